//! [`ExecResult`]: what happened when code ran.
//!
//! A program's own failure (exception, trap, non-zero exit, timeout) is a
//! result with an [`Outcome`], not an error: errors are for refusals and
//! executor faults.

use std::borrow::Cow;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::file::ExecFile;

pub(crate) mod ledger;

use ledger::ToolCallRecord;

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Finished normally (exit code 0 where there is one).
    Ok,
    /// Uncaught exception, trap, compile error or non-zero exit.
    Failed,
    /// The wall-clock deadline passed first.
    TimedOut,
    /// The memory cap was hit.
    OutOfMemory,
    /// The instruction / fuel budget ran out.
    OutOfFuel,
    /// Stopped by a signal or by the backend for another reason.
    Killed,
    /// Ran to the end, but its structured output does not match the
    /// request's [`output_schema`](crate::request::ExecRequest::output_schema)
    /// (or it gave none): [`ExecResult::output_errors`] names each failing
    /// place; `output` keeps what it gave.
    InvalidOutput,
}

impl Outcome {
    /// The stable snake_case name used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Failed => "failed",
            Outcome::TimedOut => "timed_out",
            Outcome::OutOfMemory => "out_of_memory",
            Outcome::OutOfFuel => "out_of_fuel",
            Outcome::Killed => "killed",
            Outcome::InvalidOutput => "invalid_output",
        }
    }
}

/// Why a `Failed` run failed, where the backend can tell more than "non-zero exit".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FailureKind {
    /// The code did not compile; [`ExecResult::diagnostics`] says where.
    CompileError,
}

impl FailureKind {
    /// The stable snake_case name used in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::CompileError => "compile_error",
        }
    }
}

/// One compiler message, located in the caller's code.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnostic {
    /// `error` or `warning`.
    pub level: String,
    /// The compiler's code for it (e.g. `E0308`), if any.
    pub code: Option<String>,
    /// The message's first line.
    pub message: String,
    /// 1-based line in the caller's code; `None` when the compiler points
    /// outside it (e.g. at execbox's harness: a missing or mistyped `run`).
    pub line: Option<u32>,
    /// 1-based column, with `line`.
    pub column: Option<u32>,
}

/// One captured output stream: the kept prefix and how much was produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CapturedStream {
    /// The bytes kept (at most the policy's cap).
    pub bytes: Vec<u8>,
    /// Total bytes the program wrote, kept or not.
    pub total_bytes: u64,
    /// True if bytes were dropped because of the cap.
    pub truncated: bool,
}

impl CapturedStream {
    /// The kept bytes as text (invalid UTF-8 replaced with U+FFFD). A
    /// character the cap cut in half is left out, not replaced: the text
    /// stays within the cap.
    pub fn text(&self) -> Cow<'_, str> {
        let bytes = if self.truncated { without_cut_char(&self.bytes) } else { &self.bytes[..] };
        String::from_utf8_lossy(bytes)
    }
}

/// `bytes` without a UTF-8 sequence left incomplete at its very end.
fn without_cut_char(bytes: &[u8]) -> &[u8] {
    // The last character starts within the last 4 bytes.
    for back in 1..=bytes.len().min(4) {
        let start = bytes.len() - back;
        let lead = bytes[start];
        if lead & 0b1100_0000 == 0b1000_0000 {
            continue; // a continuation byte: keep looking for the lead
        }
        let needed = match lead {
            0x00..=0x7f => 1,
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            0xf0..=0xf7 => 4,
            _ => return bytes, // not a lead byte: invalid anyway, leave it to the lossy conversion
        };
        return if back < needed { &bytes[..start] } else { bytes };
    }
    bytes
}

pub use crate::schema::OutputError;

/// Resources a run used, where the backend can tell.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Wall-clock time inside the backend.
    pub duration: Duration,
    /// VM instructions executed (boa).
    pub instructions: Option<u64>,
    /// Fuel consumed (wasmtime).
    pub fuel: Option<u64>,
    /// Peak memory, in bytes.
    pub peak_memory_bytes: Option<u64>,
}

/// The result of one run.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ExecResult {
    /// Name of the backend that ran the code.
    pub backend: String,
    /// How the run ended.
    pub outcome: Outcome,
    /// Process exit code; `None` for in-process engines, which have no process.
    pub exit_code: Option<i32>,
    /// Standard output (JS: `console.log`/`info`/`debug`).
    pub stdout: CapturedStream,
    /// Standard error (JS: `console.warn`/`error`, and the uncaught exception).
    pub stderr: CapturedStream,
    /// Structured output (JS: the returned value as JSON).
    pub output: Option<Value>,
    /// True when the program produced structured output that was dropped
    /// because its JSON text exceeds the policy's `max_stdout_bytes` (the run
    /// is then `Failed`, and `output` is `None`): a cut value is never passed
    /// off as a whole one.
    pub output_truncated: bool,
    /// One line saying why the outcome is not `Ok` (exception, trap, limit).
    pub message: Option<String>,
    /// Files the program produced.
    pub output_files: Vec<ExecFile>,
    /// What kind of failure, when the backend can tell (e.g. a compile error).
    pub failure_kind: Option<FailureKind>,
    /// Compiler errors and warnings (compiled languages only).
    pub diagnostics: Vec<Diagnostic>,
    /// Resources used.
    pub usage: Usage,
    /// The run's tool calls (Code Mode), in the order they were made: what
    /// each did, so an agent can reconcile after a failure (a call the run
    /// ended in the middle of says `unknown`). At most
    /// [`MAX_LEDGER`](ledger::MAX_LEDGER) entries.
    pub tool_calls: Vec<ToolCallRecord>,
    /// The artifact that holds the run's whole stdout, when its policy
    /// spills output ([`SandboxPolicy::spill_output`](crate::policy::SandboxPolicy::spill_output))
    /// and stdout passed its cap: `stdout` is then the stream's head and
    /// tail with a line between them naming this artifact, in the run's
    /// scope (`artifacts.load` from code, `ArtifactStore::load` from the
    /// host). In JSON only when set.
    pub spilled: Option<String>,
    /// Why the output does not match the request's output schema, when the
    /// outcome is [`Outcome::InvalidOutput`]: each failing place, at most
    /// [`MAX_REPORTED_ERRORS`](crate::schema::MAX_REPORTED_ERRORS). In JSON
    /// only when not empty.
    pub output_errors: Vec<OutputError>,
    /// How full the run's workspace was when the run ended (`full`: a write
    /// past its quota failed), for a run in one. In JSON only when set.
    pub workspace: Option<crate::workspace::WorkspaceUsage>,
}

impl ExecResult {
    /// A result of `backend` with `outcome` and nothing else: no process, no
    /// output, empty streams. Backends fill in what they know.
    pub fn new(backend: impl Into<String>, outcome: Outcome) -> Self {
        Self {
            backend: backend.into(),
            outcome,
            exit_code: None,
            stdout: CapturedStream::default(),
            stderr: CapturedStream::default(),
            output: None,
            output_truncated: false,
            message: None,
            output_files: Vec::new(),
            failure_kind: None,
            diagnostics: Vec::new(),
            usage: Usage::default(),
            tool_calls: Vec::new(),
            spilled: None,
            output_errors: Vec::new(),
            workspace: None,
        }
    }

    /// True when the outcome is `Ok`.
    pub fn is_ok(&self) -> bool {
        self.outcome == Outcome::Ok
    }

    /// The JSON shape (see [`ExecResult`]'s `Serialize`) as a value.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// `ExecResult` in JSON: one flat object, the shape `execbox run --json`
/// prints, the MCP server's `structuredContent` and docs/cli.md document.
/// Streams are text (invalid UTF-8 replaced with U+FFFD); `duration_ms` is
/// fractional milliseconds; files are [`ExecFile`]'s shape.
#[derive(Serialize)]
struct ResultJsonRef<'a> {
    outcome: Outcome,
    backend: &'a str,
    exit_code: Option<i32>,
    stdout: Cow<'a, str>,
    stderr: Cow<'a, str>,
    stdout_truncated: bool,
    stderr_truncated: bool,
    stdout_total_bytes: u64,
    stderr_total_bytes: u64,
    output: &'a Option<Value>,
    output_truncated: bool,
    message: &'a Option<String>,
    duration_ms: f64,
    instructions: Option<u64>,
    fuel: Option<u64>,
    peak_memory_bytes: Option<u64>,
    failure_kind: Option<FailureKind>,
    diagnostics: &'a [Diagnostic],
    output_files: &'a [ExecFile],
    tool_calls: &'a [ToolCallRecord],
    #[serde(skip_serializing_if = "Option::is_none")]
    spilled: &'a Option<String>,
    #[serde(skip_serializing_if = "<[OutputError]>::is_empty")]
    output_errors: &'a [OutputError],
    #[serde(skip_serializing_if = "Option::is_none")]
    workspace: &'a Option<crate::workspace::WorkspaceUsage>,
}

/// The owned side of [`ResultJsonRef`], for clients reading results back.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResultJson {
    backend: String,
    outcome: Outcome,
    #[serde(default)]
    exit_code: Option<i32>,
    #[serde(default)]
    stdout: String,
    #[serde(default)]
    stderr: String,
    #[serde(default)]
    stdout_truncated: bool,
    #[serde(default)]
    stderr_truncated: bool,
    #[serde(default)]
    stdout_total_bytes: Option<u64>,
    #[serde(default)]
    stderr_total_bytes: Option<u64>,
    #[serde(default)]
    output: Option<Value>,
    #[serde(default)]
    output_truncated: bool,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    duration_ms: f64,
    #[serde(default)]
    instructions: Option<u64>,
    #[serde(default)]
    fuel: Option<u64>,
    #[serde(default)]
    peak_memory_bytes: Option<u64>,
    #[serde(default)]
    failure_kind: Option<FailureKind>,
    #[serde(default)]
    diagnostics: Vec<Diagnostic>,
    #[serde(default)]
    output_files: Vec<ExecFile>,
    #[serde(default)]
    tool_calls: Vec<ToolCallRecord>,
    #[serde(default)]
    spilled: Option<String>,
    #[serde(default)]
    output_errors: Vec<OutputError>,
    #[serde(default)]
    workspace: Option<crate::workspace::WorkspaceUsage>,
}

impl Serialize for ExecResult {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        ResultJsonRef {
            outcome: self.outcome,
            backend: &self.backend,
            exit_code: self.exit_code,
            stdout: self.stdout.text(),
            stderr: self.stderr.text(),
            stdout_truncated: self.stdout.truncated,
            stderr_truncated: self.stderr.truncated,
            stdout_total_bytes: self.stdout.total_bytes,
            stderr_total_bytes: self.stderr.total_bytes,
            output: &self.output,
            output_truncated: self.output_truncated,
            message: &self.message,
            duration_ms: self.usage.duration.as_secs_f64() * 1e3,
            instructions: self.usage.instructions,
            fuel: self.usage.fuel,
            peak_memory_bytes: self.usage.peak_memory_bytes,
            failure_kind: self.failure_kind,
            diagnostics: &self.diagnostics,
            output_files: &self.output_files,
            tool_calls: &self.tool_calls,
            spilled: &self.spilled,
            output_errors: &self.output_errors,
            workspace: &self.workspace,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ExecResult {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let j = ResultJson::deserialize(deserializer)?;
        let stream = |text: String, truncated: bool, total: Option<u64>| {
            let total_bytes = total.unwrap_or(text.len() as u64);
            CapturedStream { bytes: text.into_bytes(), total_bytes, truncated }
        };
        let duration = if j.duration_ms.is_finite() && j.duration_ms >= 0.0 {
            Duration::try_from_secs_f64(j.duration_ms / 1e3).unwrap_or(Duration::MAX)
        } else {
            return Err(serde::de::Error::custom("duration_ms must be a finite, non-negative number"));
        };
        Ok(ExecResult {
            backend: j.backend,
            outcome: j.outcome,
            exit_code: j.exit_code,
            stdout: stream(j.stdout, j.stdout_truncated, j.stdout_total_bytes),
            stderr: stream(j.stderr, j.stderr_truncated, j.stderr_total_bytes),
            output: j.output,
            output_truncated: j.output_truncated,
            message: j.message,
            output_files: j.output_files,
            failure_kind: j.failure_kind,
            diagnostics: j.diagnostics,
            usage: Usage {
                duration,
                instructions: j.instructions,
                fuel: j.fuel,
                peak_memory_bytes: j.peak_memory_bytes,
            },
            tool_calls: j.tool_calls,
            spilled: j.spilled,
            output_errors: j.output_errors,
            workspace: j.workspace,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_character_cut_by_the_cap_is_left_out() {
        let cut = |bytes: &[u8], truncated| {
            CapturedStream { bytes: bytes.to_vec(), total_bytes: 99, truncated }.text().into_owned()
        };
        assert_eq!(cut("ab\u{20ac}".as_bytes(), true), "ab\u{20ac}");
        assert_eq!(cut(&"ab\u{20ac}".as_bytes()[..4], true), "ab");
        assert_eq!(cut(&"\u{1f600}".as_bytes()[..3], true), "");
        assert_eq!(cut(&"\u{20ac}".as_bytes()[..2], false), "\u{fffd}", "only a cut stream is trimmed");
    }

    #[test]
    fn results_round_trip_through_json() {
        let mut r = ExecResult::new("boa-js", Outcome::Failed);
        r.stdout = CapturedStream { bytes: b"hi\n".to_vec(), total_bytes: 10, truncated: true };
        r.output = Some(serde_json::json!({"a": [1]}));
        r.message = Some("why".into());
        r.output_files =
            vec![ExecFile { name: "p.png".into(), content: vec![137, 80], mime_type: Some("image/png".into()) }];
        r.usage.duration = Duration::from_micros(1500);
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<ExecResult>(&text).unwrap(), r);
        assert_eq!(serde_json::to_value(&r).unwrap()["duration_ms"], 1.5);
        assert!(serde_json::to_value(&r).unwrap().get("spilled").is_none(), "only when set");
        r.spilled = Some("stdout-1".into());
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<ExecResult>(&text).unwrap(), r);
        assert_eq!(serde_json::to_value(&r).unwrap()["spilled"], "stdout-1");
    }
}
