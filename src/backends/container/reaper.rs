//! Removes finished containers and their staging directories off the
//! request path.
//!
//! A finished container is stopped and holds no resources but its record;
//! removing it costs an engine round trip (~10–20 ms) that a caller should not
//! wait for. Its staging directory may hold whatever a hostile program left
//! in `/work/out` (millions of entries): removing that is not the caller's
//! wait either. The reaper batches both on one thread — containers first,
//! then their directories — which `Drop` drains and joins, so nothing
//! outlives the backend.

use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;

use super::process;

enum Job {
    Container(String),
    Dir(tempfile::TempDir),
}

pub(super) struct Reaper {
    engine: PathBuf,
    state: Mutex<Option<(Sender<Job>, JoinHandle<()>)>>,
}

impl Reaper {
    pub fn new(engine: PathBuf) -> Self {
        Self { engine, state: Mutex::new(None) }
    }

    /// Queues the container `name` for removal (`rm --force`: a container
    /// still running is killed first).
    pub fn remove(&self, name: String) {
        self.send(Job::Container(name));
    }

    /// Queues a staging directory for removal.
    pub fn discard(&self, dir: tempfile::TempDir) {
        self.send(Job::Dir(dir));
    }

    /// Hands `job` to the thread; does it at once if no thread can be started.
    fn send(&self, job: Job) {
        let mut state = self.state.lock();
        if state.is_none() {
            let (tx, rx) = mpsc::channel();
            let engine = self.engine.clone();
            match std::thread::Builder::new().name("execbox-reaper".into()).spawn(move || reap(&engine, rx)) {
                Ok(handle) => *state = Some((tx, handle)),
                Err(_) => return run(&self.engine, vec![job]),
            }
        }
        if let Some((tx, _)) = state.as_ref()
            && let Err(mpsc::SendError(job)) = tx.send(job)
        {
            run(&self.engine, vec![job]);
        }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        let state = self.state.get_mut().take();
        if let Some((tx, handle)) = state {
            drop(tx);
            drop(handle.join());
        }
    }
}

fn reap(engine: &Path, rx: Receiver<Job>) {
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        jobs.extend(rx.try_iter());
        run(engine, jobs);
    }
}

/// Removes the containers of `jobs` in one command, then their directories.
fn run(engine: &Path, jobs: Vec<Job>) {
    let (mut names, mut dirs) = (Vec::new(), Vec::new());
    for job in jobs {
        match job {
            Job::Container(name) => names.push(name),
            Job::Dir(dir) => dirs.push(dir),
        }
    }
    for batch in names.chunks(100) {
        let mut args = vec!["rm", "--force"];
        args.extend(batch.iter().map(String::as_str));
        if let Err(e) = process::quiet(engine, &args, process::HOUSEKEEPING_TIMEOUT) {
            tracing::warn!(error = %e, containers = batch.len(), "cannot remove finished containers");
        }
    }
    for dir in dirs {
        // Not TempDir's own removal: it recurses per level (see `remove_tree`).
        // Already gone is done: a host exiting on a signal sweeps its own
        // staging directories while removals may still be queued here.
        match crate::owner::remove_tree(dir.path()) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %dir.path().display(), error = %e, "cannot remove a staging directory");
            }
        }
    }
}
