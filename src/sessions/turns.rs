//! [`Turns`]: a session's calls, one at a time, in arrival order.

use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Tickets: each call takes the next one and waits until it is served.
#[derive(Default)]
pub(super) struct Turns {
    /// (next ticket to hand out, ticket being served).
    tickets: Mutex<(u64, u64)>,
    /// Tickets whose callers stopped waiting (their deadline passed).
    skipped: Mutex<Vec<u64>>,
    changed: Condvar,
}

/// A call's turn; the next ticket is served when it drops.
pub(super) struct Turn(Arc<Turns>);

impl Turns {
    /// This call's turn if it is served at once (no call runs or waits),
    /// without taking a ticket otherwise: an async caller's fast path.
    pub fn try_take(self: &Arc<Self>) -> Option<Turn> {
        let mut tickets = self.tickets.lock();
        if tickets.0 != tickets.1 {
            return None;
        }
        tickets.0 += 1;
        Some(Turn(self.clone()))
    }

    /// Waits for this call's turn, at most `limit` (`None`: no limit).
    pub fn take(self: &Arc<Self>, limit: Option<Duration>) -> Option<Turn> {
        let until = limit.map(|l| Instant::now() + l);
        let mut tickets = self.tickets.lock();
        let mine = tickets.0;
        tickets.0 += 1;
        while tickets.1 != mine {
            let left = until.map(|u| u.saturating_duration_since(Instant::now()));
            if left.is_some_and(|l| l.is_zero()) {
                // Give the ticket up: the turn passes over it.
                drop(tickets);
                self.skip(mine);
                return None;
            }
            let wait = left.unwrap_or(Duration::from_secs(3600));
            self.changed.wait_for(&mut tickets, wait);
        }
        Some(Turn(self.clone()))
    }

    /// Marks `ticket` as not wanting its turn: served (or skipped when it comes up).
    fn skip(&self, ticket: u64) {
        self.skipped.lock().push(ticket);
        self.advance();
    }

    /// Serves the next ticket that is still wanted.
    fn advance(&self) {
        let mut tickets = self.tickets.lock();
        let mut skipped = self.skipped.lock();
        while let Some(at) = skipped.iter().position(|&t| t == tickets.1) {
            skipped.swap_remove(at);
            tickets.1 += 1;
        }
        drop(skipped);
        drop(tickets);
        self.changed.notify_all();
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.0.tickets.lock().1 += 1;
        self.0.advance();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn turns_are_served_in_order_and_a_waiter_past_its_deadline_gives_up() {
        let turns = Arc::new(Turns::default());
        let first = turns.take(None).unwrap();
        assert!(turns.take(Some(Duration::from_millis(30))).is_none(), "the first still runs");
        let order = Arc::new(Mutex::new(Vec::new()));
        let waiters: Vec<_> = (0..4u64)
            .map(|i| {
                let (mine, order) = (turns.clone(), order.clone());
                let handle = std::thread::spawn(move || {
                    let _turn = mine.take(Some(Duration::from_secs(10))).unwrap();
                    order.lock().push(i);
                });
                // Arrival order is ticket order: wait until this waiter has
                // its ticket (0 and 1 went to the first two calls).
                while turns.tickets.lock().0 < 3 + i {
                    std::thread::yield_now();
                }
                handle
            })
            .collect();
        drop(first);
        waiters.into_iter().for_each(|w| w.join().unwrap());
        assert_eq!(*order.lock(), vec![0, 1, 2, 3], "arrival order, the gave-up ticket skipped");
    }
}
