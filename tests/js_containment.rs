//! Contained boa (`boa-js`): every class of hostile JavaScript that could
//! take down, exhaust or outlive a host that ran boa in-process ends as a
//! typed outcome here, the host lives on, and the next request is served.
//!
//! The workers come from the `execbox` binary cargo builds for these tests
//! (found next to the test binary, see `execbox::worker`).

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::procfs::zombie_children;
use common::wait::wait_until;
use execbox::Executor;
use execbox::backends::{BoaJs, BoaJsConfig, WorkerGauge};
use execbox::{
    Backend, ExecError, ExecRequest, ExecResult, Language, Outcome, SandboxPolicy, SessionError, SessionSpec, Sessions,
};
use serde_json::json;

fn backend() -> BoaJs {
    BoaJs::new(BoaJsConfig::default().worker_program(env!("CARGO_BIN_EXE_execbox-worker"))).unwrap()
}

fn policy() -> SandboxPolicy {
    SandboxPolicy::strict().timeout(Duration::from_secs(10))
}

fn run(backend: &BoaJs, code: &str, policy: SandboxPolicy) -> Result<ExecResult, ExecError> {
    Executor::run_on(backend, ExecRequest::javascript(code).policy(policy))
}

/// The backend still answers an ordinary request correctly.
fn still_serves(backend: &BoaJs) {
    let request = ExecRequest::javascript("return input.map(x => x * 2)").input(json!([1, 2])).policy(policy());
    let r = Executor::run_on(backend, request).unwrap();
    assert_eq!((r.outcome, r.output), (Outcome::Ok, Some(json!([2, 4]))));
}

/// No zombie child of this process lasts: the tests of this binary run at
/// once, and another test's worker, killed a moment ago, is a zombie until
/// its own backend reaps it; a zombie that lasts 5 s is a leak. (Whether a
/// test's own worker was reaped is `process_gone`'s question.)
fn no_lasting_zombies() -> bool {
    wait_until(Duration::from_secs(5), || zombie_children().is_empty())
}

fn process_gone(pid: u32) -> bool {
    // Gone, or at least not a zombie of ours and not running.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => {
            let state = stat.rsplit(')').next().and_then(|r| r.split_whitespace().next()).unwrap_or("?");
            state == "X"
        }
    }
}

/// Workers started and waiting for a request.
fn ready(backend: &BoaJs) -> usize {
    backend.readiness().map_or(0, |r| r.ready)
}

/// Each snippet reproduced a host abort, a multi-GB allocation or a stuck
/// core on in-process boa. Every one must end as a typed result (or a typed
/// refusal), with the host alive and serving.
#[test]
fn every_hostile_class_ends_typed_and_the_host_serves_on() {
    let deep = "let deep = []; let c = deep; for (let i = 0; i < 20000; i++) { c.push([]); c = c[0]; }";
    let cases: Vec<(&str, String, &[Outcome])> = vec![
        // Native recursion that no guard covers.
        ("toLocaleString cycle", "let a = []; a[0] = a; return a.toLocaleString()".into(), &[Outcome::Failed]),
        ("flat(Infinity) cycle", "let a = [1]; a.push(a); return a.flat(Infinity).length".into(), &[
            Outcome::Ok,
            Outcome::Failed,
            Outcome::OutOfMemory,
            Outcome::TimedOut,
        ]),
        ("error message is itself, thrown", "let e = new Error('x'); e.message = e; throw e".into(), &[Outcome::Failed]),
        (
            "error message is itself, printed",
            "let e = new Error('x'); e.message = e; console.log(e); console.log(String(e)); return 1".into(),
            &[Outcome::Ok, Outcome::Failed],
        ),
        (
            "error message is itself, inside a Map",
            "let e = new Error('x'); e.message = e; console.log(new Map([[1, e]])); return 1".into(),
            &[Outcome::Ok, Outcome::Failed],
        ),
        (
            "prototype cycle through a Proxy",
            "let o = {}; let p = new Proxy(o, {}); Object.setPrototypeOf(o, p); return o.missing".into(),
            &[Outcome::Failed, Outcome::TimedOut],
        ),
        (
            "JSON.parse reviver grafts a cycle",
            "return JSON.parse('{\"a\":1,\"b\":{}}', function (k, v) { if (k === 'a') this.b = this; return v; })"
                .into(),
            &[Outcome::Failed, Outcome::TimedOut],
        ),
        (
            "a long chain of iterator helpers",
            "let it = [1].values(); for (let i = 0; i < 200000; i++) it = it.map(x => x); return it.next().value"
                .into(),
            &[Outcome::Ok, Outcome::Failed, Outcome::OutOfMemory, Outcome::TimedOut],
        ),
        // Guards that check one value while the built-in uses another.
        (
            "a getter answers the walk, then hands stringify a deep value",
            format!("{deep} let n = 0; let o = {{ get x() {{ return ++n > 1 ? deep : 1; }} }}; return JSON.stringify(o)"),
            &[Outcome::Ok],
        ),
        (
            "toJSON answers twice",
            format!("{deep} let n = 0; return JSON.stringify({{ toJSON() {{ return ++n > 1 ? deep : 1; }} }})"),
            &[Outcome::Ok],
        ),
        (
            "a proxy lies about its keys",
            format!(
                "{deep} let n = 0; let p = new Proxy({{}}, {{ ownKeys() {{ return ['a']; }}, \
                 getOwnPropertyDescriptor() {{ return {{ value: 1, enumerable: true, configurable: true }}; }}, \
                 get() {{ return ++n > 1 ? deep : 1; }} }}); return JSON.stringify(p)"
            ),
            // The trap is asked once per key; the deep answer is caught by the bounded snapshot.
            &[Outcome::Failed],
        ),
        (
            "join on a non-array holding a deep array",
            format!("{deep} return Array.prototype.join.call({{ length: 1, 0: deep }})"),
            &[Outcome::Failed],
        ),
        (
            "repeat count whose valueOf changes",
            "let n = 0; return 'ab'.repeat({ valueOf() { return ++n > 1 ? 2 ** 29 : 1; } }).length".into(),
            &[Outcome::Ok],
        ),
        // Allocation failures from lengths JS controls.
        ("sort of 2^32-1 holes", "return Array(2 ** 32 - 1).sort()".into(), &[Outcome::Failed]),
        ("apply with a 2^40 length", "return Math.max.apply(null, { length: 2 ** 40 })".into(), &[Outcome::Failed]),
        ("join with a 2^40 length", "return Array.prototype.join.call({ length: 2 ** 40 })".into(), &[Outcome::Failed]),
        (
            "AggregateError with a huge errors list",
            "let e = new AggregateError([], 'agg'); e.errors.length = 2 ** 32 - 1; throw e".into(),
            &[Outcome::Failed],
        ),
        // No memory ceiling in-process: here the worker's cap holds.
        ("string doubling", "let s = 'x'; while (true) s = s + s".into(), &[Outcome::OutOfMemory, Outcome::Failed]),
        (
            "two 1.5 GiB ArrayBuffers",
            "let a = new ArrayBuffer(1.5 * 2 ** 30); let b = new ArrayBuffer(1.5 * 2 ** 30); return a.byteLength + b.byteLength"
                .into(),
            &[Outcome::OutOfMemory, Outcome::Failed],
        ),
        // Native loops that ignore the budget.
        ("a loop in a native callback", "[1].map(() => { while (true) {} })".into(), &[Outcome::TimedOut]),
    ];
    let backend = backend();
    let quick = policy().timeout(Duration::from_secs(3));
    for (name, code, expected) in &cases {
        let result = run(&backend, code, quick.clone());
        match result {
            Ok(r) => {
                assert!(expected.contains(&r.outcome), "{name}: {r:?}");
                let message = r.message.unwrap_or_default();
                assert!(message.len() <= 4200, "{name}: a message of {} bytes", message.len());
            }
            // A typed refusal is also an acceptable end (e.g. nesting refused before parsing).
            Err(e) => assert!(matches!(e, ExecError::InvalidRequest(_)), "{name}: {e}"),
        }
    }
    // A 128 MiB typed array logged ends ok with a short line that says it
    // is too large to print (the snapshot's element bound). Making it
    // takes ~1.3 s of a debug build on an idle machine (over 3 s on a loaded
    // 2-core one), so it has the ordinary deadline: what this checks is the
    // log, not the engine's speed.
    let logged = run(&backend, "console.log(new Uint8Array(128 * 2 ** 20)); return 1", policy()).unwrap();
    assert_eq!(logged.outcome, Outcome::Ok, "{logged:?}");
    let line = String::from_utf8_lossy(&logged.stdout.bytes);
    assert!(line.starts_with("[unprintable: RangeError") && line.len() < 200, "{line}");
    still_serves(&backend);
}

/// The scanner no longer under-counts: these are refused before boa's
/// parser sees them (and would be contained if they were not).
#[test]
fn code_that_would_overflow_the_parser_is_refused_or_contained() {
    let backend = backend();
    let big = policy().max_code_bytes(4 << 20);
    let hidden = format!("let of = 4, g = 2; return of / {}1{} / g", "(".repeat(20_000), ")".repeat(20_000));
    for code in [format!("return {}0", "!".repeat(3_000_000)), hidden] {
        match run(&backend, &code, big.clone()) {
            Err(ExecError::InvalidRequest(_)) => {}
            Ok(r) => assert_eq!(r.outcome, Outcome::Failed, "{r:?}"),
            Err(e) => panic!("{e}"),
        }
    }
    still_serves(&backend);
}

#[test]
fn the_caps_hold_for_the_returned_value_and_the_message() {
    let backend = backend();
    let r = run(&backend, "return 'x'.repeat(2 ** 20)", policy().max_output_bytes(100)).unwrap();
    assert_eq!((r.outcome, r.output_truncated, &r.output), (Outcome::Failed, true, &None), "{r:?}");
    let r = run(&backend, "throw 'y'.repeat(10_000_000)", policy()).unwrap();
    assert_eq!(r.outcome, Outcome::Failed);
    assert!(r.message.as_deref().unwrap().len() < 4200);
    let r = run(
        &backend,
        "let o = {}; let c = o; for (let i = 0; i < 100000; i++) { c.a = {}; c = c.a; } throw o",
        policy(),
    )
    .unwrap();
    assert_eq!((r.outcome, r.message.as_deref()), (Outcome::Failed, Some("an object was thrown")));
}

#[test]
fn a_timed_out_worker_is_killed_and_uses_no_cpu() {
    let backend =
        BoaJs::new(BoaJsConfig::default().idle_workers(1).worker_program(env!("CARGO_BIN_EXE_execbox-worker")))
            .unwrap();
    backend.prepare(Duration::from_secs(20));
    assert_eq!(ready(&backend), 1);
    let pid = backend.idle_worker_pids()[0];
    let start = Instant::now();
    let r = run(&backend, "[1].map(() => { while (true) {} })", policy().timeout(Duration::from_millis(300))).unwrap();
    assert_eq!(r.outcome, Outcome::TimedOut);
    assert!(start.elapsed() < Duration::from_secs(3), "{:?}", start.elapsed());
    // Killed and reaped before `execute` returned: no process, no zombie.
    assert!(process_gone(pid), "worker {pid} still exists");
    assert!(no_lasting_zombies(), "zombies: {:?}", zombie_children());
    // A replacement is started off the request path.
    backend.prepare(Duration::from_secs(20));
    assert_eq!(ready(&backend), 1);
    assert_ne!(backend.idle_worker_pids()[0], pid);
}

#[test]
fn a_forbidden_system_call_kills_the_worker() {
    use std::os::unix::process::ExitStatusExt;
    let status = execbox::worker::probe_seccomp(Some(env!("CARGO_BIN_EXE_execbox-worker").as_ref())).unwrap();
    assert_eq!(status.signal(), Some(libc_sigsys()), "{status:?}");
}

fn libc_sigsys() -> i32 {
    31 // SIGSYS on x86_64 and aarch64 Linux
}

#[test]
fn workers_run_in_their_own_session_and_die_with_their_host() {
    let backend = backend();
    backend.prepare(Duration::from_secs(20));
    assert!(ready(&backend) >= 1);
    let pid = backend.idle_worker_pids()[0];
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
    // Field 6 (session id) is the worker's own pid after setsid.
    assert_eq!(fields[3], pid.to_string(), "session id: {stat}");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(status.lines().any(|l| l.starts_with("Seccomp:") && l.ends_with('2')), "{status}");
    assert!(status.lines().any(|l| l.starts_with("NoNewPrivs:") && l.ends_with('1')), "{status}");
    // No open files but its three standard descriptors.
    let fds: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(fds, ["0", "1", "2"].into_iter().map(String::from).collect(), "open fds");
    // Dropping the backend kills its workers.
    drop(backend);
    assert!(wait_until(Duration::from_secs(10), || process_gone(pid)), "worker outlived its backend");
}

/// 200 mixed runs, a tenth hostile, on 8 threads: every run gets its own
/// answer, and afterwards the pool is back to its idle size with no zombies.
#[test]
fn mixed_runs_leave_no_workers_or_zombies_behind() {
    let backend = BoaJs::new(
        BoaJsConfig::default().idle_workers(2).max_workers(8).worker_program(env!("CARGO_BIN_EXE_execbox-worker")),
    )
    .unwrap();
    let gauge = backend.worker_gauge();
    let hostile = [
        "[1].map(() => { while (true) {} })",
        "let s = 'x'; while (true) s = s + s",
        "let a = []; a[0] = a; return a.toLocaleString()",
        "while (true) {}",
    ];
    std::thread::scope(|scope| {
        for t in 0..8u64 {
            let backend = backend.clone();
            scope.spawn(move || {
                for i in 0..25u64 {
                    let n = t * 100 + i;
                    let (code, hostile_run) = if n % 10 == 3 {
                        (hostile[(n as usize / 10) % hostile.len()].to_string(), true)
                    } else {
                        (format!("console.log('n={n}'); return {{ n: input.n, sq: input.n * input.n }}"), false)
                    };
                    // Hostile runs end at a short deadline; ordinary ones have room to wait for a worker.
                    let timeout = Duration::from_millis(if hostile_run { 1500 } else { 20_000 });
                    let r = Executor::run_on(
                        &backend,
                        ExecRequest::javascript(code)
                            .input(json!({"n": n}))
                            .policy(policy().timeout(timeout).memory_bytes(64 << 20)),
                    )
                    .unwrap();
                    if hostile_run {
                        assert_ne!(r.outcome, Outcome::Ok, "{r:?}");
                    } else {
                        assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
                        assert_eq!(r.output, Some(json!({"n": n, "sq": n * n})));
                        assert_eq!(r.stdout.text(), format!("n={n}\n"));
                    }
                }
            });
        }
    });
    assert!(
        wait_until(Duration::from_secs(20), || gauge.live() == 2 && ready(&backend) == 2),
        "live workers: {}",
        gauge.live()
    );
    assert!(no_lasting_zombies(), "zombies: {:?}", zombie_children());
    drop(backend);
    assert!(wait_until(Duration::from_secs(10), || gauge.live() == 0), "live workers: {}", gauge.live());
}

#[test]
fn sessions_are_contained_and_validated() {
    // No pooled workers: every live worker is a session's.
    let backend =
        BoaJs::new(BoaJsConfig::default().worker_program(env!("CARGO_BIN_EXE_execbox-worker")).idle_workers(0))
            .unwrap();
    let gauge = backend.worker_gauge();
    let sessions = Sessions::builder().backend(backend.clone()).build();
    sessions.open("s", SessionSpec::new(Language::JavaScript)).unwrap();
    assert_eq!(gauge.live(), 1, "the session has a worker of its own");
    let call = |code: &str, policy: SandboxPolicy| sessions.execute("s", ExecRequest::javascript(code).policy(policy));
    assert_eq!(call("let total = 40; total", policy()).unwrap().output, Some(json!(40)));
    assert_eq!(call("total + 2", policy()).unwrap().output, Some(json!(42)));
    // Request validation applies to sessions too.
    let err = call("1 + 1", policy().max_code_bytes(2)).unwrap_err();
    assert!(matches!(err, SessionError::Exec(ExecError::InvalidRequest(_))), "{err}");
    // A bomb ends the session, and its worker.
    let r = call("let s = 'x'; while (true) s = s + s", policy().memory_bytes(64 << 20)).unwrap();
    assert_eq!(r.outcome, Outcome::OutOfMemory, "{r:?}");
    assert!(wait_until(Duration::from_secs(10), || gauge.live() == 0), "the session's worker outlived it");
    assert_eq!(call("1", policy()).unwrap_err().kind(), "session_lost");

    // Closing a session kills its worker, also while a call of it runs in a
    // native callback (where the VM does not yield): the call ends as killed.
    sessions.open("t", SessionSpec::new(Language::JavaScript)).unwrap();
    let caller = {
        let sessions = sessions.clone();
        std::thread::spawn(move || {
            let spin = ExecRequest::javascript("[1].map(() => { while (true) {} })").policy(policy());
            sessions.execute("t", spin)
        })
    };
    wait_until(Duration::from_secs(10), || sessions.calls_in_flight() > 0);
    let started = Instant::now();
    assert!(sessions.close("t"));
    let r = caller.join().unwrap().unwrap();
    assert_eq!(r.outcome, Outcome::Killed, "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    assert!(wait_until(Duration::from_secs(10), || gauge.live() == 0), "session worker outlived its session");
    assert!(no_lasting_zombies(), "zombies: {:?}", zombie_children());
}

#[test]
fn no_worker_program_is_unavailable_with_the_fix() {
    let backend = BoaJs::new(BoaJsConfig::default().worker_program("/nonexistent/execbox")).unwrap();
    let err = run(&backend, "return 1", policy()).unwrap_err();
    assert_eq!(err.kind(), "backend_unavailable", "{err}");
    assert!(err.to_string().contains("/nonexistent/execbox"), "{err}");
    assert!(backend.availability().is_err());

    // A binary that is not an execbox worker.
    let backend = BoaJs::new(BoaJsConfig::default().worker_program("/bin/true")).unwrap();
    let err = run(&backend, "return 1", policy()).unwrap_err();
    assert_eq!(err.kind(), "backend_unavailable", "{err}");
    assert!(err.to_string().contains("serve_if_worker"), "{err}");
}

/// What an adversarial review of the contained backend found, kept fixed.
#[test]
fn review_findings_stay_fixed() {
    let backend = backend();
    let ok = |code: &str| {
        let r = run(&backend, code, policy()).unwrap();
        assert_eq!(r.outcome, Outcome::Ok, "{code}: {r:?}");
        r
    };
    // Symbol.for was boa's lazily built, process-wide registry: a forbidden
    // syscall after lockdown, and state shared between runs.
    assert_eq!(
        ok("return [String(Symbol.for('a')), Symbol.keyFor(Symbol.for('b')), Symbol.for('c') === Symbol.for('c')]")
            .output,
        Some(json!(["Symbol(a)", "b", true]))
    );
    assert_eq!(ok("globalThis.s = Symbol.for('shared'); return 1").output, Some(json!(1)));
    assert_eq!(ok("return Symbol.keyFor(Symbol('x')) === undefined").output, Some(json!(true)));
    // The Function constructors and eval are the engine's own (scanned by a host hook).
    assert_eq!(
        ok("function f() { let x = 41; return eval('x + 1'); } \
            return [typeof Function.prototype, (() => 1) instanceof Function, f(), new Function('a', 'return a * 2')(4)]")
        .output,
        Some(json!(["function", true, 42, 8]))
    );
    let r = run(&backend, &format!("return eval('{}1{}')", "(".repeat(500), ")".repeat(500)), policy()).unwrap();
    assert!(r.message.unwrap().starts_with("RangeError: source nests"));
    // Control characters escape to 6 bytes each in a frame: still within the frame limit.
    let r = ok("console.log('\\x00'.repeat(400000)); return 1");
    assert_eq!((r.stdout.total_bytes, r.stdout.truncated), (400_001, false));
    // Totals stay exact when the worker is killed mid-flood.
    let r = run(
        &backend,
        "console.log('x'.repeat(2e6)); return Array.prototype.indexOf.call({length: 2 ** 53 - 1}, 1)",
        policy().timeout(Duration::from_millis(1500)),
    )
    .unwrap();
    assert_eq!((r.outcome, r.stdout.total_bytes, r.stdout.truncated), (Outcome::TimedOut, 2_000_001, true));
    // A returned value over the cap is refused before its text exists (not out_of_memory).
    let r = run(&backend, "const s = 'x'.repeat(2 ** 23); return [s, s, s, s]", policy()).unwrap();
    assert_eq!((r.outcome, r.output_truncated), (Outcome::Failed, true), "{r:?}");
    // repeat builds its result in one buffer: 16 Mi units fit the default cap.
    assert_eq!(ok("return 'x'.repeat(2 ** 24).length").output, Some(json!(16_777_216)));
    // A string cut inside a character returns with U+FFFD, not a failure.
    assert_eq!(ok("return 'hi \u{1F600} there'.slice(0, 4)").output, Some(json!("hi \u{FFFD}")));
    // 127 levels are fine; 128 are refused as documented, never by the host's parser.
    assert!(ok("let a = 1; for (let i = 0; i < 126; i++) a = [a]; return a").output.is_some());
    let r = run(&backend, "let a = 1; for (let i = 0; i < 128; i++) a = [a]; return a", policy()).unwrap();
    assert!(r.message.unwrap().starts_with("RangeError: value nests 128 levels"));
    // import() fails in a way the code can catch.
    assert_eq!(ok("try { await import('x'); } catch (e) { return 'caught'; }").output, Some(json!("caught")));
    // A getter that throws while printing is reported, not mistaken for depth.
    assert!(
        ok("console.log({ get a() { throw new Error('g'); } }); return 1")
            .stdout
            .text()
            .starts_with("[unprintable: Error: g")
    );
}

#[test]
fn a_cold_pool_reports_starting_workers_not_busy_ones() {
    let backend =
        BoaJs::new(BoaJsConfig::default().idle_workers(1).worker_program(env!("CARGO_BIN_EXE_execbox-worker")))
            .unwrap();
    match run(&backend, "return 1", policy().timeout(Duration::from_millis(1))) {
        Err(ExecError::Busy { reason, .. }) => assert!(reason.contains("still starting"), "{reason}"),
        Ok(r) => assert_eq!(r.outcome, Outcome::TimedOut), // the worker won the race
        Err(e) => panic!("{e}"),
    }
    backend.prepare(Duration::from_secs(20));
    assert!(ready(&backend) >= 1);
    still_serves(&backend);
}

/// Classes an adversarial review found after the guards were written; each
/// ends typed, the host lives, the next request is served.
#[test]
fn left_associative_chains_and_reachable_engine_assertions_end_typed() {
    let js = backend();
    // Long left-associative chains recurse in boa's parser past the nesting
    // scanner (which counts brackets and right-associative chains): the
    // worker's stack overflow ends the run.
    let chain = format!("return 1{}", "+1".repeat(50_000));
    let r = run(&js, &chain, policy()).unwrap();
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
    assert!(r.message.as_deref().unwrap_or("").contains("crashed"), "{:?}", r.message);
    still_serves(&js);
    // A boa assertion reachable from JS: a panic in the worker, not the host.
    let r = run(&js, "async function* g() { yield* g() } return await g().next()", policy()).unwrap();
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
    still_serves(&js);
}

/// Input at the nesting bound reaches the worker intact (the frame around
/// it once pushed serde_json past its own limit and killed the worker).
#[test]
fn input_at_the_nesting_bound_is_accepted_and_one_deeper_is_refused() {
    let js = backend();
    let nested = |depth: usize| (1..depth).fold(json!([]), |inner, _| json!([inner]));
    let at_bound = ExecRequest::javascript("let d = 0; for (let v = input; Array.isArray(v); v = v[0]) d++; return d")
        .input(nested(127))
        .policy(policy());
    let r = Executor::run_on(&js, at_bound).unwrap();
    assert_eq!((r.outcome, r.output.clone()), (Outcome::Ok, Some(json!(127))), "{r:?}");
    let over = ExecRequest::javascript("return 1").input(nested(129)).policy(policy());
    assert_eq!(Executor::run_on(&js, over).unwrap_err().kind(), "invalid_request");
}

/// Code Mode: a worker killed while the code waits on a tool call ends the
/// run; the call is `unknown` in the ledger, the tool's work is dropped,
/// and no process is left behind.
#[test]
fn a_worker_killed_mid_call_ends_the_run_and_leaves_the_call_unknown() {
    use std::sync::{Mutex, mpsc};

    use execbox::tools::{ToolCallOutcome, ToolRegistry, ToolSpec};
    use serde_json::Value;

    /// Says so when the hanging tool's future is dropped.
    struct Dropped(mpsc::Sender<()>);
    impl Drop for Dropped {
        fn drop(&mut self) {
            let _ = self.0.send(());
        }
    }
    let (dropped, was_dropped) = mpsc::channel::<()>();
    let dropped = Mutex::new(dropped);
    let (called, was_called) = mpsc::channel::<()>();
    let called = Mutex::new(called);
    let registry = ToolRegistry::builder()
        .tool(ToolSpec::new("slow.hang"), move |_: Value| {
            let guard = Dropped(dropped.lock().unwrap().clone());
            let _ = called.lock().unwrap().send(());
            async move {
                let _guard = guard;
                std::future::pending::<()>().await;
                Ok(Value::Null)
            }
        })
        .build()
        .unwrap();
    let backend =
        BoaJs::new(BoaJsConfig::default().idle_workers(1).worker_program(env!("CARGO_BIN_EXE_execbox-worker")))
            .unwrap();
    let gauge = backend.worker_gauge();
    backend.prepare(Duration::from_secs(20));
    assert_eq!(ready(&backend), 1);
    let pid = backend.idle_worker_pids()[0];
    let exec = Executor::builder().backend(backend.clone()).tools(registry).build();
    let policy = policy().timeout(Duration::from_secs(20)).tools(["slow.*"]);
    let started = Instant::now();
    let result = std::thread::scope(|scope| {
        let run = scope.spawn(|| {
            exec.execute_blocking(ExecRequest::javascript("await tools.slow.hang({}); return 1").policy(policy))
                .unwrap()
        });
        was_called.recv_timeout(Duration::from_secs(10)).expect("the tool was called");
        let killed = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
        assert!(killed.success());
        run.join().unwrap()
    });
    assert_eq!(result.outcome, Outcome::Failed, "{result:?}");
    assert!(result.message.as_deref().unwrap_or("").contains("killed"), "{result:?}");
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    assert_eq!(result.tool_calls.len(), 1);
    assert_eq!(result.tool_calls[0].outcome, ToolCallOutcome::Unknown);
    // Nothing left running: the tool's work was dropped, the worker reaped
    // and replaced, no zombie.
    assert!(was_dropped.recv_timeout(Duration::from_secs(5)).is_ok(), "the tool still runs");
    assert!(process_gone(pid));
    assert!(no_lasting_zombies(), "zombies: {:?}", zombie_children());
    assert!(wait_until(Duration::from_secs(20), || gauge.live() == 1 && ready(&backend) == 1));
    still_serves(&backend);
}

/// 48 requests at once, from threads and from async tasks, for 2 workers,
/// each run busy ~30 ms: every waiter is woken as a worker frees (one
/// waiter per freed worker), none sleeps to its deadline, and no more than
/// 2 workers ever live; after the burst the pool is back to its idle size.
#[test]
fn many_waiters_for_few_workers_are_all_served_in_turn() {
    let backend = BoaJs::new(
        BoaJsConfig::default().idle_workers(1).max_workers(2).worker_program(env!("CARGO_BIN_EXE_execbox-worker")),
    )
    .unwrap();
    let gauge = backend.worker_gauge();
    let busy = "const t = Date.now(); while (Date.now() - t < 30) {} return input";
    let most = std::sync::atomic::AtomicUsize::new(0);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for n in 0..24u64 {
            let (backend, most, gauge) = (&backend, &most, &gauge);
            scope.spawn(move || {
                let request =
                    ExecRequest::javascript(busy).input(json!(n)).policy(policy().timeout(Duration::from_secs(60)));
                let r = Executor::run_on(backend, request).unwrap();
                most.fetch_max(gauge.live(), std::sync::atomic::Ordering::SeqCst);
                assert_eq!((r.outcome, r.output), (Outcome::Ok, Some(json!(n))));
            });
        }
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        let exec = Executor::builder().backend(backend.clone()).build();
        runtime.block_on(async {
            let mut tasks = Vec::new();
            for n in 0..24u64 {
                let exec = exec.clone();
                let request =
                    ExecRequest::javascript(busy).input(json!(n)).policy(policy().timeout(Duration::from_secs(60)));
                tasks.push(tokio::spawn(async move { (n, exec.execute(request).await) }));
            }
            for task in tasks {
                let (n, r) = task.await.unwrap();
                let r = r.unwrap();
                assert_eq!((r.outcome, r.output), (Outcome::Ok, Some(json!(n))));
            }
        });
    });
    let took = started.elapsed();
    // 48 runs of 30 ms on 2 workers: ~1 s of work; a waiter left asleep
    // would wait for its 60 s deadline.
    assert!(took < Duration::from_secs(30), "{took:?}");
    assert!(most.load(std::sync::atomic::Ordering::SeqCst) <= 2, "{} workers", most.into_inner());
    assert!(wait_until(Duration::from_secs(20), || gauge.live() == 1), "live workers: {}", gauge.live());
    assert!(no_lasting_zombies(), "zombies: {:?}", zombie_children());
}

/// SIGKILLs `pid` from outside (as the OOM killer or an operator would) and
/// waits until it is no longer running.
fn kill_from_outside(pid: u32) {
    let status = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    assert!(status.success(), "kill -9 {pid}: {status}");
    assert!(wait_until(Duration::from_secs(10), || !common::procfs::alive(pid)), "worker {pid} survived SIGKILL");
}

/// Idle workers the pool has, alive.
fn alive_idle(backend: &BoaJs) -> usize {
    backend.idle_worker_pids().into_iter().filter(|&pid| common::procfs::alive(pid)).count()
}

/// A pool of `idle` workers, once all of them are ready, and its gauge.
fn filled_pool(idle: usize) -> (BoaJs, WorkerGauge) {
    let backend =
        BoaJs::new(BoaJsConfig::default().idle_workers(idle).worker_program(env!("CARGO_BIN_EXE_execbox-worker")))
            .unwrap();
    let gauge = backend.worker_gauge();
    assert!(wait_until(Duration::from_secs(30), || alive_idle(&backend) == idle), "the pool never filled");
    (backend, gauge)
}

/// Waits until the pool is back to `idle` live, idle workers and no more.
fn assert_back_to(backend: &BoaJs, gauge: &WorkerGauge, idle: usize, when: &str) {
    assert!(
        wait_until(Duration::from_secs(20), || alive_idle(backend) == idle && gauge.live() == idle),
        "{when}: idle alive: {}, live: {}",
        alive_idle(backend),
        gauge.live()
    );
}

/// Every idle worker killed from outside: the next run is served (it waits
/// for a new worker rather than sending its job to three dead ones and
/// failing), and the pool is back to its idle size.
#[test]
fn idle_workers_killed_from_outside_are_replaced_and_the_next_run_is_served() {
    let (backend, gauge) = filled_pool(4);
    for pid in backend.idle_worker_pids() {
        kill_from_outside(pid);
    }
    still_serves(&backend);
    assert_back_to(&backend, &gauge, 4, "after the run");
    assert!(no_lasting_zombies(), "zombies: {:?}", zombie_children());
}

/// The worker that just answered, killed from outside while it builds its
/// next context: the next run drops it and the refill thread replaces it,
/// also under sequential load (where no run gives a worker back to an empty
/// idle list, so nothing else wakes the refill thread).
#[test]
fn a_worker_killed_while_it_builds_its_next_context_is_replaced_under_sequential_load() {
    let (backend, gauge) = filled_pool(3);
    for round in 0..5 {
        still_serves(&backend);
        // The worker that answered went back last.
        kill_from_outside(*backend.idle_worker_pids().last().unwrap());
        for _ in 0..5 {
            still_serves(&backend);
        }
        assert_back_to(&backend, &gauge, 3, &format!("round {round}"));
    }
    assert!(no_lasting_zombies(), "zombies: {:?}", zombie_children());
}

/// Idle workers killed from outside while no request comes: the pool reaps
/// and replaces them on its own (within its sweep), so its readiness never
/// counts dead workers for long and none is left a zombie.
#[test]
fn idle_workers_killed_while_nothing_runs_are_reaped_and_replaced_without_a_request() {
    let (backend, gauge) = filled_pool(3);
    let killed = backend.idle_worker_pids();
    for &pid in &killed[..2] {
        kill_from_outside(pid);
    }
    let replaced = || {
        let pids = backend.idle_worker_pids();
        pids.len() == 3 && pids.iter().all(|pid| !killed[..2].contains(pid)) && alive_idle(&backend) == 3
    };
    assert!(
        wait_until(Duration::from_secs(20), || replaced() && gauge.live() == 3),
        "idle: {:?} (killed {:?}), live: {}",
        backend.idle_worker_pids(),
        &killed[..2],
        gauge.live()
    );
    assert_eq!(backend.readiness().map(|r| r.ready), Some(3));
    assert!(no_lasting_zombies(), "zombies: {:?}", zombie_children());
    still_serves(&backend);
}
