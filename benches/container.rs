//! Container latency: Python `print(1+1)` through execbox vs the identical
//! `docker run` argv spawned directly (execbox's own overhead), the same and
//! a pandas one-liner through the warm pool (`container_warm`), Code Mode
//! (one and 100 calls of a no-op tool from Python), and the Rust pipeline
//! cached vs compiling.
//!
//! `cargo bench --bench container`. Skipped, with a message, when no engine
//! answers or the images are missing (`scripts/build-images.sh`).

use std::hint::black_box;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use execbox::Executor;
use execbox::backends::Container;
use execbox::tools::{ToolLimits, ToolRegistry, ToolSpec};
use execbox::{Backend, ExecRequest, Language, SandboxPolicy};
use serde_json::{Value, json};

const RUST_TRANSFORM: &str = "\
use serde_json::{json, Value};

fn run(input: Value) -> Value {
    let items = input[\"items\"].as_array().cloned().unwrap_or_default();
    json!(items.iter().map(|x| x.as_i64().unwrap_or(0) * 2).collect::<Vec<_>>())
}
";

fn python_print() -> ExecRequest {
    ExecRequest::source(Language::Python, "print(1+1)")
}

fn bench(c: &mut Criterion) {
    let container = Container::default();
    if let Err(reason) = container.availability() {
        eprintln!("skipping the container bench: {reason}");
        return;
    }
    let mut g = c.benchmark_group("container");
    g.sample_size(20).measurement_time(Duration::from_secs(15)).warm_up_time(Duration::from_secs(2));

    g.bench_function("python_print_execbox", |b| {
        b.iter(|| {
            let r = Executor::run_on(&container, python_print()).expect("runs");
            assert_eq!(r.output, Some(json!(2)), "{r:?}");
            black_box(r);
        })
    });

    // The same argv execbox would build (same flags, mounts, bootstrap), plus
    // `--rm` so the daemon removes each container, spawned directly.
    let work = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(work.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let counter = AtomicU64::new(0);
    g.bench_function("python_print_raw_docker_run", |b| {
        b.iter(|| {
            let mut spec = container.plan(&python_print()).expect("plan");
            spec.name = format!("execbox-bench-raw-{}-{}", std::process::id(), counter.fetch_add(1, Ordering::Relaxed));
            spec.mounts[0].host = work.path().to_path_buf();
            let mut argv = spec.argv();
            argv.insert(1, "--rm".into());
            let mut child = Command::new("docker")
                .args(&argv)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("docker");
            child.stdin.take().unwrap().write_all(b"print(1+1)").unwrap();
            let out = child.wait_with_output().unwrap();
            assert_eq!(out.stdout, b"2\n", "{}", String::from_utf8_lossy(&out.stderr));
        })
    });

    // Code Mode: a no-op Rust tool called from Python in a container, over
    // the run's tool socket (the container's start dominates one call).
    let noop = ToolRegistry::builder()
        .tool(ToolSpec::new("bench.noop"), |_: Value| async { Ok(Value::Null) })
        .build()
        .expect("a valid registry");
    let with_tools = Executor::builder().backend(container.clone()).tools(noop).build();
    let tool_request = |code: &str| {
        let policy = SandboxPolicy::strict().tools(["bench.*"]).tool_limits(ToolLimits::default().max_calls(100));
        ExecRequest::source(Language::Python, code).policy(policy)
    };
    const ONE_CALL: &str = "import tools\nprint(tools.bench.noop())";
    const HUNDRED_CALLS: &str = "import tools\nfor i in range(100):\n    tools.bench.noop(i=i)\nprint(100)";
    let first = with_tools.execute_blocking(tool_request(ONE_CALL)).expect("runs");
    assert_eq!((first.stdout.text().as_ref(), first.tool_calls.len()), ("None\n", 1), "{first:?}");
    let hundred = with_tools.execute_blocking(tool_request(HUNDRED_CALLS)).expect("runs");
    assert_eq!((hundred.output, hundred.tool_calls.len()), (Some(json!(100)), 100));
    g.bench_function("tool_container_one_call", |b| {
        b.iter(|| black_box(with_tools.execute_blocking(tool_request(ONE_CALL)).expect("runs")))
    });
    g.bench_function("tool_container_100_sequential_calls", |b| {
        b.iter(|| black_box(with_tools.execute_blocking(tool_request(HUNDRED_CALLS)).expect("runs")))
    });

    let rust = |code: &str| {
        ExecRequest::source(Language::Rust, code)
            .input(json!({"items": [1, 2, 3]}))
            .policy(SandboxPolicy::strict().timeout(Duration::from_secs(30)))
    };
    match Executor::run_on(&container, rust(RUST_TRANSFORM)) {
        Ok(r) if r.is_ok() => {
            g.bench_function("rust_transform_cached", |b| {
                b.iter(|| black_box(Executor::run_on(&container, rust(RUST_TRANSFORM)).expect("runs")))
            });
            let unseen = AtomicU64::new(0);
            g.sample_size(10).measurement_time(Duration::from_secs(40));
            g.bench_function("rust_transform_compiles", |b| {
                b.iter(|| {
                    let n = unseen.fetch_add(1, Ordering::Relaxed);
                    let code = format!("// bench {} {n}\n{RUST_TRANSFORM}", std::process::id());
                    let r = Executor::run_on(&container, rust(&code)).expect("runs");
                    assert!(r.is_ok(), "{r:?}");
                })
            });
        }
        other => eprintln!("skipping the Rust benches: {other:?}"),
    }
    g.finish();
}

/// One run through a warm pool: each sample waits (untimed) until the pool
/// is full again (no start in flight), then times the run that takes one. Sustained rates
/// above the pool's refill (a container start each, ~0.3 s, two at once)
/// fall back to cold starts: that is `python_print_execbox`.
fn bench_warm(c: &mut Criterion) {
    use execbox::backends::ContainerConfig;
    let mut g = c.benchmark_group("container_warm");
    g.sample_size(30).measurement_time(Duration::from_secs(20)).warm_up_time(Duration::from_secs(1));
    let cases = [
        ("python_print", python_print().policy(SandboxPolicy::strict().timeout(Duration::from_secs(60))), json!(2)),
        (
            "pandas_sum",
            ExecRequest::source(
                Language::Python,
                "import pandas as pd\nprint(int(pd.DataFrame({'a': [1, 2, 3]})['a'].sum()))",
            )
            .packages(["pandas"])
            .policy(SandboxPolicy::strict().timeout(Duration::from_secs(60))),
            json!(6),
        ),
    ];
    for (name, request, want) in cases {
        let warm = Container::new(ContainerConfig::default().warm_containers(2)).expect("config");
        if let Err(reason) = warm.availability() {
            eprintln!("skipping the warm container bench: {reason}");
            return;
        }
        let ready = || {
            let until = std::time::Instant::now() + Duration::from_secs(60);
            while warm.readiness().is_none_or(|r| r.ready < r.target) {
                assert!(std::time::Instant::now() < until, "the warm pool does not fill");
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        // The first run starts this package set's pool.
        let first = Executor::run_on(&warm, request.clone()).expect("runs");
        assert_eq!(first.output, Some(want.clone()), "{first:?}");
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    ready();
                    let started = std::time::Instant::now();
                    let r = Executor::run_on(&warm, request.clone()).expect("runs");
                    total += started.elapsed();
                    assert_eq!(r.output, Some(want.clone()), "{r:?}");
                }
                total
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench, bench_warm);
criterion_main!(benches);
