//! [`write_all_until`]: every host write across a guest channel has a
//! deadline.
//!
//! A guest decides when it reads. A blocking `write_all` of a framed cell to
//! a container's stdin, or of a job to a worker's socket, waits for as long
//! as the guest does not read, holding whatever the caller holds meanwhile
//! (a session's turn, a server's run slot). Written here instead, the write
//! is non-blocking and waits for room with `poll` until the caller's
//! deadline, after which the caller kills the guest.

use std::io;
use std::os::fd::AsFd;
use std::time::Instant;

/// Why a write did not complete.
#[derive(Debug)]
pub(crate) enum WriteError {
    /// The deadline passed first: the reader may have seen part of the message.
    TimedOut,
    /// The reader is gone (`EPIPE`) or the write failed, after `written` bytes.
    Closed {
        /// Bytes written before the failure.
        #[cfg_attr(not(any(feature = "js", feature = "wasm")), allow(dead_code))]
        written: usize,
    },
}

/// How [`write_all_until`] writes to its file descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// A pipe: `write(2)`.
    #[cfg_attr(not(feature = "container"), allow(dead_code))]
    Pipe,
    /// A socket: `send(2)` with `MSG_NOSIGNAL`, so a dead reader is an
    /// `EPIPE` error and never a `SIGPIPE` that would kill a host which does
    /// not ignore it.
    #[cfg_attr(not(any(feature = "js", feature = "wasm")), allow(dead_code))]
    Socket,
}

/// Makes `fd` non-blocking (once, before the first [`write_all_until`] on it).
pub(crate) fn set_nonblocking(fd: impl AsFd) -> io::Result<()> {
    rustix::io::ioctl_fionbio(fd, true).map_err(io::Error::from)
}

/// Writes all of `bytes` to the non-blocking `fd` (see [`set_nonblocking`]),
/// waiting for room at most until `until` (`None`: no limit).
pub(crate) fn write_all_until(
    fd: impl AsFd,
    endpoint: Endpoint,
    bytes: &[u8],
    until: Option<Instant>,
) -> Result<(), WriteError> {
    let fd = fd.as_fd();
    let mut written = 0;
    while written < bytes.len() {
        let attempt = match endpoint {
            Endpoint::Pipe => rustix::io::write(fd, &bytes[written..]),
            Endpoint::Socket => rustix::net::send(
                fd,
                &bytes[written..],
                rustix::net::SendFlags::NOSIGNAL | rustix::net::SendFlags::DONTWAIT,
            ),
        };
        match attempt {
            Ok(n) => written += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::AGAIN) => {
                if !wait_writable(fd, until) {
                    return Err(WriteError::TimedOut);
                }
            }
            Err(_) => return Err(WriteError::Closed { written }),
        }
    }
    Ok(())
}

/// Waits until `fd` has room (or an error to report); false if `until`
/// passed first.
fn wait_writable(fd: std::os::fd::BorrowedFd<'_>, until: Option<Instant>) -> bool {
    super::poll::ready(fd, rustix::event::PollFlags::OUT, until)
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_reader_that_never_reads_costs_the_writer_its_deadline_only() {
        let (mut read, write) = std::io::pipe().unwrap();
        set_nonblocking(&write).unwrap();
        let started = Instant::now();
        let big = vec![7u8; 4 << 20];
        let until = Some(Instant::now() + Duration::from_millis(100));
        let err = write_all_until(&write, Endpoint::Pipe, &big, until).unwrap_err();
        assert!(matches!(err, WriteError::TimedOut), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
        // A reader that reads gets the part written before, then everything.
        let reader = std::thread::spawn(move || {
            let mut all = Vec::new();
            read.read_to_end(&mut all).unwrap();
            all.len()
        });
        write_all_until(&write, Endpoint::Pipe, &big, None).unwrap();
        drop(write);
        let read = reader.join().unwrap();
        assert!(read > big.len() && read < 2 * big.len(), "{read}");
    }

    #[test]
    fn a_closed_reader_is_an_error_not_a_signal() {
        let (host, guest) = std::os::unix::net::UnixStream::pair().unwrap();
        set_nonblocking(&host).unwrap();
        drop(guest);
        let err = write_all_until(&host, Endpoint::Socket, b"hello", None).unwrap_err();
        assert!(matches!(err, WriteError::Closed { written: 0 }), "{err:?}");
    }
}
