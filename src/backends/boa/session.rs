//! [`JsSession`]: one long-lived realm on its own thread, for agents that
//! keep interpreter state across calls.
//!
//! In a session the code runs as a **script**: top-level `let`, `const`,
//! `function` and `var` declarations persist into later calls, and the value
//! of the last expression statement is the `output` (like a REPL); `return`
//! is a syntax error. `input` is rebound on every call. Every control of a
//! single run still holds per call (deadline, output caps, nesting bounds),
//! except the instruction budget: it spans the whole session
//! ([`BoaJsConfig::backstop_without_timeout`]), so a request that asks for
//! per-call `fuel` is refused. A call abandoned at its deadline (a loop inside
//! a native callback) ends the session: [`JsSession::is_alive`] turns false.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, SyncSender};
use std::sync::{Arc, Mutex};

use super::BoaJs;
use super::engine::{Mode, Prepared};
use super::pool::{self, Assignment};
use crate::error::{BackendRejection, ExecError};
use crate::matching::{self, Control, Violation};
use crate::request::ExecRequest;
use crate::result::ExecResult;

/// A JavaScript realm kept alive across calls. Dropping it ends its thread
/// (once a call it abandoned, if any, has stopped).
pub struct JsSession {
    backend: BoaJs,
    /// Held for a whole call: calls on one session run one at a time, in order.
    inbox: Mutex<SyncSender<Assignment>>,
    alive: Arc<AtomicBool>,
}

impl std::fmt::Debug for JsSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsSession").field("alive", &self.is_alive()).finish_non_exhaustive()
    }
}

impl BoaJs {
    /// Opens a session: a thread with a fresh realm of its own, waiting for calls.
    pub fn open_session(&self) -> Result<JsSession, ExecError> {
        let cfg = self.pool.config().clone();
        let budget = cfg.backstop_without_timeout;
        let (inbox, calls) = mpsc::sync_channel::<Assignment>(0);
        let (ready_tx, ready) = mpsc::sync_channel(1);
        let alive = Arc::new(AtomicBool::new(true));
        let thread_alive = alive.clone();
        std::thread::Builder::new()
            .name("execbox-js-session".into())
            .stack_size(cfg.worker_stack_bytes)
            .spawn(move || {
                let mut prepared = match Prepared::new(budget, &cfg) {
                    Ok(p) => p,
                    Err(e) => {
                        let _ = ready_tx.send(Err(pool::internal(&format!("cannot build a JS context: {e}"))));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                while let Ok(assignment) = calls.recv() {
                    pool::answer(&mut prepared, assignment, &cfg);
                }
                thread_alive.store(false, Ordering::SeqCst);
                drop(prepared);
                boa_gc::force_collect();
            })
            .map_err(|e| pool::internal(&format!("cannot start a JS session thread: {e}")))?;
        ready.recv().map_err(|_| pool::internal("the session thread ended before it was ready"))??;
        Ok(JsSession { backend: self.clone(), inbox: Mutex::new(inbox), alive })
    }
}

impl JsSession {
    /// The name sessions report in refusals.
    pub const NAME: &'static str = "boa-js-session";

    /// False once a call was abandoned at its deadline or the thread ended:
    /// the state is gone and later calls fail.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Runs `request` in this session's realm. Refused like a run on
    /// [`BoaJs`] would be, and also when it asks for per-call `fuel`.
    pub fn execute(&self, request: ExecRequest) -> Result<ExecResult, ExecError> {
        let mut violations = matching::check(&self.backend.caps, &request).err().unwrap_or_default();
        if let Some(fuel) = request.policy.fuel {
            violations.push(Violation {
                control: Control::Fuel,
                requested: format!("{fuel} units"),
                reason: "a session's instruction budget spans the session, not one call".into(),
            });
        }
        if !violations.is_empty() {
            return Err(ExecError::Refused {
                rejections: vec![BackendRejection { backend: Self::NAME.into(), violations }],
            });
        }
        let mut job = self.backend.job(request, Mode::Script)?;
        job.budget = self.backend.pool.config().backstop_without_timeout;
        let inbox = self.inbox.lock().unwrap_or_else(|p| p.into_inner());
        if !self.is_alive() {
            return Err(ended());
        }
        let grace = self.backend.pool.config().abandon_grace;
        let sent = |assignment| inbox.send(assignment).map_err(|_| ended());
        let (result, abandoned) = pool::run_with(job, grace, sent)?;
        if abandoned {
            self.alive.store(false, Ordering::SeqCst);
        }
        Ok(result)
    }
}

fn ended() -> ExecError {
    ExecError::BackendUnavailable {
        backend: JsSession::NAME.into(),
        reason: "this session ended (a call was abandoned at its deadline); its state is gone".into(),
    }
}
