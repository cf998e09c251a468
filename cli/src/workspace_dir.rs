//! `execbox run --workspace DIR`: a one-shot run over a host directory. The
//! directory is copied into a fresh workspace (the code sees it read-write
//! at `/work`, on whichever backend runs it), and after the run the files
//! matching `--collect` are written back into it.
//!
//! Both copies are capability-relative: the directory is opened once,
//! before the run, and read and written one component at a time, never
//! through a link (a symlink the code plants is not followed; one in the
//! directory is not copied in). Files the code removed are not removed
//! from the directory: the write-back only adds and replaces.

use std::path::{Path, PathBuf};

use execbox::workspace::OutputDir;
use execbox::{CollectLimits, Workspace, WorkspaceConfig};

/// Largest file, and all files together, written back (the workspace's
/// quota bounds both anyway).
const MAX_WRITE_BACK_FILES: usize = 100_000;

/// What [`DirWorkspace::write_back`] did.
pub(crate) struct WrittenBack {
    /// Files written (new or changed).
    pub written: usize,
    /// Files that already held what the workspace held, left alone.
    pub unchanged: usize,
    /// What matched but was not read from the workspace, each with why (a
    /// symlink the code made, a limit).
    pub left_out: Vec<String>,
    /// Files the directory refused, each with why.
    pub failed: Vec<String>,
}

/// A run's workspace and the directory it came from.
pub(crate) struct DirWorkspace {
    workspace: Workspace,
    dir: OutputDir,
    globs: Vec<String>,
    quota_bytes: u64,
}

impl DirWorkspace {
    /// Mounts a workspace of `quota_mb` under `root` (or the default root)
    /// and copies `dir` into it; the notes say what was not copied.
    pub(crate) fn open(
        dir: &Path,
        globs: Vec<String>,
        quota_mb: u64,
        root: Option<PathBuf>,
    ) -> Result<(Self, Vec<String>), String> {
        if !dir.is_dir() {
            return Err("not a directory".into());
        }
        execbox::workspace::check_globs(&globs).map_err(|e| format!("--collect: {e}"))?;
        let quota_bytes = quota_mb.checked_mul(1 << 20).filter(|b| *b > 0).ok_or("the quota must be 1 MiB or more")?;
        let output = OutputDir::open(dir).map_err(|e| e.to_string())?;
        let mut cfg = WorkspaceConfig::default().quota_bytes(quota_bytes);
        if let Some(root) = root {
            cfg = cfg.root(root);
        }
        let workspace = Workspace::create(cfg).map_err(|e| execbox::with_causes(&e))?;
        let imported = workspace.import_dir(dir).map_err(|e| format!("copying it in: {}", execbox::with_causes(&e)))?;
        let globs = if globs.is_empty() { vec!["**".to_string()] } else { globs };
        Ok((Self { workspace, dir: output, globs, quota_bytes }, imported.left_out))
    }

    /// The workspace the run uses.
    pub(crate) fn workspace(&self) -> &Workspace {
        &self.workspace
    }

    /// Writes the files matching the globs back into the directory, but
    /// those at `skip` (what the run itself staged, as `input.json`) and
    /// those it already holds unchanged. A file that cannot be written (a
    /// symlink of the directory's on its path) is skipped and the rest
    /// written.
    pub(crate) fn write_back(&self, skip: &[&str]) -> Result<WrittenBack, String> {
        let limits = CollectLimits::new(MAX_WRITE_BACK_FILES, self.quota_bytes, self.quota_bytes);
        let collected = self.workspace.collect(&self.globs, &limits).map_err(|e| execbox::with_causes(&e))?;
        let mut back = WrittenBack { written: 0, unchanged: 0, left_out: collected.left_out, failed: Vec::new() };
        for file in collected.files.iter().filter(|file| !skip.contains(&file.path.as_str())) {
            // Unchanged: left alone (a set-id bit of the directory's stays).
            if self.dir.holds(&file.path, &file.content, file.mode) {
                back.unchanged += 1;
                continue;
            }
            match self.dir.write(&file.path, &file.content, Some(file.mode)) {
                Ok(()) => back.written += 1,
                Err(e) => back.failed.push(execbox::with_causes(&e)),
            }
        }
        Ok(back)
    }

    /// The directory (for messages).
    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }
}
