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
    child: Child,
    pid: Pid,
    /// Frames to the worker (its stdin). A socket, not a pipe: written with
    /// `MSG_NOSIGNAL`, a dead worker is an `EPIPE` error, never a `SIGPIPE`
    /// that would kill a host which does not ignore it.
    to_worker: UnixStream,
    /// Names the process for kills from other threads (see [`ChildHandle`]).
    handle: ChildHandle,
    /// Frames from the worker (its stdout), non-blocking.
    frames: FrameReader<UnixStream>,
    stderr: ChildStderr,
    /// `/proc/<pid>/statm`, opened at spawn: its size is read before every run.
    statm: Option<File>,
    /// Set once the process is known dead (and reaped).
    status: Option<ExitStatus>,
    /// The host's own `RLIMIT_AS` hard limit, and its CPUs, when it started
    /// the worker.
    hard_as: Option<u64>,
    #[cfg_attr(not(feature = "js"), allow(dead_code))]
    host_cpus: Option<rustix::thread::CpuSet>,
    /// Sent SIGKILL by [`WorkerProcess::stop`], not yet reaped.
    #[cfg_attr(not(feature = "js"), allow(dead_code))]
    stopped: bool,
    /// Its sockets on a runtime's reactor, once an async caller talked to it.
    #[cfg(feature = "js")]
    reactor: Option<Sockets>,
}

/// How long a worker that closed its end may take to exit before it is
/// killed ([`WorkerProcess::death`]).
const DEATH_WAIT: Duration = Duration::from_millis(500);

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
    fn death_after(&mut self, exited: bool) -> Death {
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
    written: usize,
    /// A write failed: the worker is gone (its read side says how).
    closed: bool,
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

    fn wants_room(&self) -> bool {
        !self.frames.is_empty() && !self.closed
    }

    /// Writes what the socket takes now, without waiting.
    fn write_some(&mut self, to: &UnixStream) {
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

// A worker's conversation for an async caller: the same frames as
// `WorkerProcess::send` and `WorkerProcess::exchange`, waited for on the
// runtime's reactor rather than on a thread. Only where
// `crate::reactor::here`: tokio panics registering a descriptor with a
// runtime that has no I/O driver.
#[cfg(feature = "js")]
pub(crate) use on_reactor::{NoReactor, Registered, Sockets};

#[cfg(feature = "js")]
mod on_reactor {
    use std::io;
    use std::os::fd::{AsFd, OwnedFd};
    use std::time::{Duration, Instant};

    use serde::Serialize;
    use serde::de::DeserializeOwned;
    use tokio::io::Interest;
    use tokio::io::unix::AsyncFd;

    use crate::backends::worker::frame::{RecvError, Waited};
    use crate::backends::worker::process::{DEATH_WAIT, Death, Outbox, SendError, WorkerProcess};

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
    struct Alarm(Registered);

    impl Alarm {
        fn new() -> io::Result<Self> {
            use rustix::time::{TimerfdClockId, TimerfdFlags, timerfd_create};
            let fd = timerfd_create(TimerfdClockId::Monotonic, TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC)?;
            Registered::owning(fd, Interest::READABLE).map(Self)
        }

        /// Rings at `until`, or never (`None`), replacing any earlier setting.
        fn set(&self, until: Option<Instant>) -> Result<(), NoReactor> {
            use rustix::time::{Itimerspec, TimerfdTimerFlags, Timespec, timerfd_settime};
            let never = Timespec { tv_sec: 0, tv_nsec: 0 };
            let value = match until {
                // A zero value disarms: a deadline already past rings in 1 ns.
                Some(at) => {
                    Timespec::try_from(at.saturating_duration_since(Instant::now()).max(Duration::from_nanos(1)))
                        .unwrap_or(Timespec { tv_sec: i64::MAX, tv_nsec: 0 })
                }
                None => never,
            };
            let spec = Itimerspec { it_interval: never, it_value: value };
            timerfd_settime(self.0.0.get_ref(), TimerfdTimerFlags::empty(), &spec).map_err(|_| NoReactor)?;
            Ok(())
        }

        /// Waits until it rang. Reads the expiry, so a readiness left from an
        /// earlier setting is waited past.
        async fn rung(&self) -> Result<(), NoReactor> {
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
        runtime: tokio::runtime::Id,
        from_worker: Registered,
        /// Registered only once a write found no room: a registration for
        /// writability wakes the reactor at every change of room, which on a
        /// small machine took CPU from the worker it waits for.
        to_worker: Option<Registered>,
        /// The deadline of its conversation (or of its reaping).
        alarm: Alarm,
    }

    impl WorkerProcess {
        /// Registers the worker's frames with the current runtime's reactor,
        /// unless they are already. Only where [`crate::reactor::here`].
        pub fn on_reactor(&mut self) -> io::Result<()> {
            let runtime = tokio::runtime::Handle::try_current().map_err(io::Error::other)?.id();
            if self.reactor.as_ref().is_none_or(|sockets| sockets.runtime != runtime) {
                self.reactor = None;
                let from_worker = Registered::new(&self.frames, Interest::READABLE)?;
                self.reactor = Some(Sockets { runtime, from_worker, to_worker: None, alarm: Alarm::new()? });
            }
            Ok(())
        }

        /// Sets the deadline that [`WorkerProcess::send_async`],
        /// [`WorkerProcess::exchange_async`] and the waits for an exit keep:
        /// `None` for none (an idle worker's alarm is off: it would wake the
        /// reactor for nothing).
        pub fn set_alarm(&mut self, until: Option<Instant>) -> Result<(), NoReactor> {
            self.reactor.as_ref().ok_or(NoReactor)?.alarm.set(until)
        }

        /// Registers the write side with the reactor, unless it is already
        /// (see [`Sockets::to_worker`]).
        fn watch_room(&mut self) -> Result<&Sockets, NoReactor> {
            let sockets = self.reactor.as_mut().ok_or(NoReactor)?;
            if sockets.to_worker.is_none() {
                sockets.to_worker = Some(Registered::new(&self.to_worker, Interest::WRITABLE).map_err(|_| NoReactor)?);
            }
            Ok(sockets)
        }

        /// Waits on the reactor for room to write to the worker: false if the
        /// alarm rang first.
        async fn room(&mut self) -> Result<bool, NoReactor> {
            let sockets = self.watch_room()?;
            let to_worker = sockets.to_worker.as_ref().ok_or(NoReactor)?;
            tokio::select! {
                biased;
                room = to_worker.wait(Interest::WRITABLE) => room.map(|()| true),
                rung = sockets.alarm.rung() => rung.map(|()| false),
            }
        }

        /// [`WorkerProcess::send`] for an async caller, after
        /// [`WorkerProcess::on_reactor`]: the frame goes out as the worker
        /// makes room, until the alarm ([`WorkerProcess::set_alarm`]) rings. A
        /// frame cut short makes the worker unusable, as
        /// [`SendError::TimedOut`] says; so does one cut short by
        /// [`NoReactor`].
        pub async fn send_async(&mut self, message: &impl Serialize) -> Result<Result<(), SendError>, NoReactor> {
            let mut outbox = Outbox::default();
            if outbox.push(message).is_err() {
                return Ok(Err(SendError::Closed { written: 0 }));
            }
            loop {
                outbox.write_some(&self.to_worker);
                if outbox.closed {
                    return Ok(Err(SendError::Closed { written: outbox.written }));
                }
                if outbox.len() == 0 {
                    return Ok(Ok(()));
                }
                if !self.room().await? {
                    return Ok(Err(SendError::TimedOut));
                }
            }
        }

        /// [`WorkerProcess::exchange`] for an async caller: the next frame,
        /// meanwhile writing `outbox` as the worker makes room, or `Ok(None)`
        /// as soon as `wake` is ready (the caller has frames to add and clears
        /// `wake`), or [`RecvError::TimedOut`] once the alarm
        /// ([`WorkerProcess::set_alarm`]) rings. Cancel-safe: a
        /// partial frame read so far is kept for the next call, and the outbox
        /// knows what it wrote.
        pub async fn exchange_async<T: DeserializeOwned>(
            &mut self,
            outbox: &mut Outbox,
            wake: Option<&Registered>,
            max: usize,
        ) -> Result<Result<Option<T>, RecvError>, NoReactor> {
            loop {
                outbox.write_some(&self.to_worker);
                // Reads what is there, without waiting.
                match self.frames.recv_or(None, max, |_, _| Waited::Interrupted) {
                    Ok(None) => {}
                    heard => return Ok(heard),
                }
                let wants_room = outbox.wants_room();
                if wants_room {
                    self.watch_room()?;
                }
                let sockets = self.reactor.as_ref().ok_or(NoReactor)?;
                let woken = async {
                    match wake {
                        Some(wake) => wake.wait(Interest::READABLE).await,
                        None => std::future::pending().await,
                    }
                };
                let room = async {
                    match &sockets.to_worker {
                        Some(to_worker) if wants_room => to_worker.wait(Interest::WRITABLE).await,
                        _ => std::future::pending().await,
                    }
                };
                tokio::select! {
                    biased;
                    woken = woken => return woken.map(|()| Ok(None)),
                    readable = sockets.from_worker.wait(Interest::READABLE) => readable?,
                    room = room => room?,
                    rung = sockets.alarm.rung() => return rung.map(|()| Err(RecvError::TimedOut)),
                }
            }
        }

        /// Reaps a worker that [`WorkerProcess::stop`] signalled, once it has
        /// exited, waiting for that on the reactor (a worker not stopped is
        /// left alone). If it has not exited within [`REAP_WAIT`] (stuck in the
        /// kernel), reaping is left to its drop.
        pub async fn reap_async(&mut self) {
            if self.stopped && self.status.is_none() && self.exit_async(REAP_WAIT).await {
                self.status = self.child.try_wait().ok().flatten();
            }
        }

        /// [`WorkerProcess::death`] for an async caller: its wait for the exit
        /// is on the reactor.
        pub async fn death_async(&mut self) -> Death {
            let exited = self.status.is_some() || self.exit_async(DEATH_WAIT).await;
            self.death_after(exited)
        }

        /// Waits on the reactor, at most `limit`, until the worker has exited
        /// (true). Does not reap it. Without a reactor to wait on, waits on
        /// this thread (a stopped worker exits at once).
        async fn exit_async(&mut self, limit: Duration) -> bool {
            let until = Instant::now() + limit;
            let exit = Registered::new(&self.handle, Interest::READABLE);
            let waited = match (exit, self.set_alarm(Some(until)), self.reactor.as_ref()) {
                (Ok(exit), Ok(()), Some(sockets)) => tokio::select! {
                    biased;
                    exited = exit.wait(Interest::READABLE) => exited.map(|()| true),
                    rung = sockets.alarm.rung() => rung.map(|()| false),
                },
                _ => Err(NoReactor),
            };
            waited.unwrap_or_else(|NoReactor| self.handle.wait_exit(Some(until)))
        }
    }

    /// How long a stopped worker may take to exit before its reaping is left to
    /// its drop ([`WorkerProcess::reap_async`]).
    const REAP_WAIT: Duration = Duration::from_secs(1);
}
