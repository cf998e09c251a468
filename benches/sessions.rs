//! Python sessions against stateless runs of the same code: a cell in a
//! CPython-in-wasm session vs a pooled stateless run (paced, as the pool
//! refills between agent turns), opening a session, and a cell in a
//! container session vs a one-shot container run.
//!
//! `cargo bench --bench sessions`; engines not available here are skipped.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use execbox::Executor;
use execbox::backends::{Container, InterpreterConfig, WasmInterpreter};
use execbox::{Backend, ExecRequest, Language, SandboxPolicy, SessionConfig, SessionSpec, Sessions};
use serde_json::json;

fn print() -> ExecRequest {
    ExecRequest::source(Language::Python, "print(1+1)").policy(SandboxPolicy::strict().timeout(Duration::from_secs(60)))
}

fn bench(c: &mut Criterion) {
    let python = WasmInterpreter::new(InterpreterConfig::default().warm_pool(2)).expect("engine");
    if let Err(reason) =
        python.availability().map_err(|e| e.to_string()).and_then(|()| python.warm_up().map_err(|e| e.to_string()))
    {
        eprintln!("skipping python-wasm sessions: {reason}");
        return;
    }
    let mut g = c.benchmark_group("sessions");
    g.sample_size(20).measurement_time(Duration::from_secs(5)).warm_up_time(Duration::from_secs(1));
    let wait_for_pool = || {
        while python.warm_ready() < 2 {
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    g.bench_function("print/python_wasm_pooled_stateless", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                wait_for_pool();
                let started = Instant::now();
                let r = Executor::run_on(&python, print()).unwrap();
                total += started.elapsed();
                assert_eq!(r.output, Some(json!(2)));
            }
            total
        })
    });
    let sessions = Sessions::builder().config(SessionConfig::default()).backend(python.clone()).build();
    sessions.open("bench", SessionSpec::new(Language::Python)).unwrap();
    g.bench_function("print/python_wasm_session_cell", |b| {
        b.iter(|| {
            let r = sessions.execute("bench", print()).unwrap();
            assert_eq!(r.output, Some(json!(2)));
            black_box(r)
        })
    });
    g.bench_function("open/python_wasm_session_from_pool", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for i in 0..iters {
                wait_for_pool();
                let id = format!("open-{i}");
                let started = Instant::now();
                sessions.open(&id, SessionSpec::new(Language::Python)).unwrap();
                total += started.elapsed();
                sessions.close(&id);
            }
            total
        })
    });
    g.finish();

    let container = Container::default();
    if let Err(reason) = container.availability() {
        eprintln!("skipping container sessions: {reason}");
        return;
    }
    let mut g = c.benchmark_group("sessions");
    g.sample_size(10).measurement_time(Duration::from_secs(8)).warm_up_time(Duration::from_secs(1));
    g.bench_function("print/python_container_one_shot", |b| {
        b.iter(|| black_box(Executor::run_on(&container, print()).unwrap()))
    });
    let in_container = Sessions::builder().config(SessionConfig::default()).backend(container.clone()).build();
    let numpy = ["numpy".to_string()];
    in_container.open("bench", SessionSpec::new(Language::Python).packages(numpy.clone())).unwrap();
    g.bench_function("print/python_container_session_cell", |b| {
        b.iter(|| {
            let r = in_container.execute("bench", print()).unwrap();
            assert_eq!(r.output, Some(json!(2)));
            black_box(r)
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
