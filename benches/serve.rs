//! `execbox serve` in front of an agent: an MCP `run_code` round trip over
//! stdio (rmcp's client, the release `execbox` binary as the server) against
//! the same run through the library (blocking, and for Python also awaited
//! as the server awaits it), for a JS transform and a pooled Python
//! `print(1+1)`.
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
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
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
    // Paced like an agent loop: the warm pool refills between turns (100 ms,
    // untimed). `run` makes one call and gives its output.
    let paced = |b: &mut criterion::Bencher, run: &dyn Fn() -> Value| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                std::thread::sleep(Duration::from_millis(100));
                let started = std::time::Instant::now();
                let output = run();
                total += started.elapsed();
                assert_eq!(output, json!(2));
            }
            total
        })
    };
    let print = || ExecRequest::source(Language::Python, "print(1+1)").policy(SandboxPolicy::strict());
    g.sample_size(10).measurement_time(Duration::from_secs(3));
    g.bench_function("python_print/mcp_stdio_paced", |b| {
        paced(b, &|| {
            let r = call(json!({"language": "python", "code": "print(1+1)"}));
            r.structured_content.as_ref().unwrap()["output"].clone()
        })
    });
    g.bench_function("python_print/library_paced", |b| {
        paced(b, &|| exec.execute_blocking(print()).unwrap().output.unwrap_or_default())
    });
    // The same awaited, as the server awaits it (on a 2-worker runtime).
    g.bench_function("python_print/library_async_paced", |b| {
        paced(b, &|| runtime.block_on(exec.execute(print())).unwrap().output.unwrap_or_default())
    });
    g.finish();
    drop(runtime.block_on(client.cancel()));
}

criterion_group!(benches, bench);
criterion_main!(benches);
