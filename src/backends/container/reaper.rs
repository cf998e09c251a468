//! Removes finished containers off the request path.
//!
//! A finished container is stopped and holds no resources but its record;
//! removing it costs an engine round trip (~10–20 ms) that a caller should not
//! wait for. The reaper batches removals on one thread, which `Drop` drains
//! and joins, so no container outlives the backend.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;

pub(super) struct Reaper {
    engine: PathBuf,
    state: Mutex<Option<(Sender<String>, JoinHandle<()>)>>,
}

impl Reaper {
    pub fn new(engine: PathBuf) -> Self {
        Self { engine, state: Mutex::new(None) }
    }

    /// Queues `name` for removal; removes it at once if no thread can be started.
    pub fn remove(&self, name: String) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.is_none() {
            let (tx, rx) = mpsc::channel();
            let engine = self.engine.clone();
            match std::thread::Builder::new().name("execbox-reaper".into()).spawn(move || reap(&engine, rx)) {
                Ok(handle) => *state = Some((tx, handle)),
                Err(_) => return super::process::remove_now(&self.engine, &name),
            }
        }
        if let Some((tx, _)) = state.as_ref()
            && let Err(mpsc::SendError(name)) = tx.send(name)
        {
            super::process::remove_now(&self.engine, &name);
        }
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((tx, handle)) = state {
            drop(tx);
            drop(handle.join());
        }
    }
}

fn reap(engine: &std::path::Path, rx: Receiver<String>) {
    while let Ok(first) = rx.recv() {
        let mut names = vec![first];
        names.extend(rx.try_iter());
        let mut args = vec!["rm", "--force"];
        args.extend(names.iter().map(String::as_str));
        drop(super::process::quiet(engine, &args));
    }
}
