//! [`ExecError`]: refusals and executor faults (never a program's own failure).

use std::fmt;
use std::sync::Arc;

use serde::Serialize;
use serde_json::{Value, json};

use crate::language::Language;
use crate::text::cap_message;
use crate::violation::Violation;

pub(crate) mod tool;

/// Why one backend was not chosen.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BackendRejection {
    /// Backend name.
    pub backend: String,
    /// Every unmet control, not just the first.
    pub violations: Vec<Violation>,
}

/// A request that is wrong whichever backend would run it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidRequest {
    /// The payload exceeds the policy's `max_code_bytes`.
    #[error("code is {size} bytes, over the policy's max_code_bytes of {max}")]
    CodeTooLarge {
        /// Payload size.
        size: u64,
        /// The limit.
        max: u64,
    },
    /// Code or input nests deeper than the backend can parse without risking
    /// its native stack.
    #[error("{what} nests {depth} levels deep, over the limit of {max}")]
    TooDeep {
        /// What was too deep (`code`, `input`).
        what: &'static str,
        /// Depth found (at least this much).
        depth: usize,
        /// The limit.
        max: usize,
    },
    /// The payload is not a usable module: malformed, invalid, an import the
    /// host does not provide, or exports matching no supported guest ABI.
    #[error("invalid module: {reason}")]
    InvalidModule {
        /// What is wrong, in the engine's words where it has them.
        reason: String,
    },
    /// A granted path or staged file cannot be used as asked.
    #[error("path {path:?} cannot be used: {reason}")]
    BadPath {
        /// The path as given.
        path: String,
        /// Why not.
        reason: String,
    },
    /// Both `stdin` and a JSON `input` were given to a backend that delivers
    /// `input` on standard input.
    #[error("{0}")]
    Conflict(&'static str),
    /// An environment variable cannot be passed as given.
    #[error("environment variable {name:?} cannot be passed: {reason}")]
    BadEnv {
        /// The variable's name.
        name: String,
        /// Why not.
        reason: String,
    },
    /// A policy limit is outside what the chosen backend can apply.
    #[error("{limit} of {value} is out of range: {reason}")]
    LimitOutOfRange {
        /// Which limit (`memory_bytes`, ...).
        limit: &'static str,
        /// The value asked for.
        value: u64,
        /// The accepted range.
        reason: String,
    },
    /// The request's policy asks for more than the executor's ceiling allows
    /// (see [`SandboxPolicy::within`](crate::policy::SandboxPolicy::within)).
    #[error("the policy asks for more {control} access than the configured ceiling allows: {}", beyond.join(", "))]
    OverCeiling {
        /// Which control (`network`, `filesystem`, `environment`).
        control: &'static str,
        /// What lies beyond the ceiling.
        beyond: Vec<String>,
    },
    /// The declared packages cannot be read as package names.
    #[error("bad package list: {reason}")]
    BadPackages {
        /// What is wrong.
        reason: String,
    },
    /// An argument of the request (on the command line, or of a tool call)
    /// cannot be used as given.
    #[error("{name}: {reason}")]
    Argument {
        /// The argument (e.g. `--input`).
        name: String,
        /// Why not.
        reason: String,
    },
    /// The policy grants tools by name that no registered tool has.
    #[error("the policy grants tools that are not registered: {}", names.join(", "))]
    UnknownTools {
        /// The names.
        names: Vec<String>,
    },
    /// The policy asks to spill output
    /// ([`SandboxPolicy::spill_output`](crate::policy::SandboxPolicy::spill_output))
    /// where it cannot be kept: no artifact store, or a run without a scope.
    #[error("spill_output cannot be honoured: {reason}")]
    CannotSpill {
        /// Why not, and what would do.
        reason: String,
    },
    /// The request sets environment variables the policy does not allow.
    #[error("environment variables not allowed by the policy: {}", names.join(", "))]
    EnvNotAllowed {
        /// The offending names.
        names: Vec<String>,
    },
}

/// A configuration that cannot be honoured: the caller's to fix (or, for
/// [`ConfigError::Unsupported`], the machine cannot do what it asks).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A setting's value cannot be used as given.
    #[error("{setting}: {reason}")]
    Invalid {
        /// The setting (e.g. `ContainerConfig::extra_run_args`).
        setting: &'static str,
        /// Why not, and what would do.
        reason: String,
    },
    /// This machine cannot do what the configuration asks.
    #[error("unsupported here: {reason}")]
    Unsupported {
        /// What is missing.
        reason: String,
    },
}

impl ConfigError {
    /// A [`ConfigError::Invalid`] of `setting`.
    pub fn invalid(setting: &'static str, reason: impl Into<String>) -> Self {
        ConfigError::Invalid { setting, reason: reason.into() }
    }

    /// Stable snake_case kind for JSON: `config`.
    pub fn kind(&self) -> &'static str {
        "config"
    }

    /// `{"error": <this error's JSON>}`, as [`ExecError::to_json`].
    pub fn to_json(&self) -> Value {
        json!({"error": self})
    }
}

/// [`ExecError`]'s JSON shape: `{"kind": "config", "message", "violations": []}`.
impl Serialize for ConfigError {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serialize_error(serializer, self.kind(), self.to_string(), &[] as &[()])
    }
}

/// Why a request was not run, or an executor fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    /// No backend can enforce everything the request needs; no code ran.
    #[error("refused: {}", RejectionList(rejections))]
    Refused {
        /// Per backend considered, every unmet control.
        rejections: Vec<BackendRejection>,
    },
    /// No registered backend runs this language at all.
    #[error("no registered backend runs {language} (registered: {})", available.join(", "))]
    UnsupportedLanguage {
        /// The language asked for.
        language: Language,
        /// Names of the registered backends.
        available: Vec<String>,
    },
    /// The request pinned a backend name that is not registered.
    #[error("no backend named {name:?} (registered: {})", available.join(", "))]
    UnknownBackend {
        /// The name asked for.
        name: String,
        /// Names of the registered backends.
        available: Vec<String>,
    },
    /// The request itself is invalid; no code ran.
    #[error("invalid request: {0}")]
    InvalidRequest(#[from] InvalidRequest),
    /// The backend exists but cannot run now (engine missing, image missing...).
    #[error("backend {backend} is unavailable: {reason}{}", fix_suffix(fix))]
    BackendUnavailable {
        /// Backend name.
        backend: String,
        /// What is missing or broken.
        reason: String,
        /// What to do about it, if execbox knows (see [`crate::Unavailable`]).
        fix: Option<String>,
    },
    /// The backend had no free capacity (pool slot, worker) before the
    /// request's deadline passed; no code ran. Retrying later may succeed.
    #[error("backend {backend} is busy: {reason}")]
    Busy {
        /// Backend name.
        backend: String,
        /// What was full.
        reason: String,
    },
    /// A fault inside execbox or the engine, not caused by the program.
    #[error("internal error in backend {backend}: {message}")]
    Internal {
        /// Backend name.
        backend: String,
        /// What went wrong.
        message: String,
        /// The error underneath, when there is one (its own causes follow
        /// it through [`std::error::Error::source`]).
        #[source]
        cause: Option<Cause>,
    },
}

/// The error under an [`ExecError::Internal`], shared so that the error stays
/// `Clone`. Two causes are equal when they read the same.
#[derive(Clone, Debug)]
pub struct Cause(Arc<dyn std::error::Error + Send + Sync + 'static>);

impl Cause {
    /// Wraps `error` (an `std` error, an `anyhow`/`wasmtime` error, or text).
    pub fn new(error: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        Cause(Arc::from(error.into()))
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Cause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for Cause {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0.to_string() == other.0.to_string()
    }
}

impl Eq for Cause {}

/// `error` and each of its causes, joined by `: `, for people and for JSON
/// `message`s (an error's own `Display` leaves its causes out). A cause whose
/// text already ends the line (an error that prints its source) is not repeated.
pub fn with_causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        let said = cause.to_string();
        if !text.ends_with(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        next = cause.source();
    }
    text
}

/// ` — <fix>` after a reason, or nothing: how an unavailable backend's fix
/// reads wherever its reason is printed.
pub(crate) fn fix_suffix(fix: &Option<String>) -> String {
    fix.as_ref().map(|fix| format!(" — {fix}")).unwrap_or_default()
}

struct RejectionList<'a>(&'a [BackendRejection]);

impl fmt::Display for RejectionList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("no backends are registered");
        }
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: ", r.backend)?;
            for (j, v) in r.violations.iter().enumerate() {
                if j > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{v}")?;
            }
        }
        Ok(())
    }
}

impl ExecError {
    /// An [`ExecError::BackendUnavailable`] of `backend` with no known fix.
    pub fn unavailable(backend: &str, reason: impl Into<String>) -> Self {
        ExecError::BackendUnavailable { backend: backend.to_string(), reason: reason.into(), fix: None }
    }

    /// An [`ExecError::Internal`] of `backend`.
    pub fn internal(backend: &str, message: impl Into<String>) -> Self {
        ExecError::Internal { backend: backend.to_string(), message: message.into(), cause: None }
    }

    /// An [`ExecError::Internal`] of `backend`: `doing` failed because of `cause`.
    pub fn internal_caused(
        backend: &str,
        doing: impl Into<String>,
        cause: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        ExecError::Internal { backend: backend.to_string(), message: doing.into(), cause: Some(Cause::new(cause)) }
    }

    /// Stable snake_case kind used in JSON (`refused`, `invalid_request`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            ExecError::Refused { .. } => "refused",
            ExecError::UnsupportedLanguage { .. } => "unsupported_language",
            ExecError::UnknownBackend { .. } => "unknown_backend",
            ExecError::InvalidRequest(_) => "invalid_request",
            ExecError::BackendUnavailable { .. } => "backend_unavailable",
            ExecError::Busy { .. } => "busy",
            ExecError::Internal { .. } => "internal",
        }
    }

    /// Every violation, each tagged with its backend (empty unless `Refused`).
    pub fn violations(&self) -> Vec<(String, Violation)> {
        match self {
            ExecError::Refused { rejections } => {
                rejections.iter().flat_map(|r| r.violations.iter().map(|v| (r.backend.clone(), v.clone()))).collect()
            }
            _ => Vec::new(),
        }
    }

    /// For people: the error in one line, or a refusal as one line per
    /// unmet control and backend; every text capped like a result's message.
    pub fn describe(&self) -> String {
        match self {
            ExecError::Refused { rejections } => {
                let mut text = "refused: no backend can enforce this request".to_string();
                for r in rejections {
                    for v in &r.violations {
                        text.push_str(&format!("\n  {}: {}", r.backend, cap_message(v.to_string())));
                    }
                }
                text
            }
            other => cap_message(with_causes(other)),
        }
    }

    /// `{"error": <this error's JSON>}`: what `execbox run --json` prints
    /// when nothing ran.
    pub fn to_json(&self) -> Value {
        json!({"error": self})
    }
}

/// One violation in an error's JSON, tagged with its backend; its texts
/// capped like a result's `message`.
#[derive(Serialize)]
struct ViolationJson<'a> {
    backend: &'a str,
    control: crate::violation::Control,
    requested: String,
    reason: String,
}

/// In JSON: `{"kind", "message", "violations": [{"backend", "control",
/// "requested", "reason"}]}`; `violations` is empty unless `kind` is
/// `refused`. Every text is capped like a result's `message` (4 KiB: an
/// invalid module's reason can quote the payload).
impl Serialize for ExecError {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let violations: Vec<ViolationJson<'_>> = match self {
            ExecError::Refused { rejections } => rejections
                .iter()
                .flat_map(|r| {
                    r.violations.iter().map(|v| ViolationJson {
                        backend: &r.backend,
                        control: v.control,
                        requested: cap_message(v.requested.clone()),
                        reason: cap_message(v.reason.clone()),
                    })
                })
                .collect(),
            _ => Vec::new(),
        };
        serialize_error(serializer, self.kind(), with_causes(self), &violations)
    }
}

/// The error JSON shape `{"kind", "message", "violations"}` (the message
/// capped), for every error type that has it.
pub(crate) fn serialize_error<S: serde::Serializer, V: Serialize>(
    serializer: S,
    kind: &str,
    message: String,
    violations: &[V],
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeStruct;
    let mut s = serializer.serialize_struct("Error", 3)?;
    s.serialize_field("kind", kind)?;
    s.serialize_field("message", &cap_message(message))?;
    s.serialize_field("violations", violations)?;
    s.end()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_internal_error_keeps_its_cause_and_says_it_once() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "the kernel said no");
        let error = ExecError::internal_caused("wasm", "cannot spawn the guest thread", io);
        assert_eq!(error.to_string(), "internal error in backend wasm: cannot spawn the guest thread");
        let cause = std::error::Error::source(&error).expect("the cause is kept");
        assert_eq!(cause.to_string(), "the kernel said no");
        let io = cause.downcast_ref::<Cause>().expect("a Cause");
        assert_eq!(io.to_string(), "the kernel said no");
        let said = "internal error in backend wasm: cannot spawn the guest thread: the kernel said no";
        assert_eq!(error.describe(), said);
        assert_eq!(error.to_json()["error"]["message"], said);
        // Clones share the cause and stay equal.
        assert_eq!(error.clone(), error);
    }

    #[test]
    fn a_cause_that_its_error_already_prints_is_not_repeated() {
        let error = ExecError::from(InvalidRequest::Conflict("stdin and input both given"));
        assert!(std::error::Error::source(&error).is_some());
        assert_eq!(error.describe(), "invalid request: stdin and input both given");
        assert_eq!(with_causes(&error), "invalid request: stdin and input both given");
    }

    #[test]
    fn causes_chain_through_every_level() {
        #[derive(Debug, thiserror::Error)]
        #[error("reading the manifest")]
        struct Outer(#[source] std::io::Error);
        let error = ExecError::internal_caused("container", "cannot stage", Outer(std::io::Error::other("disk full")));
        assert_eq!(
            with_causes(&error),
            "internal error in backend container: cannot stage: reading the manifest: disk full"
        );
    }
}
