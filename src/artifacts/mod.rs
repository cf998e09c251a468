//! Artifacts: files code keeps across runs, versioned, per scope (Code
//! Mode's `artifacts.save`, `artifacts.load`, `artifacts.list`).
//!
//! - [`ArtifactStore`]: the store, files under one data directory
//!   ([`ArtifactStoreConfig::dir`]) opened through cap-std, so no name from
//!   code can reach outside it and no link planted in it is followed.
//!   Every save is a new version (`load` gets the latest or a given one);
//!   each scope has a quota of bytes and files, each version a size cap.
//! - **Scopes**: a run's artifacts are those of its
//!   [`ExecRequest::artifact_scope`](crate::request::ExecRequest::artifact_scope),
//!   set by the host, never by the code: a session's cells share
//!   `session:<id>` ([`Sessions::artifact_scope`](crate::sessions::Sessions::artifact_scope));
//!   a one-shot run has the key its caller gives, or none — then the tools
//!   answer `unavailable` (a run alone has no later run to keep anything
//!   for, and an implicit shared scope would let unrelated runs read each
//!   other's files).
//! - **Scopes a process owns** ([`ArtifactStore::own_scopes`]): scopes
//!   meant to live no longer than the process that uses them (`execbox
//!   serve`'s, one per MCP connection) carry an owner record, and a store
//!   opened after that process is gone, however it ended, removes them
//!   ([`ArtifactStore::reclaim_abandoned_scopes`]). Every other scope stays
//!   until [`ArtifactStore::remove_scope`].
//! - **Tools** ([`ArtifactStore::tools`]): ordinary registry tools in the
//!   namespace `artifacts`, granted like any (`artifacts.*` or by name),
//!   counted in the run's budgets and ledger, listed by `tools.list()` and
//!   the catalog. There are no aliases `save_artifact`, `load_artifact`,
//!   `list_artifacts`: every tool name is `namespace.tool` (grants rely on
//!   it), and a second name per tool would double the catalog and let a
//!   grant of one name miss the other. JavaScript:
//!   `await tools.artifacts.save({name: "a.csv", content: csv})`; Python:
//!   `tools.artifacts.save(name="a.csv", content=csv)`. Add them to a
//!   registry in one line:
//!   `ToolRegistry::builder().tool(..).tools(&store.tools()).build()?`
//!   ([`ToolRegistryBuilder::tools`](crate::tools::ToolRegistryBuilder::tools)).
//! - **Spilled output**: a run whose policy asks it
//!   ([`SandboxPolicy::spill_output`](crate::policy::SandboxPolicy::spill_output))
//!   keeps its whole stdout, past its cap, as an artifact of its scope
//!   (the store given to
//!   [`ExecutorBuilder::artifacts`](crate::executor::ExecutorBuilder::artifacts)
//!   or [`SessionsBuilder::artifacts`](crate::sessions::SessionsBuilder::artifacts));
//!   its result shows the head and tail and names the artifact
//!   ([`ExecResult::spilled`](crate::result::ExecResult::spilled)).
//!
//! See docs/code-mode.md ("Artifacts") for the CLI and MCP server.
//! ```
//! use execbox::artifacts::{ArtifactStore, ArtifactStoreConfig};
//! let dir = tempfile::tempdir().unwrap();
//! let store = ArtifactStore::new(ArtifactStoreConfig::default().dir(dir.path())).unwrap();
//! store.save_text("key:demo", "notes.txt", "first", None).unwrap();
//! let second = store.save_text("key:demo", "notes.txt", "second", Some("text/plain")).unwrap();
//! assert_eq!(second.version, 2);
//! assert_eq!(store.load("key:demo", "notes.txt", Some(1)).unwrap().content, b"first");
//! assert_eq!(store.list("key:demo").unwrap()[0].versions.len(), 2);
//! assert_eq!(store.tools().names(), ["artifacts.list", "artifacts.load", "artifacts.save"]);
//! ```

pub(crate) mod config;
pub(crate) mod error;
mod names;
mod owned;
pub(crate) mod spill;
pub(crate) mod store;
mod tools;

pub use config::ArtifactStoreConfig;
pub use error::ArtifactError;
pub use names::{MAX_NAME_BYTES, check_name};
pub use store::{Artifact, ArtifactInfo, ArtifactStore, ArtifactVersion, ScopeUsage};
pub use tools::NAMESPACE;
