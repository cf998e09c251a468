//! JS latency: raw boa, the boa backend, the Executor, and policy matching.
//!
//! `cargo bench --bench js`. The transform is map/filter/reduce over 100
//! numbers with JSON in and out.

use std::hint::black_box;
use std::time::{Duration, Instant};

use boa_engine::{Context, JsValue, Source, context::ContextBuilder, js_string, property::Attribute};
use criterion::{Criterion, criterion_group, criterion_main};
use execbox::backends::BoaJs;
use execbox::{Backend, ExecRequest, Executor, SandboxPolicy, check};
use serde_json::{Value, json};

const TRANSFORM: &str = "return input.items.filter(x => x % 3 !== 0).map(x => x * 2).reduce((a, b) => a + b, 0);";

fn input() -> Value {
    json!({"items": (0..100).collect::<Vec<i32>>()})
}

fn request() -> ExecRequest {
    ExecRequest::javascript(TRANSFORM).input(input()).policy(SandboxPolicy::strict())
}

/// Times `iters` calls with 2 ms of untimed idle before each, as in an agent
/// loop where the model thinks between calls.
fn paced<T, E: std::fmt::Debug>(iters: u64, mut call: impl FnMut(ExecRequest) -> Result<T, E>) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        std::thread::sleep(Duration::from_millis(2));
        let req = request();
        let start = Instant::now();
        black_box(call(req).unwrap());
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

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("js");

    // Baseline: what boa itself costs for one fresh call on this thread.
    let raw_input = input();
    let raw_src = format!("(function () {{{TRANSFORM}\n}})()");
    g.bench_function("raw_boa_fresh_context", |b| {
        b.iter(|| black_box(raw_boa_call(raw_boa_context(), &raw_input, &raw_src)))
    });

    // The floor under any pool: the same work on an already-built context.
    g.bench_function("raw_boa_prebuilt_context", |b| {
        b.iter_batched(
            raw_boa_context,
            |ctx| black_box(raw_boa_call(ctx, &raw_input, &raw_src)),
            criterion::BatchSize::SmallInput,
        )
    });

    let exec = Executor::with_default_backends();
    std::thread::sleep(Duration::from_millis(200)); // let the idle workers warm up
    assert_eq!(exec.execute_blocking(request()).unwrap().output, Some(json!(6534)));

    // Agent-loop pacing: requests arrive with idle time between them (the
    // model is thinking), so a prebuilt context is always waiting.
    g.bench_function("executor_paced", |b| b.iter_custom(|iters| paced(iters, |req| exec.execute_blocking(req))));

    // Back to back: bounded by building a fresh context per call on 2 cores.
    g.bench_function("executor_back_to_back", |b| b.iter(|| black_box(exec.execute_blocking(request()).unwrap())));

    let backend = BoaJs::default();
    std::thread::sleep(Duration::from_millis(200));
    g.bench_function("backend_paced", |b| b.iter_custom(|iters| paced(iters, |req| backend.execute(req))));

    let caps = backend.capabilities().clone();
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
