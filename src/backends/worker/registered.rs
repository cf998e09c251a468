//! Descriptors and a deadline on the current runtime's reactor, for a
//! worker's conversation with an async caller (`on_reactor`): registered
//! duplicates, and a timerfd rather than tokio's timer.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// A descriptor registered with the current runtime's reactor. It owns a
/// duplicate of the descriptor it watches: dropping it deregisters and
/// closes the duplicate only, and never touches a descriptor number that
/// its owner may have closed and the process reused meanwhile.
pub(crate) struct Registered(AsyncFd<OwnedFd>);

/// The runtime's reactor cannot be waited on: it shut down (the runtime
/// is shutting down while a caller still polls, e.g. `Handle::block_on`
/// on a thread of its blocking pool), or a descriptor could not be
/// registered with it. Waiting on it again would return at once: a
/// conversation that kept trying would spin until its worker answers,
/// and forever for a worker that does not.
#[derive(Debug)]
pub(crate) struct NoReactor;

impl Registered {
    /// Registers a duplicate of `fd` for `interest`.
    pub fn new(fd: impl AsFd, interest: Interest) -> io::Result<Self> {
        debug_assert!(crate::reactor::here(), "registered outside a runtime marked as having a reactor");
        let duplicate = fd.as_fd().try_clone_to_owned()?;
        Self::owning(duplicate, interest)
    }

    /// Registers `fd` itself, which it then owns.
    fn owning(fd: OwnedFd, interest: Interest) -> io::Result<Self> {
        // SAFETY: the `AsyncFd` owns `fd`, an open descriptor that stays
        // open, and names the same file description, until the `AsyncFd`
        // drops; `OwnedFd::as_raw_fd` always returns it.
        let registered = unsafe { AsyncFd::register_with_interest(fd, interest) };
        Ok(Self(registered?))
    }

    /// Waits until the descriptor may be ready for `interest`, then clears
    /// that readiness: the caller's next attempt tells, and a descriptor
    /// that turns out not ready is waited for again rather than spun on.
    /// An error means the reactor is gone (the runtime is shutting down).
    pub async fn wait(&self, interest: Interest) -> Result<(), NoReactor> {
        let mut guard = self.0.ready(interest).await.map_err(|_| NoReactor)?;
        guard.clear_ready();
        Ok(())
    }
}

/// A deadline on the reactor: a timerfd, kept with the worker. No wait of
/// an async conversation uses tokio's timer: polling one after its
/// runtime's time driver shut down panics, which a caller that polls
/// through `Handle::block_on` while the runtime is dropped would hit.
pub(super) struct Alarm(Registered);

impl Alarm {
    pub(super) fn new() -> io::Result<Self> {
        use rustix::time::{TimerfdClockId, TimerfdFlags, timerfd_create};
        let fd = timerfd_create(TimerfdClockId::Monotonic, TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC)?;
        Registered::owning(fd, Interest::READABLE).map(Self)
    }

    /// Rings at `until`, or never (`None`), replacing any earlier setting.
    pub(super) fn set(&self, until: Option<Instant>) -> Result<(), NoReactor> {
        use rustix::time::{Itimerspec, TimerfdTimerFlags, Timespec, timerfd_settime};
        let never = Timespec { tv_sec: 0, tv_nsec: 0 };
        let value = match until {
            // A zero value disarms: a deadline already past rings in 1 ns.
            Some(at) => Timespec::try_from(at.saturating_duration_since(Instant::now()).max(Duration::from_nanos(1)))
                .unwrap_or(Timespec { tv_sec: i64::MAX, tv_nsec: 0 }),
            None => never,
        };
        let spec = Itimerspec { it_interval: never, it_value: value };
        timerfd_settime(self.0.0.get_ref(), TimerfdTimerFlags::empty(), &spec).map_err(|_| NoReactor)?;
        Ok(())
    }

    /// Waits until it rang. Reads the expiry, so a readiness left from an
    /// earlier setting is waited past.
    pub(super) async fn rung(&self) -> Result<(), NoReactor> {
        loop {
            let mut expiries = [0u8; 8];
            match rustix::io::read(self.0.0.get_ref(), &mut expiries) {
                Ok(_) => return Ok(()),
                Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => {}
                Err(_) => return Err(NoReactor),
            }
            self.0.wait(Interest::READABLE).await?;
        }
    }
}

/// A worker's sockets on a runtime's reactor, kept with the worker
/// across runs (registering costs a `dup` and an `epoll_ctl` each way).
pub(crate) struct Sockets {
    /// The runtime whose reactor they are registered with.
    pub(super) runtime: tokio::runtime::Id,
    pub(super) from_worker: Registered,
    /// Registered only once a write found no room: a registration for
    /// writability wakes the reactor at every change of room, which on a
    /// small machine took CPU from the worker it waits for.
    pub(super) to_worker: Option<Registered>,
    /// The deadline of its conversation (or of its reaping).
    pub(super) alarm: Alarm,
}
