//! JS latency: raw boa, the contained `boa-js` (worker processes), a session cell (blocking and async), the
//! in-thread `boa-js-inthread`, and policy matching.
//!
//! `cargo bench --bench js`. The transform is filter/map/reduce over 100
//! numbers with JSON in and out. "Paced" benches sleep 2 ms (untimed) before
//! each call, as in an agent loop where the model thinks between calls;
//! "back to back" benches do not. The `tool_*` benches are Code Mode: a
//! no-op Rust tool called from contained boa code and back, once per run
//! and 100 times in a row in one run.

use std::hint::black_box;
use std::time::{Duration, Instant};

use boa_engine::{Context, JsValue, Source, context::ContextBuilder, js_string, property::Attribute};
use criterion::{Criterion, criterion_group, criterion_main};
use execbox::backends::{BoaJs, BoaJsConfig, BoaJsInThread};
use execbox::tools::{ToolLimits, ToolRegistry, ToolSpec};
use execbox::{Backend, ExecRequest, Executor, Language, SandboxPolicy, SessionBackend, SessionSpec, Sessions, check};
use serde_json::{Value, json};

const TRANSFORM: &str = "return input.items.filter(x => x % 3 !== 0).map(x => x * 2).reduce((a, b) => a + b, 0);";

fn input() -> Value {
    json!({"items": (0..100).collect::<Vec<i32>>()})
}

/// The request both backends can run: strict, without the memory cap that
/// in-thread boa cannot enforce.
fn request() -> ExecRequest {
    let policy = {
        let mut p = SandboxPolicy::strict();
        p.memory_bytes = None;
        p
    };
    ExecRequest::javascript(TRANSFORM).input(input()).policy(policy)
}

/// Times `iters` calls with 2 ms of untimed idle before each.
fn paced<T>(iters: u64, mut call: impl FnMut() -> T) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        std::thread::sleep(Duration::from_millis(2));
        let start = Instant::now();
        black_box(call());
        total += start.elapsed();
    }
    total
}

/// What boa alone costs for one call on `ctx`: input in, eval, JSON out.
fn raw_boa_call(mut ctx: Context, input: &Value, src: &str) -> Option<Value> {
    let v = JsValue::from_json(input, &mut ctx).unwrap();
    ctx.register_global_property(js_string!("input"), v, Attribute::all()).unwrap();
    let out = ctx.eval(Source::from_bytes(src.as_bytes())).unwrap();
    out.to_json(&mut ctx).unwrap()
}

fn raw_boa_context() -> Context {
    ContextBuilder::new().instructions_remaining(usize::MAX).build().unwrap()
}

fn wait_ready(ready: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(30);
    while !ready() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("js");

    // Baselines: what boa itself costs, on this thread.
    let raw_input = input();
    let raw_src = format!("(function () {{{TRANSFORM}\n}})()");
    g.bench_function("raw_boa_fresh_context", |b| {
        b.iter(|| black_box(raw_boa_call(raw_boa_context(), &raw_input, &raw_src)))
    });
    // The floor under any pool: the same work on a context built beforehand (untimed).
    g.bench_function("raw_boa_prebuilt_context", |b| {
        b.iter_batched(
            raw_boa_context,
            |ctx| black_box(raw_boa_call(ctx, &raw_input, &raw_src)),
            criterion::BatchSize::SmallInput,
        )
    });
    // The same floor with the agent-loop idle before each call: what pacing
    // alone costs (cold caches, a CPU that clocked down).
    g.bench_function("raw_boa_prebuilt_paced", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let ctx = raw_boa_context();
                std::thread::sleep(Duration::from_millis(2));
                let start = Instant::now();
                black_box(raw_boa_call(ctx, &raw_input, &raw_src));
                total += start.elapsed();
            }
            total
        })
    });

    // The contained default: one worker process per run, a pipe round trip.
    let contained = BoaJs::default();
    wait_ready(|| contained.readiness().map(|r| r.ready) == Some(BoaJsConfig::default().idle_workers));
    let exec = Executor::builder().backend(contained.clone()).build();
    assert_eq!(exec.execute_blocking(request()).unwrap().output, Some(json!(6534)));
    g.bench_function("contained_paced", |b| {
        b.iter_custom(|iters| paced(iters, || exec.execute_blocking(request()).unwrap()))
    });
    g.bench_function("contained_back_to_back", |b| b.iter(|| black_box(exec.execute_blocking(request()).unwrap())));

    // Code Mode: a no-op Rust tool, called from contained code and back.
    let noop = ToolRegistry::builder()
        .tool(ToolSpec::new("bench.noop"), |_: Value| async { Ok(Value::Null) })
        .build()
        .expect("a valid registry");
    let with_tools = Executor::builder().backend(contained.clone()).tools(noop).build();
    let tool_request = |code: &str| {
        let mut policy = SandboxPolicy::strict().tools(["bench.*"]).tool_limits(ToolLimits::default().max_calls(100));
        policy.memory_bytes = None;
        ExecRequest::javascript(code).policy(policy)
    };
    const ONE_CALL: &str = "return await tools.bench.noop({})";
    const HUNDRED_CALLS: &str = "for (let i = 0; i < 100; i++) { await tools.bench.noop({i}); } return 100";
    let first = with_tools.execute_blocking(tool_request(ONE_CALL)).unwrap();
    assert_eq!((first.output, first.tool_calls.len()), (Some(Value::Null), 1));
    assert_eq!(with_tools.execute_blocking(tool_request(HUNDRED_CALLS)).unwrap().output, Some(json!(100)));
    g.bench_function("tool_contained_one_call", |b| {
        b.iter(|| black_box(with_tools.execute_blocking(tool_request(ONE_CALL)).unwrap()))
    });
    g.bench_function("tool_contained_100_sequential_calls", |b| {
        b.iter(|| black_box(with_tools.execute_blocking(tool_request(HUNDRED_CALLS)).unwrap()))
    });

    // The in-thread engine: a thread hand-off per run.
    let inthread = Executor::builder().backend(BoaJsInThread::default()).build();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(inthread.execute_blocking(request()).unwrap().output, Some(json!(6534)));
    g.bench_function("inthread_paced", |b| {
        b.iter_custom(|iters| paced(iters, || inthread.execute_blocking(request()).unwrap()))
    });
    g.bench_function("inthread_back_to_back", |b| b.iter(|| black_box(inthread.execute_blocking(request()).unwrap())));

    // What replacing a killed worker costs (off the request path): spawn,
    // exec, warm-up, seccomp, first context, ready.
    g.bench_function("contained_worker_start", |b| {
        let spec = SessionSpec::new(Language::JavaScript);
        b.iter(|| black_box(SessionBackend::open_session(&contained, &spec).unwrap()));
    });

    // A session cell (the same code, as a function body in the session's
    // realm): blocking, and through the async door from a task of a plain
    // tokio runtime (the blocking pool) and of an execbox runtime (the
    // worker's socket awaited on the caller's task).
    let sessions = Sessions::builder().backend(contained.clone()).build();
    sessions.open("bench", SessionSpec::new(Language::JavaScript)).unwrap();
    let cell = request;
    assert_eq!(sessions.execute("bench", cell()).unwrap().output, Some(json!(6534)));
    g.bench_function("session_cell_blocking", |b| b.iter(|| black_box(sessions.execute("bench", cell()).unwrap())));
    let plain = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let marked = execbox::runtime_builder().worker_threads(2).build().unwrap();
    for (name, runtime) in [("session_cell_async_blocking_pool", &plain), ("session_cell_async_on_task", &marked)] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let sessions = sessions.clone();
                let on_task = async move {
                    let started = Instant::now();
                    for _ in 0..iters {
                        let r = sessions.execute_async("bench", cell()).await.unwrap();
                        assert_eq!(r.output, Some(json!(6534)));
                    }
                    started.elapsed()
                };
                runtime.block_on(async { tokio::spawn(on_task).await.unwrap() })
            })
        });
    }
    sessions.close_all();

    let caps = contained.capabilities().clone();
    let req = request();
    g.bench_function("policy_matching", |b| b.iter(|| black_box(check(black_box(&caps), black_box(&req)))));
    g.bench_function("executor_select", |b| b.iter(|| black_box(exec.select(black_box(&req)).is_ok())));
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(60).measurement_time(Duration::from_secs(4)).warm_up_time(Duration::from_secs(1));
    targets = bench
}
criterion_main!(benches);
