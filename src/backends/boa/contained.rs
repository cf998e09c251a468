//! The contained `boa-js` backend, host side: [`BoaJs`] over its worker
//! pool (see `pool.rs` and [`crate::backends::worker`]), and its runs
//! awaited on the caller's task when the runtime has a reactor.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::admission::Admitted;
use crate::backend::{Backend, Readiness, RunFuture, Unavailable, blocking, on_blocking_pool};
use crate::backends::boa::capabilities;
use crate::backends::boa::config::BoaJsConfig;
use crate::backends::boa::conversation::{Conversation, converse_async};
use crate::backends::boa::gauge::WorkerGauge;
use crate::backends::boa::pool::{Core, Run, Worker};
use crate::capabilities::BackendCapabilities;
use crate::error::{ConfigError, ExecError};
use crate::result::ExecResult;

/// JavaScript on boa in contained worker processes (`boa-js`, see
/// [`crate::backends::boa`] for what a run means and what is enforced).
/// Cheap to clone (clones share the pool); the pool's workers are killed
/// when the last clone drops.
///
/// Its workers run a program that serves as an execbox worker (see
/// [`crate::backends::worker`]): a program using the library calls
/// `execbox::worker::serve_if_worker()` first thing in `main`, or points
/// `EXECBOX_WORKER` (or [`BoaJsConfig::worker_program`]) at an `execbox`
/// binary. Without one the backend is unavailable (saying so, with the fix)
/// and a default matrix runs JavaScript elsewhere (QuickJS in wasm, about 4×
/// slower).
#[derive(Clone)]
pub struct BoaJs {
    handle: Arc<Handle>,
}

/// Ends the pool when the last [`BoaJs`] clone drops.
struct Handle {
    core: Arc<Core>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.core.lock().shutdown = true;
        self.core.changed.notify_all();
        self.core.freed.notify_all();
    }
}

impl std::fmt::Debug for BoaJs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoaJs").field("config", &self.handle.core.cfg).finish_non_exhaustive()
    }
}

/// With [`BoaJsConfig::default`], which is always valid.
impl Default for BoaJs {
    fn default() -> Self {
        Self::start(BoaJsConfig::default())
    }
}

impl BoaJs {
    /// The backend's name.
    pub const NAME: &'static str = capabilities::CONTAINED_NAME;

    /// Starts the pool: the refill thread begins starting
    /// [`BoaJsConfig::idle_workers`] workers in the background.
    ///
    /// Errors: [`ConfigError::Invalid`] for a setting no run could work
    /// with (see [`BoaJsConfig`]). A machine that cannot run workers (no
    /// worker program, no seccomp filter for this architecture) is not an
    /// error here: the backend reports itself unavailable, with the fix
    /// ([`Backend::availability`]). With no worker program found, it also
    /// logs one warning per process (`tracing`), since a default matrix then
    /// quietly runs JavaScript on a slower backend.
    pub fn new(cfg: BoaJsConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        Ok(Self::start(cfg))
    }

    fn start(cfg: BoaJsConfig) -> Self {
        Self { handle: Arc::new(Handle { core: Core::start(cfg) }) }
    }

    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.handle.core
    }

    /// Counts this backend's live worker processes without keeping the
    /// backend alive: for leak checks.
    pub fn worker_gauge(&self) -> WorkerGauge {
        WorkerGauge::new(&self.handle.core.live)
    }

    /// Waits until at least one worker is ready, or `limit` passes, or no
    /// worker can be started; true if one is ready.
    fn wait_ready(&self, limit: Duration) -> bool {
        let core = &self.handle.core;
        if core.spec.is_err() {
            return false;
        }
        let until = Instant::now() + limit;
        let mut state = core.lock();
        loop {
            if !state.idle.is_empty() {
                return true;
            }
            if state.spawn_error.is_some() && state.starting == 0 {
                return false;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            core.changed.wait_for(&mut state, left);
        }
    }

    /// Process ids of this backend's idle workers (for tests and audits).
    #[doc(hidden)]
    pub fn idle_worker_pids(&self) -> Vec<u32> {
        self.handle.core.lock().idle.iter().map(|w| w.process.pid()).collect()
    }
}

// An async run on the caller's task (see `BoaJs::execute_async`): on a
// runtime with a reactor (`crate::runtime_builder`), a run that finds a
// worker idle talks to it through the reactor (`converse_async`) instead of
// handing the whole run to a thread of tokio's blocking pool. However the
// run's future ends, the worker it took goes back to the pool after a clean
// run, or is stopped, reaped and counted out: dropped mid-conversation, it is
// stopped at once and reaped by a task of its own.

/// Runs `call` on the caller's task with an idle worker, or on the blocking
/// pool when none is idle (that path waits for one). The caller checked
/// [`crate::reactor::here`].
async fn execute_on_task(core: Arc<Core>, call: Admitted) -> Result<ExecResult, ExecError> {
    let mut run = Run::new(&core.cfg, call)?;
    // A worker that died while idle is found when the job is sent; nothing
    // ran then, so another worker is tried.
    for attempt in 0.. {
        if attempt == 3 {
            return Err(core.all_died());
        }
        let Some(mut worker) = core.try_acquire() else { break };
        if worker.process.on_reactor().is_err() {
            // Its sockets cannot be waited on here (the runtime shut down
            // under a caller that still polls, or no descriptor is left):
            // the worker is as it was, and the run takes the blocking pool.
            core.release(Some(worker));
            break;
        }
        let mut lent = Lent { core: core.clone(), worker: Some(worker) };
        // (Always there: it was just lent.)
        let Some(worker) = lent.worker.as_mut() else { break };
        let conversation =
            converse_async(&mut worker.process, &mut run.job, &run.deadline, run.limits, run.tools.as_ref()).await;
        match conversation {
            Conversation::NotStarted => lent.give_back(false).await,
            Conversation::Finished { result, reusable } => {
                lent.give_back(reusable).await;
                return Ok(*result);
            }
        }
    }
    // No worker idle (or none it can wait on here): the blocking pool waits
    // for one within the deadline.
    blocking(BoaJs::NAME, move || core.run(run)).await
}

/// A worker an async run took from the pool (counted busy until it comes
/// back or is counted out).
struct Lent {
    core: Arc<Core>,
    /// `None` once given back.
    worker: Option<Worker>,
}

impl Lent {
    /// Gives the worker back after a clean run (`reusable`); otherwise
    /// stops it and reaps it on the reactor before counting it out.
    async fn give_back(mut self, reusable: bool) {
        let Some(mut worker) = self.worker.take() else { return };
        // Not pinned on this path (see `converse_async`).
        worker.ready = false;
        if reusable {
            // An idle worker's alarm would wake the reactor for nothing.
            let _ = worker.process.set_alarm(None);
            self.core.release(Some(worker));
        } else {
            Reaping::of(&self.core, worker).run().await;
        }
    }
}

/// Dropped with its worker still lent, the run was dropped
/// mid-conversation (or a conversation ended in a panic): the worker may be
/// anywhere in the job, so it is stopped and reaped by a task of its own.
impl Drop for Lent {
    fn drop(&mut self) {
        let Some(worker) = self.worker.take() else { return };
        let reaping = Reaping::of(&self.core, worker);
        if crate::reactor::here() {
            // A runtime shutting down drops the task unrun: `Reaping`'s
            // drop then reaps the worker in place.
            drop(tokio::spawn(reaping.run()));
        }
    }
}

/// A stopped worker on its way out: reaped on the reactor by
/// [`Reaping::run`], counted out of the pool when this drops (reaping it in
/// place if it was not yet).
struct Reaping {
    core: Arc<Core>,
    worker: Option<Worker>,
}

impl Reaping {
    /// Stops `worker` (SIGKILL, no wait).
    fn of(core: &Arc<Core>, mut worker: Worker) -> Self {
        worker.process.stop();
        Self { core: core.clone(), worker: Some(worker) }
    }

    async fn run(mut self) {
        if let Some(worker) = self.worker.as_mut() {
            worker.process.reap_async().await;
        }
    }
}

impl Drop for Reaping {
    fn drop(&mut self) {
        let worker = self.worker.take();
        self.core.release(None);
        drop(worker);
    }
}

impl Backend for BoaJs {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn capabilities(&self) -> &BackendCapabilities {
        &self.handle.core.caps
    }

    fn availability(&self) -> Result<(), Unavailable> {
        let core = &self.handle.core;
        core.spec.as_ref().map_err(Clone::clone)?;
        let state = core.lock();
        match &state.spawn_error {
            Some(error) if state.idle.is_empty() && state.busy == 0 => Err(error.clone()),
            _ => Ok(()),
        }
    }

    fn execute(&self, call: Admitted) -> Result<ExecResult, ExecError> {
        self.handle.core.execute(call)
    }

    /// On a runtime from [`crate::runtime_builder`] (which `execbox serve`
    /// uses), a run that finds a worker idle is awaited on the caller's task:
    /// the worker's socket is waited for on the runtime's reactor, and a
    /// dropped future stops the worker at once. Any other run takes the
    /// blocking pool (the default), where a dropped future's run ends by its
    /// deadline.
    fn execute_async(self: Arc<Self>, call: Admitted) -> RunFuture {
        if !crate::reactor::here() {
            return Box::pin(on_blocking_pool(self, call));
        }
        Box::pin(execute_on_task(self.handle.core.clone(), call))
    }

    /// Waits for a ready worker (the pool starts its workers when built).
    fn prepare(&self, limit: Duration) {
        self.wait_ready(limit);
    }

    fn readiness(&self) -> Option<Readiness> {
        let core = &self.handle.core;
        Some(Readiness { ready: core.lock().idle.len(), target: core.cfg.idle_workers })
    }

    /// Sessions in worker processes of their own ([`JsSession`](crate::backends::JsSession)).
    fn session_backends(&self) -> Vec<Arc<dyn crate::backend::SessionBackend>> {
        vec![Arc::new(self.clone())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::boa::pool::{NO_WORKER_FIX, warn_no_worker};
    use parking_lot::Mutex;
    use std::sync::Once;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Counts WARN events and keeps their text.
    #[derive(Default)]
    struct Warnings {
        count: AtomicUsize,
        text: Mutex<String>,
    }

    struct Text<'a>(&'a mut String);

    impl tracing::field::Visit for Text<'_> {
        fn record_debug(&mut self, _field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            self.0.push_str(&format!("{value:?}"));
        }
    }

    impl tracing::Subscriber for Warnings {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, event: &tracing::Event<'_>) {
            if *event.metadata().level() == tracing::Level::WARN {
                self.count.fetch_add(1, Ordering::SeqCst);
                event.record(&mut Text(&mut self.text.lock()));
            }
        }
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    #[test]
    fn no_worker_program_is_warned_once_with_the_fix() {
        let warnings = Arc::new(Warnings::default());
        let once = Once::new();
        let why = Unavailable::new("no worker program", NO_WORKER_FIX);
        tracing::subscriber::with_default(warnings.clone(), || {
            warn_no_worker(&once, &why);
            warn_no_worker(&once, &why);
        });
        assert_eq!(warnings.count.load(Ordering::SeqCst), 1);
        let text = warnings.text.lock().clone();
        assert!(text.contains("execbox::worker::serve_if_worker() first thing in main"), "{text}");
        assert!(text.contains("EXECBOX_WORKER"), "{text}");
    }

    #[test]
    fn a_missing_worker_program_is_unavailable_with_a_fix() {
        let backend =
            BoaJs::new(BoaJsConfig::default().worker_program("/nonexistent/execbox").idle_workers(0)).unwrap();
        let why = backend.availability().unwrap_err();
        assert!(why.reason.contains("/nonexistent/execbox"), "{why}");
        assert!(why.fix.unwrap().contains("BoaJsConfig::worker_program"));
        assert!(BoaJs::new(BoaJsConfig::default().max_workers(0)).is_err());
        assert!(crate::backends::boa::inthread::BoaJsInThread::new(BoaJsConfig::default().yield_every(0)).is_err());
    }
}
