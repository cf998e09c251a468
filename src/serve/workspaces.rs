//! The MCP tools of workspaces: `create_workspace`, `close_workspace`,
//! `describe_workspace`, `write_files`, `read_files` (and `run_code`'s `workspace_id`, in
//! `tools.rs`). A connection's workspaces are its own: ids are looked up
//! under it only, and its workspaces are unmounted when it ends.

use base64::Engine as _;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{ErrorData as McpError, schemars, tool, tool_router};
use serde::Deserialize;
use serde_json::json;

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::file_artifacts::{Artifacts, DEFAULT_NAME_TEMPLATE, Saved};
use super::shared::HeldWorkspace;
use super::tools::{Connection, ExecboxMcp, invalid_arguments, structured};
use crate::program::ProgramStatus;
use crate::workspace::{CollectLimits, Direction, Workspace, WorkspaceConfig, WorkspaceError};

/// Workspaces one connection may hold at once.
pub(super) const MAX_WORKSPACES_PER_CONNECTION: usize = 4;

/// `create_workspace`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateWorkspaceArgs {
    /// Its quota in MiB (at most the server's; default the server's).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub quota_mb: Option<u64>,
    /// Packages every Python or shell run, session and program in it needs (e.g. numpy,
    /// pandas): they then run where those are (a container); refused if no backend has them.
    #[serde(default)]
    pub packages: Option<Vec<String>>,
}

/// Names one workspace of this connection.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceIdArgs {
    /// The id `create_workspace` returned.
    pub workspace_id: String,
}

/// One file to write.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceFileArg {
    /// Its path in the workspace (relative; directories are made).
    pub path: String,
    /// Its bytes, base64 (or give `artifact`).
    #[serde(default)]
    pub content_base64: Option<String>,
    /// Its bytes from an artifact of this connection: `name@version`, or `name` for the latest
    /// (when the server keeps artifacts; or give `content_base64`).
    #[serde(default)]
    pub artifact: Option<String>,
    /// Its permission bits as a number, e.g. 493 (0o755) for a script; at
    /// most 511 (0o777). Default: 0o666 less the server's umask (0o644).
    #[serde(default)]
    #[schemars(range(max = 511))]
    pub mode: Option<u32>,
}

/// `write_files`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFilesArgs {
    /// The id `create_workspace` returned.
    pub workspace_id: String,
    /// The files, each replacing any file at its path.
    pub files: Vec<WorkspaceFileArg>,
    /// The artifact scope files' `artifact` references are read from (as `run_code`'s).
    #[serde(default)]
    pub artifact_key: Option<String>,
}

/// `read_files`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFilesArgs {
    /// The id `create_workspace` returned.
    pub workspace_id: String,
    /// Paths or globs relative to the workspace (`*.csv`, `out/**/*.png`).
    pub globs: Vec<String>,
    /// Files at the most (default 100, at most 1000).
    #[serde(default)]
    pub max_files: Option<usize>,
    /// Bytes of one file at the most (default 1 MiB, at most 8 MiB).
    #[serde(default)]
    pub max_file_bytes: Option<u64>,
    /// Bytes of all files at the most (default and at most 8 MiB).
    #[serde(default)]
    pub max_total_bytes: Option<u64>,
    /// Save each file read as the next version of an artifact of this connection (when the
    /// server keeps artifacts): each file then has `artifact` {name, version, sha256}.
    #[serde(default)]
    pub save_as_artifacts: Option<bool>,
    /// How an artifact's name is made of a file's path: `{path}` (its `/` turned into `_`) and
    /// `{name}` (its last component). Default `{path}`.
    #[serde(default)]
    pub name_template: Option<String>,
    /// Return each file's content (`content_base64`); default true, false when saving as artifacts.
    #[serde(default)]
    pub inline: Option<bool>,
    /// The artifact scope files are saved to (as `run_code`'s).
    #[serde(default)]
    pub artifact_key: Option<String>,
}

#[tool_router(router = workspace_router, vis = "pub(super)")]
impl ExecboxMcp {
    /// Mounts a workspace for this connection.
    #[tool(description = "Create a workspace: a directory that every run_code with its workspace_id sees \
            read-write at /work, on any backend that carries files (Python in wasm or a container, shell, \
            Rust, wasm), so files outlive a run and pass between languages. Its quota holds every write (past \
            it a write fails with ENOSPC). It is removed by close_workspace or when this connection ends.")]
    async fn create_workspace(
        &self,
        Parameters(CreateWorkspaceArgs { quota_mb, packages }): Parameters<CreateWorkspaceArgs>,
    ) -> Result<CallToolResult, McpError> {
        let packages = packages.unwrap_or_default();
        if let Err(e) = crate::admission::validate_packages(&packages) {
            return Ok(invalid_arguments("create_workspace", &e.to_string()));
        }
        let base = self.shared.cfg.workspaces.clone();
        let quota = match quota_mb {
            Some(0) => return Ok(invalid_arguments("create_workspace", "quota_mb must be at least 1")),
            Some(mb) if mb.saturating_mul(1 << 20) > base.quota_bytes => {
                let most = base.quota_bytes >> 20;
                return Ok(invalid_arguments("create_workspace", &format!("quota_mb is at most {most} here")));
            }
            Some(mb) => mb << 20,
            None => base.quota_bytes,
        };
        // Checked before the mount (the common case) and again when the
        // workspace is put in (another call of the connection may have won).
        let connection_full = || {
            let why = format!("this connection already holds {MAX_WORKSPACES_PER_CONNECTION} workspaces");
            invalid_arguments("create_workspace", &why)
        };
        if self.connection.workspaces.lock().len() >= MAX_WORKSPACES_PER_CONNECTION {
            return Ok(connection_full());
        }
        let Some(slot) = self.shared.take_workspace_slot() else {
            let most = self.shared.cfg.max_workspaces;
            return Ok(invalid_arguments("create_workspace", &format!("this server already holds {most} workspaces")));
        };
        let cfg = WorkspaceConfig { quota_bytes: quota, ..base };
        let exec = self.shared.exec.clone();
        let wanted = packages.clone();
        // Asking a backend for its packages may read its image: blocking.
        let created = tokio::task::spawn_blocking(move || match unprovided(&exec, &wanted) {
            Some(why) => Err(why),
            None => Ok(Workspace::create(cfg)),
        })
        .await
        .map_err(|e| McpError::internal_error(format!("workspace task: {e}"), None))?;
        let workspace = match created {
            Ok(Ok(workspace)) => workspace,
            Ok(Err(e)) => return Ok(failed(&e)),
            Err(why) => return Ok(invalid_arguments("create_workspace", &why)),
        };
        let id = crate::nonce::hex128();
        // A system call: made before the connection's lock is taken.
        let usage = workspace.usage().ok();
        let mut held = self.connection.workspaces.lock();
        if held.len() >= MAX_WORKSPACES_PER_CONNECTION {
            return Ok(connection_full());
        }
        let now = std::time::Instant::now();
        let held_workspace = HeldWorkspace {
            workspace,
            _slot: slot,
            created: now,
            last_used: now,
            sessions: Vec::new(),
            packages: packages.clone(),
        };
        held.insert(id.clone(), held_workspace);
        let body = json!({
            "workspace_id": id,
            "replica": self.shared.cfg.replica,
            "packages": packages,
            "quota_bytes": usage.map_or(quota, |u| u.quota_bytes),
            "max_files": usage.map(|u| u.max_files),
            "idle_timeout_ms": millis(self.shared.cfg.workspace_idle),
            "lifetime_ms": millis(self.shared.cfg.workspace_lifetime),
        });
        Ok(structured(body, format!("workspace {id} is ready at /work"), false))
    }

    /// Unmounts a workspace of this connection.
    #[tool(description = "Close a workspace: its files are removed.")]
    async fn close_workspace(
        &self,
        Parameters(WorkspaceIdArgs { workspace_id }): Parameters<WorkspaceIdArgs>,
    ) -> Result<CallToolResult, McpError> {
        let closed = self.connection.workspaces.lock().remove(&workspace_id);
        forget_programs_of(&self.connection, &workspace_id);
        let text = match closed {
            Some(_) => format!("workspace {workspace_id} closed"),
            None => format!("no workspace {workspace_id} is open"),
        };
        let was_open = closed.is_some();
        // Done when it answers: its sessions closed, its programs killed,
        // its container removed, and unmounted (lazily, if a run still
        // uses it).
        tokio::task::spawn_blocking(closing(&self.connection, closed.into_iter().collect()))
            .await
            .map_err(|e| McpError::internal_error(format!("workspace task: {e}"), None))?;
        Ok(structured(json!({"closed": was_open}), text, false))
    }

    /// A workspace's usage and the host's record of its files.
    #[tool(description = "Describe a workspace: how full it is ({bytes_used, quota_bytes, files_used, \
            max_files, full}) and its metadata, the host's record of the files put in (write_files, a run's \
            input files) and taken out (read_files, saved artifacts), each {path, size, sha256, via, \
            at_unix_ms}, oldest first (the last 1000 of each; dropped counts the rest). Code in the \
            workspace cannot change this record.")]
    async fn describe_workspace(
        &self,
        Parameters(WorkspaceIdArgs { workspace_id }): Parameters<WorkspaceIdArgs>,
    ) -> Result<CallToolResult, McpError> {
        let Some(workspace) = self.workspace(&workspace_id) else {
            return Ok(self.no_workspace("describe_workspace", &workspace_id));
        };
        let usage = tokio::task::spawn_blocking({
            let workspace = workspace.clone();
            move || workspace.usage()
        })
        .await
        .map_err(|e| McpError::internal_error(format!("workspace task: {e}"), None))?;
        let usage = match usage {
            Ok(usage) => usage,
            Err(e) => return Ok(invalid_arguments("describe_workspace", &crate::error::with_causes(&e))),
        };
        let metadata = workspace.metadata();
        let text = format!(
            "{} of {} bytes used; {} files put in, {} taken out",
            usage.bytes_used,
            usage.quota_bytes,
            metadata.inputs.len(),
            metadata.outputs.len()
        );
        let body = json!({"workspace_id": workspace_id, "usage": usage, "metadata": metadata});
        Ok(structured(body, text, false))
    }

    /// Writes files into a workspace.
    #[tool(description = "Write files into a workspace (each replaces any file at its path; directories are \
            made). Paths are relative to /work; mode is the permission bits as a number (493 = 0o755 for a \
            script).")]
    async fn write_files(
        &self,
        Parameters(WriteFilesArgs { workspace_id, files, artifact_key }): Parameters<WriteFilesArgs>,
    ) -> Result<CallToolResult, McpError> {
        let Some(workspace) = self.workspace(&workspace_id) else {
            return Ok(self.no_workspace("write_files", &workspace_id));
        };
        let mut contents = Vec::with_capacity(files.len());
        let mut artifacts = None;
        for file in files {
            let content = match (file.content_base64, file.artifact) {
                (Some(text), None) => match base64::engine::general_purpose::STANDARD.decode(text.as_bytes()) {
                    Ok(bytes) => Content::Inline(bytes),
                    Err(e) => {
                        let why = format!("file {:?}: content_base64: {e}", file.path);
                        return Ok(invalid_arguments("write_files", &why));
                    }
                },
                (None, Some(reference)) => {
                    if artifacts.is_none() {
                        match self.artifacts_for(artifact_key.clone()) {
                            Ok(found) => artifacts = Some(found),
                            Err(why) => return Ok(invalid_arguments("write_files", &format!("artifact: {why}"))),
                        }
                    }
                    Content::Artifact(reference)
                }
                _ => {
                    let why = format!("file {:?}: give content_base64 or artifact, one of them", file.path);
                    return Ok(invalid_arguments("write_files", &why));
                }
            };
            contents.push((file.path, content, file.mode));
        }
        let written = tokio::task::spawn_blocking(move || {
            for (path, content, mode) in &contents {
                let loaded;
                let (bytes, via) = match content {
                    Content::Inline(bytes) => (bytes, "write".to_string()),
                    Content::Artifact(reference) => {
                        let store = artifacts.as_ref().ok_or_else(|| Refused::Artifact("no store".into()))?;
                        let which;
                        (loaded, which) = store.load(reference).map_err(Refused::Artifact)?;
                        (&loaded, format!("artifact:{which}"))
                    }
                };
                workspace.write_from(path, bytes, *mode, &via)?;
            }
            Ok::<_, Refused>(contents.len())
        })
        .await
        .map_err(|e| McpError::internal_error(format!("workspace task: {e}"), None))?;
        Ok(match written {
            Ok(n) => structured(json!({"written": n}), format!("{n} files written"), false),
            Err(Refused::Workspace(e @ (WorkspaceError::BadPath { .. } | WorkspaceError::BadMode { .. }))) => {
                invalid_arguments("write_files", &e.to_string())
            }
            Err(Refused::Workspace(e)) => failed(&e),
            Err(Refused::Artifact(why)) => invalid_arguments("write_files", &why),
        })
    }

    /// Reads files back from a workspace.
    #[tool(description = "Read files of a workspace by paths or globs (`*.csv`, `**/*.png`), within limits: \
            files (path, size, content_base64), limits_hit and left_out (what matched but was not read, and \
            why: a limit, or not a regular file; symlinks are never followed).")]
    async fn read_files(&self, Parameters(args): Parameters<ReadFilesArgs>) -> Result<CallToolResult, McpError> {
        let Some(workspace) = self.workspace(&args.workspace_id) else {
            return Ok(self.no_workspace("read_files", &args.workspace_id));
        };
        let defaults = CollectLimits::default();
        let limits = CollectLimits::new(
            args.max_files.unwrap_or(defaults.max_files).min(1000),
            args.max_file_bytes.unwrap_or(defaults.max_file_bytes).min(defaults.max_total_bytes),
            args.max_total_bytes.unwrap_or(defaults.max_total_bytes).min(defaults.max_total_bytes),
        );
        let save = args.save_as_artifacts.unwrap_or(false);
        let artifacts = match save.then(|| self.artifacts_for(args.artifact_key)) {
            Some(Err(why)) => return Ok(invalid_arguments("read_files", &format!("save_as_artifacts: {why}"))),
            Some(Ok(artifacts)) => Some(artifacts),
            None => None,
        };
        let template = args.name_template.unwrap_or_else(|| DEFAULT_NAME_TEMPLATE.into());
        let inline = args.inline.unwrap_or(!save);
        let globs = args.globs;
        let collected = tokio::task::spawn_blocking(move || {
            let mut collected = workspace.collect(&globs, &limits)?;
            // Saved after the walk: what was read is what is saved.
            let saved: Vec<Option<Saved>> = match &artifacts {
                Some(artifacts) => {
                    let mut saved = Vec::with_capacity(collected.files.len());
                    for file in &collected.files {
                        match artifacts.save(&template, &file.path, &file.content) {
                            Ok(artifact) => {
                                let via = format!("artifact:{}@{}", artifact.name, artifact.version);
                                let size = file.content.len() as u64;
                                workspace.note(Direction::Out, &file.path, size, Some(&file.content), &via);
                                saved.push(Some(artifact));
                            }
                            Err(why) => {
                                collected.left_out.push(format!("{}: not saved as an artifact: {why}", file.path));
                                if !collected.limits_hit.iter().any(|hit| hit == "artifacts") {
                                    collected.limits_hit.push("artifacts".into());
                                }
                                saved.push(None);
                            }
                        }
                    }
                    saved
                }
                None => Vec::new(),
            };
            Ok::<_, crate::workspace::WorkspaceError>((collected, saved))
        })
        .await
        .map_err(|e| McpError::internal_error(format!("workspace task: {e}"), None))?;
        let (collected, saved) = match collected {
            Ok(collected) => collected,
            Err(
                e @ (crate::workspace::WorkspaceError::BadPath { .. }
                | crate::workspace::WorkspaceError::BadGlob { .. }),
            ) => {
                return Ok(invalid_arguments("read_files", &e.to_string()));
            }
            Err(e) => return Ok(failed(&e)),
        };
        let mut saved = saved.into_iter();
        let files: Vec<_> = collected
            .files
            .iter()
            .map(|f| {
                let mut entry = json!({"path": f.path, "size": f.content.len()});
                if inline {
                    entry["content_base64"] = base64::engine::general_purpose::STANDARD.encode(&f.content).into();
                }
                if let Some(artifact) = saved.next().flatten() {
                    entry["artifact"] = json!(artifact);
                }
                entry
            })
            .collect();
        let text = format!("{} files read; limits hit: {:?}", files.len(), collected.limits_hit);
        let body = json!({"files": files, "limits_hit": collected.limits_hit, "left_out": collected.left_out});
        Ok(structured(body, text, false))
    }
}

/// Where a file's content comes from.
enum Content {
    Inline(Vec<u8>),
    /// An artifact reference: `name@version` or `name`.
    Artifact(String),
}

/// Why `write_files` stopped: the workspace refused a write, or an
/// artifact could not be read (an invalid argument).
enum Refused {
    Workspace(crate::workspace::WorkspaceError),
    Artifact(String),
}

impl From<crate::workspace::WorkspaceError> for Refused {
    fn from(e: crate::workspace::WorkspaceError) -> Self {
        Self::Workspace(e)
    }
}

/// A workspace that could not be made or written: `isError`, in the shape
/// of every other error (`{"error": {"kind", "message"}}`).
fn failed(error: &crate::workspace::WorkspaceError) -> CallToolResult {
    let message = crate::error::with_causes(error);
    structured(json!({"error": {"kind": "workspace", "message": message}}), format!("workspace: {message}"), true)
}

impl ExecboxMcp {
    /// Checks the arguments of a workspace tool against its type (see
    /// `call_tool`); any other tool's pass.
    pub(super) fn check_workspace_arguments(tool: &str, arguments: serde_json::Value) -> Result<(), serde_json::Error> {
        match tool {
            "create_workspace" => serde_json::from_value::<CreateWorkspaceArgs>(arguments).map(drop),
            "close_workspace" | "describe_workspace" => serde_json::from_value::<WorkspaceIdArgs>(arguments).map(drop),
            "write_files" => serde_json::from_value::<WriteFilesArgs>(arguments).map(drop),
            "read_files" => serde_json::from_value::<ReadFilesArgs>(arguments).map(drop),
            _ => Ok(()),
        }
    }

    /// The artifacts of this connection (its scope for `key`, if given), or
    /// why there are none (see `file_artifacts.rs`).
    #[cfg(feature = "artifacts")]
    fn artifacts_for(&self, key: Option<String>) -> Result<Artifacts, String> {
        let none = || "this server keeps no artifacts (see execbox serve --artifacts)".to_string();
        let store = self.shared.artifacts.as_ref().ok_or_else(none)?.store.clone();
        let scope = self.artifact_scope(key)?.ok_or_else(none)?;
        Ok(Artifacts::new(store, scope))
    }

    /// The artifacts of this connection: none, in a build without them.
    #[cfg(not(feature = "artifacts"))]
    fn artifacts_for(&self, key: Option<String>) -> Result<Artifacts, String> {
        let _ = key;
        Err("this execbox was built without artifacts".into())
    }

    /// Adds the packages of this connection's workspace `id` (if it is open)
    /// to those `declared`, each once.
    pub(super) fn declare_workspace_packages(&self, id: &str, declared: &mut Vec<String>) {
        let held = self.connection.workspaces.lock();
        for package in held.get(id).map(|held| held.packages.as_slice()).unwrap_or_default() {
            if !declared.iter().any(|p| p.eq_ignore_ascii_case(package)) {
                declared.push(package.clone());
            }
        }
    }

    /// This connection's workspace `id`, marked used now.
    pub(super) fn workspace(&self, id: &str) -> Option<Workspace> {
        touch(&self.connection, id)
    }

    /// The answer to a call naming a workspace this connection does not hold.
    pub(super) fn no_workspace(&self, tool: &str, id: &str) -> CallToolResult {
        self.not_held_here(invalid_arguments(tool, &format!("no workspace {id} is open")))
    }
}

/// Workspace `id` of `connection`, marked used now.
pub(super) fn touch(connection: &Connection, id: &str) -> Option<Workspace> {
    let mut held = connection.workspaces.lock();
    let entry = held.get_mut(id)?;
    entry.last_used = Instant::now();
    Some(entry.workspace.clone())
}

/// What closes workspaces taken out of `connection`'s: their sessions first
/// (each holds its workspace), then the workspaces (their programs killed,
/// their container removed, unmounted). It blocks: run it off the async
/// threads.
pub(super) fn closing(connection: &Connection, closed: Vec<HeldWorkspace>) -> impl FnOnce() + Send + 'static {
    let sessions = connection.shared.sessions.clone();
    let keys: Vec<String> = closed.iter().flat_map(|held| held.sessions.iter().map(|id| connection.key(id))).collect();
    move || {
        for key in keys {
            sessions.close(&key);
        }
        drop(closed);
    }
}

/// Why no backend of `exec` runs Python with every one of `packages`, if
/// none does (what the others provide named).
fn unprovided(exec: &crate::executor::Executor, packages: &[String]) -> Option<String> {
    if packages.is_empty() {
        return None;
    }
    let wanted = crate::request::ExecRequest::source(crate::language::Language::Python, "").packages(packages.to_vec());
    let backends: Vec<(&str, Vec<String>)> =
        exec.backends().map(|b| (b.name(), b.packages(crate::language::Language::Python))).collect();
    if backends.iter().any(|(name, provided)| crate::matching::check_packages(name, provided, &wanted).is_none()) {
        return None;
    }
    let offered: Vec<String> = backends
        .iter()
        .filter(|(_, provided)| !provided.is_empty())
        .map(|(name, provided)| format!("{name} provides {}", provided.join(", ")))
        .collect();
    let offered = if offered.is_empty() { "no backend here provides packages".into() } else { offered.join("; ") };
    Some(format!("packages: no backend provides {} ({offered})", packages.join(", ")))
}

/// Forgets the programs of workspace `workspace_id` (closed or expired).
pub(super) fn forget_programs_of(connection: &Connection, workspace_id: &str) {
    connection.programs.lock().retain(|_, (_, workspace)| workspace != workspace_id);
}

impl ExecboxMcp {
    /// Closes, every few seconds while `connection` lives, its workspaces that
    /// are idle (no call used them for `ServeConfig::workspace_idle`, and no
    /// run, session call or program runs in them) or older than
    /// `ServeConfig::workspace_lifetime`.
    /// Closing kills their programs and removes their container, off the async
    /// threads (on the connection's cleanups, which a drain waits for).
    pub(super) fn expire_idle_workspaces(connection: &Arc<Connection>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let cfg = &connection.shared.cfg;
        let every = (cfg.workspace_idle.min(cfg.workspace_lifetime) / 4)
            .clamp(Duration::from_millis(50), Duration::from_secs(5));
        let connection = Arc::downgrade(connection);
        runtime.spawn(async move {
            let mut ticks = tokio::time::interval(every);
            loop {
                ticks.tick().await;
                let Some(connection) = connection.upgrade() else { return };
                let (idle, lifetime) = (connection.shared.cfg.workspace_idle, connection.shared.cfg.workspace_lifetime);
                let running: std::collections::HashSet<String> = connection
                    .programs
                    .lock()
                    .values()
                    .filter(|(program, _)| program.status() == ProgramStatus::Running)
                    .map(|(_, workspace)| workspace.clone())
                    .collect();
                let now = Instant::now();
                let expired: Vec<(String, HeldWorkspace)> = {
                    let mut held = connection.workspaces.lock();
                    let ids: Vec<String> = held
                        .iter()
                        .filter(|(id, w)| {
                            let in_use = running.contains(*id)
                                || w.workspace.in_run()
                                || crate::program_tools::code_programs_running(&w.workspace);
                            now - w.created >= lifetime || (now - w.last_used >= idle && !in_use)
                        })
                        .map(|(id, _)| id.clone())
                        .collect();
                    ids.into_iter().filter_map(|id| held.remove(&id).map(|w| (id, w))).collect()
                };
                if expired.is_empty() {
                    continue;
                }
                for (id, _) in &expired {
                    tracing::info!(workspace = id.as_str(), "a workspace expired (idle or past its lifetime): closed");
                    forget_programs_of(&connection, id);
                }
                let close = closing(&connection, expired.into_iter().map(|(_, held)| held).collect());
                connection.shared.cleanups.spawn(close);
            }
        });
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
