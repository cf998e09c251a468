//! What a run sees of the host's files: the policy's granted directories
//! as preopens, and the request's input files staged in a directory of
//! their own.

use std::path::Path;

use wasmtime_wasi::FsPerms;

use super::fs_guard;
use super::guest::Preopen;
use crate::error::{ExecError, InvalidRequest};
use crate::policy::{Access, SandboxPolicy};
use crate::request::ExecRequest;

/// Where a `wasm` guest finds the request's staged `input_files` (read-only).
pub(crate) const INPUT_DIR: &str = "/input";

/// The policy's granted directories as preopens (read-only or read-write).
pub(crate) fn policy_preopens(policy: &SandboxPolicy) -> Result<Vec<Preopen>, InvalidRequest> {
    let mut preopens = Vec::new();
    if let Access::Allow(grants) = &policy.filesystem {
        let modes = [(&grants.read_only, FsPerms::ReadOnly), (&grants.read_write, FsPerms::ReadWrite)];
        for (list, perms) in modes {
            for grant in list {
                let guest = grant.guest_path().to_str().ok_or_else(|| InvalidRequest::BadPath {
                    path: grant.guest_path().display().to_string(),
                    reason: "guest paths must be UTF-8".into(),
                })?;
                preopens.push(Preopen { host: grant.host.clone(), guest: guest.to_string(), perms });
            }
        }
    }
    fs_guard::refuse_blocking_mounts(&preopens)?;
    Ok(preopens)
}

/// The run's workspace as a read-write preopen at `/work`, once the
/// request's input files and `input_json` (as `input.json`) are written
/// into it; `None` for a run without one.
pub(crate) fn workspace_preopen(
    request: &ExecRequest,
    input_json: Option<&[u8]>,
) -> Result<Option<Preopen>, ExecError> {
    let Some(workspace) = &request.workspace else { return Ok(None) };
    workspace
        .stage(&request.input_files, input_json)
        .map_err(|e| InvalidRequest::BadPath { path: "<workspace>".into(), reason: crate::error::with_causes(&e) })?;
    Ok(workspace_mount(request))
}

/// The run's workspace as a read-write preopen at `/work`, as it is.
pub(crate) fn workspace_mount(request: &ExecRequest) -> Option<Preopen> {
    let host = request.workspace.as_ref()?.host_path().to_path_buf();
    Some(Preopen { host, guest: crate::workspace::GUEST_PATH.into(), perms: FsPerms::ReadWrite })
}

/// Writes the request's input files (and `extra`, a named file of execbox's
/// own such as `input.json`) into a fresh temporary directory.
pub(crate) fn stage_input_files(
    request: &ExecRequest,
    extra: Option<(&str, &[u8])>,
) -> Result<Option<tempfile::TempDir>, ExecError> {
    if request.input_files.is_empty() && extra.is_none() {
        return Ok(None);
    }
    let dir = crate::owner::temp_dir("input")
        .map_err(|e| InvalidRequest::BadPath { path: "<tempdir>".into(), reason: e.to_string() })?;
    write_staged(dir.path(), request, extra)?;
    Ok(Some(dir))
}

/// Writes the request's input files (and `extra`) under `dir`.
pub(crate) fn write_staged(dir: &Path, request: &ExecRequest, extra: Option<(&str, &[u8])>) -> Result<(), ExecError> {
    let io = |path: &str, e: std::io::Error| InvalidRequest::BadPath { path: path.into(), reason: e.to_string() };
    for file in &request.input_files {
        let relative = file.relative_path()?;
        let path = dir.join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io(&file.name, e))?;
        }
        std::fs::write(&path, &file.content).map_err(|e| io(&file.name, e))?;
    }
    if let Some((name, bytes)) = extra {
        std::fs::write(dir.join(name), bytes).map_err(|e| io(name, e))?;
    }
    Ok(())
}
