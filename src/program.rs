//! Programs: processes that keep running in a workspace after the call that
//! started them (a REPL, a server, a build), which the caller polls, writes
//! to and kills.
//!
//! A [`Program`] is a handle on one: its output is kept in a ring of
//! [`ProgramSpec::max_output_bytes`] (older bytes are dropped, and counted)
//! and read from a cursor ([`Program::poll`]) or from any offset
//! ([`Program::log`]). Its input, signals and kill go to the backend that
//! carries it (see [`Executor::start_program`](crate::Executor::start_program)),
//! through its backend.
//!
//! Its life is capped by [`ProgramSpec::lifetime`]: at its end it is killed
//! (`SIGTERM`, then `SIGKILL` after [`KILL_GRACE`]). Closing its workspace
//! kills it too. A program's processes end with its first process: what it
//! left running (a double-forked daemon included) is killed when it exits.

// Only the container backend carries programs so far.
#![cfg_attr(not(feature = "container"), allow(dead_code))]

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};

use crate::error::ExecError;
use crate::policy::SandboxPolicy;

/// How long a program gets between `SIGTERM` and `SIGKILL` when its
/// lifetime ends.
pub const KILL_GRACE: Duration = Duration::from_secs(2);

/// How long a killed program's carrier gets to report it gone before the
/// handle stops waiting and calls it killed.
const KILL_CONFIRM: Duration = Duration::from_secs(5);

/// After output arrives, how long a poll waits for more before answering:
/// a REPL's echo and its answer come together.
const SETTLE: Duration = Duration::from_millis(2);

/// Output kept per program unless the spec says otherwise.
pub const DEFAULT_OUTPUT_BYTES: usize = 1 << 20;

/// The most one [`Program::write`] may carry.
pub const MAX_WRITE_BYTES: usize = 1 << 20;

/// Input a program has not read that its carrier holds for it; past it,
/// input is dropped and counted ([`ProgramOutput::input_dropped_bytes`]).
pub const MAX_PENDING_INPUT_BYTES: usize = 4 << 20;

/// Bytes of input per message to the carrier: a long write goes in pieces.
const WRITE_PIECE: usize = 48 << 10;

/// What to run: a line for `bash -c`, or an argv.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "serve", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum ProgramCommand {
    /// Run by `bash -c`.
    Shell(String),
    /// Run as given (the first item looked up in `PATH`).
    Argv(Vec<String>),
}

impl ProgramCommand {
    /// The argv the carrier executes.
    pub fn argv(&self) -> Vec<String> {
        match self {
            Self::Shell(line) => vec!["/bin/bash".into(), "-c".into(), line.clone()],
            Self::Argv(argv) => argv.clone(),
        }
    }

    /// The command, if it names something to run (an argv's first item is
    /// not empty).
    pub(crate) fn checked(self) -> Result<Self, &'static str> {
        match &self {
            Self::Argv(argv) if argv.first().is_none_or(String::is_empty) => Err("the argv is empty"),
            _ => Ok(self),
        }
    }
}

/// How long a tool call on a program (MCP's program tools, Code Mode's
/// `workspace.*` tools) waits for its output or its end by default, and at
/// the most; a kill's grace is held to the same most.
const DEFAULT_CALL_WAIT: Duration = Duration::from_secs(1);
const MAX_CALL_WAIT: Duration = Duration::from_secs(30);

/// Output one tool answer carries by default, and at the most.
pub(crate) const DEFAULT_ANSWER_BYTES: usize = 64 << 10;
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// A tool call's `yield_ms`, within its bounds.
pub(crate) fn call_wait(yield_ms: Option<u64>) -> Duration {
    yield_ms.map_or(DEFAULT_CALL_WAIT, Duration::from_millis).min(MAX_CALL_WAIT)
}

/// A tool call's `limit` (bytes of output), within its bounds.
pub(crate) fn answer_limit(limit: Option<usize>) -> usize {
    limit.unwrap_or(DEFAULT_ANSWER_BYTES).clamp(1, MAX_ANSWER_BYTES)
}

/// A tool call's `grace_ms` for a kill: [`KILL_GRACE`] unless given.
pub(crate) fn kill_grace(grace_ms: Option<u64>) -> Duration {
    grace_ms.map_or(KILL_GRACE, Duration::from_millis).min(MAX_CALL_WAIT)
}

/// A tool call's `timeout_ms`: the program's lifetime, at most `most` (and
/// `most` unless given).
pub(crate) fn lifetime_within(timeout_ms: Option<u64>, most: Duration) -> Result<Duration, &'static str> {
    match timeout_ms {
        Some(0) => Err("timeout_ms must be at least 1"),
        Some(ms) => Ok(Duration::from_millis(ms).min(most)),
        None => Ok(most),
    }
}

/// A program to start in a workspace.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ProgramSpec {
    /// What to run.
    pub command: ProgramCommand,
    /// Give it a terminal (a pty, 80x24): its stdout and stderr are the
    /// terminal, Ctrl-C and EOF are keys. Without one, stdout and stderr
    /// share one pipe.
    pub tty: bool,
    /// Environment values; names must be in the policy's allow-list.
    pub env: BTreeMap<String, String>,
    /// Its directory, relative to `/work` (default: `/work`).
    pub cwd: Option<String>,
    /// Its limits, held to the executor's ceiling like a run's: memory and
    /// processes are the caps of the container its workspace's programs
    /// share (fixed by the first). Its timeout is not used: a program's
    /// life is [`ProgramSpec::lifetime`].
    pub policy: SandboxPolicy,
    /// How long it may run: then it is killed (`SIGTERM`, then `SIGKILL`
    /// after [`KILL_GRACE`]).
    pub lifetime: Duration,
    /// Output kept for [`Program::poll`] and [`Program::log`]; older bytes
    /// are dropped and counted.
    pub max_output_bytes: usize,
    /// Third-party packages it needs (Python's, e.g. `numpy`): matched like
    /// a run's ([`ExecRequest::packages`](crate::ExecRequest::packages)).
    /// The workspace's container gets the image that provides them when it
    /// starts, so a later program that needs packages its container lacks
    /// is refused (`packages` named).
    pub packages: Vec<String>,
}

impl ProgramSpec {
    /// A program that runs `command`, under the strict policy, for ten
    /// minutes at the most.
    pub fn new(command: ProgramCommand) -> Self {
        Self {
            command,
            tty: false,
            env: BTreeMap::new(),
            cwd: None,
            policy: SandboxPolicy::strict(),
            lifetime: Duration::from_secs(600),
            max_output_bytes: DEFAULT_OUTPUT_BYTES,
            packages: Vec::new(),
        }
    }

    /// [`ProgramSpec::new`] for a line run by `bash -c`.
    pub fn shell(line: impl Into<String>) -> Self {
        Self::new(ProgramCommand::Shell(line.into()))
    }

    /// [`ProgramSpec::new`] for an argv.
    pub fn argv<S: Into<String>>(argv: impl IntoIterator<Item = S>) -> Self {
        Self::new(ProgramCommand::Argv(argv.into_iter().map(Into::into).collect()))
    }

    /// Sets [`ProgramSpec::tty`].
    pub fn tty(mut self, tty: bool) -> Self {
        self.tty = tty;
        self
    }

    /// Sets one environment value.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(name.into(), value.into());
        self
    }

    /// Sets [`ProgramSpec::cwd`].
    pub fn cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// Sets [`ProgramSpec::policy`].
    pub fn policy(mut self, policy: SandboxPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Sets [`ProgramSpec::lifetime`].
    pub fn lifetime(mut self, lifetime: Duration) -> Self {
        self.lifetime = lifetime;
        self
    }

    /// Sets [`ProgramSpec::max_output_bytes`].
    pub fn max_output_bytes(mut self, bytes: usize) -> Self {
        self.max_output_bytes = bytes;
        self
    }

    /// Declares packages ([`ProgramSpec::packages`]).
    pub fn packages<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.packages.extend(names.into_iter().map(Into::into));
        self
    }
}

/// Where a program is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgramStatus {
    /// Still running.
    Running,
    /// Its first process exited by itself.
    Exited,
    /// It was killed: by [`Program::kill`], at its lifetime's end, or with
    /// its workspace.
    Killed,
}

/// What a poll or a log read returns.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProgramOutput {
    /// Where the program is.
    pub status: ProgramStatus,
    /// Its output from `offset` to `next_offset`.
    pub output: Vec<u8>,
    /// Where `output` starts in the program's whole output.
    pub offset: u64,
    /// Where the next read starts.
    pub next_offset: u64,
    /// Its exit status once it ended (`128 + n` when signal `n` ended it);
    /// `None` while it runs, or when its carrier was lost.
    pub exit_code: Option<i32>,
    /// Bytes between the offset asked for and `offset` that were dropped
    /// from the ring before they were read.
    pub dropped_bytes: u64,
    /// Bytes written to it that it never got: its input was closed (by
    /// itself, or by [`Program::close_input`]), or it left more than
    /// [`MAX_PENDING_INPUT_BYTES`] unread. Since it started.
    pub input_dropped_bytes: u64,
}

impl ProgramOutput {
    /// The answer of a poll of program `id`, as MCP's program tools and
    /// Code Mode's `workspace.*` tools give it: `{program_id, status,
    /// output (UTF-8 text, invalid bytes replaced), offset, next_offset,
    /// exit_code, dropped_bytes, input_dropped_bytes}`.
    pub fn to_json(&self, id: &str) -> serde_json::Value {
        serde_json::json!({
            "program_id": id,
            "status": self.status,
            "output": String::from_utf8_lossy(&self.output),
            "offset": self.offset,
            "next_offset": self.next_offset,
            "exit_code": self.exit_code,
            "dropped_bytes": self.dropped_bytes,
            "input_dropped_bytes": self.input_dropped_bytes,
        })
    }
}

/// What starts programs for code that calls Code Mode's `workspace.*`
/// tools: the executor that admitted its run.
pub(crate) trait ProgramStarter: Send + Sync {
    /// Starts `spec` in `workspace` (see
    /// [`Executor::start_program_blocking`](crate::Executor::start_program_blocking)).
    fn start_program_blocking(
        &self,
        workspace: &crate::workspace::Workspace,
        spec: &ProgramSpec,
    ) -> Result<Program, ExecError>;
}

/// What Code Mode's `workspace.*` tools know of the run that calls them
/// (in its [`ToolContext`](crate::tools::ToolContext)): where its programs
/// start, and under what.
#[derive(Clone)]
pub(crate) struct ProgramHost {
    /// The executor that admitted the run.
    pub starter: Arc<dyn ProgramStarter>,
    /// The run's workspace: its programs run there.
    pub workspace: crate::workspace::Workspace,
    /// The run's policy, its tool grants taken out (programs call no
    /// tools): a program code starts gets no more than its run.
    pub policy: SandboxPolicy,
    /// The run's packages (a workspace's, over MCP): its programs need
    /// the same image.
    pub packages: Vec<String>,
}

impl std::fmt::Debug for ProgramHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProgramHost").field("workspace", &self.workspace).finish_non_exhaustive()
    }
}

impl PartialEq for ProgramHost {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.starter, &other.starter) && self.workspace == other.workspace && self.policy == other.policy
    }
}

impl Eq for ProgramHost {}

/// Why a program could not take input.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProgramError {
    /// It has ended.
    #[error("the program has ended")]
    Ended,
    /// Its input was closed (by [`Program::close_input`], or by itself).
    #[error("the program's input is closed")]
    InputClosed,
    /// One write of more than [`MAX_WRITE_BYTES`].
    #[error("a write of {0} bytes: at most {MAX_WRITE_BYTES} at a time")]
    TooLarge(usize),
    /// Its carrier is gone (its container ended).
    #[error("the program's container is gone: {0}")]
    Lost(String),
}

/// What a backend is asked to do to a running program.
#[derive(Clone, Debug)]
pub(crate) enum ProgramOp {
    /// Bytes for its stdin (or terminal).
    Write(Vec<u8>),
    /// End of input: its stdin closed, or EOF (Ctrl-D) on a terminal.
    Eof,
    /// A signal to its process group.
    Signal(i32),
    /// `SIGKILL` to every process it started.
    Kill,
}

/// The backend's side of a program: where its ops go.
pub(crate) trait ProgramControl: Send + Sync {
    /// Sends `op` to program `id`.
    fn send(&self, id: u64, op: ProgramOp) -> Result<(), ProgramError>;
    /// The carrier does not answer: end it (and every program in it).
    fn abandon(&self);
}

/// A running (or ended) program. Cloning gives another handle on the same
/// program (one cursor for all); every method may be called from several
/// tasks at once.
#[derive(Clone)]
pub struct Program {
    id: u64,
    tty: bool,
    state: Arc<ProgramState>,
    control: Arc<dyn ProgramControl>,
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program").field("id", &self.id).field("status", &self.status()).finish()
    }
}

impl Program {
    /// A handle on program `id` of `control`, whose output and exit come
    /// into `state`; its lifetime ends at `deadline`.
    pub(crate) fn start(
        id: u64,
        tty: bool,
        state: Arc<ProgramState>,
        control: Arc<dyn ProgramControl>,
        lifetime: Duration,
    ) -> Self {
        let program = Self { id, tty, state, control };
        let watcher = program.clone();
        let spawned =
            std::thread::Builder::new().name("execbox-program-life".into()).stack_size(64 << 10).spawn(move || {
                let deadline = Instant::now() + lifetime;
                if !watcher.state.wait_for_blocking(deadline, |log| log.status != ProgramStatus::Running) {
                    watcher.kill_blocking(KILL_GRACE);
                }
            });
        if spawned.is_err() {
            // No watcher, no lifetime: it does not run at all.
            program.kill_blocking(Duration::ZERO);
        }
        program
    }

    /// Where it is now.
    pub fn status(&self) -> ProgramStatus {
        self.state.log.lock().status
    }

    /// Its output since the cursor (at most `limit` bytes), moving the
    /// cursor past it. While it runs and nothing is new, waits up to
    /// `yield_for` for output or its end; once output comes, answers when
    /// none more comes for a moment (a REPL's echo and its answer come
    /// together).
    pub async fn poll(&self, yield_for: Duration, limit: usize) -> ProgramOutput {
        self.wait_to_poll(yield_for, limit, 0).await;
        self.state.take(limit, false)
    }

    /// [`Program::poll`] for a caller that shows the output as text: while
    /// the program runs, an answer never ends inside a UTF-8 sequence (the
    /// rest of it comes with the next).
    pub async fn poll_text(&self, yield_for: Duration, limit: usize) -> ProgramOutput {
        // The start of a character held back by the last answer is not new.
        let held = {
            let log = self.state.log.lock();
            let fresh = log.read(log.cursor, 4).output;
            match std::str::from_utf8(&fresh) {
                Err(e) if e.valid_up_to() == 0 && e.error_len().is_none() => fresh.len(),
                _ => 0,
            }
        };
        self.wait_to_poll(yield_for, limit, held).await;
        self.state.take(limit, true)
    }

    /// Waits as [`Program::poll`] says, taking `seen` bytes past the cursor
    /// as not new.
    async fn wait_to_poll(&self, yield_for: Duration, limit: usize, seen: usize) {
        let until = Instant::now() + yield_for;
        let limit = limit.max(1);
        let mut seen = seen;
        let first = seen;
        loop {
            let waited = if seen == first { until } else { (Instant::now() + SETTLE).min(until) };
            let grew =
                self.state.wait_for(waited, |log| log.fresh() > seen || log.status != ProgramStatus::Running).await;
            let (fresh, ended) = {
                let log = self.state.log.lock();
                (log.fresh(), log.status != ProgramStatus::Running)
            };
            if !grew || ended || fresh >= limit || Instant::now() >= until {
                break;
            }
            seen = fresh;
        }
    }

    /// Its output from `offset` (at most `limit` bytes), without moving the
    /// cursor.
    pub fn log(&self, offset: u64, limit: usize) -> ProgramOutput {
        self.state.log.lock().read(offset, limit)
    }

    /// Writes `data` (at most [`MAX_WRITE_BYTES`]) to its input. The write
    /// is handed over, not awaited: input it never gets is counted in
    /// [`ProgramOutput::input_dropped_bytes`].
    pub fn write(&self, data: &[u8]) -> Result<(), ProgramError> {
        if data.len() > MAX_WRITE_BYTES {
            return Err(ProgramError::TooLarge(data.len()));
        }
        self.check_input()?;
        for piece in data.chunks(WRITE_PIECE) {
            self.control.send(self.id, ProgramOp::Write(piece.to_vec()))?;
        }
        Ok(())
    }

    /// What a tool's write asks: `text`, with a newline if asked, then
    /// Ctrl-C, then the end of its input, each if asked, in that order (as
    /// a terminal would send them).
    pub(crate) fn send(&self, text: String, newline: bool, interrupt: bool, eof: bool) -> Result<(), ProgramError> {
        let mut data = text.into_bytes();
        if newline {
            data.push(b'\n');
        }
        if !data.is_empty() {
            self.write(&data)?;
        }
        if interrupt {
            self.interrupt()?;
        }
        if eof {
            self.close_input()?;
        }
        Ok(())
    }

    /// Whether `answer`, a poll of this program, carried its end: it ended,
    /// and nothing is left to read after it. Its holder may forget it then.
    pub(crate) fn end_was_read(&self, answer: &ProgramOutput) -> bool {
        answer.status != ProgramStatus::Running && self.log(answer.next_offset, 1).output.is_empty()
    }

    /// Ends its input (closes its stdin; Ctrl-D on a terminal, after which
    /// a terminal's input stays open).
    pub fn close_input(&self) -> Result<(), ProgramError> {
        self.check_input()?;
        self.control.send(self.id, ProgramOp::Eof)?;
        if !self.tty {
            self.state.log.lock().input_closed = true;
        }
        Ok(())
    }

    /// Interrupts it (`SIGINT` to its process group: Ctrl-C).
    pub fn interrupt(&self) -> Result<(), ProgramError> {
        self.check_running()?;
        self.control.send(self.id, ProgramOp::Signal(libc_sigint()))
    }

    /// Kills it: `SIGTERM` to its process group, then, if it still runs
    /// after `grace`, `SIGKILL` to every process it started. Returns its
    /// output since the cursor, and its end.
    pub async fn kill(&self, grace: Duration) -> ProgramOutput {
        match tokio::runtime::Handle::try_current() {
            Ok(_) => {
                let program = self.clone();
                if tokio::task::spawn_blocking(move || program.kill_blocking(grace)).await.is_err() {
                    self.kill_blocking(Duration::ZERO);
                }
            }
            Err(_) => self.kill_blocking(grace),
        }
        self.state.take(usize::MAX, false)
    }

    /// Waits until it ends; its status then.
    pub async fn wait(&self) -> ProgramStatus {
        let forever = Instant::now() + Duration::from_secs(86_400 * 365);
        while !self.state.wait_for(forever, |log| log.status != ProgramStatus::Running).await {}
        self.status()
    }

    fn check_running(&self) -> Result<(), ProgramError> {
        if self.status() == ProgramStatus::Running { Ok(()) } else { Err(ProgramError::Ended) }
    }

    fn check_input(&self) -> Result<(), ProgramError> {
        self.check_running()?;
        if self.state.log.lock().input_closed { Err(ProgramError::InputClosed) } else { Ok(()) }
    }

    /// [`Program::kill`] on this thread.
    fn kill_blocking(&self, grace: Duration) {
        if !self.state.ask_kill() {
            return;
        }
        let ended = |log: &Log| log.status != ProgramStatus::Running;
        if !grace.is_zero()
            && self.control.send(self.id, ProgramOp::Signal(libc_sigterm())).is_ok()
            && self.state.wait_for_blocking(Instant::now() + grace, ended)
        {
            return;
        }
        if self.control.send(self.id, ProgramOp::Kill).is_ok()
            && self.state.wait_for_blocking(Instant::now() + KILL_CONFIRM, ended)
        {
            return;
        }
        // The carrier does not answer: it goes, and this program with it.
        self.control.abandon();
        self.state.ended(None);
    }
}

fn libc_sigterm() -> i32 {
    rustix::process::Signal::TERM.as_raw()
}

fn libc_sigint() -> i32 {
    rustix::process::Signal::INT.as_raw()
}

/// A program's output and end, fed by its carrier.
pub(crate) struct ProgramState {
    log: Mutex<Log>,
    /// Signalled at every change (output, end), for blocking waiters;
    /// `notify` is the same for async ones.
    changed: Condvar,
    notify: tokio::sync::watch::Sender<()>,
}

struct Log {
    ring: VecDeque<u8>,
    capacity: usize,
    /// The offset of `ring[0]` in the whole output.
    first: u64,
    cursor: u64,
    status: ProgramStatus,
    exit_code: Option<i32>,
    kill_asked: bool,
    input_closed: bool,
    input_dropped: u64,
}

impl Log {
    /// Bytes past the cursor.
    fn fresh(&self) -> usize {
        self.end().saturating_sub(self.cursor) as usize
    }

    fn end(&self) -> u64 {
        self.first + self.ring.len() as u64
    }

    fn read(&self, offset: u64, limit: usize) -> ProgramOutput {
        let start = offset.clamp(self.first, self.end());
        let dropped_bytes = self.first.saturating_sub(offset);
        let skip = (start - self.first) as usize;
        let take = limit.min(self.ring.len() - skip);
        let output: Vec<u8> = self.ring.range(skip..skip + take).copied().collect();
        ProgramOutput {
            status: self.status,
            next_offset: start + take as u64,
            output,
            offset: start,
            exit_code: self.exit_code,
            dropped_bytes,
            input_dropped_bytes: self.input_dropped,
        }
    }
}

impl ProgramState {
    pub(crate) fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            log: Mutex::new(Log {
                ring: VecDeque::new(),
                capacity: capacity.max(1),
                first: 0,
                cursor: 0,
                status: ProgramStatus::Running,
                exit_code: None,
                kill_asked: false,
                input_closed: false,
                input_dropped: 0,
            }),
            changed: Condvar::new(),
            notify: tokio::sync::watch::Sender::new(()),
        })
    }

    /// Appends output, dropping the oldest bytes past the ring's capacity.
    pub(crate) fn output(&self, bytes: &[u8]) {
        {
            let mut log = self.log.lock();
            let kept = &bytes[bytes.len().saturating_sub(log.capacity)..];
            log.first += (bytes.len() - kept.len()) as u64;
            let overflow = (log.ring.len() + kept.len()).saturating_sub(log.capacity);
            log.ring.drain(..overflow);
            log.first += overflow as u64;
            log.ring.extend(kept);
        }
        self.changed.notify_all();
        self.notify.send_replace(());
    }

    /// The program ended with `code` (`None`: its carrier was lost).
    pub(crate) fn ended(&self, code: Option<i32>) {
        {
            let mut log = self.log.lock();
            if log.status != ProgramStatus::Running {
                return;
            }
            log.status = if log.kill_asked || code.is_none() { ProgramStatus::Killed } else { ProgramStatus::Exited };
            log.exit_code = code;
        }
        self.changed.notify_all();
        self.notify.send_replace(());
    }

    /// Marks a kill asked for; `false` if it has ended already.
    fn ask_kill(&self) -> bool {
        let mut log = self.log.lock();
        log.kill_asked = true;
        log.status == ProgramStatus::Running
    }

    /// Waits until `done` holds or `until`; whether it holds. On the task
    /// inside a tokio runtime, else on this thread.
    async fn wait_for(&self, until: Instant, done: impl Fn(&Log) -> bool) -> bool {
        if tokio::runtime::Handle::try_current().is_err() {
            return self.wait_for_blocking(until, done);
        }
        let mut changes = self.notify.subscribe();
        loop {
            if done(&self.log.lock()) {
                return true;
            }
            if tokio::time::timeout_at(until.into(), changes.changed()).await.is_err() {
                return done(&self.log.lock());
            }
        }
    }

    /// [`ProgramState::wait_for`] on this thread.
    fn wait_for_blocking(&self, until: Instant, done: impl Fn(&Log) -> bool) -> bool {
        let mut log = self.log.lock();
        while !done(&log) {
            if self.changed.wait_until(&mut log, until).timed_out() {
                return done(&log);
            }
        }
        true
    }

    /// Reads from the cursor and moves it.
    /// Reads from the cursor and moves it; `whole_chars`: while it runs,
    /// not past the start of a UTF-8 sequence the ring does not hold whole.
    fn take(&self, limit: usize, whole_chars: bool) -> ProgramOutput {
        let mut log = self.log.lock();
        let mut read = log.read(log.cursor, limit);
        // A sequence cut at the end is kept for the next read, unless the
        // limit alone cut it and nothing else would be read.
        if whole_chars
            && read.status == ProgramStatus::Running
            && let Err(e) = std::str::from_utf8(&read.output)
            && e.error_len().is_none()
            && (e.valid_up_to() > 0 || read.output.len() < limit)
        {
            let keep = e.valid_up_to();
            read.next_offset -= (read.output.len() - keep) as u64;
            read.output.truncate(keep);
        }
        log.cursor = read.next_offset;
        read
    }

    /// Input it never got: `bytes` dropped, and its input closed if
    /// `closed`.
    pub(crate) fn input_dropped(&self, bytes: u64, closed: bool) {
        let mut log = self.log.lock();
        log.input_dropped += bytes;
        log.input_closed |= closed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_newest_bytes_and_counts_what_it_dropped() {
        let state = ProgramState::new(8);
        state.output(b"0123");
        assert_eq!(state.take(2, false).output, b"01");
        state.output(b"456789ab");
        let read = state.take(100, false);
        assert_eq!((read.output.as_slice(), read.offset, read.dropped_bytes), (&b"456789ab"[..], 4, 2));
        assert_eq!(read.next_offset, 12);
        state.output(b"0123456789abcdefXYZ");
        let read = state.log.lock().read(0, 100);
        assert_eq!((read.output.as_slice(), read.offset, read.dropped_bytes), (&b"bcdefXYZ"[..], 23, 23));
    }

    #[test]
    fn a_text_poll_keeps_a_split_character_for_the_next() {
        let state = ProgramState::new(64);
        state.output("é".as_bytes()[..1].as_ref());
        let first = state.take(100, true);
        assert_eq!((first.output.len(), first.next_offset), (0, 0));
        state.output(&"é!".as_bytes()[1..]);
        assert_eq!(state.take(100, true).output, "é!".as_bytes());
        state.output("aé".as_bytes());
        assert_eq!(state.take(2, true).output, b"a", "a limit inside a character");
        assert_eq!(state.take(2, true).output, "é".as_bytes());
        // Bytes that are no UTF-8 at all are not held back.
        state.output(&[0xff, b'x']);
        assert_eq!(state.take(100, true).output, [0xff, b'x']);
    }

    #[test]
    fn a_log_read_past_the_end_is_empty_and_does_not_move_the_cursor() {
        let state = ProgramState::new(16);
        state.output(b"hello");
        let read = state.log.lock().read(99, 10);
        assert_eq!((read.output.len(), read.offset, read.next_offset), (0, 5, 5));
        assert_eq!(state.take(10, false).output, b"hello");
    }

    #[test]
    fn an_end_after_a_kill_reads_killed_and_a_second_end_changes_nothing() {
        let state = ProgramState::new(16);
        assert!(state.ask_kill());
        state.ended(Some(143));
        state.ended(Some(0));
        let read = state.take(1, false);
        assert_eq!((read.status, read.exit_code), (ProgramStatus::Killed, Some(143)));
        assert!(!state.ask_kill());
    }
}
