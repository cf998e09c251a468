//! Code Mode: the tools every carrier's tests call, what the hanging one
//! saw, and the ledger's shape.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use execbox::tools::{ToolCallOutcome, ToolCallRecord, ToolError, ToolErrorKind, ToolRegistry, ToolSpec};
use execbox::{ExecRequest, SandboxPolicy};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Counts the calls of `slow.sleep` that started and those whose future was
/// dropped (a call cancelled when its run ended, or timed out), and wakes
/// who waits for either.
#[derive(Default)]
pub struct Probe {
    /// (started, ended)
    counts: Mutex<(usize, usize)>,
    changed: Condvar,
}

/// Ends its call in the probe when dropped.
struct Ended(Arc<Probe>);

impl Drop for Ended {
    fn drop(&mut self) {
        self.0.counts.lock().unwrap().1 += 1;
        self.0.changed.notify_all();
    }
}

impl Probe {
    fn start(self: &Arc<Self>) -> Ended {
        self.counts.lock().unwrap().0 += 1;
        self.changed.notify_all();
        Ended(self.clone())
    }

    /// Waits at most `limit` until some `slow.sleep` has started; whether one has.
    pub fn wait_started(&self, limit: Duration) -> bool {
        let counts = self.counts.lock().unwrap();
        let (counts, _) = self.changed.wait_timeout_while(counts, limit, |(started, _)| *started == 0).unwrap();
        counts.0 > 0
    }

    /// Waits (at most 5 s) until every `slow.sleep` that started has ended.
    pub fn assert_nothing_running(&self) {
        let counts = self.counts.lock().unwrap();
        let limit = Duration::from_secs(5);
        let (counts, _) = self.changed.wait_timeout_while(counts, limit, |(started, ended)| ended < started).unwrap();
        let (started, ended) = *counts;
        assert!(started > 0, "the hanging tool ran");
        assert_eq!(started, ended, "a tool call outlived its run");
    }
}

/// `math.add`, `pace.add` (`math.add` after 300 ms: calls overlap),
/// `echo.args`, `fail.always`, `bad.panic` (panics), `big.blob` (100 MiB)
/// and `slow.sleep` (an hour, seen by `probe`).
pub fn registry(probe: &Arc<Probe>) -> ToolRegistry {
    let probe = probe.clone();
    ToolRegistry::builder()
        .tool(ToolSpec::new("math.add").description("a + b".to_string()), |args: Value| async move {
            Ok(json!(args["a"].as_i64().unwrap_or(0) + args["b"].as_i64().unwrap_or(0)))
        })
        .tool(ToolSpec::new("pace.add"), |args: Value| async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok(json!(args["a"].as_i64().unwrap_or(0) + args["b"].as_i64().unwrap_or(0)))
        })
        .tool(ToolSpec::new("echo.args"), |args: Value| async move { Ok(args) })
        .tool(ToolSpec::new("fail.always"), |_: Value| async {
            Err(ToolError::failed("fail.always", "it always fails"))
        })
        .tool(ToolSpec::new("bad.panic"), |_: Value| async { panic!("a tool that panics") })
        .tool(ToolSpec::new("big.blob"), |_: Value| async { Ok(json!("x".repeat(100 << 20))) })
        .tool(ToolSpec::new("slow.sleep"), move |_: Value| {
            let probe = probe.clone();
            async move {
                let _ended = probe.start();
                // The call hangs until its run ends it (its future is dropped).
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(Value::Null)
            }
        })
        .build()
        .unwrap()
}

/// The grants of every carrier's error scenario.
pub const ERROR_GRANTS: &[&str] = &["math.*", "echo.*", "fail.*", "bad.*"];

/// `request` with its policy changed by `f`.
pub fn with_limits(request: ExecRequest, f: impl FnOnce(SandboxPolicy) -> SandboxPolicy) -> ExecRequest {
    let policy = f(request.policy.clone());
    request.policy(policy)
}

/// The hex sha256 of `args` as JSON (what the ledger records).
pub fn sha256(args: &Value) -> String {
    format!("{:x}", Sha256::digest(serde_json::to_vec(args).unwrap()))
}

/// Each ledgered call's tool, outcome and error kind.
pub fn outcomes(ledger: &[ToolCallRecord]) -> Vec<(String, ToolCallOutcome, Option<ToolErrorKind>)> {
    ledger.iter().map(|r| (r.tool.clone(), r.outcome, r.error)).collect()
}

/// What every carrier's error scenario leaves in the ledger (see the codes).
pub fn assert_error_ledger(label: &str, ledger: &[ToolCallRecord]) {
    use ToolCallOutcome::*;
    use ToolErrorKind::*;
    let expected = [
        ("fail.always", Error, Some(Failed)),
        ("slow.sleep", Refused, Some(NotGranted)),
        ("math.nope", Refused, Some(NotFound)),
        ("bad.panic", Error, Some(Failed)),
        ("echo.args", Refused, Some(InvalidArguments)),
        ("echo.args", Refused, Some(InvalidArguments)),
        ("math.add", Ok, None),
    ];
    let expected: Vec<_> = expected.iter().map(|(t, o, k)| (t.to_string(), *o, *k)).collect();
    assert_eq!(outcomes(ledger), expected, "{label}");
    // The long call was refused unread, by its head: its size is counted.
    assert!(ledger[5].bytes_in > 1_000_000, "{label}: the long call's size is counted: {:?}", ledger[5]);
}

/// What the Python scenario of [`assert_error_ledger`] prints: each call's
/// tool and error kind, then one caught before it was sent.
pub const PYTHON_ERRORS: &str = "\
import json, tools
seen = []
for name, args in [('fail.always', {}), ('slow.sleep', {}), ('math.nope', {}), ('bad.panic', {}),
                   ('echo.args', {'s': 'x' * 100000}), ('echo.args', {'s': 'x' * 1000000})]:
    try:
        tools.call(name, args)
        seen.append('ok')
    except tools.ToolError as e:
        seen.append([e.tool, e.kind])
try:
    tools.call('echo.args', {'x': float('nan')})
except tools.ToolError as e:
    seen.append(['local', e.kind])
print(json.dumps({'seen': seen, 'after': tools.math.add(a=1, b=1)}))";

/// What [`PYTHON_ERRORS`] prints as its output.
pub fn python_errors_output() -> Value {
    let seen = json!([
        ["fail.always", "failed"],
        ["slow.sleep", "not_granted"],
        ["math.nope", "not_found"],
        ["bad.panic", "failed"],
        ["echo.args", "invalid_arguments"],
        ["echo.args", "invalid_arguments"],
        ["local", "invalid_arguments"],
    ]);
    json!({"seen": seen, "after": 2})
}

/// A Python program that calls tools every way the `tools` module allows.
pub const PYTHON_ROUND_TRIP: &str = "\
import json, tools
from tools.math import add
import tools.echo
print(json.dumps({
    'add': add(a=2, b=3),
    'positional': tools.math.add({'a': 1}, b=1),
    'call': tools.call('math.add', {'a': 5, 'b': 5}),
    'echo': tools.echo.args(x=[1, 'é', None]),
    'list': tools.list(),
    'describe': tools.describe('math.add')['description'],
    'error_class': [tools.ToolError.__module__, issubclass(tools.ToolError, Exception)],
    'input': input,
}))";

/// Checks what [`PYTHON_ROUND_TRIP`] returned, given `{"n": 1}` as input and
/// `math.*` and `echo.args` as grants: its values and its ledger.
pub fn assert_python_round_trip(label: &str, r: &execbox::ExecResult) {
    assert_eq!(r.outcome, execbox::Outcome::Ok, "{label}: {r:?}");
    assert_eq!(
        r.output,
        Some(json!({
            "add": 5, "positional": 2, "call": 10, "echo": {"x": [1, "é", null]},
            "list": ["echo.args", "math.add"], "describe": "a + b",
            "error_class": ["tools", true], "input": {"n": 1},
        })),
        "{label}: {r:?}"
    );
    // The built-ins are not ledgered; each call is, with its arguments' hash.
    let tools: Vec<&str> = r.tool_calls.iter().map(|c| c.tool.as_str()).collect();
    assert_eq!(tools, ["math.add", "math.add", "math.add", "echo.args"], "{label}");
    let first = &r.tool_calls[0];
    assert_eq!(first.outcome, ToolCallOutcome::Ok);
    assert_eq!(first.args_sha256, sha256(&json!({"a": 2, "b": 3})));
    assert_eq!(
        (first.bytes_in, first.bytes_out),
        (serde_json::to_vec(&json!({"a": 2, "b": 3})).unwrap().len() as u64, 1)
    );
}

/// A strict policy of `timeout` that grants `grants` (none: tools are not
/// asked for at all).
pub fn granting(timeout: Duration, grants: &[&str]) -> SandboxPolicy {
    let policy = SandboxPolicy::strict().timeout(timeout);
    if grants.is_empty() { policy } else { policy.tools(grants.iter().copied()) }
}

/// `code` in `language` under [`granting`]`(timeout, grants)`.
pub fn source(language: execbox::Language, code: &str, timeout: Duration, grants: &[&str]) -> ExecRequest {
    ExecRequest::source(language, code).policy(granting(timeout, grants))
}

/// Two cells of Python session `id` calling tools: one keeps a tool's
/// answer in a global (`total`, 42), the next makes 20 more calls and
/// catches a failing one, ending with its own status. Returns the first
/// cell's result.
pub fn assert_session_cells_call_tools(
    sessions: &execbox::Sessions,
    id: &str,
    cell: impl Fn(&str, &[&str]) -> ExecRequest,
) -> execbox::ExecResult {
    use execbox::Outcome;
    let first = sessions
        .execute(
            id,
            cell("import json, tools\ntotal = tools.math.add(a=40, b=2)\nprint(json.dumps(total))", &["math.*"]),
        )
        .unwrap();
    assert_eq!((first.outcome, first.output.clone()), (Outcome::Ok, Some(json!(42))), "{first:?}");
    assert_eq!(outcomes(&first.tool_calls), [("math.add".into(), ToolCallOutcome::Ok, None)]);
    // Many calls in one cell, errors caught, and the cell ends with its own status.
    let code = "\
import json
kinds = []
for i in range(20):
    total = tools.math.add(a=total, b=1)
try:
    tools.fail.always()
except tools.ToolError as e:
    kinds.append(e.kind)
print(json.dumps([total, kinds]))";
    let r = sessions.execute(id, cell(code, &["math.*", "fail.*"])).unwrap();
    assert_eq!((r.outcome, r.output.clone()), (Outcome::Ok, Some(json!([62, ["failed"]]))), "{r:?}");
    assert_eq!(r.tool_calls.len(), 21);
    first
}

/// Python that floods its run's tool socket (`$EXECBOX_TOOLS`) the ways a
/// hostile program would, and prints what it saw as JSON (see
/// [`assert_flood_answers`]): garbage, a line of `line_mib` MiB, a line of
/// `endless_mib` MiB that never ends, 400 calls whose answers it never
/// reads, 64 connections at once, then one ordinary call. `wait`: seconds
/// it waits for an answer.
pub fn flood_code(line_mib: u32, endless_mib: u32, wait: u32) -> String {
    let wait_each = wait - 10;
    format!(
        r#"
import json, os, socket, time, tools
path = os.environ['EXECBOX_TOOLS']
def conn():
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    return s
def answers(s, n):
    buf = b''
    s.settimeout({wait})
    while buf.count(b'\n') < n:
        chunk = s.recv(1 << 16)
        if not chunk:
            break
        buf += chunk
    return [json.loads(l)['tool_result'] for l in buf.split(b'\n')[:n] if l]
seen = {{}}
# Garbage, a blank line and a frame without a name: protocol errors, in order.
s = conn()
s.sendall(b'garbage\n\n[1,2]\n{{"tool_call":{{"id":5,"args":{{}}}}}}\n')
seen['garbage'] = [(a['id'], a['error']['kind']) for a in answers(s, 3)]
# A line of {line_mib} MiB: counted, not kept; refused by its head.
head = b'{{"tool_call":{{"id":9,"name":"echo.args","args":{{"s":"'
s.sendall(head + b'x' * ({line_mib} << 20) + b'"}}}}}}\n')
seen['huge'] = [(a['id'], a['error']['kind']) for a in answers(s, 1)]
# A line that never ends, {endless_mib} MiB of it, then the connection closes.
t = conn()
t.sendall(b'y' * ({endless_mib} << 20))
t.close()
# Calls whose answers are never read: the host drops that connection.
# (Distinct ids: a call reusing the id of one in flight is refused at once.)
u = conn()
arg = b'z' * 60000
dropped = False
try:
    u.settimeout({wait})
    for i in range(400):
        u.sendall(b'{{"tool_call":{{"id":%d,"name":"echo.args","args":{{"s":"%s"}}}}}}\n' % (i, arg))
except OSError:
    dropped = True
seen['unread_dropped'] = dropped
u.close()
# Many connections at once: those past the bound are closed at once.
# One closed before its call is sent fails the send (EPIPE): closed too.
held, closed = [], 0
for _ in range(64):
    c = conn()
    c.settimeout({wait_each})
    try:
        c.sendall(b'{{"tool_call":{{"id":1,"name":"tools.list","args":{{}}}}}}\n')
    except OSError:
        closed += 1
        c.close()
        continue
    held.append(c)
for c in held:
    try:
        if not c.recv(1 << 16):
            closed += 1
    except OSError:
        closed += 1
seen['served'] = 64 - closed
for c in held:
    c.close()
s.close()
time.sleep(0.5)
seen['after'] = tools.math.add(a=2, b=2)
print(json.dumps(seen))
"#
    )
}

/// What [`flood_code`] prints when every bound of the socket held: typed
/// answers where it read them, the unread connection dropped, at most 16
/// connections served at once, and the `tools` module working after.
pub fn assert_flood_answers(r: &execbox::ExecResult) {
    assert_eq!(r.outcome, execbox::Outcome::Ok, "{r:?}");
    let out = r.output.clone().expect("JSON");
    assert_eq!(out["garbage"], json!([[0, "protocol"], [0, "protocol"], [5, "protocol"]]), "{r:?}");
    assert_eq!(out["huge"], json!([[9, "invalid_arguments"]]), "{r:?}");
    assert_eq!(out["unread_dropped"], true, "{r:?}");
    // At most 16 at once, the first one among them (still open).
    let served = out["served"].as_u64().unwrap();
    assert!((1..=15).contains(&served), "{served} served at once: {r:?}");
    assert_eq!(out["after"], 4, "{r:?}");
}
