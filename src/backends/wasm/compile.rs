//! [`ModuleCache`]: compiled modules keyed by the payload's sha256, kept in
//! memory (least recently used evicted) and optionally on disk as serialized
//! artifacts, so a repeated module is never compiled twice.
//!
//! Each entry holds an [`InstancePre`](wasmtime::InstancePre): imports resolved and type-checked once,
//! so a call only instantiates. The guest ABI is decided here too, so a
//! module that fits none is refused before anything runs.
//!
//! Two kinds of modules come through here:
//! - **untrusted** ones (a request's payload): converted from WAT, checked
//!   against the static [`ModuleLimits`] (cheap, linear in the module's size)
//!   and only then compiled, always by [`compile_untrusted`] — the one place
//!   that turns untrusted bytes into machine code, and the seam where that
//!   compile can move into a contained worker process;
//! - **pinned** ones (the interpreters): known by sha256, trusted, compiled
//!   in-process by [`compile_trusted`].

use lru::LruCache;
use parking_lot::{Condvar, Mutex};
use std::collections::HashSet;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use sha2::{Digest, Sha256};
use wasmtime::{Engine, ExternType, Linker, Module, ValType};

use super::compile_worker::{CompileWorkers, Compiled as Contained};
use super::disk_cache::{DiskCache, Key};
use super::engine::WasmEngine;
use super::guest::{Compiled, GuestAbi, GuestState};
use super::module_limits::{self, Ceilings, ModuleLimits, StaticRefusal};
use crate::error::InvalidRequest;
use crate::limits::deadline::Deadline;

/// Counters of a backend's module cache since the backend was built
/// ([`WasmGuest::cache_stats`](super::guest_backend::WasmGuest::cache_stats)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CacheStats {
    /// Modules compiled from their bytes.
    pub compiled: u64,
    /// Calls served from the in-memory cache.
    pub memory_hits: u64,
    /// Modules loaded from the on-disk cache instead of compiled.
    pub disk_hits: u64,
    /// Entries currently held in memory.
    pub entries: u64,
}

/// One backend's compiled modules: in memory (an LRU of `capacity`), on
/// disk if it has a [`DiskCache`], and the compiles in flight.
pub(crate) struct ModuleCache {
    engine: Engine,
    linker: Arc<Linker<GuestState>>,
    linker_async: Arc<Linker<GuestState>>,
    /// Least recently used evicted first (the `lru` crate: O(1) lookups,
    /// inserts and evictions).
    entries: Mutex<LruCache<Key, Arc<Compiled>>>,
    disk: Option<Arc<DiskCache>>,
    compiled: AtomicU64,
    memory_hits: AtomicU64,
    disk_hits: AtomicU64,
    /// Untrusted modules being compiled now (single flight): a run that
    /// needs one of them waits for that compile (within its deadline)
    /// instead of starting the same compile again, so concurrency does not
    /// multiply a heavy module. The LRU cannot do this: it holds only
    /// modules that are ready.
    in_flight: Mutex<HashSet<Key>>,
    landed: Condvar,
    /// Where untrusted modules compile (`None`: in this process).
    compiler: Option<Arc<CompileWorkers>>,
}

impl ModuleCache {
    /// A cache of `capacity` modules in memory (at least 1) for runs on
    /// `wasm`, keeping them in `disk` too if given.
    pub(crate) fn new(wasm: &WasmEngine, capacity: usize, disk: Option<Arc<DiskCache>>) -> Self {
        let capacity = NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN);
        Self {
            engine: wasm.engine().clone(),
            linker: wasm.linker().clone(),
            linker_async: wasm.linker_async().clone(),
            compiler: wasm.compiler().cloned(),
            entries: Mutex::new(LruCache::new(capacity)),
            disk,
            compiled: AtomicU64::new(0),
            memory_hits: AtomicU64::new(0),
            disk_hits: AtomicU64::new(0),
            in_flight: Mutex::default(),
            landed: Condvar::new(),
        }
    }

    pub(crate) fn stats(&self) -> CacheStats {
        CacheStats {
            compiled: self.compiled.load(Ordering::Relaxed),
            memory_hits: self.memory_hits.load(Ordering::Relaxed),
            disk_hits: self.disk_hits.load(Ordering::Relaxed),
            entries: self.entries.lock().len() as u64,
        }
    }

    /// The ready module for the untrusted payload `bytes` (binary or WAT),
    /// checked against `limits` and `ceilings` and compiled at most once.
    /// `deadline` is the run's: a compile is not started once it has passed.
    pub(crate) fn get_untrusted(
        &self,
        bytes: &[u8],
        limits: &ModuleLimits,
        ceilings: &Ceilings,
        deadline: &Deadline,
    ) -> Result<Arc<Compiled>, CompileRefusal> {
        module_limits::check_size(bytes, limits)?;
        let key: Key = Sha256::digest(bytes).into();
        let _flight = match self.hit_or_lead(key, deadline)? {
            Lead::Hit(hit) => {
                self.memory_hits.fetch_add(1, Ordering::Relaxed);
                return Ok(hit);
            }
            Lead::Lead(flight) => flight,
        };
        let wasm = wat::parse_bytes(bytes).map_err(|e| InvalidRequest::InvalidModule { reason: format!("{e}") })?;
        // Checked before the disk cache too: the limits hold whatever an
        // earlier process (with other limits) left there.
        module_limits::check(&wasm, limits, ceilings).map_err(|refusal| match refusal {
            StaticRefusal::Invalid(e) => CompileRefusal::Invalid(e),
            StaticRefusal::TooBigToStart(why) => CompileRefusal::TooBigToStart(why),
        })?;
        let module = match self.disk.as_ref().and_then(|d| d.load(&self.engine, &key)) {
            Some(module) => {
                self.disk_hits.fetch_add(1, Ordering::Relaxed);
                module
            }
            None => {
                let module = compile_untrusted(&self.engine, self.compiler.as_deref(), &wasm, deadline)?;
                self.compiled.fetch_add(1, Ordering::Relaxed);
                self.store_on_disk(&module, &key);
                module
            }
        };
        Ok(self.ready(key, &module)?)
    }

    /// The ready module for the untrusted payload `bytes` if it is in memory
    /// now (a hit counts as one); `None` for anything else, which
    /// [`ModuleCache::get_untrusted`] then decides (compiles, waits, refuses).
    /// Never blocks: for runs on an async task.
    pub(crate) fn cached(&self, bytes: &[u8], limits: &ModuleLimits) -> Option<Arc<Compiled>> {
        module_limits::check_size(bytes, limits).ok()?;
        let key: Key = Sha256::digest(bytes).into();
        let hit = self.lookup(&key)?;
        self.memory_hits.fetch_add(1, Ordering::Relaxed);
        Some(hit)
    }

    /// The ready module whose sha256 is `key`. `bytes` is called only when
    /// neither cache has it; what it returns must hash to `key`. For large
    /// pinned modules (interpreters): a warm disk cache skips reading and
    /// hashing the module itself.
    pub(crate) fn get_pinned<'b>(
        &self,
        key: Key,
        bytes: impl FnOnce() -> Result<std::borrow::Cow<'b, [u8]>, InvalidRequest>,
    ) -> Result<Arc<Compiled>, InvalidRequest> {
        if let Some(hit) = self.lookup(&key) {
            self.memory_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(hit);
        }
        let module = match self.disk.as_ref().and_then(|d| d.load(&self.engine, &key)) {
            Some(module) => {
                self.disk_hits.fetch_add(1, Ordering::Relaxed);
                module
            }
            None => {
                let bytes = bytes()?;
                if <[u8; 32]>::from(Sha256::digest(&bytes)) != key {
                    return Err(InvalidRequest::InvalidModule {
                        reason: "the module does not match its pinned sha256".into(),
                    });
                }
                let module = compile_trusted(&self.engine, &bytes)?;
                self.compiled.fetch_add(1, Ordering::Relaxed);
                self.store_on_disk(&module, &key);
                module
            }
        };
        self.ready(key, &module)
    }

    /// The module if it is in memory; otherwise a guard that makes this run
    /// the one preparing it, after waiting (until `deadline`) for another run
    /// that already is.
    fn hit_or_lead(&self, key: Key, deadline: &Deadline) -> Result<Lead<'_>, CompileRefusal> {
        let mut flights = self.in_flight.lock();
        loop {
            if let Some(hit) = self.lookup(&key) {
                return Ok(Lead::Hit(hit));
            }
            if flights.insert(key) {
                return Ok(Lead::Lead(Flight { cache: self, key }));
            }
            match deadline.remaining() {
                None => self.landed.wait(&mut flights),
                Some(left) if left.is_zero() => return Err(CompileRefusal::DeadlinePassed),
                Some(left) => drop(self.landed.wait_for(&mut flights, left)),
            }
        }
    }

    /// Best effort: a full disk only costs the next process a compile.
    fn store_on_disk(&self, module: &Module, key: &Key) {
        if let Some(disk) = &self.disk
            && let Err(e) = disk.store(module, key)
        {
            tracing::debug!(error = %e, dir = %disk.dir().display(), "cannot store a compiled module on disk");
        }
    }

    /// Decides the ABI, resolves the imports and keeps the result in memory.
    fn ready(&self, key: Key, module: &Module) -> Result<Arc<Compiled>, InvalidRequest> {
        let abi = guest_abi(module)?;
        let link = |linker: &Linker<GuestState>| {
            linker.instantiate_pre(module).map_err(|e| InvalidRequest::InvalidModule {
                reason: format!("{e:#} (execbox provides only wasi_snapshot_preview1)"),
            })
        };
        let compiled = Arc::new(Compiled { pre: link(&self.linker)?, pre_async: link(&self.linker_async)?, abi });
        self.insert(key, compiled.clone());
        Ok(compiled)
    }

    fn lookup(&self, key: &Key) -> Option<Arc<Compiled>> {
        self.entries.lock().get(key).cloned()
    }

    fn insert(&self, key: Key, compiled: Arc<Compiled>) {
        self.entries.lock().put(key, compiled);
    }
}

/// What [`ModuleCache::hit_or_lead`] found.
enum Lead<'a> {
    Hit(Arc<Compiled>),
    Lead(Flight<'a>),
}

/// This run prepares `key`; others wait until the guard drops (ready or not).
struct Flight<'a> {
    cache: &'a ModuleCache,
    key: Key,
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        self.cache.in_flight.lock().remove(&self.key);
        self.cache.landed.notify_all();
    }
}

/// Why an untrusted module was not made ready.
#[derive(Debug)]
pub(crate) enum CompileRefusal {
    /// Malformed, invalid, over a static limit, or fitting no ABI.
    Invalid(InvalidRequest),
    /// Its declared minimum memory or table exceeds the backend's ceiling.
    TooBigToStart(String),
    /// The run's deadline passed before the compile could start.
    DeadlinePassed,
}

impl From<InvalidRequest> for CompileRefusal {
    fn from(e: InvalidRequest) -> Self {
        CompileRefusal::Invalid(e)
    }
}

/// Compiles an untrusted module that passed the static checks. **Every**
/// untrusted compile goes through here.
///
/// With a compiler, in a worker process killed at `deadline` with its memory
/// capped (see `compile_worker.rs`). Without one (or when no worker can be
/// started), in this process: Cranelift cannot be stopped once started, the
/// static limits bound how long it runs, and the caller reports a compile
/// that ends after `deadline` as `timed_out`.
fn compile_untrusted(
    engine: &Engine,
    compiler: Option<&CompileWorkers>,
    wasm: &[u8],
    deadline: &Deadline,
) -> Result<Module, CompileRefusal> {
    if deadline.expired() {
        return Err(CompileRefusal::DeadlinePassed);
    }
    let invalid = |reason: String| CompileRefusal::Invalid(InvalidRequest::InvalidModule { reason });
    match compiler.map(|c| c.compile(wasm, deadline)) {
        Some(Contained::Artifact(artifact)) => {
            // SAFETY: `artifact` was produced by `Engine::precompile_module`
            // of this same wasmtime build, in a compile worker of this same
            // execbox build whose engine settings were checked to match
            // (compatibility fingerprint at start-up); wasmtime checks the
            // header, version and settings again and errors on a mismatch.
            // The worker compiled untrusted input, so a Cranelift bug could
            // in principle let that input forge the artifact; the same bug in
            // an in-process compile would compromise this process directly,
            // so loading it adds no trust (see `compile_worker.rs`).
            unsafe { Module::deserialize(engine, &artifact) }.map_err(|e| invalid(format!("{e:#}")))
        }
        Some(Contained::Invalid(reason)) => Err(invalid(reason)),
        Some(Contained::TimedOut) => Err(CompileRefusal::DeadlinePassed),
        Some(Contained::OutOfMemory(why)) => Err(CompileRefusal::TooBigToStart(why)),
        Some(Contained::Unavailable(why)) => {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!(reason = %why, "wasm modules compile in this process: no compile worker can be started")
            });
            Module::from_binary(engine, wasm).map_err(|e| invalid(format!("{e:#}")))
        }
        None => Module::from_binary(engine, wasm).map_err(|e| invalid(format!("{e:#}"))),
    }
}

/// Compiles a pinned, trusted module (an interpreter) in-process.
fn compile_trusted(engine: &Engine, wasm: &[u8]) -> Result<Module, InvalidRequest> {
    Module::new(engine, wasm).map_err(|e| InvalidRequest::InvalidModule { reason: format!("{e:#}") })
}

/// Decides the ABI from the exports; refuses a module that fits neither.
fn guest_abi(module: &Module) -> Result<GuestAbi, InvalidRequest> {
    let func = |name: &str| match module.get_export(name) {
        Some(ExternType::Func(f)) => Some(f),
        _ => None,
    };
    let bad = |reason: String| InvalidRequest::InvalidModule { reason };
    if let Some(start) = func("_start") {
        if start.params().len() != 0 || start.results().len() != 0 {
            return Err(bad("export `_start` must take and return nothing".into()));
        }
        return Ok(GuestAbi::Command);
    }
    let (Some(alloc), Some(run)) = (func("alloc"), func("run")) else {
        return Err(bad("module exports neither `_start` (WASI command) nor `alloc` and `run` (JSON ABI)".into()));
    };
    let is = |ty: &[ValType], want: &[ValType]| {
        ty.len() == want.len() && ty.iter().zip(want).all(|(a, b)| ValType::eq(a, b))
    };
    let sig = |f: &wasmtime::FuncType| (f.params().collect::<Vec<_>>(), f.results().collect::<Vec<_>>());
    let (alloc_params, alloc_results) = sig(&alloc);
    if !is(&alloc_params, &[ValType::I32]) || !is(&alloc_results, &[ValType::I32]) {
        return Err(bad("JSON ABI: `alloc` must be (i32) -> i32".into()));
    }
    let (run_params, run_results) = sig(&run);
    if !is(&run_params, &[ValType::I32, ValType::I32]) || !is(&run_results, &[ValType::I64]) {
        return Err(bad("JSON ABI: `run` must be (i32, i32) -> i64".into()));
    }
    if !matches!(module.get_export("memory"), Some(ExternType::Memory(_))) {
        return Err(bad("JSON ABI: the module must export its `memory`".into()));
    }
    Ok(GuestAbi::JsonAbi { initialize: func("_initialize").is_some() })
}
