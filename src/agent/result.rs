//! The input and result of one agent code execution, in the shape agent
//! frameworks use (ADK's `CodeExecutionInput` / `CodeExecutionResult`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::file::ExecFile;
use crate::result::{ExecResult, Outcome as RunOutcome};

/// Code an agent wants to run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CodeExecutionInput {
    /// The code.
    pub code: String,
    /// Language id: `python`, `javascript`/`js`, `rust`, `shell`, `wasm` (WAT text).
    pub language: String,
    /// Files staged for the code.
    #[serde(default)]
    pub input_files: Vec<ExecFile>,
    /// With a stateful executor: runs with the same id share interpreter state.
    #[serde(default)]
    pub execution_id: Option<String>,
    /// execbox extension: structured JSON input (JS/Python `input`, Rust `run`'s argument).
    #[serde(default)]
    pub input: Option<Value>,
    /// execbox extension: packages the code needs (Python: `numpy`, `pandas`,
    /// `matplotlib`, ...); only a backend that provides them all runs it.
    #[serde(default)]
    pub packages: Vec<String>,
    /// execbox extension: return the files the code writes to its output
    /// directory (`/work/out`) as `output_files` (only backends that can, i.e.
    /// containers, are then chosen).
    #[serde(default)]
    pub collect_output_files: bool,
    /// execbox extension: what the structured output must match (see
    /// [`ExecRequest::output_schema`](crate::request::ExecRequest::output_schema)):
    /// a run whose output does not is [`ModelOutcome::Failed`] and its
    /// [`CodeExecutionResult::output_errors`] say where.
    #[serde(default)]
    pub output_schema: Option<crate::schema::JsonSchema>,
}

impl CodeExecutionInput {
    /// `code` in `language`, nothing else.
    pub fn new(language: impl Into<String>, code: impl Into<String>) -> Self {
        Self { code: code.into(), language: language.into(), ..Self::default() }
    }
}

/// The outcome reported back to the model with a result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelOutcome {
    /// Not known (e.g. the result was built by hand).
    #[default]
    Unspecified,
    /// The code ran to completion.
    Ok,
    /// The code failed: exception, non-zero exit, compile error, a limit.
    Failed,
    /// The deadline passed: tell the model the code was too slow, not wrong.
    DeadlineExceeded,
}

/// What one execution produced.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CodeExecutionResult {
    /// Standard output (kept part; see `stdout_truncated`).
    pub stdout: String,
    /// Standard error; for a failure without a process (JS exception, a
    /// limit) it ends with execbox's one-line reason.
    pub stderr: String,
    /// Files the code wrote to its output directory.
    pub output_files: Vec<ExecFile>,
    /// The process's exit code; `None` for in-process engines.
    pub exit_code: Option<i32>,
    /// The outcome for the model.
    pub outcome: ModelOutcome,
    /// Structured output (JS return value, JSON stdout of container programs).
    pub output: Option<Value>,
    /// True if stdout was cut at the policy's cap.
    pub stdout_truncated: bool,
    /// True if stderr was cut at the policy's cap.
    pub stderr_truncated: bool,
    /// Bytes the code wrote to stdout, kept or not.
    pub stdout_total_bytes: u64,
    /// Bytes the code wrote to stderr, kept or not.
    pub stderr_total_bytes: u64,
    /// The backend that ran it.
    pub backend: String,
    /// Wall-clock time of the run.
    pub duration_ms: f64,
    /// Runs started for this result (more than 1 after a retried executor error).
    pub attempts: u32,
    /// Where the output does not match the input's `output_schema`, if it
    /// does not (then the outcome is `Failed`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub output_errors: Vec<crate::result::OutputError>,
}

impl CodeExecutionResult {
    /// Whether the code ran to the end and did what was asked: never true
    /// for a result whose outcome is known and not [`ModelOutcome::Ok`]
    /// (an output over its cap or one that does not match its schema keeps
    /// exit code 0 and is still not a success). For a result built by hand
    /// ([`ModelOutcome::Unspecified`]): exit code 0, or no exit code and
    /// nothing on stderr.
    pub fn is_success(&self) -> bool {
        match self.outcome {
            ModelOutcome::Ok => true,
            ModelOutcome::Failed | ModelOutcome::DeadlineExceeded => false,
            ModelOutcome::Unspecified => {
                self.exit_code == Some(0) || (self.exit_code.is_none() && self.stderr.is_empty())
            }
        }
    }

    /// stdout, then stderr under a `--- stderr ---` divider when both have text.
    pub fn combined_output(&self) -> String {
        match (self.stdout.is_empty(), self.stderr.is_empty()) {
            (_, true) => self.stdout.clone(),
            (true, false) => self.stderr.clone(),
            (false, false) => {
                let newline = if self.stdout.ends_with('\n') { "" } else { "\n" };
                format!("{}{newline}--- stderr ---\n{}", self.stdout, self.stderr)
            }
        }
    }

    /// A line per truncated stream (`[stdout truncated: 1024 of 52428800 bytes kept]`),
    /// so a model does not loop on silently cut output.
    pub fn truncation_note(&self) -> Option<String> {
        let mut notes = Vec::new();
        for (name, cut, kept, total) in [
            ("stdout", self.stdout_truncated, self.stdout.len(), self.stdout_total_bytes),
            ("stderr", self.stderr_truncated, self.stderr.len(), self.stderr_total_bytes),
        ] {
            if cut {
                notes.push(format!("[{name} truncated: {kept} of {total} bytes kept]"));
            }
        }
        (!notes.is_empty()).then(|| notes.join("\n"))
    }

    /// The text a model sees for this result: combined output, the structured
    /// output when stdout does not already show it, the files that came back
    /// (so it knows a plot exists), and truncation notes.
    pub fn model_text(&self) -> String {
        let mut text = self.combined_output();
        let stdout_is_output = serde_json::from_str::<Value>(self.stdout.trim()).ok() == self.output;
        if let Some(output) = self.output.as_ref().filter(|_| !stdout_is_output) {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&format!("--- output ---\n{output}"));
        }
        if !self.output_errors.is_empty() {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str("--- the output does not match the output schema ---");
            for error in &self.output_errors {
                text.push('\n');
                text.push_str(&error.line());
            }
        }
        if !self.output_files.is_empty() {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str("--- files ---");
            for file in &self.output_files {
                let mime = file.mime_type.as_deref().unwrap_or("application/octet-stream");
                text.push_str(&format!("\n{} ({mime}, {} bytes)", file.name, file.content.len()));
            }
        }
        if let Some(note) = self.truncation_note() {
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&note);
        }
        text
    }
}

impl From<ExecResult> for CodeExecutionResult {
    fn from(r: ExecResult) -> Self {
        let outcome = match r.outcome {
            RunOutcome::Ok => ModelOutcome::Ok,
            RunOutcome::TimedOut => ModelOutcome::DeadlineExceeded,
            _ => ModelOutcome::Failed,
        };
        let mut stderr = r.stderr.text().into_owned();
        // A failure must never look like a success: without a process there
        // is no exit code, so the reason goes to stderr.
        // (An output that does not match its schema is listed in full
        // under its own heading instead.)
        if outcome != ModelOutcome::Ok
            && stderr.is_empty()
            && r.output_errors.is_empty()
            && let Some(message) = &r.message
        {
            stderr = format!("execbox: {}: {message}\n", r.outcome.as_str());
        }
        Self {
            stdout: r.stdout.text().into_owned(),
            stderr,
            output_files: r.output_files,
            exit_code: r.exit_code,
            outcome,
            output: r.output,
            stdout_truncated: r.stdout.truncated,
            stderr_truncated: r.stderr.truncated,
            stdout_total_bytes: r.stdout.total_bytes,
            stderr_total_bytes: r.stderr.total_bytes,
            backend: r.backend,
            duration_ms: r.usage.duration.as_secs_f64() * 1e3,
            attempts: 1,
            output_errors: r.output_errors,
        }
    }
}
