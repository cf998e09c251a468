//! Python sessions against stateless runs of the same code: a cell in a
//! CPython-in-wasm session vs a pooled stateless run (paced, as the pool
//! refills between agent turns), opening a session, and a cell in a
//! container session vs a one-shot container run (Python, and a shell
//! cell against a one-shot shell run). And Code Mode's round
//! trip: a no-op Rust tool called from pooled CPython-in-wasm (one call,
//! and 100 calls in a row in one run) and from a session cell, against the
//! pooled run that calls none (`print/python_wasm_pooled_stateless`).
//!
//! `cargo bench --bench sessions`; engines not available here are skipped.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use execbox::Executor;
use execbox::backends::{Container, InterpreterConfig, WasmInterpreter};
use execbox::tools::{ToolRegistry, ToolSpec};
use execbox::{Backend, ExecRequest, Language, SandboxPolicy, SessionConfig, SessionSpec, Sessions};
use serde_json::{Value, json};

fn print() -> ExecRequest {
    ExecRequest::source(Language::Python, "print(1+1)").policy(SandboxPolicy::strict().timeout(Duration::from_secs(60)))
}

/// `code` with the no-op tool `bench.noop` granted.
fn calling_tools(code: &str) -> ExecRequest {
    let policy = SandboxPolicy::strict().timeout(Duration::from_secs(60)).tools(["bench.*"]);
    ExecRequest::source(Language::Python, code).policy(policy)
}

/// One tool that does nothing: what is measured is the way there and back.
fn noop_tool() -> ToolRegistry {
    ToolRegistry::builder().tool(ToolSpec::new("bench.noop"), |_: Value| async { Ok(Value::Null) }).build().unwrap()
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

    // Code Mode: the record out on stdout, the bridge, the answer in on stdin.
    let with_tools = Executor::builder().backend(python.clone()).tools(noop_tool()).build();
    let one_call = calling_tools("import tools\ntools.bench.noop()\nprint(1+1)");
    let hundred_calls = calling_tools("import tools\nfor _ in range(100):\n    tools.bench.noop()\nprint(1+1)");
    for (name, request) in
        [("tools/python_wasm_pooled_one_call", one_call), ("tools/python_wasm_pooled_100_calls", hundred_calls)]
    {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    wait_for_pool();
                    let started = Instant::now();
                    let r = with_tools.execute_blocking(request.clone()).unwrap();
                    total += started.elapsed();
                    assert_eq!(r.output, Some(json!(2)), "{r:?}");
                }
                total
            })
        });
    }
    let tool_sessions =
        Sessions::builder().config(SessionConfig::default()).backend(python.clone()).tools(noop_tool()).build();
    tool_sessions.open("bench", SessionSpec::new(Language::Python)).unwrap();
    let cell = calling_tools("import tools\ntools.bench.noop()\nprint(1+1)");
    let hundred_cell = calling_tools("import tools\nfor _ in range(100):\n    tools.bench.noop()\nprint(1+1)");
    // One call and 100 in a cell: their difference / 99 is one call's round trip.
    for (name, cell) in
        [("tools/python_wasm_session_cell_one_call", cell), ("tools/python_wasm_session_cell_100_calls", hundred_cell)]
    {
        g.bench_function(name, |b| {
            b.iter(|| {
                let r = tool_sessions.execute("bench", cell.clone()).unwrap();
                assert_eq!(r.output, Some(json!(2)), "{r:?}");
                black_box(r)
            })
        });
    }
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
    // A shell cell: one-shot (a fresh container) against a shell session's
    // cell (sourced by its one bash).
    let echo = || {
        ExecRequest::source(Language::Shell, "echo 2").policy(SandboxPolicy::strict().timeout(Duration::from_secs(60)))
    };
    g.bench_function("echo/shell_container_one_shot", |b| {
        b.iter(|| black_box(Executor::run_on(&container, echo()).unwrap()))
    });
    let shell = container.session_backends().into_iter().find(|s| s.session_language() == Language::Shell);
    let shell =
        Sessions::builder().config(SessionConfig::default()).shared_backend(shell.expect("shell sessions")).build();
    shell.open("bench", SessionSpec::new(Language::Shell)).unwrap();
    g.bench_function("echo/shell_container_session_cell", |b| {
        b.iter(|| {
            let r = shell.execute("bench", echo()).unwrap();
            assert_eq!(r.output, Some(json!(2)));
            black_box(r)
        })
    });
    // Code Mode over the session's tool socket: one call and 100 in a cell
    // (their difference / 99 is one call's round trip, without a start).
    let container_tools =
        Sessions::builder().config(SessionConfig::default()).backend(container.clone()).tools(noop_tool()).build();
    container_tools.open("bench", SessionSpec::new(Language::Python)).unwrap();
    let one = calling_tools("import tools\ntools.bench.noop()\nprint(1+1)");
    let hundred = calling_tools("import tools\nfor _ in range(100):\n    tools.bench.noop()\nprint(1+1)");
    for (name, cell) in [
        ("tools/python_container_session_cell_one_call", one),
        ("tools/python_container_session_cell_100_calls", hundred),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                let r = container_tools.execute("bench", cell.clone()).unwrap();
                assert_eq!(r.output, Some(json!(2)), "{r:?}");
                black_box(r)
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
