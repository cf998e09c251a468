//! `execbox serve` in front of an agent: an MCP `run_code` round trip over
//! stdio (rmcp's client, the release `execbox` binary as the server) against
//! the same run through the library (blocking, and awaited on a task of an
//! execbox runtime as the server awaits it), for a JS transform back to
//! back, and paced like an agent loop for a pooled Python `print(1+1)` and a
//! JS `return 2`. The server's share is `mcp_stdio_paced` minus
//! `library_async_paced`.
//!
//! `cargo bench --bench serve` (it builds the `execbox` binary it talks to).

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use execbox::{BackendsConfig, ExecRequest, Executor, Language, SandboxPolicy};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};

const JS: &str = "return input.items.map(x => x * 2)";

fn execbox_binary() -> std::path::PathBuf {
    // target/release/deps/serve-... -> target/release/execbox
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
    let binary = execbox_binary();
    if !binary.exists() {
        eprintln!("skipping: {} is missing (cargo build --release)", binary.display());
        return;
    }
    // An execbox runtime, as the server's: a run awaited on one of its tasks
    // talks to a JS worker on the task, with no blocking-pool hand-off.
    let runtime = execbox::runtime_builder().worker_threads(2).build().unwrap();
    let client = runtime.block_on(async {
        let mut command = tokio::process::Command::new(&binary);
        command.arg("serve");
        let transport = TokioChildProcess::new(command).expect("spawn execbox serve");
        ().serve(transport).await.expect("MCP handshake")
    });
    let call = |args: Value| {
        let peer = client.peer().clone();
        runtime.block_on(async move {
            peer.call_tool(CallToolRequestParams::new("run_code").with_arguments(arguments(args))).await.unwrap()
        })
    };
    // Let the server's pools fill.
    std::thread::sleep(Duration::from_secs(3));
    let input = json!({"items": (0..100).collect::<Vec<i64>>()});

    let exec = Executor::builder().default_backends(&BackendsConfig::default()).unwrap().build();
    exec.prepare_all();
    std::thread::sleep(Duration::from_secs(3));

    let mut g = c.benchmark_group("serve");
    g.sample_size(30).measurement_time(Duration::from_secs(6)).warm_up_time(Duration::from_secs(1));
    g.bench_function("js_transform/mcp_stdio", |b| {
        b.iter(|| {
            let r = call(json!({"language": "javascript", "code": JS, "input": input}));
            assert_eq!(r.is_error, Some(false));
            black_box(r)
        })
    });
    g.bench_function("js_transform/library", |b| {
        b.iter(|| {
            let request = ExecRequest::javascript(JS).input(input.clone()).policy(SandboxPolicy::strict());
            black_box(exec.execute_blocking(request).unwrap())
        })
    });
    // Paced like an agent loop: the warm pool refills between turns (200 ms,
    // untimed; at 100 ms a CPython start-up at lowered priority on a busy
    // 2-CPU VM sometimes missed the turn, and the median measured the pool's
    // refill rate instead of the hop). `run` makes one call and gives its output.
    let paced = |b: &mut criterion::Bencher, run: &dyn Fn() -> Value| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                std::thread::sleep(Duration::from_millis(200));
                let started = std::time::Instant::now();
                let output = run();
                total += started.elapsed();
                assert_eq!(output, json!(2));
            }
            total
        })
    };
    // Awaited on a task of the runtime, as the server awaits a call.
    let awaited = |request: ExecRequest| {
        let exec = exec.clone();
        let run = runtime.spawn(async move { exec.execute(request).await.unwrap() });
        runtime.block_on(run).unwrap().output.unwrap_or_default()
    };
    let print = || ExecRequest::source(Language::Python, "print(1+1)").policy(SandboxPolicy::strict());
    g.sample_size(20).measurement_time(Duration::from_secs(6));
    g.bench_function("python_print/mcp_stdio_paced", |b| {
        paced(b, &|| {
            let r = call(json!({"language": "python", "code": "print(1+1)"}));
            r.structured_content.as_ref().unwrap()["output"].clone()
        })
    });
    g.bench_function("python_print/library_paced", |b| {
        paced(b, &|| exec.execute_blocking(print()).unwrap().output.unwrap_or_default())
    });
    // The same awaited on a task, as the server awaits it.
    g.bench_function("python_print/library_async_paced", |b| paced(b, &|| awaited(print())));
    g.bench_function("js_return/mcp_stdio_paced", |b| {
        paced(b, &|| {
            let r = call(json!({"language": "javascript", "code": "return 2"}));
            r.structured_content.as_ref().unwrap()["output"].clone()
        })
    });
    let ret = || ExecRequest::javascript("return 2").policy(SandboxPolicy::strict());
    g.bench_function("js_return/library_async_paced", |b| paced(b, &|| awaited(ret())));
    g.bench_function("js_return/library_paced", |b| {
        paced(b, &|| exec.execute_blocking(ret()).unwrap().output.unwrap_or_default())
    });
    g.finish();
    drop(runtime.block_on(client.cancel()));
}

criterion_group!(benches, bench);
criterion_main!(benches);
