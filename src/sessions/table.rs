//! What a session registry holds (its live sessions, those being opened,
//! those lost) and the expiry thread that closes idle sessions and kills
//! those whose call overran its deadline (the backstop).

use parking_lot::{Mutex, MutexGuard};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::config::SessionConfig;
use super::session::{CALL_OVERRUN_LIMIT, Session, SessionBackend};
use super::turns::Turns;
use crate::admission::Door;
use crate::session_spec::SessionSpec;

pub(super) struct Inner {
    pub(super) cfg: SessionConfig,
    pub(super) backends: Vec<Arc<dyn SessionBackend>>,
    /// The one door every call passes (an executor's, when built for one).
    pub(super) door: Door,
    pub(super) state: Mutex<State>,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) live: HashMap<String, Entry>,
    /// Sessions being opened: they count against the bound.
    pub(super) opening: usize,
    /// Ids of sessions that ended without a close, with why; each is
    /// reported once. Bounded: the oldest are forgotten.
    pub(super) lost: VecDeque<(String, String)>,
    pub(super) expiry_running: bool,
    /// Numbers calls in flight.
    pub(super) next_call: u64,
    /// Calls whose session the backstop killed because they overran their
    /// deadline: they end as `timed_out`, not as closed.
    pub(super) overran: std::collections::HashSet<u64>,
}

pub(super) struct Entry {
    pub(super) session: Arc<dyn Session>,
    pub(super) spec: Arc<SessionSpec>,
    /// What its backend provides: later calls may declare these.
    pub(super) packages: Vec<String>,
    /// Calls run one at a time, in arrival order.
    pub(super) turns: Arc<Turns>,
    pub(super) last_used: Instant,
    /// Calls in flight (waiting for their turn or running), each with the
    /// moment past which it overran its deadline (see [`CALL_OVERRUN_LIMIT`]).
    pub(super) calls: HashMap<u64, Instant>,
}

/// Lost ids remembered at most.
pub(super) const MAX_LOST: usize = 1024;

impl State {
    pub(super) fn remember_lost(&mut self, id: String, reason: String) {
        self.lost.push_back((id, reason));
        while self.lost.len() > MAX_LOST {
            self.lost.pop_front();
        }
    }
}

impl Inner {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }
}

/// Kills the sessions of removed entries (outside the registry's lock),
/// then drops them.
pub(super) fn end_all(removed: &[Entry]) {
    for entry in removed {
        entry.session.kill();
    }
}

/// The expiry thread: closes idle sessions and kills those whose call
/// overran its deadline, until none is live or the registry is gone.
pub(super) fn expire(weak: Weak<Inner>) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let idle = inner.cfg.idle_timeout;
        let tick = (idle / 4).clamp(Duration::from_millis(20), Duration::from_millis(500));
        let ended: Vec<Entry> = {
            let mut state = inner.lock();
            let now = Instant::now();
            let mut ended = Vec::new();
            let overdue: Vec<u64> = state
                .live
                .values()
                .flat_map(|e| e.calls.iter().filter(|(_, at)| now >= **at).map(|(call, _)| *call))
                .collect();
            state.overran.extend(overdue);
            let ids: Vec<(String, &'static str)> = state
                .live
                .iter()
                .filter_map(|(id, e)| {
                    if e.calls.values().any(|overdue| now >= *overdue) {
                        Some((id.clone(), "overran"))
                    } else if e.calls.is_empty() && e.last_used.elapsed() >= idle {
                        Some((id.clone(), "idle"))
                    } else {
                        None
                    }
                })
                .collect();
            for (id, why) in ids {
                if let Some(entry) = state.live.remove(&id) {
                    let reason = match why {
                        "overran" => format!(
                            "a call still ran {} s past its deadline, so the session was killed",
                            CALL_OVERRUN_LIMIT.as_secs()
                        ),
                        _ => format!("idle for longer than {} ms", idle.as_millis()),
                    };
                    if why == "overran" {
                        tracing::error!(session = %id, "a session call overran its deadline: killed by the registry");
                    }
                    state.remember_lost(id, reason);
                    ended.push(entry);
                }
            }
            if state.live.is_empty() && state.opening == 0 {
                state.expiry_running = false;
                drop(state);
                end_all(&ended);
                return;
            }
            ended
        };
        end_all(&ended);
        drop(ended);
        // Sleep without keeping the registry alive past its owners.
        drop(inner);
        std::thread::sleep(tick);
    }
}
