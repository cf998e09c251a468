//! The agent-loop contract: retries, outcome mapping, truncation metadata,
//! code-block extraction, sessions, concurrency, the tool schema, the loop.
#![cfg(feature = "js")]

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::wait::wait_until;
use execbox::agent::{
    AgentLoop, CodeBlockExtractor, CodeExecutionInput, CodeExecutor, CodeExecutorError, Delimiters,
    ExecboxCodeExecutor, InvocationContext, Message, ModelOutcome as Outcome, Part, Role, SessionConfig, Sessions,
    StopReason, dispatch, tool_schema,
};
use execbox::backends::BoaJs;
use execbox::{
    Backend, BackendCapabilities, CapturedStream, CostClass, Enforcement, ExecError, ExecResult, Executor,
    IsolationKind, Language, Outcome as RunOutcome, PayloadKind, RequestFeatures, SandboxPolicy, SurfaceCapability,
};
use serde_json::json;

fn js_executor() -> ExecboxCodeExecutor {
    ExecboxCodeExecutor::new(Executor::builder().backend(BoaJs::default()).build())
}

async fn run(executor: &ExecboxCodeExecutor, language: &str, code: &str) -> execbox::agent::CodeExecutionResult {
    executor.execute_code(&InvocationContext::default(), CodeExecutionInput::new(language, code)).await.unwrap()
}

// ---- retries --------------------------------------------------------------------

/// A Python "backend" that fails the first `failures` calls with `error`,
/// then returns a result with `exit_code`.
struct Flaky {
    failures: u32,
    error: fn() -> ExecError,
    exit_code: i32,
    calls: Arc<AtomicU32>,
    caps: BackendCapabilities,
    /// Where each run's invocation id goes, when a test looks.
    seen: Option<Arc<Seen>>,
}

/// The invocation ids runs carried.
struct Seen(parking_lot::Mutex<Vec<Option<String>>>);

impl Flaky {
    fn new(failures: u32, error: fn() -> ExecError, exit_code: i32) -> (Self, Arc<AtomicU32>) {
        let calls = Arc::new(AtomicU32::new(0));
        let any =
            || SurfaceCapability { deny: Enforcement::enforced("test"), allow_list: Enforcement::enforced("test") };
        let caps = BackendCapabilities {
            default_timeout_ms: 30_000,
            isolation: IsolationKind::InProcess,
            cost: CostClass::Low,
            languages: vec![Language::Python],
            payloads: vec![PayloadKind::Source],
            features: RequestFeatures::default(),
            network: any(),
            filesystem: any(),
            environment: any(),
            timeout: Enforcement::enforced("test"),
            memory: Enforcement::enforced("test"),
            fuel: Enforcement::enforced("test"),
            stdout_cap: Enforcement::enforced("test"),
            stderr_cap: Enforcement::enforced("test"),
            processes: Enforcement::enforced("test"),
            tools: execbox::SurfaceCapability {
                deny: Enforcement::enforced("test"),
                allow_list: Enforcement::enforced("test"),
            },
            workspace: Enforcement::not_enforced("test"),
        };
        (Self { failures, error, exit_code, calls: calls.clone(), caps, seen: None }, calls)
    }
}

impl Backend for Flaky {
    fn name(&self) -> &str {
        "flaky"
    }
    fn capabilities(&self) -> &BackendCapabilities {
        &self.caps
    }
    fn execute(&self, call: execbox::Admitted) -> Result<ExecResult, ExecError> {
        if let Some(seen) = &self.seen {
            seen.0.lock().push(call.request().invocation_id.clone());
        }
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        if n < self.failures {
            return Err((self.error)());
        }
        let mut result =
            ExecResult::new("flaky", if self.exit_code == 0 { RunOutcome::Ok } else { RunOutcome::Failed });
        result.exit_code = Some(self.exit_code);
        result.stderr = CapturedStream { bytes: b"boom\n".to_vec(), total_bytes: 5, truncated: false };
        Ok(result)
    }
}

fn unavailable() -> ExecError {
    ExecError::unavailable("flaky", "spawn failed")
}

fn internal() -> ExecError {
    ExecError::internal("flaky", "fault after the run")
}

fn flaky_executor(backend: Flaky) -> ExecboxCodeExecutor {
    ExecboxCodeExecutor::new(Executor::builder().backend(backend).build())
}

#[tokio::test]
async fn an_executor_error_is_retried_once_by_default() {
    let (backend, calls) = Flaky::new(1, unavailable, 0);
    let executor = flaky_executor(backend);
    assert_eq!(executor.error_retry_attempts(), 2);
    let r = run(&executor, "python", "print(1)").await;
    assert_eq!((calls.load(Ordering::SeqCst), r.attempts, r.outcome), (2, 2, Outcome::Ok));

    let (backend, calls) = Flaky::new(u32::MAX, unavailable, 0);
    let executor = flaky_executor(backend);
    let err = executor.execute_code(&InvocationContext::default(), CodeExecutionInput::new("python", "x")).await;
    assert!(matches!(err, Err(CodeExecutorError::Exec(ExecError::BackendUnavailable { .. }))));
    assert_eq!(calls.load(Ordering::SeqCst), 2, "one retry, then the error");

    let (backend, calls) = Flaky::new(u32::MAX, unavailable, 0);
    let executor = flaky_executor(backend).with_retry_attempts(0);
    assert_eq!(executor.error_retry_attempts(), 1, "minimum 1");
    let _ = executor.execute_code(&InvocationContext::default(), CodeExecutionInput::new("python", "x")).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn program_failures_and_possible_side_effects_are_never_retried() {
    let (backend, calls) = Flaky::new(0, unavailable, 3);
    let r = run(&flaky_executor(backend), "python", "exit(3)").await;
    assert_eq!((calls.load(Ordering::SeqCst), r.outcome, r.exit_code), (1, Outcome::Failed, Some(3)));
    assert!(!r.is_success());

    let (backend, calls) = Flaky::new(1, internal, 0);
    let executor = flaky_executor(backend);
    let err = executor.execute_code(&InvocationContext::default(), CodeExecutionInput::new("python", "x")).await;
    assert!(matches!(err, Err(CodeExecutorError::Exec(ExecError::Internal { .. }))));
    assert_eq!(calls.load(Ordering::SeqCst), 1, "an internal fault may come after side effects");
}

// ---- outcomes and results -----------------------------------------------------------

#[tokio::test]
async fn outcomes_map_for_the_model() {
    let executor = js_executor();
    let ok = run(&executor, "js", "console.log('hi'); return 42").await;
    assert_eq!((ok.outcome, ok.exit_code, ok.output.clone()), (Outcome::Ok, None, Some(json!(42))));
    assert!(ok.is_success());
    assert_eq!(ok.model_text(), "hi\n--- output ---\n42");

    let thrown = run(&executor, "javascript", "throw new TypeError('bad')").await;
    assert_eq!(thrown.outcome, Outcome::Failed);
    assert!(!thrown.is_success());
    assert!(thrown.stderr.contains("TypeError: bad"));

    let slow = js_executor().with_timeout(Duration::from_millis(100));
    let timed_out = run(&slow, "js", "while (true) {}").await;
    assert_eq!(timed_out.outcome, Outcome::DeadlineExceeded, "a timeout is not a generic failure");
    assert!(!timed_out.is_success(), "the reason is in stderr: {:?}", timed_out.stderr);

    let err = executor.execute_code(&InvocationContext::default(), CodeExecutionInput::new("cobol", "x")).await;
    assert!(matches!(err, Err(CodeExecutorError::UnknownLanguage { .. })));
}

#[tokio::test]
async fn truncation_is_explicit() {
    let executor = js_executor().with_policy(SandboxPolicy::strict().max_output_bytes(100));
    let r = run(&executor, "js", "console.log('x'.repeat(10000)); console.error('e'.repeat(50))").await;
    assert!(r.stdout_truncated && !r.stderr_truncated);
    assert_eq!((r.stdout.len(), r.stdout_total_bytes), (100, 10001));
    let text = r.model_text();
    assert!(text.contains("[stdout truncated: 100 of 10001 bytes kept]"), "{text}");
    assert!(text.contains("--- stderr ---\neeee"), "{text}");
}

#[test]
fn combined_output_uses_the_divider_only_when_both_streams_have_text() {
    let mut r = execbox::agent::CodeExecutionResult { stdout: "out".into(), ..Default::default() };
    assert_eq!(r.combined_output(), "out");
    r.stderr = "err\n".into();
    assert_eq!(r.combined_output(), "out\n--- stderr ---\nerr\n");
    r.stdout.clear();
    assert_eq!(r.combined_output(), "err\n");
    assert!(!r.is_success());
    r.exit_code = Some(0);
    assert!(r.is_success());
}

#[tokio::test]
async fn fifty_concurrent_executions_do_not_bleed() {
    let executor = Arc::new(js_executor());
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let executor = executor.clone();
            tokio::spawn(async move {
                let code = format!("for (let k = 0; k < 20; k++) console.log('run-{i}'); return {i}");
                (i, run(&executor, "js", &code).await)
            })
        })
        .collect();
    for task in tasks {
        let (i, r) = task.await.unwrap();
        assert_eq!(r.output, Some(json!(i)));
        assert_eq!(r.stdout, format!("run-{i}\n").repeat(20), "output of another run leaked in");
    }
}

// ---- extraction -----------------------------------------------------------------

#[test]
fn only_tagged_runnable_blocks_run_and_the_text_before_is_kept() {
    let reply = "Let me compute.\n```python\nprint(1)\n```\nAnd in JS:\n```js\nreturn 2\n```\n\
                 Data:\n```json\n{\"a\": 1}\n```\n```\nuntagged\n```\n```markdown\n# x\n```\nDone.";
    let e = CodeBlockExtractor::default().extract(reply);
    assert_eq!(e.text_before, "Let me compute.\n");
    assert_eq!(e.blocks.len(), 5);
    let runnable: Vec<(String, Language)> = e.runnable().map(|(b, l)| (b.code.clone(), l)).collect();
    assert_eq!(runnable, vec![("print(1)".into(), Language::Python), ("return 2".into(), Language::JavaScript)]);
    assert_eq!(e.blocks[2].tag.as_deref(), Some("json"));

    let untagged = CodeBlockExtractor::default().untagged_as(Some(Language::Python)).extract(reply);
    assert_eq!(untagged.runnable().count(), 3);
}

#[test]
fn fences_inside_code_lines_and_unclosed_blocks() {
    let reply = "```python\ns = 'a ``` b'\nprint(s)\n```\n```js\nnever closed";
    let e = CodeBlockExtractor::default().extract(reply);
    assert_eq!(e.blocks.len(), 1);
    assert_eq!(e.blocks[0].code, "s = 'a ``` b'\nprint(s)");
    assert_eq!(e.text_before, "");
}

#[test]
fn custom_delimiters() {
    let extractor = CodeBlockExtractor::default().delimiters(vec![Delimiters::pair("<execute lang>", "</execute>")]);
    let e = extractor.extract("Plan: <execute lang>python\nprint(3)</execute> then ```python\nignored\n```");
    assert_eq!(e.text_before, "Plan: ");
    assert_eq!(e.blocks.len(), 1);
    assert_eq!((e.blocks[0].code.as_str(), e.blocks[0].language), ("print(3)", Some(Language::Python)));
}

/// What is found in replies of about 1 MB (how fast: `benches/agent.rs`,
/// group `agent_extract_large`).
#[test]
fn large_inputs_are_scanned_to_the_end() {
    for (name, text) in common::large_replies::large_replies() {
        let e = CodeBlockExtractor::default().extract(&text);
        assert!(e.blocks.len() <= 50_000, "{name}: {} blocks", e.blocks.len());
    }
}

// ---- sessions -------------------------------------------------------------------------

fn session_executor(cfg: SessionConfig) -> ExecboxCodeExecutor {
    let js = BoaJs::default();
    ExecboxCodeExecutor::new(Executor::builder().backend(js.clone()).build())
        .with_sessions(Sessions::builder().config(cfg).backend(js).build())
}

async fn in_session(executor: &ExecboxCodeExecutor, id: &str, code: &str) -> execbox::agent::CodeExecutionResult {
    let input = CodeExecutionInput { execution_id: Some(id.into()), ..CodeExecutionInput::new("js", code) };
    executor.execute_code(&InvocationContext::default(), input).await.unwrap()
}

#[tokio::test]
async fn sessions_keep_state_within_an_id_and_never_across_ids() {
    let executor = session_executor(SessionConfig::default());
    assert!(executor.stateful());
    assert_eq!(in_session(&executor, "a", "let x = 41; function twice(n) { return 2 * n }").await.outcome, Outcome::Ok);
    assert_eq!(in_session(&executor, "a", "x + 1").await.output, Some(json!(42)));
    assert_eq!(in_session(&executor, "a", "twice(x)").await.output, Some(json!(82)));
    assert_eq!(in_session(&executor, "b", "typeof x").await.output, Some(json!("undefined")));
    // Without an id, runs stay stateless.
    assert_eq!(run(&executor, "js", "return typeof x").await.output, Some(json!("undefined")));
    assert_eq!(executor.session_count(), 2);
    assert!(executor.close_session("a"));
    assert_eq!(in_session(&executor, "a", "typeof x").await.output, Some(json!("undefined")));
}

#[tokio::test]
async fn idle_sessions_expire_and_the_count_is_bounded() {
    let executor = session_executor(SessionConfig::default().max_sessions(2).idle_timeout(Duration::from_secs(1)));
    in_session(&executor, "a", "var kept = 1").await;
    in_session(&executor, "b", "1").await;
    let third = CodeExecutionInput { execution_id: Some("c".into()), ..CodeExecutionInput::new("js", "1") };
    let err = executor.execute_code(&InvocationContext::default(), third).await.unwrap_err();
    assert_eq!(err.kind(), "too_many_sessions", "{err}");
    // Closed by the expiry thread, untouched; reported once as lost, never silently reset.
    wait_until(Duration::from_secs(10), || executor.session_count() == 0);
    assert_eq!(executor.session_count(), 0, "both went idle");
    let again = CodeExecutionInput { execution_id: Some("a".into()), ..CodeExecutionInput::new("js", "typeof kept") };
    let err = executor.execute_code(&InvocationContext::default(), again).await.unwrap_err();
    assert_eq!(err.kind(), "session_lost", "{err}");
    assert!(err.to_string().contains("idle"), "{err}");
    assert_eq!(in_session(&executor, "a", "typeof kept").await.output, Some(json!("undefined")));
}

#[tokio::test]
async fn sessions_refuse_other_languages_and_end_after_an_abandoned_call() {
    let executor = session_executor(SessionConfig::default()).with_timeout(Duration::from_millis(100));
    let python = CodeExecutionInput { execution_id: Some("p".into()), ..CodeExecutionInput::new("python", "1") };
    let err = executor.execute_code(&InvocationContext::default(), python).await.unwrap_err();
    assert_eq!(err.kind(), "stateful_unsupported", "{err}");

    // A plain loop is stopped by the VM itself at the deadline: the session still ends.
    in_session(&executor, "t", "var state = 'kept'").await;
    assert_eq!(in_session(&executor, "t", "while (true) {}").await.outcome, Outcome::DeadlineExceeded);
    let next = CodeExecutionInput { execution_id: Some("t".into()), ..CodeExecutionInput::new("js", "state") };
    let err = executor.execute_code(&InvocationContext::default(), next).await.unwrap_err();
    assert_eq!(err.kind(), "session_lost", "{err}");

    in_session(&executor, "s", "var state = 'kept'").await;
    // A loop in a native callback does not yield: the call is abandoned at the deadline.
    let r = in_session(&executor, "s", "[1].map(() => { while (true) {} })").await;
    assert_eq!(r.outcome, Outcome::DeadlineExceeded);
    // The loss is reported once, typed; the call after it starts afresh.
    let next = CodeExecutionInput { execution_id: Some("s".into()), ..CodeExecutionInput::new("js", "typeof state") };
    let err = executor.execute_code(&InvocationContext::default(), next).await.unwrap_err();
    assert!(matches!(&err, CodeExecutorError::Session(e) if e.kind() == "session_lost"), "{err}");
    assert_eq!(in_session(&executor, "s", "typeof state").await.output, Some(json!("undefined")), "a fresh session");
}

// ---- tool ---------------------------------------------------------------------------

#[tokio::test]
async fn the_tool_schema_and_dispatch_answer_json() {
    let schema = tool_schema();
    assert_eq!(schema["name"], "execute_code");
    assert_eq!(schema["parameters"]["required"], json!(["language", "code"]));

    let executor = js_executor();
    let ok =
        dispatch(&executor, &json!({"language": "javascript", "code": "return input.n * 2", "input": {"n": 21}})).await;
    assert_eq!(
        (ok["outcome"].as_str(), ok["output"].as_i64(), ok["success"].as_bool()),
        (Some("ok"), Some(42), Some(true))
    );

    let as_string = json!(r#"{"language": "js", "code": "while(true){}", "timeout_secs": 0.1}"#);
    assert_eq!(dispatch(&executor, &as_string).await["outcome"], "deadline_exceeded");

    for (args, kind) in [
        (json!({"language": "js"}), "invalid_arguments"),
        (json!("not json"), "invalid_arguments"),
        (json!({"language": "js", "code": "1", "extra": 1}), "invalid_arguments"),
        (json!({"language": "js", "code": "1", "timeout_secs": -1}), "invalid_arguments"),
        (json!({"language": "cobol", "code": "1"}), "unknown_language"),
        (json!({"language": "python", "code": "1"}), "unsupported_language"),
    ] {
        assert_eq!(dispatch(&executor, &args).await["error"]["kind"], kind, "{args}");
    }
}

// ---- the loop ----------------------------------------------------------------------

#[tokio::test]
async fn the_loop_feeds_a_failure_back_and_stops_when_the_model_has_no_code() {
    let executor = js_executor();
    let mut turn = 0;
    let model = |history: &[Message]| {
        turn += 1;
        match turn {
            1 => "I'll sum it.\n```js\nreturn [1, 2, 3].sum()\n```".to_string(),
            2 => {
                let last = history.last().unwrap();
                assert!(
                    matches!(&last.parts[0], Part::CodeResult { outcome: Outcome::Failed, output } if output.contains("TypeError"))
                );
                "Arrays have no sum; reduce instead.\n```js\nreturn [1, 2, 3].reduce((a, b) => a + b, 0)\n```"
                    .to_string()
            }
            _ => "The sum is 6.".to_string(),
        }
    };
    let report = AgentLoop::new(&executor).run(vec![Message::user("Sum 1, 2, 3.")], model).await;
    assert_eq!(report.stop, StopReason::NoCode);
    assert_eq!(report.history.len(), 6, "user, model, tool, model, tool, model");
    let outcomes: Vec<Outcome> = report.trace.iter().map(|s| s.outcome).collect();
    assert_eq!(outcomes, [Outcome::Failed, Outcome::Ok]);
    assert_eq!(report.trace[1].backend.as_deref(), Some("boa-js"));
    assert_eq!(report.trace[0].code_sha256.len(), 64);
    assert_eq!(report.history.last().unwrap().text(), "The sum is 6.");

    let forever = AgentLoop::new(&executor).max_turns(2).run(vec![], |_| "```js\nreturn 1\n```".into()).await;
    assert_eq!((forever.stop, forever.trace.len()), (StopReason::MaxTurns, 2));
}

#[tokio::test]
async fn the_loop_awaits_an_async_model() {
    let executor = ExecboxCodeExecutor::new(Executor::builder().backend(BoaJs::default()).build());
    // A stand-in for an async LLM client: it awaits (a timer here) before each reply.
    let mut asked = 0;
    let model = async |history: &[Message]| {
        asked += 1;
        // The subject: a model that awaits something (not a wait for anything).
        tokio::time::sleep(Duration::from_millis(5)).await;
        if history.iter().any(|m| m.role == Role::Tool) {
            "Done: 3.".to_string()
        } else {
            "```js\nreturn 1 + 2\n```".to_string()
        }
    };
    let report = AgentLoop::new(&executor).run_async(vec![Message::user("1 + 2?")], model).await;
    assert_eq!(report.stop, StopReason::NoCode);
    assert_eq!(report.trace.len(), 1);
    assert_eq!(report.trace[0].outcome, Outcome::Ok);
    assert_eq!(asked, 2);
}

#[tokio::test]
async fn dispatch_runs_in_a_session_by_id_and_checks_its_arguments() {
    let executor = session_executor(SessionConfig::default());
    let call = |args: serde_json::Value| {
        let executor = &executor;
        async move { dispatch(executor, &args).await }
    };
    let first = call(json!({"language": "js", "code": "var n = 41", "session_id": "s1"})).await;
    assert_eq!(first["outcome"], "ok", "{first}");
    let second = call(json!({"language": "js", "code": "n + 1", "session_id": "s1"})).await;
    assert_eq!(second["output"], 42, "{second}");
    let other = call(json!({"language": "js", "code": "typeof n", "session_id": "s2"})).await;
    assert_eq!(other["output"], "undefined", "{other}");
    for bad in [
        json!({"language": "js", "code": "1", "session_id": 7}),
        json!({"language": "js", "code": "1", "packages": "numpy"}),
    ] {
        assert_eq!(call(bad.clone()).await["error"]["kind"], "invalid_arguments", "{bad}");
    }
    let refused = call(json!({"language": "js", "code": "1", "packages": ["numpy"]})).await;
    assert_eq!(refused["error"]["kind"], "refused", "{refused}");
    assert_eq!(refused["error"]["violations"][0]["control"], "packages", "{refused}");
}

// ---- the loop's contract with any executor ------------------------------------------

/// A hand-written executor: it fails its first `failures` calls with a
/// retryable error, hangs when the code says `hang`, records what each call
/// was given, and returns a file per call.
struct Scripted {
    failures: AtomicU32,
    calls: parking_lot::Mutex<Vec<CodeExecutionInput>>,
    retries: u32,
    stateful: bool,
    ended: parking_lot::Mutex<Vec<String>>,
}

impl Scripted {
    fn new(failures: u32, retries: u32, stateful: bool) -> Self {
        Self {
            failures: AtomicU32::new(failures),
            calls: parking_lot::Mutex::new(Vec::new()),
            retries,
            stateful,
            ended: parking_lot::Mutex::new(Vec::new()),
        }
    }
}

impl CodeExecutor for Scripted {
    fn execute_code<'a>(
        &'a self,
        _ctx: &'a InvocationContext,
        input: CodeExecutionInput,
    ) -> execbox::agent::BoxFuture<'a, Result<execbox::agent::CodeExecutionResult, CodeExecutorError>> {
        Box::pin(async move {
            self.calls.lock().push(input.clone());
            if self.failures.load(Ordering::SeqCst) > 0 {
                self.failures.fetch_sub(1, Ordering::SeqCst);
                return Err(CodeExecutorError::Exec(unavailable()));
            }
            if input.code.contains("hang") {
                std::future::pending::<()>().await;
            }
            let file = execbox::ExecFile::new("plot.png", vec![137u8, 80, 78, 71]);
            Ok(execbox::agent::CodeExecutionResult {
                stdout: "ran\n".into(),
                outcome: Outcome::Ok,
                backend: "scripted".into(),
                output_files: vec![file],
                ..Default::default()
            })
        })
    }

    fn stateful(&self) -> bool {
        self.stateful
    }

    fn error_retry_attempts(&self) -> u32 {
        self.retries
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(200)
    }

    fn end_execution(&self, execution_id: &str) {
        self.ended.lock().push(execution_id.to_string());
    }
}

#[tokio::test]
async fn the_loop_holds_any_executor_to_its_retries_and_timeout() {
    // Three attempts allowed, two retryable failures: the block runs.
    let executor = Scripted::new(2, 3, false);
    let report = AgentLoop::new(&executor).max_turns(1).run(vec![], |_| "```python\nprint(1)\n```".into()).await;
    assert_eq!(report.trace[0].outcome, Outcome::Ok, "{report:?}");
    assert_eq!(executor.calls.lock().len(), 3);
    // One attempt allowed: the first failure is the answer.
    let executor = Scripted::new(2, 1, false);
    let report = AgentLoop::new(&executor).max_turns(1).run(vec![], |_| "```python\nprint(1)\n```".into()).await;
    assert_eq!((report.trace[0].outcome, executor.calls.lock().len()), (Outcome::Failed, 1));
    assert!(report.trace[0].error.as_deref().unwrap().contains("spawn failed"), "{report:?}");
    // An executor that never answers is stopped at its own timeout (plus the grace).
    let executor = Scripted::new(0, 1, false);
    let started = std::time::Instant::now();
    let report = AgentLoop::new(&executor).max_turns(1).run(vec![], |_| "```python\nhang\n```".into()).await;
    assert_eq!(report.trace[0].outcome, Outcome::DeadlineExceeded, "{report:?}");
    assert!(started.elapsed() < Duration::from_secs(20), "it did not wait for ever");
    let Part::CodeResult { output, .. } = &report.history.last().unwrap().parts[0] else { panic!() };
    assert!(output.contains("did not answer within its timeout of 200 ms"), "{output}");
}

#[tokio::test]
async fn the_loop_passes_input_files_and_keeps_output_files_and_a_stateful_id() {
    let executor = Scripted::new(0, 1, true);
    let csv = execbox::ExecFile::new("data.csv", "a,b\n1,2\n");
    let mut turn = 0;
    let model = |_: &[Message]| {
        turn += 1;
        if turn < 3 { "```python\nprint(1)\n```\n```python\nprint(2)\n```".to_string() } else { "done".to_string() }
    };
    let report = AgentLoop::new(&executor).input_files(vec![csv.clone()]).run(vec![], model).await;
    let calls = executor.calls.lock().clone();
    assert_eq!(calls.len(), 4);
    assert!(calls.iter().all(|c| c.input_files == [csv.clone()]), "every block gets the files");
    let id = report.execution_id.clone().expect("a stateful executor gets an id");
    assert!(calls.iter().all(|c| c.execution_id.as_deref() == Some(id.as_str())), "one id for the whole loop");
    assert_eq!(*executor.ended.lock(), [id], "the made-up id is ended with the loop");
    let places: Vec<(usize, usize)> = report.output_files.iter().map(|f| (f.turn, f.block)).collect();
    assert_eq!(places, [(0, 0), (0, 1), (1, 0), (1, 1)]);
    assert_eq!(report.output_files[0].file.content, [137, 80, 78, 71], "the bytes are kept");
    // A given id is the caller's: used, never ended by the loop.
    let executor = Scripted::new(0, 1, true);
    let report =
        AgentLoop::new(&executor).execution_id("mine").max_turns(1).run(vec![], |_| "```py\n1\n```".into()).await;
    assert_eq!(report.execution_id.as_deref(), Some("mine"));
    assert!(executor.ended.lock().is_empty());
    // A stateless executor gets none.
    let executor = Scripted::new(0, 1, false);
    let report = AgentLoop::new(&executor).max_turns(1).run(vec![], |_| "```py\n1\n```".into()).await;
    assert_eq!((report.execution_id, executor.calls.lock()[0].execution_id.clone()), (None, None));
}

/// A caller that gives up on a loop (a timeout around an agent's turn)
/// drops its future mid-run: the id the loop made up is ended all the same
/// (nobody else knows it; its session would hold one of the registry's
/// slots until it idled out, and 16 such loops refused every new session).
#[tokio::test]
async fn a_dropped_loop_ends_the_id_it_made_up() {
    let executor = Scripted::new(0, 1, true);
    let agent = AgentLoop::new(&executor).max_turns(1);
    let run = agent.run(vec![], |_| "```py\nhang\n```".into());
    assert!(tokio::time::timeout(Duration::from_millis(50), run).await.is_err(), "the block hangs");
    let made_up = executor.calls.lock()[0].execution_id.clone().expect("a stateful executor gets an id");
    assert_eq!(*executor.ended.lock(), [made_up], "ended when the loop was dropped");
}

#[tokio::test]
async fn a_stateful_loop_keeps_state_across_turns_and_closes_its_session() {
    let executor = session_executor(SessionConfig::default());
    let mut turn = 0;
    let model = |history: &[Message]| {
        turn += 1;
        match turn {
            1 => "```js\nvar total = 40\n```".to_string(),
            2 => "```js\ntotal + 2\n```".to_string(),
            _ => {
                let Part::CodeResult { output, .. } = &history.last().unwrap().parts[0] else { panic!() };
                assert!(output.contains("42"), "{output}");
                "It is 42.".to_string()
            }
        }
    };
    let report = AgentLoop::new(&executor).run(vec![Message::user("add")], model).await;
    assert_eq!(report.stop, StopReason::NoCode);
    assert!(report.trace.iter().all(|s| s.outcome == Outcome::Ok), "{:?}", report.trace);
    assert_eq!(executor.session_count(), 0, "the loop's session is closed when it ends");
}

/// `is_success` is never true for a known outcome other than ok, whatever
/// the exit code (an output cut at its cap or one that does not match its
/// schema keeps exit code 0).
#[test]
fn is_success_follows_the_outcome() {
    let failed_with_zero =
        execbox::agent::CodeExecutionResult { exit_code: Some(0), outcome: Outcome::Failed, ..Default::default() };
    assert!(!failed_with_zero.is_success());
    let ok = execbox::agent::CodeExecutionResult { exit_code: Some(0), outcome: Outcome::Ok, ..Default::default() };
    assert!(ok.is_success());
    let by_hand = execbox::agent::CodeExecutionResult { exit_code: Some(0), ..Default::default() };
    assert!(by_hand.is_success(), "an unspecified outcome falls back to the exit code");
    let mut run = ExecResult::new("x", RunOutcome::InvalidOutput);
    run.exit_code = Some(0);
    assert!(!execbox::agent::CodeExecutionResult::from(run).is_success());
}

/// The invocation id reaches every run the executor makes, and the output
/// schema is checked for the agent layer too.
#[tokio::test]
async fn invocation_ids_reach_the_run_and_output_schemas_are_checked() {
    let seen = Arc::new(Seen(parking_lot::Mutex::new(Vec::new())));
    let (mut backend, _) = Flaky::new(0, unavailable, 0);
    backend.seen = Some(seen.clone());
    let executor = flaky_executor(backend);
    let ctx = InvocationContext::new("inv-7");
    executor.execute_code(&ctx, CodeExecutionInput::new("python", "x")).await.unwrap();
    assert_eq!(*seen.0.lock(), [Some("inv-7".to_string())]);

    let js = js_executor();
    let schema = execbox::JsonSchema::new(json!({"type": "object", "required": ["answer"]})).unwrap();
    let input = CodeExecutionInput { output_schema: Some(schema), ..CodeExecutionInput::new("js", "return {}") };
    let r = js.execute_code(&InvocationContext::default(), input).await.unwrap();
    assert_eq!(r.outcome, Outcome::Failed);
    assert!(!r.is_success());
    assert_eq!(r.output_errors.len(), 1, "{r:?}");
    assert!(r.model_text().contains("\"answer\" is a required property"), "{}", r.model_text());
}

#[test]
fn the_system_instruction_names_languages_limits_and_granted_tools() {
    use execbox::tools::{ToolRegistry, ToolSpec};
    let tools = ToolRegistry::builder()
        .tool(ToolSpec::new("crm.lookup").description("Finds a customer by email."), |_args| async {
            Ok(json!({"id": 1}))
        })
        .build()
        .unwrap();
    let executor = ExecboxCodeExecutor::new(Executor::builder().backend(BoaJs::default()).tools(tools).build())
        .with_policy(SandboxPolicy::strict().tools(["crm.*"]))
        .with_timeout(Duration::from_secs(3));
    let text = executor.system_instruction();
    assert!(text.contains("```javascript: a function body"), "{text}");
    assert!(!text.contains("```python"), "only languages a backend runs: {text}");
    assert!(text.contains("3000 ms") && text.contains("256 MiB") && text.contains("no network"), "{text}");
    assert!(text.contains("Finds a customer by email.") && text.contains("lookup(args"), "{text}");
    assert!(text.contains("At most 100 tool calls per run."), "{text}");
    let plain = js_executor().system_instruction();
    assert!(!plain.contains("Code Mode"), "no tools granted, none described: {plain}");
}
