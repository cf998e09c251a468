//! The one backoff of execbox's pools: after `n` failed starts in a row, the
//! next start waits `first`, doubled for every failure after the first, up
//! to `max`. Each pool picks `first` and `max` for what its start costs.

use std::time::Duration;

/// How long to wait after `failures` failed starts in a row (0 for none).
pub(crate) fn after_failures(failures: u32, first: Duration, max: Duration) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    first.saturating_mul(1 << (failures - 1).min(16)).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_the_first_failure_up_to_the_cap() {
        let ms = |n| Duration::from_millis(n);
        let waits: Vec<Duration> = (0..6).map(|n| after_failures(n, ms(100), ms(1_000))).collect();
        assert_eq!(waits, [ms(0), ms(100), ms(200), ms(400), ms(800), ms(1_000)]);
        assert_eq!(after_failures(u32::MAX, ms(100), Duration::from_secs(10)), Duration::from_secs(10));
    }
}
