//! What execbox tells a `tracing` subscriber: one span per admitted run
//! (`execbox::run`), per session call (`execbox::session_call`) and per
//! refusal (`execbox::refused`), each ending with one INFO event that
//! carries the span's fields (a JSON log shows them on that line).
//!
//! Fields of a run: `backend`, `language`, `session` (the session's id, or
//! empty), `invocation` (the request's
//! [`invocation_id`](crate::request::ExecRequest::invocation_id), or
//! empty), `bytes_in` (code, stdin and input files), then `outcome`,
//! `duration_ms` and `bytes_out` (stdout, stderr and output files, as
//! written, kept or not). A refusal carries `language`, `kind` and
//! `violations` (how many unmet controls, all backends together).

use tracing::Span;
use tracing::field::Empty;

use crate::error::ExecError;
use crate::request::ExecRequest;
use crate::result::ExecResult;

/// The span of a run of `request` on `backend` (in session `session`).
pub(crate) fn run_span(backend: &str, request: &ExecRequest, session: Option<&str>) -> Span {
    let bytes_in = request.payload.len() as u64
        + request.stdin.as_ref().map_or(0, |s| s.len() as u64)
        + request.input_files.iter().map(|f| f.content.len() as u64).sum::<u64>();
    let name = if session.is_some() { "execbox::session_call" } else { "execbox::run" };
    tracing::info_span!(
        target: "execbox",
        "run",
        kind = name,
        backend,
        language = request.language.as_str(),
        session = session.unwrap_or(""),
        invocation = request.invocation_id.as_deref().unwrap_or(""),
        bytes_in,
        outcome = Empty,
        duration_ms = Empty,
        bytes_out = Empty,
    )
}

/// Records how the run of `span` ended, and says so in one event.
pub(crate) fn finished(span: &Span, result: &Result<ExecResult, ExecError>) {
    match result {
        Ok(r) => {
            let bytes_out = r.stdout.total_bytes
                + r.stderr.total_bytes
                + r.output_files.iter().map(|f| f.content.len() as u64).sum::<u64>();
            let duration_ms = r.usage.duration.as_secs_f64() * 1e3;
            span.record("outcome", r.outcome.as_str());
            span.record("duration_ms", duration_ms);
            span.record("bytes_out", bytes_out);
            tracing::info!(target: "execbox", parent: span, outcome = r.outcome.as_str(), duration_ms, bytes_out, "run ended");
        }
        Err(e) => {
            span.record("outcome", e.kind());
            tracing::info!(target: "execbox", parent: span, error = e.kind(), message = %e, "run failed before a result");
        }
    }
}

/// A span and event for a request refused before any code ran.
pub(crate) fn refused(request: &ExecRequest, error: &ExecError, session: Option<&str>) {
    let violations = error.violations().len();
    let span = tracing::info_span!(
        target: "execbox",
        "refused",
        language = request.language.as_str(),
        session = session.unwrap_or(""),
        invocation = request.invocation_id.as_deref().unwrap_or(""),
        kind = error.kind(),
        violations,
    );
    tracing::info!(target: "execbox", parent: &span, message = %error.describe(), "refused");
}
