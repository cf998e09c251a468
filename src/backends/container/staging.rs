//! The host side of a run's files, in one private temporary directory:
//!
//! - `work/` → `/work` (read-only): `input.json`, the staged input files, and
//!   whatever a language adds (Rust: `main.rs`);
//! - `out/` → `/work/out` (read-write), only when the request collects output files;
//! - `env`: the `--env-file` with exactly the request's variables.
//!
//! Everything is removed when the [`Staging`] drops, whatever the outcome.

use std::path::{Component, Path, PathBuf};

use super::argv::Mount;
use crate::error::{ExecError, InvalidRequest};
use crate::request::{ExecFile, ExecRequest};

/// The code's working directory.
pub const WORKDIR: &str = "/work";
/// Where the code writes files to return (when the request collects them).
pub const OUTPUT_DIR: &str = "/work/out";
/// The request's JSON `input`, when it has one.
pub const INPUT_JSON: &str = "/work/input.json";

/// Guest paths a policy grant may not cover: execbox's own mounts and the
/// kernel's pseudo-filesystems.
const RESERVED_GUEST_PATHS: &[&str] = &["/", "/work", "/opt/execbox", "/opt/rust", "/tmp", "/proc", "/sys", "/dev"];

/// Limits on the files returned from `out/`.
#[derive(Clone, Copy, Debug)]
pub(super) struct OutputLimits {
    pub max_files: usize,
    pub max_file_bytes: u64,
    pub max_total_bytes: u64,
}

pub(super) struct Staging {
    root: tempfile::TempDir,
    collect_outputs: bool,
    has_env: bool,
}

impl Staging {
    /// Stages `input` (as `input.json`), the request's input files and
    /// environment, and an output directory if the request collects one.
    pub fn new(request: &ExecRequest, input: Option<&[u8]>) -> Result<Self, ExecError> {
        let io = |what: &str, e: std::io::Error| InvalidRequest::BadPath { path: what.into(), reason: e.to_string() };
        let root = crate::backends::owner::temp_dir("run").map_err(|e| io("<staging dir>", e))?;
        let work = root.path().join("work");
        create_dir(&work, 0o755).map_err(|e| io("<staging dir>", e))?;
        if let Some(json) = input {
            write_file(&work.join("input.json"), json).map_err(|e| io("input.json", e))?;
        }
        for file in &request.input_files {
            let relative = file.relative_path()?;
            if relative.components().next() == Some(Component::Normal("out".as_ref())) && request.collect_output_files {
                return Err(InvalidRequest::BadPath {
                    path: file.name.clone(),
                    reason: "out/ is the output directory".into(),
                }
                .into());
            }
            let mut dir = work.clone();
            if let Some(parent) = relative.parent() {
                for part in parent.components() {
                    dir.push(part);
                    if !dir.is_dir() {
                        create_dir(&dir, 0o755).map_err(|e| io(&file.name, e))?;
                    }
                }
            }
            write_file(&work.join(relative), &file.content).map_err(|e| io(&file.name, e))?;
        }
        if request.collect_output_files {
            create_dir(&work.join("out"), 0o755).map_err(|e| io("out", e))?;
            // Writable by the container's unprivileged user, whatever its uid.
            create_dir(&root.path().join("out"), 0o777).map_err(|e| io("out", e))?;
        }
        let has_env = !request.env.is_empty();
        if has_env {
            std::fs::write(root.path().join("env"), env_file(request)?).map_err(|e| io("<env file>", e))?;
        }
        Ok(Self { root, collect_outputs: request.collect_output_files, has_env })
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

    /// The files the code left in `/work/out`: regular files only (symlinks
    /// and special files are skipped, never followed), in name order, within
    /// `limits`. The second value notes what was left out, if anything.
    pub fn collect_outputs(&self, limits: OutputLimits) -> (Vec<ExecFile>, Option<String>) {
        if !self.collect_outputs {
            return (Vec::new(), None);
        }
        let mut found = Vec::new();
        let mut skipped = Vec::new();
        walk(&self.root.path().join("out"), "", 0, &mut found, &mut skipped);
        found.sort();
        let mut files = Vec::new();
        let mut total = 0u64;
        for (name, size) in found {
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
            match read_regular(&self.root.path().join("out").join(&name)) {
                Ok(content) => {
                    total += content.len() as u64;
                    let mime_type = mime_guess::from_path(&name).first_raw().map(str::to_string);
                    files.push(ExecFile { name, content, mime_type });
                }
                Err(e) => skipped.push(format!("{name} ({e})")),
            }
        }
        let note = (!skipped.is_empty()).then(|| format!("output files left out: {}", skipped.join(", ")));
        (files, note)
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

/// The `NAME=VALUE` lines of an env file; refuses what the format cannot carry.
fn env_file(request: &ExecRequest) -> Result<Vec<u8>, InvalidRequest> {
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

fn walk(dir: &Path, prefix: &str, depth: usize, found: &mut Vec<(String, u64)>, skipped: &mut Vec<String>) {
    const MAX_DEPTH: usize = 16;
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let Some(file_name) = entry.file_name().to_str().map(str::to_string) else {
            skipped.push(format!("{prefix}{} (name is not UTF-8)", entry.file_name().to_string_lossy()));
            continue;
        };
        let name = format!("{prefix}{file_name}");
        // symlink_metadata: a symlink is reported as itself, never followed.
        match entry.path().symlink_metadata() {
            Ok(meta) if meta.is_file() => found.push((name, meta.len())),
            Ok(meta) if meta.is_dir() && depth < MAX_DEPTH => {
                walk(&entry.path(), &format!("{name}/"), depth + 1, found, skipped)
            }
            Ok(meta) if meta.is_dir() => skipped.push(format!("{name}/ (nested deeper than {MAX_DEPTH})")),
            Ok(meta) if meta.file_type().is_symlink() => skipped.push(format!("{name} (symlink)")),
            _ => skipped.push(format!("{name} (not a regular file)")),
        }
    }
}

/// Reads a regular file without following a symlink put in its place.
fn read_regular(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(path)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(bytes)
}

fn create_dir(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new().mode(mode).create(path)?;
    // The umask may have narrowed the mode.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

fn write_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, bytes)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))
}
