//! `GET /healthz` and `GET /readyz` beside `/mcp`, for an orchestrator's
//! probes (a Kubernetes Deployment's liveness and readiness): no token and
//! no MCP, and nothing they answer changes state or names more than the
//! backends' names.
//!
//! - `/healthz`: 200 while the process serves HTTP.
//! - `/readyz`: 200 while the server admits calls and at least one backend
//!   is available (each backend's own cached check), else 503; the body
//!   says which backends are available, and which replica answered
//!   ([`ServeConfig::replica`](super::ServeConfig::replica)). A check that takes over 5 s (a
//!   first container or pod probe) answers 503 "checking" and goes on in
//!   the background, so the next probe finds it cached.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::routing::get;
use serde_json::{Value, json};

use super::shared::Shared;

/// Longest a readiness answer waits for the backends' checks.
const READY_WAIT: Duration = Duration::from_secs(5);

/// The two routes, on `shared`.
pub(super) fn routes(shared: Arc<Shared>) -> axum::Router {
    axum::Router::new().route("/healthz", get(healthz)).route("/readyz", get(readyz)).with_state(shared)
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// A JSON answer (axum's `json` feature is not compiled in).
type Answer = (StatusCode, [(header::HeaderName, &'static str); 1], String);

fn answer(status: StatusCode, body: Value) -> Answer {
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string())
}

async fn readyz(State(shared): State<Arc<Shared>>) -> Answer {
    if shared.gate.is_closed() {
        return answer(StatusCode::SERVICE_UNAVAILABLE, json!({"ready": false, "why": "shutting down"}));
    }
    let exec = shared.exec.clone();
    let checks = tokio::task::spawn_blocking(move || {
        exec.backends().filter(|b| b.availability().is_ok()).map(|b| b.name().to_string()).collect::<Vec<_>>()
    });
    match tokio::time::timeout(READY_WAIT, checks).await {
        Ok(Ok(available)) if !available.is_empty() => {
            answer(StatusCode::OK, json!({"ready": true, "available": available, "replica": shared.cfg.replica}))
        }
        Ok(Ok(_)) => answer(StatusCode::SERVICE_UNAVAILABLE, json!({"ready": false, "why": "no backend is available"})),
        Ok(Err(_)) => answer(StatusCode::SERVICE_UNAVAILABLE, json!({"ready": false, "why": "the check failed"})),
        Err(_) => answer(StatusCode::SERVICE_UNAVAILABLE, json!({"ready": false, "why": "checking"})),
    }
}
