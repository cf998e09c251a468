//! Throughput: runs per second at concurrency 1, 2, 8 and 64, with N tasks
//! on a multi-thread tokio runtime (one worker per core) all calling
//! `Executor::execute`, as a server's connections do.
//!
//! `cargo bench --bench throughput`. Three workloads:
//! - `wasm_hello`: the trivial cached WASI command (`hello.wat`, one
//!   `fd_write`), on the caller's task; `wasm_hello_blocking_pool` the same
//!   with `async_runs(false)`, each run handed to tokio's blocking pool;
//! - `js_transform`: the 100-number JS transform of `benches/js.rs` on the
//!   contained `boa-js` (worker processes), each run handed to tokio's
//!   blocking pool; `js_transform_execbox_runtime` the same on a runtime
//!   from `execbox::runtime_builder`, awaited on the task;
//! - `python_print_pooled`: `print(1+1)` on `python-wasm` with its warm pool
//!   (skipped with a message when the interpreters are not fetched).
//!
//! Criterion reports elements (runs) per second: each measured batch of
//! `iters` runs is split among the N tasks, and the batch's wall time is
//! what counts.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use execbox::backends::{BoaJs, InterpreterConfig, WasmGuest, WasmGuestConfig, WasmInterpreter};
use execbox::{Backend, ExecRequest, Executor, Language, SandboxPolicy};
use serde_json::json;
use tokio::runtime::Runtime;

const HELLO: &str = include_str!("../guests/wat/hello.wat");
const TRANSFORM: &str = "return input.items.filter(x => x % 3 !== 0).map(x => x * 2).reduce((a, b) => a + b, 0);";
const CONCURRENCY: [u64; 4] = [1, 2, 8, 64];

/// Runs `iters` requests made by `request` through `exec`, split among
/// `tasks` concurrent tasks on `runtime`; returns the wall time of the batch.
fn batch(
    runtime: &Runtime,
    exec: &Executor,
    tasks: u64,
    iters: u64,
    request: Arc<dyn Fn() -> ExecRequest + Send + Sync>,
) -> Duration {
    let started = Instant::now();
    runtime.block_on(async {
        let mut handles = Vec::new();
        for task in 0..tasks {
            // The first `iters % tasks` tasks run one more.
            let share = iters / tasks + u64::from(task < iters % tasks);
            let exec = exec.clone();
            let request = request.clone();
            handles.push(tokio::spawn(async move {
                for _ in 0..share {
                    let result = exec.execute(request()).await.expect("runs");
                    assert!(result.is_ok(), "{result:?}");
                    black_box(result);
                }
            }));
        }
        for handle in handles {
            handle.await.expect("task");
        }
    });
    started.elapsed()
}

fn group(
    c: &mut Criterion,
    runtime: &Runtime,
    name: &str,
    exec: &Executor,
    request: Arc<dyn Fn() -> ExecRequest + Send + Sync>,
    slow: bool,
) {
    let mut g = c.benchmark_group(format!("throughput/{name}"));
    if slow {
        g.sample_size(10).measurement_time(Duration::from_secs(6)).warm_up_time(Duration::from_secs(1));
    }
    g.throughput(Throughput::Elements(1));
    for tasks in CONCURRENCY {
        g.bench_with_input(BenchmarkId::from_parameter(tasks), &tasks, |b, &tasks| {
            b.iter_custom(|iters| batch(runtime, exec, tasks, iters, request.clone()))
        });
    }
    g.finish();
}

fn bench(c: &mut Criterion) {
    // One worker thread per core, as `#[tokio::main]` builds it.
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");

    let hello = wat::parse_str(HELLO).expect("valid WAT");
    let wasm = Executor::with_backend(WasmGuest::new(WasmGuestConfig::default()).expect("wasm"));
    let request = hello.clone();
    group(c, &runtime, "wasm_hello", &wasm, Arc::new(move || ExecRequest::wasm(request.clone())), false);
    // The same on tokio's blocking pool (each run a thread hand-off): the
    // path every run took before runs on the async task.
    let pooled = WasmGuest::new(WasmGuestConfig::default().async_runs(false)).expect("wasm");
    let wasm = Executor::with_backend(pooled);
    group(c, &runtime, "wasm_hello_blocking_pool", &wasm, Arc::new(move || ExecRequest::wasm(hello.clone())), false);

    let boa = BoaJs::default();
    let js = Executor::with_backend(boa);
    let transform = || {
        let mut policy = SandboxPolicy::strict();
        policy.memory_bytes = None;
        ExecRequest::javascript(TRANSFORM).input(json!({"items": (0..100).collect::<Vec<i32>>()})).policy(policy)
    };
    assert_eq!(js.execute_blocking(transform()).expect("runs").output, Some(json!(6534)));
    group(c, &runtime, "js_transform", &js, Arc::new(transform), false);
    // The same on a runtime from `execbox::runtime_builder`: a run that
    // finds a worker idle is awaited on its task, not handed to the
    // blocking pool.
    let marked = execbox::runtime_builder().build().expect("runtime");
    group(c, &marked, "js_transform_execbox_runtime", &js, Arc::new(transform), false);

    let python = WasmInterpreter::new(InterpreterConfig::default()).expect("engine");
    match python.availability().map_err(|e| e.to_string()).and_then(|()| python.warm_up().map_err(|e| e.to_string())) {
        Ok(()) => {
            python.prepare(Duration::from_secs(30));
            let exec = Executor::with_backend(python);
            let print = || {
                ExecRequest::source(Language::Python, "print(1+1)")
                    .policy(SandboxPolicy::strict().timeout(Duration::from_secs(30)))
            };
            group(c, &runtime, "python_print_pooled", &exec, Arc::new(print), true);
        }
        Err(reason) => eprintln!("skipping python-wasm: {reason}"),
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);
