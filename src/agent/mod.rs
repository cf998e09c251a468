//! The agent-loop contract: how agent frameworks embed execbox.
//!
//! - [`CodeExecutor`] (ADK's shape) and [`ExecboxCodeExecutor`], its
//!   implementation over an [`Executor`](crate::executor::Executor): language ids,
//!   one policy, retries of executor errors only, stateful JavaScript sessions.
//! - [`CodeExecutionResult`]: stdout/stderr/exit code/files plus the
//!   [`ModelOutcome`] fed back to the model (`DeadlineExceeded` for timeouts) and
//!   explicit truncation metadata.
//! - [`CodeBlockExtractor`]: fenced code blocks in model text, linear time.
//! - [`AgentLoop`]: reply → code → results → reply, with a trace.
//! - [`tool_schema`] / [`dispatch`]: execbox as one function-calling tool.

mod driver;
mod executor;
mod extract;
mod result;
mod tool;

pub use crate::sessions::config::SessionConfig;
pub use crate::sessions::registry::Sessions;
pub use driver::{AgentLoop, LoopFile, LoopReport, Message, Part, Role, StopReason, TraceStep};
pub use executor::{BoxFuture, CodeExecutor, CodeExecutorError, ExecboxCodeExecutor, InvocationContext};
pub use extract::{CodeBlock, CodeBlockExtractor, Delimiters, Extraction};
pub use result::{CodeExecutionInput, CodeExecutionResult, ModelOutcome};
pub use tool::{TOOL_NAME, dispatch, tool_schema};
