//! execbox runs untrusted, model-written code for LLM agents behind a
//! **backend matrix** that fails closed.
//!
//! A request ([`ExecRequest`]) carries code, inputs and a [`SandboxPolicy`].
//! Each backend declares its [`BackendCapabilities`]. The [`Executor`] picks
//! the cheapest backend that enforces *everything* the policy states, or
//! refuses before any code runs with every unmet control named
//! ([`ExecError::Refused`]). A program's own failure — exception, timeout,
//! budget — is an [`ExecResult`] with an [`Outcome`], not an error.
//!
//! ```
//! use execbox::{ExecRequest, Executor, Outcome, SandboxPolicy};
//! use serde_json::json;
//!
//! let exec = Executor::with_default_backends();
//! let out = exec
//!     .execute_blocking(
//!         ExecRequest::javascript("return input.items.map(x => x * 2);")
//!             .input(json!({"items": [1, 2, 3]}))
//!             .policy(SandboxPolicy::strict()),
//!     )
//!     .unwrap();
//! assert_eq!(out.outcome, Outcome::Ok);
//! assert_eq!(out.output, Some(json!([2, 4, 6])));
//! ```

pub mod admission;
pub mod agent;
#[cfg(feature = "artifacts")]
pub mod artifacts;
mod backend;
pub mod backends;
pub mod capabilities;
mod config;
pub mod defaults;
pub mod error;
pub mod executor;
mod file;
mod hostfs;
pub(crate) mod json;
mod language;
pub mod limits;
pub mod matching;
mod nonce;
// Work done however a scope ends: the server's gate, the kubernetes backend's checks.
#[cfg(any(feature = "serve", feature = "kubernetes"))]
mod guard;
mod observe;
mod owner;
pub mod policy;
pub mod program;
pub mod program_tools;
mod reactor;
pub mod request;
pub mod result;
pub mod schema;
#[cfg(feature = "serve")]
pub mod serve;
mod session_spec;
pub mod sessions;
pub(crate) mod text;
pub mod tools;
pub mod violation;
pub mod workspace;

/// execbox's own worker processes (contained JavaScript, wasm compiles): see
/// [`backends::worker`].
#[cfg(any(feature = "js", feature = "wasm"))]
pub use backends::worker;

pub use admission::Admitted;
pub use backend::ProgramBackend;
pub use backend::{Backend, Readiness, RunFuture, Unavailable};
pub use capabilities::{
    BackendCapabilities, CostClass, Enforcement, IsolationKind, PayloadKind, RequestFeatures, SurfaceCapability,
};
pub use config::RunDefaults;
pub use defaults::{BackendsConfig, ClusterAccess};
pub use error::{BackendRejection, Cause, ConfigError, ExecError, InvalidRequest, with_causes};
pub use executor::{BackendStatus, Executor, ExecutorBuilder, WeakExecutor};
pub use file::ExecFile;
pub use language::Language;
pub use matching::check;
pub use policy::{Access, PathGrant, PathGrants, SandboxPolicy};
pub use program::{Program, ProgramCommand, ProgramError, ProgramOutput, ProgramSpec, ProgramStatus};
pub use reactor::runtime_builder;
pub use request::{ExecRequest, Payload};
pub use result::{CapturedStream, Diagnostic, ExecResult, FailureKind, Outcome, OutputError, Usage};
pub use schema::{JsonSchema, SchemaError};
pub use sessions::{Session, SessionBackend, SessionConfig, SessionError, SessionSpec, Sessions, SessionsBuilder};
pub use violation::{Control, Violation};
pub use workspace::{
    CollectLimits, Collected, CollectedFile, Copied, Imported, RecordedFile, WeakWorkspace, Workspace, WorkspaceConfig,
    WorkspaceError, WorkspaceMetadata, WorkspaceUsage,
};

// The README and every page of docs/ compiled as doctests: each Rust block
// in them must build (and run, unless marked `no_run`) with `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/architecture.md")]
struct ArchitectureDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/backends.md")]
struct BackendsDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/cli.md")]
struct CliDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/code-mode.md")]
struct CodeModeDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/library.md")]
struct LibraryDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/mcp.md")]
struct McpDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/performance.md")]
struct PerformanceDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/workspaces.md")]
struct WorkspacesDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/sessions.md")]
struct SessionsDoctests;
#[cfg(doctest)]
#[doc = include_str!("../docs/threat-model.md")]
struct ThreatModelDoctests;
#[cfg(all(doctest, feature = "kubernetes"))]
#[doc = include_str!("../docs/kubernetes.md")]
struct KubernetesDoctests;
