//! Scopes a process owns: the owner record that lets a store opened later
//! reclaim them once that process is gone, however it ended.
//!
//! A scope is *owned* when the process that uses it says so
//! ([`ArtifactStore::own_scopes`](super::ArtifactStore::own_scopes)): `execbox
//! serve` owns every scope of its connections, whose names carry a random
//! prefix no later process can use again. The save that creates an owned
//! scope's directory writes `.owner` in it before any version: this
//! process's owner token (pid and start time, see
//! [`owner::token`](crate::owner::token)), the boot and PID
//! namespace it lives in, and the host name. A store opening the directory
//! later removes the scopes whose owner is gone
//! ([`ArtifactStore::reclaim_abandoned_scopes`](super::ArtifactStore::reclaim_abandoned_scopes)).
//!
//! Who is judged gone, and who is never touched:
//! - a scope without a record (a library user's, or one from before
//!   records) belongs to no process: it stays until it is removed;
//! - same boot and PID namespace: gone when no process has the owner's pid
//!   *and* start time (a reused pid is not mistaken for its predecessor);
//! - an earlier boot of this machine (another boot id, the same host name):
//!   gone, whatever its pid;
//! - another PID namespace of this boot (a container sharing the
//!   directory), or another machine: its pids mean nothing here, so it is
//!   never judged, never removed;
//! - a record that cannot be read as one: never judged.
//!
//! When this process cannot read its own boot id (no `/proc`), it judges
//! nobody.

use std::io::{Read, Write};

use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, OpenOptions, OpenOptionsExt};
use serde::{Deserialize, Serialize};

use super::error::ArtifactError;
use crate::owner;

/// The owner record of an owned scope, in its directory.
pub(super) const OWNER_FILE: &str = ".owner";

/// The prefix of an owner record being written.
const OWNER_TEMP_PREFIX: &str = ".owner.tmp-";

/// Longest owner record read.
const MAX_RECORD_BYTES: u64 = 4096;

/// Who owns a scope: `.owner`, one JSON line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct OwnerRecord {
    /// The owner's token: `<pid>.<start time>`.
    owner: String,
    /// `<boot id>.<PID namespace inode>` the owner lives in.
    namespace: String,
    /// The owner's host name.
    host: String,
}

impl OwnerRecord {
    /// This process's record.
    pub(super) fn this_process() -> Self {
        Self {
            owner: owner::token().to_string(),
            namespace: owner::namespace().to_string(),
            host: owner::host().to_string(),
        }
    }

    /// Whether the owner is judged gone (see the module docs).
    pub(super) fn is_abandoned(&self) -> bool {
        let here = owner::namespace();
        let my_boot = owner::boot_of(here);
        if my_boot.is_empty() || *self == Self::this_process() {
            return false;
        }
        if self.namespace == here {
            // A token whose start time is unknown (0) cannot be judged.
            let judged = self.owner.split_once('.').is_some_and(|(_, start)| start != "0");
            return judged && !owner::is_alive(&self.owner);
        }
        let boot = owner::boot_of(&self.namespace);
        !boot.is_empty() && boot != my_boot && !owner::host().is_empty() && self.host == owner::host()
    }
}

/// The owner record of `scope_dir`: `None` when it has none, or one that
/// cannot be read as a record (never judged). A link in its place is an
/// error, never followed.
pub(super) fn read(scope_dir: &Dir) -> Result<Option<OwnerRecord>, ArtifactError> {
    let mut options = OpenOptions::new();
    options.read(true).follow(FollowSymlinks::No).custom_flags(libc::O_NONBLOCK);
    let file = match scope_dir.open_with(OWNER_FILE, &options) {
        Ok(file) => file.into_std(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ArtifactError::io("cannot open a scope's owner record (a link is refused)", e)),
    };
    let failed = |e| ArtifactError::io("cannot read a scope's owner record", e);
    if !file.metadata().map_err(failed)?.is_file() {
        return Err(ArtifactError::Io("a scope's owner record is not a regular file".into()));
    }
    let mut text = Vec::new();
    file.take(MAX_RECORD_BYTES).read_to_end(&mut text).map_err(failed)?;
    match serde_json::from_slice(text.trim_ascii_end()) {
        Ok(record) => Ok(Some(record)),
        Err(e) => {
            tracing::debug!(error = %e, "an artifact scope's owner record is damaged: it is never judged");
            Ok(None)
        }
    }
}

/// Makes this process the owner of `scope_dir` (the caller holds its
/// lock): a record written whole (a temporary file renamed over `.owner`).
pub(super) fn write(scope_dir: &Dir) -> Result<(), ArtifactError> {
    let mut line = serde_json::to_vec(&OwnerRecord::this_process()).map_err(|e| ArtifactError::Io(e.to_string()))?;
    line.push(b'\n');
    let temp = format!("{OWNER_TEMP_PREFIX}{:016x}", crate::nonce::random_u64());
    let written = (|| {
        let mut options = OpenOptions::new();
        options.write(true).create_new(true).mode(0o600);
        let mut file = scope_dir.open_with(&temp, &options)?;
        file.write_all(&line)?;
        file.sync_all()?;
        scope_dir.rename(&temp, scope_dir, OWNER_FILE)
    })();
    if let Err(e) = written {
        let _ = scope_dir.remove_file(&temp);
        return Err(ArtifactError::io("cannot write the scope's owner record", e));
    }
    Ok(())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A record of `owner` in `namespace` on `host`, as another process
    /// would have written it.
    pub(in crate::artifacts) fn record(owner: &str, namespace: &str, host: &str) -> String {
        serde_json::to_string(&OwnerRecord { owner: owner.into(), namespace: namespace.into(), host: host.into() })
            .unwrap()
    }

    #[test]
    fn owners_are_judged_only_where_they_can_be() {
        let here = owner::namespace();
        let judge = |owner: &str, namespace: &str, host: &str| {
            OwnerRecord { owner: owner.into(), namespace: namespace.into(), host: host.into() }.is_abandoned()
        };
        assert!(!OwnerRecord::this_process().is_abandoned(), "this process is alive");
        assert!(judge("999999999.1", here, owner::host()), "a dead pid of this namespace");
        // This pid with this start time is alive; with another, it is a dead predecessor.
        let (pid, start) = owner::token().split_once('.').unwrap();
        assert!(!judge(&format!("{pid}.{start}"), here, "another-host"));
        assert!(judge(&format!("{pid}.1{start}"), here, owner::host()), "a reused pid");
        assert!(!judge("999999999.0", here, owner::host()), "an unknown start time is never judged");
        // Another PID namespace of this boot: its pids mean nothing here.
        let boot = owner::boot_of(here);
        assert!(!judge("999999999.1", &format!("{boot}.1"), owner::host()));
        // An earlier boot of this host: gone; of another host: never judged.
        assert!(judge("999999999.1", "an-earlier-boot.1", owner::host()));
        assert!(!judge("999999999.1", "an-earlier-boot.1", "another-host"));
        assert!(!judge("999999999.1", ".1", owner::host()), "no boot id");
    }
}
