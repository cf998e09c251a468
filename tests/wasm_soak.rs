//! Soak: a few hundred mixed wasm runs (guests, pooled and fresh Python,
//! QuickJS, a tenth of them endless loops under short deadlines) at high
//! concurrency on one shared engine. Every run must answer with its own
//! nonce, no run whose deadline allows waiting may be refused as busy, and
//! afterwards the process has as many threads, file descriptors and temp
//! dirs as before. Alone in its own test binary, so nothing else moves those
//! counts.
//!
//! Needs the interpreter modules (`scripts/fetch-interpreters.sh`); without
//! them it passes with a message unless `EXECBOX_REQUIRE_INTERPRETERS=1`.
#![cfg(feature = "wasm")]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::wait::wait_until;
use common::{procfs, skip, soak};
use execbox::backends::{Interpreter, InterpreterConfig, WasmEngine, WasmGuest, WasmGuestConfig, WasmInterpreter};
use execbox::{Backend, ExecError, ExecRequest, Executor, Language, Outcome, SandboxPolicy};
use serde_json::json;

const RUNS: usize = 400;
const CONCURRENCY: usize = 64;

/// execbox temp dirs of this process (`execbox-<what>-<owner token>-...`).
fn own_temp_dirs(what: &str) -> usize {
    procfs::temp_dirs(&format!("execbox-{what}-"), &procfs::own_token()).len()
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    WasmJson,
    WasmCommand,
    QuickJs,
    PythonPooled,
    PythonFresh,
    Loop,
}

fn kind_of(i: usize) -> Kind {
    if i.is_multiple_of(10) {
        return Kind::Loop;
    }
    match i % 9 {
        0 | 1 => Kind::WasmJson,
        2 | 3 => Kind::WasmCommand,
        4 | 5 => Kind::QuickJs,
        6 | 7 => Kind::PythonPooled,
        _ => Kind::PythonFresh,
    }
}

/// The request of run `i`, and the nonce its result must carry (none for loops).
fn job(i: usize) -> (ExecRequest, Option<String>) {
    let nonce = format!("n{i}-{:x}", i * 7919 + 17);
    let roomy = SandboxPolicy::strict().timeout(Duration::from_secs(90));
    let short = SandboxPolicy::strict().timeout(Duration::from_millis(300));
    let echo = include_bytes!("../guests/wat/echo_json.wat").to_vec();
    let tool = include_bytes!("../guests/prebuilt/wasi_tool.wasm").to_vec();
    match kind_of(i) {
        Kind::WasmJson => (ExecRequest::wasm(echo).input(json!({"nonce": nonce})).policy(roomy), Some(nonce)),
        Kind::WasmCommand => (ExecRequest::wasm(tool).arg("args").arg(&nonce).policy(roomy), Some(nonce)),
        Kind::QuickJs => (
            // A memory cap: what sends JS to QuickJS rather than boa.
            ExecRequest::javascript("return {nonce: input.nonce}")
                .input(json!({"nonce": nonce}))
                .policy(roomy.memory_bytes(64 << 20)),
            Some(nonce),
        ),
        Kind::PythonPooled => (
            ExecRequest::source(Language::Python, "import json\nprint(json.dumps({'nonce': input['nonce']}))")
                .input(json!({"nonce": nonce}))
                .policy(roomy),
            Some(nonce),
        ),
        Kind::PythonFresh => (
            // An argument is fixed at start-up: always a fresh instance.
            ExecRequest::source(Language::Python, "import sys\nprint(sys.argv[1])").arg(&nonce).policy(roomy),
            Some(nonce),
        ),
        Kind::Loop => {
            let request = match (i / 10) % 3 {
                0 => ExecRequest::wasm(include_bytes!("../guests/wat/infinite_loop.wat").to_vec()).policy(short),
                1 => ExecRequest::source(Language::Python, "while True: pass").policy(short),
                _ => ExecRequest::javascript("while (true) {}").policy(short.memory_bytes(64 << 20)),
            };
            (request, None)
        }
    }
}

fn answered_nonce(kind: Kind, r: &execbox::ExecResult) -> Option<String> {
    match kind {
        Kind::WasmCommand | Kind::PythonFresh => Some(r.stdout.text().trim().to_string()),
        _ => r.output.as_ref()?.get("nonce")?.as_str().map(str::to_string),
    }
}

#[test]
fn soak_mixed_wasm_runs_at_high_concurrency() {
    let engine = WasmEngine::new(WasmGuestConfig::default()).unwrap();
    let wasm = Arc::new(WasmGuest::on_engine(engine.clone()));
    let qjs =
        Arc::new(WasmInterpreter::on_engine(engine.clone(), InterpreterConfig::default().kind(Interpreter::QuickJs)));
    let py = Arc::new(WasmInterpreter::on_engine(engine.clone(), InterpreterConfig::default()));
    if !skip::available(skip::INTERPRETERS, py.availability().and(qjs.availability())) {
        return;
    }
    let exec =
        Executor::builder().shared_backend(wasm.clone()).shared_backend(qjs.clone()).shared_backend(py.clone()).build();
    let settle = |what: &str| {
        // The warm pool refills after each pooled run: wait until it is full
        // and its instances wait for code.
        wait_until(Duration::from_secs(120), || py.warm_idle() >= 2 && py.warm_ready() >= 2);
        assert_eq!(py.warm_ready(), 2, "{what}: the warm pool is full and ready");
    };

    // One run of each kind first, so what is created once per process
    // (compile threads, wasmtime-wasi's runtime, the warm pool) exists
    // before the counts are taken.
    for i in 1..10 {
        let (request, _) = job(i);
        exec.execute_blocking(request).unwrap();
    }
    settle("before");
    let threads_before = procfs::count_entries("/proc/self/task");
    let fds_before = procfs::count_entries("/proc/self/fd");
    let started = Instant::now();

    // How full the instance pool got: the burst must exceed it, or nothing waited.
    let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let (engine, sampling) = (engine.clone(), sampling.clone());
        std::thread::spawn(move || {
            let mut most = 0;
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                most = most.max(engine.slots_in_use());
                // The sampling period of the measurement, not a wait for anything.
                std::thread::sleep(Duration::from_micros(500));
            }
            most
        })
    };
    let outcomes = soak::burst(&exec, RUNS, CONCURRENCY, job);
    let took = started.elapsed();
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    let most_slots = sampler.join().unwrap();

    let (mut ok, mut timed_out, mut busy_short) = (0, 0, 0);
    for (i, nonce, result) in outcomes {
        let kind = kind_of(i);
        match (kind, result) {
            (Kind::Loop, Ok(r)) => {
                assert_eq!(r.outcome, Outcome::TimedOut, "run {i} ({kind:?}): {r:?}");
                timed_out += 1;
            }
            // A 300 ms deadline may pass while every slot is busy: that is the
            // one refusal allowed, and it must be typed and name the backend.
            (Kind::Loop, Err(ExecError::Busy { backend, .. })) => {
                assert!(["wasm", "python-wasm", "quickjs-wasm"].contains(&backend.as_str()), "{backend}");
                busy_short += 1;
            }
            (_, Ok(r)) => {
                assert_eq!(r.outcome, Outcome::Ok, "run {i} ({kind:?}): {r:?}");
                assert_eq!(answered_nonce(kind, &r), nonce, "run {i} ({kind:?}) got another run's answer: {r:?}");
                ok += 1;
            }
            (_, Err(e)) => panic!("run {i} ({kind:?}) was refused although its deadline allowed waiting: {e}"),
        }
    }
    eprintln!(
        "soak: {RUNS} runs, {CONCURRENCY} at a time, in {:.1} s: {ok} ok, {timed_out} timed out, {busy_short} \
         short-deadline runs busy; at most {most_slots} slots in use",
        took.as_secs_f64(),
    );
    assert_eq!(ok + timed_out + busy_short, RUNS);
    assert_eq!(most_slots, 32, "the burst filled the pool, so runs had to wait for slots");

    settle("after");
    assert_eq!(engine.slots_in_use(), 2, "only the two warm instances hold slots");
    let threads_after = procfs::count_entries("/proc/self/task");
    let fds_after = procfs::count_entries("/proc/self/fd");
    assert!(threads_after <= threads_before + 2, "threads: {threads_before} before, {threads_after} after");
    assert!(fds_after <= fds_before + 4, "fds: {fds_before} before, {fds_after} after");
    assert_eq!(own_temp_dirs("input"), 0, "no staging dir is left");
    assert_eq!(own_temp_dirs("warm"), 2, "one /work per warm instance");
}
