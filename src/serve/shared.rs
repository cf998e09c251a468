//! What the tools of every connection share: the matrix, the gate, the
//! session registry, and the limits `list_backends` reports.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::config::ServeConfig;
use super::gate::Gate;
use crate::executor::Executor;
use crate::policy::SandboxPolicy;
use crate::sessions::registry::Sessions;

/// What the tools share across connections.
pub(crate) struct Shared {
    pub exec: Executor,
    pub cfg: ServeConfig,
    pub gate: Gate,
    pub sessions: Sessions,
    pub next_connection: AtomicU64,
    /// The upstream MCP servers and whether they connected.
    pub upstreams: Vec<UpstreamStatus>,
    /// Keeps the upstream connections open.
    pub _connections: Connections,
    /// Ended connections' cleanups still running (the drain waits for them).
    pub cleanups: Arc<Cleanups>,
    /// The artifact store, when the server keeps artifacts.
    #[cfg(feature = "artifacts")]
    pub artifacts: Option<ServeArtifacts>,
    /// Workspaces live across all connections (at most
    /// [`ServeConfig::max_workspaces`]: each may hold its quota in memory).
    pub workspaces_live: Arc<std::sync::atomic::AtomicUsize>,
}

/// One of the server's workspace slots, given back when dropped (with the
/// workspace it was taken for: closed, or its connection ended).
pub(crate) struct WorkspaceSlot(Arc<std::sync::atomic::AtomicUsize>);

/// A workspace a connection holds: its slot, when it was made and last
/// used (for its idle timeout and its lifetime), and the sessions opened in
/// it (closed with it).
pub(crate) struct HeldWorkspace {
    pub workspace: crate::workspace::Workspace,
    pub _slot: WorkspaceSlot,
    pub created: std::time::Instant,
    pub last_used: std::time::Instant,
    /// The ids (the connection's) of the sessions opened in it.
    pub sessions: Vec<String>,
    /// Packages every Python or shell run, session and program in it
    /// declares (from `create_workspace {packages}`).
    pub packages: Vec<String>,
}

impl Drop for WorkspaceSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The server's artifact store and the prefix of its scopes.
#[cfg(feature = "artifacts")]
pub(crate) struct ServeArtifacts {
    pub store: crate::artifacts::store::ArtifactStore,
    /// `mcp:<random>`: this server process's scopes, apart from any other's
    /// (connection numbers start again at 1 in every process). The store
    /// knows them as this process's own
    /// ([`ArtifactStore::own_scopes`](crate::artifacts::ArtifactStore::own_scopes)),
    /// so a later store reclaims what a killed server left.
    pub prefix: String,
}

/// Cleanups of ended connections (closing their sessions, removing their
/// artifact scopes), each on a thread of its own because it blocks; the
/// drain waits for them so that the process does not exit half-way through
/// one.
#[derive(Default)]
pub(crate) struct Cleanups {
    running: parking_lot::Mutex<usize>,
    finished: parking_lot::Condvar,
}

impl Cleanups {
    /// Runs `work` on a thread of its own, counted until it ends (or
    /// panics). If no thread can start, it is logged and left to the drain
    /// (which closes every session and removes every scope the server owns)
    /// or, after a crash, to the next store's sweep.
    pub fn spawn(self: &Arc<Self>, work: impl FnOnce() + Send + 'static) {
        /// Uncounts its cleanup when dropped: at its end, or with the
        /// closure of a thread that did not start.
        struct Counted(Arc<Cleanups>);
        impl Drop for Counted {
            fn drop(&mut self) {
                *self.0.running.lock() -= 1;
                self.0.finished.notify_all();
            }
        }
        *self.running.lock() += 1;
        let counted = Counted(self.clone());
        let started = std::thread::Builder::new().name("execbox-cleanup".into()).spawn(move || {
            let _counted = counted;
            work();
        });
        if let Err(e) = started {
            tracing::warn!(error = %e, "cannot start an ended connection's cleanup");
        }
    }

    /// Waits (blocking) until no cleanup runs, for at most `limit`; whether
    /// none does.
    pub fn wait(&self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        let mut running = self.running.lock();
        while *running > 0 {
            if self.finished.wait_until(&mut running, until).timed_out() {
                return *running == 0;
            }
        }
        true
    }
}

/// What keeps the upstream connections open (dropped with the server).
pub(crate) type Connections = Option<Box<dyn std::any::Any + Send + Sync>>;

/// An upstream MCP server as `list_backends` reports it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct UpstreamStatus {
    pub name: String,
    pub connected: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Shared {
    /// A workspace slot, if fewer than the configured most are live.
    pub fn take_workspace_slot(&self) -> Option<WorkspaceSlot> {
        use std::sync::atomic::Ordering::SeqCst;
        let most = self.cfg.max_workspaces;
        let taken = self.workspaces_live.fetch_update(SeqCst, SeqCst, |n| (n < most).then_some(n + 1));
        taken.ok().map(|_| WorkspaceSlot(self.workspaces_live.clone()))
    }

    /// The specs of the tools the server's policy grants, sorted by name.
    pub fn granted_tools(&self) -> Vec<std::sync::Arc<crate::tools::ToolSpec>> {
        let (Some(registry), Some(grants)) = (self.exec.tools(), self.cfg.policy.tool_grants()) else {
            return Vec::new();
        };
        registry.tools().filter(|t| crate::tools::granted(grants, &t.spec.name)).map(|t| t.spec.clone()).collect()
    }

    /// The deadline a call will run under, in ms: what it asks, held to the
    /// ceiling's; with neither, the longest default of any backend (a
    /// ceiling without a timeout lets each backend use its own).
    pub fn run_timeout_ms(&self, asked: Option<u64>) -> u64 {
        match (asked, self.cfg.policy.timeout_ms) {
            (Some(a), Some(c)) => a.min(c),
            (a, c) => a.or(c).unwrap_or_else(|| {
                self.exec.backends().map(|b| b.capabilities().default_timeout_ms).max().unwrap_or(30_000)
            }),
        }
    }
}

/// The ceiling and load settings as `list_backends` reports them.
#[derive(Serialize, Deserialize)]
pub(crate) struct Limits {
    pub ceiling: SandboxPolicy,
    pub max_concurrent: usize,
    pub max_queued: usize,
    pub running: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::Admitted;
    use crate::backend::Backend;
    use crate::capabilities::BackendCapabilities;
    use crate::error::ExecError;
    use crate::result::ExecResult;

    /// A backend that only declares a default deadline.
    struct Slow(BackendCapabilities);

    impl Backend for Slow {
        fn name(&self) -> &str {
            "slow"
        }
        fn capabilities(&self) -> &BackendCapabilities {
            &self.0
        }
        fn execute(&self, _call: Admitted) -> Result<ExecResult, ExecError> {
            Err(ExecError::internal("slow", "not run in this test"))
        }
    }

    #[test]
    fn without_a_ceiling_timeout_a_call_is_bounded_by_the_longest_backend_default() {
        let mut caps = BackendCapabilities::test_fixture();
        caps.default_timeout_ms = 300_000;
        let exec = Executor::builder().backend(Slow(caps)).build();
        let cfg = ServeConfig::default().policy(SandboxPolicy { timeout_ms: None, ..SandboxPolicy::strict() });
        let shared = Shared {
            exec,
            gate: Gate::new(1, 1),
            sessions: Sessions::builder().build(),
            next_connection: AtomicU64::new(1),
            upstreams: Vec::new(),
            _connections: None,
            cleanups: Default::default(),
            #[cfg(feature = "artifacts")]
            artifacts: None,
            workspaces_live: Default::default(),
            cfg,
        };
        assert_eq!(shared.run_timeout_ms(None), 300_000, "the container-like default, not 30 s");
        assert_eq!(shared.run_timeout_ms(Some(5)), 5);
    }
}
