//! [`Backend`]: one way of running code, and what it tells the matrix
//! about itself (its capabilities, availability and readiness).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::admission::Admitted;
use crate::capabilities::BackendCapabilities;
use crate::error::ExecError;
use crate::language::Language;
use crate::request::ExecRequest;
use crate::result::ExecResult;
use crate::session_spec::SessionSpec;
use crate::violation::Violation;

/// One way of running code. Implementations must be honest: a control is
/// declared enforced in [`BackendCapabilities`] only if it holds against
/// hostile code.
pub trait Backend: Send + Sync + 'static {
    /// Unique, stable name (used for pinning and in results).
    fn name(&self) -> &str;

    /// What this backend runs and enforces.
    fn capabilities(&self) -> &BackendCapabilities;

    /// `Err` if the backend cannot run anything right now (engine or image
    /// missing), with how to fix it.
    fn availability(&self) -> Result<(), Unavailable> {
        Ok(())
    }

    /// Runs an admitted request (see [`crate::admission`]: it was validated,
    /// held to the ceiling and matched against this backend's capabilities,
    /// and its deadline has started). Blocks until the run ends, at most
    /// about 2 s past its deadline. A program's failure is an `Ok` result.
    fn execute(&self, call: Admitted) -> Result<ExecResult, ExecError>;

    /// Runs an admitted request for an async caller, without blocking the
    /// task that awaits it: what [`Executor::execute`](crate::executor::Executor::execute)
    /// awaits inside a tokio runtime (and only there: the future may need
    /// one).
    ///
    /// The default moves [`Backend::execute`] to tokio's blocking pool (a
    /// thread hand-off); dropping its future abandons the result, not the
    /// run, which ends on the pool by its deadline. A backend that can run
    /// on the task itself overrides it: the `wasm` guest does, for cached
    /// modules (wasmtime yields to the runtime at every epoch tick, so the
    /// guest holds a runtime thread for about one tick at a time, one
    /// uninterruptible bulk-memory instruction aside), and `python-wasm`
    /// does for a run on a warm instance (the task awaits the instance's own
    /// thread). Dropping such a future ends the run at once. Either way
    /// every control of the policy holds as in [`Backend::execute`].
    fn execute_async(self: Arc<Self>, call: Admitted) -> RunFuture {
        Box::pin(on_blocking_pool(self, call))
    }

    /// Gets ready now rather than on the first request: loads modules,
    /// starts workers or warm instances, and waits at most `limit` for
    /// pre-started capacity (loading a module always finishes). Failures are
    /// not returned; they show up, typed, when a request runs. Default:
    /// nothing to prepare.
    fn prepare(&self, limit: Duration) {
        let _ = limit;
    }

    /// Pre-started capacity, for status displays; `None` when the backend
    /// keeps none.
    fn readiness(&self) -> Option<Readiness> {
        None
    }

    /// What this kind of backend keeps outside any process now and could
    /// leave behind (for `execbox backends`): e.g. the pods of execbox in a
    /// Kubernetes namespace, runs in flight anywhere included. `None`: it
    /// keeps nothing listable (default).
    fn leftovers(&self) -> Option<Vec<String>> {
        None
    }

    /// For a host about to exit: stops and removes what this backend
    /// started outside its own process (containers, staging directories)
    /// and refuses later runs. Default: nothing outlives the process anyway
    /// (worker processes die with their host).
    fn shutdown(&self) {}

    /// Third-party packages this backend provides for `language`, as it can
    /// tell now (e.g. read from its image). Asked only for requests that
    /// declare packages. Default: none (the language's standard library).
    fn packages(&self, language: Language) -> Vec<String> {
        let _ = language;
        Vec::new()
    }

    /// Opens sessions (state kept across calls), one per language it keeps
    /// state for; none by default.
    fn session_backends(&self) -> Vec<Arc<dyn SessionBackend>> {
        Vec::new()
    }

    /// Starts programs that keep running in a workspace, if it can (see
    /// [`Executor::start_program`](crate::Executor::start_program)).
    fn program_backend(&self) -> Option<Arc<dyn ProgramBackend>> {
        None
    }
}

/// A run in progress for an async caller ([`Backend::execute_async`]): it
/// owns what it needs, so it can be spawned.
pub type RunFuture = Pin<Box<dyn Future<Output = Result<ExecResult, ExecError>> + Send + 'static>>;

/// Runs `call` on `backend` on tokio's blocking pool (the thread marked for
/// [`may_block_here`]), in the caller's tracing span. Inside a tokio runtime
/// only.
pub(crate) async fn on_blocking_pool<B: Backend + ?Sized>(
    backend: Arc<B>,
    call: Admitted,
) -> Result<ExecResult, ExecError> {
    let name = backend.name().to_string();
    blocking(&name, move || backend.execute(call)).await
}

/// Runs `work` (part of a run of `backend`) on tokio's blocking pool, the
/// thread marked for [`may_block_here`], in the caller's tracing span.
/// Inside a tokio runtime only.
pub(crate) async fn blocking<R: Send + 'static>(
    backend: &str,
    work: impl FnOnce() -> Result<R, ExecError> + Send + 'static,
) -> Result<R, ExecError> {
    let span = tracing::Span::current();
    let run = move || {
        let _marked = BlockingPoolMark::set();
        span.in_scope(work)
    };
    tokio::task::spawn_blocking(run)
        .await
        .unwrap_or_else(|join_err| Err(ExecError::internal_caused(backend, "worker task failed", join_err)))
}

/// Why a backend cannot run anything now, and how to fix it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{reason}{}", crate::error::fix_suffix(fix))]
pub struct Unavailable {
    /// What is missing or broken.
    pub reason: String,
    /// What to do about it, if execbox knows.
    pub fix: Option<String>,
}

impl Unavailable {
    /// `reason`, fixed by `fix`.
    pub fn new(reason: impl Into<String>, fix: impl Into<String>) -> Self {
        Self { reason: reason.into(), fix: Some(fix.into()) }
    }

    /// `reason`, with no known fix.
    pub fn because(reason: impl Into<String>) -> Self {
        Self { reason: reason.into(), fix: None }
    }

    /// The [`ExecError`] of a request this backend could not run.
    pub fn into_error(self, backend: &str) -> ExecError {
        ExecError::BackendUnavailable { backend: backend.to_string(), reason: self.reason, fix: self.fix }
    }
}

/// How much pre-started capacity a backend holds (warm instances, idle workers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Readiness {
    /// Started and waiting for a request now.
    pub ready: usize,
    /// How many the backend keeps.
    pub target: usize,
}

thread_local! {
    static ON_BLOCKING_POOL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks the current thread as a tokio blocking-pool thread running one
/// request, until dropped.
pub(crate) struct BlockingPoolMark;

impl BlockingPoolMark {
    pub(crate) fn set() -> Self {
        ON_BLOCKING_POOL.set(true);
        BlockingPoolMark
    }
}

impl Drop for BlockingPoolMark {
    fn drop(&mut self) {
        ON_BLOCKING_POOL.set(false);
    }
}

/// True when the current thread may block on a nested runtime: no tokio
/// runtime is entered here, or the executor moved the run onto tokio's
/// blocking pool. False on an async worker thread, where a backend that
/// blocks (e.g. sync WASI) must move to a thread of its own.
#[cfg_attr(not(feature = "wasm"), allow(dead_code))]
pub(crate) fn may_block_here() -> bool {
    ON_BLOCKING_POOL.get() || tokio::runtime::Handle::try_current().is_err()
}

/// How long past its deadline a session call may still run before the
/// registry kills its session (a backstop: every backend ends its calls
/// within 2 s of the deadline by itself).
pub const CALL_OVERRUN_LIMIT: Duration = Duration::from_secs(3);

/// One live interpreter that keeps state across calls.
pub trait Session: Send + Sync + 'static {
    /// The name results and refusals carry (e.g. `boa-js-session`).
    fn backend(&self) -> &str;

    /// What a call may ask for: matched like a one-shot run's request.
    fn capabilities(&self) -> &BackendCapabilities;

    /// What this session cannot do for `request` beyond its capabilities
    /// and what every session fixes when it opens (e.g. a container's
    /// memory cap, fixed when it started). Default: nothing more.
    fn refusals(&self, request: &ExecRequest) -> Vec<Violation> {
        let _ = request;
        Vec::new()
    }

    /// Runs one admitted call. Blocks until the call ends, at most about
    /// 2 s past its deadline. Calls never overlap (the registry sees to it).
    fn execute(&self, call: Admitted) -> Result<ExecResult, ExecError>;

    /// Runs one admitted call without blocking the async caller (what
    /// [`Sessions::execute_async`](crate::sessions::Sessions::execute_async)
    /// calls). By default on tokio's blocking pool; a session whose
    /// interpreter can be awaited overrides it (a JavaScript session on an
    /// execbox runtime talks to its worker on the caller's task). Inside a
    /// tokio runtime only.
    fn execute_async(self: Arc<Self>, call: Admitted) -> RunFuture {
        Box::pin(async move {
            let name = self.backend().to_string();
            blocking(&name, move || self.execute(call)).await
        })
    }

    /// False once the session ended (a call ended it, or it was killed):
    /// its state is gone.
    fn is_alive(&self) -> bool;

    /// Ends the session now, from any thread, even while a call runs: its
    /// interpreter is killed, and the call in flight returns promptly as
    /// `killed`. Idempotent.
    fn kill(&self);
}

/// What starts programs for a backend ([`Backend::program_backend`](crate::Backend::program_backend)).
/// Only execbox's own backends can carry programs: a [`Program`](crate::program::Program) is made
/// inside the crate.
pub trait ProgramBackend: Send + Sync {
    /// Starts `spec` in `request`'s workspace. `request` is the program as a
    /// run: held to the executor's ceiling, validated, and matched against
    /// this backend's capabilities already.
    fn start_program(
        &self,
        request: &ExecRequest,
        spec: &crate::program::ProgramSpec,
    ) -> Result<crate::program::Program, ExecError>;
}

/// A backend that can open [`Session`]s for one language.
pub trait SessionBackend: Send + Sync {
    /// The name its sessions carry.
    fn session_name(&self) -> &str;

    /// The language its sessions run.
    fn session_language(&self) -> Language;

    /// What its sessions enforce: the opening spec is matched against it.
    fn session_capabilities(&self) -> &BackendCapabilities;

    /// Third-party packages its sessions provide (see
    /// [`Backend::packages`](crate::backend::Backend::packages)). Default: none.
    fn session_packages(&self) -> Vec<String> {
        Vec::new()
    }

    /// What it cannot open under `spec` beyond its capabilities. Default:
    /// nothing more.
    fn open_refusals(&self, spec: &SessionSpec) -> Vec<Violation> {
        let _ = spec;
        Vec::new()
    }

    /// Opens a session under `spec` (already held to the ceiling and
    /// matched): starts its interpreter now.
    fn open_session(&self, spec: &SessionSpec) -> Result<Box<dyn Session>, ExecError>;
}

/// The result of a call whose session was closed (killed) while it ran.
#[cfg_attr(not(any(feature = "js", feature = "wasm", feature = "container")), allow(dead_code))]
pub(crate) fn killed_result(backend: &str, deadline: &crate::limits::deadline::Deadline) -> ExecResult {
    let mut result = ExecResult::new(backend, crate::result::Outcome::Killed);
    result.message = Some("the session was closed during this call: its interpreter was killed".into());
    result.usage.duration = deadline.elapsed();
    result
}
