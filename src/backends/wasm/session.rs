//! [`PythonSession`]: one live CPython-in-wasm instance that runs a request
//! per call and keeps its globals between calls (a notebook's kernel).
//!
//! A session starts from the warm pool (an instance already waiting for its
//! code, with the session loop already defined during its start-up), so
//! opening one costs about what a pooled run costs: the host sends `S` and
//! the session's nonce, and the loop reads cells from the instance's message
//! stdin. A session opened with environment values or granted directories
//! gets an instance started for it with them instead (CPython's start-up,
//! ~0.1 s). Per cell:
//!
//! - the request's `input` is rebound and its `input_files` are staged in
//!   the instance's `/work` (read-only to the guest; files of earlier cells
//!   stay);
//! - the deadline, output caps and an output tap are set for this cell;
//!   the memory cap applies to the instance as a whole (it only grows);
//! - the cell is over when the loop blocks for the next one, after writing
//!   its status record (taken out of stdout by the host);
//! - a cell that times out, runs out of memory, or ends the interpreter
//!   ends the session ([`Session::is_alive`] turns false; the registry
//!   reports it as lost);
//! - a cell whose policy grants tools gets the `tools` package (see the
//!   interpreters' module docs): its calls go to the cell's own tool
//!   bridge (the ledger is the cell's), and while the cell waits for an
//!   answer it is mid-cell, not done (the host knows an answer is owed or
//!   unread). The session keeps one `tools` module for all its cells: in a
//!   cell without a grant `import tools` fails and a module kept in the
//!   globals gets `not_granted` for every call.
//!
//! The host never blocks on the guest: sending a cell is a message on an
//! unbounded in-memory channel, and the wait for the cell's end is bounded
//! by its deadline plus [`REPORT_GRACE`]. [`Session::kill`] moves the
//! deadline to now (the guest stops at its next epoch tick, or wakes from a
//! sleep) and ends its stdin (a guest blocked reading it reads end-of-file).
//! Dropping the session does the same: the instance thread ends, freeing
//! its instance slot and `/work`.

use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::engine::WasmEngine;
use super::guest::RunControls;
use super::quickjs;
use super::run::Stdio;
use super::staging::write_staged;
use super::stdio::MessageSender;
use super::tool_channel::ToolChannel;
use super::warm::Warm;
use crate::admission::Admitted;
use crate::backend::{Session, killed_result};
use crate::backends::conventions;
use crate::capabilities::BackendCapabilities;
use crate::error::ExecError;
use crate::limits::deadline::Deadline;
use crate::limits::deadline::REPORT_GRACE;
use crate::limits::output::StreamKind;
use crate::limits::records::{ResultTap, marker};
use crate::request::ExecRequest;
use crate::result::{ExecResult, Outcome};
use crate::text;
use crate::tools::wire::{frame_limit, python_header};
use crate::violation::{Control, Violation};

/// How long opening a session may take (a pooled instance: milliseconds;
/// a new one: CPython's start-up, ~0.1–1 s).
const OPEN_LIMIT: Duration = Duration::from_secs(30);

/// A Python session on CPython-in-wasm (`python-wasm-session`): one live
/// instance whose globals persist across calls, opened through the
/// `python-wasm` backend's
/// [`SessionBackend`](crate::backend::SessionBackend) (e.g. by
/// [`Sessions`](crate::sessions::Sessions)). See the module docs for what
/// a call keeps and what ends the session.
pub struct PythonSession {
    engine: Arc<WasmEngine>,
    /// The `python-wasm` backend's: what calls are checked against.
    caps: Arc<BackendCapabilities>,
    nonce: String,
    stdin: Arc<MessageSender>,
    /// Takes the cells' tool calls from stdout to each cell's bridge.
    tools: Arc<ToolChannel>,
    controls: Arc<RunControls>,
    stdio: Stdio,
    work: PathBuf,
    /// The instance thread's end: `_start`'s result, once it returns.
    done: Mutex<Ended>,
    alive: AtomicBool,
    killed: AtomicBool,
}

/// The instance thread's end: its channel, and the result once received.
struct Ended {
    rx: oneshot::Receiver<Result<ExecResult, ExecError>>,
    result: Option<Result<ExecResult, ExecError>>,
}

impl PythonSession {
    /// The name sessions report in results and refusals.
    pub const NAME: &'static str = "python-wasm-session";

    /// Starts the session loop on `warm` (an instance of `engine`, from the
    /// `python-wasm` backend whose capabilities are `caps`).
    pub(crate) fn open(engine: Arc<WasmEngine>, caps: Arc<BackendCapabilities>, warm: Warm) -> Result<Self, ExecError> {
        let Warm { code, controls, stdio, work, done, thread, priority } = warm;
        drop(thread); // detached: it ends when the session's stdin does
        priority.restore();
        let nonce = quickjs::nonce();
        let ceiling = usize::try_from(engine.config().max_memory_bytes).unwrap_or(usize::MAX);
        controls.arm(Deadline::start(Some(OPEN_LIMIT)), ceiling);
        stdio.stdout.reset(Some(0), None, StreamKind::Stdout);
        stdio.stderr.reset(Some(64 << 10), None, StreamKind::Stderr);
        let tools = ToolChannel::new(&code);
        stdio.stdout.set_calls(Some(tools.sink()));
        let session = Self {
            engine,
            caps,
            nonce: nonce.clone(),
            stdin: code,
            tools,
            controls,
            stdio,
            work,
            done: Mutex::new(Ended { rx: done, result: None }),
            alive: AtomicBool::new(true),
            killed: AtomicBool::new(false),
        };
        let engine = session.engine.clone();
        let ticking = engine.ticker().run_guard();
        let unavailable = |reason: String| ExecError::unavailable(Self::NAME, reason);
        // The loop is defined in the warm bootstrap: `S` starts it with the nonce.
        let seen = session.stdin.send_raw(b"S\n".to_vec()).ok_or_else(|| unavailable("the instance ended".into()))?;
        session.stdin.send(nonce.as_bytes()).ok_or_else(|| unavailable("the instance ended".into()))?;
        let ready = session.stdin.wait_past(seen, Some(Instant::now() + OPEN_LIMIT), || session.ended());
        if !ready {
            let stderr = session.stdio.stderr.take_captured();
            return Err(unavailable(format!(
                "the session loop did not start: {}",
                text::cap_message(stderr.text().into_owned())
            )));
        }
        drop(ticking);
        Ok(session)
    }

    /// True once the instance's thread has reported its end (kept for
    /// [`PythonSession::end_of_session`]).
    fn ended(&self) -> bool {
        self.wait_end(Duration::ZERO)
    }

    /// Waits at most `limit` for the instance's thread to report its end;
    /// true once it has.
    fn wait_end(&self, limit: Duration) -> bool {
        let mut done = self.done.lock();
        if done.result.is_none() {
            match done.rx.recv_timeout(limit) {
                Ok(result) => done.result = Some(result),
                Err(oneshot::RecvTimeoutError::Timeout) => return false,
                Err(oneshot::RecvTimeoutError::Disconnected) => {
                    done.result = Some(Err(ExecError::internal(Self::NAME, "the instance thread ended")));
                }
            }
        }
        true
    }

    fn lost(&self) -> ExecError {
        ExecError::BackendUnavailable {
            backend: Self::NAME.into(),
            reason:
                "this session ended (a call timed out, ran out of memory or ended the interpreter); its state is gone"
                    .into(),
            fix: None,
        }
    }

    fn run_cell(&self, mut call: Admitted) -> Result<ExecResult, ExecError> {
        if !self.alive.load(Ordering::SeqCst) {
            return Err(self.lost());
        }
        let deadline = call.deadline();
        let source = call.take_source(Self::NAME)?;
        let max_nesting = self.engine.config().defaults.max_input_nesting;
        let input = call.take_input_json(max_nesting, Self::NAME)?;
        let request = call.request();
        // This cell's input, or none: never the last cell's.
        let _ = std::fs::remove_file(self.work.join("input.json"));
        write_staged(&self.work, request, input.as_deref().map(|json| ("input.json", json)))?;

        let policy = call.policy();
        let tap = request.output_tap.clone();
        let marker = marker(&self.nonce);
        let bridge = call.tools().cloned();
        // Every cell's tap takes tool calls: a `tools` module kept from a
        // cell that had a grant gets `not_granted` in one that has none.
        self.stdio.stdout.reset_with_records(
            policy.max_stdout_bytes,
            ResultTap::new(marker.clone(), Some(1024)).with_calls(frame_limit(bridge.as_deref())),
            tap.clone(),
            StreamKind::Stdout,
        );
        self.stdio.stderr.reset_with_records(
            policy.max_stderr_bytes,
            ResultTap::new(marker, Some(1024)),
            tap,
            StreamKind::Stderr,
        );
        self.controls.arm(deadline, self.engine.memory_cap(policy));
        let _ticking = self.engine.ticker().run_guard();

        let message = match &bridge {
            Some(bridge) => [python_header(&self.nonce, bridge), source.into_bytes()].concat(),
            None => source.into_bytes(),
        };
        self.tools.begin(bridge);
        let Some(seen) = self.stdin.send(&message) else {
            self.tools.end();
            self.alive.store(false, Ordering::SeqCst);
            return Err(self.lost());
        };
        drop(message);
        let until = deadline.remaining().map(|left| Instant::now() + left + REPORT_GRACE);
        let finished = self.wait_for_cell(seen, until);
        self.tools.end();
        if self.killed.load(Ordering::SeqCst) {
            return Ok(killed_result(Self::NAME, &deadline));
        }
        if !finished {
            return Ok(self.end_of_session(&deadline));
        }
        let stdout = self.stdio.stdout.take_captured();
        let records = self.stdio.stdout.take_records();
        let stderr = self.stdio.stderr.take_captured();
        drop(self.stdio.stderr.take_records());
        let status = records
            .value
            .and_then(|v| v.json)
            .and_then(|json| serde_json::from_slice::<serde_json::Value>(&json).ok())
            .and_then(|v| v["status"].as_i64())
            .map(|s| i32::try_from(s).unwrap_or(1));
        let mut result = ExecResult::new(Self::NAME, Outcome::Ok);
        result.exit_code = status;
        result.stdout = stdout;
        result.stderr = stderr;
        result.usage.duration = deadline.elapsed();
        result.usage.peak_memory_bytes = Some(self.controls.peak() as u64);
        match status {
            Some(0) => result.output = conventions::json_stdout(&result.stdout),
            Some(code) if self.controls.denied() => {
                // The cap was hit: the interpreter's state may be half-built.
                result.outcome = Outcome::OutOfMemory;
                result.message = Some(format!("the memory cap was reached (the cell exited with status {code})"));
                self.alive.store(false, Ordering::SeqCst);
            }
            Some(code) => {
                result.outcome = Outcome::Failed;
                result.message = Some(format!("the cell failed with status {code}"));
            }
            None => {
                // The loop's own record is missing: the cell broke the loop.
                result.outcome = Outcome::Failed;
                result.message = Some("the cell ended without its status (did it read stdin?)".into());
                self.alive.store(false, Ordering::SeqCst);
            }
        }
        Ok(result)
    }

    /// Waits until the guest blocks reading stdin for its next cell (true),
    /// or until it ends, `until` passes or the session is killed (false). A
    /// guest that blocks waiting for a tool call's answer is mid-cell: the
    /// wait goes on.
    fn wait_for_cell(&self, mut seen: u64, until: Option<Instant>) -> bool {
        loop {
            let blocked = self.stdin.wait_past(seen, until, || self.killed.load(Ordering::SeqCst) || self.ended());
            if !blocked {
                return false;
            }
            let waits = self.stdin.waits();
            if !self.tools.awaiting_answer(waits) {
                return true;
            }
            seen = waits;
        }
    }

    /// The cell did not finish: the instance ended (timed out, out of
    /// memory, `os._exit`) or never answered. The session is over.
    fn end_of_session(&self, deadline: &Deadline) -> ExecResult {
        self.alive.store(false, Ordering::SeqCst);
        // The instance stops itself at the deadline; a stuck one is told to.
        self.controls.expire_now();
        self.stdin.close();
        // The thread may report its end a moment after the guest stopped.
        self.wait_end(Duration::from_millis(500));
        let ended = self.done.lock().result.take();
        match ended {
            Some(Ok(mut result)) => {
                result.backend = Self::NAME.into();
                if result.outcome == Outcome::Ok {
                    result.outcome = Outcome::Failed;
                    result.message = Some("the interpreter exited during the cell".into());
                }
                result.usage.duration = deadline.elapsed();
                result
            }
            _ => {
                let mut result = ExecResult::new(Self::NAME, Outcome::TimedOut);
                result.message = Some(deadline.exceeded_message());
                result.stdout = self.stdio.stdout.take_captured();
                result.stderr = self.stdio.stderr.take_captured();
                result.usage.duration = deadline.elapsed();
                result
            }
        }
    }
}

impl Session for PythonSession {
    fn backend(&self) -> &str {
        Self::NAME
    }

    fn capabilities(&self) -> &BackendCapabilities {
        &self.caps
    }

    /// Per-call `fuel` (the instance's budget is set when it starts) and
    /// packages (CPython's standard library only).
    fn refusals(&self, request: &ExecRequest) -> Vec<Violation> {
        let mut violations = fuel_refusal(request.policy.fuel);
        if !request.packages.is_empty() {
            violations.push(Violation {
                control: Control::Packages,
                requested: request.packages.join(", "),
                reason: "python-wasm has CPython's standard library only".into(),
            });
        }
        violations
    }

    fn execute(&self, call: Admitted) -> Result<ExecResult, ExecError> {
        self.run_cell(call)
    }

    fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    fn kill(&self) {
        self.killed.store(true, Ordering::SeqCst);
        self.alive.store(false, Ordering::SeqCst);
        self.controls.expire_now();
        self.stdin.close();
    }
}

impl Drop for PythonSession {
    /// Ends the instance: its thread stops and frees its slot and `/work`.
    fn drop(&mut self) {
        self.controls.expire_now();
        self.stdin.close();
    }
}

/// A session has no per-call fuel: its instance's budget is set at start-up.
pub(crate) fn fuel_refusal(fuel: Option<u64>) -> Vec<Violation> {
    fuel.map(|fuel| Violation {
        control: Control::Fuel,
        requested: format!("{fuel} units"),
        reason: "a session has no per-call fuel budget".into(),
    })
    .into_iter()
    .collect()
}
