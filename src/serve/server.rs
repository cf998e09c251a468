//! [`Server`]: the matrix, the gate and the session registry, served over
//! stdio or streamable HTTP, and drained at shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::config::ServeConfig;
use super::gate::Gate;
use super::http::{HttpAccess, HttpLimits, MAX_HTTP_REQUESTS, MAX_HTTP_SESSIONS, admit, bearer};
use super::shared::{Connections, Shared, UpstreamStatus};
use super::stdio::{Paced, Stall, WRITE_STALL_LIMIT, Watched};
use super::tools::ExecboxMcp;
use crate::error::ConfigError;
use crate::executor::Executor;
use crate::sessions::registry::Sessions;
use crate::tools::ToolRegistry;

/// How long the drain removes the artifact scopes left and waits for
/// ended connections' cleanups: room for about 50,000 version files at
/// the ~0.2 ms each measured for a sweep (docs/code-mode.md, "Artifacts");
/// a larger store is finished by the next store's sweep.
pub(crate) const CLEANUP_LIMIT: Duration = Duration::from_secs(10);

/// How long the last answers of calls in flight get to reach their HTTP
/// streams at shutdown, once the calls are over.
const ANSWER_FLUSH: Duration = Duration::from_millis(100);

/// The server's state: the matrix (prepared in the background), the gate
/// and the session registry. Build once, then serve one or more transports.
#[derive(Clone)]
pub struct Server {
    shared: Arc<Shared>,
}

impl Server {
    /// Builds the matrix from `cfg` (an error only for settings that cannot
    /// be honoured) and starts preparing every backend in the background:
    /// JS workers, the warm Python pool, interpreter modules.
    /// Upstream MCP servers that cannot be reached are left out, each with
    /// a warning, and shown in `list_backends`.
    pub fn new(cfg: ServeConfig) -> Result<Self, ConfigError> {
        let (tools, upstreams, connections) = connect_tools(&cfg)?;
        // Code in a workspace may start programs there (when granted `workspace.*`).
        let tools = tools
            .merged(&crate::program_tools::workspace_tools_with(cfg.program_lifetime))
            .map_err(|e| ConfigError::invalid("ServeConfig::upstreams", e.to_string()))?;
        #[cfg_attr(not(feature = "artifacts"), allow(unused_mut))]
        let mut builder = Executor::builder().default_backends(&cfg.backends)?.ceiling(cfg.policy.clone());
        #[cfg(feature = "artifacts")]
        let (tools, artifacts) = match cfg.artifacts.clone() {
            Some(config) => {
                let store = crate::artifacts::store::ArtifactStore::new(config)?;
                let tools = tools
                    .merged(&store.tools())
                    .map_err(|e| ConfigError::invalid("ServeConfig::artifacts", e.to_string()))?;
                builder = builder.artifacts(store.clone());
                let prefix = format!("mcp:{}", crate::nonce::hex128());
                // Scopes `<prefix>:<connection>…`: this process's, removed
                // when their connection ends or at the drain, and by a later
                // store if this process dies first.
                store.own_scopes(format!("{prefix}:"));
                (tools, Some(super::shared::ServeArtifacts { store, prefix }))
            }
            None => (tools, None),
        };
        let exec = builder.tools(tools).build();
        exec.prepare_all();
        let sessions = Sessions::for_executor(cfg.sessions.clone(), &exec);
        let gate = Gate::new(cfg.max_concurrent, cfg.max_queued);
        let shared = Shared {
            exec,
            cfg,
            gate,
            sessions,
            next_connection: AtomicU64::new(1),
            upstreams,
            _connections: connections,
            cleanups: Default::default(),
            #[cfg(feature = "artifacts")]
            artifacts,
            workspaces_live: Default::default(),
        };
        Ok(Self { shared: Arc::new(shared) })
    }

    /// The executor behind the tools.
    pub fn executor(&self) -> &Executor {
        &self.shared.exec
    }

    /// A handler for one MCP connection.
    pub fn handler(&self) -> ExecboxMcp {
        ExecboxMcp::new(self.shared.clone())
    }

    /// Serves one client over this process's stdin and stdout until stdin
    /// ends or `stop` is cancelled; then drains (see [`Server::drain`]).
    pub async fn serve_stdio(&self, stop: CancellationToken) -> std::io::Result<()> {
        use rmcp::ServiceExt;
        let stalled = Arc::new(Stall::default());
        let stdout = super::stdio_io::ServerStdout::new();
        let stdin = Paced { inner: super::stdio_io::ServerStdin::new(&stdout), stall: stalled.clone() };
        let stdout = Watched { inner: stdout, stall: stalled.clone() };
        // A signal before the client's `initialize` ends the server too.
        let running = tokio::select! {
            running = self.handler().serve((stdin, stdout)) => {
                running.map_err(|e| std::io::Error::other(format!("MCP handshake on stdio failed: {e}")))?
            }
            _ = stop.cancelled() => {
                self.drain().await;
                return Ok(());
            }
        };
        let cancel = running.cancellation_token();
        let waiting = running.waiting();
        tokio::pin!(waiting);
        let stuck = stalled.clone();
        let unread = async move {
            // A client that stops reading would make the server queue
            // answers without bound: it is disconnected instead.
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if stuck.stalled_for() > WRITE_STALL_LIMIT {
                    return;
                }
            }
        };
        tokio::select! {
            _ = &mut waiting => {}
            _ = unread => {
                tracing::warn!("the client read nothing for {WRITE_STALL_LIMIT:?}: disconnecting it");
                cancel.cancel();
                let _ = tokio::time::timeout(Duration::from_secs(2), &mut waiting).await;
            }
            _ = stop.cancelled() => {
                // Let in-flight calls answer before the transport closes.
                self.drain().await;
                cancel.cancel();
                // Answers a client does not read cannot hold the exit up.
                let _ = tokio::time::timeout(Duration::from_secs(2), &mut waiting).await;
            }
        }
        self.drain().await;
        Ok(())
    }

    /// Serves streamable HTTP at `http://addr/mcp` until `stop` is
    /// cancelled, to the clients `access` lets in (see [`HttpAccess`]:
    /// loopback `Host` and `Origin` names by default, 403 for others; with
    /// a token, every request must carry it, else 401). Refuses
    /// (`InvalidInput`) settings [`HttpAccess::check`] refuses, such as a
    /// non-loopback address without a token.
    pub async fn serve_http(
        &self,
        addr: SocketAddr,
        access: HttpAccess,
        stop: CancellationToken,
        bound: impl FnOnce(SocketAddr),
    ) -> std::io::Result<()> {
        use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
        use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
        access.check(addr).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
        // What ends the MCP sessions and their streams: `stop`, once the
        // calls in flight have answered on them.
        let transport = CancellationToken::new();
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        let server = self.clone();
        // DNS-rebinding protection: rmcp checks `Host` and `Origin` before
        // it reads a request (403 otherwise).
        let mut config = StreamableHttpServerConfig::default()
            // Cancelled only once the calls in flight have answered (below).
            .with_cancellation_token(transport.clone())
            .with_allowed_hosts(access.hosts_for(local));
        config = match access.origins() {
            Some(origins) => config.with_allowed_origins(origins).enforce_origin_validation(),
            None => config.disable_allowed_origins(),
        };
        let mut manager = LocalSessionManager::default();
        // An MCP session unused this long goes, with the execbox sessions it opened.
        manager.session_config.keep_alive = Some(self.shared.cfg.sessions.idle_timeout);
        let manager = Arc::new(manager);
        let service = StreamableHttpService::new(move || Ok(server.handler()), manager.clone(), config);
        let limits = Arc::new(HttpLimits {
            requests: tokio::sync::Semaphore::new(MAX_HTTP_REQUESTS),
            max_sessions: MAX_HTTP_SESSIONS,
            manager,
            replica: self.shared.cfg.replica.clone(),
        });
        let mut router = axum::Router::new()
            .nest_service("/mcp", service)
            .layer(axum::middleware::from_fn(move |req, next| admit(limits.clone(), req, next)));
        if let Some(token) = access.token {
            let token = Arc::new(token);
            // Outermost: nothing is looked at before the token.
            router = router.layer(axum::middleware::from_fn(move |req, next| bearer(token.clone(), req, next)));
        }
        // After the token layer: orchestrators' probes carry none.
        let router = router.merge(super::health::routes(self.shared.clone()));
        bound(local);
        // Answers go out in several small writes: without TCP_NODELAY,
        // Nagle's algorithm meets the client's delayed ACK and each
        // round trip waits ~40 ms.
        use axum::serve::ListenerExt as _;
        let listener = listener.tap_io(|stream| {
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!("cannot set TCP_NODELAY on a connection: {e}");
            }
        });
        let shared = self.shared.clone();
        let shutdown = async move {
            stop.cancelled().await;
            // New calls get `busy`; those in flight run to their end (within
            // their deadlines) and answer on their streams before the
            // sessions end: a client whose call was running gets its result,
            // not an ended stream.
            shared.gate.close();
            if !shared.gate.drained().await {
                tracing::warn!(running = shared.gate.active(), "runs still in flight at shutdown");
            }
            // A deliberate delay, not synchronisation: the last answers
            // cross from the handler to their streams (in-process, well
            // under a millisecond) before the streams end.
            tokio::time::sleep(ANSWER_FLUSH).await;
            transport.cancel();
        };
        axum::serve(listener, router).with_graceful_shutdown(shutdown).await?;
        self.drain().await;
        Ok(())
    }

    /// Refuses new calls, waits for runs in flight (no longer than the
    /// latest deadline in flight plus the kill grace), then kills every
    /// session (also one whose call is still running) and removes what the
    /// backends started outside this process (containers, staging
    /// directories). Last, it removes the artifact scopes of every
    /// connection (ended or still open) and waits for the cleanups of
    /// connections that ended, within 10 s (`CLEANUP_LIMIT`): what is left
    /// then is reclaimed by the next store opened on the directory, as
    /// after a crash.
    pub async fn drain(&self) {
        let shared = &self.shared;
        shared.gate.close();
        if !shared.gate.drained().await {
            tracing::warn!(running = shared.gate.active(), "runs still in flight at shutdown");
        }
        let sessions = shared.sessions.clone();
        let exec = shared.exec.clone();
        let _ = tokio::task::spawn_blocking(move || {
            sessions.close_all();
            exec.shutdown();
        })
        .await;
        // File work: off the async threads, and bounded.
        let this = shared.clone();
        let cleaned = tokio::task::spawn_blocking(move || {
            // Every connection's scopes, ended or not (runs are over): in
            // turns with the removals of the cleanups running.
            #[cfg(feature = "artifacts")]
            if let Some(artifacts) = &this.artifacts {
                artifacts.store.remove_owned_scopes(&format!("{}:", artifacts.prefix));
            }
            this.cleanups.wait(CLEANUP_LIMIT)
        });
        match tokio::time::timeout(CLEANUP_LIMIT, cleaned).await {
            Ok(Ok(true)) => {}
            _ => tracing::warn!("connections' cleanups still running at exit: a later store sweeps what they leave"),
        }
    }
}

/// The configured tools and the upstream servers' together, how each
/// upstream fared, and the connections.
fn connect_tools(cfg: &ServeConfig) -> Result<(ToolRegistry, Vec<UpstreamStatus>, Connections), ConfigError> {
    #[cfg(feature = "upstream")]
    {
        let (upstreams, errors) = crate::tools::Upstreams::connect(&cfg.upstreams);
        let mut status: Vec<UpstreamStatus> = upstreams
            .servers()
            .into_iter()
            .map(|name| UpstreamStatus { name: name.to_string(), connected: true, reason: None })
            .collect();
        for error in errors {
            tracing::warn!(upstream = %error.server, reason = %error.explain(), "upstream MCP server left out");
            status.push(UpstreamStatus { reason: Some(error.explain()), name: error.server, connected: false });
        }
        let theirs = upstreams.registry().map_err(|e| ConfigError::invalid("ServeConfig::upstreams", e.to_string()))?;
        let tools =
            cfg.tools.merged(&theirs).map_err(|e| ConfigError::invalid("ServeConfig::upstreams", e.to_string()))?;
        // The connections live as long as the server.
        Ok((tools, status, Some(Box::new(upstreams))))
    }
    #[cfg(not(feature = "upstream"))]
    {
        Ok((cfg.tools.clone(), Vec::new(), None))
    }
}
