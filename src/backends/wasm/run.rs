//! One guest run: a fresh WASI context and store around a cached
//! [`InstancePre`](wasmtime::InstancePre), the policy's limits applied to the
//! store, and the engine's verdict mapped to an [`Outcome`].

use std::sync::Arc;
use std::time::Instant;

use wasmtime::{Instance, Memory, Store, Trap, TypedFunc, UpdateDeadline};
use wasmtime_wasi::p2::pipe::MemoryInputPipe;
use wasmtime_wasi::{HostMonotonicClock, I32Exit, WasiCtxBuilder};

use super::engine::{SlotPermit, WasmEngine};
use super::guest::{Compiled, GuestAbi, GuestState, MemoryLimits, Preopen, RunControls};
use super::linker::DeadlineReached;
use super::stdio::CappedPipe;
use super::ticker::ticks_for;
use crate::error::{ExecError, InvalidRequest};
use crate::limits::deadline::Deadline;
use crate::limits::output::StreamKind;
use crate::result::{ExecResult, Outcome};
use crate::tools::ToolBridge;

/// A result decided before the guest ran (its module could not start, or
/// its deadline passed while compiling or loading).
pub(crate) fn early_result(backend: &str, outcome: Outcome, message: String, deadline: &Deadline) -> ExecResult {
    let mut result = ExecResult::new(backend, outcome);
    result.message = Some(message);
    result.usage.duration = deadline.elapsed();
    result
}

/// Everything one run needs, taken from the request.
pub(crate) struct Job {
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
    /// The run's tool bridge, for a guest's `execbox_tools` import.
    pub tools: Option<Arc<ToolBridge>>,
}

impl Job {
    /// What a store of this job is built from.
    fn store_setup(&self) -> StoreSetup<'_> {
        StoreSetup {
            args: &self.args,
            env: &self.env,
            preopens: &self.preopens,
            fuel: self.fuel,
            tools: self.tools.clone(),
        }
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

/// Runs `compiled` under `job`'s limits, as `backend`, within `deadline`
/// (started by the caller, before the module was looked up or compiled).
pub(crate) fn run(
    engine: &WasmEngine,
    backend: &str,
    compiled: &Compiled,
    mut job: Job,
    deadline: Deadline,
) -> Result<ExecResult, ExecError> {
    let (stdin, stdio) = streams(compiled.abi, &mut job);
    run_with(engine, backend, compiled, job, MemoryInputPipe::new(stdin), stdio, deadline)
}

/// A job's stdin bytes and capped output streams. A command reads the input
/// on stdin; a JSON-ABI guest gets it through `alloc`/`run`.
fn streams(abi: GuestAbi, job: &mut Job) -> (Vec<u8>, Stdio) {
    let stdio = Stdio {
        stdout: CappedPipe::new(job.max_stdout).with_tap(job.tap.clone(), StreamKind::Stdout),
        stderr: CappedPipe::new(job.max_stderr).with_tap(job.tap.clone(), StreamKind::Stderr),
    };
    let stdin = match abi {
        GuestAbi::Command => std::mem::take(&mut job.guest_input),
        GuestAbi::JsonAbi { .. } => Vec::new(),
    };
    (stdin, stdio)
}

/// [`run`] on the caller's async task, holding `slot` (taken without
/// waiting: a run that would wait for one goes to the blocking pool). The
/// guest yields to the runtime at every epoch tick and stops at the first
/// tick past its deadline; its sleeps and tool calls await (see
/// [`linker_async`](super::linker::linker_async)). Every other limit is the
/// same as [`run`]'s. Dropping the future ends the run where it is
/// (wasmtime unwinds the guest's stack): the store goes, then the slot.
pub(crate) async fn run_async(
    engine: &WasmEngine,
    backend: &str,
    compiled: &Compiled,
    mut job: Job,
    deadline: Deadline,
    slot: SlotPermit,
) -> Result<ExecResult, ExecError> {
    // Declared first, so it is given back after the store is gone.
    let _slot = slot;
    let (stdin, stdio) = streams(compiled.abi, &mut job);
    let controls = RunControls::new(deadline, job.memory_cap);
    let setup = job.store_setup();
    let mut store =
        new_store_with(engine, compiled.abi, MemoryInputPipe::new(stdin), &stdio, &setup, controls, Blocking::Never)?;
    // Every tick: the deadline, then a yield to the runtime. The deadline
    // of a run here never moves, so the callback keeps its own copy.
    store.set_epoch_deadline(1);
    store.epoch_deadline_callback(move |_| {
        if deadline.expired() {
            return Err(wasmtime::Error::new(DeadlineReached));
        }
        // tokio's yield lets the runtime poll its timers and I/O before it
        // resumes this task (a self-wake would not, on a busy runtime), and
        // outside tokio it is a plain yield.
        Ok(UpdateDeadline::YieldCustom(1, Box::pin(tokio::task::yield_now())))
    });
    let _ticking = engine.ticker().run_guard();

    let verdict = match pool_full(backend, compiled.pre_async.instantiate_async(&mut store).await)? {
        Err(err) => Err(err),
        Ok(instance) => match compiled.abi {
            GuestAbi::Command => {
                let start = instance.get_typed_func::<(), ()>(&mut store, "_start");
                match start {
                    Ok(start) => exited(start.call_async(&mut store, ()).await),
                    Err(err) => Err(err),
                }
            }
            GuestAbi::JsonAbi { initialize } => call_json_abi_async(&mut store, instance, initialize, &job).await,
        },
    };
    Ok(finish(engine, backend, &mut store, verdict, &stdio, job.fuel))
}

/// [`run`] with the streams made by the caller (QuickJS taps its stdout; an
/// interpreter that calls tools reads their answers from a message stdin).
pub(crate) fn run_with(
    engine: &WasmEngine,
    backend: &str,
    compiled: &Compiled,
    job: Job,
    stdin: impl wasmtime_wasi::cli::StdinStream + 'static,
    stdio: Stdio,
    deadline: Deadline,
) -> Result<ExecResult, ExecError> {
    // Declared first, so it is given back after the store is gone.
    let _slot: SlotPermit = engine.acquire_slot(&deadline, backend)?;
    let controls = RunControls::new(deadline, job.memory_cap);
    let setup = job.store_setup();
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
pub(crate) fn stop_at_armed_deadline(store: &mut Store<GuestState>) {
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
pub(crate) struct Stdio {
    pub stdout: CappedPipe,
    pub stderr: CappedPipe,
}

/// What a store is built with, besides its streams and controls.
pub(crate) struct StoreSetup<'a> {
    pub args: &'a [String],
    pub env: &'a [(String, String)],
    pub preopens: &'a [Preopen],
    /// Fuel for the store (`None`: unlimited, if the engine meters at all).
    pub fuel: Option<u64>,
    /// The tool bridge of the `execbox_tools` import.
    pub tools: Option<Arc<ToolBridge>>,
}

/// A store with the WASI context, limiter and fuel of one run, for the
/// synchronous API. The epoch deadline is the caller's to set.
pub(crate) fn new_store(
    engine: &WasmEngine,
    abi: GuestAbi,
    stdin: impl wasmtime_wasi::cli::StdinStream + 'static,
    stdio: &Stdio,
    setup: &StoreSetup<'_>,
    controls: Arc<RunControls>,
) -> Result<Store<GuestState>, ExecError> {
    new_store_with(engine, abi, stdin, stdio, setup, controls, Blocking::Allowed)
}

/// Whether a store's file operations may block the thread it runs on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Blocking {
    /// A thread of its own, or tokio's blocking pool: inline.
    Allowed,
    /// An async task: each goes to tokio's blocking pool.
    Never,
}

fn new_store_with(
    engine: &WasmEngine,
    abi: GuestAbi,
    stdin: impl wasmtime_wasi::cli::StdinStream + 'static,
    stdio: &Stdio,
    setup: &StoreSetup<'_>,
    controls: Arc<RunControls>,
    blocking: Blocking,
) -> Result<Store<GuestState>, ExecError> {
    let clock_start = Instant::now();
    let mut wasi = WasiCtxBuilder::new();
    wasi.stdout(stdio.stdout.clone())
        .stderr(stdio.stderr.clone())
        .allow_blocking_current_thread(blocking == Blocking::Allowed)
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
        limits: MemoryLimits::new(controls.clone(), cfg.max_table_elements),
        controls,
        clock_start,
        tools: setup.tools.clone(),
        tool_answer: Vec::new(),
        alarms: engine.ticker().alarms().clone(),
    };
    let mut store = Store::new(engine.engine(), state);
    store.limiter(|s| &mut s.limits);
    if cfg.consume_fuel {
        store
            .set_fuel(setup.fuel.unwrap_or(u64::MAX))
            .map_err(|e| ExecError::internal_caused("wasm", "cannot set the fuel", e))?;
    }
    Ok(store)
}

/// Instantiates from the pool, any failure being the run's (inner) error.
/// The caller holds a slot ([`WasmEngine::acquire_slot`]), so the pool is
/// never full here; if it is anyway (a slot freed late), the run is refused
/// as [`ExecError::Busy`] before any guest code ran.
pub(crate) fn instantiate(
    backend: &str,
    compiled: &Compiled,
    store: &mut Store<GuestState>,
) -> Result<wasmtime::Result<wasmtime::Instance>, ExecError> {
    pool_full(backend, compiled.pre.instantiate(store))
}

/// A full pool as [`ExecError::Busy`]; any other outcome as the run's.
fn pool_full(backend: &str, instantiated: wasmtime::Result<Instance>) -> Result<wasmtime::Result<Instance>, ExecError> {
    match instantiated {
        Err(err) if err.is::<wasmtime::PoolConcurrencyLimitError>() => {
            Err(ExecError::Busy { backend: backend.into(), reason: format!("the wasm instance pool is full: {err:#}") })
        }
        other => Ok(other),
    }
}

/// The result of a finished run. `fuel` is the budget the store started
/// with (`None`: unlimited), for the usage figure.
pub(crate) fn finish(
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
pub(crate) enum Finished {
    /// A command returned from `_start` (0) or called `proc_exit(0)`.
    Exited(i32),
    /// A JSON-ABI guest returned this document.
    Returned(serde_json::Value),
    /// A JSON-ABI guest broke the ABI (bad pointer, invalid JSON...).
    Refused(String),
    /// A JSON-ABI guest returned more than `max_stdout_bytes` (the cap).
    OverCap(u64),
}

pub(crate) fn call_start(store: &mut Store<GuestState>, instance: wasmtime::Instance) -> wasmtime::Result<Finished> {
    let start = instance.get_typed_func::<(), ()>(&mut *store, "_start")?;
    exited(start.call(&mut *store, ()))
}

/// How `_start` ended: returning, or `proc_exit(0)`, is exit code 0.
fn exited(started: wasmtime::Result<()>) -> wasmtime::Result<Finished> {
    match started {
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
    let abi = JsonAbi::of(store, instance)?;
    let len = match abi.input_len(&job.guest_input) {
        Ok(len) => len,
        Err(refused) => return Ok(refused),
    };
    let ptr = abi.alloc.call(&mut *store, len)?;
    if let Some(refused) = abi.write_input(store, ptr, len, &job.guest_input) {
        return Ok(refused);
    }
    let packed = abi.run.call(&mut *store, (ptr, len))?;
    Ok(abi.read_output(store, packed, job.max_stdout))
}

/// [`call_json_abi`] with the async API.
async fn call_json_abi_async(
    store: &mut Store<GuestState>,
    instance: wasmtime::Instance,
    initialize: bool,
    job: &Job,
) -> wasmtime::Result<Finished> {
    if initialize {
        instance.get_typed_func::<(), ()>(&mut *store, "_initialize")?.call_async(&mut *store, ()).await?;
    }
    let abi = JsonAbi::of(store, instance)?;
    let len = match abi.input_len(&job.guest_input) {
        Ok(len) => len,
        Err(refused) => return Ok(refused),
    };
    let ptr = abi.alloc.call_async(&mut *store, len).await?;
    if let Some(refused) = abi.write_input(store, ptr, len, &job.guest_input) {
        return Ok(refused);
    }
    let packed = abi.run.call_async(&mut *store, (ptr, len)).await?;
    Ok(abi.read_output(store, packed, job.max_stdout))
}

/// A JSON-ABI guest's exports.
struct JsonAbi {
    alloc: TypedFunc<i32, i32>,
    run: TypedFunc<(i32, i32), i64>,
    memory: Memory,
}

impl JsonAbi {
    fn of(store: &mut Store<GuestState>, instance: wasmtime::Instance) -> wasmtime::Result<Self> {
        let alloc = instance.get_typed_func::<i32, i32>(&mut *store, "alloc")?;
        let run = instance.get_typed_func::<(i32, i32), i64>(&mut *store, "run")?;
        let memory =
            instance.get_memory(&mut *store, "memory").ok_or_else(|| wasmtime::format_err!("no exported memory"))?;
        Ok(Self { alloc, run, memory })
    }

    /// The input's length as the guest's `i32`.
    fn input_len(&self, input: &[u8]) -> Result<i32, Finished> {
        i32::try_from(input.len())
            .map_err(|_| Finished::Refused(format!("input of {} bytes is too large for a 32-bit guest", input.len())))
    }

    /// Writes `input` where `alloc(len)` returned `ptr`; `Some` when that is
    /// outside the guest's memory.
    fn write_input(&self, store: &mut Store<GuestState>, ptr: i32, len: i32, input: &[u8]) -> Option<Finished> {
        self.memory
            .write(&mut *store, ptr as u32 as usize, input)
            .is_err()
            .then(|| Finished::Refused(format!("alloc({len}) returned {ptr:#x}, outside the guest's memory")))
    }

    /// The document `run` returned as `packed`, held to `max_stdout`.
    fn read_output(&self, store: &Store<GuestState>, packed: i64, max_stdout: Option<u64>) -> Finished {
        let packed = packed as u64;
        let (out_ptr, out_len) = ((packed >> 32) as usize, (packed & 0xffff_ffff) as usize);
        if let Some(max) = max_stdout
            && out_len as u64 > max
        {
            return Finished::OverCap(max);
        }
        let Some(bytes) = self.memory.data(store).get(out_ptr..out_ptr.saturating_add(out_len)) else {
            return Finished::Refused(format!(
                "run returned {out_len} bytes at {out_ptr:#x}, outside the guest's memory"
            ));
        };
        match serde_json::from_slice(bytes) {
            Ok(value) => Finished::Returned(value),
            Err(e) => Finished::Refused(format!("output is not valid JSON: {e}")),
        }
    }
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
    if state.limits.denied() {
        let cap = state.controls.memory_cap();
        let message = format!("memory limit of {cap} bytes reached, then {what}");
        return (Outcome::OutOfMemory, exit_code, None, Some(message));
    }
    (Outcome::Failed, exit_code, None, Some(what))
}
