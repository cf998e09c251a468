//! The container backend against a real engine: every locked flag, limit and
//! escape with the exact outcome, and the Rust pipeline.
//!
//! Tests that need an engine skip (with a printed reason) only when no engine
//! answers at all; with `EXECBOX_REQUIRE_CONTAINERS=1` (set by `.ci/run`) they
//! fail instead. An engine without execbox's images is a failure: run
//! `scripts/build-images.sh`.
#![cfg(feature = "container")]

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::programs::{DENIED_SYSCALLS, FLOOD_WORK_OUT, SECCOMP_PROFILE};
use common::{docker, process};
use execbox::backends::container::{ContainerConfig, KILL_GRACE, RustConfig};
use execbox::backends::{Container, WasmGuest};
use execbox::{
    Access, Backend, ConfigError, ExecError, ExecFile, ExecRequest, ExecResult, Executor, FailureKind, InvalidRequest,
    Language, Outcome, PathGrants, SandboxPolicy,
};
use serde_json::json;

/// A backend whose containers carry a label unique to this test, so the test
/// can check afterwards that none is left.
fn backend(label: &str) -> Option<Container> {
    backend_with(label, ContainerConfig::default())
}

fn backend_with(label: &str, cfg: ContainerConfig) -> Option<Container> {
    common::skip::labelled_container(label, cfg)
}

/// Containers (running or not) carrying this test's label.
fn leftovers(label: &str) -> Vec<String> {
    docker::ps(&["--all", "--filter", &docker::test_label(label)])
}

/// Running containers carrying this test's label.
fn running(label: &str) -> Vec<String> {
    docker::ps(&["--filter", &docker::test_label(label)])
}

/// What a fake engine's `run` prints for the availability check's seccomp
/// probe: the verdict of an engine that applies execbox's profile.
const SECCOMP_PROBE_PASSES: &str = "execbox-seccomp-probe: mode=2 io_uring_setup=EPERM io_uring_enter=EPERM \
                                    io_uring_register=EPERM ptrace=EPERM socket=EPERM mknodat=EPERM fcntl=EPERM";

/// What `execute` may take past the deadline and its grace: spawning, joining
/// the stream readers, assembling the result (the bound under test is the
/// deadline plus KILL_GRACE; this is slack for a loaded 2-core machine).
const OVERHEAD: Duration = Duration::from_secs(1);

fn python(code: &str) -> ExecRequest {
    ExecRequest::source(Language::Python, code)
}

fn run(backend: &Container, request: ExecRequest) -> ExecResult {
    Executor::run_on(backend, request).expect("execute")
}

fn stdout(r: &ExecResult) -> String {
    r.stdout.text().into_owned()
}

// ---- argv: what a policy turns into (no engine needed) ----------------------

#[test]
fn argv_carries_every_locked_flag_and_the_policy_limits() {
    let data = tempfile::tempdir().unwrap();
    let container = Container::new(ContainerConfig::default().extra_run_args(vec!["--runtime=runc".into()])).unwrap();
    let policy = SandboxPolicy::strict()
        .memory_bytes(64 << 20)
        .max_processes(16)
        .environment(Access::Allow(vec!["GREETING".into()]))
        .filesystem(Access::Allow(PathGrants::new().read_only_at(data.path(), "/data")));
    let request = python("print(1)").env("GREETING", "secret-value").policy(policy);
    let argv = container.plan(&request).unwrap().argv();
    for flag in [
        "--network=none",
        "--read-only",
        "--memory=67108864",
        "--memory-swap=67108864",
        "--cpus=1",
        "--pids-limit=16",
        "--user=65534:65534",
        "--cap-drop=ALL",
        "--security-opt=no-new-privileges",
        "--ipc=none",
        "--log-driver=none",
        "--pull=never",
    ] {
        assert!(argv.iter().any(|a| a == flag), "{flag} missing from {argv:?}");
    }
    assert!(argv.iter().any(|a| a.starts_with("--tmpfs=/tmp:") && a.contains("size=")));
    assert!(argv.iter().any(|a| a.starts_with("--name=execbox-")));
    let data_mount = format!("--mount=type=bind,src={},dst=/data,readonly", data.path().display());
    assert!(argv.contains(&data_mount), "{argv:?}");
    assert!(argv.iter().any(|a| a.starts_with("--env-file=")));
    assert!(!argv.iter().any(|a| a.contains("secret-value")), "env values never appear in argv");
    // Extra arguments come before every locked flag: a locked value wins.
    let extra = argv.iter().position(|a| a == "--runtime=runc").unwrap();
    let locked = argv.iter().position(|a| a == "--network=none").unwrap();
    assert!(extra < locked);
}

#[test]
fn extra_args_that_could_weaken_isolation_are_refused() {
    for bad in ["--network=host", "--privileged", "--cap-add=ALL", "-v=/:/host", "--security-opt=seccomp=unconfined"] {
        let cfg = ContainerConfig::default().extra_run_args(vec![bad.into()]);
        let err = Container::new(cfg).err().unwrap_or_else(|| panic!("{bad} accepted"));
        match err {
            ConfigError::Invalid { setting, reason } => {
                assert_eq!(setting, "ContainerConfig::extra_run_args");
                assert!(reason.starts_with(&format!("{bad:?} refused")), "{reason}");
            }
            other => panic!("{bad}: {other}"),
        }
    }
    let with_extra = |arg: &str| Container::new(ContainerConfig::default().extra_run_args(vec![arg.into()]));
    assert!(with_extra("--runtime=runsc").is_ok());
    // --init would put the in-container timer under tini, where the program could kill it.
    assert!(with_extra("--init").is_err());
}

#[test]
fn bad_grants_and_env_are_typed_errors() {
    let container = Container::default();
    let grant = |guest: &str| {
        let policy = SandboxPolicy::strict().filesystem(Access::Allow(PathGrants::new().read_only_at("/tmp", guest)));
        container.plan(&python("").policy(policy)).unwrap_err()
    };
    for guest in ["/work", "/work/x", "/tmp", "relative", "/a,b"] {
        assert!(matches!(grant(guest), ExecError::InvalidRequest(InvalidRequest::BadPath { .. })), "{guest}");
    }
    let policy = SandboxPolicy::strict().environment(Access::Allow(vec!["X".into()]));
    let err = container.plan(&python("").env("X", "a\nb").policy(policy)).unwrap_err();
    assert!(matches!(err, ExecError::InvalidRequest(InvalidRequest::BadEnv { .. })), "{err}");
    let err = container.plan(&python("").policy(SandboxPolicy::strict().memory_bytes(1024))).unwrap_err();
    assert!(matches!(err, ExecError::InvalidRequest(InvalidRequest::LimitOutOfRange { .. })), "{err}");
    let traversal = python("").input_file(ExecFile::new("../escape", "x"));
    let err = container.plan(&traversal).unwrap_err();
    assert!(matches!(err, ExecError::InvalidRequest(InvalidRequest::BadPath { .. })), "{err}");
}

#[test]
fn missing_engine_is_unavailable_with_the_fix() {
    let container = Container::new(ContainerConfig::default().engine("/nonexistent/docker")).unwrap();
    let reason = container.availability().unwrap_err();
    assert!(reason.fix.as_deref().unwrap_or("").contains("scripts/start-container-engine.sh"), "{reason}");
    let exec = Executor::builder().backend(container).build();
    match exec.execute_blocking(python("print(1)")) {
        Err(ExecError::BackendUnavailable { backend, reason, fix }) => {
            assert_eq!(backend, "container");
            // The fix stays a field of its own, and the message says it.
            let fix = fix.expect("a fix");
            assert!(fix.contains("start-container-engine"), "{reason} / {fix}");
            let error = ExecError::BackendUnavailable { backend, reason, fix: Some(fix) };
            assert!(error.to_string().contains("start-container-engine"), "{error}");
        }
        other => panic!("expected BackendUnavailable, got {other:?}"),
    }
}

#[test]
fn requests_the_backend_cannot_carry_are_refused_before_running() {
    let exec = Executor::builder().backend(Container::default()).build();
    let refused = |r: ExecRequest| -> Vec<execbox::Control> {
        match exec.select(&r) {
            Err(ExecError::Refused { rejections }) => rejections[0].violations.iter().map(|v| v.control).collect(),
            other => panic!("expected a refusal, got {:?}", other.map(|b| b.name().to_string())),
        }
    };
    use execbox::Control;
    assert_eq!(refused(python("").stdin(b"x".to_vec())), vec![Control::Stdin]);
    assert_eq!(refused(python("").policy(SandboxPolicy::strict().fuel(1000))), vec![Control::Fuel]);
    let net = SandboxPolicy::strict().network(Access::Allow(vec!["example.org".into()]));
    assert_eq!(refused(python("").policy(net)), vec![Control::Network]);
}

#[test]
fn every_container_carries_its_owner_and_its_own_timer() {
    let container = Container::default();
    let limit = Duration::from_millis(2500);
    let request = python("print(1)").policy(SandboxPolicy::strict().timeout(limit));
    let spec = container.plan(&request).unwrap();
    assert_eq!(spec.stop_after, limit + KILL_GRACE, "the timer fires a grace after the deadline");
    let argv = spec.argv();
    let owner = format!("--label=execbox.owner={}", Container::owner_token());
    assert!(argv.contains(&owner), "{argv:?}");
    assert!(argv.iter().any(|a| a.starts_with("--label=execbox.scope=")), "{argv:?}");
    let image = argv.iter().position(|a| a == "localhost/execbox-python:3.11").unwrap();
    // The image's first process copies `timeout` execute-only, limits file sizes, then runs the program under it.
    assert_eq!(argv[image + 1..image + 3], ["/bin/sh", "-c"]);
    assert!(argv[image + 3].contains("install -m 0111 /usr/bin/timeout") && argv[image + 3].contains("--signal=KILL"));
    assert_eq!(
        argv[image + 5..image + 8],
        ["16384", "4.500s", "/usr/bin/python3"],
        "8 MiB in 512-byte blocks, then the timer"
    );
    assert!(!argv.iter().any(|a| a.starts_with("--ulimit")), "the limit is set after the timer's copy");
}

// ---- Lifetime: the container's own timer, a hung engine -----------------------

/// A fake engine CLI: `run` and the commands in `hang` never answer (and
/// ignore SIGTERM); `run` exits with `run_exit` otherwise; everything else
/// succeeds at once. The availability check's seccomp probe (a `run` of the
/// role `probe`) gets the verdict of an engine that applies the profile.
fn fake_engine(dir: &Path, hang: &[&str], run_exit: Option<i32>) -> std::path::PathBuf {
    let path = dir.join("engine");
    let mut script = String::from("#!/bin/sh\ntrap '' TERM INT\n");
    script.push_str(&format!("case \"$*\" in *execbox.role=probe*) echo '{SECCOMP_PROBE_PASSES}'; exit 0 ;; esac\n"));
    script.push_str("case \"$1\" in\n");
    for command in hang {
        script.push_str(&format!("  {command}) sleep 1000 ;;\n"));
    }
    if let Some(code) = run_exit {
        script.push_str(&format!("  run) cat >/dev/null; exit {code} ;;\n"));
    }
    script.push_str("  *) exit 0 ;;\nesac\n");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

#[test]
fn a_time_out_returns_within_the_grace_even_when_the_engine_hangs() {
    let dir = tempfile::tempdir().unwrap();
    let engine = fake_engine(dir.path(), &["run", "kill"], None);
    let c = Container::new(ContainerConfig::default().engine(engine)).unwrap();
    let limit = Duration::from_secs(1);
    let started = Instant::now();
    let r = Executor::run_on(&c, python("while True: pass").policy(SandboxPolicy::strict().timeout(limit))).unwrap();
    let took = started.elapsed();
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    // The kill gets the grace, then the CLI is killed: deadline + grace, plus spawn overhead.
    assert!(took < limit + KILL_GRACE + OVERHEAD, "took {took:?}");
}

#[test]
fn classifying_an_exit_is_bounded_when_the_engine_hangs() {
    let dir = tempfile::tempdir().unwrap();
    // Exit 137 is ambiguous (OOM or not): only `inspect` can tell, and it never answers.
    let engine = fake_engine(dir.path(), &["inspect"], Some(137));
    let c = Container::new(ContainerConfig::default().engine(engine)).unwrap();
    let limit = Duration::from_secs(1);
    let started = Instant::now();
    let err = Executor::run_on(&c, python("pass").policy(SandboxPolicy::strict().timeout(limit))).unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.kind(), "internal", "{err}");
    assert!(took < limit + KILL_GRACE + OVERHEAD, "took {took:?}");
}

#[test]
fn a_container_stops_by_itself_when_nothing_watches_it() {
    let Some(c) = backend("selfstop") else { return };
    let limit = Duration::from_secs(1);
    let spec = c.plan(&python("").policy(SandboxPolicy::strict().timeout(limit))).unwrap();
    // The exact argv execbox would run, without its staging mounts (plan's are
    // placeholders), started directly: no execbox process watches it.
    let argv: Vec<String> = spec.argv().into_iter().filter(|a| !a.starts_with("--mount=")).collect();
    let mut child = Command::new("docker")
        .args(&argv)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Hostile: try to disarm the timer (ptrace it, stop it, kill it), then spin.
    let code = "\
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
print('ptrace', libc.ptrace(16, 1, 0, 0), ctypes.get_errno(), flush=True)
for sig in (signal.SIGSTOP, signal.SIGKILL):
    os.kill(1, sig)
while True: pass
";
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), code.as_bytes()).unwrap();
    // The timer fires `stop_after` after the container started; starting may take a few seconds here.
    let bound = spec.stop_after + Duration::from_secs(10);
    let status = process::wait_child(&mut child, bound);
    let mut out = String::new();
    drop(std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out));
    drop(Command::new("docker").args(["rm", "--force", &spec.name]).output());
    let status = status.unwrap_or_else(|| panic!("still running {bound:?} after the start"));
    assert_eq!(status.code(), Some(137), "killed by its own timer");
    assert!(out.starts_with("ptrace -1 1\n"), "the timer cannot be traced (EPERM): {out:?}");
}

// ---- Python and shell ----------------------------------------------------------

#[test]
fn python_gets_json_input_and_stdout_json_becomes_output() {
    let Some(c) = backend("json") else { return };
    let code = "import json, sys\nprint(json.dumps({'sum': sum(input['items']), 'argv': sys.argv[1:]}))";
    let r = run(&c, python(code).input(json!({"items": [1, 2, 3]})).arg("--flag"));
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(r.output, Some(json!({"sum": 6, "argv": ["--flag"]})));
    assert_eq!(r.backend, "container");
    let r = run(&c, python("print(open('/work/input.json').read())").input(json!([1])));
    assert_eq!(stdout(&r).trim(), "[1]");
    let r = run(&c, python("print('not json', input)"));
    assert_eq!((r.output.clone(), stdout(&r).trim()), (None, "not json None"));
    drop(c); // joins the reaper: finished containers are removed off the request path
    assert!(leftovers("json").is_empty());
}

#[test]
fn python_errors_point_at_the_callers_lines() {
    let Some(c) = backend("traceback") else { return };
    let r = run(&c, python("x = 1\ny = x / 0\n"));
    assert_eq!(r.outcome, Outcome::Failed);
    assert_eq!(r.exit_code, Some(1));
    let stderr = r.stderr.text();
    assert!(stderr.contains("File \"<code>\", line 2"), "{stderr}");
    assert!(stderr.contains("ZeroDivisionError"), "{stderr}");
}

#[test]
fn python_stdlib_modules_import() {
    let Some(c) = backend("stdlib") else { return };
    let code = "import json, re, statistics, datetime, decimal, csv, sqlite3, collections, math\n\
                print(json.dumps(statistics.mean([1, 2, 3])))";
    let r = run(&c, python(code));
    assert_eq!((r.outcome, r.output.clone()), (Outcome::Ok, Some(json!(2))), "{r:?}");
}

#[test]
fn shell_scripts_run_with_args() {
    let Some(c) = backend("shell") else { return };
    let r = run(&c, ExecRequest::source(Language::Shell, "echo \"$1-$2\"; exit 3").arg("a").arg("b"));
    assert_eq!((r.outcome, r.exit_code, stdout(&r).as_str()), (Outcome::Failed, Some(3), "a-b\n"));
}

/// `bash` is bash: arrays, `[[ ]]`, process substitution and `$BASH_VERSION`
/// work (dash, the images' /bin/sh, has none of them).
#[test]
fn shell_scripts_are_bash_scripts() {
    let Some(c) = backend("bash") else { return };
    let code = r#"a=(x y z); [[ ${#a[@]} -eq 3 ]] && echo "n=${#a[@]}"; while read l; do echo "got $l"; done < <(printf '1\n'); echo "${BASH_VERSION%%.*}""#;
    let language = Language::from_id("bash").unwrap();
    let r = run(&c, ExecRequest::source(language, code));
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(stdout(&r), "n=3\ngot 1\n5\n", "{r:?}");
}

/// A command that reads its standard input (`read`, `wc`, `cat`, `jq .`)
/// gets nothing and the script runs on: `bash -s` read the script from
/// stdin a line at a time, so such a command took the rest of the script
/// as its input and the script ended there (dash read 8 KiB at once, so a
/// short script ran whole before the switch to bash).
#[test]
fn a_command_reading_stdin_does_not_take_the_rest_of_the_script() {
    let Some(c) = backend("shell") else { return };
    let code = "read x; echo \"got:$x\"\nwc -l\necho \"after $1\"\n";
    let r = run(&c, ExecRequest::source(Language::Shell, code).arg("a"));
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(stdout(&r), "got:\n0\nafter a\n", "{r:?}");
}

/// A container session keeps its container across calls, and says so.
#[test]
fn container_sessions_declare_a_persistent_container() {
    use execbox::{IsolationKind, SessionBackend};
    let c = Container::default();
    assert_eq!(c.capabilities().isolation, IsolationKind::ContainerEphemeral);
    assert_eq!(c.session_capabilities().isolation, IsolationKind::ContainerPersistent);
}

#[test]
fn network_is_unreachable() {
    let Some(c) = backend("network") else { return };
    let code = "\
import socket, os
try:
    socket.create_connection(('1.1.1.1', 53), timeout=2)
    print('connected')
except OSError as e:
    print('blocked', e.errno)
print(sorted(os.listdir('/sys/class/net')))
";
    let r = run(&c, python(code));
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    let out = stdout(&r);
    assert!(out.starts_with("blocked"), "{out}");
    assert!(out.contains("['lo']"), "only loopback: {out}");
}

#[test]
fn root_filesystem_and_work_are_read_only_tmp_is_writable() {
    let Some(c) = backend("readonly") else { return };
    let code = "\
import errno
for path in ['/etc/x', '/usr/x', '/work/x', '/x']:
    try:
        open(path, 'w')
        print(path, 'writable')
    except OSError as e:
        print(path, errno.errorcode[e.errno])
open('/tmp/ok', 'w').write('fine')
print(open('/tmp/ok').read())
";
    let r = run(&c, python(code));
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    let out = stdout(&r);
    for path in ["/etc/x", "/usr/x", "/work/x", "/x"] {
        assert!(out.contains(&format!("{path} EROFS")) || out.contains(&format!("{path} EACCES")), "{out}");
    }
    assert!(out.contains("fine"));
}

#[test]
fn memory_bomb_is_out_of_memory() {
    let Some(c) = backend("oom") else { return };
    let policy = SandboxPolicy::strict().memory_bytes(64 << 20).timeout(Duration::from_secs(20));
    let r =
        run(&c, python("x = bytearray(1 << 30)\nx[::4096] = b'1' * len(x[::4096])\nprint('survived')").policy(policy));
    assert_eq!(r.outcome, Outcome::OutOfMemory, "{r:?}");
    assert_eq!(r.exit_code, Some(137));
    assert!(!stdout(&r).contains("survived"));
    drop(c); // joins the reaper: finished containers are removed off the request path
    assert!(leftovers("oom").is_empty());
}

#[test]
fn fork_bomb_is_contained_and_cleaned_up() {
    let Some(c) = backend("forkbomb") else { return };
    let policy = SandboxPolicy::strict().max_processes(32).timeout(Duration::from_secs(3));
    let started = Instant::now();
    let r = run(&c, ExecRequest::source(Language::Shell, "bomb() { bomb | bomb & }; bomb; sleep 60").policy(policy));
    assert!(matches!(r.outcome, Outcome::TimedOut | Outcome::Failed), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(3) + KILL_GRACE + OVERHEAD, "took {:?}", started.elapsed());
    assert!(running("forkbomb").is_empty(), "still running after the result");
    // The engine and host are fine afterwards.
    assert_eq!(run(&c, python("print(7)")).output, Some(json!(7)));
    drop(c); // joins the reaper
    assert!(leftovers("forkbomb").is_empty(), "container left behind");
}

#[test]
fn busy_loop_times_out_keeps_earlier_output_and_leaves_no_container() {
    let Some(c) = backend("busy") else { return };
    // Long enough for a container to start on a loaded 2-core machine.
    let limit = Duration::from_secs(4);
    let policy = SandboxPolicy::strict().timeout(limit);
    let started = Instant::now();
    let r = run(&c, python("print('started', flush=True)\nwhile True: pass").policy(policy));
    let took = started.elapsed();
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    assert_eq!(r.exit_code, None);
    assert_eq!(stdout(&r), "started\n");
    assert!(took >= limit && took < limit + KILL_GRACE + OVERHEAD, "took {took:?}");
    assert!(running("busy").is_empty(), "still running after the result");
    drop(c); // joins the reaper
    assert!(leftovers("busy").is_empty(), "container left behind after a timeout");
}

#[test]
fn a_huge_timeout_leaves_the_in_container_timer_huge_too() {
    let Some(c) = backend("huge-timeout") else { return };
    // The timer's argument for ~584 million years must be one coreutils accepts, and not cut a
    // program that runs longer than the grace.
    let code = "sleep 3; echo done";
    let r = run(&c, ExecRequest::source(Language::Shell, code).policy(SandboxPolicy::strict().timeout(Duration::MAX)));
    assert_eq!((r.outcome, stdout(&r).as_str()), (Outcome::Ok, "done\n"), "{r:?}");
}

#[test]
fn a_program_that_closes_its_streams_and_runs_on_still_times_out() {
    let Some(c) = backend("closed-streams") else { return };
    let limit = Duration::from_secs(3);
    let started = Instant::now();
    let r = run(
        &c,
        python("import os\nos.close(1)\nos.close(2)\nwhile True: pass").policy(SandboxPolicy::strict().timeout(limit)),
    );
    let took = started.elapsed();
    // Both streams end at once, but the run has not: it is timed out at the deadline.
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    assert!(took < limit + KILL_GRACE + OVERHEAD, "took {took:?}");
}

#[test]
fn output_flood_is_truncated_while_read() {
    let Some(c) = backend("flood") else { return };
    let policy = SandboxPolicy::strict().max_output_bytes(1024).timeout(Duration::from_secs(20));
    let code =
        "import sys\nchunk = 'x' * 65536\nfor _ in range(800): sys.stdout.write(chunk)\nsys.stderr.write('e' * 5000)";
    let r = run(&c, python(code).policy(policy));
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(r.stdout.bytes.len(), 1024);
    assert_eq!(r.stdout.total_bytes, 800 * 65536);
    assert!(r.stdout.truncated && r.stderr.truncated);
    assert_eq!(r.stderr.total_bytes, 5000);
    assert_eq!(r.output, None);
}

#[test]
fn env_is_exactly_the_allow_listed_values() {
    let Some(c) = backend("env") else { return };
    let policy = SandboxPolicy::strict().environment(Access::Allow(vec!["GREETING".into()]));
    let r = run(
        &c,
        python("import os, json\nprint(json.dumps(dict(os.environ)))").env("GREETING", "hi there").policy(policy),
    );
    let env = r.output.expect("env as JSON");
    assert_eq!(env["GREETING"], "hi there");
    let host_only: Vec<&String> = env
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| !["GREETING", "PATH", "LANG", "PYTHONDONTWRITEBYTECODE", "HOSTNAME", "HOME"].contains(&k.as_str()))
        .collect();
    assert!(host_only.is_empty(), "unexpected variables: {host_only:?}");
    assert_ne!(env["HOME"], std::env::var("HOME").unwrap_or_default(), "HOME is not the host's");
}

#[test]
fn granted_paths_are_mounted_with_their_mode() {
    let Some(c) = backend("grants") else { return };
    let ro = tempfile::tempdir().unwrap();
    let rw = tempfile::tempdir().unwrap();
    std::fs::write(ro.path().join("data.txt"), "from host").unwrap();
    std::fs::set_permissions(rw.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let grants = PathGrants::new().read_only_at(ro.path(), "/data").read_write_at(rw.path(), "/scratch");
    let code = "\
print(open('/data/data.txt').read())
try:
    open('/data/new', 'w')
except OSError as e:
    print('ro', e.errno)
open('/scratch/out.txt', 'w').write('to host')
";
    let r = run(&c, python(code).policy(SandboxPolicy::strict().filesystem(Access::Allow(grants))));
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(stdout(&r), "from host\nro 30\n");
    assert_eq!(std::fs::read_to_string(rw.path().join("out.txt")).unwrap(), "to host");
    assert!(!ro.path().join("new").exists());
}

#[test]
fn input_files_are_staged_and_output_files_come_back() {
    let Some(c) = backend("files") else { return };
    let code = "\
import os
rows = open('/work/data/in.csv').read().splitlines()
os.makedirs('/work/out/nested', exist_ok=True)
open('/work/out/report.json', 'w').write('{\"rows\": %d}' % len(rows))
open('/work/out/nested/copy.csv', 'w').write('\\n'.join(rows))
os.symlink('/etc/passwd', '/work/out/passwd-link')
os.symlink('..', '/work/out/up')
";
    let request = python(code).input_file(ExecFile::new("data/in.csv", "a,b\n1,2\n")).collect_output_files();
    let r = run(&c, request);
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    let names: Vec<&str> = r.output_files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["nested/copy.csv", "report.json"], "symlinks are never followed");
    assert_eq!(r.output_files[1].content, br#"{"rows": 2}"#);
    assert_eq!(r.output_files[1].mime_type.as_deref(), Some("application/json"));
    let message = r.message.unwrap_or_default();
    assert!(message.contains("passwd-link (symlink)") && message.contains("up (symlink)"), "{message}");
}

#[test]
fn oversized_output_files_are_cut_by_the_kernel_and_left_out() {
    let cfg = ContainerConfig::default().max_output_file_bytes(4096);
    let Some(c) = backend_with("bigfile", cfg) else { return };
    let code = "\
try:
    open('/work/out/big.bin', 'wb').write(b'x' * 100000)
except OSError as e:
    print('refused', e.errno)
open('/work/out/small.txt', 'w').write('ok')
";
    let r = run(&c, python(code).collect_output_files());
    assert_eq!(stdout(&r), "refused 27\n", "EFBIG from RLIMIT_FSIZE: {r:?}");
    let names: Vec<&str> = r.output_files.iter().map(|f| f.name.as_str()).collect();
    assert!(names.contains(&"small.txt"), "{names:?}");
    if let Some(big) = r.output_files.iter().find(|f| f.name == "big.bin") {
        assert!(big.content.len() <= 4096);
    }
}

#[test]
fn a_flood_of_output_entries_is_walked_within_bounds_and_noted_briefly() {
    // The most entries of /work/out the host looks at (see the module docs).
    const MAX_OUTPUT_ENTRIES: usize = 10_000;
    let Some(c) = backend("manyfiles") else { return };
    let code = "\
import os
os.makedirs('/work/out/d', exist_ok=True)
for i in range(25000):
    open('/work/out/d/f%05d' % i, 'w').close()
for i in range(50):
    os.symlink('/etc/passwd', '/work/out/link%02d' % i)
";
    let policy = SandboxPolicy::strict().timeout(Duration::from_secs(60));
    let r = run(&c, python(code).policy(policy).collect_output_files());
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert!(r.output_files.len() <= 64, "{}", r.output_files.len());
    let message = r.message.unwrap_or_default();
    assert!(message.len() < 4096, "message is {} bytes", message.len());
    assert!(message.contains(" more"), "a count, not every name: {message}");
    assert!(message.contains(&format!("more than {MAX_OUTPUT_ENTRIES} entries")), "{message}");
}

/// Issue 17 (F1/F2): `/work/out` is a tmpfs inside the container, capped in
/// bytes and entries: a program that floods it stops on `ENOSPC`, the run
/// ends within its deadline, and what comes back is bounded by the usual caps.
#[test]
fn a_run_that_floods_work_out_is_stopped_by_the_kernel() {
    let Some(c) = backend("outflood") else { return };
    let code = FLOOD_WORK_OUT;
    let limit = Duration::from_secs(10);
    let started = Instant::now();
    let r = run(&c, python(code).policy(SandboxPolicy::strict().timeout(limit)).collect_output_files());
    let took = started.elapsed();
    eprintln!("one-shot run flooding /work/out: {:?} in {took:?} ({limit:?} deadline)", r.outcome);
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    let printed = stdout(&r);
    let mut lines = printed.lines();
    let files: Vec<&str> = lines.next().unwrap_or_default().split(' ').collect();
    assert_eq!((files[0], files[2]), ("files", "28"), "ENOSPC at the inode cap: {printed}");
    assert!(files[1].parse::<u64>().unwrap() < 40_000, "{printed}");
    assert!(matches!(lines.next(), Some("bytes 28" | "bytes 27")), "{printed}");
    assert!(took < limit + KILL_GRACE + OVERHEAD, "took {took:?}");
    assert!(r.output_files.len() <= 64, "{}", r.output_files.len());
    let message = r.message.unwrap_or_default();
    assert!(message.len() < 4096 && message.contains("more than 10000 entries"), "{message}");
    drop(c);
    assert!(leftovers("outflood").is_empty());
}

/// Files are listed when the program ends: a run that times out returns
/// none, and says why.
#[test]
fn a_run_that_times_out_returns_no_files_and_says_why() {
    let Some(c) = backend("outtimeout") else { return };
    let code = "open('/work/out/a.txt', 'w').write('a')\nwhile True: pass";
    let policy = SandboxPolicy::strict().timeout(Duration::from_secs(3));
    let r = run(&c, python(code).policy(policy).collect_output_files());
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    assert!(r.output_files.is_empty(), "{r:?}");
    let message = r.message.unwrap_or_default();
    assert!(message.contains("output files not collected") && message.contains("ran out of time"), "{message}");
}

/// Hard links and sparse files take no room in the tmpfs: the listing still
/// carries no more than its size, and the caps hold.
#[test]
fn hard_links_and_sparse_files_cannot_inflate_what_comes_back() {
    let cfg = ContainerConfig::default().max_output_total_bytes(1 << 20);
    let Some(c) = backend_with("outlinks", cfg) else { return };
    let code = "\
import os
open('/work/out/a', 'wb').write(b'x' * (600 << 10))
for i in range(200):
    os.link('/work/out/a', '/work/out/l%03d' % i)
for i in range(50):
    with open('/work/out/s%02d' % i, 'wb') as f:
        f.truncate(4 << 20)
";
    let started = Instant::now();
    let r =
        run(&c, python(code).policy(SandboxPolicy::strict().timeout(Duration::from_secs(20))).collect_output_files());
    eprintln!("hard links and sparse files: {:?} in {:?}", r.outcome, started.elapsed());
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    let total: usize = r.output_files.iter().map(|f| f.content.len()).sum();
    assert!(total <= 1 << 20, "{total}");
    assert_eq!(r.output_files.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["a"]);
    let message = r.message.unwrap_or_default();
    assert!(message.contains("over max_output_total_bytes") && message.len() < 4096, "{message}");
}

#[test]
fn executor_routes_python_to_the_container_and_js_in_process() {
    let Some(c) = backend("routing") else { return };
    let exec = Executor::builder()
        .backend(c)
        .backend(execbox::backends::BoaJs::default())
        .backend(WasmGuest::new(Default::default()).unwrap())
        .build();
    assert_eq!(exec.select(&python("print(1)")).unwrap().name(), "container");
    assert_eq!(exec.select(&ExecRequest::javascript("return 1")).unwrap().name(), "boa-js");
    let r = exec.execute_blocking(python("print(40 + 2)")).unwrap();
    assert_eq!(r.output, Some(json!(42)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_execute_runs_containers_concurrently_off_the_runtime() {
    let Some(c) = backend("async") else { return };
    let exec = Executor::builder().backend(c).build();
    let tasks: Vec<_> = (0..3)
        .map(|i| {
            let exec = exec.clone();
            tokio::spawn(async move { exec.execute(python(&format!("print({i} * 10)"))).await })
        })
        .collect();
    let mut outputs = Vec::new();
    for task in tasks {
        outputs.push(task.await.unwrap().unwrap().output);
    }
    assert_eq!(outputs, [Some(json!(0)), Some(json!(10)), Some(json!(20))]);
}

// ---- Rust pipeline ------------------------------------------------------------

fn rust(code: &str) -> ExecRequest {
    ExecRequest::source(Language::Rust, code).policy(SandboxPolicy::strict().timeout(Duration::from_secs(20)))
}

/// A backend with its own Rust binary cache, so compile counts are this test's.
fn rust_backend(label: &str, cache: &Path) -> Option<Container> {
    let shared = RustConfig::default().cache_root().expect("a cache root");
    // The prebuilt crates live in the shared cache; link them into this one.
    for entry in std::fs::read_dir(&shared).ok()?.flatten() {
        if entry.file_name().to_string_lossy().starts_with("deps-") {
            std::os::unix::fs::symlink(entry.path(), cache.join(entry.file_name())).unwrap();
        }
    }
    let cfg = ContainerConfig::default().rust(RustConfig::default().cache_dir(cache));
    backend_with(label, cfg)
}

#[test]
fn rust_runs_compiled_in_the_sandbox_and_is_cached() {
    let cache = tempfile::tempdir().unwrap();
    let Some(c) = rust_backend("rust-ok", cache.path()) else { return };
    let code = "\
use serde_json::{json, Value};

fn run(input: Value) -> Value {
    let items = input[\"items\"].as_array().cloned().unwrap_or_default();
    json!(items.iter().map(|x| x.as_i64().unwrap_or(0) * 2).collect::<Vec<_>>())
}
";
    let r = run(&c, rust(code).input(json!({"items": [1, 2, 3]})));
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(r.output, Some(json!([2, 4, 6])));
    assert_eq!(c.rust_cache_stats().compiles, 1);
    let again = run(&c, rust(code).input(json!({"items": [5]})));
    assert_eq!(again.output, Some(json!([10])));
    assert_eq!((c.rust_cache_stats().compiles, c.rust_cache_stats().hits), (1, 1), "the repeat is a cache hit");
    drop(c); // joins the reaper: finished containers are removed off the request path
    assert!(leftovers("rust-ok").is_empty());
}

/// Rust and shell runs return output files too (listed in the container
/// when the program ends, like Python's), and the program's own stdout and
/// JSON output are untouched by the listing.
#[test]
fn rust_and_shell_runs_return_output_files() {
    let cache = tempfile::tempdir().unwrap();
    let Some(c) = rust_backend("rust-files", cache.path()) else { return };
    let code = "\
use serde_json::{json, Value};

fn run(_input: Value) -> Value {
    std::fs::create_dir_all(\"/work/out/d\").unwrap();
    std::fs::write(\"/work/out/d/r.txt\", \"from rust\").unwrap();
    json!({\"wrote\": 1})
}
";
    let r = run(&c, rust(code).collect_output_files());
    assert_eq!((r.outcome, r.output.clone()), (Outcome::Ok, Some(json!({"wrote": 1}))), "{r:?}");
    let files: Vec<(&str, &[u8])> = r.output_files.iter().map(|f| (f.name.as_str(), f.content.as_slice())).collect();
    assert_eq!(files, [("d/r.txt", b"from rust".as_slice())]);
    assert_eq!(r.message, None);
    let shell = ExecRequest::source(Language::Shell, "echo hi; printf 'a\\0b' > /work/out/s.bin; mkdir /work/out/e")
        .policy(SandboxPolicy::strict().timeout(Duration::from_secs(20)))
        .collect_output_files();
    let r = run(&c, shell);
    assert_eq!((r.outcome, stdout(&r).as_str()), (Outcome::Ok, "hi\n"), "{r:?}");
    let files: Vec<(&str, &[u8])> = r.output_files.iter().map(|f| (f.name.as_str(), f.content.as_slice())).collect();
    assert_eq!(files, [("s.bin", b"a\0b".as_slice())]);
    drop(c);
    assert!(leftovers("rust-files").is_empty());
}

/// `output` is the returned value, whatever the program printed before it
/// (which stays stdout), and a successful compile's warnings are kept as
/// diagnostics, on a cache hit too.
#[test]
fn rust_output_is_the_returned_value_and_warnings_are_kept() {
    let cache = tempfile::tempdir().unwrap();
    let Some(c) = rust_backend("rust-print", cache.path()) else { return };
    let code = "\
use serde_json::{json, Value};

fn run(input: Value) -> Value {
    let unused = 1;
    println!(\"working on {input}\");
    print!(\"{{\\\"looks\\\": \\\"like json\\\"}}\");
    json!({\"n\": input[\"n\"]})
}
";
    for attempt in 0..2 {
        let r = run(&c, rust(code).input(json!({"n": 7})));
        assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
        assert_eq!(r.output, Some(json!({"n": 7})), "attempt {attempt}: {r:?}");
        assert_eq!(stdout(&r), "working on {\"n\":7}\n{\"looks\": \"like json\"}", "attempt {attempt}");
        let warning = r.diagnostics.iter().find(|d| d.level == "warning").unwrap_or_else(|| panic!("{r:?}"));
        assert!(warning.message.contains("unused"), "{warning:?}");
        assert_eq!(warning.line, Some(4), "{warning:?}");
    }
    assert_eq!((c.rust_cache_stats().compiles, c.rust_cache_stats().hits), (1, 1));
    // A program that exits without returning gives no value.
    let r = run(&c, rust("fn run(_: Value) -> Value { println!(\"bye\"); std::process::exit(0) }\n"));
    assert_eq!((r.outcome, r.output.clone(), stdout(&r).as_str()), (Outcome::Ok, None, "bye\n"), "{r:?}");
}

#[test]
fn rust_compile_errors_are_structured_and_located_in_the_callers_code() {
    let cache = tempfile::tempdir().unwrap();
    let Some(c) = rust_backend("rust-err", cache.path()) else { return };
    let code = "use serde_json::Value;\n\nfn run(input: Value) -> Value {\n    let n: u32 = \"text\";\n    input\n}\n";
    let r = run(&c, rust(code));
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
    assert_eq!(r.failure_kind, Some(FailureKind::CompileError));
    let error = r.diagnostics.iter().find(|d| d.level == "error").expect("an error diagnostic");
    assert_eq!(error.code.as_deref(), Some("E0308"));
    assert_eq!((error.line, error.column), (Some(4), Some(18)), "{error:?}");
    assert!(r.stderr.text().contains("main.rs:4:18"), "{}", r.stderr.text());
    assert!(r.message.unwrap().contains("line 4"));
    // A missing `run` points at the harness: no line in the caller's code.
    let r = run(&c, rust("fn not_run() {}\n"));
    assert_eq!(r.failure_kind, Some(FailureKind::CompileError));
    let error = r.diagnostics.iter().find(|d| d.level == "error").unwrap();
    assert_eq!(error.line, None, "{error:?}");
}

#[test]
fn rust_include_str_cannot_read_host_files() {
    let cache = tempfile::tempdir().unwrap();
    let Some(c) = rust_backend("rust-include", cache.path()) else { return };
    let secret = tempfile::tempdir().unwrap();
    let path = secret.path().join("secret.txt");
    std::fs::write(&path, "host-secret-7f3a").unwrap();
    let code = format!(
        "use serde_json::Value;\nconst S: &str = include_str!({:?});\nfn run(_: Value) -> Value {{ Value::from(S) }}\n",
        path.display().to_string()
    );
    let r = run(&c, rust(&code));
    assert_eq!(r.failure_kind, Some(FailureKind::CompileError), "{r:?}");
    assert!(r.diagnostics.iter().any(|d| d.message.contains("couldn't read") && d.line == Some(2)), "{r:?}");
    let everything = format!("{}{}{:?}", r.stdout.text(), r.stderr.text(), r.output);
    assert!(!everything.contains("host-secret-7f3a"));
    let r = run(
        &c,
        rust(
            "use serde_json::Value;\nconst S: &str = include_str!(\"/etc/shadow\");\nfn run(_: Value) -> Value { Value::from(S) }\n",
        ),
    );
    assert_eq!(r.failure_kind, Some(FailureKind::CompileError), "{r:?}");
}

#[test]
fn rust_value_is_in_scope_with_or_without_a_use() {
    let cache = tempfile::tempdir().unwrap();
    let Some(c) = rust_backend("rust-value", cache.path()) else { return };
    let forms = [
        // adk-code's RustExecutor contract: no `use` at all.
        "fn run(input: Value) -> Value {\n    input\n}\n",
        "use serde_json::Value;\n\nfn run(input: Value) -> Value {\n    input\n}\n",
        "use serde_json::*;\n\nfn run(input: Value) -> Value {\n    json!([input])\n}\n",
    ];
    for (i, code) in forms.iter().enumerate() {
        let r = run(&c, rust(code).input(json!({"n": i})));
        assert_eq!(r.outcome, Outcome::Ok, "form {i}: {r:?}");
        let expected = if i == 2 { json!([{"n": i}]) } else { json!({"n": i}) };
        assert_eq!(r.output, Some(expected), "form {i}");
    }
    // Diagnostics stay on the caller's lines in the form without a `use`.
    let r = run(&c, rust("fn run(input: Value) -> Value {\n    let n: u32 = \"text\";\n    input\n}\n"));
    let error = r.diagnostics.iter().find(|d| d.level == "error").expect("an error");
    assert_eq!((error.line, error.code.as_deref()), (Some(2), Some("E0308")), "{error:?}");
}

#[test]
fn rust_compile_is_bounded_by_the_request_deadline() {
    let cache = tempfile::tempdir().unwrap();
    let Some(c) = rust_backend("rust-consteval", cache.path()) else { return };
    // An endless const evaluation: the compiler itself never finishes.
    let code = "\
#![allow(long_running_const_eval)]
const N: u64 = { let mut i = 0u64; loop { i = i.wrapping_add(1); if i == 0 { break i; } } };
fn run(_: Value) -> Value { Value::from(N) }
";
    let limit = Duration::from_secs(3);
    let started = Instant::now();
    let r = run(&c, ExecRequest::source(Language::Rust, code).policy(SandboxPolicy::strict().timeout(limit)));
    let took = started.elapsed();
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    assert!(r.message.as_deref().unwrap_or_default().contains("while compiling"), "{r:?}");
    assert!(took < limit + KILL_GRACE + OVERHEAD, "took {took:?}");
    assert_eq!(c.rust_cache_stats().compiles, 1);
}

#[test]
fn rust_panics_and_timeouts_are_outcomes() {
    let cache = tempfile::tempdir().unwrap();
    let Some(c) = rust_backend("rust-panic", cache.path()) else { return };
    let r = run(&c, rust("use serde_json::Value;\nfn run(_: Value) -> Value { panic!(\"boom\") }\n"));
    assert_eq!((r.outcome, r.exit_code), (Outcome::Failed, Some(101)), "{r:?}");
    assert!(r.stderr.text().contains("boom"));
    let policy = SandboxPolicy::strict().timeout(Duration::from_millis(1500));
    let r = run(
        &c,
        rust("use serde_json::Value;\nfn run(_: Value) -> Value { loop { std::hint::spin_loop() } }\n").policy(policy),
    );
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    drop(c); // joins the reaper
    assert!(leftovers("rust-panic").is_empty());
}

#[test]
fn a_rust_value_over_the_output_cap_is_failed_not_lost() {
    let cache = tempfile::tempdir().unwrap();
    let Some(c) = rust_backend("rust-cap", cache.path()) else { return };
    let code = "fn run(_input: Value) -> Value { Value::String(\"x\".repeat(100_000)) }";
    let policy = SandboxPolicy::strict().timeout(Duration::from_secs(60)).max_output_bytes(1000);
    let r = run(&c, rust(code).policy(policy));
    assert_eq!((r.outcome, r.output_truncated, r.output.is_none()), (Outcome::Failed, true, true), "{r:?}");
    assert!(r.message.as_deref().unwrap_or("").contains("max_stdout_bytes"), "{:?}", r.message);
}

#[test]
fn the_callers_path_cannot_break_the_in_container_timer_and_loader_variables_are_refused() {
    let Some(c) = backend("env-timer") else { return };
    let env = |name: &str, value: &str| {
        python("import os; print(os.environ.get('PATH'))")
            .env(name, value)
            .policy(SandboxPolicy::strict().environment(Access::Allow(vec![name.into()])))
    };
    // The timer, the interpreter and the shell are found by absolute path.
    let r = run(&c, env("PATH", "/nope"));
    assert_eq!((r.outcome, stdout(&r).trim()), (Outcome::Ok, "/nope"), "{r:?}");
    let shell = ExecRequest::source(Language::Shell, "/bin/echo \"$PATH\"")
        .env("PATH", "/nope")
        .policy(SandboxPolicy::strict().environment(Access::Allow(vec!["PATH".into()])));
    let r = run(&c, shell);
    assert_eq!((r.outcome, stdout(&r).trim()), (Outcome::Ok, "/nope"), "{r:?}");
    let err = Executor::run_on(&c, env("LD_PRELOAD", "/tmp/x.so")).unwrap_err();
    assert!(matches!(err, ExecError::InvalidRequest(InvalidRequest::BadEnv { .. })), "{err}");
}

// ---- seccomp: execbox's own profile on every container ------------------------

/// Every call execbox's profile denies fails inside a real container, run
/// through the API, with `EPERM` (`clone3`: `ENOSYS`, so that libc falls
/// back to `clone`), in the plain and in the data image. Under docker
/// 20.10's default profile the io_uring calls, `ptrace`, `modify_ldt`,
/// `personality` and the socket families reach the kernel instead, and
/// `mkfifo` makes a FIFO and `F_SETLEASE` a lease.
#[cfg(target_arch = "x86_64")]
#[test]
fn every_call_the_profile_denies_fails_inside_the_container() {
    let Some(c) = backend("seccomp-denied") else { return };
    for packages in [&[][..], &["numpy"][..]] {
        let r = run(&c, python(DENIED_SYSCALLS).packages(packages.iter().copied()));
        assert_eq!(r.outcome, Outcome::Ok, "{packages:?}: {r:?}");
        let seen = r.output.clone().unwrap_or_else(|| panic!("no JSON from {r:?}"));
        let seen = seen.as_object().unwrap();
        assert_eq!(seen.len(), 30, "{seen:?}");
        for (call, errno) in seen {
            let expected = if call == "clone3" { "ENOSYS" } else { "EPERM" };
            assert_eq!(errno, expected, "{packages:?}: {call} in {seen:?}");
        }
    }
    drop(c);
    assert!(leftovers("seccomp-denied").is_empty());
}

/// 32-bit system calls (`int 0x80` from a 64-bit process) are not in the
/// profile's architectures: the process is killed with SIGSYS at the first
/// one (the engine's default profile lets it through: it printed its pid).
#[cfg(target_arch = "x86_64")]
#[test]
fn a_32_bit_system_call_kills_the_process() {
    let Some(c) = backend("seccomp-int80") else { return };
    let code = r#"
import subprocess, sys
child = """
import ctypes, mmap
code = bytes([0xb8, 20, 0, 0, 0, 0xcd, 0x80, 0xc3])  # mov eax, 20 (getpid on i386); int 0x80; ret
page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(code)
getpid = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
print(getpid())
"""
done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
print(done.returncode, repr(done.stdout))
"#;
    let r = run(&c, python(code));
    assert_eq!((r.outcome, stdout(&r).trim()), (Outcome::Ok, "-31 ''"), "SIGSYS, nothing printed: {r:?}");
    drop(c);
    assert!(leftovers("seccomp-int80").is_empty());
}

/// What the profile filters by argument (`clone`'s flags, socket families,
/// `personality`) still lets ordinary programs through: threads, fork,
/// subprocesses, loopback TCP and UDP, IPv6 sockets, Unix socket pairs,
/// interface names (netlink), asyncio, and a shell script's pipes,
/// subshells and background jobs.
#[test]
fn threads_processes_and_loopback_sockets_still_work() {
    let Some(c) = backend("seccomp-normal") else { return };
    let code = "\
import asyncio, concurrent.futures, os, socket, subprocess, threading
out = []
t = threading.Thread(target=out.append, args=('thread',)); t.start(); t.join()
with concurrent.futures.ThreadPoolExecutor(4) as pool:
    out.append(sum(pool.map(abs, [-1, -2, -3])))
pid = os.fork()
if pid == 0:
    os._exit(7)
out.append(os.waitpid(pid, 0)[1] >> 8)
out.append(subprocess.run(['/bin/sh', '-c', 'echo sub'], capture_output=True, text=True).stdout.strip())
server = socket.create_server(('127.0.0.1', 0))
client = socket.create_connection(server.getsockname())
conn, _ = server.accept(); client.sendall(b'tcp'); out.append(conn.recv(3).decode())
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); udp.bind(('127.0.0.1', 0))
udp.sendto(b'udp', udp.getsockname()); out.append(udp.recv(3).decode())
socket.socket(socket.AF_INET6).close(); out.append('inet6')  # the family (lo has no ::1 here)
a, b = socket.socketpair(); a.sendall(b'unix'); out.append(b.recv(4).decode())
out.append(socket.if_nameindex()[0][1])
out.append(asyncio.run(asyncio.sleep(0, 'async')))
print(' '.join(map(str, out)))
";
    let r = run(&c, python(code));
    assert_eq!((r.outcome, stdout(&r).trim()), (Outcome::Ok, "thread 6 7 sub tcp udp inet6 unix lo async"), "{r:?}");
    let script = "a=$(echo one | tr a-z A-Z); (echo sub) & wait; echo \"$a\" $(seq 3 | sort -r | head -1) $((6*7))";
    let r = run(&c, ExecRequest::source(Language::Shell, script));
    assert_eq!((r.outcome, stdout(&r).as_str()), (Outcome::Ok, "sub\nONE 3 42\n"), "{r:?}");
    drop(c);
    assert!(leftovers("seccomp-normal").is_empty());
}

/// The Rust pipeline's compile container gets exactly execbox's profile
/// (read back from the engine's record while an endless compile runs), and
/// the compiled program meets it: `io_uring_setup` is `EPERM`.
#[test]
fn rust_compiles_and_runs_under_the_profile() {
    let cache = tempfile::tempdir().unwrap();
    let label = "seccomp-rust";
    let Some(c) = rust_backend(label, cache.path()) else { return };
    let code = "\
use serde_json::{json, Value};
unsafe extern \"C\" {
    fn syscall(number: std::ffi::c_long, ...) -> std::ffi::c_long;
}
fn run(_: Value) -> Value {
    // SAFETY: io_uring_setup(1, NULL) writes nothing: the filter (or the kernel) refuses it.
    let r = unsafe { syscall(425, 1 as std::ffi::c_long, 0 as std::ffi::c_long) };
    json!([r, std::io::Error::last_os_error().raw_os_error()])
}
";
    let r = run(&c, rust(code));
    assert_eq!((r.outcome, r.output.clone()), (Outcome::Ok, Some(json!([-1, 1]))), "{r:?}");

    let test_filter = docker::test_label(label);
    let events = docker::Events::new(&[&test_filter, "label=execbox.role=compile", "event=start"]);
    let endless = "\
#![allow(long_running_const_eval)]
const N: u64 = { let mut i = 0u64; loop { i = i.wrapping_add(1); if i == 0 { break i; } } };
fn run(_: Value) -> Value { Value::from(N) }
";
    let compiling = {
        let c = c.clone();
        let request = ExecRequest::source(Language::Rust, endless)
            .policy(SandboxPolicy::strict().timeout(Duration::from_secs(20)));
        std::thread::spawn(move || Executor::run_on(&c, request).unwrap())
    };
    // The first compile's start is a second old at most: skip it if the stream still has it.
    let profile = loop {
        let started = events.next_before(Instant::now() + Duration::from_secs(30)).expect("a compile container starts");
        let (_, id) = started.split_once(' ').unwrap();
        if let Some(profile) = docker::seccomp_profile_of(id) {
            break profile;
        }
    };
    assert_eq!(profile, serde_json::from_str::<serde_json::Value>(SECCOMP_PROFILE).unwrap());
    assert_eq!(compiling.join().unwrap().outcome, Outcome::TimedOut);
    drop(c);
    assert!(leftovers(label).is_empty());
}

/// A stand-in for an engine that ignores seccomp profiles (a runtime
/// without seccomp): docker itself, with execbox's `--security-opt=seccomp=`
/// dropped from every `run`; each `run`'s role goes to `<dir>/roles`.
fn engine_ignoring_the_profile(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("engine");
    let script = format!(
        "#!/bin/sh\n\
         for arg; do\n  shift\n  case \"$arg\" in\n    --security-opt=seccomp=*) ;;\n    \
         --label=execbox.role=*) echo \"${{arg#--label=execbox.role=}}\" >> {roles}; set -- \"$@\" \"$arg\" ;;\n    \
         *) set -- \"$@\" \"$arg\" ;;\n  esac\ndone\nexec docker \"$@\"\n",
        roles = dir.join("roles").display()
    );
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

/// An engine that runs containers without execbox's profile is caught by
/// the availability check (its probe saw the calls reach the kernel): the
/// backend is unavailable, says why, and no request's container starts.
#[test]
fn an_engine_that_ignores_the_profile_is_unavailable_and_runs_nothing() {
    if !common::skip::engine_answers(Path::new("docker")) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_ignoring_the_profile(dir.path());
    let label = "seccomp-ignored";
    let cfg = ContainerConfig::default().engine(&engine).extra_run_args(vec![format!("--label=execbox.test={label}")]);
    let c = Container::new(cfg).unwrap();
    let why = c.availability().unwrap_err();
    assert!(why.reason.contains("does not apply execbox's seccomp profile"), "{why}");
    for call in ["io_uring_setup", "io_uring_enter", "io_uring_register", "ptrace", "socket"] {
        assert!(why.reason.contains(&format!("{call} reached the kernel")), "{call}: {why}");
    }
    assert!(why.fix.as_deref().unwrap_or("").contains("runtime that applies OCI seccomp profiles"), "{why}");
    let exec = Executor::builder().backend(c.clone()).build();
    assert_eq!(exec.status()[0].unavailable.as_ref(), Some(&why), "execbox backends shows the same reason");
    // Not synchronisation: past the 2 s a negative answer is kept, so the run probes again.
    std::thread::sleep(Duration::from_millis(2100));
    match exec.execute_blocking(python("print(1)")) {
        Err(ExecError::BackendUnavailable { backend, reason, .. }) => {
            assert_eq!(backend, "container");
            assert!(reason.contains("io_uring_setup reached the kernel"), "{reason}");
        }
        other => panic!("expected BackendUnavailable, got {other:?}"),
    }
    drop(exec);
    drop(c);
    let roles = std::fs::read_to_string(dir.path().join("roles")).unwrap();
    assert!(roles.lines().all(|role| role == "probe") && roles.lines().count() >= 2, "{roles}");
    assert!(leftovers(label).is_empty());
}

/// An engine that cannot apply a custom profile and says so (docker on a
/// kernel without seccomp) makes the backend unavailable with its words.
#[test]
fn an_engine_that_refuses_the_profile_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let engine = dir.path().join("engine");
    let script = "#!/bin/sh\ncase \"$1\" in\n  run) echo 'docker: Error response from daemon: seccomp is not enabled in \
                  your kernel, cannot run a custom seccomp profile.' >&2; exit 125 ;;\n  inspect) [ \"$2\" = image ] || \
                  exit 1 ;;\nesac\nexit 0\n";
    std::fs::write(&engine, script).unwrap();
    std::fs::set_permissions(&engine, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let c = Container::new(ContainerConfig::default().engine(&engine)).unwrap();
    let why = c.availability().unwrap_err();
    assert!(why.reason.contains("cannot start a container under execbox's seccomp profile"), "{why}");
    assert!(why.reason.contains("seccomp is not enabled in your kernel"), "{why}");
}

/// The profile's file is this process's, private, and named on every run.
#[test]
fn every_run_names_this_processs_private_copy_of_the_profile() {
    use std::os::unix::fs::PermissionsExt;
    let container = Container::default();
    let argv = container.plan(&python("print(1)")).unwrap().argv();
    let flags: Vec<&String> = argv.iter().filter(|a| a.starts_with("--security-opt=seccomp=")).collect();
    assert_eq!(flags.len(), 1, "{argv:?}");
    let path = Path::new(flags[0].strip_prefix("--security-opt=seccomp=").unwrap());
    assert_eq!(std::fs::read_to_string(path).unwrap(), SECCOMP_PROFILE);
    assert_eq!(std::fs::metadata(path).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(path.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o700);
    let dir = path.parent().unwrap().file_name().unwrap().to_string_lossy().into_owned();
    assert!(dir.starts_with(&format!("execbox-seccomp-{}-", Container::owner_token())), "{dir}");
    // Beside the locked flag it joins, before the image.
    let at = argv.iter().position(|a| a == flags[0]).unwrap();
    assert_eq!(argv[at - 1], "--security-opt=no-new-privileges");
    assert!(at < argv.iter().position(|a| a == "localhost/execbox-python:3.11").unwrap());
    // An allow-listed extra argument cannot add another profile.
    let refused = ContainerConfig::default().extra_run_args(vec!["--security-opt=seccomp=unconfined".into()]);
    assert!(Container::new(refused).is_err());
}

/// A shell session keeps one `bash` across cells (variables, functions, the
/// working directory); a cell that exits gets that status and the next cell
/// a new shell; a cell that leaves a process running ends the session; a
/// closed session leaves no container.
#[test]
fn shell_sessions_keep_one_bash_across_cells() {
    use execbox::{SessionConfig, SessionSpec, Sessions};
    let Some(c) = backend("shell-session") else { return };
    let sessions = c
        .session_backends()
        .into_iter()
        .fold(Sessions::builder().config(SessionConfig::default()), |b, s| b.shared_backend(s))
        .build();
    assert_eq!(sessions.languages(), [Language::Python, Language::Shell]);
    let cell = |code: &str| {
        ExecRequest::source(Language::Shell, code).policy(SandboxPolicy::strict().timeout(Duration::from_secs(20)))
    };
    sessions.open("sh", SessionSpec::new(Language::Shell)).unwrap();
    let r = sessions
        .execute("sh", cell("total=40\ntwice() { echo $(( $1 * 2 )); }\nmkdir -p /tmp/d && cd /tmp/d\necho set"))
        .unwrap();
    assert_eq!((r.outcome, r.stdout.text().as_ref()), (Outcome::Ok, "set\n"), "{r:?}");
    assert_eq!(r.backend, "container-session");
    let r = sessions.execute("sh", cell("twice $((total + 1)); pwd; echo err >&2")).unwrap();
    assert_eq!(
        (r.outcome, r.stdout.text().as_ref(), r.stderr.text().as_ref()),
        (Outcome::Ok, "82\n/tmp/d\n", "err\n"),
        "{r:?}"
    );
    // A failing command is the cell's status; the shell lives on. Stdin is empty.
    let r = sessions.execute("sh", cell("read line; echo \"got:$line\"; false")).unwrap();
    assert_eq!((r.outcome, r.exit_code, r.stdout.text().as_ref()), (Outcome::Failed, Some(1), "got:\n"), "{r:?}");
    assert_eq!(sessions.execute("sh", cell("echo $total")).unwrap().stdout.text(), "40\n");
    // Input JSON is /work/input.json, as in one-shot runs; structured output too.
    let r = sessions.execute("sh", cell("cat /work/input.json").input(json!({"n": 1}))).unwrap();
    assert_eq!(r.output, Some(json!({"n": 1})), "{r:?}");
    // `exit` ends the shell, not the session: its status is the cell's, the next shell starts afresh.
    let r = sessions.execute("sh", cell("exit 3")).unwrap();
    assert_eq!((r.outcome, r.exit_code), (Outcome::Failed, Some(3)), "{r:?}");
    assert!(r.stderr.text().contains("new shell"), "{r:?}");
    let r = sessions.execute("sh", cell("echo \"[${total:-unset}]\"; pwd")).unwrap();
    assert_eq!((r.outcome, r.stdout.text().as_ref()), (Outcome::Ok, "[unset]\n/work\n"), "{r:?}");
    // A process left running after its cell ends the session (as in Python sessions).
    let r = sessions.execute("sh", cell("sleep 30 &")).unwrap();
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
    assert!(r.message.as_deref().unwrap_or_default().contains("still ran"), "{r:?}");
    assert_eq!(sessions.execute("sh", cell("echo")).unwrap_err().kind(), "session_lost");
    // A cell that writes its own status early and runs on is caught when
    // the host checks the shell is back reading: the session ends, nothing spins.
    sessions.open("forged", SessionSpec::new(Language::Shell)).unwrap();
    let forge = "for fd in /proc/$$/fd/*; do n=${fd##*/}; [ \"$n\" -gt 2 ] && builtin printf '0\\n' >&$n; done 2>/dev/null\n\
                 while :; do :; done";
    let r = sessions.execute("forged", cell(forge)).unwrap();
    assert_ne!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(sessions.execute("forged", cell("echo")).unwrap_err().kind(), "session_lost");
    // A Python cell is refused in a shell session, naming the language.
    sessions.open("sh2", SessionSpec::new(Language::Shell)).unwrap();
    let err = sessions.execute("sh2", ExecRequest::source(Language::Python, "1")).unwrap_err();
    assert!(err.to_string().contains("python"), "{err}");
    assert!(sessions.close("sh2"));
    sessions.close("sh");
    let label = docker::test_label("shell-session");
    assert!(docker::wait_gone(&[&label], Duration::from_secs(20)), "left: {:?}", leftovers("shell-session"));
}
