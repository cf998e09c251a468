//! [`SessionSpec`]: what a session is opened under, and what it fixes for
//! every later call.

use std::collections::BTreeMap;

use crate::language::Language;
use crate::policy::{Access, SandboxPolicy};
use crate::request::ExecRequest;
use crate::violation::{Control, Violation};
use crate::workspace::Workspace;

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
    /// The workspace its calls run in (at `/work`, read-write), if any: only
    /// a session backend that carries workspaces opens it (matched like
    /// any control). The session holds the workspace until it closes.
    pub workspace: Option<Workspace>,
}

impl SessionSpec {
    /// A session of `language` under [`SandboxPolicy::strict`].
    pub fn new(language: Language) -> Self {
        Self { language, packages: Vec::new(), policy: SandboxPolicy::strict(), env: BTreeMap::new(), workspace: None }
    }

    /// What a call opens when its session does not exist yet: its language,
    /// packages, policy, environment and workspace.
    pub fn of_request(request: &ExecRequest) -> Self {
        Self {
            language: request.language,
            packages: request.packages.clone(),
            policy: request.policy.clone(),
            env: request.env.clone(),
            workspace: request.workspace.clone(),
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

    /// Opens the session in `workspace`: every call runs with it at
    /// `/work`, read-write, and takes its turn there like a run.
    pub fn workspace(mut self, workspace: &Workspace) -> Self {
        self.workspace = Some(workspace.clone());
        self
    }

    /// A request with this spec's language, policy, environment, packages
    /// and workspace and no code: what opening is matched and validated as.
    pub(crate) fn template(&self) -> ExecRequest {
        let mut request = ExecRequest::source(self.language, "").policy(self.policy.clone());
        request.env = self.env.clone();
        request.packages = self.packages.clone();
        request.workspace = self.workspace.clone();
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
    // A call runs in its session's workspace whether it names it or not;
    // naming another (or one, for a session without) is refused.
    // (Named without ids: a workspace's is its mount's, which callers over
    // MCP never see.)
    if let Some(asked) = &request.workspace
        && spec.workspace.as_ref() != Some(asked)
    {
        let (requested, had) = match spec.workspace {
            Some(_) => ("another workspace", "in its own workspace"),
            None => ("a workspace", "without a workspace"),
        };
        violations.push(fixed(Control::Workspace, requested.into(), had.into()));
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
    crate::text::cap_message(text)
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
