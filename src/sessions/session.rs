//! [`Session`] and [`SessionBackend`]: what a backend implements to keep
//! interpreter state across calls.

use std::time::Duration;

use super::spec::SessionSpec;
use crate::admission::Admitted;
use crate::capabilities::BackendCapabilities;
use crate::error::ExecError;
use crate::language::Language;
use crate::request::ExecRequest;
use crate::result::ExecResult;
use crate::violation::Violation;

/// How long past its deadline a session call may still run before the
/// registry kills its session (a backstop: every backend ends its calls
/// within 2 s of the deadline by itself).
pub const CALL_OVERRUN_LIMIT: Duration = Duration::from_secs(3);

/// One live interpreter that keeps state across calls.
pub trait Session: Send + Sync {
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

    /// False once the session ended (a call ended it, or it was killed):
    /// its state is gone.
    fn is_alive(&self) -> bool;

    /// Ends the session now, from any thread, even while a call runs: its
    /// interpreter is killed, and the call in flight returns promptly as
    /// `killed`. Idempotent.
    fn kill(&self);
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

/// A new session id: 128 random bits as hex.
pub fn new_id() -> String {
    crate::nonce::hex128()
}
