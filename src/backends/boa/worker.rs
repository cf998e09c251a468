//! The worker process's side of contained boa: read a job, run it on a fresh
//! context, stream `console` output and the result back as frames, build the
//! next context while idle.
//!
//! The host's side is `contained.rs` (its pool) and `conversation.rs` (one
//! run's exchange of frames); the frames are defined here. The
//! worker trusts nothing it does after user code runs: the host caps every
//! frame, re-applies every limit and kills the process at the deadline.
//!
//! A run whose job has tools ([`Job::tools`]) sends each call as a
//! [`FromWorker::Tools`] frame on its stdout and reads the answers as
//! [`ToWorker::Tools`] frames from its stdin (the same two descriptors as
//! every other frame: the seccomp filter allows nothing more). The read
//! blocks: the filter has no `poll`; the host answers every call by the
//! run's deadline (the bridge's timeout) or kills the worker.

use std::cell::{Cell, RefCell};
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::rc::Rc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::backends::boa::config::EngineSettings;
use crate::backends::boa::engine::{Job, Mode, Prepared, RunReport};
use crate::backends::boa::port::{Gone, ToolPort};
use crate::backends::boa::realm::console::Console;
use crate::backends::worker::{frame, lockdown};
use crate::limits::deadline::Deadline;
use crate::tools::frame::{ToCode, ToCodeHost, ToolCall, ToolResult};

/// The first frame a worker receives.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Init {
    pub engine: EngineSettings,
    /// Keep one context across runs (a session) instead of a fresh one per run.
    pub session: bool,
}

/// Host → worker, after [`Init`].
#[derive(Debug, Deserialize)]
pub(crate) enum ToWorker {
    Run(Job),
    /// The answer to a tool call of the run (ignored between runs: a late
    /// answer to a call of a run that ended).
    Tools(ToCode),
}

/// [`ToWorker`] as the host sends it (by reference: the same JSON).
#[derive(Serialize)]
pub(crate) enum ToWorkerRef<'a> {
    Run(&'a Job),
    Tools(&'a ToCode),
}

/// Worker → host.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum FromWorker {
    /// Locked down with a fresh context, waiting for a job: sent after
    /// start-up and after each run once the next context is built.
    Ready,
    /// Kept `console` output (already cut to the run's caps), and how many
    /// bytes the code has written to that stream so far, kept or not.
    Console { stderr: bool, text: String, total: u64 },
    /// A tool call of the code (only while a run with tools is going on).
    Tools(ToCodeHost),
    /// The run ended.
    Done {
        report: RunReport,
        /// Bytes the code wrote to each stream, kept or not.
        stdout_total: u64,
        stderr_total: u64,
        /// The engine is in doubt (it panicked): replace this worker.
        retire: bool,
    },
}

/// The budget of a context when the policy asks for no fuel: the host's
/// SIGKILL, not the instruction budget, ends runaway code here.
const NO_BUDGET: u64 = u64::MAX;

/// The worker's main loop; returns its exit code.
pub(crate) fn serve() -> i32 {
    let out = FrameOut;
    let init: Init = match read_frame() {
        Ok(Some(init)) => init,
        Ok(None) => return 0,
        Err(e) => {
            eprintln!("execbox worker: bad init frame: {e}");
            return 2;
        }
    };
    let settings = init.engine;
    // Everything the engine initializes lazily (random seeds, time, shapes)
    // happens once here, before the filter forbids what it would need.
    warm_up(&settings);
    if let Err(e) = lockdown::apply() {
        eprintln!("execbox worker: {}", crate::error::with_causes(&e));
        return 2;
    }
    let Some(mut prepared) = fresh_context(NO_BUDGET, &settings) else { return 2 };
    if out.send(&FromWorker::Ready).is_err() {
        return 0;
    }
    loop {
        let job = match read_frame::<ToWorker>() {
            Ok(Some(ToWorker::Run(job))) => job,
            // A late answer to a call of a run that ended.
            Ok(Some(ToWorker::Tools(_))) => continue,
            Ok(None) => return 0,
            Err(e) => {
                eprintln!("execbox worker: bad frame: {e}");
                return 2;
            }
        };
        if !init.session && job.budget != prepared.budget {
            let Some(fresh) = fresh_context(job.budget, &settings) else { return 2 };
            prepared = fresh;
        }
        let deadline = Deadline::start(job.timeout);
        let console = Rc::new(StreamingConsole::new(job.max_stdout, job.max_stderr));
        let port = job.tools.is_some().then(|| Rc::new(FramePort::default()));
        let run_port = port.clone().map(|p| p as Rc<dyn ToolPort>);
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            prepared.run(job, &deadline, console.clone(), run_port)
        }));
        let (report, mut retire) = match run {
            Ok(report) => (report, false),
            Err(panic) => (panicked(&panic), true),
        };
        // The host broke the protocol mid-run: nothing it sends can be trusted to line up.
        if let Some(why) = port.as_ref().and_then(|p| p.broken.take()) {
            eprintln!("execbox worker: {why}");
            retire = true;
        }
        console.flush(false);
        let (stdout_total, stderr_total) = console.totals();
        let done = FromWorker::Done { report, stdout_total, stderr_total, retire };
        let sent = match out.send(&done) {
            // Only an output with no cap can make a frame over the protocol's
            // limit: report it dropped rather than dying.
            Err(e) if e.kind() == io::ErrorKind::Other => out.send(&FromWorker::Done {
                report: RunReport {
                    outcome: crate::result::Outcome::Failed,
                    output: None,
                    output_truncated: true,
                    message: Some("the returned value is over the protocol's 64 MiB frame limit".into()),
                    instructions: 0,
                },
                stdout_total,
                stderr_total,
                retire,
            }),
            other => other,
        };
        if sent.is_err() || retire {
            return 0;
        }
        // The host waits on this CPU (it pinned us here for the run): let it
        // take the answer before the next context is built.
        rustix::thread::sched_yield();
        if !init.session {
            // The dirty context goes now, while the host has its answer.
            drop(prepared);
            boa_gc::force_collect();
            let Some(fresh) = fresh_context(NO_BUDGET, &settings) else { return 2 };
            prepared = fresh;
        }
        // Ready again: the host prefers workers that say so.
        if out.send(&FromWorker::Ready).is_err() {
            return 0;
        }
    }
}

/// Runs a script that touches what boa initializes lazily, on a throwaway context.
/// A fresh context with `budget`, or `None` (said on stderr) when none can
/// be built: then the worker exits with 2.
fn fresh_context(budget: u64, settings: &EngineSettings) -> Option<Prepared> {
    Prepared::new(budget, settings).map_err(|e| eprintln!("execbox worker: cannot build a context: {e}")).ok()
}

fn warm_up(settings: &EngineSettings) {
    let Ok(mut prepared) = Prepared::new(NO_BUDGET, settings) else { return };
    let job = Job {
        source: "const d = new Date(); d.toString(); d.toISOString(); Math.random(); \
                 /a+(b)/.exec('aab'); JSON.stringify(JSON.parse('{\"a\":[1,2.5]}')); \
                 [3, 1, 2].sort().map(x => x * 2).join(','); (1.5).toFixed(2); 'x'.repeat(3).padStart(5); \
                 new Map([[1, 2]]); new Set([1]); Symbol('s').toString(); \
                 return Promise.resolve(1).then(x => x + 1);"
            .into(),
        mode: Mode::FunctionBody,
        input: Some(serde_json::json!({"items": [1, 2, 3]})),
        budget: NO_BUDGET,
        fuel_asked: false,
        timeout: Some(Duration::from_secs(5)),
        max_stdout: Some(1024),
        max_stderr: Some(1024),
        tools: None,
    };
    let console = Rc::new(StreamingConsole::new(Some(0), Some(0)));
    let _ = prepared.run(job, &Deadline::start(Some(Duration::from_secs(5))), console, None);
    drop(prepared);
    boa_gc::force_collect();
}

fn panicked(panic: &Box<dyn std::any::Any + Send>) -> RunReport {
    let text = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string());
    RunReport {
        outcome: crate::result::Outcome::Failed,
        output: None,
        output_truncated: false,
        message: Some(crate::text::cap_message(format!("the JS engine panicked: {text}"))),
        instructions: 0,
    }
}

/// Reads one frame from stdin, blocking. Stdin is locked per frame: a
/// run's tool port reads its answers from it too.
fn read_frame<T: serde::de::DeserializeOwned>() -> io::Result<Option<T>> {
    frame::read_blocking(&mut io::stdin().lock())
}

/// A run's tool port in the worker: calls are frames on stdout, answers
/// frames on stdin.
#[derive(Default)]
struct FramePort {
    /// Why the host's frames can no longer be read in order, if they cannot.
    broken: Cell<Option<String>>,
}

impl FramePort {
    fn gone(&self, why: String) -> Gone {
        self.broken.set(Some(why.clone()));
        Gone(why)
    }
}

impl ToolPort for FramePort {
    fn send(&self, call: ToolCall) -> Result<(), Gone> {
        FrameOut.send(&FromWorker::Tools(ToCodeHost::ToolCall(call))).map_err(|e| Gone(format!("the host: {e}")))
    }

    /// Blocks for the next frame whatever `until` says (the filter allows
    /// no `poll`): the host answers by the deadline or kills this process.
    fn wait(&self, _until: Option<Instant>) -> Result<Vec<ToolResult>, Gone> {
        match read_frame::<ToWorker>() {
            Ok(Some(ToWorker::Tools(ToCode::ToolResult(result)))) => Ok(vec![result]),
            Ok(Some(ToWorker::Run(_))) => Err(self.gone("the host sent a job during a run".into())),
            Ok(None) => Err(self.gone("the host closed the channel".into())),
            Err(e) => Err(self.gone(format!("bad frame: {e}"))),
        }
    }
}

/// Frames to the host on fd 1 (raw writes: no buffering to lose at exit).
struct FrameOut;

impl FrameOut {
    fn send(&self, message: &FromWorker) -> io::Result<()> {
        let bytes = frame::encode(message)?;
        let stdout = io::stdout();
        let mut fd = RawWriter(stdout.as_fd());
        fd.write_all(&bytes)
    }
}

/// `write(2)` on a borrowed fd, nothing else (the seccomp filter allows
/// exactly that).
struct RawWriter<'a>(std::os::fd::BorrowedFd<'a>);

impl Write for RawWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        rustix::io::write(self.0, buf).map_err(io::Error::from)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// `console` of a run in a worker: output is cut to the run's caps here (so
/// a flood past the cap never crosses the socket), each kept line is sent at
/// once (a run killed at its deadline still reports everything it printed),
/// and while output is being dropped its count is sent every few
/// milliseconds (so even a killed run's totals are nearly exact).
struct StreamingConsole(RefCell<ConsoleState>);

struct ConsoleState {
    out: Capped,
    err: Capped,
    last_count: std::time::Instant,
}

/// How often a count of dropped output is sent.
const COUNT_EVERY: Duration = Duration::from_millis(5);

#[derive(Default)]
struct Capped {
    cap: u64,
    kept: u64,
    total: u64,
    /// `total` as last reported to the host.
    sent_total: u64,
    pending: String,
}

impl StreamingConsole {
    fn new(max_stdout: Option<u64>, max_stderr: Option<u64>) -> Self {
        let capped = |cap: Option<u64>| Capped { cap: cap.unwrap_or(u64::MAX), ..Capped::default() };
        Self(RefCell::new(ConsoleState {
            out: capped(max_stdout),
            err: capped(max_stderr),
            last_count: std::time::Instant::now(),
        }))
    }

    fn totals(&self) -> (u64, u64) {
        let state = self.0.borrow();
        (state.out.total, state.err.total)
    }

    /// Sends what is pending; with `counts`, also the totals of streams
    /// that have nothing pending.
    fn flush(&self, counts: bool) {
        let mut guard = self.0.borrow_mut();
        let state = &mut *guard;
        for (stderr, stream) in [(false, &mut state.out), (true, &mut state.err)] {
            if !stream.pending.is_empty() || (counts && stream.total > stream.sent_total) {
                let text = std::mem::take(&mut stream.pending);
                stream.sent_total = stream.total;
                // A host that stopped listening kills us soon; nothing to do.
                let _ = FrameOut.send(&FromWorker::Console { stderr, text, total: stream.total });
            }
        }
        if counts {
            state.last_count = std::time::Instant::now();
        }
    }
}

impl Console for StreamingConsole {
    fn line(&self, to_stderr: bool, text: &str) {
        let (kept, count_due) = {
            let mut state = self.0.borrow_mut();
            let due = state.last_count.elapsed() >= COUNT_EVERY;
            let stream = if to_stderr { &mut state.err } else { &mut state.out };
            (stream.keep(text) + stream.keep("\n"), due)
        };
        if kept > 0 || count_due {
            self.flush(count_due);
        }
    }
}

impl Capped {
    /// Keeps what fits under the cap (cut at a character boundary); counts all.
    fn keep(&mut self, text: &str) -> usize {
        self.total = self.total.saturating_add(text.len() as u64);
        let room = usize::try_from(self.cap.saturating_sub(self.kept)).unwrap_or(usize::MAX);
        let mut end = text.len().min(room);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        self.pending.push_str(&text[..end]);
        self.kept += end as u64;
        end
    }
}
