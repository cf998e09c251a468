//! Kubernetes latency: Python `print(1+1)` as a fresh pod through the
//! `kubernetes` backend (create the ConfigMap and the pod, the setup init
//! container, the launcher, the log, the deletes), beside the same run on
//! the docker `container` backend, on the same machine; and the same run on
//! a claimed warm pod (claim, attach and deliver, log, deletes; each
//! sample waits, untimed, for the pool to have a pod). Then a pandas
//! one-liner, cold and on a warm pod of its package set's pool (pandas
//! imported before the run came). Last, a Rust transform compiled and run
//! (a fresh source each sample, so the docker backend's binary cache never
//! hits): in a pod's compile init container, and in the docker backend's
//! compile container. And Code Mode: one no-op tool call's round trip
//! from code in a pod (carried up the log and down the attachment) and in
//! a container (its bind-mounted socket), timed inside the program after
//! a first call (which in a cold pod waits for the pod's start to be seen).
//!
//! `cargo bench --features kubernetes --bench kubernetes`, with the cluster
//! of `scripts/kube/up.sh` (`$EXECBOX_KUBECONFIG`, else
//! `/tmp/execbox-kube/admin.kubeconfig`). Skipped, with a message, when
//! either backend is unavailable.

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use execbox::backends::{Container, Kubernetes, KubernetesConfig};
use execbox::{Backend, ExecRequest, Executor, Language, SandboxPolicy};
use serde_json::json;

/// The memory cap of the warm backend's pools (its default), which a run
/// must ask for to take one of their pods; of its own, so no other
/// process's pods count toward the readiness the warm samples wait for.
const WARM_MEMORY: u64 = 272 << 20;

fn policy() -> SandboxPolicy {
    SandboxPolicy::strict().timeout(Duration::from_secs(30)).memory_bytes(WARM_MEMORY)
}

fn python_print() -> ExecRequest {
    let policy = policy();
    ExecRequest::source(Language::Python, "print(1+1)").policy(policy)
}

fn pandas_sum() -> ExecRequest {
    let policy = policy();
    ExecRequest::source(Language::Python, "import pandas\nprint(int(pandas.Series([1, 2, 3]).sum()))")
        .packages(["pandas"])
        .policy(policy)
}

/// Times `request` on `backend` once `ready` says a warm pod waits
/// (untimed), `iters` times.
fn timed_warm(
    backend: &Kubernetes,
    request: fn() -> ExecRequest,
    ready: impl Fn(usize) -> bool,
    expected: serde_json::Value,
    iters: u64,
) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let waiting = std::time::Instant::now();
        while !backend.readiness().is_some_and(|r| ready(r.ready)) {
            assert!(waiting.elapsed() < Duration::from_secs(120), "no warm pod: {:?}", backend.readiness());
            std::thread::sleep(Duration::from_millis(50));
        }
        let started = std::time::Instant::now();
        let r = Executor::run_on(backend, request()).expect("runs");
        total += started.elapsed();
        assert_eq!(r.output, Some(expected.clone()), "{r:?}");
    }
    total
}

fn bench(c: &mut Criterion) {
    let rust_image =
        std::env::var("EXECBOX_KUBE_RUST_IMAGE").unwrap_or_else(|_| "localhost/execbox-rust-toolchain:current".into());
    let cfg = KubernetesConfig::default().kubeconfig(kubeconfig_path()).rust_image(rust_image);
    let kubernetes = match Kubernetes::new(cfg) {
        Ok(backend) => backend,
        Err(e) => return eprintln!("skipping the kubernetes bench: {e}"),
    };
    let container = Container::default();
    for backend in [&kubernetes as &dyn Backend, &container] {
        if let Err(reason) = backend.availability() {
            return eprintln!("skipping the kubernetes bench: {} is unavailable: {reason}", backend.name());
        }
    }
    let mut g = c.benchmark_group("kubernetes");
    g.sample_size(10).measurement_time(Duration::from_secs(30)).warm_up_time(Duration::from_secs(3));
    for backend in [&kubernetes as &dyn Backend, &container] {
        g.bench_function(format!("python_print_cold_{}", backend.name()), |b| {
            b.iter(|| {
                let r = Executor::run_on(backend, python_print()).expect("runs");
                assert_eq!(r.output, Some(json!(2)), "{r:?}");
                black_box(r);
            })
        });
    }
    let defaults = execbox::RunDefaults::default().memory_bytes(WARM_MEMORY);
    let warm_cfg = KubernetesConfig::default().kubeconfig(kubeconfig_path()).defaults(defaults).warm_pods(2);
    let warm = Kubernetes::new(warm_cfg).expect("a backend");
    warm.availability().expect("available");
    g.bench_function("python_print_warm_kubernetes", |b| {
        b.iter_custom(|iters| timed_warm(&warm, python_print, |ready| ready > 0, json!(2), iters))
    });
    g.bench_function("python_pandas_cold_kubernetes", |b| {
        b.iter(|| {
            let r = Executor::run_on(&kubernetes, pandas_sum()).expect("runs");
            assert_eq!(r.output, Some(json!(6)), "{r:?}");
            black_box(r);
        })
    });
    // The set's first run (cold) starts its pool; with the plain pool's 2
    // pods at most, 3 ready means one of the set's waits.
    Executor::run_on(&warm, pandas_sum()).expect("runs");
    g.bench_function("python_pandas_warm_kubernetes", |b| {
        b.iter_custom(|iters| timed_warm(&warm, pandas_sum, |ready| ready >= 3, json!(6), iters))
    });
    warm.shutdown();
    let unseen = AtomicU64::new(0);
    for backend in [&kubernetes as &dyn Backend, &container] {
        g.bench_function(format!("rust_transform_compiles_{}", backend.name()), |b| {
            b.iter(|| {
                let n = unseen.fetch_add(1, Ordering::Relaxed);
                let r = Executor::run_on(backend, rust_transform(n)).expect("runs");
                assert_eq!(r.output, Some(json!([2, 4, 6])), "{r:?}");
                black_box(r);
            })
        });
    }
    let with_tools = |builder: execbox::ExecutorBuilder| {
        let tools = execbox::tools::ToolRegistry::builder()
            .tool(execbox::tools::ToolSpec::new("bench.noop"), |_: serde_json::Value| async { Ok(json!(null)) })
            .build()
            .expect("a registry");
        builder.tools(tools).build()
    };
    let executors = [
        ("kubernetes", with_tools(Executor::builder().backend(kubernetes.clone()))),
        ("container", with_tools(Executor::builder().backend(container.clone()))),
    ];
    for (name, exec) in &executors {
        g.bench_function(format!("code_mode_call_{name}"), |b| b.iter_custom(|iters| tool_calls(exec, iters)));
    }
    g.finish();
}

/// The time `iters` no-op tool calls take, one after another, timed in
/// the program after a first, untimed one.
fn tool_calls(exec: &Executor, iters: u64) -> Duration {
    let code = format!(
        "import time, tools\ntools.bench.noop()\nstarted = time.perf_counter_ns()\nfor _ in range({iters}):\n    tools.bench.noop()\nprint(time.perf_counter_ns() - started)"
    );
    let limits = execbox::tools::ToolLimits::default().max_calls(u32::try_from(iters + 1).unwrap_or(u32::MAX));
    let policy = policy().timeout(Duration::from_secs(300)).tools(["bench.*"]).tool_limits(limits);
    let r = exec.execute_blocking(ExecRequest::source(Language::Python, code).policy(policy)).expect("runs");
    let nanos = r.output.as_ref().and_then(serde_json::Value::as_u64).unwrap_or_else(|| panic!("{r:?}"));
    Duration::from_nanos(nanos)
}

/// A Rust transform no backend has compiled before (`n` and the process
/// id in a comment).
fn rust_transform(n: u64) -> ExecRequest {
    let code = format!(
        "// bench {} {n}\nfn run(input: Value) -> Value {{\n    let items = input[\"items\"].as_array().cloned().unwrap_or_default();\n    Value::from(items.iter().map(|x| x.as_i64().unwrap_or(0) * 2).collect::<Vec<_>>())\n}}\n",
        std::process::id()
    );
    ExecRequest::source(Language::Rust, code).input(json!({"items": [1, 2, 3]})).policy(policy())
}

fn kubeconfig_path() -> PathBuf {
    std::env::var_os("EXECBOX_KUBECONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/execbox-kube/admin.kubeconfig"))
}

criterion_group!(benches, bench);
criterion_main!(benches);
