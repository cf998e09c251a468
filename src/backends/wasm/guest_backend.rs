//! [`WasmGuest`]: the `wasm` backend, running a request's own module.

use std::sync::Arc;

use wasmtime_wasi::FsPerms;

use super::capabilities::capabilities;
use super::compile::{CacheStats, CompileRefusal, ModuleCache};
use super::config::WasmGuestConfig;
use super::engine::{SlotPermit, WasmEngine};
use super::guest::{Compiled, GuestAbi, Preopen};
use super::module_limits::Ceilings;
use super::run::{self, early_result};
use super::staging::{INPUT_DIR, policy_preopens, stage_input_files, workspace_mount};
use crate::admission::Admitted;
use crate::backend::{Backend, RunFuture, on_blocking_pool};
use crate::capabilities::BackendCapabilities;
use crate::error::{ConfigError, ExecError, InvalidRequest};
use crate::limits::deadline::Deadline;
use crate::policy::Access;
use crate::request::{ExecRequest, Payload};
use crate::result::{ExecResult, Outcome};

/// In-process WebAssembly guests (backend `wasm`) on a (possibly shared)
/// [`WasmEngine`]: WASI preview-1 commands and JSON-ABI reactors, under
/// every limit described in the [module docs](super). A request's staged
/// `input_files` appear read-only under `/input`.
///
/// Cheap to share (`Executor` holds it in an `Arc`); dropping the last
/// handle on its engine stops the engine's epoch ticker thread.
pub struct WasmGuest {
    engine: Arc<WasmEngine>,
    cache: ModuleCache,
    caps: BackendCapabilities,
}

impl WasmGuest {
    /// The backend's name in results and refusals.
    pub const NAME: &'static str = "wasm";

    /// A backend with `cfg` on an engine of its own (≈5 ms to build: do it
    /// once). Errors as [`WasmEngine::new`] does.
    pub fn new(cfg: WasmGuestConfig) -> Result<Self, ConfigError> {
        Ok(Self::on_engine(WasmEngine::new(cfg)?))
    }

    /// A backend on a shared `engine`, with its settings and a module cache
    /// of its own (in memory, and in the engine's `disk_cache_dir` if set).
    ///
    /// This second constructor exists because an engine is more than
    /// settings: it owns the instance slots (and their reserved address
    /// space), the epoch ticker thread and the compile workers. The wasm
    /// backends of a matrix share one engine
    /// ([`ExecutorBuilder::wasm_backends`](crate::executor::ExecutorBuilder::wasm_backends)),
    /// so `pooled_instances` bounds their concurrent instances together
    /// instead of each reserving a pool of its own.
    pub fn on_engine(engine: Arc<WasmEngine>) -> Self {
        let cfg = engine.config();
        let cache = ModuleCache::new(&engine, cfg.module_cache_entries, engine.disk_cache().cloned());
        let caps = capabilities(&engine);
        Self { engine, cache, caps }
    }

    /// The settings in use.
    pub fn config(&self) -> &WasmGuestConfig {
        self.engine.config()
    }

    /// The engine this backend runs on.
    pub fn engine(&self) -> &Arc<WasmEngine> {
        &self.engine
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
            Err(CompileRefusal::Invalid(e)) => Err(e.into()),
            Err(CompileRefusal::TooBigToStart(reason)) => Err(InvalidRequest::InvalidModule { reason }.into()),
            Err(CompileRefusal::DeadlinePassed) => Err(ExecError::internal(Self::NAME, "no deadline, yet it passed")),
        }
    }

    fn ceilings(&self) -> Ceilings {
        let cfg = self.config();
        Ceilings { memory_bytes: cfg.max_memory_bytes, table_elements: cfg.max_table_elements as u64 }
    }

    /// Runs on the current thread, which may block.
    fn execute_here(&self, mut call: Admitted) -> Result<ExecResult, ExecError> {
        // The clock started at admission: a compile counts against the
        // run's deadline and its duration.
        let deadline = call.deadline();
        let module = call.take_module(Self::NAME)?;
        let cfg = self.config();
        let compiled = match self.cache.get_untrusted(&module, &cfg.module_limits, &self.ceilings(), &deadline) {
            Ok(compiled) => compiled,
            Err(CompileRefusal::Invalid(e)) => return Err(e.into()),
            Err(CompileRefusal::TooBigToStart(why)) => {
                return Ok(early_result(Self::NAME, Outcome::OutOfMemory, why, &deadline));
            }
            Err(CompileRefusal::DeadlinePassed) => return Ok(compile_timed_out(Self::NAME, &deadline)),
        };
        drop(module);
        if deadline.expired() {
            return Ok(compile_timed_out(Self::NAME, &deadline));
        }
        let (job, _staged) = self.job(call, compiled.abi)?;
        run::run(&self.engine, Self::NAME, &compiled, job, deadline)
    }

    /// The run of `call` on a module with `abi`, and the directory its input
    /// files are staged in (removed when dropped: keep it until the run ends).
    fn job(&self, mut call: Admitted, abi: GuestAbi) -> Result<(run::Job, Option<tempfile::TempDir>), ExecError> {
        let input = call.take_input_json(self.config().defaults.max_input_nesting, Self::NAME)?;
        let tools = call.tools().cloned();
        let mut request = call.into_request();
        let guest_input = match abi {
            GuestAbi::Command => match (request.stdin.take(), input) {
                (Some(_), Some(_)) => {
                    return Err(InvalidRequest::Conflict(
                        "a WASI command gets `input` as JSON on stdin: give either stdin or input, not both",
                    )
                    .into());
                }
                (stdin, input) => input.or(stdin).unwrap_or_default(),
            },
            GuestAbi::JsonAbi { .. } => input.unwrap_or_else(|| b"null".to_vec()),
        };

        let policy = &request.policy;
        // No grants: no file work (the mount check reads nothing).
        let mut preopens = policy_preopens(policy)?;
        // A guest's input files stay in `/input`; a workspace is `/work`.
        preopens.extend(workspace_mount(&request));
        let staged = stage_input_files(&request, None)?;
        if let Some(dir) = &staged {
            preopens.push(Preopen {
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
            tools,
        };
        Ok((job, staged))
    }

    /// The module and the instance slot of `call` if it can run on the
    /// async task: its module is cached, it is granted no files (staging
    /// them, checking their mounts and every file operation would be
    /// blocking work) and an instance slot is free now. Otherwise it goes to
    /// the blocking pool, which compiles, stages and waits.
    fn on_task(&self, call: &Admitted) -> Option<(Arc<Compiled>, SlotPermit)> {
        if !self.config().async_runs || uses_files(call.request()) {
            return None;
        }
        let Payload::WasmModule(module) = &call.request().payload else { return None };
        let compiled = self.cache.cached(module, &self.config().module_limits)?;
        let slot = self.engine.try_acquire_slot(0)?;
        Some((compiled, slot))
    }
}

/// True when `request` is granted files: host directories, or input files
/// staged for it.
fn uses_files(request: &ExecRequest) -> bool {
    let granted = match &request.policy.filesystem {
        Access::Allow(grants) => !(grants.read_only.is_empty() && grants.read_write.is_empty()),
        _ => false,
    };
    granted || !request.input_files.is_empty()
}

/// `timed_out`: the deadline passed before the module was ready.
fn compile_timed_out(backend: &str, deadline: &Deadline) -> ExecResult {
    let message = format!("{} while compiling the module, before it ran", deadline.exceeded_message());
    early_result(backend, Outcome::TimedOut, message, deadline)
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

    /// On the caller's task when the module is cached (see
    /// [`WasmGuestConfig::async_runs`]), else on tokio's blocking pool.
    fn execute_async(self: Arc<Self>, call: Admitted) -> RunFuture {
        let Some((compiled, slot)) = self.on_task(&call) else { return Box::pin(on_blocking_pool(self, call)) };
        Box::pin(async move {
            let deadline = call.deadline();
            let (job, _staged) = self.job(call, compiled.abi)?;
            run::run_async(&self.engine, Self::NAME, &compiled, job, deadline, slot).await
        })
    }
}
