//! Starting a warm pool's instances, and the refill thread that keeps the
//! pool full: a replacement starts after each run has answered, a failed
//! start backs off (see the parent module's docs).

use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime_wasi::FsPerms;

use super::{Backoff, Pool, Refiller, SessionSetup, StartError, Warm, lock};
use crate::backends::wasm::guest::{Preopen, RunControls};
use crate::backends::wasm::priority::{PriorityEnd, StartPriority, step_aside};
use crate::backends::wasm::run::{self, Stdio, StoreSetup};
use crate::backends::wasm::stdio::{CappedPipe, MessageStdin};
use crate::limits::deadline::Deadline;

/// First wait before starting instances again after a failed start (no
/// temporary directory, no thread, no free slot); doubled per failure in a
/// row, up to [`BACKOFF_MAX`].
const BACKOFF_START: Duration = Duration::from_millis(100);

const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// How long the refill thread waits for work before it ends (the next run
/// starts it again): longer than an agent's usual pause between turns.
const REFILL_LINGER: Duration = Duration::from_secs(30);

/// How long the refill thread lets a run's answer travel before it starts
/// the replacement: started at once, its ~0.15 ms of work competed (on a
/// small machine) with the threads carrying the answer to the caller.
const REFILL_DELAY: Duration = Duration::from_millis(2);

impl Pool {
    /// Starts instances on the calling thread until the pool is full (the
    /// first fill, so that a backend warmed up has its instances listed);
    /// a pool left short is the refill thread's from then on.
    pub(super) fn fill_now(self: &Arc<Self>) {
        if let Some(_refilling) = self.refilling.try_lock() {
            self.start_instances();
        }
        if lock(&self.idle).len() < self.size {
            self.refill_soon();
        }
    }

    /// Has the refill thread top the pool up, starting the thread unless it
    /// runs. Called after each run has answered (never during one), by the
    /// caller after a fresh run, and when a session takes an instance: the
    /// caller pays a notify, not the ~0.15 ms of starting an instance's
    /// thread and its `/work`.
    pub(super) fn refill_soon(self: &Arc<Self>) {
        let mut control = lock(&self.control);
        if control.closed {
            return;
        }
        control.wanted = true;
        self.wake.notify_all();
        // Under `control`: a thread that has not yet decided to end will see
        // `wanted`, and one that has is marked not running by now.
        let mut refiller = lock(&self.refiller);
        if refiller.running {
            return;
        }
        if let Some(ended) = refiller.thread.take() {
            drop(ended.join());
        }
        let pool = self.clone();
        let spawned = std::thread::Builder::new()
            .name("execbox-warm-refill".into())
            .stack_size(256 << 10)
            .spawn(move || pool.refill_loop());
        match spawned {
            Ok(thread) => *refiller = Refiller { running: true, thread: Some(thread) },
            // The next run that ends tries again.
            Err(e) => tracing::debug!(error = %e, "cannot start the warm pool's refill thread"),
        }
    }

    /// The refill thread: joins ended instance threads and starts missing
    /// instances whenever asked, and while the pool is short each time the
    /// backoff passes; ends when the pool closes or after [`REFILL_LINGER`]
    /// with nothing to do.
    pub(super) fn refill_loop(self: Arc<Self>) {
        while self.next_refill() {
            self.pause(REFILL_DELAY);
            match self.refilling.try_lock() {
                Some(_refilling) => self.start_instances(),
                // The first fill is at work: look again after a pause.
                None => lock(&self.backoff).retry_at = Some(Instant::now() + BACKOFF_START),
            }
            lock(&self.control).listing = false;
            self.join_handed(false);
        }
    }

    /// Sleeps for `pause`, or until the pool closes.
    pub(super) fn pause(&self, pause: Duration) {
        let until = Instant::now() + pause;
        let mut control = lock(&self.control);
        while !control.closed && !self.wake.wait_until(&mut control, until).timed_out() {}
    }

    /// Waits for refill work that is due: asked for, or a short pool whose
    /// backoff has passed. False (the thread ends, marked not running) once
    /// the pool closes, or after [`REFILL_LINGER`] with nothing to do.
    pub(super) fn next_refill(&self) -> bool {
        let mut control = lock(&self.control);
        let idle_until = Instant::now() + REFILL_LINGER;
        while !control.closed {
            // Short alone is no reason to start one: the pool's instance
            // may be running a request (its replacement starts once it has
            // answered). Short after a failed start is.
            let short = lock(&self.idle).len() < self.size;
            let retry_at = lock(&self.backoff).retry_at.filter(|_| short);
            let work = match retry_at {
                Some(at) if at > Instant::now() => {
                    self.wake.wait_until(&mut control, at);
                    continue;
                }
                Some(_) => true,
                None => control.wanted,
            };
            if work {
                control.wanted = false;
                control.listing = true;
                return true;
            }
            if self.wake.wait_until(&mut control, idle_until).timed_out() && !control.wanted {
                break;
            }
        }
        lock(&self.refiller).running = false;
        false
    }

    /// Starts the instances the pool misses now (not more: one listed and
    /// taken at once is a run's, whose replacement waits for its answer),
    /// until a start fails (backoff) or finds no slot (retry soon). The
    /// caller holds `refilling`.
    pub(super) fn start_instances(&self) {
        let missing = self.size.saturating_sub(lock(&self.idle).len());
        if missing == 0 {
            // Full: nothing to retry (the failure count stays).
            lock(&self.backoff).retry_at = None;
        }
        for _ in 0..missing {
            if lock(&self.control).closed {
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
    pub(super) fn note_failure(&self, why: &str) {
        let mut backoff = lock(&self.backoff);
        backoff.failures = backoff.failures.saturating_add(1);
        let delay = crate::limits::backoff::after_failures(backoff.failures, BACKOFF_START, BACKOFF_MAX);
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
    pub(super) fn start_one(&self, keep_free: usize, setup: SessionSetup) -> Result<Warm, StartError> {
        // Never waits, and (for the pool) leaves as many slots free as the
        // pool holds: with slots scarce, requests need them more.
        let slot = self.engine.try_acquire_slot(keep_free).ok_or(StartError::NoSlot)?;
        let work =
            crate::owner::temp_dir("warm").map_err(|e| StartError::Failed(format!("no temporary directory: {e}")))?;
        let work_path = work.path().to_path_buf();
        let (stdin, code) = MessageStdin::new(Some(self.started.clone()));
        let code = Arc::new(code);
        let ended = stdin.end_guard();
        let ceiling = usize::try_from(self.engine.config().max_memory_bytes).unwrap_or(usize::MAX);
        let controls = RunControls::new(Deadline::start(None), ceiling);
        let stdio = Stdio { stdout: CappedPipe::new(Some(0)), stderr: CappedPipe::new(Some(0)) };
        let (done_tx, done) = oneshot::channel();
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
                            drop(done_tx.send(Err(e)));
                            return;
                        }
                    };
                run::stop_at_armed_deadline(&mut store);
                let verdict = match run::instantiate(backend, &compiled, &mut store) {
                    Ok(Ok(instance)) => run::call_start(&mut store, instance),
                    Ok(Err(err)) => Err(err),
                    Err(e) => {
                        drop(done_tx.send(Err(e)));
                        return;
                    }
                };
                // Answer first: freeing the instance (resetting its memory
                // slot) is not the caller's wait. (On the early returns above,
                // `ended` goes when the thread ends, after its answer.)
                drop(done_tx.send(Ok(run::finish(&engine, backend, &mut store, verdict, &thread_stdio, None))));
                drop(ended);
                step_aside();
                drop(store);
            })
            .map_err(|e| StartError::Failed(format!("cannot spawn a thread: {e}")))?;
        Ok(Warm { code, controls, stdio, work: work_path, done, thread, priority })
    }
}
