//! [`SandboxPolicy`]: what a request needs from whichever backend runs it.
//!
//! Every access control has three states ([`Access`]): *not asked* (the caller
//! states no requirement), *deny*, or *allow* an explicit list. Every numeric
//! limit is `Option`: `None` means "not asked". A backend that cannot enforce a
//! stated requirement is never chosen (see [`crate::matching`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::InvalidRequest;

pub mod tools;

use tools::ToolLimits;

/// One access control: not asked, denied, or allowed for an explicit list.
///
/// `Allow` grants exactly the listed items (hosts, paths, variable names) and
/// nothing else; an empty list grants nothing and behaves like `Deny`.
///
/// In JSON it is written `{"mode": "allow", "allow": [...]}`,
/// `{"mode": "deny"}` or `{"mode": "not_asked"}`, and read in those forms
/// or in the obvious shorthands: the list (or path grants object) alone
/// for allow, `"deny"` or `"not_asked"` alone for the others:
///
/// ```
/// use execbox::{Access, SandboxPolicy};
/// let p: SandboxPolicy = serde_json::from_str(r#"{"tools": ["memory.*"], "network": "deny"}"#).unwrap();
/// assert_eq!(p.tools, Access::Allow(vec!["memory.*".to_string()]));
/// assert_eq!(serde_json::to_string(&p.tools).unwrap(), r#"{"mode":"allow","allow":["memory.*"]}"#);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "mode", content = "allow")]
pub enum Access<T> {
    /// The caller states no requirement; the backend's own behaviour applies.
    #[default]
    NotAsked,
    /// The code must not be able to use this surface at all.
    Deny,
    /// The code may use exactly these items.
    Allow(T),
}

impl<T> Access<T> {
    /// True when the caller has stated a requirement (deny or allow).
    pub fn is_asked(&self) -> bool {
        !matches!(self, Access::NotAsked)
    }
}

/// [`Access`] as written out in full (the shape it serializes to).
#[derive(Deserialize)]
#[serde(rename_all = "snake_case", tag = "mode", content = "allow", deny_unknown_fields)]
enum TaggedAccess<T> {
    NotAsked,
    Deny,
    Allow(T),
}

impl<'de, T: serde::de::DeserializeOwned> Deserialize<'de> for Access<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        const SHAPES: &str = r#"expected a list (allow exactly these, e.g. ["memory.*"]), "deny", "not_asked", or {"mode": "allow", "allow": [...]} / {"mode": "deny"} / {"mode": "not_asked"}"#;
        let value = serde_json::Value::deserialize(deserializer)?;
        let tagged = |value| {
            serde_json::from_value::<TaggedAccess<T>>(value).map_err(|e| D::Error::custom(format!("{e}; {SHAPES}")))
        };
        let access = match value {
            serde_json::Value::String(mode) => match mode.as_str() {
                "deny" => TaggedAccess::Deny,
                "not_asked" => TaggedAccess::NotAsked,
                other => return Err(D::Error::custom(format!("unknown access mode {other:?}; {SHAPES}"))),
            },
            serde_json::Value::Object(ref fields) if fields.contains_key("mode") => tagged(value)?,
            // The grants alone: a list, or the path grants object.
            value @ (serde_json::Value::Array(_) | serde_json::Value::Object(_)) => TaggedAccess::Allow(
                serde_json::from_value(value).map_err(|e| D::Error::custom(format!("{e}; {SHAPES}")))?,
            ),
            other => return Err(D::Error::custom(format!("{other} is not an access control; {SHAPES}"))),
        };
        Ok(match access {
            TaggedAccess::NotAsked => Access::NotAsked,
            TaggedAccess::Deny => Access::Deny,
            TaggedAccess::Allow(items) => Access::Allow(items),
        })
    }
}

/// Host directories the code may see, split by access mode.
///
/// ```
/// use execbox::PathGrants;
/// let grants = PathGrants::new().read_only("/srv/data").read_write_at("/tmp/job-7", "/work");
/// assert_eq!(grants.read_write[0].guest_path(), std::path::Path::new("/work"));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PathGrants {
    /// Readable, never writable.
    pub read_only: Vec<PathGrant>,
    /// Readable and writable.
    pub read_write: Vec<PathGrant>,
}

impl PathGrants {
    /// No paths.
    pub fn new() -> Self {
        Self::default()
    }

    /// Grants `host` read-only, seen by the code at the same path.
    pub fn read_only(mut self, host: impl Into<PathBuf>) -> Self {
        self.read_only.push(PathGrant::new(host));
        self
    }

    /// Grants `host` read-only, seen by the code at `guest`.
    pub fn read_only_at(mut self, host: impl Into<PathBuf>, guest: impl Into<PathBuf>) -> Self {
        self.read_only.push(PathGrant::new(host).at(guest));
        self
    }

    /// Grants `host` read-write, seen by the code at the same path.
    pub fn read_write(mut self, host: impl Into<PathBuf>) -> Self {
        self.read_write.push(PathGrant::new(host));
        self
    }

    /// Grants `host` read-write, seen by the code at `guest`.
    pub fn read_write_at(mut self, host: impl Into<PathBuf>, guest: impl Into<PathBuf>) -> Self {
        self.read_write.push(PathGrant::new(host).at(guest));
        self
    }
}

/// One granted host directory and where the code sees it.
///
/// Serialized as a plain path string (seen at the same path) or as
/// `{"host": ..., "guest": ...}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "PathGrantRepr")]
pub struct PathGrant {
    /// The directory on the host.
    pub host: PathBuf,
    /// Where the code sees it; `None`: at `host`'s own path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest: Option<PathBuf>,
}

impl PathGrant {
    /// `host`, seen at its own path.
    pub fn new(host: impl Into<PathBuf>) -> Self {
        Self { host: host.into(), guest: None }
    }

    /// Seen by the code at `guest` instead.
    pub fn at(mut self, guest: impl Into<PathBuf>) -> Self {
        self.guest = Some(guest.into());
        self
    }

    /// The path the code uses.
    pub fn guest_path(&self) -> &Path {
        self.guest.as_deref().unwrap_or(&self.host)
    }
}

impl From<&str> for PathGrant {
    fn from(host: &str) -> Self {
        Self::new(host)
    }
}

impl From<PathBuf> for PathGrant {
    fn from(host: PathBuf) -> Self {
        Self::new(host)
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum PathGrantRepr {
    Path(PathBuf),
    Mapped {
        host: PathBuf,
        #[serde(default)]
        guest: Option<PathBuf>,
    },
}

impl From<PathGrantRepr> for PathGrant {
    fn from(repr: PathGrantRepr) -> Self {
        match repr {
            PathGrantRepr::Path(host) => Self { host, guest: None },
            PathGrantRepr::Mapped { host, guest } => Self { host, guest },
        }
    }
}

/// What a request needs: access controls plus resource limits.
///
/// `Default` is [`SandboxPolicy::strict`], and so is any field missing from a
/// serialized policy: a partial policy never loosens a control by omission.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct SandboxPolicy {
    /// Outbound network: hosts (`host` or `host:port`) the code may reach.
    pub network: Access<Vec<String>>,
    /// Host filesystem paths the code may see.
    pub filesystem: Access<PathGrants>,
    /// Environment variable names the code may see (values come from the request).
    pub environment: Access<Vec<String>>,
    /// Wall-clock limit for the whole run, in milliseconds.
    pub timeout_ms: Option<u64>,
    /// Memory cap in bytes (heap / linear memory / cgroup, per backend).
    pub memory_bytes: Option<u64>,
    /// Instruction budget: VM instructions (boa) or fuel units (wasmtime).
    pub fuel: Option<u64>,
    /// Bytes of stdout kept; the rest is counted and dropped.
    pub max_stdout_bytes: Option<u64>,
    /// Bytes of stderr kept; the rest is counted and dropped.
    pub max_stderr_bytes: Option<u64>,
    /// Largest accepted payload (source text or module bytes).
    pub max_code_bytes: Option<u64>,
    /// Largest number of processes/threads the code may create.
    pub max_processes: Option<u64>,
    /// Host tools the code may call (Code Mode): exact names
    /// (`memory.read_graph`), namespaces (`memory.*`), or `*`. Only a backend
    /// whose capabilities enforce the tool bridge runs a request that grants
    /// tools.
    pub tools: Access<Vec<String>>,
    /// How much a run may use its tools (calls, timeouts, sizes). `None`:
    /// not asked; held to a ceiling, the ceiling's limits; run without one,
    /// [`ToolLimits::default`](ToolLimits::default) (see
    /// [`SandboxPolicy::effective_tool_limits`]). Absent from JSON when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_limits: Option<ToolLimits>,
    /// Spilled output: when the run's stdout passes `max_stdout_bytes`, keep
    /// the whole stream (up to the artifact store's largest file,
    /// `ArtifactStoreConfig::max_file_bytes`, feature `artifacts`)
    /// as an artifact of the run's scope
    /// ([`ExecRequest::artifact_scope`](crate::request::ExecRequest::artifact_scope));
    /// the result's stdout is then its head and tail, within the cap, and
    /// [`ExecResult::spilled`](crate::result::ExecResult::spilled) names
    /// the artifact. Done for every backend, after the run (see
    /// [`crate::admission`]). `None`: not asked (held to a ceiling, the
    /// ceiling's value); `Some(false)`: never (a ceiling that says so
    /// refuses requests asking `Some(true)`); `Some(true)`: spill. A run
    /// asking it without an artifact store or without a scope is refused
    /// ([`InvalidRequest::CannotSpill`]).
    ///
    /// Absent from JSON when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spill_output: Option<bool>,
}

impl Default for SandboxPolicy {
    fn default() -> Self {
        Self::strict()
    }
}

impl SandboxPolicy {
    /// The memory cap of [`SandboxPolicy::strict`]: 256 MiB.
    pub const STRICT_MEMORY_BYTES: u64 = 256 << 20;

    /// Deny network, filesystem and environment; 5 s wall clock; a 256 MiB
    /// memory cap ([`SandboxPolicy::STRICT_MEMORY_BYTES`]); 1 MiB per output
    /// stream; 1 MiB of code. No fuel requirement. Every default backend can
    /// enforce all of it; a backend without a memory cap (in-thread boa) is
    /// never chosen for it.
    pub fn strict() -> Self {
        Self {
            network: Access::Deny,
            filesystem: Access::Deny,
            environment: Access::Deny,
            timeout_ms: Some(5_000),
            memory_bytes: Some(Self::STRICT_MEMORY_BYTES),
            fuel: None,
            max_stdout_bytes: Some(1 << 20),
            max_stderr_bytes: Some(1 << 20),
            max_code_bytes: Some(1 << 20),
            max_processes: None,
            tools: Access::Deny,
            tool_limits: None,
            spill_output: None,
        }
    }

    /// For trusted code on the caller's own machine: no access requirements,
    /// 30 s wall clock, 16 MiB per output stream, 16 MiB of code.
    pub fn host_local() -> Self {
        Self {
            network: Access::NotAsked,
            filesystem: Access::NotAsked,
            environment: Access::NotAsked,
            timeout_ms: Some(30_000),
            memory_bytes: None,
            fuel: None,
            max_stdout_bytes: Some(16 << 20),
            max_stderr_bytes: Some(16 << 20),
            max_code_bytes: Some(16 << 20),
            max_processes: None,
            tools: Access::NotAsked,
            tool_limits: None,
            spill_output: None,
        }
    }

    /// Asks for nothing: every access control not asked, every limit unset.
    /// Held to a ceiling ([`SandboxPolicy::within`]) it becomes the ceiling,
    /// so a caller that sets only a deadline gets the ceiling's everything
    /// else. Run without a ceiling, each backend's own defaults apply (its
    /// default deadline: no run goes unbounded).
    pub fn unstated() -> Self {
        Self {
            network: Access::NotAsked,
            filesystem: Access::NotAsked,
            environment: Access::NotAsked,
            timeout_ms: None,
            memory_bytes: None,
            fuel: None,
            max_stdout_bytes: None,
            max_stderr_bytes: None,
            max_code_bytes: None,
            max_processes: None,
            tools: Access::NotAsked,
            tool_limits: None,
            spill_output: None,
        }
    }

    /// Sets the wall-clock limit.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout_ms = Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// Requires a memory cap of `bytes`.
    pub fn memory_bytes(mut self, bytes: u64) -> Self {
        self.memory_bytes = Some(bytes);
        self
    }

    /// Requires an instruction/fuel budget.
    pub fn fuel(mut self, fuel: u64) -> Self {
        self.fuel = Some(fuel);
        self
    }

    /// Caps both stdout and stderr at `bytes`.
    pub fn max_output_bytes(mut self, bytes: u64) -> Self {
        self.max_stdout_bytes = Some(bytes);
        self.max_stderr_bytes = Some(bytes);
        self
    }

    /// Caps the payload size.
    pub fn max_code_bytes(mut self, bytes: u64) -> Self {
        self.max_code_bytes = Some(bytes);
        self
    }

    /// Caps the number of processes/threads.
    pub fn max_processes(mut self, n: u64) -> Self {
        self.max_processes = Some(n);
        self
    }

    /// Sets the network control.
    pub fn network(mut self, access: Access<Vec<String>>) -> Self {
        self.network = access;
        self
    }

    /// Sets the filesystem control.
    pub fn filesystem(mut self, access: Access<PathGrants>) -> Self {
        self.filesystem = access;
        self
    }

    /// Grants tools (names, `namespace.*`, or `*`) to the code.
    pub fn tools<S: Into<String>>(mut self, grants: impl IntoIterator<Item = S>) -> Self {
        self.tools = Access::Allow(grants.into_iter().map(Into::into).collect());
        self
    }

    /// Sets the tool budgets.
    pub fn tool_limits(mut self, limits: ToolLimits) -> Self {
        self.tool_limits = Some(limits);
        self
    }

    /// The tool budgets a run under this policy gets: the stated ones, or
    /// [`ToolLimits::default`](ToolLimits::default).
    pub fn effective_tool_limits(&self) -> ToolLimits {
        self.tool_limits.clone().unwrap_or_default()
    }

    /// Keeps the whole stdout as an artifact when it passes its cap (see
    /// [`SandboxPolicy::spill_output`]).
    pub fn spill_output(mut self, spill: bool) -> Self {
        self.spill_output = Some(spill);
        self
    }

    /// The granted tools' patterns, if the policy grants any.
    pub fn tool_grants(&self) -> Option<&[String]> {
        match &self.tools {
            Access::Allow(grants) if !grants.is_empty() => Some(grants),
            _ => None,
        }
    }

    /// Sets the environment control.
    pub fn environment(mut self, access: Access<Vec<String>>) -> Self {
        self.environment = access;
        self
    }

    /// The wall-clock limit as a `Duration`.
    pub fn timeout_duration(&self) -> Option<Duration> {
        self.timeout_ms.map(Duration::from_millis)
    }

    /// This policy held to `ceiling`: never looser than either.
    ///
    /// - Each limit is the smaller of the two; one that only the ceiling
    ///   states is the ceiling's.
    /// - An access control the request does not ask about takes the
    ///   ceiling's (its deny, or its whole allow-list); a deny stays a deny.
    /// - An allow-list must be within the ceiling's: a ceiling that denies
    ///   the surface, or an item the ceiling's list lacks, is an
    ///   [`InvalidRequest::OverCeiling`] naming the control.
    pub fn within(&self, ceiling: &SandboxPolicy) -> Result<SandboxPolicy, InvalidRequest> {
        let min = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Ok(SandboxPolicy {
            network: access_within(&self.network, &ceiling.network, "network", |asked, allowed| {
                asked.iter().filter(|h| !allowed.contains(h)).cloned().collect()
            })?,
            filesystem: access_within(&self.filesystem, &ceiling.filesystem, "filesystem", grants_outside)?,
            environment: access_within(&self.environment, &ceiling.environment, "environment", |asked, allowed| {
                asked.iter().filter(|n| !allowed.contains(n)).cloned().collect()
            })?,
            timeout_ms: min(self.timeout_ms, ceiling.timeout_ms),
            memory_bytes: min(self.memory_bytes, ceiling.memory_bytes),
            fuel: min(self.fuel, ceiling.fuel),
            max_stdout_bytes: min(self.max_stdout_bytes, ceiling.max_stdout_bytes),
            max_stderr_bytes: min(self.max_stderr_bytes, ceiling.max_stderr_bytes),
            max_code_bytes: min(self.max_code_bytes, ceiling.max_code_bytes),
            max_processes: min(self.max_processes, ceiling.max_processes),
            tools: access_within(&self.tools, &ceiling.tools, "tools", |asked, allowed| {
                tools::grants_outside(asked, allowed)
            })?,
            // Not asked: the ceiling's. A ceiling that states none holds a
            // request to the defaults, as a run without a ceiling gets them.
            tool_limits: match (&self.tool_limits, &ceiling.tool_limits) {
                (None, ceiling) => ceiling.clone(),
                (Some(asked), ceiling) => Some(asked.within(&ceiling.clone().unwrap_or_default())),
            },
            spill_output: match (self.spill_output, ceiling.spill_output) {
                (None, ceiling) => ceiling,
                (Some(true), Some(false)) => {
                    return Err(InvalidRequest::OverCeiling {
                        control: "spill_output",
                        beyond: vec!["spilled output (the ceiling says never)".into()],
                    });
                }
                (asked, _) => asked,
            },
        })
    }
}

/// One access control held to its ceiling (see [`SandboxPolicy::within`]);
/// `outside` lists what an allow-list asks beyond the ceiling's.
fn access_within<T: Clone>(
    asked: &Access<T>,
    ceiling: &Access<T>,
    control: &'static str,
    outside: impl Fn(&T, &T) -> Vec<String>,
) -> Result<Access<T>, InvalidRequest> {
    match (asked, ceiling) {
        (Access::NotAsked, c) => Ok(c.clone()),
        (Access::Deny, _) => Ok(Access::Deny),
        (a @ Access::Allow(_), Access::NotAsked) => Ok(a.clone()),
        (Access::Allow(_), Access::Deny) => {
            Err(InvalidRequest::OverCeiling { control, beyond: vec!["any access (the ceiling denies it)".into()] })
        }
        (Access::Allow(a), Access::Allow(c)) => {
            let beyond = outside(a, c);
            if beyond.is_empty() {
                Ok(Access::Allow(a.clone()))
            } else {
                Err(InvalidRequest::OverCeiling { control, beyond })
            }
        }
    }
}

/// Grants in `asked` that `allowed` does not hold: the same host directory
/// at the same guest path, and read-write only where the ceiling grants it
/// read-write.
fn grants_outside(asked: &PathGrants, allowed: &PathGrants) -> Vec<String> {
    let has =
        |list: &[PathGrant], g: &PathGrant| list.iter().any(|c| c.host == g.host && c.guest_path() == g.guest_path());
    let ro = asked
        .read_only
        .iter()
        .filter(|g| !has(&allowed.read_only, g) && !has(&allowed.read_write, g))
        .map(|g| format!("{} (read-only)", g.host.display()));
    let rw = asked
        .read_write
        .iter()
        .filter(|g| !has(&allowed.read_write, g))
        .map(|g| format!("{} (read-write)", g.host.display()));
    ro.chain(rw).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn within_never_loosens_either_policy() {
        let ceiling = SandboxPolicy::strict()
            .timeout(Duration::from_secs(10))
            .environment(Access::Allow(vec!["A".into(), "B".into()]))
            .filesystem(Access::Allow(PathGrants::new().read_only("/data").read_write("/scratch")));
        // Limits: the smaller; unstated ones come from the ceiling.
        let asked = SandboxPolicy { timeout_ms: Some(60_000), memory_bytes: None, ..SandboxPolicy::strict() }
            .max_output_bytes(10)
            .network(Access::NotAsked)
            .environment(Access::NotAsked);
        let held = asked.within(&ceiling).unwrap();
        assert_eq!(held.timeout_ms, Some(10_000));
        assert_eq!(held.memory_bytes, ceiling.memory_bytes);
        assert_eq!(held.max_stdout_bytes, Some(10));
        assert_eq!(held.network, Access::Deny);
        assert_eq!(held.environment, ceiling.environment);
        // Allow-lists inside the ceiling's pass; a read-only view of a
        // read-write grant is inside it.
        let inside = SandboxPolicy::strict()
            .environment(Access::Allow(vec!["B".into()]))
            .filesystem(Access::Allow(PathGrants::new().read_only("/scratch")));
        assert_eq!(inside.within(&ceiling).unwrap().environment, Access::Allow(vec!["B".into()]));
        // Anything beyond is refused, naming it.
        for (over, what) in [
            (SandboxPolicy::strict().environment(Access::Allow(vec!["C".into()])), "C"),
            (SandboxPolicy::strict().filesystem(Access::Allow(PathGrants::new().read_write("/data"))), "/data"),
            (SandboxPolicy::strict().filesystem(Access::Allow(PathGrants::new().read_only_at("/data", "/d"))), "/data"),
            (SandboxPolicy::strict().network(Access::Allow(vec!["example.org".into()])), "the ceiling denies it"),
        ] {
            let err = over.within(&ceiling).unwrap_err().to_string();
            assert!(err.contains(what), "{err}");
        }
        // A deny stays a deny under a looser ceiling.
        let loose = SandboxPolicy::host_local();
        assert_eq!(SandboxPolicy::strict().within(&loose).unwrap().network, Access::Deny);
    }

    #[test]
    fn spill_output_is_held_like_an_access_control() {
        let spill = |asked: Option<bool>, ceiling: Option<bool>| {
            let mut a = SandboxPolicy::unstated();
            a.spill_output = asked;
            let mut c = SandboxPolicy::strict();
            c.spill_output = ceiling;
            a.within(&c).map(|p| p.spill_output)
        };
        assert_eq!(spill(None, None), Ok(None));
        assert_eq!(spill(None, Some(true)), Ok(Some(true)), "not asked takes the ceiling's");
        assert_eq!(spill(Some(true), None), Ok(Some(true)));
        assert_eq!(spill(Some(false), Some(true)), Ok(Some(false)), "never stays never");
        let err = spill(Some(true), Some(false)).unwrap_err();
        assert!(matches!(err, InvalidRequest::OverCeiling { control: "spill_output", .. }), "{err}");
        // Absent from JSON unless asked, so policies read as before.
        assert!(serde_json::to_value(SandboxPolicy::strict()).unwrap().get("spill_output").is_none());
        let p: SandboxPolicy = serde_json::from_str(r#"{"spill_output": true}"#).unwrap();
        assert_eq!(p.spill_output, Some(true));
    }

    #[test]
    fn unstated_tool_limits_take_the_ceilings_even_above_the_defaults() {
        use ToolLimits;
        let ceiling = SandboxPolicy::strict().tool_limits(ToolLimits::default().max_calls(500));
        let held = SandboxPolicy::unstated().within(&ceiling).unwrap();
        assert_eq!(held.effective_tool_limits().max_calls, 500);
        let asked = SandboxPolicy::unstated().tool_limits(ToolLimits::default().max_calls(1000));
        assert_eq!(asked.within(&ceiling).unwrap().effective_tool_limits().max_calls, 500, "the smaller wins");
        let no_ceiling_limits = asked.within(&SandboxPolicy::strict()).unwrap();
        assert_eq!(no_ceiling_limits.effective_tool_limits().max_calls, 100, "the defaults hold when unstated");
        let p: SandboxPolicy = serde_json::from_str(r#"{"tool_limits": {"max_calls": 500}}"#).unwrap();
        assert_eq!(p.effective_tool_limits().max_calls, 500);
        assert_eq!(p.effective_tool_limits().call_timeout_ms, ToolLimits::default().call_timeout_ms);
    }

    #[test]
    fn partial_json_policy_keeps_strict_defaults() {
        let p: SandboxPolicy = serde_json::from_str(r#"{"timeout_ms": 100}"#).unwrap();
        assert_eq!(p.timeout_ms, Some(100));
        assert_eq!(p.network, Access::Deny);
        assert_eq!(p.max_stdout_bytes, Some(1 << 20));
    }

    #[test]
    fn access_serializes_with_mode_tag() {
        let a: Access<Vec<String>> = Access::Allow(vec!["PATH".into()]);
        let s = serde_json::to_string(&a).unwrap();
        assert_eq!(s, r#"{"mode":"allow","allow":["PATH"]}"#);
        let back: Access<Vec<String>> = serde_json::from_str(&s).unwrap();
        assert_eq!(back, a);
        let d: Access<Vec<String>> = serde_json::from_str(r#"{"mode":"deny"}"#).unwrap();
        assert_eq!(d, Access::Deny);
    }

    #[test]
    fn access_reads_the_obvious_shorthands_and_names_the_shapes_otherwise() {
        let p: SandboxPolicy = serde_json::from_str(
            r#"{"tools": ["memory.*"], "environment": "not_asked", "network": "deny",
                "filesystem": {"read_only": ["/data"]}}"#,
        )
        .unwrap();
        assert_eq!(p.tools, Access::Allow(vec!["memory.*".into()]));
        assert_eq!(p.environment, Access::NotAsked);
        assert_eq!(p.network, Access::Deny);
        assert_eq!(p.filesystem, Access::Allow(PathGrants::new().read_only("/data")));
        let full: SandboxPolicy =
            serde_json::from_str(r#"{"tools": {"mode": "allow", "allow": ["memory.*"]}}"#).unwrap();
        assert_eq!(full.tools, p.tools);
        for bad in [r#"{"tools": "memory.*"}"#, r#"{"tools": 7}"#, r#"{"tools": {"mode": "sometimes"}}"#] {
            let err = serde_json::from_str::<SandboxPolicy>(bad).unwrap_err().to_string();
            assert!(err.contains(r#"["memory.*"]"#) && err.contains(r#"{"mode": "allow""#), "{bad}: {err}");
        }
        assert!(serde_json::from_str::<SandboxPolicy>(r#"{"tools": [7]}"#).is_err());
    }

    #[test]
    fn path_grants_accept_plain_and_mapped_paths() {
        let g: PathGrants =
            serde_json::from_str(r#"{"read_only": ["/data", {"host": "/tmp/x", "guest": "/work"}]}"#).unwrap();
        assert_eq!(g.read_only[0], PathGrant::new("/data"));
        assert_eq!(g.read_only[1].guest_path(), Path::new("/work"));
        let back: PathGrants = serde_json::from_str(&serde_json::to_string(&g).unwrap()).unwrap();
        assert_eq!(back, g);
    }

    #[test]
    fn unknown_policy_fields_are_rejected() {
        assert!(serde_json::from_str::<SandboxPolicy>(r#"{"netwrok": {"mode":"deny"}}"#).is_err());
    }
}
