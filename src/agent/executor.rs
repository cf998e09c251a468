//! [`CodeExecutor`]: how an agent framework runs code, and
//! [`ExecboxCodeExecutor`], its implementation over the [`Executor`].

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde_json::{Value, json};

use super::result::{CodeExecutionInput, CodeExecutionResult};
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
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InvocationContext {
    /// The agent framework's id for this invocation.
    pub invocation_id: String,
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
pub trait CodeExecutor: Send + Sync {
    /// Runs one piece of code. A program's failure or timeout is an `Ok`
    /// result with that [`ModelOutcome`](super::ModelOutcome).
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
    /// errors that happen before any code ran are retried.
    fn error_retry_attempts(&self) -> u32 {
        2
    }

    /// Wall-clock limit per execution.
    fn timeout(&self) -> Duration {
        Duration::from_secs(30)
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
    /// `Sessions::new(cfg).backend(boa)` for JavaScript). A lost session
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

    /// Live sessions.
    pub fn session_count(&self) -> usize {
        self.sessions.as_ref().map_or(0, Sessions::len)
    }

    /// The request a piece of code becomes.
    fn request(&self, input: CodeExecutionInput) -> Result<ExecRequest, CodeExecutorError> {
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
        Ok(request)
    }

    /// Like [`CodeExecutor::execute_code`] with a per-call timeout that can
    /// shorten, never extend, this executor's.
    pub async fn run_with_timeout(
        &self,
        _ctx: &InvocationContext,
        input: CodeExecutionInput,
        timeout: Option<Duration>,
    ) -> Result<CodeExecutionResult, CodeExecutorError> {
        self.run(input, timeout.map_or(self.timeout, |t| t.min(self.timeout))).await
    }

    async fn run(
        &self,
        input: CodeExecutionInput,
        timeout: Duration,
    ) -> Result<CodeExecutionResult, CodeExecutorError> {
        let session_id = input.execution_id.clone().filter(|_| self.sessions.is_some());
        let mut request = self.request(input)?;
        request.policy = request.policy.timeout(timeout);
        if let (Some(id), Some(sessions)) = (session_id, &self.sessions) {
            // The registry holds calls to its own ceiling; a registry built
            // without the executor's is held to the executor's here too.
            crate::admission::hold(&mut request, self.executor.ceiling())?;
            let sessions = sessions.clone();
            let run = move || sessions.execute_or_open(&id, request);
            let result = match tokio::runtime::Handle::try_current() {
                Ok(handle) => handle.spawn_blocking(run).await.unwrap_or_else(|e| {
                    Err(ExecError::internal("sessions", format!("session task failed: {e}")).into())
                }),
                Err(_) => run(),
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

/// Only errors that guarantee no code ran: a backend that could not start
/// (engine missing, spawn failed) or had no free worker or slot before the
/// deadline (`busy`). Refusals and invalid requests would fail the same way
/// again; an internal fault may have happened after the code had side effects.
fn retryable(err: &ExecError) -> bool {
    matches!(err, ExecError::BackendUnavailable { .. } | ExecError::Busy { .. })
}

impl CodeExecutor for ExecboxCodeExecutor {
    fn execute_code<'a>(
        &'a self,
        _ctx: &'a InvocationContext,
        input: CodeExecutionInput,
    ) -> BoxFuture<'a, Result<CodeExecutionResult, CodeExecutorError>> {
        Box::pin(self.run(input, self.timeout))
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
