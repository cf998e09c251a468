//! Waiting for a state that no event announces.

use std::future::Future;
use std::time::{Duration, Instant};

/// The pauses between two looks: short at first (most states arrive
/// quickly), then at most 50 ms.
fn pauses() -> impl Iterator<Item = Duration> {
    std::iter::successors(Some(Duration::from_millis(1)), |p| Some((*p * 2).min(Duration::from_millis(50))))
}

/// Looks at `done` until it holds or `limit` has passed (looking once more
/// then); whether it held. Only for a state nothing announces: wait on the
/// event where there is one (see the module docs of `common`).
pub fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + limit;
    for pause in pauses() {
        if done() {
            return true;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        std::thread::sleep(pause.min(left));
    }
    unreachable!("the pauses never end")
}

/// [`wait_until`] for a test on a tokio runtime, whose look is itself a
/// future (a call to a server).
pub async fn wait_until_async<F: Future<Output = bool>>(limit: Duration, mut done: impl FnMut() -> F) -> bool {
    let until = Instant::now() + limit;
    for pause in pauses() {
        if done().await {
            return true;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        tokio::time::sleep(pause.min(left)).await;
    }
    unreachable!("the pauses never end")
}
