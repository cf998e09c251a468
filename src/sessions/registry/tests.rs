//! The registry's unit tests: call admission, expiry and its backstop,
//! the bound on live sessions.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::*;
use crate::capabilities::BackendCapabilities;
use crate::result::Outcome;

/// A session that counts calls, dies on code "die" and hangs on "hang"
/// until killed.
struct Counter {
    calls: AtomicUsize,
    alive: AtomicBool,
    killed: (Mutex<bool>, parking_lot::Condvar),
    open: Arc<AtomicUsize>,
    caps: BackendCapabilities,
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
    fn capabilities(&self) -> &BackendCapabilities {
        &self.caps
    }
    fn execute(&self, mut call: Admitted) -> Result<ExecResult, ExecError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let code = call.take_source("counter")?;
        if code == "die" {
            self.alive.store(false, Ordering::SeqCst);
            return Ok(ExecResult::new("counter", Outcome::TimedOut));
        }
        if code == "hang" {
            // Ignores its deadline on purpose: only a kill ends it.
            let (lock, changed) = &self.killed;
            let mut killed = lock.lock();
            while !*killed {
                changed.wait(&mut killed);
            }
            return Ok(ExecResult::new("counter", Outcome::Killed));
        }
        let mut r = ExecResult::new("counter", Outcome::Ok);
        r.output = Some(serde_json::json!(n));
        Ok(r)
    }
    fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }
    fn kill(&self) {
        self.alive.store(false, Ordering::SeqCst);
        *self.killed.0.lock() = true;
        self.killed.1.notify_all();
    }
}

struct Opener(Arc<AtomicUsize>, BackendCapabilities);

impl SessionBackend for Opener {
    fn session_name(&self) -> &str {
        "counter"
    }
    fn session_language(&self) -> Language {
        Language::JavaScript
    }
    fn session_capabilities(&self) -> &BackendCapabilities {
        &self.1
    }
    fn open_session(&self, _spec: &SessionSpec) -> Result<Box<dyn Session>, ExecError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(Box::new(Counter {
            calls: AtomicUsize::new(0),
            alive: AtomicBool::new(true),
            killed: Default::default(),
            open: self.0.clone(),
            caps: self.1.clone(),
        }))
    }
}

fn caps() -> BackendCapabilities {
    BackendCapabilities::test_fixture()
}

fn registry(cfg: SessionConfig) -> (Sessions, Arc<AtomicUsize>) {
    let open = Arc::new(AtomicUsize::new(0));
    (Sessions::builder().config(cfg).backend(Opener(open.clone(), caps())).build(), open)
}

fn call(code: &str) -> ExecRequest {
    ExecRequest::javascript(code)
}

fn js() -> SessionSpec {
    SessionSpec::new(Language::JavaScript)
}

#[test]
fn state_is_kept_per_id_and_a_lost_session_is_reported_once() {
    let (sessions, open) = registry(SessionConfig::default());
    assert_eq!(sessions.execute("a", call("x")).unwrap_err().kind(), "unknown_session");
    sessions.open("a", js()).unwrap();
    assert_eq!(sessions.open("a", js()).unwrap_err().kind(), "session_exists");
    assert_eq!(sessions.open("n", js().packages(["numpy"])).unwrap_err().kind(), "packages_unavailable");
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
    // A pin on another backend is refused, and leaves nothing in flight.
    sessions.open("p", js()).unwrap();
    let pinned = call("x").on_backend("container");
    assert_eq!(sessions.execute("p", pinned).unwrap_err().kind(), "wrong_backend");
    assert_eq!(sessions.calls_in_flight(), 0);
    assert_eq!(sessions.execute("p", call("x").on_backend("counter")).unwrap().output, Some(serde_json::json!(1)));
    sessions.close("p");
    assert_eq!(
        sessions.execute("a", ExecRequest::source(Language::Python, "1")).unwrap_err().kind(),
        "unknown_session"
    );
    assert_eq!(sessions.open("p", SessionSpec::new(Language::Python)).unwrap_err().kind(), "stateful_unsupported");
    // An opening spec the backend cannot enforce is refused, naming the control.
    let grants = crate::policy::Access::Allow(vec!["example.org".to_string()]);
    let refused = sessions.open("g", js().policy(SandboxPolicy::host_local().network(grants))).unwrap_err();
    assert_eq!(refused.kind(), "refused", "{refused}");
    assert!(refused.to_string().contains("network"), "{refused}");
}

#[test]
fn refused_and_pinned_calls_leave_nothing_busy_so_the_session_still_expires() {
    let (sessions, open) = registry(SessionConfig { max_sessions: 4, idle_timeout: Duration::from_millis(100) });
    sessions.open("a", js()).unwrap();
    for refused in [
        call("x").on_backend("container"),
        ExecRequest::source(Language::Python, "x"),
        call("x").packages(["numpy"]),
        call("x").arg("1"),
        call("x").policy(SandboxPolicy::strict().max_code_bytes(0)),
    ] {
        assert!(sessions.execute("a", refused).is_err());
    }
    assert_eq!(sessions.calls_in_flight(), 0);
    // Expiry takes the session out of the table, then kills it outside
    // the table's lock: wait for both.
    let until = Instant::now() + Duration::from_secs(10);
    while (!sessions.is_empty() || open.load(Ordering::SeqCst) > 0) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!((sessions.len(), open.load(Ordering::SeqCst)), (0, 0), "expired");
}

#[test]
fn closing_kills_a_session_whose_call_hangs_and_the_call_returns() {
    let (sessions, open) = registry(SessionConfig::default());
    sessions.open("h", js()).unwrap();
    let caller = {
        let sessions = sessions.clone();
        std::thread::spawn(move || sessions.execute("h", call("hang")))
    };
    while sessions.calls_in_flight() == 0 {
        std::thread::yield_now();
    }
    assert!(sessions.close("h"));
    let result = caller.join().unwrap().unwrap();
    assert_eq!(result.outcome, Outcome::Killed);
    assert_eq!((sessions.len(), sessions.calls_in_flight(), open.load(Ordering::SeqCst)), (0, 0, 0));
}

#[test]
fn a_call_that_overruns_its_deadline_gets_its_session_killed() {
    let (sessions, open) = registry(SessionConfig::default());
    sessions.open("h", js()).unwrap();
    let started = Instant::now();
    let hung = call("hang").policy(SandboxPolicy::strict().timeout(Duration::from_millis(100)));
    let result = sessions.execute("h", hung).unwrap();
    assert_eq!(result.outcome, Outcome::TimedOut, "{result:?}");
    assert!(result.message.unwrap().contains("past its deadline"));
    assert!(started.elapsed() < Duration::from_millis(100) + CALL_OVERRUN_LIMIT + Duration::from_secs(2));
    assert_eq!(sessions.execute("h", call("x")).unwrap_err().kind(), "session_lost");
    // The expiry thread drops the session it killed right after the kill.
    let until = Instant::now() + Duration::from_secs(10);
    while open.load(Ordering::SeqCst) > 0 && Instant::now() < until {
        std::thread::yield_now();
    }
    assert_eq!(open.load(Ordering::SeqCst), 0);
}

#[test]
fn the_count_is_bounded_and_idle_sessions_expire_as_lost() {
    let (sessions, open) = registry(SessionConfig { max_sessions: 2, idle_timeout: Duration::from_millis(200) });
    let a = sessions.open_new(js()).unwrap();
    let b = sessions.open_new(js()).unwrap();
    assert_ne!(a, b);
    assert_eq!(sessions.open_new(js()).unwrap_err().kind(), "too_many_sessions");
    let until = Instant::now() + Duration::from_secs(10);
    while !sessions.is_empty() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!((sessions.len(), open.load(Ordering::SeqCst)), (0, 0), "expired without being touched");
    let lost = sessions.execute(&a, call("x")).unwrap_err();
    assert!(lost.to_string().contains("idle"), "{lost}");
    assert_eq!(sessions.close_where(|id| id == b), 0, "already gone");
}
