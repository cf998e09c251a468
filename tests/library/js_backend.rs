//! The boa JavaScript backend: request semantics, limits, hostile code.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use execbox::backends::{BoaJs, BoaJsConfig, BoaJsInThread};
use execbox::{
    Control, ExecError, ExecRequest, ExecResult, Executor, InvalidRequest, Language, Outcome, SandboxPolicy,
    SessionError, SessionSpec, Sessions,
};
use serde_json::{Value, json};

fn exec() -> &'static Executor {
    static EXEC: OnceLock<Executor> = OnceLock::new();
    EXEC.get_or_init(Executor::with_default_backends)
}

fn run(code: &str) -> ExecResult {
    run_with(ExecRequest::javascript(code))
}

fn run_with(req: ExecRequest) -> ExecResult {
    exec().execute_blocking(req).expect("request should run")
}

fn quick() -> SandboxPolicy {
    SandboxPolicy::strict().timeout(Duration::from_millis(300))
}

#[test]
fn transform_returns_json_output() {
    let r = run_with(
        ExecRequest::javascript("return input.items.filter(x => x % 2).map(x => x * 10).reduce((a, b) => a + b, 0);")
            .input(json!({"items": [1, 2, 3, 4, 5]})),
    );
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(r.output, Some(json!(90)));
    assert_eq!(r.backend, "boa-js");
    assert_eq!(r.exit_code, None);
    assert!(r.usage.instructions.unwrap() > 0);
}

#[test]
fn console_is_captured_and_trailing_comment_is_harmless() {
    let r = run(
        "console.log('a', 1, [2], {k: 'v'}); console.info('b'); console.warn('w'); console.error('e');\nreturn 7 // done",
    );
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    // Values print as their JSON, errors as `Name: message` (as on QuickJS).
    assert_eq!(r.stdout.text(), "a 1 [2] {\"k\":\"v\"}\nb\n");
    assert_eq!(r.stderr.text(), "w\ne\n");
    assert_eq!(r.output, Some(json!(7)));
}

#[test]
fn uncaught_exception_is_failed_with_name_and_message() {
    let r = run("function g() { throw new TypeError('bad thing'); }\ng();");
    assert_eq!(r.outcome, Outcome::Failed);
    assert_eq!(r.message.as_deref(), Some("TypeError: bad thing"));
    assert!(r.stderr.text().contains("Uncaught TypeError: bad thing"), "{:?}", r.stderr.text());
    let thrown = run("throw 'plain string'");
    assert_eq!(thrown.message.as_deref(), Some("plain string"));
}

#[test]
fn syntax_error_reports_user_line_and_column() {
    let r = run("let ok = 1;\nlet x = ;");
    assert_eq!(r.outcome, Outcome::Failed);
    let m = r.message.unwrap();
    assert!(m.starts_with("SyntaxError"), "{m}");
    assert!(m.contains("line 2, col 9"), "{m}");
    let first = run("let x = ;").message.unwrap();
    assert!(first.contains("line 1, col 9"), "{first}");
}

#[test]
fn promises_are_awaited() {
    assert_eq!(run("return Promise.resolve(41).then(x => x + 1)").output, Some(json!(42)));
    assert_eq!(run("const v = await Promise.resolve(5); return v * 2").output, Some(json!(10)));
    let rejected = run("return Promise.reject(new RangeError('nope'))");
    assert_eq!(rejected.outcome, Outcome::Failed);
    assert_eq!(rejected.message.as_deref(), Some("RangeError: nope"));
    let pending = run("return new Promise(() => {})");
    assert_eq!(pending.outcome, Outcome::Failed);
    assert!(pending.message.unwrap().contains("never settled"));
}

#[test]
fn values_without_json_form_have_defined_results() {
    assert_eq!(run("return undefined").output, None);
    assert_eq!(run("let x = 1").output, None);
    assert_eq!(run("return () => 1").output, None);
    assert_eq!(run("return null").output, Some(Value::Null));
    assert_eq!(
        run("return [undefined, () => 1, NaN, Infinity, new Date(0), {f() {}, u: undefined, k: 1}]").output,
        Some(json!([null, null, null, null, "1970-01-01T00:00:00.000Z", {"k": 1}]))
    );
    let bigint = run("return 10n");
    assert_eq!(bigint.outcome, Outcome::Failed);
    assert!(bigint.message.unwrap().contains("bigint"));
    let cycle = run("const a = {}; a.self = a; return a");
    assert_eq!(cycle.outcome, Outcome::Failed);
    assert!(cycle.message.unwrap().contains("cyclic"));
}

#[test]
fn host_apis_do_not_exist() {
    let r = run("return ['require', 'process', 'fetch', 'Deno', 'setTimeout', 'XMLHttpRequest', 'WebSocket', 'Bun']\
         .map(n => typeof globalThis[n])");
    assert_eq!(r.output, Some(json!(vec!["undefined"; 8])));
}

#[test]
fn infinite_loop_times_out_near_the_deadline() {
    let start = Instant::now();
    let r = run_with(ExecRequest::javascript("while (true) {}").policy(quick()));
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    assert!(start.elapsed() < Duration::from_secs(3), "took {:?}", start.elapsed());
    assert_eq!(r.message.as_deref(), Some("deadline of 300 ms exceeded"));
}

#[test]
fn loop_inside_native_callback_still_times_out_for_the_caller() {
    let start = Instant::now();
    // The budget is what later stops the abandoned worker; keep it small so the
    // test does not leave a busy thread behind for long. A debug build runs
    // 5,000-10,000 instructions per ms (3M ran out at 316 ms in one CI run,
    // racing the 300 ms deadline), so 12M outlasts the deadline fourfold;
    // an optimized build may exhaust it first.
    let r = run_with(
        ExecRequest::javascript("console.log('before'); [1].map(() => { while (true) {} })")
            .policy(quick().fuel(12_000_000)),
    );
    if cfg!(debug_assertions) {
        assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    } else {
        assert!(matches!(r.outcome, Outcome::TimedOut | Outcome::OutOfFuel), "{r:?}");
    }
    assert!(start.elapsed() < Duration::from_secs(3), "took {:?}", start.elapsed());
    assert_eq!(r.stdout.text(), "before\n", "output before the deadline is kept");
}

#[test]
fn promise_job_loop_times_out() {
    let r = run_with(
        ExecRequest::javascript("function spin() { return Promise.resolve().then(spin); } spin(); return 1")
            .policy(quick()),
    );
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
}

#[test]
fn instruction_budget_gives_out_of_fuel() {
    let r = run_with(
        ExecRequest::javascript("let i = 0; while (true) { i++ }").policy(SandboxPolicy::strict().fuel(50_000)),
    );
    assert_eq!(r.outcome, Outcome::OutOfFuel, "{r:?}");
    assert_eq!(r.usage.instructions, Some(50_000));
    assert!(r.message.unwrap().contains("50000"));
    // The budget also stops JS called from native code.
    let r = run_with(
        ExecRequest::javascript("[1].map(() => { let i = 0; while (true) { i++ } })")
            .policy(SandboxPolicy::strict().fuel(50_000)),
    );
    assert_eq!(r.outcome, Outcome::OutOfFuel, "{r:?}");
    // It is not catchable.
    let r = run_with(
        ExecRequest::javascript("try { while (true) {} } catch (e) { return 'caught' }")
            .policy(SandboxPolicy::strict().fuel(10_000)),
    );
    assert_eq!(r.outcome, Outcome::OutOfFuel, "{r:?}");
}

#[test]
fn small_programs_fit_a_small_budget() {
    let r =
        run_with(ExecRequest::javascript("return [1,2,3].map(x => x + 1)").policy(SandboxPolicy::strict().fuel(1_000)));
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert!(r.usage.instructions.unwrap() < 1_000);
}

#[test]
fn deep_recursion_fails_without_crashing() {
    let r = run("function f(n) { return f(n + 1) + 1 } return f(0)");
    assert_eq!(r.outcome, Outcome::Failed);
    assert!(r.message.unwrap().contains("recursive"), "uncatchable runtime limit");
    let r = run("function f(n) { return f(n + 1) } try { f(0) } catch (e) { return 'caught' }");
    assert_eq!(r.outcome, Outcome::Failed, "runtime limits are not catchable: {r:?}");
}

#[test]
fn deeply_nested_text_given_to_parsers_fails_without_crashing() {
    for code in [
        r#"eval("(".repeat(200000))"#,
        r#"return JSON.parse("[".repeat(200000))"#,
        r#"new Function("return " + "[".repeat(200000))"#,
        r#"Function("(".repeat(200000))"#,
        r#"(function(){}).constructor("[".repeat(200000))"#,
        r#"(async function(){}).constructor("[".repeat(200000))"#,
        r#"(function*(){}).constructor("[".repeat(200000))"#,
        r#"eval("a=".repeat(100000) + "1")"#,
    ] {
        let r = run(code);
        assert_eq!(r.outcome, Outcome::Failed, "{code}: {r:?}");
        assert!(r.message.as_deref().unwrap_or("").contains("nests"), "{code}: {:?}", r.message);
    }
    // Shallow dynamic code still works.
    assert_eq!(
        run("return eval('[[1]]')[0][0] + JSON.parse('[2]')[0] + Function('return 3')()").output,
        Some(json!(6))
    );
}

#[test]
fn deeply_nested_code_or_input_is_refused_before_parsing() {
    let deep_code = format!("return {}1{}", "[".repeat(100_000), "]".repeat(100_000));
    let err = exec().execute_blocking(ExecRequest::javascript(deep_code)).unwrap_err();
    assert!(matches!(err, ExecError::InvalidRequest(InvalidRequest::TooDeep { what: "code", .. })), "{err}");

    let mut deep = json!(1);
    for _ in 0..50_000 {
        deep = Value::Array(vec![deep]);
    }
    let err = exec().execute_blocking(ExecRequest::javascript("return 1").input(deep)).unwrap_err();
    assert!(matches!(err, ExecError::InvalidRequest(InvalidRequest::TooDeep { what: "input", .. })), "{err}");
}

#[test]
fn deep_values_built_at_runtime_fail_without_crashing() {
    let build = "let a = [1]; for (let i = 0; i < 5000; i++) a = [a];";
    for tail in ["return String(a)", "return JSON.stringify(a)", "return a", "return a.join()"] {
        let r = run(&format!("{build} {tail}"));
        assert_eq!(r.outcome, Outcome::Failed, "{tail}: {r:?}");
        assert!(r.message.unwrap().contains(" nests "), "{tail}");
    }
    let r = run(&format!("{build} console.log(a); return 1"));
    assert_eq!(r.outcome, Outcome::Ok);
    assert!(r.stdout.text().starts_with("[unprintable: RangeError: value nests"), "{}", r.stdout.text());
    // Shared sub-values cannot blow up a walk exponentially.
    let r = run_with(
        ExecRequest::javascript("let a = [1]; for (let i = 0; i < 40; i++) a = [a, a]; return a.toString().length")
            .policy(SandboxPolicy::strict().timeout(Duration::from_secs(60))),
    );
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
}

#[test]
fn huge_builtin_allocations_are_refused() {
    for code in [
        "return 'x'.repeat(1 << 28).length",
        "return ''.padStart(1 << 30).length",
        "return 'a'.padEnd(1e12).length",
        "return new Array(1e9).fill(0).length",
    ] {
        let r = run(code);
        assert_eq!(r.outcome, Outcome::Failed, "{code}: {r:?}");
        assert!(r.message.as_deref().unwrap_or("").starts_with("RangeError"), "{code}: {:?}", r.message);
    }
    assert_eq!(run("return 'ab'.repeat(3) + '7'.padStart(3, '0')").output, Some(json!("ababab007")));
}

#[test]
fn output_flood_is_truncated_with_totals() {
    let r = run_with(
        ExecRequest::javascript("for (let i = 0; i < 2000; i++) console.log('0123456789'); return 'done'")
            .policy(SandboxPolicy::strict().max_output_bytes(1000)),
    );
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert_eq!(r.stdout.bytes.len(), 1000);
    assert!(r.stdout.truncated);
    assert_eq!(r.stdout.total_bytes, 2000 * 11);
    assert!(!r.stderr.truncated);
    assert_eq!(r.output, Some(json!("done")));
}

#[test]
fn code_over_the_size_limit_is_refused() {
    let err = exec()
        .execute_blocking(
            ExecRequest::javascript("x".repeat(2000)).policy(SandboxPolicy::strict().max_code_bytes(1000)),
        )
        .unwrap_err();
    assert_eq!(err, ExecError::InvalidRequest(InvalidRequest::CodeTooLarge { size: 2000, max: 1000 }));
}

#[test]
fn no_state_leaks_between_requests() {
    for _ in 0..6 {
        let r = run("const seen = [typeof globalThis.leak, typeof Array.prototype.evil, typeof input];\
             globalThis.leak = 1; Array.prototype.evil = 1; JSON.stringify = () => 'hijacked';\
             return seen");
        assert_eq!(r.output, Some(json!(["undefined", "undefined", "undefined"])), "{r:?}");
    }
}

#[test]
fn memory_cap_is_refused_by_in_thread_boa() {
    // The contained boa-js enforces it; the in-thread engine shares the host's heap.
    let only_boa = Executor::builder().backend(BoaJsInThread::default()).build();
    let err = only_boa
        .execute_blocking(ExecRequest::javascript("return 1").policy(SandboxPolicy::strict().memory_bytes(64 << 20)))
        .unwrap_err();
    let ExecError::Refused { rejections } = &err else { panic!("{err}") };
    let boa = rejections.iter().find(|r| r.backend == "boa-js-inthread").expect("boa considered");
    assert_eq!(boa.violations.len(), 1);
    assert_eq!(boa.violations[0].control, Control::Memory);
    assert_eq!(rejections.len(), 1);
}

#[test]
fn concurrent_runs_do_not_mix_output() {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..24)
            .map(|i| {
                s.spawn(move || {
                    let r = run_with(
                        ExecRequest::javascript("console.log('id', input.id); return input.id * 2")
                            .input(json!({"id": i})),
                    );
                    (i, r)
                })
            })
            .collect();
        for h in handles {
            let (i, r) = h.join().unwrap();
            assert_eq!(r.output, Some(json!(i * 2)));
            assert_eq!(r.stdout.text(), format!("id {i}\n"));
        }
    });
}

#[test]
fn dropping_the_backend_ends_its_threads() {
    let backend = BoaJs::new(BoaJsConfig::default().idle_workers(2)).unwrap();
    let gauge = backend.worker_gauge();
    let exec = Executor::builder().backend(backend).build();
    for _ in 0..3 {
        assert!(exec.execute_blocking(ExecRequest::javascript("return 1")).unwrap().is_ok());
    }
    let timed_out = exec.execute_blocking(ExecRequest::javascript("while (true) {}").policy(quick())).unwrap();
    assert_eq!(timed_out.outcome, Outcome::TimedOut);
    assert!(gauge.live() >= 1);
    drop(exec);
    crate::common::wait::wait_until(Duration::from_secs(10), || gauge.live() == 0);
    assert_eq!(gauge.live(), 0, "worker threads outlived the backend");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_execute_works_inside_tokio() {
    let r = exec().execute(ExecRequest::javascript("return input + 1").input(json!(1))).await.unwrap();
    assert_eq!(r.output, Some(json!(2)));
}

#[tokio::test(flavor = "current_thread")]
async fn async_execute_on_a_current_thread_runtime() {
    let r = exec().execute(ExecRequest::javascript("return 'x'")).await.unwrap();
    assert_eq!(r.output, Some(json!("x")));
}

/// Checking a large output against its schema can take a second (the
/// work bound's own worst case): an async caller's runtime keeps running
/// meanwhile (it checked on the caller's task; on a 2-core `execbox serve`
/// two such runs held every runtime thread).
#[tokio::test(flavor = "current_thread")]
async fn a_large_output_is_checked_off_the_callers_runtime() {
    let schema = execbox::JsonSchema::new(json!({"items": {"allOf": vec![json!({"type": "integer"}); 140]}})).unwrap();
    let request = ExecRequest::javascript("return Array(200000).fill(0)").output_schema(schema);
    let beats = std::sync::Arc::new(parking_lot::Mutex::new(Vec::<Instant>::new()));
    let ticking = beats.clone();
    let ticker = tokio::spawn(async move {
        loop {
            ticking.lock().push(Instant::now());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    let checked = Instant::now();
    let r = exec().execute(request).await.unwrap();
    let took = checked.elapsed();
    tokio::time::sleep(Duration::from_millis(30)).await; // the ticker beats once more
    ticker.abort();
    assert_eq!(r.outcome, Outcome::Ok, "{:?}", r.message);
    let beats = beats.lock();
    let longest = beats.windows(2).map(|w| w[1] - w[0]).max().unwrap_or_default();
    assert!(longest < Duration::from_millis(400), "the runtime stood still {longest:?} of the run's {took:?}");
}

/// Issue 18 item 8: a session cell may `return` like a one-shot run; cells
/// without a top-level `return` run as scripts, as before.
#[test]
fn a_session_cell_may_return_its_output() {
    let sessions = Sessions::builder().backend(BoaJs::default()).build();
    sessions.open("s", SessionSpec::new(Language::JavaScript)).unwrap();
    let output = |code: &str| {
        let r = sessions.execute("s", ExecRequest::javascript(code)).unwrap();
        assert_eq!(r.outcome, Outcome::Ok, "{code}: {r:?}");
        r.output
    };
    assert_eq!(output("let k = 41; function twice(x) { return 2 * x } k"), Some(json!(41)));
    // A top-level `return` sets the output, and sees earlier declarations.
    assert_eq!(output("return k + 1"), Some(json!(42)));
    assert_eq!(output("if (k > 40) { return 'big' } 'small'"), Some(json!("big")));
    assert_eq!(output("for (const x of [1, 2, 3]) { if (x * k > 100) return x } return 0"), Some(json!(3)));
    // Assigning an earlier cell's names from a returning cell persists...
    assert_eq!(output("k = 100; return twice(k)"), Some(json!(200)));
    assert_eq!(output("k"), Some(json!(100)));
    // ...its own declarations are local to the cell (it runs as a function body).
    assert_eq!(output("let local = 5; globalThis.kept = local; return local"), Some(json!(5)));
    assert_eq!(output("[typeof local, kept]"), Some(json!(["undefined", 5])));
    // A returned promise is awaited; `await` makes the cell an async body.
    assert_eq!(output("return Promise.resolve(k + 1)"), Some(json!(101)));
    assert_eq!(output("const v = await Promise.resolve(7); return v * 2"), Some(json!(14)));
    // `return` inside nested functions is theirs: the cell stays a script,
    // its declarations persist and its last expression is the output.
    assert_eq!(
        output("const add = (a, b) => { return a + b }; function three() { return 3 } add(three(), k)"),
        Some(json!(103))
    );
    assert_eq!(output("add(1, 1) + three()"), Some(json!(5)));
    assert_eq!(output("const o = { m() { return 'm' } }; o.m()"), Some(json!("m")));
    // The last-expression fallback is unchanged, and so is a cell with no value.
    assert_eq!(output("k + 1; k + 2"), Some(json!(102)));
    assert_eq!(output("let nothing = 1"), None);
    // A syntax error with a `return` in it is reported as a syntax error.
    let r = sessions.execute("s", ExecRequest::javascript("return (")).unwrap();
    assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
    assert!(r.message.as_deref().unwrap_or("").starts_with("SyntaxError"), "{r:?}");
    // A thrown error in a returning cell fails the call, like a one-shot run.
    let r = sessions.execute("s", ExecRequest::javascript("throw new Error('no'); return 1")).unwrap();
    assert_eq!((r.outcome, r.message.as_deref()), (Outcome::Failed, Some("Error: no")));
    assert_eq!(output("k"), Some(json!(100)), "the session lives on");
}

#[test]
fn a_session_keeps_its_realm_and_refuses_per_call_fuel() {
    let sessions = Sessions::builder().backend(BoaJs::default()).build();
    sessions.open("s", SessionSpec::new(Language::JavaScript)).unwrap();
    let call = |request: ExecRequest| sessions.execute("s", request);
    let r = call(ExecRequest::javascript("let total = input.n; total").input(json!({"n": 1}))).unwrap();
    assert_eq!(r.output, Some(json!(1)));
    let r = call(ExecRequest::javascript("total += input.n; total").input(json!({"n": 5}))).unwrap();
    assert_eq!(r.output, Some(json!(6)));
    let r = call(ExecRequest::javascript("return 1")).unwrap();
    assert_eq!((r.outcome, r.output), (Outcome::Ok, Some(json!(1))), "a top-level `return` sets the output");
    let r = call(ExecRequest::javascript("let = ;")).unwrap();
    assert_eq!(r.outcome, Outcome::Failed, "a syntax error is still one");
    let fuel = call(ExecRequest::javascript("1").policy(SandboxPolicy::strict().fuel(10)));
    let Err(SessionError::Exec(ExecError::Refused { rejections })) = fuel else { panic!("{fuel:?}") };
    assert_eq!(rejections[0].violations[0].control, Control::Fuel);
    assert_eq!(sessions.len(), 1, "a refused call leaves the session as it was");
}

// ---- Code Mode: `tools` on contained boa, in-thread boa and JS sessions ----

mod code_mode {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use execbox::backends::{BoaJs, BoaJsInThread};
    use execbox::tools::{ToolCallOutcome, ToolError, ToolErrorKind, ToolLimits, ToolRegistry, ToolSpec};
    use execbox::{ExecRequest, ExecResult, Executor, Outcome, SandboxPolicy, Sessions};
    use serde_json::{Value, json};
    use sha2::{Digest, Sha256};

    fn registry() -> ToolRegistry {
        ToolRegistry::builder()
            .tool(ToolSpec::new("math.add").description("a + b"), |args: Value| async move {
                Ok(json!(args["a"].as_i64().unwrap_or(0) + args["b"].as_i64().unwrap_or(0)))
            })
            .tool(ToolSpec::new("fail.always"), |_: Value| async { Err(ToolError::failed("fail.always", "nope")) })
            .tool(ToolSpec::new("slow.sleep"), |args: Value| async move {
                // The subject: a tool that takes `ms` to answer.
                tokio::time::sleep(Duration::from_millis(args["ms"].as_u64().unwrap_or(0))).await;
                Ok(json!("slept"))
            })
            .tool(ToolSpec::new("slow.hang"), |_: Value| async {
                std::future::pending::<()>().await;
                Ok(Value::Null)
            })
            .tool(ToolSpec::new("bad.panic"), |_: Value| async { panic!("the tool broke") })
            .tool(ToolSpec::new("big.blob"), |_: Value| async { Ok(json!("x".repeat(100 << 20))) })
            .tool(ToolSpec::new("secret.read"), |_: Value| async { Ok(json!("the secret")) })
            .build()
            .unwrap()
    }

    /// Grants every tool but `secret.read`; no memory cap (in-thread boa
    /// cannot enforce one).
    fn policy() -> SandboxPolicy {
        let mut policy = SandboxPolicy::strict()
            .timeout(Duration::from_secs(10))
            .tools(["math.*", "fail.*", "slow.*", "bad.*", "big.*"]);
        policy.memory_bytes = None;
        policy
    }

    /// The three JavaScript carriers of the tool bridge.
    enum Carrier {
        Executor(Executor),
        /// Awaited on a task of an execbox runtime: contained boa's runs talk
        /// to their worker on the task, through the runtime's reactor.
        Awaited(Executor, tokio::runtime::Runtime),
        /// Each run in a new session (a call that times out ends its session).
        Sessions(Sessions, AtomicU64),
    }

    impl Carrier {
        fn run(&self, code: &str, policy: SandboxPolicy) -> ExecResult {
            let request = ExecRequest::javascript(code).policy(policy);
            match self {
                Carrier::Executor(exec) => exec.execute_blocking(request).unwrap(),
                Carrier::Awaited(exec, runtime) => {
                    let exec = exec.clone();
                    runtime
                        .block_on(async move { tokio::spawn(async move { exec.execute(request).await }).await })
                        .unwrap()
                        .unwrap()
                }
                Carrier::Sessions(sessions, next) => {
                    let id = format!("s{}", next.fetch_add(1, Ordering::SeqCst));
                    sessions.execute_or_open(&id, request).unwrap()
                }
            }
        }
    }

    fn carriers() -> Vec<(&'static str, Carrier)> {
        vec![
            ("boa-js", Carrier::Executor(Executor::builder().backend(BoaJs::default()).tools(registry()).build())),
            (
                "boa-js awaited",
                Carrier::Awaited(
                    Executor::builder().backend(BoaJs::default()).tools(registry()).build(),
                    execbox::runtime_builder().worker_threads(2).build().unwrap(),
                ),
            ),
            (
                "boa-js-inthread",
                Carrier::Executor(Executor::builder().backend(BoaJsInThread::default()).tools(registry()).build()),
            ),
            (
                "boa-js-session",
                Carrier::Sessions(
                    Sessions::builder().backend(BoaJs::default()).tools(registry()).build(),
                    AtomicU64::new(0),
                ),
            ),
        ]
    }

    fn ok(carrier: &str, r: &ExecResult) -> Value {
        assert_eq!(r.outcome, Outcome::Ok, "{carrier}: {r:?}");
        assert_eq!(r.backend, carrier.trim_end_matches(" awaited"));
        r.output.clone().unwrap_or(Value::Null)
    }

    /// Every test of the carrier contract, on each carrier.
    #[test]
    fn every_js_carrier_keeps_the_contract() {
        for (name, carrier) in carriers() {
            // Round trip, and the ledger: sha256 of the arguments, outcome, bytes.
            let r = carrier.run("return await tools.math.add({a: 2, b: 3})", policy());
            assert_eq!(ok(name, &r), json!(5));
            assert_eq!(r.tool_calls.len(), 1, "{name}: {:?}", r.tool_calls);
            let call = &r.tool_calls[0];
            assert_eq!((call.tool.as_str(), call.outcome), ("math.add", ToolCallOutcome::Ok));
            assert_eq!(call.args_sha256, format!("{:x}", Sha256::digest(br#"{"a":2,"b":3}"#)));
            assert_eq!((call.bytes_in, call.bytes_out, call.truncated), (13, 1, false));

            // A failing tool: a ToolError the code catches.
            let r = carrier.run(
                "try { await tools.fail.always({}); } catch (e) {
                     return [e instanceof ToolError, e instanceof Error, e.name, e.kind, e.tool, e.message]; }",
                policy(),
            );
            assert_eq!(ok(name, &r), json!([true, true, "ToolError", "failed", "fail.always", "nope"]));
            assert_eq!(r.tool_calls[0].outcome, ToolCallOutcome::Error);

            // Not granted: no `tools.secret`, and a call by name is refused.
            let r = carrier.run(
                "const kinds = [typeof tools.secret];
                 try { await tools.call('secret.read', {}); } catch (e) { kinds.push(e.kind); }
                 try { await tools.call('math.nope', {}); } catch (e) { kinds.push(e.kind); }
                 return kinds",
                policy(),
            );
            assert_eq!(ok(name, &r), json!(["undefined", "not_granted", "not_found"]));
            assert_eq!(r.tool_calls[0].outcome, ToolCallOutcome::Refused);
            assert_eq!(r.tool_calls[0].error, Some(ToolErrorKind::NotGranted));

            // list and describe.
            let r = carrier.run(
                "const names = await tools.list(); const spec = await tools.describe('math.add');
                 return [names, spec.description]",
                policy(),
            );
            let names = json!(["bad.panic", "big.blob", "fail.always", "math.add", "slow.hang", "slow.sleep"]);
            assert_eq!(ok(name, &r), json!([names, "a + b"]));

            // A loop of calls hits max_calls; the code catches it and finishes.
            let limited = policy().tool_limits(ToolLimits::default().max_calls(3));
            let r = carrier.run(
                "let n = 0; for (;;) { try { await tools.math.add({a: n, b: 1}); n++; } catch (e) { return [n, e.kind]; } }",
                limited,
            );
            assert_eq!(ok(name, &r), json!([3, "budget_exhausted"]));
            assert_eq!(r.tool_calls.len(), 4);
            assert_eq!(r.tool_calls[3].error, Some(ToolErrorKind::BudgetExhausted));

            // Huge arguments never cross.
            let r = carrier.run(
                "try { await tools.math.add({blob: 'x'.repeat(1 << 20)}); } catch (e) { return e.kind; }",
                policy(),
            );
            assert_eq!(ok(name, &r), json!("invalid_arguments"));
            assert!(r.tool_calls.is_empty(), "{name}: {:?}", r.tool_calls);

            // A 100 MB result is cut to the cap, keeping its shape, and the ledger says so.
            let r = carrier.run("const v = await tools.big.blob({}); return [typeof v, v.length < 300000]", policy());
            assert_eq!(ok(name, &r), json!(["string", true]));
            assert!(r.tool_calls[0].truncated, "{name}: {:?}", r.tool_calls);
            assert!(r.tool_calls[0].bytes_out <= ToolLimits::default().max_result_bytes);

            // A tool that panics fails its call; the host serves on.
            let r = carrier.run("try { await tools.bad.panic({}); } catch (e) { return e.kind; }", policy());
            assert_eq!(ok(name, &r), json!("failed"));
            assert_eq!(ok(name, &carrier.run("return await tools.math.add({a: 1, b: 1})", policy())), json!(2));

            // A tool that hangs: the call times out...
            let short = policy().tool_limits(ToolLimits::default().call_timeout_ms(200));
            let r = carrier.run("try { await tools.slow.hang({}); } catch (e) { return e.kind; }", short);
            assert_eq!(ok(name, &r), json!("timed_out"));
            assert_eq!(r.tool_calls[0].outcome, ToolCallOutcome::Unknown);
            // ...and the run still ends by its deadline.
            let started = Instant::now();
            let r = carrier.run("await tools.slow.hang({}); return 1", policy().timeout(Duration::from_millis(700)));
            assert_eq!(r.outcome, Outcome::TimedOut, "{name}: {r:?}");
            assert!(started.elapsed() < Duration::from_secs(3), "{name}: {:?}", started.elapsed());
            assert_eq!(r.tool_calls[0].outcome, ToolCallOutcome::Unknown);

            // Without a grant there is no `tools`, and nothing reaches the host.
            let mut strict = SandboxPolicy::strict();
            strict.memory_bytes = None;
            let r = carrier.run("return [typeof tools, typeof ToolError]", strict);
            assert_eq!(ok(name, &r), json!(["undefined", "undefined"]));
            assert!(r.tool_calls.is_empty());
        }
    }

    /// `Promise.all` of three slow calls runs them at once.
    #[test]
    fn concurrent_calls_run_in_parallel() {
        for (name, carrier) in carriers() {
            let r = carrier.run(
                "const t0 = Date.now();
                 const all = await Promise.all([1, 2, 3].map(() => tools.slow.sleep({ms: 600})));
                 return [all, Date.now() - t0]",
                policy(),
            );
            let out = ok(name, &r);
            assert_eq!(out[0], json!(["slept", "slept", "slept"]));
            // Three in a row would take 1800 ms.
            assert!(out[1].as_f64().unwrap() < 1400.0, "{name}: {out}");
            assert_eq!(r.tool_calls.len(), 3);
            // Beyond max_concurrent the bridge refuses.
            let two = policy().tool_limits(ToolLimits::default().max_concurrent(2));
            let r = carrier.run(
                "const got = await Promise.allSettled([1, 2, 3].map(() => tools.slow.sleep({ms: 200})));
                 return got.map(g => g.status === 'fulfilled' ? g.value : g.reason.kind)",
                two,
            );
            assert_eq!(ok(name, &r), json!(["slept", "slept", "too_many_in_flight"]));
        }
    }

    /// A session keeps functions that call tools across cells; a cell
    /// without a grant has no `tools`, and a kept reference is refused.
    #[test]
    fn session_cells_call_tools() {
        let sessions = Sessions::builder().backend(BoaJs::default()).tools(registry()).build();
        let cell = |code: &str, policy: SandboxPolicy| {
            sessions.execute_or_open("s", ExecRequest::javascript(code).policy(policy))
        };
        let r =
            cell("async function sum(a, b) { return await tools.math.add({a, b}); } const kept = tools; 1", policy())
                .unwrap();
        assert_eq!(ok("boa-js-session", &r), json!(1));
        let r = cell("return await sum(20, 22)", policy()).unwrap();
        assert_eq!(ok("boa-js-session", &r), json!(42));
        assert_eq!(r.tool_calls.len(), 1);
        let mut strict = SandboxPolicy::strict();
        strict.memory_bytes = None;
        let r = cell(
            "let kind; try { await kept.math.add({a: 1, b: 2}); } catch (e) { kind = e.kind; } return [typeof tools, kind]",
            strict,
        )
        .unwrap();
        assert_eq!(ok("boa-js-session", &r), json!(["undefined", "not_granted"]));
        assert!(r.tool_calls.is_empty(), "nothing reached the host");
        let r = cell("return await sum(1, 2)", policy()).unwrap();
        assert_eq!(ok("boa-js-session", &r), json!(3), "the grant is per call");
    }
}

// ---- Contained boa awaited on an execbox runtime (on the caller's task) ----

mod on_task {
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use execbox::backends::{BoaJs, BoaJsConfig};
    use execbox::{ExecRequest, Executor, Outcome, SandboxPolicy};
    use serde_json::json;

    /// A runtime from `execbox::runtime_builder` with one worker thread and
    /// one blocking thread, and that blocking thread held until the sender
    /// drops: whatever runs there must run on its task.
    fn runtime_with_its_blocking_thread_held() -> (tokio::runtime::Runtime, mpsc::Sender<()>) {
        let runtime = execbox::runtime_builder().worker_threads(1).max_blocking_threads(1).build().unwrap();
        let (hold, held) = mpsc::channel::<()>();
        let (started, running) = mpsc::channel();
        runtime.spawn_blocking(move || {
            started.send(()).unwrap();
            let _ = held.recv();
        });
        running.recv().unwrap();
        (runtime, hold)
    }

    fn filled(idle: usize) -> BoaJs {
        let mut cfg = BoaJsConfig::default();
        cfg.idle_workers = idle;
        let backend = BoaJs::new(cfg).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while backend.idle_worker_pids().len() < idle && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        backend
    }

    #[test]
    fn runs_are_awaited_on_the_task_and_hostile_ones_end_typed_in_time() {
        let backend = filled(2);
        let exec = Executor::builder().backend(backend).build();
        let (runtime, _hold) = runtime_with_its_blocking_thread_held();
        let run = |code: &'static str, timeout: Duration| {
            let exec = exec.clone();
            let request =
                ExecRequest::javascript(code).input(json!([1, 2])).policy(SandboxPolicy::strict().timeout(timeout));
            runtime
                .block_on(async move {
                    let run = tokio::spawn(async move { exec.execute(request).await });
                    // A run that needed the (held) blocking pool would never end.
                    tokio::time::timeout(Duration::from_secs(15), run).await.expect("the run needed the blocking pool")
                })
                .unwrap()
                .unwrap()
        };
        let r = run("return input.map(x => x * 2)", Duration::from_secs(5));
        assert_eq!((r.outcome, r.output.clone()), (Outcome::Ok, Some(json!([2, 4]))), "{r:?}");
        let started = Instant::now();
        let r = run("while (true) {}", Duration::from_millis(300));
        assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        // Lines of ~1 kB pass the 1 MiB cap within ~1,000 of them: short lines
        // (8 bytes) met the 5 s deadline first in a debug build on a busy
        // 2-CPU machine (892 kB kept, not truncated).
        let r = run(
            "const pad = 'x'.repeat(1000); for (let i = 0; i < 1e6; i++) console.log('flood ' + i + pad)",
            Duration::from_secs(5),
        );
        assert!(r.stdout.truncated, "{r:?}");
        let r = run("throw new Error('nope')", Duration::from_secs(5));
        assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
        // The worker dies of its memory cap: its death is read on the reactor.
        let r = run("let s = 'x'; while (true) s = s + s", Duration::from_secs(10));
        assert!(matches!(r.outcome, Outcome::OutOfMemory | Outcome::Failed), "{r:?}");
        let r = run("return 7", Duration::from_secs(5));
        assert_eq!(r.output, Some(json!(7)), "{r:?}");
    }

    #[test]
    fn dropping_an_awaited_run_stops_its_worker_at_once_and_the_pool_recovers() {
        let backend = filled(1);
        let gauge = backend.worker_gauge();
        let exec = Executor::builder().backend(backend.clone()).build();
        let runtime = execbox::runtime_builder().worker_threads(1).build().unwrap();
        let before: Vec<u32> = backend.idle_worker_pids();
        let request =
            ExecRequest::javascript("while (true) {}").policy(SandboxPolicy::strict().timeout(Duration::from_secs(60)));
        let run = runtime.spawn({
            let exec = exec.clone();
            async move { exec.execute(request).await }
        });
        // Running: its worker left the idle list.
        let busy = || backend.idle_worker_pids().is_empty();
        assert!(crate::common::wait::wait_until(Duration::from_secs(10), busy), "the run never took a worker");
        run.abort();
        // The worker that took the run is gone well before its deadline.
        let deadline = Instant::now() + Duration::from_secs(5);
        while before.iter().any(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists()) {
            assert!(Instant::now() < deadline, "the dropped run's worker still lives");
            std::thread::sleep(Duration::from_millis(10));
        }
        // The pool is back to its size, counts nothing busy, and serves.
        let deadline = Instant::now() + Duration::from_secs(20);
        while backend.idle_worker_pids().is_empty() || gauge.live() != 1 {
            assert!(Instant::now() < deadline, "live workers: {}", gauge.live());
            std::thread::sleep(Duration::from_millis(20));
        }
        let request = ExecRequest::javascript("return 1").policy(SandboxPolicy::strict());
        let r = runtime
            .block_on(async move { tokio::spawn(async move { exec.execute(request).await }).await })
            .unwrap()
            .unwrap();
        assert_eq!(r.output, Some(json!(1)), "{r:?}");
        // Dropping the runtime with a run in flight leaves no worker behind.
        drop(runtime);
        drop(backend);
    }

    /// A run awaited with `Handle::block_on` on a thread of the runtime's
    /// blocking pool outlives the runtime's shutdown: its reactor is gone,
    /// so every wait on it returns at once. The run used to spin on it
    /// (a CPU at 100 %) until its worker answered, and forever for a worker
    /// that does not (here: one stopped with SIGSTOP); it now ends at once,
    /// failed and saying why, and the pool recovers.
    #[test]
    fn a_run_whose_runtime_shuts_down_under_it_ends_at_once() {
        // Shut down in the background, or dropped (which waits for the
        // blocking thread; tokio's timers panic if polled then, so the run
        // must use none).
        for dropped in [false, true] {
            let backend = filled(1);
            let gauge = backend.worker_gauge();
            let pid = backend.idle_worker_pids()[0];
            let exec = Executor::builder().backend(backend.clone()).build();
            let runtime = execbox::runtime_builder().worker_threads(1).build().unwrap();
            let (done, result) = mpsc::channel();
            let handle = runtime.handle().clone();
            runtime.spawn_blocking(move || {
                let request = ExecRequest::javascript("while (true) {}")
                    .policy(SandboxPolicy::strict().timeout(Duration::from_secs(1)));
                let _ = done.send(handle.block_on(exec.execute(request)));
            });
            // Running: its worker left the idle list.
            let busy = || !backend.idle_worker_pids().contains(&pid);
            assert!(crate::common::wait::wait_until(Duration::from_secs(10), busy), "the run never took a worker");
            // The worker stops answering (stuck, as far as the host can tell).
            let stuck = rustix::process::Pid::from_raw(pid as i32).unwrap();
            rustix::process::kill_process(stuck, rustix::process::Signal::STOP).unwrap();
            let dropping = if dropped {
                Some(std::thread::spawn(move || drop(runtime)))
            } else {
                runtime.shutdown_background();
                None
            };
            let r = result
                .recv_timeout(Duration::from_secs(10))
                .expect("the run never ended after its runtime shut down")
                .unwrap();
            assert_eq!(r.outcome, Outcome::Failed, "dropped: {dropped}: {r:?}");
            assert!(r.message.as_deref().unwrap_or("").contains("reactor"), "{r:?}");
            assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "the stuck worker still lives");
            if let Some(dropping) = dropping {
                dropping.join().expect("dropping the runtime panicked");
            }
            let deadline = Instant::now() + Duration::from_secs(20);
            while backend.idle_worker_pids().is_empty() || gauge.live() != 1 {
                assert!(Instant::now() < deadline, "live workers: {}", gauge.live());
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// A worker program that takes its job and then sends console frames
    /// without end: what a worker taken over by the code it runs could do.
    /// Written once per process: rewriting it while an earlier test's
    /// worker still runs it fails with ETXTBSY.
    fn flooding_worker() -> std::path::PathBuf {
        static WRITTEN: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
        WRITTEN.get_or_init(write_flooding_worker).clone()
    }

    fn write_flooding_worker() -> std::path::PathBuf {
        // Under target/ (cargo's directory for tests' files), not /tmp:
        // nothing would remove it from there.
        let dir =
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("execbox-flood-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("flood.py");
        let script = r#"#!/usr/bin/python3
import os, struct, json
def read():
    n = struct.unpack('<I', os.read(0, 4))[0]
    got = b''
    while len(got) < n:
        got += os.read(0, n - len(got))
def send(o):
    b = json.dumps(o).encode()
    os.write(1, struct.pack('<I', len(b)) + b)
read()
send("Ready")
read()
# Frames in bulk, faster than the host reads them: its reader never waits.
chunk = b''
for total in range(1, 2001):
    b = json.dumps({"Console": {"stderr": False, "text": "x", "total": total}}).encode()
    chunk += struct.pack('<I', len(b)) + b
while True:
    os.write(1, chunk)
"#;
        std::fs::write(&path, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    /// A worker that never stops talking is still stopped at the deadline
    /// plus its grace, awaited and blocking: frames that keep coming (read
    /// without a wait) must not keep the deadline from being heard.
    #[test]
    fn a_worker_that_floods_frames_is_stopped_at_its_deadline() {
        for awaited in [true, false] {
            let backend = BoaJs::new(BoaJsConfig::default().idle_workers(1).worker_program(flooding_worker())).unwrap();
            let deadline = Instant::now() + Duration::from_secs(20);
            while backend.idle_worker_pids().is_empty() {
                assert!(Instant::now() < deadline, "the fake worker never became ready");
                std::thread::sleep(Duration::from_millis(20));
            }
            let exec = Executor::builder().backend(backend).build();
            let runtime = execbox::runtime_builder().worker_threads(1).build().unwrap();
            let (done, result) = mpsc::channel();
            let request =
                ExecRequest::javascript("return 1").policy(SandboxPolicy::strict().timeout(Duration::from_millis(300)));
            let started = Instant::now();
            if awaited {
                runtime.spawn(async move {
                    let _ = done.send(exec.execute(request).await);
                });
            } else {
                std::thread::spawn(move || {
                    let _ = done.send(exec.execute_blocking(request));
                });
            }
            let r = result
                .recv_timeout(Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("awaited: {awaited}: a flooding worker kept the run going"))
                .unwrap();
            assert_eq!(r.outcome, Outcome::TimedOut, "awaited: {awaited}: {r:?}");
            assert!(started.elapsed() < Duration::from_secs(2), "awaited: {awaited}: {:?}", started.elapsed());
        }
    }

    /// Runtimes come and go; the descriptors of their reactors do not stay.
    #[test]
    fn many_runtimes_leave_no_descriptors() {
        let backend = filled(2);
        let gauge = backend.worker_gauge();
        let exec = Executor::builder().backend(backend.clone()).build();
        let round = |exec: &Executor| {
            let runtime = execbox::runtime_builder().worker_threads(1).build().unwrap();
            for (code, ms) in [("return 1", 5000), ("while (true) {}", 30), ("return 2", 5000)] {
                let exec = exec.clone();
                let request =
                    ExecRequest::javascript(code).policy(SandboxPolicy::strict().timeout(Duration::from_millis(ms)));
                runtime
                    .block_on(async move { tokio::spawn(async move { exec.execute(request).await }).await })
                    .unwrap()
                    .unwrap();
            }
            drop(runtime);
        };
        for _ in 0..5 {
            round(&exec);
        }
        // Settled: both workers idle again (the replacements of those the
        // endless loops killed have started, the killed ones are reaped).
        let settle = |gauge: &execbox::backends::WorkerGauge| {
            let idle = || backend.idle_worker_pids().len() >= 2 && gauge.live() == 2;
            assert!(crate::common::wait::wait_until(Duration::from_secs(20), idle), "the pool did not refill");
        };
        settle(&gauge);
        let before = crate::common::procfs::own_fd_targets();
        for _ in 0..40 {
            round(&exec);
        }
        settle(&gauge);
        // A killed worker's descriptors close when its reaper has run, which
        // a loaded machine may not have done yet: what is left after that
        // is a leak, named by what each extra descriptor refers to.
        let bounded = || crate::common::procfs::own_fd_targets().len() <= before.len() + 8;
        if !crate::common::wait::wait_until(Duration::from_secs(20), bounded) {
            let after = crate::common::procfs::own_fd_targets();
            let extra: Vec<&String> = after.iter().filter(|(fd, _)| !before.contains_key(fd)).map(|(_, t)| t).collect();
            panic!("descriptors: {} before, {} after 40 runtimes; new ones: {extra:?}", before.len(), after.len());
        }
    }

    /// Code Mode on the task: deadlines that hit while a tool call is out,
    /// while the code spins between calls, and runs right after them on
    /// the same worker, which must not end early.
    #[test]
    fn tool_calls_on_the_task_end_at_their_deadline_and_reuse_is_clean() {
        use execbox::tools::{ToolRegistry, ToolSpec};
        use serde_json::Value;
        let registry = ToolRegistry::builder()
            .tool(ToolSpec::new("t.hang"), |_: Value| async {
                std::future::pending::<()>().await;
                Ok(Value::Null)
            })
            .tool(ToolSpec::new("t.echo"), |args: Value| async move { Ok(args) })
            .build()
            .unwrap();
        let backend = filled(1);
        let gauge = backend.worker_gauge();
        let exec = Executor::builder().backend(backend.clone()).tools(registry).build();
        let runtime = execbox::runtime_builder().worker_threads(2).build().unwrap();
        let run = |code: &str, ms: u64| {
            let exec = exec.clone();
            let mut policy = SandboxPolicy::strict().timeout(Duration::from_millis(ms)).tools(["t.*"]);
            policy.memory_bytes = None;
            let request = ExecRequest::javascript(code).policy(policy);
            let started = Instant::now();
            let r = runtime
                .block_on(async move { tokio::spawn(async move { exec.execute(request).await }).await })
                .unwrap()
                .unwrap();
            (r, started.elapsed())
        };
        let slow = "let s = 0; for (let i = 0; i < 2e5; i++) s += i; return [await tools.t.echo({s}), s]";
        for ms in [1, 10, 300, 1500] {
            for code in [
                "await tools.t.hang({})",
                "await tools.t.echo({}); while (true) {}",
                "for (;;) { try { await tools.t.echo({x: 1}) } catch (e) {} }",
                "tools.t.hang({}); tools.t.echo({}); while (true) {}",
            ] {
                let (r, took) = run(code, ms);
                assert_eq!(r.outcome, Outcome::TimedOut, "{ms} ms: {code}: {:?}", r.message);
                assert!(took < Duration::from_millis(ms + 1000), "{ms} ms: {code}: took {took:?}");
                // Right after, a run that takes a while: no alarm left over ends it.
                let (r, took) = run(slow, 20_000);
                assert_eq!(r.outcome, Outcome::Ok, "after {ms} ms: {code}: {r:?} ({took:?})");
            }
        }
        // Back to back on one reused worker whose previous alarm was still
        // armed (a long deadline) when it came back.
        for _ in 0..20 {
            let (r, _) = run("return await tools.t.echo({a: 1})", 10);
            assert!(matches!(r.outcome, Outcome::Ok | Outcome::TimedOut), "{r:?}");
            let (r, _) = run(slow, 20_000);
            assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while backend.idle_worker_pids().is_empty() || gauge.live() != 1 {
            assert!(Instant::now() < deadline, "live workers: {}", gauge.live());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
