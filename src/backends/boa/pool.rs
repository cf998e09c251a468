//! Worker threads, each holding one fresh context ready for its next job.
//!
//! A worker builds a context *before* it registers as idle, so a request
//! normally pays only for its own code. After a job the dirty context is
//! dropped and collected, a new one is built, and the worker re-registers if
//! fewer than `idle_workers` are idle (otherwise it exits). When no worker is
//! idle, the request starts a new thread. Dropping the backend drops the idle
//! list, which disconnects idle workers and ends them; busy workers end after
//! their job.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, Weak};

use super::BoaJsConfig;
use super::engine::{Job, Prepared};
use super::realm::Streams;
use crate::SandboxPolicy;
use crate::error::ExecError;
use crate::limits::{BoundedBuffer, Deadline};
use crate::result::{ExecResult, Outcome, Usage};

type Reply = Result<ExecResult, ExecError>;

/// A job with everything the worker needs to answer it.
pub(super) struct Assignment {
    job: Job,
    deadline: Deadline,
    streams: Arc<Mutex<Streams>>,
    reply: SyncSender<Reply>,
}

/// An idle worker: send it one assignment.
struct IdleWorker {
    inbox: SyncSender<Assignment>,
    budget: u64,
}

pub(super) struct Pool {
    cfg: BoaJsConfig,
    idle: Mutex<Vec<IdleWorker>>,
    live: Arc<AtomicUsize>,
    me: Weak<Pool>,
}

impl Pool {
    pub fn start(cfg: BoaJsConfig) -> Arc<Self> {
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

    pub fn config(&self) -> &BoaJsConfig {
        &self.cfg
    }

    pub fn live_counter(&self) -> Arc<AtomicUsize> {
        self.live.clone()
    }

    /// Runs one job; returns by the deadline (plus grace) whatever the code does.
    pub fn run(&self, job: Job) -> Reply {
        let budget = job.budget;
        run_with(job, self.cfg.abandon_grace, |a| self.dispatch(a, budget)).map(|(result, _)| result)
    }

    fn dispatch(&self, mut assignment: Assignment, budget: u64) -> Result<(), ExecError> {
        loop {
            let worker = {
                let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
                // Prefer a worker whose context already has this budget.
                let pos = idle.iter().rposition(|w| w.budget == budget).or(idle.len().checked_sub(1));
                pos.map(|i| idle.swap_remove(i))
            };
            let Some(worker) = worker else {
                return self.spawn(budget, Some(assignment));
            };
            match worker.inbox.send(assignment) {
                Ok(()) => return Ok(()),
                // That worker has gone; try the next one.
                Err(mpsc::SendError(back)) => assignment = back,
            }
        }
    }

    fn spawn(&self, budget: u64, first: Option<Assignment>) -> Result<(), ExecError> {
        let me = self.me.clone();
        let cfg = self.cfg.clone();
        let live = LiveGuard::new(self.live.clone());
        std::thread::Builder::new()
            .name("execbox-js".into())
            .stack_size(self.cfg.worker_stack_bytes)
            .spawn(move || {
                let _live = live;
                worker_main(me, cfg, budget, first);
            })
            .map(drop)
            .map_err(|e| internal(&format!("cannot start a JS worker thread: {e}")))
    }

    /// Registers an idle worker; false if enough are idle already.
    fn park(&self, worker: IdleWorker) -> bool {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() >= self.cfg.idle_workers {
            return false;
        }
        idle.push(worker);
        true
    }
}

/// Hands `job` to a worker through `send` and waits for its result until the
/// deadline plus `grace`. The flag is true if the worker was abandoned (still
/// inside native code at the deadline; its budget stops it).
pub(super) fn run_with(
    job: Job,
    grace: std::time::Duration,
    send: impl FnOnce(Assignment) -> Result<(), ExecError>,
) -> Result<(ExecResult, bool), ExecError> {
    let deadline = Deadline::start(job.timeout);
    let streams = Arc::new(Mutex::new(Streams {
        stdout: BoundedBuffer::new(job.max_stdout),
        stderr: BoundedBuffer::new(job.max_stderr),
    }));
    let (reply, answer) = mpsc::sync_channel(1);
    send(Assignment { job, deadline, streams: streams.clone(), reply })?;
    let outcome = match deadline.remaining() {
        Some(left) => answer.recv_timeout(left + grace),
        None => answer.recv().map_err(|_| RecvTimeoutError::Disconnected),
    };
    match outcome {
        Ok(reply) => reply.map(|result| (result, false)),
        Err(RecvTimeoutError::Timeout) => Ok((abandoned(&deadline, &streams), true)),
        Err(RecvTimeoutError::Disconnected) => Err(internal("worker ended without a result")),
    }
}

/// Runs one assignment on a context, catching an engine panic.
pub(super) fn answer(prepared: &mut Prepared, assignment: Assignment, cfg: &BoaJsConfig) {
    let Assignment { job, deadline, streams, reply } = assignment;
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| prepared.run(job, &deadline, &streams, cfg)))
        .map_err(|panic| internal(&format!("the JS engine panicked: {}", panic_text(&panic))));
    // The caller may have stopped waiting (deadline): that is fine.
    let _ = reply.send(result);
}

fn worker_main(pool: Weak<Pool>, cfg: BoaJsConfig, mut budget: u64, mut next: Option<Assignment>) {
    loop {
        let prepared = match Prepared::new(budget, &cfg) {
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
            Prepared::new(job_budget, &cfg)
        };
        match prepared {
            Ok(mut prepared) => answer(&mut prepared, assignment, &cfg),
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
/// worker was inside native code; the worker is stopped by its budget.
fn abandoned(deadline: &Deadline, streams: &Arc<Mutex<Streams>>) -> ExecResult {
    let s = streams.lock().unwrap_or_else(|p| p.into_inner());
    ExecResult {
        backend: super::BoaJs::NAME.to_string(),
        outcome: Outcome::TimedOut,
        exit_code: None,
        stdout: s.stdout.snapshot(),
        stderr: s.stderr.snapshot(),
        output: None,
        output_truncated: false,
        message: Some(deadline.exceeded_message()),
        output_files: Vec::new(),
        failure_kind: None,
        diagnostics: Vec::new(),
        usage: Usage { duration: deadline.elapsed(), ..Usage::default() },
    }
}

pub(super) fn internal(message: &str) -> ExecError {
    ExecError::internal(super::BoaJs::NAME, message)
}

fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}

/// Counts a worker thread for as long as it lives.
struct LiveGuard(Arc<AtomicUsize>);

impl LiveGuard {
    fn new(live: Arc<AtomicUsize>) -> Self {
        live.fetch_add(1, Ordering::SeqCst);
        Self(live)
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
