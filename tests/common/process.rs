//! A process's exit, waited for with a poll on its pidfd (no sleep loop).
//! Works for any process of this PID namespace, not only children.

use std::os::fd::OwnedFd;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::process::{Pid, PidfdFlags, pidfd_open};

/// A pidfd of `pid`, or `None` when no such process exists (any more).
fn pidfd(pid: u32) -> Option<OwnedFd> {
    let pid = Pid::from_raw(i32::try_from(pid).ok()?)?;
    pidfd_open(pid, PidfdFlags::empty()).ok()
}

/// Waits until one of `pids` has exited (a zombie has) or `limit` passes;
/// whether one has. A process already gone counts as exited.
pub fn wait_any_exit(pids: &[u32], limit: Duration) -> bool {
    let mut fds = Vec::new();
    for &pid in pids {
        match pidfd(pid) {
            Some(fd) => fds.push(fd),
            None => return true,
        }
    }
    let until = Instant::now() + limit;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let timeout = Timespec::try_from(left).expect("a short limit");
        let mut polled: Vec<PollFd> = fds.iter().map(|fd| PollFd::new(fd, PollFlags::IN)).collect();
        match poll(&mut polled, Some(&timeout)) {
            Ok(0) => return false,
            Ok(_) => return true,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => panic!("poll on pidfds: {e}"),
        }
    }
}

/// Waits until `pid` has exited (a zombie has) or `limit` passes; whether
/// it has. Does not reap it.
pub fn wait_exit(pid: u32, limit: Duration) -> bool {
    wait_any_exit(&[pid], limit)
}

/// Waits at most `limit` for `child` to end, and reaps it: its status, or
/// `None` if it still runs.
pub fn wait_child(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    wait_exit(child.id(), limit);
    child.try_wait().expect("try_wait")
}
