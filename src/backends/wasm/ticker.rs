//! [`EpochTicker`]: one background thread per backend that advances the
//! engine's epoch while guests run, so a wall-clock deadline preempts wasm
//! code at the next loop back-edge or function entry.
//!
//! The thread ticks only while runs are active and for `linger` after the
//! last one ends (so back-to-back calls never pay a wake-up), then parks.
//! Dropping the ticker stops and joins the thread.

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

pub(super) struct EpochTicker {
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

    /// Epoch ticks that cover `timeout`: the deadline fires between `timeout`
    /// and `timeout` plus two ticks.
    pub fn ticks_for(&self, timeout: Duration) -> u64 {
        let tick = self.tick.as_nanos().max(1);
        u64::try_from(timeout.as_nanos().div_ceil(tick)).unwrap_or(u64::MAX / 2).saturating_add(1).min(u64::MAX / 2)
    }
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
pub(super) struct ActiveRun<'a>(&'a Shared);

impl Drop for ActiveRun<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

fn tick_loop(engine: &Engine, state: &Shared, tick: Duration, linger: Duration) {
    let mut last_active = Instant::now();
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
            continue;
        }
        thread::sleep(tick);
        engine.increment_epoch();
    }
}
