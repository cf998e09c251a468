//! `execbox serve` as replicas on the test cluster: deploy/kubernetes/
//! (rbac.yaml, serve.yaml) with this test's `execbox` in the image
//! (scripts/kube/serve-image.sh), two replicas behind a Service with
//! ClientIP affinity, driven through the Service by the official MCP Python
//! SDK (cli/tests/mcp_replicas.py says what it checks).
//!
//! Needs the cluster (scripts/kube/up.sh; `$EXECBOX_KUBECONFIG` names its
//! kubeconfig, `$EXECBOX_KUBECTL` a kubectl) and the SDK
//! (scripts/install-mcp-client.sh); skips without them unless
//! `EXECBOX_REQUIRE_KUBERNETES=1` (as in CI's Kubernetes step).
#![cfg(all(feature = "serve", feature = "js", feature = "kubernetes"))]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::skip;

fn kubeconfig() -> PathBuf {
    std::env::var_os("EXECBOX_KUBECONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/execbox-kube/admin.kubeconfig"))
}

/// `kubectl -n execbox ARGS`: its stdout, or a failure with its stderr.
fn kubectl(args: &[&str]) -> String {
    let out = try_kubectl(args);
    assert!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn try_kubectl(args: &[&str]) -> std::process::Output {
    Command::new(kubectl_path())
        .arg("--kubeconfig")
        .arg(kubeconfig())
        .args(["-n", "execbox"])
        .args(args)
        .output()
        .unwrap()
}

fn kubectl_path() -> PathBuf {
    std::env::var_os("EXECBOX_KUBECTL").map_or_else(|| PathBuf::from("kubectl"), PathBuf::from)
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// Removes what the test applied, whether it passed or not, and every
/// execbox pod the replicas left (the deleted replica's warm pods): the
/// namespace is as the other Kubernetes tests expect it.
struct Deployed;

impl Drop for Deployed {
    fn drop(&mut self) {
        remove_replicas();
        let managed = "app.kubernetes.io/managed-by=execbox";
        let _ =
            try_kubectl(&["delete", "pods,configmaps", "-l", managed, "--grace-period=0", "--force", "--wait=false"]);
    }
}

/// Deletes serve.yaml's objects and the token, and waits (90 s at most)
/// until the replicas' pods are gone.
fn remove_replicas() {
    {
        let serve = repo("deploy/kubernetes/serve.yaml");
        let _ = try_kubectl(&[
            "delete",
            "-f",
            serve.to_str().unwrap(),
            "--ignore-not-found",
            "--wait=true",
            "--timeout=90s",
        ]);
        let _ = try_kubectl(&["delete", "secret", "execbox-serve-token", "--ignore-not-found"]);
        let start = Instant::now();
        while !kubectl(&["get", "pods", "-l", "app.kubernetes.io/name=execbox-serve", "-o", "name"]).trim().is_empty() {
            if start.elapsed() > Duration::from_secs(90) {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

#[test]
fn replicas_behind_a_service_answer_every_client_and_lose_only_their_own_calls() {
    let python = skip::installed("EXECBOX_MCP_VENV", "mcp-venv").join("bin/python");
    let cluster = kubeconfig();
    let addresses = cluster.with_file_name("client-addresses");
    let ready = if !cluster.exists() {
        Err(format!("no kubeconfig at {} (scripts/kube/up.sh)", cluster.display()))
    } else if !addresses.exists() {
        Err(format!("no {} (scripts/kube/up.sh makes it)", addresses.display()))
    } else if !python.exists() {
        Err(format!("{} is missing: run scripts/install-mcp-client.sh", python.display()))
    } else {
        Ok(())
    };
    if !skip::available(skip::KUBERNETES, ready) {
        return;
    }
    let image = Command::new(repo("scripts/kube/serve-image.sh")).arg(env!("CARGO_BIN_EXE_execbox")).output().unwrap();
    assert!(image.status.success(), "serve-image.sh: {}", String::from_utf8_lossy(&image.stderr));

    // From nothing: a Service made afresh has no client pinned to a replica yet.
    remove_replicas();
    let _deployed = Deployed;
    kubectl(&["apply", "-f", repo("deploy/kubernetes/rbac.yaml").to_str().unwrap()]);
    let token = random_token();
    let _ = try_kubectl(&["delete", "secret", "execbox-serve-token", "--ignore-not-found"]);
    kubectl(&["create", "secret", "generic", "execbox-serve-token", &format!("--from-literal=token={token}")]);
    kubectl(&["apply", "-f", repo("deploy/kubernetes/serve.yaml").to_str().unwrap()]);
    let rollout = try_kubectl(&["rollout", "status", "deployment/execbox-serve", "--timeout=180s"]);
    if !rollout.status.success() {
        let pods = try_kubectl(&["describe", "pods", "-l", "app.kubernetes.io/name=execbox-serve"]);
        let logs = try_kubectl(&["logs", "-l", "app.kubernetes.io/name=execbox-serve", "--tail=40"]);
        panic!(
            "the replicas never became ready: {}\n{}\n{}",
            String::from_utf8_lossy(&rollout.stderr),
            String::from_utf8_lossy(&pods.stdout),
            String::from_utf8_lossy(&logs.stdout)
        );
    }
    let ip = kubectl(&["get", "service", "execbox-serve", "-o", "jsonpath={.spec.clusterIP}"]);
    let sources = std::fs::read_to_string(&addresses).unwrap();
    let out = Command::new(&python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_replicas.py"))
        .arg(format!("http://{}:8931/mcp", ip.trim()))
        .arg(&token)
        .arg(sources.trim())
        .arg(kubectl_path())
        .arg(&cluster)
        .env("PYTHONWARNINGS", "ignore")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success() && stdout.trim_end().ends_with("ok"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// 128 random bits, in hex.
fn random_token() -> String {
    use std::io::Read as _;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom").unwrap().read_exact(&mut bytes).unwrap();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
