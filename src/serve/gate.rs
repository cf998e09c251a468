//! [`Gate`]: at most `max_concurrent` runs at once, at most `max_queued`
//! waiting for a turn; anything more is a typed `busy` at once, so a flood
//! neither crashes the server nor grows its memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

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

/// Runs in flight, for the drain at shutdown.
#[derive(Default)]
struct Active {
    count: AtomicUsize,
    idle: Notify,
}

/// One admitted run; dropping it frees the turn.
pub struct Turn {
    _permit: OwnedSemaphorePermit,
    active: Arc<Active>,
}

impl Drop for Turn {
    fn drop(&mut self) {
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
    pub async fn enter(&self, wait: Duration) -> Result<Turn, ExecError> {
        let busy = |reason: String| ExecError::Busy { backend: SERVER.into(), reason };
        if self.closed.load(Ordering::SeqCst) {
            return Err(busy("the server is shutting down".into()));
        }
        let permit = match self.permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                let queued = self.queued.fetch_add(1, Ordering::SeqCst);
                let _leave = scopeguard(|| {
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
        self.active.count.fetch_add(1, Ordering::SeqCst);
        Ok(Turn { _permit: permit, active: self.active.clone() })
    }

    /// Admits nothing more; waiters get `busy`.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.permits.close();
    }

    /// Waits until no run is in flight, at most `limit`; true if none is.
    pub async fn drained(&self, limit: Duration) -> bool {
        let wait = async {
            loop {
                let idle = self.active.idle.notified();
                if self.active.count.load(Ordering::SeqCst) == 0 {
                    return;
                }
                idle.await;
            }
        };
        tokio::time::timeout(limit, wait).await.is_ok()
    }

    /// Runs in flight now.
    pub fn active(&self) -> usize {
        self.active.count.load(Ordering::SeqCst)
    }
}

/// Runs `f` when dropped (also when the waiting future is cancelled).
fn scopeguard(f: impl FnOnce()) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_gate_queues_then_refuses_and_drains() {
        let gate = Arc::new(Gate::new(1, 1));
        let first = gate.enter(Duration::from_secs(5)).await.unwrap();
        let waiter = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.enter(Duration::from_secs(5)).await.map(drop) })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let refused = gate.enter(Duration::from_secs(5)).await.err().unwrap();
        assert_eq!(refused.kind(), "busy", "{refused}");
        drop(first);
        assert!(waiter.await.unwrap().is_ok(), "the queued call got the freed turn");
        let timed_out = {
            let _held = gate.enter(Duration::from_secs(5)).await.unwrap();
            gate.enter(Duration::from_millis(50)).await.err().unwrap()
        };
        assert!(timed_out.to_string().contains("deadline"), "{timed_out}");
        assert!(gate.drained(Duration::from_secs(1)).await);
        gate.close();
        assert!(gate.enter(Duration::from_secs(1)).await.err().unwrap().to_string().contains("shutting down"));
    }
}
