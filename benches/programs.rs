//! What programs cost once their workspace's container runs (warm): a
//! `start_program` of `echo hi` polled to its exit, and a write and poll
//! round trip to a running `python3 -i` (a line echoed back with its
//! prompt), through the library and over MCP stdio (rmcp's client, the
//! release `execbox` binary as the server).
//!
//! `cargo build --release -p execbox-cli && cargo bench -p execbox --bench
//! programs`. Skipped, with a message, where this process cannot mount a
//! workspace (not root) or has no container engine.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use execbox::backends::Container;
use execbox::{Backend, Executor, ProgramSpec, ProgramStatus, Workspace, WorkspaceConfig};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};

fn execbox_binary() -> std::path::PathBuf {
    // target/release/deps/programs-... -> target/release/execbox
    let exe = std::env::current_exe().expect("bench binary");
    exe.parent().and_then(|deps| deps.parent()).expect("target dir").join("execbox")
}

fn arguments(value: Value) -> serde_json::Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => unreachable!(),
    }
}

fn bench(c: &mut Criterion) {
    let root = tempfile::tempdir().expect("tempdir");
    let ws = match Workspace::create(WorkspaceConfig::default().root(root.path())) {
        Ok(ws) => ws,
        Err(e) => {
            eprintln!("skipping the programs bench: {e}");
            return;
        }
    };
    let container = Container::default();
    if let Err(reason) = container.availability() {
        eprintln!("skipping the programs bench: {reason}");
        return;
    }
    let runtime = execbox::runtime_builder().worker_threads(2).build().unwrap();
    let exec = Executor::with_backend(container);
    let mut g = c.benchmark_group("programs");
    g.sample_size(30).measurement_time(Duration::from_secs(8)).warm_up_time(Duration::from_secs(2));

    let echo_to_exit = || async {
        let program = exec.start_program(&ws, ProgramSpec::argv(["echo", "hi"])).await.unwrap();
        let mut out = program.poll(Duration::from_secs(10), 1 << 10).await;
        while out.status == ProgramStatus::Running {
            out = program.poll(Duration::from_secs(10), 1 << 10).await;
        }
        assert_eq!(out.exit_code, Some(0), "{out:?}");
        black_box(out)
    };
    // The first program starts the workspace's container.
    runtime.block_on(echo_to_exit());
    g.bench_function("echo_to_exit/library", |b| b.iter(|| runtime.block_on(echo_to_exit())));

    let repl = runtime
        .block_on(exec.start_program(&ws, ProgramSpec::argv(["python3", "-i", "-q"]).tty(true)))
        .expect("python3 -i");
    runtime.block_on(repl.poll(Duration::from_secs(10), 1 << 10));
    g.bench_function("repl_round_trip/library", |b| {
        b.iter(|| {
            runtime.block_on(async {
                repl.write(b"7\n").unwrap();
                let mut seen = Vec::new();
                while !seen.ends_with(b">>> ") {
                    seen.extend(repl.poll(Duration::from_secs(10), 1 << 10).await.output);
                }
                black_box(seen)
            })
        })
    });

    let binary = execbox_binary();
    if !binary.exists() {
        eprintln!("skipping MCP: {} is missing (cargo build --release -p execbox-cli)", binary.display());
        g.finish();
        return;
    }
    let server_root = tempfile::tempdir().expect("tempdir");
    let client = runtime.block_on(async {
        let mut command = tokio::process::Command::new(&binary);
        command.arg("serve").arg("--workspace-root").arg(server_root.path());
        let transport = TokioChildProcess::new(command).expect("spawn execbox serve");
        ().serve(transport).await.expect("MCP handshake")
    });
    let call = |tool: &'static str, args: Value| {
        let peer = client.peer().clone();
        let result = runtime.block_on(async move {
            peer.call_tool(CallToolRequestParams::new(tool).with_arguments(arguments(args))).await.unwrap()
        });
        assert_eq!(result.is_error, Some(false), "{tool}: {result:?}");
        result.structured_content.expect("structuredContent")
    };
    let ws_id = call("create_workspace", json!({}))["workspace_id"].clone();
    let echo = json!({"workspace_id": ws_id, "command": ["echo", "hi"], "yield_ms": 10_000});
    let echo_to_exit = || {
        let mut answer = call("start_program", echo.clone());
        while answer["status"] == "running" {
            answer = call("poll_program", json!({"program_id": answer["program_id"], "yield_ms": 10_000}));
        }
        assert_eq!(answer["exit_code"], 0, "{answer}");
        answer
    };
    echo_to_exit();
    g.bench_function("echo_to_exit/mcp_stdio", |b| b.iter(|| black_box(echo_to_exit())));
    let started = call(
        "start_program",
        json!({"workspace_id": ws_id, "command": ["python3", "-i", "-q"], "tty": true, "yield_ms": 10_000}),
    );
    let program_id = started["program_id"].clone();
    let line = json!({"program_id": program_id, "data": "7", "newline": true, "yield_ms": 10_000});
    g.bench_function("repl_round_trip/mcp_stdio", |b| {
        b.iter(|| {
            let answer = call("write_program", line.clone());
            assert!(answer["output"].as_str().unwrap().ends_with(">>> "), "{answer}");
            black_box(answer)
        })
    });
    g.finish();
    runtime.block_on(async { client.cancel().await.ok() });
}

criterion_group!(benches, bench);
criterion_main!(benches);
