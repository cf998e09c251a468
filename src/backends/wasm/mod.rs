//! The `wasm` backend: WebAssembly guest modules in-process on wasmtime.
//!
//! Two guest ABIs, chosen from the module's exports:
//! - **WASI preview-1 commands** (`_start`): stdin from the request (or the
//!   JSON `input` when no stdin is given), argv, env only from the request's
//!   allow-listed values, capped stdout/stderr, exit code from `proc_exit`.
//! - **JSON ABI** reactors (`memory`, `alloc(len) -> ptr`,
//!   `run(ptr, len) -> (out_ptr << 32) | out_len`, optional `_initialize`):
//!   `input` goes in as UTF-8 JSON, the returned bytes must be UTF-8 JSON and
//!   become `output`. Such a guest may import WASI too (stderr for logs).
//!
//! What holds against a hostile guest:
//! - **compile**: static [`ModuleLimits`] (functions, body sizes, nesting,
//!   locals) checked with wasmparser before Cranelift sees the module; the
//!   compile counts against the run's deadline (see `compile.rs`).
//! - **fuel**: wasmtime fuel (≈1 unit per wasm instruction) → `out_of_fuel`.
//! - **deadline**: epoch interruption from one ticker thread per engine,
//!   preemptive in wasm code; `poll_oneoff` sleeps end at the deadline →
//!   `timed_out`. Every run has a deadline (the policy's, else
//!   [`WasmGuestConfig::default_timeout`]), started before its module is
//!   looked up or compiled.
//! - **memory**: a per-store [`ResourceLimiter`](wasmtime::ResourceLimiter):
//!   `memory.grow` past the cap returns -1 (the guest sees an allocation
//!   failure); a run that then fails is `out_of_memory`. Never a host abort.
//! - **files**: only preopened directories (cap-std's primitives inside
//!   wasmtime-wasi): `..` and symlinks cannot leave a preopen, read-only
//!   grants refuse writes; guests cannot create symlinks, and FIFOs, sockets
//!   and devices are refused at open (`fs_guard.rs`). **network**: WASI
//!   preview 1 cannot open sockets.
//! - **output**: stdout/stderr through the shared bounded buffer.
//!
//! Modules are compiled once per sha256 (memory cache, optional disk cache)
//! and kept as `InstancePre`; instances come from the pooling allocator of a
//! [`WasmEngine`] that the wasm backends of a matrix share.

mod compile;
pub(crate) mod compile_worker;
mod engine;
mod fs_guard;
pub mod interpreters;
mod module_limits;
mod quickjs;
mod run;
mod session;
mod stdio;
mod ticker;
mod warm;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use wasmtime_wasi::FsPerms;

pub use compile::CacheStats;
pub use engine::WasmEngine;
pub use interpreters::{Interpreter, WasmInterpreter};
pub use module_limits::ModuleLimits;
pub use session::PythonSession;

use crate::admission::Admitted;
use crate::backend::{Backend, may_block_here};
use crate::capabilities::{
    BackendCapabilities, CostClass, Enforcement, IsolationKind, PayloadKind, RequestFeatures, SurfaceCapability,
};
use crate::error::{ExecError, InvalidRequest};
use crate::language::Language;
use crate::limits::deadline::Deadline;
use crate::policy::Access;
use crate::request::ExecRequest;
use crate::result::{ExecResult, Outcome};

/// Where staged `input_files` appear inside the guest (read-only).
pub const INPUT_DIR: &str = "/input";

/// Settings of a [`WasmEngine`] and the wasm backends built on it.
#[derive(Clone, Debug)]
pub struct WasmGuestConfig {
    /// Ceiling on one guest's linear memory, whatever the policy asks (a
    /// policy's `memory_bytes` above it gets this much). Also the size of a
    /// pooled memory slot. A module whose declared initial memory exceeds it
    /// is `out_of_memory` before anything is compiled.
    ///
    /// # Default
    /// 1 GiB.
    pub max_memory_bytes: u64,
    /// Ceiling on table elements per table.
    ///
    /// # Default
    /// 100,000.
    pub max_table_elements: usize,
    /// Wasm stack per call (wasmtime's `max_wasm_stack`); deeper recursion traps.
    ///
    /// # Default
    /// 512 KiB.
    pub max_wasm_stack: usize,
    /// Instance slots of the pooling allocator, shared by every backend on
    /// the engine (warm interpreter instances hold one each). A run that
    /// finds them all busy waits for one until its deadline, then is refused
    /// as [`ExecError::Busy`]. `0` allocates on demand instead (slower, and
    /// concurrency is then unbounded). Each slot reserves address space
    /// (not memory) for a `max_memory_bytes` memory.
    ///
    /// # Default
    /// 32.
    pub pooled_instances: u32,
    /// Meter fuel. Required to honour a policy's `fuel`; costs ≈ 10–80% on
    /// tight loops (see the README's benchmark).
    ///
    /// # Default
    /// On.
    pub consume_fuel: bool,
    /// Epoch period: deadlines fire within two ticks after the limit.
    ///
    /// # Default
    /// 1 ms.
    pub epoch_tick: Duration,
    /// How long the ticker keeps ticking after the last run before it parks.
    ///
    /// # Default
    /// 250 ms.
    pub ticker_linger: Duration,
    /// Compiled modules kept in memory per backend (least recently used evicted).
    ///
    /// # Default
    /// 64.
    pub module_cache_entries: usize,
    /// Directory for serialized modules, reused across processes.
    ///
    /// # Default
    /// None (modules are kept in memory only).
    ///
    /// # Unsafety
    ///
    /// Loading a serialized module runs its machine code: wasmtime's
    /// `Module::deserialize` checks only a header, so anyone who can write an
    /// artifact into this directory can run arbitrary code in this process.
    /// execbox therefore trusts the directory only if it is owned by this
    /// process's effective user and not writable by group or others (a
    /// directory it creates is made `0700`; an existing one is checked, never
    /// chmodded, and refused otherwise when the backend is built), and loads
    /// an artifact only if the file itself passes the same check (opened
    /// without following symlinks). What remains the caller's duty: do not
    /// point it at a directory whose *parents* another user controls, or that
    /// this user's other, less trusted programs write.
    pub disk_cache_dir: Option<PathBuf>,
    /// Deepest JSON `input` accepted (serialization recurses).
    ///
    /// # Default
    /// 128.
    pub max_input_nesting: usize,
    /// Deadline of a run whose policy states none: no guest runs unbounded.
    ///
    /// # Default
    /// 30 s.
    pub default_timeout: Duration,
    /// Static limits on untrusted modules, checked before compiling.
    ///
    /// # Default
    /// [`ModuleLimits::default`].
    pub module_limits: ModuleLimits,
    /// Compile untrusted modules in a worker process, killed at the run's
    /// deadline with its memory capped (see `compile_worker.rs`). Without a
    /// worker program (see [`crate::worker`]), or with `false`, they compile
    /// in this process, bounded by [`WasmGuestConfig::module_limits`] only.
    ///
    /// # Default
    /// `true`.
    pub compile_in_worker: bool,
    /// The program serving as compile worker; `None` finds one (see
    /// [`crate::worker`]).
    ///
    /// # Default
    /// `None`.
    pub worker_program: Option<PathBuf>,
    /// How much a compile worker may grow while compiling one module; a
    /// module that needs more is `out_of_memory`.
    ///
    /// # Default
    /// 1 GiB.
    pub max_compile_memory_bytes: u64,
}

impl Default for WasmGuestConfig {
    fn default() -> Self {
        Self {
            max_memory_bytes: 1 << 30,
            max_table_elements: 100_000,
            max_wasm_stack: 512 * 1024,
            pooled_instances: 32,
            consume_fuel: true,
            epoch_tick: Duration::from_millis(1),
            ticker_linger: Duration::from_millis(250),
            module_cache_entries: 64,
            disk_cache_dir: None,
            max_input_nesting: 128,
            default_timeout: Duration::from_secs(30),
            compile_in_worker: true,
            worker_program: None,
            max_compile_memory_bytes: 1 << 30,
            module_limits: ModuleLimits::default(),
        }
    }
}

/// In-process WebAssembly guests on a (possibly shared) [`WasmEngine`].
///
/// Cheap to share (`Executor` holds it in an `Arc`); dropping the last
/// handle on its engine stops the engine's epoch ticker thread.
pub struct WasmGuest {
    engine: Arc<WasmEngine>,
    cache: compile::ModuleCache,
    caps: BackendCapabilities,
}

impl WasmGuest {
    /// The backend's name in results and refusals.
    pub const NAME: &'static str = "wasm";

    /// A backend with [`WasmGuestConfig::default`] on an engine of its own.
    pub fn new() -> Result<Self, ExecError> {
        Self::with_config(WasmGuestConfig::default())
    }

    /// A backend with `cfg` on an engine of its own (≈5 ms to build: do it
    /// once; to share the engine with the interpreters, use
    /// [`WasmGuest::on_engine`]).
    pub fn with_config(cfg: WasmGuestConfig) -> Result<Self, ExecError> {
        Self::on_engine(WasmEngine::new(cfg)?)
    }

    /// A backend on `engine`, with a module cache of its own (in memory, and
    /// in the engine config's `disk_cache_dir` if set).
    pub fn on_engine(engine: Arc<WasmEngine>) -> Result<Self, ExecError> {
        let cfg = engine.config();
        let cache = compile::ModuleCache::new(&engine, cfg.module_cache_entries, cfg.disk_cache_dir.clone())
            .map_err(|e| ExecError::internal(Self::NAME, format!("cannot use the module cache directory: {e}")))?;
        let caps = capabilities(&engine);
        Ok(Self { engine, cache, caps })
    }

    /// The settings in use.
    pub fn config(&self) -> &WasmGuestConfig {
        self.engine.config()
    }

    /// The engine this backend runs on.
    pub fn engine(&self) -> &Arc<WasmEngine> {
        &self.engine
    }

    /// True when instances come from the pooling allocator (see
    /// [`WasmEngine::pooling_allocator`]).
    pub fn pooling_allocator(&self) -> bool {
        self.engine.pooling_allocator()
    }

    /// Module cache counters: a repeated module shows up as a hit, not a compile.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// Compiles (or finds) a module without running it, e.g. to warm the
    /// cache at start-up; fails like `execute` would on a bad module (a
    /// module too big to start, which `execute` reports as `out_of_memory`,
    /// is an invalid module here).
    pub fn precompile(&self, module: &[u8]) -> Result<(), ExecError> {
        match self.cache.get_untrusted(module, &self.config().module_limits, &self.ceilings(), &Deadline::start(None)) {
            Ok(_) => Ok(()),
            Err(compile::CompileRefusal::Invalid(e)) => Err(e.into()),
            Err(compile::CompileRefusal::TooBigToStart(reason)) => Err(InvalidRequest::InvalidModule { reason }.into()),
            Err(compile::CompileRefusal::DeadlinePassed) => {
                Err(ExecError::internal(Self::NAME, "no deadline, yet it passed"))
            }
        }
    }

    fn ceilings(&self) -> module_limits::Ceilings {
        let cfg = self.config();
        module_limits::Ceilings { memory_bytes: cfg.max_memory_bytes, table_elements: cfg.max_table_elements as u64 }
    }

    /// Runs on the current thread, which may block.
    fn execute_here(&self, mut call: Admitted) -> Result<ExecResult, ExecError> {
        // The clock started at admission: a compile counts against the
        // run's deadline and its duration.
        let deadline = call.deadline();
        let module = call.take_module(Self::NAME)?;
        let cfg = self.config();
        let input = call.take_input_json(cfg.max_input_nesting, Self::NAME)?;
        let mut request = call.into_request();
        let compiled = match self.cache.get_untrusted(&module, &cfg.module_limits, &self.ceilings(), &deadline) {
            Ok(compiled) => compiled,
            Err(compile::CompileRefusal::Invalid(e)) => return Err(e.into()),
            Err(compile::CompileRefusal::TooBigToStart(why)) => {
                return Ok(early_result(Self::NAME, Outcome::OutOfMemory, why, &deadline));
            }
            Err(compile::CompileRefusal::DeadlinePassed) => return Ok(compile_timed_out(Self::NAME, &deadline)),
        };
        drop(module);
        if deadline.expired() {
            return Ok(compile_timed_out(Self::NAME, &deadline));
        }

        let guest_input = match compiled.abi {
            compile::GuestAbi::Command => match (request.stdin.take(), input) {
                (Some(_), Some(_)) => {
                    return Err(InvalidRequest::Conflict(
                        "a WASI command gets `input` as JSON on stdin: give either stdin or input, not both",
                    )
                    .into());
                }
                (stdin, input) => input.or(stdin).unwrap_or_default(),
            },
            compile::GuestAbi::JsonAbi { .. } => input.unwrap_or_else(|| b"null".to_vec()),
        };

        let policy = &request.policy;
        let mut preopens = policy_preopens(policy)?;
        // Staged input files live in a temporary directory, removed when
        // this function returns whatever the outcome.
        let staged = stage_input_files(&request, None)?;
        if let Some(dir) = &staged {
            preopens.push(run::Preopen {
                host: dir.path().to_path_buf(),
                guest: INPUT_DIR.into(),
                perms: FsPerms::ReadOnly,
            });
        }

        let job = run::Job {
            guest_input,
            args: std::mem::take(&mut request.args),
            env: std::mem::take(&mut request.env).into_iter().collect(),
            preopens,
            fuel: policy.fuel,
            memory_cap: self.engine.memory_cap(policy),
            max_stdout: policy.max_stdout_bytes,
            max_stderr: policy.max_stderr_bytes,
            tap: request.output_tap.take(),
        };
        run::run(&self.engine, Self::NAME, &compiled, job, deadline)
    }
}

/// A result decided before the guest ran (its module could not start, or
/// its deadline passed while compiling or loading).
fn early_result(backend: &str, outcome: Outcome, message: String, deadline: &Deadline) -> ExecResult {
    let mut result = ExecResult::new(backend, outcome);
    result.message = Some(message);
    result.usage.duration = deadline.elapsed();
    result
}

/// `timed_out`: the deadline passed before the module was ready.
fn compile_timed_out(backend: &str, deadline: &Deadline) -> ExecResult {
    let message = format!("{} while compiling the module, before it ran", deadline.exceeded_message());
    early_result(backend, Outcome::TimedOut, message, deadline)
}

impl WasmEngine {
    /// The linear-memory cap of a run: the policy's, at most the ceiling.
    fn memory_cap(&self, policy: &crate::policy::SandboxPolicy) -> usize {
        let ceiling = self.config().max_memory_bytes;
        let cap = policy.memory_bytes.map_or(ceiling, |m| m.min(ceiling));
        usize::try_from(cap).unwrap_or(usize::MAX)
    }

    /// Runs `f` here if this thread may block, else on a scoped thread: on an
    /// async worker thread the sync WASI layer would try to block on a nested
    /// runtime and panic.
    fn on_blocking_thread<R: Send>(
        &self,
        backend: &str,
        f: impl FnOnce() -> Result<R, ExecError> + Send,
    ) -> Result<R, ExecError> {
        if may_block_here() {
            return f();
        }
        std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("execbox-wasm".into())
                .stack_size(self.config().max_wasm_stack + (2 << 20))
                .spawn_scoped(scope, f)
                .map_err(|e| ExecError::internal(backend, format!("cannot spawn: {e}")))?
                .join()
                .unwrap_or_else(|_| Err(ExecError::internal(backend, "guest thread panicked")))
        })
    }
}

/// The policy's granted directories as preopens (read-only or read-write).
fn policy_preopens(policy: &crate::policy::SandboxPolicy) -> Result<Vec<run::Preopen>, InvalidRequest> {
    let mut preopens = Vec::new();
    if let Access::Allow(grants) = &policy.filesystem {
        let modes = [(&grants.read_only, FsPerms::ReadOnly), (&grants.read_write, FsPerms::ReadWrite)];
        for (list, perms) in modes {
            for grant in list {
                let guest = grant.guest_path().to_str().ok_or_else(|| InvalidRequest::BadPath {
                    path: grant.guest_path().display().to_string(),
                    reason: "guest paths must be UTF-8".into(),
                })?;
                preopens.push(run::Preopen { host: grant.host.clone(), guest: guest.to_string(), perms });
            }
        }
    }
    fs_guard::refuse_blocking_mounts(&preopens)?;
    Ok(preopens)
}

/// Writes the request's input files (and `extra`, a named file of execbox's
/// own such as `input.json`) into a fresh temporary directory.
fn stage_input_files(
    request: &ExecRequest,
    extra: Option<(&str, &[u8])>,
) -> Result<Option<tempfile::TempDir>, ExecError> {
    if request.input_files.is_empty() && extra.is_none() {
        return Ok(None);
    }
    let dir = crate::backends::owner::temp_dir("input")
        .map_err(|e| InvalidRequest::BadPath { path: "<tempdir>".into(), reason: e.to_string() })?;
    write_staged(dir.path(), request, extra)?;
    Ok(Some(dir))
}

/// Writes the request's input files (and `extra`) under `dir`.
fn write_staged(dir: &std::path::Path, request: &ExecRequest, extra: Option<(&str, &[u8])>) -> Result<(), ExecError> {
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

fn capabilities(engine: &WasmEngine) -> BackendCapabilities {
    use Enforcement as E;
    let cfg = engine.config();
    let allocation = if engine.pooling_allocator() {
        format!("instances from a pooling allocator of {} slots shared by the wasm backends", cfg.pooled_instances)
    } else if cfg.pooled_instances > 0 {
        format!(
            "instances allocated on demand: the pooling allocator's reservation was refused; at most {} at once",
            cfg.pooled_instances
        )
    } else {
        "instances allocated on demand".to_string()
    };
    BackendCapabilities {
        isolation: IsolationKind::InProcess,
        cost: CostClass::Low,
        languages: vec![Language::Wasm],
        payloads: vec![PayloadKind::WasmModule],
        features: RequestFeatures { json_input: true, stdin: true, args: true, input_files: true, output_files: false },
        network: SurfaceCapability {
            deny: E::by_omission("WASI preview 1 has no call that opens a socket, and none is preopened"),
            allow_list: E::not_enforced("WASI preview 1 cannot grant network access"),
        },
        filesystem: SurfaceCapability {
            deny: E::enforced("no directory is preopened; WASI preview 1 reaches files only through preopens"),
            allow_list: E::enforced(
                "each granted directory is a cap-std preopen (read-only grants refuse writes); \
                 `..` and symlinks cannot leave it; guests cannot create symlinks; FIFOs, sockets and \
                 devices are refused at open",
            ),
        },
        environment: SurfaceCapability {
            deny: E::enforced("the guest's environment is empty"),
            allow_list: E::enforced("only the request's values for allow-listed names; nothing is inherited"),
        },
        timeout: E::enforced(format!(
            "preemptive: epoch interruption every {} µs in wasm code; sleeps in poll_oneoff end at the deadline; \
             the module's compile counts against it ({compile})",
            cfg.epoch_tick.as_micros(),
            compile = if engine.compiles_contained() {
                "in a compile worker process, killed at the deadline, memory capped"
            } else {
                "in this process, bounded by the static module limits only: no compile worker program"
            }
        )),
        memory: E::enforced(format!(
            "per-store limiter on linear memory and tables (ceiling {} bytes); memory.grow past it returns -1; \
             {allocation}",
            cfg.max_memory_bytes
        )),
        fuel: if cfg.consume_fuel {
            E::enforced("wasmtime fuel metering, uncatchable by the guest")
        } else {
            E::not_enforced("fuel metering is off in this backend's config")
        },
        stdout_cap: E::enforced("guest writes go through a bounded buffer; the rest is counted and dropped"),
        stderr_cap: E::enforced("guest writes go through a bounded buffer; the rest is counted and dropped"),
        processes: E::by_omission("WASI preview 1 cannot create processes or threads"),
        default_timeout_ms: u64::try_from(cfg.default_timeout.as_millis()).unwrap_or(u64::MAX),
    }
}

impl Backend for WasmGuest {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn capabilities(&self) -> &BackendCapabilities {
        &self.caps
    }

    fn execute(&self, call: Admitted) -> Result<ExecResult, ExecError> {
        self.engine.on_blocking_thread(Self::NAME, || self.execute_here(call))
    }
}
