//! The warm pool recovers from failed starts. Alone in its own test binary:
//! it makes temporary directories fail by pointing `TMPDIR` nowhere, which
//! would disturb any other test of the process.
//!
//! Needs the interpreter modules (`scripts/fetch-interpreters.sh`); without
//! them it passes with a message unless `EXECBOX_REQUIRE_INTERPRETERS=1`.
#![cfg(feature = "wasm")]

mod common;

use std::time::Duration;

use common::skip;

use execbox::Executor;
use execbox::backends::{InterpreterConfig, WasmInterpreter};
use execbox::{Backend, ExecRequest, Language, Outcome, SandboxPolicy};
use serde_json::json;

fn python(code: &str) -> ExecRequest {
    ExecRequest::source(Language::Python, code).policy(SandboxPolicy::strict().timeout(Duration::from_secs(60)))
}

#[test]
fn a_pool_whose_starts_failed_refills_after_a_backoff() {
    let py = WasmInterpreter::new(InterpreterConfig::default()).expect("engine");
    if !skip::available(skip::INTERPRETERS, py.availability()) {
        return;
    }
    let tmp = std::env::temp_dir();
    // SAFETY: this test is alone in its binary; no other thread reads the
    // environment while it changes.
    unsafe { std::env::set_var("TMPDIR", "/nonexistent/execbox-warm-pool-test") };
    py.warm_up().unwrap();
    assert_eq!(py.warm_idle(), 0, "no warm instance can start without a temporary directory");

    // Requests still run, on fresh instances (no input: no staging needed).
    let r = Executor::run_on(&py, python("print(1)")).unwrap();
    assert_eq!((r.outcome, r.output.clone()), (Outcome::Ok, Some(json!(1))), "{r:?}");
    assert!(r.usage.fuel.is_some(), "a fresh instance ran it");

    // The cause goes away; after the backoff the pool refills.
    // SAFETY: as above.
    unsafe { std::env::set_var("TMPDIR", &tmp) };
    // The subject: the backoff after the failed starts passes (nothing to wait on).
    std::thread::sleep(Duration::from_millis(500));
    let r = Executor::run_on(&py, python("print(2)")).unwrap();
    assert_eq!(r.output, Some(json!(2)));
    // The refill thread tops the pool up off the request's path.
    assert!(common::wait::wait_until(Duration::from_secs(30), || py.warm_idle() == 2), "the pool refilled");
    py.prepare(Duration::from_secs(120));
    let r = Executor::run_on(&py, python("print(3)")).unwrap();
    assert_eq!((r.output, r.usage.fuel), (Some(json!(3)), None), "served by a warm instance");
}
