//! [`JsSession`]: one long-lived realm in a worker process of its own, for
//! agents that keep interpreter state across calls. What a cell means is
//! documented on the type (public); how a cell is evaluated is in the
//! engine (`Mode::Script`).

use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::admission::Admitted;
use crate::backend::{RunFuture, Session, SessionBackend, blocking};
use crate::backends::boa::contained::BoaJs;
use crate::backends::boa::conversation::{Conversation, Limits, converse, converse_async};
use crate::backends::boa::engine::{Job, Mode};
use crate::backends::boa::job::job;
use crate::backends::boa::pool::Worker;
use crate::capabilities::BackendCapabilities;
use crate::error::ExecError;
use crate::language::Language;
use crate::limits::child::ChildHandle;
use crate::limits::deadline::Deadline;
use crate::request::ExecRequest;
use crate::result::{ExecResult, Outcome};
use crate::session_spec::SessionSpec;
use crate::tools::ToolBridge;
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
        let baseline = worker
            .process
            .vm_bytes()
            .map_err(|e| ExecError::internal_caused(JsSession::NAME, "cannot read the worker's size", e))?;
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

    /// A call on the caller's task: the worker leaves its slot for the
    /// conversation (calls never overlap, so no other call waits for it) and
    /// comes back after it. Dropped mid-conversation, the call ends the
    /// session: the worker may be anywhere in the cell.
    async fn execute_on_task(self: Arc<Self>, call: Admitted) -> Result<ExecResult, ExecError> {
        let mut call = Call::new(&self, call)?;
        let taken = {
            let mut slot = self.worker.lock();
            if self.killed.load(Ordering::SeqCst) {
                self.end(&mut slot);
                return Ok(crate::backend::killed_result(Self::NAME, &call.deadline));
            }
            slot.take()
        };
        let Some(mut worker) = taken else { return Err(ended()) };
        if worker.process.on_reactor().is_err() {
            // Its sockets cannot be waited on here: the call takes the
            // blocking pool with the worker as it was.
            *self.worker.lock() = Some(worker);
            let session = self.clone();
            return blocking(Self::NAME, move || session.run_taken(call)).await;
        }
        let limits = call.limits(&self, &mut worker);
        let mut out = Out { session: &self, worker: Some(worker) };
        let conversation = match out.worker.as_mut() {
            Some(worker) => {
                converse_async(&mut worker.process, &mut call.job, &call.deadline, limits, call.tools.as_ref()).await
            }
            None => Conversation::NotStarted,
        };
        let mut worker = out.worker.take();
        if let Some(worker) = worker.as_mut() {
            // An idle worker's alarm would wake the reactor for nothing.
            let _ = worker.process.set_alarm(None);
        }
        let mut slot = self.worker.lock();
        *slot = worker;
        self.conclude(&mut slot, conversation, &call.deadline)
    }

    /// The blocking half of [`JsSession::execute_on_task`]'s fallback: the
    /// synchronous conversation for a call already taken apart.
    fn run_taken(&self, mut call: Call) -> Result<ExecResult, ExecError> {
        let mut slot = self.worker.lock();
        let Some(worker) = slot.as_mut() else { return Err(ended()) };
        let limits = call.limits(self, worker);
        let conversation = converse(&mut worker.process, &mut call.job, &call.deadline, limits, call.tools.as_ref());
        worker.process.unpin();
        self.conclude(&mut slot, conversation, &call.deadline)
    }

    /// What a conversation means for the session, sync or async: a killed
    /// session, a worker that never took the job, or a cell that ended the
    /// session, all end it.
    fn conclude(
        &self,
        slot: &mut Option<Worker>,
        conversation: Conversation,
        deadline: &Deadline,
    ) -> Result<ExecResult, ExecError> {
        if self.killed.load(Ordering::SeqCst) {
            self.end(slot);
            return Ok(crate::backend::killed_result(Self::NAME, deadline));
        }
        match conversation {
            Conversation::NotStarted => {
                self.end(slot);
                Err(ended())
            }
            Conversation::Finished { mut result, reusable } => {
                // A timed-out or out-of-memory call ends the session, as on
                // every backend (the realm may be half-way through anything).
                let ends = matches!(result.outcome, Outcome::TimedOut | Outcome::OutOfMemory | Outcome::OutOfFuel);
                if !reusable || ends {
                    self.end(slot);
                }
                result.backend = Self::NAME.into();
                Ok(*result)
            }
        }
    }
}

/// One call taken apart: its job for the worker and what its conversation
/// keeps.
struct Call {
    job: Job,
    deadline: Deadline,
    tools: Option<Arc<ToolBridge>>,
    /// The call's memory cap.
    cap: u64,
}

impl Call {
    fn new(session: &JsSession, call: Admitted) -> Result<Self, ExecError> {
        let core = session.backend.core();
        let deadline = call.deadline();
        let cap = call.policy().memory_bytes.unwrap_or(core.cfg.defaults.memory_bytes);
        let tools = call.tools().cloned();
        let job = job(&core.cfg, call, Mode::Script, false)?;
        Ok(Self { job, deadline, tools, cap })
    }

    /// The call's limits: the worker may grow to its size when the session
    /// opened plus the call's cap.
    fn limits(&self, session: &JsSession, worker: &mut Worker) -> Limits {
        let size = worker.process.vm_bytes().unwrap_or(u64::MAX);
        Limits {
            memory: session.baseline.saturating_add(self.cap).saturating_sub(size),
            grace: session.backend.core().cfg.deadline_grace,
        }
    }
}

/// The worker of a call on the caller's task while it is out of its slot.
/// Dropped still holding it, the call was dropped mid-conversation: the
/// worker is killed (reaped at once: a killed worker exits within
/// milliseconds) and the session ends.
struct Out<'a> {
    session: &'a JsSession,
    worker: Option<Worker>,
}

impl Drop for Out<'_> {
    fn drop(&mut self) {
        if self.worker.take().is_some() {
            self.session.alive.store(false, Ordering::SeqCst);
        }
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
        let mut call = Call::new(self, call)?;
        let mut slot = self.worker.lock();
        if self.killed.load(Ordering::SeqCst) {
            self.end(&mut slot);
            return Ok(crate::backend::killed_result(Self::NAME, &call.deadline));
        }
        let Some(worker) = slot.as_mut() else { return Err(ended()) };
        let limits = call.limits(self, worker);
        let conversation = converse(&mut worker.process, &mut call.job, &call.deadline, limits, call.tools.as_ref());
        worker.process.unpin();
        self.conclude(&mut slot, conversation, &call.deadline)
    }

    /// On a runtime with a reactor (tokio with I/O enabled) the call talks
    /// to the worker on the caller's task, as a one-shot `boa-js` run does;
    /// elsewhere it takes tokio's blocking pool.
    fn execute_async(self: Arc<Self>, call: Admitted) -> RunFuture {
        if !crate::reactor::here() {
            return Box::pin(async move { blocking(Self::NAME, move || self.execute(call)).await });
        }
        Box::pin(self.execute_on_task(call))
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
        fix: None,
    }
}
