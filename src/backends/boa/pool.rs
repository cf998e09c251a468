//! The `boa-js` worker pool: [`BoaJsConfig::idle_workers`] workers kept
//! ready, more started up to [`BoaJsConfig::max_workers`] while requests
//! wait. All spawning happens on one refill thread, off the request path: a
//! request only ever takes a ready worker (waiting for one within its own
//! deadline) and gives it back when the run ended cleanly. A worker that
//! timed out, crashed or misbehaved is killed and never reused. After a
//! burst, the workers past `idle_workers` stay for [`SURPLUS_LINGER`] of
//! rest before the refill thread retires them, so steady concurrent load
//! does not start and kill a worker per request.

use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::VecDeque;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use crate::admission::Admitted;
use crate::backend::Unavailable;
use crate::backends::boa::capabilities;
use crate::backends::boa::config::BoaJsConfig;
use crate::backends::boa::conversation::{Conversation, Limits, converse, describe_death};
use crate::backends::boa::engine::{Job, Mode};
use crate::backends::boa::gauge::LiveCount;
use crate::backends::boa::job::job;
use crate::backends::boa::worker::{FromWorker, Init};
use crate::backends::worker::frame::RecvError;
use crate::backends::worker::process::{Death, SpawnSpec, WorkerProcess};
use crate::backends::worker::program::WorkerProgramError;
use crate::backends::worker::role::{EXIT_PROTOCOL_MISMATCH, PROGRAM_ENV, Role};
use crate::capabilities::BackendCapabilities;
use crate::error::ExecError;
use crate::limits::deadline::Deadline;
use crate::result::ExecResult;
use crate::tools::ToolBridge;

/// How long a worker past [`BoaJsConfig::idle_workers`] rests idle before
/// the refill thread retires it.
pub(super) const SURPLUS_LINGER: Duration = Duration::from_secs(1);

/// How often the refill thread looks for idle workers that died (a
/// non-blocking `waitpid` each).
const IDLE_SWEEP: Duration = Duration::from_secs(1);

pub(crate) struct Core {
    pub(super) cfg: BoaJsConfig,
    pub(super) caps: BackendCapabilities,
    /// How to start a worker, or why none can be.
    pub(super) spec: Result<SpawnSpec, Unavailable>,
    pub(super) state: Mutex<State>,
    /// The pool changed: for the refill thread and `prepare`.
    pub(super) changed: Condvar,
    /// A worker became idle: wakes one waiting request per worker (not
    /// every waiter, which at high concurrency woke dozens of threads to
    /// find one worker).
    pub(super) freed: Condvar,
    pub(super) live: Arc<AtomicUsize>,
}

#[derive(Default)]
pub(super) struct State {
    /// Ready workers, longest idle first: a worker that just answered is
    /// still building its next context, one that rested has it ready.
    pub(super) idle: VecDeque<Worker>,
    pub(super) starting: usize,
    pub(super) busy: usize,
    /// Requests waiting for a worker.
    pub(super) waiting: usize,
    pub(super) shutdown: bool,
    /// Why the last start failed (cleared by the next success).
    pub(super) spawn_error: Option<Unavailable>,
    failures_in_a_row: u32,
}

/// A worker process, counted by the backend's [`WorkerGauge`] while it lives.
pub(crate) struct Worker {
    pub(super) process: WorkerProcess,
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

/// How to give `boa-js` a worker program when none was configured.
pub(super) const NO_WORKER_FIX: &str = "call execbox::worker::serve_if_worker() first thing in main, set EXECBOX_WORKER to an \
                             execbox binary, or set BoaJsConfig::worker_program";

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
pub(super) fn warn_no_worker(once: &Once, why: &Unavailable) {
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
    /// The pool of `cfg`, its refill thread started when workers can be.
    pub(super) fn start(cfg: BoaJsConfig) -> Arc<Self> {
        let spec = spawn_spec(&cfg);
        let caps = capabilities::contained(&cfg);
        let core = Arc::new(Self {
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
        core
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    pub(super) fn unavailable(&self, why: Unavailable) -> ExecError {
        why.into_error(capabilities::CONTAINED_NAME)
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
                return Err(ExecError::Busy { backend: capabilities::CONTAINED_NAME.into(), reason });
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
    pub(super) fn execute(&self, call: Admitted) -> Result<ExecResult, ExecError> {
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
    pub(super) job: Job,
    pub(super) deadline: Deadline,
    pub(super) tools: Option<Arc<ToolBridge>>,
    pub(super) limits: Limits,
}

impl Run {
    pub(super) fn new(cfg: &BoaJsConfig, call: Admitted) -> Result<Self, ExecError> {
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
pub(super) fn refill(core: &Core) {
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
            // Back off after failures: 100 ms, 200 ms, ... up to 5 s.
            let pause = crate::limits::backoff::after_failures(
                state.failures_in_a_row,
                Duration::from_millis(100),
                Duration::from_secs(5),
            );
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
