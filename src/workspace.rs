//! Workspaces: a file tree that outlives runs, seen read-write at `/work` by
//! every backend that carries files (`container`, `wasm`, `python-wasm`,
//! `quickjs-wasm`), under one quota.
//!
//! A workspace is a tmpfs that execbox mounts with a size and an inode cap
//! (`size=`, `nr_inodes=`), so the kernel holds the quota against every
//! writer at once: code in a container writing straight into its bind
//! mount, a wasm guest writing through the host. A write past it fails with
//! `ENOSPC` inside the code. Being a filesystem of its own, it also refuses
//! hard links to any file outside it (`EXDEV`).
//!
//! Mounting needs `CAP_SYS_ADMIN` (root, as a server in a VM or a pod
//! usually runs). Without it [`Workspace::create`] fails with
//! [`WorkspaceError::CannotMount`]: nothing falls back to a directory with
//! no quota.
//!
//! The host reaches the files only through a cap-std handle on the mount
//! (see `hostfs`): no symlink, FIFO or device planted by code leads it
//! outside the workspace.
//!
//! Dropping the last handle unmounts the workspace (lazily: a run still
//! using it keeps it until it ends) and removes its directory. A process
//! killed with workspaces mounted leaves them behind; the next
//! [`Workspace::create`] under the same root unmounts and removes those
//! whose owner process is gone.

use std::ffi::{CString, OsStr};
use std::fmt;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cap_std::fs::Dir;
use rustix::fs::{AtFlags, Gid, Uid, chownat};
use rustix::mount::{MountFlags, UnmountFlags, mount, unmount};
use serde::{Deserialize, Serialize};

use crate::file::ExecFile;
use crate::hostfs;

/// Where a run's JSON input is written, in every backend's `/work`.
#[cfg_attr(not(any(feature = "wasm", feature = "container")), allow(dead_code))]
const INPUT_JSON: &str = "input.json";

/// Where every backend that carries files sees a workspace.
pub const GUEST_PATH: &str = "/work";

/// Where collected files are saved on the host (also at
/// `backends::container::OutputDir`): what `execbox run --workspace`
/// writes a workspace's files back with.
pub use crate::hostfs::{OutputDir, SaveError};

/// Where workspaces are mounted unless configured.
pub const DEFAULT_ROOT: &str = "/run/execbox/workspaces";

/// What a workspace may hold, and where it is mounted.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct WorkspaceConfig {
    /// Bytes the files may take (the tmpfs's `size=`).
    ///
    /// # Default
    /// 64 MiB.
    pub quota_bytes: u64,
    /// Files and directories it may hold (the tmpfs's `nr_inodes=`, less
    /// its root).
    ///
    /// # Default
    /// 10,000.
    pub max_files: u64,
    /// The directory workspaces are mounted under; stale ones found there
    /// (of processes that are gone) are removed when one is created.
    ///
    /// # Default
    /// [`DEFAULT_ROOT`].
    pub root: PathBuf,
    /// The user and group (`uid`, `gid`) code runs as in a container: the
    /// workspace's root and every file execbox writes into it are theirs,
    /// so a container run can write and replace them. A container backend
    /// whose [`ContainerConfig::user`](crate::backends::container::ContainerConfig::user)
    /// is another refuses to run in the workspace.
    ///
    /// # Default
    /// `(65534, 65534)` (nobody, the container backend's default user).
    pub code_user: (u32, u32),
    /// A host directory the workspace's files are copied into when it goes
    /// (its last handle dropped, or [`Workspace::end_now`]), as
    /// [`Workspace::export_dir`] copies: made if missing, same-named files
    /// replaced. The copy runs on the thread that drops the last handle; a
    /// failure is logged. A host killed outright (SIGKILL) copies nothing:
    /// call `export_dir` at the points you cannot lose.
    ///
    /// # Default
    /// None: the files go with the workspace.
    pub persist_to: Option<PathBuf>,
    /// It ends (as [`Workspace::end_now`] ends it) once it has not been
    /// used for this long: no host-side file work, no run starting or
    /// ending, no run in it, and no program container running in it.
    ///
    /// # Default
    /// None: its handles alone decide.
    pub idle_timeout: Option<Duration>,
    /// It ends this long after it was made, in use or not.
    ///
    /// # Default
    /// None: its handles alone decide.
    pub lifetime: Option<Duration>,
}

impl Default for WorkspaceConfig {
    fn default() -> Self {
        Self {
            quota_bytes: 64 << 20,
            max_files: 10_000,
            root: PathBuf::from(DEFAULT_ROOT),
            code_user: (65534, 65534),
            persist_to: None,
            idle_timeout: None,
            lifetime: None,
        }
    }
}

impl WorkspaceConfig {
    /// Sets [`WorkspaceConfig::quota_bytes`].
    pub fn quota_bytes(mut self, bytes: u64) -> Self {
        self.quota_bytes = bytes;
        self
    }

    /// Sets [`WorkspaceConfig::max_files`].
    pub fn max_files(mut self, files: u64) -> Self {
        self.max_files = files;
        self
    }

    /// Sets [`WorkspaceConfig::code_user`].
    pub fn code_user(mut self, uid: u32, gid: u32) -> Self {
        self.code_user = (uid, gid);
        self
    }

    /// Sets [`WorkspaceConfig::root`].
    pub fn root(mut self, root: impl Into<PathBuf>) -> Self {
        self.root = root.into();
        self
    }

    /// Sets [`WorkspaceConfig::persist_to`].
    pub fn persist_to(mut self, dir: impl Into<PathBuf>) -> Self {
        self.persist_to = Some(dir.into());
        self
    }

    /// Sets [`WorkspaceConfig::idle_timeout`].
    pub fn idle_timeout(mut self, idle: Duration) -> Self {
        self.idle_timeout = Some(idle);
        self
    }

    /// Sets [`WorkspaceConfig::lifetime`].
    pub fn lifetime(mut self, lifetime: Duration) -> Self {
        self.lifetime = Some(lifetime);
        self
    }
}

/// Why a workspace could not be made, or a file in it not be reached.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkspaceError {
    /// This process cannot mount the workspace's tmpfs.
    #[error("cannot mount a workspace at {}: {source} (workspaces need CAP_SYS_ADMIN: run as root)", path.display())]
    CannotMount {
        /// The mount point.
        path: PathBuf,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },
    /// A quota of zero bytes or files.
    #[error("a workspace needs a quota of at least one byte and one file")]
    NoQuota,
    /// The path is not a relative path inside the workspace.
    #[error("{path:?} is not a path inside the workspace: {reason}")]
    BadPath {
        /// The path as given.
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A glob (or the list of them) that [`Workspace::collect`] does not take.
    #[error("glob {glob:?}: {reason}")]
    BadGlob {
        /// The glob as given (or how many were given).
        glob: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A file mode that is not permission bits.
    #[error("mode {mode:#o} for {path:?} is not permission bits: at most 0o777, no set-id or sticky bit")]
    BadMode {
        /// The file it was for.
        path: String,
        /// The mode as given.
        mode: u32,
    },
    /// The workspace has ended (idle, past its lifetime, or
    /// [`Workspace::end_now`]); its files are gone.
    #[error("the workspace has ended ({why}): its files are gone")]
    Ended {
        /// Why it ended.
        why: String,
    },
    /// A file operation failed (a symlink on the way, not a regular file,
    /// over the size asked for, the quota).
    #[error("{path}: {source}")]
    Io {
        /// The path, or what was being done.
        path: String,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// How full a workspace is, as its filesystem counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceUsage {
    /// Bytes its files take.
    pub bytes_used: u64,
    /// [`WorkspaceConfig::quota_bytes`], rounded to whole pages.
    pub quota_bytes: u64,
    /// Files and directories in it.
    pub files_used: u64,
    /// [`WorkspaceConfig::max_files`].
    pub max_files: u64,
    /// No byte or no file was left when it was measured (for a run: when
    /// the run ended), so the next write fails with `ENOSPC`. A run that
    /// hit the quota and then freed space reads `false`.
    pub full: bool,
}

/// What [`Workspace::collect`] gives back, and how much.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct CollectLimits {
    /// Files at the most.
    ///
    /// # Default
    /// 100.
    pub max_files: usize,
    /// Bytes of one file at the most (a larger file is left out, named).
    ///
    /// # Default
    /// 1 MiB.
    pub max_file_bytes: u64,
    /// Bytes of all files together at the most.
    ///
    /// # Default
    /// 8 MiB.
    pub max_total_bytes: u64,
}

impl CollectLimits {
    /// Limits of `max_files` files, `max_file_bytes` each and
    /// `max_total_bytes` together.
    pub fn new(max_files: usize, max_file_bytes: u64, max_total_bytes: u64) -> Self {
        Self { max_files, max_file_bytes, max_total_bytes }
    }
}

impl Default for CollectLimits {
    fn default() -> Self {
        Self { max_files: 100, max_file_bytes: 1 << 20, max_total_bytes: 8 << 20 }
    }
}

/// Entries a collect walks at the most, and how deep: a tree planted by
/// code is walked within bounds, whatever it holds.
const WALK_ENTRIES: usize = 100_000;
const WALK_DEPTH: usize = 64;
/// How long a collect may walk and match: globs are matched by
/// backtracking, so their cost is bounded by time as well as by size.
const WALK_TIME: std::time::Duration = std::time::Duration::from_secs(2);
/// Globs per collect, bytes per glob, and `*` per glob, at the most.
const MAX_GLOBS: usize = 32;
const MAX_GLOB_BYTES: usize = 256;
const MAX_GLOB_STARS: usize = 8;

/// One file [`Workspace::collect`] read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollectedFile {
    /// Its path relative to the workspace.
    pub path: String,
    /// Its bytes.
    pub content: Vec<u8>,
    /// Its permission bits (at most `0o777`) when it was found.
    pub mode: u32,
}

/// What [`Workspace::collect`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Collected {
    /// The files read, in path order.
    pub files: Vec<CollectedFile>,
    /// Each limit that left something out: `max_files`, `max_file_bytes`,
    /// `max_total_bytes`, `walk` (100,000 entries or 64 levels), `time`
    /// (2 s of walking and matching).
    pub limits_hit: Vec<String>,
    /// Matching paths not read, each with why (a limit, or not a regular
    /// file: symlinks, FIFOs, devices are never followed or opened).
    pub left_out: Vec<String>,
}

/// Entries a workspace's metadata keeps of each kind: past it the oldest
/// go first, counted in [`WorkspaceMetadata::dropped`].
const METADATA_ENTRIES: usize = 1000;
/// Characters of a path a metadata entry keeps (a longer one is cut, `…` marking it).
const MAX_RECORDED_PATH_CHARS: usize = 1024;

/// The host's record of what was put into a workspace and taken out of it
/// ([`Workspace::metadata`]; its `metadata.json`). Kept host side: code in
/// the workspace can neither read nor change it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceMetadata {
    /// Files put in, oldest first: by the host's writes, as a run's input
    /// files, by an import (a run's JSON input, `input.json`, is not listed).
    pub inputs: Vec<RecordedFile>,
    /// Files taken out, oldest first: read back by a collect, or saved as
    /// artifacts.
    pub outputs: Vec<RecordedFile>,
    /// Entries dropped (the oldest) past 1,000 of a kind.
    pub dropped: u64,
}

/// One file in a [`WorkspaceMetadata`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordedFile {
    /// Its path relative to the workspace (its first 1,024 characters and
    /// `…` when longer).
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
    /// The sha256 of its bytes, hex (none for an import, which copies
    /// without reading the file into memory).
    pub sha256: Option<String>,
    /// How it moved: `write` (the host wrote it), `input` (a run's input
    /// file), `import` ([`Workspace::import_dir`]), `collect` (read back by
    /// [`Workspace::collect`]), or `artifact:NAME@VERSION` (from or to an
    /// artifact).
    pub via: String,
    /// When, in milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
}

/// Which list of a [`WorkspaceMetadata`] an entry goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    In,
    Out,
}

/// A handle that does not keep its workspace mounted
/// ([`Workspace::downgrade`]).
#[derive(Clone, Debug)]
pub struct WeakWorkspace(std::sync::Weak<Mounted>);

impl WeakWorkspace {
    /// The workspace, if a handle still keeps it.
    pub fn upgrade(&self) -> Option<Workspace> {
        self.0.upgrade().map(Workspace)
    }
}

/// What a copy of a tree ([`Workspace::import_dir`],
/// [`Workspace::export_dir`]) copied, and what it did not.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Copied {
    /// Regular files copied.
    pub files: usize,
    /// Their bytes.
    pub bytes: u64,
    /// What was not copied, each with why (a symlink, a special file, a
    /// name that is not UTF-8, the walk's bounds).
    pub left_out: Vec<String>,
}

/// What [`Workspace::import_dir`] copied (its first name for [`Copied`]).
pub type Imported = Copied;

/// A workspace: a handle that can be cloned and given to requests
/// ([`ExecRequest::workspace`](crate::request::ExecRequest::workspace));
/// the workspace goes when the last handle does. Two handles are equal
/// when they name the same workspace.
#[derive(Clone)]
pub struct Workspace(Arc<Mounted>);

struct Mounted {
    id: String,
    path: PathBuf,
    max_files: u64,
    code_user: (u32, u32),
    /// A run holds its turn (see [`RunTurn`]).
    running: std::sync::atomic::AtomicBool,
    /// The mount's root: every file operation of the host is relative to it.
    dir: Dir,
    /// What carries its programs (a backend's, e.g. a container), dropped
    /// (and so ended) before the workspace is unmounted.
    carrier: parking_lot::Mutex<Option<Arc<dyn std::any::Any + Send + Sync>>>,
    metadata: parking_lot::Mutex<WorkspaceMetadata>,
    /// Where its files are copied when it goes (taken by the first copy).
    persist_to: parking_lot::Mutex<Option<PathBuf>>,
    /// Why it ended, once it has (before its last handle went).
    ended: parking_lot::Mutex<Option<String>>,
    /// When it was made and last used, and its bounds (see `expiry`).
    created: Instant,
    last_used: parking_lot::Mutex<Instant>,
    idle_timeout: Option<Duration>,
    lifetime: Option<Duration>,
}

impl Workspace {
    /// Mounts a new, empty workspace under `cfg.root`, first removing the
    /// workspaces there of processes that are gone.
    pub fn create(cfg: WorkspaceConfig) -> Result<Self, WorkspaceError> {
        if cfg.quota_bytes == 0 || cfg.max_files == 0 {
            return Err(WorkspaceError::NoQuota);
        }
        fn io_at(path: &Path) -> impl FnOnce(io::Error) -> WorkspaceError + '_ {
            move |source| WorkspaceError::Io { path: path.display().to_string(), source }
        }
        std::fs::create_dir_all(&cfg.root).map_err(io_at(&cfg.root))?;
        sweep_stale(&cfg.root);
        let id = format!("{}-{:016x}", crate::owner::token(), crate::nonce::random_u64());
        let path = cfg.root.join(&id);
        std::fs::create_dir(&path).map_err(io_at(&path))?;
        // The root inode counts against `nr_inodes` too.
        let (uid, gid) = cfg.code_user;
        let options = format!(
            "size={},nr_inodes={},mode=0755,uid={uid},gid={gid}",
            cfg.quota_bytes,
            cfg.max_files.saturating_add(1)
        );
        let options = CString::new(options).expect("no NUL in numbers");
        if let Err(e) = mount("tmpfs", &path, "tmpfs", MountFlags::NOSUID | MountFlags::NODEV, options.as_c_str()) {
            let _ = std::fs::remove_dir(&path);
            return Err(WorkspaceError::CannotMount { path, source: e.into() });
        }
        match hostfs::open_ambient(&path) {
            Ok(dir) => {
                let (running, carrier, metadata) = Default::default();
                let (max_files, code_user) = (cfg.max_files, cfg.code_user);
                let persist_to = parking_lot::Mutex::new(cfg.persist_to);
                let now = Instant::now();
                let mounted = Mounted {
                    id,
                    path,
                    max_files,
                    code_user,
                    running,
                    dir,
                    carrier,
                    metadata,
                    persist_to,
                    ended: Default::default(),
                    created: now,
                    last_used: parking_lot::Mutex::new(now),
                    idle_timeout: cfg.idle_timeout,
                    lifetime: cfg.lifetime,
                };
                let workspace = Self(Arc::new(mounted));
                if cfg.idle_timeout.is_some() || cfg.lifetime.is_some() {
                    expiry::watch(workspace.downgrade());
                }
                Ok(workspace)
            }
            Err(source) => {
                let _ = unmount(&path, UnmountFlags::DETACH);
                let _ = std::fs::remove_dir(&path);
                Err(WorkspaceError::Io { path: path.display().to_string(), source })
            }
        }
    }

    /// Its id: unique on this host, never reused.
    pub fn id(&self) -> &str {
        &self.0.id
    }

    /// The user and group its files belong to (see [`WorkspaceConfig::code_user`]).
    pub fn code_user(&self) -> (u32, u32) {
        self.0.code_user
    }

    /// The host directory it is mounted on (what backends bind or preopen
    /// at `/work`).
    pub fn host_path(&self) -> &Path {
        &self.0.path
    }

    /// The slot of what carries its programs (see `program`): a backend
    /// keeps its carrier there, so that it ends with the workspace.
    #[cfg_attr(not(feature = "container"), allow(dead_code))]
    pub(crate) fn carrier(&self) -> parking_lot::MutexGuard<'_, Option<Arc<dyn std::any::Any + Send + Sync>>> {
        self.0.carrier.lock()
    }

    /// A handle on its root, for host-side file work relative to it.
    #[cfg_attr(not(feature = "container"), allow(dead_code))]
    pub(crate) fn dir(&self) -> &Dir {
        &self.0.dir
    }

    /// Writes `bytes` to `path` (relative; its directories made as needed),
    /// replacing a file there: written beside it and renamed over it, so no
    /// reader sees half a file and a hard link is never written through. A
    /// symlink anywhere on the path is refused.
    pub fn write(&self, path: &str, bytes: &[u8]) -> Result<(), WorkspaceError> {
        self.write_from(path, bytes, None, "write")
    }

    /// [`Workspace::write`] with the file's permission bits (`0o755` for a
    /// script, say): at most `0o777`, no set-id or sticky bit.
    pub fn write_with_mode(&self, path: &str, bytes: &[u8], mode: u32) -> Result<(), WorkspaceError> {
        self.write_from(path, bytes, Some(mode), "write")
    }

    /// Writes a file (see [`Workspace::write`]) and records it among the
    /// metadata's inputs as having come `via` (e.g. `artifact:NAME@VERSION`).
    pub(crate) fn write_from(
        &self,
        path: &str,
        bytes: &[u8],
        mode: Option<u32>,
        via: &str,
    ) -> Result<(), WorkspaceError> {
        if let Some(mode) = mode.filter(|mode| *mode > 0o777) {
            return Err(WorkspaceError::BadMode { path: path.to_string(), mode });
        }
        self.in_use()?;
        let (parents, leaf) = split(path)?;
        let io = |source| WorkspaceError::Io { path: path.to_string(), source };
        let dir = self.make_dirs(&parents).map_err(io)?;
        hostfs::replace_with_mode(&dir, leaf, bytes, mode).map_err(io)?;
        give_to_code(&dir, leaf, self.0.code_user).map_err(io)?;
        self.note(Direction::In, path, bytes.len() as u64, Some(bytes), via);
        Ok(())
    }

    /// The host's record of the files put in and taken out so far.
    pub fn metadata(&self) -> WorkspaceMetadata {
        self.0.metadata.lock().clone()
    }

    /// Adds one file to the metadata (`content`, when at hand, for its hash).
    pub(crate) fn note(&self, direction: Direction, path: &str, size: u64, content: Option<&[u8]>, via: &str) {
        use sha2::Digest as _;
        let at_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        // Bytes held per entry are bounded too (a path may be ~1 MB long).
        let path = match path.char_indices().nth(MAX_RECORDED_PATH_CHARS) {
            Some((end, _)) => format!("{}…", &path[..end]),
            None => path.to_string(),
        };
        let entry = RecordedFile {
            path,
            size,
            sha256: content.map(|bytes| hex::encode(sha2::Sha256::digest(bytes))),
            via: via.to_string(),
            at_unix_ms,
        };
        let mut metadata = self.0.metadata.lock();
        let metadata = &mut *metadata;
        let list = match direction {
            Direction::In => &mut metadata.inputs,
            Direction::Out => &mut metadata.outputs,
        };
        if list.len() >= METADATA_ENTRIES {
            list.remove(0);
            metadata.dropped += 1;
        }
        list.push(entry);
    }

    /// Puts a run's files in before it starts: each of `files`, and
    /// `input.json` (the run's JSON input) or, for a run without one, no
    /// `input.json` (so an earlier run's is never taken for this one's).
    #[cfg_attr(not(any(feature = "wasm", feature = "container")), allow(dead_code))]
    pub(crate) fn stage(&self, files: &[ExecFile], input_json: Option<&[u8]>) -> Result<(), WorkspaceError> {
        for file in files {
            self.write_from(&file.name, &file.content, None, "input")?;
        }
        match input_json {
            Some(json) => self.write(INPUT_JSON, json),
            None => match self.0.dir.remove_file(INPUT_JSON) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    Err(WorkspaceError::Io { path: INPUT_JSON.into(), source: e })
                }
                _ => Ok(()),
            },
        }
    }

    /// Reads the regular file at `path`, if it holds at most `max_bytes`:
    /// a symlink on the path, a FIFO, a device or a directory is refused.
    pub fn read(&self, path: &str, max_bytes: u64) -> Result<Vec<u8>, WorkspaceError> {
        self.in_use()?;
        let (parents, leaf) = split(path)?;
        let io = |source| WorkspaceError::Io { path: path.to_string(), source };
        let mut dir = self.0.dir.try_clone().map_err(io)?;
        for name in &parents {
            dir = hostfs::open_dir(&dir, name).map_err(io)?;
        }
        hostfs::read_regular(&dir, leaf, max_bytes).map_err(io)
    }

    /// Reads back the files whose paths (relative, `/`-separated) match
    /// any of `globs` (`*` and `?` within a name, `**` across directories;
    /// at most 32 globs of 256 bytes and 8 `*` each), within `limits`. The
    /// walk never follows a symlink and opens only regular files; it stops
    /// after 100,000 entries, 64 levels or 2 s. Each file read goes into
    /// the [metadata](Workspace::metadata)'s outputs.
    pub fn collect(&self, globs: &[String], limits: &CollectLimits) -> Result<Collected, WorkspaceError> {
        self.in_use()?;
        let patterns = compile_globs(globs)?;
        let started = std::time::Instant::now();
        let options = glob::MatchOptions { require_literal_separator: true, ..Default::default() };
        let matches = |path: &str| patterns.iter().any(|p| p.matches_with(path, options));
        let io = |source| WorkspaceError::Io { path: "<workspace walk>".into(), source };
        let mut found = Vec::new();
        let mut walked = 0;
        let mut limits_hit = std::collections::BTreeSet::new();
        let mut left_out = Vec::new();
        // Directories still to walk, by path: each is opened when its turn
        // comes, so a wide tree never holds more than a path's descriptors.
        let mut stack = vec![(String::new(), 0usize)];
        while let Some((prefix, depth)) = stack.pop() {
            // Swapped for a symlink, or gone, since it was listed (code may
            // still run in the workspace): said, not walked.
            let dir = match self.open_path(&prefix) {
                Ok(dir) => dir,
                Err(e) => {
                    left_out.push(format!("{}/: {e}", joined(&prefix, "")));
                    continue;
                }
            };
            for entry in dir.entries().map_err(io)? {
                let Ok(entry) = entry else { continue };
                walked += 1;
                if walked > WALK_ENTRIES {
                    limits_hit.insert("walk".to_string());
                    stack.clear();
                    break;
                }
                if started.elapsed() > WALK_TIME {
                    limits_hit.insert("time".to_string());
                    stack.clear();
                    break;
                }
                let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                    let shown = entry.file_name().to_string_lossy().into_owned();
                    left_out
                        .push(format!("{}: a name that is not UTF-8 (not walked or read)", joined(&prefix, &shown)));
                    continue;
                };
                let path = joined(&prefix, &name);
                let Ok(kind) = entry.file_type() else { continue };
                if kind.is_dir() {
                    if depth + 1 < WALK_DEPTH {
                        stack.push((path, depth + 1));
                    } else {
                        limits_hit.insert("walk".to_string());
                    }
                } else if matches(&path) {
                    match entry.metadata() {
                        Ok(meta) if kind.is_file() => {
                            use cap_std::fs::PermissionsExt as _;
                            found.push((path, meta.len(), meta.permissions().mode() & 0o777))
                        }
                        _ => left_out.push(format!("{path}: not a regular file")),
                    }
                }
            }
        }
        found.sort();
        let mut files = Vec::new();
        let mut total = 0u64;
        for (path, size, mode) in found {
            if size > limits.max_file_bytes {
                limits_hit.insert("max_file_bytes".to_string());
                left_out.push(format!("{path}: over max_file_bytes"));
                continue;
            }
            if files.len() >= limits.max_files {
                limits_hit.insert("max_files".to_string());
                left_out.push(format!("{path}: over max_files"));
                continue;
            }
            // Changed since the walk (code may still run in it): said, not read.
            let bytes = match self.read(&path, limits.max_file_bytes) {
                Ok(bytes) => bytes,
                Err(e) => {
                    left_out.push(format!("{path}: {e}"));
                    continue;
                }
            };
            if total.saturating_add(bytes.len() as u64) > limits.max_total_bytes {
                limits_hit.insert("max_total_bytes".to_string());
                left_out.push(format!("{path}: over max_total_bytes"));
                continue;
            }
            total += bytes.len() as u64;
            self.note(Direction::Out, &path, bytes.len() as u64, Some(&bytes), "collect");
            files.push(CollectedFile { path, content: bytes, mode });
        }
        Ok(Collected { files, limits_hit: limits_hit.into_iter().collect(), left_out })
    }

    /// Copies the host directory `host` into the workspace's root: its
    /// directories and regular files (with their permission bits), replacing
    /// files of the same paths. The copy reads `host` through a handle, one
    /// component at a time: a symlink or a special file in it is never
    /// followed or opened, only named in [`Copied::left_out`], as are
    /// names that are not UTF-8. The walk stops after 100,000 entries or 64
    /// levels (`left_out` says so). Past the quota the copy fails with the
    /// file it was at (`No space left on device`); what was copied stays.
    pub fn import_dir(&self, host: &Path) -> Result<Imported, WorkspaceError> {
        self.in_use()?;
        let from = hostfs::open_ambient(host)
            .map_err(|source| WorkspaceError::Io { path: host.display().to_string(), source })?;
        // Into the workspace: its quota bounds what is written (ENOSPC ends it).
        let bounds = CopyBounds { max_bytes: u64::MAX, modes: 0o777, strict: true };
        copy_tree(&from, &self.0.dir, bounds, |dir, name, path, size| {
            give_to_code(dir, name, self.0.code_user)?;
            if let Some(size) = size {
                self.note(Direction::In, path, size, None, "import");
            }
            Ok(())
        })
    }

    /// Copies the workspace's directories and regular files (with their
    /// permission bits) into the host directory `host` (made if missing),
    /// replacing files of the same paths there: the other way round from
    /// [`Workspace::import_dir`], with the same walk and bounds. What code
    /// planted (a symlink, a FIFO, a device) is never followed or opened,
    /// only named in [`Copied::left_out`]; a symlink already in `host` is
    /// never written through. It writes at most the workspace's quota in
    /// bytes (apparent sizes: a sparse file or a hard link past it is left
    /// out, named), copies no group or other write bit, and names a file
    /// that changed under the walk rather than stopping there.
    pub fn export_dir(&self, host: &Path) -> Result<Copied, WorkspaceError> {
        self.in_use()?;
        let at = |source| WorkspaceError::Io { path: host.display().to_string(), source };
        std::fs::create_dir_all(host).map_err(at)?;
        let to = hostfs::open_ambient(host).map_err(at)?;
        copy_tree(&self.0.dir, &to, self.0.export_bounds(), |_, _, _, _| Ok(()))
    }

    /// Hands every entry of the workspace that is not the code's user's to
    /// it (without following links; when this process runs as root): what
    /// an in-process (wasm) run created belongs to the host's user, and a
    /// container run (as the code's user) could not replace it or write in
    /// its directories. The walk is bounded as [`Workspace::collect`]'s
    /// (100,000 entries, 64 levels, 2 s); its first error is returned after
    /// the rest was walked.
    pub(crate) fn hand_to_code(&self) -> Result<(), WorkspaceError> {
        use cap_std::fs::MetadataExt as _;
        if !rustix::process::geteuid().is_root() {
            return Ok(());
        }
        let (uid, gid) = self.0.code_user;
        let started = std::time::Instant::now();
        let mut first_error = None;
        let mut walked = 0;
        let mut stack = vec![(String::new(), 0usize)];
        while let Some((prefix, depth)) = stack.pop() {
            let dir = match self.open_path(&prefix) {
                Ok(dir) => dir,
                Err(e) => {
                    first_error.get_or_insert(WorkspaceError::Io { path: prefix, source: e });
                    continue;
                }
            };
            let Ok(entries) = dir.entries() else { continue };
            for entry in entries.flatten() {
                walked += 1;
                if walked > WALK_ENTRIES || started.elapsed() > WALK_TIME {
                    return first_error.map_or(Ok(()), Err);
                }
                let Ok(meta) = entry.metadata() else { continue };
                let name = entry.file_name();
                if (meta.uid(), meta.gid()) != (uid, gid)
                    && let Err(e) = give_to_code(&dir, &name, self.0.code_user)
                {
                    let path = joined(&prefix, &name.to_string_lossy());
                    first_error.get_or_insert(WorkspaceError::Io { path, source: e });
                }
                // A name that is not UTF-8 was not made by a wasm guest (WASI's
                // are): nothing below it is the host's.
                if let Some(name) = name.to_str().filter(|_| meta.is_dir() && depth + 1 < WALK_DEPTH) {
                    stack.push((joined(&prefix, name), depth + 1));
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Opens the directory at `path` (`/`-separated, `""` for the root), one
    /// component at a time, refusing a symlink anywhere.
    fn open_path(&self, path: &str) -> io::Result<Dir> {
        let mut dir = self.0.dir.try_clone()?;
        for name in path.split('/').filter(|n| !n.is_empty()) {
            dir = hostfs::open_dir(&dir, OsStr::new(name))?;
        }
        Ok(dir)
    }

    /// How full it is now.
    pub fn usage(&self) -> Result<WorkspaceUsage, WorkspaceError> {
        let stat = rustix::fs::fstatvfs(&self.0.dir)
            .map_err(|e| WorkspaceError::Io { path: "<workspace usage>".into(), source: e.into() })?;
        let block = stat.f_frsize.max(1);
        Ok(WorkspaceUsage {
            bytes_used: stat.f_blocks.saturating_sub(stat.f_bfree).saturating_mul(block),
            quota_bytes: stat.f_blocks.saturating_mul(block),
            // Less the root.
            files_used: stat.f_files.saturating_sub(stat.f_ffree).saturating_sub(1),
            max_files: self.0.max_files,
            full: stat.f_bavail == 0 || stat.f_favail == 0,
        })
    }

    /// Opens (making where missing) each directory of `parents`, handed to
    /// the code's user so that a container run can write into them.
    fn make_dirs(&self, parents: &[&OsStr]) -> io::Result<Dir> {
        let mut dir = self.0.dir.try_clone()?;
        for name in parents {
            let next = hostfs::create_dirs(&dir, Path::new(name), Some(0o755))?;
            give_to_code(&dir, name, self.0.code_user)?;
            dir = next;
        }
        Ok(dir)
    }
}

/// A run's turn in its workspace. Runs in one workspace take turns, so no
/// code can swap a file under a running wasm guest between the host's check
/// of what a path is and its open (a FIFO there would block the host thread
/// past any deadline: see `fs_guard`'s known window). It holds the
/// workspace mounted until the run is done.
pub(crate) struct RunTurn(Arc<Mounted>);

impl Drop for RunTurn {
    fn drop(&mut self) {
        *self.0.last_used.lock() = Instant::now();
        self.0.running.store(false, std::sync::atomic::Ordering::Release);
    }
}

impl Workspace {
    /// A handle that does not keep the workspace (for a signal handler that
    /// ends it at exit: [`Workspace::end_now`]).
    pub fn downgrade(&self) -> WeakWorkspace {
        WeakWorkspace(Arc::downgrade(&self.0))
    }

    /// Ends the workspace now, whatever handles remain: what carries its
    /// programs ends, its files are copied to
    /// [`WorkspaceConfig::persist_to`] if set, it is unmounted (lazily: a run still in it keeps it
    /// until it ends) and its directory removed. For a process about to
    /// exit on a signal, whose handles are never dropped; any later use of
    /// a handle fails.
    pub fn end_now(&self) {
        self.0.end("ended by end_now");
    }

    /// Why it ended, if it has (idle, past its lifetime, or
    /// [`Workspace::end_now`]).
    pub fn ended(&self) -> Option<String> {
        self.0.ended.lock().clone()
    }

    /// Marks it used now, or says it has ended.
    fn in_use(&self) -> Result<(), WorkspaceError> {
        if let Some(why) = self.ended() {
            return Err(WorkspaceError::Ended { why });
        }
        *self.0.last_used.lock() = Instant::now();
        Ok(())
    }

    /// Whether a run (or a session's call) holds its turn now.
    #[cfg_attr(not(feature = "serve"), allow(dead_code))]
    pub(crate) fn in_run(&self) -> bool {
        self.0.running.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The workspace's turn for one run, unless another run has it.
    pub(crate) fn try_turn(&self) -> Option<RunTurn> {
        use std::sync::atomic::Ordering::{Acquire, Relaxed};
        let turn = self.0.running.compare_exchange(false, true, Acquire, Relaxed).ok().map(|_| RunTurn(self.0.clone()));
        if turn.is_some() {
            *self.0.last_used.lock() = Instant::now();
        }
        turn
    }
}

impl PartialEq for Workspace {
    fn eq(&self, other: &Self) -> bool {
        self.0.id == other.0.id
    }
}

impl Eq for Workspace {}

impl fmt::Debug for Workspace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Workspace").field("id", &self.0.id).field("path", &self.0.path).finish()
    }
}

/// How far a [`copy_tree`] may go.
struct CopyBounds {
    /// Bytes it may write in all (files' apparent sizes).
    max_bytes: u64,
    /// The permission bits a copied file may keep.
    modes: u32,
    /// A file that cannot be copied ends the copy (else it is left out, named).
    strict: bool,
}

/// Copies the directories and regular files under `from` into `to` (their
/// permission bits kept; each file written beside its place and renamed
/// over it, so no existing inode is written into), one component at a
/// time: a symlink, FIFO, device or name that is not UTF-8 is never
/// followed or opened, only named in `left_out`. At most 100,000 entries
/// and 64 levels. `made(dir, name, path, size)` runs on each entry made in
/// `to` (`size`: `None` for a directory). Stops at the first error.
fn copy_tree(
    from: &Dir,
    to: &Dir,
    bounds: CopyBounds,
    mut made: impl FnMut(&Dir, &OsStr, &str, Option<u64>) -> io::Result<()>,
) -> Result<Copied, WorkspaceError> {
    use cap_std::fs::PermissionsExt as _;
    let at = |path: &str| {
        let path = path.to_string();
        move |source| WorkspaceError::Io { path, source }
    };
    let open = |root: &Dir, prefix: &str| -> io::Result<Dir> {
        let mut dir = root.try_clone()?;
        for name in prefix.split('/').filter(|n| !n.is_empty()) {
            dir = hostfs::open_dir(&dir, OsStr::new(name))?;
        }
        Ok(dir)
    };
    let mut copied = Copied::default();
    let mut walked = 0;
    let mut stack = vec![(String::new(), 0usize)];
    while let Some((prefix, depth)) = stack.pop() {
        let source = open(from, &prefix).map_err(at(&prefix))?;
        let target = open(to, &prefix).map_err(at(&prefix))?;
        for entry in source.entries().map_err(at(&prefix))? {
            let entry = entry.map_err(at(&prefix))?;
            walked += 1;
            if walked > WALK_ENTRIES {
                let dir = joined(&prefix, "");
                copied.left_out.push(format!("{dir}/: more than {WALK_ENTRIES} entries (the rest not copied)"));
                return Ok(copied);
            }
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                let shown = entry.file_name().to_string_lossy().into_owned();
                let path = joined(&prefix, &shown);
                copied.left_out.push(format!("{path}: a name that is not UTF-8 (not copied)"));
                continue;
            };
            let path = joined(&prefix, &name);
            let leaf = OsStr::new(&name);
            let kind = entry.file_type().map_err(at(&path))?;
            if kind.is_dir() {
                if depth + 1 < WALK_DEPTH {
                    hostfs::create_dirs(&target, Path::new(&name), Some(0o755)).map_err(at(&path))?;
                    made(&target, leaf, &path, None).map_err(at(&path))?;
                    stack.push((path, depth + 1));
                } else {
                    copied.left_out.push(format!("{path}/: deeper than {WALK_DEPTH} levels (not copied)"));
                }
            } else if kind.is_file() {
                let meta = entry.metadata().map_err(at(&path))?;
                let mode = meta.permissions().mode() & bounds.modes;
                // Apparent sizes count (a sparse or hard-linked file is
                // copied whole each time): the budget bounds what is written.
                let left = bounds.max_bytes.saturating_sub(copied.bytes);
                if meta.len() > left {
                    let most = bounds.max_bytes;
                    copied.left_out.push(format!("{path}: past the {most} bytes this copy may write (not copied)"));
                    continue;
                }
                let done = hostfs::copy_regular(&source, leaf, &target, leaf, mode, left)
                    .and_then(|()| made(&target, leaf, &path, Some(meta.len())));
                match done {
                    Ok(()) => {
                        copied.files += 1;
                        copied.bytes += meta.len();
                    }
                    Err(e) if !bounds.strict => copied.left_out.push(format!("{path}: {e} (not copied)")),
                    Err(e) => return Err(at(&path)(e)),
                }
            } else {
                copied.left_out.push(format!("{path}: not a regular file or a directory (not copied)"));
            }
        }
    }
    Ok(copied)
}

impl Mounted {
    /// Out of the workspace onto the host: at most its quota's bytes (what
    /// code could have written), no group or other write bit, and a file
    /// that changed under the walk is left out, not the end of the copy.
    fn export_bounds(&self) -> CopyBounds {
        let quota = rustix::fs::fstatvfs(&self.dir).map(|s| s.f_blocks.saturating_mul(s.f_frsize.max(1)));
        CopyBounds { max_bytes: quota.unwrap_or(0), modes: 0o755, strict: false }
    }

    /// Ends it now (once): what carries its programs ends, its files are
    /// copied to `persist_to` if set, it is unmounted and its directory
    /// removed; later file work and runs are refused, saying `why`.
    fn end(&self, why: &str) {
        {
            let mut ended = self.ended.lock();
            if ended.is_some() {
                return;
            }
            *ended = Some(why.to_string());
        }
        drop(self.carrier.lock().take());
        self.persist();
        remove(&self.path);
    }

    /// Why it should end now, if it should: past its lifetime, or idle
    /// (no run in it, no program container, unused) for its idle timeout.
    fn expired(&self, now: Instant) -> Option<String> {
        if let Some(lifetime) = self.lifetime.filter(|l| now.duration_since(self.created) >= *l) {
            return Some(format!("past its lifetime of {} s", lifetime.as_secs_f64()));
        }
        let idle = self.idle_timeout?;
        let busy = self.running.load(std::sync::atomic::Ordering::Acquire) || self.carrier.lock().is_some();
        (!busy && now.duration_since(*self.last_used.lock()) >= idle)
            .then(|| format!("idle for {} s", idle.as_secs_f64()))
    }

    /// When it should next be looked at by the expiry thread.
    fn next_check(&self) -> Option<Instant> {
        let by_lifetime = self.lifetime.map(|l| self.created + l);
        let by_idle = self.idle_timeout.map(|idle| *self.last_used.lock() + idle);
        match (by_lifetime, by_idle) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Copies its files to [`WorkspaceConfig::persist_to`], once, if set:
    /// what fails is logged (this runs as it goes, with no caller to tell).
    fn persist(&self) {
        let Some(host) = self.persist_to.lock().take() else { return };
        let to = std::fs::create_dir_all(&host).and_then(|()| hostfs::open_ambient(&host));
        match to.map_err(|source| WorkspaceError::Io { path: host.display().to_string(), source }) {
            Ok(to) => match copy_tree(&self.dir, &to, self.export_bounds(), |_, _, _, _| Ok(())) {
                Ok(copied) if copied.left_out.is_empty() => {}
                Ok(copied) => {
                    tracing::warn!(dir = %host.display(), left_out = ?copied.left_out, "a workspace was kept in part")
                }
                Err(e) => tracing::warn!(
                    dir = %host.display(),
                    error = %crate::error::with_causes(&e),
                    "a workspace could not be kept"
                ),
            },
            Err(e) => tracing::warn!(error = %crate::error::with_causes(&e), "a workspace could not be kept"),
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        self.end("its last handle went");
    }
}

/// The thread that ends workspaces with an idle timeout or a lifetime
/// ([`WorkspaceConfig::idle_timeout`], [`WorkspaceConfig::lifetime`]):
/// started with the first such workspace, it sleeps until the next one is
/// due (or a new one comes) and holds them weakly.
mod expiry {
    use std::sync::OnceLock;
    use std::time::{Duration, Instant};

    use parking_lot::{Condvar, Mutex};

    use crate::workspace::WeakWorkspace;

    struct Watched {
        list: Mutex<Vec<WeakWorkspace>>,
        added: Condvar,
    }

    static WATCHED: OnceLock<Watched> = OnceLock::new();

    /// Watches `workspace` until it ends or goes.
    pub(super) fn watch(workspace: WeakWorkspace) {
        let mut started = false;
        let watched = WATCHED.get_or_init(|| {
            started = true;
            Watched { list: Mutex::new(Vec::new()), added: Condvar::new() }
        });
        watched.list.lock().push(workspace);
        watched.added.notify_all();
        if started {
            let spawned = std::thread::Builder::new()
                .name("execbox-workspace-expiry".into())
                .stack_size(128 << 10)
                .spawn(move || run(watched));
            if let Err(e) = spawned {
                tracing::error!(error = %e, "no workspace expiry thread: idle timeouts and lifetimes are not kept");
            }
        }
    }

    fn run(watched: &'static Watched) {
        let mut list = watched.list.lock();
        loop {
            let now = Instant::now();
            let mut due = Vec::new();
            let mut next: Option<Instant> = None;
            list.retain(|weak| {
                let Some(workspace) = weak.upgrade() else { return false };
                if workspace.0.ended.lock().is_some() {
                    return false;
                }
                if let Some(why) = workspace.0.expired(now) {
                    due.push((workspace, why));
                    return false;
                }
                // Due but busy (a run, a program container): looked at
                // again a second later; else exactly when due.
                let at = match workspace.0.next_check() {
                    Some(at) if at > now => at,
                    _ => now + Duration::from_secs(1),
                };
                next = Some(next.map_or(at, |n| n.min(at)));
                true
            });
            if !due.is_empty() {
                // Ended off the lock: an end copies files and unmounts.
                drop(list);
                for (workspace, why) in due {
                    tracing::info!(workspace = workspace.id(), why, "a workspace ended");
                    workspace.0.end(&why);
                }
                list = watched.list.lock();
                continue;
            }
            match next {
                Some(at) => drop(watched.added.wait_until(&mut list, at)),
                None => watched.added.wait(&mut list),
            }
        }
    }
}

/// Unmounts the workspace at `path` (lazily: descriptors still open on it,
/// e.g. a run's, keep it until they close) and removes its directory.
fn remove(path: &Path) {
    if let Err(e) = unmount(path, UnmountFlags::DETACH)
        && e != rustix::io::Errno::INVAL
    {
        tracing::warn!(path = %path.display(), error = %e, "a workspace could not be unmounted");
    }
    if let Err(e) = std::fs::remove_dir(path)
        && e.kind() != io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), error = %e, "a workspace's directory could not be removed");
    }
}

/// Removes the workspaces under `root` whose owner process is gone: only
/// directories named as execbox names workspaces (anything else there is
/// left alone). Owners are judged in this process's PID namespace, so a
/// root must not be shared by processes of different PID namespaces.
fn sweep_stale(root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(owner) = name.to_str().and_then(workspace_owner) else { continue };
        if entry.file_type().is_ok_and(|t| t.is_dir()) && !crate::owner::is_alive(owner) {
            remove(&entry.path());
        }
    }
}

/// The owner token in a workspace directory's name (`<pid>.<start>-<16
/// hex digits>`, as [`Workspace::create`] names them); `None` for any other
/// name, which the sweep never touches.
fn workspace_owner(name: &str) -> Option<&str> {
    let (owner, random) = name.rsplit_once('-')?;
    let (pid, start) = owner.split_once('.')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let hex = random.len() == 16 && random.bytes().all(|b| b.is_ascii_hexdigit());
    (digits(pid) && digits(start) && hex).then_some(owner)
}

/// `name` under the `/`-separated directory path `prefix` (`""`: the root).
fn joined(prefix: &str, name: &str) -> String {
    match (prefix.is_empty(), name.is_empty()) {
        (true, _) => name.to_string(),
        (false, true) => prefix.to_string(),
        (false, false) => format!("{prefix}/{name}"),
    }
}

/// Checks `globs` as [`Workspace::collect`] takes them (before a run, say):
/// at most 32, each of at most 256 bytes and 8 `*`, relative (no leading
/// `/`, no `..` component), not empty, and a pattern `glob` can read.
pub fn check_globs(globs: &[String]) -> Result<(), WorkspaceError> {
    compile_globs(globs).map(drop)
}

/// [`check_globs`], and the patterns.
fn compile_globs(globs: &[String]) -> Result<Vec<glob::Pattern>, WorkspaceError> {
    let bad = |glob: &str, reason: String| WorkspaceError::BadGlob { glob: glob.to_string(), reason };
    if globs.len() > MAX_GLOBS {
        return Err(bad(&format!("{} globs", globs.len()), format!("at most {MAX_GLOBS} globs")));
    }
    globs
        .iter()
        .map(|g| {
            if g.len() > MAX_GLOB_BYTES || g.matches('*').count() > MAX_GLOB_STARS {
                return Err(bad(g, format!("a glob has at most {MAX_GLOB_BYTES} bytes and {MAX_GLOB_STARS} `*`")));
            }
            let relative = g.trim_start_matches("./");
            if relative.is_empty() || relative == "." {
                return Err(bad(g, "it matches nothing: give a path or a pattern".into()));
            }
            if relative.starts_with('/') || relative.split('/').any(|part| part == "..") {
                return Err(bad(g, "globs are relative to /work, without `..`".into()));
            }
            glob::Pattern::new(relative).map_err(|e| bad(g, format!("not a glob pattern: {e}")))
        })
        .collect()
}

/// Hands `name` in `dir` to the code's user (when this process may: as
/// root), without following a symlink.
fn give_to_code(dir: &Dir, name: &OsStr, (uid, gid): (u32, u32)) -> io::Result<()> {
    if !rustix::process::geteuid().is_root() {
        return Ok(());
    }
    let (uid, gid) = (Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)));
    chownat(dir, name, uid, gid, AtFlags::SYMLINK_NOFOLLOW).map_err(io::Error::from)
}

/// A relative path's directories and its last component: no `..`, no root,
/// no empty name.
fn split(path: &str) -> Result<(Vec<&OsStr>, &OsStr), WorkspaceError> {
    let bad = |reason| WorkspaceError::BadPath { path: path.to_string(), reason };
    if path.ends_with('/') {
        return Err(bad("it names a directory"));
    }
    let mut names = Vec::new();
    for component in Path::new(path).components() {
        match component {
            Component::Normal(name) => names.push(name),
            Component::CurDir => {}
            Component::ParentDir => return Err(bad("`..` is not allowed")),
            Component::RootDir | Component::Prefix(_) => return Err(bad("it must be relative")),
        }
    }
    let leaf = names.pop().ok_or_else(|| bad("it names no file"))?;
    Ok((names, leaf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside() {
        assert!(split("a/b/c.txt").is_ok());
        assert_eq!(split("./a").unwrap().1, OsStr::new("a"));
        for bad in ["../x", "a/../../x", "/etc/passwd", "", ".", "a/"] {
            assert!(matches!(split(bad), Err(WorkspaceError::BadPath { .. })), "{bad}");
        }
    }

    #[test]
    fn the_sweep_knows_only_names_it_made() {
        assert_eq!(workspace_owner("123.456-0123456789abcdef"), Some("123.456"));
        for foreign in [
            "usb-disk",
            "1-2",
            "123.456-xyz",
            "123.456-0123456789abcdeg",
            ".456-0123456789abcdef",
            "a.1-0123456789abcdef",
        ] {
            assert_eq!(workspace_owner(foreign), None, "{foreign}");
        }
    }
}
