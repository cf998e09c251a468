//! The contained `boa-js` backend, host side: a pool of worker processes
//! (see [`crate::backends::worker`]), each waiting with a fresh context, and the one
//! conversation every run (and every session call) has with its worker.
//!
//! The pool keeps [`BoaJsConfig::idle_workers`] workers ready and starts
//! more, up to [`BoaJsConfig::max_workers`], while requests wait. All
//! spawning happens on one refill thread, off the request path: a request
//! only ever takes a ready worker (waiting for one within its own deadline)
//! and gives it back when the run ended cleanly. A worker that timed out,
//! crashed or misbehaved is killed and never reused. After a burst, the
//! workers past `idle_workers` stay for [`SURPLUS_LINGER`] of rest before
//! the refill thread retires them, so steady concurrent load does not
//! start and kill a worker per request.

use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::VecDeque;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use crate::admission::Admitted;
use crate::backend::{Backend, Readiness, RunFuture, Unavailable, blocking, on_blocking_pool};
use crate::backends::boa::capabilities;
use crate::backends::boa::config::BoaJsConfig;
use crate::backends::boa::conversation::{Conversation, Limits, converse, converse_async, describe_death};
use crate::backends::boa::engine::{Job, Mode};
use crate::backends::boa::gauge::{LiveCount, WorkerGauge};
use crate::backends::boa::job::job;
use crate::backends::boa::worker::{FromWorker, Init};
use crate::backends::worker::frame::RecvError;
use crate::backends::worker::process::{Death, SpawnSpec, WorkerProcess};
use crate::backends::worker::program::WorkerProgramError;
use crate::backends::worker::role::{EXIT_PROTOCOL_MISMATCH, PROGRAM_ENV, Role};
use crate::capabilities::BackendCapabilities;
use crate::error::{ConfigError, ExecError};
use crate::limits::deadline::Deadline;
use crate::result::ExecResult;
use crate::tools::ToolBridge;

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

/// How long a worker past [`BoaJsConfig::idle_workers`] rests idle before
/// the refill thread retires it.
const SURPLUS_LINGER: Duration = Duration::from_secs(1);

/// How often the refill thread looks for idle workers that died (a
/// non-blocking `waitpid` each).
const IDLE_SWEEP: Duration = Duration::from_secs(1);

pub(crate) struct Core {
    pub cfg: BoaJsConfig,
    pub caps: BackendCapabilities,
    /// How to start a worker, or why none can be.
    spec: Result<SpawnSpec, Unavailable>,
    state: Mutex<State>,
    /// The pool changed: for the refill thread and `prepare`.
    changed: Condvar,
    /// A worker became idle: wakes one waiting request per worker (not
    /// every waiter, which at high concurrency woke dozens of threads to
    /// find one worker).
    freed: Condvar,
    live: Arc<AtomicUsize>,
}

#[derive(Default)]
struct State {
    /// Ready workers, longest idle first: a worker that just answered is
    /// still building its next context, one that rested has it ready.
    idle: VecDeque<Worker>,
    starting: usize,
    busy: usize,
    /// Requests waiting for a worker.
    waiting: usize,
    shutdown: bool,
    /// Why the last start failed (cleared by the next success).
    spawn_error: Option<Unavailable>,
    failures_in_a_row: u32,
}

/// A worker process, counted by the backend's [`WorkerGauge`] while it lives.
pub(crate) struct Worker {
    pub process: WorkerProcess,
    /// Its `Ready` after the last run was read: its next context is built.
    pub(super) ready: bool,
    /// When it last went idle.
    idle_since: Instant,
    _live: LiveCount,
}

impl Worker {
    /// Whether its next context is built, reading its `Ready` if it came.
    /// `None` if it died or broke the protocol.
    fn is_ready(&mut self) -> Option<bool> {
        if self.ready {
            // Killed while idle (the OOM killer, an operator): found here,
            // not by a run that would send it a job and try the next one.
            if self.process.has_exited() {
                return None;
            }
        } else {
            match self.process.recv::<FromWorker>(Some(Instant::now()), 1 << 10) {
                Ok(FromWorker::Ready) => self.ready = true,
                Err(RecvError::TimedOut) => {}
                _ => return None,
            }
        }
        Some(self.ready)
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

/// How to give `boa-js` a worker program when none was configured.
const NO_WORKER_FIX: &str = "call execbox::worker::serve_if_worker() first thing in main, set EXECBOX_WORKER to an \
                             execbox binary, or set BoaJsConfig::worker_program";

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
        let spec = spawn_spec(&cfg);
        let caps = capabilities::contained(&cfg);
        let core = Arc::new(Core {
            cfg,
            caps,
            spec,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            freed: Condvar::new(),
            live: Arc::new(AtomicUsize::new(0)),
        });
        if core.spec.is_ok() {
            let thread_core = core.clone();
            let started = std::thread::Builder::new()
                .name("execbox-boa-refill".into())
                .stack_size(256 << 10)
                .spawn(move || refill(&thread_core));
            if let Err(e) = started {
                core.lock().spawn_error = Some(Unavailable::because(format!("cannot start the refill thread: {e}")));
            }
        }
        Self { handle: Arc::new(Handle { core }) }
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

/// How to start a worker, or why none can be (with the fix). Warns once per
/// process when no worker program is found.
fn spawn_spec(cfg: &BoaJsConfig) -> Result<SpawnSpec, Unavailable> {
    static WARNED: Once = Once::new();
    let program = crate::backends::worker::program::find_program(cfg.worker_program.as_deref()).map_err(|error| {
        let reason = crate::error::with_causes(&error);
        let unavailable = if cfg.worker_program.is_some() {
            Unavailable::new(reason, "set BoaJsConfig::worker_program to an execbox binary of this build")
        } else if std::env::var_os(PROGRAM_ENV).is_some() {
            Unavailable::new(reason, format!("point {PROGRAM_ENV} at an execbox binary of this build"))
        } else if matches!(error, WorkerProgramError::NotFound) {
            Unavailable::new("no worker program", NO_WORKER_FIX)
        } else {
            Unavailable::new(reason, NO_WORKER_FIX)
        };
        warn_no_worker(&WARNED, &unavailable);
        unavailable
    })?;
    if !crate::backends::worker::lockdown::supported() {
        return Err(Unavailable::new(
            format!("no seccomp filter for {}: workers cannot be locked down here", std::env::consts::ARCH),
            "run on x86_64 or aarch64 Linux (or, for trusted code only, register BoaJsInThread)",
        ));
    }
    Ok(SpawnSpec { program, role: Role::BoaJs, stack_bytes: cfg.worker_stack_bytes as u64 })
}

/// Warns, once per `once`, that `boa-js` has no worker program: a library
/// user who forgot `serve_if_worker()` otherwise only sees JavaScript run
/// slower (a default matrix falls back to QuickJS in wasm).
fn warn_no_worker(once: &Once, why: &Unavailable) {
    once.call_once(|| {
        tracing::warn!(
            "boa-js cannot start JavaScript workers ({}): JavaScript runs on a slower backend (QuickJS in wasm, \
             about 4x slower) or not at all. Fix: {}",
            why.reason,
            why.fix.as_deref().unwrap_or(NO_WORKER_FIX)
        );
    });
}

impl Core {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    fn unavailable(&self, why: Unavailable) -> ExecError {
        why.into_error(BoaJs::NAME)
    }

    /// Starts one worker: spawn, hand it its settings, wait until it is
    /// locked down and ready. `session` workers keep their context.
    pub(crate) fn start_worker(&self, session: bool) -> Result<Worker, Unavailable> {
        let spec = self.spec.as_ref().map_err(Clone::clone)?;
        let program = spec.program.display().to_string();
        let of_this_build =
            || format!("point {PROGRAM_ENV} or BoaJsConfig::worker_program at an execbox binary of this build");
        let mut process = WorkerProcess::spawn(spec)
            .map_err(|e| Unavailable::because(format!("cannot start the worker program {program}: {e}")))?;
        let live = LiveCount::new(&self.live);
        let init = Init { engine: self.cfg.engine(), session };
        let until = Instant::now() + self.cfg.worker_start_timeout;
        let sent = process.send(&init, Some(until));
        let answer = match sent {
            Ok(()) => process.recv::<FromWorker>(Some(until), 1 << 10),
            Err(_) => Err(RecvError::Closed),
        };
        match answer {
            Ok(FromWorker::Ready) => {}
            Ok(_) => {
                return Err(Unavailable::new(
                    format!("the worker program {program} answered out of turn"),
                    of_this_build(),
                ));
            }
            Err(RecvError::TimedOut) => {
                return Err(Unavailable::new(
                    format!(
                        "the worker program {program} was not ready within {} ms",
                        self.cfg.worker_start_timeout.as_millis()
                    ),
                    "raise BoaJsConfig::worker_start_timeout on a slow or loaded machine",
                ));
            }
            Err(RecvError::Invalid(why)) => {
                return Err(Unavailable::new(format!("the worker program {program} sent {why}"), of_this_build()));
            }
            Err(RecvError::Closed) => {
                return Err(match process.death() {
                    Death::Exited { code: EXIT_PROTOCOL_MISMATCH, .. } => Unavailable::new(
                        format!("{program} is another build of execbox (protocol mismatch)"),
                        of_this_build(),
                    ),
                    Death::Exited { code: 0, stderr } if stderr.is_empty() => Unavailable::new(
                        format!("{program} exited without serving"),
                        "a program serving as worker calls execbox::worker::serve_if_worker() first thing in main",
                    ),
                    death => Unavailable::because(format!(
                        "the worker program {program} failed to start: {}",
                        describe_death(&death)
                    )),
                });
            }
        }
        // Until a run sets its own cap, an idle worker may grow only this much.
        let _ = process.limit_memory(self.cfg.defaults.memory_bytes);
        Ok(Worker { process, ready: true, idle_since: Instant::now(), _live: live })
    }

    /// Takes a ready worker, waiting for one until `deadline`.
    fn acquire(&self, deadline: &Deadline) -> Result<Worker, ExecError> {
        if let Err(why) = &self.spec {
            return Err(self.unavailable(why.clone()));
        }
        let mut state = self.lock();
        loop {
            if let (Some(worker), dropped) = Self::take_counted(&mut state) {
                drop(state);
                if dropped {
                    self.changed.notify_all();
                }
                return Ok(worker);
            }
            if state.shutdown {
                return Err(self.unavailable(Unavailable::because("the backend was dropped")));
            }
            if let Some(error) = &state.spawn_error
                && state.busy == 0
            {
                return Err(self.unavailable(error.clone()));
            }
            let left = deadline.remaining().unwrap_or(Duration::MAX);
            if left.is_zero() {
                let reason = if state.busy == 0 {
                    "the JS workers were still starting when the deadline passed".to_string()
                } else {
                    format!("no JS worker became free before the deadline ({} at most, all busy)", self.cfg.max_workers)
                };
                return Err(ExecError::Busy { backend: BoaJs::NAME.into(), reason });
            }
            state.waiting += 1;
            self.changed.notify_all();
            self.freed.wait_for(&mut state, left.min(Duration::from_secs(3600)));
            state.waiting -= 1;
        }
    }

    /// [`Core::take_idle`], counting the worker busy; true in second place
    /// if dead workers were dropped on the way. Taking a worker leaves the
    /// refill thread nothing to do (it counts busy workers as coming back),
    /// but dropped ones it replaces: the caller wakes it then.
    fn take_counted(state: &mut State) -> (Option<Worker>, bool) {
        let before = state.idle.len();
        let worker = Self::take_idle(&mut state.idle);
        let dropped = before - state.idle.len() > usize::from(worker.is_some());
        if worker.is_some() {
            state.busy += 1;
        }
        (worker, dropped)
    }

    /// The most recently used idle worker whose next context is built (its
    /// memory is the warmest), else the longest idle one (likely the next to
    /// be ready). Dead workers are dropped on the way.
    fn take_idle(idle: &mut VecDeque<Worker>) -> Option<Worker> {
        let mut i = idle.len();
        while i > 0 {
            i -= 1;
            match idle[i].is_ready() {
                Some(true) => return idle.remove(i),
                Some(false) => {}
                None => drop(idle.remove(i)),
            }
        }
        loop {
            let mut worker = idle.pop_front()?;
            if !worker.process.has_exited() {
                return Some(worker);
            }
        }
    }

    /// Gives back a worker after a clean run, or drops it (a dead one, or
    /// any once the backend is dropped). One past `idle_workers` that
    /// nobody waits for is kept too, until it has rested [`SURPLUS_LINGER`]:
    /// the refill thread then retires it and the pool shrinks back to its
    /// idle size. The refill thread is woken only when it has something to
    /// do: a wake-up per run cost the caller ~10 µs and, on 2 CPUs, took a
    /// CPU from the next run.
    pub(super) fn release(&self, worker: Option<Worker>) {
        let mut state = self.lock();
        state.busy -= 1;
        // The refill thread replaces a worker that did not come back;
        // `prepare` waits for the first idle one.
        let wake = worker.is_none() || state.idle.is_empty();
        let surplus = match worker {
            Some(mut worker) if !state.shutdown => {
                worker.idle_since = Instant::now();
                state.idle.push_back(worker);
                self.freed.notify_one();
                None
            }
            other => {
                // No worker came back: a waiting request may have to give
                // up now (a start error with none busy).
                self.freed.notify_all();
                other
            }
        };
        let wake = wake || state.shutdown || state.waiting > 0 || state.idle.len() > self.cfg.idle_workers;
        drop(state);
        if wake {
            self.changed.notify_all();
        }
        drop(surplus); // killed and reaped outside the lock
    }

    /// Takes an idle worker without waiting, if one is there (for a run on
    /// an async task, which must not wait on a condition variable).
    pub(super) fn try_acquire(&self) -> Option<Worker> {
        if self.spec.is_err() {
            return None;
        }
        let mut state = self.lock();
        if state.shutdown {
            return None;
        }
        let (worker, dropped) = Self::take_counted(&mut state);
        drop(state);
        if dropped {
            self.changed.notify_all();
        }
        worker
    }

    /// Runs a request's job on a pooled worker.
    fn execute(&self, call: Admitted) -> Result<ExecResult, ExecError> {
        self.run(Run::new(&self.cfg, call)?)
    }

    /// Runs `run` on a pooled worker, waiting for one within its deadline.
    pub(super) fn run(&self, mut run: Run) -> Result<ExecResult, ExecError> {
        // A worker that died while idle is found when the job is sent;
        // nothing ran then, so another worker is tried.
        for _ in 0..3 {
            let mut worker = self.acquire(&run.deadline)?;
            match converse(&mut worker.process, &mut run.job, &run.deadline, run.limits, run.tools.as_ref()) {
                Conversation::NotStarted => self.release(None),
                Conversation::Finished { result, reusable } => {
                    worker.ready = false;
                    // Its next context is built on whichever CPU is free,
                    // not on the caller's.
                    worker.process.unpin();
                    self.release(reusable.then_some(worker));
                    return Ok(*result);
                }
            }
        }
        Err(self.all_died())
    }

    /// The error of a run whose workers all died before taking its job.
    pub(super) fn all_died(&self) -> ExecError {
        self.unavailable(Unavailable::because("three workers in a row died before they could take the job"))
    }
}

/// A request's job on a pooled worker, and what its conversation needs.
pub(super) struct Run {
    pub job: Job,
    pub deadline: Deadline,
    pub tools: Option<Arc<ToolBridge>>,
    pub limits: Limits,
}

impl Run {
    fn new(cfg: &BoaJsConfig, call: Admitted) -> Result<Self, ExecError> {
        let memory = call.policy().memory_bytes.unwrap_or(cfg.defaults.memory_bytes);
        let deadline = call.deadline();
        let tools = call.tools().cloned();
        let job = job(cfg, call, Mode::FunctionBody, false)?;
        Ok(Self { job, deadline, tools, limits: Limits { memory, grace: cfg.deadline_grace } })
    }
}

/// What the refill thread does next.
enum Chore {
    /// Start a worker.
    Start,
    /// Retire these surplus workers that rested long enough.
    Retire(Vec<Worker>),
}

/// The idle workers past `keep` that have rested [`SURPLUS_LINGER`]
/// (longest idle first), and how long until the next one has, if any.
fn rested_surplus(state: &mut State, keep: usize) -> (Vec<Worker>, Option<Duration>) {
    let mut rested = Vec::new();
    while state.idle.len() > keep {
        let Some(rest) = state.idle.front().map(|w| w.idle_since.elapsed()) else { break };
        if rest < SURPLUS_LINGER {
            return (rested, Some(SURPLUS_LINGER - rest));
        }
        rested.extend(state.idle.pop_front());
    }
    (rested, None)
}

/// Keeps the pool filled (the only thread that starts workers for it) and
/// retires the surplus after a burst.
fn refill(core: &Core) {
    loop {
        let mut state = core.lock();
        let chore = loop {
            if state.shutdown {
                let idle = std::mem::take(&mut state.idle);
                drop(state);
                drop(idle); // killed and reaped
                return;
            }
            // Idle workers killed from outside (the OOM killer, an operator)
            // are reaped and replaced within a sweep, not left for the next
            // request to find, and `readiness` does not count them.
            state.idle.retain_mut(|worker| !worker.process.has_exited());
            let live = state.idle.len() + state.starting + state.busy;
            // Busy workers come back after a clean run: the pool is short only
            // if, counting them, it is below its idle size, or if requests
            // wait and nothing is starting for them.
            let short = live < core.cfg.idle_workers || state.idle.len() + state.starting < state.waiting;
            if short && live < core.cfg.max_workers.max(1) {
                break Chore::Start;
            }
            match rested_surplus(&mut state, core.cfg.idle_workers) {
                (rested, _) if !rested.is_empty() => break Chore::Retire(rested),
                (_, next) => drop(core.changed.wait_for(&mut state, next.unwrap_or(IDLE_SWEEP).min(IDLE_SWEEP))),
            }
        };
        if let Chore::Retire(rested) = chore {
            drop(state);
            drop(rested); // killed and reaped outside the lock
            core.changed.notify_all();
            continue;
        }
        if state.failures_in_a_row > 0 {
            // Back off after failures: 50 ms, 100 ms, ... up to 5 s.
            let pause = Duration::from_millis(50u64 << state.failures_in_a_row.min(7)).min(Duration::from_secs(5));
            core.changed.wait_for(&mut state, pause);
            if state.shutdown {
                continue;
            }
        }
        state.starting += 1;
        drop(state);
        let started = core.start_worker(false);
        let mut state = core.lock();
        state.starting -= 1;
        let mut surplus = None;
        match started {
            Ok(worker) => {
                // Started for a burst that is over: not kept.
                if state.idle.len() < core.cfg.idle_workers.max(state.waiting) && !state.shutdown {
                    state.idle.push_back(worker);
                    core.freed.notify_one();
                } else {
                    surplus = Some(worker);
                }
                state.spawn_error = None;
                state.failures_in_a_row = 0;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot start a boa worker");
                state.spawn_error = Some(e);
                state.failures_in_a_row = state.failures_in_a_row.saturating_add(1);
                // Waiting requests decide whether to give up.
                core.freed.notify_all();
            }
        }
        drop(state);
        core.changed.notify_all();
        drop(surplus);
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
    fn session_backend(&self) -> Option<Arc<dyn crate::backend::SessionBackend>> {
        Some(Arc::new(self.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
