//! A warm pool for an interpreter: instances pre-started in the background
//! up to the point where they wait for their code (CPython blocked reading
//! stdin), so a request pays only for its own code.
//!
//! Each instance serves exactly one request and is never reused: its thread
//! ends with the run, and a replacement starts as soon as the run has
//! answered (not during it: on a small machine its start-up would slow the
//! run down). An instance gets its request's deadline, memory cap and output caps
//! when the code arrives ([`RunControls::arm`]); requests that need what is
//! fixed at start-up (arguments, environment, granted directories, a fuel
//! budget, or a memory cap below what start-up already used) run fresh instead.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use wasmtime_wasi::FsPerms;

use super::WasmGuest;
use super::compile::Compiled;
use super::run::{self, Preopen, RunControls, Stdio, StoreSetup};
use super::stdio::{CappedPipe, CodeStdin};
use crate::error::ExecError;
use crate::limits::Deadline;
use crate::policy::Access;
use crate::request::ExecRequest;
use crate::result::{ExecResult, Outcome};

/// How long past its deadline a run may take to report before the caller
/// stops waiting (the guest stops itself at the deadline; this is a backstop).
const REPORT_GRACE: Duration = Duration::from_secs(5);

/// One pre-started instance, waiting for its code.
struct Warm {
    code: tokio::sync::oneshot::Sender<Vec<u8>>,
    controls: Arc<RunControls>,
    stdio: Stdio,
    /// Seen by the guest at `/work` (read-only); the request's files go here.
    work: tempfile::TempDir,
    done: mpsc::Receiver<Result<ExecResult, ExecError>>,
    thread: JoinHandle<()>,
    /// Set once start-up is over and the guest waits for its code.
    waiting: Arc<AtomicBool>,
}

impl Warm {
    /// Ends an unused instance: with no code its stdin ends, the program
    /// runs nothing and exits.
    fn retire(self) {
        drop(self.code);
        drop(self.thread.join());
    }
}

pub(super) struct WarmPool {
    guest: Arc<WasmGuest>,
    compiled: Arc<Compiled>,
    /// The interpreter's arguments (e.g. `-c BOOTSTRAP`).
    args: Vec<String>,
    size: usize,
    idle: Mutex<VecDeque<Warm>>,
    /// Threads (and work dirs) of answered runs, joined off the request path.
    finished: Mutex<Vec<(JoinHandle<()>, tempfile::TempDir)>>,
}

impl WarmPool {
    /// A pool of `size` instances, starting now in the background.
    pub fn start(guest: Arc<WasmGuest>, compiled: Arc<Compiled>, args: Vec<String>, size: usize) -> Self {
        let pool =
            Self { guest, compiled, args, size, idle: Mutex::new(VecDeque::new()), finished: Mutex::new(Vec::new()) };
        for _ in 0..size {
            pool.refill();
        }
        pool
    }

    /// Whether a warm instance can honour `request` exactly.
    pub fn fits(request: &ExecRequest) -> bool {
        request.args.is_empty()
            && request.env.is_empty()
            && !matches!(request.policy.filesystem, Access::Allow(_))
            && request.policy.fuel.is_none()
    }

    /// Runs `code` on a warm instance, with `request`'s limits and files.
    /// `None` when no instance is idle or it cannot honour the memory cap:
    /// the caller runs a fresh instance.
    pub fn run(
        &self,
        code: &str,
        input_json: Option<&[u8]>,
        request: &ExecRequest,
    ) -> Option<Result<ExecResult, ExecError>> {
        let warm = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop_front()?;
        // The replacement starts once this run has answered: started now, its
        // CPython start-up would compete with this run for the CPU.
        let _refill = Refill(self);
        let policy = &request.policy;
        let memory_cap = self.guest.memory_cap(policy);
        if warm.controls.peak() > memory_cap {
            warm.retire();
            return None;
        }
        if let Err(e) = super::write_staged(warm.work.path(), request, input_json.map(|j| ("input.json", j))) {
            warm.retire();
            return Some(Err(e));
        }
        warm.stdio.stdout.reset(policy.max_stdout_bytes);
        warm.stdio.stderr.reset(policy.max_stderr_bytes);
        let deadline = Deadline::start(Some(policy.timeout_duration().unwrap_or(self.guest.cfg.default_timeout)));
        warm.controls.arm(deadline, memory_cap);
        let _ticking = self.guest.ticker().run_guard();
        if warm.code.send(code.as_bytes().to_vec()).is_err() {
            return Some(Err(ExecError::internal(WasmGuest::NAME, "a warm instance ended before its code arrived")));
        }
        let result = match deadline.remaining() {
            Some(left) => warm.done.recv_timeout(left + REPORT_GRACE).ok(),
            None => warm.done.recv().ok(),
        };
        let Some(mut result) = result else {
            // The guest stops itself at the deadline; a run that has not
            // reported by now is stuck in the host: leave its thread.
            return Some(Ok(stuck(&deadline)));
        };
        self.finished.lock().unwrap_or_else(PoisonError::into_inner).push((warm.thread, warm.work));
        if let Ok(r) = &mut result {
            // The store's counter includes start-up: no per-request figure.
            r.usage.fuel = None;
        }
        Some(result)
    }

    /// Starts one instance in the background; it joins the idle list at once
    /// (a request that takes it before start-up ends waits for the rest).
    fn refill(&self) {
        self.join_finished(false);
        let Ok(work) = crate::backends::owner::temp_dir("warm") else { return };
        let (stdin, code, waiting) = CodeStdin::new();
        let controls = RunControls::new(Deadline::start(None), self.guest.cfg.max_memory_bytes as usize);
        let stdio = Stdio { stdout: CappedPipe::new(Some(0)), stderr: CappedPipe::new(Some(0)) };
        let (done_tx, done) = mpsc::sync_channel(1);
        let guest = self.guest.clone();
        let compiled = self.compiled.clone();
        let args = self.args.clone();
        let thread_stdio = Stdio { stdout: stdio.stdout.clone(), stderr: stdio.stderr.clone() };
        let thread_controls = controls.clone();
        let host = work.path().to_path_buf();
        let spawned = std::thread::Builder::new()
            .name("execbox-warm".into())
            .stack_size(self.guest.cfg.max_wasm_stack + (2 << 20))
            .spawn(move || {
                let preopens = [Preopen { host, guest: "/work".into(), perms: FsPerms::ReadOnly }];
                let setup = StoreSetup { args: &args, env: &[], preopens: &preopens, fuel: None };
                let mut store =
                    match run::new_store(&guest, compiled.abi, stdin, &thread_stdio, &setup, thread_controls) {
                        Ok(store) => store,
                        Err(e) => {
                            let _ = done_tx.send(Err(e));
                            return;
                        }
                    };
                run::stop_at_armed_deadline(&mut store);
                let verdict = match run::instantiate(&guest, &compiled, &mut store) {
                    Ok(Ok(instance)) => run::call_start(&mut store, instance),
                    Ok(Err(err)) => Err(err),
                    Err(e) => {
                        let _ = done_tx.send(Err(e));
                        return;
                    }
                };
                // Answer first: freeing the instance (resetting its memory
                // slot) is not the caller's wait.
                let _ = done_tx.send(Ok(run::finish(&guest, &mut store, verdict, &thread_stdio, None)));
                drop(store);
            });
        if let Ok(thread) = spawned {
            let warm = Warm { code, controls, stdio, work, done, thread, waiting };
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            if idle.len() < self.size {
                idle.push_back(warm);
                return;
            }
            drop(idle);
            warm.retire();
        }
    }

    /// Joins the threads of answered runs: those already ended, or with
    /// `all`, every one (they end right after answering).
    fn join_finished(&self, all: bool) {
        let mut finished = self.finished.lock().unwrap_or_else(PoisonError::into_inner);
        let (done, running): (Vec<_>, Vec<_>) =
            std::mem::take(&mut *finished).into_iter().partition(|(thread, _)| all || thread.is_finished());
        *finished = running;
        drop(finished);
        for (thread, work) in done {
            drop(thread.join());
            drop(work);
        }
    }

    /// Instances in the pool (started or still starting).
    pub fn idle(&self) -> usize {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Instances done starting, waiting for code.
    pub fn ready(&self) -> usize {
        let idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        idle.iter().filter(|w| w.waiting.load(Ordering::SeqCst)).count()
    }
}

impl Drop for WarmPool {
    fn drop(&mut self) {
        let idle = std::mem::take(&mut *self.idle.lock().unwrap_or_else(PoisonError::into_inner));
        for warm in idle {
            warm.retire();
        }
        self.join_finished(true);
    }
}

/// Starts a replacement instance when dropped (whatever path `run` returns by).
struct Refill<'a>(&'a WarmPool);

impl Drop for Refill<'_> {
    fn drop(&mut self) {
        self.0.refill();
    }
}

fn stuck(deadline: &Deadline) -> ExecResult {
    ExecResult {
        backend: WasmGuest::NAME.into(),
        outcome: Outcome::TimedOut,
        exit_code: None,
        stdout: Default::default(),
        stderr: Default::default(),
        output: None,
        output_truncated: false,
        message: Some(deadline.exceeded_message()),
        output_files: Vec::new(),
        failure_kind: None,
        diagnostics: Vec::new(),
        usage: Default::default(),
    }
}
