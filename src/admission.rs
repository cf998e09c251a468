//! Admission: the one path from a request to a run.
//!
//! Every entry point (the [`Executor`](crate::executor::Executor), the session
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
//! One `Door` does all four, for the [`Executor`](crate::executor::Executor)
//! and the session registry alike (a registry built for an executor shares
//! its door: the same ceiling, tools and artifact store), against a
//! `Target`: a backend or a live session, named with its capabilities,
//! the packages it provides and its own refusals. Only this module makes an
//! [`Admitted`], so a backend that takes one cannot be reached around the
//! policy. Each admitted run carries its tracing span. Results leave through
//! one finisher, which records how the run ended on that span, which ends the run's tool calls into its ledger, spills
//! stdout past its cap into the artifact store when the policy asks it
//! ([`SandboxPolicy::spill_output`]: the run then captures stdout up to
//! the store's largest file, and the finisher cuts the result back to the
//! cap, for every backend alike), caps the fields that are not streams,
//! and checks the output against the request's output schema
//! ([`ExecRequest::output_schema`]: a run that ends `ok` with an output
//! that does not match ends [`Outcome::InvalidOutput`]).

use crate::capabilities::BackendCapabilities;
use crate::error::{BackendRejection, ExecError, InvalidRequest};
use crate::limits::deadline::Deadline;
use crate::limits::{nesting, result_caps};
use crate::policy::{Access, SandboxPolicy};
use crate::program::{ProgramHost, ProgramStarter};
use crate::request::{ExecRequest, Payload};
use crate::result::{ExecResult, Outcome};
use crate::schema::JsonSchema;
use crate::tools::{ToolBridge, ToolContext, ToolRegistry};
use crate::violation::Violation;
use std::sync::Arc;
use tracing::Span;

/// What every run admitted through one door shares: the ceiling it is held
/// to, the tools its policy may grant, and the store its stdout may spill
/// to. Cheap to clone.
#[derive(Clone, Default)]
pub(crate) struct Door {
    ceiling: Option<Arc<SandboxPolicy>>,
    tools: Option<ToolRegistry>,
    artifacts: Option<SpillStore>,
    /// What starts the programs of runs that call Code Mode's
    /// `workspace.*` tools (an executor's door has it).
    programs: Option<Arc<dyn ProgramStarter>>,
}

/// What a request is admitted to: a backend, or a live session.
pub(crate) struct Target<'a> {
    /// Its name, in refusals and in the run's span.
    pub name: &'a str,
    /// What it enforces.
    pub capabilities: &'a BackendCapabilities,
    /// The third-party packages it provides for the request's language.
    pub packages: Vec<String>,
    /// What it refuses beyond its capabilities (a session: what it fixed
    /// when it opened).
    pub refusals: Vec<Violation>,
    /// The session the run is a call of, if any (for its span).
    pub session: Option<&'a str>,
}

impl Door {
    /// A door holding runs to `ceiling`, with `tools` and `artifacts`.
    pub(crate) fn new(
        ceiling: Option<SandboxPolicy>,
        tools: Option<ToolRegistry>,
        artifacts: Option<SpillStore>,
    ) -> Self {
        Self { ceiling: ceiling.map(Arc::new), tools, artifacts, programs: None }
    }

    /// This door, its runs' `workspace.*` tools starting programs with
    /// `starter` (an executor built on a door without one: no cycle).
    pub(crate) fn with_programs(mut self, starter: Arc<dyn ProgramStarter>) -> Self {
        self.programs = Some(starter);
        self
    }

    /// The ceiling every request is held to, if any.
    pub(crate) fn ceiling(&self) -> Option<&SandboxPolicy> {
        self.ceiling.as_deref()
    }

    /// The tools a request's policy may grant, if any.
    pub(crate) fn tools(&self) -> Option<&ToolRegistry> {
        self.tools.as_ref()
    }

    /// The store spilled output goes to, if any.
    pub(crate) fn artifacts(&self) -> Option<&SpillStore> {
        self.artifacts.as_ref()
    }

    /// Steps 1 and 2: holds `request` to the ceiling in place, then
    /// validates it (under the held policy). A caller that picks a target
    /// by the held request (the executor's selection) holds it first.
    pub(crate) fn hold(&self, request: &mut ExecRequest) -> Result<(), ExecError> {
        hold(request, self.ceiling())
    }

    /// Step 3, without admitting: every control of `request` that `target`
    /// leaves unmet (its capabilities, its packages, its own refusals).
    pub(crate) fn refusals(request: &ExecRequest, target: &Target<'_>) -> Vec<Violation> {
        let mut violations = crate::matching::check(target.capabilities, request).err().unwrap_or_default();
        violations.extend(crate::matching::check_packages(target.name, &target.packages, request));
        violations.extend(target.refusals.iter().cloned());
        violations
    }

    /// Steps 3 and 4 for a held request: matched against `target` (a
    /// refusal names every unmet control, and is observed), its deadline
    /// started, its tools and its spill planned, its span opened.
    pub(crate) fn admit(&self, request: ExecRequest, target: &Target<'_>) -> Result<Admitted, ExecError> {
        let violations = Self::refusals(&request, target);
        if !violations.is_empty() {
            let refused = ExecError::Refused {
                rejections: vec![BackendRejection { backend: target.name.to_string(), violations }],
            };
            crate::observe::refused(&request, &refused, target.session);
            return Err(refused);
        }
        // Runs in one workspace take turns (see `RunTurn`): a second one is
        // busy at once, never queued behind a run that may last minutes.
        if let Some(why) = request.workspace.as_ref().and_then(crate::workspace::Workspace::ended) {
            let reason = crate::workspace::WorkspaceError::Ended { why }.to_string();
            return Err(InvalidRequest::BadPath { path: "<workspace>".into(), reason }.into());
        }
        let turn = match &request.workspace {
            Some(workspace) => Some(Arc::new(workspace.try_turn().ok_or_else(|| ExecError::Busy {
                backend: target.name.to_string(),
                reason: "its workspace is running another run; retry when it ends".into(),
            })?)),
            None => None,
        };
        let span = crate::observe::run_span(target.name, &request, target.session);
        let mut admitted = Admitted::new(request, target.capabilities, span);
        admitted.workspace_turn = turn;
        admitted.with_tools(self.tools(), self.programs.as_ref())?.with_spill(self.artifacts())
    }
}

/// Where an executor or a session registry keeps spilled output: an
/// artifact store (nothing without the `artifacts` feature).
#[cfg(feature = "artifacts")]
pub(crate) type SpillStore = crate::artifacts::store::ArtifactStore;
/// Where an executor or a session registry keeps spilled output: an
/// artifact store (nothing without the `artifacts` feature).
#[cfg(not(feature = "artifacts"))]
pub(crate) type SpillStore = std::convert::Infallible;

/// How a run spills its stdout, if it does.
#[cfg(feature = "artifacts")]
type SpillPlan = crate::artifacts::spill::Spill;
/// How a run spills its stdout, if it does.
#[cfg(not(feature = "artifacts"))]
type SpillPlan = std::convert::Infallible;

/// A request admitted to run: validated, held to the ceiling, matched
/// against the backend that runs it, its deadline started.
///
/// The policy it carries is the effective one: every limit the run is held
/// to, its timeout always set.
pub struct Admitted {
    request: ExecRequest,
    deadline: Deadline,
    /// The run's span (`execbox::run` or `execbox::session_call`).
    span: Span,
    /// The run's tool dispatcher, when its policy grants tools.
    tools: Option<Arc<ToolBridge>>,
    /// Where its stdout spills, when its policy asks it.
    spill: Option<SpillPlan>,
    /// Its turn in its workspace, held until the run and its result are
    /// done (shared with its finisher).
    workspace_turn: Option<Arc<crate::workspace::RunTurn>>,
    /// It runs in this process (wasm): what it makes in its workspace
    /// belongs to the host's user until the finisher hands it over.
    in_process: bool,
}

impl std::fmt::Debug for Admitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admitted")
            .field("request", &self.request)
            .field("deadline", &self.deadline)
            .field("tools", &self.tools.is_some())
            .finish()
    }
}

/// What turns a backend's result into the run's: the result caps of its
/// policy, and the ledger of its tool calls (see [`Admitted::finisher`]).
pub(crate) struct Finisher {
    span: Span,
    policy: SandboxPolicy,
    tools: Option<Arc<ToolBridge>>,
    spill: Option<SpillPlan>,
    schema: Option<JsonSchema>,
    deadline: Deadline,
    workspace: Option<crate::workspace::Workspace>,
    /// Hand what the run made in its workspace to the code's user (an
    /// in-process run made it as the host's).
    hand_over: bool,
    /// Keeps the run's turn in its workspace until its result is made.
    _workspace_turn: Option<Arc<crate::workspace::RunTurn>>,
}

impl Finisher {
    /// The run's span: what it runs in.
    pub(crate) fn span(&self) -> &Span {
        &self.span
    }

    /// Ends the run's tool calls (those in flight are cancelled and left
    /// `unknown` in the ledger), puts the ledger in the result, spills
    /// stdout when the policy asks it (file work: see [`Finisher::spills`]),
    /// caps the result's fields that are not streams, checks the output
    /// against its schema, and records how the run ended on its span.
    pub(crate) fn finish(mut self, result: Result<ExecResult, ExecError>) -> Result<ExecResult, ExecError> {
        let result = self.finished(result);
        crate::observe::finished(&self.span, &result);
        result
    }

    fn finished(&mut self, result: Result<ExecResult, ExecError>) -> Result<ExecResult, ExecError> {
        let ledger = self.tools.take().map(|bridge| bridge.finish().0);
        result.map(|mut r| {
            if let Some(ledger) = ledger {
                r.tool_calls = ledger;
            }
            // A run that failed on a tool call its deadline cut off (the
            // code saw `cancelled` and did not catch it) ended because of
            // its deadline: it timed out, whatever the code made of it.
            let cut_off = r.tool_calls.iter().any(|c| c.error == Some(crate::tools::ToolErrorKind::Cancelled));
            if r.outcome == Outcome::Failed && cut_off && self.deadline_passed() {
                r.outcome = Outcome::TimedOut;
                let why = "the run's deadline passed during a tool call";
                r.message = Some(match r.message.take() {
                    Some(m) => format!("{why} ({m})"),
                    None => why.to_string(),
                });
            }
            #[cfg(feature = "artifacts")]
            if let Some(spill) = &self.spill {
                spill.finish(&mut r);
            }
            if let Some(workspace) = &self.workspace {
                if self.hand_over
                    && let Err(e) = workspace.hand_to_code()
                {
                    tracing::warn!(error = %e, "a run's files in its workspace were not handed to the code's user");
                }
                r.workspace = workspace.usage().ok();
            }
            result_caps::cap_result(&mut r, &self.policy);
            if let Some(schema) = &self.schema {
                check_output(&mut r, schema);
            }
            r
        })
    }

    fn deadline_passed(&self) -> bool {
        self.deadline.expired()
    }

    /// True when [`Finisher::finish`] may write a file (the run spills its
    /// stdout): an async caller finishes it where blocking is fine.
    pub(crate) fn spills(&self) -> bool {
        self.spill.is_some()
    }

    /// True when [`Finisher::finish`] may block for a while: it spills, or
    /// checks an output too large or deep to check at once (up to about a
    /// second: see [`JsonSchema::is_quick`]), or walks the workspace of an
    /// in-process run. An async caller finishes it where blocking is fine.
    pub(crate) fn blocks(&self, result: &Result<ExecResult, ExecError>) -> bool {
        let checks_slowly = |r: &ExecResult| {
            r.outcome == Outcome::Ok
                && matches!((&self.schema, &r.output), (Some(schema), Some(output)) if !schema.is_quick(output))
        };
        self.spills() || self.hand_over || result.as_ref().is_ok_and(checks_slowly)
    }
}

/// Holds an `ok` run's output to `schema`: no output, or one that does not
/// match, makes the run [`Outcome::InvalidOutput`] with each failing place
/// in `output_errors` and the first in `message`. Other outcomes are left
/// as they are (their output is not an answer).
fn check_output(result: &mut ExecResult, schema: &JsonSchema) {
    if result.outcome != Outcome::Ok {
        return;
    }
    let mismatch = match &result.output {
        Some(output) => match schema.validate(output) {
            Ok(()) => return,
            Err(mismatch) => mismatch,
        },
        None => crate::schema::Mismatch {
            errors: vec![crate::result::OutputError {
                path: String::new(),
                schema_path: String::new(),
                message: "the program gave no structured output (JavaScript: return a value; Python and \
                          containers: print one JSON value; Rust: return from run)"
                    .into(),
            }],
            more: false,
        },
    };
    let others = mismatch.errors.len().saturating_sub(1);
    let first = mismatch.errors.first().map(crate::result::OutputError::line).unwrap_or_default();
    let more = match (others, mismatch.more) {
        (0, false) => String::new(),
        (n, false) => format!(" (and {n} more: see output_errors)"),
        (n, true) => format!(" (and more than {n} more: see output_errors)"),
    };
    result.outcome = Outcome::InvalidOutput;
    result.message =
        Some(crate::text::cap_message(format!("the output does not match the output schema: {first}{more}")));
    result.output_errors = mismatch.errors;
}

/// A run whose result nobody will finish (its caller dropped the future of
/// [`Executor::execute`](crate::executor::Executor::execute)): its tool
/// calls end now, not at their timeouts, and no later call starts.
impl Drop for Finisher {
    fn drop(&mut self) {
        if let Some(bridge) = self.tools.take() {
            bridge.finish();
        }
    }
}

impl Admitted {
    /// Admits `request` to a backend with `caps` (step 4: the [`Door`] has
    /// validated, held and matched it): its timeout defaults to the
    /// backend's, and its deadline starts now.
    fn new(mut request: ExecRequest, caps: &BackendCapabilities, span: Span) -> Self {
        let timeout = *request.policy.timeout_ms.get_or_insert(caps.default_timeout_ms);
        let limit = Some(std::time::Duration::from_millis(timeout));
        let deadline = match request.deadline_from {
            Some(start) => Deadline::started_at(start, limit),
            None => Deadline::start(limit),
        };
        let in_process = caps.isolation == crate::capabilities::IsolationKind::InProcess;
        Self { request, deadline, span, tools: None, spill: None, workspace_turn: None, in_process }
    }

    /// Gives the run its tool bridge when its policy grants tools: the
    /// granted tools of `registry`, within the policy's tool limits, until
    /// the run's deadline. A grant that names a tool `registry` lacks (not a
    /// `namespace.*` pattern: a name) is an invalid request.
    /// A run in a workspace also gets what its `workspace.*` tools start
    /// programs with (`programs`, under its policy less its tool grants).
    fn with_tools(
        mut self,
        registry: Option<&ToolRegistry>,
        programs: Option<&Arc<dyn ProgramStarter>>,
    ) -> Result<Self, ExecError> {
        let Some(grants) = self.request.policy.tool_grants() else { return Ok(self) };
        let registry = registry.cloned().unwrap_or_default();
        let unknown: Vec<String> = grants
            .iter()
            .filter(|g| !g.ends_with(".*") && g.as_str() != "*" && registry.get(g).is_none())
            .cloned()
            .collect();
        if !unknown.is_empty() {
            return Err(InvalidRequest::UnknownTools { names: unknown }.into());
        }
        let mut context = match &self.request.artifact_scope {
            Some(scope) => ToolContext::with_scope(scope.as_str()),
            None => ToolContext::default(),
        };
        if let (Some(starter), Some(workspace)) = (programs, &self.request.workspace) {
            let mut policy = self.request.policy.clone();
            // Denied, not unstated: a ceiling that grants tools would fill them in.
            policy.tools = crate::policy::Access::Deny;
            let (starter, workspace) = (starter.clone(), workspace.clone());
            let packages = self.request.packages.clone();
            context.programs = Some(ProgramHost { starter, workspace, policy, packages });
        }
        let bridge = ToolBridge::for_run(
            registry,
            grants.to_vec(),
            self.request.policy.effective_tool_limits(),
            self.deadline,
            self.request.tool_approver.clone(),
            context,
        );
        self.tools = Some(bridge);
        Ok(self)
    }

    /// Plans the run's spilled output when its policy asks it
    /// ([`SandboxPolicy::spill_output`]): into `store`, under the run's
    /// [`ExecRequest::artifact_scope`]. The run's stdout cap becomes the
    /// store's largest file (its output tap still sees no more than the
    /// asked cap); the finisher holds the result to the asked cap. Without
    /// a store or a scope, the request is refused
    /// ([`InvalidRequest::CannotSpill`]): the caller asked that nothing of
    /// stdout be lost.
    fn with_spill(self, store: Option<&SpillStore>) -> Result<Self, ExecError> {
        if self.request.policy.spill_output != Some(true) {
            return Ok(self);
        }
        let cannot = |reason: &str| ExecError::from(InvalidRequest::CannotSpill { reason: reason.into() });
        let Some(store) = store else {
            return Err(cannot(
                "no artifact store keeps spilled output here (ExecutorBuilder::artifacts, SessionsBuilder::artifacts)",
            ));
        };
        let Some(scope) = self.request.artifact_scope.clone() else {
            return Err(cannot("the run has no artifact scope (ExecRequest::artifact_scope) to keep it in"));
        };
        #[cfg(feature = "artifacts")]
        {
            let mut this = self;
            // Not asked: stdout is never cut, so there is nothing to spill.
            let Some(cap) = this.request.policy.max_stdout_bytes else { return Ok(this) };
            let spill = crate::artifacts::spill::Spill::new(store.clone(), scope, cap);
            this.request.policy.max_stdout_bytes = Some(spill.capture_bytes());
            this.request.output_tap = this.request.output_tap.take().map(|tap| tap.stdout_capped(cap));
            this.spill = Some(spill);
            Ok(this)
        }
        #[cfg(not(feature = "artifacts"))]
        {
            let _ = scope;
            match *store {}
        }
    }

    /// The run's tool bridge, when its policy grants tools (a backend that
    /// declares the bridge enforced carries it to the code).
    pub fn tools(&self) -> Option<&Arc<ToolBridge>> {
        self.tools.as_ref()
    }

    /// What finishes this run's result (taken before the backend consumes
    /// the call).
    pub(crate) fn finisher(&self) -> Finisher {
        #[cfg_attr(not(feature = "artifacts"), allow(unused_mut))]
        let mut policy = self.request.policy.clone();
        #[cfg(feature = "artifacts")]
        if let Some(spill) = &self.spill {
            // The run captured more than its cap; its result is held to the cap.
            policy.max_stdout_bytes = Some(spill.cap());
        }
        Finisher {
            span: self.span.clone(),
            policy,
            tools: self.tools.clone(),
            spill: self.spill.clone(),
            schema: self.request.output_schema.clone(),
            deadline: self.deadline,
            workspace: self.request.workspace.clone(),
            hand_over: self.in_process && self.request.workspace.is_some(),
            _workspace_turn: self.workspace_turn.clone(),
        }
    }

    /// The request, with its effective policy.
    pub fn request(&self) -> &ExecRequest {
        &self.request
    }

    /// The effective policy. For a run that spills its stdout,
    /// `max_stdout_bytes` is what the run captures (the artifact store's
    /// largest file); its result is held to the asked cap.
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

    /// Takes the module bytes out (matching admitted only module payloads
    /// to a backend that calls this).
    #[cfg_attr(not(feature = "wasm"), allow(dead_code))]
    pub(crate) fn take_module(&mut self, backend: &str) -> Result<Vec<u8>, ExecError> {
        match std::mem::replace(&mut self.request.payload, Payload::WasmModule(Vec::new())) {
            Payload::WasmModule(module) => Ok(module),
            Payload::Source(_) => Err(ExecError::internal(backend, "matching let a source payload through")),
        }
    }

    /// Takes the JSON input out, serialized (checked for depth first).
    #[cfg_attr(not(any(feature = "wasm", feature = "container")), allow(dead_code))]
    pub(crate) fn take_input_json(&mut self, max_nesting: usize, backend: &str) -> Result<Option<Vec<u8>>, ExecError> {
        nesting::take_input_json(&mut self.request.input, max_nesting, backend)
    }
}

/// Steps 1 and 2: holds `request` to `ceiling` in place, then validates
/// it (under the held policy: its code size and environment allow-list).
fn hold(request: &mut ExecRequest, ceiling: Option<&SandboxPolicy>) -> Result<(), ExecError> {
    if let Some(ceiling) = ceiling {
        request.policy = request.policy.within(ceiling)?;
    }
    validate(request)?;
    Ok(())
}

/// Most packages a request may declare.
pub const MAX_PACKAGES: usize = 64;

/// Step 1: checks that hold whichever backend runs the request.
pub(crate) fn validate(request: &ExecRequest) -> Result<(), InvalidRequest> {
    validate_env(request)?;
    validate_packages(&request.packages)?;
    let policy = &request.policy;
    if let Some(max) = policy.max_code_bytes {
        let size = request.payload.len() as u64;
        if size > max {
            return Err(InvalidRequest::CodeTooLarge { size, max });
        }
    }
    if !request.env.is_empty() {
        let allowed: &[String] = match &policy.environment {
            Access::Allow(names) => names,
            Access::Deny => &[],
            // Not asked: the request's own values are the grant; matching
            // still requires a backend that can pass exactly those.
            Access::NotAsked => return Ok(()),
        };
        let names: Vec<String> = request.env.keys().filter(|k| !allowed.contains(k)).cloned().collect();
        if !names.is_empty() {
            return Err(InvalidRequest::EnvNotAllowed { names });
        }
    }
    Ok(())
}

/// Package names are import names: `[A-Za-z0-9_.-]`, 1 to 100 bytes; at
/// most [`MAX_PACKAGES`].
pub(crate) fn validate_packages(packages: &[String]) -> Result<(), InvalidRequest> {
    let bad = |reason: String| InvalidRequest::BadPackages { reason };
    if packages.len() > MAX_PACKAGES {
        return Err(bad(format!("{} packages, at most {MAX_PACKAGES}", packages.len())));
    }
    for name in packages {
        let ok =
            (1..=100).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
        if !ok {
            return Err(bad(format!(
                "{:?} is not a package name ([A-Za-z0-9_.-], at most 100 bytes)",
                crate::text::cap_text(name.clone(), 100)
            )));
        }
    }
    Ok(())
}

/// Longest environment value accepted, in bytes (container env files are
/// read line by line with a 64 KiB line limit).
pub const MAX_ENV_VALUE_BYTES: usize = 32 << 10;

/// Checks that every variable can reach the program exactly as given: a
/// portable name (`[A-Za-z_][A-Za-z0-9_]*`: engines rewrite others, e.g.
/// docker trims `\u{85}X` to `X`), not a dynamic-loader variable (`LD_*`),
/// and a value without NUL, at most [`MAX_ENV_VALUE_BYTES`].
pub(crate) fn validate_env(request: &ExecRequest) -> Result<(), InvalidRequest> {
    for (name, value) in &request.env {
        let bad = |reason: String| InvalidRequest::BadEnv { name: name.clone(), reason };
        let mut chars = name.bytes();
        let portable = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == b'_');
        if !portable || name.len() > 256 {
            return Err(bad("names must match [A-Za-z_][A-Za-z0-9_]* (at most 256 bytes)".into()));
        }
        if name.starts_with("LD_") {
            // They would reach the sandbox's own helpers (the container's
            // in-container timer) before the program.
            return Err(bad("dynamic-loader variables (LD_*) cannot be passed".into()));
        }
        if value.len() > MAX_ENV_VALUE_BYTES {
            return Err(bad(format!("the value is {} bytes, over the limit of {MAX_ENV_VALUE_BYTES}", value.len())));
        }
        if value.contains('\0') {
            return Err(bad("values cannot hold NUL".into()));
        }
    }
    Ok(())
}
