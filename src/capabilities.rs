//! [`BackendCapabilities`]: what a backend can run and which controls it enforces.
//!
//! A backend declares a control enforced only if the control holds against
//! hostile code; anything weaker is `NotEnforced` with the reason, so the
//! executor fails closed instead of trusting a best effort.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::language::Language;

/// The form of a request's code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum PayloadKind {
    /// UTF-8 source text.
    Source,
    /// Binary (or WAT) WebAssembly module bytes.
    WasmModule,
}

/// How strongly a backend isolates code from the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IsolationKind {
    /// Inside the caller's process (an interpreter or wasm runtime): a fault
    /// in the engine is a fault in the host.
    InProcess,
    /// In a separate OS process of execbox's own (a worker): memory rlimit,
    /// SIGKILL at the deadline, seccomp, killed with the host. An engine crash
    /// ends the worker, not the host.
    WorkerProcess,
    /// A fresh container per call, removed afterwards.
    ContainerEphemeral,
    /// A container kept across calls.
    ContainerPersistent,
    /// A plain host process: no isolation beyond the OS user.
    HostProcess,
}

/// Relative start-up cost; the executor prefers the cheapest satisfying backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CostClass {
    /// Microseconds to a few milliseconds per call (in-process engines).
    Low,
    /// Tens of milliseconds (warm processes, large interpreters in wasm).
    Medium,
    /// Hundreds of milliseconds or more (containers).
    High,
}

/// Whether and how a backend enforces one control.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "level")]
pub enum Enforcement {
    /// Enforced against hostile code, by the mechanism in `how`.
    Enforced {
        /// The mechanism, for people reading `execbox backends`.
        how: Cow<'static, str>,
    },
    /// The backend has no such surface at all (e.g. no network API exists),
    /// which is real enforcement of a deny and of any limit on that surface.
    ByOmission {
        /// Why the surface does not exist.
        why: Cow<'static, str>,
    },
    /// Not enforced: a request that states this control is refused.
    NotEnforced {
        /// Why not.
        why: Cow<'static, str>,
    },
}

impl Enforcement {
    /// Enforced by a mechanism.
    pub fn enforced(how: impl Into<Cow<'static, str>>) -> Self {
        Enforcement::Enforced { how: how.into() }
    }

    /// The tool surface of a backend that cannot carry the tool bridge:
    /// denied by omission, grants not enforced.
    pub fn no_tool_bridge() -> SurfaceCapability {
        SurfaceCapability {
            deny: Enforcement::by_omission("the code has no channel to the host's tools"),
            allow_list: Enforcement::not_enforced("this backend does not carry the tool bridge"),
        }
    }

    /// Enforced because the surface does not exist.
    pub fn by_omission(why: impl Into<Cow<'static, str>>) -> Self {
        Enforcement::ByOmission { why: why.into() }
    }

    /// Not enforced.
    pub fn not_enforced(why: impl Into<Cow<'static, str>>) -> Self {
        Enforcement::NotEnforced { why: why.into() }
    }

    /// True for `Enforced` and `ByOmission`.
    pub fn holds(&self) -> bool {
        !matches!(self, Enforcement::NotEnforced { .. })
    }

    /// The explanation text, whatever the level.
    pub fn detail(&self) -> &str {
        match self {
            Enforcement::Enforced { how } => how,
            Enforcement::ByOmission { why } | Enforcement::NotEnforced { why } => why,
        }
    }
}

/// An access surface (network, filesystem, environment): can the backend deny
/// it, and can it grant an explicit allow-list?
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SurfaceCapability {
    /// How a `Deny` is enforced.
    pub deny: Enforcement,
    /// How an `Allow(list)` is enforced: granting exactly the list and nothing
    /// more. `NotEnforced` if the backend cannot grant this surface at all, or
    /// only all-or-nothing.
    pub allow_list: Enforcement,
}

/// Request features beyond code and policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestFeatures {
    /// Structured JSON `input` reaches the code.
    pub json_input: bool,
    /// Bytes on standard input.
    pub stdin: bool,
    /// Command-line arguments.
    pub args: bool,
    /// Files staged for the code to read.
    pub input_files: bool,
    /// Files the code writes returned with the result.
    pub output_files: bool,
}

/// Everything the executor needs to decide whether a backend may run a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendCapabilities {
    /// Isolation from the host.
    pub isolation: IsolationKind,
    /// Relative start-up cost.
    pub cost: CostClass,
    /// Languages accepted.
    pub languages: Vec<Language>,
    /// Payload forms accepted.
    pub payloads: Vec<PayloadKind>,
    /// Request features supported.
    pub features: RequestFeatures,
    /// Outbound network.
    pub network: SurfaceCapability,
    /// Host filesystem.
    pub filesystem: SurfaceCapability,
    /// Environment variables.
    pub environment: SurfaceCapability,
    /// Wall-clock deadline.
    pub timeout: Enforcement,
    /// Memory cap.
    pub memory: Enforcement,
    /// Instruction / fuel budget.
    pub fuel: Enforcement,
    /// Stdout byte cap.
    pub stdout_cap: Enforcement,
    /// Stderr byte cap.
    pub stderr_cap: Enforcement,
    /// Process/thread count cap.
    pub processes: Enforcement,
    /// Host tools (Code Mode): `deny` holds when the code has no way to
    /// reach the host's tools; `allow_list` when the backend carries the
    /// tool bridge (the code reaches exactly the granted tools, within the
    /// policy's tool limits).
    pub tools: SurfaceCapability,
    /// A workspace ([`crate::workspace`]) seen read-write at `/work`,
    /// within its quota. Not enforced by a backend that carries no files.
    pub workspace: Enforcement,
    /// The deadline a run gets when its policy states none, in milliseconds:
    /// no backend runs without a limit. The executor writes it into the
    /// request's policy before the run.
    pub default_timeout_ms: u64,
}

impl BackendCapabilities {
    /// The deadline of a run under `policy`: its own, else this backend's default.
    pub fn effective_timeout(&self, policy: &crate::policy::SandboxPolicy) -> std::time::Duration {
        std::time::Duration::from_millis(policy.timeout_ms.unwrap_or(self.default_timeout_ms))
    }
}

#[cfg(test)]
impl BackendCapabilities {
    /// A JavaScript backend that enforces everything but allow-lists: for
    /// unit tests of what uses capabilities.
    pub(crate) fn test_fixture() -> Self {
        let yes = || Enforcement::enforced("test");
        let surface = || SurfaceCapability { deny: yes(), allow_list: Enforcement::not_enforced("test") };
        BackendCapabilities {
            isolation: IsolationKind::InProcess,
            cost: CostClass::Low,
            languages: vec![Language::JavaScript],
            payloads: vec![PayloadKind::Source],
            features: RequestFeatures { json_input: true, ..Default::default() },
            network: surface(),
            filesystem: surface(),
            environment: surface(),
            timeout: yes(),
            memory: yes(),
            fuel: yes(),
            stdout_cap: yes(),
            stderr_cap: yes(),
            processes: yes(),
            tools: SurfaceCapability { deny: yes(), allow_list: yes() },
            workspace: yes(),
            default_timeout_ms: 1000,
        }
    }
}
