//! [`ToolError`]: why a tool call from sandboxed code produced no value.
//! Code catches it (`ToolError` in JavaScript and Python), so each kind
//! says whether retrying can help.

use serde::{Deserialize, Serialize};

/// What kind of failure a [`ToolError`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ToolErrorKind {
    /// No tool has this name; from a store's tools (`artifacts.load`), no
    /// item has the name or version asked for.
    NotFound,
    /// The tool exists but the run's policy does not grant it.
    NotGranted,
    /// The arguments are not a JSON object, are too large, or the tool
    /// refused them.
    InvalidArguments,
    /// The run made as many calls as its policy allows.
    BudgetExhausted,
    /// As many calls as the policy allows are already in flight.
    TooManyInFlight,
    /// The call did not finish within its timeout (the run's deadline at
    /// the latest); an upstream call was cancelled.
    TimedOut,
    /// The tool's result is larger than the policy allows.
    ResultTooLarge,
    /// The host (or a person, through it) did not approve the call.
    Denied,
    /// The tool ran and failed (its own error, or an upstream server's).
    Failed,
    /// The tool's source (an upstream MCP server) is gone or not answering,
    /// or the tool cannot serve this run (the artifact tools in a run that
    /// has no scope).
    Unavailable,
    /// A store's quota would be exceeded (an artifact scope's bytes or
    /// files, or the largest file): retrying the same call cannot help.
    QuotaExceeded,
    /// The run is over (its deadline passed, or it was stopped).
    Cancelled,
    /// The call was malformed (not a call frame, a reused id).
    Protocol,
}

impl ToolErrorKind {
    /// The stable snake_case name code sees in `error.kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            ToolErrorKind::NotFound => "not_found",
            ToolErrorKind::NotGranted => "not_granted",
            ToolErrorKind::InvalidArguments => "invalid_arguments",
            ToolErrorKind::BudgetExhausted => "budget_exhausted",
            ToolErrorKind::TooManyInFlight => "too_many_in_flight",
            ToolErrorKind::TimedOut => "timed_out",
            ToolErrorKind::ResultTooLarge => "result_too_large",
            ToolErrorKind::Denied => "denied",
            ToolErrorKind::Failed => "failed",
            ToolErrorKind::Unavailable => "unavailable",
            ToolErrorKind::QuotaExceeded => "quota_exceeded",
            ToolErrorKind::Cancelled => "cancelled",
            ToolErrorKind::Protocol => "protocol",
        }
    }
}

/// A failed tool call, as code sees it: `{"tool", "kind", "message"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{tool}: {} ({message})", kind.as_str())]
pub struct ToolError {
    /// The tool's name as the code called it.
    pub tool: String,
    /// What kind of failure.
    pub kind: ToolErrorKind,
    /// What happened, in words (capped at 4 KiB).
    pub message: String,
}

impl ToolError {
    /// A `kind` error of `tool`.
    pub fn new(tool: impl Into<String>, kind: ToolErrorKind, message: impl Into<String>) -> Self {
        let message = crate::text::cap_message(message.into());
        Self { tool: tool.into(), kind, message }
    }

    /// A tool's own failure: what a handler returns when its work failed.
    pub fn failed(tool: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(tool, ToolErrorKind::Failed, message)
    }
}
