//! Soak for the container backend: many runs at once, about one in ten an
//! endless loop under a short deadline, then nothing of this process is
//! left — no container carrying its owner label, no temp dir with its owner
//! token.
//!
//! A test binary of its own: the owner token is this process's, so no other
//! test's containers or temp dirs can hide a leak or fake one. Skips (with
//! the reason) only when no engine answers; `EXECBOX_REQUIRE_CONTAINERS=1`
//! makes that a failure.
#![cfg(feature = "container")]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{docker, procfs, skip};
use execbox::backends::container::{Container, ContainerConfig};
use execbox::{Backend, ExecRequest, Executor, Language, Outcome, SandboxPolicy};
use serde_json::json;

fn owned_temp_dirs() -> Vec<String> {
    procfs::temp_dirs("execbox-", Container::owner_token())
}

/// One request of the mix and the outcome it must have.
fn request(i: usize) -> (ExecRequest, Outcome) {
    let policy = |ms: u64| SandboxPolicy::strict().timeout(Duration::from_millis(ms));
    let python = |code: &str| ExecRequest::source(Language::Python, code);
    let shell = |code: &str| ExecRequest::source(Language::Shell, code);
    match i % 10 {
        0 => (python("while True: pass").policy(policy(1500)), Outcome::TimedOut),
        1 | 4 => (python(&format!("print({i} * 2)")).policy(policy(30_000)), Outcome::Ok),
        2 => (shell("echo hi; exit 3").policy(policy(30_000)), Outcome::Failed),
        3 => (
            python("open('/work/out/r.txt', 'w').write('x')").policy(policy(30_000)).collect_output_files(),
            Outcome::Ok,
        ),
        5 => (python("print(sum(input))").input(json!([1, 2, 3])).policy(policy(30_000)), Outcome::Ok),
        6 => (shell("sleep 0.2; echo done").policy(policy(30_000)), Outcome::Ok),
        7 => (python("import sys; sys.stdout.write('x' * 100000)").policy(policy(30_000)), Outcome::Ok),
        8 => (python("raise SystemExit(2)").policy(policy(30_000)), Outcome::Failed),
        _ => (shell("echo $((1 + 1))").policy(policy(30_000)), Outcome::Ok),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mix_of_runs_with_endless_loops_leaves_nothing_behind() {
    if !skip::engine_answers("docker".as_ref()) {
        return;
    }
    let cfg = ContainerConfig::default().extra_run_args(vec!["--label=execbox.test=soak".into()]);
    let container = Container::new(cfg).unwrap();
    container.availability().expect("images built (scripts/build-images.sh)");
    let exec = Executor::builder().backend(container).build();

    // Proof that the label check below can see something: the runs carry it
    // (docker's event of a container of this process starting).
    let started = docker::Events::new(&[&docker::owned_by(Container::owner_token()), "event=start"]);

    const RUNS: usize = 40;
    const AT_ONCE: usize = 6;
    let gate = Arc::new(tokio::sync::Semaphore::new(AT_ONCE));
    let tasks: Vec<_> = (0..RUNS)
        .map(|i| {
            let (exec, gate) = (exec.clone(), Arc::clone(&gate));
            tokio::spawn(async move {
                let _slot = gate.acquire().await.unwrap();
                let (request, expected) = request(i);
                (i, expected, exec.execute(request).await)
            })
        })
        .collect();
    for task in tasks {
        let (i, expected, result) = task.await.unwrap();
        let result = result.unwrap_or_else(|e| panic!("run {i}: {e}"));
        assert_eq!(result.outcome, expected, "run {i}: {result:?}");
    }
    let seen = started.next_before(Instant::now() + Duration::from_secs(60)).is_some();
    assert!(seen, "no container ever carried this process's owner label");

    drop(exec); // the last handle: joins the reaper
    assert_eq!(docker::owned(Container::owner_token(), true), Vec::<String>::new(), "containers left behind");
    assert_eq!(owned_temp_dirs(), Vec::<String>::new(), "temp dirs left behind");
}
