//! [`EpochTicker`]: one background thread per backend that advances the
//! engine's epoch while guests run, so a wall-clock deadline preempts wasm
//! code at the next loop back-edge or function entry.
//!
//! The thread ticks only while runs are active and for `linger` after the
//! last one ends (so back-to-back calls never pay a wake-up), then parks.
//! Dropping the ticker stops and joins the thread.
//!
//! Ticks follow the real clock, not the number of sleeps: a sleep may last
//! far longer than a tick (a loaded machine, a descheduled thread), so each
//! wake-up advances the epoch by as many ticks as time actually passed.
//! Counting sleeps made deadlines ~11% late on an idle machine and ~2×
//! late under CPU contention.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use wasmtime::Engine;

struct Shared {
    active: AtomicUsize,
    parked: AtomicBool,
    stop: AtomicBool,
}

pub(crate) struct EpochTicker {
    shared: Arc<Shared>,
    tick: Duration,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    pub fn start(engine: Engine, tick: Duration, linger: Duration) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            active: AtomicUsize::new(0),
            parked: AtomicBool::new(true),
            stop: AtomicBool::new(false),
        });
        let state = shared.clone();
        let thread = thread::Builder::new()
            .name("execbox-epoch".into())
            .stack_size(64 * 1024)
            .spawn(move || tick_loop(&engine, &state, tick, linger))?;
        Ok(Self { shared, tick, thread: Some(thread) })
    }

    /// Ticks until the returned guard drops.
    pub fn run_guard(&self) -> ActiveRun<'_> {
        self.shared.active.fetch_add(1, Ordering::SeqCst);
        if self.shared.parked.load(Ordering::SeqCst)
            && let Some(thread) = &self.thread
        {
            thread.thread().unpark();
        }
        ActiveRun(&self.shared)
    }

    /// Epoch ticks that cover `timeout` (see [`ticks_for`]).
    pub fn ticks_for(&self, timeout: Duration) -> u64 {
        ticks_for(self.tick, timeout)
    }

    /// The tick length.
    pub fn tick(&self) -> Duration {
        self.tick
    }
}

/// Epoch ticks of length `tick` that cover `timeout`, plus one for the
/// phase of the current tick: the deadline is looked at between `timeout`
/// and `timeout` plus two ticks (ticks owed from before a run can make it
/// come sooner; runs check the clock then, see `run.rs`).
pub(crate) fn ticks_for(tick: Duration, timeout: Duration) -> u64 {
    let tick = tick.as_nanos().max(1);
    u64::try_from(timeout.as_nanos().div_ceil(tick)).unwrap_or(u64::MAX / 2).saturating_add(1).min(u64::MAX / 2)
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

/// A run in progress; the ticker keeps ticking while any exists.
pub(crate) struct ActiveRun<'a>(&'a Shared);

impl Drop for ActiveRun<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

fn tick_loop(engine: &Engine, state: &Shared, tick: Duration, linger: Duration) {
    let mut last_active = Instant::now();
    let tick_nanos = tick.as_nanos().max(1);
    // Ticks are counted from `base`; `done` of them have been applied.
    let (mut base, mut done) = (Instant::now(), 0u128);
    while !state.stop.load(Ordering::SeqCst) {
        if state.active.load(Ordering::SeqCst) > 0 {
            last_active = Instant::now();
        } else if last_active.elapsed() >= linger {
            // Announce the park first, then re-check: a run that starts in
            // between sees `parked` and unparks us (unpark before park is kept).
            state.parked.store(true, Ordering::SeqCst);
            if state.active.load(Ordering::SeqCst) == 0 && !state.stop.load(Ordering::SeqCst) {
                thread::park();
            }
            state.parked.store(false, Ordering::SeqCst);
            last_active = Instant::now();
            // Time parked is no run's time: deadlines are set relative to
            // the epoch when a run starts.
            (base, done) = (Instant::now(), 0);
            continue;
        }
        thread::sleep(tick);
        let due = base.elapsed().as_nanos() / tick_nanos;
        for _ in done..due {
            engine.increment_epoch();
        }
        done = due.max(done);
    }
}
