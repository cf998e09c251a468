//! The host side of a run's files, in one private temporary directory:
//!
//! - `work/` → `/work` (read-only): `input.json`, the staged input files, and
//!   whatever a language adds;
//! - `out/` → `/work/out` (read-write), only when the request collects output files;
//! - `env`: the `--env-file` with exactly the request's variables.
//!
//! Every file operation goes through a cap-std handle on that directory,
//! never through a link (see `hostfs.rs`). The directory is handed to the
//! reaper after the run ([`Staging::into_dir`]), whatever the outcome; a
//! `Staging` dropped earlier (an error) removes itself.

use std::ffi::OsStr;
use std::path::{Component, Path, PathBuf};

use cap_std::fs::Dir;

use super::argv::Mount;
use super::hostfs::{self, ReadRefused};
use crate::error::{ExecError, InvalidRequest};
use crate::file::ExecFile;
use crate::limits::text;
use crate::request::ExecRequest;

/// The code's working directory (`input.json`, the request's JSON `input`,
/// is staged there when it has one).
pub(super) const WORKDIR: &str = "/work";
/// Where the code writes files to return (when the request collects them).
const OUTPUT_DIR: &str = "/work/out";

/// Guest paths a policy grant may not cover: execbox's own mounts and the
/// kernel's pseudo-filesystems.
const RESERVED_GUEST_PATHS: &[&str] = &["/", "/work", "/opt/execbox", "/opt/rust", "/tmp", "/proc", "/sys", "/dev"];

/// Most entries of `out/` the host looks at (files, directories, links,
/// anything): a hostile program can leave millions within its deadline; the
/// host walks this many and says so when it stopped.
const MAX_OUTPUT_ENTRIES: usize = 10_000;

/// Deepest directory of `out/` walked.
const MAX_OUTPUT_DEPTH: usize = 16;

/// Limits on the files returned from `out/`.
#[derive(Clone, Copy, Debug)]
pub(super) struct OutputLimits {
    pub max_files: usize,
    pub max_file_bytes: u64,
    pub max_total_bytes: u64,
}

pub(super) struct Staging {
    root: tempfile::TempDir,
    /// A handle on `root`: every file operation below it is relative to this.
    dir: Dir,
    collect_outputs: bool,
    has_env: bool,
}

impl Staging {
    /// Stages `input` (as `input.json`), the request's input files and
    /// environment, and an output directory if the request collects one.
    pub fn new(request: &ExecRequest, input: Option<&[u8]>) -> Result<Self, ExecError> {
        let io = |what: &str, e: std::io::Error| InvalidRequest::BadPath { path: what.into(), reason: e.to_string() };
        let root = crate::backends::owner::temp_dir("run").map_err(|e| io("<staging dir>", e))?;
        let dir = hostfs::open_ambient(root.path()).map_err(|e| io("<staging dir>", e))?;
        let work = hostfs::create_dirs(&dir, Path::new("work"), Some(0o755)).map_err(|e| io("<staging dir>", e))?;
        if let Some(json) = input {
            hostfs::write_new(&work, OsStr::new("input.json"), json, 0o644).map_err(|e| io("input.json", e))?;
        }
        for file in &request.input_files {
            stage_file(&work, file, request.collect_output_files, |dir, leaf| {
                hostfs::write_new(dir, leaf, &file.content, 0o644)
            })?;
        }
        if request.collect_output_files {
            hostfs::create_dirs(&work, Path::new("out"), Some(0o755)).map_err(|e| io("out", e))?;
            // Writable by the container's unprivileged user, whatever its uid.
            hostfs::create_dirs(&dir, Path::new("out"), Some(0o777)).map_err(|e| io("out", e))?;
        }
        let has_env = !request.env.is_empty();
        if has_env {
            hostfs::write_new(&dir, OsStr::new("env"), &env_file(request)?, 0o600).map_err(|e| io("<env file>", e))?;
        }
        Ok(Self { root, dir, collect_outputs: request.collect_output_files, has_env })
    }

    /// Stages one session cell's files in `/work` (replacing files of the
    /// same name, never through a link) and its `input.json` (removed when
    /// the cell has no input), and empties `/work/out` so the cell returns
    /// only what it writes.
    pub fn stage_cell(&self, request: &ExecRequest, input: Option<&[u8]>) -> Result<(), ExecError> {
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
        if self.collect_outputs {
            hostfs::empty_tree(&self.root.path().join("out")).map_err(|e| io("out", e))?;
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

    /// `/work` read-only, and `/work/out` read-write when collecting outputs.
    pub fn mounts(&self) -> Vec<Mount> {
        let mut mounts = vec![Mount { host: self.work(), guest: WORKDIR.into(), writable: false }];
        if self.collect_outputs {
            mounts.push(Mount { host: self.root.path().join("out"), guest: OUTPUT_DIR.into(), writable: true });
        }
        mounts
    }

    /// Hands the directory over for removal (a hostile program may have left
    /// millions of entries: removing them is the reaper's job, off the
    /// request path).
    pub fn into_dir(self) -> tempfile::TempDir {
        self.root
    }

    /// The files the code left in `/work/out`: regular files only (symlinks
    /// and special files are skipped, never followed), in name order, within
    /// `limits`. The walk looks at most [`MAX_OUTPUT_ENTRIES`] entries, at
    /// most [`MAX_OUTPUT_DEPTH`] deep. The second value notes what was left
    /// out, if anything: a bounded list and a count.
    pub fn collect_outputs(&self, limits: OutputLimits) -> (Vec<ExecFile>, Option<String>) {
        if !self.collect_outputs {
            return (Vec::new(), None);
        }
        let mut walk = Walk::default();
        let out = match hostfs::open_dir(&self.dir, OsStr::new("out")) {
            Ok(out) => out,
            Err(e) => return (Vec::new(), Some(format!("output files left out: out/ ({e})"))),
        };
        walk.dir(&out, "", 0);
        walk.found.sort();
        let mut files = Vec::new();
        let mut total = 0u64;
        let mut skipped = walk.skipped;
        for (name, size) in walk.found {
            let over = if files.len() >= limits.max_files {
                Some("over max_output_files")
            } else if size > limits.max_file_bytes {
                Some("over max_output_file_bytes")
            } else if total + size > limits.max_total_bytes {
                Some("over max_output_total_bytes")
            } else {
                None
            };
            if let Some(reason) = over {
                skipped.push(format!("{name} ({reason})"));
                continue;
            }
            let max = limits.max_file_bytes.min(limits.max_total_bytes - total);
            match read_output(&out, &name, max) {
                Ok(content) => {
                    total += content.len() as u64;
                    let mime_type = mime_guess::from_path(&name).first_raw().map(str::to_string);
                    files.push(ExecFile { name, content, mime_type });
                }
                Err(ReadRefused::TooLarge) => skipped.push(format!("{name} (grew past the output caps)")),
                Err(ReadRefused::NotRegular) => skipped.push(format!("{name} (not a regular file)")),
                Err(ReadRefused::Io(e)) => skipped.push(format!("{name} ({e})")),
            }
        }
        let mut notes = Vec::new();
        if !skipped.is_empty() {
            notes.push(format!("output files left out: {}", text::list_names(&skipped)));
        }
        if walk.stopped {
            notes.push(format!("out/ holds more than {MAX_OUTPUT_ENTRIES} entries: only those were looked at"));
        }
        (files, (!notes.is_empty()).then(|| notes.join("; ")))
    }
}

/// Reads `out/<name>` one component at a time from the handle on `out/`,
/// never through a link (the walk saw a regular file; the program may have
/// swapped in a link since, if its container outlived a failed kill).
fn read_output(out: &Dir, name: &str, max: u64) -> Result<Vec<u8>, ReadRefused> {
    let mut parts: Vec<&str> = name.split('/').collect();
    let leaf = parts.pop().unwrap_or_default();
    let mut dir = out.try_clone().map_err(ReadRefused::Io)?;
    for part in parts {
        dir = hostfs::open_dir(&dir, OsStr::new(part)).map_err(ReadRefused::Io)?;
    }
    hostfs::read_regular(&dir, OsStr::new(leaf), max)
}

/// A bounded walk of `out/`: the regular files found (name, size), what
/// was skipped, and whether the entry bound stopped it. Holds one open
/// directory per level (at most [`MAX_OUTPUT_DEPTH`]).
#[derive(Default)]
struct Walk {
    found: Vec<(String, u64)>,
    skipped: Vec<String>,
    visited: usize,
    stopped: bool,
}

impl Walk {
    fn dir(&mut self, dir: &Dir, prefix: &str, depth: usize) {
        let Ok(entries) = dir.entries() else {
            self.skipped.push(format!("{prefix} (cannot be listed)"));
            return;
        };
        for entry in entries {
            if self.visited >= MAX_OUTPUT_ENTRIES {
                self.stopped = true;
            }
            if self.stopped {
                return;
            }
            self.visited += 1;
            let Ok(entry) = entry else { continue };
            let file_name = entry.file_name();
            let Some(text) = file_name.to_str() else {
                self.skipped.push(format!("{prefix}{} (name is not UTF-8)", file_name.to_string_lossy()));
                continue;
            };
            let name = format!("{prefix}{text}");
            // symlink_metadata: a symlink is reported as itself, never followed.
            match dir.symlink_metadata(&file_name) {
                Ok(meta) if meta.is_file() => self.found.push((name, meta.len())),
                Ok(meta) if meta.is_dir() && depth < MAX_OUTPUT_DEPTH => match hostfs::open_dir(dir, &file_name) {
                    Ok(sub) => self.dir(&sub, &format!("{name}/"), depth + 1),
                    Err(e) => self.skipped.push(format!("{name}/ ({e})")),
                },
                Ok(meta) if meta.is_dir() => {
                    self.skipped.push(format!("{name}/ (nested deeper than {MAX_OUTPUT_DEPTH})"))
                }
                Ok(meta) if meta.file_type().is_symlink() => self.skipped.push(format!("{name} (symlink)")),
                _ => self.skipped.push(format!("{name} (not a regular file)")),
            }
        }
    }
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
