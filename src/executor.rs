//! [`Executor`]: the backend matrix. Picks, per request, the cheapest
//! registered backend that enforces everything the request states, or refuses
//! before any code runs.

use std::sync::Arc;

use crate::capabilities::BackendCapabilities;
use crate::error::{BackendRejection, ExecError, InvalidRequest};
use crate::limits::{nesting, result_caps};
use crate::matching;
use crate::policy::{Access, SandboxPolicy};
use crate::request::ExecRequest;
use crate::result::ExecResult;

/// One way of running code. Implementations must be honest: a control is
/// declared enforced in [`BackendCapabilities`] only if it holds against
/// hostile code.
pub trait Backend: Send + Sync + 'static {
    /// Unique, stable name (used for pinning and in results).
    fn name(&self) -> &str;

    /// What this backend runs and enforces.
    fn capabilities(&self) -> &BackendCapabilities;

    /// `Err(reason)` if the backend cannot run anything right now (engine or
    /// image missing); the reason should say how to fix it.
    fn availability(&self) -> Result<(), String> {
        Ok(())
    }

    /// Runs a request that has already passed matching. Blocks until the run
    /// ends or its deadline passes. A program's failure is an `Ok` result.
    fn execute(&self, request: ExecRequest) -> Result<ExecResult, ExecError>;
}

/// Registers backends for an [`Executor`].
#[derive(Default)]
pub struct ExecutorBuilder {
    backends: Vec<Arc<dyn Backend>>,
}

impl ExecutorBuilder {
    /// Adds a backend. Among backends that satisfy a request, the lowest cost
    /// class wins, then the earliest registered.
    pub fn backend(mut self, backend: impl Backend) -> Self {
        self.backends.push(Arc::new(backend));
        self
    }

    /// Adds a shared backend.
    pub fn shared_backend(mut self, backend: Arc<dyn Backend>) -> Self {
        self.backends.push(backend);
        self
    }

    /// The wasm guest backend and the interpreters in wasm (QuickJS, CPython),
    /// all on one shared [`WasmEngine`](crate::backends::WasmEngine) (one
    /// engine, one instance pool, one epoch ticker thread); each keeps its own
    /// module cache. An interpreter whose module is missing reports itself
    /// unavailable. Engine creation only fails when even on-demand
    /// allocation is refused; the matrix then runs without these backends.
    #[cfg(feature = "wasm")]
    pub fn wasm_backends(mut self) -> Self {
        use crate::backends::wasm::{Interpreter, WasmEngine, WasmGuest, WasmGuestConfig, WasmInterpreter};
        let engine = match WasmEngine::new(WasmGuestConfig::default()) {
            Ok(engine) => engine,
            Err(e) => {
                tracing::warn!(error = %e, "no wasm backends: cannot build the wasm engine");
                return self;
            }
        };
        match WasmGuest::on_engine(engine.clone()) {
            Ok(wasm) => self = self.backend(wasm),
            Err(e) => tracing::warn!(error = %e, "no wasm guest backend"),
        }
        let dir = crate::backends::wasm::interpreters::interpreters_dir();
        for kind in [Interpreter::QuickJs, Interpreter::Python] {
            match WasmInterpreter::on_engine(kind, dir.clone(), engine.clone()) {
                Ok(interpreter) => self = self.backend(interpreter),
                Err(e) => tracing::warn!(error = %e, backend = kind.backend_name(), "interpreter backend not built"),
            }
        }
        self
    }

    /// Finishes the matrix.
    pub fn build(self) -> Executor {
        let mut backends = self.backends;
        // Stable: registration order breaks ties within a cost class.
        backends.sort_by_key(|b| b.capabilities().cost);
        Executor { backends: backends.into() }
    }
}

/// The backend matrix. Cheap to clone; safe to share between threads.
#[derive(Clone)]
pub struct Executor {
    backends: Arc<[Arc<dyn Backend>]>,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.backends.iter().map(|b| b.name())).finish()
    }
}

impl Executor {
    /// Starts an empty matrix.
    pub fn builder() -> ExecutorBuilder {
        ExecutorBuilder::default()
    }

    /// Every backend compiled in with its default configuration:
    /// [`crate::backends::BoaJs`] (feature `js`),
    /// [`crate::backends::WasmGuest`] and the QuickJS and CPython
    /// [`crate::backends::WasmInterpreter`]s (feature `wasm`) and
    /// [`crate::backends::Container`] on docker (feature `container`; it
    /// reports itself unavailable until an engine and its images exist).
    pub fn with_default_backends() -> Self {
        #[allow(unused_mut)]
        let mut builder = Self::builder();
        #[cfg(feature = "js")]
        {
            builder = builder.backend(crate::backends::BoaJs::default());
        }
        #[cfg(feature = "wasm")]
        {
            builder = builder.wasm_backends();
        }
        #[cfg(feature = "container")]
        {
            builder = builder.backend(crate::backends::Container::docker());
        }
        builder.build()
    }

    /// The registered backends, in selection order.
    pub fn backends(&self) -> impl Iterator<Item = &dyn Backend> {
        self.backends.iter().map(|b| b.as_ref())
    }

    /// Decides which backend would run `request`, without running anything.
    pub fn select(&self, request: &ExecRequest) -> Result<&Arc<dyn Backend>, ExecError> {
        validate(request)?;
        let names = || self.backends.iter().map(|b| b.name().to_string()).collect();

        let pinned = match &request.backend {
            Some(name) => match self.backends.iter().find(|b| b.name() == name) {
                Some(b) => Some(b),
                None => return Err(ExecError::UnknownBackend { name: name.clone(), available: names() }),
            },
            None => {
                if !self.backends.iter().any(|b| b.capabilities().languages.contains(&request.language)) {
                    return Err(ExecError::UnsupportedLanguage { language: request.language, available: names() });
                }
                None
            }
        };

        let mut rejections = Vec::new();
        let mut unavailable = None;
        for backend in pinned.into_iter().chain(self.backends.iter().filter(|_| pinned.is_none())) {
            match matching::check(backend.capabilities(), request) {
                Ok(()) => match backend.availability() {
                    Ok(()) => return Ok(backend),
                    Err(reason) => {
                        unavailable.get_or_insert(ExecError::BackendUnavailable {
                            backend: backend.name().to_string(),
                            reason,
                        });
                    }
                },
                Err(violations) => {
                    rejections.push(BackendRejection { backend: backend.name().to_string(), violations })
                }
            }
        }
        Err(unavailable.unwrap_or(ExecError::Refused { rejections }))
    }

    /// Runs `request` on the calling thread (blocks until the result or the
    /// deadline). Refusals return before any code runs.
    pub fn execute_blocking(&self, mut request: ExecRequest) -> Result<ExecResult, ExecError> {
        match self.select(&request) {
            Ok(backend) => {
                let policy = prepare(&mut request, backend.capabilities());
                finish(backend.execute(request), &policy)
            }
            Err(err) => {
                discard(request);
                Err(err)
            }
        }
    }

    /// Runs `request` without blocking the async caller: inside a tokio
    /// runtime the run happens on its blocking pool; elsewhere, inline.
    pub async fn execute(&self, mut request: ExecRequest) -> Result<ExecResult, ExecError> {
        let backend = match self.select(&request) {
            Ok(backend) => Arc::clone(backend),
            Err(err) => {
                discard(request);
                return Err(err);
            }
        };
        let policy = prepare(&mut request, backend.capabilities());
        let result = match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let name = backend.name().to_string();
                let run = move || {
                    let _marked = BlockingPoolMark::set();
                    backend.execute(request)
                };
                handle.spawn_blocking(run).await.unwrap_or_else(|join_err| {
                    Err(ExecError::internal(&name, format!("worker task failed: {join_err}")))
                })
            }
            Err(_) => backend.execute(request),
        };
        finish(result, &policy)
    }
}

thread_local! {
    static ON_BLOCKING_POOL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks the current thread as a tokio blocking-pool thread running one request.
struct BlockingPoolMark;

impl BlockingPoolMark {
    fn set() -> Self {
        ON_BLOCKING_POOL.set(true);
        BlockingPoolMark
    }
}

impl Drop for BlockingPoolMark {
    fn drop(&mut self) {
        ON_BLOCKING_POOL.set(false);
    }
}

/// True when the current thread may block on a nested runtime: no tokio
/// runtime is entered here, or [`Executor::execute`] moved the run onto
/// tokio's blocking pool. False on an async worker thread, where a backend
/// that blocks (e.g. sync WASI) must move to a thread of its own.
#[cfg_attr(not(feature = "wasm"), allow(dead_code))]
pub(crate) fn may_block_here() -> bool {
    ON_BLOCKING_POOL.get() || tokio::runtime::Handle::try_current().is_err()
}

/// Checks that hold whichever backend runs the request (also used by
/// sessions, which bypass selection).
pub(crate) fn validate(request: &ExecRequest) -> Result<(), InvalidRequest> {
    validate_env(request)?;
    let policy = &request.policy;
    if let Some(max) = policy.max_code_bytes {
        let size = request.payload.len() as u64;
        if size > max {
            return Err(InvalidRequest::CodeTooLarge { size, max });
        }
    }
    if !request.env.is_empty() {
        let allowed: &[String] = match &policy.environment {
            Access::Allow(names) => names,
            Access::Deny => &[],
            // Not asked: the request's own values are the grant; matching
            // still requires a backend that can pass exactly those.
            Access::NotAsked => return Ok(()),
        };
        let names: Vec<String> = request.env.keys().filter(|k| !allowed.contains(k)).cloned().collect();
        if !names.is_empty() {
            return Err(InvalidRequest::EnvNotAllowed { names });
        }
    }
    Ok(())
}

/// Longest environment value accepted, in bytes (container env files are
/// read line by line with a 64 KiB line limit).
pub const MAX_ENV_VALUE_BYTES: usize = 32 << 10;

/// Checks that every variable can reach the program exactly as given: a
/// portable name (`[A-Za-z_][A-Za-z0-9_]*`: engines rewrite others, e.g.
/// docker trims `\u{85}X` to `X`) and a value without NUL, at most
/// [`MAX_ENV_VALUE_BYTES`].
fn validate_env(request: &ExecRequest) -> Result<(), InvalidRequest> {
    for (name, value) in &request.env {
        let bad = |reason: String| InvalidRequest::BadEnv { name: name.clone(), reason };
        let mut chars = name.bytes();
        let portable = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == b'_');
        if !portable || name.len() > 256 {
            return Err(bad("names must match [A-Za-z_][A-Za-z0-9_]* (at most 256 bytes)".into()));
        }
        if value.len() > MAX_ENV_VALUE_BYTES {
            return Err(bad(format!("the value is {} bytes, over the limit of {MAX_ENV_VALUE_BYTES}", value.len())));
        }
        if value.contains('\0') {
            return Err(bad("values cannot hold NUL".into()));
        }
    }
    Ok(())
}

/// Completes the policy with the chosen backend's defaults (no run goes
/// without a deadline) and returns the policy the result is capped by.
fn prepare(request: &mut ExecRequest, caps: &BackendCapabilities) -> SandboxPolicy {
    request.policy.timeout_ms.get_or_insert(caps.default_timeout_ms);
    request.policy.clone()
}

/// Caps the fields of a result that are not streams (see [`result_caps`]).
fn finish(result: Result<ExecResult, ExecError>, policy: &SandboxPolicy) -> Result<ExecResult, ExecError> {
    result.map(|mut r| {
        result_caps::cap_result(&mut r, policy);
        r
    })
}

/// Drops a refused request without letting a hostile, deeply nested input
/// overflow the caller's stack in serde_json's recursive `Drop`.
fn discard(mut request: ExecRequest) {
    if let Some(input) = request.input.take() {
        nesting::drop_deep(input);
    }
}
