//! The HTTP transport's guards: which `Host` and `Origin` a request may
//! carry (DNS-rebinding protection), the bearer token, and bounds on
//! requests in flight and MCP sessions.
//!
//! A web page in the user's browser can point a name it controls at
//! 127.0.0.1 and then drive a loopback server with the browser's requests.
//! Such a request carries the attacker's name in `Host` and, from a page,
//! the page's `Origin`, so both are checked before anything else looks at
//! the request (rmcp's own check, configured from [`HttpAccess`]): a `Host`
//! must be a loopback name with the bound port or a name the operator
//! allowed, and a present `Origin` must be a loopback origin (any port: the
//! MCP Inspector and local tools run in a browser there) or an allowed one.
//! Anything else gets 403 and runs nothing, with or without a token: a
//! token is no defence against a page that was given it.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::error::ConfigError;

/// Who may reach `execbox serve` over HTTP: the bearer token, and the
/// names a request's `Host` and `Origin` may carry beyond loopback's.
///
/// # Default
/// No token, loopback names only (`localhost`, `127.0.0.1`, `[::1]` with
/// the bound port in `Host`; `http(s)://` those names at any port in
/// `Origin`; a request without `Origin`, as every non-browser client sends,
/// passes).
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct HttpAccess {
    /// The bearer token every request must carry (`Authorization: Bearer
    /// <token>`, else 401, compared in constant time). Required to bind an
    /// address other than loopback, and to allow `*` below.
    ///
    /// # Default
    /// None.
    pub token: Option<String>,
    /// More names a `Host` header may carry: `name` (any port) or
    /// `name:port`, e.g. the name a reverse proxy or a Kubernetes Service
    /// forwards. `*` turns the `Host` check off (only with a token).
    ///
    /// # Default
    /// None.
    pub allowed_hosts: Vec<String>,
    /// More origins a browser's `Origin` header may carry:
    /// `scheme://host:port`, `scheme://host:*` (any port) or `null` (only
    /// with a token: any page can send it from a sandboxed frame). `*`
    /// turns the `Origin` check off (only with a token).
    ///
    /// # Default
    /// None.
    pub allowed_origins: Vec<String>,
}

crate::config::setters!(HttpAccess { allowed_hosts: Vec<String>, allowed_origins: Vec<String> } some { token: String });

/// The loopback names a `Host` header may carry without being allowed.
const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// "Any", in an allow-list.
const ANY: &str = "*";

impl HttpAccess {
    /// Checks that these settings may serve `addr`: a token for an address
    /// other than loopback and for `*`, and entries rmcp can parse.
    pub fn check(&self, addr: SocketAddr) -> Result<(), ConfigError> {
        if self.token.is_some() {
            // fall through to the entry checks
        } else if !addr.ip().is_loopback() {
            return Err(ConfigError::invalid(
                "HttpAccess::token",
                format!(
                    "refusing to serve {addr} without a token: only loopback addresses may go without a bearer token"
                ),
            ));
        } else if self.allowed_hosts.iter().any(|h| h == ANY) {
            return Err(ConfigError::invalid(
                "HttpAccess::allowed_hosts",
                "`*` needs a token: it lets any web page's rebound name in",
            ));
        } else if self.allowed_origins.iter().any(|o| o == ANY) {
            return Err(ConfigError::invalid(
                "HttpAccess::allowed_origins",
                "`*` needs a token: it lets any web page in",
            ));
        } else if self.allowed_origins.iter().any(|o| o == "null") {
            // Any page can send `Origin: null` from a sandboxed frame.
            return Err(ConfigError::invalid(
                "HttpAccess::allowed_origins",
                "`null` needs a token: any web page can send it from a sandboxed frame",
            ));
        }
        for host in self.allowed_hosts.iter().filter(|h| *h != ANY) {
            if host.is_empty()
                || host.contains(['/', '@', ' '])
                || axum::http::uri::Authority::try_from(host.as_str()).is_err()
            {
                return Err(ConfigError::invalid(
                    "HttpAccess::allowed_hosts",
                    format!("{host:?} is not a host name or host:port"),
                ));
            }
        }
        for origin in self.allowed_origins.iter().filter(|o| *o != ANY && *o != "null") {
            let base = origin.strip_suffix(":*").unwrap_or(origin);
            let parsed = axum::http::Uri::try_from(base).ok();
            let whole = parsed.as_ref().is_some_and(|u| {
                u.scheme().is_some()
                    && u.authority().is_some()
                    && u.path_and_query().is_none_or(|p| p.as_str() == "/" && !base.ends_with('/'))
            });
            if !whole {
                return Err(ConfigError::invalid(
                    "HttpAccess::allowed_origins",
                    format!("{origin:?} is not an origin (scheme://host, scheme://host:port or scheme://host:*)"),
                ));
            }
        }
        Ok(())
    }

    /// The `Host` values rmcp lets through for a server bound at `bound`:
    /// loopback names with its port, its own address, and the allowed
    /// ones; empty (no check) when `*` is allowed.
    pub(super) fn hosts_for(&self, bound: SocketAddr) -> Vec<String> {
        if self.allowed_hosts.iter().any(|h| h == ANY) {
            return Vec::new();
        }
        let port = bound.port();
        let mut hosts: Vec<String> = LOOPBACK_HOSTS.iter().map(|name| format!("{name}:{port}")).collect();
        if port == 80 {
            // Clients leave the default port out of `Host`.
            hosts.extend(LOOPBACK_HOSTS.iter().map(|name| name.to_string()));
        }
        if !bound.ip().is_unspecified() && !bound.ip().is_loopback() {
            hosts.push(bound.to_string());
        }
        hosts.extend(self.allowed_hosts.iter().cloned());
        hosts
    }

    /// The `Origin` values rmcp lets through: loopback origins at any
    /// port and the allowed ones; `None` (no check) when `*` is allowed.
    pub(super) fn origins(&self) -> Option<Vec<String>> {
        if self.allowed_origins.iter().any(|o| o == ANY) {
            return None;
        }
        let mut origins: Vec<String> = ["http", "https"]
            .iter()
            .flat_map(|scheme| LOOPBACK_HOSTS.iter().map(move |name| format!("{scheme}://{name}:*")))
            .collect();
        origins.extend(self.allowed_origins.iter().cloned());
        Some(origins)
    }
}

/// HTTP requests handled at once; more get 503 at once.
pub(super) const MAX_HTTP_REQUESTS: usize = 256;

/// MCP sessions (HTTP clients) at once; another `initialize` gets 503.
pub(super) const MAX_HTTP_SESSIONS: usize = 256;

pub(super) struct HttpLimits {
    pub(super) requests: tokio::sync::Semaphore,
    pub(super) max_sessions: usize,
    pub(super) manager: Arc<rmcp::transport::streamable_http_server::session::local::LocalSessionManager>,
    /// [`ServeConfig::replica`](super::ServeConfig::replica).
    pub(super) replica: Option<String>,
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
    // rmcp takes a session id that is not UTF-8 for none: such a POST may
    // open a session too, and counts against the bound.
    let opens_session = request.method() == axum::http::Method::POST
        && request.headers().get("mcp-session-id").is_none_or(|id| id.to_str().is_err());
    if opens_session && limits.manager.sessions.read().await.len() >= limits.max_sessions {
        return unavailable("too many MCP sessions; close one (DELETE) or wait for one to expire");
    }
    let deletes = request.method() == axum::http::Method::DELETE;
    let path = request.uri().path();
    let session = (path == "/mcp" || path.starts_with("/mcp/"))
        .then(|| request.headers().get("mcp-session-id"))
        .flatten()
        .map(|id| String::from_utf8_lossy(id.as_bytes()).into_owned());
    let mut response = next.run(request).await;
    if let Some(id) = session.filter(|_| response.status() == axum::http::StatusCode::NOT_FOUND) {
        return unknown_session(&id, limits.replica.as_deref());
    }
    // rmcp answers a session's DELETE with 202; the session is closed by
    // then, and clients (the Python SDK) expect 200 or 204 for it.
    if deletes && response.status() == axum::http::StatusCode::ACCEPTED {
        *response.status_mut() = axum::http::StatusCode::NO_CONTENT;
    }
    response
}

/// The answer to a request (POST or GET) naming an MCP session this
/// process does not hold (closed, expired, or opened on another replica;
/// rmcp answers a DELETE of one 202, as if closed): still the 404 the
/// MCP specification asks for, which tells a client to initialize again,
/// now with a JSON-RPC error that says so and names this replica.
fn unknown_session(id: &str, replica: Option<&str>) -> axum::response::Response {
    use axum::response::IntoResponse;
    let id: String = id.chars().take(64).collect();
    let mut message = format!(
        "unknown_session: MCP session {id:?} is not open here (closed, expired, or opened on another replica); \
         initialize a new session"
    );
    if let Some(replica) = replica {
        message.push_str(&format!("; replica {replica} answered"));
    }
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": -32001, "message": message, "data": {"kind": "unknown_session", "replica": replica}},
    });
    (axum::http::StatusCode::NOT_FOUND, [(axum::http::header::CONTENT_TYPE, "application/json")], body.to_string())
        .into_response()
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
        Some(given) if bool::from(subtle::ConstantTimeEq::ct_eq(given.as_bytes(), token.as_bytes())) => {
            next.run(request).await
        }
        _ => (axum::http::StatusCode::UNAUTHORIZED, [(axum::http::header::WWW_AUTHENTICATE, "Bearer")], "unauthorized")
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn loopback_names_with_the_bound_port_are_the_default_hosts() {
        let hosts = HttpAccess::default().hosts_for(addr("127.0.0.1:8931"));
        assert_eq!(hosts, ["localhost:8931", "127.0.0.1:8931", "[::1]:8931"]);
        let on_80 = HttpAccess::default().hosts_for(addr("127.0.0.1:80"));
        assert!(on_80.contains(&"localhost".to_string()), "the default port may be left out: {on_80:?}");
        let public = HttpAccess::default().token("t").hosts_for(addr("10.1.2.3:8931"));
        assert!(public.contains(&"10.1.2.3:8931".to_string()), "its own address: {public:?}");
        let any = HttpAccess::default().token("t").hosts_for(addr("0.0.0.0:8931"));
        assert!(!any.iter().any(|h| h.starts_with("0.0.0.0")), "not the unspecified address: {any:?}");
        let allowed = HttpAccess::default().allowed_hosts(vec!["proxy.example".into()]).hosts_for(addr("127.0.0.1:1"));
        assert!(allowed.contains(&"proxy.example".to_string()));
        let star = HttpAccess::default().token("t").allowed_hosts(vec!["*".into()]);
        assert!(star.hosts_for(addr("127.0.0.1:1")).is_empty(), "rmcp checks nothing for an empty list");
    }

    #[test]
    fn loopback_origins_at_any_port_are_the_default_origins() {
        let origins = HttpAccess::default().origins().unwrap();
        for origin in ["http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*", "https://localhost:*"] {
            assert!(origins.contains(&origin.to_string()), "{origin} in {origins:?}");
        }
        assert!(!origins.contains(&"null".to_string()), "a sandboxed frame or a file page is not loopback");
        let star = HttpAccess::default().token("t").allowed_origins(vec!["*".into()]);
        assert_eq!(star.origins(), None);
    }

    #[test]
    fn settings_that_would_let_any_page_in_are_refused() {
        let loopback = addr("127.0.0.1:8931");
        assert!(HttpAccess::default().check(loopback).is_ok());
        assert!(HttpAccess::default().check(addr("0.0.0.0:8931")).is_err(), "no token off loopback");
        assert!(HttpAccess::default().token("t").check(addr("0.0.0.0:8931")).is_ok());
        let star_host = HttpAccess::default().allowed_hosts(vec!["*".into()]);
        assert!(star_host.check(loopback).is_err(), "`*` without a token");
        assert!(star_host.clone().token("t").check(loopback).is_ok());
        let star_origin = HttpAccess::default().allowed_origins(vec!["*".into()]);
        assert!(star_origin.check(loopback).is_err(), "`*` without a token");
        for bad in ["", "a b", "http://x", "user@host"] {
            let access = HttpAccess::default().allowed_hosts(vec![bad.into()]);
            assert!(access.check(loopback).is_err(), "host {bad:?}");
        }
        for good in ["proxy.example", "proxy.example:8443", "[::1]:9"] {
            let access = HttpAccess::default().allowed_hosts(vec![good.into()]);
            assert!(access.check(loopback).is_ok(), "host {good:?}");
        }
        for bad in ["app.example", "http://app.example/path", "http://", "http://app.example/"] {
            let access = HttpAccess::default().allowed_origins(vec![bad.into()]);
            assert!(access.check(loopback).is_err(), "origin {bad:?}");
        }
        for good in ["http://app.example:3000", "https://app.example", "http://app.example:*"] {
            let access = HttpAccess::default().allowed_origins(vec![good.into()]);
            assert!(access.check(loopback).is_ok(), "origin {good:?}");
        }
        let null = HttpAccess::default().allowed_origins(vec!["null".into()]);
        assert!(null.check(loopback).is_err(), "`null` without a token: a sandboxed frame sends it");
        assert!(null.token("t").check(loopback).is_ok());
    }
}
