//! [`ServeConfig`]: how `execbox serve` runs.

use std::collections::BTreeMap;

use crate::config::setters;
use crate::defaults::BackendsConfig;
use crate::policy::SandboxPolicy;
use crate::sessions::config::SessionConfig;
use crate::tools::ToolRegistry;

/// How `execbox serve` runs. `Default`: the strict policy as the ceiling,
/// 4 runs at once per core, 64 waiting, the default session bounds and
/// backends.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ServeConfig {
    /// The ceiling every call is held to (and the policy of a call that
    /// asks for nothing).
    pub policy: SandboxPolicy,
    /// Environment values every run gets (their names must be in the
    /// policy's environment allow-list).
    pub env: BTreeMap<String, String>,
    /// Runs at once.
    pub max_concurrent: usize,
    /// Calls waiting for a run slot; more are refused as `busy` at once.
    pub max_queued: usize,
    /// Bounds on sessions (all connections together).
    pub sessions: SessionConfig,
    /// The backends' settings (pool sizes, engine, caches).
    pub backends: BackendsConfig,
    /// Report a program that ran and did not end `ok` as a failed tool
    /// call (`isError: true`), as execbox did before. Off, such a run is
    /// the tool's normal answer, its outcome first: agent frameworks spend
    /// their tool-retry budget on failed calls (pydantic-ai's default is
    /// one retry), and a model's bug is not a tool failure.
    ///
    /// # Default
    /// `false`.
    pub failures_as_errors: bool,
    /// Host tools code may call when the policy grants them (Code Mode).
    ///
    /// # Default
    /// None.
    pub tools: ToolRegistry,
    /// Upstream MCP servers whose tools code may call (their server name is
    /// the tools' namespace), in the `mcpServers` shape of MCP clients.
    ///
    /// # Default
    /// None.
    #[cfg(feature = "upstream")]
    pub upstreams: crate::tools::UpstreamsConfig,
    /// The artifact store (feature `artifacts`): when set, code's
    /// `artifacts.*` tools are registered (granted like any tool, e.g.
    /// `artifacts.*` in the policy's tools) and runs whose policy spills
    /// output keep it there. A connection's runs and session cells share
    /// one scope (a `run_code` call's `artifact_key` picks another scope of
    /// the same connection); a connection's scopes are removed when it
    /// ends, and a server's scopes are never another server process's.
    ///
    /// # Default
    /// None.
    #[cfg(feature = "artifacts")]
    pub artifacts: Option<crate::artifacts::ArtifactStoreConfig>,
    /// Workspaces (`create_workspace`): where they are mounted, and the
    /// largest quota a call may ask for (its default). A connection holds
    /// at most 4; they are unmounted when it ends. Mounting needs root.
    ///
    /// # Default
    /// [`WorkspaceConfig::default`](crate::workspace::WorkspaceConfig).
    pub workspaces: crate::workspace::WorkspaceConfig,
    /// Workspaces live at once across all connections: each may hold up
    /// to its quota in memory (a tmpfs), so this bounds what clients can
    /// make the host keep (16 × 64 MiB = 1 GiB with the defaults).
    ///
    /// # Default
    /// 16.
    pub max_workspaces: usize,
    /// The longest a program (`start_program`) may run, and the lifetime of
    /// one that states none: then it is killed. A program's lifetime is not
    /// a run's deadline, so the policy's timeout does not bound it; its
    /// workspace's container lives at most
    /// [`ContainerConfig::session_lifetime`](crate::backends::container::ContainerConfig::session_lifetime)
    /// (an hour) in any case.
    ///
    /// # Default
    /// 10 minutes.
    pub program_lifetime: std::time::Duration,
    /// A workspace no call used for this long, and in which no program
    /// runs, is closed (its files removed).
    ///
    /// # Default
    /// 15 minutes.
    pub workspace_idle: std::time::Duration,
    /// A workspace is closed this long after it was made, whatever runs in
    /// it.
    ///
    /// # Default
    /// 1 hour.
    pub workspace_lifetime: std::time::Duration,
    /// This server's name among replicas behind one address (a Kubernetes
    /// Deployment's pod name). Sessions, workspaces and MCP sessions live
    /// in one process: when set, `create_session` and `create_workspace`
    /// say which replica holds what they opened, and a call naming one this
    /// replica does not hold is told which replica it reached
    /// (`unknown_session`; for MCP sessions, a 404 with a JSON-RPC error
    /// whose `data.kind` is `unknown_session`).
    ///
    /// # Default
    /// None (one process: nothing to name).
    pub replica: Option<String>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        Self {
            policy: SandboxPolicy::strict(),
            env: BTreeMap::new(),
            max_concurrent: 4 * cores,
            max_queued: 64,
            sessions: SessionConfig::default(),
            backends: BackendsConfig::default(),
            failures_as_errors: false,
            tools: ToolRegistry::default(),
            #[cfg(feature = "upstream")]
            upstreams: crate::tools::UpstreamsConfig::default(),
            #[cfg(feature = "artifacts")]
            artifacts: None,
            workspaces: crate::workspace::WorkspaceConfig::default(),
            max_workspaces: 16,
            program_lifetime: std::time::Duration::from_secs(600),
            workspace_idle: std::time::Duration::from_secs(900),
            workspace_lifetime: std::time::Duration::from_secs(3600),
            replica: None,
        }
    }
}

setters!(ServeConfig {
    policy: SandboxPolicy,
    env: BTreeMap<String, String>,
    max_concurrent: usize,
    max_queued: usize,
    sessions: SessionConfig,
    backends: BackendsConfig,
    failures_as_errors: bool,
    tools: ToolRegistry,
    workspaces: crate::workspace::WorkspaceConfig,
    max_workspaces: usize,
    program_lifetime: std::time::Duration,
    workspace_idle: std::time::Duration,
    workspace_lifetime: std::time::Duration,
} some {
    replica: String,
});

#[cfg(feature = "upstream")]
setters!(ServeConfig { upstreams: crate::tools::UpstreamsConfig });

#[cfg(feature = "artifacts")]
setters!(ServeConfig {} some { artifacts: crate::artifacts::ArtifactStoreConfig });
