//! [`ChildHandle`]: a child process named by a pidfd.
//!
//! A pidfd names one process for as long as the handle lives, however and
//! whenever that process ends: signalling it never reaches a recycled pid,
//! so any thread may kill a child that another thread is waiting on (a
//! session closed while its call runs). A pidfd is also readable once the
//! process has exited, so waiting for an exit is a `poll`, not a sleep loop.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Instant;

use rustix::process::{Pid, PidfdFlags, Signal};

/// A handle on one child process; clones name the same process.
#[derive(Clone, Debug)]
pub(crate) struct ChildHandle(Arc<OwnedFd>);

/// The pidfd: readable once the process has exited.
impl std::os::fd::AsFd for ChildHandle {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl ChildHandle {
    /// The handle of `child`, opened before anything reaps it.
    pub fn of(child: &std::process::Child) -> io::Result<Self> {
        let pid = i32::try_from(child.id())
            .ok()
            .and_then(Pid::from_raw)
            .ok_or_else(|| io::Error::other("a child without a valid pid"))?;
        Ok(Self(Arc::new(rustix::process::pidfd_open(pid, PidfdFlags::empty())?)))
    }

    /// Sends `SIGKILL`; a process already gone is not an error.
    pub fn kill(&self) {
        let _ = rustix::process::pidfd_send_signal(&*self.0, Signal::KILL);
    }

    /// Waits until the process has exited (true), or `until` passes (false).
    /// Does not reap it: its parent's `wait` still collects the status.
    pub fn wait_exit(&self, until: Option<Instant>) -> bool {
        super::poll::ready(&*self.0, rustix::event::PollFlags::IN, until)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_child_is_killed_and_its_exit_is_seen_without_polling_loops() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let handle = ChildHandle::of(&child).unwrap();
        assert!(!handle.wait_exit(Some(Instant::now() + Duration::from_millis(20))));
        let other = handle.clone();
        std::thread::spawn(move || other.kill()).join().unwrap();
        assert!(handle.wait_exit(Some(Instant::now() + Duration::from_secs(5))));
        let status = child.wait().unwrap();
        assert!(!status.success());
        handle.kill(); // reaped: still no error, and no other process is hit
    }
}
