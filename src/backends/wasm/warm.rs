//! A warm pool for an interpreter: instances pre-started in the background
//! up to the point where they wait for their code (CPython blocked reading
//! stdin), so a request pays only for its own code.
//!
//! A run's code is one message on the instance's stdin, which is then closed
//! (a read of it is end-of-file); a run that calls tools instead gets the
//! tools header before its code and keeps stdin open for the answers until
//! the run ends or its deadline passes (then it is closed, so a guest
//! blocked reading it stops, and the run is `timed_out`).
//!
//! Each instance serves exactly one request and is never reused: its thread
//! ends with the run, and a replacement starts as soon as the run has
//! answered (not during it: on a small machine its start-up would slow the
//! run down). An instance gets its request's deadline, memory cap and output caps
//! when the code arrives ([`RunControls::arm`]); requests that need what is
//! fixed at start-up (arguments, environment, granted directories, a fuel
//! budget, or a memory cap below what start-up already used) run fresh instead.
//!
//! Each instance holds one of the engine's instance slots while it waits, and
//! takes one only if it is free at once and as many as the pool's size stay
//! free (warm instances never queue for a slot ahead of requests, nor take
//! the last ones). A start that fails — no temporary directory, no
//! thread, an instance that dies during start-up — does not shrink the pool
//! for good: a retry thread (alive only while the pool is short) tries again
//! after a backoff of 100 ms, doubling per failure in a row up to 10 s; a
//! start that found every slot busy is retried after 100 ms without growing
//! the backoff. Meanwhile requests run on fresh instances.

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use wasmtime_wasi::FsPerms;

use super::engine::WasmEngine;
use super::guest::{Compiled, Preopen, RunControls};
use super::run::{self, Stdio, StoreSetup};
use super::staging::write_staged;
use super::stdio::{CappedPipe, MessageSender, MessageStdin, WaitSignal};
use super::tool_channel::{ToolChannel, cut_off_at_deadline};
use crate::error::ExecError;
use crate::limits::deadline::Deadline;
use crate::limits::deadline::REPORT_GRACE;
use crate::limits::output::StreamKind;
use crate::limits::records::{ResultTap, marker};
use crate::policy::Access;
use crate::request::ExecRequest;
use crate::result::{ExecResult, Outcome};
use crate::tools::ToolBridge;
use crate::tools::wire::{frame_limit, python_header};

/// First wait before starting instances again after a failed start (no
/// temporary directory, no thread, no free slot); doubled per failure in a
/// row, up to [`BACKOFF_MAX`].
const BACKOFF_START: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// One pre-started instance, waiting for its code.
pub(crate) struct Warm {
    /// Its stdin: the code, as one message (a session's loop, then cells;
    /// and the answers of tool calls). Tool channels hold it weakly:
    /// dropping this (or closing it) ends the stream.
    pub code: Arc<MessageSender>,
    pub controls: Arc<RunControls>,
    pub stdio: Stdio,
    /// Seen by the guest at `/work` (read-only); the request's files go here.
    /// The directory belongs to the instance's thread and is removed when
    /// that thread ends, never while the guest may still read it.
    pub work: PathBuf,
    /// The instance's end: `_start`'s result, once it returns.
    pub done: mpsc::Receiver<Result<ExecResult, ExecError>>,
    pub thread: JoinHandle<()>,
    /// Its thread's priority: lowered while it starts, restored (by
    /// [`StartPriority::restore`]) before it gets its code.
    pub priority: Arc<StartPriority>,
}

impl Warm {
    /// Ends an unused instance: with no code its stdin ends, the program
    /// runs nothing and exits.
    fn retire(self) {
        self.code.close();
        drop(self.thread.join());
    }
}

/// A thread whose instance was handed a request.
struct Handed {
    thread: JoinHandle<()>,
    /// It answered, so it ends at once (dropping its store); otherwise it
    /// was abandoned past its deadline and ends when the guest stops.
    answered: bool,
}

/// Failed starts in a row, and when to try again.
#[derive(Default)]
struct Backoff {
    failures: u32,
    retry_at: Option<Instant>,
}

/// Why an instance did not start.
enum StartError {
    /// Every instance slot is busy: contention, retried soon.
    NoSlot,
    /// Anything else: retried after the backoff.
    Failed(String),
}

/// The pool; the retry thread shares it.
pub(crate) struct WarmPool {
    pool: Arc<Pool>,
}

struct Pool {
    engine: Arc<WasmEngine>,
    /// The backend's name, in results and errors.
    backend: &'static str,
    compiled: Arc<Compiled>,
    /// The interpreter's arguments (e.g. `-c BOOTSTRAP`).
    args: Vec<String>,
    size: usize,
    idle: Mutex<VecDeque<Warm>>,
    /// Threads of handed-out instances, joined off the request path once ended.
    handed: Mutex<Vec<Handed>>,
    backoff: Mutex<Backoff>,
    /// Held by whoever is starting instances (one refiller at a time).
    refilling: Mutex<()>,
    /// Set when the pool is dropped; the retry thread waits on `wake`.
    closed: Mutex<bool>,
    wake: Condvar,
    /// The retry thread, while the pool is short.
    retrier: Mutex<Retrier>,
    /// Notified each time one of the pool's instances blocks for its code
    /// (done starting).
    started: Arc<WaitSignal>,
}

#[derive(Default)]
struct Retrier {
    /// Set by whoever starts the thread, cleared by the thread as it ends
    /// (both under the mutex, so a pool found short is never left alone).
    running: bool,
    thread: Option<JoinHandle<()>>,
}

fn lock<T>(mutex: &Mutex<T>) -> parking_lot::MutexGuard<'_, T> {
    mutex.lock()
}

impl WarmPool {
    /// A pool of `size` instances of `backend`, starting now in the background.
    pub fn start(
        engine: Arc<WasmEngine>,
        backend: &'static str,
        compiled: Arc<Compiled>,
        args: Vec<String>,
        size: usize,
    ) -> Self {
        let pool = Arc::new(Pool {
            engine,
            backend,
            compiled,
            args,
            size,
            idle: Mutex::new(VecDeque::new()),
            handed: Mutex::new(Vec::new()),
            backoff: Mutex::new(Backoff::default()),
            refilling: Mutex::new(()),
            closed: Mutex::new(false),
            wake: Condvar::new(),
            retrier: Mutex::new(Retrier::default()),
            started: Arc::new(WaitSignal::default()),
        });
        pool.top_up();
        Self { pool }
    }

    /// Whether a warm instance can honour `request` exactly.
    pub fn fits(request: &ExecRequest) -> bool {
        request.args.is_empty()
            && request.env.is_empty()
            && !matches!(request.policy.filesystem, Access::Allow(_))
            && request.policy.fuel.is_none()
    }

    /// Runs `code` on a warm instance, with `request`'s limits and files,
    /// within `deadline`, its tool calls going to `tools`. `None` when no
    /// live instance is idle or it cannot honour the memory cap: the caller
    /// runs a fresh instance (and calls [`WarmPool::top_up`] afterwards).
    pub fn run(
        &self,
        code: &str,
        input_json: Option<&[u8]>,
        request: &ExecRequest,
        deadline: Deadline,
        tools: Option<&Arc<ToolBridge>>,
    ) -> Option<Result<ExecResult, ExecError>> {
        self.pool.run(code, input_json, request, deadline, tools)
    }

    /// Starts instances until the pool is full again (see [`Pool::top_up`]).
    pub fn top_up(&self) {
        self.pool.top_up();
    }

    /// Instances in the pool (started or still starting).
    pub fn idle(&self) -> usize {
        lock(&self.pool.idle).len()
    }

    /// Instances done starting, waiting for code.
    pub fn ready(&self) -> usize {
        self.pool.ready()
    }

    /// Waits at most `limit` until an instance is ready (at once if the
    /// pool keeps none); true if one is.
    pub fn wait_ready(&self, limit: Duration) -> bool {
        self.pool.size == 0 || self.pool.started.wait_for(limit, || self.pool.ready() > 0)
    }

    /// An instance for a session: with no environment and no granted
    /// directories, one of the pool's (its replacement starts at once) or a
    /// new one if none is pooled; otherwise a new one started now with
    /// `setup`'s environment and directories (what a pooled instance could
    /// not be given after its start). `Err` if no instance slot is free.
    pub fn take_for_session(&self, setup: SessionSetup) -> Result<Warm, String> {
        let plain = setup.env.is_empty() && setup.preopens.is_empty();
        let pooled = if plain {
            loop {
                let Some(warm) = lock(&self.pool.idle).pop_front() else { break None };
                if !warm.thread.is_finished() {
                    break Some(warm);
                }
                drop(warm.thread.join());
            }
        } else {
            None
        };
        let warm = match pooled {
            Some(warm) => warm,
            None => match self.pool.start_one(0, setup) {
                Ok(warm) => warm,
                Err(StartError::NoSlot) => return Err("every instance slot is busy".into()),
                Err(StartError::Failed(why)) => return Err(why),
            },
        };
        self.pool.top_up();
        Ok(warm)
    }
}

/// What a session's instance starts with beyond the pool's own: its
/// environment and granted directories (fixed for its life).
#[derive(Default)]
pub(crate) struct SessionSetup {
    pub env: Vec<(String, String)>,
    pub preopens: Vec<Preopen>,
}

impl Pool {
    fn ready(&self) -> usize {
        lock(&self.idle).iter().filter(|w| w.code.waits() > 0).count()
    }

    fn run(
        self: &Arc<Self>,
        code: &str,
        input_json: Option<&[u8]>,
        request: &ExecRequest,
        deadline: Deadline,
        tools: Option<&Arc<ToolBridge>>,
    ) -> Option<Result<ExecResult, ExecError>> {
        let warm = loop {
            let warm = lock(&self.idle).pop_front()?;
            if !warm.thread.is_finished() {
                break warm;
            }
            // It ended during start-up (e.g. its instance could not be made).
            let why = match warm.done.try_recv() {
                Ok(Err(e)) => e.to_string(),
                _ => "it exited during start-up".to_string(),
            };
            self.note_failure(&why);
            drop(warm.thread.join());
        };
        // The replacement starts once this run has answered: started now, its
        // start-up would compete with this run for the CPU.
        let _refill = Refill(self.clone());
        let policy = &request.policy;
        let memory_cap = self.engine.memory_cap(policy);
        if warm.controls.peak() > memory_cap {
            warm.retire();
            return None;
        }
        if let Err(e) = write_staged(&warm.work, request, input_json.map(|j| ("input.json", j))) {
            warm.retire();
            return Some(Err(e));
        }
        let tap = request.output_tap.clone();
        let mut message = Vec::with_capacity(code.len());
        let channel = match tools {
            // Tool calls leave stdout through the tap; answers come on stdin.
            Some(bridge) => {
                let nonce = crate::nonce::hex128();
                let records = ResultTap::new(marker(&nonce), Some(0)).with_calls(frame_limit(Some(bridge)));
                warm.stdio.stdout.reset_with_records(policy.max_stdout_bytes, records, tap.clone(), StreamKind::Stdout);
                let channel = ToolChannel::new(&warm.code);
                channel.begin(Some(bridge.clone()));
                warm.stdio.stdout.set_calls(Some(channel.sink()));
                message = python_header(&nonce, bridge);
                Some(channel)
            }
            None => {
                warm.stdio.stdout.reset(policy.max_stdout_bytes, tap.clone(), StreamKind::Stdout);
                None
            }
        };
        warm.stdio.stderr.reset(policy.max_stderr_bytes, tap, StreamKind::Stderr);
        message.extend_from_slice(code.as_bytes());
        warm.controls.arm(deadline, memory_cap);
        warm.priority.restore();
        let _ticking = self.engine.ticker().run_guard();
        if warm.code.send(&message).is_none() {
            // It ended between the check above and now: run fresh instead.
            self.hand_off(warm.thread, true);
            return None;
        }
        drop(message);
        let result = match (deadline.remaining(), &channel) {
            // Without tools the code is all it gets: a read of stdin after it
            // is end-of-file, never a wait the deadline cannot interrupt.
            (Some(left), None) => {
                warm.code.close();
                warm.done.recv_timeout(left + REPORT_GRACE)
            }
            // With tools stdin stays open for the answers until the deadline;
            // then a guest blocked reading it reads end-of-file and stops.
            (Some(left), Some(_)) => match warm.done.recv_timeout(left) {
                Err(RecvTimeoutError::Timeout) => {
                    warm.controls.expire_now();
                    warm.code.close();
                    let mut late = warm.done.recv_timeout(REPORT_GRACE);
                    if let Ok(Ok(result)) = &mut late {
                        cut_off_at_deadline(result, &deadline);
                    }
                    late
                }
                answered => answered,
            },
            (None, channel) => {
                if channel.is_none() {
                    warm.code.close();
                }
                warm.done.recv().map_err(|_| RecvTimeoutError::Disconnected)
            }
        };
        if let Some(channel) = &channel {
            channel.end();
        }
        warm.code.close();
        self.hand_off(warm.thread, result.is_ok());
        Some(match result {
            Ok(mut result) => {
                if let Ok(r) = &mut result {
                    // The store's counter includes start-up: no per-request figure.
                    r.usage.fuel = None;
                }
                result
            }
            // The guest stops itself at the deadline; a run that has not
            // reported by now is stuck in the host: leave its thread (and
            // its `/work`, which goes when the thread ends).
            Err(RecvTimeoutError::Timeout) => Ok(stuck(self.backend, &deadline)),
            Err(RecvTimeoutError::Disconnected) => {
                Err(ExecError::internal(self.backend, "a warm instance ended without a result"))
            }
        })
    }

    /// Starts instances until the pool is full again, unless a recent start
    /// failed and its backoff has not passed. Called after each run answered
    /// (never during one), by the caller after a fresh run, and by the retry
    /// thread, which runs while the pool is short.
    fn top_up(self: &Arc<Self>) {
        self.join_handed(false);
        let Some(refilling) = self.refilling.try_lock() else { return };
        let due = lock(&self.backoff).retry_at.is_none_or(|at| Instant::now() >= at);
        if due {
            self.start_instances();
        }
        drop(refilling);
        if lock(&self.idle).len() < self.size {
            self.keep_retrying();
        }
    }

    /// Starts the retry thread unless it runs: it tops the pool up when each
    /// backoff passes, and ends once the pool is full (or closed).
    fn keep_retrying(self: &Arc<Self>) {
        let mut retrier = lock(&self.retrier);
        if retrier.running {
            return;
        }
        if let Some(ended) = retrier.thread.take() {
            drop(ended.join());
        }
        let pool = self.clone();
        let spawned = std::thread::Builder::new()
            .name("execbox-warm-retry".into())
            .stack_size(256 << 10)
            .spawn(move || pool.retry_loop());
        match spawned {
            Ok(thread) => *retrier = Retrier { running: true, thread: Some(thread) },
            // The next request that ends tries again.
            Err(e) => tracing::debug!(error = %e, "cannot start the warm pool's retry thread"),
        }
    }

    fn retry_loop(self: Arc<Self>) {
        loop {
            if !self.wait_for_backoff() {
                break;
            }
            self.start_missing();
            let mut retrier = lock(&self.retrier);
            if lock(&self.idle).len() >= self.size || *lock(&self.closed) {
                retrier.running = false;
                return;
            }
        }
        lock(&self.retrier).running = false;
    }

    /// Sleeps until the backoff has passed; false if the pool closed meanwhile.
    fn wait_for_backoff(&self) -> bool {
        let mut closed = lock(&self.closed);
        while !*closed {
            let retry_at = lock(&self.backoff).retry_at;
            let wait = retry_at.map_or(Duration::ZERO, |at| at.saturating_duration_since(Instant::now()));
            if wait.is_zero() {
                return true;
            }
            self.wake.wait_for(&mut closed, wait);
        }
        false
    }

    /// One refill attempt of the retry thread.
    fn start_missing(&self) {
        let Some(_refilling) = self.refilling.try_lock() else {
            // A request's refill is at work: look again after a pause.
            lock(&self.backoff).retry_at = Some(Instant::now() + BACKOFF_START);
            return;
        };
        self.start_instances();
    }

    /// Starts instances until the pool is full, a start fails (backoff) or
    /// finds no slot (retry soon). The caller holds `refilling`.
    fn start_instances(&self) {
        loop {
            let short = lock(&self.idle).len() < self.size;
            if !short || *lock(&self.closed) {
                return;
            }
            match self.start_one(self.size, SessionSetup::default()) {
                Ok(warm) => {
                    *lock(&self.backoff) = Backoff::default();
                    lock(&self.idle).push_back(warm);
                    // It may have finished starting before it was listed.
                    self.started.notify();
                }
                Err(StartError::NoSlot) => {
                    lock(&self.backoff).retry_at = Some(Instant::now() + BACKOFF_START);
                    return;
                }
                Err(StartError::Failed(why)) => {
                    self.note_failure(&why);
                    return;
                }
            }
        }
    }

    /// Records a failed start: no new start before the backoff passes.
    fn note_failure(&self, why: &str) {
        let mut backoff = lock(&self.backoff);
        backoff.failures = backoff.failures.saturating_add(1);
        let delay = BACKOFF_START.saturating_mul(1 << backoff.failures.min(16).saturating_sub(1)).min(BACKOFF_MAX);
        backoff.retry_at = Some(Instant::now() + delay);
        tracing::warn!(
            backend = self.backend,
            failures = backoff.failures,
            retry_in_ms = delay.as_millis() as u64,
            reason = why,
            "cannot start a warm instance; requests run on fresh instances meanwhile"
        );
    }

    /// Starts one instance in the background; it joins the idle list at once
    /// (a request that takes it before start-up ends waits for the rest).
    fn start_one(&self, keep_free: usize, setup: SessionSetup) -> Result<Warm, StartError> {
        // Never waits, and (for the pool) leaves as many slots free as the
        // pool holds: with slots scarce, requests need them more.
        let slot = self.engine.try_acquire_slot(keep_free).ok_or(StartError::NoSlot)?;
        let work = crate::backends::owner::temp_dir("warm")
            .map_err(|e| StartError::Failed(format!("no temporary directory: {e}")))?;
        let work_path = work.path().to_path_buf();
        let (stdin, code) = MessageStdin::new(Some(self.started.clone()));
        let code = Arc::new(code);
        let ended = stdin.end_guard();
        let ceiling = usize::try_from(self.engine.config().max_memory_bytes).unwrap_or(usize::MAX);
        let controls = RunControls::new(Deadline::start(None), ceiling);
        let stdio = Stdio { stdout: CappedPipe::new(Some(0)), stderr: CappedPipe::new(Some(0)) };
        let (done_tx, done) = mpsc::sync_channel(1);
        let engine = self.engine.clone();
        let backend = self.backend;
        let compiled = self.compiled.clone();
        let args = self.args.clone();
        let thread_stdio = Stdio { stdout: stdio.stdout.clone(), stderr: stdio.stderr.clone() };
        let thread_controls = controls.clone();
        let priority = Arc::new(StartPriority::default());
        let thread_priority = priority.clone();
        let thread = std::thread::Builder::new()
            .name("execbox-warm".into())
            .stack_size(self.engine.config().max_wasm_stack + (2 << 20))
            .spawn(move || {
                thread_priority.lower_this_thread();
                // Marked before the thread ends, whatever way it ends: a
                // restore never names a thread id that may have been reused.
                let _ended = PriorityEnd(thread_priority);
                // Dropped last, in this order: the store (below) frees the
                // pool slot, then `/work` goes, then the slot is given back.
                let _slot = slot;
                let work = work;
                let mut preopens =
                    vec![Preopen { host: work.path().to_path_buf(), guest: "/work".into(), perms: FsPerms::ReadOnly }];
                preopens.extend(setup.preopens);
                let setup = StoreSetup { args: &args, env: &setup.env, preopens: &preopens, fuel: None, tools: None };
                let mut store =
                    match run::new_store(&engine, compiled.abi, stdin, &thread_stdio, &setup, thread_controls) {
                        Ok(store) => store,
                        Err(e) => {
                            let _ = done_tx.send(Err(e));
                            return;
                        }
                    };
                run::stop_at_armed_deadline(&mut store);
                let verdict = match run::instantiate(backend, &compiled, &mut store) {
                    Ok(Ok(instance)) => run::call_start(&mut store, instance),
                    Ok(Err(err)) => Err(err),
                    Err(e) => {
                        let _ = done_tx.send(Err(e));
                        return;
                    }
                };
                // Answer first: freeing the instance (resetting its memory
                // slot) is not the caller's wait. (On the early returns above,
                // `ended` goes when the thread ends, after its answer.)
                let _ = done_tx.send(Ok(run::finish(&engine, backend, &mut store, verdict, &thread_stdio, None)));
                drop(ended);
                step_aside();
                drop(store);
            })
            .map_err(|e| StartError::Failed(format!("cannot spawn a thread: {e}")))?;
        Ok(Warm { code, controls, stdio, work: work_path, done, thread, priority })
    }

    fn hand_off(&self, thread: JoinHandle<()>, answered: bool) {
        lock(&self.handed).push(Handed { thread, answered });
    }

    /// Joins handed-out threads that have ended, or with `answered`, also
    /// those that answered (they end right after). Abandoned threads that
    /// still run are left to end at their deadline.
    fn join_handed(&self, answered: bool) {
        let mut handed = lock(&self.handed);
        let (done, running): (Vec<_>, Vec<_>) =
            std::mem::take(&mut *handed).into_iter().partition(|h| h.thread.is_finished() || (answered && h.answered));
        *handed = running;
        drop(handed);
        for h in done {
            drop(h.thread.join());
        }
    }
}

impl Drop for WarmPool {
    fn drop(&mut self) {
        let pool = &self.pool;
        *lock(&pool.closed) = true;
        pool.wake.notify_all();
        // Wait for a refill at work, then stop the retry thread.
        drop(lock(&pool.refilling));
        let retrier = lock(&pool.retrier).thread.take();
        if let Some(thread) = retrier {
            drop(thread.join());
        }
        let idle = std::mem::take(&mut *lock(&pool.idle));
        for warm in idle {
            warm.retire();
        }
        pool.join_handed(true);
    }
}

/// Lets the caller this thread just answered run before the thread frees
/// its instance, and leaves that freeing (~0.7 ms of resetting memory for
/// CPython) to spare CPU time. Measured through `execbox serve` on 2 CPUs:
/// the woken caller otherwise waited up to ~0.7 ms for this thread's CPU.
/// The thread ends right after, so it never needs its priority back (which
/// would take a privilege).
fn step_aside() {
    let _ = lower_this_thread_by(BACKGROUND_NICE_STEP);
    std::thread::yield_now();
}

/// How much an instance's thread lowers its priority (raises its nice
/// value) for its background work: starting, and freeing after its answer.
const BACKGROUND_NICE_STEP: i32 = 10;

/// Raises the calling thread's nice value by `step` (at most to 19); its
/// id and nice value before, if it could.
fn lower_this_thread_by(step: i32) -> Option<(rustix::process::Pid, i32)> {
    let tid = rustix::thread::gettid();
    let nice = rustix::process::getpriority_process(Some(tid)).ok()?;
    rustix::process::setpriority_process(Some(tid), (nice + step).min(19)).ok()?;
    Some((tid, nice))
}

/// The priority of an instance's thread while it starts. CPython's start
/// takes ~100 ms of CPU; at normal priority a caller's threads woken
/// meanwhile (the server's answer path, the next run) waited up to a
/// scheduler slice (1.5–3 ms measured on 2 CPUs) for its CPU. Lowered only
/// where this process may raise it back (root, `CAP_SYS_NICE`, or an
/// `RLIMIT_NICE` that allows it; probed once): a run never executes at a
/// lowered priority.
#[derive(Default)]
pub(crate) struct StartPriority(Mutex<Priority>);

#[derive(Default)]
enum Priority {
    /// Not lowered (yet, or at all).
    #[default]
    Normal,
    /// Lowered: the thread and its nice value before.
    Lowered { tid: rustix::process::Pid, nice: i32 },
    /// Restored for a run, or its thread ended: never touched again.
    Restored,
}

/// Marks its [`StartPriority`] done when dropped (as its thread ends).
struct PriorityEnd(Arc<StartPriority>);

impl Drop for PriorityEnd {
    fn drop(&mut self) {
        *self.0.0.lock() = Priority::Restored;
    }
}

impl StartPriority {
    /// Lowers the calling thread's priority, unless the instance already
    /// got its code or the priority could not be raised back.
    fn lower_this_thread(&self) {
        let mut state = self.0.lock();
        if !matches!(*state, Priority::Normal) || !may_raise_priority() {
            return;
        }
        if let Some((tid, nice)) = lower_this_thread_by(BACKGROUND_NICE_STEP) {
            *state = Priority::Lowered { tid, nice };
        }
    }

    /// Gives the instance's thread its priority back (before its code runs).
    pub fn restore(&self) {
        let mut state = self.0.lock();
        if let Priority::Lowered { tid, nice } = *state
            && let Err(e) = rustix::process::setpriority_process(Some(tid), nice)
        {
            tracing::warn!(error = %e, "cannot restore a warm instance's priority: its run goes at a lower one");
        }
        *state = Priority::Restored;
    }
}

/// Whether a thread of this process may raise its priority back after
/// lowering it (probed once, on a thread of its own).
fn may_raise_priority() -> bool {
    static MAY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *MAY.get_or_init(|| {
        let probe = std::thread::Builder::new().name("execbox-nice-probe".into()).spawn(|| {
            matches!(lower_this_thread_by(1), Some((tid, nice))
                if nice < 19 && rustix::process::setpriority_process(Some(tid), nice).is_ok())
        });
        probe.ok().and_then(|t| t.join().ok()).unwrap_or(false)
    })
}

/// Tops the pool up when dropped (whatever path `run` returns by).
struct Refill(Arc<Pool>);

impl Drop for Refill {
    fn drop(&mut self) {
        self.0.top_up();
    }
}

fn stuck(backend: &str, deadline: &Deadline) -> ExecResult {
    let mut result = ExecResult::new(backend, Outcome::TimedOut);
    result.message = Some(deadline.exceeded_message());
    result.usage.duration = deadline.elapsed();
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nice_of_this_thread() -> i32 {
        rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap()
    }

    /// Runs `lower` on a thread of its own, then `between` on this one,
    /// and returns that thread's nice value before, after `lower`, and
    /// after `between`.
    fn on_a_thread(priority: Arc<StartPriority>, between: impl FnOnce()) -> (i32, i32, i32) {
        let (lowered_tx, lowered_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let before = nice_of_this_thread();
            priority.lower_this_thread();
            lowered_tx.send(nice_of_this_thread()).unwrap();
            go_rx.recv().unwrap();
            (before, nice_of_this_thread())
        });
        let lowered = lowered_rx.recv().unwrap();
        between();
        go_tx.send(()).unwrap();
        let (before, after) = thread.join().unwrap();
        (before, lowered, after)
    }

    #[test]
    fn a_starting_instance_runs_lowered_and_gets_its_priority_back_before_its_code() {
        let priority = Arc::new(StartPriority::default());
        let restorer = priority.clone();
        let (before, lowered, after) = on_a_thread(priority, move || restorer.restore());
        if may_raise_priority() {
            assert_eq!(lowered, (before + BACKGROUND_NICE_STEP).min(19));
        } else {
            assert_eq!(lowered, before, "lowered where it could not be raised back");
        }
        assert_eq!(after, before);
    }

    #[test]
    fn a_thread_that_ended_lowered_is_never_named_by_a_restore() {
        let priority = Arc::new(StartPriority::default());
        let thread_priority = priority.clone();
        std::thread::spawn(move || {
            thread_priority.lower_this_thread();
            let _ended = PriorityEnd(thread_priority);
        })
        .join()
        .unwrap();
        assert!(matches!(*priority.0.lock(), Priority::Restored));
        priority.restore();
    }

    #[test]
    fn an_instance_given_its_code_before_it_lowered_itself_stays_at_its_priority() {
        let priority = Arc::new(StartPriority::default());
        priority.restore();
        let (before, lowered, after) = on_a_thread(priority, || {});
        assert_eq!((lowered, after), (before, before));
    }
}
