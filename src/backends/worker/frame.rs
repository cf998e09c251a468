//! Frames between the host and a worker: a 4-byte little-endian length, then
//! that many bytes of JSON.
//!
//! Both sides refuse a frame over their limit. The host reads with a
//! deadline from a non-blocking pipe: a worker may be slow, silent or
//! hostile, and none of that may hang the host.

use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Instant;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Largest frame either side accepts: a backstop, not a policy limit (the
/// policy's caps are applied before frames are built and after they arrive).
pub(crate) const MAX_FRAME_BYTES: usize = 64 << 20;

/// The bytes of one frame holding `message`.
pub(crate) fn encode(message: &impl Serialize) -> io::Result<Vec<u8>> {
    let mut bytes = vec![0u8; 4];
    serde_json::to_writer(&mut bytes, message)?;
    let len = u32::try_from(bytes.len() - 4)
        .ok()
        .filter(|&len| len as usize <= MAX_FRAME_BYTES)
        .ok_or_else(|| io::Error::other("frame over the protocol's size limit"))?;
    bytes[..4].copy_from_slice(&len.to_le_bytes());
    Ok(bytes)
}

/// Reads one frame, blocking: the worker's side, which has nothing else to
/// do. `Ok(None)` on a clean end of stream before a frame starts.
pub(crate) fn read_blocking<T: DeserializeOwned>(input: &mut impl Read) -> io::Result<Option<T>> {
    let mut len = [0u8; 4];
    match input.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "frame over the protocol's size limit"));
    }
    let mut body = vec![0u8; len];
    input.read_exact(&mut body)?;
    serde_json::from_slice(&body).map(Some).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Why the host got no frame.
#[derive(Debug)]
pub(crate) enum RecvError {
    /// The deadline passed first.
    TimedOut,
    /// The worker closed its end (it exited or died).
    Closed,
    /// The worker sent something that is not a frame of the protocol.
    Invalid(String),
}

/// The host's reader of one worker's frames, over a non-blocking pipe.
pub(crate) struct FrameReader<R> {
    inner: R,
    /// Read buffer; `buf[start..filled]` is unread. Its length only grows
    /// (for a frame larger than it), so reads never zero memory again.
    buf: Vec<u8>,
    start: usize,
    filled: usize,
}

impl<R: AsFd> AsFd for FrameReader<R> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.as_fd()
    }
}

impl<R: Read + AsFd> FrameReader<R> {
    /// Takes the read end of a pipe and makes it non-blocking.
    pub fn new(inner: R) -> io::Result<Self> {
        rustix::io::ioctl_fionbio(inner.as_fd(), true)?;
        Ok(Self { inner, buf: vec![0; 64 << 10], start: 0, filled: 0 })
    }

    /// The next frame, waiting at most until `until` (`None`: no limit).
    /// Frames over `max` bytes are refused.
    pub fn recv<T: DeserializeOwned>(&mut self, until: Option<Instant>, max: usize) -> Result<T, RecvError> {
        let waited = self.recv_or(until, max, |fd, until| match wait_readable(&fd, until) {
            true => Waited::Readable,
            false => Waited::TimedOut,
        });
        waited?.ok_or(RecvError::TimedOut)
    }

    /// [`FrameReader::recv`], where `wait` waits for the pipe to become
    /// readable (it may do other work meanwhile) and may end the wait early
    /// ([`Waited::Interrupted`]): then `Ok(None)`, any partial frame kept
    /// for the next call.
    pub fn recv_or<T: DeserializeOwned>(
        &mut self,
        until: Option<Instant>,
        max: usize,
        mut wait: impl FnMut(BorrowedFd<'_>, Option<Instant>) -> Waited,
    ) -> Result<Option<T>, RecvError> {
        loop {
            let unread = &self.buf[self.start..self.filled];
            if unread.len() >= 4 {
                let len = u32::from_le_bytes([unread[0], unread[1], unread[2], unread[3]]) as usize;
                if len > max.min(MAX_FRAME_BYTES) {
                    return Err(RecvError::Invalid(format!("a frame of {len} bytes, over the limit of {max}")));
                }
                if unread.len() >= 4 + len {
                    let parsed = serde_json::from_slice(&unread[4..4 + len]);
                    self.start += 4 + len;
                    if self.start == self.filled {
                        (self.start, self.filled) = (0, 0);
                    }
                    return parsed.map(Some).map_err(|e| RecvError::Invalid(format!("an unreadable frame: {e}")));
                }
                if !self.fill(4 + len - unread.len(), until, &mut wait)? {
                    return Ok(None);
                }
            } else if !self.fill(4 - unread.len(), until, &mut wait)? {
                return Ok(None);
            }
        }
    }

    /// Reads at least one more byte (up to what is available and fits),
    /// with room for `wanted` more, waiting with `wait` until `until`;
    /// false if `wait` was interrupted first.
    fn fill(
        &mut self,
        wanted: usize,
        until: Option<Instant>,
        wait: &mut impl FnMut(BorrowedFd<'_>, Option<Instant>) -> Waited,
    ) -> Result<bool, RecvError> {
        if self.start > 0 {
            // Move the unread bytes to the front.
            self.buf.copy_within(self.start..self.filled, 0);
            self.filled -= self.start;
            self.start = 0;
        }
        if self.buf.len() < self.filled + wanted {
            self.buf.resize(self.filled + wanted, 0);
        }
        loop {
            match self.inner.read(&mut self.buf[self.filled..]) {
                Ok(0) => return Err(RecvError::Closed),
                Ok(n) => {
                    self.filled += n;
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => match wait(self.inner.as_fd(), until) {
                    Waited::Readable => {}
                    Waited::TimedOut => return Err(RecvError::TimedOut),
                    Waited::Interrupted => return Ok(false),
                },
                Err(_) => return Err(RecvError::Closed),
            }
        }
    }
}

/// How a wait for a readable pipe ended (see [`FrameReader::recv_or`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Waited {
    /// The pipe is readable (or hung up, or the wait failed: the read says which).
    Readable,
    /// The deadline passed first.
    TimedOut,
    /// Something else needs the caller.
    Interrupted,
}

/// Waits until `fd` is readable (or hung up); false if `until` passed first.
fn wait_readable(fd: &impl AsFd, until: Option<Instant>) -> bool {
    crate::limits::poll::ready(fd, rustix::event::PollFlags::IN, until)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::Duration;

    #[test]
    fn frames_round_trip_through_a_pipe_and_time_out_when_silent() {
        let (read, mut write) = std::io::pipe().unwrap();
        let mut reader = FrameReader::new(read).unwrap();
        write.write_all(&encode(&serde_json::json!({"a": 1})).unwrap()).unwrap();
        write.write_all(&encode(&"second").unwrap()).unwrap();
        let first: serde_json::Value = reader.recv(None, 1 << 20).unwrap();
        assert_eq!(first, serde_json::json!({"a": 1}));
        let second: String = reader.recv(None, 1 << 20).unwrap();
        assert_eq!(second, "second");
        let until = Some(Instant::now() + Duration::from_millis(20));
        assert!(matches!(reader.recv::<String>(until, 1 << 20), Err(RecvError::TimedOut)));
        drop(write);
        assert!(matches!(reader.recv::<String>(None, 1 << 20), Err(RecvError::Closed)));
    }

    #[test]
    fn oversized_and_garbled_frames_are_refused() {
        let (read, mut write) = std::io::pipe().unwrap();
        let mut reader = FrameReader::new(read).unwrap();
        write.write_all(&(1u32 << 30).to_le_bytes()).unwrap();
        assert!(matches!(reader.recv::<String>(None, 1 << 20), Err(RecvError::Invalid(_))));

        let (read, mut write) = std::io::pipe().unwrap();
        let mut reader = FrameReader::new(read).unwrap();
        write.write_all(&3u32.to_le_bytes()).unwrap();
        write.write_all(b"{{{").unwrap();
        assert!(matches!(reader.recv::<String>(None, 1 << 20), Err(RecvError::Invalid(_))));
    }

    #[test]
    fn blocking_reads_see_frames_and_a_clean_end() {
        let mut bytes = encode(&42u32).unwrap();
        bytes.extend(encode(&43u32).unwrap());
        let mut input = &bytes[..];
        assert_eq!(read_blocking::<u32>(&mut input).unwrap(), Some(42));
        assert_eq!(read_blocking::<u32>(&mut input).unwrap(), Some(43));
        assert_eq!(read_blocking::<u32>(&mut input).unwrap(), None);
    }
}
