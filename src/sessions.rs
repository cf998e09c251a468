//! [`Sessions`]: interpreter state kept across calls, by id.
//!
//! A session is one live interpreter (a JS realm in a worker process of its
//! own, a CPython instance, a container) that runs a request per call and
//! keeps its globals between calls. The registry guarantees, whatever the
//! backend:
//!
//! - **Bounded**: at most [`SessionConfig::max_sessions`] live (or opening)
//!   at once; one more is [`SessionError::TooMany`].
//! - **Closed when idle**: a session unused for
//!   [`SessionConfig::idle_timeout`] is closed by a background thread (alive
//!   only while sessions are), not when the registry is next touched.
//! - **One call at a time** per session, in arrival order.
//! - **Never silently reset**: a session that a call ended (time-out, memory,
//!   an engine crash) or that expired is *lost*; the next call with its id
//!   gets [`SessionError::Lost`] once, with the reason, and only a call after
//!   that may open a fresh one.
//! - **Closing frees everything**: dropping a session ends its worker,
//!   instance or container; [`Sessions::close`] does it at once.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::capabilities::Language;
use crate::error::ExecError;
use crate::request::ExecRequest;
use crate::result::ExecResult;

/// One live interpreter that keeps state across calls.
pub trait Session: Send + Sync {
    /// The name results and refusals carry (e.g. `boa-js-session`).
    fn backend(&self) -> &str;

    /// Runs one call in this session. Validated and refused like a
    /// stateless run of the same backend; blocks until the call ends or its
    /// deadline passes. Calls never overlap (the registry sees to it).
    fn execute(&self, request: ExecRequest) -> Result<ExecResult, ExecError>;

    /// False once a call ended the session (its state is gone).
    fn is_alive(&self) -> bool;
}

/// A backend that can open [`Session`]s for one language.
pub trait SessionBackend: Send + Sync {
    /// The language its sessions run.
    fn session_language(&self) -> Language;

    /// Third-party packages its sessions provide (see
    /// [`Backend::packages`](crate::Backend::packages)). Default: none.
    fn session_packages(&self) -> Vec<String> {
        Vec::new()
    }

    /// Opens a session: starts its interpreter now. `packages` are those the
    /// caller declared (all among [`SessionBackend::session_packages`]).
    fn open_session(&self, packages: &[String]) -> Result<Box<dyn Session>, ExecError>;
}

/// Bounds on sessions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionConfig {
    /// Most sessions live (or opening) at once. Default 16.
    pub max_sessions: usize,
    /// A session unused this long is closed. Default 5 minutes.
    pub idle_timeout: Duration,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self { max_sessions: 16, idle_timeout: Duration::from_secs(300) }
    }
}

/// Why a session call produced no result.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// No session has this id (never opened here, or closed).
    #[error("no session {id:?} is open")]
    Unknown {
        /// The id asked for.
        id: String,
    },
    /// The session ended without being closed; its state is gone.
    #[error("session {id:?} was lost ({reason}); its state is gone, so open a new session")]
    Lost {
        /// The id asked for.
        id: String,
        /// What ended it.
        reason: String,
    },
    /// Every session slot is taken.
    #[error("all {max} sessions are in use; close one or wait for one to go idle")]
    TooMany {
        /// The bound.
        max: usize,
    },
    /// No registered backend keeps sessions for this language.
    #[error("stateful sessions are not available for {language}")]
    Unsupported {
        /// The language asked for.
        language: Language,
    },
    /// No session backend of the language provides every declared package.
    #[error("no {language} session provides {}", packages.join(", "))]
    PackagesUnavailable {
        /// The language asked for.
        language: Language,
        /// The packages no session backend provides.
        packages: Vec<String>,
    },
    /// The request pins a backend other than the session's.
    #[error("session {id:?} runs on {session}, not {requested}")]
    WrongBackend {
        /// The id asked for.
        id: String,
        /// The session's backend.
        session: String,
        /// The backend the request pinned.
        requested: String,
    },
    /// A session with this id is already open.
    #[error("a session {id:?} is already open")]
    Exists {
        /// The id asked for.
        id: String,
    },
    /// The session has another language than the request.
    #[error("session {id:?} runs {session}, not {requested}")]
    WrongLanguage {
        /// The id asked for.
        id: String,
        /// The session's language.
        session: Language,
        /// The request's language.
        requested: Language,
    },
    /// Opening the session, or the call, was refused or failed before a result.
    #[error(transparent)]
    Exec(#[from] ExecError),
}

impl SessionError {
    /// Stable snake_case kind for JSON.
    pub fn kind(&self) -> &'static str {
        match self {
            SessionError::Unknown { .. } => "unknown_session",
            SessionError::Lost { .. } => "session_lost",
            SessionError::TooMany { .. } => "too_many_sessions",
            SessionError::Unsupported { .. } => "stateful_unsupported",
            SessionError::PackagesUnavailable { .. } => "packages_unavailable",
            SessionError::Exists { .. } => "session_exists",
            SessionError::WrongLanguage { .. } => "wrong_language",
            SessionError::WrongBackend { .. } => "wrong_backend",
            SessionError::Exec(e) => e.kind(),
        }
    }
}

/// [`ExecError`]'s JSON shape: `{"kind", "message", "violations"}`.
impl Serialize for SessionError {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            SessionError::Exec(e) => e.serialize(serializer),
            _ => crate::error::serialize_error(serializer, self.kind(), self.to_string(), &[] as &[()]),
        }
    }
}

/// The registry of live sessions. Cheap to clone (shared).
#[derive(Clone)]
pub struct Sessions {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions").field("cfg", &self.inner.cfg).field("live", &self.len()).finish_non_exhaustive()
    }
}

struct Inner {
    cfg: SessionConfig,
    backends: Vec<Arc<dyn SessionBackend>>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    live: HashMap<String, Entry>,
    /// Sessions being opened: they count against the bound.
    opening: usize,
    /// Ids of sessions that ended without a close, with why; each is
    /// reported once. Bounded: the oldest are forgotten.
    lost: VecDeque<(String, String)>,
    expiry_running: bool,
}

struct Entry {
    session: Arc<dyn Session>,
    language: Language,
    /// What its backend provides: later calls may declare these.
    packages: Vec<String>,
    /// Calls run one at a time, in arrival order.
    turn: Arc<Turns>,
    last_used: Instant,
    /// Calls in flight (a session is never expired under a running call).
    busy: usize,
}

/// A session's calls, one at a time in arrival order (tickets).
#[derive(Default)]
struct Turns {
    /// (next ticket to hand out, ticket being served).
    tickets: Mutex<(u64, u64)>,
    /// Tickets whose callers stopped waiting (their deadline passed).
    skipped: Mutex<Vec<u64>>,
    changed: std::sync::Condvar,
}

/// A call's turn; the next ticket is served when it drops.
struct Turn<'a>(&'a Turns);

impl Turns {
    /// Waits for this call's turn, at most `limit` (`None`: no limit).
    fn take(&self, limit: Option<Duration>) -> Option<Turn<'_>> {
        let until = limit.map(|l| Instant::now() + l);
        let mut tickets = self.tickets.lock().unwrap_or_else(|p| p.into_inner());
        let mine = tickets.0;
        tickets.0 += 1;
        while tickets.1 != mine {
            let left = until.map(|u| u.saturating_duration_since(Instant::now()));
            if left.is_some_and(|l| l.is_zero()) {
                // Give the ticket up: the turn passes over it.
                drop(tickets);
                self.skip(mine);
                return None;
            }
            let wait = left.unwrap_or(Duration::from_secs(3600));
            tickets = self.changed.wait_timeout(tickets, wait).unwrap_or_else(|p| p.into_inner()).0;
        }
        Some(Turn(self))
    }

    /// Marks `ticket` as not wanting its turn: served (or skipped when it comes up).
    fn skip(&self, ticket: u64) {
        let mut skipped = self.skipped.lock().unwrap_or_else(|p| p.into_inner());
        skipped.push(ticket);
        drop(skipped);
        self.advance();
    }

    /// Serves the next ticket that is still wanted.
    fn advance(&self) {
        let mut tickets = self.tickets.lock().unwrap_or_else(|p| p.into_inner());
        let mut skipped = self.skipped.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(at) = skipped.iter().position(|&t| t == tickets.1) {
            skipped.swap_remove(at);
            tickets.1 += 1;
        }
        drop(skipped);
        drop(tickets);
        self.changed.notify_all();
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        {
            let mut tickets = self.0.tickets.lock().unwrap_or_else(|p| p.into_inner());
            tickets.1 += 1;
        }
        self.0.advance();
    }
}

/// Lost ids remembered at most.
const MAX_LOST: usize = 1024;

impl Sessions {
    /// An empty registry; add backends with [`Sessions::backend`].
    pub fn new(cfg: SessionConfig) -> Self {
        Self { inner: Arc::new(Inner { cfg, backends: Vec::new(), state: Mutex::new(State::default()) }) }
    }

    /// Adds a backend that opens sessions. The first added for a language
    /// opens that language's sessions. Call before the registry is shared.
    pub fn backend(mut self, backend: impl SessionBackend + 'static) -> Self {
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => inner.backends.push(Arc::new(backend)),
            None => tracing::error!("Sessions::backend called after the registry was shared; ignored"),
        }
        self
    }

    /// Like [`Sessions::backend`], for a shared one.
    pub fn backend_shared(mut self, backend: Arc<dyn SessionBackend>) -> Self {
        match Arc::get_mut(&mut self.inner) {
            Some(inner) => inner.backends.push(backend),
            None => tracing::error!("Sessions::backend_shared called after the registry was shared; ignored"),
        }
        self
    }

    /// A registry whose sessions open on the executor's backends that keep
    /// state ([`Backend::session_backend`](crate::Backend::session_backend)), in selection order.
    pub fn for_executor(cfg: SessionConfig, executor: &crate::Executor) -> Self {
        executor.backends().filter_map(|b| b.session_backend()).fold(Self::new(cfg), Self::backend_shared)
    }

    /// The bounds in use.
    pub fn config(&self) -> &SessionConfig {
        &self.inner.cfg
    }

    /// Languages that have sessions here.
    pub fn languages(&self) -> Vec<Language> {
        let mut languages: Vec<Language> = self.inner.backends.iter().map(|b| b.session_language()).collect();
        languages.dedup();
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

    /// Opens a session of `language` under `id`, on the first session
    /// backend of that language that provides every one of `packages`.
    pub fn open(&self, id: &str, language: Language, packages: &[String]) -> Result<(), SessionError> {
        crate::executor::validate_packages(packages).map_err(|e| SessionError::Exec(e.into()))?;
        let backend = self.backend_for(language, packages)?;
        {
            let mut state = self.inner.lock();
            if state.live.contains_key(id) {
                return Err(SessionError::Exists { id: id.into() });
            }
            self.reserve(&mut state)?;
            // A new session under a lost id is a deliberate fresh start.
            state.lost.retain(|(lost, _)| lost != id);
        }
        let opened = backend.open_session(packages);
        let provided = backend.session_packages();
        let mut state = self.inner.lock();
        state.opening -= 1;
        let session: Arc<dyn Session> = Arc::from(opened?);
        if state.live.contains_key(id) {
            // Another caller opened the same id meanwhile: theirs stays;
            // this one is dropped (outside the lock).
            drop(state);
            drop(session);
            return Err(SessionError::Exists { id: id.into() });
        }
        let entry = Entry {
            session,
            language,
            packages: provided,
            turn: Arc::new(Turns::default()),
            last_used: Instant::now(),
            busy: 0,
        };
        state.live.insert(id.to_string(), entry);
        self.start_expiry(&mut state);
        Ok(())
    }

    /// Opens a session of `language` under a new random id, and returns it.
    pub fn open_new(&self, language: Language, packages: &[String]) -> Result<String, SessionError> {
        let id = new_id();
        self.open(&id, language, packages)?;
        Ok(id)
    }

    /// Runs `request` in session `id`: [`SessionError::Unknown`] if none is
    /// open, [`SessionError::Lost`] (once) if it ended. Blocks.
    pub fn execute(&self, id: &str, request: ExecRequest) -> Result<ExecResult, SessionError> {
        self.run(id, request, false)
    }

    /// Like [`Sessions::execute`], but opens a session of the request's
    /// language when none has this id (the agent layer's semantics: the id
    /// is the caller's). A lost session is still reported once first.
    pub fn execute_or_open(&self, id: &str, request: ExecRequest) -> Result<ExecResult, SessionError> {
        self.run(id, request, true)
    }

    /// Closes session `id` now (its interpreter ends); false if none was open.
    pub fn close(&self, id: &str) -> bool {
        let removed = {
            let mut state = self.inner.lock();
            state.lost.retain(|(lost, _)| lost != id);
            state.live.remove(id)
        };
        let closed = removed.is_some();
        drop(removed);
        closed
    }

    /// Closes every session whose id `matches` (e.g. all of one client's); returns how many.
    pub fn close_where(&self, matches: impl Fn(&str) -> bool) -> usize {
        let removed: Vec<Entry> = {
            let mut state = self.inner.lock();
            state.lost.retain(|(id, _)| !matches(id));
            let ids: Vec<String> = state.live.keys().filter(|id| matches(id)).cloned().collect();
            ids.iter().filter_map(|id| state.live.remove(id)).collect()
        };
        removed.len()
    }

    /// Closes every session.
    pub fn close_all(&self) -> usize {
        self.close_where(|_| true)
    }

    fn backend_for(&self, language: Language, packages: &[String]) -> Result<Arc<dyn SessionBackend>, SessionError> {
        let mut of_language = self.inner.backends.iter().filter(|b| b.session_language() == language).peekable();
        if of_language.peek().is_none() {
            return Err(SessionError::Unsupported { language });
        }
        let mut missing = packages.to_vec();
        for backend in of_language {
            let provided = backend.session_packages();
            let lacks: Vec<String> =
                packages.iter().filter(|p| !provided.iter().any(|h| h.eq_ignore_ascii_case(p))).cloned().collect();
            if lacks.is_empty() {
                return Ok(backend.clone());
            }
            missing.retain(|p| lacks.contains(p));
        }
        Err(SessionError::PackagesUnavailable { language, packages: missing })
    }

    /// Counts one session being opened against the bound.
    fn reserve(&self, state: &mut State) -> Result<(), SessionError> {
        let max = self.inner.cfg.max_sessions;
        if state.live.len() + state.opening >= max {
            return Err(SessionError::TooMany { max });
        }
        state.opening += 1;
        Ok(())
    }

    fn run(&self, id: &str, request: ExecRequest, open_if_unknown: bool) -> Result<ExecResult, SessionError> {
        let language = request.language;
        let (session, turn) = loop {
            {
                let mut state = self.inner.lock();
                if let Some(at) = state.lost.iter().position(|(lost, _)| lost == id) {
                    let (id, reason) = state.lost.remove(at).unwrap_or_default();
                    return Err(SessionError::Lost { id, reason });
                }
                if let Some(entry) = state.live.get_mut(id) {
                    if entry.language != language {
                        return Err(SessionError::WrongLanguage {
                            id: id.into(),
                            session: entry.language,
                            requested: language,
                        });
                    }
                    let lacks: Vec<String> = request
                        .packages
                        .iter()
                        .filter(|p| !entry.packages.iter().any(|h| h.eq_ignore_ascii_case(p)))
                        .cloned()
                        .collect();
                    if !lacks.is_empty() {
                        return Err(SessionError::PackagesUnavailable { language, packages: lacks });
                    }
                    entry.busy += 1;
                    entry.last_used = Instant::now();
                    if let Some(pin) = request.backend.as_deref()
                        && !entry.session.backend().starts_with(pin)
                    {
                        return Err(SessionError::WrongBackend {
                            id: id.into(),
                            session: entry.session.backend().to_string(),
                            requested: pin.to_string(),
                        });
                    }
                    break (entry.session.clone(), entry.turn.clone());
                }
                if !open_if_unknown {
                    return Err(SessionError::Unknown { id: id.into() });
                }
            }
            match self.open(id, language, &request.packages) {
                Ok(()) | Err(SessionError::Exists { .. }) => continue,
                Err(e) => return Err(e),
            }
        };
        // Waiting for earlier calls counts against this call's deadline.
        let wait = request.policy.timeout_duration();
        let result = match turn.take(wait) {
            Some(_turn) => session.execute(request),
            None => Err(ExecError::Busy {
                backend: session.backend().to_string(),
                reason: "earlier calls of this session still ran when this call's deadline passed".into(),
            }),
        };
        let ended = {
            let mut state = self.inner.lock();
            let still_ours = state.live.get(id).is_some_and(|e| Arc::ptr_eq(&e.session, &session));
            if still_ours && let Some(entry) = state.live.get_mut(id) {
                entry.busy -= 1;
                entry.last_used = Instant::now();
            }
            if still_ours && !session.is_alive() {
                let reason = match &result {
                    Ok(r) => format!("a call ended as {}", r.outcome.as_str()),
                    Err(e) => format!("a call failed: {e}"),
                };
                state.lost.push_back((id.to_string(), reason));
                if state.lost.len() > MAX_LOST {
                    state.lost.pop_front();
                }
                state.live.remove(id)
            } else {
                None
            }
        };
        let ended = ended.is_some();
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

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The expiry thread: closes idle sessions until none is live or the
/// registry is gone. Sessions are dropped outside the lock.
fn expire(weak: Weak<Inner>) {
    loop {
        let Some(inner) = weak.upgrade() else { return };
        let idle = inner.cfg.idle_timeout;
        let tick = (idle / 4).clamp(Duration::from_millis(20), Duration::from_secs(1));
        let expired: Vec<Entry> = {
            let mut state = inner.lock();
            let ids: Vec<String> = state
                .live
                .iter()
                .filter(|(_, e)| e.busy == 0 && e.last_used.elapsed() >= idle)
                .map(|(id, _)| id.clone())
                .collect();
            let mut expired = Vec::new();
            for id in ids {
                if let Some(entry) = state.live.remove(&id) {
                    state.lost.push_back((id, format!("idle for longer than {} ms", idle.as_millis())));
                    expired.push(entry);
                }
            }
            while state.lost.len() > MAX_LOST {
                state.lost.pop_front();
            }
            if state.live.is_empty() && state.opening == 0 {
                state.expiry_running = false;
                drop(state);
                drop(expired);
                return;
            }
            expired
        };
        drop(expired);
        // Sleep without keeping the registry alive past its owners.
        drop(inner);
        std::thread::sleep(tick);
    }
}

/// Checks one call of a session backend's (`name`): the executor's
/// validation, matching against `caps`, what every session fixes when it
/// opens (arguments, environment, granted directories), and `own`, the
/// session's own refusals. `Refused` names every unmet control.
#[cfg(any(feature = "wasm", feature = "container"))]
pub(crate) fn check_call(
    name: &str,
    caps: &crate::capabilities::BackendCapabilities,
    request: &ExecRequest,
    own: Vec<crate::matching::Violation>,
) -> Result<(), ExecError> {
    use crate::matching::{Control, Violation};
    crate::executor::validate(request)?;
    let mut violations = crate::matching::check(caps, request).err().unwrap_or_default();
    let fixed = |control, requested: String| Violation {
        control,
        requested,
        reason: "a session's arguments, environment and directories are fixed (none) when it opens".into(),
    };
    if !request.args.is_empty() {
        violations.push(fixed(Control::Args, format!("{} arguments", request.args.len())));
    }
    if !request.env.is_empty() {
        violations.push(fixed(Control::Environment, "variables".into()));
    }
    if matches!(request.policy.filesystem, crate::policy::Access::Allow(_)) {
        violations.push(fixed(Control::Filesystem, "granted directories".into()));
    }
    violations.extend(own);
    if violations.is_empty() {
        return Ok(());
    }
    Err(ExecError::Refused {
        rejections: vec![crate::error::BackendRejection { backend: name.to_string(), violations }],
    })
}

/// A new session id: 128 random bits as hex.
pub fn new_id() -> String {
    crate::nonce::hex128()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use super::*;
    use crate::result::Outcome;

    /// A session that counts calls and dies on code "die".
    struct Counter {
        calls: AtomicUsize,
        alive: AtomicBool,
        open: Arc<AtomicUsize>,
    }

    impl Drop for Counter {
        fn drop(&mut self) {
            self.open.fetch_sub(1, Ordering::SeqCst);
        }
    }

    impl Session for Counter {
        fn backend(&self) -> &str {
            "counter"
        }
        fn execute(&self, request: ExecRequest) -> Result<ExecResult, ExecError> {
            let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
            let crate::request::Payload::Source(code) = &request.payload else { unreachable!() };
            if code == "die" {
                self.alive.store(false, Ordering::SeqCst);
                return Ok(ExecResult::new("counter", Outcome::TimedOut));
            }
            let mut r = ExecResult::new("counter", Outcome::Ok);
            r.output = Some(serde_json::json!(n));
            Ok(r)
        }
        fn is_alive(&self) -> bool {
            self.alive.load(Ordering::SeqCst)
        }
    }

    struct Opener(Arc<AtomicUsize>);

    impl SessionBackend for Opener {
        fn session_language(&self) -> Language {
            Language::JavaScript
        }
        fn open_session(&self, _packages: &[String]) -> Result<Box<dyn Session>, ExecError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(Box::new(Counter { calls: AtomicUsize::new(0), alive: AtomicBool::new(true), open: self.0.clone() }))
        }
    }

    fn registry(cfg: SessionConfig) -> (Sessions, Arc<AtomicUsize>) {
        let open = Arc::new(AtomicUsize::new(0));
        (Sessions::new(cfg).backend(Opener(open.clone())), open)
    }

    fn call(code: &str) -> ExecRequest {
        ExecRequest::javascript(code)
    }

    #[test]
    fn state_is_kept_per_id_and_a_lost_session_is_reported_once() {
        let (sessions, open) = registry(SessionConfig::default());
        assert_eq!(sessions.execute("a", call("x")).unwrap_err().kind(), "unknown_session");
        sessions.open("a", Language::JavaScript, &[]).unwrap();
        assert_eq!(sessions.open("a", Language::JavaScript, &[]).unwrap_err().kind(), "session_exists");
        let numpy = ["numpy".to_string()];
        assert_eq!(sessions.open("n", Language::JavaScript, &numpy).unwrap_err().kind(), "packages_unavailable");
        assert_eq!(sessions.execute("a", call("x")).unwrap().output, Some(serde_json::json!(1)));
        assert_eq!(sessions.execute("a", call("x")).unwrap().output, Some(serde_json::json!(2)));
        assert_eq!(sessions.execute_or_open("b", call("x")).unwrap().output, Some(serde_json::json!(1)));
        let ended = sessions.execute("a", call("die")).unwrap();
        assert!(ended.message.unwrap().contains("session ended"));
        assert_eq!(open.load(Ordering::SeqCst), 1, "the lost session was freed");
        let lost = sessions.execute_or_open("a", call("x")).unwrap_err();
        assert_eq!(lost.kind(), "session_lost", "{lost}");
        assert!(lost.to_string().contains("timed_out"), "{lost}");
        // Reported once; then the id is free again.
        assert_eq!(sessions.execute_or_open("a", call("x")).unwrap().output, Some(serde_json::json!(1)));
        assert!(sessions.close("a") && sessions.close("b"));
        assert_eq!((sessions.len(), open.load(Ordering::SeqCst)), (0, 0));
        // A pin on another backend is refused.
        sessions.open("p", Language::JavaScript, &[]).unwrap();
        let pinned = call("x").on_backend("container");
        assert_eq!(sessions.execute("p", pinned).unwrap_err().kind(), "wrong_backend");
        assert_eq!(sessions.execute("p", call("x").on_backend("counter")).unwrap().output, Some(serde_json::json!(1)));
        sessions.close("p");
        assert_eq!(
            sessions.execute("a", ExecRequest::source(Language::Python, "1")).unwrap_err().kind(),
            "unknown_session"
        );
        assert_eq!(sessions.open("p", Language::Python, &[]).unwrap_err().kind(), "stateful_unsupported");
    }

    #[test]
    fn turns_are_served_in_order_and_a_waiter_past_its_deadline_gives_up() {
        let turns = Arc::new(Turns::default());
        let first = turns.take(None).unwrap();
        assert!(turns.take(Some(Duration::from_millis(30))).is_none(), "the first still runs");
        let order = Arc::new(Mutex::new(Vec::new()));
        let waiters: Vec<_> = (0..4)
            .map(|i| {
                let (turns, order) = (turns.clone(), order.clone());
                let handle = std::thread::spawn(move || {
                    let _turn = turns.take(Some(Duration::from_secs(10))).unwrap();
                    order.lock().unwrap().push(i);
                });
                std::thread::sleep(Duration::from_millis(30));
                handle
            })
            .collect();
        drop(first);
        waiters.into_iter().for_each(|w| w.join().unwrap());
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3], "arrival order, the gave-up ticket skipped");
    }

    #[test]
    fn the_count_is_bounded_and_idle_sessions_expire_as_lost() {
        let (sessions, open) = registry(SessionConfig { max_sessions: 2, idle_timeout: Duration::from_millis(200) });
        let a = sessions.open_new(Language::JavaScript, &[]).unwrap();
        let b = sessions.open_new(Language::JavaScript, &[]).unwrap();
        assert_ne!(a, b);
        assert_eq!(sessions.open_new(Language::JavaScript, &[]).unwrap_err().kind(), "too_many_sessions");
        let until = Instant::now() + Duration::from_secs(10);
        while !sessions.is_empty() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!((sessions.len(), open.load(Ordering::SeqCst)), (0, 0), "expired without being touched");
        let lost = sessions.execute(&a, call("x")).unwrap_err();
        assert!(lost.to_string().contains("idle"), "{lost}");
        assert_eq!(sessions.close_where(|id| id == b), 0, "already gone");
    }
}
