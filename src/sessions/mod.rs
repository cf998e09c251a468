//! [`Sessions`]: interpreter state kept across calls, by id.
//!
//! A session is one live interpreter (a JS realm in a worker process of its
//! own, a CPython instance, a container) that runs a request per call and
//! keeps its globals between calls. The registry guarantees, whatever the
//! backend:
//!
//! - **Opened under the effective policy**: a session opens under its
//!   [`SessionSpec`] held to the registry's ceiling, exactly as a one-shot
//!   run of the same request would be; controls fixed at that moment
//!   (network, directories, environment; a container's memory and process
//!   caps) cannot be lowered by a later call, which is refused naming them.
//! - **One admission path**: each call is validated, held to the ceiling
//!   and matched against the session's capabilities like a one-shot run
//!   ([`crate::admission`]); its deadline starts before it waits for its turn.
//! - **Bounded**: at most [`SessionConfig::max_sessions`] live (or opening)
//!   at once; one more is [`SessionError::TooMany`].
//! - **Closed when idle**: a session unused for
//!   [`SessionConfig::idle_timeout`] is closed by a background thread (alive
//!   only while sessions are), not when the registry is next touched.
//! - **One call at a time** per session, in arrival order.
//! - **Nothing outlives its deadline**: every backend stops a call at its
//!   deadline; as a backstop, the same thread kills a session whose call is
//!   still running [`CALL_OVERRUN_LIMIT`] past its deadline.
//! - **Closing means closed**: [`Sessions::close`] (and expiry, and
//!   [`Sessions::close_all`] at shutdown) kills the session's interpreter at
//!   once, even while a call of it runs; that call ends as `killed`.
//! - **Never silently reset**: a session that a call ended (time-out, memory,
//!   an engine crash) or that expired is *lost*; the next call with its id
//!   gets [`SessionError::Lost`] once, with the reason, and only a call after
//!   that may open a fresh one.

mod error;
mod registry;
mod turns;

use std::collections::BTreeMap;
use std::time::Duration;

pub use error::SessionError;
pub use registry::{SessionConfig, Sessions, SessionsBuilder};

use crate::admission::Admitted;
use crate::capabilities::{BackendCapabilities, Language};
use crate::error::ExecError;
use crate::policy::{Access, SandboxPolicy};
use crate::request::ExecRequest;
use crate::result::ExecResult;
use crate::violation::{Control, Violation};

/// How long past its deadline a session call may still run before the
/// registry kills its session (a backstop: every backend ends its calls
/// within 2 s of the deadline by itself).
pub const CALL_OVERRUN_LIMIT: Duration = Duration::from_secs(3);

/// One live interpreter that keeps state across calls.
pub trait Session: Send + Sync {
    /// The name results and refusals carry (e.g. `boa-js-session`).
    fn backend(&self) -> &str;

    /// What a call may ask for: matched like a one-shot run's request.
    fn capabilities(&self) -> &BackendCapabilities;

    /// What this session cannot do for `request` beyond its capabilities
    /// and what every session fixes when it opens (e.g. a container's
    /// memory cap, fixed when it started). Default: nothing more.
    fn refusals(&self, request: &ExecRequest) -> Vec<Violation> {
        let _ = request;
        Vec::new()
    }

    /// Runs one admitted call. Blocks until the call ends, at most about
    /// 2 s past its deadline. Calls never overlap (the registry sees to it).
    fn execute(&self, call: Admitted) -> Result<ExecResult, ExecError>;

    /// False once the session ended (a call ended it, or it was killed):
    /// its state is gone.
    fn is_alive(&self) -> bool;

    /// Ends the session now, from any thread, even while a call runs: its
    /// interpreter is killed, and the call in flight returns promptly as
    /// `killed`. Idempotent.
    fn kill(&self);
}

/// A backend that can open [`Session`]s for one language.
pub trait SessionBackend: Send + Sync {
    /// The name its sessions carry.
    fn session_name(&self) -> &str;

    /// The language its sessions run.
    fn session_language(&self) -> Language;

    /// What its sessions enforce: the opening spec is matched against it.
    fn session_capabilities(&self) -> &BackendCapabilities;

    /// Third-party packages its sessions provide (see
    /// [`Backend::packages`](crate::Backend::packages)). Default: none.
    fn session_packages(&self) -> Vec<String> {
        Vec::new()
    }

    /// What it cannot open under `spec` beyond its capabilities. Default:
    /// nothing more.
    fn open_refusals(&self, spec: &SessionSpec) -> Vec<Violation> {
        let _ = spec;
        Vec::new()
    }

    /// Opens a session under `spec` (already held to the ceiling and
    /// matched): starts its interpreter now.
    fn open_session(&self, spec: &SessionSpec) -> Result<Box<dyn Session>, ExecError>;
}

/// What a session is opened under, fixed for its life: the policy of the
/// call that opens it (the registry holds it to its ceiling first), the
/// packages it declares and its environment values.
///
/// `Default`-like: [`SessionSpec::new`] has the strict policy, no packages
/// and no environment.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct SessionSpec {
    /// The session's language.
    pub language: Language,
    /// Packages its code needs (see [`ExecRequest::packages`]).
    pub packages: Vec<String>,
    /// The policy it opens under: network, directories and environment are
    /// fixed by it; a container also fixes its memory and process caps.
    pub policy: SandboxPolicy,
    /// Environment values every call sees (names allowed by `policy`).
    pub env: BTreeMap<String, String>,
}

impl SessionSpec {
    /// A session of `language` under [`SandboxPolicy::strict`].
    pub fn new(language: Language) -> Self {
        Self { language, packages: Vec::new(), policy: SandboxPolicy::strict(), env: BTreeMap::new() }
    }

    /// What a call opens when its session does not exist yet: its language,
    /// packages, policy and environment.
    pub fn of_request(request: &ExecRequest) -> Self {
        Self {
            language: request.language,
            packages: request.packages.clone(),
            policy: request.policy.clone(),
            env: request.env.clone(),
        }
    }

    /// Declares packages.
    pub fn packages<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.packages.extend(names.into_iter().map(Into::into));
        self
    }

    /// Sets the policy.
    pub fn policy(mut self, policy: SandboxPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Sets an environment value (its name must be allowed by the policy).
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(name.into(), value.into());
        self
    }

    /// A request with this spec's language, policy, environment and
    /// packages and no code: what opening is matched and validated as.
    pub(crate) fn template(&self) -> ExecRequest {
        let mut request = ExecRequest::source(self.language, "").policy(self.policy.clone());
        request.env = self.env.clone();
        request.packages = self.packages.clone();
        request
    }
}

/// What every session fixes when it opens, checked for each call: no
/// arguments, and the same network, directories and environment as the
/// opening spec. A call that states one of them differently (including
/// asking for less, e.g. denying directories the session has) is refused.
pub(crate) fn fixed_at_open(spec: &SessionSpec, request: &ExecRequest) -> Vec<Violation> {
    let mut violations = Vec::new();
    let fixed = |control, requested: String, had: String| Violation {
        control,
        requested,
        reason: format!("fixed when the session opened ({had}); open another session for a different one"),
    };
    if !request.args.is_empty() {
        violations.push(fixed(Control::Args, format!("{} arguments", request.args.len()), "none".into()));
    }
    let env_names = |env: &BTreeMap<String, String>| {
        if env.is_empty() { "no variables".to_string() } else { env.keys().cloned().collect::<Vec<_>>().join(", ") }
    };
    if !request.env.is_empty() && request.env != spec.env {
        violations.push(fixed(Control::Environment, env_names(&request.env), env_names(&spec.env)));
    } else if matches!(request.policy.environment, Access::Deny) && !spec.env.is_empty() {
        violations.push(fixed(Control::Environment, "deny".into(), env_names(&spec.env)));
    }
    if !same_access(&request.policy.filesystem, &spec.policy.filesystem, |g| {
        g.read_only.is_empty() && g.read_write.is_empty()
    }) {
        violations.push(fixed(
            Control::Filesystem,
            describe(&request.policy.filesystem),
            describe(&spec.policy.filesystem),
        ));
    }
    if !same_access(&request.policy.network, &spec.policy.network, Vec::is_empty) {
        violations.push(fixed(Control::Network, describe(&request.policy.network), describe(&spec.policy.network)));
    }
    violations
}

/// True when a call's access is what the session has: not asked, or the
/// same grant (a deny and an empty allow-list are the same).
fn same_access<T: PartialEq>(call: &Access<T>, session: &Access<T>, empty: impl Fn(&T) -> bool) -> bool {
    fn grants<'a, T>(access: &'a Access<T>, empty: &impl Fn(&T) -> bool) -> Option<&'a T> {
        match access {
            Access::Allow(list) if !empty(list) => Some(list),
            _ => None,
        }
    }
    match call {
        Access::NotAsked => true,
        _ => match (grants(call, &empty), grants(session, &empty)) {
            // No session backend grants what was not asked: both have none.
            (None, None) => true,
            (Some(a), Some(b)) => a == b,
            _ => false,
        },
    }
}

fn describe<T: std::fmt::Debug>(access: &Access<T>) -> String {
    let text = match access {
        Access::NotAsked => "not asked".to_string(),
        Access::Deny => "deny".to_string(),
        Access::Allow(list) => format!("allow {list:?}"),
    };
    crate::limits::text::cap_message(text)
}

/// The result of a call whose session was closed (killed) while it ran.
#[cfg_attr(not(any(feature = "js", feature = "wasm", feature = "container")), allow(dead_code))]
pub(crate) fn killed_result(backend: &str, deadline: &crate::limits::Deadline) -> ExecResult {
    let mut result = ExecResult::new(backend, crate::result::Outcome::Killed);
    result.message = Some("the session was closed during this call: its interpreter was killed".into());
    result.usage.duration = deadline.elapsed();
    result
}

/// A new session id: 128 random bits as hex.
pub fn new_id() -> String {
    crate::nonce::hex128()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::PathGrants;

    #[test]
    fn a_call_cannot_change_what_its_session_fixed_at_open() {
        let grants = Access::Allow(PathGrants::new().read_only("/data"));
        let spec = SessionSpec::new(Language::Python)
            .policy(SandboxPolicy::strict().filesystem(grants.clone()).environment(Access::Allow(vec!["A".into()])))
            .env("A", "1");
        let call = |policy: SandboxPolicy| ExecRequest::source(Language::Python, "").policy(policy);
        let same = call(spec.policy.clone());
        assert!(fixed_at_open(&spec, &same).is_empty());
        let not_asked = call(SandboxPolicy {
            filesystem: Access::NotAsked,
            environment: Access::NotAsked,
            network: Access::NotAsked,
            ..SandboxPolicy::strict()
        });
        assert!(fixed_at_open(&spec, &not_asked).is_empty());
        // Asking for less (no directories, no environment) or other values is refused, naming each.
        let less = call(SandboxPolicy::strict());
        let controls: Vec<Control> = fixed_at_open(&spec, &less).iter().map(|v| v.control).collect();
        assert_eq!(controls, vec![Control::Environment, Control::Filesystem]);
        let other = call(spec.policy.clone()).env("A", "2").arg("x");
        let controls: Vec<Control> = fixed_at_open(&spec, &other).iter().map(|v| v.control).collect();
        assert_eq!(controls, vec![Control::Args, Control::Environment]);
        // A session opened with nothing accepts a call that denies everything.
        let plain = SessionSpec::new(Language::Python);
        assert!(fixed_at_open(&plain, &less).is_empty());
        let wants = call(SandboxPolicy::strict().filesystem(grants));
        assert_eq!(fixed_at_open(&plain, &wants)[0].control, Control::Filesystem);
    }
}
