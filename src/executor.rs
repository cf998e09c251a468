//! [`Executor`]: the backend matrix. Picks, per request, the cheapest
//! registered backend that enforces everything the request states, or refuses
//! before any code runs.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::capabilities::{BackendCapabilities, Language};
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

    /// Gets ready now rather than on the first request: loads modules,
    /// starts workers or warm instances, and waits at most `limit` for
    /// pre-started capacity (loading a module always finishes). Failures are
    /// not returned; they show up, typed, when a request runs. Default:
    /// nothing to prepare.
    fn prepare(&self, limit: Duration) {
        let _ = limit;
    }

    /// Pre-started capacity, for status displays; `None` when the backend
    /// keeps none.
    fn readiness(&self) -> Option<Readiness> {
        None
    }

    /// For a host about to exit: stops and removes what this backend
    /// started outside its own process (containers, staging directories)
    /// and refuses later runs. Default: nothing outlives the process anyway
    /// (worker processes die with their host).
    fn shutdown(&self) {}

    /// Third-party packages this backend provides for `language`, as it can
    /// tell now (e.g. read from its image). Asked only for requests that
    /// declare packages. Default: none (the language's standard library).
    fn packages(&self, language: Language) -> Vec<String> {
        let _ = language;
        Vec::new()
    }

    /// Opens sessions (state kept across calls) for this backend's
    /// language, if it can.
    fn session_backend(&self) -> Option<Arc<dyn crate::sessions::SessionBackend>> {
        None
    }
}

/// How much pre-started capacity a backend holds (warm instances, idle workers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Readiness {
    /// Started and waiting for a request now.
    pub ready: usize,
    /// How many the backend keeps.
    pub target: usize,
}

/// Registers backends for an [`Executor`].
#[derive(Default)]
pub struct ExecutorBuilder {
    backends: Vec<Arc<dyn Backend>>,
    ceiling: Option<SandboxPolicy>,
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

    /// Adds every backend of `other` (its ceiling is ignored).
    #[cfg(feature = "wasm")]
    pub(crate) fn append(mut self, other: ExecutorBuilder) -> Self {
        self.backends.extend(other.backends);
        self
    }

    /// Holds every request to `ceiling`: its policy becomes
    /// [`SandboxPolicy::within`] the ceiling before a backend is chosen, so
    /// no request gets a longer deadline, a larger cap or a grant the
    /// ceiling lacks (an allow-list beyond it is an
    /// [`InvalidRequest::OverCeiling`]). Sessions opened outside the
    /// executor are not covered: hold their requests to it yourself.
    pub fn ceiling(mut self, ceiling: SandboxPolicy) -> Self {
        self.ceiling = Some(ceiling);
        self
    }

    /// Finishes the matrix.
    pub fn build(self) -> Executor {
        let mut backends = self.backends;
        // Stable: registration order breaks ties within a cost class.
        backends.sort_by_key(|b| b.capabilities().cost);
        Executor { backends: backends.into(), ceiling: self.ceiling.map(Arc::new) }
    }
}

/// The backend matrix. Cheap to clone; safe to share between threads.
#[derive(Clone)]
pub struct Executor {
    backends: Arc<[Arc<dyn Backend>]>,
    ceiling: Option<Arc<SandboxPolicy>>,
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

    /// Every backend compiled in with its default configuration
    /// ([`BackendsConfig::default`](crate::BackendsConfig), see
    /// [`ExecutorBuilder::default_backends`]). The container backend reports
    /// itself unavailable until an engine and its images exist.
    pub fn with_default_backends() -> Self {
        match Self::builder().default_backends(&crate::BackendsConfig::default()) {
            Ok(builder) => builder.build(),
            Err(e) => {
                // The defaults name no setting that can be refused.
                tracing::error!(error = %e, "default backends");
                Self::builder().build()
            }
        }
    }

    /// The ceiling every request is held to, if one was set.
    pub fn ceiling(&self) -> Option<&SandboxPolicy> {
        self.ceiling.as_deref()
    }

    /// Prepares every backend ([`Backend::prepare`]) on threads of their
    /// own and returns at once: for servers, at start-up.
    pub fn prepare_all(&self) {
        for backend in self.backends.iter() {
            let backend = Arc::clone(backend);
            let name = format!("execbox-prepare-{}", backend.name());
            let spawned =
                std::thread::Builder::new().name(name).spawn(move || backend.prepare(Duration::from_secs(30)));
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "cannot start a thread to prepare a backend");
            }
        }
    }

    /// Prepares the backend that would run `request` and waits for it (at
    /// most `limit` for pre-started capacity): for one-shot callers whose
    /// request should not pay for start-up inside its own deadline.
    pub fn prepare_for(&self, request: &ExecRequest, limit: Duration) {
        if let Ok(backend) = self.select(request) {
            backend.prepare(limit);
        }
    }

    /// Each backend's name, availability, readiness and capabilities: what
    /// `execbox backends --json` prints and the MCP tool `list_backends`
    /// returns.
    pub fn status(&self) -> Vec<BackendStatus> {
        self.backends
            .iter()
            .map(|b| {
                let availability = b.availability();
                let mut packages: Vec<String> =
                    b.capabilities().languages.iter().flat_map(|l| b.packages(*l)).collect();
                packages.dedup();
                BackendStatus {
                    name: b.name().to_string(),
                    available: availability.is_ok(),
                    unavailable_reason: availability.err(),
                    readiness: b.readiness(),
                    packages,
                    capabilities: b.capabilities().clone(),
                }
            })
            .collect()
    }

    /// A handle that does not keep the backends alive (e.g. for a signal
    /// handler that must not delay their cleanup when the executor drops).
    pub fn downgrade(&self) -> WeakExecutor {
        WeakExecutor { backends: Arc::downgrade(&self.backends), ceiling: self.ceiling.clone() }
    }

    /// Stops what the backends started outside this process (containers,
    /// staging directories) and refuses later runs: for a host about to exit.
    pub fn shutdown(&self) {
        for backend in self.backends.iter() {
            backend.shutdown();
        }
    }

    /// The registered backends, in selection order.
    pub fn backends(&self) -> impl Iterator<Item = &dyn Backend> {
        self.backends.iter().map(|b| b.as_ref())
    }

    /// Decides which backend would run `request`, without running anything
    /// (held to the ceiling, as a run would be).
    pub fn select(&self, request: &ExecRequest) -> Result<&Arc<dyn Backend>, ExecError> {
        match &self.ceiling {
            Some(ceiling) => {
                let held = ExecRequest { policy: request.policy.within(ceiling)?, ..request.clone() };
                self.select_held(&held)
            }
            None => self.select_held(request),
        }
    }

    /// Holds `request` to the ceiling, in place.
    fn hold(&self, request: &mut ExecRequest) -> Result<(), ExecError> {
        if let Some(ceiling) = &self.ceiling {
            request.policy = request.policy.within(ceiling)?;
        }
        Ok(())
    }

    /// [`Executor::select`] for a request already held to the ceiling.
    fn select_held(&self, request: &ExecRequest) -> Result<&Arc<dyn Backend>, ExecError> {
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
            match matching::check(backend.capabilities(), request).and_then(|()| missing_packages(&**backend, request))
            {
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
        let selected = self.hold(&mut request).and_then(|()| self.select_held(&request));
        match selected {
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
        let backend = match self.hold(&mut request).and_then(|()| self.select_held(&request)) {
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

/// An [`Executor`] that may have been dropped (see [`Executor::downgrade`]).
#[derive(Clone)]
pub struct WeakExecutor {
    backends: std::sync::Weak<[Arc<dyn Backend>]>,
    ceiling: Option<Arc<SandboxPolicy>>,
}

impl WeakExecutor {
    /// The executor, if it is still alive.
    pub fn upgrade(&self) -> Option<Executor> {
        Some(Executor { backends: self.backends.upgrade()?, ceiling: self.ceiling.clone() })
    }
}

/// One backend as status displays show it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BackendStatus {
    /// The backend's name.
    pub name: String,
    /// True when it can run requests now.
    pub available: bool,
    /// Why not, and how to fix it.
    pub unavailable_reason: Option<String>,
    /// Its pre-started capacity, if it keeps any.
    pub readiness: Option<Readiness>,
    /// Third-party packages it provides (beyond each language's standard library).
    pub packages: Vec<String>,
    /// What it runs and enforces, and how.
    pub capabilities: BackendCapabilities,
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

/// The packages `request` declares that `backend` does not provide, as a
/// violation (a backend for another language is already refused by matching).
pub(crate) fn missing_packages(backend: &dyn Backend, request: &ExecRequest) -> Result<(), Vec<matching::Violation>> {
    if request.packages.is_empty() {
        return Ok(());
    }
    let provided = backend.packages(request.language);
    let missing: Vec<&str> = request
        .packages
        .iter()
        .filter(|p| !provided.iter().any(|have| have.eq_ignore_ascii_case(p)))
        .map(String::as_str)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let reason = if provided.is_empty() {
        format!("{} provides no third-party packages for {}", backend.name(), request.language)
    } else {
        format!("{} provides {} for {}", backend.name(), provided.join(", "), request.language)
    };
    Err(vec![matching::Violation {
        control: matching::Control::Packages,
        requested: crate::limits::result_caps::list_names(&missing),
        reason,
    }])
}

/// Most packages a request may declare.
pub const MAX_PACKAGES: usize = 64;

/// Checks that hold whichever backend runs the request (also used by
/// sessions, which bypass selection).
pub(crate) fn validate(request: &ExecRequest) -> Result<(), InvalidRequest> {
    validate_env(request)?;
    validate_packages(&request.packages)?;
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

/// Package names are import names: `[A-Za-z0-9_.-]`, 1 to 100 bytes; at
/// most [`MAX_PACKAGES`].
pub(crate) fn validate_packages(packages: &[String]) -> Result<(), InvalidRequest> {
    let bad = |reason: String| InvalidRequest::BadPackages { reason };
    if packages.len() > MAX_PACKAGES {
        return Err(bad(format!("{} packages, at most {MAX_PACKAGES}", packages.len())));
    }
    for name in packages {
        let ok =
            (1..=100).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
        if !ok {
            return Err(bad(format!(
                "{:?} is not a package name ([A-Za-z0-9_.-], at most 100 bytes)",
                crate::limits::result_caps::cap_text(name.clone(), 100)
            )));
        }
    }
    Ok(())
}

/// Longest environment value accepted, in bytes (container env files are
/// read line by line with a 64 KiB line limit).
pub const MAX_ENV_VALUE_BYTES: usize = 32 << 10;

/// Checks that every variable can reach the program exactly as given: a
/// portable name (`[A-Za-z_][A-Za-z0-9_]*`: engines rewrite others, e.g.
/// docker trims `\u{85}X` to `X`), not a dynamic-loader variable (`LD_*`),
/// and a value without NUL, at most [`MAX_ENV_VALUE_BYTES`].
pub(crate) fn validate_env(request: &ExecRequest) -> Result<(), InvalidRequest> {
    for (name, value) in &request.env {
        let bad = |reason: String| InvalidRequest::BadEnv { name: name.clone(), reason };
        let mut chars = name.bytes();
        let portable = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == b'_');
        if !portable || name.len() > 256 {
            return Err(bad("names must match [A-Za-z_][A-Za-z0-9_]* (at most 256 bytes)".into()));
        }
        if name.starts_with("LD_") {
            // They would reach the sandbox's own helpers (the container's
            // in-container timer) before the program.
            return Err(bad("dynamic-loader variables (LD_*) cannot be passed".into()));
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
pub(crate) fn finish(result: Result<ExecResult, ExecError>, policy: &SandboxPolicy) -> Result<ExecResult, ExecError> {
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
