//! One guest run: a fresh WASI context and store around a cached
//! [`InstancePre`](wasmtime::InstancePre), the policy's limits applied to the
//! store, and the engine's verdict mapped to an [`Outcome`].

use parking_lot::{Condvar, Mutex};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use wasmtime::{Caller, Engine, Linker, ResourceLimiter, Store, Trap};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::pipe::MemoryInputPipe;
use wasmtime_wasi::{FsPerms, HostMonotonicClock, I32Exit, WasiCtxBuilder};

use super::compile::{Compiled, GuestAbi};
use super::engine::{SlotPermit, WasmEngine};
use super::fs_guard;
use super::stdio::CappedPipe;
use super::ticker::ticks_for;
use crate::error::{ExecError, InvalidRequest};
use crate::limits::deadline::Deadline;
use crate::limits::output::StreamKind;
use crate::result::{ExecResult, Outcome};

/// Everything one run needs, taken from the request.
pub(super) struct Job {
    /// Bytes on the guest's stdin (commands) or the JSON input (JSON ABI).
    pub guest_input: Vec<u8>,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub preopens: Vec<Preopen>,
    pub fuel: Option<u64>,
    pub memory_cap: usize,
    pub max_stdout: Option<u64>,
    pub max_stderr: Option<u64>,
    pub tap: Option<crate::limits::output::OutputTap>,
}

/// A host directory the guest sees at `guest`.
pub(super) struct Preopen {
    pub host: PathBuf,
    pub guest: String,
    pub perms: FsPerms,
}

/// The store's data: the WASI context and the per-run limits.
pub(crate) struct GuestState {
    pub(super) wasi: WasiP1Ctx,
    limits: MemoryLimits,
    controls: Arc<RunControls>,
    clock_start: Instant,
}

/// The limits of a run that the host may set while the guest is already
/// running: a warm instance gets its deadline and memory cap only when its
/// code arrives.
pub(super) struct RunControls {
    deadline: Mutex<Deadline>,
    /// Wakes a guest sleeping in `poll_oneoff` when the deadline moves
    /// (a killed session's is moved to now).
    moved: Condvar,
    memory_cap: AtomicUsize,
    /// Largest linear memory so far.
    peak: AtomicUsize,
    /// Memory was refused since the last [`RunControls::arm`].
    denied: AtomicBool,
}

impl RunControls {
    pub fn new(deadline: Deadline, memory_cap: usize) -> Arc<Self> {
        Arc::new(Self {
            deadline: Mutex::new(deadline),
            moved: Condvar::new(),
            memory_cap: AtomicUsize::new(memory_cap),
            peak: AtomicUsize::new(0),
            denied: AtomicBool::new(false),
        })
    }

    pub fn deadline(&self) -> Deadline {
        *self.deadline.lock()
    }

    /// Starts the run's clock and sets its memory cap.
    pub fn arm(&self, deadline: Deadline, memory_cap: usize) {
        *self.deadline.lock() = deadline;
        self.memory_cap.store(memory_cap, Ordering::SeqCst);
        self.denied.store(false, Ordering::SeqCst);
        self.moved.notify_all();
    }

    /// Moves the deadline to now: the guest stops at its next epoch tick,
    /// and a guest sleeping in `poll_oneoff` wakes and stops at once.
    pub fn expire_now(&self) {
        *self.deadline.lock() = Deadline::start(Some(Duration::ZERO));
        self.moved.notify_all();
    }

    /// Sleeps for `wait`, or until the deadline if that comes first
    /// (true: the deadline was reached). Wakes when the deadline moves.
    fn sleep(&self, wait: Duration) -> bool {
        let until = Instant::now() + wait;
        let mut deadline = self.deadline.lock();
        loop {
            if deadline.expired() {
                return true;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let step = deadline.remaining().map_or(left, |d| d.min(left));
            self.moved.wait_for(&mut deadline, step);
        }
    }

    /// True if memory (or a table) was refused since the last `arm`.
    pub fn denied(&self) -> bool {
        self.denied.load(Ordering::SeqCst)
    }

    /// Largest linear memory so far, in bytes.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }
}

/// Caps linear memory and tables per store and remembers whether the guest
/// was refused memory, so a failure after that reads as `out_of_memory`.
struct MemoryLimits {
    controls: Arc<RunControls>,
    table_elements: usize,
    denied: bool,
}

impl ResourceLimiter for MemoryLimits {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.controls.memory_cap.load(Ordering::SeqCst) {
            self.denied = true;
            self.controls.denied.store(true, Ordering::SeqCst);
            return Ok(false); // the guest's memory.grow returns -1
        }
        self.controls.peak.fetch_max(desired, Ordering::SeqCst);
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.table_elements {
            self.denied = true;
            self.controls.denied.store(true, Ordering::SeqCst);
            return Ok(false);
        }
        Ok(true)
    }

    fn instances(&self) -> usize {
        1
    }

    fn memories(&self) -> usize {
        1
    }

    fn tables(&self) -> usize {
        8
    }
}

/// The guest's monotonic clock, started with the run, so the poll guard can
/// turn an absolute guest time into a wait.
struct GuestClock(Instant);

impl HostMonotonicClock for GuestClock {
    fn resolution(&self) -> u64 {
        1
    }

    fn now(&self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// The host error that ends a run whose guest sleeps past its deadline.
#[derive(Debug)]
struct DeadlineReached;

impl std::fmt::Display for DeadlineReached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("deadline reached while the guest slept")
    }
}

impl std::error::Error for DeadlineReached {}

/// WASI preview 1, with execbox's own `poll_oneoff`, and its own
/// `path_open`, `path_symlink`, `path_rename` and `path_link` (see `fs_guard.rs`).
///
/// Epoch interruption only fires in wasm code, and wasmtime-wasi's
/// `poll_oneoff` sleeps on the host thread: `sleep(3600)` would hold the
/// caller for an hour. This replacement never sleeps past the deadline (it
/// sleeps until the deadline and stops the run as `timed_out`). Every file
/// descriptor here is always ready (stdin is in memory, files are local,
/// output is buffered), so a poll with any fd subscription returns at once,
/// reporting the fds and any clock already due, as wasmtime-wasi would.
pub(super) fn linker(engine: &Engine) -> wasmtime::Result<Linker<GuestState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |s: &mut GuestState| &mut s.wasi)?;
    linker.allow_shadowing(true);
    linker.func_wrap("wasi_snapshot_preview1", "poll_oneoff", poll_oneoff)?;
    linker.func_wrap("wasi_snapshot_preview1", "path_open", fs_guard::path_open)?;
    linker.func_wrap("wasi_snapshot_preview1", "path_symlink", fs_guard::path_symlink)?;
    linker.func_wrap("wasi_snapshot_preview1", "path_rename", fs_guard::path_rename)?;
    linker.func_wrap("wasi_snapshot_preview1", "path_link", fs_guard::path_link)?;
    linker.allow_shadowing(false);
    Ok(linker)
}

/// WASI preview-1 errno values used here.
const ERRNO_SUCCESS: i32 = 0;
const ERRNO_FAULT: i32 = 21;
const ERRNO_INVAL: i32 = 28;

fn poll_oneoff(
    mut caller: Caller<'_, GuestState>,
    subs: i32,
    events: i32,
    n: i32,
    nevents: i32,
) -> wasmtime::Result<i32> {
    const SUB_SIZE: usize = 48; // sizeof(subscription)
    const EVENT_SIZE: usize = 32; // sizeof(event)
    const ABSTIME: u16 = 1;
    let Some(memory) = caller.get_export("memory").and_then(|e| e.into_memory()) else {
        return Ok(ERRNO_FAULT);
    };
    let n = n as u32 as usize;
    if n == 0 {
        return Ok(ERRNO_INVAL);
    }
    let mut raw = vec![0u8; n.saturating_mul(SUB_SIZE).min(1 << 20)];
    if raw.len() != n * SUB_SIZE || memory.read(&caller, subs as u32 as usize, &mut raw).is_err() {
        return Ok(ERRNO_FAULT);
    }

    // Each subscription: (userdata, event type, time until due; fds are due now).
    let guest_now = caller.data().clock_start.elapsed();
    let wall_now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let mut pending = Vec::with_capacity(n);
    for sub in raw.chunks_exact(SUB_SIZE) {
        let le_u64 = |at: usize| u64::from_le_bytes(sub[at..at + 8].try_into().unwrap_or([0; 8]));
        let userdata = le_u64(0);
        let tag = sub[8];
        let due = if tag == 0 {
            let clock_id = u32::from_le_bytes(sub[16..20].try_into().unwrap_or([0; 4]));
            let timeout = Duration::from_nanos(le_u64(24));
            let flags = u16::from_le_bytes([sub[40], sub[41]]);
            match (flags & ABSTIME != 0, clock_id) {
                (false, _) => timeout,
                (true, 0) => timeout.saturating_sub(wall_now),
                (true, 1) => timeout.saturating_sub(guest_now),
                (true, _) => Duration::ZERO,
            }
        } else {
            Duration::ZERO
        };
        pending.push((userdata, tag, due));
    }

    let wait = pending.iter().map(|&(_, _, due)| due).min().unwrap_or_default();
    if !wait.is_zero() && caller.data().controls.sleep(wait) {
        return Err(wasmtime::Error::new(DeadlineReached));
    }

    let mut count = 0u32;
    for &(userdata, tag, due) in &pending {
        if due > wait {
            continue;
        }
        let mut event = [0u8; EVENT_SIZE];
        event[0..8].copy_from_slice(&userdata.to_le_bytes());
        event[10] = tag; // event type mirrors the subscription tag
        if tag != 0 {
            event[16..24].copy_from_slice(&1u64.to_le_bytes()); // nbytes, as wasmtime-wasi reports
        }
        let at = (events as u32 as usize).saturating_add(count as usize * EVENT_SIZE);
        if memory.write(&mut caller, at, &event).is_err() {
            return Ok(ERRNO_FAULT);
        }
        count += 1;
    }
    if memory.write(&mut caller, nevents as u32 as usize, &count.to_le_bytes()).is_err() {
        return Ok(ERRNO_FAULT);
    }
    Ok(ERRNO_SUCCESS)
}

/// Runs `compiled` under `job`'s limits, as `backend`, within `deadline`
/// (started by the caller, before the module was looked up or compiled).
pub(super) fn run(
    engine: &WasmEngine,
    backend: &str,
    compiled: &Compiled,
    mut job: Job,
    deadline: Deadline,
) -> Result<ExecResult, ExecError> {
    let stdio = Stdio {
        stdout: CappedPipe::new(job.max_stdout).with_tap(job.tap.clone(), StreamKind::Stdout),
        stderr: CappedPipe::new(job.max_stderr).with_tap(job.tap.clone(), StreamKind::Stderr),
    };
    // A command reads the input on stdin; a JSON-ABI guest gets it through `alloc`/`run`.
    let stdin = match compiled.abi {
        GuestAbi::Command => std::mem::take(&mut job.guest_input),
        GuestAbi::JsonAbi { .. } => Vec::new(),
    };
    run_with(engine, backend, compiled, job, MemoryInputPipe::new(stdin), stdio, deadline)
}

/// [`run`] with the streams made by the caller (QuickJS taps its stdout).
pub(super) fn run_with(
    engine: &WasmEngine,
    backend: &str,
    compiled: &Compiled,
    job: Job,
    stdin: MemoryInputPipe,
    stdio: Stdio,
    deadline: Deadline,
) -> Result<ExecResult, ExecError> {
    // Declared first, so it is given back after the store is gone.
    let _slot: SlotPermit = engine.acquire_slot(&deadline, backend)?;
    let controls = RunControls::new(deadline, job.memory_cap);
    let setup = StoreSetup { args: &job.args, env: &job.env, preopens: &job.preopens, fuel: job.fuel };
    let mut store = new_store(engine, compiled.abi, stdin, &stdio, &setup, controls)?;
    let ticker = engine.ticker();
    store.set_epoch_deadline(deadline.remaining().map_or(u64::MAX / 2, |left| ticker.ticks_for(left)));
    // Epoch ticks only say when to look: the clock decides. A tick that
    // lands early (ticks owed from before this run, applied at once) never
    // stops the guest before its deadline.
    let tick = ticker.tick();
    store.epoch_deadline_callback(move |ctx| match ctx.data().controls.deadline().remaining() {
        Some(left) if left.is_zero() => Err(wasmtime::Error::new(DeadlineReached)),
        Some(left) => Ok(wasmtime::UpdateDeadline::Continue(ticks_for(tick, left))),
        None => Ok(wasmtime::UpdateDeadline::Continue(u64::MAX / 2)),
    });
    let _ticking = deadline.limit().map(|_| ticker.run_guard());

    let verdict = match instantiate(backend, compiled, &mut store)? {
        Err(err) => Err(err),
        Ok(instance) => match compiled.abi {
            GuestAbi::Command => call_start(&mut store, instance),
            GuestAbi::JsonAbi { initialize } => call_json_abi(&mut store, instance, initialize, &job),
        },
    };
    Ok(finish(engine, backend, &mut store, verdict, &stdio, job.fuel))
}

/// For a store whose deadline is set later ([`RunControls::arm`]): at every
/// epoch tick, stop the guest once the armed deadline has passed.
pub(super) fn stop_at_armed_deadline(store: &mut Store<GuestState>) {
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(|ctx| {
        if ctx.data().controls.deadline().expired() {
            Err(wasmtime::Error::new(DeadlineReached))
        } else {
            Ok(wasmtime::UpdateDeadline::Continue(1))
        }
    });
}

/// A run's capped output streams.
pub(super) struct Stdio {
    pub stdout: CappedPipe,
    pub stderr: CappedPipe,
}

/// What a store is built with, besides its streams and controls.
pub(super) struct StoreSetup<'a> {
    pub args: &'a [String],
    pub env: &'a [(String, String)],
    pub preopens: &'a [Preopen],
    /// Fuel for the store (`None`: unlimited, if the engine meters at all).
    pub fuel: Option<u64>,
}

/// A store with the WASI context, limiter and fuel of one run. The epoch
/// deadline is the caller's to set.
pub(super) fn new_store(
    engine: &WasmEngine,
    abi: GuestAbi,
    stdin: impl wasmtime_wasi::cli::StdinStream + 'static,
    stdio: &Stdio,
    setup: &StoreSetup<'_>,
    controls: Arc<RunControls>,
) -> Result<Store<GuestState>, ExecError> {
    let clock_start = Instant::now();
    let mut wasi = WasiCtxBuilder::new();
    wasi.stdout(stdio.stdout.clone())
        .stderr(stdio.stderr.clone())
        .allow_blocking_current_thread(true)
        .monotonic_clock(GuestClock(clock_start));
    if abi == GuestAbi::Command {
        wasi.stdin(stdin);
    }
    let argv: Vec<&str> = std::iter::once("guest.wasm").chain(setup.args.iter().map(String::as_str)).collect();
    wasi.args(&argv);
    for (name, value) in setup.env {
        wasi.env(name, value);
    }
    for p in setup.preopens {
        wasi.preopened_dir(&p.host, &p.guest, p.perms)
            .map_err(|e| InvalidRequest::BadPath { path: p.host.display().to_string(), reason: format!("{e:#}") })?;
    }
    let cfg = engine.config();
    let state = GuestState {
        wasi: wasi.build_p1(),
        limits: MemoryLimits { controls: controls.clone(), table_elements: cfg.max_table_elements, denied: false },
        controls,
        clock_start,
    };
    let mut store = Store::new(engine.engine(), state);
    store.limiter(|s| &mut s.limits);
    if cfg.consume_fuel {
        store.set_fuel(setup.fuel.unwrap_or(u64::MAX)).map_err(|e| ExecError::internal("wasm", format!("{e:#}")))?;
    }
    Ok(store)
}

/// Instantiates from the pool, any failure being the run's (inner) error.
/// The caller holds a slot ([`WasmEngine::acquire_slot`]), so the pool is
/// never full here; if it is anyway (a slot freed late), the run is refused
/// as [`ExecError::Busy`] before any guest code ran.
pub(super) fn instantiate(
    backend: &str,
    compiled: &Compiled,
    store: &mut Store<GuestState>,
) -> Result<wasmtime::Result<wasmtime::Instance>, ExecError> {
    match compiled.pre.instantiate(store) {
        Err(err) if err.is::<wasmtime::PoolConcurrencyLimitError>() => {
            Err(ExecError::Busy { backend: backend.into(), reason: format!("the wasm instance pool is full: {err:#}") })
        }
        other => Ok(other),
    }
}

/// The result of a finished run. `fuel` is the budget the store started
/// with (`None`: unlimited), for the usage figure.
pub(super) fn finish(
    engine: &WasmEngine,
    backend: &str,
    store: &mut Store<GuestState>,
    verdict: wasmtime::Result<Finished>,
    stdio: &Stdio,
    fuel: Option<u64>,
) -> ExecResult {
    let state = store.data();
    let deadline = state.controls.deadline();
    let mut output_truncated = false;
    let (outcome, exit_code, output, message) = match verdict {
        Ok(Finished::Exited(code)) => (Outcome::Ok, Some(code), None, None),
        Ok(Finished::Returned(value)) => (Outcome::Ok, None, Some(value), None),
        Ok(Finished::Refused(why)) => (Outcome::Failed, None, None, Some(why)),
        Ok(Finished::OverCap(max)) => {
            // What `result_caps::cap_result` decides for every backend.
            output_truncated = true;
            let why = format!("the returned value is over the output cap of {max} bytes (max_stdout_bytes)");
            (Outcome::Failed, None, None, Some(why))
        }
        Err(err) => classify(&err, state, &deadline),
    };
    let peak = state.controls.peak() as u64;
    // Compiled code keeps the fuel counter in a register and an interrupt
    // does not write it back: after a timeout the store's figure is stale.
    let fuel_budget = fuel.unwrap_or(u64::MAX);
    let fuel = (engine.config().consume_fuel && outcome != Outcome::TimedOut)
        .then(|| fuel_budget.saturating_sub(store.get_fuel().unwrap_or(0)));
    let mut result = ExecResult::new(backend, outcome);
    result.exit_code = exit_code;
    result.stdout = stdio.stdout.take_captured();
    result.stderr = stdio.stderr.take_captured();
    result.output = output;
    result.output_truncated = output_truncated;
    result.message = message;
    result.usage.duration = deadline.elapsed();
    result.usage.fuel = fuel;
    result.usage.peak_memory_bytes = Some(peak);
    result
}

/// How a guest finished without a trap.
pub(super) enum Finished {
    /// A command returned from `_start` (0) or called `proc_exit(0)`.
    Exited(i32),
    /// A JSON-ABI guest returned this document.
    Returned(serde_json::Value),
    /// A JSON-ABI guest broke the ABI (bad pointer, invalid JSON...).
    Refused(String),
    /// A JSON-ABI guest returned more than `max_stdout_bytes` (the cap).
    OverCap(u64),
}

pub(super) fn call_start(store: &mut Store<GuestState>, instance: wasmtime::Instance) -> wasmtime::Result<Finished> {
    let start = instance.get_typed_func::<(), ()>(&mut *store, "_start")?;
    match start.call(&mut *store, ()) {
        Ok(()) => Ok(Finished::Exited(0)),
        Err(err) => match err.downcast_ref::<I32Exit>() {
            Some(I32Exit(0)) => Ok(Finished::Exited(0)),
            _ => Err(err),
        },
    }
}

/// The JSON ABI: `ptr = alloc(len)`, the input written at `ptr`, then
/// `run(ptr, len)` returns `(out_ptr << 32) | out_len` of UTF-8 JSON.
fn call_json_abi(
    store: &mut Store<GuestState>,
    instance: wasmtime::Instance,
    initialize: bool,
    job: &Job,
) -> wasmtime::Result<Finished> {
    if initialize {
        instance.get_typed_func::<(), ()>(&mut *store, "_initialize")?.call(&mut *store, ())?;
    }
    let alloc = instance.get_typed_func::<i32, i32>(&mut *store, "alloc")?;
    let run = instance.get_typed_func::<(i32, i32), i64>(&mut *store, "run")?;
    let memory =
        instance.get_memory(&mut *store, "memory").ok_or_else(|| wasmtime::format_err!("no exported memory"))?;
    let input = &job.guest_input;
    let Ok(len) = i32::try_from(input.len()) else {
        return Ok(Finished::Refused(format!("input of {} bytes is too large for a 32-bit guest", input.len())));
    };
    let ptr = alloc.call(&mut *store, len)?;
    if memory.write(&mut *store, ptr as u32 as usize, input).is_err() {
        return Ok(Finished::Refused(format!("alloc({len}) returned {ptr:#x}, outside the guest's memory")));
    }
    let packed = run.call(&mut *store, (ptr, len))? as u64;
    let (out_ptr, out_len) = ((packed >> 32) as usize, (packed & 0xffff_ffff) as usize);
    if let Some(max) = job.max_stdout
        && out_len as u64 > max
    {
        return Ok(Finished::OverCap(max));
    }
    let Some(bytes) = memory.data(&*store).get(out_ptr..out_ptr.saturating_add(out_len)) else {
        return Ok(Finished::Refused(format!(
            "run returned {out_len} bytes at {out_ptr:#x}, outside the guest's memory"
        )));
    };
    Ok(match serde_json::from_slice(bytes) {
        Ok(value) => Finished::Returned(value),
        Err(e) => Finished::Refused(format!("output is not valid JSON: {e}")),
    })
}

/// Maps the engine's error to an outcome, exit code and message.
fn classify(
    err: &wasmtime::Error,
    state: &GuestState,
    deadline: &Deadline,
) -> (Outcome, Option<i32>, Option<serde_json::Value>, Option<String>) {
    let exit_code = err.downcast_ref::<I32Exit>().map(|e| e.0);
    let trap = err.downcast_ref::<Trap>();
    if err.is::<DeadlineReached>() || trap == Some(&Trap::Interrupt) {
        return (Outcome::TimedOut, None, None, Some(deadline.exceeded_message()));
    }
    if trap == Some(&Trap::OutOfFuel) {
        return (Outcome::OutOfFuel, None, None, Some("fuel budget exhausted".into()));
    }
    let what = match (exit_code, trap) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(Trap::StackOverflow)) => "call stack exhausted (recursion too deep)".to_string(),
        (None, Some(trap)) => format!("wasm trap: {trap}"),
        // Not a trap: an instantiation or host error; its root cause is the message.
        (None, None) => err.root_cause().to_string(),
    };
    if state.limits.denied {
        let cap = state.controls.memory_cap.load(Ordering::SeqCst);
        let message = format!("memory limit of {cap} bytes reached, then {what}");
        return (Outcome::OutOfMemory, exit_code, None, Some(message));
    }
    (Outcome::Failed, exit_code, None, Some(what))
}
