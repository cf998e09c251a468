//! Kubernetes latency: Python `print(1+1)` as a fresh pod through the
//! `kubernetes` backend (create the ConfigMap and the pod, the setup init
//! container, the launcher, the log, the deletes), beside the same run on
//! the docker `container` backend, on the same machine.
//!
//! `cargo bench --features kubernetes --bench kubernetes`, with the cluster
//! of `scripts/kube/up.sh` (`$EXECBOX_KUBECONFIG`, else
//! `/tmp/execbox-kube/admin.kubeconfig`). Skipped, with a message, when
//! either backend is unavailable.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use execbox::backends::{Container, Kubernetes, KubernetesConfig};
use execbox::{Backend, ExecRequest, Executor, Language, SandboxPolicy};
use serde_json::json;

fn python_print() -> ExecRequest {
    let policy = SandboxPolicy::strict().timeout(Duration::from_secs(30));
    ExecRequest::source(Language::Python, "print(1+1)").policy(policy)
}

fn bench(c: &mut Criterion) {
    let kubeconfig = std::env::var_os("EXECBOX_KUBECONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/execbox-kube/admin.kubeconfig"));
    let kubernetes = match Kubernetes::new(KubernetesConfig::default().kubeconfig(kubeconfig)) {
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
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
