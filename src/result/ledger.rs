//! The ledger of a run's tool calls (Code Mode): what each call did, so an
//! agent can reconcile after a failure.

use serde::{Deserialize, Serialize};

use crate::error::tool::ToolErrorKind;

/// Most ledger entries a result keeps (later calls are counted only).
pub const MAX_LEDGER: usize = 1024;

/// How a call in the ledger ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolCallOutcome {
    /// It returned a value.
    Ok,
    /// It ran (or may have run) and failed; see `error`.
    Error,
    /// It was refused before it ran (not granted, over budget, malformed):
    /// it certainly did nothing.
    Refused,
    /// The run ended (or the call timed out) while it was in flight: what
    /// it did is unknown; a write may or may not have happened.
    Unknown,
}

/// One call in a result's ledger ([`ExecResult::tool_calls`](crate::result::ExecResult::tool_calls)).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCallRecord {
    /// The tool as the code named it.
    pub tool: String,
    /// sha256 of the arguments' JSON text as the code sent it (hex).
    pub args_sha256: String,
    /// How it ended.
    pub outcome: ToolCallOutcome,
    /// The error's kind, unless `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ToolErrorKind>,
    /// How long it took, in ms.
    pub duration_ms: f64,
    /// Bytes of arguments (JSON).
    pub bytes_in: u64,
    /// Bytes of result (JSON) the code got.
    pub bytes_out: u64,
    /// The result was cut to the cap.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}
