//! [`ArtifactStoreConfig`]: where the artifact store keeps its files and
//! how much each scope may hold.

use std::path::{Path, PathBuf};

use crate::config::setters;

/// Where an [`ArtifactStore`](crate::artifacts::ArtifactStore) keeps its
/// files and the quotas of each scope.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ArtifactStoreConfig {
    /// The data directory. Created (with its parents) when missing; only
    /// this path is resolved by name: everything below it is opened
    /// relative to its handle, never through a link.
    ///
    /// # Default
    /// `$XDG_DATA_HOME/execbox/artifacts` (when `XDG_DATA_HOME` is an
    /// absolute path), else `$HOME/.local/share/execbox/artifacts`; with
    /// neither set, empty, which
    /// [`ArtifactStore::new`](crate::artifacts::ArtifactStore::new) refuses.
    pub dir: PathBuf,
    /// Most bytes one scope's files may take on disk, every version
    /// counted (each version's content plus a header of about 200 bytes).
    ///
    /// # Default
    /// 64 MiB.
    pub max_scope_bytes: u64,
    /// Most files (versions, all names together) one scope may hold.
    ///
    /// # Default
    /// 1,000.
    pub max_scope_files: u64,
    /// Largest content of one version. Code sends content as a tool call's
    /// arguments, so the policy's `tool_limits.max_argument_bytes` (64 KiB
    /// by default) bounds what it can save in one call. A run that spills
    /// its stdout captures up to this many bytes of it, and keeps them.
    ///
    /// # Default
    /// 8 MiB.
    pub max_file_bytes: u64,
    /// Most bytes all scopes together may take on disk. Counted by this
    /// store (and its clones): measured when it opens, then kept by its
    /// saves, [`ArtifactStore::remove_scope`](crate::artifacts::ArtifactStore::remove_scope)
    /// and its sweep of abandoned scopes
    /// ([`ArtifactStore::reclaim_abandoned_scopes`](crate::artifacts::ArtifactStore::reclaim_abandoned_scopes));
    /// what another process writes into the same directory is counted at
    /// the next open.
    ///
    /// # Default
    /// 1 GiB.
    pub max_total_bytes: u64,
}

impl Default for ArtifactStoreConfig {
    fn default() -> Self {
        Self {
            dir: default_dir().unwrap_or_default(),
            max_scope_bytes: 64 << 20,
            max_scope_files: 1000,
            max_file_bytes: 8 << 20,
            max_total_bytes: 1 << 30,
        }
    }
}

setters!(ArtifactStoreConfig {
    max_scope_bytes: u64,
    max_scope_files: u64,
    max_file_bytes: u64,
    max_total_bytes: u64,
} into { dir: PathBuf });

/// `$XDG_DATA_HOME/execbox/artifacts`, else `~/.local/share/execbox/artifacts`.
fn default_dir() -> Option<PathBuf> {
    let xdg = std::env::var_os("XDG_DATA_HOME").map(PathBuf::from).filter(|p| p.is_absolute());
    let base = xdg.or_else(|| {
        std::env::var_os("HOME").map(PathBuf::from).filter(|p| p.is_absolute()).map(|home| home.join(".local/share"))
    })?;
    Some(base.join(Path::new("execbox/artifacts")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_setters() {
        let cfg = ArtifactStoreConfig::default().dir("/tmp/x").max_scope_files(3);
        assert_eq!((cfg.dir.as_path(), cfg.max_scope_files), (Path::new("/tmp/x"), 3));
        assert_eq!((cfg.max_scope_bytes, cfg.max_file_bytes, cfg.max_total_bytes), (64 << 20, 8 << 20, 1 << 30));
        if let Some(dir) = default_dir() {
            assert!(dir.is_absolute() && dir.ends_with("execbox/artifacts"), "{}", dir.display());
        }
    }
}
