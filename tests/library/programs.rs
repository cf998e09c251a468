//! Programs: processes that keep running in a workspace, driven by poll,
//! write and kill, that end with their tree, their lifetime and their
//! workspace.

use std::time::{Duration, Instant};

use crate::common;

use execbox::backends::BoaJsInThread;
use execbox::backends::container::ContainerConfig;
use execbox::{
    Control, ExecError, Executor, Program, ProgramError, ProgramOutput, ProgramSpec, ProgramStatus, Workspace,
    WorkspaceConfig, WorkspaceError,
};

/// A workspace and an executor with a container backend, or `None`
/// (skipped) where this machine has no engine or cannot mount. In the
/// order a test's bindings should drop last (the root, then the workspace).
fn setup(label: &str) -> Option<(tempfile::TempDir, Workspace, Executor)> {
    let root = tempfile::tempdir().unwrap();
    let ws = crate::workspace::workspace_with(WorkspaceConfig::default().root(root.path()))?;
    let container = common::skip::labelled_container(label, ContainerConfig::default())?;
    Some((root, ws, Executor::with_backend(container)))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// Polls until the output so far contains `needle` or the program ends
/// (at most 30 s); everything read.
async fn read_until(program: &Program, needle: &str) -> (String, ProgramOutput) {
    let mut text = String::new();
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let out = program.poll(Duration::from_millis(500), 1 << 20).await;
        text.push_str(&String::from_utf8_lossy(&out.output));
        if text.contains(needle) || out.status != ProgramStatus::Running || Instant::now() > until {
            return (text, out);
        }
    }
}

/// Runs `line` as a program to its end; its whole output.
async fn run(executor: &Executor, ws: &Workspace, line: &str) -> (String, ProgramOutput) {
    let program = executor.start_program(ws, ProgramSpec::shell(line)).await.unwrap();
    let (text, out) = read_until(&program, "\u{0}never").await;
    assert_ne!(out.status, ProgramStatus::Running, "{line}: {text}");
    (text, out)
}

/// How many processes of the workspace's container have a command line
/// that `pattern` (a Python regex written so it does not match itself)
/// finds.
async fn count(executor: &Executor, ws: &Workspace, pattern: &str) -> usize {
    let script = format!(
        "import os, re\n\
         n = 0\n\
         for p in filter(str.isdigit, os.listdir('/proc')):\n\
         \x20   try: n += bool(re.search(r'{pattern}', open('/proc/' + p + '/cmdline', 'rb').read().replace(b'\\0', b' ').decode()))\n\
         \x20   except OSError: pass\n\
         print(n)\n"
    );
    let program = executor.start_program(ws, ProgramSpec::argv(["python3", "-c", &script])).await.unwrap();
    let (text, _) = read_until(&program, "\u{0}never").await;
    text.trim().parse().unwrap_or_else(|_| panic!("{text:?}"))
}

#[test]
fn a_program_outlives_its_call_and_is_polled_to_its_exit_code() {
    let Some((_root, ws, executor)) = setup("programs-exit") else { return };
    runtime().block_on(async {
        let program = executor.start_program(&ws, ProgramSpec::shell("sleep 1; echo done; exit 7")).await.unwrap();
        let first = program.poll(Duration::ZERO, 100).await;
        assert_eq!((first.status, first.exit_code), (ProgramStatus::Running, None));
        let (text, end) = read_until(&program, "\u{0}never").await;
        assert_eq!(text, "done\n");
        assert_eq!((end.status, end.exit_code), (ProgramStatus::Exited, Some(7)));
        // The log is still there, from any offset, and the cursor is at its end.
        let log = program.log(2, 100);
        assert_eq!((log.output.as_slice(), log.offset, log.next_offset), (&b"ne\n"[..], 2, 5));
        assert!(program.poll(Duration::ZERO, 100).await.output.is_empty());
        // An argv runs without a shell; a missing program says why, and 127.
        let (text, end) = read_until(
            &executor.start_program(&ws, ProgramSpec::argv(["/bin/echo", "a b", "$HOME"])).await.unwrap(),
            "\u{0}never",
        )
        .await;
        assert_eq!((text.as_str(), end.exit_code), ("a b $HOME\n", Some(0)));
        // A text poll never ends inside a character: its start waits for the rest.
        let split = ProgramSpec::shell("printf '\\xc3'; sleep 0.3; printf '\\xa9\\n'");
        let split = executor.start_program(&ws, split).await.unwrap();
        assert!(split.poll_text(Duration::from_millis(100), 100).await.output.is_empty());
        let rest = split.poll_text(Duration::from_secs(5), 100).await;
        assert_eq!(String::from_utf8(rest.output).unwrap(), "é\n");
        let missing = executor.start_program(&ws, ProgramSpec::argv(["no-such-program"])).await.unwrap();
        let (text, end) = read_until(&missing, "\u{0}never").await;
        assert_eq!(end.exit_code, Some(127), "{text}");
        assert!(text.contains("did not start"), "{text}");
    });
}

#[test]
fn repls_answer_prompts_through_write_and_poll() {
    let Some((_root, ws, executor)) = setup("programs-repl") else { return };
    runtime().block_on(async {
        let python = executor.start_program(&ws, ProgramSpec::argv(["python3", "-i", "-q"]).tty(true)).await.unwrap();
        let (text, _) = read_until(&python, ">>> ").await;
        assert!(text.contains(">>> "), "{text:?}");
        python.write(b"x = 6 * 7\n").unwrap();
        python.write(b"print(x)\n").unwrap();
        let (text, _) = read_until(&python, "42").await;
        assert!(text.contains("42"), "{text:?}");
        // Ctrl-C interrupts a running statement, and the REPL goes on.
        python.write(b"import time; time.sleep(60)\n").unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        python.interrupt().unwrap();
        let (text, _) = read_until(&python, "KeyboardInterrupt").await;
        assert!(text.contains("KeyboardInterrupt"), "{text:?}");
        // EOF (Ctrl-D) ends it.
        python.close_input().unwrap();
        assert_eq!(python.wait().await, ProgramStatus::Exited);

        let bash = executor.start_program(&ws, ProgramSpec::shell("read -r name; echo \"hello $name\"")).await.unwrap();
        bash.write(b"world\n").unwrap();
        let (text, end) = read_until(&bash, "\u{0}never").await;
        assert_eq!((text.as_str(), end.exit_code), ("hello world\n", Some(0)));

        // Without a terminal, closing the input is the end of `cat`'s input.
        let cat = executor.start_program(&ws, ProgramSpec::argv(["cat"])).await.unwrap();
        cat.write(b"line").unwrap();
        cat.close_input().unwrap();
        let (text, end) = read_until(&cat, "\u{0}never").await;
        assert_eq!((text.as_str(), end.exit_code), ("line", Some(0)));
        assert!(cat.write(b"more").is_err(), "a write to an ended program");
    });
}

#[test]
fn kill_gives_a_grace_to_a_program_that_handles_sigterm_and_none_to_one_that_ignores_it() {
    let Some((_root, ws, executor)) = setup("programs-kill") else { return };
    runtime().block_on(async {
        let polite = "trap 'echo bye; exit 3' TERM; echo ready; while true; do sleep 0.1; done";
        let program = executor.start_program(&ws, ProgramSpec::shell(polite)).await.unwrap();
        read_until(&program, "ready").await;
        let end = program.kill(Duration::from_secs(10)).await;
        assert_eq!((end.status, end.exit_code), (ProgramStatus::Killed, Some(3)));
        assert!(String::from_utf8_lossy(&end.output).contains("bye"), "{end:?}");

        let stubborn = "trap '' TERM; echo ready; while true; do sleep 0.1; done";
        let program = executor.start_program(&ws, ProgramSpec::shell(stubborn)).await.unwrap();
        read_until(&program, "ready").await;
        let started = Instant::now();
        let end = program.kill(Duration::from_millis(500)).await;
        let took = started.elapsed();
        assert_eq!((end.status, end.exit_code), (ProgramStatus::Killed, Some(137)), "{end:?}");
        assert!(took >= Duration::from_millis(500), "killed before its grace: {took:?}");
    });
}

#[test]
fn what_a_program_leaves_running_ends_with_it() {
    let Some((_root, ws, executor)) = setup("programs-daemon") else { return };
    // The classic daemon: fork, setsid, fork again, parents exit.
    let daemon = |n: u32| {
        format!(
            "python3 -c 'import os, time\nif os.fork(): os._exit(0)\nos.setsid()\nif os.fork(): os._exit(0)\ntime.sleep({n})'"
        )
    };
    runtime().block_on(async {
        // Left behind by a program that exits.
        let (_, end) = run(&executor, &ws, &format!("{}; echo left", daemon(1001))).await;
        assert_eq!(end.exit_code, Some(0));
        assert_eq!(count(&executor, &ws, r"slee[p]\(1001").await, 0);
        // And by one that is killed.
        let line = format!("{}; echo up; sleep 1000", daemon(1002));
        let program = executor.start_program(&ws, ProgramSpec::shell(line)).await.unwrap();
        read_until(&program, "up").await;
        assert_eq!(count(&executor, &ws, r"slee[p]\(1002").await, 1);
        program.kill(Duration::from_millis(100)).await;
        assert_eq!(count(&executor, &ws, r"slee[p]\(1002").await, 0);
        // A program that kills its own shim ends, and so does what it runs.
        let (_, end) = run(&executor, &ws, "kill -9 $PPID; exec sleep 1003").await;
        assert_eq!(end.exit_code, Some(137));
        assert_eq!(count(&executor, &ws, r"slee[p] 1003").await, 0);
        // A program that stops its shim is still killed at once, alone.
        let bystander = executor.start_program(&ws, ProgramSpec::shell("sleep 1000")).await.unwrap();
        let stopper = executor.start_program(&ws, ProgramSpec::shell("kill -STOP $PPID; sleep 1004")).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let started = Instant::now();
        let end = stopper.kill(Duration::from_millis(100)).await;
        assert_eq!(end.status, ProgramStatus::Killed);
        assert!(started.elapsed() < Duration::from_secs(4), "the kill took {:?}", started.elapsed());
        assert_eq!(count(&executor, &ws, r"slee[p] 1004").await, 0);
        assert_eq!(bystander.status(), ProgramStatus::Running, "a program's kill took its neighbour");
        bystander.kill(Duration::ZERO).await;
    });
}

#[test]
fn a_start_that_finds_the_process_cap_full_ends_alone() {
    let Some((_root, ws, executor)) = setup("programs-pids") else { return };
    runtime().block_on(async {
        let capped = |spec: ProgramSpec| spec.policy(execbox::SandboxPolicy::strict().max_processes(24));
        let bystander = executor.start_program(&ws, capped(ProgramSpec::shell("sleep 1000"))).await.unwrap();
        let filler = "import os, time\n\
                      try:\n\
                      \x20   while True:\n\
                      \x20       if os.fork() == 0: time.sleep(1000); os._exit(0)\n\
                      except OSError: print('full', flush=True)\n\
                      time.sleep(1000)\n";
        let filler = executor.start_program(&ws, capped(ProgramSpec::argv(["python3", "-c", filler]))).await.unwrap();
        let (text, _) = read_until(&filler, "full").await;
        assert!(text.contains("full"), "{text}");
        let refused = executor.start_program(&ws, capped(ProgramSpec::argv(["echo", "hello"]))).await.unwrap();
        let (text, end) = read_until(&refused, "\u{0}never").await;
        assert_eq!((end.status, end.exit_code), (ProgramStatus::Exited, Some(126)), "{text}");
        assert!(text.contains("did not start"), "{text}");
        let end = filler.kill(Duration::ZERO).await;
        assert_eq!(end.status, ProgramStatus::Killed);
        assert_eq!(bystander.status(), ProgramStatus::Running, "the machine was lost");
        let (text, end) = run(&executor, &ws, "echo again").await;
        assert_eq!((text.as_str(), end.exit_code), ("again\n", Some(0)));
    });
}

#[test]
fn input_is_bounded_and_a_closed_input_says_so() {
    let Some((_root, ws, executor)) = setup("programs-input") else { return };
    runtime().block_on(async {
        let sink = executor.start_program(&ws, ProgramSpec::shell("wc -c")).await.unwrap();
        let big = vec![b'x'; execbox::program::MAX_WRITE_BYTES];
        assert!(matches!(sink.write(&[big.as_slice(), b"y"].concat()), Err(ProgramError::TooLarge(_))));
        for _ in 0..3 {
            sink.write(&big).unwrap();
        }
        sink.close_input().unwrap();
        assert!(matches!(sink.write(b"late"), Err(ProgramError::InputClosed)));
        let (text, end) = read_until(&sink, "\u{0}never").await;
        assert_eq!((text.trim(), end.exit_code, end.input_dropped_bytes), ("3145728", Some(0), 0));

        // A program that closes its own input: what is written after is
        // counted as dropped, and later writes are refused.
        let deaf = executor.start_program(&ws, ProgramSpec::shell("exec 0<&-; echo closed; sleep 1000")).await.unwrap();
        read_until(&deaf, "closed").await;
        deaf.write(b"hello?").unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        while deaf.log(0, 0).input_dropped_bytes == 0 && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(deaf.log(0, 0).input_dropped_bytes, 6);
        assert!(matches!(deaf.write(b"again"), Err(ProgramError::InputClosed)));
        deaf.kill(Duration::ZERO).await;
    });
}

#[test]
fn programs_of_one_workspace_share_its_files_and_its_loopback() {
    let Some((_root, ws, executor)) = setup("programs-loopback") else { return };
    runtime().block_on(async {
        ws.write("site/index.html", b"from the host").unwrap();
        let server = executor
            .start_program(
                &ws,
                ProgramSpec::argv(["python3", "-m", "http.server", "8123", "--bind", "127.0.0.1"]).cwd("site"),
            )
            .await
            .unwrap();
        let fetch = "import time, urllib.request\n\
                     for _ in range(100):\n\
                     \x20   try:\n\
                     \x20       print(urllib.request.urlopen('http://127.0.0.1:8123/index.html').read().decode()); break\n\
                     \x20   except OSError: time.sleep(0.1)\n";
        let client = executor.start_program(&ws, ProgramSpec::argv(["python3", "-c", fetch])).await.unwrap();
        let (text, end) = read_until(&client, "\u{0}never").await;
        assert_eq!((text.as_str(), end.exit_code), ("from the host\n", Some(0)));
        let (_, end) = run(&executor, &ws, "echo written > site/by-program.txt").await;
        assert_eq!(end.exit_code, Some(0));
        assert_eq!(ws.read("site/by-program.txt", 100).unwrap(), b"written\n");
        assert_eq!(server.status(), ProgramStatus::Running);
        server.kill(Duration::from_secs(1)).await;
    });
}

#[test]
fn a_program_ends_at_its_lifetime_and_every_program_ends_with_its_workspace() {
    let Some((_root, ws, executor)) = setup("programs-lifetime") else { return };
    runtime().block_on(async {
        let short = ProgramSpec::shell("sleep 100").lifetime(Duration::from_secs(1));
        let program = executor.start_program(&ws, short).await.unwrap();
        assert_eq!(tokio::time::timeout(Duration::from_secs(10), program.wait()).await, Ok(ProgramStatus::Killed));

        let long = executor.start_program(&ws, ProgramSpec::shell("echo up; sleep 1000")).await.unwrap();
        read_until(&long, "up").await;
        let mount = ws.host_path().display().to_string();
        let filter = format!("volume={mount}");
        assert_eq!(common::docker::ps(&["--filter", &filter]).len(), 1);
        drop(ws);
        assert_eq!(long.status(), ProgramStatus::Killed);
        assert!(long.write(b"x").is_err());
        assert!(
            common::docker::wait_gone(&[&filter], Duration::from_secs(20)),
            "the workspace's program container outlived it"
        );
    });
}

#[test]
fn a_matrix_without_a_program_carrier_refuses_naming_programs() {
    let root = tempfile::tempdir().unwrap();
    let ws = match Workspace::create(WorkspaceConfig::default().root(root.path())) {
        Ok(ws) => ws,
        Err(e @ WorkspaceError::CannotMount { .. }) => {
            common::skip::available("EXECBOX_REQUIRE_WORKSPACES", Err(e));
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let executor = Executor::with_backend(BoaJsInThread::default());
    match executor.start_program_blocking(&ws, &ProgramSpec::shell("echo hi")) {
        Err(ExecError::Refused { rejections }) => {
            assert!(rejections[0].violations.iter().any(|v| v.control == Control::Programs), "{rejections:?}");
        }
        other => panic!("{other:?}"),
    }
}

/// Packages: a workspace's container is started in the image that has its
/// first program's packages; a later program that needs packages a
/// container started without them lacks is refused, naming `packages`; a
/// package no backend has is refused before anything starts.
#[test]
fn packages_pick_the_workspace_container_s_image() {
    let Some((_root, ws, executor)) = setup("programs-packages") else { return };
    let rt = runtime();
    rt.block_on(async {
        let import = ["python3", "-c", "import numpy; print(int(numpy.ones(3).sum()))"];
        let refused = executor.start_program(&ws, ProgramSpec::argv(import).packages(["no_such_package"])).await;
        match refused {
            Err(ExecError::Refused { rejections }) => {
                assert_eq!(rejections[0].violations[0].control, Control::Packages, "{rejections:?}")
            }
            other => panic!("{other:?}"),
        }
        let first = executor.start_program(&ws, ProgramSpec::argv(import).packages(["numpy"])).await.unwrap();
        let (text, out) = read_until(&first, "\u{0}never").await;
        assert_eq!((out.exit_code, text.trim()), (Some(0), "3"), "{out:?}");
    });
    let Some((_root, plain, executor)) = setup("programs-packages") else { return };
    rt.block_on(async {
        run(&executor, &plain, "true").await;
        let later = executor.start_program(&plain, ProgramSpec::shell("true").packages(["numpy"])).await;
        match later {
            Err(ExecError::Refused { rejections }) => {
                let violation = &rejections[0].violations[0];
                assert_eq!(violation.control, Control::Packages, "{rejections:?}");
                assert!(violation.reason.contains("without packages"), "{violation:?}");
            }
            other => panic!("{other:?}"),
        }
    });
}

/// Code Mode's `workspace.*` tools: code in a workspace starts a program
/// that outlives its run; a later run in the same workspace polls and kills
/// it by id; a run in another workspace cannot reach it; a run without a
/// workspace is told it has none; a program gets no more than its run
/// (no tools).
#[test]
fn code_starts_and_drives_programs_in_its_workspace() {
    use execbox::{ExecRequest, Language, Outcome, SandboxPolicy};
    let Some((root, ws, _)) = setup("program-tools") else { return };
    let other = Workspace::create(WorkspaceConfig::default().root(root.path())).unwrap();
    let container = common::skip::labelled_container("program-tools", ContainerConfig::default()).unwrap();
    let executor = Executor::builder().backend(container).tools(execbox::program_tools::workspace_tools()).build();
    let python = |code: &str, ws: Option<&Workspace>| {
        let policy = SandboxPolicy::strict().timeout(Duration::from_secs(60)).tools(["workspace.*"]);
        let request = ExecRequest::source(Language::Python, code).policy(policy);
        let request = match ws {
            Some(ws) => request.workspace(ws),
            None => request,
        };
        let result = executor.execute_blocking(request).unwrap();
        assert_eq!(result.outcome, Outcome::Ok, "{result:?}");
        result.stdout.text().trim().to_string()
    };
    let started = python(
        "import tools\n\
         a = tools.workspace.start_program(command='read -r x; echo \"got $x\" > /work/got.txt; echo bye', yield_ms=0)\n\
         print(a['program_id'], a['status'])",
        Some(&ws),
    );
    let (id, status) = started.split_once(' ').unwrap();
    assert_eq!(status, "running", "{started}");
    // A later run of the same workspace writes to it and reads its end.
    let code = format!(
        "import tools\n\
         a = tools.workspace.write_program(program_id='{id}', data='7', newline=True, yield_ms=10000)\n\
         out = a['output']\n\
         while a['status'] == 'running':\n\
         \x20   a = tools.workspace.poll_program(program_id='{id}', yield_ms=10000)\n\
         \x20   out += a['output']\n\
         print(repr(out), a['exit_code'], open('/work/got.txt').read().strip())"
    );
    assert_eq!(python(&code, Some(&ws)), "'bye\\n' 0 got 7");
    // Forgotten once its end was read; unknown in another workspace; no workspace, no programs.
    let poll = |id: &str| {
        format!(
            "import tools\n\
             try:\n\
             \x20   tools.workspace.poll_program(program_id='{id}')\n\
             \x20   print('reached')\n\
             except tools.ToolError as e:\n\
             \x20   print(e.kind)"
        )
    };
    assert_eq!(python(&poll(id), Some(&ws)), "not_found");
    let long = python(
        "import tools\nprint(tools.workspace.start_program(command='sleep 300', yield_ms=0)['program_id'])",
        Some(&ws),
    );
    assert_eq!(python(&poll(&long), Some(&other)), "not_found");
    assert_eq!(python(&poll(&long), None), "unavailable");
    let killed = python(
        &format!("import tools\nprint(tools.workspace.kill_program(program_id='{long}', grace_ms=0)['status'])"),
        Some(&ws),
    );
    assert_eq!(killed, "killed");
    // A program cannot call tools: its run's grants are not its own.
    let tools_in_program = python(
        "import tools\n\
         a = tools.workspace.start_program(command='test -e /usr/local/bin/tool && echo has-tool || echo no-tool; echo ${EXECBOX_TOOLS:-none}', yield_ms=10000)\n\
         out = a['output']\n\
         while a['status'] == 'running':\n\
         \x20   a = tools.workspace.poll_program(program_id=a['program_id'], yield_ms=10000)\n\
         \x20   out += a['output']\n\
         print(out.split())",
        Some(&ws),
    );
    assert_eq!(tools_in_program, "['no-tool', 'none']");
}
