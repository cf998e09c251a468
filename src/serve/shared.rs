//! What the tools of every connection share: the matrix, the gate, the
//! session registry, and the limits `list_backends` reports.

use std::sync::atomic::AtomicU64;

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
    /// The artifact store, when the server keeps artifacts.
    #[cfg(feature = "artifacts")]
    pub artifacts: Option<ServeArtifacts>,
}

/// The server's artifact store and the prefix of its scopes.
#[cfg(feature = "artifacts")]
pub(crate) struct ServeArtifacts {
    pub store: crate::artifacts::store::ArtifactStore,
    /// `mcp:<random>`: this server process's scopes, apart from any other's
    /// (connection numbers start again at 1 in every process).
    pub prefix: String,
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
            #[cfg(feature = "artifacts")]
            artifacts: None,
            cfg,
        };
        assert_eq!(shared.run_timeout_ms(None), 300_000, "the container-like default, not 30 s");
        assert_eq!(shared.run_timeout_ms(Some(5)), 5);
    }
}
