//! Admission: the one path from a request to a run.
//!
//! Every entry point (the [`Executor`](crate::Executor), the session
//! registry, and through them the agent layer, the CLI and the MCP server)
//! turns a request into an [`Admitted`] run the same way:
//!
//! 1. **validate** what holds whichever backend runs it (code size,
//!    environment names and values, package names);
//! 2. **hold** it to the ceiling, if one is set ([`SandboxPolicy::within`]);
//! 3. **match** it against the chosen backend's capabilities, naming every
//!    unmet control ([`crate::matching`]);
//! 4. **start its deadline**: the policy's timeout, else the backend's
//!    default; the clock starts here, so waiting for a worker, a slot or a
//!    session's turn counts against it.
//!
//! Only this module makes an [`Admitted`], so a backend that takes one
//! cannot be reached around the policy. Results leave through
//! [`Admitted::finish`], which caps the fields that are not streams.

use crate::capabilities::BackendCapabilities;
use crate::error::ExecError;
use crate::limits::{Deadline, nesting, result_caps};
use crate::policy::SandboxPolicy;
use crate::request::{ExecRequest, Payload};
use crate::result::ExecResult;

/// A request admitted to run: validated, held to the ceiling, matched
/// against the backend that runs it, its deadline started.
///
/// The policy it carries is the effective one: every limit the run is held
/// to, its timeout always set.
#[derive(Debug)]
pub struct Admitted {
    request: ExecRequest,
    deadline: Deadline,
}

impl Admitted {
    /// Admits `request` to a backend with `caps` (steps 3 and 4 above; the
    /// caller has validated and held it): its timeout defaults to the
    /// backend's, and its deadline starts now.
    pub(crate) fn new(mut request: ExecRequest, caps: &BackendCapabilities) -> Self {
        let timeout = *request.policy.timeout_ms.get_or_insert(caps.default_timeout_ms);
        let deadline = Deadline::start(Some(std::time::Duration::from_millis(timeout)));
        Self { request, deadline }
    }

    /// The request, with its effective policy.
    pub fn request(&self) -> &ExecRequest {
        &self.request
    }

    /// The effective policy.
    pub fn policy(&self) -> &SandboxPolicy {
        &self.request.policy
    }

    /// The run's deadline, started at admission.
    pub fn deadline(&self) -> Deadline {
        self.deadline
    }

    /// The request, for a backend that takes it apart.
    pub fn into_request(self) -> ExecRequest {
        self.request
    }

    /// Takes the source text out (matching admitted only source payloads
    /// to a backend that calls this).
    #[cfg_attr(not(any(feature = "wasm", feature = "container")), allow(dead_code))]
    pub(crate) fn take_source(&mut self, backend: &str) -> Result<String, ExecError> {
        match std::mem::replace(&mut self.request.payload, Payload::Source(String::new())) {
            Payload::Source(source) => Ok(source),
            Payload::WasmModule(_) => Err(ExecError::internal(backend, "matching let a module payload through")),
        }
    }

    /// Takes the JSON input out, serialized (checked for depth first).
    #[cfg_attr(not(any(feature = "wasm", feature = "container")), allow(dead_code))]
    pub(crate) fn take_input_json(&mut self, max_nesting: usize, backend: &str) -> Result<Option<Vec<u8>>, ExecError> {
        nesting::take_input_json(&mut self.request.input, max_nesting, backend)
    }

    /// Caps the fields of `result` that are not streams (see
    /// [`result_caps`]) by this run's policy.
    pub(crate) fn finish(
        policy: &SandboxPolicy,
        result: Result<ExecResult, ExecError>,
    ) -> Result<ExecResult, ExecError> {
        result.map(|mut r| {
            result_caps::cap_result(&mut r, policy);
            r
        })
    }
}

/// Steps 1 and 2: validates `request` and holds it to `ceiling` in place.
pub(crate) fn hold(request: &mut ExecRequest, ceiling: Option<&SandboxPolicy>) -> Result<(), ExecError> {
    if let Some(ceiling) = ceiling {
        request.policy = request.policy.within(ceiling)?;
    }
    crate::executor::validate(request)?;
    Ok(())
}
