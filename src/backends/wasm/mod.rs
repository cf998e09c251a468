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
//! - **fuel**: wasmtime fuel (≈1 unit per wasm instruction) → `out_of_fuel`.
//! - **deadline**: epoch interruption from one ticker thread per backend,
//!   preemptive in wasm code; `poll_oneoff` sleeps end at the deadline →
//!   `timed_out`.
//! - **memory**: a per-store [`ResourceLimiter`](wasmtime::ResourceLimiter):
//!   `memory.grow` past the cap returns -1 (the guest sees an allocation
//!   failure); a run that then fails is `out_of_memory`. Never a host abort.
//! - **files**: only preopened directories (cap-std's primitives inside
//!   wasmtime-wasi): `..` and symlinks cannot leave a preopen, read-only
//!   grants refuse writes. **network**: WASI preview 1 cannot open sockets.
//! - **output**: stdout/stderr through the shared bounded buffer.
//!
//! Modules are compiled once per sha256 (memory cache, optional disk cache)
//! and kept as `InstancePre`; instances come from the pooling allocator.

mod compile;
pub mod interpreters;
mod run;
mod stdio;
mod ticker;
mod warm;

use std::path::PathBuf;
use std::time::Duration;

use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};
use wasmtime_wasi::FsPerms;

pub use compile::CacheStats;
pub use interpreters::{Interpreter, WasmInterpreter};

use crate::capabilities::{
    BackendCapabilities, CostClass, Enforcement, IsolationKind, Language, PayloadKind, RequestFeatures,
    SurfaceCapability,
};
use crate::error::{ExecError, InvalidRequest};
use crate::executor::{Backend, may_block_here};
use crate::limits::nesting;
use crate::policy::Access;
use crate::request::{ExecRequest, Payload};
use crate::result::ExecResult;

/// Where staged `input_files` appear inside the guest (read-only).
pub const INPUT_DIR: &str = "/input";

/// Settings of a [`WasmGuest`] backend.
#[derive(Clone, Debug)]
pub struct WasmGuestConfig {
    /// Ceiling on one guest's linear memory, whatever the policy asks (a
    /// policy's `memory_bytes` above it gets this much). Also the size of a
    /// pooled memory slot.
    pub max_memory_bytes: u64,
    /// Ceiling on table elements per table.
    pub max_table_elements: usize,
    /// Wasm stack per call (wasmtime's `max_wasm_stack`); deeper recursion traps.
    pub max_wasm_stack: usize,
    /// Instances held by the pooling allocator; concurrent runs beyond this are
    /// refused as `BackendUnavailable`. `0` allocates on demand instead (slower,
    /// unbounded).
    pub pooled_instances: u32,
    /// Meter fuel. Required to honour a policy's `fuel`; costs ≈ 10–80% on
    /// tight loops (see the README's benchmark).
    pub consume_fuel: bool,
    /// Epoch period: deadlines fire within two ticks after the limit.
    pub epoch_tick: Duration,
    /// How long the ticker keeps ticking after the last run before it parks.
    pub ticker_linger: Duration,
    /// Compiled modules kept in memory (least recently used evicted).
    pub module_cache_entries: usize,
    /// Directory for serialized modules, reused across processes. Only
    /// point it at a directory no untrusted user can write: loading an
    /// artifact runs its machine code.
    pub disk_cache_dir: Option<PathBuf>,
    /// Deepest JSON `input` accepted (serialization recurses).
    pub max_input_nesting: usize,
    /// Deadline of a run whose policy states none: no guest runs unbounded.
    ///
    /// # Default
    /// 30 s.
    pub default_timeout: Duration,
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
        }
    }
}

/// In-process WebAssembly guests on one shared wasmtime [`Engine`].
///
/// Cheap to share (`Executor` holds it in an `Arc`); dropping it stops its
/// epoch ticker thread.
pub struct WasmGuest {
    cfg: WasmGuestConfig,
    engine: Engine,
    cache: compile::ModuleCache,
    ticker: ticker::EpochTicker,
    caps: BackendCapabilities,
}

impl WasmGuest {
    /// The backend's name in results and refusals.
    pub const NAME: &'static str = "wasm";

    /// A backend with [`WasmGuestConfig::default`].
    pub fn new() -> Result<Self, ExecError> {
        Self::with_config(WasmGuestConfig::default())
    }

    /// A backend with `cfg`. Builds the engine (≈5 ms): do it once.
    pub fn with_config(cfg: WasmGuestConfig) -> Result<Self, ExecError> {
        let fault = |what: &str, e: &dyn std::fmt::Display| ExecError::internal(Self::NAME, format!("{what}: {e:#}"));
        let engine = build_engine(&cfg).map_err(|e| fault("cannot create the wasmtime engine", &e))?;
        let linker = run::linker(&engine).map_err(|e| fault("cannot link WASI", &e))?;
        let cache = compile::ModuleCache::new(
            engine.clone(),
            std::sync::Arc::new(linker),
            cfg.module_cache_entries,
            cfg.disk_cache_dir.clone(),
        )
        .map_err(|e| fault("cannot open the module cache directory", &e))?;
        let ticker = ticker::EpochTicker::start(engine.clone(), cfg.epoch_tick, cfg.ticker_linger)
            .map_err(|e| fault("cannot start the epoch ticker", &e))?;
        let caps = capabilities(&cfg);
        Ok(Self { cfg, engine, cache, ticker, caps })
    }

    /// The settings in use.
    pub fn config(&self) -> &WasmGuestConfig {
        &self.cfg
    }

    /// Module cache counters: a repeated module shows up as a hit, not a compile.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// Compiles (or finds) a module without running it, e.g. to warm the
    /// cache at start-up; fails like `execute` would on a bad module.
    pub fn precompile(&self, module: &[u8]) -> Result<(), ExecError> {
        self.cache.get(module).map(drop).map_err(ExecError::from)
    }

    fn engine(&self) -> &Engine {
        &self.engine
    }

    fn ticker(&self) -> &ticker::EpochTicker {
        &self.ticker
    }

    /// Runs on the current thread, which may block.
    fn execute_here(&self, mut request: ExecRequest) -> Result<ExecResult, ExecError> {
        let Payload::WasmModule(module) = std::mem::replace(&mut request.payload, Payload::WasmModule(Vec::new()))
        else {
            return Err(ExecError::internal(Self::NAME, "matching let a source payload through"));
        };
        let input = nesting::take_bounded_input(&mut request.input, self.cfg.max_input_nesting)?
            .map(|value| serde_json::to_vec(&value))
            .transpose()
            .map_err(|e| ExecError::internal(Self::NAME, format!("cannot serialize input: {e}")))?;
        let compiled = self.cache.get(&module)?;
        drop(module);

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
            timeout: Some(self.caps.effective_timeout(policy)),
            memory_cap: self.memory_cap(policy),
            max_stdout: policy.max_stdout_bytes,
            max_stderr: policy.max_stderr_bytes,
        };
        run::run(self, &compiled, job)
    }
}

impl WasmGuest {
    /// The linear-memory cap of a run: the policy's, at most the ceiling.
    fn memory_cap(&self, policy: &crate::policy::SandboxPolicy) -> usize {
        let cap = policy.memory_bytes.map_or(self.cfg.max_memory_bytes, |m| m.min(self.cfg.max_memory_bytes));
        usize::try_from(cap).unwrap_or(usize::MAX)
    }

    /// Runs `f` here if this thread may block, else on a scoped thread: on an
    /// async worker thread the sync WASI layer would try to block on a nested
    /// runtime and panic.
    fn on_blocking_thread<R: Send>(&self, f: impl FnOnce() -> Result<R, ExecError> + Send) -> Result<R, ExecError> {
        if may_block_here() {
            return f();
        }
        std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("execbox-wasm".into())
                .stack_size(self.cfg.max_wasm_stack + (2 << 20))
                .spawn_scoped(scope, f)
                .map_err(|e| ExecError::internal(Self::NAME, format!("cannot spawn: {e}")))?
                .join()
                .unwrap_or_else(|_| Err(ExecError::internal(Self::NAME, "guest thread panicked")))
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
    Ok(preopens)
}

fn build_engine(cfg: &WasmGuestConfig) -> wasmtime::Result<Engine> {
    let mut config = Config::new();
    config.consume_fuel(cfg.consume_fuel).epoch_interruption(true).max_wasm_stack(cfg.max_wasm_stack);
    if cfg.pooled_instances == 0 {
        return Engine::new(&config);
    }
    let n = cfg.pooled_instances;
    let mut pool = PoolingAllocationConfig::default();
    pool.total_core_instances(n)
        .total_memories(n)
        .total_tables(n * 4)
        .max_memories_per_module(1)
        .max_tables_per_module(4)
        .table_elements(cfg.max_table_elements)
        .max_memory_size(usize::try_from(cfg.max_memory_bytes).unwrap_or(usize::MAX))
        .total_component_instances(0)
        .total_stacks(0);
    let mut pooled = config.clone();
    pooled.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    // The pool reserves its address space up front; where that is refused
    // (e.g. a `ulimit -v`), fall back to on-demand allocation.
    Engine::new(&pooled).or_else(|_| Engine::new(&config))
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

fn capabilities(cfg: &WasmGuestConfig) -> BackendCapabilities {
    use Enforcement as E;
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
                 `..` and symlinks cannot leave it",
            ),
        },
        environment: SurfaceCapability {
            deny: E::enforced("the guest's environment is empty"),
            allow_list: E::enforced("only the request's values for allow-listed names; nothing is inherited"),
        },
        timeout: E::enforced(format!(
            "preemptive: epoch interruption every {} µs in wasm code; sleeps in poll_oneoff end at the deadline",
            cfg.epoch_tick.as_micros()
        )),
        memory: E::enforced(format!(
            "per-store limiter on linear memory and tables (ceiling {} bytes); memory.grow past it returns -1",
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

    fn execute(&self, request: ExecRequest) -> Result<ExecResult, ExecError> {
        self.on_blocking_thread(|| self.execute_here(request))
    }
}
