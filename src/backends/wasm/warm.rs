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
//! run down), started by the pool's refill thread a moment later, so the
//! caller gets its result without waiting for that start. An instance gets its request's deadline, memory cap and output caps
//! when the code arrives ([`RunControls::arm`]); requests that need what is
//! fixed at start-up (arguments, environment, granted directories, a fuel
//! budget, or a memory cap below what an instance's start-up uses, as seen
//! of the pool's started instances) run fresh instead, leaving the pool's
//! instances to the next run.
//!
//! Each instance holds one of the engine's instance slots while it waits, and
//! takes one only if it is free at once and as many as the pool's size stay
//! free (warm instances never queue for a slot ahead of requests, nor take
//! the last ones). A start that fails — no temporary directory, no
//! thread, an instance that dies during start-up — does not shrink the pool
//! for good: the refill thread tries again after a backoff of 100 ms,
//! doubling per failure in a row up to 10 s; a start that found every slot
//! busy is retried after 100 ms without growing the backoff. Meanwhile
//! requests run on fresh instances. The refill thread ends after 30 s
//! with nothing to do, and the next run starts it again.
//!
//! A blocking caller waits for its instance's answer on its own thread; an
//! async one ([`WarmPool::run_async`]) awaits it on its task, woken by the
//! instance's thread, with no thread of tokio's blocking pool in between.

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::RecvTimeoutError;
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::engine::WasmEngine;
use super::guest::{Compiled, Preopen, RunControls};
use super::priority::StartPriority;
use super::run::Stdio;
use super::staging::write_staged;
use super::stdio::{MessageSender, WaitSignal};
use super::ticker::Alarm;
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

/// How long a blocking run that found the pool empty waits for the refill
/// thread to list an instance it is starting, before it runs fresh.
const LISTING_WAIT: Duration = Duration::from_millis(10);

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
    pub done: oneshot::Receiver<Result<ExecResult, ExecError>>,
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
    /// What the refill thread waits for, on `wake`.
    control: Mutex<Control>,
    wake: Condvar,
    /// The refill thread, while it runs.
    refiller: Mutex<Refiller>,
    /// Notified each time one of the pool's instances blocks for its code
    /// (done starting).
    started: Arc<WaitSignal>,
    /// The most memory an instance was seen to have used by the end of its
    /// start-up (0 until one was seen): a run capped below it runs fresh.
    startup_peak: AtomicUsize,
}

/// Work for the refill thread.
#[derive(Default)]
struct Control {
    /// The pool was dropped.
    closed: bool,
    /// Set after each run (and each instance a session took): top the pool up.
    wanted: bool,
    /// The refill thread took that work and is starting instances.
    listing: bool,
}

#[derive(Default)]
struct Refiller {
    /// Set by whoever starts the thread, cleared by the thread as it ends
    /// (under `control` and this mutex both, so a refill asked for is never
    /// left without a thread).
    running: bool,
    thread: Option<JoinHandle<()>>,
}

mod refill;

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
            control: Mutex::new(Control::default()),
            wake: Condvar::new(),
            refiller: Mutex::new(Refiller::default()),
            started: Arc::new(WaitSignal::default()),
            startup_peak: AtomicUsize::new(0),
        });
        pool.fill_now();
        Self { pool }
    }

    /// Whether a warm instance can honour `request` exactly.
    pub fn fits(request: &ExecRequest) -> bool {
        request.args.is_empty()
            && request.env.is_empty()
            && !matches!(request.policy.filesystem, Access::Allow(_))
            && request.policy.fuel.is_none()
            && request.workspace.is_none()
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
        finished_now(self.pool.backend, self.pool.run(code, input_json, request, deadline, tools, Waiting::Blocking))
    }

    /// [`WarmPool::run`] for an async caller: the task awaits the
    /// instance's answer, with no thread between them. The preparation
    /// before the code is sent (writing `input.json` into the instance's
    /// `/work`) runs on the task. Dropping the future ends the run at once.
    pub async fn run_async(
        &self,
        code: &str,
        input_json: Option<&[u8]>,
        request: &ExecRequest,
        deadline: Deadline,
        tools: Option<&Arc<ToolBridge>>,
    ) -> Option<Result<ExecResult, ExecError>> {
        self.pool.run(code, input_json, request, deadline, tools, Waiting::Async).await
    }

    /// Has the pool topped up off the caller's path (see [`Pool::refill_soon`]).
    pub fn top_up(&self) {
        self.pool.refill_soon();
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
        self.pool.refill_soon();
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

    /// Runs `code` on an idle instance (see [`WarmPool::run`]), waiting for
    /// its answer as `waiting` says.
    async fn run(
        self: &Arc<Self>,
        code: &str,
        input_json: Option<&[u8]>,
        request: &ExecRequest,
        deadline: Deadline,
        tools: Option<&Arc<ToolBridge>>,
        waiting: Waiting,
    ) -> Option<Result<ExecResult, ExecError>> {
        let policy = &request.policy;
        let memory_cap = self.engine.memory_cap(policy);
        if self.startup_peak.load(Ordering::Relaxed) > memory_cap {
            // No instance of this pool can honour the cap: leave them all.
            return None;
        }
        let warm = loop {
            let warm = self.take_idle(waiting)?;
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
        // Done starting, an instance has used what every start-up uses; one
        // still starting (just listed) has not yet, and is judged by those
        // seen before it.
        if warm.code.waits() > 0 {
            self.startup_peak.fetch_max(warm.controls.peak(), Ordering::Relaxed);
        }
        if warm.controls.peak().max(self.startup_peak.load(Ordering::Relaxed)) > memory_cap {
            // Untouched: it stays for a run it can serve.
            lock(&self.idle).push_front(warm);
            return None;
        }
        // The replacement starts once this run has answered: started now, its
        // start-up would compete with this run for the CPU.
        let _refill = Refill(self.clone());
        if let Err(e) = write_staged(&warm.work, request, input_json.map(|j| ("input.json", j))) {
            self.discard(warm);
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
        let mut flight = InFlight {
            pool: self,
            code: warm.code,
            controls: warm.controls,
            thread: Some(warm.thread),
            channel,
            answered: false,
        };
        let done = &mut waiting.receive(warm.done);
        let result = match (deadline.remaining(), flight.channel.is_some()) {
            // Without tools the code is all it gets: a read of stdin after it
            // is end-of-file, never a wait the deadline cannot interrupt.
            (Some(left), false) => {
                flight.code.close();
                done.within(self, Some(left + REPORT_GRACE)).await
            }
            // With tools stdin stays open for the answers until the deadline;
            // then a guest blocked reading it reads end-of-file and stops.
            (Some(left), true) => match done.within(self, Some(left)).await {
                Err(RecvTimeoutError::Timeout) => {
                    flight.controls.expire_now();
                    flight.code.close();
                    let mut late = done.within(self, Some(REPORT_GRACE)).await;
                    if let Ok(Ok(result)) = &mut late {
                        cut_off_at_deadline(result, &deadline);
                    }
                    late
                }
                answered => answered,
            },
            (None, calls_tools) => {
                if !calls_tools {
                    flight.code.close();
                }
                done.within(self, None).await
            }
        };
        flight.answered = result.is_ok();
        drop(flight);
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

    /// The next idle instance. When none is listed but the refill thread
    /// is about to list one (a run just answered), a blocking caller waits
    /// for it up to [`LISTING_WAIT`]: the replacement started first, so it
    /// is ready sooner than a fresh instance would be. An async caller
    /// never waits here (its fallback, on the blocking pool, does).
    fn take_idle(&self, waiting: Waiting) -> Option<Warm> {
        if matches!(waiting, Waiting::Async) {
            return lock(&self.idle).pop_front();
        }
        // Read before looking: the refill thread lists its instance before
        // it clears `listing`.
        let refilling = {
            let control = lock(&self.control);
            control.wanted || control.listing
        };
        if let Some(warm) = lock(&self.idle).pop_front() {
            return Some(warm);
        }
        let listing = refilling && lock(&self.backoff).retry_at.is_none_or(|at| at <= Instant::now());
        if !listing {
            return None;
        }
        self.started.wait_for(LISTING_WAIT, || !lock(&self.idle).is_empty());
        lock(&self.idle).pop_front()
    }

    /// Ends an instance that will not run this request, without waiting
    /// for its thread (it may still be starting): with its stdin closed it
    /// runs nothing and exits, and is joined once it has.
    fn discard(&self, warm: Warm) {
        warm.code.close();
        self.hand_off(warm.thread, true);
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
        lock(&pool.control).closed = true;
        pool.wake.notify_all();
        // Wait for a refill at work, then stop the refill thread.
        drop(lock(&pool.refilling));
        let refiller = lock(&pool.refiller).thread.take();
        if let Some(thread) = refiller {
            drop(thread.join());
        }
        let idle = std::mem::take(&mut *lock(&pool.idle));
        for warm in idle {
            warm.retire();
        }
        pool.join_handed(true);
    }
}

/// How a caller waits for its instance's answer.
#[derive(Clone, Copy)]
enum Waiting {
    /// Blocking this thread: the future of [`Pool::run`] never pends, and
    /// one poll finishes it ([`finished_now`]).
    Blocking,
    /// Awaiting it: the instance's thread wakes the task, and the limit is
    /// an [`Alarm`] of the engine's ticker (which ticks while the run is
    /// active), so no runtime driver is needed.
    Async,
}

impl Waiting {
    /// The instance's answer, to be waited for this way.
    fn receive<T>(self, done: oneshot::Receiver<T>) -> Done<T> {
        match self {
            Waiting::Blocking => Done::Blocking(done),
            Waiting::Async => Done::Async(done.into_future()),
        }
    }
}

/// An instance's answer as a run waits for it (one value, sent by the
/// instance's thread; the sender dropped without one is `Disconnected`).
enum Done<T> {
    Blocking(oneshot::Receiver<T>),
    /// Woken by the send itself: no runtime driver is needed.
    Async(oneshot::AsyncReceiver<T>),
}

impl<T> Done<T> {
    /// The answer, waited for at most `limit` (`None`: no limit).
    async fn within(&mut self, pool: &Pool, limit: Option<Duration>) -> Result<T, RecvTimeoutError> {
        match self {
            Done::Blocking(done) => match limit {
                Some(limit) => done.recv_timeout(limit).map_err(|e| match e {
                    oneshot::RecvTimeoutError::Timeout => RecvTimeoutError::Timeout,
                    oneshot::RecvTimeoutError::Disconnected => RecvTimeoutError::Disconnected,
                }),
                None => done.recv_ref().map_err(|_| RecvTimeoutError::Disconnected),
            },
            Done::Async(done) => {
                let until = limit.and_then(|limit| Instant::now().checked_add(limit));
                let mut alarm = until.map(|until| Alarm::at(pool.engine.ticker().alarms(), until));
                poll_fn(|cx| {
                    if let Poll::Ready(answer) = Pin::new(&mut *done).poll(cx) {
                        return Poll::Ready(answer.map_err(|_| RecvTimeoutError::Disconnected));
                    }
                    match alarm.as_mut().map(|alarm| Pin::new(alarm).poll(cx)) {
                        Some(Poll::Ready(())) => Poll::Ready(Err(RecvTimeoutError::Timeout)),
                        _ => Poll::Pending,
                    }
                })
                .await
            }
        }
    }
}

/// The result of [`Pool::run`] for a blocking caller: its waits block the
/// thread and never leave the future pending, so one poll finishes it.
fn finished_now(
    backend: &str,
    run: impl Future<Output = Option<Result<ExecResult, ExecError>>>,
) -> Option<Result<ExecResult, ExecError>> {
    let mut run = std::pin::pin!(run);
    match run.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(result) => result,
        Poll::Pending => Some(Err(ExecError::internal(backend, "a blocking wait for a warm instance pended"))),
    }
}

/// An instance that has its code, until [`Pool::run`] has its answer or
/// stops waiting. Dropped unanswered (an async caller dropped the run's
/// future), it ends the run at once: the guest stops at the next epoch
/// tick, as a cached `wasm` module on the task does.
struct InFlight<'a> {
    pool: &'a Arc<Pool>,
    code: Arc<MessageSender>,
    controls: Arc<RunControls>,
    thread: Option<JoinHandle<()>>,
    channel: Option<Arc<ToolChannel>>,
    answered: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.controls.expire_now();
        }
        if let Some(channel) = &self.channel {
            channel.end();
        }
        self.code.close();
        if let Some(thread) = self.thread.take() {
            self.pool.hand_off(thread, self.answered);
        }
    }
}

/// Has the pool topped up when dropped (whatever path `run` returns by).
struct Refill(Arc<Pool>);

impl Drop for Refill {
    fn drop(&mut self) {
        self.0.refill_soon();
    }
}

fn stuck(backend: &str, deadline: &Deadline) -> ExecResult {
    let mut result = ExecResult::new(backend, Outcome::TimedOut);
    result.message = Some(deadline.exceeded_message());
    result.usage.duration = deadline.elapsed();
    result
}
