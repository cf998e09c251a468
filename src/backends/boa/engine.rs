//! One run on a worker thread: a fresh context, the wrapped code evaluated
//! under a deadline and an instruction budget, and the result classified.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use boa_engine::builtins::promise::PromiseState;
use boa_engine::context::ContextBuilder;
use boa_engine::error::EngineError;
use boa_engine::job::{self, JobExecutor};
use boa_engine::property::Attribute;
use boa_engine::{Context, JsError, JsResult, JsValue, Script, Source, js_string};
use serde_json::Value;

use super::BoaJsConfig;
use super::realm::{self, ConsoleSink, GuardLimits, Realm, RunDeadline, Streams};
use crate::limits::Deadline;
use crate::result::{ExecResult, Outcome, Usage};

/// How the source is evaluated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    /// A function body: `return` sets the output; nothing outlives the call.
    FunctionBody,
    /// A script in a long-lived realm (sessions): top-level declarations
    /// persist, the completion value (last expression statement) is the output.
    Script,
}

/// What a worker needs to run one request (everything `Send`).
pub(super) struct Job {
    pub source: String,
    pub mode: Mode,
    pub input: Option<Value>,
    /// Instruction budget: the policy's fuel, or the backstop.
    pub budget: u64,
    /// True if `budget` is the policy's own fuel (affects the message only).
    pub fuel_asked: bool,
    pub timeout: Option<Duration>,
    pub max_stdout: Option<u64>,
    pub max_stderr: Option<u64>,
}

/// A fresh context with the realm installed, waiting for one job.
pub(super) struct Prepared {
    ctx: Context,
    realm: Realm,
    queue: Rc<JobQueue>,
    /// The budget this context was built with.
    pub budget: u64,
}

impl Prepared {
    pub fn new(budget: u64, cfg: &BoaJsConfig) -> JsResult<Self> {
        let queue = Rc::new(JobQueue::default());
        let mut ctx = ContextBuilder::new()
            .job_executor(queue.clone())
            .instructions_remaining(usize::try_from(budget).unwrap_or(usize::MAX))
            .build()?;
        let limits = ctx.runtime_limits_mut();
        limits.set_recursion_limit(cfg.recursion_limit);
        let realm = realm::install(&mut ctx, GuardLimits::from(cfg))?;
        Ok(Self { ctx, realm, queue, budget })
    }

    /// Runs `job` to completion, a limit, or the deadline. The context keeps
    /// whatever the code left (a session reuses it; the pool drops it).
    pub fn run(
        &mut self,
        job: Job,
        deadline: &Deadline,
        streams: &Arc<Mutex<Streams>>,
        cfg: &BoaJsConfig,
    ) -> ExecResult {
        self.ctx.insert_data(ConsoleSink(streams.clone()));
        self.ctx.insert_data(RunDeadline(*deadline));
        let start_remaining = self.ctx.instructions_remaining();
        let fuel_asked = job.fuel_asked;
        let budget = job.budget;
        let wrapped = job.mode == Mode::FunctionBody;

        let (outcome, output, message) = match self.evaluate(job, deadline, cfg) {
            Ok(output) => (Outcome::Ok, output, None),
            Err(Stop::Deadline) => (Outcome::TimedOut, None, Some(deadline.exceeded_message())),
            Err(Stop::Thrown(err)) => {
                let (outcome, message) = classify(err, &mut self.ctx, fuel_asked, budget, wrapped);
                (outcome, None, Some(message))
            }
        };
        let used = start_remaining.saturating_sub(self.ctx.instructions_remaining()) as u64;
        let (stdout, stderr) = {
            let mut s = streams.lock().unwrap_or_else(|p| p.into_inner());
            if outcome == Outcome::Failed
                && let Some(m) = &message
            {
                s.stderr.write_str(&format!("Uncaught {m}\n"));
            }
            (s.stdout.snapshot(), s.stderr.snapshot())
        };
        ExecResult {
            backend: super::BoaJs::NAME.to_string(),
            outcome,
            exit_code: None,
            stdout,
            stderr,
            output,
            output_truncated: false,
            message,
            output_files: Vec::new(),
            failure_kind: None,
            diagnostics: Vec::new(),
            usage: Usage {
                duration: deadline.elapsed(),
                instructions: Some(used),
                fuel: None,
                peak_memory_bytes: None,
            },
        }
    }

    fn evaluate(&mut self, job: Job, deadline: &Deadline, cfg: &BoaJsConfig) -> Result<Option<Value>, Stop> {
        let ctx = &mut self.ctx;
        let input = match &job.input {
            Some(value) => JsValue::from_json(value, ctx)?,
            None => JsValue::undefined(),
        };
        ctx.register_global_property(js_string!("input"), input, Attribute::WRITABLE | Attribute::CONFIGURABLE)?;

        let source = match job.mode {
            Mode::FunctionBody => wrap(&job.source),
            Mode::Script => job.source,
        };
        drop(job.input);
        let script = Script::parse(Source::from_bytes(source.as_bytes()), None, ctx)?;
        drop(source);
        let value =
            poll_until(script.evaluate_async_with_budget(ctx, cfg.yield_every), deadline).ok_or(Stop::Deadline)??;
        self.queue.drain(ctx, deadline)?;

        let value = match value.as_promise().map(|p| p.state()) {
            None => value,
            Some(PromiseState::Fulfilled(v)) => v,
            Some(PromiseState::Rejected(reason)) => return Err(JsError::from_opaque(reason).into()),
            Some(PromiseState::Pending) => {
                return Err(JsError::from(
                    boa_engine::JsNativeError::error().with_message("the returned promise never settled"),
                )
                .into());
            }
        };
        if value.is_undefined() {
            return Ok(None);
        }
        // `output` is exactly what JSON.stringify makes of the value
        // (the guarded original, whatever the code did to `JSON`).
        let text = self.realm.stringify.call(&JsValue::undefined(), &[value], ctx)?;
        match text.as_string() {
            None => Ok(None), // functions, symbols: no JSON form
            Some(s) => serde_json::from_str(&s.to_std_string_escaped()).map(Some).map_err(|e| {
                Stop::Thrown(
                    boa_engine::JsNativeError::typ()
                        .with_message(format!("return value is not valid JSON: {e}"))
                        .into(),
                )
            }),
        }
    }
}

/// Why a run stopped before producing a value.
pub(super) enum Stop {
    Deadline,
    Thrown(JsError),
}

impl From<JsError> for Stop {
    fn from(err: JsError) -> Self {
        Stop::Thrown(err)
    }
}

/// The code becomes a function body. It starts on the wrapper's first line,
/// so error positions match the user's lines; the newline before `}` keeps a
/// trailing `// comment` from swallowing the wrapper.
fn wrap(source: &str) -> String {
    // Both prefixes are WRAP_PREFIX_LEN characters long.
    let prefix = if source.contains("await") { "(async function () {" } else { "(function       () {" };
    format!("{prefix}{source}\n}})()")
}

const WRAP_PREFIX_LEN: usize = "(async function () {".len();

/// Polls a VM future, checking the deadline each time it yields.
fn poll_until<F: Future>(fut: F, deadline: &Deadline) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return Some(out);
        }
        if deadline.expired() {
            return None;
        }
    }
}

fn classify(err: JsError, ctx: &mut Context, fuel_asked: bool, budget: u64, wrapped: bool) -> (Outcome, String) {
    if let Some(engine) = err.as_engine() {
        return match engine {
            EngineError::NoInstructionsRemain if fuel_asked => {
                (Outcome::OutOfFuel, format!("instruction budget of {budget} exhausted"))
            }
            EngineError::NoInstructionsRemain => (
                Outcome::OutOfFuel,
                format!(
                    "instruction backstop of {budget} exhausted (derived from the timeout; \
                     set policy.fuel to choose the budget)"
                ),
            ),
            EngineError::RuntimeLimit(limit) => (Outcome::Failed, format!("RangeError: {limit}")),
            other => (Outcome::Failed, format!("engine error: {other}")),
        };
    }
    match err.try_native(ctx) {
        Ok(native) => (Outcome::Failed, describe_native(&native, wrapped)),
        Err(_) => {
            let thrown = err.as_opaque().cloned().unwrap_or_default();
            let text = match thrown.as_string() {
                Some(s) => s.to_std_string_escaped(),
                None => thrown.display().to_string(),
            };
            (Outcome::Failed, text)
        }
    }
}

/// `Kind: message`, without boa's stack-position suffix: inside the wrapper
/// it names the wrapper's call site, not the user's line. Syntax errors carry
/// their own `at line L, col C`, which is corrected for the wrapper prefix.
fn describe_native(native: &boa_engine::JsNativeError, wrapped: bool) -> String {
    let message = native.message().trim();
    let message = if wrapped { fix_first_line_column(message) } else { message.to_string() };
    if message.is_empty() { native.kind().to_string() } else { format!("{}: {message}", native.kind()) }
}

fn fix_first_line_column(message: &str) -> String {
    const MARK: &str = "at line 1, col ";
    let Some(at) = message.find(MARK) else { return message.to_string() };
    let digits_start = at + MARK.len();
    let digits_len = message[digits_start..].bytes().take_while(u8::is_ascii_digit).count();
    let Ok(col) = message[digits_start..digits_start + digits_len].parse::<usize>() else {
        return message.to_string();
    };
    let col = col.saturating_sub(WRAP_PREFIX_LEN).max(1);
    format!("{}{col}{}", &message[..digits_start], &message[digits_start + digits_len..])
}

/// Promise jobs, run by [`JobQueue::drain`] with the deadline checked between
/// jobs (a job itself is bounded by the instruction budget). No timers exist
/// in this realm, so only promise and generic jobs ever arrive.
#[derive(Default)]
pub(super) struct JobQueue(RefCell<VecDeque<job::Job>>);

impl JobQueue {
    fn drain(&self, ctx: &mut Context, deadline: &Deadline) -> Result<(), Stop> {
        loop {
            if deadline.expired() {
                return Err(Stop::Deadline);
            }
            let Some(next) = self.0.borrow_mut().pop_front() else { return Ok(()) };
            run_job(next, ctx)?;
        }
    }
}

fn run_job(job: job::Job, ctx: &mut Context) -> JsResult<()> {
    match job {
        job::Job::PromiseJob(j) => j.call(ctx).map(drop),
        job::Job::GenericJob(j) => j.call(ctx).map(drop),
        // Async, timer and finalization jobs need host APIs this realm lacks.
        _ => Ok(()),
    }
}

impl JobExecutor for JobQueue {
    fn enqueue_job(self: Rc<Self>, job: job::Job, _ctx: &mut Context) {
        self.0.borrow_mut().push_back(job);
    }

    fn run_jobs(self: Rc<Self>, ctx: &mut Context) -> JsResult<()> {
        loop {
            let Some(next) = self.0.borrow_mut().pop_front() else { return Ok(()) };
            run_job(next, ctx)?;
        }
    }
}
