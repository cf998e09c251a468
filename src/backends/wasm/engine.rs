//! [`WasmEngine`]: the wasmtime [`Engine`], its epoch ticker, the WASI
//! linkers and the instance slots, shared by every wasm backend built on it.
//!
//! An engine is the expensive part of a wasm backend: building it reserves
//! the pooling allocator's address space (tens of GiB of it, committed only
//! as used) and starts a ticker thread. `wasm`, `quickjs-wasm` and
//! `python-wasm` therefore share one ([`ExecutorBuilder::wasm_backends`]
//! does this), and with it its instance slots; each backend keeps its own
//! module cache (the engine's `disk_cache_dir` is opened once, here).
//!
//! **Slots.** The pooling allocator has a fixed number of instance slots. A
//! run takes a [`SlotPermit`] before it instantiates and gives it back after
//! its store is gone, so a burst larger than the pool *waits* for a slot
//! (until its own deadline) instead of failing inside wasmtime. Only a run
//! whose deadline passes while it waits is refused, as
//! [`ExecError::Busy`] naming its backend. Warm interpreter instances hold a
//! permit while they wait for code.
//!
//! [`ExecutorBuilder::wasm_backends`]: crate::executor::ExecutorBuilder::wasm_backends

use parking_lot::{Condvar, Mutex};
use std::sync::Arc;

use wasmtime::{Enabled, Engine, InstanceAllocationStrategy, Linker, PoolingAllocationConfig};

use super::compile_worker::{CompileSettings, CompileWorkers, HOST_STACK};
use super::config::WasmGuestConfig;
use super::disk_cache::DiskCache;
use super::guest::GuestState;
use super::linker;
use super::ticker::EpochTicker;
use crate::backend::may_block_here;
use crate::error::{ConfigError, ExecError};
use crate::limits::deadline::Deadline;
use crate::policy::SandboxPolicy;

/// Bytes of each pooled linear memory that stay resident when its instance
/// ends, reset with `memset` (only the pages the guest touched, where the
/// kernel has `PAGEMAP_SCAN`) instead of `madvise`: a small guest's next run
/// then takes no page faults, and no TLB shootdown crosses the CPUs (which
/// kept concurrent runs from scaling past one core). Memory past this is
/// given back as before; contents are reset either way.
const KEEP_RESIDENT: usize = 64 << 10;

/// A wasmtime engine with everything its runs share: the epoch ticker
/// thread, the WASI linker (with execbox's own `poll_oneoff`, `path_open` and
/// `path_symlink`) and the instance slots.
///
/// Build one per process and hand it to every wasm backend
/// ([`WasmGuest::on_engine`](super::guest_backend::WasmGuest::on_engine),
/// [`WasmInterpreter::on_engine`](super::interpreters::WasmInterpreter::on_engine)).
/// Dropping the last handle stops the ticker thread.
pub struct WasmEngine {
    cfg: WasmGuestConfig,
    engine: Engine,
    linker: Arc<Linker<GuestState>>,
    linker_async: Arc<Linker<GuestState>>,
    ticker: EpochTicker,
    slots: Arc<Slots>,
    pooling: bool,
    compiler: Option<Arc<CompileWorkers>>,
    /// `cfg.disk_cache_dir`, opened and checked.
    disk: Option<Arc<DiskCache>>,
}

impl WasmEngine {
    /// An engine with `cfg`. Takes ≈5 ms: do it once.
    ///
    /// With `cfg.pooled_instances > 0` the engine tries the pooling allocator
    /// first; where its address-space reservation is refused (e.g. under a
    /// `ulimit -v`) it falls back to on-demand allocation, logs a warning,
    /// and says so in [`WasmEngine::pooling_allocator`] and in the
    /// capabilities of the backends built on it. Concurrent runs are still
    /// bounded by `cfg.pooled_instances` then.
    ///
    /// Errors: [`ConfigError::Invalid`] for a setting that cannot be used
    /// (a `disk_cache_dir` that cannot be created or that another user
    /// could write, a zero `epoch_tick`); [`ConfigError::Unsupported`] when
    /// this machine cannot run an engine at all (even on-demand allocation
    /// refused, no thread for the ticker).
    pub fn new(cfg: WasmGuestConfig) -> Result<Arc<Self>, ConfigError> {
        let unsupported =
            |what: &str, e: &dyn std::fmt::Display| ConfigError::Unsupported { reason: format!("{what}: {e:#}") };
        if cfg.epoch_tick.is_zero() {
            return Err(ConfigError::invalid(
                "WasmGuestConfig::epoch_tick",
                "a zero tick would keep the ticker thread spinning; 1 ms is the default",
            ));
        }
        let (engine, pooling, settings) =
            build_engine(&cfg).map_err(|e| unsupported("cannot create the wasmtime engine", &e))?;
        let disk = match &cfg.disk_cache_dir {
            Some(dir) => Some(Arc::new(DiskCache::open(dir.clone(), &engine).map_err(|e| {
                ConfigError::invalid("WasmGuestConfig::disk_cache_dir", format!("cannot use {}: {e}", dir.display()))
            })?)),
            None => None,
        };
        let compiler = cfg.compile_in_worker.then(|| {
            Arc::new(CompileWorkers::new(&engine, settings, cfg.worker_program.clone(), cfg.max_compile_memory_bytes))
        });
        let linker = linker::linker(&engine).map_err(|e| unsupported("cannot link WASI", &e))?;
        let linker_async = linker::linker_async(&engine).map_err(|e| unsupported("cannot link WASI", &e))?;
        let ticker = EpochTicker::start(engine.clone(), cfg.epoch_tick, cfg.ticker_linger)
            .map_err(|e| unsupported("cannot start the epoch ticker", &e))?;
        let capacity = (cfg.pooled_instances > 0).then_some(cfg.pooled_instances as usize);
        let slots = Arc::new(Slots { capacity, busy: Mutex::new(0), freed: Condvar::new() });
        Ok(Arc::new(Self {
            cfg,
            engine,
            linker: Arc::new(linker),
            linker_async: Arc::new(linker_async),
            ticker,
            slots,
            pooling,
            compiler,
            disk,
        }))
    }

    /// The settings in use.
    pub fn config(&self) -> &WasmGuestConfig {
        &self.cfg
    }

    /// True when instances come from the pooling allocator; false when the
    /// config asked for on-demand allocation or the pool's reservation was
    /// refused and the engine fell back to it.
    pub fn pooling_allocator(&self) -> bool {
        self.pooling
    }

    /// True when untrusted modules compile in a worker process (killed at
    /// the deadline, memory capped); false when they compile in this
    /// process, bounded by the static module limits only.
    pub fn compiles_contained(&self) -> bool {
        self.compiler.as_ref().is_some_and(|c| c.contained())
    }

    pub(crate) fn compiler(&self) -> Option<&Arc<CompileWorkers>> {
        self.compiler.as_ref()
    }

    /// The engine's `disk_cache_dir`, opened (`None` when not configured).
    pub(crate) fn disk_cache(&self) -> Option<&Arc<DiskCache>> {
        self.disk.as_ref()
    }

    /// Instance slots in use right now (runs, warm instances and live
    /// sessions), out of `pooled_instances`: for status displays.
    pub fn slots_in_use(&self) -> usize {
        *self.slots.lock()
    }

    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    pub(crate) fn linker(&self) -> &Arc<Linker<GuestState>> {
        &self.linker
    }

    /// The linker of runs on an async task (see `linker.rs`).
    pub(crate) fn linker_async(&self) -> &Arc<Linker<GuestState>> {
        &self.linker_async
    }

    pub(crate) fn ticker(&self) -> &EpochTicker {
        &self.ticker
    }

    /// A slot for one instance of `backend`'s, waiting for one until
    /// `deadline`; [`ExecError::Busy`] if none frees up by then.
    pub(crate) fn acquire_slot(&self, deadline: &Deadline, backend: &str) -> Result<SlotPermit, ExecError> {
        let Some(capacity) = self.slots.capacity else { return Ok(SlotPermit(None)) };
        let mut busy = self.slots.lock();
        loop {
            if *busy < capacity {
                *busy += 1;
                return Ok(SlotPermit(Some(self.slots.clone())));
            }
            match deadline.remaining() {
                None => self.slots.freed.wait(&mut busy),
                Some(left) if left.is_zero() => {
                    return Err(ExecError::Busy {
                        backend: backend.to_string(),
                        reason: format!(
                            "all {capacity} wasm instance slots (shared by the wasm backends) stayed busy until the \
                             run's deadline of {} ms; raise WasmGuestConfig::pooled_instances or the timeout",
                            deadline.limit().unwrap_or_default().as_millis()
                        ),
                    });
                }
                Some(left) => drop(self.slots.freed.wait_for(&mut busy, left)),
            }
        }
    }

    /// A slot if one is free now and `keep_free` more stay free after it:
    /// warm instances never wait, and never take the last slots from requests.
    pub(crate) fn try_acquire_slot(&self, keep_free: usize) -> Option<SlotPermit> {
        let Some(capacity) = self.slots.capacity else { return Some(SlotPermit(None)) };
        let mut busy = self.slots.lock();
        (busy.saturating_add(1).saturating_add(keep_free) <= capacity).then(|| {
            *busy += 1;
            SlotPermit(Some(self.slots.clone()))
        })
    }
}

impl WasmEngine {
    /// The linear-memory cap of a run under `policy`: the policy's, else
    /// [`RunDefaults::memory_bytes`](crate::config::RunDefaults::memory_bytes),
    /// at most [`WasmGuestConfig::max_memory_bytes`].
    pub(crate) fn memory_cap(&self, policy: &SandboxPolicy) -> usize {
        let ceiling = self.cfg.max_memory_bytes;
        let cap = policy.memory_bytes.unwrap_or(self.cfg.defaults.memory_bytes).min(ceiling);
        usize::try_from(cap).unwrap_or(usize::MAX)
    }

    /// Runs `f` here if this thread may block, else on a scoped thread: on an
    /// async worker thread the sync WASI layer would try to block on a nested
    /// runtime and panic.
    pub(crate) fn on_blocking_thread<R: Send>(
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
                .stack_size(self.cfg.max_wasm_stack.saturating_add(HOST_STACK))
                .spawn_scoped(scope, f)
                .map_err(|e| ExecError::internal_caused(backend, "cannot spawn the guest thread", e))?
                .join()
                .unwrap_or_else(|_| Err(ExecError::internal(backend, "guest thread panicked")))
        })
    }
}

/// Counts the instances alive in the engine against its slot capacity.
struct Slots {
    /// `None`: unbounded (on-demand allocation by configuration).
    capacity: Option<usize>,
    busy: Mutex<usize>,
    freed: Condvar,
}

impl Slots {
    fn lock(&self) -> parking_lot::MutexGuard<'_, usize> {
        self.busy.lock()
    }
}

/// One instance slot, given back when dropped. Drop it only after the store
/// that used it: the pooling allocator frees the slot with the store.
pub(crate) struct SlotPermit(Option<Arc<Slots>>);

impl Drop for SlotPermit {
    fn drop(&mut self) {
        if let Some(slots) = self.0.take() {
            *slots.lock() -= 1;
            slots.freed.notify_one();
        }
    }
}

/// The engine, whether it pools instances, and the settings a compile
/// worker needs to produce artifacts it can load.
fn build_engine(cfg: &WasmGuestConfig) -> wasmtime::Result<(Engine, bool, CompileSettings)> {
    let mut settings = CompileSettings {
        consume_fuel: cfg.consume_fuel,
        max_wasm_stack: cfg.max_wasm_stack,
        small_reservations: false,
    };
    let config = settings.config();
    if cfg.pooled_instances == 0 {
        return Ok((Engine::new(&config)?, false, settings));
    }
    let n = cfg.pooled_instances;
    let mut pool = PoolingAllocationConfig::default();
    pool.total_core_instances(n)
        .total_memories(n)
        .total_tables(n.saturating_mul(4))
        .max_memories_per_module(1)
        .max_tables_per_module(4)
        .table_elements(cfg.max_table_elements)
        .max_memory_size(usize::try_from(cfg.max_memory_bytes).unwrap_or(usize::MAX))
        .total_component_instances(0)
        // One fiber stack per slot, for runs on an async task.
        .total_stacks(n)
        .linear_memory_keep_resident(KEEP_RESIDENT)
        .pagemap_scan(Enabled::Auto);
    let mut pooled = config.clone();
    pooled.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    match Engine::new(&pooled) {
        Ok(engine) => Ok((engine, true, settings)),
        Err(e) => {
            // The pool reserves its address space up front; where that is
            // refused, run on demand, and say so (capabilities, accessor).
            // Whatever refused it (e.g. `ulimit -v`) would refuse the 4 GiB
            // that each on-demand memory reserves by default too: reserve
            // only what a memory uses (explicit bounds checks, slower).
            tracing::warn!(
                error = %format!("{e:#}"),
                slots = n,
                "the wasm pooling allocator's reservation was refused; instances are allocated on demand"
            );
            settings.small_reservations = true;
            Ok((Engine::new(&settings.config())?, false, settings))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_epoch_tick_is_the_callers_mistake() {
        let cfg = WasmGuestConfig::default().epoch_tick(std::time::Duration::ZERO).pooled_instances(0);
        let err = WasmEngine::new(cfg).err().expect("refused");
        assert!(matches!(err, ConfigError::Invalid { setting: "WasmGuestConfig::epoch_tick", .. }), "{err:?}");
    }

    #[test]
    fn an_unusable_cache_dir_is_the_callers_mistake() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let cfg = WasmGuestConfig::default().disk_cache_dir(file.path()).pooled_instances(0);
        let err = WasmEngine::new(cfg).err().expect("refused");
        assert!(matches!(err, ConfigError::Invalid { setting: "WasmGuestConfig::disk_cache_dir", .. }), "{err:?}");
    }

    #[test]
    fn the_memory_cap_is_the_policys_else_the_default_at_most_the_ceiling() {
        let mut cfg = WasmGuestConfig::default().max_memory_bytes(64 << 20).pooled_instances(0);
        cfg.defaults.memory_bytes = 16 << 20;
        let engine = WasmEngine::new(cfg).unwrap();
        let cap = |memory: Option<u64>| {
            let mut policy = SandboxPolicy::strict();
            policy.memory_bytes = memory;
            engine.memory_cap(&policy)
        };
        assert_eq!(cap(None), 16 << 20);
        assert_eq!(cap(Some(32 << 20)), 32 << 20);
        assert_eq!(cap(Some(1 << 40)), 64 << 20);
    }
}
