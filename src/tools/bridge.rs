//! [`ToolBridge`]: one run's dispatcher of tool calls. Every carrier (a JS
//! worker's socket, a wasm instance's stdio, a container's Unix socket, a
//! wasm guest's host import) hands it the calls the code makes; it checks
//! each against the grant and the budget, runs the tool on execbox's tool
//! runtime within the call's timeout, answers, and keeps the ledger the
//! result reports.
//!
//! What holds whatever the code sends:
//! - a call names a granted tool, or is answered `not_found`/`not_granted`
//!   without running anything;
//! - at most `max_calls` calls run per run and `max_concurrent` at once;
//!   arguments over `max_argument_bytes` are refused, results over
//!   `max_result_bytes` cut keeping their shape;
//! - a call ends by its timeout and never outlives the run: when the run
//!   ends ([`ToolBridge::finish`]) every call in flight is dropped (an
//!   upstream call is cancelled) and its ledger entry says `unknown`;
//! - a tool that panics is a `failed` call, not a crash;
//! - the code's call ids are only echoed: a reused id is refused.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::frame::{ToolCall, ToolResult, cut_to_fit, json_len};
use super::registry::{Approver, Tool, ToolApprover, ToolContext, ToolRegistry, ToolSpec};
use crate::error::tool::{ToolError, ToolErrorKind};
use crate::limits::deadline::Deadline;
use crate::policy::tools::{ToolLimits, granted};
use crate::result::ledger::{MAX_LEDGER, ToolCallOutcome, ToolCallRecord};

/// How long past the run's deadline a call clamped to it may wait: the
/// run's carrier ends the run at its deadline (and the call with it) well
/// before.
const RUN_END_GRACE: Duration = Duration::from_secs(2);

/// How long past a call's timeout a blocking caller waits for its answer
/// (the tool runtime answers at the timeout; this is a backstop).
const ANSWER_GRACE: Duration = Duration::from_millis(500);

/// One run's tool dispatcher. See the module docs.
pub struct ToolBridge {
    registry: ToolRegistry,
    /// Decides calls that need approval: the run's own, else the registry's.
    approver: Option<Arc<dyn Approver>>,
    grants: Vec<String>,
    limits: ToolLimits,
    deadline: Deadline,
    /// What each handler is told of the run (its scope).
    context: ToolContext,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Calls started (not refused ones).
    started: u32,
    /// Calls in flight by the code's id: their ledger index and task.
    in_flight: HashMap<u64, (usize, tokio::task::AbortHandle)>,
    ledger: Vec<ToolCallRecord>,
    /// Calls beyond [`MAX_LEDGER`], counted.
    dropped: u64,
    /// The run is over: no call starts, none answers.
    closed: bool,
}

/// The tool runtime: tools are async, carriers are threads; tool futures
/// run here, apart from any runtime of the caller's.
pub(crate) fn tool_runtime() -> Option<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<Option<tokio::runtime::Runtime>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("execbox-tools")
                .enable_all()
                .build()
                .map_err(|e| tracing::error!(error = %e, "no tool runtime: tool calls fail as unavailable"))
                .ok()
        })
        .as_ref()
}

impl ToolBridge {
    /// The bridge of one run: `grants` of `registry`, within `limits`, until `deadline`.
    pub fn new(registry: ToolRegistry, grants: Vec<String>, limits: ToolLimits, deadline: Deadline) -> Arc<Self> {
        Self::with_approver(registry, grants, limits, deadline, None)
    }

    /// [`ToolBridge::new`], with `approver` deciding the calls that need
    /// approval in place of the registry's.
    pub fn with_approver(
        registry: ToolRegistry,
        grants: Vec<String>,
        limits: ToolLimits,
        deadline: Deadline,
        approver: Option<ToolApprover>,
    ) -> Arc<Self> {
        Self::for_run(registry, grants, limits, deadline, approver, ToolContext::default())
    }

    /// [`ToolBridge::with_approver`], its handlers told `context` (the
    /// run's scope) with every call, and the largest answer `limits` take.
    pub(crate) fn for_run(
        registry: ToolRegistry,
        grants: Vec<String>,
        limits: ToolLimits,
        deadline: Deadline,
        approver: Option<ToolApprover>,
        context: ToolContext,
    ) -> Arc<Self> {
        let approver = approver.map(|a| a.0).or_else(|| registry.approver().cloned());
        let context = ToolContext { max_result_bytes: Some(limits.max_result_bytes), ..context };
        Arc::new(Self { registry, approver, grants, limits, deadline, context, state: Mutex::new(State::default()) })
    }

    /// The specs of the tools this run may call, sorted by name.
    pub fn granted_specs(&self) -> Vec<Arc<ToolSpec>> {
        self.registry.tools().filter(|t| granted(&self.grants, &t.spec.name)).map(|t| t.spec.clone()).collect()
    }

    /// The limits in force.
    pub fn limits(&self) -> &ToolLimits {
        &self.limits
    }

    /// Handles one call: `reply` gets its answer exactly once, inline when
    /// it is refused or built in, else from the tool runtime — unless the
    /// run ends first ([`ToolBridge::finish`]), when nobody is listening.
    pub fn call(self: &Arc<Self>, call: ToolCall, reply: impl FnOnce(ToolResult) + Send + 'static) {
        let started_at = Instant::now();
        let args_text = serde_json::to_vec(&call.args).unwrap_or_default();
        let bytes_in = args_text.len() as u64;
        let refuse = |kind: ToolErrorKind, message: String| ToolError::new(&call.name, kind, message);
        // Built in: no grant, no budget, nothing runs.
        match call.name.as_str() {
            "tools.list" => {
                let names: Vec<String> = self.granted_specs().iter().map(|s| s.name.clone()).collect();
                return reply(ToolResult::value(call.id, serde_json::json!(names), false));
            }
            "tools.describe" => {
                let wanted = call.args.get("name").and_then(Value::as_str).unwrap_or_default();
                let answer = match self.granted_specs().into_iter().find(|s| s.name == wanted) {
                    Some(spec) => ToolResult::value(call.id, serde_json::to_value(&*spec).unwrap_or_default(), false),
                    None => ToolResult::error(
                        call.id,
                        refuse(ToolErrorKind::NotFound, format!("no granted tool is called {wanted:?}")),
                    ),
                };
                return reply(answer);
            }
            _ => {}
        }
        let tool = match self.check(&call, bytes_in) {
            Ok(tool) => tool,
            Err(error) => return reply(self.refused(&call, &args_text, started_at, error)),
        };
        let Some(runtime) = tool_runtime() else {
            let error = refuse(ToolErrorKind::Unavailable, "execbox's tool runtime could not start".into());
            return reply(self.refused(&call, &args_text, started_at, error));
        };
        let mut state = self.state.lock();
        if state.closed {
            drop(state);
            return reply(ToolResult::error(call.id, refuse(ToolErrorKind::Cancelled, "the run is over".into())));
        }
        if state.in_flight.contains_key(&call.id) {
            drop(state);
            let error = refuse(ToolErrorKind::Protocol, format!("call id {} is already in flight", call.id));
            return reply(ToolResult::error(call.id, error));
        }
        if state.started >= self.limits.max_calls {
            drop(state);
            let error = refuse(
                ToolErrorKind::BudgetExhausted,
                format!("this run may make {} tool calls (the policy's tool_limits.max_calls)", self.limits.max_calls),
            );
            return reply(self.refused(&call, &args_text, started_at, error));
        }
        if state.in_flight.len() >= self.limits.max_concurrent as usize {
            drop(state);
            let error = refuse(
                ToolErrorKind::TooManyInFlight,
                format!("at most {} calls may be in flight (tool_limits.max_concurrent)", self.limits.max_concurrent),
            );
            return reply(self.refused(&call, &args_text, started_at, error));
        }
        state.started += 1;
        let index = push_record(
            &mut state,
            ToolCallRecord {
                tool: call.name.clone(),
                args_sha256: format!("{:x}", Sha256::digest(&args_text)),
                outcome: ToolCallOutcome::Unknown,
                error: None,
                duration_ms: 0.0,
                bytes_in,
                bytes_out: 0,
                truncated: false,
            },
        );
        // A call whose own timeout would fall at or past the run's deadline
        // is ended by that deadline (the run ends timed_out and the call
        // stays unknown), not by a catchable timed_out a moment before it,
        // which would let the run end `failed` instead; the grace only
        // bounds the call should a carrier end its run late.
        let per_call = Duration::from_millis(self.limits.call_timeout_ms);
        let left = self.deadline.remaining().unwrap_or(Duration::MAX);
        let timeout = if per_call < left { per_call } else { left.saturating_add(RUN_END_GRACE) };
        let bridge = Arc::clone(self);
        let approver = self.approver.clone();
        let context = self.context.clone();
        let max_result = self.limits.max_result_bytes;
        let id = call.id;
        let name = call.name.clone();
        let task = runtime.spawn(async move {
            let spec = tool.spec.clone();
            let work = async {
                if spec.annotations.requires_approval {
                    match &approver {
                        Some(approver) => approver.approve(&spec, &call.args).await.map_err(|why| {
                            ToolError::new(&spec.name, ToolErrorKind::Denied, format!("not approved: {why}"))
                        })?,
                        None => {
                            return Err(ToolError::new(
                                &spec.name,
                                ToolErrorKind::Denied,
                                "this tool requires approval and the host has no approver",
                            ));
                        }
                    }
                }
                // A panicking handler fails its call, not the runtime. It
                // runs in this task (no second task to spawn and wake), so
                // it ends with this future: a timeout, the run's end.
                let value = match unwinding(tool.handler.call_in(call.args, &context)).await {
                    Ok(outcome) => outcome,
                    Err(_panic) => Err(ToolError::failed(&spec.name, "the tool panicked")),
                }?;
                // A result that breaks the tool's own declared shape is its
                // failure. Checked within the call's timeout, and a large
                // result off this runtime: an upstream's result checked
                // against its own hostile output_schema held both of its
                // threads, and every run's tool calls timed out.
                let Some(schema) = tool.schemas.output.clone() else { return Ok(value) };
                let checked = if schema.is_quick(&value) {
                    schema.validate(&value).map(|()| value)
                } else {
                    let check = tokio::task::spawn_blocking(move || schema.validate(&value).map(|()| value));
                    match check.await {
                        Ok(checked) => checked,
                        Err(_) => return Err(ToolError::failed(&spec.name, "checking the tool's result failed")),
                    }
                };
                checked.map_err(|mismatch| {
                    ToolError::failed(
                        &spec.name,
                        format!("the tool's result does not match its output_schema:\n{}", mismatch.describe()),
                    )
                })
            };
            let outcome = tokio::time::timeout(timeout, work).await;
            let (result, outcome, kind, bytes_out, truncated) = match outcome {
                Ok(Ok(value)) => {
                    let (value, truncated) = cut_to_fit(value, max_result);
                    let bytes_out = json_len(&value);
                    (ToolResult::value(id, value, truncated), ToolCallOutcome::Ok, None, bytes_out, truncated)
                }
                Ok(Err(error)) => {
                    let kind = error.kind;
                    let outcome =
                        if kind == ToolErrorKind::Denied { ToolCallOutcome::Refused } else { ToolCallOutcome::Error };
                    (ToolResult::error(id, error), outcome, Some(kind), 0, false)
                }
                Err(_) => {
                    let message = format!("no answer within {} ms", timeout.as_millis());
                    let error = ToolError::new(&name, ToolErrorKind::TimedOut, message);
                    // It was dropped mid-call: whether it acted is unknown.
                    (ToolResult::error(id, error), ToolCallOutcome::Unknown, Some(ToolErrorKind::TimedOut), 0, false)
                }
            };
            if bridge.settle(id, index, outcome, kind, started_at, bytes_out, truncated) {
                reply(result);
            }
        });
        state.in_flight.insert(id, (index, task.abort_handle()));
    }

    /// Handles one call and waits for its answer (for carriers that block:
    /// a wasm host function, a sync stdio channel). Never waits past the
    /// call's timeout, nor the run's deadline, by more than a moment.
    pub fn call_blocking(self: &Arc<Self>, call: ToolCall) -> ToolResult {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let id = call.id;
        let name = call.name.clone();
        self.call(call, move |result| {
            let _ = tx.send(result);
        });
        let wait = self.answer_wait();
        rx.recv_timeout(wait).unwrap_or_else(|_| no_answer(id, &name))
    }

    /// How long a carrier waits for a call's answer: its timeout, never past
    /// the run's deadline, plus a moment for the answer to arrive.
    fn answer_wait(&self) -> Duration {
        Duration::from_millis(self.limits.call_timeout_ms)
            .min(self.deadline.remaining().unwrap_or(Duration::MAX))
            .saturating_add(ANSWER_GRACE)
    }

    /// [`ToolBridge::call_blocking`] for a carrier on an async task (a wasm
    /// guest run there): awaits the answer instead of blocking the thread,
    /// as long as a blocking caller would wait. The wait is timed on the
    /// tool runtime, so the caller's runtime needs no timer.
    #[cfg(feature = "wasm")]
    pub(crate) async fn call_async(self: &Arc<Self>, call: ToolCall) -> ToolResult {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let id = call.id;
        let name = call.name.clone();
        self.call(call, move |result| {
            let _ = tx.send(result);
        });
        let wait = self.answer_wait();
        let late = || no_answer(id, &name);
        // Answered inline (refused, built in): no need for a timer.
        let mut rx = rx;
        match rx.try_recv() {
            Ok(result) => return result,
            Err(tokio::sync::oneshot::error::TryRecvError::Closed) => return late(),
            Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {}
        }
        let Some(runtime) = tool_runtime() else { return late() };
        // Aborted if this future is dropped (its run was cancelled). The
        // timeout is made inside the task: `tokio::time::timeout` takes the
        // timer of the runtime it is called on, and the caller's may have
        // none (it panicked there).
        let mut timed = AbortOnDrop(runtime.spawn(async move { tokio::time::timeout(wait, rx).await }));
        match (&mut timed.0).await {
            Ok(Ok(Ok(result))) => result,
            _ => late(),
        }
    }

    /// Refuses call `id` of `name` whose frame the carrier did not read whole
    /// because it is `bytes_in` bytes, over the carrier's limit (which is
    /// above `max_argument_bytes`): answered `invalid_arguments` and ledgered
    /// as refused, as [`ToolBridge::call`] refuses arguments over the limit.
    /// The ledger's `args_sha256` is of nothing (the arguments were not
    /// read) and `bytes_in` counts the whole frame.
    #[cfg_attr(not(any(feature = "wasm", feature = "container")), allow(dead_code))]
    pub(crate) fn refuse_unread(&self, id: u64, name: &str, bytes_in: u64) -> ToolResult {
        let error = ToolError::new(
            name,
            ToolErrorKind::InvalidArguments,
            format!(
                "the call is {bytes_in} bytes of JSON, over the limit of {} for its arguments \
                 (tool_limits.max_argument_bytes)",
                self.limits.max_argument_bytes
            ),
        );
        self.record(name, b"", ToolCallOutcome::Refused, Some(error.kind), Instant::now(), bytes_in, 0, false);
        ToolResult::error(id, error)
    }

    /// Ends the run's tool calls: no call starts or answers after this;
    /// calls in flight are dropped (an upstream call is cancelled) and their
    /// ledger entries stay `unknown`. Returns the ledger and how many calls
    /// it left out. Idempotent (later calls return an empty ledger).
    pub fn finish(&self) -> (Vec<ToolCallRecord>, u64) {
        let mut state = self.state.lock();
        state.closed = true;
        for (_, (_, task)) in state.in_flight.drain() {
            task.abort();
        }
        (std::mem::take(&mut state.ledger), std::mem::take(&mut state.dropped))
    }

    /// The tool a call may run, or why not.
    fn check(&self, call: &ToolCall, bytes_in: u64) -> Result<Tool, ToolError> {
        let refuse = |kind, message: String| ToolError::new(&call.name, kind, message);
        if !call.args.is_object() && !call.args.is_null() {
            return Err(refuse(ToolErrorKind::InvalidArguments, "arguments must be a JSON object".into()));
        }
        if bytes_in > self.limits.max_argument_bytes {
            return Err(refuse(
                ToolErrorKind::InvalidArguments,
                format!(
                    "arguments are {bytes_in} bytes of JSON, over the limit of {} (tool_limits.max_argument_bytes)",
                    self.limits.max_argument_bytes
                ),
            ));
        }
        if self.deadline.expired() {
            return Err(refuse(ToolErrorKind::Cancelled, "the run's deadline has passed".into()));
        }
        // Grants first: code learns nothing of the tools it may not call,
        // not even whether they exist.
        if !granted(&self.grants, &call.name) {
            return Err(refuse(ToolErrorKind::NotGranted, "the run's policy does not grant this tool".into()));
        }
        let tool = self.registry.get(&call.name).ok_or_else(|| {
            refuse(ToolErrorKind::NotFound, "no such tool (tools.list() names the granted ones)".into())
        })?;
        if let Some(schema) = &tool.schemas.input {
            let empty = Value::Object(Default::default());
            let args = if call.args.is_null() { &empty } else { &call.args };
            if let Err(mismatch) = schema.validate(args) {
                return Err(refuse(
                    ToolErrorKind::InvalidArguments,
                    format!("the arguments do not match the tool's input_schema:\n{}", mismatch.describe()),
                ));
            }
        }
        Ok(tool.clone())
    }

    /// Records how call `id` ended; false if the run is over (nobody listens).
    #[allow(clippy::too_many_arguments)]
    fn settle(
        &self,
        id: u64,
        index: usize,
        outcome: ToolCallOutcome,
        error: Option<ToolErrorKind>,
        started_at: Instant,
        bytes_out: u64,
        truncated: bool,
    ) -> bool {
        let mut state = self.state.lock();
        if state.closed {
            return false;
        }
        state.in_flight.remove(&id);
        if let Some(record) = state.ledger.get_mut(index) {
            record.outcome = outcome;
            record.error = error;
            record.duration_ms = started_at.elapsed().as_secs_f64() * 1e3;
            record.bytes_out = bytes_out;
            record.truncated = truncated;
        }
        true
    }

    /// Ledgers `call` as refused with `error` (nothing ran) and makes its answer.
    fn refused(&self, call: &ToolCall, args_text: &[u8], started_at: Instant, error: ToolError) -> ToolResult {
        let bytes_in = args_text.len() as u64;
        self.record(&call.name, args_text, ToolCallOutcome::Refused, Some(error.kind), started_at, bytes_in, 0, false);
        ToolResult::error(call.id, error)
    }

    /// Records a call that ended at once.
    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        tool: &str,
        args: &[u8],
        outcome: ToolCallOutcome,
        error: Option<ToolErrorKind>,
        started_at: Instant,
        bytes_in: u64,
        bytes_out: u64,
        truncated: bool,
    ) {
        let record = ToolCallRecord {
            tool: crate::text::cap_text(tool.to_string(), 256),
            args_sha256: format!("{:x}", Sha256::digest(args)),
            outcome,
            error,
            duration_ms: started_at.elapsed().as_secs_f64() * 1e3,
            bytes_in,
            bytes_out,
            truncated,
        };
        push_record(&mut self.state.lock(), record);
    }
}

/// The answer of a call its carrier stopped waiting for.
fn no_answer(id: u64, name: &str) -> ToolResult {
    ToolResult::error(id, ToolError::new(name, ToolErrorKind::TimedOut, "no answer before the deadline"))
}

/// A task aborted when this drops.
/// `future`'s output, or the payload of a panic in one of its polls.
async fn unwinding<T>(future: impl Future<Output = T>) -> std::thread::Result<T> {
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(|cx| {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(value)) => Poll::Ready(Ok(value)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    })
    .await
}

/// A task aborted when its handle is dropped.
#[cfg(feature = "wasm")]
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

#[cfg(feature = "wasm")]
impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Appends to the ledger, or counts past [`MAX_LEDGER`]; returns the index
/// (past the end when dropped).
fn push_record(state: &mut State, record: ToolCallRecord) -> usize {
    if state.ledger.len() >= MAX_LEDGER {
        state.dropped += 1;
        return usize::MAX;
    }
    state.ledger.push(record);
    state.ledger.len() - 1
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn registry() -> ToolRegistry {
        ToolRegistry::builder()
            .tool(ToolSpec::new("math.add"), |args: Value| async move {
                Ok(json!(args["a"].as_i64().unwrap_or(0) + args["b"].as_i64().unwrap_or(0)))
            })
            .tool(ToolSpec::new("slow.sleep"), |_: Value| async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok(Value::Null)
            })
            .tool(ToolSpec::new("bad.panic"), |_: Value| async { panic!("boom") })
            .tool(ToolSpec::new("big.blob"), |_: Value| async { Ok(json!("x".repeat(1 << 20))) })
            .tool(ToolSpec::new("fail.always"), |_: Value| async { Err(ToolError::failed("fail.always", "nope")) })
            .tool(
                ToolSpec::new("gated.write")
                    .annotations(crate::tools::ToolAnnotations::default().requires_approval(true)),
                |_: Value| async { Ok(json!("written")) },
            )
            .build()
            .unwrap()
    }

    fn bridge(grants: &[&str], limits: ToolLimits) -> Arc<ToolBridge> {
        let grants = grants.iter().map(|s| s.to_string()).collect();
        ToolBridge::new(registry(), grants, limits, Deadline::start(Some(Duration::from_secs(30))))
    }

    fn call(id: u64, name: &str, args: Value) -> ToolCall {
        ToolCall { id, name: name.into(), args }
    }

    /// Arguments are checked against the tool's input_schema before its
    /// handler runs; a result against its output_schema after.
    #[test]
    fn arguments_and_results_are_held_to_the_tools_schemas() {
        use std::sync::atomic::{AtomicU32, Ordering};
        let ran = Arc::new(AtomicU32::new(0));
        let counted = ran.clone();
        let input = json!({"type": "object", "properties": {"email": {"type": "string", "format": "email"},
            "limit": {"type": "integer", "minimum": 1}}, "required": ["email"], "additionalProperties": false});
        let registry = ToolRegistry::builder()
            .tool(ToolSpec::new("crm.find").input_schema(input), move |args: Value| {
                counted.fetch_add(1, Ordering::SeqCst);
                async move { Ok(json!({"id": if args["email"] == "bad@x.org" { json!("seven") } else { json!(7) }})) }
            })
            .tool(
                ToolSpec::new("crm.count").output_schema(json!({"type": "object", "required": ["id"],
                    "properties": {"id": {"type": "integer"}}})),
                |_: Value| async { Ok(json!({"id": "seven"})) },
            )
            .build()
            .unwrap();
        let b = ToolBridge::new(
            registry,
            vec!["crm.*".into()],
            ToolLimits::default(),
            Deadline::start(Some(Duration::from_secs(30))),
        );
        for (args, named) in [
            (json!({}), "\"email\" is a required property"),
            (json!({"email": "not an address"}), "/email"),
            (json!({"email": "a@x.org", "limit": 0}), "/limit"),
            (json!({"email": "a@x.org", "extra": 1}), "extra"),
            (Value::Null, "\"email\" is a required property"),
        ] {
            let r = b.call_blocking(call(1, "crm.find", args.clone()));
            let error = r.error.unwrap_or_else(|| panic!("{args} was let through"));
            assert_eq!(error.kind, ToolErrorKind::InvalidArguments, "{args}");
            assert!(error.message.contains(named), "{args}: {}", error.message);
        }
        assert_eq!(ran.load(Ordering::SeqCst), 0, "no handler ran for arguments that do not match");
        assert!(b.call_blocking(call(2, "crm.find", json!({"email": "a@x.org", "limit": 3}))).ok);
        let broken = b.call_blocking(call(3, "crm.count", json!({})));
        let error = broken.error.expect("a result that breaks its schema fails");
        assert_eq!(error.kind, ToolErrorKind::Failed);
        assert!(error.message.contains("/id: \"seven\" is not of type \"integer\""), "{}", error.message);
        let ledger = b.finish().0;
        assert_eq!(ledger.len(), 7, "each call is in the ledger: {ledger:?}");
    }

    /// A tool's result is checked within the call's timeout, and a large
    /// one off the tool runtime: an upstream that declares a hostile
    /// pattern in its output_schema and answers a long string held both of
    /// the runtime's threads with two calls (the regex crate's PikeVM: ~0.3
    /// ms a byte of a debug build), and every other call of every run
    /// waited, its own timeout unable to fire.
    #[test]
    fn a_slow_result_check_holds_neither_the_tool_runtime_nor_its_call() {
        let pattern = "(?:a[ab]{400}c|b[ab]{400}d|[ab]{1,500}[^x]{1,500}\u{e9})";
        let mut seed = 1u32;
        let text: String = (0..15_000)
            .map(|_| {
                seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                if seed >> 16 & 1 == 0 { 'a' } else { 'b' }
            })
            .collect();
        let schema = json!({"type": "object", "properties": {"s": {"pattern": pattern}}});
        let registry = ToolRegistry::builder()
            .tool(ToolSpec::new("up.slow").output_schema(schema), move |_: Value| {
                let text = text.clone();
                async move { Ok(json!({"s": text})) }
            })
            .tool(ToolSpec::new("up.fast"), |_: Value| async { Ok(json!(1)) })
            .build()
            .unwrap();
        let limits = ToolLimits::default().call_timeout_ms(1_500);
        let b = ToolBridge::new(registry, vec!["up.*".into()], limits, Deadline::start(Some(Duration::from_secs(60))));
        let started = Instant::now();
        let (tx, rx) = std::sync::mpsc::channel();
        for id in [1, 2] {
            let tx = tx.clone();
            b.call(call(id, "up.slow", json!({})), move |r| {
                let _ = tx.send(r);
            });
        }
        std::thread::sleep(Duration::from_millis(300));
        let fast = Instant::now();
        assert!(b.call_blocking(call(3, "up.fast", json!({}))).ok);
        assert!(fast.elapsed() < Duration::from_secs(1), "another call waited {:?}", fast.elapsed());
        for _ in 0..2 {
            let slow = rx.recv_timeout(Duration::from_secs(10)).expect("an answer");
            // Timed out while checking, or refused by the bounded matcher
            // (src/schema/pattern.rs) as too costly: never accepted unchecked.
            let error = slow.error.expect("the slow result is not accepted");
            match error.kind {
                ToolErrorKind::TimedOut => {}
                ToolErrorKind::Failed => assert!(error.message.contains("too costly"), "{}", error.message),
                other => panic!("{other:?}: {}", error.message),
            }
        }
        assert!(started.elapsed() < Duration::from_secs(4), "the slow calls took {:?}", started.elapsed());
    }

    #[test]
    fn a_schema_execbox_will_not_compile_is_a_registration_error() {
        let err = ToolRegistry::builder()
            .tool(ToolSpec::new("x.y").input_schema(json!({"$ref": "https://example.com/s.json"})), |_: Value| async {
                Ok(Value::Null)
            })
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("input_schema") && err.to_string().contains("same document"), "{err}");
    }

    #[test]
    fn grants_budgets_and_errors_are_typed_and_ledgered() {
        let b = bridge(
            &["math.*", "bad.panic", "fail.always", "big.blob", "gated.write"],
            ToolLimits::default().max_calls(6),
        );
        let r = b.call_blocking(call(1, "math.add", json!({"a": 2, "b": 3})));
        assert_eq!((r.ok, r.value), (true, Some(json!(5))));
        let kind = |r: ToolResult| r.error.map(|e| e.kind);
        assert_eq!(kind(b.call_blocking(call(2, "slow.sleep", json!({})))), Some(ToolErrorKind::NotGranted));
        // Not granted comes first: an ungranted name says nothing of whether it exists.
        assert_eq!(kind(b.call_blocking(call(3, "no.such", json!({})))), Some(ToolErrorKind::NotGranted));
        assert_eq!(kind(b.call_blocking(call(3, "math.nope", json!({})))), Some(ToolErrorKind::NotFound));
        assert_eq!(kind(b.call_blocking(call(4, "math.add", json!([1])))), Some(ToolErrorKind::InvalidArguments));
        assert_eq!(kind(b.call_blocking(call(5, "bad.panic", json!({})))), Some(ToolErrorKind::Failed));
        assert_eq!(kind(b.call_blocking(call(6, "fail.always", json!({})))), Some(ToolErrorKind::Failed));
        let big = b.call_blocking(call(7, "big.blob", json!({})));
        assert!(big.ok && big.truncated, "{big:?}");
        assert_eq!(kind(b.call_blocking(call(8, "gated.write", json!({})))), Some(ToolErrorKind::Denied));
        // Six started (math, panic, fail, blob, gated, and this one): the budget holds.
        assert!(b.call_blocking(call(9, "math.add", json!({}))).ok);
        assert_eq!(kind(b.call_blocking(call(10, "math.add", json!({})))), Some(ToolErrorKind::BudgetExhausted));
        let listed = b.call_blocking(call(11, "tools.list", json!({})));
        assert_eq!(listed.value.unwrap().as_array().unwrap().len(), 5);
        let (ledger, dropped) = b.finish();
        assert_eq!(dropped, 0);
        let outcomes: Vec<ToolCallOutcome> = ledger.iter().map(|r| r.outcome).collect();
        use ToolCallOutcome::*;
        assert_eq!(outcomes, [Ok, Refused, Refused, Refused, Refused, Error, Error, Ok, Refused, Ok, Refused]);
        assert!(ledger[7].truncated);
        assert_eq!(ledger[0].args_sha256.len(), 64);
    }

    #[test]
    fn a_hanging_tool_times_out_and_a_run_that_ends_mid_call_says_unknown() {
        let b = bridge(&["slow.*"], ToolLimits::default().call_timeout_ms(100));
        let started = Instant::now();
        let r = b.call_blocking(call(1, "slow.sleep", json!({})));
        assert_eq!(r.error.unwrap().kind, ToolErrorKind::TimedOut);
        assert!(started.elapsed() < Duration::from_secs(5));
        let b = bridge(&["slow.*"], ToolLimits::default());
        let (tx, rx) = std::sync::mpsc::channel();
        b.call(call(1, "slow.sleep", json!({})), move |r| drop(tx.send(r)));
        // Same id while in flight: refused.
        let again = b.call_blocking(call(1, "slow.sleep", json!({})));
        assert_eq!(again.error.unwrap().kind, ToolErrorKind::Protocol);
        let (ledger, _) = b.finish();
        assert_eq!(ledger[0].outcome, ToolCallOutcome::Unknown);
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err(), "no answer after the run ended");
        let after = b.call_blocking(call(2, "slow.sleep", json!({})));
        assert_eq!(after.error.unwrap().kind, ToolErrorKind::Cancelled);
    }

    #[test]
    fn a_call_that_times_out_or_outlives_its_run_stops_running() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        struct Dropped(Arc<AtomicUsize>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let dropped = Arc::new(AtomicUsize::new(0));
        let started = Arc::new(AtomicUsize::new(0));
        let (counter, starts) = (dropped.clone(), started.clone());
        let registry = ToolRegistry::builder()
            .tool(ToolSpec::new("slow.hang"), move |_: Value| {
                starts.fetch_add(1, Ordering::SeqCst);
                let guard = Dropped(counter.clone());
                async move {
                    let _guard = guard;
                    std::future::pending::<()>().await;
                    Ok(Value::Null)
                }
            })
            .build()
            .unwrap();
        let limits = ToolLimits::default().call_timeout_ms(100);
        let b = ToolBridge::new(registry.clone(), vec!["slow.*".into()], limits, Deadline::start(None));
        assert_eq!(b.call_blocking(call(1, "slow.hang", json!({}))).error.unwrap().kind, ToolErrorKind::TimedOut);
        let reaches = |count: &AtomicUsize, n: usize| {
            let until = Instant::now() + Duration::from_secs(5);
            while count.load(Ordering::SeqCst) < n && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
            }
            count.load(Ordering::SeqCst) >= n
        };
        assert!(reaches(&dropped, 1), "the timed-out tool still runs");
        let b = ToolBridge::new(registry, vec!["slow.*".into()], ToolLimits::default(), Deadline::start(None));
        b.call(call(2, "slow.hang", json!({})), drop);
        assert!(reaches(&started, 2));
        b.finish();
        assert!(reaches(&dropped, 2), "the tool outlived its run");
    }

    #[test]
    fn concurrency_is_bounded() {
        let b = bridge(&["slow.*"], ToolLimits::default().max_concurrent(2));
        for id in 0..2 {
            b.call(call(id, "slow.sleep", json!({})), drop);
        }
        let third = b.call_blocking(call(9, "slow.sleep", json!({})));
        assert_eq!(third.error.unwrap().kind, ToolErrorKind::TooManyInFlight);
        b.finish();
    }
}
