//! Warm one-shot containers: started before the runs that take them.
//!
//! A one-shot container costs ~300 ms to create and start, nearly all of it
//! the engine's, and ~50–150 ms more to stop; the program itself often
//! needs a few ms. A warm container has been started already, with its
//! package set imported, and waits on stdin for its code.
//!
//! - **Never reused.** A warm container runs exactly one program and is
//!   removed after it, like a cold one: nothing of one run can reach
//!   another.
//! - **The same locks as a cold run.** Its spec is built by the runner's
//!   one spec function (every locked flag, the key's memory and process
//!   caps, `/work` read-only from a staging directory of its own, `/work/out`
//!   when the package set collects files). Only three things differ: the
//!   command is Python's warm bootstrap
//!   ([`PYTHON_WARM_CONTAINER_BOOTSTRAP`]: import the packages, say
//!   ready, read the code); it runs under the end-record wrapper
//!   ([`WARM_AFTER_SCRIPT`](super::outputs::WARM_AFTER_SCRIPT)), so the run is
//!   over when both streams carry the program's end record, not when the
//!   engine has stopped the container; and its in-container timer covers
//!   the longest wait plus the longest run it may take
//!   (`warm_lifetime + defaults.timeout +` [`KILL_GRACE`]). A run's files are
//!   written into the staging directory when the run takes the container
//!   (the bind mount shows them at once).
//! - **Only runs that fit.** The runner decides (`Runner::warm_key`): Python
//!   without environment, arguments, path grants or tools; the key holds
//!   what the container is started with (image, packages, `/work/out`,
//!   memory and process caps), so a pool serves exactly the runs whose cold
//!   container would have had the same flags.
//! - **Bounded.** Per package set ([`WarmKey`]) at most `warm_containers`
//!   ready or starting; at most [`MAX_KEYS`] package sets (the least
//!   recently used one goes; its starts still count until they end); at
//!   most [`MAX_STARTING`] starts at once; a container that has not said
//!   ready within [`START_TIMEOUT`] (or within `warm_lifetime`) is removed,
//!   and a pool whose starts fail backs off on its own (up to
//!   [`MAX_BACKOFF`]: a package set that can never start, e.g. one that
//!   needs more memory than its cap, neither spins nor holds back the
//!   others); a ready one is replaced once `warm_lifetime` has passed since
//!   its start (not since it said ready: its in-container timer runs from
//!   its start, and must outlast any run it takes).
//! - **Off the request path.** Starts, expiry, health checks (a container
//!   killed from outside is replaced within [`HEALTH_EVERY`]) and removals
//!   happen on the pool's own thread and its starters. A run never waits for
//!   the pool: one that finds no ready container starts a cold one.
//! - **Dies with the host.** Warm containers carry the labels of every
//!   container: the host's watcher and the next process's sweep remove them
//!   (`owners.rs`). Shutdown and drop remove them too, and drop joins the
//!   pool's threads.

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::argv::RunSpec;
#[cfg(doc)]
use super::process::KILL_GRACE;
use super::process::{self, HOUSEKEEPING_TIMEOUT, Spawned};
use super::staging::Staging;
#[cfg(doc)]
use crate::backends::conventions::PYTHON_WARM_CONTAINER_BOOTSTRAP;
use crate::backends::conventions::{WARM_CONTAINER_HERE, WARM_CONTAINER_PROBE, WARM_CONTAINER_READY};

/// Most package sets with a pool of their own.
pub(super) const MAX_KEYS: usize = 8;
/// Most warm containers starting at once (all package sets together).
pub(super) const MAX_STARTING: usize = 2;
/// Longest a warm container may take to say ready.
pub(super) const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How often ready containers are checked for life (one killed from
/// outside is replaced by then).
pub(super) const HEALTH_EVERY: Duration = Duration::from_secs(1);
/// Longest pause after failed starts before the next try.
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// The pause after a package set's first failed start (doubled per failure after it).
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// Longest a ready container may take to answer the probe a run takes it
/// with (an answer takes well under a millisecond): one that does not
/// (paused with `docker pause`, frozen, stuck) is removed, and the run
/// takes another or starts a cold one.
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_millis(250);

/// What a warm container is started for: the runs it can serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct WarmKey {
    /// The image.
    pub image: String,
    /// The packages imported before the code comes (the request's declared
    /// ones, sorted, without repeats).
    pub packages: Vec<String>,
    /// Whether `/work/out` is collected.
    pub outputs: bool,
    /// The memory cap (`--memory`).
    pub memory_bytes: u64,
    /// The process cap (`--pids-limit`).
    pub pids: u64,
}

/// A started container waiting for its code.
pub(super) struct Warm {
    pub spec: RunSpec,
    pub staging: Staging,
    pub spawned: Spawned,
    /// Just before its CLI was spawned: its in-container timer started
    /// later, so a container younger than `warm_lifetime` by this clock has
    /// at least `defaults.timeout + KILL_GRACE` of its timer left.
    born: Instant,
}

impl Warm {
    /// Still running: its CLI has not exited.
    fn alive(&self) -> bool {
        !self.spawned.exit.wait_exit(Some(Instant::now()))
    }

    /// Whether its Python answers the probe within [`PROBE_TIMEOUT`]: it
    /// runs and reads its stdin, so the code the run writes next is read.
    fn answers(&mut self) -> bool {
        use std::io::Write as _;
        let Some(stdin) = self.spawned.child.stdin.as_mut() else { return false };
        if stdin.write_all(WARM_CONTAINER_PROBE).and_then(|()| stdin.flush()).is_err() {
            return false;
        }
        match wait_line(&mut self.spawned, WARM_CONTAINER_HERE, Instant::now() + PROBE_TIMEOUT) {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(container = %self.spec.name, error = %e, "a warm container did not answer: removed");
                false
            }
        }
    }

    /// Stops its CLI and removes the container (a housekeeping wait, never
    /// on a request's path).
    fn discard(self, engine: &std::path::Path) {
        discard_all(engine, vec![self]);
    }
}

/// Stops the CLIs of `warms` and removes their containers with one `rm`
/// per hundred: a daemon that does not answer costs one
/// [`HOUSEKEEPING_TIMEOUT`] per batch, not per container (the pool's drop
/// waits for this).
fn discard_all(engine: &std::path::Path, warms: Vec<Warm>) {
    let mut names = Vec::with_capacity(warms.len());
    for mut warm in warms {
        process::kill_group(&mut warm.spawned.child);
        drop(warm.spawned.child.wait());
        names.push(warm.spec.name);
    }
    for batch in names.chunks(100) {
        let mut args = vec!["rm", "--force"];
        args.extend(batch.iter().map(String::as_str));
        drop(process::quiet(engine, &args, HOUSEKEEPING_TIMEOUT));
    }
}

/// Builds the spec and staging of a warm container for a key (the runner's:
/// its one spec function).
pub(super) type Launch = dyn Fn(&WarmKey) -> std::io::Result<(RunSpec, Staging)> + Send + Sync;

/// The pool; see the module docs.
pub(super) struct WarmPool {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

struct Shared {
    engine: PathBuf,
    size: usize,
    lifetime: Duration,
    launch: Box<Launch>,
    state: Mutex<State>,
    wake: Condvar,
}

#[derive(Default)]
struct State {
    pools: Vec<Pool>,
    /// Containers to remove (expired, dead, evicted), by the pool's thread.
    discard: Vec<Warm>,
    /// CLIs starting now: killed at drop so their starters end at once.
    starting: Vec<u32>,
    starters: Vec<JoinHandle<()>>,
    /// Starts under way, of every pool, evicted ones too (at most
    /// [`MAX_STARTING`]).
    in_flight: usize,
    /// The id of the next pool: a starter finds its own pool by id, never
    /// a later pool of the same key.
    next_id: u64,
    shut_down: bool,
}

struct Pool {
    id: u64,
    key: WarmKey,
    ready: VecDeque<Warm>,
    starting: usize,
    last_used: Instant,
    /// Failed starts in a row, and when this pool may try again.
    failures: u32,
    retry_at: Option<Instant>,
}

impl WarmPool {
    /// A pool keeping `size` containers per key, each waiting at most
    /// `lifetime`; nothing starts before the first [`WarmPool::take`] or
    /// [`WarmPool::want`].
    pub fn new(engine: PathBuf, size: usize, lifetime: Duration, launch: Box<Launch>) -> Self {
        let shared = Arc::new(Shared {
            engine,
            size,
            lifetime,
            launch,
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
        });
        Self { shared, thread: Mutex::new(None) }
    }

    /// Whether the pool keeps any containers at all.
    pub fn enabled(&self) -> bool {
        self.shared.size > 0
    }

    /// A ready container for `key`, if one is waiting and answers its
    /// probe ([`Warm::answers`]: one that does not is removed); the pool
    /// refills after it (and starts a pool for a key it has not seen).
    pub fn take(&self, key: &WarmKey) -> Option<Warm> {
        if !self.enabled() {
            return None;
        }
        self.ensure_thread();
        loop {
            let mut candidate = self.candidate(key)?;
            // Off the pool's lock: a probe may wait its whole timeout.
            if candidate.answers() {
                return Some(candidate);
            }
            self.shared.state.lock().discard.push(candidate);
            self.shared.wake.notify_all();
        }
    }

    /// The next ready container for `key` that is alive and young enough.
    fn candidate(&self, key: &WarmKey) -> Option<Warm> {
        let mut state = self.shared.state.lock();
        if state.shut_down {
            return None;
        }
        let now = Instant::now();
        let taken = match state.pools.iter().position(|p| &p.key == key) {
            Some(at) => {
                let pool = &mut state.pools[at];
                pool.last_used = now;
                let mut taken = None;
                let mut stale = Vec::new();
                while let Some(warm) = pool.ready.pop_front() {
                    if warm.alive() && warm.born.elapsed() < self.shared.lifetime {
                        taken = Some(warm);
                        break;
                    }
                    stale.push(warm);
                }
                state.discard.extend(stale);
                taken
            }
            None => {
                add_pool(&mut state, key.clone(), now);
                None
            }
        };
        self.shared.wake.notify_all();
        taken
    }

    /// Starts the pool of `key` now (it fills off the caller's path).
    pub fn want(&self, key: WarmKey) {
        if !self.enabled() {
            return;
        }
        self.ensure_thread();
        let mut state = self.shared.state.lock();
        if !state.shut_down && !state.pools.iter().any(|p| p.key == key) {
            add_pool(&mut state, key, Instant::now());
        }
        self.shared.wake.notify_all();
    }

    /// Ready containers now, and how many the pool keeps.
    pub fn counts(&self) -> (usize, usize) {
        let state = self.shared.state.lock();
        let ready = state.pools.iter().map(|p| p.ready.len()).sum();
        (ready, self.shared.size * state.pools.len().max(1))
    }

    /// Stops refilling and removes every warm container (the pool's thread
    /// does, at once).
    pub fn shutdown(&self) {
        let mut state = self.shared.state.lock();
        state.shut_down = true;
        kill_starting(&state.starting);
        self.shared.wake.notify_all();
    }

    fn ensure_thread(&self) {
        let mut thread = self.thread.lock();
        if thread.is_none() {
            let shared = Arc::clone(&self.shared);
            match std::thread::Builder::new().name("execbox-warm".into()).spawn(move || keep(&shared)) {
                Ok(handle) => *thread = Some(handle),
                Err(e) => tracing::warn!(error = %e, "cannot start the warm container pool's thread"),
            }
        }
    }
}

impl Drop for WarmPool {
    /// Removes every warm container and joins the pool's threads: nothing
    /// of the pool outlives it.
    fn drop(&mut self) {
        self.shutdown();
        if let Some(handle) = self.thread.get_mut().take() {
            drop(handle.join());
        }
        // Without a thread, nothing was ever started; with one, it left
        // nothing behind (see `keep`).
    }
}

fn add_pool(state: &mut State, key: WarmKey, now: Instant) {
    if state.pools.len() >= MAX_KEYS
        && let Some(oldest) = state.pools.iter().enumerate().min_by_key(|(_, p)| p.last_used).map(|(i, _)| i)
    {
        // Its starts still under way stay counted in `in_flight`; their
        // containers, once ready, find no pool and are removed.
        let evicted = state.pools.remove(oldest);
        state.discard.extend(evicted.ready);
    }
    let id = state.next_id;
    state.next_id += 1;
    state.pools.push(Pool {
        id,
        key,
        ready: VecDeque::new(),
        starting: 0,
        last_used: now,
        failures: 0,
        retry_at: None,
    });
}

/// Kills the process groups of CLIs this process spawned in groups of their
/// own and has not yet reaped (a starter removes its pid before it waits).
fn kill_starting(pids: &[u32]) {
    for pid in pids {
        process::kill_process_group(*pid);
    }
}

/// The pool's thread: expiry, health, refills and removals, until shutdown;
/// then it removes every container and joins the starters.
fn keep(shared: &Arc<Shared>) {
    let mut state = shared.state.lock();
    loop {
        let now = Instant::now();
        let mut discard = std::mem::take(&mut state.discard);
        if state.shut_down {
            for pool in &mut state.pools {
                discard.extend(pool.ready.drain(..));
            }
        } else {
            for pool in &mut state.pools {
                let (keep, gone): (VecDeque<Warm>, VecDeque<Warm>) =
                    pool.ready.drain(..).partition(|w| w.alive() && w.born.elapsed() < shared.lifetime);
                pool.ready = keep;
                discard.extend(gone);
            }
        }
        let mut starts = Vec::new();
        if !state.shut_down {
            let mut in_flight = state.in_flight;
            for pool in &mut state.pools {
                if pool.retry_at.is_some_and(|at| now < at) {
                    continue;
                }
                pool.retry_at = None;
                while pool.ready.len() + pool.starting < shared.size && in_flight < MAX_STARTING {
                    pool.starting += 1;
                    in_flight += 1;
                    starts.push((pool.id, pool.key.clone()));
                }
            }
            state.in_flight = in_flight;
        }
        state.starters.retain(|h| !h.is_finished());
        let done = state.shut_down && state.in_flight == 0;
        let starters = if done { std::mem::take(&mut state.starters) } else { Vec::new() };
        drop(state);

        if !discard.is_empty() {
            discard_all(&shared.engine, discard);
        }
        let mut spawned = Vec::new();
        for (id, key) in starts {
            let shared2 = Arc::clone(shared);
            match std::thread::Builder::new().name("execbox-warm-start".into()).spawn(move || start(&shared2, id, key))
            {
                Ok(handle) => spawned.push(handle),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start a warm container's starter");
                    let mut state = shared.state.lock();
                    state.in_flight -= 1;
                    if let Some(pool) = state.pools.iter_mut().find(|p| p.id == id) {
                        pool.starting -= 1;
                    }
                }
            }
        }
        if done {
            for handle in starters {
                drop(handle.join());
            }
            // Whatever a starter handed over meanwhile (none should).
            let left = std::mem::take(&mut shared.state.lock().discard);
            if !left.is_empty() {
                discard_all(&shared.engine, left);
            }
            return;
        }

        state = shared.state.lock();
        state.starters.extend(spawned);
        if state.discard.is_empty() && !(state.shut_down && state.in_flight == 0) {
            let mut wait = HEALTH_EVERY;
            for at in state.pools.iter().filter_map(|p| p.retry_at) {
                wait = wait.min(at.saturating_duration_since(Instant::now()));
            }
            for warm in state.pools.iter().flat_map(|p| p.ready.iter()) {
                wait = wait.min(shared.lifetime.saturating_sub(warm.born.elapsed()));
            }
            shared.wake.wait_for(&mut state, wait);
        }
    }
}

/// A starter: one warm container for the pool `id` (of `key`), handed to
/// that pool when ready (removed if the pool is gone).
fn start(shared: &Arc<Shared>, id: u64, key: WarmKey) {
    let result = launch(shared, &key);
    let mut state = shared.state.lock();
    state.in_flight -= 1;
    let shut_down = state.shut_down;
    let pool = state.pools.iter_mut().find(|p| p.id == id);
    match (result, pool) {
        (Ok(warm), Some(pool)) if !shut_down => {
            pool.starting -= 1;
            pool.failures = 0;
            pool.ready.push_back(warm);
        }
        (Ok(warm), pool) => {
            if let Some(pool) = pool {
                pool.starting -= 1;
            }
            state.discard.push(warm);
        }
        (Err(_), None) => {}
        (Err(e), Some(pool)) => {
            pool.starting -= 1;
            pool.failures = pool.failures.saturating_add(1);
            let backoff = crate::limits::backoff::after_failures(pool.failures, FIRST_BACKOFF, MAX_BACKOFF);
            pool.retry_at = Some(Instant::now() + backoff);
            if !shut_down {
                tracing::warn!(error = %e, image = %key.image, packages = ?key.packages, "a warm container did not start; retrying in {backoff:?}");
            }
        }
    }
    shared.wake.notify_all();
}

/// Spawns a warm container for `key` and waits (at most [`START_TIMEOUT`])
/// for its ready line. On failure nothing of it is left.
fn launch(shared: &Shared, key: &WarmKey) -> std::io::Result<Warm> {
    let (spec, staging) = (shared.launch)(key)?;
    let born = Instant::now();
    let mut spawned = process::spawn(&shared.engine, &spec.argv())?;
    let pid = spawned.child.id();
    {
        let mut state = shared.state.lock();
        if state.shut_down {
            kill_starting(&[pid]);
        }
        state.starting.push(pid);
    }
    // Ready after its lifetime, it could not be taken: a failed start.
    let until = born + START_TIMEOUT.min(shared.lifetime);
    let ready = wait_ready(&mut spawned, until);
    shared.state.lock().starting.retain(|p| *p != pid);
    let warm = Warm { spec, staging, spawned, born };
    match ready {
        Ok(()) => Ok(warm),
        Err(e) => {
            warm.discard(&shared.engine);
            Err(e)
        }
    }
}

/// Reads the container's stdout until exactly its ready line (nothing may
/// come before or after it), within `until`: `poll(2)` on the pipe, no
/// sleeps.
fn wait_ready(spawned: &mut Spawned, until: Instant) -> std::io::Result<()> {
    wait_line(spawned, WARM_CONTAINER_READY, until)
}

/// Waits until `line` is all a warm container wrote to stdout since the
/// last wait, until `until`; anything else, or its end, is an error.
fn wait_line(spawned: &mut Spawned, line: &[u8], until: Instant) -> std::io::Result<()> {
    let broken = |what: String| std::io::Error::other(what);
    let stdout = spawned.child.stdout.as_mut().ok_or_else(|| broken("no stdout".into()))?;
    let mut got = Vec::with_capacity(line.len());
    while got.len() < line.len() {
        if !crate::limits::poll::ready(&*stdout, rustix::event::PollFlags::IN, Some(until)) {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "not ready in time"));
        }
        let mut byte = [0u8; 32];
        let want = line.len() - got.len();
        match stdout.read(&mut byte[..want.min(32)]) {
            Ok(0) => {
                // Its CLI is ending: once it is gone, stderr ends too.
                process::kill_group(&mut spawned.child);
                let mut stderr = String::new();
                if let Some(pipe) = spawned.child.stderr.as_mut() {
                    drop(pipe.take(4096).read_to_string(&mut stderr));
                }
                return Err(broken(format!("ended before it was ready: {}", stderr.trim())));
            }
            Ok(n) => got.extend_from_slice(&byte[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        if !line.starts_with(&got) {
            return Err(broken(format!("wrote something else than {:?}", String::from_utf8_lossy(line))));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::container::config::ContainerConfig;
    use crate::backends::container::runner::warm_spec;
    use std::os::unix::fs::PermissionsExt;

    /// A stand-in engine: `run` logs its pid, says ready after `delay`
    /// seconds (or fails at once for the image `image-bad`) and then waits;
    /// any other subcommand (`rm`) succeeds, or hangs once `<dir>/hang`
    /// exists (a daemon that stopped answering).
    fn fake_engine(dir: &std::path::Path, delay: &str) -> (PathBuf, PathBuf) {
        let log = dir.join("log");
        let script = format!(
            "#!/bin/sh\n[ \"$1\" = run ] || {{ [ -e {hang} ] && exec sleep 1000; exit 0; }}\ncase \"$*\" in *image-bad*) echo \"fail $$\" >> {log}; exit 1 ;; esac\n\
             echo \"start $$ $(date +%s.%N)\" >> {log}\nsleep {delay}\necho \"ready $$ $(date +%s.%N)\" >> {log}\n\
             printf '\\000execbox:warm\\n'\nread probe\nprintf '\\000execbox:here\\n'\nexec sleep 1000\n",
            log = log.display(),
            hang = dir.join("hang").display()
        );
        let engine = dir.join("engine");
        std::fs::write(&engine, script).unwrap();
        std::fs::set_permissions(&engine, std::fs::Permissions::from_mode(0o755)).unwrap();
        (engine, log)
    }

    fn key(image: &str, memory_mb: u64) -> WarmKey {
        WarmKey { image: image.into(), packages: Vec::new(), outputs: false, memory_bytes: memory_mb << 20, pids: 64 }
    }

    fn pool(engine: &std::path::Path, size: usize) -> WarmPool {
        let cfg = ContainerConfig::default();
        WarmPool::new(engine.to_path_buf(), size, Duration::from_secs(60), Box::new(move |k| warm_spec(&cfg, k)))
    }

    fn lines(log: &std::path::Path, kind: &str) -> Vec<(u32, f64)> {
        std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                (f.next() == Some(kind))
                    .then(|| (f.next().unwrap().parse().unwrap(), f.next().map_or(0.0, |t| t.parse().unwrap())))
            })
            .collect()
    }

    /// Polls `done` (a test only: the pool's state has no event to wait on).
    fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if done() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        done()
    }

    fn alive(pid: u32) -> bool {
        // SAFETY: kill(2) with signal 0 only checks that the pid exists.
        unsafe { libc::kill(pid as i32, 0) == 0 }
    }

    /// Drops `pool` on another thread: whether that returned within `limit`.
    fn dropped_within(pool: WarmPool, limit: Duration) -> bool {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(pool);
            let _ = tx.send(());
        });
        rx.recv_timeout(limit).is_ok()
    }

    #[test]
    fn an_evicted_pools_starts_stay_counted_and_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, log) = fake_engine(dir.path(), "2");
        let pool = pool(&engine, 1);
        pool.want(key("image-a", 100));
        assert!(wait_for(Duration::from_secs(10), || lines(&log, "start").len() == 1));
        // Eight more package sets: the first (still starting) is evicted,
        // then asked for again at once.
        for n in 1..=MAX_KEYS as u64 {
            pool.want(key("image-a", 100 + n));
        }
        pool.want(key("image-a", 100));
        assert!(
            wait_for(Duration::from_secs(60), || pool.counts().0 == MAX_KEYS),
            "the pools did not fill: {:?}",
            pool.counts()
        );
        let starts = lines(&log, "start");
        let readies = lines(&log, "ready");
        let end = |pid: u32| readies.iter().find(|(p, _)| *p == pid).map_or(f64::MAX, |(_, t)| *t);
        let most =
            starts.iter().map(|(_, at)| starts.iter().filter(|(p, s)| s <= at && end(*p) > *at).count()).max().unwrap();
        assert!(most <= MAX_STARTING, "{most} starts at once: {starts:?} {readies:?}");
        {
            let state = pool.shared.state.lock();
            assert_eq!(state.in_flight, 0);
            assert!(state.pools.iter().all(|p| p.starting == 0 && p.ready.len() == 1));
        }
        assert!(dropped_within(pool, Duration::from_secs(30)), "dropping the pool hung");
        let left: Vec<u32> = starts.iter().map(|(p, _)| *p).filter(|p| alive(*p)).collect();
        for pid in &left {
            // SAFETY: kill(2) on a leftover stand-in engine of this test.
            unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
        }
        assert!(left.is_empty(), "warm CLIs outlived the pool: {left:?}");
    }

    #[test]
    fn a_hung_engine_holds_the_pools_drop_once_not_per_container() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, log) = fake_engine(dir.path(), "0.1");
        let pool = pool(&engine, 3);
        pool.want(key("image-a", 100));
        assert!(wait_for(Duration::from_secs(30), || pool.counts().0 == 3), "{:?}", pool.counts());
        std::fs::write(dir.path().join("hang"), "").unwrap();
        let started = Instant::now();
        assert!(dropped_within(pool, HOUSEKEEPING_TIMEOUT * 2), "the drop waited per container");
        assert!(started.elapsed() >= HOUSEKEEPING_TIMEOUT, "the removal did not wait for the engine at all");
        let left: Vec<u32> = lines(&log, "start").iter().map(|(p, _)| *p).filter(|p| alive(*p)).collect();
        assert!(left.is_empty(), "warm CLIs outlived the pool: {left:?}");
    }

    #[test]
    fn a_package_set_that_never_starts_backs_off_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, log) = fake_engine(dir.path(), "0.1");
        let pool = pool(&engine, 1);
        pool.want(key("image-bad", 100));
        let good = key("image-good", 100);
        pool.want(good.clone());
        let started = Instant::now();
        let mut taken = 0;
        while started.elapsed() < Duration::from_secs(6) {
            if let Some(warm) = pool.take(&good) {
                taken += 1;
                warm.discard(&engine);
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        let fails = lines(&log, "fail").len();
        assert!(dropped_within(pool, Duration::from_secs(30)), "dropping the pool hung");
        // Backing off 0.5, 1, 2, 4 s: at most 5 tries in 6 s, whatever the
        // other pool does ...
        assert!(fails <= 5, "{fails} failed starts in 6 s");
        // ... and the other pool refills meanwhile.
        assert!(taken >= 10, "only {taken} of 20 takes found a container");
    }
}
