//! Code Mode against the classic tool loop, on one agent task: look up 20
//! customers in a CRM (an MCP server) and report who owes money.
//!
//! - **classic**: the model calls the CRM's `lookup` tool 20 times through
//!   MCP; every record lands in its context.
//! - **code_mode**: the model calls `execbox serve`'s `run_code` once; the
//!   code makes the 20 calls (the CRM is an upstream of the server) and
//!   returns the answer.
//!
//! Both talk to the same CRM server (this bench binary, started with
//! `EXECBOX_BENCH_CRM=1`) over stdio with rmcp's client, and both count
//! the bytes that would reach the model: the tool listing once, then every
//! result. What this cannot show is the model's own time per turn, which
//! the classic loop pays 20 times and Code Mode once.
//!
//! `cargo bench --bench code_mode` (needs the release `execbox` binary:
//! `cargo build --release`).

use std::hint::black_box;
use std::time::Duration;

use criterion::Criterion;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock, ServerCapabilities, ServerConfig};
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::{ErrorData as McpError, ServerHandler, ServiceExt, schemars, tool, tool_handler, tool_router};
use serde_json::{Value, json};

/// How many customers the task looks up.
const CUSTOMERS: u64 = 20;

/// The code the model writes once in Code Mode.
const TASK: &str = "const owing = [];
for (let id = 1; id <= 20; id++) {
  const c = await tools.crm.lookup({id});
  const due = c.invoices.filter(i => i.status === 'overdue').reduce((s, i) => s + i.amount, 0);
  if (due > 0) owing.push({id, name: c.name, due});
}
return {owing, total: owing.reduce((s, o) => s + o.due, 0)};";

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct LookupArgs {
    /// The customer's id.
    id: u64,
}

/// The CRM: one tool returning a customer's record (~1 KB of JSON, as a
/// real CRM's would be).
#[derive(Clone)]
struct Crm {
    tool_router: ToolRouter<Crm>,
}

#[tool_router]
impl Crm {
    #[tool(description = "Looks up a customer by id: contact details, plan, invoices and notes.")]
    async fn lookup(&self, Parameters(args): Parameters<LookupArgs>) -> Result<CallToolResult, McpError> {
        Ok(CallToolResult::structured(customer(args.id)))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Crm {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

/// A deterministic customer record.
fn customer(id: u64) -> Value {
    let invoices: Vec<Value> = (0..8)
        .map(|n| {
            let status = if (id + n).is_multiple_of(7) { "overdue" } else { "paid" };
            json!({"id": format!("INV-{id:04}-{n:02}"), "amount": 100 + (id * 37 + n * 11) % 900,
                   "due": format!("2026-{:02}-15", 1 + n), "status": status})
        })
        .collect();
    json!({
        "id": id,
        "name": format!("Customer {id}"),
        "email": format!("customer{id}@example.com"),
        "address": {"street": format!("{id} Main Street"), "city": "Springfield", "zip": format!("{:05}", 10000 + id)},
        "plan": if id.is_multiple_of(3) { "enterprise" } else { "team" },
        "invoices": invoices,
        "notes": "Prefers email. Renewal discussed in the last quarterly review; follow up before the end of the month.",
    })
}

fn execbox_binary() -> std::path::PathBuf {
    // target/release/deps/code_mode-... -> target/release/execbox
    let exe = std::env::current_exe().expect("bench binary");
    exe.parent().and_then(|deps| deps.parent()).expect("target dir").join("execbox")
}

/// The bytes of a tool result as a model would get it.
fn result_bytes(result: &CallToolResult) -> usize {
    serde_json::to_vec(result).map_or(0, |v| v.len())
}

/// The bytes of a server's tool listing.
async fn listing_bytes(client: &RunningService<RoleClient, ()>) -> usize {
    serde_json::to_vec(&client.peer().list_all_tools().await.expect("tools/list")).map_or(0, |v| v.len())
}

fn arguments(value: Value) -> serde_json::Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => unreachable!(),
    }
}

fn bench(c: &mut Criterion) {
    let binary = execbox_binary();
    if !binary.exists() {
        eprintln!("skipping: {} is missing (cargo build --release)", binary.display());
        return;
    }
    let me = std::env::current_exe().expect("bench binary");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let upstreams = dir.path().join("upstreams.json");
    let config = json!({"mcpServers": {"crm": {"command": me, "env": {"EXECBOX_BENCH_CRM": "1"}}}});
    std::fs::write(&upstreams, config.to_string()).unwrap();

    let (crm, execbox) = runtime.block_on(async {
        let mut command = tokio::process::Command::new(&me);
        command.env("EXECBOX_BENCH_CRM", "1");
        let crm = ().serve(TokioChildProcess::new(command).expect("spawn the CRM")).await.expect("MCP handshake");
        let mut command = tokio::process::Command::new(&binary);
        command.arg("serve").arg("--upstreams").arg(&upstreams).args(["--allow-tool", "crm.*"]);
        let execbox = ().serve(TokioChildProcess::new(command).expect("spawn execbox serve")).await.expect("handshake");
        (crm, execbox)
    });
    std::thread::sleep(Duration::from_secs(2));

    let classic = || {
        runtime.block_on(async {
            let mut bytes = 0;
            for id in 1..=CUSTOMERS {
                let params = CallToolRequestParams::new("lookup").with_arguments(arguments(json!({"id": id})));
                let r = crm.peer().call_tool(params).await.expect("lookup");
                bytes += result_bytes(&r);
            }
            bytes
        })
    };
    let code_mode = || {
        runtime.block_on(async {
            let args = json!({"language": "javascript", "code": TASK});
            let r = execbox
                .peer()
                .call_tool(CallToolRequestParams::new("run_code").with_arguments(arguments(args)))
                .await
                .expect("run_code");
            assert_eq!(r.is_error, Some(false), "{r:?}");
            r
        })
    };

    // What reaches the model, once.
    let (crm_listing, execbox_listing) =
        runtime.block_on(async { (listing_bytes(&crm).await, listing_bytes(&execbox).await) });
    let classic_results = classic();
    let answer = code_mode();
    let text: Vec<&str> = answer
        .content
        .iter()
        .filter_map(|b| match b {
            ContentBlock::Text(t) => Some(t.text.as_str()),
            _ => None,
        })
        .collect();
    eprintln!(
        "code_mode task bytes to the model: classic = {} (listing {crm_listing} + {CUSTOMERS} results {classic_results}), \
         code mode = {} (listing {execbox_listing} + code {} + one result {}); {} model turns vs 1\n  answer: {}",
        crm_listing + classic_results,
        execbox_listing + TASK.len() + result_bytes(&answer),
        TASK.len(),
        result_bytes(&answer),
        CUSTOMERS,
        text.join(" ").chars().take(200).collect::<String>(),
    );

    let mut g = c.benchmark_group("code_mode_task");
    g.sample_size(20).measurement_time(Duration::from_secs(8)).warm_up_time(Duration::from_secs(1));
    g.bench_function("classic_20_mcp_calls", |b| b.iter(|| black_box(classic())));
    g.bench_function("code_mode_one_run_code", |b| b.iter(|| black_box(code_mode())));
    g.finish();
    runtime.block_on(async {
        drop(crm.cancel().await);
        drop(execbox.cancel().await);
    });
}

fn main() {
    if std::env::var_os("EXECBOX_BENCH_CRM").is_some() {
        // The CRM server, on this process's stdio.
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        runtime.block_on(async {
            let crm = Crm { tool_router: Crm::tool_router() };
            if let Ok(service) = crm.serve(rmcp::transport::stdio()).await {
                let _ = service.waiting().await;
            }
        });
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    bench(&mut c);
    c.final_summary();
}
