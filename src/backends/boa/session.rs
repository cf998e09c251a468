//! [`JsSession`]: one long-lived realm in a worker process of its own, for
//! agents that keep interpreter state across calls.
//!
//! In a session the code runs as a **script**: top-level `let`, `const`,
//! `function` and `var` declarations persist into later calls, and the value
//! of the last expression statement is the `output` (like a REPL); `return`
//! is a syntax error. `input` is rebound on every call.
//!
//! The session's worker is contained like any `boa-js` worker (seccomp, dies
//! with the host, killed when the session drops). Per call: the deadline,
//! output caps, nesting bounds and request validation (`max_code_bytes`,
//! environment) hold as for a single run. The memory cap covers the whole
//! session: the worker may grow to its size when the session opened plus the
//! call's cap. Per-call `fuel` is refused (boa's instruction budget is set
//! when a context is built, and the context lives as long as the session).
//! A call that times out, runs out of memory or crashes the engine ends the
//! session: [`JsSession::is_alive`] turns false and later calls fail.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use super::BoaJs;
use super::contained::{Conversation, Limits, Worker, converse};
use super::engine::Mode;
use crate::error::{BackendRejection, ExecError};
use crate::limits::{Deadline, result_caps};
use crate::matching::{self, Control, Violation};
use crate::request::ExecRequest;
use crate::result::{ExecResult, Outcome};

/// A JavaScript realm kept alive across calls. Dropping it kills its worker.
pub struct JsSession {
    backend: BoaJs,
    /// Held for a whole call: calls on one session run one at a time, in order.
    worker: Mutex<Option<Worker>>,
    /// The worker's size when the session opened: the base of its memory cap.
    baseline: u64,
    alive: AtomicBool,
}

impl std::fmt::Debug for JsSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsSession").field("alive", &self.is_alive()).finish_non_exhaustive()
    }
}

impl BoaJs {
    /// Opens a session: a worker process of its own with a fresh realm,
    /// started now (tens of milliseconds).
    pub fn open_session(&self) -> Result<JsSession, ExecError> {
        let core = self.core();
        let mut worker = core
            .start_worker(true)
            .map_err(|reason| ExecError::BackendUnavailable { backend: JsSession::NAME.into(), reason })?;
        let baseline = worker.process.vm_bytes().map_err(|e| ExecError::internal(JsSession::NAME, e.to_string()))?;
        Ok(JsSession {
            backend: self.clone(),
            worker: Mutex::new(Some(worker)),
            baseline,
            alive: AtomicBool::new(true),
        })
    }
}

impl JsSession {
    /// The name sessions report in refusals.
    pub const NAME: &'static str = "boa-js-session";

    /// False once a call ended the session (timeout, memory, crash): the
    /// state is gone and later calls fail.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// The session worker's process id, while it lives (for tests and audits).
    #[doc(hidden)]
    pub fn worker_pid(&self) -> Option<u32> {
        self.worker.lock().unwrap_or_else(PoisonError::into_inner).as_ref().map(|w| w.process.pid())
    }

    /// Runs `request` in this session's realm. Validated and refused like a
    /// run on [`BoaJs`] would be, and also when it asks for per-call `fuel`.
    pub fn execute(&self, mut request: ExecRequest) -> Result<ExecResult, ExecError> {
        crate::executor::validate(&request)?;
        let core = self.backend.core();
        let mut violations = matching::check(&core.caps, &request).err().unwrap_or_default();
        if let Some(fuel) = request.policy.fuel {
            violations.push(Violation {
                control: Control::Fuel,
                requested: format!("{fuel} units"),
                reason: "a session's instruction budget is fixed when it opens, not per call".into(),
            });
        }
        if !violations.is_empty() {
            return Err(ExecError::Refused {
                rejections: vec![BackendRejection { backend: Self::NAME.into(), violations }],
            });
        }
        request.policy.timeout_ms.get_or_insert(core.caps.default_timeout_ms);
        let policy = request.policy.clone();
        let cap = policy.memory_bytes.unwrap_or(core.cfg.default_memory_bytes);
        let mut job = super::job(&core.cfg, &core.caps, request, Mode::Script, false)?;
        let deadline = Deadline::start(job.timeout);

        let mut slot = self.worker.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(worker) = slot.as_mut() else { return Err(ended()) };
        let size = worker.process.vm_bytes().unwrap_or(u64::MAX);
        let limits =
            Limits { memory: self.baseline.saturating_add(cap).saturating_sub(size), grace: core.cfg.deadline_grace };
        let conversation = converse(&mut worker.process, &mut job, &deadline, limits);
        worker.process.unpin();
        match conversation {
            Conversation::NotStarted => {
                *slot = None;
                self.alive.store(false, Ordering::SeqCst);
                Err(ended())
            }
            Conversation::Finished { mut result, reusable } => {
                // A timed-out or out-of-memory call ends the session, as on
                // every backend (the realm may be half-way through anything).
                let ends = matches!(result.outcome, Outcome::TimedOut | Outcome::OutOfMemory | Outcome::OutOfFuel);
                if !reusable || ends {
                    *slot = None;
                    self.alive.store(false, Ordering::SeqCst);
                }
                result.backend = Self::NAME.into();
                result_caps::cap_result(&mut result, &policy);
                Ok(*result)
            }
        }
    }
}

impl crate::sessions::Session for JsSession {
    fn backend(&self) -> &str {
        Self::NAME
    }

    fn execute(&self, request: ExecRequest) -> Result<ExecResult, ExecError> {
        JsSession::execute(self, request)
    }

    fn is_alive(&self) -> bool {
        JsSession::is_alive(self)
    }
}

/// JavaScript sessions: a worker process each.
impl crate::sessions::SessionBackend for BoaJs {
    fn session_language(&self) -> crate::Language {
        crate::Language::JavaScript
    }

    fn open_session(&self, _packages: &[String]) -> Result<Box<dyn crate::sessions::Session>, ExecError> {
        Ok(Box::new(BoaJs::open_session(self)?))
    }
}

fn ended() -> ExecError {
    ExecError::BackendUnavailable {
        backend: JsSession::NAME.into(),
        reason: "this session ended (a call timed out, ran out of memory or crashed the engine); its state is gone"
            .into(),
    }
}
