//! The bounds of a session registry.

use std::time::Duration;

/// Bounds on sessions.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionConfig {
    /// Most sessions live (or opening) at once.
    ///
    /// # Default
    /// 16.
    pub max_sessions: usize,
    /// A session unused this long is closed (and reported lost once).
    ///
    /// # Default
    /// 5 minutes.
    pub idle_timeout: Duration,
}

crate::config::setters!(SessionConfig { max_sessions: usize, idle_timeout: Duration });

impl Default for SessionConfig {
    fn default() -> Self {
        Self { max_sessions: 16, idle_timeout: Duration::from_secs(300) }
    }
}
