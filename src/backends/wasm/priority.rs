//! The priority of a warm instance's thread during its background work
//! (starting, and freeing after its answer), so that it never competes with
//! the threads that carry a caller's answer. A run itself never executes at
//! a lowered priority.

use std::sync::Arc;

use parking_lot::Mutex;

/// Lets the caller this thread just answered run before the thread frees
/// its instance, and leaves that freeing (~0.7 ms of resetting memory for
/// CPython) to spare CPU time. Measured through `execbox serve` on 2 CPUs:
/// the woken caller otherwise waited up to ~0.7 ms for this thread's CPU.
/// The thread ends right after, so it never needs its priority back (which
/// would take a privilege).
pub(crate) fn step_aside() {
    let _ = lower_this_thread_by(BACKGROUND_NICE_STEP);
    std::thread::yield_now();
}

/// How much an instance's thread lowers its priority (raises its nice
/// value) for its background work: starting, and freeing after its answer.
const BACKGROUND_NICE_STEP: i32 = 10;

/// Raises the calling thread's nice value by `step` (at most to 19); its
/// id and nice value before, if it could.
fn lower_this_thread_by(step: i32) -> Option<(rustix::process::Pid, i32)> {
    let tid = rustix::thread::gettid();
    let nice = rustix::process::getpriority_process(Some(tid)).ok()?;
    rustix::process::setpriority_process(Some(tid), (nice + step).min(19)).ok()?;
    Some((tid, nice))
}

/// The priority of an instance's thread while it starts. CPython's start
/// takes ~100 ms of CPU; at normal priority a caller's threads woken
/// meanwhile (the server's answer path, the next run) waited up to a
/// scheduler slice (1.5–3 ms measured on 2 CPUs) for its CPU. Lowered only
/// where this process may raise it back (root, `CAP_SYS_NICE`, or an
/// `RLIMIT_NICE` that allows it; probed once): a run never executes at a
/// lowered priority.
#[derive(Default)]
pub(crate) struct StartPriority(Mutex<Priority>);

#[derive(Default)]
enum Priority {
    /// Not lowered (yet, or at all).
    #[default]
    Normal,
    /// Lowered: the thread and its nice value before.
    Lowered { tid: rustix::process::Pid, nice: i32 },
    /// Restored for a run, or its thread ended: never touched again.
    Restored,
}

/// Marks its [`StartPriority`] done when dropped (as its thread ends).
pub(crate) struct PriorityEnd(pub(crate) Arc<StartPriority>);

impl Drop for PriorityEnd {
    fn drop(&mut self) {
        *self.0.0.lock() = Priority::Restored;
    }
}

impl StartPriority {
    /// Lowers the calling thread's priority, unless the instance already
    /// got its code or the priority could not be raised back.
    pub(crate) fn lower_this_thread(&self) {
        let mut state = self.0.lock();
        if !matches!(*state, Priority::Normal) || !may_raise_priority() {
            return;
        }
        if let Some((tid, nice)) = lower_this_thread_by(BACKGROUND_NICE_STEP) {
            *state = Priority::Lowered { tid, nice };
        }
    }

    /// Gives the instance's thread its priority back (before its code runs).
    pub fn restore(&self) {
        let mut state = self.0.lock();
        if let Priority::Lowered { tid, nice } = *state
            && let Err(e) = rustix::process::setpriority_process(Some(tid), nice)
        {
            tracing::warn!(error = %e, "cannot restore a warm instance's priority: its run goes at a lower one");
        }
        *state = Priority::Restored;
    }
}

/// Whether a thread of this process may raise its priority back after
/// lowering it (probed once, on a thread of its own).
fn may_raise_priority() -> bool {
    static MAY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *MAY.get_or_init(|| {
        let probe = std::thread::Builder::new().name("execbox-nice-probe".into()).spawn(|| {
            matches!(lower_this_thread_by(1), Some((tid, nice))
                if nice < 19 && rustix::process::setpriority_process(Some(tid), nice).is_ok())
        });
        probe.ok().and_then(|t| t.join().ok()).unwrap_or(false)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn nice_of_this_thread() -> i32 {
        rustix::process::getpriority_process(Some(rustix::thread::gettid())).unwrap()
    }

    /// Runs `lower` on a thread of its own, then `between` on this one,
    /// and returns that thread's nice value before, after `lower`, and
    /// after `between`.
    fn on_a_thread(priority: Arc<StartPriority>, between: impl FnOnce()) -> (i32, i32, i32) {
        let (lowered_tx, lowered_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let before = nice_of_this_thread();
            priority.lower_this_thread();
            lowered_tx.send(nice_of_this_thread()).unwrap();
            go_rx.recv().unwrap();
            (before, nice_of_this_thread())
        });
        let lowered = lowered_rx.recv().unwrap();
        between();
        go_tx.send(()).unwrap();
        let (before, after) = thread.join().unwrap();
        (before, lowered, after)
    }

    #[test]
    fn a_starting_instance_runs_lowered_and_gets_its_priority_back_before_its_code() {
        let priority = Arc::new(StartPriority::default());
        let restorer = priority.clone();
        let (before, lowered, after) = on_a_thread(priority, move || restorer.restore());
        if may_raise_priority() {
            assert_eq!(lowered, (before + BACKGROUND_NICE_STEP).min(19));
        } else {
            assert_eq!(lowered, before, "lowered where it could not be raised back");
        }
        assert_eq!(after, before);
    }

    #[test]
    fn a_thread_that_ended_lowered_is_never_named_by_a_restore() {
        let priority = Arc::new(StartPriority::default());
        let thread_priority = priority.clone();
        std::thread::spawn(move || {
            thread_priority.lower_this_thread();
            let _ended = PriorityEnd(thread_priority);
        })
        .join()
        .unwrap();
        assert!(matches!(*priority.0.lock(), Priority::Restored));
        priority.restore();
    }

    #[test]
    fn an_instance_given_its_code_before_it_lowered_itself_stays_at_its_priority() {
        let priority = Arc::new(StartPriority::default());
        priority.restore();
        let (before, lowered, after) = on_a_thread(priority, || {});
        assert_eq!((lowered, after), (before, before));
    }
}
