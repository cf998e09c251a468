//! One JSON transform (100 numbers doubled, plus their sum and count: what
//! `guests/c/json_transform.c` computes) and
//! `print(1+1)` on every engine available here, so one run gives one table:
//! boa, QuickJS in wasm, CPython in wasm, a C JSON-ABI wasm guest, and the
//! container (Python, and Rust with its binary cached) when an engine answers.
//!
//! `cargo bench --bench engines`. Engines that are not available (no
//! interpreters fetched, no container engine) are skipped with a message.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use execbox::Executor;
use execbox::backends::{
    BoaJs, Container, Interpreter, InterpreterConfig, WasmGuest, WasmGuestConfig, WasmInterpreter,
};
use execbox::{Backend, ExecRequest, Language, SandboxPolicy};
use serde_json::{Value, json};

const JS: &str = "const xs = input.items;\n\
                  return {items: xs.map(x => x * 2), sum: xs.reduce((a, b) => a + b, 0), count: xs.length};";
const PYTHON: &str = "import json\nxs = input['items']\n\
                      print(json.dumps({'items': [x * 2 for x in xs], 'sum': sum(xs), 'count': len(xs)}))";
const RUST: &str = "use serde_json::{json, Value};\n\
                    fn run(input: Value) -> Value {\n\
                        let xs: Vec<i64> = input[\"items\"].as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect();\n\
                        json!({\"items\": xs.iter().map(|x| x * 2).collect::<Vec<_>>(), \"sum\": xs.iter().sum::<i64>(), \"count\": xs.len()})\n\
                    }\n";
const C_GUEST: &[u8] = include_bytes!("../guests/prebuilt/json_transform.wasm");

fn input() -> Value {
    json!({"items": (0..100).collect::<Vec<i64>>()})
}

fn expected() -> Value {
    let items: Vec<i64> = (0..100).map(|x| x * 2).collect();
    json!({"items": items, "sum": 4950, "count": 100})
}

/// Runs `request` and checks it produced the expected output.
fn check(backend: &dyn Backend, request: ExecRequest, want: &Value) {
    let r = Executor::run_on(backend, request).expect("runs");
    assert_eq!(r.output.as_ref(), Some(want), "{}: {r:?}", backend.name());
    black_box(r);
}

fn policy() -> SandboxPolicy {
    SandboxPolicy::strict().timeout(Duration::from_secs(30))
}

fn bench(c: &mut Criterion) {
    let want = expected();
    let mut g = c.benchmark_group("engines");
    g.sample_size(30).measurement_time(Duration::from_secs(8)).warm_up_time(Duration::from_secs(2));

    let boa = BoaJs::default();
    g.bench_function("transform/boa", |b| {
        b.iter(|| check(&boa, ExecRequest::javascript(JS).input(input()).policy(policy()), &want))
    });

    let wasm = WasmGuest::new(WasmGuestConfig::default()).expect("wasm");
    g.bench_function("transform/wasm_c_json_abi", |b| {
        b.iter(|| check(&wasm, ExecRequest::wasm(C_GUEST).input(input()).policy(policy()), &want))
    });

    let quickjs = WasmInterpreter::new(InterpreterConfig::default().kind(Interpreter::QuickJs)).expect("engine");
    match quickjs.availability().map_err(|e| e.to_string()).and_then(|()| quickjs.warm_up().map_err(|e| e.to_string()))
    {
        Ok(()) => g.bench_function("transform/quickjs_wasm", |b| {
            b.iter(|| check(&quickjs, ExecRequest::javascript(JS).input(input()).policy(policy()), &want))
        }),
        Err(reason) => {
            eprintln!("skipping quickjs-wasm: {reason}");
            &mut g
        }
    };

    let fresh = WasmInterpreter::new(InterpreterConfig::default().warm_pool(0)).expect("engine");
    let pooled = WasmInterpreter::new(InterpreterConfig::default().warm_pool(2)).expect("engine");
    let loaded = fresh
        .availability()
        .map_err(|e| e.to_string())
        .and_then(|()| fresh.warm_up().and_then(|()| pooled.warm_up()).map_err(|e| e.to_string()));
    match loaded {
        Ok(()) => {
            let transform = || ExecRequest::source(Language::Python, PYTHON).input(input()).policy(policy());
            let print = || ExecRequest::source(Language::Python, "print(1+1)").policy(policy());
            g.bench_function("transform/python_wasm_fresh", |b| b.iter(|| check(&fresh, transform(), &want)));
            g.bench_function("print/python_wasm_fresh", |b| b.iter(|| check(&fresh, print(), &json!(2))));
            // Agent-loop pacing: the next request comes once the pool has
            // refilled (untimed), as it does between model turns.
            let paced = |b: &mut criterion::Bencher, request: &dyn Fn() -> ExecRequest, want: &Value| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        while pooled.warm_ready() < 2 {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        let started = std::time::Instant::now();
                        check(&pooled, request(), want);
                        total += started.elapsed();
                    }
                    total
                })
            };
            // Each iteration also waits (untimed) ~0.1 s for the refill: keep the sample small.
            g.sample_size(10).measurement_time(Duration::from_secs(1)).warm_up_time(Duration::from_millis(200));
            g.bench_function("transform/python_wasm_pooled", |b| paced(b, &transform, &want));
            g.bench_function("print/python_wasm_pooled", |b| paced(b, &print, &json!(2)));
        }
        Err(reason) => eprintln!("skipping python-wasm: {reason}"),
    }
    g.finish();

    let container = Container::default();
    if let Err(reason) = container.availability() {
        eprintln!("skipping the container: {reason}");
        return;
    }
    let mut g = c.benchmark_group("engines");
    g.sample_size(10).measurement_time(Duration::from_secs(10)).warm_up_time(Duration::from_secs(1));
    g.bench_function("transform/python_container", |b| {
        b.iter(|| {
            check(&container, ExecRequest::source(Language::Python, PYTHON).input(input()).policy(policy()), &want)
        })
    });
    g.bench_function("print/python_container", |b| {
        b.iter(|| check(&container, ExecRequest::source(Language::Python, "print(1+1)").policy(policy()), &json!(2)))
    });
    let rust = || ExecRequest::source(Language::Rust, RUST).input(input()).policy(policy());
    match Executor::run_on(&container, rust()) {
        Ok(r) if r.is_ok() => {
            g.bench_function("transform/rust_container_cached", |b| b.iter(|| check(&container, rust(), &want)));
        }
        other => eprintln!("skipping rust in the container: {other:?}"),
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
