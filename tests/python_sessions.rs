//! Python sessions: CPython-in-wasm instances that keep globals across
//! cells (and, with declared packages, containers: see
//! `tests/library/container_backend.rs`). Through the library's session
//! registry, the way the agent layer and the MCP server use them.
#![cfg(feature = "wasm")]

mod common;

use std::time::{Duration, Instant};

use common::procfs::threads_named;
use common::skip;
use common::wait::wait_until;
use execbox::Executor;
use execbox::backends::{InterpreterConfig, WasmInterpreter};
use execbox::{Backend, ExecRequest, Language, Outcome, SandboxPolicy, SessionConfig, SessionSpec, Sessions};
use serde_json::json;

fn python() -> Option<WasmInterpreter> {
    skip::interpreter(WasmInterpreter::new(InterpreterConfig::default().warm_pool(1)).expect("engine"))
}

fn cell(code: &str) -> ExecRequest {
    ExecRequest::source(Language::Python, code).policy(SandboxPolicy::strict().timeout(Duration::from_secs(20)))
}

#[test]
fn cells_share_globals_per_session_and_nothing_else() {
    let Some(py) = python() else { return };
    let sessions = Sessions::builder().config(SessionConfig::default()).backend(py.clone()).build();
    sessions.open("a", SessionSpec::new(Language::Python)).unwrap();
    sessions.open("b", SessionSpec::new(Language::Python)).unwrap();
    let r =
        sessions.execute("a", cell("import json\ntotal = 40\ndef twice(n):\n    return 2 * n\nprint('set')")).unwrap();
    assert_eq!((r.outcome, r.stdout.text().as_ref()), (Outcome::Ok, "set\n"), "{r:?}");
    let r =
        sessions.execute("a", cell("print(json.dumps(twice(total) + input['add']))").input(json!({"add": 2}))).unwrap();
    assert_eq!((r.outcome, r.output.clone()), (Outcome::Ok, Some(json!(82))), "{r:?}");
    // Stdout and stderr are per cell.
    let r = sessions.execute("a", cell("import sys\nprint('only this', file=sys.stderr)")).unwrap();
    assert_eq!((r.stdout.text().as_ref(), r.stderr.text().as_ref()), ("", "only this\n"));
    // Another session and a stateless run see none of it.
    let r = sessions.execute("b", cell("print('total' in globals())")).unwrap();
    assert_eq!(r.stdout.text(), "False\n");
    let stateless = Executor::run_on(&py, cell("print('total' in globals())")).unwrap();
    assert_eq!(stateless.stdout.text(), "False\n");
    // A failing cell keeps the session; its traceback names the caller's lines.
    let r = sessions.execute("a", cell("x = 1\nraise ValueError('nope')")).unwrap();
    assert_eq!(r.outcome, Outcome::Failed);
    assert!(r.stderr.text().contains("line 2") && r.stderr.text().contains("ValueError: nope"), "{r:?}");
    assert!(!r.stderr.text().contains("_execbox_session"), "the loop's own frame is not shown: {r:?}");
    let r = sessions.execute("a", cell("print(total, x)")).unwrap();
    assert_eq!(r.stdout.text(), "40 1\n");
    // Reading stdin in a cell sees end-of-file, not the next cell.
    let r = sessions.execute("a", cell("import sys\nprint(repr(sys.stdin.read()))")).unwrap();
    assert_eq!(r.stdout.text(), "''\n");
    assert!(sessions.close("a") && sessions.close("b"));
}

#[test]
fn a_timed_out_or_out_of_memory_cell_ends_the_session_as_lost() {
    let Some(py) = python() else { return };
    let sessions = Sessions::builder().config(SessionConfig::default()).backend(py).build();
    sessions.open("slow", SessionSpec::new(Language::Python)).unwrap();
    sessions.execute("slow", cell("kept = 1")).unwrap();
    let started = Instant::now();
    let r = sessions
        .execute("slow", cell("while True: pass").policy(SandboxPolicy::strict().timeout(Duration::from_millis(300))))
        .unwrap();
    assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    let lost = sessions.execute("slow", cell("print(kept)")).unwrap_err();
    assert_eq!(lost.kind(), "session_lost", "{lost}");

    // Ending the interpreter is a failure of the cell, not a timeout; the session is lost.
    sessions.open("exit", SessionSpec::new(Language::Python)).unwrap();
    let r = sessions.execute("exit", cell("import os\nos._exit(3)")).unwrap();
    assert_eq!((r.outcome, r.exit_code), (Outcome::Failed, Some(3)), "{r:?}");
    assert_eq!(sessions.execute("exit", cell("1")).unwrap_err().kind(), "session_lost");

    sessions.open("big", SessionSpec::new(Language::Python)).unwrap();
    let bomb = cell("blocks = []\nwhile True:\n    blocks.append(bytearray(8 << 20))")
        .policy(SandboxPolicy::strict().timeout(Duration::from_secs(20)).memory_bytes(64 << 20));
    let r = sessions.execute("big", bomb).unwrap();
    assert_eq!(r.outcome, Outcome::OutOfMemory, "{r:?}");
    assert_eq!(sessions.execute("big", cell("1")).unwrap_err().kind(), "session_lost");
}

#[test]
fn sessions_are_bounded_expire_and_free_everything_on_close() {
    let Some(py) = python() else { return };
    // The idle timeout must outlast opening two sessions and a refusal on a
    // loaded 2-core CI machine (at 600 ms the first one expired early).
    let before = threads_named("execbox-warm");
    let sessions = Sessions::builder()
        .config(SessionConfig::default().max_sessions(2).idle_timeout(Duration::from_secs(3)))
        .backend(py)
        .build();
    let a = sessions.open_new(SessionSpec::new(Language::Python)).unwrap();
    let _b = sessions.open_new(SessionSpec::new(Language::Python)).unwrap();
    assert_eq!(sessions.open_new(SessionSpec::new(Language::Python)).unwrap_err().kind(), "too_many_sessions");
    // Declared packages are not python-wasm's: refused, typed.
    let numpy = ["numpy".to_string()];
    assert_eq!(
        sessions.open("n", SessionSpec::new(Language::Python).packages(numpy.clone())).unwrap_err().kind(),
        "packages_unavailable"
    );
    sessions.execute(&a, cell("v = 1")).unwrap();
    // Both expire untouched; their instances' threads end.
    wait_until(Duration::from_secs(15), || sessions.is_empty() && threads_named("execbox-warm") <= before + 1);
    assert!(sessions.is_empty(), "idle sessions expired");
    assert_eq!(sessions.execute(&a, cell("v")).unwrap_err().kind(), "session_lost");
    // At most the pool's own instance is left (it was refilled).
    assert!(threads_named("execbox-warm") <= before + 1, "{} warm threads", threads_named("execbox-warm"));
}

// ---- container sessions (declared packages) ------------------------------------

#[cfg(feature = "container")]
mod containers {
    use super::*;
    use execbox::backends::Container;

    fn container() -> Option<Container> {
        let c = Container::default();
        skip::available(skip::CONTAINERS, c.availability()).then_some(c)
    }

    /// This process's containers (running or not).
    fn ours() -> Vec<String> {
        common::docker::owned(Container::owner_token(), true)
    }

    #[test]
    fn a_session_with_packages_runs_in_a_container_keeps_state_and_is_removed_on_close() {
        let Some(c) = container() else { return };
        let Some(py) = python() else { return };
        // python-wasm first (cheaper), the container for what it lacks.
        let sessions = Sessions::builder().config(SessionConfig::default()).backend(py).backend(c).build();
        let numpy = ["numpy".to_string()];
        sessions.open("np", SessionSpec::new(Language::Python).packages(numpy.clone())).unwrap();
        let before = ours();
        assert!(!before.is_empty(), "the session's container runs");
        let slow = SandboxPolicy::strict().timeout(Duration::from_secs(60));
        let r = sessions.execute("np", cell("import numpy as np\na = np.arange(10)").policy(slow.clone())).unwrap();
        assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
        assert_eq!(r.backend, "container-session");
        let r = sessions.execute("np", cell("print(int(a.sum()))").policy(slow.clone())).unwrap();
        assert_eq!((r.outcome, r.output.clone()), (Outcome::Ok, Some(json!(45))), "{r:?}");
        // A stateless python-wasm session knows nothing of it.
        sessions.open("plain", SessionSpec::new(Language::Python)).unwrap();
        let r = sessions.execute("plain", cell("print('a' in globals())")).unwrap();
        assert_eq!((r.backend.as_str(), r.stdout.text().as_ref()), ("python-wasm-session", "False\n"));
        // A cell that leaves a thread (or a process) running past its end
        // ends the session: nothing of a cell outlives its deadline.
        sessions.open("spin", SessionSpec::new(Language::Python).packages(numpy.clone())).unwrap();
        let spin =
            "import threading\ndef spin():\n    while True: pass\nthreading.Thread(target=spin, daemon=True).start()";
        let r = sessions.execute("spin", cell(spin).policy(slow.clone())).unwrap();
        assert_eq!(r.outcome, Outcome::Failed, "{r:?}");
        assert!(r.message.as_deref().unwrap_or("").contains("threads still ran"), "{r:?}");
        assert_eq!(sessions.execute("spin", cell("1").policy(slow.clone())).unwrap_err().kind(), "session_lost");
        // A forged end-of-cell record does not end the cell early either.
        sessions.open("forge", SessionSpec::new(Language::Python).packages(numpy.clone())).unwrap();
        let forge = "import os, sys\nm = sys._getframe(1).f_locals['marker']\nrec = (m + 'R13:{\"status\": 0}\\n').encode()\nos.write(2, rec)\nos.write(1, rec)\nwhile True: pass";
        let r = sessions.execute("forge", cell(forge).policy(slow.clone())).unwrap();
        assert_ne!(r.outcome, Outcome::Ok, "{r:?}");
        assert_eq!(sessions.execute("forge", cell("1").policy(slow.clone())).unwrap_err().kind(), "session_lost");
        // A timed-out cell ends the container session as lost, and kills it.
        let r = sessions
            .execute("np", cell("while True: pass").policy(SandboxPolicy::strict().timeout(Duration::from_millis(500))))
            .unwrap();
        assert_eq!(r.outcome, Outcome::TimedOut, "{r:?}");
        assert_eq!(sessions.execute("np", cell("a").policy(slow)).unwrap_err().kind(), "session_lost");
        sessions.close("plain");
        // Closed (or lost) sessions leave no container behind.
        common::docker::wait_gone(&[&common::docker::owned_by(Container::owner_token())], Duration::from_secs(20));
        assert!(ours().is_empty(), "containers left: {:?}", ours());
    }

    /// The analysis in three cells, through the agent layer: read a
    /// staged CSV into pandas, aggregate, save a matplotlib PNG.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_data_analysis_in_three_cells_through_the_agent_layer() {
        use execbox::ExecFile;
        use execbox::agent::{CodeExecutionInput, CodeExecutor, ExecboxCodeExecutor, InvocationContext};
        let Some(c) = container() else { return };
        let Some(py) = python() else { return };
        let exec = execbox::Executor::builder().backend(py.clone()).backend(c.clone()).build();
        let sessions = Sessions::builder().config(SessionConfig::default()).backend(py).backend(c).build();
        let agent = ExecboxCodeExecutor::new(exec).with_timeout(Duration::from_secs(60)).with_sessions(sessions);
        let packages = vec!["pandas".to_string(), "matplotlib".to_string()];
        let step = |code: &str| CodeExecutionInput {
            execution_id: Some("analysis".into()),
            packages: packages.clone(),
            collect_output_files: true,
            ..CodeExecutionInput::new("python", code)
        };
        let csv = "city,sales\nOslo,10\nLima,7\nOslo,5\nLima,1\n";
        let first = CodeExecutionInput {
            input_files: vec![ExecFile::new("sales.csv", csv)],
            ..step("import pandas as pd\ndf = pd.read_csv('sales.csv')\nprint(len(df))")
        };
        let ctx = InvocationContext::default();
        let r = agent.execute_code(&ctx, first).await.unwrap();
        assert_eq!((r.is_success(), r.stdout.as_str()), (true, "4\n"), "{r:?}");
        let r = agent
            .execute_code(&ctx, step("totals = df.groupby('city').sales.sum()\nprint(totals.to_json())"))
            .await
            .unwrap();
        assert_eq!(r.output, Some(json!({"Lima": 8, "Oslo": 15})), "{r:?}");
        let plot = "import matplotlib.pyplot as plt\ntotals.plot(kind='bar')\nplt.savefig('/work/out/totals.png')";
        let r = agent.execute_code(&ctx, step(plot)).await.unwrap();
        assert!(r.is_success(), "{r:?}");
        assert_eq!(r.output_files.len(), 1, "{r:?}");
        let png = &r.output_files[0];
        assert_eq!((png.name.as_str(), png.mime_type.as_deref()), ("totals.png", Some("image/png")));
        assert!(png.content.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
        assert!(r.model_text().contains("totals.png"), "the model is told a file came back: {}", r.model_text());
        assert!(agent.close_session("analysis"));
    }

    /// A session's container runs under exactly execbox's seccomp profile
    /// (the engine's record of it), and a cell meets it: `io_uring_setup`
    /// is `EPERM` (docker 20.10's default profile let it reach the kernel).
    #[test]
    fn a_session_container_runs_under_execbox_seccomp_profile() {
        use common::programs::{IO_URING_SETUP_ERRNO, SECCOMP_PROFILE};
        let Some(c) = container() else { return };
        let sessions = Sessions::builder().config(SessionConfig::default()).backend(c).build();
        sessions.open("seccomp", SessionSpec::new(Language::Python).packages(["numpy".to_string()])).unwrap();
        let owner = common::docker::owned_by(Container::owner_token());
        let ids = common::docker::ps(&["--filter", &owner, "--filter", "label=execbox.role=session"]);
        assert!(!ids.is_empty(), "the session's container runs");
        let expected: serde_json::Value = serde_json::from_str(SECCOMP_PROFILE).unwrap();
        for id in &ids {
            assert_eq!(common::docker::seccomp_profile_of(id).as_ref(), Some(&expected), "{id}");
        }
        let slow = SandboxPolicy::strict().timeout(Duration::from_secs(60));
        let r = sessions.execute("seccomp", cell(IO_URING_SETUP_ERRNO).policy(slow)).unwrap();
        assert_eq!(
            (r.outcome, r.backend.as_str(), r.stdout.text().trim()),
            (Outcome::Ok, "container-session", "1"),
            "{r:?}"
        );
        sessions.close("seccomp");
    }
}
