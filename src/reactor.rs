//! Runtimes known to have tokio's I/O and time drivers, so that a run can
//! wait for a worker process on the runtime's reactor instead of on a
//! thread of the blocking pool.
//!
//! tokio has no stable way to ask whether the current runtime has an I/O
//! driver: registering a descriptor with one that has none panics. So the
//! runtimes execbox waits on are the ones built by [`runtime_builder`],
//! which enables every driver and marks its threads with the runtime's id.
//! A run on any other runtime (or on a thread of another runtime's context)
//! takes the blocking pool, as before.

use std::cell::Cell;

thread_local! {
    /// The runtime whose [`runtime_builder`] started this thread.
    static MARKED: Cell<Option<tokio::runtime::Id>> = const { Cell::new(None) };
}

/// A multi-thread tokio runtime builder with every driver enabled, whose
/// threads execbox may wait on: on a runtime built from it,
/// [`Executor::execute`](crate::Executor::execute) awaits a contained
/// `boa-js` run's worker on the runtime's reactor, on the caller's task,
/// rather than hand the run to a thread of the blocking pool (0.05–0.1 ms
/// less per paced run on a 2-CPU machine, more under load). Every control
/// holds as on any runtime.
///
/// Set what else you need on it (thread counts, names, `max_blocking_threads`)
/// but keep its `on_thread_start` hook, which is the mark: replacing it
/// makes runs take the blocking pool again (still correct, only slower).
/// `execbox serve` runs on one.
pub fn runtime_builder() -> tokio::runtime::Builder {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all().on_thread_start(|| {
        // The runtime's context is entered before this hook runs.
        let id = tokio::runtime::Handle::try_current().ok().map(|handle| handle.id());
        MARKED.with(|mark| mark.set(id));
    });
    builder
}

/// True on a thread of a runtime built by [`runtime_builder`], inside that
/// runtime's own context: its reactor and timer may be waited on.
#[cfg_attr(not(feature = "js"), allow(dead_code))]
pub(crate) fn here() -> bool {
    let Some(marked) = MARKED.with(Cell::get) else { return false };
    tokio::runtime::Handle::try_current().is_ok_and(|handle| handle.id() == marked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_threads_of_a_marked_runtime_in_its_own_context_may_wait_on_it() {
        assert!(!here(), "no runtime");
        let marked = runtime_builder().worker_threads(1).build().unwrap();
        let plain = tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().unwrap();
        assert!(marked.block_on(async { tokio::spawn(async { here() }).await.unwrap() }));
        assert!(marked.block_on(async { tokio::task::spawn_blocking(here).await.unwrap() }));
        assert!(!plain.block_on(async { tokio::spawn(async { here() }).await.unwrap() }));
        // A thread of the marked runtime that enters another runtime's
        // context (which may lack drivers) is not marked for it.
        let other = plain.handle().clone();
        let inside_other = marked.block_on(async move {
            tokio::spawn(async move {
                let _entered = other.enter();
                here()
            })
            .await
            .unwrap()
        });
        assert!(!inside_other);
        // The thread that called block_on is not one of the runtime's.
        assert!(!marked.block_on(async { here() }));
    }
}
