//! One run's conversation with a `boa-js` worker process, host side: send
//! the job, collect the output, pass the worker's tool calls to the run's
//! bridge and their answers back, and end it, stopping a worker that has
//! not answered by the deadline plus its grace.
//!
//! A blocking caller waits on its own thread ([`converse`]). An async
//! caller on a runtime with a reactor ([`crate::reactor::here`]) awaits the
//! same conversation on its task ([`converse_async`]). Both hand what they
//! hear to one [`Talk`], so every frame means the same on both.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustix::fd::OwnedFd;
use serde_json::Value;

use crate::backends::boa::capabilities::CONTAINED_NAME;
use crate::backends::boa::engine::Job;
use crate::backends::boa::port::fit_result;
use crate::backends::boa::worker::{FromWorker, ToWorkerRef};
use crate::backends::worker::frame::{MAX_FRAME_BYTES, RecvError};
use crate::backends::worker::process::{Death, Outbox, SendError, WorkerProcess};
use crate::backends::worker::registered::{NoReactor, Registered};
use crate::limits::deadline::Deadline;
use crate::limits::output::BoundedBuffer;
use crate::result::{ExecResult, Outcome};
use crate::text::cap_message;
use crate::tools::frame::{ToCode, ToCodeHost, ToolCall, ToolResult};
use crate::tools::{ToolBridge, ToolError, ToolErrorKind};

/// How a conversation with a worker ended.
pub(crate) enum Conversation {
    /// The worker was gone before it took the job: nothing ran.
    NotStarted,
    /// The run has a result; `reusable` if the worker may serve again.
    Finished { result: Box<ExecResult>, reusable: bool },
}

/// The limits of one conversation.
#[derive(Clone, Copy)]
pub(crate) struct Limits {
    /// Bytes the worker may grow by during the run (and while it builds its
    /// next context afterwards).
    pub memory: u64,
    /// How long past the deadline the worker may take to report itself
    /// before it is killed.
    pub grace: Duration,
}

/// Runs `job` on `worker`: caps its memory, sends the job with what is left
/// of `deadline`, collects its output, and kills it if it has not answered
/// `grace` after the deadline. With `tools` (the run's bridge; the job then
/// names the granted tools), the worker's tool calls go to the bridge and
/// their answers back to the worker, within the same wait.
pub(crate) fn converse(
    worker: &mut WorkerProcess,
    job: &mut Job,
    deadline: &Deadline,
    limits: Limits,
    tools: Option<&Arc<ToolBridge>>,
) -> Conversation {
    let mut talk = match Talk::begin(worker, job, deadline, limits, tools) {
        Ok(begun) => begun,
        Err(ended) => return ended,
    };
    // The worker runs where this thread waits for it (its caller unpins it).
    worker.pin_to_this_cpu();
    let sent = worker.send(&ToWorkerRef::Run(job), talk.until);
    if let Some(ended) = talk.sent(worker, sent) {
        worker.reap();
        return ended;
    }
    loop {
        let heard = match &talk.link {
            Some(link) => {
                worker.exchange::<FromWorker>(&mut talk.outbox, link.answers.wake.as_fd(), talk.until, talk.max_frame)
            }
            None => worker.recv::<FromWorker>(talk.until, talk.max_frame).map(Some),
        };
        match talk.hear(worker, heard) {
            Step::Listen => {}
            Step::Over(ended) => {
                // A stopped worker is gone, and reaped, when the run returns.
                worker.reap();
                return ended;
            }
            Step::Closed => return talk.died(&worker.death()),
        }
    }
}

/// [`converse`] for an async caller, on a thread where
/// [`crate::reactor::here`]: every wait is on the runtime's reactor (the
/// deadline too: a timerfd), none on the thread. The worker is not pinned:
/// the task may move between threads, and tasks that ran on one thread
/// pinned their workers to one CPU, which halved throughput on two. A
/// worker that must be stopped is signalled here and reaped once it has
/// exited, also on the reactor. The caller registered the worker with the
/// reactor first ([`WorkerProcess::on_reactor`]). Dropping the future
/// leaves the worker mid-job: its owner must stop it.
pub(crate) async fn converse_async(
    worker: &mut WorkerProcess,
    job: &mut Job,
    deadline: &Deadline,
    limits: Limits,
    tools: Option<&Arc<ToolBridge>>,
) -> Conversation {
    let mut talk = match Talk::begin(worker, job, deadline, limits, tools) {
        Ok(begun) => begun,
        Err(ended) => return ended,
    };
    let wake = talk.link.as_ref().map(|link| Registered::new(&link.answers.wake, tokio::io::Interest::READABLE));
    let (Ok(wake), Ok(())) = (wake.transpose(), worker.set_alarm(talk.until)) else {
        return talk.off_reactor(worker).await;
    };
    let sent = match worker.send_async(&ToWorkerRef::Run(job)).await {
        Ok(sent) => sent,
        Err(NoReactor) => return talk.off_reactor(worker).await,
    };
    if let Some(ended) = talk.sent(worker, sent) {
        worker.reap_async().await;
        return ended;
    }
    loop {
        let exchange = worker.exchange_async::<FromWorker>(&mut talk.outbox, wake.as_ref(), talk.max_frame);
        let heard = match exchange.await {
            Ok(heard) => heard,
            Err(NoReactor) => return talk.off_reactor(worker).await,
        };
        match talk.hear(worker, heard) {
            Step::Listen => {}
            Step::Over(ended) => {
                worker.reap_async().await;
                return ended;
            }
            Step::Closed => return talk.died(&worker.death_async().await),
        }
    }
}

/// One conversation after the job was built: what the host has collected
/// from the worker and what it owes it.
struct Talk<'a> {
    deadline: &'a Deadline,
    memory: u64,
    /// The run's tool calls, if it grants tools.
    link: Option<Link>,
    /// The largest frame the worker may send ([`frame_limit`]).
    max_frame: usize,
    /// When the conversation ends at the latest: the deadline plus the grace.
    until: Option<Instant>,
    stdout: BoundedBuffer,
    stderr: BoundedBuffer,
    /// The worker's running counts of what the code wrote (kept or not).
    totals: (u64, u64),
    /// Tool answers for the worker, written as it reads.
    outbox: Outbox,
}

/// What the driver of a [`Talk`] does next.
enum Step {
    /// Wait for the worker's next frame.
    Listen,
    /// The conversation is over. A worker that may not serve again was
    /// stopped (signalled, not yet reaped).
    Over(Conversation),
    /// The worker closed its end: its death says how the run ended
    /// ([`Talk::died`]).
    Closed,
}

impl<'a> Talk<'a> {
    /// Gets `worker` ready for `job`: caps its memory and gives the job what
    /// is left of `deadline`. Returns the talk, or how the conversation
    /// ended before it began.
    fn begin(
        worker: &mut WorkerProcess,
        job: &mut Job,
        deadline: &'a Deadline,
        limits: Limits,
        tools: Option<&Arc<ToolBridge>>,
    ) -> Result<Self, Conversation> {
        let Limits { memory, grace } = limits;
        let link = match tools.map(|bridge| Link::new(bridge.clone())).transpose() {
            Ok(link) => link,
            Err(e) => {
                let mut result = ExecResult::new(CONTAINED_NAME, Outcome::Failed);
                result.message = Some(format!("cannot set up the channel for tool calls: {e}"));
                return Err(Conversation::Finished { result: Box::new(result), reusable: true });
            }
        };
        if worker.limit_memory(memory).is_err() {
            return Err(Conversation::NotStarted);
        }
        job.timeout = deadline.remaining();
        let until = deadline.remaining().map(|left| Instant::now() + left + grace);
        let talk = Talk {
            deadline,
            memory,
            link,
            max_frame: frame_limit(job),
            until,
            stdout: BoundedBuffer::new(job.max_stdout),
            stderr: BoundedBuffer::new(job.max_stderr),
            totals: (0, 0),
            outbox: Outbox::default(),
        };
        Ok(talk)
    }

    /// How sending the job went: `Some` if that ended the conversation
    /// (the worker is stopped then, unless nothing reached it).
    fn sent(&self, worker: &mut WorkerProcess, sent: Result<(), SendError>) -> Option<Conversation> {
        match sent {
            Ok(()) => None,
            Err(e) if e.nothing_sent() => Some(Conversation::NotStarted),
            Err(SendError::TimedOut) => {
                // The worker did not take the whole job before the deadline.
                worker.stop();
                let mut result = ExecResult::new(CONTAINED_NAME, Outcome::TimedOut);
                result.message = Some(self.deadline.exceeded_message());
                result.usage.duration = self.deadline.elapsed();
                Some(Conversation::Finished { result: Box::new(result), reusable: false })
            }
            // It died while taking the job: its death says how (the next
            // read finds its end closed).
            Err(SendError::Closed { .. }) => None,
        }
    }

    /// Takes in what the driver heard: a frame, a wake-up for tool answers
    /// (`Ok(None)`), or why nothing came.
    fn hear(&mut self, worker: &mut WorkerProcess, heard: Result<Option<FromWorker>, RecvError>) -> Step {
        let frame = match heard {
            Ok(Some(frame)) => frame,
            // Woken: answers to pass on.
            Ok(None) => {
                if let Some(link) = &self.link {
                    for (tool, answer) in link.take() {
                        link.forward(tool, answer, &mut self.outbox);
                    }
                }
                if self.outbox.len() > MAX_UNREAD_ANSWERS {
                    let why = format!("the JS worker left over {MAX_UNREAD_ANSWERS} tool answers unread");
                    return self.stopped(worker, Outcome::Failed, why);
                }
                return Step::Listen;
            }
            Err(RecvError::TimedOut) => {
                let why = self.deadline.exceeded_message();
                return self.stopped(worker, Outcome::TimedOut, why);
            }
            Err(RecvError::Invalid(why)) => {
                return self.stopped(worker, Outcome::Failed, format!("the JS worker sent {why}"));
            }
            Err(RecvError::Closed) => return Step::Closed,
        };
        match frame {
            FromWorker::Tools(ToCodeHost::ToolCall(call)) => match &self.link {
                Some(link) => link.dispatch(call),
                None => {
                    let why = "the JS worker sent a tool call, but this run grants no tools".to_string();
                    return self.stopped(worker, Outcome::Failed, why);
                }
            },
            FromWorker::Console { stderr: to_stderr, text, total } => {
                let (stream, seen) = if to_stderr {
                    (&mut self.stderr, &mut self.totals.1)
                } else {
                    (&mut self.stdout, &mut self.totals.0)
                };
                stream.write_str(&text);
                *seen = (*seen).max(total);
            }
            FromWorker::Done { report, stdout_total, stderr_total, retire } => {
                // The run's memory limit stays while the worker builds its
                // next context (trusted code, well within it); the next run
                // sets its own. The caller lifts the pin (the pool, a
                // session after its call).
                let mut result = ExecResult::new(CONTAINED_NAME, report.outcome);
                result.stdout = with_total(self.take_stdout(), stdout_total);
                result.stderr = with_total(self.take_stderr(), stderr_total);
                // The worker's clock started when it read the job: the
                // request's own deadline is the one to report.
                result.message = match report.outcome {
                    Outcome::TimedOut => Some(self.deadline.exceeded_message()),
                    _ => report.message.map(cap_message),
                };
                result.output_truncated = report.output_truncated;
                result.usage.instructions = Some(report.instructions);
                result.usage.duration = self.deadline.elapsed();
                if let Some(text) = report.output {
                    match serde_json::from_str::<Value>(&text) {
                        Ok(value) => result.output = Some(value),
                        Err(e) => {
                            result.outcome = Outcome::Failed;
                            result.message = Some(format!("the returned value is not usable JSON: {e}"));
                        }
                    }
                }
                // A tool answer cut short in the worker's input would be
                // read as the start of its next job.
                let reusable = !retire && self.outbox.at_frame_boundary();
                return Step::Over(Conversation::Finished { result: Box::new(result), reusable });
            }
            // Sent when the previous run's successor context was built; the
            // pool had no time to read it.
            FromWorker::Ready => {}
        }
        // Frames already waiting are read without a wait, so a worker that
        // sent them faster than they are read would never meet the
        // deadline's wait: it is checked after every frame.
        if self.until.is_some_and(|until| Instant::now() >= until) {
            let why = self.deadline.exceeded_message();
            return self.stopped(worker, Outcome::TimedOut, why);
        }
        Step::Listen
    }

    /// The end of an async conversation that cannot wait on its runtime's
    /// reactor (the runtime shut down under a caller that still polls, or
    /// no descriptor was left to register): the worker is stopped and
    /// reaped, and the run fails saying so, rather than wait on a reactor
    /// that returns at once (a spin until the worker answers, forever for
    /// one that does not).
    async fn off_reactor(mut self, worker: &mut WorkerProcess) -> Conversation {
        let why = "the run could not wait on its runtime's reactor (the runtime shut down during the run, or no \
                   descriptor was left to register): the JS worker was stopped";
        let ended = self.partial(Outcome::Failed, why.to_string());
        worker.stop();
        worker.reap_async().await;
        ended
    }

    /// The end of a worker that closed its end, as its `death` tells.
    fn died(mut self, death: &Death) -> Conversation {
        let (outcome, message) = crash_outcome(death, self.memory);
        self.partial(outcome, message)
    }

    /// Stops the worker and ends with what it wrote so far.
    fn stopped(&mut self, worker: &mut WorkerProcess, outcome: Outcome, message: String) -> Step {
        worker.stop();
        Step::Over(self.partial(outcome, message))
    }

    /// A result from what the worker wrote so far; the worker is not reused.
    fn partial(&mut self, outcome: Outcome, message: String) -> Conversation {
        let mut result = ExecResult::new(CONTAINED_NAME, outcome);
        result.stdout = with_total(self.take_stdout(), self.totals.0);
        result.stderr = with_total(self.take_stderr(), self.totals.1);
        result.message = Some(cap_message(message));
        result.usage.duration = self.deadline.elapsed();
        Conversation::Finished { result: Box::new(result), reusable: false }
    }

    fn take_stdout(&mut self) -> BoundedBuffer {
        std::mem::replace(&mut self.stdout, BoundedBuffer::new(Some(0)))
    }

    fn take_stderr(&mut self) -> BoundedBuffer {
        std::mem::replace(&mut self.stderr, BoundedBuffer::new(Some(0)))
    }
}

/// The largest frame a run's worker may send: its output caps in JSON
/// (each byte may become a 6-byte `\u00XX` escape) plus room for the
/// message and framing; with tools, at least a call's largest arguments
/// (measured as the JSON the frame holds) plus room for its name.
fn frame_limit(job: &Job) -> usize {
    let caps = job.max_stdout.unwrap_or(u64::MAX).max(job.max_stderr.unwrap_or(u64::MAX));
    let output = caps.saturating_mul(6).saturating_add(256 << 10);
    let call = job.tools.as_ref().map_or(0, |tools| tools.max_argument_bytes.saturating_add(64 << 10));
    usize::try_from(output.max(call)).unwrap_or(usize::MAX).min(MAX_FRAME_BYTES)
}

/// Most tool answers the host holds for a worker that does not read them:
/// the engine keeps at most `MAX_PENDING` calls waiting (256), so only a
/// worker that broke out of it gets here, and is killed.
const MAX_UNREAD_ANSWERS: usize = 1024;

/// The host's side of one run's tool calls: each call goes to the bridge;
/// its answer comes back on a thread of the tool runtime, which queues it
/// and wakes the conversation (an eventfd it polls with the worker's
/// socket). The conversation alone writes to the worker, so an answer
/// never blocks a tool thread and none arrives after the run.
struct Link {
    bridge: Arc<ToolBridge>,
    answers: Arc<Answers>,
}

struct Answers {
    /// Answers by the name of their tool.
    queue: Mutex<Vec<(String, ToolResult)>>,
    wake: OwnedFd,
}

impl Answers {
    fn push(&self, tool: String, answer: ToolResult) {
        self.queue.lock().push((tool, answer));
        // Non-blocking; a full counter has woken the conversation already.
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }
}

impl Link {
    fn new(bridge: Arc<ToolBridge>) -> std::io::Result<Self> {
        use rustix::event::{EventfdFlags, eventfd};
        let wake = eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)?;
        Ok(Self { bridge, answers: Arc::new(Answers { queue: Mutex::new(Vec::new()), wake }) })
    }

    /// Hands one call to the bridge (which checks everything about it).
    fn dispatch(&self, call: ToolCall) {
        let answers = self.answers.clone();
        let tool = call.name.clone();
        self.bridge.call(call, move |answer| {
            let answer = fit_result(answer, &tool);
            answers.push(tool, answer);
        });
    }

    /// The answers that arrived, clearing the wake-up.
    fn take(&self) -> Vec<(String, ToolResult)> {
        let mut counter = [0u8; 8];
        let _ = rustix::io::read(&self.answers.wake, &mut counter);
        std::mem::take(&mut *self.answers.queue.lock())
    }

    /// Queues `answer` for the worker; one too large for a frame becomes
    /// an error saying so.
    fn forward(&self, tool: String, answer: ToolResult, outbox: &mut Outbox) {
        let id = answer.id;
        if outbox.push(&ToWorkerRef::Tools(&ToCode::ToolResult(answer))).is_err() {
            let message = format!("the value is over the {} MiB frame limit of a worker", MAX_FRAME_BYTES >> 20);
            let error = ToolResult::error(id, ToolError::new(tool, ToolErrorKind::ResultTooLarge, message));
            // A frame of an error message always fits.
            let _ = outbox.push(&ToWorkerRef::Tools(&ToCode::ToolResult(error)));
        }
    }
}

/// A stream received from a worker, with the worker's count of what the
/// code wrote (it counts what it did not send).
fn with_total(buffer: BoundedBuffer, total: u64) -> crate::result::CapturedStream {
    let mut captured = buffer.into_captured();
    if total > captured.total_bytes {
        captured.total_bytes = total;
        captured.truncated = true;
    }
    captured
}

/// The outcome and message of a worker that died during a run.
fn crash_outcome(death: &Death, memory: u64) -> (Outcome, String) {
    if death.ran_out_of_memory() {
        return (
            Outcome::OutOfMemory,
            format!("memory limit of {memory} bytes reached: the JS engine could not allocate and was stopped"),
        );
    }
    if death.overflowed_stack() {
        return (Outcome::Failed, "the JS engine crashed: stack overflow (native recursion)".into());
    }
    (Outcome::Failed, describe_death(death))
}

pub(crate) fn describe_death(death: &Death) -> String {
    let detail = || death.first_stderr_line().map(|l| format!(": {}", cap_message(l.to_string()))).unwrap_or_default();
    match death {
        Death::KilledByHost => "the JS engine was stopped".into(),
        Death::Signal { signal, .. } if *signal == libc::SIGSYS => {
            "the JS engine made a forbidden system call and was killed (seccomp)".into()
        }
        Death::Signal { signal, .. } if *signal == libc::SIGKILL => {
            "the JS engine was killed (SIGKILL from outside execbox, e.g. the kernel's OOM killer)".into()
        }
        Death::Signal { signal, .. } => format!("the JS engine crashed ({}){}", signal_name(*signal), detail()),
        Death::Exited { code, .. } => format!("the JS engine exited with code {code}{}", detail()),
    }
}

fn signal_name(signal: i32) -> String {
    match signal {
        libc::SIGSEGV => "SIGSEGV: a stack overflow or an invalid memory access".into(),
        libc::SIGABRT => "SIGABRT".into(),
        libc::SIGBUS => "SIGBUS".into(),
        libc::SIGILL => "SIGILL".into(),
        libc::SIGFPE => "SIGFPE".into(),
        other => format!("signal {other}"),
    }
}
