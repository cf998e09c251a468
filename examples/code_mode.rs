//! Code Mode in a few lines: register two Rust closures as tools, grant
//! them in a policy, and let sandboxed JavaScript and Python call them.
//! The code runs in execbox's contained boa worker and in CPython-in-wasm
//! (when the interpreter is fetched: `scripts/fetch-interpreters.sh`); the
//! tools run in this process, and only arguments and results cross.
//!
//! `cargo run --example code_mode`

use std::time::Duration;

use execbox::tools::{ToolError, ToolRegistry, ToolSpec};
use execbox::{ExecRequest, Executor, Language, SandboxPolicy};
use serde_json::{Value, json};

fn main() {
    // The host's tools: Rust closures, namespaced, with JSON Schemas the
    // model and the code see.
    let tools = ToolRegistry::builder()
        .tool(
            ToolSpec::new("inventory.stock").description("Units in stock for a SKU").input_schema(
                json!({"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]}),
            ),
            |args: Value| async move {
                match args["sku"].as_str() {
                    Some("A-1") => Ok(json!(12)),
                    Some("B-2") => Ok(json!(0)),
                    Some(other) => Err(ToolError::failed("inventory.stock", format!("no SKU {other}"))),
                    None => Err(ToolError::failed("inventory.stock", "sku is required")),
                }
            },
        )
        .tool(ToolSpec::new("inventory.reorder").description("Orders more units of a SKU"), |args: Value| async move {
            Ok(json!({"ordered": args["sku"], "units": args["units"]}))
        })
        .build()
        .expect("tool names are valid");
    let exec = Executor::builder().default_backends(&Default::default()).expect("backends").tools(tools).build();

    // A policy grants tools by name or namespace (the default grants none).
    let policy = SandboxPolicy::strict().timeout(Duration::from_secs(10)).tools(["inventory.*"]);

    // One program instead of a chain of model round trips: JavaScript.
    let js = "const low = [];
for (const sku of ['A-1', 'B-2', 'C-3']) {
  try {
    if (await tools.inventory.stock({sku}) === 0) low.push(sku);
  } catch (e) {
    console.log(`skipped ${sku}: ${e.kind}: ${e.message}`);
  }
}
for (const sku of low) await tools.inventory.reorder({sku, units: 50});
return {reordered: low};";
    let result = exec.execute_blocking(ExecRequest::javascript(js).policy(policy.clone())).expect("admitted");
    println!("JavaScript on {}: {:?} -> {}", result.backend, result.outcome, result.output.unwrap_or_default());
    print!("{}", result.stdout.text());
    println!("ledger (what each call did, for reconciling after a failure):");
    for call in &result.tool_calls {
        println!(
            "  {:<20} {:<8} {:>6.2} ms  {} B in, {} B out",
            call.tool,
            format!("{:?}", call.outcome).to_lowercase(),
            call.duration_ms,
            call.bytes_in,
            call.bytes_out
        );
    }

    // The same tools from Python (CPython compiled to wasm), synchronously.
    let py = "import json, tools
from tools.inventory import stock
print(json.dumps({sku: stock(sku=sku) for sku in ['A-1', 'B-2']}))";
    match exec.execute_blocking(ExecRequest::source(Language::Python, py).policy(policy)) {
        Ok(result) => println!("Python on {}: {}", result.backend, result.output.unwrap_or_default()),
        Err(refused) => println!("Python: not run here ({refused})"),
    }

    // Without a grant, the code has no `tools` at all.
    let bare = exec.execute_blocking(ExecRequest::javascript("return typeof tools")).expect("admitted");
    println!("without a grant: typeof tools = {}", bare.output.unwrap_or_default());
}
