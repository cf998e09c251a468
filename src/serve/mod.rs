//! `execbox serve`: the backend matrix as an MCP server, over stdio or
//! streamable HTTP, so agents in any language get the warm pools and
//! sessions of one long-lived process.
//!
//! - **Tools**: `run_code`, `list_backends`, `create_session`,
//!   `close_session`, the workspaces' `create_workspace`,
//!   `close_workspace`, `write_files`, `read_files` (files to and from
//!   artifacts: `file_artifacts.rs`), and the programs' `start_program`,
//!   `poll_program`, `write_program`, `kill_program` (see [`ExecboxMcp`]).
//! - **The configured policy is a ceiling** ([`ServeConfig::policy`]): a
//!   call may shorten the deadline or lower the memory cap, nothing else.
//!   Grants (directories, environment values, the container engine) come
//!   only from the configuration; no tool argument names one.
//! - **Load**: at most [`ServeConfig::max_concurrent`] runs at once and
//!   [`ServeConfig::max_queued`] waiting (within their own deadlines); more
//!   is a `busy` tool error at once.
//! - **Sessions** are bounded and expire when idle
//!   ([`ServeConfig::sessions`]); their ids are random and belong to the MCP
//!   connection that created them (another connection cannot use them), and
//!   a connection's sessions close when it does. Calls within one session
//!   run one at a time.
//! - **Shutdown** (SIGTERM, SIGINT, stdin EOF on stdio): new calls are
//!   refused, runs in flight finish or time out (the drain waits no longer
//!   than the latest deadline in flight plus the kill grace), then sessions
//!   are killed, containers and staging directories are removed, and so
//!   are the connections' artifact scopes, before the process exits (a
//!   server killed first leaves them to the next store's sweep).

mod approval;
mod config;
mod file_artifacts;
mod gate;
mod health;
mod http;
mod server;
mod shared;
mod stdio;
mod stdio_io;
// MCP logging notifications are what clients use for output today; rmcp
// marks them deprecated for a later protocol revision (SEP-2577).
mod programs;
#[allow(deprecated)]
mod stream;
#[allow(deprecated)]
mod tools;
mod workspaces;

pub use config::ServeConfig;
pub use gate::SERVER;
pub use http::HttpAccess;
pub use server::Server;
pub use tools::{CloseSessionArgs, CreateSessionArgs, ExecboxMcp, FileArg, LanguageArg, NoArgs, RunCodeArgs};
pub use workspaces::{CreateWorkspaceArgs, ReadFilesArgs, WorkspaceFileArg, WorkspaceIdArgs, WriteFilesArgs};
