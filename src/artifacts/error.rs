//! [`ArtifactError`]: why the artifact store did not do what it was asked.

use crate::error::tool::{ToolError, ToolErrorKind};

/// Why a store operation failed. Messages never name the data directory
/// (code reads them).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ArtifactError {
    /// The name cannot be used (see [`check_name`](crate::artifacts::check_name)).
    #[error("artifact name {name:?}: {reason}")]
    BadName {
        /// The name, cut to 64 bytes.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Another argument cannot be used (a media type, a range).
    #[error("{0}")]
    BadArgument(String),
    /// No such artifact, or no such version of it.
    #[error("no artifact {name:?}{}", version.map(|v| format!(" version {v}")).unwrap_or_default())]
    NotFound {
        /// The name asked for.
        name: String,
        /// The version asked for, if one was.
        version: Option<u32>,
    },
    /// The scope's quota, or the per-file cap, would be exceeded.
    #[error("{0}")]
    QuotaExceeded(String),
    /// The store's files could not be read or written (or were not what
    /// the store writes: a link, a damaged header).
    #[error("artifact store: {0}")]
    Io(String),
}

impl ArtifactError {
    /// An I/O failure, described without paths.
    pub(crate) fn io(what: &str, error: std::io::Error) -> Self {
        ArtifactError::Io(format!("{what}: {}", error.kind()))
    }

    /// The [`ToolError`] code sees for this failure of `tool`.
    pub fn to_tool_error(&self, tool: &str) -> ToolError {
        let kind = match self {
            ArtifactError::BadName { .. } | ArtifactError::BadArgument(_) => ToolErrorKind::InvalidArguments,
            ArtifactError::NotFound { .. } => ToolErrorKind::NotFound,
            ArtifactError::QuotaExceeded(_) => ToolErrorKind::QuotaExceeded,
            ArtifactError::Io(_) => ToolErrorKind::Failed,
        };
        ToolError::new(tool, kind, self.to_string())
    }
}
