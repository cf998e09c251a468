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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Metadata, Subscriber};

    /// Keeps the fields of every new span, as `name=value` text.
    #[derive(Clone, Default)]
    struct Fields(Arc<Mutex<Vec<String>>>);

    impl Visit for Fields {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.0.lock().unwrap().push(format!("{}={value:?}", field.name()));
        }
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.lock().unwrap().push(format!("{}={value}", field.name()));
        }
    }

    impl Subscriber for Fields {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, span: &Attributes<'_>) -> Id {
            span.record(&mut self.clone());
            Id::from_u64(1)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, _: &Event<'_>) {}
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    #[test]
    fn a_runs_span_carries_its_invocation_id() {
        let fields = Fields::default();
        let request = ExecRequest::javascript("1").invocation_id("inv-42");
        tracing::subscriber::with_default(fields.clone(), || {
            let _span = run_span("boa-js", &request, None);
        });
        let seen = fields.0.lock().unwrap().clone();
        assert!(seen.contains(&"invocation=inv-42".to_string()), "{seen:?}");
        assert!(seen.contains(&"backend=boa-js".to_string()), "{seen:?}");
    }
}
