//! [`Gate`]: at most `max_concurrent` runs at once, at most `max_queued`
//! waiting for a turn; anything more is a typed `busy` at once, so a flood
//! neither crashes the server nor grows its memory.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::error::ExecError;

/// The name busy refusals from the gate carry.
pub const SERVER: &str = "execbox-serve";

/// Admission to runs.
pub struct Gate {
    permits: Arc<Semaphore>,
    max_concurrent: usize,
    max_queued: usize,
    queued: AtomicUsize,
    closed: AtomicBool,
    active: Arc<Active>,
}

/// Runs in flight, for the drain at shutdown: each with the moment by which
/// it is over (its deadline plus the kill grace, or a tool's own bound).
#[derive(Default)]
struct Active {
    count: AtomicUsize,
    ends: parking_lot::Mutex<HashMap<u64, Instant>>,
    next: AtomicU64,
    idle: Notify,
}

/// One admitted run; dropping it frees the turn (whichever way the call
/// returns, and also when its future is dropped).
pub struct Turn {
    _permit: OwnedSemaphorePermit,
    active: Arc<Active>,
    id: u64,
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.active.ends.lock().remove(&self.id);
        if self.active.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.active.idle.notify_waiters();
        }
    }
}

impl Gate {
    /// `max_concurrent` turns (at least 1), `max_queued` waiters.
    pub fn new(max_concurrent: usize, max_queued: usize) -> Self {
        Self {
            permits: Arc::new(Semaphore::new(max_concurrent.max(1))),
            max_concurrent: max_concurrent.max(1),
            max_queued,
            queued: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            active: Arc::new(Active::default()),
        }
    }

    /// Waits for a turn, at most `wait` (the run's own deadline: a run that
    /// could not start before it would time out anyway). `busy` when the
    /// queue is full, the wait runs out, or the server is shutting down.
    /// `limit` is the longest the call may run once admitted (its deadline
    /// plus the kill grace): the drain at shutdown waits no longer.
    pub async fn enter(&self, wait: Duration, limit: Duration) -> Result<Turn, ExecError> {
        let busy = |reason: String| ExecError::Busy { backend: SERVER.into(), reason };
        if self.closed.load(Ordering::SeqCst) {
            return Err(busy("the server is shutting down".into()));
        }
        let permit = match self.permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                let queued = self.queued.fetch_add(1, Ordering::SeqCst);
                // Also when the waiting future is cancelled.
                let _leave = crate::guard::on_drop(|| {
                    self.queued.fetch_sub(1, Ordering::SeqCst);
                });
                if queued >= self.max_queued {
                    return Err(busy(format!(
                        "all {} run slots are taken and {} calls are already waiting",
                        self.max_concurrent, self.max_queued
                    )));
                }
                match tokio::time::timeout(wait, self.permits.clone().acquire_owned()).await {
                    Ok(Ok(permit)) => permit,
                    Ok(Err(_)) => return Err(busy("the server is shutting down".into())),
                    Err(_) => {
                        return Err(busy(format!(
                            "no run slot became free within the call's deadline ({} ms)",
                            wait.as_millis()
                        )));
                    }
                }
            }
        };
        if self.closed.load(Ordering::SeqCst) {
            return Err(busy("the server is shutting down".into()));
        }
        let id = self.active.next.fetch_add(1, Ordering::SeqCst);
        let ends = Instant::now() + limit;
        self.active.ends.lock().insert(id, ends);
        self.active.count.fetch_add(1, Ordering::SeqCst);
        Ok(Turn { _permit: permit, active: self.active.clone(), id })
    }

    /// Admits nothing more; waiters get `busy`.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.permits.close();
    }

    /// Whether [`Gate::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Waits until no run is in flight, but no longer than the latest
    /// moment by which a run in flight must be over; true if none is.
    pub async fn drained(&self) -> bool {
        loop {
            let idle = self.active.idle.notified();
            if self.active.count.load(Ordering::SeqCst) == 0 {
                return true;
            }
            let latest = self.active.ends.lock().values().max().copied();
            let left = latest.map_or(Duration::ZERO, |at| at.saturating_duration_since(Instant::now()));
            if left.is_zero() {
                return self.active.count.load(Ordering::SeqCst) == 0;
            }
            let _ = tokio::time::timeout(left, idle).await;
        }
    }

    /// Runs in flight now.
    pub fn active(&self) -> usize {
        self.active.count.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_gate_queues_then_refuses_and_drains() {
        let long = Duration::from_secs(60);
        let gate = Arc::new(Gate::new(1, 1));
        let first = gate.enter(Duration::from_secs(5), long).await.unwrap();
        let waiter = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.enter(Duration::from_secs(5), long).await.map(drop) })
        };
        while gate.queued.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let refused = gate.enter(Duration::from_secs(5), long).await.err().unwrap();
        assert_eq!(refused.kind(), "busy", "{refused}");
        drop(first);
        assert!(waiter.await.unwrap().is_ok(), "the queued call got the freed turn");
        let timed_out = {
            let _held = gate.enter(Duration::from_secs(5), long).await.unwrap();
            gate.enter(Duration::from_millis(50), long).await.err().unwrap()
        };
        assert!(timed_out.to_string().contains("deadline"), "{timed_out}");
        assert!(gate.drained().await);
        gate.close();
        let closed = gate.enter(Duration::from_secs(1), long).await.err().unwrap();
        assert!(closed.to_string().contains("shutting down"));
    }

    #[tokio::test]
    async fn the_drain_waits_no_longer_than_the_latest_run_may_take() {
        let gate = Gate::new(2, 0);
        let _stuck = gate.enter(Duration::from_secs(1), Duration::from_millis(200)).await.unwrap();
        let started = Instant::now();
        assert!(!gate.drained().await, "a run still holds its turn");
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(150) && waited < Duration::from_secs(5), "{waited:?}");
    }
}
