//! Code Mode on the container backend: Python (one-shot on the base and the
//! data image, and sessions), shell and Rust in containers call the host's
//! tools through the run's Unix socket, and every bound holds.
//!
//! Tests that need an engine skip (with a printed reason) only when no
//! engine answers at all; with `EXECBOX_REQUIRE_CONTAINERS=1` they fail
//! instead. An engine without execbox's images is a failure: run
//! `scripts/build-images.sh` (and `scripts/build-rust-deps.sh` for Rust).
#![cfg(feature = "container")]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::tools::{
    ERROR_GRANTS, PYTHON_ERRORS, PYTHON_ROUND_TRIP, Probe, assert_error_ledger, assert_flood_answers,
    assert_python_round_trip, assert_session_cells_call_tools, flood_code, outcomes, python_errors_output, registry,
    source, with_limits,
};
use common::wait::wait_until;
use common::{docker, procfs, skip};
use execbox::backends::Container;
use execbox::backends::container::{ContainerConfig, KILL_GRACE};
use execbox::tools::{ToolCallOutcome, ToolErrorKind, ToolLimits};
use execbox::{
    Access, Backend, ExecError, ExecFile, ExecRequest, ExecResult, Executor, InvalidRequest, Language, Outcome,
    PathGrants, SandboxPolicy, SessionConfig, SessionSpec, Sessions,
};
use serde_json::json;

// ---- the backend -------------------------------------------------------------

/// One test at a time: each checks that no tool socket directory of this
/// process is left, and the flood test measures the host's memory.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A backend whose containers carry a label unique to this test (so the
/// test can check that none is left), or `None` when no engine answers.
fn backend(label: &str) -> Option<Container> {
    common::skip::labelled_container(label, ContainerConfig::default())
}

/// An executor on `label`'s backend with the tools of `probe`.
fn executor(label: &str, probe: &Arc<Probe>) -> Option<(Container, Executor)> {
    let container = backend(label)?;
    let exec = Executor::builder().backend(container.clone()).tools(registry(probe)).build();
    Some((container, exec))
}

/// Containers (running or not) carrying this test's label.
fn leftovers(label: &str) -> Vec<String> {
    docker::ps(&["--all", "--filter", &docker::test_label(label)])
}

/// Waits (at most 20 s) for the reaper to remove this test's containers.
fn assert_no_containers_left(label: &str) {
    docker::wait_gone(&[&docker::test_label(label)], Duration::from_secs(20));
    assert!(leftovers(label).is_empty(), "containers left: {:?}", leftovers(label));
}

/// This process's tool socket directories still on disk.
fn socket_dirs() -> Vec<String> {
    procfs::temp_dirs("execbox-tools-", Container::owner_token())
}

fn request(language: Language, code: &str, grants: &[&str]) -> ExecRequest {
    source(language, code, Duration::from_secs(60), grants)
}

fn python(code: &str, grants: &[&str]) -> ExecRequest {
    request(Language::Python, code, grants)
}

fn run(exec: &Executor, request: ExecRequest) -> ExecResult {
    exec.execute_blocking(request).expect("runs")
}

/// `request` on the base image, and on the data image (it declares numpy)
/// when the data image has numpy.
fn on_both_images(container: &Container, exec: &Executor, request: ExecRequest) -> Vec<(&'static str, ExecResult)> {
    let mut results = vec![("base", run(exec, request.clone()))];
    if container.packages(Language::Python).iter().any(|p| p == "numpy") {
        results.push(("data", run(exec, request.packages(["numpy"]))));
    } else {
        skip::available(skip::CONTAINERS, Err("the data image lacks numpy: its runs are skipped"));
    }
    results
}

// ---- argv: nothing changes for runs without tools (no engine needed) --------

/// `argv` with the parts that differ per run and per process replaced.
fn normalized(argv: Vec<String>) -> Vec<String> {
    let owner = Container::owner_token();
    // The listing's nonce (runs that collect output files) follows `execbox-out`.
    let nonce_at = argv.iter().position(|a| a == "execbox-out").map(|i| i + 1);
    argv.into_iter()
        .enumerate()
        .map(|(i, arg)| {
            if Some(i) == nonce_at {
                return "<nonce>".into();
            }
            if arg.starts_with("--name=execbox-") {
                return "--name=<name>".into();
            }
            if arg.starts_with("--label=execbox.scope=") {
                return "--label=execbox.scope=<scope>".into();
            }
            if let Some(path) = arg.strip_prefix("--security-opt=seccomp=") {
                assert!(path.contains(&format!("/execbox-seccomp-{owner}-")), "not this process's profile: {arg}");
                return "--security-opt=seccomp=<seccomp-profile>".into();
            }
            let arg = arg.replace(&format!("execbox.owner={owner}"), "execbox.owner=<owner>");
            match arg.find("/execbox-run-") {
                Some(at) => {
                    let start = arg[..at].rfind('=').map_or(0, |i| i + 1);
                    let end = at + arg[at + 1..].find('/').map_or(arg.len() - at, |i| i + 1);
                    format!("{}<staging>{}", &arg[..start], &arg[end..])
                }
                None => arg,
            }
        })
        .collect()
}

/// The `run` arguments of requests that grant no tools are exactly those
/// execbox built before it carried the bridge (recorded from that build;
/// the run that collects output files re-recorded when `/work/out` became a
/// tmpfs listed inside the container, issue 17; the `execbox.role=run`
/// label added when warm and session containers got their own roles; the
/// `--security-opt=seccomp=` of execbox's own profile added, issue 28).
#[test]
fn runs_without_tools_get_exactly_the_argv_they_had_before() {
    let _serial = serial();
    let golden: Vec<Vec<String>> =
        serde_json::from_str(include_str!("golden/container_argv_without_tools.json")).unwrap();
    let container = Container::default();
    let requests = [
        ExecRequest::source(Language::Python, "print(1)"),
        ExecRequest::source(Language::Shell, "echo hi").input(json!({"a": 1})).collect_output_files(),
        ExecRequest::source(Language::Rust, "fn run(i: Value) -> Value { i }").policy(SandboxPolicy::strict()),
        ExecRequest::source(Language::Python, "1")
            .packages(["numpy"])
            .input_file(ExecFile::new("a.txt", b"x".to_vec())),
    ];
    for (request, expected) in requests.into_iter().zip(golden) {
        let argv = normalized(container.plan(&request).unwrap().argv());
        assert_eq!(argv, expected);
        assert!(!argv.iter().any(|a| a.contains("/run/execbox") || a.contains("EXECBOX_TOOLS")));
    }
}

#[test]
fn runs_with_tools_get_the_socket_read_only_and_nothing_loosened() {
    let _serial = serial();
    let container = Container::default();
    for language in [Language::Python, Language::Shell, Language::Rust] {
        let without = container.plan(&request(language, "1", &[])).unwrap().argv();
        let with = container.plan(&request(language, "1", &["math.*"])).unwrap().argv();
        let socket = with.iter().find(|a| a.contains("dst=/run/execbox/tools.sock")).expect("the socket is mounted");
        assert!(socket.starts_with("--mount=type=bind,src=") && socket.ends_with(",readonly"), "{socket}");
        assert!(socket.contains(&format!("/execbox-tools-{}-", Container::owner_token())), "{socket}");
        assert!(with.contains(&"--env=EXECBOX_TOOLS=/run/execbox/tools.sock".to_string()));
        let command = with.iter().find(|a| a.contains("dst=/usr/local/bin/tool"));
        assert_eq!(command.is_some(), language == Language::Shell, "{language}: {with:?}");
        // Every other argument is the same (but the name and staging paths,
        // and Python's bootstrap, which installs the tools module).
        let added = |a: &String| {
            a.starts_with("--mount=") && (a.contains("dst=/run/execbox/") || a.contains("dst=/usr/local/bin/tool"))
                || a.starts_with("--env=EXECBOX_TOOLS=")
        };
        let kept: Vec<String> = normalized(with.clone()).into_iter().filter(|a| !added(a)).collect();
        let before = normalized(without);
        assert_eq!(kept.len(), before.len(), "{language}");
        for (a, b) in kept.iter().zip(&before) {
            if a != b {
                assert!(language == Language::Python && b.contains("exec(compile(source"), "{language}: {a} vs {b}");
                assert!(a.contains("_execbox_socket('/run/execbox/tools.sock')"), "{a}");
            }
        }
    }
    // The socket's directory goes when the plan returns.
    assert!(socket_dirs().is_empty(), "{:?}", socket_dirs());
    // A granted directory over the socket's mount point is refused for a run with tools.
    let over = SandboxPolicy::strict()
        .filesystem(Access::Allow(PathGrants::new().read_only_at("/tmp", "/run")))
        .tools(["math.*"]);
    let err = container.plan(&ExecRequest::source(Language::Python, "1").policy(over)).unwrap_err();
    assert!(matches!(err, ExecError::InvalidRequest(InvalidRequest::BadPath { .. })), "{err}");
}

// ---- Python -----------------------------------------------------------------

#[test]
fn python_round_trip_with_every_form_of_the_api_and_the_ledger() {
    let _serial = serial();
    let probe = Arc::new(Probe::default());
    let Some((container, exec)) = executor("cm-py-round-trip", &probe) else { return };
    let request = python(PYTHON_ROUND_TRIP, &["math.*", "echo.args"]).input(json!({"n": 1}));
    for (label, r) in on_both_images(&container, &exec, request) {
        assert_python_round_trip(label, &r);
    }
    assert!(socket_dirs().is_empty(), "{:?}", socket_dirs());
    assert_no_containers_left("cm-py-round-trip");
}

#[test]
fn python_errors_are_tool_errors_the_code_catches() {
    let _serial = serial();
    let probe = Arc::new(Probe::default());
    let Some((container, exec)) = executor("cm-py-errors", &probe) else { return };
    for (label, r) in on_both_images(&container, &exec, python(PYTHON_ERRORS, ERROR_GRANTS)) {
        assert_eq!(r.outcome, Outcome::Ok, "{label}: {r:?}");
        assert_eq!(r.output, Some(python_errors_output()), "{label}: {r:?}");
        assert_error_ledger(label, &r.tool_calls);
    }
}

#[test]
fn python_a_call_loop_stops_at_the_budget_and_a_huge_result_is_cut() {
    let _serial = serial();
    let probe = Arc::new(Probe::default());
    let Some((_container, exec)) = executor("cm-py-budget", &probe) else { return };
    let code = "\
import json, tools
n = 0
try:
    while True:
        tools.math.add(a=n, b=1)
        n += 1
except tools.ToolError as e:
    print(json.dumps({'made': n, 'kind': e.kind}))";
    let request = with_limits(python(code, &["math.*"]), |p| p.tool_limits(ToolLimits::default().max_calls(3)));
    let r = run(&exec, request);
    assert_eq!(r.output, Some(json!({"made": 3, "kind": "budget_exhausted"})), "{r:?}");
    assert_eq!(r.tool_calls.len(), 4);
    assert_eq!(r.tool_calls[3].error, Some(ToolErrorKind::BudgetExhausted));

    let code = "import json, tools\nv = tools.big.blob()\nprint(json.dumps({'len': len(v), 'cut': v.endswith('…')}))";
    let r = run(&exec, python(code, &["big.*"]));
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    let len = r.output.as_ref().and_then(|o| o["len"].as_u64()).unwrap();
    assert!(len < 300 << 10 && r.output.as_ref().unwrap()["cut"] == true, "{r:?}");
    let call = &r.tool_calls[0];
    assert!(call.truncated && call.bytes_out <= 256 << 10, "{call:?}");
}

#[test]
fn python_a_hanging_tool_times_out_and_the_run_still_ends_by_its_deadline() {
    let _serial = serial();
    let probe = Arc::new(Probe::default());
    let label = "cm-py-hang";
    let Some((_container, exec)) = executor(label, &probe) else { return };
    let code = "\
import json, tools
try:
    tools.slow.sleep()
except tools.ToolError as e:
    print(json.dumps(e.kind))";
    let request = with_limits(python(code, &["slow.*"]), |p| p.tool_limits(ToolLimits::default().call_timeout_ms(300)));
    let r = run(&exec, request);
    assert_eq!((r.outcome, r.output.clone()), (Outcome::Ok, Some(json!("timed_out"))), "{r:?}");
    assert_eq!(
        outcomes(&r.tool_calls),
        [("slow.sleep".into(), ToolCallOutcome::Unknown, Some(ToolErrorKind::TimedOut))]
    );
    // The run's deadline comes first: the run ends by it (and its grace),
    // mid-call, the call left unknown and its tool no longer running.
    let limit = Duration::from_secs(3);
    let request = with_limits(python("import tools\ntools.slow.sleep()\nwhile True:\n    pass", &["slow.*"]), |p| {
        p.timeout(limit)
    });
    let started = Instant::now();
    let r = run(&exec, request);
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    assert!(started.elapsed() < limit + KILL_GRACE + Duration::from_secs(2), "took {:?}", started.elapsed());
    assert_eq!(r.tool_calls[0].outcome, ToolCallOutcome::Unknown);
    probe.assert_nothing_running();
    assert!(socket_dirs().is_empty(), "{:?}", socket_dirs());
    assert_no_containers_left(label);
}

#[test]
fn python_a_panicking_tool_fails_the_call_and_the_host_lives_on() {
    let _serial = serial();
    let probe = Arc::new(Probe::default());
    let Some((_container, exec)) = executor("cm-py-panic", &probe) else { return };
    let code = "\
import json, tools
try:
    tools.bad.panic()
except tools.ToolError as e:
    print(json.dumps([e.kind, tools.math.add(a=1, b=2)]))";
    let r = run(&exec, python(code, &["bad.*", "math.*"]));
    assert_eq!(r.output, Some(json!(["failed", 3])), "{r:?}");
}

#[test]
fn python_without_a_grant_has_no_tools_module_socket_or_variable() {
    let _serial = serial();
    let probe = Arc::new(Probe::default());
    let Some((container, exec)) = executor("cm-py-none", &probe) else { return };
    let code = "\
import json, os
try:
    import tools
    found = True
except ModuleNotFoundError:
    found = False
print(json.dumps({'found': found, 'socket': os.path.exists('/run/execbox'), 'env': 'EXECBOX_TOOLS' in os.environ}))";
    for (label, r) in on_both_images(&container, &exec, python(code, &[])) {
        assert_eq!(r.output, Some(json!({"found": false, "socket": false, "env": false})), "{label}: {r:?}");
        assert!(r.tool_calls.is_empty());
    }
}

/// The code's process is killed mid-call (here by itself): the run ends,
/// the call is `unknown` in the ledger, its tool no longer runs, and
/// neither the container nor the socket's directory is left.
#[test]
fn a_container_killed_mid_call_leaves_the_call_unknown_and_nothing_behind() {
    let _serial = serial();
    let probe = Arc::new(Probe::default());
    let label = "cm-py-killed";
    let Some((_container, exec)) = executor(label, &probe) else { return };
    let code = "\
import os, threading, time, tools
threading.Thread(target=tools.slow.sleep, daemon=True).start()
time.sleep(1.5)
os.kill(os.getpid(), 9)";
    let started = Instant::now();
    let r = run(&exec, python(code, &["slow.*"]));
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
    assert_eq!(r.exit_code, Some(137), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(outcomes(&r.tool_calls), [("slow.sleep".into(), ToolCallOutcome::Unknown, None)]);
    probe.assert_nothing_running();
    assert!(socket_dirs().is_empty(), "{:?}", socket_dirs());
    assert_no_containers_left(label);
}

/// Code that floods its socket — garbage, a line of 50 MB, calls whose
/// answers it never reads, far more connections than allowed — gets typed
/// answers where it reads them, its run a typed result, and the host stays
/// alive with its memory bounded; the `tools` module still works after.
#[test]
fn code_that_floods_the_socket_gets_typed_answers_and_the_host_stays_bounded() {
    let _serial = serial();
    let probe = Arc::new(Probe::default());
    let Some((_container, exec)) = executor("cm-py-flood", &probe) else { return };
    let code = flood_code(50, 50, 20);
    let before = procfs::own_rss_bytes();
    let request = with_limits(python(&code, &["math.*", "echo.*"]), |p| {
        p.tool_limits(ToolLimits::default().max_calls(10_000)).timeout(Duration::from_secs(120))
    });
    let r = run(&exec, request);
    assert_flood_answers(&r);
    let grown = procfs::own_rss_bytes().saturating_sub(before);
    assert!(grown < 256 << 20, "the host grew by {} MiB", grown >> 20);
    // The host is alive and answers.
    let r = run(&exec, python("import tools\nprint(tools.math.add(a=1, b=1))", &["math.*"]));
    assert_eq!(r.output, Some(json!(2)), "{r:?}");
}

// ---- shell ------------------------------------------------------------------

#[test]
fn shell_calls_tools_with_the_tool_command() {
    let _serial = serial();
    let probe = Arc::new(Probe::default());
    let label = "cm-sh";
    let Some((_container, exec)) = executor(label, &probe) else { return };
    // /work is read-only: the errors go to /tmp.
    let script = r#"
set -u
sum=$(tool math.add '{"a": 2, "b": 3}')
names=$(tool tools.list)
piped=$(echo '{"a": 40, "b": 2}' | tool math.add -)
failed=0
tool fail.always 2>/tmp/err.json || failed=$?
denied=0
tool slow.sleep 2>/tmp/denied.json || denied=$?
printf '{"sum": %s, "names": %s, "piped": %s, "failed": %s, "error": %s, "denied": [%s, %s], "env": "%s"}\n' \
  "$sum" "$names" "$piped" "$failed" "$(cat /tmp/err.json)" "$denied" "$(cat /tmp/denied.json)" "$EXECBOX_TOOLS"
"#;
    let r = run(&exec, request(Language::Shell, script, &["math.*", "fail.*"]));
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(
        r.output,
        Some(json!({
            "sum": 5, "names": ["fail.always", "math.add"], "piped": 42, "failed": 1,
            "error": {"tool": "fail.always", "kind": "failed", "message": "it always fails"},
            "denied": [1, {"tool": "slow.sleep", "kind": "not_granted",
                           "message": "the run's policy does not grant this tool"}],
            "env": "/run/execbox/tools.sock",
        })),
        "{r:?}"
    );
    assert_eq!(
        outcomes(&r.tool_calls),
        [
            ("math.add".into(), ToolCallOutcome::Ok, None),
            ("math.add".into(), ToolCallOutcome::Ok, None),
            ("fail.always".into(), ToolCallOutcome::Error, Some(ToolErrorKind::Failed)),
            ("slow.sleep".into(), ToolCallOutcome::Refused, Some(ToolErrorKind::NotGranted)),
        ]
    );
    // Calls from parallel `tool` commands (each a connection numbering its
    // calls from 1) are all answered: none collides with another's id.
    let script = "for n in 1 2 3 4; do tool pace.add \"{\\\"a\\\": $n, \\\"b\\\": 10}\" > /tmp/r$n & done; wait; cat /tmp/r1 /tmp/r2 /tmp/r3 /tmp/r4";
    let r = run(&exec, request(Language::Shell, script, &["pace.*"]));
    assert_eq!(
        (r.outcome, r.stdout.text().split_whitespace().collect::<Vec<_>>()),
        (Outcome::Ok, vec!["11", "12", "13", "14"]),
        "{r:?}"
    );
    // Without a grant there is no command and no socket.
    let script = "command -v tool || echo none; ls /run/execbox 2>/dev/null || echo nothing";
    let r = run(&exec, request(Language::Shell, script, &[]));
    assert_eq!(r.stdout.text(), "none\nnothing\n", "{r:?}");
    assert!(socket_dirs().is_empty(), "{:?}", socket_dirs());
    assert_no_containers_left(label);
}

// ---- Rust -------------------------------------------------------------------

/// Rust, if its pipeline is set up (else skipped, or a failure when
/// containers are required).
fn rust_runs(exec: &Executor, request: ExecRequest) -> Option<ExecResult> {
    match exec.execute_blocking(request) {
        Err(ExecError::BackendUnavailable { reason, .. }) => {
            skip::available(skip::CONTAINERS, Err(format!("the Rust pipeline: {reason}")));
            None
        }
        other => Some(other.expect("runs")),
    }
}

#[test]
fn rust_calls_tools_with_its_tools_module_and_with_a_bare_unix_stream() {
    let _serial = serial();
    let probe = Arc::new(Probe::default());
    let Some((_container, exec)) = executor("cm-rust", &probe) else { return };
    let code = r#"
use serde_json::json;

fn run(input: Value) -> Value {
    let sum = tools::call("math.add", json!({"a": input["a"], "b": 2})).unwrap();
    let err = tools::call("fail.always", json!({})).unwrap_err();
    let denied = tools::call("slow.sleep", json!({})).unwrap_err();
    json!({"sum": sum, "names": tools::list().unwrap(), "describe": tools::describe("math.add").unwrap()["description"],
           "err": [err.tool, err.kind, err.message], "denied": denied.kind})
}
"#;
    let granted = request(Language::Rust, code, &["math.*", "fail.*"]).input(json!({"a": 40}));
    let Some(r) = rust_runs(&exec, granted) else { return };
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert!(r.diagnostics.is_empty(), "the harness adds no warning: {:?}", r.diagnostics);
    assert_eq!(
        r.output,
        Some(json!({"sum": 42, "names": ["fail.always", "math.add"], "describe": "a + b",
                    "err": ["fail.always", "failed", "it always fails"], "denied": "not_granted"})),
        "{r:?}"
    );
    assert_eq!(r.tool_calls.len(), 3, "{:?}", r.tool_calls);

    // The wire needs nothing but std: a Unix stream, one JSON line each way.
    let code = r#"
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;

fn run(_input: Value) -> Value {
    let path = std::env::var("EXECBOX_TOOLS").unwrap();
    let mut stream = UnixStream::connect(path).unwrap();
    stream.write_all(b"{\"tool_call\":{\"id\":7,\"name\":\"math.add\",\"args\":{\"a\":1,\"b\":2}}}\n").unwrap();
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap()
}
"#;
    let Some(r) = rust_runs(&exec, request(Language::Rust, code, &["math.*"])) else { return };
    assert_eq!(r.output, Some(json!({"tool_result": {"id": 7, "ok": true, "value": 3}})), "{r:?}");
    assert_eq!(outcomes(&r.tool_calls), [("math.add".into(), ToolCallOutcome::Ok, None)]);
    // Without a grant: not_granted, and no socket.
    let code = r#"
fn run(_input: Value) -> Value {
    let err = tools::call("math.add", serde_json::json!({})).unwrap_err();
    serde_json::json!([err.kind, std::path::Path::new("/run/execbox").exists()])
}
"#;
    let Some(r) = rust_runs(&exec, request(Language::Rust, code, &[])) else { return };
    assert_eq!(r.output, Some(json!(["not_granted", false])), "{r:?}");
}

// ---- sessions ---------------------------------------------------------------

fn cell(code: &str, grants: &[&str]) -> ExecRequest {
    with_limits(python(code, grants), |p| p.timeout(Duration::from_secs(30)))
}

#[test]
fn a_session_cell_calls_tools_and_a_cell_without_a_grant_cannot() {
    let _serial = serial();
    let probe = Arc::new(Probe::default());
    let label = "cm-session";
    let Some(container) = backend(label) else { return };
    let sessions =
        Sessions::builder().config(SessionConfig::default()).backend(container).tools(registry(&probe)).build();
    sessions.open("s", SessionSpec::new(Language::Python)).unwrap();
    let first = assert_session_cells_call_tools(&sessions, "s", cell);
    assert_eq!(first.backend, "container-session");
    // A cell without a grant: no module to import, and the one kept in the
    // globals gets not_granted (nothing reaches the tools), even over a
    // connection of its own.
    let code = "\
import json, os, socket
try:
    import tools as again
    imported = True
except ModuleNotFoundError:
    imported = False
try:
    tools.math.add(a=1, b=1)
    kind = None
except tools.ToolError as e:
    kind = e.kind
s = socket.socket(socket.AF_UNIX)
s.connect('/run/execbox/tools.sock')
s.sendall(b'{\"tool_call\":{\"id\":3,\"name\":\"math.add\",\"args\":{}}}\\n')
raw = json.loads(s.makefile().readline())['tool_result']['error']['kind']
s.close()
print(json.dumps([imported, kind, raw, total]))";
    let r = sessions.execute("s", cell(code, &[])).unwrap();
    assert_eq!(
        (r.outcome, r.output.clone()),
        (Outcome::Ok, Some(json!([false, "not_granted", "not_granted", 62]))),
        "{r:?}"
    );
    assert!(r.tool_calls.is_empty());
    // Granted again: the kept module works, with this cell's grant.
    let r = sessions.execute("s", cell("print(tools.math.add(a=total, b=0))", &["math.*"])).unwrap();
    assert_eq!(r.stdout.text(), "62\n", "{r:?}");
    // A cell that reaches its deadline mid-call ends the session.
    let timed = with_limits(cell("tools.slow.sleep()", &["slow.*"]), |p| p.timeout(Duration::from_millis(2000)));
    let started = Instant::now();
    let r = sessions.execute("s", timed).unwrap();
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(2) + KILL_GRACE + Duration::from_secs(2));
    assert_eq!(r.tool_calls[0].outcome, ToolCallOutcome::Unknown);
    assert!(sessions.execute("s", cell("print(1)", &[])).is_err(), "the session is lost");
    probe.assert_nothing_running();
    sessions.close("s");
    // Nothing announces a removed directory: it is looked for.
    wait_until(Duration::from_secs(10), || socket_dirs().is_empty());
    assert!(socket_dirs().is_empty(), "{:?}", socket_dirs());
    assert_no_containers_left(label);
}
