//! This process's stdin and stdout as the stdio transport reads and writes
//! them: on the runtime's reactor when they are pipes or Unix stream
//! sockets, which is what MCP clients give a server they start (pipes from
//! most, a socket pair from Node's libuv).
//!
//! tokio's own `Stdin` and `Stdout` read and write on a thread of its
//! blocking pool, so every request and every answer crosses one more thread
//! than it must. Measured through `execbox serve` on 2 CPUs (rmcp's client,
//! `cargo bench --bench serve`, two runs each, alternating binaries): the
//! JS transform 1.02 / 1.12 → 0.79 / 0.77 ms, JS `return 2` paced 1.43 /
//! 1.46 → 1.04 / 0.98 ms, pooled Python `print(1+1)` paced 1.95 / 1.90 →
//! 1.45 / 1.51 ms.
//!
//! Reading and writing on the reactor takes `O_NONBLOCK`, a flag of the
//! open file that every descriptor of it shares, other processes' too. So:
//! - a pipe is opened anew through `/proc/self/fd` (a new open file on the
//!   same pipe), and only that one is made non-blocking; where that fails,
//!   tokio's blocking-thread `Stdin`/`Stdout` are kept;
//! - a named FIFO to read keeps the blocking thread: Linux reports no hang-up
//!   to a FIFO's reader opened non-blocking while it had no writer, so a
//!   reopened stdin whose writer had already written and gone would never
//!   see its end;
//! - a descriptor opened for the other direction (stdin open for writing
//!   only, say) is left alone: reopening it the way it is used would make the
//!   server a reader or writer of a pipe it was not given that end of;
//! - a socket cannot be opened anew: its flag is set, and cleared again when
//!   the transport drops its end, if it was clear before; a stdin socket that
//!   is also stderr, or stdout left on the blocking thread (one socket for
//!   all three, as systemd's `StandardInput=socket` or inetd give), is left
//!   blocking, since their writes would meet `EAGAIN`;
//! - a terminal, a regular file or anything else keeps tokio's
//!   blocking-thread `Stdin`/`Stdout`;
//! - stdout that is the same file as stderr (`2>&1`) keeps it too: logging
//!   to a non-blocking stderr could drop lines.
//!
//! No child of the server inherits either descriptor: workers, engine CLIs
//! and upstream servers all get their own stdio.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::pin::Pin;
use std::task::{Context, Poll};

use rustix::fs::OFlags;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;
use tokio::net::unix::pipe;

/// The server's stdin.
pub(super) struct ServerStdin {
    end: In,
    /// Dropped after `end`: the socket's flags as they were.
    _restore: Option<Blocking>,
}

enum In {
    Pipe(pipe::Receiver),
    Socket(UnixStream),
    Thread(tokio::io::Stdin),
}

/// The server's stdout.
pub(super) struct ServerStdout {
    end: Out,
    /// Dropped after `end`: the socket's flags as they were.
    _restore: Option<Blocking>,
}

enum Out {
    Pipe(pipe::Sender),
    Socket(UnixStream),
    Thread(tokio::io::Stdout),
}

/// Which way a descriptor is used.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Read,
    Write,
}

impl ServerStdin {
    /// This process's stdin (call within a runtime with I/O enabled), read
    /// beside `stdout`.
    pub fn new(stdout: &ServerStdout) -> Self {
        let (out, err) = (io::stdout(), io::stderr());
        let mut blocking = vec![err.as_fd()];
        if !stdout.on_reactor() {
            blocking.push(out.as_fd());
        }
        Self::of(io::stdin().as_fd(), &blocking)
    }

    /// `fd` as the transport reads it; `fd` itself is left as it was. A
    /// socket that is the same as one of `blocking` (written by blocking
    /// writes) is not made non-blocking.
    fn of(fd: BorrowedFd<'_>, blocking: &[BorrowedFd<'_>]) -> Self {
        let end = match Kind::of(fd, Direction::Read, blocking) {
            Kind::Pipe(fd) => pipe::Receiver::from_owned_fd(fd).ok().map(|r| (In::Pipe(r), None)),
            Kind::Socket(socket, restore) => UnixStream::from_std(socket).ok().map(|s| (In::Socket(s), Some(restore))),
            Kind::Other => None,
        };
        match end {
            Some((end, restore)) => ServerStdin { end, _restore: restore },
            None => ServerStdin { end: In::Thread(tokio::io::stdin()), _restore: None },
        }
    }

    /// Whether requests are read on the reactor (not tokio's blocking pool).
    #[cfg(test)]
    fn on_reactor(&self) -> bool {
        !matches!(self.end, In::Thread(_))
    }
}

impl ServerStdout {
    /// This process's stdout (call within a runtime with I/O enabled).
    pub fn new() -> Self {
        Self::of(io::stdout().as_fd(), io::stderr().as_fd())
    }

    /// `fd` as the transport writes it, unless it is the same file as
    /// `stderr`; `fd` itself is left as it was.
    fn of(fd: BorrowedFd<'_>, stderr: BorrowedFd<'_>) -> Self {
        let kind = if same_file(fd, stderr) { Kind::Other } else { Kind::of(fd, Direction::Write, &[]) };
        let end = match kind {
            Kind::Pipe(fd) => pipe::Sender::from_owned_fd(fd).ok().map(|w| (Out::Pipe(w), None)),
            Kind::Socket(socket, restore) => UnixStream::from_std(socket).ok().map(|s| (Out::Socket(s), Some(restore))),
            Kind::Other => None,
        };
        match end {
            Some((end, restore)) => ServerStdout { end, _restore: restore },
            None => ServerStdout { end: Out::Thread(tokio::io::stdout()), _restore: None },
        }
    }

    /// Whether answers are written on the reactor (not tokio's blocking pool).
    fn on_reactor(&self) -> bool {
        !matches!(self.end, Out::Thread(_))
    }
}

/// What a standard descriptor is, with a descriptor of it the reactor may
/// make non-blocking.
enum Kind {
    /// A pipe, opened anew: its own open file, shared with no one.
    Pipe(OwnedFd),
    /// A Unix stream socket (a duplicate: the open file is shared), and how
    /// to leave its flags as they were.
    Socket(std::os::unix::net::UnixStream, Blocking),
    Other,
}

impl Kind {
    fn of(fd: BorrowedFd<'_>, direction: Direction, blocking: &[BorrowedFd<'_>]) -> Kind {
        let Some(flags) = file_flags(fd) else { return Kind::Other };
        if !opened_for(flags, direction) {
            return Kind::Other;
        }
        let Ok(duplicate) = fd.try_clone_to_owned() else { return Kind::Other };
        let file = std::fs::File::from(duplicate);
        let Ok(meta) = file.metadata() else { return Kind::Other };
        let kind = meta.file_type();
        if kind.is_fifo() {
            if matches!(direction, Direction::Read) && !anonymous_pipe(fd) {
                return Kind::Other;
            }
            return match reopen(fd, direction) {
                Some(pipe) => Kind::Pipe(pipe),
                None => Kind::Other,
            };
        }
        if kind.is_socket() {
            if blocking.iter().any(|other| same_file(fd, *other)) {
                return Kind::Other;
            }
            let Some(restore) = Blocking::of(fd, flags) else { return Kind::Other };
            let socket = std::os::unix::net::UnixStream::from(OwnedFd::from(file));
            // Not a Unix stream socket (TCP from inetd, a datagram socket):
            // left alone.
            if socket.local_addr().is_ok() && is_stream(socket.as_fd()) && socket.set_nonblocking(true).is_ok() {
                return Kind::Socket(socket, restore);
            }
        }
        Kind::Other
    }
}

/// The flags of the open file `fd` names (`F_GETFL`).
fn file_flags(fd: BorrowedFd<'_>) -> Option<OFlags> {
    rustix::fs::fcntl_getfl(fd).ok()
}

/// Whether an open file with `flags` was opened for `direction` (reading,
/// or writing).
fn opened_for(flags: OFlags, direction: Direction) -> bool {
    let mode = flags & OFlags::RWMODE;
    mode == OFlags::RDWR
        || (direction == Direction::Read && mode == OFlags::RDONLY)
        || (direction == Direction::Write && mode == OFlags::WRONLY)
}

/// Whether `fd` is a pipe made by `pipe(2)` (`pipe:[inode]`), not a named
/// FIFO (a path).
fn anonymous_pipe(fd: BorrowedFd<'_>) -> bool {
    use std::os::unix::ffi::OsStrExt;
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .is_ok_and(|target| target.as_os_str().as_bytes().starts_with(b"pipe:["))
}

/// A new open file on the pipe `fd` names (through `/proc/self/fd`), so
/// that making it non-blocking touches no one else's.
fn reopen(fd: BorrowedFd<'_>, direction: Direction) -> Option<OwnedFd> {
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let mut options = std::fs::OpenOptions::new();
    match direction {
        Direction::Read => options.read(true),
        Direction::Write => options.write(true),
    };
    // Non-blocking at once: opening a pipe's read side with no writer left
    // would otherwise wait for one.
    let reopened = OwnedFd::from(options.custom_flags(libc::O_NONBLOCK).open(path).ok()?);
    // A descriptor swapped between the two looks: leave it all alone.
    same_file(reopened.as_fd(), fd).then_some(reopened)
}

/// Clears `O_NONBLOCK` on a socket's open file when dropped, if it was clear
/// when seen.
struct Blocking(Option<OwnedFd>);

impl Blocking {
    /// For `fd`, whose open file's flags are `flags` now.
    fn of(fd: BorrowedFd<'_>, flags: OFlags) -> Option<Blocking> {
        let was_blocking = !flags.contains(OFlags::NONBLOCK);
        Some(Blocking(if was_blocking { Some(fd.try_clone_to_owned().ok()?) } else { None }))
    }
}

impl Drop for Blocking {
    fn drop(&mut self) {
        if let Some(fd) = &self.0
            && let Some(flags) = file_flags(fd.as_fd())
        {
            let _ = rustix::fs::fcntl_setfl(fd, flags - OFlags::NONBLOCK);
        }
    }
}

/// Whether a socket is a stream socket (`SO_TYPE`).
fn is_stream(fd: BorrowedFd<'_>) -> bool {
    rustix::net::sockopt::socket_type(fd).is_ok_and(|kind| kind == rustix::net::SocketType::STREAM)
}

/// Whether two descriptors name the same file.
fn same_file(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> bool {
    let meta = |fd: BorrowedFd<'_>| {
        let file = std::fs::File::from(fd.try_clone_to_owned().ok()?);
        file.metadata().ok().map(|m| (m.dev(), m.ino()))
    };
    matches!((meta(a), meta(b)), (Some(a), Some(b)) if a == b)
}

impl AsyncRead for ServerStdin {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().end {
            In::Pipe(r) => Pin::new(r).poll_read(cx, buf),
            In::Socket(r) => Pin::new(r).poll_read(cx, buf),
            In::Thread(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ServerStdout {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match &mut self.get_mut().end {
            Out::Pipe(w) => Pin::new(w).poll_write(cx, buf),
            Out::Socket(w) => Pin::new(w).poll_write(cx, buf),
            Out::Thread(w) => Pin::new(w).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().end {
            Out::Pipe(w) => Pin::new(w).poll_flush(cx),
            Out::Socket(w) => Pin::new(w).poll_flush(cx),
            Out::Thread(w) => Pin::new(w).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().end {
            Out::Pipe(w) => Pin::new(w).poll_shutdown(cx),
            Out::Socket(w) => Pin::new(w).poll_shutdown(cx),
            Out::Thread(w) => Pin::new(w).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn nonblocking(fd: BorrowedFd<'_>) -> bool {
        file_flags(fd).expect("F_GETFL").contains(OFlags::NONBLOCK)
    }

    fn pipe() -> (std::io::PipeReader, std::io::PipeWriter) {
        std::io::pipe().expect("a pipe")
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    #[test]
    fn a_pipe_is_read_on_the_reactor_and_the_callers_descriptor_stays_blocking() {
        runtime().block_on(async {
            let (read, mut write) = pipe();
            let mut stdin = ServerStdin::of(read.as_fd(), &[]);
            assert!(stdin.on_reactor());
            assert!(!nonblocking(read.as_fd()), "the caller's open file must keep its flags");
            write.write_all(b"{\"jsonrpc\":\"2.0\"}\n").unwrap();
            drop(write);
            let mut text = String::new();
            stdin.read_to_string(&mut text).await.unwrap();
            assert_eq!(text, "{\"jsonrpc\":\"2.0\"}\n");
        });
    }

    #[test]
    fn a_pipe_is_written_on_the_reactor_in_order_to_a_slow_reader() {
        let (mut read, write) = pipe();
        let stderr = pipe().1;
        // More than a pipe holds (64 KiB): writes meet a full pipe and wait.
        let sent: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                std::thread::sleep(std::time::Duration::from_micros(200));
                match read.read(&mut chunk).unwrap() {
                    0 => return got,
                    n => got.extend_from_slice(&chunk[..n]),
                }
            }
        });
        runtime().block_on(async {
            let mut stdout = ServerStdout::of(write.as_fd(), stderr.as_fd());
            assert!(stdout.on_reactor());
            assert!(!nonblocking(write.as_fd()), "the caller's open file must keep its flags");
            stdout.write_all(&sent).await.unwrap();
            stdout.flush().await.unwrap();
        });
        drop(write);
        assert!(reader.join().unwrap() == sent, "every byte, in order");
    }

    #[test]
    fn a_socket_is_used_on_the_reactor_and_its_flag_is_cleared_again() {
        let (ours, mut theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        runtime().block_on(async {
            let mut stdin = ServerStdin::of(ours.as_fd(), &[]);
            assert!(stdin.on_reactor());
            theirs.write_all(b"ping\n").unwrap();
            let mut buf = [0u8; 5];
            stdin.read_exact(&mut buf).await.unwrap();
            assert_eq!(&buf, b"ping\n");
            assert!(nonblocking(ours.as_fd()), "a socket's one open file is made non-blocking while in use");
            drop(stdin);
        });
        assert!(!nonblocking(ours.as_fd()), "and blocking again once the transport is dropped");
    }

    #[test]
    fn a_datagram_socket_is_left_to_the_blocking_pool_untouched() {
        let (ours, _theirs) = std::os::unix::net::UnixDatagram::pair().unwrap();
        runtime().block_on(async {
            assert!(!ServerStdin::of(ours.as_fd(), &[]).on_reactor());
        });
        assert!(!nonblocking(ours.as_fd()));
    }

    #[test]
    fn files_and_stdout_shared_with_stderr_stay_on_the_blocking_pool() {
        runtime().block_on(async {
            let file = tempfile::tempfile().unwrap();
            assert!(!ServerStdin::of(file.as_fd(), &[]).on_reactor());
            assert!(!ServerStdout::of(file.as_fd(), pipe().1.as_fd()).on_reactor());
            let (_read, write) = pipe();
            let twin = write.try_clone().unwrap();
            assert!(!ServerStdout::of(write.as_fd(), twin.as_fd()).on_reactor(), "2>&1 keeps stderr blocking");
            assert!(!nonblocking(write.as_fd()));
        });
    }

    #[test]
    fn writing_to_a_pipe_whose_reader_is_gone_fails_and_does_not_hang() {
        runtime().block_on(async {
            let (read, write) = pipe();
            drop(read);
            let mut stdout = ServerStdout::of(write.as_fd(), pipe().1.as_fd());
            let err = stdout.write_all(b"answer\n").await.unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
        });
    }

    #[test]
    fn a_named_fifo_to_read_stays_on_the_blocking_pool() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("requests");
        let status = std::process::Command::new("mkfifo").arg(&path).status().unwrap();
        assert!(status.success());
        // Opened (as a shell's `< fifo` is) while the writer was there; the
        // writer is gone before the server looks at its stdin. Reopened
        // non-blocking now, the FIFO would never report its end to the
        // reactor (cli/tests/cli/serve.rs has the server that never exited).
        let read = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&path).unwrap();
        let mut write = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        write.write_all(b"{\"jsonrpc\":\"2.0\"}\n").unwrap();
        drop(write);
        runtime().block_on(async {
            assert!(!ServerStdin::of(read.as_fd(), &[]).on_reactor());
        });
    }

    #[test]
    fn a_descriptor_open_the_other_way_is_not_reopened_the_way_it_is_used() {
        runtime().block_on(async {
            // stdin that is the write end of a pipe (`serve 0>&1`): reading it
            // must fail as before, not make the server a reader of the pipe.
            let (read, write) = pipe();
            assert!(!ServerStdin::of(write.as_fd(), &[]).on_reactor());
            assert!(!ServerStdout::of(read.as_fd(), pipe().1.as_fd()).on_reactor());
        });
    }

    #[test]
    fn a_socket_that_is_also_stderr_is_left_blocking() {
        // One socket as stdin, stdout and stderr (systemd's
        // `StandardInput=socket`, inetd): stdout stays on the thread (it is
        // stderr), so stdin must not turn their shared open file non-blocking.
        let (ours, _theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let twin = ours.try_clone().unwrap();
        runtime().block_on(async {
            let stdout = ServerStdout::of(ours.as_fd(), twin.as_fd());
            assert!(!stdout.on_reactor());
            assert!(!ServerStdin::of(ours.as_fd(), &[twin.as_fd()]).on_reactor());
            assert!(!nonblocking(ours.as_fd()), "stderr's writes would meet EAGAIN");
        });
    }

    #[test]
    fn a_pipe_whose_writer_is_gone_is_reopened_without_waiting_and_reads_the_end() {
        runtime().block_on(async {
            let (read, write) = pipe();
            drop(write);
            let mut stdin = ServerStdin::of(read.as_fd(), &[]);
            assert!(stdin.on_reactor());
            let mut text = String::new();
            assert_eq!(stdin.read_to_string(&mut text).await.unwrap(), 0);
        });
    }
}
