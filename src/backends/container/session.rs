//! [`ContainerSession`]: one long-lived, locked-down container whose Python
//! process keeps its globals across calls, or whose `bash` keeps its
//! variables, functions and working directory (for code that needs what only
//! the container has: declared packages, output files, a shell).
//!
//! The container gets the same locked flags as a one-shot run, the data
//! image when packages are declared, `/work` (read-only: each cell's input
//! and files are staged there by the host) and `/work/out` (the container's
//! own size- and inode-capped tmpfs, see `outputs.rs`; the session loop
//! empties it before each cell, so a cell that collects files gets what it
//! wrote: after such a cell the host lists it with `exec`, within the cell's
//! deadline).
//! Its first process is the in-container timer around `python3` running the
//! session loop (the same loop as CPython-in-wasm sessions, see
//! `conventions.rs`), which reads cells from the attached stdin; a shell
//! session's loop hands each cell to its one `bash` child instead. Per cell:
//!
//! - the deadline is the host's: a cell still running at its deadline gets
//!   the container killed, and the session is lost. The cell itself is
//!   written to the container's stdin without blocking, within the same
//!   deadline: a session loop that stops reading cannot hold the host;
//! - the output caps and tap are per cell; memory and processes are capped
//!   for the whole container (cgroup), fixed when it starts from the
//!   session's spec (its policy's caps, else
//!   [`ContainerConfig::session_memory_bytes`](super::ContainerConfig::session_memory_bytes)
//!   and the default process cap), as are its granted directories and
//!   environment; a call asking for a lower cap is refused;
//! - the cell is over when both streams carry its status record;
//! - Code Mode: the session's container has a tool socket for its whole
//!   life (see `tool_socket.rs`); a cell whose policy grants tools gets the
//!   `tools` module (its header comes before the cell's code) and its calls
//!   go to that cell's bridge; in a cell without a grant every call is
//!   answered `not_granted`, and between cells `cancelled`.
//!
//! A session's whole life is bounded by
//! [`ContainerConfig::session_lifetime`](super::ContainerConfig::session_lifetime)
//! (the in-container timer), and it dies with its host like every container
//! of execbox's (the watcher and the sweep, see `owners.rs`). Dropping the
//! session removes the container and its staging directory.

use parking_lot::{Condvar, Mutex};
use std::io::Read;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::outputs::{self, COLLECT_SCRIPT, Listing};
use super::process;
use super::runner::{self, Runner};
use super::staging::Staging;
use super::tool_socket::ToolSocket;
use crate::admission::{Admitted, Door, Target};
use crate::backend::Session;
use crate::backends::conventions;
use crate::capabilities::BackendCapabilities;
use crate::error::ExecError;
use crate::file::ExecFile;
use crate::language::Language;
use crate::limits::child::ChildHandle;
use crate::limits::deadline::Deadline;
use crate::limits::output::{BoundedBuffer, OutputTap, StreamKind};
use crate::limits::records::{ResultTap, marker};
use crate::limits::write::{Endpoint, WriteError, set_nonblocking, write_all_until};
use crate::policy::SandboxPolicy;
use crate::request::ExecRequest;
use crate::result::{CapturedStream, ExecResult, Outcome, Usage};
use crate::session_spec::SessionSpec;
use crate::text;
use crate::tools::wire::python_header;
use crate::violation::{Control, Violation};

/// How long the container may take to start and run its first (empty) cell.
const OPEN_LIMIT: Duration = Duration::from_secs(60);

/// How long the host waits for the listing of `/work/out` after a cell
/// without a deadline (past it the cell gets no files, as past a deadline).
const LISTING_LIMIT: Duration = Duration::from_secs(60);

/// A Python or shell session in a container. See the module docs.
pub struct ContainerSession {
    runner: Arc<Runner>,
    language: Language,
    name: String,
    staging: Option<Staging>,
    /// Opens the session's status records (`\0execbox:<nonce>:`).
    marker: Vec<u8>,
    io: Mutex<CellIo>,
    /// Kills the attached CLI from any thread (see [`Session::kill`]).
    cli: ChildHandle,
    /// The memory and process caps of its container, fixed when it started.
    memory_bytes: u64,
    pids: u64,
    streams: Arc<Streams>,
    alive: AtomicBool,
    killed: AtomicBool,
    /// The container's first process (the timer) as the host sees it, to
    /// check after each cell that nothing of the cell still runs.
    init_pid: Mutex<Option<u32>>,
    /// The session's tool socket: each cell's calls go to its bridge.
    tools: ToolSocket,
}

/// The attached CLI and its stdin (held for a whole cell: one at a time).
struct CellIo {
    child: Child,
    stdin: Option<ChildStdin>,
    /// A listing of `/work/out` that outlived its cell's deadline.
    listing: Option<PendingListing>,
}

/// An `exec` listing `/work/out` still running (its output drained and
/// dropped by its reader thread).
struct PendingListing {
    child: Child,
    exit: ChildHandle,
}

impl PendingListing {
    /// Waits until the listing ended, or `until`: whether it ended.
    fn finish(mut self, until: Option<Instant>) -> bool {
        let ended = self.exit.wait_exit(until);
        if !ended {
            process::kill_group(&mut self.child);
        }
        let _ = self.child.wait();
        ended
    }
}

/// Both output streams of the current cell, fed by reader threads.
struct Streams {
    sinks: Mutex<[Sink; 2]>,
    changed: Condvar,
}

struct Sink {
    text: BoundedBuffer,
    records: Option<ResultTap>,
    /// The stream ended (the container is gone).
    closed: bool,
}

impl Streams {
    fn lock(&self) -> parking_lot::MutexGuard<'_, [Sink; 2]> {
        self.sinks.lock()
    }
}

/// How a cell ended, as the host saw it.
enum CellEnd {
    /// Both status records arrived.
    Done,
    /// The deadline passed first.
    TimedOut,
    /// The container ended.
    Ended,
    /// The session was killed.
    Killed,
}

impl ContainerSession {
    /// The name sessions report in results and refusals.
    pub const NAME: &'static str = "container-session";

    /// Starts the container under `spec` (its memory and process caps,
    /// granted directories and environment) and checks its loop with an
    /// empty cell.
    pub(super) fn open(runner: Arc<Runner>, spec: &SessionSpec) -> Result<Self, ExecError> {
        let unavailable = |reason: String| ExecError::unavailable(Self::NAME, reason);
        runner.check_available(runner::NAME)?;
        let cfg = runner.config();
        let nonce = crate::nonce::hex128();
        let (program, first_cell) = match spec.language {
            Language::Python => (conventions::PYTHON_SESSION_PROGRAM, "pass"),
            Language::Shell => (conventions::SHELL_SESSION_PROGRAM, ":"),
            other => return Err(unavailable(format!("container sessions run Python and shell, not {other}"))),
        };
        let program = program.replace("NONCE", &nonce);
        let mut template = spec.template().collect_output_files();
        let memory_bytes = *template.policy.memory_bytes.get_or_insert(cfg.session_memory_bytes);
        let pids = *template.policy.max_processes.get_or_insert(cfg.default_pids);
        let staging = Staging::new(&template, None)?;
        let command = vec!["/usr/bin/python3".to_string(), "-c".to_string(), program];
        let image = runner.script_image(&template);
        let mut spec = runner.spec(&template, &staging, image, command, cfg.session_lifetime)?;
        spec.role = "session";
        // Cells' files are listed by `exec`, not after the (endless) loop.
        if let Some(out) = spec.output_dir.as_mut() {
            out.listing_nonce = None;
        }
        let tools =
            ToolSocket::start().map_err(|e| unavailable(format!("cannot open the session's tool socket: {e}")))?;
        // Shell cells call tools with the `tool` command.
        tools.attach(&mut spec, template.language == Language::Shell)?;
        let process::Spawned { mut child, exit: cli } = process::spawn(&cfg.engine, &spec.argv()).map_err(|e| {
            runner.reaper().remove(spec.name.clone());
            unavailable(format!("cannot run {} and watch it: {e}", cfg.engine.display()))
        })?;
        let streams = Arc::new(Streams { sinks: Mutex::new([sink(), sink()]), changed: Condvar::new() });
        let pipes: [Option<Box<dyn Read + Send>>; 2] = [
            child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>),
            child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>),
        ];
        let stdin = child.stdin.take();
        if let Some(Err(e)) = stdin.as_ref().map(set_nonblocking) {
            tracing::warn!(error = %e, "cannot make a session's stdin non-blocking");
        }
        let session = Self {
            runner,
            language: template.language,
            name: spec.name.clone(),
            staging: Some(staging),
            marker: marker(&nonce),
            io: Mutex::new(CellIo { child, stdin, listing: None }),
            cli,
            memory_bytes,
            pids,
            streams,
            alive: AtomicBool::new(true),
            killed: AtomicBool::new(false),
            init_pid: Mutex::new(None),
            tools,
        };
        for (index, pipe) in pipes.into_iter().enumerate() {
            let Some(pipe) = pipe else { continue };
            let streams = session.streams.clone();
            // Detached: it ends when the container's stream does.
            let spawned = std::thread::Builder::new()
                .name("execbox-session-io".into())
                .stack_size(128 << 10)
                .spawn(move || read_into(pipe, &streams, index));
            if let Err(e) = spawned {
                return Err(unavailable(format!("cannot start a reader thread: {e}")));
            }
        }
        // An empty first cell: the container's start counts here, not
        // against the caller's first deadline.
        let probe = ExecRequest::source(session.language, first_cell)
            .policy(SandboxPolicy::strict().timeout(OPEN_LIMIT).max_output_bytes(64 << 10));
        let target = Target {
            name: Self::NAME,
            capabilities: session.runner.session_capabilities(),
            packages: Vec::new(),
            refusals: Vec::new(),
            session: None,
        };
        let result = session.run_cell(Door::default().admit(probe, &target)?)?;
        if result.outcome != Outcome::Ok {
            let why = format!("{} {}", result.message.unwrap_or_default(), result.stderr.text());
            return Err(unavailable(text::cap_message(format!("the session did not start: {why}"))));
        }
        // Running now (the probe answered): where its processes are.
        let inspected = process::bounded_output(
            process::engine_command(&session.runner.config().engine).args([
                "inspect",
                "--format={{.State.Pid}}",
                &session.name,
            ]),
            process::HOUSEKEEPING_TIMEOUT,
            4096,
        );
        let pid = inspected.ok().and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<u32>().ok());
        match pid.filter(|p| *p > 0) {
            Some(pid) => *session.init_pid.lock() = Some(pid),
            None => tracing::warn!(
                container = session.name,
                "cannot see the session's processes: leftovers of a cell go unchecked"
            ),
        }
        Ok(session)
    }

    /// What this session cannot do per call: its container's memory and
    /// process caps were fixed when it started, so a call cannot ask for
    /// lower ones.
    fn fixed_cap_refusals(&self, request: &ExecRequest) -> Vec<Violation> {
        let mut violations = Vec::new();
        if request.language != self.language {
            violations.push(Violation {
                control: Control::Language,
                requested: request.language.to_string(),
                reason: format!("this container session runs {}", self.language),
            });
        }
        let fixed = |control, asked: u64, cap: u64, unit: &str| Violation {
            control,
            requested: format!("{asked} {unit}"),
            reason: format!("the session's container has a cap of {cap} {unit}, fixed when it opened"),
        };
        if let Some(asked) = request.policy.memory_bytes.filter(|asked| *asked < self.memory_bytes) {
            violations.push(fixed(Control::Memory, asked, self.memory_bytes, "bytes"));
        }
        if let Some(asked) = request.policy.max_processes.filter(|asked| *asked < self.pids) {
            violations.push(fixed(Control::Processes, asked, self.pids, "processes"));
        }
        violations
    }

    fn lost(&self) -> ExecError {
        ExecError::BackendUnavailable {
            backend: Self::NAME.into(),
            reason:
                "this session ended (a call timed out, ran out of memory or ended its container); its state is gone"
                    .into(),
            fix: None,
        }
    }

    fn run_cell(&self, mut call: Admitted) -> Result<ExecResult, ExecError> {
        let mut io = self.io.lock();
        if !self.alive.load(Ordering::SeqCst) {
            return Err(self.lost());
        }
        let deadline = call.deadline();
        // The last cell's listing of /work/out, if it outlived that cell's
        // deadline, ends before this cell starts (or the session does).
        if let Some(listing) = io.listing.take() {
            let until = deadline.remaining().map(|left| Instant::now() + left);
            if !listing.finish(until) {
                self.alive.store(false, Ordering::SeqCst);
                process::kill_container(&self.runner.config().engine, &self.name, process::KILL_GRACE);
                let mut result = ExecResult::new(Self::NAME, Outcome::TimedOut);
                result.usage = Usage { duration: deadline.elapsed(), ..Usage::default() };
                result.message = Some(format!(
                    "{}: the last cell's listing of out/ still ran; the session ended",
                    deadline.exceeded_message()
                ));
                return Ok(result);
            }
        }
        let source = call.take_source(Self::NAME)?;
        let input = call.take_input_json(self.runner.config().defaults.max_input_nesting, Self::NAME)?;
        let request = call.request();
        let staging = self.staging.as_ref().ok_or_else(|| self.lost())?;
        staging.stage_cell(request, input.as_deref())?;
        self.reset_streams(request);

        // The cell's code, after the tools header when a Python cell may
        // call tools (a shell cell has the `tool` command).
        let bridge = call.tools().cloned();
        let header = match bridge.as_deref() {
            Some(bridge) if self.language == Language::Python => python_header("", bridge),
            _ => Vec::new(),
        };
        let mut framed = format!("{}\n", header.len() + source.len()).into_bytes();
        framed.extend_from_slice(&header);
        framed.extend_from_slice(source.as_bytes());
        drop(source);
        // The cell's calls go to its bridge until it returns, on every path.
        self.tools.begin(bridge);
        let _cell = CellTools(&self.tools);
        let until = deadline.remaining().map(|left| Instant::now() + left);
        let sent = match io.stdin.as_ref() {
            Some(stdin) => write_all_until(stdin, Endpoint::Pipe, &framed, until),
            None => Err(WriteError::Closed { written: 0 }),
        };
        let end = match sent {
            Ok(()) => self.wait_cell(&deadline),
            // The loop stopped reading: the cell is as good as running past its deadline.
            Err(WriteError::TimedOut) => CellEnd::TimedOut,
            Err(WriteError::Closed { .. }) if self.killed.load(Ordering::SeqCst) => CellEnd::Killed,
            Err(WriteError::Closed { .. }) => CellEnd::Ended,
        };
        let [stdout, stderr] = self.take_streams();
        let mut result = ExecResult::new(Self::NAME, Outcome::Ok);
        result.usage = Usage { duration: deadline.elapsed(), ..Usage::default() };
        match end {
            CellEnd::Done if let Some(left) = self.leftovers() => {
                // The loop said the cell is over, but something of it runs
                // on (a thread, a child, a forged record): end the session.
                self.alive.store(false, Ordering::SeqCst);
                process::kill_container(&self.runner.config().engine, &self.name, process::KILL_GRACE);
                result.outcome = Outcome::Failed;
                result.message = Some(format!("{left} after the cell returned: the session ended"));
                result.stdout = stdout.0;
                result.stderr = stderr.0;
            }
            CellEnd::Done => {
                let status = stdout.1.unwrap_or(1);
                result.exit_code = Some(status);
                result.stdout = stdout.0;
                result.stderr = stderr.0;
                if status == 0 {
                    result.output = conventions::json_stdout(&result.stdout);
                } else {
                    result.outcome = Outcome::Failed;
                    result.message = Some(format!("the cell failed with status {status}"));
                }
                if call.request().collect_output_files {
                    let (files, note) = self.collect_outputs(&mut io, &deadline);
                    result.output_files = files;
                    if let Some(note) = note {
                        crate::text::add_note(&mut result.message, note);
                    }
                }
            }
            CellEnd::TimedOut => {
                self.alive.store(false, Ordering::SeqCst);
                process::kill_container(&self.runner.config().engine, &self.name, process::KILL_GRACE);
                result.outcome = Outcome::TimedOut;
                result.message = Some(deadline.exceeded_message());
                result.stdout = stdout.0;
                result.stderr = stderr.0;
            }
            CellEnd::Killed => {
                self.alive.store(false, Ordering::SeqCst);
                let mut killed = crate::backend::killed_result(Self::NAME, &deadline);
                killed.stdout = stdout.0;
                killed.stderr = stderr.0;
                return Ok(killed);
            }
            CellEnd::Ended if self.killed.load(Ordering::SeqCst) => {
                self.alive.store(false, Ordering::SeqCst);
                return Ok(crate::backend::killed_result(Self::NAME, &deadline));
            }
            CellEnd::Ended => {
                self.alive.store(false, Ordering::SeqCst);
                let status = self.wait_briefly(&mut io.child);
                let limit = process::KILL_GRACE;
                let ended = process::classify(&self.runner.config().engine, &self.name, status, &stderr.0, limit);
                (result.outcome, result.message) = match ended {
                    process::Ended::Exited { oom_killed: true, .. } => {
                        (Outcome::OutOfMemory, Some("killed by the kernel's OOM killer at the memory cap".into()))
                    }
                    process::Ended::Exited { exit_code, .. } => {
                        (Outcome::Failed, Some(format!("the session's interpreter exited with code {exit_code}")))
                    }
                    process::Ended::TimedOut => (Outcome::TimedOut, Some(deadline.exceeded_message())),
                    process::Ended::EngineError(text) => {
                        (Outcome::Failed, Some(format!("the container ended: {text}")))
                    }
                };
                result.stdout = stdout.0;
                result.stderr = stderr.0;
            }
        }
        Ok(result)
    }

    /// Fresh sinks for a cell: its caps, its tap, a new record reader each.
    fn reset_streams(&self, request: &ExecRequest) {
        let policy = &request.policy;
        let tap: Option<OutputTap> = request.output_tap.clone();
        let mut sinks = self.streams.lock();
        for (sink, (cap, kind)) in sinks
            .iter_mut()
            .zip([(policy.max_stdout_bytes, StreamKind::Stdout), (policy.max_stderr_bytes, StreamKind::Stderr)])
        {
            sink.text = BoundedBuffer::new(cap).tapped(tap.clone(), kind);
            sink.records = Some(ResultTap::new(self.marker.clone(), Some(1024)));
        }
    }

    /// Waits for both status records, the container's end, or the deadline.
    fn wait_cell(&self, deadline: &Deadline) -> CellEnd {
        let mut sinks = self.streams.lock();
        loop {
            if self.killed.load(Ordering::SeqCst) {
                return CellEnd::Killed;
            }
            if sinks.iter().all(|s| s.records.as_ref().is_some_and(ResultTap::value_complete)) {
                return CellEnd::Done;
            }
            if sinks.iter().any(|s| s.closed) {
                return CellEnd::Ended;
            }
            // Every change that ends the wait notifies `changed` under the
            // lock (a record completing, a stream closing, a kill): no
            // periodic re-check is needed.
            match deadline.remaining() {
                Some(left) if left.is_zero() => return CellEnd::TimedOut,
                Some(left) => drop(self.streams.changed.wait_for(&mut sinks, left)),
                None => self.streams.changed.wait(&mut sinks),
            }
        }
    }

    /// Each stream's kept text and, from its record, the cell's status.
    fn take_streams(&self) -> [(CapturedStream, Option<i32>); 2] {
        let mut sinks = self.streams.lock();
        sinks.each_mut().map(|sink| {
            let mut text = std::mem::replace(&mut sink.text, BoundedBuffer::new(Some(0)));
            let status = sink.records.take().and_then(|mut tap| {
                let records = tap.finish(&mut text);
                let json = records.value.and_then(|v| v.json)?;
                let value: serde_json::Value = serde_json::from_slice(&json).ok()?;
                value["status"].as_i64().map(|s| i32::try_from(s).unwrap_or(1))
            });
            (text.into_captured(), status)
        })
    }
}

impl ContainerSession {
    /// The files the last cell left in `/work/out`, listed inside the
    /// container by `exec` (see `outputs.rs`; nothing of the cell runs any
    /// more), read through a bounded buffer. A listing that does not finish
    /// within the cell's deadline gives no files (the message says so) and
    /// is left to finish (its work is bounded: entries, depth and bytes),
    /// the host draining it: the next cell waits for it first. Not killed:
    /// what a kill orphans inside the container would stay there as zombies
    /// of its first process, which reaps only its own child.
    fn collect_outputs(&self, io: &mut CellIo, deadline: &Deadline) -> (Vec<ExecFile>, Option<String>) {
        let limits = self.runner.output_limits();
        let none = |why: &str| outputs::files_from_listing(None, why, limits);
        let until = Instant::now() + deadline.remaining().unwrap_or(LISTING_LIMIT);
        if deadline.expired() {
            return none("the cell's deadline passed before out/ could be listed");
        }
        let mut command = process::engine_command(&self.runner.config().engine);
        command
            .args(["exec", &self.name, "/bin/sh", "-c", COLLECT_SCRIPT, "execbox-out"])
            .args(outputs::script_args(limits.tmpfs_bytes()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => return none(&format!("cannot list out/: {e}")),
        };
        let exit = match ChildHandle::of(&child) {
            Ok(exit) => exit,
            Err(e) => {
                process::kill_group(&mut child);
                let _ = child.wait();
                return none(&format!("cannot list out/: {e}"));
            }
        };
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let pipe = child.stdout.take();
        let cap = limits.listing_cap();
        // Detached: it ends when the listing's stdout does.
        let spawned =
            std::thread::Builder::new().name("execbox-listing".into()).stack_size(128 << 10).spawn(move || {
                let mut buffer = BoundedBuffer::new(Some(cap));
                if let Some(mut pipe) = pipe {
                    let mut chunk = [0u8; 16 * 1024];
                    loop {
                        match pipe.read(&mut chunk) {
                            Ok(0) => break,
                            Ok(n) => buffer.write(&chunk[..n]),
                            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                            Err(_) => break,
                        }
                    }
                }
                let _ = tx.send(buffer.into_captured());
            });
        if let Err(e) = spawned {
            process::kill_group(&mut child);
            let _ = child.wait();
            return none(&format!("cannot list out/: {e}"));
        }
        let read = rx.recv_timeout(until.saturating_duration_since(Instant::now())).ok();
        let status = match read {
            Some(_) if exit.wait_exit(Some(until)) => child.try_wait().ok().flatten(),
            _ => None,
        };
        match (read, status) {
            (Some(out), Some(status)) if status.success() => {
                let listing = Listing { bytes: out.bytes, cut: out.truncated };
                outputs::files_from_listing(Some(&listing), "", limits)
            }
            (Some(_), Some(status)) => none(&format!("listing out/ failed ({status})")),
            _ => {
                io.listing = Some(PendingListing { child, exit });
                none("listing out/ did not finish within the cell's deadline")
            }
        }
    }

    /// What of the last cell still runs, if anything: more processes than
    /// the timer and the interpreter, more threads than its one, or the
    /// interpreter not blocked reading its next cell. Read from the host's
    /// `/proc` (the program cannot fake it); `None` when the container's
    /// processes cannot be seen from here.
    fn leftovers(&self) -> Option<String> {
        let init = (*self.init_pid.lock())?;
        // The loop writes its record, then blocks: give it a moment to get
        // there. This re-reads `/proc` every 10 ms for at most 500 ms on
        // purpose: what it waits for is a state of the guest's processes
        // (the interpreter blocked in `read`, nothing else running), not an
        // exit, and the kernel offers no event for that (a pidfd signals
        // only exits).
        let until = Instant::now() + Duration::from_millis(500);
        // The timer and the loop; a shell session's `bash` too.
        let ours = if self.language == Language::Shell { 3 } else { 2 };
        loop {
            let found = inspect_tree(init)?;
            let verdict = match found {
                Tree { processes, .. } if processes > ours => Some(format!("{} processes still ran", processes - ours)),
                Tree { threads, .. } if threads > 1 => Some(format!("{} threads still ran", threads - 1)),
                Tree { reading: false, .. } => Some("the interpreter was still running".to_string()),
                // A shell's cell runs in its bash: that bash must be back
                // reading its next command (a cell that wrote its own status
                // and ran on is caught here; bash has no timer to wake it
                // later, only that input).
                Tree { shell_reading: false, .. } if self.language == Language::Shell => {
                    Some("the shell was still running the cell".to_string())
                }
                _ => None,
            };
            if verdict.is_none() || Instant::now() >= until {
                return verdict;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The container's processes below its first one.
struct Tree {
    /// Processes, the first included.
    processes: usize,
    /// Threads of the interpreter (the first process's child).
    threads: usize,
    /// The interpreter is blocked in `read` on fd 0.
    reading: bool,
    /// The interpreter's first child (a shell session's `bash`) is blocked
    /// in `read` on fd 0.
    shell_reading: bool,
}

/// Walks `/proc` from `init` (children of every thread); `None` if `init`
/// cannot be read (another PID namespace, or it is gone).
fn inspect_tree(init: u32) -> Option<Tree> {
    let children = |pid: u32| -> Vec<u32> {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
        tasks
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
            .flat_map(|list| list.split_whitespace().filter_map(|c| c.parse().ok()).collect::<Vec<u32>>())
            .collect()
    };
    std::fs::metadata(format!("/proc/{init}")).ok()?;
    let mut all = vec![init];
    let mut at = 0;
    while at < all.len() && all.len() < 4096 {
        let next = children(all[at]);
        all.extend(next);
        at += 1;
    }
    let interpreter = children(init).first().copied();
    let threads = interpreter
        .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("Threads:").map(|n| n.trim().parse::<usize>().unwrap_or(1)))
        })
        .unwrap_or(1);
    let reading = interpreter.is_some_and(blocked_reading_stdin);
    let shell_reading = interpreter.and_then(|pid| children(pid).first().copied()).is_some_and(blocked_reading_stdin);
    Some(Tree { processes: all.len(), threads, reading, shell_reading })
}

/// Whether process `pid` is blocked in `read` on fd 0 (from `/proc`).
fn blocked_reading_stdin(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/syscall")) {
        // x86_64 read(2) is syscall 0; its first argument the fd.
        Ok(text) => {
            let mut fields = text.split_whitespace();
            matches!((fields.next(), fields.next()), (Some("0"), Some("0x0")))
        }
        // Not allowed to look: at least it must not be running.
        Err(_) => std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit(')').next().and_then(|r| r.split_whitespace().next()).map(|st| st != "R"))
            .unwrap_or(true),
    }
}

/// Ends a cell's tool calls when dropped.
struct CellTools<'a>(&'a ToolSocket);

impl Drop for CellTools<'_> {
    fn drop(&mut self) {
        self.0.end();
    }
}

fn sink() -> Sink {
    Sink { text: BoundedBuffer::new(Some(0)), records: None, closed: false }
}

/// A reader thread: feeds one stream into its sink, wakes the waiter when
/// a record completes or the stream ends.
fn read_into(mut pipe: Box<dyn Read + Send>, streams: &Streams, index: usize) {
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let n = match pipe.read(&mut chunk) {
            Ok(0) | Err(_) => 0,
            Ok(n) => n,
        };
        let mut sinks = streams.lock();
        let sink = &mut sinks[index];
        if n == 0 {
            sink.closed = true;
            streams.changed.notify_all();
            return;
        }
        match sink.records.as_mut() {
            Some(records) => records.feed(&chunk[..n], &mut sink.text),
            None => sink.text.write(&chunk[..n]),
        }
        if sink.records.as_ref().is_some_and(ResultTap::value_complete) {
            streams.changed.notify_all();
        }
    }
}

impl ContainerSession {
    /// The CLI's exit status, if it exits within a moment (its container is gone).
    fn wait_briefly(&self, child: &mut Child) -> Option<std::process::ExitStatus> {
        self.cli.wait_exit(Some(Instant::now() + Duration::from_secs(2)));
        child.try_wait().ok().flatten()
    }
}

impl Session for ContainerSession {
    fn backend(&self) -> &str {
        Self::NAME
    }

    fn capabilities(&self) -> &BackendCapabilities {
        self.runner.session_capabilities()
    }

    fn refusals(&self, request: &ExecRequest) -> Vec<Violation> {
        self.fixed_cap_refusals(request)
    }

    fn execute(&self, call: Admitted) -> Result<ExecResult, ExecError> {
        self.run_cell(call)
    }

    fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Kills the container on the daemon side and the CLI attached to it
    /// (through its pidfd: no lock the call holds is needed). A call
    /// blocked writing to the container's stdin or waiting for its streams
    /// sees them close and returns as `killed`.
    fn kill(&self) {
        if self.killed.swap(true, Ordering::SeqCst) {
            return;
        }
        self.alive.store(false, Ordering::SeqCst);
        // Through the lock: a call between checking `killed` and waiting
        // cannot miss the wake-up (the lock is only ever held briefly).
        drop(self.streams.lock());
        self.streams.changed.notify_all();
        process::kill_container(&self.runner.config().engine, &self.name, process::KILL_GRACE);
        self.cli.kill();
    }
}

impl Drop for ContainerSession {
    /// Removes the container (off this thread, by the reaper), ends the CLI
    /// attached to it, and hands the staging directory over for removal.
    fn drop(&mut self) {
        let io = self.io.get_mut();
        drop(io.stdin.take());
        if let Some(listing) = io.listing.take() {
            listing.finish(Some(Instant::now()));
        }
        self.runner.reaper().remove(self.name.clone());
        process::kill_group(&mut io.child);
        let _ = io.child.wait();
        if let Some(staging) = self.staging.take() {
            self.runner.reaper().discard(staging.into_dir());
        }
    }
}
