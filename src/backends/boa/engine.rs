//! One run on boa: a fresh context, the wrapped code evaluated under a
//! deadline and an instruction budget, and the result classified. The same
//! code runs in a worker process (the contained backend) and on a host
//! thread (the in-thread backend); only where `console` writes differs.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::rc::Rc;
use std::task::Poll;
use std::time::{Duration, Instant};

use boa_engine::builtins::promise::{OperationType, PromiseState};
use boa_engine::context::{ContextBuilder, HostHooks};
use boa_engine::error::EngineError;
use boa_engine::job::{self, JobExecutor};
use boa_engine::module::IdleModuleLoader;
use boa_engine::object::JsObject;
use boa_engine::property::Attribute;
use boa_engine::{Context, JsError, JsResult, JsValue, Script, Source, js_string};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::backends::boa::config::EngineSettings;
use crate::backends::boa::lexer;
use crate::backends::boa::port::{JobTools, ToolPort};
use crate::backends::boa::realm;
use crate::backends::boa::realm::console::{Console, ConsoleSink};
use crate::backends::boa::realm::data::{GuardLimits, RunDeadline, plain_property};
use crate::backends::boa::realm::guards;
use crate::backends::boa::realm::snapshot::{OutputJson, output_json};
use crate::backends::boa::realm::tools;
use crate::limits::deadline::Deadline;
use crate::result::Outcome;
use crate::text::cap_message;

/// How the source is evaluated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Mode {
    /// A function body: `return` sets the output; nothing outlives the call.
    FunctionBody,
    /// A cell in a long-lived realm (sessions). A cell that parses as a
    /// script runs as one: its top-level declarations persist, and the
    /// completion value (of the last expression statement) is the output.
    /// A cell that does not, but has a `return` outside every function (see
    /// [`lexer::has_top_level_return`]), runs as a function body instead,
    /// exactly like a [`Mode::FunctionBody`] run: `return` sets the output,
    /// earlier cells' declarations are in scope, and its own declarations
    /// are local to the cell.
    Script,
}

/// What one run needs (sent to a worker process as a frame).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Job {
    pub source: String,
    pub mode: Mode,
    /// Sent as JSON text inside the frame: parsed from depth 0 in the
    /// worker, so input at the nesting bound (128) does not overflow
    /// serde_json's own limit once wrapped in the frame.
    #[serde(with = "json_text")]
    pub input: Option<Value>,
    /// Instruction budget: the policy's fuel, or the backstop.
    pub budget: u64,
    /// True if `budget` is the policy's own fuel (affects the message only).
    pub fuel_asked: bool,
    pub timeout: Option<Duration>,
    pub max_stdout: Option<u64>,
    pub max_stderr: Option<u64>,
    /// The tools the code may call, when the policy grants any (absent from
    /// the frame otherwise: a run without tools sends what it always sent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<JobTools>,
}

/// Serde for a JSON value carried as a string of its JSON text.
mod json_text {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use serde_json::Value;

    pub fn serialize<S: Serializer>(value: &Option<Value>, serializer: S) -> Result<S::Ok, S::Error> {
        value.as_ref().map(Value::to_string).serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
        Option::<String>::deserialize(deserializer)?
            .map(|text| serde_json::from_str(&text).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// How a run ended, without its streams (sent back by a worker as a frame).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct RunReport {
    pub outcome: Outcome,
    /// The returned value as JSON text (what `JSON.stringify` made of it).
    pub output: Option<String>,
    /// The returned value's JSON was over `max_stdout_bytes` and was dropped.
    pub output_truncated: bool,
    pub message: Option<String>,
    /// VM instructions executed.
    pub instructions: u64,
}

/// A fresh context with the realm installed, waiting for one job.
pub(crate) struct Prepared {
    ctx: Context,
    queue: Rc<JobQueue>,
    hooks: Rc<Hooks>,
    settings: EngineSettings,
    /// The budget this context was built with.
    pub budget: u64,
}

impl Prepared {
    pub fn new(budget: u64, settings: &EngineSettings) -> JsResult<Self> {
        let queue = Rc::new(JobQueue::default());
        let hooks = Rc::new(Hooks { unhandled: RefCell::default() });
        let mut ctx = ContextBuilder::new()
            .job_executor(queue.clone())
            .host_hooks(hooks.clone())
            // No module loader: boa's default resolves `import()` against the
            // working directory's files.
            .module_loader(Rc::new(IdleModuleLoader))
            .instructions_remaining(usize::try_from(budget).unwrap_or(usize::MAX))
            .build()?;
        ctx.runtime_limits_mut().set_recursion_limit(settings.recursion_limit);
        realm::install(&mut ctx, GuardLimits::from(settings))?;
        Ok(Self { ctx, queue, hooks, settings: *settings, budget })
    }

    /// Runs `job` to completion, a limit, or the deadline, writing `console`
    /// output to `console`; its tool calls (if the job has tools) go to
    /// `port`. The context keeps whatever the code left (a session reuses
    /// it; otherwise it is dropped).
    pub fn run(
        &mut self,
        job: Job,
        deadline: &Deadline,
        console: Rc<dyn Console>,
        port: Option<Rc<dyn ToolPort>>,
    ) -> RunReport {
        self.ctx.insert_data(ConsoleSink(console.clone()));
        self.ctx.insert_data(RunDeadline(*deadline));
        self.hooks.unhandled.borrow_mut().clear();
        let start_remaining = self.ctx.instructions_remaining();
        let (fuel_asked, budget, max_output) = (job.fuel_asked, job.budget, job.max_stdout);
        let mut wrapped = false;

        let mut report =
            RunReport { outcome: Outcome::Ok, output: None, output_truncated: false, message: None, instructions: 0 };
        let evaluated = self.evaluate(job, deadline, port, &mut wrapped);
        tools::end_run(&mut self.ctx);
        match evaluated {
            Ok(text) => match (text, max_output) {
                (Some(text), Some(max)) if text.len() as u64 > max => {
                    report.outcome = Outcome::Failed;
                    report.output_truncated = true;
                    report.message =
                        Some(format!("the returned value is over the output cap of {max} bytes (max_stdout_bytes)"));
                }
                (text, _) => report.output = text,
            },
            Err(Stop::Deadline) => {
                report.outcome = Outcome::TimedOut;
                report.message = Some(deadline.exceeded_message());
            }
            Err(Stop::OutputTooLarge(max)) => {
                report.outcome = Outcome::Failed;
                report.output_truncated = true;
                report.message =
                    Some(format!("the returned value is over the output cap of {max} bytes (max_stdout_bytes)"));
            }
            Err(Stop::Unhandled(reason)) => {
                report.outcome = Outcome::Failed;
                report.message = Some(format!("(in promise) {reason}"));
            }
            Err(Stop::Thrown(err)) => {
                let (outcome, message) = classify(err, fuel_asked, budget, wrapped);
                report.outcome = outcome;
                report.message = Some(message);
            }
        }
        if let Some(message) = report.message.take() {
            let message = cap_message(message);
            if report.outcome == Outcome::Failed && !report.output_truncated {
                console.line(true, &format!("Uncaught {message}"));
            }
            report.message = Some(message);
        }
        report.instructions = start_remaining.saturating_sub(self.ctx.instructions_remaining()) as u64;
        report
    }

    /// The returned value's JSON text, if it has one. Sets `wrapped` if the
    /// code ran inside the function wrapper (its syntax errors' columns are
    /// then corrected for the wrapper's prefix).
    fn evaluate(
        &mut self,
        job: Job,
        deadline: &Deadline,
        port: Option<Rc<dyn ToolPort>>,
        wrapped: &mut bool,
    ) -> Result<Option<String>, Stop> {
        let yield_every = self.settings.yield_every;
        let ctx = &mut self.ctx;
        let input = match &job.input {
            Some(value) => JsValue::from_json(value, ctx)?,
            None => JsValue::undefined(),
        };
        ctx.register_global_property(js_string!("input"), input, Attribute::WRITABLE | Attribute::CONFIGURABLE)?;
        match (&job.tools, port) {
            (Some(granted), Some(port)) => tools::install(ctx, granted, port)?,
            // A session's cell without tools after one with them.
            _ => tools::remove(ctx),
        }

        drop(job.input);
        let parse = |source: &str, ctx: &mut Context| Script::parse(Source::from_bytes(source.as_bytes()), None, ctx);
        let script = match job.mode {
            Mode::FunctionBody => {
                *wrapped = true;
                parse(&wrap(&job.source), ctx)?
            }
            Mode::Script => match parse(&job.source, ctx) {
                Ok(script) => script,
                // Only a cell that is no script but is a function body runs
                // as one; otherwise the script's own error stands.
                Err(err) if lexer::has_top_level_return(&job.source) => match parse(&wrap(&job.source), ctx) {
                    Ok(script) => {
                        *wrapped = true;
                        script
                    }
                    Err(_) => return Err(err.into()),
                },
                Err(err) => return Err(err.into()),
            },
        };
        drop(job.source);
        let value =
            poll_until(script.evaluate_async_with_budget(ctx, yield_every), deadline).ok_or(Stop::Deadline)??;
        self.queue.run_to_rest(ctx, deadline)?;

        let returned_promise = value.as_promise();
        let value = match returned_promise.as_ref().map(|p| p.state()) {
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
        // A promise rejected with no handler, other than the returned one: an
        // error nobody caught (Node and QuickJS fail the same way).
        let returned: Option<JsObject> = returned_promise.map(JsObject::from);
        let unhandled = self
            .hooks
            .unhandled
            .borrow()
            .iter()
            .find(|p| returned.as_ref().is_none_or(|r| !JsObject::equals(p, r)))
            .cloned();
        if let Some(promise) = unhandled
            && let Some(PromiseState::Rejected(reason)) = JsValue::from(promise).as_promise().map(|p| p.state())
        {
            return Err(Stop::Unhandled(describe_value(&reason)));
        }
        if value.is_undefined() {
            return Ok(None);
        }
        // `output` is exactly what JSON.stringify makes of the value,
        // whatever the code did to `JSON`.
        match output_json(value, job.max_stdout, ctx)? {
            OutputJson::None => Ok(None),
            OutputJson::Text(text) => Ok(Some(text)),
            OutputJson::TooLarge => Err(Stop::OutputTooLarge(job.max_stdout.unwrap_or(u64::MAX))),
        }
    }
}

/// Why a run stopped before producing a value.
pub(crate) enum Stop {
    Deadline,
    OutputTooLarge(u64),
    /// A promise rejected with no handler; the rejection reason, described.
    Unhandled(String),
    Thrown(JsError),
}

impl From<JsError> for Stop {
    fn from(err: JsError) -> Self {
        Stop::Thrown(err)
    }
}

/// The host hooks of a run's realm: unhandled rejections are tracked, text
/// compiled at run time (`eval`, `Function`) is scanned for nesting, and
/// local time is UTC (the host's time zone is not the code's business, and
/// reading it would open `/etc/localtime`).
struct Hooks {
    unhandled: RefCell<Vec<JsObject>>,
}

impl HostHooks for Hooks {
    fn promise_rejection_tracker(
        &self,
        promise: &JsObject<boa_engine::builtins::promise::Promise>,
        operation: OperationType,
        _context: &mut Context,
    ) {
        let promise = promise.clone().upcast();
        let mut unhandled = self.unhandled.borrow_mut();
        match operation {
            OperationType::Reject => unhandled.push(promise),
            OperationType::Handle => unhandled.retain(|p| !JsObject::equals(p, &promise)),
        }
    }

    fn local_timezone_offset_seconds(&self, _unix_time_seconds: i64) -> i32 {
        0
    }

    fn ensure_can_compile_strings(
        &self,
        _realm: boa_engine::realm::Realm,
        parameters: &[boa_engine::JsString],
        body: &boa_engine::JsString,
        _direct: bool,
        context: &mut Context,
    ) -> JsResult<()> {
        for text in parameters.iter().chain(std::iter::once(body)) {
            guards::scan(&text.to_std_string_escaped(), context)?;
        }
        Ok(())
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

fn classify(err: JsError, fuel_asked: bool, budget: u64, wrapped: bool) -> (Outcome, String) {
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
    if let Some(native) = err.as_native() {
        return (Outcome::Failed, describe_native(native, wrapped));
    }
    let thrown = err.as_opaque().cloned().unwrap_or_default();
    (Outcome::Failed, describe_value(&thrown))
}

/// `Kind: message`, without boa's stack-position suffix: inside the wrapper
/// it names the wrapper's call site, not the user's line. Syntax errors carry
/// their own `at line L, col C`, which is corrected for the wrapper prefix.
fn describe_native(native: &boa_engine::JsNativeError, wrapped: bool) -> String {
    let message = native.message().trim();
    let message = if wrapped { fix_first_line_column(message) } else { message.to_string() };
    if message.is_empty() { native.kind().to_string() } else { format!("{}: {message}", native.kind()) }
}

/// A thrown value in one line, read as plain data: strings as they are,
/// error-like objects as `name: message` from their own or inherited *data*
/// properties (no getter, proxy trap or `toString` of the code's runs here:
/// an error whose message is itself, or whose `errors` list claims a huge
/// length, is described without walking it).
fn describe_value(value: &JsValue) -> String {
    if let Some(text) = value.as_string() {
        return cap_message(text.to_std_string_escaped());
    }
    let Some(object) = value.as_object() else {
        // Primitives display without running code.
        return cap_message(value.display().to_string());
    };
    let name = plain_property(&object, "name");
    let message = plain_property(&object, "message");
    match (name, message) {
        (Some(name), Some(message)) if !message.is_empty() => cap_message(format!("{name}: {message}")),
        (Some(name), _) => cap_message(name),
        (None, Some(message)) => cap_message(message),
        (None, None) if object.is_callable() => "a function was thrown".into(),
        (None, None) => "an object was thrown".into(),
    }
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
/// jobs (a job itself is bounded by the instruction budget, and in a worker
/// process by the host's kill). No timers exist in this realm, so only
/// promise and generic jobs ever arrive.
#[derive(Default)]
pub(crate) struct JobQueue(RefCell<VecDeque<job::Job>>);

impl JobQueue {
    /// Runs jobs until none is left and no tool call is pending: while calls
    /// are pending and nothing else can run, waits for their answers (until
    /// the deadline) and settles them, which queues more jobs. As in Node,
    /// the run goes on while a call the code made is unanswered, awaited or
    /// not.
    fn run_to_rest(&self, ctx: &mut Context, deadline: &Deadline) -> Result<(), Stop> {
        loop {
            self.drain(ctx, deadline)?;
            let Some(run) = tools::active(ctx) else { return Ok(()) };
            if !run.waiting() {
                return Ok(());
            }
            let until = deadline.remaining().map(|left| Instant::now() + left);
            match run.port().wait(until) {
                Ok(answers) => run.settle(answers, ctx)?,
                Err(gone) => run.abandon(&gone, ctx)?,
            }
        }
    }

    fn drain(&self, ctx: &mut Context, deadline: &Deadline) -> Result<(), Stop> {
        loop {
            if deadline.expired() {
                return Err(Stop::Deadline);
            }
            let Some(next) = self.0.borrow_mut().pop_front() else { return Ok(()) };
            match next {
                // Dynamic `import()` settles through one of these (it fails:
                // there is no module loader), so the code can catch it.
                job::Job::AsyncJob(job) => {
                    let cell = RefCell::new(&mut *ctx);
                    poll_until(job.call(&cell), deadline).ok_or(Stop::Deadline)??;
                }
                other => run_job(other, ctx)?,
            }
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
