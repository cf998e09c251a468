//! Which binary serves as a worker (see the parent module's docs for the
//! order in which one is looked for).

use std::io;
use std::path::{Path, PathBuf};

use super::role::{HOOKED, PROGRAM_ENV};

/// Why no program can serve as a worker (see the module docs for where one
/// is looked for).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerProgramError {
    /// The configured program, or `$EXECBOX_WORKER`'s, is not a file.
    #[error("the worker program {} ({from}) does not exist", path.display())]
    Missing {
        /// The path as given.
        path: PathBuf,
        /// Where it was given: `configured` or the environment variable.
        from: &'static str,
    },
    /// The program's path cannot be made absolute.
    #[error("the worker program {} cannot be resolved", path.display())]
    Unresolvable {
        /// The path as given.
        path: PathBuf,
        /// Why not.
        #[source]
        source: io::Error,
    },
    /// This process cannot name its own executable.
    #[error("cannot find this executable")]
    NoCurrentExe(#[source] io::Error),
    /// Nothing was configured and no `execbox-worker` or `execbox` binary lies
    /// where cargo puts one.
    #[error(
        "no worker program: call execbox::worker::serve_if_worker() at the top of main, set EXECBOX_WORKER \
         to an execbox binary, or set the backend's worker_program"
    )]
    NotFound,
}

/// The binaries built to serve as a worker: this crate's own, then the CLI.
const WORKER_NAMES: [&str; 2] = ["execbox-worker", "execbox"];

/// Finds the program that serves as a worker.
pub(crate) fn find_program(explicit: Option<&Path>) -> Result<PathBuf, WorkerProgramError> {
    // Absolute: the worker starts in `/`, where a relative path means something else.
    let existing = |path: PathBuf, from: &'static str| {
        if path.is_file() {
            std::path::absolute(&path).map_err(|source| WorkerProgramError::Unresolvable { path, source })
        } else {
            Err(WorkerProgramError::Missing { path, from })
        }
    };
    if let Some(path) = explicit {
        return existing(path.to_path_buf(), "configured");
    }
    if let Some(path) = std::env::var_os(PROGRAM_ENV) {
        return existing(path.into(), PROGRAM_ENV);
    }
    let exe = std::env::current_exe().map_err(WorkerProgramError::NoCurrentExe)?;
    if HOOKED.get().is_some() {
        return Ok(exe);
    }
    // Beside this executable, then one directory up (cargo's `deps/` and `examples/`).
    let directories = [exe.parent(), exe.parent().and_then(Path::parent)];
    let candidates = directories.into_iter().flatten().flat_map(|dir| WORKER_NAMES.map(|name| dir.join(name)));
    candidates.into_iter().find(|p| p.is_file() && *p != exe).ok_or(WorkerProgramError::NotFound)
}
