//! [`Executor`]: the backend matrix. Picks, per request, the cheapest
//! registered backend that enforces everything the request states, or refuses
//! before any code runs.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tracing::Instrument;

use crate::admission::{Admitted, Door, Finisher, SpillStore, Target};
use crate::backend::{Backend, Readiness, Unavailable};
use crate::capabilities::BackendCapabilities;
use crate::error::{BackendRejection, ExecError};
use crate::language::Language;
use crate::limits::nesting;
use crate::policy::SandboxPolicy;
use crate::program::{Program, ProgramCommand, ProgramSpec};
use crate::request::ExecRequest;
use crate::result::ExecResult;
use crate::tools::ToolRegistry;
use crate::violation::{Control, Violation};
use crate::workspace::Workspace;

/// Registers backends for an [`Executor`].
#[derive(Default)]
pub struct ExecutorBuilder {
    backends: Vec<Arc<dyn Backend>>,
    ceiling: Option<SandboxPolicy>,
    tools: Option<ToolRegistry>,
    artifacts: Option<SpillStore>,
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
    /// [`InvalidRequest::OverCeiling`](crate::error::InvalidRequest::OverCeiling)). Sessions opened outside the
    /// executor are not covered: hold their requests to it yourself.
    pub fn ceiling(mut self, ceiling: SandboxPolicy) -> Self {
        self.ceiling = Some(ceiling);
        self
    }

    /// The tools code may call when a request's policy grants them (Code
    /// Mode; see [`crate::tools`]).
    pub fn tools(mut self, tools: ToolRegistry) -> Self {
        self.tools = Some(tools);
        self
    }

    /// Keeps the stdout of runs that spill it
    /// ([`SandboxPolicy::spill_output`]) in `store`, under each run's
    /// [`ExecRequest::artifact_scope`]. Code reaches the store only through
    /// its tools: add [`ArtifactStore::tools`](crate::artifacts::ArtifactStore::tools)
    /// to the registry ([`ExecutorBuilder::tools`]) and grant them.
    #[cfg(feature = "artifacts")]
    pub fn artifacts(mut self, store: crate::artifacts::store::ArtifactStore) -> Self {
        self.artifacts = Some(store);
        self
    }

    /// Finishes the matrix.
    pub fn build(self) -> Executor {
        let mut backends = self.backends;
        // Stable: registration order breaks ties within a cost class.
        backends.sort_by_key(|b| b.capabilities().cost);
        let backends: Arc<[Arc<dyn Backend>]> = backends.into();
        let door = Door::new(self.ceiling, self.tools, self.artifacts);
        // Code's `workspace.*` tools start programs through an executor
        // whose door has no starter of its own (so nothing holds itself);
        // It holds the backends weakly: a `WeakExecutor` keeps nothing alive.
        let starter = WeakExecutor { backends: Arc::downgrade(&backends), door: door.clone() };
        Executor { backends, door: door.with_programs(Arc::new(starter)) }
    }
}

/// The backend matrix. Cheap to clone; safe to share between threads.
#[derive(Clone)]
pub struct Executor {
    backends: Arc<[Arc<dyn Backend>]>,
    /// The one door: ceiling, tools, artifact store.
    door: Door,
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

    /// A matrix of `backend` alone: every request is admitted to it or
    /// refused, as in any matrix (for callers that want one engine, and
    /// tests of one backend).
    pub fn with_backend(backend: impl Backend) -> Self {
        Self::builder().backend(backend).build()
    }

    /// The tools code may call, if any were registered.
    pub fn tools(&self) -> Option<&ToolRegistry> {
        self.door.tools()
    }

    /// The ceiling every request is held to, if one was set.
    pub fn ceiling(&self) -> Option<&SandboxPolicy> {
        self.door.ceiling()
    }

    /// The store spilled output goes to, if one was set
    /// ([`ExecutorBuilder::artifacts`]).
    #[cfg(feature = "artifacts")]
    pub fn artifacts(&self) -> Option<&crate::artifacts::store::ArtifactStore> {
        self.door.artifacts()
    }

    /// The door its runs pass: a session registry built for this executor
    /// shares it.
    pub(crate) fn door(&self) -> &Door {
        &self.door
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
                // Once each: a backend may offer one set to several languages.
                let mut packages: Vec<String> = Vec::new();
                for package in b.capabilities().languages.iter().flat_map(|l| b.packages(*l)) {
                    if !packages.contains(&package) {
                        packages.push(package);
                    }
                }
                BackendStatus {
                    name: b.name().to_string(),
                    available: availability.is_ok(),
                    unavailable: availability.err(),
                    readiness: b.readiness(),
                    leftovers: b.leftovers(),
                    packages,
                    capabilities: b.capabilities().clone(),
                }
            })
            .collect()
    }

    /// A handle that does not keep the backends alive (e.g. for a signal
    /// handler that must not delay their cleanup when the executor drops).
    pub fn downgrade(&self) -> WeakExecutor {
        WeakExecutor { backends: Arc::downgrade(&self.backends), door: self.door.clone() }
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
    /// (validated and held to the ceiling, as a run would be).
    pub fn select(&self, request: &ExecRequest) -> Result<&Arc<dyn Backend>, ExecError> {
        let mut held = request.clone();
        self.door.hold(&mut held)?;
        self.select_held(&held)
    }

    /// Runs `request` on `backend` alone, admitted exactly as a matrix of
    /// that one backend would admit it (validation, matching, availability,
    /// the deadline, the result caps): for callers that hold one backend.
    pub fn run_on(backend: &dyn Backend, request: ExecRequest) -> Result<ExecResult, ExecError> {
        let (call, finisher) = Self::admit_to(&Door::default(), backend, request)?;
        let span = finisher.span().clone();
        finisher.finish(span.in_scope(|| backend.execute(call)))
    }

    /// [`Executor::select`] for a request already held to the ceiling: the
    /// pinned backend, or the first (cheapest) that enforces everything the
    /// request states and is available; else every backend's violations.
    fn select_held(&self, request: &ExecRequest) -> Result<&Arc<dyn Backend>, ExecError> {
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
            let violations = Door::refusals(request, &target_of(&**backend, request));
            if !violations.is_empty() {
                rejections.push(BackendRejection { backend: backend.name().to_string(), violations });
                continue;
            }
            match backend.availability() {
                Ok(()) => return Ok(backend),
                Err(why) => {
                    unavailable.get_or_insert(why.into_error(backend.name()));
                }
            }
        }
        Err(unavailable.unwrap_or(ExecError::Refused { rejections }))
    }

    /// Admission (see [`crate::admission`]): validates and holds `request`,
    /// picks its backend and admits it there through the door.
    fn admit(&self, mut request: ExecRequest) -> Result<(Arc<dyn Backend>, Admitted, Finisher), ExecError> {
        let selected = self.door.hold(&mut request).and_then(|()| self.select_held(&request).cloned());
        let backend = match selected {
            Ok(backend) => backend,
            Err(err) => {
                crate::observe::refused(&request, &err, None);
                discard(request);
                return Err(err);
            }
        };
        let target = target_of(&*backend, &request);
        let call = self.door.admit(request, &target)?;
        let finisher = call.finisher();
        Ok((backend, call, finisher))
    }

    /// [`Executor::admit`] to one backend, for [`Executor::run_on`]: its
    /// matching and availability, as a matrix of it alone.
    fn admit_to(
        door: &Door,
        backend: &dyn Backend,
        mut request: ExecRequest,
    ) -> Result<(Admitted, Finisher), ExecError> {
        let fits = door.hold(&mut request).and_then(|()| {
            let violations = Door::refusals(&request, &target_of(backend, &request));
            if !violations.is_empty() {
                let rejections = vec![BackendRejection { backend: backend.name().to_string(), violations }];
                return Err(ExecError::Refused { rejections });
            }
            backend.availability().map_err(|why| why.into_error(backend.name()))
        });
        if let Err(err) = fits {
            crate::observe::refused(&request, &err, None);
            discard(request);
            return Err(err);
        }
        let target = target_of(backend, &request);
        let call = door.admit(request, &target)?;
        let finisher = call.finisher();
        Ok((call, finisher))
    }

    /// Starts a program that keeps running in `workspace` (see
    /// [`crate::program`]): held to the ceiling and validated like a run,
    /// then matched against every backend that can carry programs, the
    /// cheapest first; refused before anything starts, every unmet control
    /// named, when none can. The first program of a workspace starts the
    /// container its programs share (~0.3 s); later ones start in a few
    /// milliseconds.
    pub async fn start_program(&self, workspace: &Workspace, spec: ProgramSpec) -> Result<Program, ExecError> {
        let executor = self.clone();
        let workspace = workspace.clone();
        let start = move || executor.start_program_blocking(&workspace, &spec);
        match tokio::runtime::Handle::try_current() {
            Ok(_) => crate::backend::blocking("programs", start).await,
            Err(_) => start(),
        }
    }

    /// [`Executor::start_program`] on the calling thread.
    pub fn start_program_blocking(&self, workspace: &Workspace, spec: &ProgramSpec) -> Result<Program, ExecError> {
        if let Some(why) = workspace.ended() {
            let reason = crate::workspace::WorkspaceError::Ended { why }.to_string();
            return Err(crate::error::InvalidRequest::BadPath { path: "<workspace>".into(), reason }.into());
        }
        let text = match &spec.command {
            ProgramCommand::Shell(line) => line.clone(),
            ProgramCommand::Argv(argv) => argv.join(" "),
        };
        let mut request = ExecRequest::source(Language::Shell, text).policy(spec.policy.clone()).workspace(workspace);
        request.env = spec.env.clone();
        request.packages = spec.packages.clone();
        self.door.hold(&mut request)?;
        let mut rejections = Vec::new();
        let mut unavailable = None;
        for backend in self.backends.iter() {
            let Some(carrier) = backend.program_backend() else {
                let violation = Violation {
                    control: Control::Programs,
                    requested: "a program".into(),
                    reason: "this backend runs code to its end; it cannot keep a program running".into(),
                };
                rejections.push(BackendRejection { backend: backend.name().to_string(), violations: vec![violation] });
                continue;
            };
            let mut violations = Door::refusals(&request, &target_of(&**backend, &request));
            if request.policy.tool_grants().is_some() {
                violations.push(Violation {
                    control: Control::Tools,
                    requested: "tools".into(),
                    reason: "programs cannot call tools (Code Mode runs are one-shot)".into(),
                });
            }
            if !violations.is_empty() {
                rejections.push(BackendRejection { backend: backend.name().to_string(), violations });
                continue;
            }
            match backend.availability() {
                Ok(()) => return carrier.start_program(&request, spec),
                Err(why) => {
                    unavailable.get_or_insert(why.into_error(backend.name()));
                }
            }
        }
        Err(unavailable.unwrap_or(ExecError::Refused { rejections }))
    }

    /// Runs `request` on the calling thread (blocks until the result, at
    /// most about 2 s past the deadline). Refusals return before any code runs.
    pub fn execute_blocking(&self, request: ExecRequest) -> Result<ExecResult, ExecError> {
        let (backend, call, finisher) = self.admit(request)?;
        let span = finisher.span().clone();
        finisher.finish(span.in_scope(|| backend.execute(call)))
    }

    /// Runs `request` without blocking the async caller: inside a tokio
    /// runtime the backend runs it as it can without blocking the task
    /// ([`Backend::execute_async`]: on the task itself for cached `wasm`
    /// modules, which yield at every epoch tick; on tokio's blocking pool
    /// otherwise); elsewhere, inline. Dropping the future gives up the
    /// result: a run on the task ends at once, one on the blocking pool by
    /// its deadline.
    pub async fn execute(&self, request: ExecRequest) -> Result<ExecResult, ExecError> {
        let (backend, call, finisher) = self.admit(request)?;
        let span = finisher.span().clone();
        let result = match tokio::runtime::Handle::try_current() {
            Ok(_) => backend.execute_async(call).instrument(span.clone()).await,
            Err(_) => span.in_scope(|| backend.execute(call)),
        };
        match tokio::runtime::Handle::try_current() {
            // Spilling writes a file, and checking a large output against
            // its schema can take a second: not on the caller's async
            // thread (two such checks stalled a 2-core server's runtime).
            Ok(handle) if finisher.blocks(&result) => handle
                .spawn_blocking(move || finisher.finish(result))
                .await
                .unwrap_or_else(|join_err| Err(ExecError::internal_caused("executor", "finishing failed", join_err))),
            _ => finisher.finish(result),
        }
    }
}

/// An [`Executor`] that may have been dropped (see [`Executor::downgrade`]).
#[derive(Clone)]
pub struct WeakExecutor {
    backends: std::sync::Weak<[Arc<dyn Backend>]>,
    door: Door,
}

impl WeakExecutor {
    /// The executor, if it is still alive.
    pub fn upgrade(&self) -> Option<Executor> {
        Some(Executor { backends: self.backends.upgrade()?, door: self.door.clone() })
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
    pub unavailable: Option<Unavailable>,
    /// Its pre-started capacity, if it keeps any.
    pub readiness: Option<Readiness>,
    /// What it keeps outside any process now ([`Backend::leftovers`]), if
    /// it can list that.
    #[serde(default)]
    pub leftovers: Option<Vec<String>>,
    /// Third-party packages it provides (beyond each language's standard library).
    pub packages: Vec<String>,
    /// What it runs and enforces, and how.
    pub capabilities: BackendCapabilities,
}

/// `backend` as a request's target, with the packages it provides for the
/// request's language (asked only when the request declares some).
fn target_of<'a>(backend: &'a dyn Backend, request: &ExecRequest) -> Target<'a> {
    let packages = if request.packages.is_empty() { Vec::new() } else { backend.packages(request.language) };
    Target { name: backend.name(), capabilities: backend.capabilities(), packages, refusals: Vec::new(), session: None }
}

/// Drops a refused request without letting a hostile, deeply nested input
/// overflow the caller's stack in serde_json's recursive `Drop`.
fn discard(mut request: ExecRequest) {
    if let Some(input) = request.input.take() {
        nesting::drop_deep(input);
    }
}

impl crate::program::ProgramStarter for WeakExecutor {
    fn start_program_blocking(&self, workspace: &Workspace, spec: &ProgramSpec) -> Result<Program, ExecError> {
        let executor = self.upgrade().ok_or_else(|| ExecError::internal("programs", "the executor is gone"))?;
        executor.start_program_blocking(workspace, spec)
    }
}
