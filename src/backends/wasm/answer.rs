//! [`answer`]: the one result a warm instance's thread sends back, which a
//! blocking caller waits for (with a limit) and an async caller awaits on
//! any executor. The thread's send wakes either directly, so an async run
//! needs no thread of tokio's blocking pool between it and the instance,
//! and no runtime driver (I/O or timers) either.
//!
//! The error types are `std::sync::mpsc`'s, whose channel this replaces.

use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::sync::mpsc::{RecvTimeoutError, TryRecvError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// A sender and its receiver for one value.
pub(crate) fn answer<T>() -> (AnswerSender<T>, Answer<T>) {
    let shared = Arc::new(Shared { slot: Mutex::new(Slot::default()), ready: Condvar::new() });
    (AnswerSender(shared.clone()), Answer(shared))
}

struct Shared<T> {
    slot: Mutex<Slot<T>>,
    /// Notified when a value arrives or the sender goes.
    ready: Condvar,
}

struct Slot<T> {
    value: Option<T>,
    /// The sender was dropped (after sending, or without).
    sender_gone: bool,
    /// The last async waiter, woken with the blocking ones.
    waker: Option<Waker>,
}

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Self { value: None, sender_gone: false, waker: None }
    }
}

impl<T> Shared<T> {
    /// Runs `change` on the slot, then wakes every waiter.
    fn update(&self, change: impl FnOnce(&mut Slot<T>)) {
        let waker = {
            let mut slot = self.slot.lock();
            change(&mut slot);
            slot.waker.take()
        };
        self.ready.notify_all();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// Sends the one value; dropped without sending, the receiver sees
/// `Disconnected`.
pub(crate) struct AnswerSender<T>(Arc<Shared<T>>);

impl<T> AnswerSender<T> {
    /// Hands `value` to the receiver (kept until it is taken, or dropped
    /// with the receiver).
    pub(crate) fn send(self, value: T) {
        self.0.update(|slot| slot.value = Some(value));
    }
}

impl<T> Drop for AnswerSender<T> {
    fn drop(&mut self) {
        self.0.update(|slot| slot.sender_gone = true);
    }
}

/// Receives the one value, blocking or async.
pub(crate) struct Answer<T>(Arc<Shared<T>>);

impl<T> Answer<T> {
    /// The value if it is there now.
    pub(crate) fn try_recv(&self) -> Result<T, TryRecvError> {
        let mut slot = self.0.slot.lock();
        match slot.value.take() {
            Some(value) => Ok(value),
            None if slot.sender_gone => Err(TryRecvError::Disconnected),
            None => Err(TryRecvError::Empty),
        }
    }

    /// Blocks until the value arrives, for at most `limit` (`None`: no limit).
    pub(crate) fn recv_timeout(&self, limit: Option<Duration>) -> Result<T, RecvTimeoutError> {
        let until = limit.and_then(|limit| Instant::now().checked_add(limit));
        let mut slot = self.0.slot.lock();
        loop {
            if let Some(value) = slot.value.take() {
                return Ok(value);
            }
            if slot.sender_gone {
                return Err(RecvTimeoutError::Disconnected);
            }
            match until {
                Some(until) => {
                    if self.0.ready.wait_until(&mut slot, until).timed_out() && slot.value.is_none() {
                        return Err(if slot.sender_gone {
                            RecvTimeoutError::Disconnected
                        } else {
                            RecvTimeoutError::Timeout
                        });
                    }
                }
                None => self.0.ready.wait(&mut slot),
            }
        }
    }

    /// Ready with the value, or `Disconnected` once the sender went without
    /// one; otherwise wakes `cx`'s task when either happens.
    pub(crate) fn poll_recv(&self, cx: &mut Context<'_>) -> Poll<Result<T, TryRecvError>> {
        let mut slot = self.0.slot.lock();
        if let Some(value) = slot.value.take() {
            return Poll::Ready(Ok(value));
        }
        if slot.sender_gone {
            return Poll::Ready(Err(TryRecvError::Disconnected));
        }
        match &mut slot.waker {
            Some(waker) => waker.clone_from(cx.waker()),
            none => *none = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;

    #[test]
    fn a_blocking_wait_gets_the_value_sent_from_another_thread() {
        let (tx, rx) = answer();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            tx.send(7);
        });
        assert_eq!(rx.recv_timeout(Some(Duration::from_secs(5))), Ok(7));
        sender.join().unwrap();
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected), "taken once");
    }

    #[test]
    fn a_blocking_wait_times_out_then_sees_a_dropped_sender() {
        let (tx, rx) = answer::<u8>();
        assert_eq!(rx.recv_timeout(Some(Duration::from_millis(10))), Err(RecvTimeoutError::Timeout));
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        drop(tx);
        assert_eq!(rx.recv_timeout(None), Err(RecvTimeoutError::Disconnected));
    }

    #[test]
    fn an_async_wait_is_woken_by_the_send_on_a_runtime_without_drivers() {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let (tx, rx) = answer();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            tx.send("done");
        });
        assert_eq!(runtime.block_on(poll_fn(|cx| rx.poll_recv(cx))), Ok("done"));
        sender.join().unwrap();
    }

    #[test]
    fn an_async_wait_is_woken_when_the_sender_goes_without_a_value() {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let (tx, rx) = answer::<u8>();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            drop(tx);
        });
        assert_eq!(runtime.block_on(poll_fn(|cx| rx.poll_recv(cx))), Err(TryRecvError::Disconnected));
        sender.join().unwrap();
    }
}
