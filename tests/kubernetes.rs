//! The `kubernetes` backend against a real cluster (`scripts/kube/up.sh`):
//! the docker backend's corpus with the same outcomes, the controls it
//! refuses by name, and nothing left behind, even by a host killed mid-run.
//!
//! The cluster's kubeconfig is `$EXECBOX_KUBECONFIG`, else
//! `/tmp/execbox-kube/admin.kubeconfig`. Without a cluster the tests skip,
//! saying why; with `EXECBOX_REQUIRE_KUBERNETES=1` (set by `.ci/run`) they
//! fail instead. Its own binary: it counts the pods of its owner process.
#![cfg(feature = "kubernetes")]

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use execbox::backends::{Kubernetes, KubernetesConfig};
use execbox::{
    Access, Backend, ExecError, ExecFile, ExecRequest, ExecResult, Executor, FailureKind, Language, Outcome,
    SandboxPolicy,
};
use serde_json::{Value, json};

const REQUIRE: &str = common::skip::KUBERNETES;

fn kubeconfig() -> PathBuf {
    std::env::var_os("EXECBOX_KUBECONFIG")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/execbox-kube/admin.kubeconfig"))
}

/// One backend for the whole binary (its probe runs once); `None`: skipped.
fn backend() -> Option<&'static Kubernetes> {
    static BACKEND: OnceLock<Option<Kubernetes>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            let path = kubeconfig();
            if !path.exists() {
                common::skip::available(REQUIRE, Err(format!("no kubeconfig at {}", path.display())));
                return None;
            }
            let config =
                KubernetesConfig::default().kubeconfig(path).rust_image(rust_image()).seccomp_profile(SECCOMP_PROFILE);
            let backend = Kubernetes::new(config).expect("a backend");
            common::skip::available(REQUIRE, backend.availability()).then_some(backend)
        })
        .as_ref()
}

/// Another backend on the test cluster, `cfg` with its kubeconfig and the
/// Rust image (its probe runs again); `None`: skipped.
fn backend_with(cfg: KubernetesConfig) -> Option<Kubernetes> {
    backend()?;
    let cfg = cfg.kubeconfig(kubeconfig()).rust_image(rust_image()).seccomp_profile(SECCOMP_PROFILE);
    let backend = Kubernetes::new(cfg).expect("a backend");
    backend.availability().expect("available");
    Some(backend)
}

/// execbox's seccomp profile as scripts/kube/up.sh installs it on the node.
const SECCOMP_PROFILE: &str = "execbox.json";

/// The image Rust compiles in (scripts/build-rust-toolchain-image.sh).
fn rust_image() -> String {
    std::env::var("EXECBOX_KUBE_RUST_IMAGE").unwrap_or_else(|_| "localhost/execbox-rust-toolchain:current".into())
}

/// The strict policy with room for a pod's start on a loaded 2-core node
/// (the strict 5 s is the whole run's, start included).
fn patient() -> SandboxPolicy {
    SandboxPolicy::strict().timeout(Duration::from_secs(30))
}

fn python(code: &str) -> ExecRequest {
    ExecRequest::source(Language::Python, code).policy(patient())
}

fn shell(code: &str) -> ExecRequest {
    ExecRequest::source(Language::Shell, code).policy(patient())
}

fn run(backend: &Kubernetes, request: ExecRequest) -> ExecResult {
    Executor::run_on(backend, request).expect("execute")
}

fn stdout(r: &ExecResult) -> String {
    r.stdout.text().into_owned()
}

/// `kubectl` (`$EXECBOX_KUBECTL`, else the one on `PATH`) against the test
/// cluster, in its namespace.
fn kubectl(args: &[&str]) -> String {
    let kubectl = std::env::var_os("EXECBOX_KUBECTL").unwrap_or_else(|| "kubectl".into());
    let out = Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig())
        .args(["-n", "execbox"])
        .args(args)
        .output()
        .expect("kubectl runs");
    assert!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The runs' objects of execbox in the namespace whose name holds `part`
/// (warm pods, waiting for minutes, are not runs).
fn objects(part: &str) -> Vec<String> {
    kubectl(&[
        "get",
        "pods,configmaps",
        "-l",
        "app.kubernetes.io/managed-by=execbox,execbox.dev/role!=warm",
        "-o",
        "name",
    ])
    .lines()
    .filter(|l| l.contains(part))
    .map(str::to_string)
    .collect()
}

/// Waits until no object of this process's runs there now is left (a
/// timed-out run's pod is deleted in the background; other tests' runs,
/// started later, do not count).
fn nothing_left_of(pid: u32, within: Duration) {
    let part = format!("execbox-{pid}-");
    let start = Instant::now();
    let now = objects(&part);
    loop {
        let left: Vec<String> = objects(&part).into_iter().filter(|o| now.contains(o)).collect();
        if left.is_empty() {
            return;
        }
        assert!(start.elapsed() < within, "left after {within:?}: {left:?}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn python_gets_input_files_env_and_args_and_returns_json() {
    let Some(k) = backend() else { return };
    let policy = patient().environment(Access::Allow(vec!["GREETING".into()]));
    let code = r#"
import json, os, sys
print(json.dumps({"sum": sum(input["items"]), "file": open("data/a.txt").read(), "greeting": os.environ["GREETING"],
                  "args": sys.argv[1:], "cwd": os.getcwd(), "uid": os.getuid()}))
"#;
    let request = python(code)
        .input(json!({"items": [1, 2, 3]}))
        .input_file(ExecFile::new("data/a.txt", "from the host"))
        .env("GREETING", "$(HOSTNAME) stays literal")
        .arg("one")
        .policy(policy);
    let r = run(k, request);
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(r.backend, "kubernetes");
    assert_eq!(
        r.output,
        Some(json!({"sum": 6, "file": "from the host", "greeting": "$(HOSTNAME) stays literal",
                    "args": ["one"], "cwd": "/work", "uid": 65534}))
    );
}

fn rust(code: &str) -> ExecRequest {
    ExecRequest::source(Language::Rust, code).policy(patient())
}

/// The docker backend's Rust corpus (tests/library/container_backend.rs)
/// with the same outcomes: compiled in the pod's `compile` init container,
/// run by the launcher with the input on stdin.
#[test]
fn rust_compiles_in_its_pod_and_returns_its_value_files_and_warnings() {
    let Some(k) = backend() else { return };
    let code = "\
use serde_json::{json, Value};

fn run(input: Value) -> Value {
    let unused = 1;
    println!(\"working on {input}\");
    let file = std::fs::read_to_string(\"data/a.txt\").unwrap();
    std::fs::create_dir_all(\"/work/out/d\").unwrap();
    std::fs::write(\"/work/out/d/r.txt\", \"from rust\").unwrap();
    let args: Vec<String> = std::env::args().skip(1).collect();
    json!({\"n\": input[\"n\"], \"file\": file, \"args\": args, \"uid\": std::fs::metadata(\"/proc/self\").map(|_| 0).unwrap_or(1)})
}
";
    let request = rust(code)
        .input(json!({"n": 7}))
        .input_file(ExecFile::new("data/a.txt", "from the host"))
        .arg("one")
        .collect_output_files();
    let r = run(k, request);
    assert_eq!((r.outcome, r.backend.as_str()), (Outcome::Ok, "kubernetes"), "{r:?}");
    assert_eq!(r.output, Some(json!({"n": 7, "file": "from the host", "args": ["one"], "uid": 0})), "{r:?}");
    assert_eq!(stdout(&r), "working on {\"n\":7}\n", "{r:?}");
    let warning = r.diagnostics.iter().find(|d| d.level == "warning").unwrap_or_else(|| panic!("{r:?}"));
    assert!(warning.message.contains("unused"), "{warning:?}");
    assert_eq!(warning.line, Some(4), "{warning:?}");
    let files: Vec<(&str, &[u8])> = r.output_files.iter().map(|f| (f.name.as_str(), f.content.as_slice())).collect();
    assert_eq!(files, [("d/r.txt", b"from rust".as_slice())]);
    // A program that exits without returning gives no value; `Value` is in
    // scope without a `use`.
    let r = run(k, rust("fn run(_: Value) -> Value { println!(\"bye\"); std::process::exit(0) }\n"));
    assert_eq!((r.outcome, r.output.clone(), stdout(&r).as_str()), (Outcome::Ok, None, "bye\n"), "{r:?}");
}

#[test]
fn rust_compile_errors_are_located_and_the_compiler_reads_nothing_of_the_node() {
    let Some(k) = backend() else { return };
    let code = "use serde_json::Value;\n\nfn run(input: Value) -> Value {\n    let n: u32 = \"text\";\n    input\n}\n";
    let r = run(k, rust(code));
    assert_eq!((r.outcome, r.failure_kind), (Outcome::Failed, Some(FailureKind::CompileError)), "{r:?}");
    let error = r.diagnostics.iter().find(|d| d.level == "error").expect("an error diagnostic");
    assert_eq!(error.code.as_deref(), Some("E0308"));
    assert_eq!((error.line, error.column), (Some(4), Some(18)), "{error:?}");
    assert!(r.stderr.text().contains("main.rs:4:18"), "{}", r.stderr.text());
    assert!(r.message.as_deref().unwrap_or_default().contains("line 4"), "{r:?}");
    // A missing `run` points at the harness: no line in the caller's code.
    let r = run(k, rust("fn not_run() {}\n"));
    assert_eq!(r.failure_kind, Some(FailureKind::CompileError), "{r:?}");
    assert_eq!(r.diagnostics.iter().find(|d| d.level == "error").and_then(|d| d.line), None, "{r:?}");
    // The compile runs unprivileged in its own image: neither the node's
    // files nor the job's secrets are there to include.
    for path in ["/etc/shadow", "/var/run/secrets/kubernetes.io/serviceaccount/token", "/root/.bashrc"] {
        let code = format!("const S: &str = include_str!({path:?});\nfn run(_: Value) -> Value {{ Value::from(S) }}\n");
        let r = run(k, rust(&code));
        assert_eq!(r.failure_kind, Some(FailureKind::CompileError), "{path}: {r:?}");
        assert!(r.diagnostics.iter().any(|d| d.line == Some(1)), "{path}: {r:?}");
    }
    // What it can include of itself holds nothing of the cluster.
    let code = "const S: &[u8] = include_bytes!(\"/proc/self/environ\");\nfn run(_: Value) -> Value { Value::from(String::from_utf8_lossy(S)) }\n";
    let r = run(k, rust(code));
    let environ = r.output.as_ref().and_then(Value::as_str).unwrap_or_else(|| panic!("{r:?}"));
    assert!(environ.contains("PATH=") && !environ.contains("KUBERNETES") && !environ.contains("HOSTNAME"), "{environ}");
}

#[test]
fn rust_panics_loops_bombs_floods_and_sockets_get_the_docker_backends_outcomes() {
    let Some(k) = backend() else { return };
    let r = run(k, rust("fn run(_: Value) -> Value { panic!(\"boom\") }\n"));
    assert_eq!((r.outcome, r.exit_code), (Outcome::Failed, Some(101)), "{r:?}");
    assert!(r.stderr.text().contains("boom"), "{r:?}");
    let endless = rust("fn run(_: Value) -> Value { loop { std::hint::spin_loop() } }\n")
        .policy(SandboxPolicy::strict().timeout(Duration::from_secs(12)));
    let r = run(k, endless);
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    let bomb = "fn run(_: Value) -> Value {\n    let mut v: Vec<Vec<u8>> = Vec::new();\n    loop { v.push(vec![1u8; 16 << 20]); }\n}\n";
    let r = run(k, rust(bomb).policy(patient().memory_bytes(96 << 20)));
    assert_eq!(r.outcome, Outcome::OutOfMemory, "{r:?}");
    let flood = "fn run(_: Value) -> Value { Value::String(\"x\".repeat(100_000)) }\n";
    let r = run(k, rust(flood).policy(patient().max_output_bytes(1000)));
    assert_eq!((r.outcome, r.output_truncated, r.output.is_none()), (Outcome::Failed, true, true), "{r:?}");
    assert!(r.message.as_deref().unwrap_or_default().contains("max_stdout_bytes"), "{r:?}");
    let socket = "fn run(_: Value) -> Value {\n    let r = std::net::TcpStream::connect_timeout(&\"10.0.0.1:80\".parse().unwrap(), std::time::Duration::from_secs(3));\n    Value::from(format!(\"{:?}\", r.err().map(|e| e.raw_os_error())))\n}\n";
    let r = run(k, rust(socket));
    // ENETUNREACH: no interface but lo.
    assert_eq!(r.output, Some(json!("Some(Some(101))")), "{r:?}");
}

#[test]
fn a_rust_compile_is_bounded_by_the_request_deadline_and_its_own_memory() {
    let Some(k) = backend() else { return };
    // An endless const evaluation: the compiler itself never finishes.
    let code = "\
#![allow(long_running_const_eval)]
const N: u64 = { let mut i = 0u64; loop { i = i.wrapping_add(1); if i == 0 { break i; } } };
fn run(_: Value) -> Value { Value::from(N) }
";
    let started = Instant::now();
    let r = run(
        k,
        ExecRequest::source(Language::Rust, code).policy(SandboxPolicy::strict().timeout(Duration::from_secs(10))),
    );
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    assert!(r.message.as_deref().unwrap_or_default().contains("before the program started"), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(12), "{:?}", started.elapsed());
    // A compiler out of its memory is out of memory, not a compile error.
    let Some(small) = backend_with(KubernetesConfig::default().compile_memory_bytes(40 << 20)) else { return };
    let r = run(
        &small,
        rust("fn run(i: Value) -> Value { i }\n").policy(SandboxPolicy::strict().timeout(Duration::from_secs(15))),
    );
    // Under load (CI) rustc at a limit below its working set may thrash on
    // its mapped library instead, until the deadline: typed either way.
    let message = r.message.as_deref().unwrap_or_default();
    let thrashed = r.outcome == Outcome::TimedOut && message.contains("before the program started");
    assert!(thrashed || (r.outcome == Outcome::OutOfMemory && message.contains("compiler ran out")), "{r:?}");
    nothing_left_of(std::process::id(), Duration::from_secs(20));
    // An image without rustc is the backend's configuration, not the code's.
    let no_rustc = KubernetesConfig::default().kubeconfig(kubeconfig()).rust_image("localhost/execbox-rust:bookworm");
    let no_rustc = Kubernetes::new(no_rustc).expect("a backend");
    let r = Executor::run_on(&no_rustc, rust("fn run(i: Value) -> Value { i }\n"));
    assert!(matches!(&r, Err(ExecError::BackendUnavailable { reason, .. }) if reason.contains("rustc")), "{r:?}");
    // A toolchain image the node lacks names the script that builds it.
    let absent =
        KubernetesConfig::default().kubeconfig(kubeconfig()).rust_image("localhost/execbox-no-such-toolchain:0");
    let absent = Kubernetes::new(absent).expect("a backend");
    let r = Executor::run_on(&absent, rust("fn run(i: Value) -> Value { i }\n"));
    assert!(
        matches!(&r, Err(ExecError::BackendUnavailable { fix: Some(fix), .. }) if fix.contains("build-rust-toolchain-image.sh")),
        "{r:?}"
    );
}

#[test]
fn shell_sees_no_host_or_cluster_variable_and_cannot_write_outside_its_tmpfs() {
    let Some(k) = backend() else { return };
    // SAFETY: no other thread of this binary reads or writes the environment.
    unsafe { std::env::set_var("EXECBOX_TEST_CANARY", "host-secret") };
    let script = r#"
for v in $(env | cut -d= -f1); do case $v in KUBERNETES_* | EXECBOX_TEST_CANARY) echo "seen $v" ;; esac; done
touch /work/x 2>/dev/null && echo work-writable
touch /usr/x 2>/dev/null && echo root-writable
echo ok > /tmp/t && cat /tmp/t
exit 3
"#;
    let r = run(k, shell(script));
    assert_eq!((r.outcome, r.exit_code), (Outcome::Failed, Some(3)), "{r:?}");
    assert_eq!(stdout(&r), "ok\n");
}

#[test]
fn the_network_is_unreachable_and_no_token_is_mounted() {
    let Some(k) = backend() else { return };
    let code = r#"
import errno, os, socket
try:
    socket.create_connection(("10.0.0.1", 80), timeout=3)
    print("connected")
except OSError as e:
    print(errno.errorcode.get(e.errno, "timeout"))
print(os.path.exists("/var/run/secrets/kubernetes.io"))
"#;
    let r = run(k, python(code));
    assert_eq!(stdout(&r), "ENETUNREACH\nFalse\n", "{r:?}");
}

/// The program runs under execbox's own seccomp profile (the docker
/// backend's), not the runtime's default, which lets io_uring through; a
/// backend told of a profile the nodes do not have is unavailable, naming
/// why, before any run.
#[test]
fn programs_run_under_execboxs_seccomp_profile_or_not_at_all() {
    let Some(k) = backend() else { return };
    let code =
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nprint(libc.syscall(425, 0, 0), ctypes.get_errno())";
    let r = run(k, python(code));
    assert_eq!(stdout(&r), "-1 1\n", "io_uring_setup is EPERM: {r:?}");
    let missing = KubernetesConfig::default().kubeconfig(kubeconfig()).seccomp_profile("no-such-profile.json");
    let missing = Kubernetes::new(missing).expect("a backend");
    let why = missing.availability().expect_err("no such profile on the node");
    assert!(why.to_string().contains("probe"), "{why}");
    let refused = Executor::run_on(&missing, python("print(1)"));
    assert!(matches!(refused, Err(ExecError::Refused { .. } | ExecError::BackendUnavailable { .. })), "{refused:?}");
}

#[test]
fn a_loop_times_out_at_the_deadline_and_its_pod_goes() {
    let Some(k) = backend() else { return };
    let started = Instant::now();
    let r = run(k, python("while True: pass").policy(SandboxPolicy::strict().timeout(Duration::from_secs(8))));
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    // The result comes at the deadline (the delete is in the background).
    assert!(started.elapsed() < Duration::from_secs(8) + Duration::from_secs(2), "{:?}", started.elapsed());
    nothing_left_of(std::process::id(), Duration::from_secs(20));
}

#[test]
fn a_memory_bomb_is_killed_at_the_cap() {
    let Some(k) = backend() else { return };
    let code = "x = []\nwhile True: x.append(bytearray(16 << 20))";
    let policy = SandboxPolicy::strict().memory_bytes(96 << 20).timeout(Duration::from_secs(30));
    let r = run(k, python(code).policy(policy));
    assert_eq!(r.outcome, Outcome::OutOfMemory, "{r:?}");
}

#[test]
fn a_fork_bomb_ends_with_its_run_and_the_node_lives() {
    let Some(k) = backend() else { return };
    let policy = SandboxPolicy::strict().timeout(Duration::from_secs(10));
    let r = run(k, shell("f() { f | f & }; f; sleep 5; echo survived").policy(policy));
    assert!(matches!(r.outcome, Outcome::Ok | Outcome::Failed | Outcome::TimedOut), "{r:?}");
    let after = run(k, python("print('alive')"));
    assert_eq!(stdout(&after), "alive\n", "{after:?}");
}

#[test]
fn a_flood_is_held_to_the_cap_and_counted() {
    let Some(k) = backend() else { return };
    let policy = SandboxPolicy::strict().max_output_bytes(1000).timeout(Duration::from_secs(30));
    let r = run(k, shell("head -c 20000000 /dev/zero | tr '\\0' x; echo done >&2").policy(policy));
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(r.stdout.bytes.len(), 1000);
    assert!(r.stdout.truncated);
    assert_eq!(r.stdout.total_bytes, 20_000_000);
    assert_eq!(r.stderr.text(), "done\n");
}

#[test]
fn output_files_come_back_within_the_caps() {
    let Some(k) = backend() else { return };
    let code = "import os\nos.makedirs('/work/out/d')\nopen('/work/out/d/r.txt','w').write('result')\n\
                os.symlink('/etc/passwd', '/work/out/link')";
    let r = run(k, python(code).collect_output_files());
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    let names: Vec<_> = r.output_files.iter().map(|f| (f.name.as_str(), f.content.as_slice())).collect();
    assert_eq!(names, vec![("d/r.txt", b"result".as_slice())]);
    assert!(r.message.as_deref().is_some_and(|m| m.contains("link")), "{:?}", r.message);
}

#[test]
fn binary_output_comes_back_byte_for_byte() {
    let Some(k) = backend() else { return };
    let r = run(k, python("import sys\nsys.stdout.buffer.write(bytes(range(256)) * 100)"));
    assert_eq!(r.stdout.bytes, (0..=255u8).cycle().take(25_600).collect::<Vec<_>>());
}

#[test]
fn packages_of_the_data_image_are_declared_and_import() {
    let Some(k) = backend() else { return };
    assert!(k.packages(Language::Python).contains(&"numpy".to_string()));
    let r = run(k, python("import numpy\nprint(int(numpy.arange(4).sum()))").packages(["numpy"]));
    assert_eq!(stdout(&r), "6\n", "{r:?}");
}

#[test]
fn what_a_pod_cannot_enforce_is_refused_by_name_before_anything_runs() {
    let Some(k) = backend() else { return };
    let refused = |request: ExecRequest, control: &str| match Executor::run_on(k, request) {
        Err(ExecError::Refused { rejections }) => {
            let text = format!("{rejections:?}").to_lowercase();
            assert!(text.contains(control), "{control}: {text}");
        }
        other => panic!("{control}: {other:?}"),
    };
    refused(python("1").policy(SandboxPolicy::strict().max_processes(10)), "processes");
    refused(python("1").policy(SandboxPolicy::strict().network(Access::Allow(vec!["example.com".into()]))), "network");
    let big = python(&"#".repeat(1 << 20)).policy(SandboxPolicy::strict().max_code_bytes(2 << 20));
    assert!(matches!(Executor::run_on(k, big), Err(ExecError::InvalidRequest(_))));
}

#[test]
fn expired_objects_of_a_dead_host_are_swept() {
    let Some(k) = backend() else { return };
    // What a host killed long ago left: an object whose expiry has passed.
    let name = format!("execbox-swept-{}", std::process::id());
    kubectl(&["create", "configmap", &name]);
    kubectl(&["label", "configmap", &name, "app.kubernetes.io/managed-by=execbox"]);
    kubectl(&["annotate", "configmap", &name, "execbox.dev/expires=1"]);
    assert_eq!(objects(&name).len(), 1);
    k.sweep();
    assert!(objects(&name).is_empty(), "{:?}", objects(&name));
}

/// Run by [`a_host_killed_mid_run_leaves_nothing_after_the_deadline_and_sweep`]
/// in a child process it kills.
#[test]
#[ignore = "the child of a_host_killed_mid_run_leaves_nothing_after_the_deadline_and_sweep"]
fn host_killed_mid_run_child() {
    let Some(k) = backend() else { return };
    let policy = SandboxPolicy::strict().timeout(Duration::from_secs(6));
    drop(Executor::run_on(k, shell("sleep 1000").policy(policy)));
}

#[test]
fn a_host_killed_mid_run_leaves_nothing_after_the_deadline_and_sweep() {
    let Some(k) = backend() else { return };
    let mut child = Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", "host_killed_mid_run_child", "--ignored", "--nocapture"])
        .spawn()
        .expect("spawn the child host");
    let part = format!("execbox-{}-", child.id());
    let start = Instant::now();
    let runs = || kubectl(&["get", "pods", "-l", "execbox.dev/role=run", "-o", "name"]);
    while !runs().contains(&part) {
        assert!(start.elapsed() < Duration::from_secs(60), "the child made no pod");
        std::thread::sleep(Duration::from_millis(200));
    }
    let seen = Instant::now();
    let listed = k.leftovers().expect("the namespace answers");
    assert!(listed.iter().any(|name| name.starts_with(&part)), "execbox backends lists it: {listed:?}");
    child.kill().expect("kill the child host");
    drop(child.wait());
    // Past the pod's expiry (deadline + 2 s + 2 s + 10 s), a sweep removes it.
    std::thread::sleep(Duration::from_secs(21).saturating_sub(seen.elapsed()));
    k.sweep();
    assert!(objects(&part).is_empty(), "{:?}", objects(&part));
}

/// deploy/kubernetes/rbac.yaml is all the backend needs: the backend runs
/// as its service account, which cannot read Secrets or make pods outside
/// its namespace.
#[test]
fn the_backend_runs_as_the_least_privileged_service_account() {
    if backend().is_none() {
        return;
    }
    let _pool = PoolGuard(216);
    let rbac = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/kubernetes/rbac.yaml");
    kubectl(&["apply", "-f", rbac]);
    let dir = tempfile::tempdir().unwrap();
    let path = account_kubeconfig("execbox", dir.path());
    let as_account = Kubernetes::new(KubernetesConfig::default().kubeconfig(&path)).unwrap();
    as_account.availability().expect("available with the Role's rights only");
    let r = run(&as_account, python("print(1+1)").collect_output_files());
    assert_eq!(r.output, Some(json!(2)), "{r:?}");
    // Warm too: a claim is a patch of the pod, and the run goes in over attach.
    let warm = warm_backend_as(&path, 216, 1).expect("a warm pool");
    let (r, _) = where_am_i(&warm, 216);
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    let seen = r.output.expect("json");
    assert!(seen["left"].as_array().unwrap().contains(&json!("out")), "a warm pod (its /work/out): {seen}");
    drop(warm);
    as_account.sweep();
    let can = |args: &[&str]| {
        let kubectl = std::env::var_os("EXECBOX_KUBECTL").unwrap_or_else(|| "kubectl".into());
        let out =
            Command::new(kubectl).arg("--kubeconfig").arg(&path).args(["auth", "can-i"]).args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(can(&["get", "secrets", "-n", "execbox"]), "no");
    assert_eq!(can(&["list", "secrets", "-n", "execbox"]), "no");
    assert_eq!(can(&["create", "pods", "-n", "default"]), "no");
    assert_eq!(can(&["create", "pods", "-n", "execbox"]), "yes");
}

/// A kubeconfig in `dir` with the token of service account `account` (of
/// namespace execbox) and the cluster of [`kubeconfig`].
fn account_kubeconfig(account: &str, dir: &std::path::Path) -> PathBuf {
    use base64::Engine as _;
    let start = Instant::now();
    let secret = loop {
        let name = kubectl(&["get", "serviceaccount", account, "-o", "jsonpath={.secrets[0].name}"]);
        if !name.is_empty() {
            break name;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no token for the service account {account}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let token = kubectl(&["get", "secret", &secret, "-o", "jsonpath={.data.token}"]);
    let token = String::from_utf8(base64::engine::general_purpose::STANDARD.decode(token).unwrap()).unwrap();
    let cluster = |field: &str| {
        kubectl(&["config", "view", "--raw", "-o", &format!("jsonpath={{.clusters[0].cluster.{field}}}")])
    };
    let (server, ca) = (cluster("server"), cluster("certificate-authority-data"));
    let path = dir.join(format!("{account}.kubeconfig"));
    let config = json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa", "namespace": "execbox"}}],
    });
    std::fs::write(&path, config.to_string()).unwrap();
    path
}

/// A claimed warm pod that cannot be attached (here: a Role without
/// pods/attach, as rbac.yaml was before warm pools) has received nothing of
/// the run, so the run goes to a cold pod instead of failing.
#[test]
fn a_warm_pod_that_cannot_be_attached_hands_its_run_to_a_cold_pod() {
    if backend().is_none() {
        return;
    }
    let _pool = PoolGuard(224);
    let rbac = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/kubernetes/rbac.yaml")).unwrap();
    // rbac.yaml's account and Role under another name, without pods/attach.
    let no_attach: Vec<String> = rbac
        .split("\n---\n")
        .filter(|doc| !doc.contains("kind: Namespace"))
        .map(|doc| {
            doc.replace("name: execbox-runs", "name: execbox-no-attach")
                .replace("name: execbox\n", "name: execbox-no-attach\n")
                .replace(
                    "  - apiGroups: [\"\"]\n    resources: [\"pods/attach\"]\n    verbs: [\"get\", \"create\"]\n",
                    "",
                )
        })
        .collect();
    let no_attach = no_attach.join("\n---\n");
    assert!(!no_attach.contains("pods/attach") && no_attach.contains("name: execbox-no-attach"), "{no_attach}");
    let dir = tempfile::tempdir().unwrap();
    let manifest = dir.path().join("no-attach.yaml");
    std::fs::write(&manifest, &no_attach).unwrap();
    kubectl(&["apply", "-f", manifest.to_str().unwrap()]);
    struct Remove(PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            kubectl(&["delete", "-f", self.0.to_str().unwrap(), "--ignore-not-found"]);
        }
    }
    let _remove = Remove(manifest);
    let path = account_kubeconfig("execbox-no-attach", dir.path());
    let warm = warm_backend_as(&path, 224, 1).expect("a warm pool");
    let (r, _) = where_am_i(&warm, 224);
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    let seen = r.output.expect("json");
    assert_eq!(seen["sum"], json!(6), "{seen}");
    assert!(!seen["left"].as_array().unwrap().contains(&json!("out")), "a cold pod (no /work/out): {seen}");
    // The claimed pod is gone with the run, never handed to another.
    drop(warm);
}

/// A backend with a warm pool of `pods` at `memory_mib` (a pool of its own).
fn warm_backend(memory_mib: u64, pods: usize) -> Option<Kubernetes> {
    backend()?;
    warm_backend_as(&kubeconfig(), memory_mib, pods)
}

/// [`warm_backend`] with the credentials of `kubeconfig`.
fn warm_backend_as(kubeconfig: &std::path::Path, memory_mib: u64, pods: usize) -> Option<Kubernetes> {
    let defaults = execbox::RunDefaults::default().timeout(Duration::from_secs(60)).memory_bytes(memory_mib << 20);
    let cfg = KubernetesConfig::default().kubeconfig(kubeconfig).defaults(defaults).warm_pods(pods);
    let backend = Kubernetes::new(cfg).expect("a backend");
    backend.availability().expect("available");
    let start = Instant::now();
    while backend.readiness().is_none_or(|r| r.ready < pods) {
        assert!(start.elapsed() < Duration::from_secs(90), "the warm pool never filled: {:?}", backend.readiness());
        std::thread::sleep(Duration::from_millis(250));
    }
    Some(backend)
}

/// Removes a warm pool's pods and ConfigMaps when dropped, after the
/// backends (declared after it, so dropped first: their refill stops with
/// them), whether the test passed or not.
struct PoolGuard(u64);

impl PoolGuard {
    /// The pods and ConfigMaps of the pools at this memory cap (the plain
    /// one, `python-<hash>-<MiB>mi`, and any package set's, `data-<hash>-<MiB>mi`).
    fn objects(&self) -> Vec<String> {
        let listed = kubectl(&[
            "get",
            "pods,configmaps",
            "-l",
            "execbox.dev/pool",
            "-o",
            r#"jsonpath={range .items[*]}{.kind}/{.metadata.name} {.metadata.labels.execbox\.dev/pool}{"\n"}{end}"#,
        ]);
        let suffix = format!("-{}mi", self.0);
        listed
            .lines()
            .filter_map(|line| line.split_once(' '))
            .filter(|(_, pool)| pool.ends_with(&suffix))
            .map(|(object, _)| object.to_lowercase())
            .collect()
    }
}

impl Drop for PoolGuard {
    fn drop(&mut self) {
        // A create the dropped refill had sent lands first.
        std::thread::sleep(Duration::from_millis(500));
        let objects = self.objects();
        if !objects.is_empty() {
            let mut args = vec!["delete", "--grace-period=0", "--force", "--wait=false", "--ignore-not-found"];
            args.extend(objects.iter().map(String::as_str));
            kubectl(&args);
        }
        // A dropped backend's refill is over: nothing comes back.
        std::thread::sleep(Duration::from_secs(3));
        let left = self.objects();
        if !std::thread::panicking() {
            assert!(left.is_empty(), "the pool refilled after its backends were dropped: {left:?}");
        }
    }
}

/// What a run reports of the pod it ran in, and of what an earlier run left.
const WHERE_AM_I: &str = r#"
import json, os, socket
seen = {"pod": socket.gethostname(), "left": sorted(os.listdir("/tmp")) + sorted(os.listdir("/work")),
        "sum": sum(input["items"]), "file": open("data.txt").read()}
open("/tmp/marker", "w").write("x")
print(json.dumps(seen))
"#;

/// Runs [`WHERE_AM_I`] at the memory cap of pool `memory_mib`.
fn where_am_i(backend: &Kubernetes, memory_mib: u64) -> (ExecResult, Duration) {
    let policy = SandboxPolicy::strict().timeout(Duration::from_secs(30)).memory_bytes(memory_mib << 20);
    let request = python(WHERE_AM_I)
        .input(json!({"items": [1, 2, 3]}))
        .input_file(ExecFile::new("data.txt", "staged"))
        .policy(policy);
    let started = Instant::now();
    let r = run(backend, request);
    (r, started.elapsed())
}

#[test]
fn warm_pods_run_once_each_and_an_empty_pool_falls_back_to_cold() {
    let _pool = PoolGuard(200);
    let Some(warm) = warm_backend(200, 2) else { return };
    let mut pods = Vec::new();
    for _ in 0..3 {
        let (r, took) = where_am_i(&warm, 200);
        assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
        let seen = r.output.clone().expect("json");
        assert_eq!((seen["sum"].clone(), seen["file"].clone()), (json!(6), json!("staged")), "{seen}");
        // A warm pod has /work/out mounted whether the run collects or not.
        let left: Vec<&Value> = seen["left"].as_array().unwrap().iter().filter(|n| *n != "out").collect();
        assert_eq!(left, [&json!("data.txt"), &json!("input.json")], "a fresh pod: {seen}");
        eprintln!("run on {} took {took:?}", seen["pod"]);
        pods.push(seen["pod"].as_str().unwrap().to_string());
    }
    pods.sort();
    pods.dedup();
    assert_eq!(pods.len(), 3, "never reused: {pods:?}");
}

/// A plain warm pod's launcher has Python waiting; a run it does not fit
/// (shell, Python with its own environment) gets a fresh program on the
/// same warm pod, and the waiting Python is gone before it starts. What
/// the adversarial pass found a warm pod could not take (300 small files,
/// a file named `out`) runs as it would cold.
#[test]
fn a_warm_pod_runs_shell_and_python_with_an_environment_as_fresh_programs() {
    let _pool = PoolGuard(232);
    let Some(warm) = warm_backend(232, 1) else { return };
    let policy = || {
        SandboxPolicy::strict()
            .timeout(Duration::from_secs(30))
            .memory_bytes(232 << 20)
            .environment(Access::Allow(vec!["COLOUR".into()]))
    };
    let wait_ready = || {
        let start = Instant::now();
        while warm.readiness().is_none_or(|r| r.ready < 1) {
            assert!(start.elapsed() < Duration::from_secs(90), "the pool never refilled");
            std::thread::sleep(Duration::from_millis(250));
        }
    };
    wait_ready();
    // /work/out is mounted on every warm pod, on a cold one only when collecting.
    let script = r#"test -d /work/out && echo warm; echo "$COLOUR"
n=0; for p in /proc/[0-9]*; do case "$(tr '\0' ' ' < $p/cmdline 2>/dev/null)" in *_execbox_warm*) n=$((n+1));; esac; done
echo $n"#;
    let r = run(&warm, shell(script).env("COLOUR", "blue").policy(policy()));
    assert_eq!((r.outcome, stdout(&r)), (Outcome::Ok, "warm\nblue\n0\n".to_string()), "{r:?}");
    wait_ready();
    let code = "import os, sys; print(os.path.isdir('/work/out'), os.environ['COLOUR'], sys.argv[1:])";
    let r = run(&warm, python(code).env("COLOUR", "red").arg("x").policy(policy()));
    assert_eq!((r.outcome, stdout(&r)), (Outcome::Ok, "True red ['x']\n".to_string()), "{r:?}");
    // Many small files (a page each) fit a warm pod's /work: it is the
    // memory cap's size, not the 1 MiB an empty cold job would have.
    wait_ready();
    let mut many = python("import os; print(len(os.listdir('/work')), os.path.isdir('/work/out'))").policy(policy());
    for i in 0..300 {
        many = many.input_file(ExecFile::new(format!("f{i}.txt"), "x"));
    }
    let r = run(&warm, many);
    assert_eq!((r.outcome, stdout(&r)), (Outcome::Ok, "301 True\n".to_string()), "{r:?}");
    // A file staged at `out` (not collecting) cannot share a warm pod's
    // /work/out mount: the run goes cold, as it would without a pool.
    wait_ready();
    let staged_out = python("print(open('/work/out').read())").input_file(ExecFile::new("out", "data"));
    let r = run(&warm, staged_out.policy(policy()));
    assert_eq!((r.outcome, stdout(&r)), (Outcome::Ok, "data\n".to_string()), "{r:?}");
}

/// Whether pandas was imported before the code ran, and where it ran.
const PANDAS_PRELOADED: &str = r#"
import json, socket, sys
preloaded = "pandas" in sys.modules
import pandas
print(json.dumps({"preloaded": preloaded, "pod": socket.gethostname(), "sum": int(pandas.Series(input["items"]).sum()),
                  "file": open("data.txt").read()}))
"#;

/// A run with packages takes a warm pod of its package set, whose Python
/// imported them before the run came: the set's first run is cold and
/// starts the pool; later ones are warm, each on a pod of its own; a run
/// with environment values (which that Python did not start with) or
/// another memory cap stays cold.
#[test]
fn a_package_set_gets_warm_pods_with_its_packages_imported() {
    let _pool = PoolGuard(320);
    let Some(warm) = warm_backend(320, 1) else { return };
    let pandas = |memory_mib: u64| {
        python(PANDAS_PRELOADED)
            .packages(["pandas"])
            .input(json!({"items": [1, 2, 3]}))
            .input_file(ExecFile::new("data.txt", "staged"))
            .policy(SandboxPolicy::strict().timeout(Duration::from_secs(60)).memory_bytes(memory_mib << 20))
    };
    let first = run(&warm, pandas(320));
    assert_eq!(first.outcome, Outcome::Ok, "{first:?}");
    assert_eq!(first.output.as_ref().unwrap()["preloaded"], json!(false), "the set's first run is cold: {first:?}");
    let filled = || {
        let start = Instant::now();
        // The plain pool's pod and the package set's.
        while warm.readiness().is_none_or(|r| r.ready < 2) {
            assert!(start.elapsed() < Duration::from_secs(90), "the pools never filled: {:?}", warm.readiness());
            std::thread::sleep(Duration::from_millis(250));
        }
    };
    let mut pods = Vec::new();
    for _ in 0..2 {
        filled();
        let started = Instant::now();
        let r = run(&warm, pandas(320));
        assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
        let seen = r.output.clone().expect("json");
        assert_eq!((seen["sum"].clone(), seen["file"].clone()), (json!(6), json!("staged")), "{seen}");
        assert_eq!(seen["preloaded"], json!(true), "a warm pod of the set: {r:?}");
        eprintln!("pandas run on {} took {:?}", seen["pod"], started.elapsed());
        pods.push(seen["pod"].as_str().unwrap().to_string());
    }
    pods.dedup();
    assert_eq!(pods.len(), 2, "never reused: {pods:?}");
    let with_env = run(
        &warm,
        pandas(320).env("COLOUR", "blue").policy(
            SandboxPolicy::strict()
                .timeout(Duration::from_secs(60))
                .memory_bytes(320 << 20)
                .environment(Access::Allow(vec!["COLOUR".into()])),
        ),
    );
    assert_eq!(with_env.output.as_ref().map(|o| o["preloaded"].clone()), Some(json!(false)), "{with_env:?}");
    let other_cap = run(&warm, pandas(336));
    assert_eq!(other_cap.output.as_ref().map(|o| o["preloaded"].clone()), Some(json!(false)), "{other_cap:?}");
}

/// A package set's pool that no run of this backend claims from for
/// `warm_lifetime` is given up: no more refills, its waiting pods deleted,
/// its place free; the set's next run is cold again and starts it anew.
#[test]
fn an_idle_package_pool_is_given_up_and_started_again() {
    let _pool = PoolGuard(240);
    let Some(_) = backend() else { return };
    let defaults = execbox::RunDefaults::default().timeout(Duration::from_secs(60)).memory_bytes(240 << 20);
    let cfg = KubernetesConfig::default()
        .kubeconfig(kubeconfig())
        .defaults(defaults)
        .warm_pods(1)
        .warm_lifetime(Duration::from_secs(20));
    let warm = Kubernetes::new(cfg).expect("a backend");
    warm.availability().expect("available");
    let pandas = || {
        python(PANDAS_PRELOADED)
            .packages(["pandas"])
            .input(json!({"items": [1, 2, 3]}))
            .input_file(ExecFile::new("data.txt", "staged"))
            .policy(SandboxPolicy::strict().timeout(Duration::from_secs(60)).memory_bytes(240 << 20))
    };
    let preloaded = |r: &ExecResult| r.output.as_ref().map(|o| o["preloaded"].clone());
    let waiting_pandas_pods = || {
        let pools = r#"jsonpath={range .items[*]}{.metadata.labels.execbox\.dev/pool}{"\n"}{end}"#;
        kubectl(&["get", "pods", "-l", "execbox.dev/state=ready", "-o", pools])
            .lines()
            .filter(|pool| pool.starts_with("data-") && pool.ends_with("-240mi"))
            .count()
    };
    let until = |what: &str, done: &dyn Fn() -> bool| {
        let start = Instant::now();
        while !done() {
            assert!(start.elapsed() < Duration::from_secs(90), "{what}: {:?}", warm.readiness());
            std::thread::sleep(Duration::from_millis(250));
        }
    };
    let first = run(&warm, pandas());
    assert_eq!(preloaded(&first), Some(json!(false)), "the set's first run is cold: {first:?}");
    until("the plain and the pandas pool fill", &|| warm.readiness().is_some_and(|r| r.target == 2 && r.ready >= 2));
    let claimed = run(&warm, pandas());
    assert_eq!(preloaded(&claimed), Some(json!(true)), "{claimed:?}");
    // 20 s without a claim: only the plain pool is left, and the set's
    // waiting pods are gone.
    until("the idle pool is given up", &|| warm.readiness().is_some_and(|r| r.target == 1));
    until("its waiting pods are deleted", &|| waiting_pandas_pods() == 0);
    let again = run(&warm, pandas());
    assert_eq!(preloaded(&again), Some(json!(false)), "cold once the pool is gone: {again:?}");
    assert_eq!(warm.readiness().map(|r| r.target), Some(2), "started again");
}

/// A package pool whose Python cannot get ready (here its imports do not
/// fit the memory cap) backs off: its pods end before any run claims them,
/// and the refill deletes them and waits, doubling, instead of making one
/// a second to fail the same way.
#[test]
fn a_package_pool_that_cannot_get_ready_backs_off() {
    let _pool = PoolGuard(48);
    let Some(warm) = warm_backend(48, 1) else { return };
    let heavy = python("import pandas, matplotlib.pyplot")
        .packages(["pandas", "matplotlib"])
        .policy(SandboxPolicy::strict().timeout(Duration::from_secs(60)).memory_bytes(48 << 20));
    let cold = run(&warm, heavy);
    assert_eq!(cold.outcome, Outcome::OutOfMemory, "the same imports fail cold: {cold:?}");
    let mut seen = std::collections::BTreeSet::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(25) {
        let listed = kubectl(&[
            "get",
            "pods",
            "-l",
            "execbox.dev/pool",
            "-o",
            r#"jsonpath={range .items[*]}{.metadata.name} {.metadata.labels.execbox\.dev/pool}{"\n"}{end}"#,
        ]);
        let data = listed
            .lines()
            .filter_map(|l| l.split_once(' '))
            .filter(|(_, pool)| pool.starts_with("data-") && pool.ends_with("-48mi"));
        seen.extend(data.map(|(name, _)| name.to_string()));
        std::thread::sleep(Duration::from_millis(500));
    }
    let data: Vec<&String> = seen.iter().collect();
    assert!(!data.is_empty(), "the package pool was started");
    assert!(data.len() <= 3, "the pool made a pod a second: {data:?}");
}

#[test]
fn two_replicas_never_claim_one_warm_pod() {
    let _pool = PoolGuard(208);
    let Some(a) = warm_backend(208, 3) else { return };
    let b = {
        let defaults = execbox::RunDefaults::default().timeout(Duration::from_secs(60)).memory_bytes(208 << 20);
        let cfg = KubernetesConfig::default().kubeconfig(kubeconfig()).defaults(defaults).warm_pods(3);
        Kubernetes::new(cfg).unwrap()
    };
    b.availability().unwrap();
    let pods: Vec<String> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..6)
            .map(|i| {
                let backend = if i % 2 == 0 { &a } else { &b };
                scope.spawn(move || where_am_i(backend, 208).0)
            })
            .collect();
        runs.into_iter()
            .map(|run| {
                let r = run.join().unwrap();
                assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
                r.output.unwrap()["pod"].as_str().unwrap().to_string()
            })
            .collect()
    });
    let mut distinct = pods.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 6, "a pod ran two runs: {pods:?}");
}

/// Replicas whose claims empty a shared pool at once refill it once: they
/// take turns at its refill lease and count again before creating (before
/// the lease, each listed the emptied pool and filled it).
#[test]
fn replicas_refilling_at_once_fill_a_pool_once() {
    let pool = PoolGuard(280);
    let Some(a) = warm_backend(280, 2) else { return };
    let Some(b) = warm_backend(280, 2) else { return };
    let waiting = || {
        let ready = kubectl(&["get", "pods", "-l", "execbox.dev/state=ready", "-o", "name"]);
        let ours = pool.objects();
        ready.lines().filter(|p| ours.iter().any(|o| o == p)).count()
    };
    for _ in 0..3 {
        // Both claim at once, and both refills wake at once.
        std::thread::scope(|scope| {
            for replica in [&a, &b] {
                scope.spawn(move || assert_eq!(where_am_i(replica, 280).0.outcome, Outcome::Ok));
            }
        });
        let start = Instant::now();
        while waiting() < 2 {
            assert!(start.elapsed() < Duration::from_secs(90), "the pool never refilled");
            std::thread::sleep(Duration::from_millis(250));
        }
        // Every replica's refill has run a few rounds since.
        std::thread::sleep(Duration::from_secs(3));
        assert_eq!(waiting(), 2, "the pool was filled more than once: {:?}", pool.objects());
    }
}

// ---- what the adversarial pass found (each class a test) --------------------

/// A backend under execbox's seccomp profile never claims a warm pod made
/// without it (an adversarial pass saw io_uring reach the kernel from a
/// warm run: the pool's name had left the profile out).
#[test]
fn a_warm_pod_made_without_the_profile_is_never_claimed_by_a_backend_with_it() {
    let _pool = PoolGuard(288);
    let Some(unfiltered) = warm_backend(288, 2) else { return };
    let defaults = execbox::RunDefaults::default().timeout(Duration::from_secs(60)).memory_bytes(288 << 20);
    let cfg = KubernetesConfig::default()
        .kubeconfig(kubeconfig())
        .defaults(defaults)
        .warm_pods(1)
        .seccomp_profile(SECCOMP_PROFILE);
    let filtered = Kubernetes::new(cfg).expect("a backend");
    filtered.availability().expect("available");
    let code =
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nprint(libc.syscall(425, 0, 0), ctypes.get_errno())";
    let policy = SandboxPolicy::strict().timeout(Duration::from_secs(30)).memory_bytes(288 << 20);
    for _ in 0..3 {
        let r = run(&filtered, python(code).policy(policy.clone()));
        assert_eq!(stdout(&r), "-1 1\n", "io_uring_setup is EPERM on every run: {r:?}");
    }
    drop(unfiltered);
}

#[test]
fn the_program_cannot_end_the_launcher_with_sigint_and_starts_with_default_signals() {
    let Some(k) = backend() else { return };
    let r = run(k, shell("echo before; kill -INT 1; kill -TERM 1; sleep 1; echo after"));
    assert_eq!((r.outcome, stdout(&r)), (Outcome::Ok, "before\nafter\n".to_string()), "{r:?}");
    // SIGPIPE at its default: `yes` ends quietly when `head` is done.
    let r = run(k, shell("yes | head -n 1"));
    assert_eq!((stdout(&r), r.stderr.text().into_owned()), ("y\n".to_string(), String::new()), "{r:?}");
}

#[test]
fn a_slow_output_tap_holds_only_its_own_run() {
    let Some(k) = backend() else { return };
    let tap = execbox::limits::OutputTap::new(|_, _| std::thread::sleep(Duration::from_secs(4)));
    let slow = std::thread::spawn(move || {
        let request = shell("for i in 1 2 3 4; do echo $i; sleep 0.5; done").tap_output(tap);
        Executor::run_on(k, request)
    });
    std::thread::sleep(Duration::from_secs(4));
    let started = Instant::now();
    let r = run(k, shell("echo ok").policy(SandboxPolicy::strict().timeout(Duration::from_secs(10))));
    assert_eq!((r.outcome, stdout(&r)), (Outcome::Ok, "ok\n".to_string()), "took {:?}", started.elapsed());
    drop(slow.join());
}

#[test]
fn one_backends_shutdown_leaves_another_backends_runs_alone() {
    let Some(k) = backend() else { return };
    let other = Kubernetes::new(KubernetesConfig::default().kubeconfig(kubeconfig())).expect("a backend");
    let running = std::thread::spawn(move || run(k, shell("sleep 4; echo done")));
    std::thread::sleep(Duration::from_secs(2));
    other.shutdown();
    let r = running.join().expect("the run");
    assert_eq!((r.outcome, stdout(&r)), (Outcome::Ok, "done\n".to_string()), "{r:?}");
}

#[test]
fn limits_no_pod_can_take_get_typed_answers_at_once() {
    let Some(k) = backend() else { return };
    let started = Instant::now();
    match Executor::run_on(k, shell("echo x").policy(patient().memory_bytes(1 << 40))) {
        Err(ExecError::Busy { reason, .. }) => assert!(reason.contains("Insufficient memory"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
    let huge = shell("echo x").policy(SandboxPolicy::strict().memory_bytes(u64::MAX));
    assert!(matches!(Executor::run_on(k, huge), Err(ExecError::InvalidRequest(_))));
    // A deadline decades away (past what activeDeadlineSeconds or select take).
    let far =
        run(k, shell("echo far").policy(SandboxPolicy::strict().timeout(Duration::from_millis(10_000_000_000_000))));
    assert_eq!((far.outcome, stdout(&far)), (Outcome::Ok, "far\n".to_string()), "{far:?}");
    // Within each limit alone, over the ConfigMap together.
    let mut crowded = python(&"#".repeat(690 << 10));
    let names: Vec<String> = (0..14).map(|i| format!("V{i}")).collect();
    for name in &names {
        crowded = crowded.env(name, "x".repeat(32 << 10));
    }
    let crowded = crowded.policy(patient().environment(Access::Allow(names)));
    assert!(
        matches!(Executor::run_on(k, crowded), Err(ExecError::InvalidRequest(_))),
        "code and environment over a ConfigMap"
    );
}

#[test]
fn input_file_names_follow_the_docker_backends_rules() {
    let Some(k) = backend() else { return };
    let invalid = |request: ExecRequest, what: &str| {
        assert!(matches!(Executor::run_on(k, request), Err(ExecError::InvalidRequest(_))), "{what}");
    };
    let file = |name: &str| ExecFile::new(name, "1");
    invalid(python("1").input(json!(1)).input_file(file("input.json")), "beside the JSON input");
    invalid(python("1").input_file(file("a")).input_file(file("./a")), "twice");
    invalid(python("1").input_file(file("a")).input_file(file("a/b")), "a file and a directory");
    invalid(python("1").input_file(file("a/b")).input_file(file("a")), "a directory and a file");
    invalid(python("1").input_file(file("../x")), "..");
    invalid(python("1").input_file(file("/work/x")), "absolute");
    invalid(python("1").input_file(file("")), "empty");
    invalid(python("1").collect_output_files().input_file(file("out/x")), "out/ while collecting");
    let r = run(k, shell("cat d/e.txt out/x").input_file(file("./d//e.txt")).input_file(file("out/x")));
    assert_eq!((r.outcome, stdout(&r)), (Outcome::Ok, "11".to_string()), "{r:?}");
}

#[test]
fn memory_filled_through_tmpfs_is_out_of_memory() {
    let Some(k) = backend() else { return };
    let code = "open('/tmp/a','wb').write(b'x' * (60 << 20))\nopen('/dev/shm/b','wb').write(b'x' * (60 << 20))";
    for _ in 0..2 {
        let r = run(k, python(code).policy(patient().memory_bytes(96 << 20)));
        assert_eq!(r.outcome, Outcome::OutOfMemory, "{r:?}");
    }
}

#[test]
fn a_warm_pool_is_gone_with_its_backends_shutdown() {
    let pool = PoolGuard(248);
    let Some(warm) = warm_backend(248, 2) else { return };
    warm.shutdown();
    std::thread::sleep(Duration::from_secs(3));
    let left = pool.objects();
    assert!(left.is_empty(), "{left:?}");
}

// ---- Code Mode: tools from pods ---------------------------------------------

/// One Code Mode test at a time: each checks that no tool socket directory
/// of this process is left.
fn tools_serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A Code Mode test's turn (see [`tools_serial`]), and an executor on the
/// shared backend with the tools every carrier's tests call (`slow.sleep`
/// seen by `probe`).
struct CodeMode {
    _serial: std::sync::MutexGuard<'static, ()>,
    probe: std::sync::Arc<common::tools::Probe>,
    exec: Executor,
}

/// [`CodeMode`], or `None`: skipped.
fn code_mode() -> Option<CodeMode> {
    let _serial = tools_serial();
    let probe = std::sync::Arc::new(common::tools::Probe::default());
    let exec = Executor::builder().backend(backend()?.clone()).tools(common::tools::registry(&probe)).build();
    Some(CodeMode { _serial, probe, exec })
}

/// `code` granted `grants`, with room for a pod's start.
fn granted(language: Language, code: &str, grants: &[&str]) -> ExecRequest {
    common::tools::source(language, code, Duration::from_secs(60), grants)
}

/// This process's tool socket directories still on the host.
fn socket_dirs() -> Vec<String> {
    common::procfs::temp_dirs("execbox-tools-", execbox::backends::Container::owner_token())
}

#[test]
fn python_in_a_pod_calls_tools_with_every_form_of_the_api_and_the_ledger() {
    use common::tools::*;
    let Some(CodeMode { _serial, probe: _, exec }) = code_mode() else { return };
    let request = granted(Language::Python, PYTHON_ROUND_TRIP, &["math.*", "echo.args"]).input(json!({"n": 1}));
    let r = exec.execute_blocking(request).expect("runs");
    assert_python_round_trip("pod", &r);
    assert_eq!(r.backend, "kubernetes");
    let r = exec.execute_blocking(granted(Language::Python, PYTHON_ERRORS, ERROR_GRANTS)).expect("runs");
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(r.output, Some(python_errors_output()), "{r:?}");
    assert_error_ledger("pod", &r.tool_calls);
    // A call loop stops at the budget; a 100 MiB result comes cut.
    let code = "\
import json, tools
big = tools.big.blob()
n = 0
try:
    while True:
        tools.math.add(a=n, b=1)
        n += 1
except tools.ToolError as e:
    print(json.dumps({'made': n, 'kind': e.kind, 'len': len(big), 'cut': big.endswith('…')}))";
    let request = with_limits(granted(Language::Python, code, &["math.*", "big.*"]), |p| {
        p.tool_limits(execbox::tools::ToolLimits::default().max_calls(4))
    });
    let r = exec.execute_blocking(request).expect("runs");
    let out = r.output.clone().unwrap_or_else(|| panic!("JSON: {r:?}"));
    assert_eq!(
        (out["made"].clone(), out["kind"].clone(), out["cut"].clone()),
        (json!(3), json!("budget_exhausted"), json!(true)),
        "{r:?}"
    );
    assert!(out["len"].as_u64().unwrap() < 300 << 10, "{r:?}");
    // Without a grant: no module, no socket, no variable (the job's
    // directory is there, read-only, as in every pod).
    let code = "\
import json, os
try:
    import tools
    found = True
except ModuleNotFoundError:
    found = False
print(json.dumps([found, os.path.exists('/run/execbox/tools.sock'), 'EXECBOX_TOOLS' in os.environ]))";
    let r = exec.execute_blocking(granted(Language::Python, code, &[])).expect("runs");
    assert_eq!(r.output, Some(json!([false, false, false])), "{r:?}");
    assert!(socket_dirs().is_empty(), "{:?}", socket_dirs());
}

#[test]
fn shell_and_rust_in_pods_call_tools_with_their_tool_command_and_module() {
    use common::tools::*;
    use execbox::tools::{ToolCallOutcome, ToolErrorKind};
    let Some(CodeMode { _serial, probe: _, exec }) = code_mode() else { return };
    let script = r#"
set -u
sum=$(tool math.add '{"a": 2, "b": 3}')
piped=$(echo '{"a": 40, "b": 2}' | tool math.add -)
failed=0
tool fail.always 2>/tmp/err.json || failed=$?
denied=0
tool slow.sleep 2>/tmp/denied.json || denied=$?
for n in 1 2 3 4; do tool pace.add "{\"a\": $n, \"b\": 10}" > /tmp/r$n & done; wait
printf '{"sum": %s, "piped": %s, "failed": %s, "error": %s, "denied": [%s, %s], "env": "%s", "pace": [%s]}\n' \
  "$sum" "$piped" "$failed" "$(cat /tmp/err.json)" "$denied" "$(cat /tmp/denied.json)" "$EXECBOX_TOOLS" \
  "$(cat /tmp/r1 /tmp/r2 /tmp/r3 /tmp/r4 | paste -sd, -)"
"#;
    let r = exec.execute_blocking(granted(Language::Shell, script, &["math.*", "fail.*", "pace.*"])).expect("runs");
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(
        r.output,
        Some(json!({
            "sum": 5, "piped": 42, "failed": 1,
            "error": {"tool": "fail.always", "kind": "failed", "message": "it always fails"},
            "denied": [1, {"tool": "slow.sleep", "kind": "not_granted",
                           "message": "the run's policy does not grant this tool"}],
            "env": "/run/execbox/tools.sock", "pace": [11, 12, 13, 14],
        })),
        "{r:?}"
    );
    assert_eq!(r.tool_calls.len(), 8, "{:?}", r.tool_calls);
    // Without a grant there is no command.
    let r = exec.execute_blocking(granted(Language::Shell, "command -v tool || echo none", &[])).expect("runs");
    assert_eq!(stdout(&r), "none\n", "{r:?}");

    let code = r#"
use serde_json::json;

fn run(input: Value) -> Value {
    let sum = tools::call("math.add", json!({"a": input["a"], "b": 2})).unwrap();
    let err = tools::call("fail.always", json!({})).unwrap_err();
    json!({"sum": sum, "names": tools::list().unwrap(), "err": [err.tool, err.kind]})
}
"#;
    let request = granted(Language::Rust, code, &["math.*", "fail.*"]).input(json!({"a": 40}));
    let r = exec.execute_blocking(request).expect("runs");
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(
        r.output,
        Some(json!({"sum": 42, "names": ["fail.always", "math.add"], "err": ["fail.always", "failed"]})),
        "{r:?}"
    );
    assert_eq!(
        outcomes(&r.tool_calls),
        [
            ("math.add".into(), ToolCallOutcome::Ok, None),
            ("fail.always".into(), ToolCallOutcome::Error, Some(ToolErrorKind::Failed)),
        ]
    );
    assert!(socket_dirs().is_empty(), "{:?}", socket_dirs());
}

/// A hanging tool times out by its own limit; a run whose deadline comes
/// mid-call ends by it with the call unknown and no longer running; a
/// program that kills itself mid-call leaves the call unknown; and
/// neither a pod nor a socket directory is left.
#[test]
fn tool_calls_from_pods_end_with_their_run_and_leave_nothing() {
    use common::tools::*;
    use execbox::tools::{ToolCallOutcome, ToolErrorKind, ToolLimits};
    let Some(CodeMode { _serial, probe, exec }) = code_mode() else { return };
    let code = "\
import json, tools
try:
    tools.slow.sleep()
except tools.ToolError as e:
    print(json.dumps(e.kind))";
    let request = with_limits(granted(Language::Python, code, &["slow.*"]), |p| {
        p.tool_limits(ToolLimits::default().call_timeout_ms(300))
    });
    let r = exec.execute_blocking(request).expect("runs");
    assert_eq!((r.outcome, r.output.clone()), (Outcome::Ok, Some(json!("timed_out"))), "{r:?}");
    assert_eq!(
        outcomes(&r.tool_calls),
        [("slow.sleep".into(), ToolCallOutcome::Unknown, Some(ToolErrorKind::TimedOut))]
    );
    let limit = Duration::from_secs(8);
    let code = "import tools\ntools.slow.sleep()\nwhile True:\n    pass";
    let request = with_limits(granted(Language::Python, code, &["slow.*"]), |p| p.timeout(limit));
    let started = Instant::now();
    let r = exec.execute_blocking(request).expect("runs");
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    assert!(started.elapsed() < limit + Duration::from_secs(3), "took {:?}", started.elapsed());
    assert_eq!(r.tool_calls[0].outcome, ToolCallOutcome::Unknown, "{r:?}");
    probe.assert_nothing_running();
    // (The first call waits for the host to see the pod running, up to the
    // kubelet's next look at it; the next take milliseconds.)
    let code = "\
import os, threading, time, tools
tools.math.add(a=1, b=1)
threading.Thread(target=tools.slow.sleep, daemon=True).start()
time.sleep(1.5)
os.kill(os.getpid(), 9)";
    let r = exec.execute_blocking(granted(Language::Python, code, &["slow.*", "math.*"])).expect("runs");
    assert_eq!((r.outcome, r.exit_code), (Outcome::Failed, Some(137)), "{r:?}");
    assert_eq!(
        outcomes(&r.tool_calls),
        [("math.add".into(), ToolCallOutcome::Ok, None), ("slow.sleep".into(), ToolCallOutcome::Unknown, None)]
    );
    probe.assert_nothing_running();
    assert!(socket_dirs().is_empty(), "{:?}", socket_dirs());
}

/// Code in a pod that floods its socket — garbage, a line of 8 MB, calls
/// whose answers it never reads, far more connections than allowed — gets
/// the docker backend's typed answers where it reads them, the `tools`
/// module still works after, and the host's memory stays bounded.
#[test]
fn code_in_a_pod_that_floods_its_socket_gets_typed_answers_and_the_host_stays_bounded() {
    use common::tools::*;
    use execbox::tools::ToolLimits;
    let Some(CodeMode { _serial, probe: _, exec }) = code_mode() else { return };
    let before = common::procfs::own_rss_bytes();
    let request = with_limits(granted(Language::Python, &flood_code(8, 4, 30), &["math.*", "echo.*"]), |p| {
        p.tool_limits(ToolLimits::default().max_calls(10_000)).timeout(Duration::from_secs(120))
    });
    let r = exec.execute_blocking(request).expect("runs");
    assert_flood_answers(&r);
    let grown = common::procfs::own_rss_bytes().saturating_sub(before);
    assert!(grown < 256 << 20, "the host grew by {} MiB", grown >> 20);
    assert!(socket_dirs().is_empty(), "{:?}", socket_dirs());
}

/// A warm pod takes runs that call tools too (a fresh program, not the
/// waiting Python, which has no `tools` module): its attachment, made to
/// deliver the run, carries the answers, so no call waits for the pod's
/// start to be seen.
#[test]
fn warm_pods_take_runs_that_call_tools() {
    use common::tools::*;
    let _serial = tools_serial();
    let _pool = PoolGuard(264);
    let Some(warm) = warm_backend(264, 1) else { return };
    let probe = std::sync::Arc::new(Probe::default());
    let exec = Executor::builder().backend(warm.clone()).tools(registry(&probe)).build();
    let warm_policy = |p: SandboxPolicy| p.memory_bytes(264 << 20);
    let code = "\
import json, os, time, tools
started = time.time()
value = tools.math.add(a=2, b=3)
print(json.dumps({'value': value, 'warm': os.path.isdir('/work/out'), 'ms': (time.time() - started) * 1000}))";
    let r =
        exec.execute_blocking(with_limits(granted(Language::Python, code, &["math.*"]), warm_policy)).expect("runs");
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    let out = r.output.clone().expect("JSON");
    assert_eq!((out["value"].clone(), out["warm"].clone()), (json!(5), json!(true)), "{r:?}");
    eprintln!("a warm pod's first tool call took {} ms", out["ms"]);
    let start = Instant::now();
    while warm.readiness().is_none_or(|r| r.ready < 1) {
        assert!(start.elapsed() < Duration::from_secs(90), "the warm pool never refilled");
        std::thread::sleep(Duration::from_millis(250));
    }
    let script = "tool math.add '{\"a\": 1, \"b\": 1}'; test -d /work/out && echo warm";
    let r =
        exec.execute_blocking(with_limits(granted(Language::Shell, script, &["math.*"]), warm_policy)).expect("runs");
    assert_eq!((r.outcome, stdout(&r)), (Outcome::Ok, "2\nwarm\n".to_string()), "{r:?}");
    assert!(socket_dirs().is_empty(), "{:?}", socket_dirs());
}

/// What the adversarial pass of Code Mode in pods found, each class a
/// case: a program that removes its socket gets an ordinary result (the
/// launcher had died removing it again); connections closed before a byte
/// leave their places free (16 had used up the socket for the run); a
/// call written just before the program exits still reaches the tools, as
/// a container's; and writing past the run's cap of calls is said.
#[test]
fn code_mode_in_a_pod_survives_what_the_adversarial_pass_tried() {
    use common::tools::*;
    use execbox::tools::ToolLimits;
    let Some(CodeMode { _serial, probe: _, exec }) = code_mode() else { return };
    let code = "import os\nos.unlink(os.environ['EXECBOX_TOOLS'])\nprint('unlinked')";
    let r = exec.execute_blocking(granted(Language::Python, code, &["math.*"])).expect("runs");
    assert_eq!((r.outcome, stdout(&r)), (Outcome::Ok, "unlinked\n".to_string()), "{r:?}");

    let code = "\
import os, socket, tools
for _ in range(40):
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ['EXECBOX_TOOLS'])
    s.close()
print(tools.math.add(a=1, b=2))";
    let r = exec.execute_blocking(granted(Language::Python, code, &["math.*"])).expect("runs");
    assert_eq!((r.outcome, stdout(&r)), (Outcome::Ok, "3\n".to_string()), "{r:?}");

    let code = r#"
import os, socket
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ['EXECBOX_TOOLS'])
s.sendall(b'{"tool_call":{"id":1,"name":"math.add","args":{"a":1,"b":1}}}\n')
print('sent')"#;
    let r = exec.execute_blocking(granted(Language::Python, code, &["math.*"])).expect("runs");
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(r.tool_calls.iter().map(|c| c.tool.as_str()).collect::<Vec<_>>(), ["math.add"], "{r:?}");

    let code = "\
import os, socket
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ['EXECBOX_TOOLS'])
try:
    s.sendall(b'x' * (70 << 20))
    print('all sent')
except OSError:
    print('closed')";
    let request = with_limits(granted(Language::Python, code, &["math.*"]), |p| {
        p.tool_limits(ToolLimits::default()).timeout(Duration::from_secs(120))
    });
    let started = Instant::now();
    let r = exec.execute_blocking(request).expect("runs");
    eprintln!("70 MiB to the socket took {:?}", started.elapsed());
    assert_eq!((r.outcome, stdout(&r)), (Outcome::Ok, "closed\n".to_string()), "{r:?}");
    assert!(r.message.as_deref().unwrap_or_default().contains("over 64 MiB to its tool socket"), "{r:?}");
    assert!(socket_dirs().is_empty(), "{:?}", socket_dirs());
}
