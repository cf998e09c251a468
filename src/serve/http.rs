//! The HTTP transport's guards: the bearer token, and bounds on requests
//! in flight and MCP sessions.

use std::sync::Arc;

/// HTTP requests handled at once; more get 503 at once.
pub(super) const MAX_HTTP_REQUESTS: usize = 256;

/// MCP sessions (HTTP clients) at once; another `initialize` gets 503.
pub(super) const MAX_HTTP_SESSIONS: usize = 256;

pub(super) struct HttpLimits {
    pub(super) requests: tokio::sync::Semaphore,
    pub(super) max_sessions: usize,
    pub(super) manager: Arc<rmcp::transport::streamable_http_server::session::local::LocalSessionManager>,
}

/// Bounds what HTTP clients can hold: requests in flight and MCP sessions.
pub(super) async fn admit(
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
    let deletes = request.method() == axum::http::Method::DELETE;
    let mut response = next.run(request).await;
    // rmcp answers a session's DELETE with 202; the session is closed by
    // then, and clients (the Python SDK) expect 200 or 204 for it.
    if deletes && response.status() == axum::http::StatusCode::ACCEPTED {
        *response.status_mut() = axum::http::StatusCode::NO_CONTENT;
    }
    response
}

/// Lets a request through only with the right bearer token.
pub(super) async fn bearer(
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
