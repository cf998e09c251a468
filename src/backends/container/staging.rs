//! The host side of a run's files, in one private temporary directory:
//!
//! - `work/` → `/work` (read-only): `input.json`, the staged input files, and
//!   whatever a language adds;
//! - `work/out`: only an empty mount point (`/work/out` is a tmpfs inside
//!   the container when the request collects output files, see `outputs.rs`);
//! - `env`: the `--env-file` with exactly the request's variables.
//!
//! A run in a workspace gets the workspace at `/work` instead, read-write,
//! its files written into it first (see `stage_workspace`); `/work/out`,
//! when collected, is still the run's own tmpfs.
//!
//! Every file operation goes through a cap-std handle on that directory,
//! never through a link (see `hostfs.rs`). The directory is handed to the
//! reaper after the run ([`Staging::into_dir`]), whatever the outcome; a
//! `Staging` dropped earlier (an error) removes itself.

use std::ffi::OsStr;
use std::path::{Component, Path, PathBuf};

use cap_std::fs::Dir;

use super::argv::Mount;
use crate::error::{ExecError, InvalidRequest};
use crate::file::ExecFile;
use crate::hostfs;
use crate::request::ExecRequest;
use crate::workspace::Workspace;

/// The code's working directory (`input.json`, the request's JSON `input`,
/// is staged there when it has one).
pub(super) const WORKDIR: &str = "/work";
/// Guest paths a policy grant may not cover: execbox's own mounts and the
/// kernel's pseudo-filesystems.
const RESERVED_GUEST_PATHS: &[&str] = &["/", "/work", "/opt/execbox", "/opt/rust", "/tmp", "/proc", "/sys", "/dev"];

pub(super) struct Staging {
    root: tempfile::TempDir,
    /// A handle on `root`: every file operation below it is relative to this.
    dir: Dir,
    collect_outputs: bool,
    has_env: bool,
    /// The host path of the run's workspace, bound read-write at `/work` in
    /// place of `work/` (a path, not a handle: the run's request holds the
    /// workspace, and a workspace's program container must not).
    workspace: Option<PathBuf>,
}

impl Staging {
    /// Stages `input` (as `input.json`), the request's input files and
    /// environment, and an output directory if the request collects one.
    pub fn new(request: &ExecRequest, input: Option<&[u8]>) -> Result<Self, ExecError> {
        let io = |what: &str, e: std::io::Error| InvalidRequest::BadPath { path: what.into(), reason: e.to_string() };
        let root = crate::owner::temp_dir("run").map_err(|e| io("<staging dir>", e))?;
        let dir = hostfs::open_ambient(root.path()).map_err(|e| io("<staging dir>", e))?;
        let work = hostfs::create_dirs(&dir, Path::new("work"), Some(0o755)).map_err(|e| io("<staging dir>", e))?;
        if let Some(workspace) = &request.workspace {
            stage_workspace(workspace, request, input)?;
        } else {
            stage_run_files(&work, request, input)?;
        }
        if request.collect_output_files {
            // The mount point of the /work/out tmpfs, never written into:
            // docker (20.10) gives the tmpfs this directory's mode over its
            // `mode=` option, so it is 1777 too (inside the private staging
            // directory), so the code's user can write there.
            hostfs::create_dirs(&work, Path::new("out"), Some(0o1777)).map_err(|e| io("out", e))?;
        }
        let has_env = !request.env.is_empty();
        if has_env {
            hostfs::write_new(&dir, OsStr::new("env"), &env_file(request)?, 0o600).map_err(|e| io("<env file>", e))?;
        }
        let workspace = request.workspace.as_ref().map(|w| w.host_path().to_path_buf());
        Ok(Self { root, dir, collect_outputs: request.collect_output_files, has_env, workspace })
    }

    /// An empty staging directory (a warm container's: its run's files are
    /// staged with [`Staging::stage_cell`] when a run takes it), with the
    /// mount point of `/work/out` when it collects outputs.
    pub fn empty(collect_outputs: bool) -> std::io::Result<Self> {
        let root = crate::owner::temp_dir("run")?;
        let dir = hostfs::open_ambient(root.path())?;
        let work = hostfs::create_dirs(&dir, Path::new("work"), Some(0o755))?;
        if collect_outputs {
            // As in `new`: the tmpfs takes this directory's mode.
            hostfs::create_dirs(&work, Path::new("out"), Some(0o1777))?;
        }
        Ok(Self { root, dir, collect_outputs, has_env: false, workspace: None })
    }

    /// The staging of a workspace's program container: nothing staged, the
    /// workspace bound at `/work`.
    pub fn for_workspace(workspace: &Workspace) -> Result<Self, ExecError> {
        let io = |e: std::io::Error| InvalidRequest::BadPath { path: "<staging dir>".into(), reason: e.to_string() };
        let mut staging = Self::empty(false).map_err(io)?;
        staging.workspace = Some(workspace.host_path().to_path_buf());
        Ok(staging)
    }

    /// Stages a one-shot run's files into an [`Staging::empty`] directory (a
    /// warm container's), exactly as [`Staging::new`] does: the same modes,
    /// and the same refusals (two files of one name, a file named
    /// `input.json` beside the JSON input).
    pub fn stage_run(&self, request: &ExecRequest, input: Option<&[u8]>) -> Result<(), ExecError> {
        let io = |what: &str, e: std::io::Error| InvalidRequest::BadPath { path: what.into(), reason: e.to_string() };
        let work = hostfs::open_dir(&self.dir, OsStr::new("work")).map_err(|e| io("<staging dir>", e))?;
        stage_run_files(&work, request, input)
    }

    /// Stages one session cell's files in `/work` (replacing files of the
    /// same name, never through a link) and its `input.json` (removed when
    /// the cell has no input). `/work/out` is the container's own tmpfs: the
    /// session loop empties it before each cell.
    /// In a workspace (the session's, bound at `/work`), they are written
    /// into the workspace, as a one-shot run's are.
    pub fn stage_cell(&self, request: &ExecRequest, input: Option<&[u8]>) -> Result<(), ExecError> {
        if let Some(workspace) = &request.workspace {
            return stage_workspace(workspace, request, input);
        }
        let io = |what: &str, e: std::io::Error| InvalidRequest::BadPath { path: what.into(), reason: e.to_string() };
        let work = hostfs::open_dir(&self.dir, OsStr::new("work")).map_err(|e| io("<staging dir>", e))?;
        match input {
            Some(json) => hostfs::replace(&work, OsStr::new("input.json"), json).map_err(|e| io("input.json", e))?,
            None => match work.remove_file("input.json") {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io("input.json", e).into()),
                _ => {}
            },
        }
        for file in &request.input_files {
            stage_file(&work, file, self.collect_outputs, |dir, leaf| hostfs::replace(dir, leaf, &file.content))?;
        }
        Ok(())
    }

    /// The directory seen at `/work`.
    pub fn work(&self) -> PathBuf {
        self.root.path().join("work")
    }

    /// The `--env-file`, if the request sets variables.
    pub fn env_file(&self) -> Option<PathBuf> {
        self.has_env.then(|| self.root.path().join("env"))
    }

    /// `/work` read-only (`/work/out`, when collecting outputs, is a tmpfs:
    /// see [`RunSpec::output_dir`](super::argv::RunSpec::output_dir)).
    pub fn mounts(&self) -> Vec<Mount> {
        match &self.workspace {
            Some(workspace) => {
                vec![Mount { host: workspace.clone(), guest: WORKDIR.into(), writable: true }]
            }
            None => vec![Mount { host: self.work(), guest: WORKDIR.into(), writable: false }],
        }
    }

    /// Whether the request collects output files (then `/work/out` exists).
    pub fn collects_outputs(&self) -> bool {
        self.collect_outputs
    }

    /// Hands the directory over for removal (the reaper's job, off the
    /// request path; the container never writes into it: `/work` is
    /// read-only to it).
    pub fn into_dir(self) -> tempfile::TempDir {
        self.root
    }
}

/// A one-shot run's `input.json` and input files written into its
/// workspace, and, when it collects output files, the mount point of its
/// `/work/out` tmpfs there (mode 1777, which the tmpfs takes: code may have
/// made `out` itself, with another mode).
fn stage_workspace(workspace: &Workspace, request: &ExecRequest, input: Option<&[u8]>) -> Result<(), ExecError> {
    let bad = |reason: String| InvalidRequest::BadPath { path: "<workspace>".into(), reason };
    workspace.stage(&request.input_files, input).map_err(|e| bad(crate::error::with_causes(&e)))?;
    if request.collect_output_files {
        let out = OsStr::new("out");
        hostfs::create_dirs(workspace.dir(), Path::new(out), Some(0o1777))
            .and_then(|_| hostfs::set_mode(workspace.dir(), out, 0o1777))
            .map_err(|e| bad(format!("/work/out: {e}")))?;
    }
    Ok(())
}

/// A one-shot run's `input.json` and input files, as fresh files in `work`.
fn stage_run_files(work: &Dir, request: &ExecRequest, input: Option<&[u8]>) -> Result<(), ExecError> {
    let io = |what: &str, e: std::io::Error| InvalidRequest::BadPath { path: what.into(), reason: e.to_string() };
    if let Some(json) = input {
        hostfs::write_new(work, OsStr::new("input.json"), json, 0o644).map_err(|e| io("input.json", e))?;
    }
    for file in &request.input_files {
        stage_file(work, file, request.collect_output_files, |dir, leaf| {
            hostfs::write_new(dir, leaf, &file.content, 0o644)
        })?;
    }
    Ok(())
}

/// Turns a policy grant into a mount, refusing paths the engine would
/// misparse and guest paths that would cover execbox's own.
pub(super) fn grant_mount(host: &Path, guest: &Path, writable: bool) -> Result<Mount, InvalidRequest> {
    let bad =
        |path: &Path, reason: &str| InvalidRequest::BadPath { path: path.display().to_string(), reason: reason.into() };
    let host_text = host.to_str().ok_or_else(|| bad(host, "host paths must be UTF-8"))?;
    let guest_text = guest.to_str().ok_or_else(|| bad(guest, "guest paths must be UTF-8"))?;
    for (path, text) in [(host, host_text), (guest, guest_text)] {
        if text.contains([',', '"', '\n']) {
            return Err(bad(path, "commas, quotes and newlines cannot be passed to --mount"));
        }
        if !path.is_absolute() || path.components().any(|c| c == Component::ParentDir) {
            return Err(bad(path, "must be absolute, without `..`"));
        }
    }
    let guest_norm = guest_text.trim_end_matches('/');
    if RESERVED_GUEST_PATHS.iter().any(|r| guest_norm == r.trim_end_matches('/') || guest.starts_with(r) && *r != "/") {
        return Err(bad(
            guest,
            "reserved inside the container (/work, /opt/execbox, /opt/rust, /tmp, /proc, /sys, /dev)",
        ));
    }
    if !host.exists() {
        return Err(bad(host, "does not exist on the host"));
    }
    Ok(Mount { host: host.to_path_buf(), guest: guest_text.to_string(), writable })
}

/// Puts `file` under `work` (its directories made `0o755`) with `write`,
/// given the directory handle and the file's last name. With `out_reserved`
/// (the output directory is mounted there) a name under `out/` is refused.
fn stage_file(
    work: &Dir,
    file: &ExecFile,
    out_reserved: bool,
    write: impl FnOnce(&Dir, &OsStr) -> std::io::Result<()>,
) -> Result<(), ExecError> {
    let io = |e: std::io::Error| InvalidRequest::BadPath { path: file.name.clone(), reason: e.to_string() };
    let relative = file.relative_path()?;
    if out_reserved
        && relative.components().find(|c| *c != Component::CurDir) == Some(Component::Normal("out".as_ref()))
    {
        return Err(
            InvalidRequest::BadPath { path: file.name.clone(), reason: "out/ is the output directory".into() }.into()
        );
    }
    let (parent, leaf) = match (relative.parent(), relative.file_name()) {
        (Some(parent), Some(leaf)) => (parent, leaf),
        _ => return Err(io(std::io::Error::other("names no file")).into()),
    };
    let parent = hostfs::create_dirs(work, parent, Some(0o755)).map_err(io)?;
    write(&parent, leaf).map_err(io)?;
    Ok(())
}

/// The `NAME=VALUE` lines of an env file; refuses what the format cannot carry.
fn env_file(request: &ExecRequest) -> Result<Vec<u8>, InvalidRequest> {
    // The executor's rules (portable names, no LD_*, bounded values) hold
    // for direct `Backend::execute` calls too.
    crate::admission::validate_env(request)?;
    let mut text = String::new();
    for (name, value) in &request.env {
        let bad = |reason: &str| InvalidRequest::BadEnv { name: name.clone(), reason: reason.into() };
        if name.is_empty() || name.starts_with('#') || name.contains(['=', '\0', '\n', '\r', ' ', '\t']) {
            return Err(bad("names must be non-empty, without `=`, whitespace or NUL, not starting with `#`"));
        }
        if value.contains(['\0', '\n', '\r']) {
            return Err(bad("values cannot hold newlines or NUL on the container backend"));
        }
        text.push_str(name);
        text.push('=');
        text.push_str(value);
        text.push('\n');
    }
    Ok(text.into_bytes())
}
