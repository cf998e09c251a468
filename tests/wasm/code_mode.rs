//! Code Mode on the wasm backends: code in CPython-in-wasm (warm and fresh
//! instances, and sessions), QuickJS-in-wasm and raw WASM guests calls the
//! host's tools through the run's tool bridge, and every bound holds.
//!
//! The interpreters come from `scripts/fetch-interpreters.sh`. Without them
//! the interpreter tests print why and pass, unless
//! `EXECBOX_REQUIRE_INTERPRETERS=1` makes that a failure.
#![cfg(feature = "wasm")]

use crate::common;

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use common::tools::{
    ERROR_GRANTS, PYTHON_ERRORS, PYTHON_ROUND_TRIP, Probe, assert_error_ledger, assert_python_round_trip,
    assert_session_cells_call_tools, granting, outcomes, python_errors_output, registry, sha256, source, with_limits,
};
use execbox::backends::{Interpreter, InterpreterConfig, WasmEngine, WasmGuest, WasmGuestConfig, WasmInterpreter};
use execbox::tools::{ToolCallOutcome, ToolErrorKind, ToolLimits};
use execbox::{Backend, ExecRequest, ExecResult, Executor, Language, Outcome, SessionConfig, SessionSpec, Sessions};
use serde_json::{Value, json};

/// The engine every backend here shares.
fn engine() -> Arc<WasmEngine> {
    static ENGINE: OnceLock<Arc<WasmEngine>> = OnceLock::new();
    ENGINE.get_or_init(|| WasmEngine::new(WasmGuestConfig::default().pooled_instances(48)).expect("engine")).clone()
}

/// `cfg`'s interpreter on the shared engine, warmed up, if it is installed
/// (skips, or fails with `EXECBOX_REQUIRE_INTERPRETERS`, otherwise).
fn interpreter(cfg: InterpreterConfig) -> Option<WasmInterpreter> {
    common::skip::interpreter(WasmInterpreter::on_engine(engine(), cfg))
}

/// Python on a warm instance (its pool of one ready before each run) and on
/// a fresh one (a pool of none), each an executor with the tools.
struct Pythons {
    warm: WasmInterpreter,
    warm_exec: Executor,
    fresh_exec: Executor,
}

impl Pythons {
    fn new(probe: &Arc<Probe>) -> Option<Self> {
        let warm = interpreter(InterpreterConfig::default().warm_pool(1))?;
        let fresh = interpreter(InterpreterConfig::default().warm_pool(0))?;
        let warm_exec = Executor::builder().backend(warm.clone()).tools(registry(probe)).build();
        let fresh_exec = Executor::builder().backend(fresh).tools(registry(probe)).build();
        Some(Self { warm, warm_exec, fresh_exec })
    }

    /// Runs `request` on a warm instance, blocking and then awaited (on a
    /// runtime without I/O or timer drivers: the async caller's task waits
    /// on the instance itself), and on a fresh one. The warm runs are
    /// checked to be warm (a warm run reports no fuel figure) and the fresh
    /// one fresh (it does).
    fn run(&self, request: ExecRequest) -> [(&'static str, ExecResult); 3] {
        self.warm.prepare(Duration::from_secs(30));
        let warm = self.warm_exec.execute_blocking(request.clone()).expect("warm run");
        assert_eq!(warm.usage.fuel, None, "ran on a warm instance: {warm:?}");
        self.warm.prepare(Duration::from_secs(30));
        let no_drivers = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let awaited = no_drivers.block_on(self.warm_exec.execute(request.clone())).expect("awaited warm run");
        assert_eq!(awaited.usage.fuel, None, "ran on a warm instance: {awaited:?}");
        let fresh = self.fresh_exec.execute_blocking(request).expect("fresh run");
        // (A timed-out run reports no fuel figure either.)
        assert!(fresh.usage.fuel.is_some() || fresh.outcome == Outcome::TimedOut, "ran on a fresh instance: {fresh:?}");
        [("warm", warm), ("warm, awaited", awaited), ("fresh", fresh)]
    }
}

fn python(code: &str, grants: &[&str]) -> ExecRequest {
    source(Language::Python, code, Duration::from_secs(30), grants)
}

fn javascript(code: &str, grants: &[&str]) -> ExecRequest {
    source(Language::JavaScript, code, Duration::from_secs(30), grants)
}

// ---- CPython-in-wasm ----------------------------------------------------------

#[test]
fn python_round_trip_with_every_form_of_the_api_and_the_ledger() {
    let probe = Arc::new(Probe::default());
    let Some(py) = Pythons::new(&probe) else { return };
    for (label, r) in py.run(python(PYTHON_ROUND_TRIP, &["math.*", "echo.args"]).input(json!({"n": 1}))) {
        assert_python_round_trip(label, &r);
    }
}

#[test]
fn python_errors_are_tool_errors_the_code_catches() {
    let probe = Arc::new(Probe::default());
    let Some(py) = Pythons::new(&probe) else { return };
    for (label, r) in py.run(python(PYTHON_ERRORS, ERROR_GRANTS)) {
        assert_eq!(r.outcome, Outcome::Ok, "{label}: {r:?}");
        assert_eq!(r.output, Some(python_errors_output()), "{label}: {r:?}");
        assert_error_ledger(label, &r.tool_calls);
    }
}

#[test]
fn python_a_call_loop_stops_at_the_budget_and_the_code_finishes() {
    let probe = Arc::new(Probe::default());
    let Some(py) = Pythons::new(&probe) else { return };
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
    for (label, r) in py.run(request) {
        assert_eq!(r.output, Some(json!({"made": 3, "kind": "budget_exhausted"})), "{label}: {r:?}");
        assert_eq!(r.tool_calls.len(), 4, "{label}");
        assert_eq!(r.tool_calls[3].error, Some(ToolErrorKind::BudgetExhausted));
    }
}

#[test]
fn python_a_huge_result_is_cut_and_flagged() {
    let probe = Arc::new(Probe::default());
    let Some(py) = Pythons::new(&probe) else { return };
    let code = "import json, tools\nv = tools.big.blob()\nprint(json.dumps({'len': len(v), 'cut': v.endswith('…')}))";
    for (label, r) in py.run(python(code, &["big.*"])) {
        assert_eq!(r.outcome, Outcome::Ok, "{label}: {r:?}");
        let len = r.output.as_ref().and_then(|o| o["len"].as_u64()).unwrap();
        assert!(len < 300 << 10 && r.output.as_ref().unwrap()["cut"] == true, "{label}: {r:?}");
        let call = &r.tool_calls[0];
        assert!(call.truncated && call.bytes_out <= 256 << 10, "{label}: {call:?}");
    }
}

#[test]
fn python_a_hanging_tool_times_out_and_the_run_still_ends_by_its_deadline() {
    let probe = Arc::new(Probe::default());
    let Some(py) = Pythons::new(&probe) else { return };
    let code = "\
import json, tools
try:
    tools.slow.sleep()
except tools.ToolError as e:
    print(json.dumps(e.kind))";
    let request = with_limits(python(code, &["slow.*"]), |p| p.tool_limits(ToolLimits::default().call_timeout_ms(300)));
    for (label, r) in py.run(request) {
        assert_eq!((r.outcome, r.output.clone()), (Outcome::Ok, Some(json!("timed_out"))), "{label}: {r:?}");
        assert_eq!(
            outcomes(&r.tool_calls),
            [("slow.sleep".into(), ToolCallOutcome::Unknown, Some(ToolErrorKind::TimedOut))]
        );
    }
    // The run's deadline comes first: the run ends by it, mid-call, and the
    // call is left unknown, its tool no longer running.
    let code = "import tools\ntools.slow.sleep()\nwhile True:\n    pass";
    let request = with_limits(python(code, &["slow.*"]), |p| p.timeout(Duration::from_millis(1500)));
    for (label, r) in py.run(request) {
        assert_eq!(r.outcome, Outcome::TimedOut, "{label}: {r:?}");
        assert!(r.usage.duration < Duration::from_secs(4), "{label}: ended by its deadline: {:?}", r.usage.duration);
        assert_eq!(r.tool_calls[0].outcome, ToolCallOutcome::Unknown, "{label}");
    }
    probe.assert_nothing_running();
}

#[test]
fn python_code_that_reads_stdin_itself_is_still_stopped_at_the_deadline() {
    let probe = Arc::new(Probe::default());
    let Some(py) = Pythons::new(&probe) else { return };
    // Stdin stays open for answers: a read of it that is no call waits, and
    // the deadline still ends the run.
    let code = "import os, tools\nos.read(0, 1)";
    let request = with_limits(python(code, &["math.*"]), |p| p.timeout(Duration::from_millis(1000)));
    for (label, r) in py.run(request) {
        assert_eq!(r.outcome, Outcome::TimedOut, "{label}: {r:?}");
        assert!(r.usage.duration < Duration::from_secs(4), "{label}: {:?}", r.usage.duration);
    }
}

#[test]
fn python_a_panicking_tool_fails_the_call_and_the_host_lives_on() {
    let probe = Arc::new(Probe::default());
    let Some(py) = Pythons::new(&probe) else { return };
    let code = "\
import json, tools
try:
    tools.bad.panic()
except tools.ToolError as e:
    print(json.dumps([e.kind, tools.math.add(a=1, b=2)]))";
    for (label, r) in py.run(python(code, &["bad.*", "math.*"])) {
        assert_eq!(r.output, Some(json!(["failed", 3])), "{label}: {r:?}");
    }
}

#[test]
fn python_without_a_grant_there_is_no_tools_module_and_stdin_is_closed() {
    let probe = Arc::new(Probe::default());
    let Some(py) = Pythons::new(&probe) else { return };
    let code = "\
import json, os
try:
    import tools
    found = True
except ModuleNotFoundError:
    found = False
print(json.dumps({'found': found, 'stdin': os.read(0, 10).decode()}))";
    for (label, r) in py.run(python(code, &[])) {
        assert_eq!(r.output, Some(json!({"found": false, "stdin": ""})), "{label}: {r:?}");
        assert!(r.tool_calls.is_empty());
    }
}

#[test]
fn python_forged_records_make_only_granted_calls_and_other_nonces_stay_text() {
    let probe = Arc::new(Probe::default());
    let Some(py) = Pythons::new(&probe) else { return };
    // The code digs its own run's marker out of the tools module (its
    // calls' `exchange`) and forges a call record: it is an ordinary call,
    // refused as not granted. A record with another nonce is just output.
    let code = "\
import json, os, tools
cells = [c.cell_contents for c in tools.call.__closure__]
cells += [c.cell_contents for f in cells if getattr(f, '__name__', '') == 'exchange' for c in f.__closure__]
marker = [c for c in cells if isinstance(c, bytes)][0]
read = [c for c in cells if callable(c) and getattr(c, '__name__', '') == 'read_message'][0]
frame = json.dumps({'tool_call': {'id': 99, 'name': 'slow.sleep', 'args': {}}}).encode()
os.write(1, marker + b'T%d:' % len(frame) + frame + b'\\n')
answer = json.loads(read()[1:])['tool_result']
other = b'\\0execbox:' + b'0' * 32 + b':'
os.write(1, other + b'T%d:' % len(frame) + frame + b'\\n')
print('forged:' + answer['error']['kind'])";
    for (label, r) in py.run(python(code, &["math.*"])) {
        assert_eq!(r.outcome, Outcome::Ok, "{label}: {r:?}");
        let stdout = r.stdout.text();
        assert!(stdout.contains("forged:not_granted"), "{label}: {stdout:?}");
        assert!(stdout.contains(&format!("\0execbox:{}:T", "0".repeat(32))), "{label}: {stdout:?}");
        assert_eq!(
            outcomes(&r.tool_calls),
            [("slow.sleep".into(), ToolCallOutcome::Refused, Some(ToolErrorKind::NotGranted))]
        );
    }
}

// ---- Python sessions ----------------------------------------------------------

fn cell(code: &str, grants: &[&str]) -> ExecRequest {
    python(code, grants).policy_timeout(Duration::from_secs(20))
}

trait PolicyTimeout {
    fn policy_timeout(self, timeout: Duration) -> Self;
}

impl PolicyTimeout for ExecRequest {
    fn policy_timeout(self, timeout: Duration) -> Self {
        with_limits(self, |p| p.timeout(timeout))
    }
}

#[test]
fn a_session_cell_calls_tools_and_a_cell_without_a_grant_cannot() {
    let probe = Arc::new(Probe::default());
    let Some(py) = interpreter(InterpreterConfig::default().warm_pool(1)) else { return };
    let sessions = Sessions::builder().config(SessionConfig::default()).backend(py).tools(registry(&probe)).build();
    sessions.open("s", SessionSpec::new(Language::Python)).unwrap();
    assert_session_cells_call_tools(&sessions, "s", cell);
    // A cell without a grant: no module to import, and the one kept in the
    // globals gets not_granted (nothing reaches the tools).
    let code = "\
import json
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
print(json.dumps([imported, kind, total]))";
    let r = sessions.execute("s", cell(code, &[])).unwrap();
    assert_eq!((r.outcome, r.output.clone()), (Outcome::Ok, Some(json!([false, "not_granted", 62]))), "{r:?}");
    assert!(r.tool_calls.is_empty());
    // The session is still whole.
    let r = sessions.execute("s", cell("print(total)", &[])).unwrap();
    assert_eq!(r.stdout.text(), "62\n");
}

#[test]
fn a_session_closed_mid_call_leaves_the_call_unknown_and_nothing_running() {
    let probe = Arc::new(Probe::default());
    let Some(py) = interpreter(InterpreterConfig::default().warm_pool(1)) else { return };
    let sessions = Sessions::builder().config(SessionConfig::default()).backend(py).tools(registry(&probe)).build();
    sessions.open("k", SessionSpec::new(Language::Python)).unwrap();
    let started = Instant::now();
    let r = std::thread::scope(|s| {
        let cell = s.spawn(|| sessions.execute("k", cell("import tools\ntools.slow.sleep()", &["slow.*"])));
        // Closed once its tool call has started (or 15 s after the cell, as before).
        probe.wait_started(Duration::from_secs(15).saturating_sub(started.elapsed()));
        assert!(sessions.close("k"));
        cell.join().unwrap()
    })
    .unwrap();
    assert_eq!(r.outcome, Outcome::Killed, "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(outcomes(&r.tool_calls), [("slow.sleep".into(), ToolCallOutcome::Unknown, None)]);
    probe.assert_nothing_running();
}

#[test]
fn a_session_cell_that_reaches_its_deadline_mid_call_ends_the_session() {
    let probe = Arc::new(Probe::default());
    let Some(py) = interpreter(InterpreterConfig::default().warm_pool(1)) else { return };
    let sessions = Sessions::builder().config(SessionConfig::default()).backend(py).tools(registry(&probe)).build();
    sessions.open("t", SessionSpec::new(Language::Python)).unwrap();
    let request = cell("import tools\ntools.slow.sleep()", &["slow.*"]).policy_timeout(Duration::from_millis(1500));
    let started = Instant::now();
    let r = sessions.execute("t", request).unwrap();
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert_eq!(r.tool_calls[0].outcome, ToolCallOutcome::Unknown);
    assert!(sessions.execute("t", cell("print(1)", &[])).is_err(), "the session is lost");
    probe.assert_nothing_running();
}

// ---- QuickJS-in-wasm ----------------------------------------------------------

fn quickjs(probe: &Arc<Probe>) -> Option<Executor> {
    let js = interpreter(InterpreterConfig::default().kind(Interpreter::QuickJs))?;
    Some(Executor::builder().backend(js).tools(registry(probe)).build())
}

#[test]
fn quickjs_round_trip_with_every_form_of_the_api() {
    let probe = Arc::new(Probe::default());
    let Some(js) = quickjs(&probe) else { return };
    let code = "\
const add = await tools.math.add({a: 2, b: 3});
const both = await Promise.all([tools.math.add({a: 1, b: 1}), tools.call('math.add', {a: 5, b: 5})]);
console.log('printed');
return {add, both, echo: await tools.echo.args({x: [1, 'é', null]}), list: await tools.list(),
        describe: (await tools.describe('math.add')).description, input};";
    let r = js.execute_blocking(javascript(code, &["math.*", "echo.args"]).input(json!({"n": 1}))).unwrap();
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(r.stdout.text(), "printed\n");
    assert_eq!(
        r.output,
        Some(json!({"add": 5, "both": [2, 10], "echo": {"x": [1, "é", null]}, "list": ["echo.args", "math.add"],
                    "describe": "a + b", "input": {"n": 1}}))
    );
    assert_eq!(r.tool_calls.len(), 4);
    assert_eq!(r.tool_calls[0].args_sha256, sha256(&json!({"a": 2, "b": 3})));
}

#[test]
fn quickjs_errors_are_tool_errors_the_code_catches() {
    let probe = Arc::new(Probe::default());
    let Some(js) = quickjs(&probe) else { return };
    let code = "\
const seen = [];
for (const [name, args] of [['fail.always', {}], ['slow.sleep', {}], ['math.nope', {}], ['bad.panic', {}],
                            ['echo.args', {s: 'x'.repeat(100000)}], ['echo.args', {s: 'x'.repeat(1000000)}]]) {
  try { await tools.call(name, args); seen.push('ok'); }
  catch (e) { seen.push([e instanceof ToolError && e instanceof Error, e.tool, e.kind]); }
}
return {seen, after: await tools.math.add({a: 1, b: 1})};";
    let r = js.execute_blocking(javascript(code, ERROR_GRANTS)).unwrap();
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    let seen = json!([
        [true, "fail.always", "failed"],
        [true, "slow.sleep", "not_granted"],
        [true, "math.nope", "not_found"],
        [true, "bad.panic", "failed"],
        [true, "echo.args", "invalid_arguments"],
        [true, "echo.args", "invalid_arguments"],
    ]);
    assert_eq!(r.output, Some(json!({"seen": seen, "after": 2})), "{r:?}");
    assert_error_ledger("quickjs", &r.tool_calls);
    // An uncaught one fails the run with its name and message.
    let r = js.execute_blocking(javascript("await tools.fail.always();", &["fail.*"])).unwrap();
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
    assert_eq!(r.message.as_deref(), Some("ToolError: it always fails"), "{r:?}");
}

#[test]
fn quickjs_budget_big_results_and_hanging_tools() {
    let probe = Arc::new(Probe::default());
    let Some(js) = quickjs(&probe) else { return };
    let code = "\
let made = 0;
try { for (;;) { await tools.math.add({a: made, b: 1}); made++; } }
catch (e) { return {made, kind: e.kind}; }";
    let request = with_limits(javascript(code, &["math.*"]), |p| p.tool_limits(ToolLimits::default().max_calls(3)));
    let r = js.execute_blocking(request).unwrap();
    assert_eq!(r.output, Some(json!({"made": 3, "kind": "budget_exhausted"})), "{r:?}");

    let r = js.execute_blocking(javascript("const v = await tools.big.blob(); return v.length;", &["big.*"])).unwrap();
    assert!(r.output.as_ref().and_then(Value::as_u64).is_some_and(|n| n < 300 << 10), "{r:?}");
    assert!(r.tool_calls[0].truncated);

    let code = "try { await tools.slow.sleep(); } catch (e) { return e.kind; }";
    let request =
        with_limits(javascript(code, &["slow.*"]), |p| p.tool_limits(ToolLimits::default().call_timeout_ms(300)));
    let r = js.execute_blocking(request).unwrap();
    assert_eq!(r.output, Some(json!("timed_out")), "{r:?}");

    let code = "await tools.slow.sleep(); for (;;) {}";
    let request = with_limits(javascript(code, &["slow.*"]), |p| p.timeout(Duration::from_millis(1500)));
    let r = js.execute_blocking(request).unwrap();
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    assert!(r.usage.duration < Duration::from_secs(4), "{:?}", r.usage.duration);
    assert_eq!(r.tool_calls[0].outcome, ToolCallOutcome::Unknown);
    probe.assert_nothing_running();

    let r = js
        .execute_blocking(javascript(
            "try { await tools.bad.panic(); } catch (e) { return [e.kind, await tools.math.add({a: 1, b: 2})]; }",
            &["bad.*", "math.*"],
        ))
        .unwrap();
    assert_eq!(r.output, Some(json!(["failed", 3])), "{r:?}");
}

#[test]
fn quickjs_without_a_grant_has_no_tools_global() {
    let probe = Arc::new(Probe::default());
    let Some(js) = quickjs(&probe) else { return };
    let r = js
        .execute_blocking(javascript("return [typeof tools, typeof ToolError, input];", &[]).input(json!(7)))
        .unwrap();
    assert_eq!(r.output, Some(json!(["undefined", "undefined", 7])), "{r:?}");
}

// ---- WASM guests --------------------------------------------------------------

const TOOL_CALLER: &[u8] = include_bytes!("../../guests/prebuilt/tool_caller.wasm");

fn guest(probe: &Arc<Probe>) -> Executor {
    Executor::builder().backend(WasmGuest::on_engine(engine())).tools(registry(probe)).build()
}

fn call_guest(name: &str, grants: &[&str]) -> ExecRequest {
    ExecRequest::wasm(TOOL_CALLER.to_vec()).arg(name).policy(granting(Duration::from_secs(30), grants))
}

/// The answers the guest printed, one per line.
fn answers(r: &ExecResult) -> Vec<Value> {
    r.stdout.text().lines().map(|l| serde_json::from_str(l).expect("an answer")).collect()
}

#[test]
fn a_wasm_guest_calls_tools_through_its_import() {
    let probe = Arc::new(Probe::default());
    let exec = guest(&probe);
    let r = exec.execute_blocking(call_guest("math.add", &["math.*"]).input(json!({"a": 2, "b": 3}))).unwrap();
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(answers(&r), [json!({"id": 1, "ok": true, "value": 5})]);
    assert_eq!(r.tool_calls[0].args_sha256, sha256(&json!({"a": 2, "b": 3})));
    let r = exec.execute_blocking(call_guest("tools.list", &["math.*"])).unwrap();
    assert_eq!(answers(&r), [json!({"id": 1, "ok": true, "value": ["math.add"]})]);
    // A request that is not a call: -2, nothing ran.
    let r = exec.execute_blocking(call_guest("--malformed", &["math.*"])).unwrap();
    assert_eq!((r.stdout.text().as_ref(), r.tool_calls.len()), ("-2\n", 0));
}

#[test]
fn a_wasm_guest_gets_typed_errors_budgets_and_cut_results() {
    let probe = Arc::new(Probe::default());
    let exec = guest(&probe);
    let kind = |r: &ExecResult| answers(r)[0]["error"]["kind"].as_str().map(str::to_string);
    for (name, expected) in
        [("fail.always", "failed"), ("slow.sleep", "not_granted"), ("math.nope", "not_found"), ("bad.panic", "failed")]
    {
        let r = exec.execute_blocking(call_guest(name, ERROR_GRANTS)).unwrap();
        assert_eq!(kind(&r).as_deref(), Some(expected), "{name}: {r:?}");
    }
    for size in [100_000, 1_000_000] {
        let r =
            exec.execute_blocking(call_guest("echo.args", ERROR_GRANTS).input(json!({"s": "x".repeat(size)}))).unwrap();
        assert_eq!(kind(&r).as_deref(), Some("invalid_arguments"), "{size}");
        assert_eq!(r.tool_calls[0].error, Some(ToolErrorKind::InvalidArguments));
    }
    let request = with_limits(call_guest("math.add", &["math.*"]).arg("5"), |p| {
        p.tool_limits(ToolLimits::default().max_calls(3))
    });
    let r = exec.execute_blocking(request).unwrap();
    let oks: Vec<bool> = answers(&r).iter().map(|a| a["ok"] == true).collect();
    assert_eq!(oks, [true, true, true, false, false], "{r:?}");
    assert_eq!(answers(&r)[3]["error"]["kind"], "budget_exhausted");
    let r = exec.execute_blocking(call_guest("big.blob", &["big.*"])).unwrap();
    assert_eq!(answers(&r)[0]["truncated"], true, "{r:?}");
    assert!(r.tool_calls[0].truncated);
    // Without a grant every call answers not_granted.
    let r = exec.execute_blocking(call_guest("math.add", &[])).unwrap();
    assert_eq!(kind(&r).as_deref(), Some("not_granted"), "{r:?}");
    assert!(r.tool_calls.is_empty());
}

#[test]
fn a_wasm_guest_waiting_for_a_hanging_tool_ends_by_its_deadline() {
    let probe = Arc::new(Probe::default());
    let exec = guest(&probe);
    let request = with_limits(call_guest("slow.sleep", &["slow.*"]), |p| {
        p.tool_limits(ToolLimits::default().call_timeout_ms(300))
    });
    let r = exec.execute_blocking(request).unwrap();
    assert_eq!(answers(&r)[0]["error"]["kind"], "timed_out", "{r:?}");
    // The deadline, not the call's timeout: the host call returns at the
    // deadline (the epoch deadline cannot interrupt it) and the run ends.
    let request =
        with_limits(call_guest("slow.sleep", &["slow.*"]).arg("100"), |p| p.timeout(Duration::from_millis(1500)));
    let started = Instant::now();
    let r = exec.execute_blocking(request).unwrap();
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    assert_ne!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(r.tool_calls[0].outcome, ToolCallOutcome::Unknown);
    probe.assert_nothing_running();
}

// ---- Capabilities -------------------------------------------------------------

#[test]
fn every_wasm_backend_and_python_sessions_declare_the_bridge_enforced() {
    use execbox::Enforcement;
    let enforced = |e: &Enforcement| matches!(e, Enforcement::Enforced { .. } | Enforcement::ByOmission { .. });
    let guest = WasmGuest::on_engine(engine());
    let py = WasmInterpreter::on_engine(engine(), InterpreterConfig::default().warm_pool(0));
    let js = WasmInterpreter::on_engine(engine(), InterpreterConfig::default().kind(Interpreter::QuickJs));
    let session = py.session_backends().pop().expect("python-wasm keeps sessions");
    for caps in [guest.capabilities(), py.capabilities(), js.capabilities(), session.session_capabilities()] {
        assert!(matches!(caps.tools.allow_list, Enforcement::Enforced { .. }), "{:?}", caps.tools);
        assert!(enforced(&caps.tools.deny), "{:?}", caps.tools);
    }
    // Matching lets a request that grants tools through (a backend that
    // cannot carry them refuses it naming `tools`, see tests/library/policy_matrix.rs).
    let request = python("print(1)", &["math.*"]);
    assert_eq!(execbox::matching::check(py.capabilities(), &request), Ok(()));
}
