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
//!
//! The same thread rings the [`Alarms`] of async guests sleeping in
//! `poll_oneoff` (see [`Alarm`]): they await instead of blocking a runtime
//! thread, with no dependency on the caller's runtime having timers. A
//! sleeping run is an active run, so the thread ticks while it sleeps; an
//! alarm rings at the first tick at or after its time.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use wasmtime::Engine;

struct Shared {
    active: AtomicUsize,
    parked: AtomicBool,
    stop: AtomicBool,
    alarms: Arc<Alarms>,
}

/// Wakers of async sleepers, by when they are due (ties broken by a
/// number), rung by the ticker thread.
#[derive(Default)]
pub(crate) struct Alarms {
    /// How many are set: the ticker takes the lock only when some are.
    set: AtomicUsize,
    next: AtomicU64,
    due: Mutex<BTreeMap<(Instant, u64), Waker>>,
}

impl Alarms {
    fn set(&self, at: Instant, waker: Waker) -> (Instant, u64) {
        let key = (at, self.next.fetch_add(1, Ordering::Relaxed));
        let mut due = self.due.lock();
        due.insert(key, waker);
        self.set.store(due.len(), Ordering::SeqCst);
        key
    }

    fn cancel(&self, key: &(Instant, u64)) {
        let mut due = self.due.lock();
        due.remove(key);
        self.set.store(due.len(), Ordering::SeqCst);
    }

    /// Wakes every alarm due by `now` (outside the lock).
    fn ring(&self, now: Instant) {
        if self.set.load(Ordering::SeqCst) == 0 {
            return;
        }
        let rung: Vec<Waker> = {
            let mut due = self.due.lock();
            let mut rung = Vec::new();
            while let Some(entry) = due.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                rung.push(entry.remove());
            }
            self.set.store(due.len(), Ordering::SeqCst);
            rung
        };
        rung.into_iter().for_each(Waker::wake);
    }
}

/// A future that is ready at `at` (at the first tick from then on), woken by
/// the ticker thread of `alarms`. Polled again earlier (another waker
/// fired), it sets itself again; dropped, it takes its alarm back.
pub(crate) struct Alarm<'a> {
    alarms: &'a Alarms,
    at: Instant,
    key: Option<(Instant, u64)>,
}

impl<'a> Alarm<'a> {
    /// Ready at `at`. The ticker must be ticking until then (an active run).
    pub(crate) fn at(alarms: &'a Alarms, at: Instant) -> Self {
        Self { alarms, at, key: None }
    }
}

impl Future for Alarm<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(key) = self.key.take() {
            self.alarms.cancel(&key);
        }
        if Instant::now() >= self.at {
            return Poll::Ready(());
        }
        let key = self.alarms.set(self.at, cx.waker().clone());
        self.key = Some(key);
        Poll::Pending
    }
}

impl Drop for Alarm<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.alarms.cancel(&key);
        }
    }
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
            alarms: Arc::default(),
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

    /// The alarms this ticker rings (see [`Alarm`]).
    pub fn alarms(&self) -> &Arc<Alarms> {
        &self.shared.alarms
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
        state.alarms.ring(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticker() -> EpochTicker {
        let engine = Engine::new(wasmtime::Config::new().epoch_interruption(true)).unwrap();
        EpochTicker::start(engine, Duration::from_millis(1), Duration::from_millis(50)).unwrap()
    }

    #[test]
    fn an_alarm_rings_at_its_time_while_a_run_ticks() {
        let ticker = ticker();
        let _run = ticker.run_guard();
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap(); // no timers
        let started = Instant::now();
        runtime.block_on(Alarm::at(ticker.alarms(), started + Duration::from_millis(30)));
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(30) && took < Duration::from_millis(500), "{took:?}");
        assert_eq!(ticker.alarms().set.load(Ordering::SeqCst), 0, "a rung alarm is not kept");
    }

    #[test]
    fn a_dropped_alarm_is_taken_back() {
        let ticker = ticker();
        let mut alarm = Box::pin(Alarm::at(ticker.alarms(), Instant::now() + Duration::from_secs(3600)));
        let waker = std::task::Waker::noop();
        assert!(alarm.as_mut().poll(&mut Context::from_waker(waker)).is_pending());
        assert!(alarm.as_mut().poll(&mut Context::from_waker(waker)).is_pending());
        assert_eq!(ticker.alarms().set.load(Ordering::SeqCst), 1, "polled again, it is set once");
        drop(alarm);
        assert_eq!(ticker.alarms().set.load(Ordering::SeqCst), 0);
    }
}
