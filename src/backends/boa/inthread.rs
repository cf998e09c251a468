//! `boa-js-inthread`: boa on threads of the host process, for trusted code
//! that needs the last microseconds. Not a sandbox against hostile code: a
//! native stack overflow or allocation failure inside boa aborts the host,
//! and there is no memory cap (see docs/threat-model.md). Registered
//! only explicitly; the default executor uses the contained
//! [`BoaJs`](crate::backends::BoaJs).
//!
//! Each worker thread builds a context *before* it registers as idle, so a
//! request normally pays only for its own code. After a job the dirty
//! context is dropped and collected, a new one is built, and the thread
//! re-registers if fewer than `idle_workers` are idle (otherwise it exits).
//! When no thread is idle, the request starts a new one. Dropping the
//! backend drops the idle list, which ends idle threads; busy threads end
//! after their job.

use parking_lot::Mutex;
use std::panic::AssertUnwindSafe;
use std::rc::Rc;
use std::sync::atomic::AtomicUsize;
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Weak};

use crate::admission::Admitted;
use crate::backend::Backend;
use crate::backends::boa::capabilities;
use crate::backends::boa::config::BoaJsConfig;
use crate::backends::boa::engine::{Job, Mode, Prepared, RunReport};
use crate::backends::boa::gauge::{LiveCount, WorkerGauge};
use crate::backends::boa::job::job;
use crate::backends::boa::port::{BridgePort, ToolPort};
use crate::backends::boa::realm::console::{SharedStreams, Streams};
use crate::capabilities::BackendCapabilities;
use crate::error::{ConfigError, ExecError};
use crate::limits::deadline::Deadline;
use crate::limits::output::BoundedBuffer;
use crate::policy::SandboxPolicy;
use crate::result::{ExecResult, Outcome};
use crate::tools::ToolBridge;

/// JavaScript on boa in host threads (`boa-js-inthread`): for trusted code
/// only (see [`crate::backends::boa`]). Cheap to clone (clones share the
/// threads); idle threads end when the last clone drops.
#[derive(Clone)]
pub struct BoaJsInThread {
    pool: Arc<Pool>,
    caps: Arc<BackendCapabilities>,
}

/// With [`BoaJsConfig::default`], which is always valid.
impl Default for BoaJsInThread {
    fn default() -> Self {
        Self::start(BoaJsConfig::default())
    }
}

impl std::fmt::Debug for BoaJsInThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoaJsInThread").field("config", &self.pool.cfg).finish_non_exhaustive()
    }
}

impl BoaJsInThread {
    /// The backend's name.
    pub const NAME: &'static str = "boa-js-inthread";

    /// Starts the backend: [`BoaJsConfig::idle_workers`] threads build
    /// their contexts in the background. Errors: [`ConfigError::Invalid`]
    /// for a setting no run could work with (see [`BoaJsConfig`]).
    pub fn new(config: BoaJsConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self::start(config))
    }

    fn start(config: BoaJsConfig) -> Self {
        let caps = Arc::new(capabilities::inthread(&config));
        Self { pool: Pool::start(config), caps }
    }

    /// Counts this backend's live threads without keeping the backend alive.
    pub fn worker_gauge(&self) -> WorkerGauge {
        WorkerGauge::new(&self.pool.live)
    }
}

impl Backend for BoaJsInThread {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn capabilities(&self) -> &BackendCapabilities {
        &self.caps
    }

    fn execute(&self, call: Admitted) -> Result<ExecResult, ExecError> {
        let deadline = call.deadline();
        let tools = call.tools().cloned();
        let job = job(&self.pool.cfg, call, Mode::FunctionBody, true)?;
        self.pool.run(job, deadline, tools)
    }
}

type Reply = Result<ExecResult, ExecError>;

/// A job with everything the thread needs to answer it.
struct Assignment {
    job: Job,
    deadline: Deadline,
    streams: Arc<Mutex<Streams>>,
    reply: SyncSender<Reply>,
    /// The run's tool bridge, when it grants tools: the thread calls it directly.
    tools: Option<Arc<ToolBridge>>,
}

/// An idle thread: send it one assignment.
struct IdleWorker {
    inbox: SyncSender<Assignment>,
    budget: u64,
}

struct Pool {
    cfg: BoaJsConfig,
    idle: Mutex<Vec<IdleWorker>>,
    live: Arc<AtomicUsize>,
    me: Weak<Pool>,
}

impl Pool {
    fn start(cfg: BoaJsConfig) -> Arc<Self> {
        let pool = Arc::new_cyclic(|me| Pool {
            cfg,
            idle: Mutex::new(Vec::new()),
            live: Arc::new(AtomicUsize::new(0)),
            me: me.clone(),
        });
        // Prewarm for the default policy's budget, the common case.
        let budget = pool.cfg.backstop_budget(SandboxPolicy::default().timeout_ms);
        for _ in 0..pool.cfg.idle_workers {
            // A failed prewarm spawn is retried on demand by `run`.
            let _ = pool.spawn(budget, None);
        }
        pool
    }

    /// Runs one job; returns by the deadline (plus grace) whatever the code does.
    fn run(&self, job: Job, deadline: Deadline, tools: Option<Arc<ToolBridge>>) -> Reply {
        let budget = job.budget;
        let streams = Arc::new(Mutex::new(Streams {
            stdout: BoundedBuffer::new(job.max_stdout),
            stderr: BoundedBuffer::new(job.max_stderr),
        }));
        let (reply, answer) = mpsc::sync_channel(1);
        self.dispatch(Assignment { job, deadline, streams: streams.clone(), reply, tools }, budget)?;
        let outcome = match deadline.remaining() {
            Some(left) => answer.recv_timeout(left + self.cfg.deadline_grace),
            None => answer.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match outcome {
            Ok(reply) => reply,
            Err(RecvTimeoutError::Timeout) => Ok(abandoned(&deadline, &streams)),
            Err(RecvTimeoutError::Disconnected) => Err(internal("worker ended without a result")),
        }
    }

    fn dispatch(&self, mut assignment: Assignment, budget: u64) -> Result<(), ExecError> {
        loop {
            let worker = {
                let mut idle = self.idle.lock();
                // Prefer a thread whose context already has this budget.
                let pos = idle.iter().rposition(|w| w.budget == budget).or(idle.len().checked_sub(1));
                pos.map(|i| idle.swap_remove(i))
            };
            let Some(worker) = worker else {
                return self.spawn(budget, Some(assignment));
            };
            match worker.inbox.send(assignment) {
                Ok(()) => return Ok(()),
                // That thread has gone; try the next one.
                Err(mpsc::SendError(back)) => assignment = back,
            }
        }
    }

    fn spawn(&self, budget: u64, first: Option<Assignment>) -> Result<(), ExecError> {
        let me = self.me.clone();
        let cfg = self.cfg.clone();
        let live = LiveCount::new(&self.live);
        std::thread::Builder::new()
            .name("execbox-js".into())
            .stack_size(self.cfg.thread_stack_bytes)
            .spawn(move || {
                let _live = live;
                worker_main(me, cfg, budget, first);
            })
            .map(drop)
            .map_err(|e| internal(&format!("cannot start a JS worker thread: {e}")))
    }

    /// Registers an idle thread; false if enough are idle already.
    fn park(&self, worker: IdleWorker) -> bool {
        let mut idle = self.idle.lock();
        if idle.len() >= self.cfg.idle_workers {
            return false;
        }
        idle.push(worker);
        true
    }
}

/// Runs one assignment on a context, catching an engine panic.
fn answer(prepared: &mut Prepared, assignment: Assignment) {
    let Assignment { job, deadline, streams, reply, tools } = assignment;
    let console = Rc::new(SharedStreams(streams.clone()));
    let port = tools.map(|bridge| Rc::new(BridgePort::new(bridge)) as Rc<dyn ToolPort>);
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| prepared.run(job, &deadline, console, port)))
        .map(|report| assemble(report, &deadline, &streams))
        .map_err(|panic| internal(&format!("the JS engine panicked: {}", panic_text(&panic))));
    // The caller may have stopped waiting (deadline): that is fine.
    let _ = reply.send(result);
}

/// The result of a finished run: its report and what it printed.
fn assemble(report: RunReport, deadline: &Deadline, streams: &Arc<Mutex<Streams>>) -> ExecResult {
    let mut result = ExecResult::new(BoaJsInThread::NAME, report.outcome);
    {
        let s = streams.lock();
        result.stdout = s.stdout.snapshot();
        result.stderr = s.stderr.snapshot();
    }
    result.message = report.message;
    result.output_truncated = report.output_truncated;
    result.usage.instructions = Some(report.instructions);
    result.usage.duration = deadline.elapsed();
    if let Some(text) = report.output {
        match serde_json::from_str(&text) {
            Ok(value) => result.output = Some(value),
            Err(e) => {
                result.outcome = Outcome::Failed;
                result.message = Some(format!("the returned value is not usable JSON: {e}"));
            }
        }
    }
    result
}

fn worker_main(pool: Weak<Pool>, cfg: BoaJsConfig, mut budget: u64, mut next: Option<Assignment>) {
    let settings = cfg.engine();
    loop {
        let prepared = match Prepared::new(budget, &settings) {
            Ok(p) => p,
            Err(err) => {
                if let Some(a) = next {
                    let _ = a.reply.send(Err(internal(&format!("cannot build a JS context: {err}"))));
                }
                return;
            }
        };
        let assignment = match next.take() {
            Some(a) => a,
            None => {
                let (inbox, jobs) = mpsc::sync_channel(1);
                let Some(pool) = pool.upgrade() else { return };
                if !pool.park(IdleWorker { inbox, budget }) {
                    return;
                }
                drop(pool);
                match jobs.recv() {
                    Ok(a) => a,
                    Err(_) => return, // backend dropped
                }
            }
        };
        let job_budget = assignment.job.budget;
        // A context built for another budget is rebuilt (on the request path).
        let prepared = if prepared.budget == job_budget {
            Ok(prepared)
        } else {
            drop(prepared);
            Prepared::new(job_budget, &settings)
        };
        match prepared {
            Ok(mut prepared) => answer(&mut prepared, assignment),
            Err(err) => {
                let _ = assignment.reply.send(Err(internal(&format!("cannot build a JS context: {err}"))));
            }
        }
        boa_gc::force_collect();
        budget = job_budget;
        if pool.strong_count() == 0 {
            return;
        }
    }
}

/// The result for a caller that stopped waiting at the deadline while the
/// thread was inside native code; the thread is stopped by its budget.
fn abandoned(deadline: &Deadline, streams: &Arc<Mutex<Streams>>) -> ExecResult {
    let s = streams.lock();
    let mut result = ExecResult::new(BoaJsInThread::NAME, Outcome::TimedOut);
    result.stdout = s.stdout.snapshot();
    result.stderr = s.stderr.snapshot();
    result.message = Some(deadline.exceeded_message());
    result.usage.duration = deadline.elapsed();
    result
}

fn internal(message: &str) -> ExecError {
    ExecError::internal(BoaJsInThread::NAME, message)
}

fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}
