//! [`AgentLoop`]: reply → extract code → run each block → feed the results
//! back → ask the model again, until a reply has no code or the turn bound.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::executor::{CodeExecutor, InvocationContext};
use super::extract::CodeBlockExtractor;
use super::result::{CodeExecutionInput, ModelOutcome};
use crate::file::ExecFile;

/// Who a message is from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The person or system starting the loop.
    User,
    /// The model.
    Model,
    /// execbox, reporting what the code did.
    Tool,
}

/// One part of a message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum Part {
    /// Prose (and code blocks that do not run).
    Text {
        /// The text.
        text: String,
    },
    /// A code block that ran.
    Code {
        /// Language id.
        language: String,
        /// The code.
        code: String,
    },
    /// What a code block did, as the model should see it.
    CodeResult {
        /// How it ended.
        outcome: ModelOutcome,
        /// Combined output, structured output and truncation notes, or why nothing ran.
        output: String,
    },
}

/// One message of the history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Its author.
    pub role: Role,
    /// Its parts, in order.
    pub parts: Vec<Part>,
}

impl Message {
    /// A user message with one text part.
    pub fn user(text: impl Into<String>) -> Self {
        Self { role: Role::User, parts: vec![Part::Text { text: text.into() }] }
    }

    /// All text parts joined.
    pub fn text(&self) -> String {
        self.parts
            .iter()
            .filter_map(|p| match p {
                Part::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }
}

/// What one executed block did: enough to audit a loop without its outputs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceStep {
    /// Model turn (0-based).
    pub turn: usize,
    /// Runnable block within the turn (0-based).
    pub block: usize,
    /// Language id.
    pub language: String,
    /// sha256 of the code, hex.
    pub code_sha256: String,
    /// The backend that ran it (`None` if nothing ran).
    pub backend: Option<String>,
    /// How it ended.
    pub outcome: ModelOutcome,
    /// Wall-clock time of the run.
    pub duration_ms: f64,
    /// Bytes written to stdout and stderr (kept or not).
    pub output_bytes: u64,
    /// True if either stream was cut.
    pub truncated: bool,
    /// Why nothing ran (refusal, invalid request), if so.
    pub error: Option<String>,
}

/// Why the loop stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model replied without runnable code.
    NoCode,
    /// The turn bound was reached.
    MaxTurns,
}

/// A file a block's run returned (a plot, a CSV), with where it came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoopFile {
    /// Model turn (0-based).
    pub turn: usize,
    /// Runnable block within the turn (0-based).
    pub block: usize,
    /// The file, its bytes included.
    pub file: ExecFile,
}

/// The loop's record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoopReport {
    /// Every message, the starting ones included.
    pub history: Vec<Message>,
    /// One step per executed block.
    pub trace: Vec<TraceStep>,
    /// Why it stopped.
    pub stop: StopReason,
    /// Every file the runs returned, in order (the history names them; the
    /// bytes are here).
    pub output_files: Vec<LoopFile>,
    /// The execution id the blocks ran under, if any (made up for a
    /// stateful executor when none was given, and ended with the loop).
    pub execution_id: Option<String>,
}

/// Drives a model and a [`CodeExecutor`] until the model stops writing code.
///
/// Every block runs through [`CodeExecutor::execute_code_bounded`]: the
/// executor's own [`error_retry_attempts`](CodeExecutor::error_retry_attempts)
/// and [`timeout`](CodeExecutor::timeout) hold, whoever implements it. A
/// stateful executor runs every block of the loop under one execution id:
/// the caller's ([`AgentLoop::execution_id`]), or one made up for the loop
/// and ended with it.
pub struct AgentLoop<'a, E: CodeExecutor + ?Sized> {
    executor: &'a E,
    extractor: CodeBlockExtractor,
    max_turns: usize,
    ctx: InvocationContext,
    execution_id: Option<String>,
    input_files: Vec<ExecFile>,
}

impl<'a, E: CodeExecutor + ?Sized> AgentLoop<'a, E> {
    /// A loop over `executor` with the default extractor and 8 turns.
    pub fn new(executor: &'a E) -> Self {
        Self {
            executor,
            extractor: CodeBlockExtractor::default(),
            max_turns: 8,
            ctx: InvocationContext::default(),
            execution_id: None,
            input_files: Vec::new(),
        }
    }

    /// Which blocks run.
    pub fn extractor(mut self, extractor: CodeBlockExtractor) -> Self {
        self.extractor = extractor;
        self
    }

    /// Most model turns.
    pub fn max_turns(mut self, turns: usize) -> Self {
        self.max_turns = turns;
        self
    }

    /// Runs every block under this execution id (state carries over with a
    /// stateful executor). Without one, a stateful executor's blocks get an
    /// id made up for this loop.
    pub fn execution_id(mut self, id: impl Into<String>) -> Self {
        self.execution_id = Some(id.into());
        self
    }

    /// The invocation the loop runs for: its id reaches every run's span.
    pub fn invocation(mut self, ctx: InvocationContext) -> Self {
        self.ctx = ctx;
        self
    }

    /// Stages `files` for every block (a CSV the model is asked about).
    pub fn input_files(mut self, files: Vec<ExecFile>) -> Self {
        self.input_files = files;
        self
    }

    /// Runs the loop from `history`, asking `model` for each reply (a
    /// plain closure: a scripted model, or a blocking client). For a model
    /// behind an async client, see [`AgentLoop::run_async`].
    pub async fn run(&self, history: Vec<Message>, mut model: impl FnMut(&[Message]) -> String) -> LoopReport {
        self.run_async(history, async |history: &[Message]| model(history)).await
    }

    /// Runs the loop from `history`, awaiting `model` for each reply: an
    /// async closure, e.g. `async |history| client.complete(history).await`.
    pub async fn run_async(
        &self,
        history: Vec<Message>,
        mut model: impl AsyncFnMut(&[Message]) -> String,
    ) -> LoopReport {
        let made_up = self.execution_id.is_none() && self.executor.stateful();
        let execution_id = match &self.execution_id {
            Some(id) => Some(id.clone()),
            None if made_up => Some(format!("loop-{}", crate::nonce::hex128())),
            None => None,
        };
        // The made-up id ends with the loop, also when the caller drops
        // this future mid-run (a timeout around the agent's turn): nobody
        // else knows the id, so its session would hold a slot until idle.
        let _ends = EndsExecution { executor: self.executor, id: execution_id.clone().filter(|_| made_up) };
        let mut report = LoopReport {
            history,
            trace: Vec::new(),
            stop: StopReason::MaxTurns,
            output_files: Vec::new(),
            execution_id,
        };
        report.stop = self.turns(&mut report, &mut model).await;
        report
    }

    /// The turns of [`AgentLoop::run_async`], recorded in `report`.
    async fn turns(&self, report: &mut LoopReport, model: &mut impl AsyncFnMut(&[Message]) -> String) -> StopReason {
        for turn in 0..self.max_turns {
            let reply = model(&report.history).await;
            let extraction = self.extractor.extract(&reply);
            report.history.push(Message { role: Role::Model, parts: model_parts(&reply, &extraction) });
            let blocks: Vec<_> = extraction.runnable().collect();
            if blocks.is_empty() {
                return StopReason::NoCode;
            }
            let mut results = Vec::new();
            for (index, (block, language)) in blocks.into_iter().enumerate() {
                let input = CodeExecutionInput {
                    code: block.code.clone(),
                    language: language.as_str().to_string(),
                    execution_id: report.execution_id.clone(),
                    input_files: self.input_files.clone(),
                    ..Default::default()
                };
                let mut step = TraceStep {
                    turn,
                    block: index,
                    language: language.as_str().to_string(),
                    code_sha256: format!("{:x}", Sha256::digest(block.code.as_bytes())),
                    backend: None,
                    outcome: ModelOutcome::Failed,
                    duration_ms: 0.0,
                    output_bytes: 0,
                    truncated: false,
                    error: None,
                };
                let part = match self.executor.execute_code_bounded(&self.ctx, input).await {
                    Ok(mut result) => {
                        step.backend = Some(result.backend.clone()).filter(|b| !b.is_empty());
                        step.outcome = result.outcome;
                        step.duration_ms = result.duration_ms;
                        step.output_bytes = result.stdout_total_bytes + result.stderr_total_bytes;
                        step.truncated = result.stdout_truncated || result.stderr_truncated;
                        let part = Part::CodeResult { outcome: result.outcome, output: result.model_text() };
                        let files = std::mem::take(&mut result.output_files);
                        report.output_files.extend(files.into_iter().map(|file| LoopFile { turn, block: index, file }));
                        part
                    }
                    Err(err) => {
                        step.error = Some(err.to_string());
                        Part::CodeResult {
                            outcome: ModelOutcome::Failed,
                            output: format!("execbox did not run this code: {err}"),
                        }
                    }
                };
                report.trace.push(step);
                results.push(part);
            }
            report.history.push(Message { role: Role::Tool, parts: results });
        }
        StopReason::MaxTurns
    }
}

/// Ends a loop's made-up execution id when dropped: at the loop's end, or
/// when its future is dropped.
struct EndsExecution<'a, E: CodeExecutor + ?Sized> {
    executor: &'a E,
    id: Option<String>,
}

impl<E: CodeExecutor + ?Sized> Drop for EndsExecution<'_, E> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.executor.end_execution(&id);
        }
    }
}

/// The reply as parts: text around the blocks, runnable blocks as code.
fn model_parts(reply: &str, extraction: &super::extract::Extraction) -> Vec<Part> {
    let mut parts = Vec::new();
    let text = |t: &str, parts: &mut Vec<Part>| {
        if !t.trim().is_empty() {
            parts.push(Part::Text { text: t.to_string() });
        }
    };
    let mut pos = 0;
    for block in &extraction.blocks {
        match block.language {
            Some(language) => {
                text(&reply[pos..block.span.start], &mut parts);
                parts.push(Part::Code { language: language.as_str().to_string(), code: block.code.clone() });
            }
            None => text(&reply[pos..block.span.end], &mut parts),
        }
        pos = block.span.end;
    }
    text(&reply[pos..], &mut parts);
    parts
}
