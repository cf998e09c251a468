//! Matching: `capabilities × request → Ok | every unmet control`.
//!
//! A pure function with no allocation on success. It fails closed: a control
//! the request states and the backend does not enforce is a [`Violation`];
//! a control the request does not state is never one.

use crate::capabilities::{BackendCapabilities, Enforcement, SurfaceCapability};
use crate::policy::Access;
use crate::request::ExecRequest;
use crate::violation::{Control, Violation};

/// The packages `request` declares that `backend`, which provides
/// `provided` (import names, compared without case), does not: one
/// violation naming them, or `None` when it has every one. The other half
/// of matching: capabilities are static, the packages a backend provides
/// are found at run time (a container image's label).
pub fn check_packages(backend: &str, provided: &[String], request: &ExecRequest) -> Option<Violation> {
    let missing: Vec<&str> = request
        .packages
        .iter()
        .filter(|p| !provided.iter().any(|have| have.eq_ignore_ascii_case(p)))
        .map(String::as_str)
        .collect();
    if missing.is_empty() {
        return None;
    }
    let reason = if provided.is_empty() {
        format!("{backend} provides no third-party packages for {}", request.language)
    } else {
        format!("{backend} provides {} for {}", provided.join(", "), request.language)
    };
    Some(Violation { control: Control::Packages, requested: crate::text::list_names(&missing), reason })
}

/// Checks every control of `request` against `caps`; returns all violations.
pub fn check(caps: &BackendCapabilities, request: &ExecRequest) -> Result<(), Vec<Violation>> {
    let mut r = Report(Vec::new());

    r.require(
        caps.languages.contains(&request.language),
        Control::Language,
        || request.language.to_string(),
        || "language not supported by this backend".into(),
    );
    let kind = request.payload.kind();
    r.require(
        caps.payloads.contains(&kind),
        Control::Payload,
        || format!("{kind:?}"),
        || "payload form not supported by this backend".into(),
    );

    let f = caps.features;
    let unsupported = || "not supported by this backend".to_string();
    r.require(f.json_input || request.input.is_none(), Control::JsonInput, || "input".into(), unsupported);
    r.require(f.stdin || request.stdin.is_none(), Control::Stdin, || "stdin".into(), unsupported);
    r.require(f.args || request.args.is_empty(), Control::Args, || format!("{} args", request.args.len()), unsupported);
    r.require(
        f.input_files || request.input_files.is_empty(),
        Control::InputFiles,
        || format!("{} files", request.input_files.len()),
        unsupported,
    );
    r.require(
        f.output_files || !request.collect_output_files,
        Control::OutputFiles,
        || "collect output files".into(),
        unsupported,
    );

    let p = &request.policy;
    r.surface(Control::Network, p.network.is_asked(), matches!(p.network, Access::Deny), &caps.network);
    r.surface(Control::Filesystem, p.filesystem.is_asked(), matches!(p.filesystem, Access::Deny), &caps.filesystem);
    // Values in `request.env` are an access the request makes: they need an
    // allow-list grant even when the policy itself states nothing.
    let env_asked = p.environment.is_asked() || !request.env.is_empty();
    r.surface(Control::Environment, env_asked, matches!(p.environment, Access::Deny), &caps.environment);

    r.limit(Control::Timeout, p.timeout_ms, "ms", &caps.timeout);
    r.limit(Control::Memory, p.memory_bytes, "bytes", &caps.memory);
    r.limit(Control::Fuel, p.fuel, "units", &caps.fuel);
    r.limit(Control::StdoutCap, p.max_stdout_bytes, "bytes", &caps.stdout_cap);
    r.limit(Control::StderrCap, p.max_stderr_bytes, "bytes", &caps.stderr_cap);
    r.limit(Control::Processes, p.max_processes, "processes", &caps.processes);
    r.surface(Control::Tools, p.tools.is_asked(), p.tool_grants().is_none(), &caps.tools);
    if let Some(workspace) = &request.workspace {
        r.require(
            caps.workspace.holds(),
            Control::Workspace,
            || workspace.id().into(),
            || caps.workspace.detail().into(),
        );
    }

    if r.0.is_empty() { Ok(()) } else { Err(r.0) }
}

/// Collects violations; builds their text only when one occurs.
struct Report(Vec<Violation>);

impl Report {
    fn require(
        &mut self,
        ok: bool,
        control: Control,
        requested: impl FnOnce() -> String,
        reason: impl FnOnce() -> String,
    ) {
        if !ok {
            self.0.push(Violation { control, requested: requested(), reason: reason() });
        }
    }

    fn surface(&mut self, control: Control, asked: bool, deny: bool, cap: &SurfaceCapability) {
        if !asked {
            return;
        }
        let (enforcement, requested) = if deny { (&cap.deny, "deny") } else { (&cap.allow_list, "allow-list") };
        self.require(enforcement.holds(), control, || requested.into(), || enforcement.detail().into());
    }

    fn limit(&mut self, control: Control, asked: Option<u64>, unit: &str, cap: &Enforcement) {
        if let Some(value) = asked {
            self.require(cap.holds(), control, || format!("{value} {unit}"), || cap.detail().into());
        }
    }
}
