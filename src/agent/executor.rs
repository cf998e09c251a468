//! [`CodeExecutor`]: how an agent framework runs code, and
//! [`ExecboxCodeExecutor`], its implementation over the [`Executor`].

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde_json::{Value, json};

use super::result::{CodeExecutionInput, CodeExecutionResult, ModelOutcome};
use crate::error::ExecError;
use crate::executor::Executor;
use crate::language::Language;
use crate::policy::SandboxPolicy;
use crate::request::{ExecRequest, Payload};
use crate::sessions::error::SessionError;
use crate::sessions::registry::Sessions;

/// A boxed future, so [`CodeExecutor`] stays usable as `dyn CodeExecutor`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Who is asking: carried into traces, never interpreted.
/// [`ExecboxCodeExecutor`] puts `invocation_id` on every run it makes
/// ([`ExecRequest::invocation_id`]): the run's span carries it as
/// `invocation`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InvocationContext {
    /// The agent framework's id for this invocation (empty: none).
    pub invocation_id: String,
}

impl InvocationContext {
    /// The context of invocation `id`.
    pub fn new(id: impl Into<String>) -> Self {
        Self { invocation_id: id.into() }
    }
}

/// Why an execution produced no result (a program's own failure is a result).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodeExecutorError {
    /// The language id is not one execbox knows.
    #[error("unknown language {id:?} (known: python, javascript/js, rust, shell, wasm)")]
    UnknownLanguage {
        /// The id as given.
        id: String,
    },
    /// A session call that produced no result: no session backend for the
    /// language, too many sessions, a lost session (reported once), or the
    /// run refused.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// Refused, invalid, or an executor fault (after any retries).
    #[error(transparent)]
    Exec(#[from] ExecError),
}

impl CodeExecutorError {
    /// Whether the error guarantees that no code ran, so running the same
    /// input again is safe: a backend that could not start (engine
    /// missing, spawn failed) or had no free worker or slot before the
    /// deadline (`busy`). Refusals and invalid requests would fail the same
    /// way again; an internal fault may have happened after the code had
    /// side effects.
    pub fn is_retryable(&self) -> bool {
        matches!(self, CodeExecutorError::Exec(e) if retryable(e))
    }

    /// Stable snake_case kind for JSON.
    pub fn kind(&self) -> &'static str {
        match self {
            CodeExecutorError::UnknownLanguage { .. } => "unknown_language",
            CodeExecutorError::Session(e) => e.kind(),
            CodeExecutorError::Exec(e) => e.kind(),
        }
    }

    /// `{"error": {"kind", "message", "violations"}}`, as the CLI prints refusals.
    pub fn to_json(&self) -> Value {
        json!({"error": self})
    }
}

/// [`ExecError`]'s JSON shape: `{"kind", "message", "violations"}`.
impl serde::Serialize for CodeExecutorError {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            CodeExecutorError::Exec(e) => e.serialize(serializer),
            CodeExecutorError::Session(e) => e.serialize(serializer),
            CodeExecutorError::UnknownLanguage { .. } => {
                crate::error::serialize_error(serializer, self.kind(), self.to_string(), &[] as &[()])
            }
        }
    }
}

/// Runs model-written code for an agent framework (ADK's shape).
///
/// A caller that drives an executor (the [`AgentLoop`](super::AgentLoop),
/// or a framework's own loop) calls [`CodeExecutor::execute_code_bounded`]:
/// it holds any executor to its own [`error_retry_attempts`](CodeExecutor::error_retry_attempts)
/// and [`timeout`](CodeExecutor::timeout).
pub trait CodeExecutor: Send + Sync {
    /// Runs one piece of code, once. A program's failure or timeout is an
    /// `Ok` result with that [`ModelOutcome`](super::ModelOutcome).
    fn execute_code<'a>(
        &'a self,
        ctx: &'a InvocationContext,
        input: CodeExecutionInput,
    ) -> BoxFuture<'a, Result<CodeExecutionResult, CodeExecutorError>>;

    /// Whether `execution_id` keeps interpreter state across calls.
    fn stateful(&self) -> bool {
        false
    }

    /// Runs per execution, counting the first (minimum 1). Only executor
    /// errors that happen before any code ran are retried
    /// ([`CodeExecutorError::is_retryable`]).
    fn error_retry_attempts(&self) -> u32 {
        2
    }

    /// Wall-clock limit per execution.
    fn timeout(&self) -> Duration {
        Duration::from_secs(30)
    }

    /// Ends the state kept for `execution_id` (a stateful executor's
    /// session), e.g. when a loop that made the id up is done with it.
    /// Default: nothing to end.
    fn end_execution(&self, execution_id: &str) {
        let _ = execution_id;
    }

    /// [`CodeExecutor::execute_code`] as its contract says a caller must
    /// run it: up to [`error_retry_attempts`](CodeExecutor::error_retry_attempts)
    /// times while the error guarantees that nothing ran, each run given
    /// [`timeout`](CodeExecutor::timeout) plus a grace to answer (inside a
    /// tokio runtime with a timer: an executor that does not answer is a
    /// [`ModelOutcome::DeadlineExceeded`](super::ModelOutcome::DeadlineExceeded)
    /// result). `attempts` in the result counts the runs. An executor that
    /// bounds and retries its own runs ([`ExecboxCodeExecutor`]) overrides
    /// this with its own.
    fn execute_code_bounded<'a>(
        &'a self,
        ctx: &'a InvocationContext,
        input: CodeExecutionInput,
    ) -> BoxFuture<'a, Result<CodeExecutionResult, CodeExecutorError>> {
        Box::pin(bounded(self, ctx, input))
    }
}

/// The default [`CodeExecutor::execute_code_bounded`].
async fn bounded<E: CodeExecutor + ?Sized>(
    executor: &E,
    ctx: &InvocationContext,
    input: CodeExecutionInput,
) -> Result<CodeExecutionResult, CodeExecutorError> {
    let attempts = executor.error_retry_attempts().max(1);
    let limit = executor.timeout().saturating_add(crate::limits::deadline::RUN_GRACE);
    let mut attempt = 1;
    loop {
        let answer = match within(limit, executor.execute_code(ctx, input.clone())).await {
            Some(answer) => answer,
            None => Ok(CodeExecutionResult {
                stderr: format!(
                    "execbox: the executor did not answer within its timeout of {} ms\n",
                    executor.timeout().as_millis()
                ),
                outcome: ModelOutcome::DeadlineExceeded,
                duration_ms: limit.as_secs_f64() * 1e3,
                ..Default::default()
            }),
        };
        match answer {
            Ok(mut result) => {
                result.attempts = attempt;
                return Ok(result);
            }
            Err(e) if attempt < attempts && e.is_retryable() => attempt += 1,
            Err(e) => return Err(e),
        }
    }
}

/// [`CodeExecutor`] over an [`Executor`]: maps language ids, applies one
/// policy (with this executor's timeout) to every run, retries only errors
/// that guarantee nothing ran, and keeps sessions by `execution_id` when
/// stateful.
pub struct ExecboxCodeExecutor {
    executor: Executor,
    policy: SandboxPolicy,
    timeout: Duration,
    retry_attempts: u32,
    sessions: Option<Sessions>,
}

impl ExecboxCodeExecutor {
    /// Stateless, strict policy, 30 s timeout, 2 attempts.
    pub fn new(executor: Executor) -> Self {
        Self {
            executor,
            policy: SandboxPolicy::strict(),
            timeout: Duration::from_secs(30),
            retry_attempts: 2,
            sessions: None,
        }
    }

    /// The policy for every run (its timeout is replaced by [`Self::with_timeout`]'s).
    pub fn with_policy(mut self, policy: SandboxPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The wall-clock limit per execution.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Runs per execution, counting the first; 0 is taken as 1.
    pub fn with_retry_attempts(mut self, attempts: u32) -> Self {
        self.retry_attempts = attempts.max(1);
        self
    }

    /// Turns on stateful sessions: calls with an `execution_id` run in the
    /// session of that id, opened on first use from `sessions` (e.g.
    /// `Sessions::for_executor(cfg, &executor)`, or
    /// `Sessions::builder().config(cfg).backend(boa).build()` for JavaScript
    /// alone). A lost session
    /// (a call timed out, ran out of memory or crashed, or it went idle) is
    /// reported once as `session_lost`; the call after that starts afresh.
    pub fn with_sessions(mut self, sessions: Sessions) -> Self {
        self.sessions = Some(sessions);
        self
    }

    /// Closes a session; false if there was none with that id.
    pub fn close_session(&self, execution_id: &str) -> bool {
        self.sessions.as_ref().is_some_and(|s| s.close(execution_id))
    }

    /// A system instruction for a model that writes code for this
    /// executor: how to write a block for each language it runs, its
    /// limits (deadline, memory, no network, files, environment), whether
    /// state carries over, and the catalog of the host tools its policy
    /// grants (TypeScript declarations up to 12 KiB, else a list), with
    /// how code calls them. Put it in the model's system prompt, or give
    /// it to a framework's `instruction`.
    pub fn system_instruction(&self) -> String {
        use std::fmt::Write as _;
        let policy = match self.executor.ceiling() {
            Some(ceiling) => self.policy.within(ceiling).unwrap_or_else(|_| self.policy.clone()),
            None => self.policy.clone(),
        };
        let mut text = String::from(
            "You can run code. Write each program in a fenced code block tagged with its language; it runs when \
             your reply ends, and you get back its outcome, output, stdout and stderr.\n",
        );
        let runs =
            |language: Language| self.executor.backends().any(|b| b.capabilities().languages.contains(&language));
        for (language, how) in [
            (
                Language::JavaScript,
                "```javascript: a function body; `input` holds the JSON input; `return` gives the output.",
            ),
            (
                Language::Python,
                "```python: a script; `input` holds the JSON input; print one JSON value to give the output.",
            ),
            (Language::Shell, "```bash: a bash script; stdout and the exit code are the answer."),
            (Language::Rust, "```rust: define `fn run(input: Value) -> Value` (serde_json's Value is in scope)."),
        ] {
            if runs(language) {
                let _ = writeln!(text, "- {how}");
            }
        }
        let _ = write!(text, "Each run has {} ms", self.timeout.as_millis());
        if let Some(bytes) = policy.memory_bytes {
            let _ = write!(text, " and {} MiB of memory", bytes >> 20);
        }
        text.push_str("; ");
        let denied = |access: &crate::policy::Access<_>| !matches!(access, crate::policy::Access::Allow(_));
        let mut without = Vec::new();
        if denied(&policy.network) {
            without.push("network");
        }
        if !matches!(policy.filesystem, crate::policy::Access::Allow(_)) {
            without.push("host files");
        }
        if denied(&policy.environment) {
            without.push("host environment");
        }
        if without.is_empty() {
            text.push_str("network, files and environment are as granted.\n");
        } else {
            let _ = writeln!(text, "there is no {}.", without.join(", no "));
        }
        if self.stateful() {
            text.push_str("State carries over: variables defined by one block are there in the next.\n");
        } else {
            text.push_str("Every block starts afresh: nothing carries over from one block to the next.\n");
        }
        if let (Some(registry), Some(grants)) = (self.executor.tools(), policy.tool_grants()) {
            let granted: Vec<_> = registry
                .tools()
                .filter(|t| crate::tools::granted(grants, &t.spec.name))
                .map(|t| t.spec.clone())
                .collect();
            if !granted.is_empty() {
                let specs: Vec<&crate::tools::ToolSpec> = granted.iter().map(|s| s.as_ref()).collect();
                let limits = policy.effective_tool_limits();
                let _ = writeln!(
                    text,
                    "{}\nAt most {} tool calls per run.",
                    crate::tools::catalog::code_mode_prompt(&specs, 12 << 10),
                    limits.max_calls
                );
            }
        }
        text
    }

    /// Live sessions.
    pub fn session_count(&self) -> usize {
        self.sessions.as_ref().map_or(0, Sessions::len)
    }

    /// The request a piece of code becomes.
    fn request(&self, ctx: &InvocationContext, input: CodeExecutionInput) -> Result<ExecRequest, CodeExecutorError> {
        let language =
            Language::from_id(&input.language).ok_or(CodeExecutorError::UnknownLanguage { id: input.language })?;
        let payload = match language {
            Language::Wasm => Payload::WasmModule(input.code.into_bytes()),
            _ => Payload::Source(input.code),
        };
        let mut request = ExecRequest::new(language, payload).policy(self.policy.clone().timeout(self.timeout));
        request.input = input.input;
        request.input_files = input.input_files;
        request.packages = input.packages;
        request.collect_output_files = input.collect_output_files;
        request.output_schema = input.output_schema;
        if !ctx.invocation_id.is_empty() {
            request.invocation_id = Some(ctx.invocation_id.clone());
        }
        Ok(request)
    }

    /// Like [`CodeExecutor::execute_code`] with a per-call timeout that can
    /// shorten, never extend, this executor's.
    pub async fn run_with_timeout(
        &self,
        ctx: &InvocationContext,
        input: CodeExecutionInput,
        timeout: Option<Duration>,
    ) -> Result<CodeExecutionResult, CodeExecutorError> {
        self.run(ctx, input, timeout.map_or(self.timeout, |t| t.min(self.timeout))).await
    }

    async fn run(
        &self,
        ctx: &InvocationContext,
        input: CodeExecutionInput,
        timeout: Duration,
    ) -> Result<CodeExecutionResult, CodeExecutorError> {
        let session_id = input.execution_id.clone().filter(|_| self.sessions.is_some());
        let mut request = self.request(ctx, input)?;
        request.policy = request.policy.timeout(timeout);
        if let (Some(id), Some(sessions)) = (session_id, &self.sessions) {
            // The registry holds calls to its own ceiling; a registry built
            // without the executor's is held to the executor's here too.
            self.executor.door().hold(&mut request)?;
            let result = match tokio::runtime::Handle::try_current() {
                Ok(_) => sessions.execute_or_open_async(&id, request).await,
                Err(_) => sessions.execute_or_open(&id, request),
            };
            return Ok(CodeExecutionResult::from(result?));
        }
        let attempts = self.retry_attempts.max(1);
        let mut attempt = 1;
        loop {
            match self.executor.execute(request.clone()).await {
                Ok(result) => {
                    let mut result = CodeExecutionResult::from(result);
                    result.attempts = attempt;
                    return Ok(result);
                }
                Err(e) if attempt < attempts && retryable(&e) => attempt += 1,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// `run`'s output, or `None` when `limit` passes first (the future is
/// dropped then). The clock is a thread of its own that lives as long as
/// the run, not a runtime's timer: it works under any async executor, and
/// a tokio runtime built without timers cannot make it panic.
async fn within<T>(limit: std::time::Duration, run: impl Future<Output = T>) -> Option<T> {
    let (expired, on_expiry) = tokio::sync::oneshot::channel::<()>();
    let (done, on_done) = std::sync::mpsc::channel::<()>();
    let watchdog =
        std::thread::Builder::new().name("execbox-agent-timeout".into()).stack_size(64 << 10).spawn(move || {
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = on_done.recv_timeout(limit) {
                let _ = expired.send(());
            }
        });
    if let Err(e) = watchdog {
        tracing::warn!(error = %e, "no thread for an execution's timeout: the executor bounds its own run");
        return Some(run.await);
    }
    let answer = tokio::select! {
        answer = run => Some(answer),
        _ = on_expiry => None,
    };
    drop(done); // ends the watchdog at once
    answer
}

/// Only errors that guarantee no code ran: a backend that could not start
/// (engine missing, spawn failed) or had no free worker or slot before the
/// deadline (`busy`). Refusals and invalid requests would fail the same way
/// again; an internal fault may have happened after the code had side effects.
fn retryable(err: &ExecError) -> bool {
    matches!(err, ExecError::BackendUnavailable { .. } | ExecError::Busy { .. })
}

impl CodeExecutor for ExecboxCodeExecutor {
    /// Runs `input` under this executor's policy and timeout (the policy's
    /// deadline stops the code), retrying errors that guarantee nothing ran
    /// up to [`ExecboxCodeExecutor::with_retry_attempts`] runs.
    fn execute_code<'a>(
        &'a self,
        ctx: &'a InvocationContext,
        input: CodeExecutionInput,
    ) -> BoxFuture<'a, Result<CodeExecutionResult, CodeExecutorError>> {
        Box::pin(self.run(ctx, input, self.timeout))
    }

    /// Its own runs are bounded and retried already.
    fn execute_code_bounded<'a>(
        &'a self,
        ctx: &'a InvocationContext,
        input: CodeExecutionInput,
    ) -> BoxFuture<'a, Result<CodeExecutionResult, CodeExecutorError>> {
        self.execute_code(ctx, input)
    }

    fn end_execution(&self, execution_id: &str) {
        self.close_session(execution_id);
    }

    fn stateful(&self) -> bool {
        self.sessions.is_some()
    }

    fn error_retry_attempts(&self) -> u32 {
        self.retry_attempts
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }
}
