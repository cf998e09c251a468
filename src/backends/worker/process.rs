//! The host's handle on one worker process: spawn it locked into its own
//! session with the host as its reaper of last resort, talk to it in frames,
//! cap its address space, kill it, and say how it died.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, ChildStderr, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::process::{Pid, Resource, Rlimit, Signal};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::frame::{self, FrameReader, RecvError, Waited};
use super::role::{PROTOCOL, PROTOCOL_ENV, ROLE_ENV, Role};
use crate::limits::child::ChildHandle;
use crate::limits::write::{Endpoint, WriteError, set_nonblocking, write_all_until};

/// How a worker is started: which binary, which role, and its stack.
#[derive(Clone, Debug)]
pub(crate) struct SpawnSpec {
    pub program: PathBuf,
    pub role: Role,
    /// `RLIMIT_STACK` (the main thread's stack may grow this far; the engine
    /// runs on the main thread).
    pub stack_bytes: u64,
}

/// One live worker process.
pub(crate) struct WorkerProcess {
    pub(super) child: Child,
    pid: Pid,
    /// Frames to the worker (its stdin). A socket, not a pipe: written with
    /// `MSG_NOSIGNAL`, a dead worker is an `EPIPE` error, never a `SIGPIPE`
    /// that would kill a host which does not ignore it.
    pub(super) to_worker: UnixStream,
    /// Names the process for kills from other threads (see [`ChildHandle`]).
    pub(super) handle: ChildHandle,
    /// Frames from the worker (its stdout), non-blocking.
    pub(super) frames: FrameReader<UnixStream>,
    stderr: ChildStderr,
    /// `/proc/<pid>/statm`, opened at spawn: its size is read before every run.
    statm: Option<File>,
    /// Set once the process is known dead (and reaped).
    pub(super) status: Option<ExitStatus>,
    /// The host's own `RLIMIT_AS` hard limit, and its CPUs, when it started
    /// the worker.
    hard_as: Option<u64>,
    #[cfg_attr(not(feature = "js"), allow(dead_code))]
    host_cpus: Option<rustix::thread::CpuSet>,
    /// Sent SIGKILL by [`WorkerProcess::stop`], not yet reaped.
    #[cfg_attr(not(feature = "js"), allow(dead_code))]
    pub(super) stopped: bool,
    /// Its sockets on a runtime's reactor, once an async caller talked to it.
    #[cfg(feature = "js")]
    pub(super) reactor: Option<super::registered::Sockets>,
}

/// How long a worker that closed its end may take to exit before it is
/// killed ([`WorkerProcess::death`]).
pub(super) const DEATH_WAIT: Duration = Duration::from_millis(500);

/// Why a frame did not reach a worker.
#[derive(Debug)]
pub(crate) enum SendError {
    /// The deadline passed first: the worker may have started reading the
    /// frame, so it must not be given another.
    TimedOut,
    /// The worker is gone (or the frame could not be built), after `written` bytes.
    Closed { written: usize },
}

impl SendError {
    /// True if no byte reached the worker: nothing of the frame was seen.
    #[cfg_attr(not(feature = "js"), allow(dead_code))]
    pub fn nothing_sent(&self) -> bool {
        matches!(self, SendError::Closed { written: 0 })
    }
}

/// How a worker ended, for the caller's message and outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Death {
    /// Killed by the host (deadline, shutdown).
    KilledByHost,
    /// A signal the host did not send.
    Signal { signal: i32, stderr: String },
    /// Exited with a status code.
    Exited { code: i32, stderr: String },
}

impl Death {
    /// What the worker wrote to stderr before it died (Rust's panic and
    /// abort messages land there), if anything.
    pub fn stderr(&self) -> &str {
        match self {
            Death::KilledByHost => "",
            Death::Signal { stderr, .. } | Death::Exited { stderr, .. } => stderr,
        }
    }

    /// Whether Rust's allocator aborted the worker: it hit its memory cap
    /// (`memory allocation of N bytes failed`).
    pub fn ran_out_of_memory(&self) -> bool {
        self.stderr().contains("memory allocation of")
    }

    /// Whether Rust's guard page stopped native recursion in the worker.
    #[cfg_attr(not(feature = "js"), allow(dead_code))]
    pub fn overflowed_stack(&self) -> bool {
        self.stderr().contains("has overflowed its stack")
    }

    /// The first non-blank line of stderr: a panic's or abort's message.
    pub fn first_stderr_line(&self) -> Option<&str> {
        self.stderr().lines().find(|line| !line.trim().is_empty())
    }
}

impl WorkerProcess {
    /// Starts a worker on the process-wide spawner thread (see [`spawner`]).
    pub fn spawn(spec: &SpawnSpec) -> io::Result<Self> {
        let (reply, answer) = mpsc::sync_channel(1);
        let sent = spawner().lock().send((spec.clone(), reply));
        if sent.is_err() {
            return Err(io::Error::other("the worker spawner thread is gone"));
        }
        answer.recv().unwrap_or_else(|_| Err(io::Error::other("the worker spawner thread is gone")))
    }

    /// The worker's process id.
    #[cfg_attr(not(feature = "js"), allow(dead_code))]
    pub fn pid(&self) -> u32 {
        self.pid.as_raw_nonzero().get() as u32
    }

    /// Sends one frame, waiting for the worker to read it at most until
    /// `until`. A worker reads as soon as it is idle; one that does not (it
    /// is busy, stuck or hostile) costs the caller its deadline, no more.
    pub fn send(&mut self, message: &impl Serialize, until: Option<Instant>) -> Result<(), SendError> {
        let bytes = frame::encode(message).map_err(|_| SendError::Closed { written: 0 })?;
        write_all_until(&self.to_worker, Endpoint::Socket, &bytes, until).map_err(|e| match e {
            WriteError::TimedOut => SendError::TimedOut,
            WriteError::Closed { written } => SendError::Closed { written },
        })
    }

    /// A handle that kills this worker from any thread, even while another
    /// thread talks to it (a session closed during its call).
    #[cfg_attr(not(feature = "js"), allow(dead_code))]
    pub fn handle(&self) -> ChildHandle {
        self.handle.clone()
    }

    /// Receives one frame, waiting at most until `until`.
    pub fn recv<T: DeserializeOwned>(&mut self, until: Option<Instant>, max: usize) -> Result<T, RecvError> {
        self.frames.recv(until, max)
    }

    /// Receives one frame like [`WorkerProcess::recv`], meanwhile writing
    /// `outbox` to the worker as it makes room (never waiting for room
    /// while a frame could be read: neither side can block the other), and
    /// returning `Ok(None)` as soon as `wake` becomes readable (the caller
    /// has frames to add; it clears `wake`). A partial frame read so far is
    /// kept for the next call.
    #[cfg_attr(not(feature = "js"), allow(dead_code))]
    pub fn exchange<T: DeserializeOwned>(
        &mut self,
        outbox: &mut Outbox,
        wake: BorrowedFd<'_>,
        until: Option<Instant>,
        max: usize,
    ) -> Result<Option<T>, RecvError> {
        let to_worker = &self.to_worker;
        outbox.write_some(to_worker);
        self.frames.recv_or(until, max, |from, until| {
            loop {
                outbox.write_some(to_worker);
                let timeout = match until {
                    None => None,
                    Some(at) => {
                        let left = at.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            return Waited::TimedOut;
                        }
                        Some(Timespec::try_from(left).unwrap_or(Timespec { tv_sec: i64::MAX, tv_nsec: 0 }))
                    }
                };
                let mut fds = [
                    PollFd::new(&from, PollFlags::IN),
                    PollFd::new(&wake, PollFlags::IN),
                    PollFd::new(to_worker, PollFlags::OUT),
                ];
                // Room to write is waited for only while there is something to write.
                let watched = if outbox.wants_room() { 3 } else { 2 };
                match poll(&mut fds[..watched], timeout.as_ref()) {
                    Ok(0) => {}
                    Ok(_) if !fds[1].revents().is_empty() => return Waited::Interrupted,
                    Ok(_) if !fds[0].revents().is_empty() => return Waited::Readable,
                    // Room to write: written at the top of the loop.
                    Ok(_) => {}
                    Err(rustix::io::Errno::INTR) => {}
                    // A poll that fails cannot wait: let the read report the error.
                    Err(_) => return Waited::Readable,
                }
            }
        })
    }

    /// The worker's address-space size now, in bytes.
    pub fn vm_bytes(&mut self) -> io::Result<u64> {
        use std::os::unix::fs::FileExt;
        let statm = self.statm.as_ref().ok_or_else(|| io::Error::other("no /proc/<pid>/statm"))?;
        let mut text = [0u8; 64];
        let n = statm.read_at(&mut text, 0)?;
        let pages: u64 = std::str::from_utf8(&text[..n])
            .ok()
            .and_then(|t| t.split_whitespace().next())
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| io::Error::other("unreadable /proc/<pid>/statm"))?;
        Ok(pages.saturating_mul(page_size()))
    }

    /// Caps the worker's address space at its current size plus `extra`
    /// bytes (`RLIMIT_AS`, soft limit; set from outside, since the worker's
    /// seccomp filter forbids it to touch its own limits). An allocation past
    /// it fails inside the worker, which then aborts: the host sees
    /// [`Death`] with Rust's "memory allocation of N bytes failed".
    pub fn limit_memory(&mut self, extra: u64) -> io::Result<u64> {
        let limit = self.vm_bytes()?.saturating_add(extra);
        let hard = self.hard_as;
        let soft = hard.map_or(limit, |h| limit.min(h));
        rustix::process::prlimit(Some(self.pid), Resource::As, Rlimit { current: Some(soft), maximum: hard })?;
        Ok(soft)
    }

    /// Runs the worker on the CPU this thread is on, until [`unpin`]: a
    /// request and its answer are strictly serial (the caller waits), and
    /// on a small VM a wake-up on another CPU costs hundreds of
    /// microseconds each way (measured here: a contained call took 0.9 ms
    /// across CPUs and 0.45 ms on one, where the in-thread engine takes
    /// 0.4 ms). Best effort: an error only costs speed.
    ///
    /// [`unpin`]: WorkerProcess::unpin
    #[cfg_attr(not(feature = "js"), allow(dead_code))]
    pub fn pin_to_this_cpu(&self) {
        let mut here = rustix::thread::CpuSet::new();
        here.set(rustix::thread::sched_getcpu());
        let _ = rustix::thread::sched_setaffinity(Some(self.pid), &here);
    }

    /// Lets the worker run anywhere the host may (it then builds its next
    /// context on whichever CPU is free).
    #[cfg_attr(not(feature = "js"), allow(dead_code))]
    pub fn unpin(&self) {
        if let Some(all) = &self.host_cpus {
            let _ = rustix::thread::sched_setaffinity(Some(self.pid), all);
        }
    }

    /// Whether the process has exited (without waiting).
    pub fn has_exited(&mut self) -> bool {
        self.status.is_some() || matches!(self.child.try_wait(), Ok(Some(_)) | Err(_))
    }

    /// SIGKILLs the worker without reaping it ([`reap`], or `reap_async`
    /// for an async caller, does that). Idempotent.
    ///
    /// [`reap`]: WorkerProcess::reap
    #[cfg_attr(not(feature = "js"), allow(dead_code))]
    pub fn stop(&mut self) {
        if self.status.is_none() {
            self.handle.kill();
            self.stopped = true;
        }
    }

    /// Reaps a worker that [`WorkerProcess::stop`] signalled (waiting for
    /// its exit); a worker not stopped is left alone.
    #[cfg_attr(not(feature = "js"), allow(dead_code))]
    pub fn reap(&mut self) {
        if self.stopped && self.status.is_none() {
            self.status = self.child.wait().ok();
        }
    }

    /// SIGKILLs the worker and reaps it. Idempotent.
    pub fn kill(&mut self) {
        if self.status.is_some() {
            return;
        }
        self.handle.kill();
        self.status = self.child.wait().ok();
    }

    /// How the worker died, once its pipe closed: waits briefly for the exit
    /// (killing it if it lingers) and reads what it left on stderr.
    pub fn death(&mut self) -> Death {
        self.death_after(self.handle.wait_exit(Some(Instant::now() + DEATH_WAIT)))
    }

    /// [`WorkerProcess::death`] once the wait for its exit is over
    /// (`exited`: the exit was seen).
    pub(super) fn death_after(&mut self, exited: bool) -> Death {
        if self.status.is_none() {
            if exited {
                self.status = self.child.try_wait().ok().flatten();
            }
            if self.status.is_none() {
                self.kill();
                return Death::KilledByHost;
            }
        }
        let stderr = self.stderr_tail();
        match self.status {
            Some(status) => match (status.signal(), status.code()) {
                (Some(signal), _) => Death::Signal { signal, stderr },
                (None, Some(code)) => Death::Exited { code, stderr },
                (None, None) => Death::Exited { code: -1, stderr },
            },
            None => Death::KilledByHost,
        }
    }

    /// Up to 8 KiB of what the worker wrote to stderr (non-blocking).
    fn stderr_tail(&mut self) -> String {
        let _ = rustix::io::ioctl_fionbio(self.stderr.as_fd(), true);
        let mut bytes = Vec::new();
        let mut chunk = [0u8; 4096];
        while bytes.len() < 8 << 10 {
            match self.stderr.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => bytes.extend_from_slice(&chunk[..n]),
            }
        }
        String::from_utf8_lossy(&bytes).trim().to_string()
    }
}

/// Frames for a worker that the host sends while it also reads from the
/// worker (see [`WorkerProcess::exchange`]): written as the worker makes
/// room, never blocking.
#[derive(Default)]
#[cfg_attr(not(feature = "js"), allow(dead_code))]
pub(crate) struct Outbox {
    frames: VecDeque<Vec<u8>>,
    /// Bytes of the first frame already written.
    pub(super) written: usize,
    /// A write failed: the worker is gone (its read side says how).
    pub(super) closed: bool,
}

#[cfg_attr(not(feature = "js"), allow(dead_code))]
impl Outbox {
    /// Queues one frame holding `message`.
    pub fn push(&mut self, message: &impl Serialize) -> io::Result<()> {
        self.frames.push_back(frame::encode(message)?);
        Ok(())
    }

    /// Frames not yet written in full.
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    /// True when the worker has seen whole frames only (none was cut
    /// short): what it reads next is a frame's start.
    pub fn at_frame_boundary(&self) -> bool {
        self.written == 0 && !self.closed
    }

    pub(super) fn wants_room(&self) -> bool {
        !self.frames.is_empty() && !self.closed
    }

    /// Writes what the socket takes now, without waiting.
    pub(super) fn write_some(&mut self, to: &UnixStream) {
        while let Some(front) = self.frames.front() {
            let flags = rustix::net::SendFlags::NOSIGNAL | rustix::net::SendFlags::DONTWAIT;
            match rustix::net::send(to, &front[self.written..], flags) {
                Ok(n) => {
                    self.written += n;
                    if self.written == front.len() {
                        self.frames.pop_front();
                        self.written = 0;
                    }
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::AGAIN) => return,
                Err(_) => {
                    self.closed = true;
                    self.frames.clear();
                    return;
                }
            }
        }
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn page_size() -> u64 {
    static SIZE: OnceLock<u64> = OnceLock::new();
    *SIZE.get_or_init(|| rustix::param::page_size() as u64)
}

type SpawnRequest = (SpawnSpec, mpsc::SyncSender<io::Result<WorkerProcess>>);

/// The one thread that forks workers, for the life of the process.
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits,
/// not the process: a worker forked from a short-lived thread (a tokio
/// blocking thread, a caller's thread) would be killed when that thread
/// ends. Forking from one thread that never ends ties every worker's life to
/// the host process's.
fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        let started =
            std::thread::Builder::new().name("execbox-spawner".into()).stack_size(256 << 10).spawn(move || {
                while let Ok((spec, reply)) = rx.recv() {
                    let _ = reply.send(start(&spec));
                }
            });
        if let Err(e) = started {
            tracing::warn!(error = %e, "cannot start the worker spawner thread; workers are unavailable");
        }
        Mutex::new(tx)
    })
}

/// Forks and execs one worker (on the spawner thread).
fn start(spec: &SpawnSpec) -> io::Result<WorkerProcess> {
    let host = std::process::id();
    let stack = spec.stack_bytes;
    let (to_worker, worker_in) = UnixStream::pair()?;
    let (from_worker, worker_out) = UnixStream::pair()?;
    let mut command = Command::new(&spec.program);
    command
        .env_clear()
        .env(ROLE_ENV, spec.role.as_str())
        .env(PROTOCOL_ENV, PROTOCOL)
        // Transparent huge pages for the worker's heap: each run works on a
        // fresh context right after a switch from the host's address space,
        // and 2 MiB pages cut its TLB misses (measured on this VM: the
        // contained call went from ~1.5x to ~1.15x the in-thread one).
        // Ignored where glibc or the kernel has no such thing.
        .env("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
        .current_dir("/")
        .stdin(Stdio::from(std::os::fd::OwnedFd::from(worker_in)))
        .stdout(Stdio::from(std::os::fd::OwnedFd::from(worker_out)))
        .stderr(Stdio::piped());
    // SAFETY: the closure runs in the forked child before exec and calls only
    // raw system calls (rustix's and one libc `syscall`), which allocate
    // nothing and take no locks: async-signal-safe as `pre_exec` requires.
    unsafe {
        command.pre_exec(move || lock_in_child(host, stack));
    }
    let mut child = command.spawn()?;
    // The worker's ends now live in the child only.
    drop(command);
    let pid = Pid::from_raw(child.id() as i32).ok_or_else(|| io::Error::other("spawned a worker without a pid"))?;
    let Some(stderr) = child.stderr.take() else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(io::Error::other("a worker's stderr pipe is missing"));
    };
    let statm = File::open(format!("/proc/{}/statm", child.id())).ok();
    let frames = FrameReader::new(from_worker)?;
    let hard_as = rustix::process::getrlimit(Resource::As).maximum;
    let host_cpus = rustix::thread::sched_getaffinity(None).ok();
    set_nonblocking(&to_worker)?;
    let handle = ChildHandle::of(&child)?;
    Ok(WorkerProcess {
        child,
        pid,
        to_worker,
        handle,
        frames,
        stderr,
        statm,
        status: None,
        hard_as,
        host_cpus,
        stopped: false,
        #[cfg(feature = "js")]
        reactor: None,
    })
}

/// Runs in the child between fork and exec: new session, death with the
/// host, no core dumps, the stack the engine needs, no inherited fds.
fn lock_in_child(host: u32, stack_bytes: u64) -> io::Result<()> {
    use rustix::process::{getppid, set_parent_process_death_signal, setrlimit, setsid};
    // Out of the host's session and process group: a terminal's Ctrl-C or a
    // kill of the host's group does not reach it; the death signal does.
    setsid()?;
    set_parent_process_death_signal(Some(Signal::KILL))?;
    // The host may have died between fork and prctl: then nothing would kill us.
    if getppid().map(|p| p.as_raw_nonzero().get() as u32) != Some(host) {
        return Err(io::Error::other("the host exited during spawn"));
    }
    setrlimit(Resource::Core, Rlimit { current: Some(0), maximum: Some(0) })?;
    let stack_hard = rustix::process::getrlimit(Resource::Stack).maximum;
    let stack = stack_hard.map_or(stack_bytes, |h| stack_bytes.min(h));
    setrlimit(Resource::Stack, Rlimit { current: Some(stack), maximum: stack_hard })?;
    // Every fd above stderr that the host failed to mark close-on-exec is
    // marked now, so exec closes it. Marked, not closed: std reports a failed
    // exec through a close-on-exec pipe of its own, which must stay open
    // until then.
    const CLOSE_RANGE_CLOEXEC: u32 = 1 << 2;
    // SAFETY: close_range takes integers only; failure (kernels before 5.11)
    // is harmless because the seccomp filter forbids using any other fd.
    unsafe {
        libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC);
    }
    Ok(())
}
