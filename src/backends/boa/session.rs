//! [`JsSession`]: one long-lived realm in a worker process of its own, for
//! agents that keep interpreter state across calls. What a cell means is
//! documented on the type (public); how a cell is evaluated is in the
//! engine (`Mode::Script`).

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::admission::Admitted;
use crate::backend::{Session, SessionBackend};
use crate::backends::boa::contained::{BoaJs, Worker};
use crate::backends::boa::conversation::{Conversation, Limits, converse};
use crate::backends::boa::engine::Mode;
use crate::backends::boa::job::job;
use crate::capabilities::BackendCapabilities;
use crate::error::ExecError;
use crate::language::Language;
use crate::limits::child::ChildHandle;
use crate::request::ExecRequest;
use crate::result::{ExecResult, Outcome};
use crate::session_spec::SessionSpec;
use crate::violation::{Control, Violation};

/// A JavaScript realm kept alive across calls, in a worker process of its
/// own. Opened through the session registry ([`crate::sessions`]) on a
/// [`BoaJs`] backend. Dropping it kills its worker.
///
/// Each call's code (a *cell*) runs as a **script**: top-level `let`,
/// `const`, `function`, `class` and `var` declarations persist into later
/// calls, and the value of the last expression statement is the `output`
/// (like a REPL). `input` is rebound on every call.
///
/// A cell may also **`return`** at its top level, as a one-shot run's code
/// does: `return x` sets the `output` to `x` (a returned Promise is
/// awaited). Such a cell (one that is not a valid script but has a `return`
/// outside every function) runs as a *function body* in the session's
/// global scope, exactly like a one-shot run's code: it sees and can assign
/// everything earlier cells declared, but **its own top-level declarations
/// are local to the cell** (as in any function) and do not persist; to keep
/// a value from such a cell, assign a name an earlier cell declared, or a
/// property of `globalThis`. Such a cell containing `await` runs as an
/// `async` function body. Cells without a top-level `return` run as scripts
/// (a `return` inside a nested function belongs to that function).
///
/// A cell whose policy grants tools gets `tools` and `ToolError` (see
/// [`crate::backends::boa`]), for that cell only: a later cell without a
/// grant has neither, and a reference an earlier cell kept is answered
/// `not_granted` (nothing reaches the host).
///
/// The worker is contained like any `boa-js` worker (seccomp, dies with the
/// host, killed when the session drops or is killed). Calls are admitted by
/// the session registry like one-shot runs; per call the deadline, output
/// caps and nesting bounds hold as for a single run. The memory cap covers
/// the whole session: the worker may grow to its size when the session
/// opened plus the call's cap. Per-call `fuel` is refused (boa's instruction
/// budget is set when a context is built, and the context lives as long as
/// the session). A call that times out, runs out of memory or crashes the
/// engine ends the session.
pub struct JsSession {
    backend: BoaJs,
    /// Held for a whole call.
    worker: Mutex<Option<Worker>>,
    /// Kills the worker from any thread (see [`Session::kill`]).
    handle: ChildHandle,
    /// The worker's size when the session opened: the base of its memory cap.
    baseline: u64,
    alive: AtomicBool,
    killed: AtomicBool,
}

impl std::fmt::Debug for JsSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsSession").field("alive", &self.is_alive()).finish_non_exhaustive()
    }
}

impl BoaJs {
    /// Opens a session: a worker process of its own with a fresh realm,
    /// started now (tens of milliseconds).
    pub(crate) fn open_session(&self) -> Result<JsSession, ExecError> {
        let core = self.core();
        let mut worker = core.start_worker(true).map_err(|why| why.into_error(JsSession::NAME))?;
        let baseline = worker.process.vm_bytes().map_err(|e| ExecError::internal(JsSession::NAME, e.to_string()))?;
        let handle = worker.process.handle();
        Ok(JsSession {
            backend: self.clone(),
            worker: Mutex::new(Some(worker)),
            handle,
            baseline,
            alive: AtomicBool::new(true),
            killed: AtomicBool::new(false),
        })
    }
}

impl JsSession {
    /// The name sessions report in results and refusals.
    pub const NAME: &'static str = "boa-js-session";

    fn end(&self, slot: &mut Option<Worker>) {
        *slot = None;
        self.alive.store(false, Ordering::SeqCst);
    }
}

impl Session for JsSession {
    fn backend(&self) -> &str {
        Self::NAME
    }

    fn capabilities(&self) -> &BackendCapabilities {
        &self.backend.core().caps
    }

    /// Per-call `fuel`: the instruction budget is fixed when the session's
    /// context is built.
    fn refusals(&self, request: &ExecRequest) -> Vec<Violation> {
        fuel_refusal(request.policy.fuel)
    }

    fn execute(&self, call: Admitted) -> Result<ExecResult, ExecError> {
        let core = self.backend.core();
        let deadline = call.deadline();
        let cap = call.policy().memory_bytes.unwrap_or(core.cfg.defaults.memory_bytes);
        let tools = call.tools().cloned();
        let mut job = job(&core.cfg, call, Mode::Script, false)?;

        let mut slot = self.worker.lock();
        if self.killed.load(Ordering::SeqCst) {
            self.end(&mut slot);
            return Ok(crate::backend::killed_result(Self::NAME, &deadline));
        }
        let Some(worker) = slot.as_mut() else { return Err(ended()) };
        let size = worker.process.vm_bytes().unwrap_or(u64::MAX);
        let limits =
            Limits { memory: self.baseline.saturating_add(cap).saturating_sub(size), grace: core.cfg.deadline_grace };
        let conversation = converse(&mut worker.process, &mut job, &deadline, limits, tools.as_ref());
        worker.process.unpin();
        if self.killed.load(Ordering::SeqCst) {
            self.end(&mut slot);
            return Ok(crate::backend::killed_result(Self::NAME, &deadline));
        }
        match conversation {
            Conversation::NotStarted => {
                self.end(&mut slot);
                Err(ended())
            }
            Conversation::Finished { mut result, reusable } => {
                // A timed-out or out-of-memory call ends the session, as on
                // every backend (the realm may be half-way through anything).
                let ends = matches!(result.outcome, Outcome::TimedOut | Outcome::OutOfMemory | Outcome::OutOfFuel);
                if !reusable || ends {
                    self.end(&mut slot);
                }
                result.backend = Self::NAME.into();
                Ok(*result)
            }
        }
    }

    fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Kills the worker (through its pidfd: no lock the call holds is needed).
    fn kill(&self) {
        self.killed.store(true, Ordering::SeqCst);
        self.alive.store(false, Ordering::SeqCst);
        self.handle.kill();
    }
}

/// JavaScript sessions: a worker process each.
impl SessionBackend for BoaJs {
    fn session_name(&self) -> &str {
        JsSession::NAME
    }

    fn session_language(&self) -> Language {
        Language::JavaScript
    }

    fn session_capabilities(&self) -> &BackendCapabilities {
        &self.core().caps
    }

    fn open_refusals(&self, spec: &SessionSpec) -> Vec<Violation> {
        fuel_refusal(spec.policy.fuel)
    }

    fn open_session(&self, _spec: &SessionSpec) -> Result<Box<dyn Session>, ExecError> {
        Ok(Box::new(BoaJs::open_session(self)?))
    }
}

fn fuel_refusal(fuel: Option<u64>) -> Vec<Violation> {
    fuel.map(|fuel| Violation {
        control: Control::Fuel,
        requested: format!("{fuel} units"),
        reason: "a session's instruction budget is fixed when its context is built, not per call".into(),
    })
    .into_iter()
    .collect()
}

fn ended() -> ExecError {
    ExecError::BackendUnavailable {
        backend: JsSession::NAME.into(),
        reason: "this session ended (a call timed out, ran out of memory or crashed the engine); its state is gone"
            .into(),
    }
}
