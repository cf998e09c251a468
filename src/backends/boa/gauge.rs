//! [`WorkerGauge`]: how many workers (processes or threads) a boa backend
//! has alive, counted by a [`LiveCount`] each worker holds.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A read-only count of a boa backend's workers (processes or threads). It
/// does not keep the backend alive: for leak checks.
#[derive(Clone, Debug)]
pub struct WorkerGauge(Arc<AtomicUsize>);

impl WorkerGauge {
    /// A gauge of `live`.
    pub(crate) fn new(live: &Arc<AtomicUsize>) -> Self {
        Self(live.clone())
    }

    /// Workers alive now (idle, running, or winding down).
    pub fn live(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Counts one worker in its backend's gauge for as long as it lives.
pub(crate) struct LiveCount(Arc<AtomicUsize>);

impl LiveCount {
    pub(crate) fn new(live: &Arc<AtomicUsize>) -> Self {
        live.fetch_add(1, Ordering::SeqCst);
        Self(live.clone())
    }
}

impl Drop for LiveCount {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
