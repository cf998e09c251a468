//! The whole default matrix under load: 1,000 mixed runs at 64 concurrent
//! — JavaScript on contained boa (and pinned to QuickJS), wasm guests,
//! Python in wasm (pooled and fresh), a few containers, and a tenth of them
//! endless loops under short deadlines. Every run must come back with its
//! own nonce, no run may be refused (bursts wait for workers and slots
//! within their deadlines), and afterwards the process has as many threads
//! and file descriptors as before, about the same memory, the JS pool is
//! back to its idle size with no zombies, and no container or temp dir of
//! this process is left.
//!
//! Alone in its test binary: the counts are this process's. Needs the
//! interpreters (`scripts/fetch-interpreters.sh`); the container runs need
//! an engine and its images, and are left out without one unless
//! `EXECBOX_REQUIRE_CONTAINERS=1`.

mod common;

use std::time::{Duration, Instant};

use common::wait::wait_until;
use common::{docker, procfs, skip, soak};

use execbox::backends::Container;
use execbox::{ExecError, ExecRequest, Executor, Language, Outcome, SandboxPolicy};
use serde_json::json;

const RUNS: usize = 1_000;
const CONCURRENCY: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Js,
    QuickJs,
    Wasm,
    PythonPooled,
    PythonFresh,
    Shell,
    Loop,
}

fn kind_of(i: usize, containers: bool) -> Kind {
    if i % 10 == 7 {
        return Kind::Loop;
    }
    if containers && i % 50 == 1 {
        return Kind::Shell;
    }
    match i % 7 {
        0..=2 => Kind::Js,
        3 => Kind::Wasm,
        4 => Kind::PythonPooled,
        5 => Kind::PythonFresh,
        _ if i.is_multiple_of(3) => Kind::QuickJs,
        _ => Kind::Js,
    }
}

fn job(i: usize, kind: Kind) -> (ExecRequest, Option<String>) {
    let nonce = format!("n{i}-{:x}", i * 7919 + 17);
    let roomy = SandboxPolicy::strict().timeout(Duration::from_secs(120));
    let short = SandboxPolicy::strict().timeout(Duration::from_millis(400));
    let request = match kind {
        Kind::Js => ExecRequest::javascript("console.log(input.nonce); return {nonce: input.nonce}")
            .input(json!({"nonce": nonce}))
            .policy(roomy),
        Kind::QuickJs => ExecRequest::javascript("return {nonce: input.nonce}")
            .input(json!({"nonce": nonce}))
            .on_backend("quickjs-wasm")
            .policy(roomy),
        Kind::Wasm => ExecRequest::wasm(include_bytes!("../guests/wat/echo_json.wat").to_vec())
            .input(json!({"nonce": nonce}))
            .policy(roomy),
        Kind::PythonPooled => {
            ExecRequest::source(Language::Python, "import json\nprint(json.dumps({'nonce': input['nonce']}))")
                .input(json!({"nonce": nonce}))
                .policy(roomy)
        }
        // An argument is fixed at start-up: always a fresh instance.
        Kind::PythonFresh => {
            ExecRequest::source(Language::Python, "import json, sys\nprint(json.dumps({'nonce': sys.argv[1]}))")
                .arg(&nonce)
                .policy(roomy)
        }
        Kind::Shell => {
            ExecRequest::source(Language::Shell, "printf '{\"nonce\": \"%s\"}' \"$1\"").arg(&nonce).policy(roomy)
        }
        Kind::Loop => {
            let request = match (i / 10) % 3 {
                0 => ExecRequest::javascript("while (true) {}"),
                1 => ExecRequest::wasm(include_bytes!("../guests/wat/infinite_loop.wat").to_vec()),
                _ => ExecRequest::source(Language::Python, "while True: pass"),
            };
            return (request.policy(short), None);
        }
    };
    (request, Some(nonce))
}

/// This process's temp dirs.
fn own_temp_dirs() -> usize {
    procfs::temp_dirs("execbox-", Container::owner_token()).len()
}

#[test]
fn a_thousand_mixed_runs_at_64_concurrent_leave_nothing_behind() {
    let exec = Executor::with_default_backends();
    let available = |name: &str| exec.backends().find(|b| b.name() == name).is_some_and(|b| b.availability().is_ok());
    let needs = "needs the interpreters (scripts/fetch-interpreters.sh) and a JS worker";
    if !skip::available(
        skip::INTERPRETERS,
        if available("python-wasm") && available("boa-js") { Ok(()) } else { Err(needs) },
    ) {
        return;
    }
    let no_engine = "no container engine or images: the container runs are left out";
    let containers = skip::available(skip::CONTAINERS, if available("container") { Ok(()) } else { Err(no_engine) });
    // One run of each kind first: what exists once per process (pools,
    // compile workers, spawner threads) exists before the counts are taken.
    for i in 0..70 {
        let kind = kind_of(i, containers);
        let (request, _) = job(i, kind);
        let _ = exec.execute_blocking(request);
    }
    // Then it settles: every pool is full again and the warm-up's containers
    // are removed (which nothing announces: both are looked at).
    let pools_full = || exec.backends().all(|b| b.readiness().is_none_or(|r| r.ready >= r.target));
    let settled = || pools_full() && (!containers || docker::owned(Container::owner_token(), true).is_empty());
    // An unsettled matrix would make a leak's baseline: it must settle.
    assert!(wait_until(Duration::from_secs(60), settled), "the matrix did not settle before the soak");
    let threads_before = procfs::count_entries("/proc/self/task");
    let fds_before = procfs::count_entries("/proc/self/fd");
    let rss_before = procfs::own_rss_bytes();
    let started = Instant::now();

    let outcomes = soak::burst(&exec, RUNS, CONCURRENCY, move |i| {
        let kind = kind_of(i, containers);
        let (request, nonce) = job(i, kind);
        (request, (kind, nonce))
    });
    let took = started.elapsed();

    let mut per_kind = std::collections::BTreeMap::<String, usize>::new();
    let mut busy = 0;
    for (i, (kind, nonce), result) in outcomes {
        let r = match (kind, result) {
            (_, Ok(r)) => r,
            // A 400 ms deadline may pass while every slot or worker is busy:
            // the one refusal allowed, typed and naming a real backend.
            (Kind::Loop, Err(ExecError::Busy { backend, .. })) => {
                assert!(["boa-js", "wasm", "python-wasm"].contains(&backend.as_str()), "{backend}");
                busy += 1;
                continue;
            }
            (_, Err(e)) => panic!("run {i} ({kind:?}) was refused: {e}"),
        };
        *per_kind.entry(format!("{kind:?}/{}", r.backend)).or_default() += 1;
        match kind {
            Kind::Loop => assert_eq!(r.outcome, Outcome::TimedOut, "run {i}: {r:?}"),
            _ => {
                assert_eq!(r.outcome, Outcome::Ok, "run {i} ({kind:?}): {r:?}");
                let answered = r.output.as_ref().and_then(|o| o.get("nonce")).and_then(|n| n.as_str());
                assert_eq!(answered, nonce.as_deref(), "run {i} ({kind:?}) got another run's answer: {r:?}");
                if kind == Kind::Js {
                    assert_eq!(r.stdout.text().trim(), nonce.as_deref().unwrap());
                }
            }
        }
    }
    eprintln!("{RUNS} runs at {CONCURRENCY} concurrent in {took:?}: {per_kind:?}; {busy} short loops busy");

    // Pools refill and shrink back off the request path: give them time.
    let settled = wait_until(Duration::from_secs(60), || {
        procfs::count_entries("/proc/self/task") <= threads_before + 2
            && procfs::count_entries("/proc/self/fd") <= fds_before + 4
    });
    assert!(
        settled,
        "threads {} (before {threads_before}), fds {} (before {fds_before})",
        procfs::count_entries("/proc/self/task"),
        procfs::count_entries("/proc/self/fd")
    );
    assert!(wait_until(Duration::from_secs(30), || procfs::zombie_children().is_empty()), "zombie workers");
    let grown = procfs::own_rss_bytes().saturating_sub(rss_before);
    assert!(grown < 128 << 20, "the host grew by {} MiB", grown >> 20);
    if containers {
        assert!(
            wait_until(Duration::from_secs(60), || docker::owned(Container::owner_token(), true).is_empty()),
            "{:?}",
            docker::owned(Container::owner_token(), true)
        );
    }
    drop(exec);
    assert!(wait_until(Duration::from_secs(60), || own_temp_dirs() == 0), "temp dirs left: {}", own_temp_dirs());
}
