//! `execbox serve`: the backend matrix as an MCP server, over stdio or
//! streamable HTTP, so agents in any language get the warm pools and
//! sessions of one long-lived process.
//!
//! - **Tools**: `run_code`, `list_backends`, `create_session`,
//!   `close_session` (see [`tools`]).
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
//!   are killed and containers and staging directories are removed.

mod gate;
// MCP logging notifications are what clients use for output today; rmcp
// marks them deprecated for a later protocol revision (SEP-2577).
#[allow(deprecated)]
mod stream;
#[allow(deprecated)]
pub mod tools;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::defaults::BackendsConfig;
use crate::error::ExecError;
use crate::executor::Executor;
use crate::policy::SandboxPolicy;
use crate::sessions::registry::{SessionConfig, Sessions};

pub use gate::SERVER;
pub use tools::ExecboxMcp;

/// How `execbox serve` runs. `Default`: the strict policy as the ceiling,
/// 4 runs at once per core, 64 waiting, the default session bounds and
/// backends.
#[derive(Clone, Debug)]
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
        }
    }
}

/// What the tools share across connections.
pub(crate) struct Shared {
    pub exec: Executor,
    pub cfg: ServeConfig,
    pub gate: gate::Gate,
    pub sessions: Sessions,
    pub next_connection: AtomicU64,
}

/// The server's state: the matrix (prepared in the background), the gate
/// and the session registry. Build once, then serve one or more transports.
#[derive(Clone)]
pub struct Server {
    shared: Arc<Shared>,
}

/// The ceiling and load settings as `list_backends` reports them.
#[derive(Serialize, Deserialize)]
pub(crate) struct Limits {
    pub ceiling: SandboxPolicy,
    pub max_concurrent: usize,
    pub max_queued: usize,
    pub running: usize,
}

impl Server {
    /// Builds the matrix from `cfg` (an error only for settings that cannot
    /// be honoured) and starts preparing every backend in the background:
    /// JS workers, the warm Python pool, interpreter modules.
    pub fn new(cfg: ServeConfig) -> Result<Self, ExecError> {
        let exec = Executor::builder().default_backends(&cfg.backends)?.ceiling(cfg.policy.clone()).build();
        exec.prepare_all();
        let sessions = Sessions::for_executor(cfg.sessions.clone(), &exec);
        let gate = gate::Gate::new(cfg.max_concurrent, cfg.max_queued);
        Ok(Self { shared: Arc::new(Shared { exec, cfg, gate, sessions, next_connection: AtomicU64::new(1) }) })
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
        let stdout = Watched { inner: tokio::io::stdout(), stall: stalled.clone() };
        let stdin = Paced { inner: tokio::io::stdin(), stall: stalled.clone() };
        let running = self
            .handler()
            .serve((stdin, stdout))
            .await
            .map_err(|e| std::io::Error::other(format!("MCP handshake on stdio failed: {e}")))?;
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
    /// cancelled. With `token`, every request must carry `Authorization:
    /// Bearer <token>` (else 401). Refuses (`InvalidInput`) to bind a
    /// non-loopback address without a token.
    pub async fn serve_http(
        &self,
        addr: SocketAddr,
        token: Option<String>,
        stop: CancellationToken,
        bound: impl FnOnce(SocketAddr),
    ) -> std::io::Result<()> {
        use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
        use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
        if !addr.ip().is_loopback() && token.is_none() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "refusing to serve {addr} without --token-file: only loopback addresses may go without a bearer token"
                ),
            ));
        }
        let server = self.clone();
        let config = StreamableHttpServerConfig::default()
            .with_cancellation_token(stop.child_token())
            // The bearer token (or loopback) is the access control; hosts
            // are not checked, so clients may use any name for this address.
            .disable_allowed_hosts();
        let mut manager = LocalSessionManager::default();
        // An MCP session unused this long goes, with the execbox sessions it opened.
        manager.session_config.keep_alive = Some(self.shared.cfg.sessions.idle_timeout);
        let manager = Arc::new(manager);
        let service = StreamableHttpService::new(move || Ok(server.handler()), manager.clone(), config);
        let limits = Arc::new(HttpLimits {
            requests: tokio::sync::Semaphore::new(MAX_HTTP_REQUESTS),
            max_sessions: MAX_HTTP_SESSIONS,
            manager,
        });
        let mut router = axum::Router::new()
            .nest_service("/mcp", service)
            .layer(axum::middleware::from_fn(move |req, next| admit(limits.clone(), req, next)));
        if let Some(token) = token {
            let token = Arc::new(token);
            // Outermost: nothing is looked at before the token.
            router = router.layer(axum::middleware::from_fn(move |req, next| bearer(token.clone(), req, next)));
        }
        let listener = tokio::net::TcpListener::bind(addr).await?;
        bound(listener.local_addr()?);
        let shutdown = stop.clone();
        axum::serve(listener, router).with_graceful_shutdown(async move { shutdown.cancelled().await }).await?;
        self.drain().await;
        Ok(())
    }

    /// Refuses new calls, waits for runs in flight (no longer than the
    /// latest deadline in flight plus the kill grace), then kills every
    /// session (also one whose call is still running) and removes what the
    /// backends started outside this process (containers, staging
    /// directories).
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
    }
}

/// How long stdout may stay unwritable (the client reads nothing) before the
/// client is disconnected.
const WRITE_STALL_LIMIT: Duration = Duration::from_secs(10);

/// Since when writes have been blocked (ms since `epoch`; 0: not blocked).
/// While they are, no request is read (backpressure: a client that stops
/// reading answers stops being read, so nothing queues without bound).
#[derive(Default)]
struct Stall {
    since_ms: std::sync::atomic::AtomicU64,
    epoch: std::sync::OnceLock<std::time::Instant>,
    /// The reader waiting for writes to move.
    reader: parking_lot::Mutex<Option<std::task::Waker>>,
}

impl Stall {
    fn now_ms(&self) -> u64 {
        self.epoch.get_or_init(std::time::Instant::now).elapsed().as_millis() as u64 + 1
    }

    fn blocked(&self) {
        let now = self.now_ms();
        let _ = self.since_ms.compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst);
    }

    fn moved(&self) {
        if self.since_ms.swap(0, Ordering::SeqCst) != 0
            && let Some(waker) = self.reader.lock().take()
        {
            waker.wake();
        }
    }

    /// Records what a write or flush returned, and returns it.
    fn note<T>(&self, polled: std::task::Poll<T>) -> std::task::Poll<T> {
        match polled {
            std::task::Poll::Pending => self.blocked(),
            std::task::Poll::Ready(_) => self.moved(),
        }
        polled
    }

    fn is_blocked(&self) -> bool {
        self.since_ms.load(Ordering::SeqCst) != 0
    }

    fn stalled_for(&self) -> Duration {
        match self.since_ms.load(Ordering::SeqCst) {
            0 => Duration::ZERO,
            since => Duration::from_millis(self.now_ms().saturating_sub(since)),
        }
    }
}

/// A reader that reads nothing while the writer is blocked (see [`Stall`]).
struct Paced<R> {
    inner: R,
    stall: Arc<Stall>,
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Paced<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.stall.is_blocked() {
            *self.stall.reader.lock() = Some(cx.waker().clone());
            // Moved meanwhile: its wake-up may have missed the waker.
            if self.stall.is_blocked() {
                return std::task::Poll::Pending;
            }
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

/// A writer that records when it is blocked (see [`Stall`]).
struct Watched<W> {
    inner: W,
    stall: Arc<Stall>,
}

impl<W: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Watched<W> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        self.stall.note(polled)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_flush(cx);
        self.stall.note(polled)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// HTTP requests handled at once; more get 503 at once.
const MAX_HTTP_REQUESTS: usize = 256;

/// MCP sessions (HTTP clients) at once; another `initialize` gets 503.
const MAX_HTTP_SESSIONS: usize = 256;

struct HttpLimits {
    requests: tokio::sync::Semaphore,
    max_sessions: usize,
    manager: Arc<rmcp::transport::streamable_http_server::session::local::LocalSessionManager>,
}

/// Bounds what HTTP clients can hold: requests in flight and MCP sessions.
async fn admit(
    limits: Arc<HttpLimits>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let unavailable = |why: &'static str| (axum::http::StatusCode::SERVICE_UNAVAILABLE, why).into_response();
    let Ok(_permit) = limits.requests.try_acquire() else {
        return unavailable("too many requests at once");
    };
    let opens_session =
        request.method() == axum::http::Method::POST && !request.headers().contains_key("mcp-session-id");
    if opens_session && limits.manager.sessions.read().await.len() >= limits.max_sessions {
        return unavailable("too many MCP sessions; close one (DELETE) or wait for one to expire");
    }
    next.run(request).await
}

/// Lets a request through only with the right bearer token.
async fn bearer(
    token: Arc<String>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let given = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(given) if same(given.as_bytes(), token.as_bytes()) => next.run(request).await,
        _ => (axum::http::StatusCode::UNAUTHORIZED, [(axum::http::header::WWW_AUTHENTICATE, "Bearer")], "unauthorized")
            .into_response(),
    }
}

/// Compares in time independent of where the bytes differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
