//! [`ArtifactStore`]: versioned files per scope, under one data directory.
//!
//! Layout, below the configured directory:
//!
//! ```text
//! scopes/<sha256 of the scope>/.lock        a save's lock (flock)
//! scopes/<sha256 of the scope>/.owner       the process that owns the scope, if one
//!                                           does (see `owned`)
//! scopes/<sha256 of the scope>/<name>/<N>   version N of artifact <name>:
//!                                           one JSON header line, then the content
//! ```
//!
//! What holds, whatever the code and whatever else writes in the directory:
//! - the data directory and `scopes/` belong to this user and no one else
//!   can write them (checked when the store opens): whoever could (a
//!   container granted a world-writable directory) could plant a version,
//!   header and sha256 included, that another scope then loads as its own;
//! - only the configured directory is opened by path; everything below it
//!   is opened one component at a time relative to a directory handle
//!   (cap-std), with `O_NOFOLLOW`: a symlink planted anywhere below is
//!   refused, wherever it points. New files are created with `O_EXCL` and
//!   renamed into place, so no existing inode (a planted hard link) is ever
//!   written into;
//! - a version appears whole or not at all (written to a temporary file in
//!   its artifact's directory, synced, then renamed), and is never
//!   rewritten: `load` of a version always returns what was saved, checked
//!   against its sha256;
//! - saves in one scope take the scope's lock (an `flock`, so also against
//!   other processes sharing the directory), so the quota check and the
//!   next version number are decided by one saver at a time; loads and
//!   lists take no lock (versions appear by rename);
//! - a scope holds at most `max_scope_files` versions and `max_scope_bytes`
//!   on disk; a version at most `max_file_bytes` of content;
//! - a save that is refused (a bad name, a quota) writes nothing: every
//!   check runs before the first directory is made;
//! - a scope some process owns ([`ArtifactStore::own_scopes`]) is removed
//!   by a store opened after that process is gone, however it ended
//!   ([`ArtifactStore::reclaim_abandoned_scopes`]); no other scope is ever
//!   removed but by [`ArtifactStore::remove_scope`].

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use cap_fs_ext::{DirExt, FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, DirBuilder, DirBuilderExt, OpenOptions, OpenOptionsExt};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::config::ArtifactStoreConfig;
use super::error::ArtifactError;
use super::names::{check_media_type, check_name, scope_dir_name, version_of};
use super::owned::{self, OWNER_FILE, OwnerRecord};
use crate::error::ConfigError;

/// Longest header line of a version file.
const MAX_HEADER_BYTES: u64 = 4096;

/// The lock file of a scope.
const LOCK_FILE: &str = ".lock";

/// The prefix of a save's temporary file.
const TEMP_PREFIX: &str = ".tmp-";

/// One saved version of an artifact.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ArtifactVersion {
    /// Its number: 1 for the first save of a name, then one more per save.
    pub version: u32,
    /// Bytes of content.
    pub size: u64,
    /// sha256 of the content, in hex.
    pub sha256: String,
    /// When it was saved, in ms since the Unix epoch.
    pub created_unix_ms: u64,
    /// The media type its saver gave, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// Saved as text (UTF-8), not as bytes: `load` gives it back as text.
    pub text: bool,
}

/// An artifact's name and its versions, oldest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ArtifactInfo {
    /// The name.
    pub name: String,
    /// Every version, oldest first.
    pub versions: Vec<ArtifactVersion>,
}

/// One version's content.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Artifact {
    /// The name.
    pub name: String,
    /// Which version, and what it is.
    pub version: ArtifactVersion,
    /// Its bytes.
    pub content: Vec<u8>,
}

/// What a scope holds, as the quota counts it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ScopeUsage {
    /// Bytes on disk, every version (headers included).
    pub bytes: u64,
    /// Versions, all names together.
    pub files: u64,
}

/// Versioned files kept across runs, per scope, under one data directory
/// (see the module docs for what holds). Cheap to clone; safe to share.
/// [`ArtifactStore::tools`] gives code its `artifacts.*` tools.
#[derive(Clone)]
pub struct ArtifactStore {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: ArtifactStoreConfig,
    /// `scopes/`, below the data directory.
    scopes: Dir,
    /// Bytes all scopes hold, as this store counts them (see
    /// [`ArtifactStoreConfig::max_total_bytes`]).
    total: parking_lot::Mutex<u64>,
    /// Prefixes of the scopes this process owns ([`ArtifactStore::own_scopes`]).
    owned: parking_lot::RwLock<Vec<String>>,
    /// Owned scopes whose directory this store knows carries this
    /// process's record, until they are removed.
    recorded: parking_lot::Mutex<BTreeSet<String>>,
    /// Removals take turns: two at once could count one scope's bytes out
    /// of the total twice.
    removing: parking_lot::Mutex<()>,
}

impl std::fmt::Debug for ArtifactStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArtifactStore").field("dir", &self.inner.cfg.dir).finish_non_exhaustive()
    }
}

/// The version header: the first line of a version file.
#[derive(Serialize, Deserialize)]
struct Header {
    size: u64,
    sha256: String,
    created_unix_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    media_type: Option<String>,
    text: bool,
}

impl ArtifactStore {
    /// Opens (creating it when missing, mode `0700`) the store's data
    /// directory. A directory that cannot be created or opened, that is not
    /// this user's or that group or others may write (the data directory or
    /// its `scopes/`: see the module docs), or a quota of zero, is a
    /// [`ConfigError::Invalid`] naming the setting.
    ///
    /// Then, on a thread of its own, it removes the scopes of owners that
    /// are gone ([`ArtifactStore::reclaim_abandoned_scopes`]); their bytes
    /// leave the total as they go.
    pub fn new(config: ArtifactStoreConfig) -> Result<Self, ConfigError> {
        const DIR: &str = "ArtifactStoreConfig::dir";
        if config.dir.as_os_str().is_empty() {
            return Err(ConfigError::invalid(DIR, "no data directory: neither XDG_DATA_HOME nor HOME is set; set one"));
        }
        for (setting, value) in [
            ("ArtifactStoreConfig::max_scope_bytes", config.max_scope_bytes),
            ("ArtifactStoreConfig::max_scope_files", config.max_scope_files),
            ("ArtifactStoreConfig::max_file_bytes", config.max_file_bytes),
            ("ArtifactStoreConfig::max_total_bytes", config.max_total_bytes),
        ] {
            if value == 0 {
                return Err(ConfigError::invalid(setting, "must be at least 1"));
            }
        }
        let invalid = |e: std::io::Error| ConfigError::invalid(DIR, format!("{}: {e}", config.dir.display()));
        {
            use std::os::unix::fs::DirBuilderExt as _;
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&config.dir).map_err(invalid)?;
        }
        // The one ambient step: the host's own, trusted path.
        let root = Dir::open_ambient_dir(&config.dir, cap_std::ambient_authority()).map_err(invalid)?;
        check_private(&root, &config.dir)?;
        let (scopes, _) = create_dir(&root, "scopes").map_err(invalid)?;
        check_private(&scopes, &config.dir.join("scopes"))?;
        let total = total_of(&scopes).map_err(|e| ConfigError::invalid(DIR, e.to_string()))?;
        let store = Self {
            inner: Arc::new(Inner {
                cfg: config,
                scopes,
                total: parking_lot::Mutex::new(total),
                owned: Default::default(),
                recorded: Default::default(),
                removing: Default::default(),
            }),
        };
        let sweeper = store.clone();
        let started = std::thread::Builder::new().name("execbox-artifacts-sweep".into()).spawn(move || {
            match sweeper.reclaim_abandoned_scopes() {
                Ok(0) => {}
                Ok(n) => tracing::debug!(scopes = n, "removed the artifact scopes of processes that are gone"),
                Err(e) => tracing::warn!(error = %e, "cannot sweep the artifact scopes of processes that are gone"),
            }
        });
        if let Err(e) = started {
            tracing::warn!(error = %e, "cannot start the sweep of abandoned artifact scopes");
        }
        Ok(store)
    }

    /// The configuration it was opened with.
    pub fn config(&self) -> &ArtifactStoreConfig {
        &self.inner.cfg
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.inner.cfg.dir
    }

    /// Saves `text` as the next version of `name` in `scope`.
    pub fn save_text(
        &self,
        scope: &str,
        name: &str,
        text: &str,
        media_type: Option<&str>,
    ) -> Result<ArtifactVersion, ArtifactError> {
        self.save(scope, name, text.as_bytes(), media_type, true)
    }

    /// Saves `bytes` as the next version of `name` in `scope`.
    pub fn save_bytes(
        &self,
        scope: &str,
        name: &str,
        bytes: &[u8],
        media_type: Option<&str>,
    ) -> Result<ArtifactVersion, ArtifactError> {
        self.save(scope, name, bytes, media_type, false)
    }

    fn save(
        &self,
        scope: &str,
        name: &str,
        content: &[u8],
        media_type: Option<&str>,
        text: bool,
    ) -> Result<ArtifactVersion, ArtifactError> {
        check_name(name)?;
        if let Some(media_type) = media_type {
            check_media_type(media_type)?;
        }
        let cfg = &self.inner.cfg;
        let size = content.len() as u64;
        if size > cfg.max_file_bytes {
            return Err(ArtifactError::QuotaExceeded(format!(
                "{size} bytes, over the largest artifact of {} bytes",
                cfg.max_file_bytes
            )));
        }
        let header = Header {
            size,
            sha256: hex::encode(Sha256::digest(content)),
            created_unix_ms: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
            media_type: media_type.map(str::to_string),
            text,
        };
        let mut head = serde_json::to_vec(&header).map_err(|e| ArtifactError::Io(e.to_string()))?;
        head.push(b'\n');
        let adding = head.len() as u64 + size;
        // Every check runs before anything is made: a refused save leaves
        // no scope or name directory behind (empty directories the quotas
        // do not count). First those that need no disk.
        let over_scope_bytes = |used: u64| {
            ArtifactError::QuotaExceeded(format!(
                "saving {adding} bytes would take this scope past its quota of {} bytes ({used} used)",
                cfg.max_scope_bytes
            ))
        };
        if adding > cfg.max_scope_bytes {
            return Err(over_scope_bytes(0));
        }
        // Held from here (a refusal or a failure gives it back), so that
        // saves in other scopes cannot take the same room meanwhile.
        let reserved = Reservation::take(&self.inner.total, adding, cfg.max_total_bytes)?;
        let (scope_dir, created) = create_dir(&self.inner.scopes, &scope_dir_name(scope))
            .map_err(|e| ArtifactError::io("cannot open the scope", e))?;
        let _lock = lock(&scope_dir)?;
        if self.owns(scope) {
            self.record_owner(scope, &scope_dir, created)?;
        }
        let used = usage_of(&scope_dir)?;
        if used.files >= cfg.max_scope_files {
            return Err(ArtifactError::QuotaExceeded(format!(
                "this scope holds {} files, its quota (versions count as files)",
                cfg.max_scope_files
            )));
        }
        if used.bytes.saturating_add(adding) > cfg.max_scope_bytes {
            return Err(over_scope_bytes(used.bytes));
        }
        let existing = open_existing(&scope_dir, name)?;
        let version = match &existing {
            Some(name_dir) => {
                // Under the lock no save is writing: a temporary file left is a crashed save's.
                remove_temps(name_dir);
                match latest(name_dir)? {
                    Some(v) => {
                        v.checked_add(1).ok_or_else(|| ArtifactError::QuotaExceeded("no more versions".into()))?
                    }
                    None => 1,
                }
            }
            None => 1,
        };
        let (name_dir, made_name) = match existing {
            Some(name_dir) => (name_dir, false),
            None => {
                (create_dir(&scope_dir, name).map_err(|e| ArtifactError::io("cannot open the artifact", e))?.0, true)
            }
        };
        let temp = format!("{TEMP_PREFIX}{:016x}", crate::nonce::random_u64());
        let written = (|| {
            let mut options = OpenOptions::new();
            options.write(true).create_new(true).mode(0o600);
            let mut file = name_dir.open_with(&temp, &options)?;
            file.write_all(&head)?;
            file.write_all(content)?;
            file.sync_all()?;
            name_dir.rename(&temp, &name_dir, version.to_string())
        })();
        if let Err(e) = written {
            let _ = name_dir.remove_file(&temp);
            if made_name {
                // Only if still empty: nothing of a failed save stays.
                let _ = scope_dir.remove_dir(name);
            }
            return Err(ArtifactError::io("cannot write the artifact", e));
        }
        reserved.keep();
        Ok(header.into_version(version))
    }

    /// Version `version` of `name` in `scope` (the latest when `None`),
    /// checked against its sha256.
    pub fn load(&self, scope: &str, name: &str, version: Option<u32>) -> Result<Artifact, ArtifactError> {
        check_name(name)?;
        let not_found = || ArtifactError::NotFound { name: name.to_string(), version };
        let scope_dir = self.open_scope(scope)?.ok_or_else(not_found)?;
        let name_dir = open_existing(&scope_dir, name)?.ok_or_else(not_found)?;
        let version = match version {
            Some(v) => v,
            None => latest(&name_dir)?.ok_or_else(not_found)?,
        };
        let Some(file) = open_version(&name_dir, version)? else { return Err(not_found()) };
        let mut reader = BufReader::new(file);
        let header = read_header(&mut reader)?;
        if header.size > self.inner.cfg.max_file_bytes {
            return Err(ArtifactError::QuotaExceeded(format!(
                "version {version} of {name:?} is {} bytes, over the largest artifact of {} bytes",
                header.size, self.inner.cfg.max_file_bytes
            )));
        }
        let mut content = Vec::with_capacity(header.size as usize);
        reader
            .take(header.size.saturating_add(1))
            .read_to_end(&mut content)
            .map_err(|e| ArtifactError::io("cannot read the artifact", e))?;
        if content.len() as u64 != header.size || hex::encode(Sha256::digest(&content)) != header.sha256 {
            return Err(ArtifactError::Io(format!("version {version} of {name:?} is damaged (size or sha256)")));
        }
        Ok(Artifact { name: name.to_string(), version: header.into_version(version), content })
    }

    /// Every artifact in `scope`, sorted by name, each with its versions
    /// (empty for a scope that holds nothing). Bounded: the versions listed
    /// stop at the scope's quota of files
    /// ([`ArtifactStoreConfig::max_scope_files`]).
    pub fn list(&self, scope: &str) -> Result<Vec<ArtifactInfo>, ArtifactError> {
        let Some(scope_dir) = self.open_scope(scope)? else { return Ok(Vec::new()) };
        let mut artifacts = Vec::new();
        let mut room = self.inner.cfg.max_scope_files;
        for name in artifact_names(&scope_dir)? {
            let Some(name_dir) = open_existing(&scope_dir, &name)? else { continue };
            let mut versions = Vec::new();
            for version in versions_of(&name_dir)? {
                if room == 0 {
                    break;
                }
                room -= 1;
                // A version another process removed meanwhile is skipped.
                let Some(file) = open_version(&name_dir, version)? else { continue };
                let header = read_header(&mut BufReader::new(file))?;
                versions.push(header.into_version(version));
            }
            if !versions.is_empty() {
                artifacts.push(ArtifactInfo { name, versions });
            }
        }
        Ok(artifacts)
    }

    /// Bytes all scopes hold, as the total quota counts them
    /// ([`ArtifactStoreConfig::max_total_bytes`]).
    pub fn total_bytes(&self) -> u64 {
        *self.inner.total.lock()
    }

    /// What `scope` holds, as its quota counts it.
    pub fn usage(&self, scope: &str) -> Result<ScopeUsage, ArtifactError> {
        match self.open_scope(scope)? {
            Some(dir) => usage_of(&dir),
            None => Ok(ScopeUsage::default()),
        }
    }

    /// Removes `scope` and everything in it (e.g. when the sessions or the
    /// connection it belonged to ended). False if it held nothing.
    pub fn remove_scope(&self, scope: &str) -> Result<bool, ArtifactError> {
        let removed = self.remove_scope_dir(&scope_dir_name(scope), None);
        // Gone or not, its record is no longer known to be there.
        self.inner.recorded.lock().remove(scope);
        removed
    }

    /// Makes the scopes whose names start with `prefix` this process's own,
    /// from now on: the save that creates such a scope's directory writes
    /// an owner record in it (this process's pid and start time, its boot
    /// and PID namespace) before any version, and a store opened on the
    /// directory after this process is gone, however it ended (SIGKILL
    /// too), removes the scope
    /// ([`ArtifactStore::reclaim_abandoned_scopes`]). Meant for scopes that
    /// live as long as this process at most: `execbox serve` owns its
    /// connections' scopes (`mcp:<random>:`). A scope no process owns is
    /// kept until [`ArtifactStore::remove_scope`] removes it. The owner
    /// should still remove its scopes when done with them
    /// ([`ArtifactStore::remove_scope`], [`ArtifactStore::remove_owned_scopes`]):
    /// the sweep is the backstop, and a scope counts against
    /// [`ArtifactStoreConfig::max_total_bytes`] until it is removed.
    ///
    /// A scope that already exists gets its record at its next save. Costs
    /// nothing on disk until then.
    pub fn own_scopes(&self, prefix: impl Into<String>) {
        let prefix = prefix.into();
        let mut owned = self.inner.owned.write();
        if !owned.contains(&prefix) {
            owned.push(prefix);
        }
    }

    /// Removes every scope under `prefix` this store has given this
    /// process's owner record (see [`ArtifactStore::own_scopes`]) and not
    /// removed yet: what a process that owns scopes does before it exits.
    /// Returns how many it removed; a scope it cannot remove is logged and
    /// left to a later sweep.
    pub fn remove_owned_scopes(&self, prefix: &str) -> usize {
        let scopes: Vec<String> =
            self.inner.recorded.lock().iter().filter(|s| s.starts_with(prefix)).cloned().collect();
        let mut removed = 0;
        for scope in scopes {
            match self.remove_scope(&scope) {
                Ok(true) => removed += 1,
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "an owned artifact scope was not removed"),
            }
        }
        removed
    }

    /// Removes the scopes whose owner is gone: those an
    /// [`ArtifactStore::own_scopes`] of a process that no longer runs
    /// marked (killed, or ended before it removed them). Never a scope no
    /// process owns, nor one of a live process, nor one whose owner cannot
    /// be judged from here (another PID namespace, another machine: see
    /// docs/code-mode.md, "Artifacts"). Returns how many it removed.
    ///
    /// [`ArtifactStore::new`] runs it on a thread of its own; call it to
    /// sweep now. Blocks: it reads each scope's record and removes what it
    /// finds (measured: see docs/code-mode.md).
    pub fn reclaim_abandoned_scopes(&self) -> Result<usize, ArtifactError> {
        let failed = |e| ArtifactError::io("cannot list the scopes", e);
        let mut names = Vec::new();
        for entry in self.inner.scopes.entries().map_err(failed)? {
            let entry = entry.map_err(failed)?;
            let name = entry.file_name();
            // Only what a store makes: 64 hex digits (a scope's sha256).
            let Some(name) = name.to_str().filter(|n| n.len() == 64 && n.bytes().all(|b| b.is_ascii_hexdigit())) else {
                continue;
            };
            if entry.file_type().map_err(failed)?.is_dir() {
                names.push(name.to_string());
            }
        }
        let mut removed = 0;
        for name in names {
            let judged = open_existing(&self.inner.scopes, &name).and_then(|dir| match dir {
                Some(dir) => owned::read(&dir),
                None => Ok(None),
            });
            let record = match judged {
                Ok(Some(record)) if record.is_abandoned() => record,
                Ok(_) => continue,
                Err(e) => {
                    tracing::debug!(error = %e, "an artifact scope's owner cannot be read: left alone");
                    continue;
                }
            };
            match self.remove_scope_dir(&name, Some(&record)) {
                Ok(true) => removed += 1,
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "an abandoned artifact scope was not removed"),
            }
        }
        Ok(removed)
    }

    /// Removes the scope directory `dir_name` and everything in it: only if
    /// its owner record is still `owned_by`, when given. The record goes
    /// last but for the lock, so a removal cut short (the process killed)
    /// leaves a scope the next sweep still finds. False if there was none.
    fn remove_scope_dir(&self, dir_name: &str, owned_by: Option<&OwnerRecord>) -> Result<bool, ArtifactError> {
        let _turn = self.inner.removing.lock();
        let Some(scope_dir) = open_existing(&self.inner.scopes, dir_name)? else { return Ok(false) };
        let failed = |e| ArtifactError::io("cannot remove the scope", e);
        // Saves in this scope wait; the lock file goes with the directory.
        // (A lock file that cannot be taken, e.g. a link planted there,
        // fails every save too: the scope is removed all the same.)
        let _lock = lock(&scope_dir).ok();
        if let Some(owner) = owned_by
            && owned::read(&scope_dir)?.as_ref() != Some(owner)
        {
            // Taken over meanwhile (its scope saved in again by a live owner).
            return Ok(false);
        }
        let held = usage_of(&scope_dir)?.bytes;
        let emptied = (|| {
            let mut last = Vec::new();
            for entry in scope_dir.entries()? {
                let entry = entry?;
                let name = entry.file_name();
                if name == OWNER_FILE || name == LOCK_FILE {
                    last.push(name);
                } else if entry.file_type()?.is_dir() {
                    let inner = scope_dir.open_dir_nofollow(&name)?;
                    for file in inner.entries()? {
                        // Files and links alike are unlinked, never followed.
                        inner.remove_file_or_symlink(file?.file_name())?;
                    }
                    scope_dir.remove_dir(&name)?;
                } else {
                    scope_dir.remove_file_or_symlink(&name)?;
                }
            }
            // `.owner` before `.lock` (".l" < ".o", reversed).
            last.sort();
            for name in last.iter().rev() {
                scope_dir.remove_file_or_symlink(name)?;
            }
            Ok(())
        })();
        // What went leaves the total, also when the removal stopped half-way.
        let left = if emptied.is_ok() { 0 } else { usage_of(&scope_dir).map_or(held, |u| u.bytes) };
        let mut total = self.inner.total.lock();
        *total = total.saturating_sub(held.saturating_sub(left));
        drop(total);
        emptied.map_err(failed)?;
        match self.inner.scopes.remove_dir(dir_name) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
            Err(e) => Err(failed(e)),
        }
    }

    /// Whether this process owns `scope` ([`ArtifactStore::own_scopes`]).
    fn owns(&self, scope: &str) -> bool {
        self.inner.owned.read().iter().any(|prefix| scope.starts_with(prefix.as_str()))
    }

    /// Makes sure `scope_dir` (of `scope`, which this process owns; its
    /// lock held) carries this process's owner record: always written in a
    /// directory this save `created`, else checked once per scope.
    fn record_owner(&self, scope: &str, scope_dir: &Dir, created: bool) -> Result<(), ArtifactError> {
        if !created && self.inner.recorded.lock().contains(scope) {
            return Ok(());
        }
        if created || owned::read(scope_dir)? != Some(OwnerRecord::this_process()) {
            owned::write(scope_dir)?;
        }
        self.inner.recorded.lock().insert(scope.to_string());
        Ok(())
    }

    /// The directory of `scope`, if it exists (a symlink is refused).
    fn open_scope(&self, scope: &str) -> Result<Option<Dir>, ArtifactError> {
        open_existing(&self.inner.scopes, &scope_dir_name(scope))
    }
}

/// Bytes a save holds against the store's total until it is written
/// ([`Reservation::keep`]) or gives up (dropped).
struct Reservation<'a> {
    total: &'a parking_lot::Mutex<u64>,
    bytes: u64,
    kept: bool,
}

impl<'a> Reservation<'a> {
    /// Holds `bytes` of `total`, or refuses when they would pass `max`.
    fn take(total: &'a parking_lot::Mutex<u64>, bytes: u64, max: u64) -> Result<Self, ArtifactError> {
        let mut held = total.lock();
        if held.saturating_add(bytes) > max {
            return Err(ArtifactError::QuotaExceeded(format!(
                "saving {bytes} bytes would take the store past its total quota of {max} bytes"
            )));
        }
        *held += bytes;
        Ok(Self { total, bytes, kept: false })
    }

    /// The save is written: its bytes stay counted.
    fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.kept {
            let mut total = self.total.lock();
            *total = total.saturating_sub(self.bytes);
        }
    }
}

/// Refuses a directory of the store (opened as `dir`, at `path`) that is
/// not this user's or that group or others may write: whoever can write it
/// could plant a version (its header and sha256 included) that a scope
/// then loads as its own. Checked on the opened handle, as the wasm disk
/// cache checks its directory; never chmodded.
fn check_private(dir: &Dir, path: &Path) -> Result<(), ConfigError> {
    use cap_std::fs::MetadataExt;
    const DIR: &str = "ArtifactStoreConfig::dir";
    let meta = dir.dir_metadata().map_err(|e| ConfigError::invalid(DIR, format!("{}: {e}", path.display())))?;
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me {
        return Err(ConfigError::invalid(
            DIR,
            format!(
                "{} is owned by uid {}, not by this process's uid {me}: its owner could plant artifacts there; \
                 chown it to this user or choose a directory of this user's",
                path.display(),
                meta.uid()
            ),
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(ConfigError::invalid(
            DIR,
            format!(
                "{} is writable by group or others (mode {:o}): anyone who can write it (a container granted it) \
                 could plant a version another scope loads; make it private (chmod go-w {}) or choose another \
                 directory",
                path.display(),
                meta.mode() & 0o7777,
                path.display()
            ),
        ));
    }
    Ok(())
}

impl Header {
    fn into_version(self, version: u32) -> ArtifactVersion {
        ArtifactVersion {
            version,
            size: self.size,
            sha256: self.sha256,
            created_unix_ms: self.created_unix_ms,
            media_type: self.media_type,
            text: self.text,
        }
    }
}

/// Creates (mode `0700`, where missing) and opens the directory `name` of
/// `dir`, never through a symlink; whether it was made here.
fn create_dir(dir: &Dir, name: &str) -> std::io::Result<(Dir, bool)> {
    let created = match dir.create_dir_with(name, DirBuilder::new().mode(0o700)) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
        Err(e) => return Err(e),
    };
    Ok((dir.open_dir_nofollow(name)?, created))
}

/// Opens the directory `name` of `dir` if it exists; a symlink (or a file)
/// there is an error, never followed.
fn open_existing(dir: &Dir, name: &str) -> Result<Option<Dir>, ArtifactError> {
    match dir.open_dir_nofollow(name) {
        Ok(dir) => Ok(Some(dir)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ArtifactError::io("cannot open a directory of the store (a link or a file is refused)", e)),
    }
}

/// Opens version `version` in `name_dir` for reading: not through a link,
/// not blocking on a FIFO, a regular file. `None` if it does not exist.
fn open_version(name_dir: &Dir, version: u32) -> Result<Option<std::fs::File>, ArtifactError> {
    let mut options = OpenOptions::new();
    options.read(true).follow(FollowSymlinks::No).custom_flags(libc::O_NONBLOCK);
    let file = match name_dir.open_with(version.to_string(), &options) {
        Ok(file) => file.into_std(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ArtifactError::io("cannot open a version (a link is refused)", e)),
    };
    let meta = file.metadata().map_err(|e| ArtifactError::io("cannot read a version", e))?;
    if !meta.is_file() {
        return Err(ArtifactError::Io("a version is not a regular file".into()));
    }
    Ok(Some(file))
}

/// Reads a version file's header line.
fn read_header(reader: &mut BufReader<std::fs::File>) -> Result<Header, ArtifactError> {
    let mut line = Vec::new();
    reader
        .take(MAX_HEADER_BYTES)
        .read_until(b'\n', &mut line)
        .map_err(|e| ArtifactError::io("cannot read a version", e))?;
    if line.pop() != Some(b'\n') {
        return Err(ArtifactError::Io("a version's header is damaged".into()));
    }
    serde_json::from_slice(&line).map_err(|_| ArtifactError::Io("a version's header is damaged".into()))
}

/// Takes `scope_dir`'s lock (released when the file drops).
fn lock(scope_dir: &Dir) -> Result<std::fs::File, ArtifactError> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true).follow(FollowSymlinks::No).mode(0o600);
    let file = scope_dir
        .open_with(LOCK_FILE, &options)
        .map_err(|e| ArtifactError::io("cannot open the scope's lock (a link is refused)", e))?
        .into_std();
    file.lock().map_err(|e| ArtifactError::io("cannot lock the scope", e))?;
    Ok(file)
}

/// The artifact names in `scope_dir`: its directories with valid names.
fn artifact_names(scope_dir: &Dir) -> Result<Vec<String>, ArtifactError> {
    let failed = |e| ArtifactError::io("cannot list the scope", e);
    let mut names = Vec::new();
    for entry in scope_dir.entries().map_err(failed)? {
        let entry = entry.map_err(failed)?;
        if !entry.file_type().map_err(failed)?.is_dir() {
            continue;
        }
        if let Some(name) = entry.file_name().to_str().filter(|n| check_name(n).is_ok()) {
            names.push(name.to_string());
        }
    }
    names.sort();
    Ok(names)
}

/// The versions in `name_dir` (regular files named by a number), ascending.
fn versions_of(name_dir: &Dir) -> Result<Vec<u32>, ArtifactError> {
    let failed = |e| ArtifactError::io("cannot list an artifact", e);
    let mut versions = Vec::new();
    for entry in name_dir.entries().map_err(failed)? {
        let entry = entry.map_err(failed)?;
        if let Some(version) = entry.file_name().to_str().and_then(version_of)
            && entry.file_type().map_err(failed)?.is_file()
        {
            versions.push(version);
        }
    }
    versions.sort_unstable();
    Ok(versions)
}

/// The latest version in `name_dir`.
fn latest(name_dir: &Dir) -> Result<Option<u32>, ArtifactError> {
    Ok(versions_of(name_dir)?.last().copied())
}

/// Removes the temporary files of crashed saves (the caller holds the lock).
fn remove_temps(name_dir: &Dir) {
    let Ok(entries) = name_dir.entries() else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        if name.to_str().is_some_and(|n| n.starts_with(TEMP_PREFIX)) {
            let _ = name_dir.remove_file_or_symlink(&name);
        }
    }
}

/// What every scope below `scopes` holds, in bytes.
fn total_of(scopes: &Dir) -> Result<u64, ArtifactError> {
    let failed = |e| ArtifactError::io("cannot measure the store", e);
    let mut total = 0u64;
    for entry in scopes.entries().map_err(failed)? {
        let entry = entry.map_err(failed)?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !entry.file_type().map_err(failed)?.is_dir() {
            continue;
        }
        if let Some(scope_dir) = open_existing(scopes, name)? {
            total = total.saturating_add(usage_of(&scope_dir)?.bytes);
        }
    }
    Ok(total)
}

/// What `scope_dir` holds: every regular version file's size and count.
fn usage_of(scope_dir: &Dir) -> Result<ScopeUsage, ArtifactError> {
    let failed = |e| ArtifactError::io("cannot measure the scope", e);
    let mut usage = ScopeUsage::default();
    for name in artifact_names(scope_dir)? {
        let Some(name_dir) = open_existing(scope_dir, &name)? else { continue };
        for entry in name_dir.entries().map_err(failed)? {
            let entry = entry.map_err(failed)?;
            let meta = entry.metadata().map_err(failed)?;
            if meta.is_file() && entry.file_name().to_str().and_then(version_of).is_some() {
                usage.files += 1;
                usage.bytes = usage.bytes.saturating_add(meta.len());
            }
        }
    }
    Ok(usage)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn open(dir: &Path, cfg: impl FnOnce(ArtifactStoreConfig) -> ArtifactStoreConfig) -> ArtifactStore {
        ArtifactStore::new(cfg(ArtifactStoreConfig::default().dir(dir))).unwrap()
    }

    /// The directory of `scope` on disk.
    fn scope_path(dir: &Path, scope: &str) -> std::path::PathBuf {
        dir.join("scopes").join(scope_dir_name(scope))
    }

    #[test]
    fn every_save_is_a_new_version_and_loads_back_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), |c| c);
        let v1 = store.save_text("s", "a.csv", "x,y\n1,2\n", Some("text/csv")).unwrap();
        let v2 = store.save_bytes("s", "a.csv", &[0, 159, 146, 150], None).unwrap();
        assert_eq!((v1.version, v2.version), (1, 2));
        assert!(v1.text && !v2.text);
        assert_eq!(v1.sha256, hex::encode(Sha256::digest(b"x,y\n1,2\n")));
        let latest = store.load("s", "a.csv", None).unwrap();
        assert_eq!((latest.version.version, latest.content.as_slice()), (2, &[0, 159, 146, 150][..]));
        let first = store.load("s", "a.csv", Some(1)).unwrap();
        assert_eq!(first.content, b"x,y\n1,2\n");
        assert_eq!(first.version.media_type.as_deref(), Some("text/csv"));
        assert!(matches!(store.load("s", "a.csv", Some(3)), Err(ArtifactError::NotFound { version: Some(3), .. })));
        assert!(matches!(store.load("s", "b", None), Err(ArtifactError::NotFound { .. })));
        let listed = store.list("s").unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].versions.iter().map(|v| v.version).collect::<Vec<_>>(), [1, 2]);
        // Opened again (another process, a restart), everything is still there.
        let again = open(dir.path(), |c| c);
        assert_eq!(again.load("s", "a.csv", Some(1)).unwrap().content, b"x,y\n1,2\n");
        assert_eq!(again.total_bytes(), store.total_bytes());
        assert_eq!(again.usage("s").unwrap(), store.usage("s").unwrap());
    }

    #[test]
    fn scopes_are_apart() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), |c| c);
        store.save_text("session:a", "notes", "a's", None).unwrap();
        store.save_text("session:b", "notes", "b's", None).unwrap();
        assert_eq!(store.load("session:a", "notes", None).unwrap().content, b"a's");
        assert_eq!(store.load("session:b", "notes", None).unwrap().content, b"b's");
        assert_eq!(store.load("session:b", "notes", None).unwrap().version.version, 1);
        assert!(store.list("session:c").unwrap().is_empty());
        // A scope that looks like a path is only a name: it hashes.
        store.save_text("../../etc", "x", "y", None).unwrap();
        assert!(scope_path(dir.path(), "../../etc").is_dir());
        assert!(store.remove_scope("session:a").unwrap());
        assert!(!store.remove_scope("session:a").unwrap());
        assert!(store.list("session:a").unwrap().is_empty());
        assert_eq!(store.load("session:b", "notes", None).unwrap().content, b"b's");
    }

    #[test]
    fn hostile_names_never_reach_the_disk() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), |c| c);
        for bad in ["", ".", "..", "../escape", "/etc/passwd", "a/b", ".lock", ".tmp-1", "a\0b"] {
            assert!(matches!(store.save_text("s", bad, "x", None), Err(ArtifactError::BadName { .. })), "{bad:?}");
            assert!(matches!(store.load("s", bad, None), Err(ArtifactError::BadName { .. })), "{bad:?}");
        }
        assert!(!dir.path().join("escape").exists());
        assert!(matches!(store.save_text("s", "a", "x", Some("text/\ncsv")), Err(ArtifactError::BadArgument(_))));
    }

    #[test]
    fn quotas_of_a_file_a_scope_and_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), |c| c.max_file_bytes(1000).max_scope_bytes(3000).max_scope_files(5));
        let big = "x".repeat(1001);
        assert!(matches!(store.save_text("s", "big", &big, None), Err(ArtifactError::QuotaExceeded(_))));
        // Bytes: each version is its content and a header.
        let kb = "x".repeat(900);
        let mut saved = 0;
        let err = loop {
            match store.save_text("s", "f", &kb, None) {
                Ok(_) => saved += 1,
                Err(e) => break e,
            }
        };
        assert_eq!(saved, 2, "3000 bytes hold two versions of 900 bytes and their headers, not three");
        assert!(matches!(err, ArtifactError::QuotaExceeded(ref m) if m.contains("3000")), "{err}");
        assert!(store.usage("s").unwrap().bytes <= 3000);
        // Files: five versions, however small.
        for _ in 0..5 {
            let _ = store.save_text("t", "tiny", "", None);
        }
        assert_eq!(store.usage("t").unwrap().files, 5);
        assert!(matches!(store.save_text("t", "tiny", "", None), Err(ArtifactError::QuotaExceeded(_))));
        // Nothing failed half-way: no temporary file is left.
        for scope in ["s", "t"] {
            for entry in std::fs::read_dir(scope_path(dir.path(), scope)).unwrap() {
                let entry = entry.unwrap();
                if entry.file_type().unwrap().is_dir() {
                    for file in std::fs::read_dir(entry.path()).unwrap() {
                        let name = file.unwrap().file_name().into_string().unwrap();
                        assert!(version_of(&name).is_some(), "{name}");
                    }
                }
            }
        }

        // The total, across scopes: removing a scope gives its bytes back.
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), |c| c.max_total_bytes(2500));
        store.save_text("a", "f", &kb, None).unwrap();
        store.save_text("b", "f", &kb, None).unwrap();
        let err = store.save_text("c", "f", &kb, None).unwrap_err();
        assert!(matches!(err, ArtifactError::QuotaExceeded(ref m) if m.contains("total")), "{err}");
        store.remove_scope("a").unwrap();
        store.save_text("c", "f", &kb, None).unwrap();
        // A store opened on the same directory counts what is there.
        let again = open(dir.path(), |c| c.max_total_bytes(2500));
        assert_eq!(again.total_bytes(), store.total_bytes());
        assert!(again.save_text("d", "f", &kb, None).is_err());
    }

    #[test]
    fn configuration_mistakes_are_typed() {
        let dir = tempfile::tempdir().unwrap();
        for cfg in [
            ArtifactStoreConfig::default().dir(dir.path()).max_scope_bytes(0),
            ArtifactStoreConfig::default().dir(dir.path()).max_total_bytes(0),
            ArtifactStoreConfig::default().dir(""),
        ] {
            assert!(matches!(ArtifactStore::new(cfg), Err(ConfigError::Invalid { .. })));
        }
        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        let err = ArtifactStore::new(ArtifactStoreConfig::default().dir(&file)).unwrap_err();
        assert!(matches!(err, ConfigError::Invalid { setting: "ArtifactStoreConfig::dir", .. }), "{err}");
    }

    #[test]
    fn links_planted_in_the_data_directory_are_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(
            outside.path().join("1"),
            "{\"size\":6,\"sha256\":\"x\",\"created_unix_ms\":0,\"text\":true}\nsecret",
        )
        .unwrap();
        let store = open(dir.path(), |c| c);
        // A scope's directory that is a link elsewhere.
        symlink(outside.path(), scope_path(dir.path(), "linked")).unwrap();
        assert!(matches!(store.save_text("linked", "a", "x", None), Err(ArtifactError::Io(_))));
        assert!(matches!(store.list("linked"), Err(ArtifactError::Io(_))));
        assert!(matches!(store.load("linked", "a", None), Err(ArtifactError::Io(_))));
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1, "nothing was written there");
        // An artifact's directory that is a link.
        store.save_text("s", "real", "x", None).unwrap();
        symlink(outside.path(), scope_path(dir.path(), "s").join("evil")).unwrap();
        assert!(store.load("s", "evil", None).is_err());
        assert!(store.save_text("s", "evil", "x", None).is_err());
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
        // A version that is a link.
        let real = scope_path(dir.path(), "s").join("real");
        symlink(outside.path().join("1"), real.join("2")).unwrap();
        let err = store.load("s", "real", Some(2)).unwrap_err();
        assert!(matches!(err, ArtifactError::Io(_)), "{err}");
        // Listing skips what is not a store's own (the link is neither a
        // directory nor a regular file to it).
        let names: Vec<String> = store.list("s").unwrap().into_iter().map(|a| a.name).collect();
        assert_eq!(names, ["real"]);
        // The lock file as a link is refused too.
        symlink(outside.path().join("1"), scope_path(dir.path(), "s").join(LOCK_FILE)).unwrap_or_else(|_| {
            std::fs::remove_file(scope_path(dir.path(), "s").join(LOCK_FILE)).unwrap();
            symlink(outside.path().join("1"), scope_path(dir.path(), "s").join(LOCK_FILE)).unwrap();
        });
        assert!(store.save_text("s", "real", "y", None).is_err());
        assert_eq!(std::fs::read(outside.path().join("1")).unwrap().len(), 62, "the target is untouched");
        // Removing a scope unlinks links, never what they point at.
        assert!(store.remove_scope("s").unwrap());
        assert!(outside.path().join("1").exists());
    }

    #[test]
    fn a_damaged_version_is_reported_not_returned() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), |c| c);
        store.save_text("s", "a", "hello", None).unwrap();
        let file = scope_path(dir.path(), "s").join("a").join("1");
        let mut bytes = std::fs::read(&file).unwrap();
        *bytes.last_mut().unwrap() = b'X';
        std::fs::write(&file, bytes).unwrap();
        let err = store.load("s", "a", None).unwrap_err();
        assert!(matches!(err, ArtifactError::Io(ref m) if m.contains("damaged")), "{err}");
    }

    #[test]
    fn a_crashed_save_leaves_no_version_and_is_cleaned_up() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), |c| c);
        store.save_text("s", "a", "one", None).unwrap();
        // What a save that died before its rename leaves: a temporary file.
        let name_dir = scope_path(dir.path(), "s").join("a");
        std::fs::write(name_dir.join(format!("{TEMP_PREFIX}dead")), "half").unwrap();
        assert_eq!(store.list("s").unwrap()[0].versions.len(), 1, "a temporary file is no version");
        assert_eq!(store.load("s", "a", None).unwrap().content, b"one");
        assert_eq!(store.save_text("s", "a", "two", None).unwrap().version, 2);
        assert!(!name_dir.join(format!("{TEMP_PREFIX}dead")).exists(), "the next save removes it");
    }

    #[test]
    fn concurrent_saves_get_distinct_versions_within_the_quota() {
        let dir = tempfile::tempdir().unwrap();
        // Room for 20 versions of 100 bytes and their headers, not 40.
        let store = open(dir.path(), |c| c.max_scope_files(20));
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let store = store.clone();
                std::thread::spawn(move || {
                    (0..5).filter_map(|i| store.save_text("s", "log", &format!("{t}-{i}"), None).ok()).count()
                })
            })
            .collect();
        let saved: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(saved, 20, "exactly the quota's files");
        let versions: Vec<u32> = store.list("s").unwrap()[0].versions.iter().map(|v| v.version).collect();
        assert_eq!(versions, (1..=20).collect::<Vec<_>>(), "no version lost or written twice");
        for v in 1..=20 {
            store.load("s", "log", Some(v)).unwrap();
        }
        // And another handle on the same directory (as another process would) shares the lock.
        let other = open(dir.path(), |c| c.max_scope_files(25));
        let a = std::thread::spawn({
            let store = store.clone();
            move || (0..5).filter(|_| store.save_text("t", "x", "a", None).is_ok()).count()
        });
        let b = std::thread::spawn(move || (0..5).filter(|_| other.save_text("t", "x", "b", None).is_ok()).count());
        assert_eq!(a.join().unwrap() + b.join().unwrap(), 10);
        let versions: Vec<u32> = store.list("t").unwrap()[0].versions.iter().map(|v| v.version).collect();
        assert_eq!(versions, (1..=10).collect::<Vec<_>>());
    }

    /// Every directory and file below `dir`'s `scopes/`, as paths relative to it.
    fn tree(dir: &Path) -> Vec<String> {
        let root = dir.join("scopes");
        let mut found = Vec::new();
        let mut todo = vec![root.clone()];
        while let Some(at) = todo.pop() {
            for entry in std::fs::read_dir(&at).unwrap() {
                let path = entry.unwrap().path();
                found.push(path.strip_prefix(&root).unwrap().display().to_string());
                if path.is_dir() && !path.is_symlink() {
                    todo.push(path);
                }
            }
        }
        found.sort();
        found
    }

    /// B2: a save the quotas refuse used to make its name's directory (and a
    /// new scope's) before the total was checked: hundreds of empty
    /// directories the quota does not count. Nothing is written now.
    #[test]
    fn a_refused_save_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), |c| c.max_total_bytes(2000).max_scope_bytes(1500).max_file_bytes(1000));
        store.save_text("s", "first", &"x".repeat(900), None).unwrap();
        // The store is now within a few hundred bytes of its total.
        let before = tree(dir.path());
        for i in 0..50 {
            let refusals = [
                // The total, in the scope that exists and in new scopes.
                store.save_text("s", &format!("n{i}"), &"y".repeat(900), None),
                store.save_text(&format!("new-{i}"), "n", &"y".repeat(900), None),
                // The scope's bytes, the largest file, a bad name.
                store.save_text("s", &format!("m{i}"), &"y".repeat(700), None),
                store.save_text(&format!("big-{i}"), "n", &"y".repeat(1001), None),
                store.save_text(&format!("bad-{i}"), "../x", "y", None),
            ];
            for refused in refusals {
                assert!(
                    matches!(refused, Err(ArtifactError::QuotaExceeded(_) | ArtifactError::BadName { .. })),
                    "{refused:?}"
                );
            }
        }
        let left: Vec<String> = tree(dir.path()).into_iter().filter(|p| !before.contains(p)).collect();
        assert!(left.is_empty(), "refused saves left {} entries, such as {:?}", left.len(), &left[..left.len().min(4)]);
        assert_eq!(store.list("s").unwrap().len(), 1);
        assert_eq!(store.usage("s").unwrap().files, 1);
        // The scope's file quota, with room in bytes.
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), |c| c.max_scope_files(2));
        store.save_text("s", "a", "1", None).unwrap();
        store.save_text("s", "a", "2", None).unwrap();
        let before = tree(dir.path());
        for i in 0..20 {
            assert!(matches!(store.save_text("s", &format!("n{i}"), "x", None), Err(ArtifactError::QuotaExceeded(_))));
        }
        assert_eq!(tree(dir.path()), before);
        // The total's room is given back by a refused save: the bytes it held
        // while it checked are not lost.
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), |c| c.max_scope_files(1));
        store.save_text("s", "a", "1", None).unwrap();
        let total = store.total_bytes();
        assert!(store.save_text("s", "b", "2", None).is_err());
        assert_eq!(store.total_bytes(), total);
    }

    /// Item 3 of the adversarial pass: a container granted a world-writable
    /// store directory could plant a version, header and sha256 included,
    /// that another scope then loads. Such a store is refused.
    #[test]
    fn a_store_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let chmod =
            |path: &Path, mode: u32| std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        let refused = |why: &str| {
            let err = ArtifactStore::new(ArtifactStoreConfig::default().dir(dir.path())).unwrap_err();
            let text = err.to_string();
            assert!(matches!(err, ConfigError::Invalid { setting: "ArtifactStoreConfig::dir", .. }), "{text}");
            assert!(text.contains(why), "{text}");
        };
        chmod(dir.path(), 0o777);
        refused("writable by group or others (mode 777)");
        refused("chmod go-w");
        chmod(dir.path(), 0o1770);
        refused("writable by group or others");
        chmod(dir.path(), 0o755);
        open(dir.path(), |c| c).save_text("s", "a", "mine", None).unwrap();
        // `scopes/` is checked too: it is where a version would be planted.
        chmod(&dir.path().join("scopes"), 0o757);
        refused("scopes is writable by group or others");
        chmod(&dir.path().join("scopes"), 0o700);
        assert_eq!(open(dir.path(), |c| c).load("s", "a", None).unwrap().content, b"mine");
        // Another user's directory (only root can make one to test with).
        if rustix::process::geteuid().is_root() {
            std::os::unix::fs::chown(dir.path(), Some(65534), None).unwrap();
            refused("owned by uid 65534");
        }
    }

    /// B1: scopes a process owns carry its owner record from their first
    /// save; a store opened later removes those whose owner is gone, and
    /// never a scope no process owns or one of a live process.
    #[test]
    fn owned_scopes_are_reclaimed_once_their_owner_is_gone() {
        use crate::artifacts::owned::tests::record;
        use crate::owner;
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), |c| c);
        store.own_scopes("mine:");
        store.save_text("mine:1", "a", "x", None).unwrap();
        store.save_text("kept", "a", "persistent", None).unwrap();
        assert!(scope_path(dir.path(), "mine:1").join(owned::OWNER_FILE).is_file());
        assert!(!scope_path(dir.path(), "kept").join(owned::OWNER_FILE).exists(), "no process owns it");
        // Scopes other owners left: a dead process of this namespace, a
        // live one (this test's parent), one of another PID namespace, an
        // earlier boot of this host.
        let boot = owner::boot_of(owner::namespace());
        let parent = std::os::unix::process::parent_id();
        let parent_start = std::fs::read_to_string(format!("/proc/{parent}/stat")).unwrap();
        let parent_start = parent_start[parent_start.rfind(')').unwrap() + 1..].split_whitespace().nth(19).unwrap();
        let others = [
            ("dead", record("999999999.1", owner::namespace(), owner::host()), true),
            ("live", record(&format!("{parent}.{parent_start}"), owner::namespace(), owner::host()), false),
            ("elsewhere", record("999999999.1", &format!("{boot}.1"), owner::host()), false),
            ("rebooted", record("999999999.1", "an-earlier-boot.1", owner::host()), true),
        ];
        for (scope, owner_record, _) in &others {
            store.save_text(scope, "a", &"z".repeat(100), None).unwrap();
            std::fs::write(scope_path(dir.path(), scope).join(owned::OWNER_FILE), owner_record).unwrap();
        }
        let total = store.total_bytes();
        let again = open(dir.path(), |c| c);
        assert_eq!(again.total_bytes(), total, "counted when it opens");
        // It sweeps on its own thread; this sweeps now (in turns with it).
        again.reclaim_abandoned_scopes().unwrap();
        for (scope, _, gone) in &others {
            assert_eq!(!scope_path(dir.path(), scope).exists(), *gone, "{scope}");
        }
        assert!(scope_path(dir.path(), "mine:1").exists(), "this process is alive");
        assert_eq!(again.load("kept", "a", None).unwrap().content, b"persistent");
        let each = store.usage("live").unwrap().bytes;
        assert_eq!(again.total_bytes(), total - 2 * each, "their bytes left the total");
        // Its owner removes what it owns, and only that.
        assert_eq!(store.remove_owned_scopes("mine:"), 1);
        assert!(!scope_path(dir.path(), "mine:1").exists());
        assert!(scope_path(dir.path(), "kept").exists() && scope_path(dir.path(), "live").exists());
        // A scope of an owned prefix that existed before gets the record at its next save.
        let later = open(dir.path(), |c| c);
        later.own_scopes("kep");
        later.save_text("kept", "b", "y", None).unwrap();
        assert!(scope_path(dir.path(), "kept").join(owned::OWNER_FILE).is_file());
    }

    /// How long a sweep takes (the numbers in docs/code-mode.md):
    /// `cargo test --lib sweep_takes -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, not a check"]
    fn sweep_takes() {
        use crate::artifacts::owned::tests::record;
        use crate::owner;
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path(), |c| c.max_total_bytes(1 << 40));
        for i in 0..1000 {
            store.save_text(&format!("kept-{i}"), "a", "x", None).unwrap();
        }
        let started = std::time::Instant::now();
        assert_eq!(store.reclaim_abandoned_scopes().unwrap(), 0);
        println!("sweep of 1,000 scopes, none removed: {:?}", started.elapsed());
        let dead = record("999999999.1", owner::namespace(), owner::host());
        for i in 0..100 {
            let scope = format!("dead-{i}");
            for v in 0..100 {
                store.save_text(&scope, &format!("f{v}"), &"x".repeat(100), None).unwrap();
            }
            std::fs::write(scope_path(dir.path(), &scope).join(owned::OWNER_FILE), &dead).unwrap();
        }
        let started = std::time::Instant::now();
        assert_eq!(store.reclaim_abandoned_scopes().unwrap(), 100);
        println!("sweep of 1,100 scopes, 100 of 100 versions removed: {:?}", started.elapsed());
    }
}
