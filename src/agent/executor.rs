//! [`CodeExecutor`]: how an agent framework runs code, and
//! [`ExecboxCodeExecutor`], its implementation over the [`Executor`].

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::result::{CodeExecutionInput, CodeExecutionResult};
use crate::capabilities::Language;
use crate::error::ExecError;
use crate::executor::Executor;
use crate::policy::SandboxPolicy;
use crate::request::{ExecRequest, Payload};

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
    /// Stateful sessions exist only for JavaScript (boa) so far.
    #[error("stateful sessions are not available for {language}; omit execution_id to run it stateless")]
    StatefulUnsupported {
        /// The language asked for.
        language: Language,
    },
    /// Every session slot holds a live session.
    #[error("all {max} sessions are in use; close one or wait for one to go idle")]
    TooManySessions {
        /// The bound.
        max: usize,
    },
    /// Refused, invalid, or an executor fault (after any retries).
    #[error(transparent)]
    Exec(#[from] ExecError),
}

impl CodeExecutorError {
    /// Stable snake_case kind for JSON.
    pub fn kind(&self) -> &'static str {
        match self {
            CodeExecutorError::UnknownLanguage { .. } => "unknown_language",
            CodeExecutorError::StatefulUnsupported { .. } => "stateful_unsupported",
            CodeExecutorError::TooManySessions { .. } => "too_many_sessions",
            CodeExecutorError::Exec(e) => e.kind(),
        }
    }

    /// `{"error": {"kind", "message", "violations"}}`, as the CLI prints refusals.
    pub fn to_json(&self) -> Value {
        match self {
            CodeExecutorError::Exec(e) => e.to_json(),
            other => json!({"error": {"kind": other.kind(), "message": other.to_string(), "violations": []}}),
        }
    }
}

/// Runs model-written code for an agent framework (ADK's shape).
pub trait CodeExecutor: Send + Sync {
    /// Runs one piece of code. A program's failure or timeout is an `Ok`
    /// result with that [`Outcome`](super::Outcome).
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

/// Bounds on stateful sessions.
#[derive(Clone, Debug)]
pub struct SessionConfig {
    /// Most live sessions at once.
    pub max_sessions: usize,
    /// A session unused this long is closed (checked whenever sessions are touched).
    pub idle_timeout: Duration,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self { max_sessions: 16, idle_timeout: Duration::from_secs(300) }
    }
}

/// [`CodeExecutor`] over an [`Executor`]: maps language ids, applies one
/// policy (with this executor's timeout) to every run, retries only errors
/// that guarantee nothing ran, and keeps JavaScript sessions when stateful.
pub struct ExecboxCodeExecutor {
    executor: Executor,
    policy: SandboxPolicy,
    timeout: Duration,
    retry_attempts: u32,
    sessions: Option<Sessions>,
}

#[cfg(feature = "js")]
type SessionHandle = Arc<crate::backends::JsSession>;
#[cfg(not(feature = "js"))]
type SessionHandle = Arc<()>;

struct Sessions {
    cfg: SessionConfig,
    #[cfg(feature = "js")]
    js: crate::backends::BoaJs,
    live: Mutex<HashMap<String, (SessionHandle, Instant)>>,
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

    /// Turns on stateful JavaScript sessions, kept on `js`'s configuration.
    #[cfg(feature = "js")]
    pub fn with_sessions(mut self, js: crate::backends::BoaJs, cfg: SessionConfig) -> Self {
        self.sessions = Some(Sessions { cfg, js, live: Mutex::new(HashMap::new()) });
        self
    }

    /// Closes a session; false if there was none with that id.
    pub fn close_session(&self, execution_id: &str) -> bool {
        self.sessions.as_ref().is_some_and(|s| s.lock().remove(execution_id).is_some())
    }

    /// Live sessions, after closing idle ones.
    pub fn session_count(&self) -> usize {
        self.sessions.as_ref().map_or(0, |s| {
            let mut live = s.lock();
            s.expire(&mut live);
            live.len()
        })
    }

    /// The request a piece of code becomes.
    fn request(&self, input: CodeExecutionInput) -> Result<(ExecRequest, Language), CodeExecutorError> {
        let language =
            Language::from_id(&input.language).ok_or(CodeExecutorError::UnknownLanguage { id: input.language })?;
        let payload = match language {
            Language::Wasm => Payload::WasmModule(input.code.into_bytes()),
            _ => Payload::Source(input.code),
        };
        let mut request = ExecRequest::new(language, payload).policy(self.policy.clone().timeout(self.timeout));
        request.input = input.input;
        request.input_files = input.input_files;
        Ok((request, language))
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
        let (mut request, language) = self.request(input)?;
        request.policy = request.policy.timeout(timeout);
        if let (Some(id), Some(sessions)) = (session_id, &self.sessions) {
            if language != Language::JavaScript {
                return Err(CodeExecutorError::StatefulUnsupported { language });
            }
            return sessions.run(&id, request).await;
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

impl Sessions {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (SessionHandle, Instant)>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn expire(&self, live: &mut HashMap<String, (SessionHandle, Instant)>) {
        live.retain(|_, (_, used)| used.elapsed() < self.cfg.idle_timeout);
    }

    #[cfg(feature = "js")]
    async fn run(&self, id: &str, request: ExecRequest) -> Result<CodeExecutionResult, CodeExecutorError> {
        let session = {
            let mut live = self.lock();
            self.expire(&mut live);
            match live.get_mut(id) {
                Some((session, used)) => {
                    *used = Instant::now();
                    session.clone()
                }
                None => {
                    if live.len() >= self.cfg.max_sessions {
                        return Err(CodeExecutorError::TooManySessions { max: self.cfg.max_sessions });
                    }
                    let session = Arc::new(self.js.open_session()?);
                    live.insert(id.to_string(), (session.clone(), Instant::now()));
                    session
                }
            }
        };
        let runner = session.clone();
        let result = match tokio::runtime::Handle::try_current() {
            Ok(handle) => handle.spawn_blocking(move || runner.execute(request)).await.unwrap_or_else(|e| {
                Err(ExecError::internal(crate::backends::JsSession::NAME, format!("session task failed: {e}")))
            }),
            Err(_) => runner.execute(request),
        };
        let mut live = self.lock();
        if !session.is_alive() {
            // Abandoned at its deadline: the state is gone; the next call with
            // this id starts a fresh session.
            live.remove(id);
        } else if let Some((_, used)) = live.get_mut(id) {
            *used = Instant::now();
        }
        Ok(CodeExecutionResult::from(result?))
    }

    #[cfg(not(feature = "js"))]
    async fn run(&self, _id: &str, request: ExecRequest) -> Result<CodeExecutionResult, CodeExecutorError> {
        Err(CodeExecutorError::StatefulUnsupported { language: request.language })
    }
}
