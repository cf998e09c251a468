//! Code Mode: sandboxed code calls the host's tools.
//!
//! - [`ToolRegistry`]: the tools — Rust closures registered in a few lines
//!   ([`ToolRegistryBuilder::tool`]), and the tools of upstream MCP servers.
//!   Tools run in the host process with the host's credentials; only
//!   arguments and results cross into the sandbox.
//! - A policy grants tools by name or `namespace.*`
//!   ([`SandboxPolicy::tools`](crate::policy::SandboxPolicy::tools)), with
//!   budgets ([`ToolLimits`]); the default is none. Only a backend whose
//!   capabilities enforce the tool bridge runs a request that grants tools.
//! - [`ToolBridge`]: one run's dispatcher, used by every carrier through one
//!   frame schema ([`frame`]); it keeps the ledger a result reports
//!   ([`ToolCallRecord`]).

pub(crate) mod bridge;
pub mod catalog;
pub mod frame;
pub(crate) mod registry;
#[cfg(feature = "upstream")]
mod upstream;
#[cfg(any(feature = "wasm", feature = "container"))]
pub(crate) mod wire;

pub use crate::error::tool::{ToolError, ToolErrorKind};
pub use crate::policy::tools::{ToolLimits, granted};
pub use crate::result::ledger::{MAX_LEDGER, ToolCallOutcome, ToolCallRecord};
pub use bridge::ToolBridge;
pub use registry::{
    Approver, RegistryError, Tool, ToolAnnotations, ToolApprover, ToolContext, ToolFuture, ToolHandler, ToolRegistry,
    ToolRegistryBuilder, ToolSpec,
};
#[cfg(feature = "upstream")]
pub use upstream::{RequireApproval, UpstreamConfig, UpstreamError, Upstreams, UpstreamsConfig, UpstreamsConfigError};
