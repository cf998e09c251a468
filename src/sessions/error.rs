//! [`SessionError`]: why a session call produced no result.

use serde::Serialize;

use crate::error::ExecError;
use crate::language::Language;

/// Why a session call produced no result.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// No session has this id (never opened here, or closed).
    #[error("no session {id:?} is open")]
    Unknown {
        /// The id asked for.
        id: String,
    },
    /// The session ended without being closed; its state is gone.
    #[error("session {id:?} was lost ({reason}); its state is gone, so open a new session")]
    Lost {
        /// The id asked for.
        id: String,
        /// What ended it.
        reason: String,
    },
    /// Every session slot is taken.
    #[error("all {max} sessions are in use; close one or wait for one to go idle")]
    TooMany {
        /// The bound.
        max: usize,
    },
    /// No registered backend keeps sessions for this language.
    #[error("stateful sessions are not available for {language}")]
    Unsupported {
        /// The language asked for.
        language: Language,
    },
    /// No session backend of the language provides every declared package.
    #[error("no {language} session provides {}", packages.join(", "))]
    PackagesUnavailable {
        /// The language asked for.
        language: Language,
        /// The packages no session backend provides.
        packages: Vec<String>,
    },
    /// The request pins a backend other than the session's.
    #[error("session {id:?} runs on {session}, not {requested}")]
    WrongBackend {
        /// The id asked for.
        id: String,
        /// The session's backend.
        session: String,
        /// The backend the request pinned.
        requested: String,
    },
    /// A session with this id is already open.
    #[error("a session {id:?} is already open")]
    Exists {
        /// The id asked for.
        id: String,
    },
    /// The session has another language than the request.
    #[error("session {id:?} runs {session}, not {requested}")]
    WrongLanguage {
        /// The id asked for.
        id: String,
        /// The session's language.
        session: Language,
        /// The request's language.
        requested: Language,
    },
    /// Opening the session, or the call, was refused or failed before a result.
    #[error(transparent)]
    Exec(#[from] ExecError),
}

impl SessionError {
    /// Stable snake_case kind for JSON.
    pub fn kind(&self) -> &'static str {
        match self {
            SessionError::Unknown { .. } => "unknown_session",
            SessionError::Lost { .. } => "session_lost",
            SessionError::TooMany { .. } => "too_many_sessions",
            SessionError::Unsupported { .. } => "stateful_unsupported",
            SessionError::PackagesUnavailable { .. } => "packages_unavailable",
            SessionError::Exists { .. } => "session_exists",
            SessionError::WrongLanguage { .. } => "wrong_language",
            SessionError::WrongBackend { .. } => "wrong_backend",
            SessionError::Exec(e) => e.kind(),
        }
    }

    /// The same error naming the session `id`: for callers whose ids are
    /// not the registry's keys (the MCP server keys a session by its
    /// connection too), so that no error shows a key its caller never gave.
    pub fn with_id(self, id: &str) -> Self {
        let id = id.to_string();
        match self {
            SessionError::Unknown { .. } => SessionError::Unknown { id },
            SessionError::Lost { reason, .. } => SessionError::Lost { id, reason },
            SessionError::WrongBackend { session, requested, .. } => {
                SessionError::WrongBackend { id, session, requested }
            }
            SessionError::Exists { .. } => SessionError::Exists { id },
            SessionError::WrongLanguage { session, requested, .. } => {
                SessionError::WrongLanguage { id, session, requested }
            }
            // These name no session.
            e @ (SessionError::TooMany { .. }
            | SessionError::Unsupported { .. }
            | SessionError::PackagesUnavailable { .. }
            | SessionError::Exec(_)) => e,
        }
    }
}

/// [`ExecError`]'s JSON shape: `{"kind", "message", "violations"}`.
impl Serialize for SessionError {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            SessionError::Exec(e) => e.serialize(serializer),
            _ => crate::error::serialize_error(serializer, self.kind(), self.to_string(), &[] as &[()]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_id_replaces_every_key_a_caller_never_gave() {
        let key = "7/abc";
        let errors = [
            SessionError::Unknown { id: key.into() },
            SessionError::Lost { id: key.into(), reason: "r".into() },
            SessionError::WrongBackend { id: key.into(), session: "s".into(), requested: "r".into() },
            SessionError::Exists { id: key.into() },
            SessionError::WrongLanguage { id: key.into(), session: Language::Python, requested: Language::JavaScript },
        ];
        for error in errors {
            let kind = error.kind();
            let text = error.with_id("abc").to_string();
            assert!(!text.contains(key) && text.contains("\"abc\""), "{kind}: {text}");
        }
    }
}
