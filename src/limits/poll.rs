//! The one wait on a descriptor that every host-side reader and writer uses:
//! `poll(2)` until the descriptor is ready or a deadline passes, no sleeps.

use std::os::fd::AsFd;
use std::time::Instant;

use rustix::event::{PollFd, PollFlags, Timespec, poll};

/// Waits until `fd` is ready for `flags` (`PollFlags::IN`: readable or hung
/// up; `OUT`: room to write; a pidfd is readable once its process exited):
/// true then, false once `until` has passed (a deadline already past still
/// gets one look, without waiting). A `poll` that fails cannot wait: true,
/// so the caller's read, write or `try_wait` reports what is wrong.
pub(crate) fn ready(fd: impl AsFd, flags: PollFlags, until: Option<Instant>) -> bool {
    loop {
        let timeout = until.map(|at| {
            let left = at.saturating_duration_since(Instant::now());
            Timespec::try_from(left).unwrap_or(Timespec { tv_sec: i64::MAX, tv_nsec: 0 })
        });
        let mut fds = [PollFd::new(&fd, flags)];
        match poll(&mut fds, timeout.as_ref()) {
            Ok(0) => {
                if until.is_some_and(|at| Instant::now() >= at) {
                    return false;
                }
            }
            Ok(_) => return true,
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::Duration;

    #[test]
    fn waits_for_data_or_the_deadline() {
        let (read, mut write) = std::io::pipe().unwrap();
        let soon = Some(Instant::now() + Duration::from_millis(50));
        assert!(!ready(&read, PollFlags::IN, soon), "nothing to read");
        assert!(!ready(&read, PollFlags::IN, Some(Instant::now())), "a passed deadline looks once");
        write.write_all(b"x").unwrap();
        assert!(ready(&read, PollFlags::IN, Some(Instant::now())), "ready now, even at the deadline");
        assert!(ready(&write, PollFlags::OUT, None));
    }
}
