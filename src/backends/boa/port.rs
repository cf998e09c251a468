//! The engine's link to the run's tool bridge (Code Mode): what a job says
//! about its tools ([`JobTools`]), the port its calls leave by
//! ([`ToolPort`]), and the port of the in-thread backend ([`BridgePort`]),
//! which talks to the bridge directly. The contained worker's port (frames
//! on its stdout and stdin) is in `worker.rs`; the host's side of those
//! frames in `contained.rs`.
//!
//! A call is a [`ToolCall`] handed to the port at once (the code's Promise
//! stays pending); the engine's loop, when the JavaScript job queue is
//! empty and calls are pending, waits on the port for [`ToolResult`]s until
//! the run's deadline. Several calls may be in flight at once (the bridge
//! refuses those beyond `max_concurrent`).

use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::limits::nesting::{drop_deep, json_depth_exceeds};
use crate::tools::frame::{ToolCall, ToolResult};
use crate::tools::{ToolBridge, ToolError, ToolErrorKind};

/// What a job's code may call (sent to a worker inside the job).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct JobTools {
    /// The granted tools' names (`namespace.tool`): each becomes
    /// `tools.namespace.tool`.
    pub names: Vec<String>,
    /// Largest arguments of one call as JSON: larger ones are refused inside
    /// the sandbox, before they cross.
    pub max_argument_bytes: u64,
}

impl JobTools {
    /// What `bridge` grants.
    pub fn of(bridge: &ToolBridge) -> Self {
        Self {
            names: bridge.granted_specs().iter().map(|spec| spec.name.clone()).collect(),
            max_argument_bytes: bridge.limits().max_argument_bytes,
        }
    }
}

/// The host went away: no answer will come.
#[derive(Debug)]
pub(crate) struct Gone(pub String);

/// Where a run's tool calls go and their answers come from.
pub(crate) trait ToolPort {
    /// Hands `call` to the host without waiting for its answer; `Err` if
    /// the host cannot be reached (the call then fails as `unavailable`).
    fn send(&self, call: ToolCall) -> Result<(), Gone>;

    /// Waits until at least one answer arrived, or `until` passed (then the
    /// answers may be none). Answers may be for any call in flight, or for
    /// none (the engine ignores ids it is not waiting for).
    fn wait(&self, until: Option<Instant>) -> Result<Vec<ToolResult>, Gone>;
}

/// Deepest a tool's value may nest to reach code: [`JsValue::from_json`]
/// recurses per level (on the host's thread in-thread), and a worker's
/// frame parser allows 128 levels, the value's wrapping included.
///
/// [`JsValue::from_json`]: boa_engine::JsValue::from_json
pub(crate) const MAX_RESULT_NESTING: usize = 100;

/// `result` as code may receive it: a value nesting deeper than
/// [`MAX_RESULT_NESTING`] becomes a `failed` error (dropped without
/// recursion).
pub(crate) fn fit_result(mut result: ToolResult, tool: &str) -> ToolResult {
    let depth = result.value.as_ref().and_then(|v| json_depth_exceeds(v, MAX_RESULT_NESTING));
    if let Some(depth) = depth {
        if let Some(value) = result.value.take() {
            drop_deep(value);
        }
        let message = format!(
            "the tool's value nests {depth} levels or more, deeper than code may receive ({MAX_RESULT_NESTING})"
        );
        return ToolResult::error(result.id, ToolError::new(tool, ToolErrorKind::Failed, message));
    }
    result
}

/// The in-thread backend's port: calls go to the bridge on this thread
/// (it answers refusals at once, others from its tool runtime), answers
/// come back through a channel (and through [`fit_result`] when the engine
/// settles them).
pub(crate) struct BridgePort {
    bridge: Arc<ToolBridge>,
    answers_to: Sender<ToolResult>,
    answers: Receiver<ToolResult>,
}

impl BridgePort {
    pub fn new(bridge: Arc<ToolBridge>) -> Self {
        let (answers_to, answers) = mpsc::channel();
        Self { bridge, answers_to, answers }
    }
}

impl ToolPort for BridgePort {
    fn send(&self, call: ToolCall) -> Result<(), Gone> {
        let answers = self.answers_to.clone();
        // The run may be over when it answers: then nobody listens.
        self.bridge.call(call, move |result| drop(answers.send(result)));
        Ok(())
    }

    fn wait(&self, until: Option<Instant>) -> Result<Vec<ToolResult>, Gone> {
        let first = match until {
            Some(at) => match self.answers.recv_timeout(at.saturating_duration_since(Instant::now())) {
                Ok(result) => result,
                Err(RecvTimeoutError::Timeout) => return Ok(Vec::new()),
                Err(RecvTimeoutError::Disconnected) => return Err(Gone("the tool bridge is gone".into())),
            },
            // This port holds a sender itself: never disconnected.
            None => self.answers.recv().map_err(|_| Gone("the tool bridge is gone".into()))?,
        };
        let mut answers = vec![first];
        answers.extend(self.answers.try_iter());
        Ok(answers)
    }
}
