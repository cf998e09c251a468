//! [`Deadline`]: the wall-clock limit of one run, fixed when the run starts.

use std::time::{Duration, Instant};

/// How long past its deadline an in-process guest (a wasm instance) may take
/// to report before its caller stops waiting and answers `timed_out`. The
/// guest stops itself at the deadline; this is a backstop for one stuck in
/// the host, which then ends by itself (its blocking calls end at the
/// deadline too).
pub const REPORT_GRACE: Duration = Duration::from_secs(1);

/// How long past its deadline any run may take to return, on every backend:
/// a container's kill on the daemon side and its CLI's exit are bounded by
/// this (`KILL_GRACE`), and every other backend answers sooner.
pub const RUN_GRACE: Duration = Duration::from_secs(2);

/// A point in time after which a run is `timed_out`; `None` means no limit.
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    start: Instant,
    at: Option<Instant>,
}

impl Deadline {
    /// Starts the clock now with an optional limit.
    pub fn start(limit: Option<Duration>) -> Self {
        let start = Instant::now();
        Self { start, at: limit.and_then(|l| start.checked_add(l)) }
    }

    /// A deadline whose clock started at `start` (in the past: time already
    /// spent waiting counts).
    pub fn started_at(start: Instant, limit: Option<Duration>) -> Self {
        Self { start, at: limit.and_then(|l| start.checked_add(l)) }
    }

    /// True once the limit has passed.
    pub fn expired(&self) -> bool {
        self.at.is_some_and(|at| Instant::now() >= at)
    }

    /// Time left, `None` without a limit (zero once expired).
    pub fn remaining(&self) -> Option<Duration> {
        self.at.map(|at| at.saturating_duration_since(Instant::now()))
    }

    /// Time since the run started.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// The limit itself, if any.
    pub fn limit(&self) -> Option<Duration> {
        self.at.map(|at| at - self.start)
    }

    /// The `message` of a `timed_out` result, the same on every backend.
    pub fn exceeded_message(&self) -> String {
        match self.limit() {
            Some(limit) => format!("deadline of {} ms exceeded", limit.as_millis()),
            None => "deadline exceeded".to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_limit_is_expired_at_once() {
        assert!(Deadline::start(Some(Duration::ZERO)).expired());
    }

    #[test]
    fn no_limit_never_expires() {
        let d = Deadline::start(None);
        assert!(!d.expired());
        assert_eq!(d.remaining(), None);
    }

    #[test]
    fn huge_limit_does_not_overflow() {
        let d = Deadline::start(Some(Duration::MAX));
        assert!(!d.expired());
    }
}
