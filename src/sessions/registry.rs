//! The registry of live sessions: opening, admission of calls, expiry and
//! the overrun backstop, closing. See the module docs of [`crate::sessions`].

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use super::config::SessionConfig;
use super::error::SessionError;
use super::session::{CALL_OVERRUN_LIMIT, Session, SessionBackend};
use super::table::{Entry, Inner, State, end_all, expire};
use super::turns::Turns;
use crate::admission::{Admitted, Door, SpillStore, Target};
use crate::error::{BackendRejection, ExecError};
use crate::language::Language;
use crate::policy::SandboxPolicy;
use crate::request::ExecRequest;
use crate::result::ExecResult;
use crate::session_spec::{SessionSpec, fixed_at_open};
use crate::tools::ToolRegistry;

/// The registry of live sessions. Cheap to clone (shared). Build with
/// [`Sessions::builder`] or [`Sessions::for_executor`].
#[derive(Clone)]
pub struct Sessions {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions").field("cfg", &self.inner.cfg).field("live", &self.len()).finish_non_exhaustive()
    }
}

/// Builds a [`Sessions`] registry: its bounds, its session backends (the
/// first added for a language that can honour a spec opens it), and the
/// ceiling every session and call is held to.
#[derive(Default)]
pub struct SessionsBuilder {
    cfg: SessionConfig,
    backends: Vec<Arc<dyn SessionBackend>>,
    ceiling: Option<SandboxPolicy>,
    tools: Option<ToolRegistry>,
    artifacts: Option<SpillStore>,
    /// An executor's door, shared as it is (`Sessions::for_executor`).
    door: Option<Door>,
}

impl SessionsBuilder {
    /// Sets the bounds (default: [`SessionConfig::default`]).
    pub fn config(mut self, cfg: SessionConfig) -> Self {
        self.cfg = cfg;
        self
    }

    /// Adds a backend that opens sessions.
    pub fn backend(self, backend: impl SessionBackend + 'static) -> Self {
        self.shared_backend(Arc::new(backend))
    }

    /// Adds a shared backend that opens sessions.
    pub fn shared_backend(mut self, backend: Arc<dyn SessionBackend>) -> Self {
        self.backends.push(backend);
        self
    }

    /// Holds every session's spec and every call to `ceiling` (see
    /// [`SandboxPolicy::within`]), as an executor's ceiling holds its runs.
    pub fn ceiling(mut self, ceiling: SandboxPolicy) -> Self {
        self.ceiling = Some(ceiling);
        self
    }

    /// The tools session cells may call when their policy grants them.
    pub fn tools(mut self, tools: ToolRegistry) -> Self {
        self.tools = Some(tools);
        self
    }

    /// Keeps the stdout of cells that spill it
    /// ([`SandboxPolicy::spill_output`]) in `store`, under each cell's
    /// scope (its session's, [`Sessions::artifact_scope`], unless its
    /// caller set one). Cells reach the store through its tools, added to
    /// the registry ([`SessionsBuilder::tools`]) and granted.
    #[cfg(feature = "artifacts")]
    pub fn artifacts(mut self, store: crate::artifacts::store::ArtifactStore) -> Self {
        self.artifacts = Some(store);
        self
    }

    /// Finishes the registry.
    pub fn build(self) -> Sessions {
        Sessions {
            inner: Arc::new(Inner {
                cfg: self.cfg,
                backends: self.backends,
                door: self.door.unwrap_or_else(|| Door::new(self.ceiling, self.tools, self.artifacts)),
                state: Mutex::new(State::default()),
            }),
        }
    }
}

impl Sessions {
    /// A registry to configure; see [`SessionsBuilder`].
    pub fn builder() -> SessionsBuilder {
        SessionsBuilder::default()
    }

    /// A registry whose sessions open on the executor's backends that keep
    /// state ([`Backend::session_backends`](crate::backend::Backend::session_backends)),
    /// in selection order, held to the executor's ceiling, with its tools
    /// and its artifact store.
    pub fn for_executor(cfg: SessionConfig, executor: &crate::executor::Executor) -> Self {
        let mut builder = executor
            .backends()
            .flat_map(|b| b.session_backends())
            .fold(Self::builder().config(cfg), SessionsBuilder::shared_backend);
        builder.door = Some(executor.door().clone());
        builder.build()
    }

    /// The scope the cells of session `id` run in
    /// ([`ExecRequest::artifact_scope`], when their caller sets none):
    /// `session:<id>`. A host reads a session's artifacts under it.
    pub fn artifact_scope(id: &str) -> String {
        format!("session:{id}")
    }

    /// The bounds in use.
    pub fn config(&self) -> &SessionConfig {
        &self.inner.cfg
    }

    /// The ceiling sessions and calls are held to, if any.
    pub fn ceiling(&self) -> Option<&SandboxPolicy> {
        self.inner.door.ceiling()
    }

    /// Languages that have sessions here.
    pub fn languages(&self) -> Vec<Language> {
        let mut languages: Vec<Language> = Vec::new();
        for language in self.inner.backends.iter().map(|b| b.session_language()) {
            if !languages.contains(&language) {
                languages.push(language);
            }
        }
        languages
    }

    /// Live sessions.
    pub fn len(&self) -> usize {
        self.inner.lock().live.len()
    }

    /// True when no session is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when session `id` is live.
    pub fn is_open(&self, id: &str) -> bool {
        self.inner.lock().live.contains_key(id)
    }

    /// Calls in flight (waiting for their turn or running), all sessions together.
    pub fn calls_in_flight(&self) -> usize {
        self.inner.lock().live.values().map(|e| e.calls.len()).sum()
    }

    /// Opens a session under `id`: its spec is held to the ceiling, then the
    /// first session backend of its language that provides its packages and
    /// enforces everything it states opens it. If none can, the refusal
    /// names, per backend, every unmet control.
    pub fn open(&self, id: &str, spec: SessionSpec) -> Result<(), SessionError> {
        let spec = self.hold_spec(spec)?;
        let backend = self.backend_for(&spec)?;
        let reserved = {
            let mut state = self.inner.lock();
            if state.live.contains_key(id) {
                return Err(SessionError::Exists { id: id.into() });
            }
            let max = self.inner.cfg.max_sessions;
            if state.live.len() + state.opening >= max {
                return Err(SessionError::TooMany { max });
            }
            // A new session under a lost id is a deliberate fresh start.
            state.lost.retain(|(lost, _)| lost != id);
            Opening::reserve(&self.inner, &mut state)
        };
        let opened = backend.open_session(&spec);
        let provided = backend.session_packages();
        let mut state = self.inner.lock();
        reserved.finish(&mut state);
        let session: Arc<dyn Session> = Arc::from(opened?);
        if state.live.contains_key(id) {
            // Another caller opened the same id meanwhile: theirs stays;
            // this one ends (outside the lock).
            drop(state);
            session.kill();
            return Err(SessionError::Exists { id: id.into() });
        }
        let entry = Entry {
            session,
            spec: Arc::new(spec),
            packages: provided,
            turns: Arc::new(Turns::default()),
            last_used: Instant::now(),
            calls: HashMap::new(),
        };
        state.live.insert(id.to_string(), entry);
        self.start_expiry(&mut state);
        Ok(())
    }

    /// Opens a session under a new random id, and returns it.
    pub fn open_new(&self, spec: SessionSpec) -> Result<String, SessionError> {
        let id = super::session::new_id();
        self.open(&id, spec)?;
        Ok(id)
    }

    /// Runs `request` in session `id`: [`SessionError::Unknown`] if none is
    /// open, [`SessionError::Lost`] (once) if it ended. Blocks, at most about
    /// the request's deadline plus 2 s.
    pub fn execute(&self, id: &str, request: ExecRequest) -> Result<ExecResult, SessionError> {
        self.run(id, request, false)
    }

    /// Like [`Sessions::execute`], but opens a session under the request's
    /// own spec ([`SessionSpec::of_request`]) when none has this id (the
    /// agent layer's semantics: the id is the caller's). A lost session is
    /// still reported once first.
    pub fn execute_or_open(&self, id: &str, request: ExecRequest) -> Result<ExecResult, SessionError> {
        self.run(id, request, true)
    }

    /// Closes session `id` now: its interpreter is killed, even while a
    /// call of it runs (that call ends as `killed`). False if none was open.
    pub fn close(&self, id: &str) -> bool {
        self.close_where(|key| key == id) > 0
    }

    /// Closes every session whose id `matches` (e.g. all of one client's),
    /// as [`Sessions::close`] does; returns how many.
    pub fn close_where(&self, matches: impl Fn(&str) -> bool) -> usize {
        let removed: Vec<Entry> = {
            let mut state = self.inner.lock();
            state.lost.retain(|(id, _)| !matches(id));
            let ids: Vec<String> = state.live.keys().filter(|id| matches(id)).cloned().collect();
            ids.iter().filter_map(|id| state.live.remove(id)).collect()
        };
        end_all(&removed);
        removed.len()
    }

    /// Closes every session (e.g. at shutdown).
    pub fn close_all(&self) -> usize {
        self.close_where(|_| true)
    }

    /// Validates the spec and holds its policy to the ceiling.
    fn hold_spec(&self, mut spec: SessionSpec) -> Result<SessionSpec, SessionError> {
        let mut template = spec.template();
        self.inner.door.hold(&mut template)?;
        spec.policy = template.policy;
        Ok(spec)
    }

    /// The first session backend of the spec's language that provides its
    /// packages and enforces everything it states.
    fn backend_for(&self, spec: &SessionSpec) -> Result<Arc<dyn SessionBackend>, SessionError> {
        let language = spec.language;
        let of_language: Vec<&Arc<dyn SessionBackend>> =
            self.inner.backends.iter().filter(|b| b.session_language() == language).collect();
        if of_language.is_empty() {
            return Err(SessionError::Unsupported { language });
        }
        let template = spec.template();
        let mut rejections = Vec::new();
        let mut unprovided = spec.packages.clone();
        for backend in of_language {
            let target = Target {
                name: backend.session_name(),
                capabilities: backend.session_capabilities(),
                packages: backend.session_packages(),
                refusals: backend.open_refusals(spec),
                session: None,
            };
            unprovided.retain(|p| !target.packages.iter().any(|have| have.eq_ignore_ascii_case(p)));
            let violations = Door::refusals(&template, &target);
            if violations.is_empty() {
                return Ok(backend.clone());
            }
            rejections.push(BackendRejection { backend: backend.session_name().to_string(), violations });
        }
        if !unprovided.is_empty() {
            return Err(SessionError::PackagesUnavailable { language, packages: unprovided });
        }
        Err(SessionError::Exec(ExecError::Refused { rejections }))
    }

    fn run(&self, id: &str, mut request: ExecRequest, open_if_unknown: bool) -> Result<ExecResult, SessionError> {
        self.prepare(id, &mut request)?;
        let call = loop {
            match self.admit(id, request, open_if_unknown)? {
                Admission::Ready(call) => break call,
                Admission::Open(unopened) => {
                    match self.open(id, SessionSpec::of_request(&unopened)) {
                        Ok(()) | Err(SessionError::Exists { .. }) => {}
                        Err(e) => return Err(e),
                    }
                    request = unopened;
                }
            }
        };
        // Waiting for earlier calls counts against this call's deadline.
        let turn = call.turns.take(call.admitted.deadline().remaining());
        let finisher = call.admitted.finisher();
        let span = finisher.span().clone();
        let result = match turn {
            Some(_turn) => span.in_scope(|| call.session.execute(call.admitted)),
            None => Err(busy(call.session.backend())),
        };
        let result = finisher.finish(result);
        self.conclude(id, &call.session, call.in_flight, result)
    }

    /// [`Sessions::execute`] without blocking the async caller: the
    /// registry's own waits (a session being opened, earlier calls of the
    /// same session) go to tokio's blocking pool only when there is
    /// something to wait for, and the call itself runs as its session
    /// awaits it ([`Session::execute_async`]: a JavaScript session on an
    /// execbox runtime talks to its worker on the caller's task; others run
    /// on the blocking pool). Inside a tokio runtime only. Dropping the
    /// future gives up the result; the call ends by its deadline (a
    /// JavaScript call awaited on the task ends at once, its session with
    /// it).
    pub async fn execute_async(&self, id: &str, request: ExecRequest) -> Result<ExecResult, SessionError> {
        self.run_async(id, request, false).await
    }

    /// [`Sessions::execute_or_open`] without blocking the async caller (see
    /// [`Sessions::execute_async`]).
    pub async fn execute_or_open_async(&self, id: &str, request: ExecRequest) -> Result<ExecResult, SessionError> {
        self.run_async(id, request, true).await
    }

    async fn run_async(
        &self,
        id: &str,
        mut request: ExecRequest,
        open_if_unknown: bool,
    ) -> Result<ExecResult, SessionError> {
        self.prepare(id, &mut request)?;
        let call = loop {
            match self.admit(id, request, open_if_unknown)? {
                Admission::Ready(call) => break call,
                Admission::Open(unopened) => {
                    // Starting an interpreter blocks (a worker, a container).
                    let (this, key, spec) = (self.clone(), id.to_string(), SessionSpec::of_request(&unopened));
                    match crate::backend::blocking(NAME, move || Ok(this.open(&key, spec))).await? {
                        Ok(()) | Err(SessionError::Exists { .. }) => {}
                        Err(e) => return Err(e),
                    }
                    request = unopened;
                }
            }
        };
        let turn = match call.turns.try_take() {
            Some(turn) => Some(turn),
            None => {
                let (turns, limit) = (call.turns.clone(), call.admitted.deadline().remaining());
                crate::backend::blocking(NAME, move || Ok(turns.take(limit))).await?
            }
        };
        let finisher = call.admitted.finisher();
        let span = finisher.span().clone();
        let result = match turn {
            Some(_turn) => {
                let abandoned = Abandoned { inner: self.inner.clone(), id, session: Some(call.session.clone()) };
                let result = call.session.clone().execute_async(call.admitted).instrument(span).await;
                abandoned.disarm();
                result
            }
            None => Err(busy(call.session.backend())),
        };
        // Spilling writes a file, checking a large output can take a
        // second, and a session that died is killed (a
        // container's through its engine): off the async thread.
        let dead = !call.session.is_alive();
        if finisher.blocks(&result) || dead {
            let (this, key, session, in_flight) = (self.clone(), id.to_string(), call.session, call.in_flight);
            return crate::backend::blocking(NAME, move || {
                let result = finisher.finish(result);
                Ok(this.conclude(&key, &session, in_flight, result))
            })
            .await?;
        }
        let result = finisher.finish(result);
        self.conclude(id, &call.session, call.in_flight, result)
    }

    /// Holds a call's request to the ceiling; its cells share the
    /// session's artifacts unless their caller named a scope.
    fn prepare(&self, id: &str, request: &mut ExecRequest) -> Result<(), SessionError> {
        self.inner.door.hold(request)?;
        request.artifact_scope.get_or_insert_with(|| Self::artifact_scope(id));
        Ok(())
    }

    /// Admits a call of session `id` through the door, counted in flight;
    /// [`Admission::Open`] when no session has the id and the caller may
    /// open one.
    fn admit(&self, id: &str, request: ExecRequest, open_if_unknown: bool) -> Result<Admission, SessionError> {
        let mut state = self.inner.lock();
        if let Some(at) = state.lost.iter().position(|(lost, _)| lost == id) {
            let (id, reason) = state.lost.remove(at).unwrap_or_default();
            return Err(SessionError::Lost { id, reason });
        }
        let next_call = state.next_call;
        let Some(entry) = state.live.get_mut(id) else {
            return if open_if_unknown {
                Ok(Admission::Open(request))
            } else {
                Err(SessionError::Unknown { id: id.into() })
            };
        };
        let admitted = admit_call(id, entry, request, &self.inner.door)?;
        let overdue = admitted
            .deadline()
            .remaining()
            .map_or(Instant::now() + Duration::from_secs(86_400), |left| Instant::now() + left + CALL_OVERRUN_LIMIT);
        entry.calls.insert(next_call, overdue);
        entry.last_used = Instant::now();
        let (session, turns) = (entry.session.clone(), entry.turns.clone());
        state.next_call += 1;
        let in_flight =
            InFlight { inner: self.inner.clone(), id: id.to_string(), session: session.clone(), call: next_call };
        Ok(Admission::Ready(Call { session, turns, admitted, in_flight }))
    }

    /// After a call: `timed_out` if the backstop killed its session, and
    /// the session recorded as lost if the call ended it.
    fn conclude(
        &self,
        id: &str,
        session: &Arc<dyn Session>,
        in_flight: InFlight,
        result: Result<ExecResult, ExecError>,
    ) -> Result<ExecResult, SessionError> {
        let call_number = in_flight.call;
        drop(in_flight);
        let overran = self.inner.lock().overran.remove(&call_number);
        let result = if overran { result.map(overran_result) } else { result };
        let ended = self.end_if_dead(id, session, &result);
        let mut result = result?;
        if ended {
            let note = "the session ended with this call: its state is gone";
            result.message = Some(match result.message.take() {
                Some(message) => format!("{message} ({note})"),
                None => note.to_string(),
            });
        }
        Ok(result)
    }

    /// If `session` (still `id`'s) died with a call, records it as lost and
    /// removes it; true if so.
    fn end_if_dead(&self, id: &str, session: &Arc<dyn Session>, result: &Result<ExecResult, ExecError>) -> bool {
        let removed = {
            let mut state = self.inner.lock();
            let ours = state.live.get(id).is_some_and(|e| Arc::ptr_eq(&e.session, session));
            if !ours || session.is_alive() {
                return false;
            }
            let reason = match result {
                Ok(r) => format!("a call ended as {}", r.outcome.as_str()),
                Err(e) => format!("a call failed: {e}"),
            };
            state.remember_lost(id.to_string(), reason);
            state.live.remove(id)
        };
        end_all(removed.as_slice());
        true
    }

    /// Starts the expiry thread if it is not running.
    fn start_expiry(&self, state: &mut State) {
        if state.expiry_running {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        let spawned = std::thread::Builder::new().name("execbox-session-expiry".into()).spawn(move || expire(weak));
        match spawned {
            Ok(_) => state.expiry_running = true,
            Err(e) => tracing::warn!(error = %e, "no session expiry thread; idle sessions close when touched"),
        }
    }
}

/// Admits one call to `entry`'s session: the session's language, packages
/// and backend, then matching against its capabilities, what it fixed when
/// it opened, and its own refusals, every unmet control named.
fn admit_call(id: &str, entry: &Entry, mut request: ExecRequest, door: &Door) -> Result<Admitted, SessionError> {
    let session = &entry.session;
    if entry.spec.language != request.language {
        return Err(SessionError::WrongLanguage {
            id: id.into(),
            session: entry.spec.language,
            requested: request.language,
        });
    }
    let lacks: Vec<String> = request
        .packages
        .iter()
        .filter(|p| !entry.packages.iter().any(|h| h.eq_ignore_ascii_case(p)))
        .cloned()
        .collect();
    if !lacks.is_empty() {
        return Err(SessionError::PackagesUnavailable { language: request.language, packages: lacks });
    }
    if let Some(pin) = request.backend.as_deref()
        && !session.backend().starts_with(pin)
    {
        return Err(SessionError::WrongBackend {
            id: id.into(),
            session: session.backend().to_string(),
            requested: pin.to_string(),
        });
    }
    let mut refusals = fixed_at_open(&entry.spec, &request);
    if refusals.is_empty() {
        // A call of a session opened in a workspace runs there (and takes
        // its turn there, see `Door::admit`).
        request.workspace.clone_from(&entry.spec.workspace);
    }
    refusals.extend(session.refusals(&request));
    let target = Target {
        name: session.backend(),
        capabilities: session.capabilities(),
        packages: entry.packages.clone(),
        refusals,
        session: Some(id),
    };
    door.admit(request, &target).map_err(SessionError::Exec)
}

/// Where a call stands after [`Sessions::admit`].
// Made and matched once per call, never stored: boxing either side would
// only add an allocation.
#[allow(clippy::large_enum_variant)]
enum Admission {
    /// Admitted to a live session: it waits for its turn next.
    Ready(Call),
    /// No session has the id, and the caller may open one: the request back.
    Open(ExecRequest),
}

/// A call admitted to a live session.
struct Call {
    session: Arc<dyn Session>,
    turns: Arc<Turns>,
    admitted: Admitted,
    in_flight: InFlight,
}

/// The `busy` error of a call whose deadline passed while earlier calls of
/// its session still ran.
fn busy(backend: &str) -> ExecError {
    ExecError::Busy {
        backend: backend.to_string(),
        reason: "earlier calls of this session still ran when this call's deadline passed".into(),
    }
}

/// The name the registry's own waits carry in errors.
const NAME: &str = "sessions";

/// The result of a call whose session the backstop killed for running
/// [`CALL_OVERRUN_LIMIT`] past its deadline: `timed_out`, saying so.
fn overran_result(mut result: ExecResult) -> ExecResult {
    result.outcome = crate::result::Outcome::TimedOut;
    result.message =
        Some(format!("the call ran {} s past its deadline, so its session was killed", CALL_OVERRUN_LIMIT.as_secs()));
    result
}

/// A call in flight: counted on its session's entry until it drops,
/// whichever way the call returns.
struct InFlight {
    inner: Arc<Inner>,
    id: String,
    session: Arc<dyn Session>,
    call: u64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut state = self.inner.lock();
        if let Some(entry) = state.live.get_mut(&self.id)
            && Arc::ptr_eq(&entry.session, &self.session)
        {
            entry.calls.remove(&self.call);
            entry.last_used = Instant::now();
        }
    }
}

/// A running async call whose caller may stop waiting (drop its future, as
/// an MCP client's cancellation does): dropped before [`Abandoned::disarm`],
/// the cell was cut off somewhere in its middle, so its session is recorded
/// lost and killed. Otherwise an abandoned call on the blocking pool would
/// run on to its deadline, holding the session while its turn passed on.
struct Abandoned<'a> {
    inner: Arc<Inner>,
    id: &'a str,
    /// `None` once disarmed.
    session: Option<Arc<dyn Session>>,
}

impl Abandoned<'_> {
    fn disarm(mut self) {
        self.session = None;
    }
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        let Some(session) = self.session.take() else { return };
        {
            let mut state = self.inner.lock();
            if state.live.get(self.id).is_some_and(|e| Arc::ptr_eq(&e.session, &session)) {
                let reason = "its caller stopped waiting for a call mid-cell, so the session was killed".to_string();
                state.remember_lost(self.id.to_string(), reason);
                state.live.remove(self.id);
            }
        }
        // Killing a container asks its engine: not on an async thread.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(move || session.kill())),
            Err(_) => session.kill(),
        }
    }
}

/// A session being opened, counted against the bound until it is live or
/// its opening failed.
struct Opening<'a> {
    inner: &'a Inner,
    counted: bool,
}

impl<'a> Opening<'a> {
    fn reserve(inner: &'a Inner, state: &mut State) -> Self {
        state.opening += 1;
        Self { inner, counted: true }
    }

    /// Stops counting it, under the lock the caller holds.
    fn finish(mut self, state: &mut State) {
        state.opening -= 1;
        self.counted = false;
    }
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        if self.counted {
            self.inner.lock().opening -= 1;
        }
    }
}

#[cfg(test)]
mod tests;
