//! The settings of the wasm backends: [`WasmGuestConfig`] (an engine's,
//! shared by every backend on it) and [`InterpreterConfig`] (one
//! interpreter backend's).

use std::path::PathBuf;
use std::time::Duration;

use super::module_limits::ModuleLimits;
use crate::backends::conventions;
use crate::config::{RunDefaults, setters};
use crate::language::Language;

/// Settings of a [`WasmEngine`](super::engine::WasmEngine) and the wasm backends built on it.
///
/// Build it from [`WasmGuestConfig::default`] with the setters (the type is
/// `#[non_exhaustive]`): `WasmGuestConfig::default().pooled_instances(8)`.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct WasmGuestConfig {
    /// Ceiling on one guest's linear memory, whatever the policy asks (a
    /// policy's `memory_bytes` above it gets this much, and so does
    /// [`RunDefaults::memory_bytes`] when it is set higher). Also the size of
    /// a pooled memory slot. A module whose declared initial memory exceeds
    /// it is `out_of_memory` before anything is compiled.
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
    /// as [`ExecError::Busy`](crate::error::ExecError::Busy). `0` allocates on demand instead (slower, and
    /// concurrency is then unbounded). Each slot reserves address space
    /// (not memory) for a `max_memory_bytes` memory.
    ///
    /// # Default
    /// 32.
    pub pooled_instances: u32,
    /// Meter fuel. Required to honour a policy's `fuel`; costs ≈ 10–80% on
    /// tight loops (see docs/performance.md).
    ///
    /// # Default
    /// On.
    pub consume_fuel: bool,
    /// Epoch period: deadlines fire within two ticks after the limit. Must
    /// not be zero (the ticker would spin).
    ///
    /// # Default
    /// 1 ms.
    pub epoch_tick: Duration,
    /// How long the ticker keeps ticking after the last run before it parks.
    ///
    /// # Default
    /// 250 ms.
    pub ticker_linger: Duration,
    /// Compiled modules kept in memory per backend (least recently used
    /// evicted; `0` counts as 1).
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
    /// this user's other, less trusted programs write. [`WasmEngine::new`](super::engine::WasmEngine::new)
    /// refuses an unusable directory as [`ConfigError::Invalid`](crate::error::ConfigError::Invalid).
    /// Interpreter modules are cached in their own directory instead (see
    /// [`WasmInterpreter`](super::interpreters::WasmInterpreter)).
    pub disk_cache_dir: Option<PathBuf>,
    /// What a run gets when its policy states nothing: its deadline (no
    /// guest runs unbounded), its memory cap (held to
    /// [`WasmGuestConfig::max_memory_bytes`]) and the deepest JSON `input`
    /// accepted (serialization recurses).
    ///
    /// # Default
    /// 30 s; 1 GiB (the default `max_memory_bytes`: a run whose policy
    /// states no memory gets the whole ceiling); 128.
    pub defaults: RunDefaults,
    /// Static limits on untrusted modules, checked before compiling.
    ///
    /// # Default
    /// [`ModuleLimits::default`].
    pub module_limits: ModuleLimits,
    /// Compile untrusted modules in a worker process, killed at the run's
    /// deadline with its memory capped (see `compile_worker.rs`). Without a
    /// worker program (see [`crate::backends::worker`]), or with `false`, they compile
    /// in this process, bounded by [`WasmGuestConfig::module_limits`] only.
    /// Whether a worker is used shows in [`WasmEngine::compiles_contained`](super::engine::WasmEngine::compiles_contained).
    ///
    /// # Default
    /// `true`.
    pub compile_in_worker: bool,
    /// The program serving as compile worker; `None` finds one (see
    /// [`crate::backends::worker`]). A program that cannot serve is not an error: the
    /// compile runs in this process (see `compile_in_worker`).
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
    /// Run a `wasm` guest whose module is cached on the async task that
    /// awaits [`Executor::execute`](crate::executor::Executor::execute),
    /// instead of on tokio's blocking pool: the guest yields to the runtime
    /// at every epoch tick (so it holds a runtime thread for at most one
    /// `epoch_tick` at a time, past the one wasm instruction it is in: a
    /// bulk-memory instruction is not interrupted, and one `memory.fill` of
    /// 512 MiB holds the thread ~0.3 s), and its sleeps, `random_get` and
    /// tool calls await instead of blocking. Every limit holds as on the blocking pool. A run that
    /// must compile its module, that is granted files (preopens or input
    /// files), or that finds no instance slot free takes the blocking pool
    /// anyway; `execute_blocking` always runs on the calling thread.
    ///
    /// For `python-wasm` on this engine, `true` also lets a run that takes a
    /// warm instance await that instance's answer on the task (the instance
    /// runs on its own thread, as always), with no blocking-pool thread in
    /// between; a run with input files, or that finds the pool empty, takes
    /// the blocking pool. `quickjs-wasm` always takes the blocking pool.
    /// `false` sends every run to the blocking pool.
    ///
    /// # Default
    /// `true`.
    pub async_runs: bool,
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
            defaults: RunDefaults { timeout: Duration::from_secs(30), memory_bytes: 1 << 30, max_input_nesting: 128 },
            compile_in_worker: true,
            worker_program: None,
            max_compile_memory_bytes: 1 << 30,
            module_limits: ModuleLimits::default(),
            async_runs: true,
        }
    }
}

setters!(WasmGuestConfig {
    max_memory_bytes: u64,
    max_table_elements: usize,
    max_wasm_stack: usize,
    pooled_instances: u32,
    consume_fuel: bool,
    epoch_tick: Duration,
    ticker_linger: Duration,
    module_cache_entries: usize,
    defaults: RunDefaults,
    module_limits: ModuleLimits,
    compile_in_worker: bool,
    max_compile_memory_bytes: u64,
    async_runs: bool,
} some {
    disk_cache_dir: PathBuf,
    worker_program: PathBuf,
});

/// Which interpreter a [`WasmInterpreter`](super::interpreters::WasmInterpreter) runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interpreter {
    /// CPython 3.12 (`python.wasm`), backend `python-wasm`.
    Python,
    /// QuickJS-ng (`quickjs.wasm`), backend `quickjs-wasm`.
    QuickJs,
}

impl Interpreter {
    /// The backend's name.
    pub fn backend_name(self) -> &'static str {
        match self {
            Interpreter::Python => "python-wasm",
            Interpreter::QuickJs => "quickjs-wasm",
        }
    }

    /// The module's file name in [`InterpreterConfig::dir`].
    pub fn file_name(self) -> &'static str {
        match self {
            Interpreter::Python => "python.wasm",
            Interpreter::QuickJs => "quickjs.wasm",
        }
    }

    /// The language it runs.
    pub(crate) fn language(self) -> Language {
        match self {
            Interpreter::Python => Language::Python,
            Interpreter::QuickJs => Language::JavaScript,
        }
    }
}

/// `$EXECBOX_INTERPRETERS_DIR`, else `$XDG_CACHE_HOME/execbox/interpreters`,
/// else `~/.cache/execbox/interpreters`: where `scripts/fetch-interpreters.sh`
/// puts the modules (`None` when none of these can be found).
pub fn interpreters_dir() -> Option<PathBuf> {
    conventions::cache_dir("EXECBOX_INTERPRETERS_DIR", "interpreters")
}

/// Settings of one [`WasmInterpreter`](super::interpreters::WasmInterpreter)
/// backend. Its limits and run defaults are its engine's
/// ([`WasmGuestConfig`]).
///
/// Build it from [`InterpreterConfig::default`] with the setters (the type
/// is `#[non_exhaustive]`):
/// `InterpreterConfig::default().kind(Interpreter::QuickJs)`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct InterpreterConfig {
    /// Which interpreter.
    ///
    /// # Default
    /// [`Interpreter::Python`].
    pub kind: Interpreter,
    /// Where `python.wasm` and `quickjs.wasm` are (each is checked against
    /// the sha256 pinned in execbox when it is loaded). Their compiled form
    /// is cached in `dir/compiled` (created owner-only; if it cannot be used
    /// safely the interpreter is compiled in every process instead, with a
    /// warning). `None`: the backend reports itself unavailable.
    ///
    /// # Default
    /// [`interpreters_dir`], read when the config is made.
    pub dir: Option<PathBuf>,
    /// Instances kept pre-started, waiting for code (CPython only: QuickJS
    /// starts in milliseconds and keeps none). Each holds one of the
    /// engine's instance slots while it waits, and the pool starts with the
    /// module (on the first request, or [`Backend::prepare`](crate::backend::Backend::prepare)).
    /// A one-shot process (like the CLI's `run`) should keep 0: the pool
    /// only pays off when several requests come.
    ///
    /// # Default
    /// 2.
    pub warm_pool: usize,
}

impl Default for InterpreterConfig {
    fn default() -> Self {
        Self { kind: Interpreter::Python, dir: interpreters_dir(), warm_pool: 2 }
    }
}

setters!(InterpreterConfig { kind: Interpreter, warm_pool: usize } some { dir: PathBuf });
