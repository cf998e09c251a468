//! The ticker thread's lifetime and how many there are, alone in their own
//! test binary so no other test's backend changes the thread count while
//! these look (the tests here take turns).
#![cfg(feature = "wasm")]

mod common;

use std::sync::Mutex;
use std::time::Duration;

use common::procfs::threads_named;
use common::wait::wait_until;
use execbox::Executor;
use execbox::backends::{WasmGuest, WasmGuestConfig};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A new thread names itself once it runs (which nothing announces): how
/// many there are once `expected` are, or after 2 s.
fn settles_at(name: &str, expected: usize) -> usize {
    wait_until(Duration::from_secs(2), || threads_named(name) == expected);
    threads_named(name)
}

#[test]
fn dropping_the_backend_stops_its_ticker_thread() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let before = threads_named("execbox-epoch");
    let wasm = WasmGuest::new(WasmGuestConfig::default()).unwrap();
    assert_eq!(settles_at("execbox-epoch", before + 1), before + 1);
    drop(wasm);
    // Drop joins the thread: it is gone at once.
    assert_eq!(threads_named("execbox-epoch"), before);
}

#[test]
fn the_wasm_backends_of_a_matrix_share_one_engine() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let before = threads_named("execbox-epoch");
    let exec = Executor::builder().wasm_backends().build();
    let names: Vec<&str> = exec.backends().map(|b| b.name()).collect();
    assert_eq!(names, ["wasm", "quickjs-wasm", "python-wasm"]);
    // Three backends, one engine: one ticker thread (and one instance pool).
    assert_eq!(settles_at("execbox-epoch", before + 2), before + 1);
    drop(exec);
    assert_eq!(threads_named("execbox-epoch"), before);
}

/// The epoch follows the real clock: each of the ticker's sleeps lasts
/// longer than a tick (more so on a loaded machine: here, busy threads on
/// every core), and counting sleeps instead of time made deadlines late.
#[test]
fn a_deadline_holds_under_cpu_contention() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use execbox::{ExecRequest, Outcome, SandboxPolicy};
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let wasm = WasmGuest::new(WasmGuestConfig::default()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let spinners: Vec<_> = (0..8)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n = n.wrapping_add(1);
                    std::hint::black_box(n);
                }
            })
        })
        .collect();
    let request = ExecRequest::wasm(&b"(module (func (export \"_start\") (loop br 0)))"[..])
        .policy(SandboxPolicy::strict().timeout(Duration::from_millis(1000)));
    let result = Executor::run_on(&wasm, request).unwrap();
    stop.store(true, Ordering::Relaxed);
    spinners.into_iter().for_each(|t| t.join().unwrap());
    assert_eq!(result.outcome, Outcome::TimedOut);
    let ms = result.usage.duration.as_millis();
    // Measured here: 1001–1012 ms; counting sleeps gave 1126–1157 ms.
    assert!(ms < 1080, "a 1000 ms deadline fired after {ms} ms");
}
