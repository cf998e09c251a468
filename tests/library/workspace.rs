//! Workspaces: one file tree across runs and backends, a quota the kernel
//! holds on every writer, and host-side file work that hostile files cannot
//! lead outside it.

use std::path::Path;
use std::time::Duration;

use crate::common;

use execbox::backends::container::ContainerConfig;
use execbox::backends::{BoaJsInThread, InterpreterConfig, WasmGuest, WasmGuestConfig, WasmInterpreter};
use execbox::{
    Control, ExecError, ExecFile, ExecRequest, ExecResult, Executor, Language, Outcome, SandboxPolicy, Workspace,
    WorkspaceConfig, WorkspaceError,
};
use serde_json::json;

/// Requires workspaces (root, to mount their tmpfs): `.ci/run` sets it.
const REQUIRE: &str = "EXECBOX_REQUIRE_WORKSPACES";

/// A workspace under a private root, or `None` (skipped) where this
/// process cannot mount one. The root comes first, so that a test's
/// `let Some((_root, ws))` drops it last: removed before the workspace is
/// unmounted, it would be left behind, empty.
fn workspace(quota_bytes: u64, max_files: u64) -> Option<(tempfile::TempDir, Workspace)> {
    let root = tempfile::tempdir().unwrap();
    let cfg = WorkspaceConfig::default().quota_bytes(quota_bytes).max_files(max_files).root(root.path());
    Some((root, workspace_with(cfg)?))
}

/// The workspace `cfg` makes, or `None` (skipped) where this process
/// cannot mount one.
pub(crate) fn workspace_with(cfg: WorkspaceConfig) -> Option<Workspace> {
    match Workspace::create(cfg) {
        Ok(ws) => Some(ws),
        Err(e @ WorkspaceError::CannotMount { .. }) => {
            common::skip::available(REQUIRE, Err(e));
            None
        }
        Err(e) => panic!("{e}"),
    }
}

fn mounted(path: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    mounts.lines().any(|line| line.split(' ').nth(1) == Some(path.to_str().unwrap()))
}

fn policy() -> SandboxPolicy {
    SandboxPolicy::strict().timeout(Duration::from_secs(60))
}

fn ok(result: ExecResult) -> ExecResult {
    assert_eq!(result.outcome, Outcome::Ok, "{result:?}");
    result
}

#[test]
fn a_workspace_is_a_capped_mount_that_goes_with_its_last_handle() {
    let Some((_root, ws)) = workspace(1 << 20, 50) else { return };
    let path = ws.host_path().to_path_buf();
    assert!(mounted(&path), "{path:?} is not a mount");
    ws.write("a/b/c.txt", b"hello").unwrap();
    assert_eq!(ws.read("a/b/c.txt", 100).unwrap(), b"hello");
    assert_eq!(ws.read("./a/b/c.txt", 100).unwrap(), b"hello");
    let usage = ws.usage().unwrap();
    assert_eq!(usage.files_used, 3, "{usage:?}"); // a, a/b, a/b/c.txt
    assert_eq!((usage.quota_bytes, usage.max_files, usage.full), (1 << 20, 50, false), "{usage:?}");

    let other = ws.clone();
    drop(ws);
    assert!(mounted(&path), "a handle still holds it");
    drop(other);
    assert!(!mounted(&path), "{path:?} is still mounted");
    assert!(!path.exists(), "{path:?} is still there");
}

#[test]
fn the_quota_holds_bytes_and_files_against_the_host_too() {
    let Some((_root, ws)) = workspace(64 << 10, 3) else { return };
    let err = ws.write("big", &vec![7u8; 100 << 10]).unwrap_err();
    assert!(err.to_string().contains("No space left"), "{err}");
    assert!(ws.read("big", 1 << 20).is_err(), "a refused write leaves no file");
    for name in ["1", "2", "3"] {
        ws.write(name, b"x").unwrap();
    }
    let err = ws.write("4", b"x").unwrap_err();
    assert!(err.to_string().contains("No space left"), "{err}");
    assert!(ws.usage().unwrap().full);
}

#[test]
fn hostile_files_never_lead_the_host_outside() {
    use std::os::unix::fs::symlink;
    let Some((_root, ws)) = workspace(1 << 20, 100) else { return };
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), b"host secret").unwrap();
    let root = ws.host_path();
    symlink(outside.path().join("secret"), root.join("link")).unwrap();
    symlink(outside.path(), root.join("dir")).unwrap();
    let fifo = std::ffi::CString::new(root.join("fifo").to_str().unwrap()).unwrap();
    rustix::fs::mkfifoat(rustix::fs::CWD, fifo.as_c_str(), rustix::fs::Mode::from_raw_mode(0o644)).unwrap();

    for path in ["link", "dir/secret", "fifo"] {
        assert!(ws.read(path, 1 << 20).is_err(), "{path} was read");
    }
    for path in ["link", "dir/new", "dir/secret"] {
        assert!(ws.write(path, b"overwritten").is_err(), "{path} was written");
    }
    assert_eq!(std::fs::read(outside.path().join("secret")).unwrap(), b"host secret");
    assert!(!outside.path().join("new").exists());
    for bad in ["../x", "/etc/passwd", ""] {
        assert!(matches!(ws.write(bad, b"x"), Err(WorkspaceError::BadPath { .. })), "{bad}");
    }
}

#[test]
fn a_backend_without_files_refuses_a_workspace_and_names_it() {
    let Some((_root, ws)) = workspace(1 << 20, 10) else { return };
    let js = Executor::with_backend(BoaJsInThread::default());
    let request = ExecRequest::javascript("return 1").policy(SandboxPolicy::host_local()).workspace(&ws);
    match js.execute_blocking(request) {
        Err(ExecError::Refused { rejections }) => {
            let controls: Vec<Control> =
                rejections.iter().flat_map(|r| r.violations.iter().map(|v| v.control)).collect();
            assert_eq!(controls, [Control::Workspace], "{rejections:?}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_wasm_guest_reads_and_writes_the_workspace_at_work() {
    let Some((_root, ws)) = workspace(1 << 20, 100) else { return };
    let guest = WasmGuest::new(WasmGuestConfig::default()).unwrap();
    let tool = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/guests/prebuilt/wasi_tool.wasm")).unwrap();
    ws.write("from_host.txt", b"host wrote this").unwrap();
    let run = |args: &[&str]| {
        let mut request = ExecRequest::wasm(tool.clone()).policy(policy()).workspace(&ws);
        for arg in args {
            request = request.arg(*arg);
        }
        Executor::run_on(&guest, request).unwrap()
    };
    let read = ok(run(&["read", "/work/from_host.txt"]));
    assert_eq!(read.stdout.text(), "host wrote this", "{read:?}");
    ok(run(&["write", "/work/from_guest.txt", "guest wrote this"]));
    assert_eq!(ws.read("from_guest.txt", 100).unwrap(), b"guest wrote this");
    // The guest's symlinks are refused, in a workspace as anywhere.
    assert_ne!(run(&["symlink", "/etc/passwd", "/work/link"]).outcome, Outcome::Ok);
}

/// The one workspace across python-wasm and a container, both ways, and
/// its quota inside each.
#[test]
fn python_in_wasm_and_in_a_container_share_one_workspace_under_one_quota() {
    let Some((_root, ws)) = workspace(2 << 20, 1000) else { return };
    let Some(wasm) = common::skip::interpreter(WasmInterpreter::new(InterpreterConfig::default()).unwrap()) else {
        return;
    };
    let Some(container) = common::skip::labelled_container("workspace", ContainerConfig::default()) else { return };
    let python = |code: &str| ExecRequest::source(Language::Python, code).policy(policy()).workspace(&ws);

    ok(Executor::run_on(&wasm, python("open('/work/data.csv', 'w').write('a,b\\n1,2\\n')")).unwrap());
    let read = ok(Executor::run_on(&container, python("print(open('/work/data.csv').read().split()[1])")).unwrap());
    assert_eq!(read.stdout.text().trim(), "1,2", "{read:?}");
    let usage = read.workspace.expect("a run in a workspace reports its usage");
    assert!(!usage.full && usage.files_used >= 1 && usage.bytes_used > 0, "{usage:?}");
    ok(Executor::run_on(&container, python("open('/work/from_container.txt', 'w').write('container')")).unwrap());
    let back = ok(Executor::run_on(&wasm, python("print(open('/work/from_container.txt').read())")).unwrap());
    assert_eq!(back.stdout.text().trim(), "container", "{back:?}");

    // Input and input files land in the workspace; a run without input
    // sees no earlier run's input.json.
    let staged = python("import json; print(json.load(open('/work/input.json'))['n'], open('/work/in/f.txt').read())")
        .input(json!({"n": 7}))
        .input_file(ExecFile::new("in/f.txt", b"file".to_vec()));
    assert_eq!(ok(Executor::run_on(&container, staged).unwrap()).stdout.text().trim(), "7 file");
    let stale = python("import os; print(os.path.exists('/work/input.json'))");
    assert_eq!(ok(Executor::run_on(&wasm, stale).unwrap()).stdout.text().trim(), "False");

    // `/work/out` is still the run's own tmpfs: collected, not kept.
    let out = python("open('/work/out/r.txt', 'w').write('result')").collect_output_files();
    let collected = ok(Executor::run_on(&container, out).unwrap());
    assert_eq!(collected.output_files.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["r.txt"], "{collected:?}");
    assert!(ws.read("out/r.txt", 100).is_err(), "an output file stayed in the workspace");

    // Past the quota a write fails with ENOSPC inside the code, on both.
    let flood = "import errno\ntry:\n    open('/work/flood', 'wb').write(b'x' * (4 << 20))\n    print('fit')\n\
                 except OSError as e:\n    print(errno.errorcode[e.errno])";
    for (name, result) in [
        ("container", Executor::run_on(&container, python(flood))),
        ("python-wasm", Executor::run_on(&wasm, python(flood))),
    ] {
        let result = ok(result.unwrap());
        assert_eq!(result.stdout.text().trim(), "ENOSPC", "{name}: {result:?}");
        assert!(
            result.workspace.is_some_and(|usage| usage.full),
            "{name}: the result says the quota was hit: {result:?}"
        );
        let _ = std::fs::remove_file(ws.host_path().join("flood"));
    }
    // A container cannot hard-link a file from outside into it.
    let link = "import os, errno\ntry:\n    os.link('/etc/passwd', '/work/passwd')\n    print('linked')\n\
                except OSError as e:\n    print(errno.errorcode[e.errno])";
    assert_eq!(ok(Executor::run_on(&container, python(link)).unwrap()).stdout.text().trim(), "EXDEV");
}

/// Run by [`a_killed_owner_s_workspace_is_removed_by_the_next_one`] in a
/// child process: mounts a workspace under `$EXECBOX_TEST_WORKSPACE_ROOT`,
/// says where, and waits to be killed.
#[test]
#[ignore = "a helper: run by another test in a child process"]
fn helper_mounts_a_workspace_and_waits() {
    let Some(root) = std::env::var_os("EXECBOX_TEST_WORKSPACE_ROOT") else { return };
    let ws = Workspace::create(WorkspaceConfig::default().root(root)).unwrap();
    println!("mounted {}", ws.host_path().display());
    std::thread::sleep(Duration::from_secs(120));
}

#[test]
fn a_killed_owner_s_workspace_is_removed_by_the_next_one() {
    use std::io::{BufRead, BufReader};
    let Some((root, _probe)) = workspace(1 << 20, 10) else { return };
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "workspace::helper_mounts_a_workspace_and_waits", "--ignored", "--nocapture"])
        .env("EXECBOX_TEST_WORKSPACE_ROOT", root.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let path = loop {
        let line = lines.next().expect("the helper says where it mounted").unwrap();
        if let Some(path) = line.strip_prefix("mounted ") {
            break std::path::PathBuf::from(path);
        }
    };
    assert!(mounted(&path));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(mounted(&path), "nothing unmounts a SIGKILLed owner's workspace by itself");

    // What execbox did not make is never touched.
    std::fs::create_dir(root.path().join("usb-disk")).unwrap();
    std::fs::write(root.path().join("usb-disk").join("keep"), b"data").unwrap();
    let next = Workspace::create(WorkspaceConfig::default().root(root.path())).unwrap();
    assert_eq!(std::fs::read(root.path().join("usb-disk").join("keep")).unwrap(), b"data");
    assert!(!mounted(&path), "{path:?} is still mounted");
    assert!(!path.exists(), "{path:?} is still there");
    assert!(mounted(next.host_path()));
}

#[test]
fn collect_reads_back_by_globs_within_limits_and_never_through_links() {
    use execbox::CollectLimits;
    let Some((_root, ws)) = workspace(4 << 20, 1000) else { return };
    ws.write("top.txt", b"top").unwrap();
    ws.write("a/x.txt", b"x").unwrap();
    ws.write("a/b/y.txt", b"yy").unwrap();
    ws.write("a/b/z.csv", b"z").unwrap();
    ws.write("big.bin", &vec![0u8; 2000]).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", ws.host_path().join("a/link.txt")).unwrap();
    let globs = |g: &[&str]| g.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let limits = CollectLimits::new(10, 1000, 1 << 20);

    let got = ws.collect(&globs(&["**/*.txt", "big.bin"]), &limits).unwrap();
    let paths: Vec<&str> = got.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(paths, ["a/b/y.txt", "a/x.txt", "top.txt"], "{got:?}");
    assert_eq!(got.files[0].content, b"yy");
    assert_eq!(got.limits_hit, ["max_file_bytes"], "{got:?}");
    assert!(got.left_out.iter().any(|l| l.starts_with("big.bin: over max_file_bytes")), "{got:?}");
    assert!(got.left_out.iter().any(|l| l.starts_with("a/link.txt: not a regular file")), "{got:?}");

    let few = CollectLimits::new(1, 1000, 1 << 20);
    let got = ws.collect(&globs(&["*.txt", "a/*.txt"]), &few).unwrap();
    assert_eq!(got.files.len(), 1, "{got:?}");
    assert_eq!(got.limits_hit, ["max_files"], "{got:?}");
    let small = CollectLimits::new(10, 1000, 3);
    let got = ws.collect(&globs(&["**/*.txt"]), &small).unwrap();
    assert_eq!(got.files.iter().map(|f| f.content.len()).sum::<usize>(), 3, "{got:?}");
    assert_eq!(got.limits_hit, ["max_total_bytes"], "{got:?}");
    assert!(ws.collect(&globs(&["[unclosed"]), &limits).is_err());
    // Globs that could only match outside, or nothing, are refused (they
    // matched nothing in silence before).
    for bad in ["/etc/passwd", "../x", "a/../a/x.txt", "", ".", "./", "*/*/*/*/*/*/*/*/*"] {
        match ws.collect(&globs(&[bad]), &limits) {
            Err(WorkspaceError::BadGlob { .. }) => {}
            other => panic!("{bad:?}: {other:?}"),
        }
        assert!(execbox::workspace::check_globs(&globs(&[bad])).is_err(), "{bad:?}");
    }
    assert!(execbox::workspace::check_globs(&globs(&["./a/*.txt", "**"])).is_ok());
}

/// A wide tree (more directories than a process's usual descriptor limit)
/// is walked one open directory at a time.
#[test]
fn collect_walks_a_wide_tree_without_holding_its_directories_open() {
    // More directories than this process may hold descriptors.
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current.unwrap_or(u64::MAX);
    if limit > 60_000 {
        eprintln!("skipping: a descriptor limit of {limit} is too large to exceed here");
        return;
    }
    let wide = limit + 100;
    let Some((_root, ws)) = workspace(64 << 20, wide + 10) else { return };
    for i in 0..wide {
        std::fs::create_dir(ws.host_path().join(format!("d{i}"))).unwrap();
    }
    let last = format!("d{}/found.txt", wide - 1);
    ws.write(&last, b"deep").unwrap();
    let got = ws.collect(&["**/*.txt".to_string()], &execbox::CollectLimits::default()).unwrap();
    assert_eq!(got.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(), [last.as_str()], "{got:?}");
    assert!(got.limits_hit.is_empty() && got.left_out.is_empty(), "{got:?}");
}

/// Runs in one workspace take turns: a second one while the first runs is
/// `busy` at once (a run in the same tree could otherwise swap a file for
/// a FIFO under a wasm guest's open and hold its host thread).
#[test]
fn runs_in_one_workspace_take_turns() {
    let Some((_root, ws)) = workspace(1 << 20, 100) else { return };
    let Some(wasm) = common::skip::interpreter(WasmInterpreter::new(InterpreterConfig::default()).unwrap()) else {
        return;
    };
    let python = |code: &str| ExecRequest::source(Language::Python, code).policy(policy()).workspace(&ws);
    std::thread::scope(|scope| {
        let first = scope.spawn(|| {
            Executor::run_on(&wasm, python("import time\nopen('/work/started', 'w')\ntime.sleep(3)")).unwrap()
        });
        assert!(
            common::wait::wait_until(Duration::from_secs(60), || ws.read("started", 10).is_ok()),
            "the first run never started"
        );
        match Executor::run_on(&wasm, python("print(1)")) {
            Err(ExecError::Busy { reason, .. }) => assert!(reason.contains("running another run"), "{reason}"),
            other => panic!("{other:?}"),
        }
        ok(first.join().unwrap());
    });
    ok(Executor::run_on(&wasm, python("print(2)")).unwrap());
}

#[test]
fn a_workspace_belongs_to_the_user_code_runs_as_and_a_container_of_another_user_refuses_it() {
    let root = tempfile::tempdir().unwrap();
    let cfg = WorkspaceConfig::default().root(root.path()).code_user(1000, 1000);
    let Some(ws) = workspace_with(cfg) else { return };
    ws.write("given.txt", b"host").unwrap();
    let Some(theirs) = common::skip::labelled_container("workspace-user", ContainerConfig::default().user("1000:1000"))
    else {
        return;
    };
    let replace = "open('/work/given.txt', 'w').write('code'); print(open('/work/given.txt').read())";
    let python = || ExecRequest::source(Language::Python, replace).policy(policy()).workspace(&ws);
    assert_eq!(ok(Executor::run_on(&theirs, python()).unwrap()).stdout.text().trim(), "code");
    let Some(nobody) = common::skip::labelled_container("workspace-user", ContainerConfig::default()) else { return };
    match Executor::run_on(&nobody, python()) {
        Err(e @ ExecError::BackendUnavailable { .. }) => {
            assert!(e.to_string().contains("1000:1000"), "{e}");
        }
        other => panic!("a workspace of another user: {other:?}"),
    }
}

#[test]
fn a_file_may_be_written_with_its_mode_but_never_a_set_id_bit() {
    use std::os::unix::fs::PermissionsExt;
    let Some((_root, ws)) = workspace(1 << 20, 50) else { return };
    ws.write_with_mode("bin/run.sh", b"#!/bin/sh\necho hi\n", 0o755).unwrap();
    let mode = std::fs::metadata(ws.host_path().join("bin/run.sh")).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o755);
    ws.write_with_mode("bin/run.sh", b"again", 0o600).unwrap();
    let mode = std::fs::metadata(ws.host_path().join("bin/run.sh")).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o600, "a replaced file takes the new mode");
    for bad in [0o4755, 0o2755, 0o1777] {
        assert!(matches!(ws.write_with_mode("x", b"", bad), Err(WorkspaceError::BadMode { .. })), "{bad:o}");
    }
}

/// A Python session opened in a workspace keeps its globals and sees the
/// workspace at `/work`, read-write, like a one-shot run: files pass both
/// ways between its cells, the host and other runs; its cells take turns
/// with runs; a call naming another workspace is refused, naming it; and a
/// registry whose only Python sessions are wasm's refuses to open one in a
/// workspace (its instance has its own `/work`). The session holds the
/// workspace until it closes.
#[test]
fn a_session_opened_in_a_workspace_runs_every_call_there() {
    use execbox::{SessionError, SessionSpec, Sessions};
    let Some((_root, ws)) = workspace(2 << 20, 1000) else { return };
    let Some(container) = common::skip::labelled_container("workspace-session", ContainerConfig::default()) else {
        return;
    };
    let Some(wasm) = common::skip::interpreter(WasmInterpreter::new(InterpreterConfig::default()).unwrap()) else {
        return;
    };
    let sessions = Sessions::builder().backend(wasm.clone()).backend(container.clone()).build();
    let spec = SessionSpec::new(Language::Python).policy(policy()).workspace(&ws);
    sessions.open("s", spec.clone()).unwrap();
    let cell = |code: &str| ExecRequest::source(Language::Python, code).policy(policy());

    ws.write("from_host.txt", b"host").unwrap();
    let first = ok(sessions.execute("s", cell("x = open('/work/from_host.txt').read()\nprint(x)")).unwrap());
    assert_eq!((first.backend.as_str(), first.stdout.text().trim()), ("container-session", "host"), "{first:?}");
    assert!(first.workspace.is_some(), "a call in a workspace reports its usage: {first:?}");
    ok(sessions.execute("s", cell("open('/work/from_session.txt', 'w').write(x + '+session')")).unwrap());
    assert_eq!(ws.read("from_session.txt", 100).unwrap(), b"host+session");
    // A one-shot run (python-wasm) reads what the session wrote.
    let run = ExecRequest::source(Language::Python, "print(open('/work/from_session.txt').read())")
        .policy(policy())
        .workspace(&ws);
    assert_eq!(ok(Executor::run_on(&wasm, run).unwrap()).stdout.text().trim(), "host+session");
    // A cell's input files land in the workspace, and naming the same workspace is fine.
    let staged = cell("print(open('/work/in/f.txt').read(), x)")
        .input_file(ExecFile::new("in/f.txt", b"staged".to_vec()))
        .workspace(&ws);
    assert_eq!(ok(sessions.execute("s", staged).unwrap()).stdout.text().trim(), "staged host");
    assert_eq!(ws.read("in/f.txt", 100).unwrap(), b"staged");

    // Cells take turns with runs in the workspace.
    std::thread::scope(|scope| {
        let slow = scope
            .spawn(|| sessions.execute("s", cell("import time\nopen('/work/started', 'w')\ntime.sleep(3)")).unwrap());
        assert!(
            common::wait::wait_until(Duration::from_secs(60), || ws.read("started", 10).is_ok()),
            "the cell never started"
        );
        let run = ExecRequest::source(Language::Python, "print(1)").policy(policy()).workspace(&ws);
        match Executor::run_on(&wasm, run) {
            Err(ExecError::Busy { reason, .. }) => assert!(reason.contains("running another run"), "{reason}"),
            other => panic!("{other:?}"),
        }
        ok(slow.join().unwrap());
    });

    // Another workspace, or one for a session without: refused, naming the control.
    let Some((_other_root, other)) = workspace(1 << 20, 100) else { return };
    let refused_control = |e: SessionError| match e {
        SessionError::Exec(ExecError::Refused { rejections }) => rejections[0].violations[0].control,
        other => panic!("{other:?}"),
    };
    let elsewhere = sessions.execute("s", cell("print(x)").workspace(&other)).unwrap_err();
    assert_eq!(refused_control(elsewhere), Control::Workspace);
    sessions.open("plain", SessionSpec::new(Language::Python).policy(policy())).unwrap();
    let into = sessions.execute("plain", cell("print(1)").workspace(&ws)).unwrap_err();
    assert_eq!(refused_control(into), Control::Workspace);

    // Only wasm's Python sessions: none carries a workspace.
    let wasm_only = Sessions::builder().backend(wasm.clone()).build();
    assert_eq!(refused_control(wasm_only.open("w", spec).unwrap_err()), Control::Workspace);

    // The session holds the workspace until it closes.
    let path = ws.host_path().to_path_buf();
    drop(ws);
    assert!(mounted(&path), "the session still holds its workspace");
    assert!(sessions.close("s"));
    assert!(!mounted(&path), "{path:?} is still mounted after its session closed");
}

/// `import_dir` copies a host directory's directories and regular files
/// (modes kept, owned by the code's user when root), never a symlink or a
/// FIFO (named in `left_out`, and never opened: a FIFO would block); past
/// the quota it fails naming the file; `collect` reports each file's mode.
#[test]
fn a_host_directory_is_imported_without_its_links_and_within_the_quota() {
    use std::os::unix::fs::PermissionsExt;
    let Some((_root, ws)) = workspace(64 << 10, 100) else { return };
    let host = tempfile::tempdir().unwrap();
    let h = host.path();
    std::fs::create_dir_all(h.join("a/b")).unwrap();
    std::fs::write(h.join("a/b/run.sh"), "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(h.join("a/b/run.sh"), std::fs::Permissions::from_mode(0o750)).unwrap();
    std::fs::write(h.join("top.txt"), "top").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", h.join("a/passwd")).unwrap();
    rustix::fs::mknodat(rustix::fs::CWD, h.join("fifo"), rustix::fs::FileType::Fifo, 0o600.into(), 0).unwrap();
    let imported = ws.import_dir(h).unwrap();
    assert_eq!((imported.files, imported.bytes), (2, 13), "{imported:?}");
    let mut left_out = imported.left_out.clone();
    left_out.sort();
    assert_eq!(left_out.len(), 2, "{left_out:?}");
    assert!(
        left_out[0].starts_with("a/passwd: not a regular file") && left_out[1].starts_with("fifo:"),
        "{left_out:?}"
    );
    assert_eq!(ws.read("a/b/run.sh", 100).unwrap(), b"#!/bin/sh\n");
    let collected = ws.collect(&["**".into()], &execbox::CollectLimits::default()).unwrap();
    let modes: Vec<(&str, u32)> = collected.files.iter().map(|f| (f.path.as_str(), f.mode)).collect();
    assert_eq!(modes, [("a/b/run.sh", 0o750), ("top.txt", 0o644)], "{collected:?}");
    if rustix::process::geteuid().is_root() {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(ws.host_path().join("a/b/run.sh")).unwrap();
        assert_eq!((meta.uid(), meta.gid()), ws.code_user(), "imported files belong to the code's user");
    }
    std::fs::write(h.join("big.bin"), vec![1u8; 128 << 10]).unwrap();
    let err = ws.import_dir(h).unwrap_err();
    assert!(err.to_string().contains("big.bin"), "{err}");
    assert!(execbox::with_causes(&err).contains("No space left"), "{}", execbox::with_causes(&err));
}

/// What a python-wasm run (in the host's process, as root) makes in a
/// workspace is handed to the code's user when the run ends, so a
/// container run (as that user) can rewrite its files and write in its
/// directories.
#[test]
fn what_a_wasm_run_makes_belongs_to_the_code_s_user() {
    let Some((_root, ws)) = workspace(2 << 20, 1000) else { return };
    let Some(wasm) = common::skip::interpreter(WasmInterpreter::new(InterpreterConfig::default()).unwrap()) else {
        return;
    };
    let Some(container) = common::skip::labelled_container("workspace-owner", ContainerConfig::default()) else {
        return;
    };
    let python = |code: &str| ExecRequest::source(Language::Python, code).policy(policy()).workspace(&ws);
    ok(Executor::run_on(
        &wasm,
        python("import os\nos.makedirs('/work/made/deep')\nopen('/work/made/f.txt', 'w').write('wasm')"),
    )
    .unwrap());
    if rustix::process::geteuid().is_root() {
        use std::os::unix::fs::MetadataExt;
        for path in ["made", "made/deep", "made/f.txt"] {
            let meta = std::fs::symlink_metadata(ws.host_path().join(path)).unwrap();
            assert_eq!((meta.uid(), meta.gid()), ws.code_user(), "{path}");
        }
    }
    let rewrite = "open('/work/made/f.txt', 'a').write('+container')\nopen('/work/made/deep/new.txt', 'w').write('x')";
    ok(Executor::run_on(&container, python(rewrite)).unwrap());
    assert_eq!(ws.read("made/f.txt", 100).unwrap(), b"wasm+container");
    assert_eq!(ws.read("made/deep/new.txt", 100).unwrap(), b"x");
}

/// The host's metadata lists what was put in (written, a run's input files,
/// imported) and taken out (collected), with sizes and hashes, bounded to
/// the last 1,000 of each kind; what code does in the workspace is not in it.
#[test]
fn the_metadata_records_files_in_and_out_and_stays_bounded() {
    let Some((_root, ws)) = workspace(8 << 20, 5000) else { return };
    let Some(wasm) = common::skip::interpreter(WasmInterpreter::new(InterpreterConfig::default()).unwrap()) else {
        return;
    };
    ws.write_with_mode("a.txt", b"abc", 0o600).unwrap();
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("imported.txt"), "xyz").unwrap();
    ws.import_dir(host.path()).unwrap();
    // A run's input file; the file the code itself writes is not recorded.
    let request = ExecRequest::source(Language::Python, "open('/work/by_code.txt', 'w').write('code')")
        .input_file(ExecFile::new("staged.txt", b"in".to_vec()))
        .workspace(&ws)
        .policy(policy());
    ok(Executor::run_on(&wasm, request).unwrap());
    ws.collect(&["a.txt".to_string()], &execbox::CollectLimits::default()).unwrap();
    let metadata = ws.metadata();
    let inputs: Vec<(&str, u64, &str)> =
        metadata.inputs.iter().map(|f| (f.path.as_str(), f.size, f.via.as_str())).collect();
    assert_eq!(inputs, [("a.txt", 3, "write"), ("imported.txt", 3, "import"), ("staged.txt", 2, "input")]);
    let sha = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"; // sha256("abc")
    assert_eq!(metadata.inputs[0].sha256.as_deref(), Some(sha));
    assert_eq!(metadata.inputs[1].sha256, None, "an import is copied without being read into memory");
    assert_eq!(metadata.outputs.len(), 1);
    assert_eq!((metadata.outputs[0].path.as_str(), metadata.outputs[0].via.as_str()), ("a.txt", "collect"));
    assert!(metadata.inputs[0].at_unix_ms > 1_700_000_000_000, "{:?}", metadata.inputs[0]);

    for n in 0..1_000 {
        ws.write(&format!("many/{n}"), b"").unwrap();
    }
    let metadata = ws.metadata();
    assert_eq!((metadata.inputs.len(), metadata.dropped), (1_000, 3), "the oldest go first");
    assert_eq!(metadata.inputs[0].path, "many/0");
    assert_eq!(metadata.inputs[999].path, "many/999");
    // One JSON shape.
    let json = serde_json::to_value(&metadata).unwrap();
    assert_eq!(serde_json::from_value::<execbox::WorkspaceMetadata>(json).unwrap(), metadata);
}

/// `export_dir` copies the workspace out (modes kept, what code planted not
/// followed, a link already in the target replaced, never written
/// through); `persist_to` does the same when the last handle goes, then
/// the mount goes as always.
#[test]
fn a_workspace_is_exported_and_kept_by_persist_to() {
    use std::os::unix::fs::PermissionsExt as _;
    let root = tempfile::tempdir().unwrap();
    let kept = tempfile::tempdir().unwrap();
    let keep = kept.path().join("kept");
    let cfg = WorkspaceConfig::default().quota_bytes(1 << 20).max_files(100).root(root.path()).persist_to(&keep);
    let Some(ws) = workspace_with(cfg) else { return };
    ws.write_with_mode("bin/run.sh", b"#!/bin/sh\necho hi\n", 0o755).unwrap();
    ws.write_with_mode("notes.txt", b"kept", 0o777).unwrap();
    // What code could plant: a link out, a FIFO.
    std::os::unix::fs::symlink("/etc/passwd", ws.host_path().join("link")).unwrap();
    let fifo = std::process::Command::new("mkfifo").arg(ws.host_path().join("fifo")).status().unwrap();
    assert!(fifo.success());
    // A sparse file of 1 TiB apparent size (the quota is 1 MiB): never written out whole.
    std::fs::File::create(ws.host_path().join("sparse")).unwrap().set_len(1 << 40).unwrap();

    // Exported now, into a directory holding a link where a file goes.
    let out = tempfile::tempdir().unwrap();
    let victim = out.path().join("victim");
    std::fs::write(&victim, "untouched").unwrap();
    std::os::unix::fs::symlink(&victim, out.path().join("notes.txt")).unwrap();
    let copied = ws.export_dir(out.path()).unwrap();
    assert_eq!((copied.files, copied.bytes), (2, 22), "{copied:?}");
    assert_eq!(copied.left_out.len(), 3, "the link, the FIFO and the sparse file are named: {copied:?}");
    assert!(copied.left_out.iter().any(|l| l.starts_with("sparse: past the")), "{copied:?}");
    assert!(!out.path().join("sparse").exists());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched", "written through a link");
    assert_eq!(std::fs::read_to_string(out.path().join("notes.txt")).unwrap(), "kept");
    assert!(!out.path().join("link").exists() && !out.path().join("fifo").exists());

    // Kept when the last handle goes; the mount goes all the same.
    let path = ws.host_path().to_path_buf();
    drop(ws);
    assert!(!mounted(&path) && !path.exists(), "{path:?} outlived its workspace");
    assert_eq!(std::fs::read_to_string(keep.join("notes.txt")).unwrap(), "kept");
    let script = std::fs::metadata(keep.join("bin/run.sh")).unwrap();
    assert_eq!(script.permissions().mode() & 0o777, 0o755);
    let notes = std::fs::metadata(keep.join("notes.txt")).unwrap();
    assert_eq!(notes.permissions().mode() & 0o777, 0o755, "no group or other write bit on the host");
    assert!(std::fs::symlink_metadata(keep.join("link")).is_err(), "a planted link was copied");
}

/// A library workspace with an idle timeout ends once unused (not while a
/// run is in it), one with a lifetime ends at it in use or not; an ended
/// workspace refuses file work and runs, naming why, and is unmounted
/// though handles remain.
#[test]
fn idle_and_old_library_workspaces_end() {
    use common::wait::wait_until;
    let Some(wasm) = common::skip::interpreter(WasmInterpreter::new(InterpreterConfig::default()).unwrap()) else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let create = |cfg: WorkspaceConfig| workspace_with(cfg.root(root.path()));
    let Some(idle) = create(WorkspaceConfig::default().idle_timeout(Duration::from_millis(500))) else { return };
    let path = idle.host_path().to_path_buf();
    // A run longer than the idle timeout keeps it; its end counts as use.
    let slow = ExecRequest::source(Language::Python, "import time; time.sleep(1.5); open('/work/a', 'w').write('x')")
        .policy(policy())
        .workspace(&idle);
    ok(Executor::run_on(&wasm, slow).unwrap());
    assert_eq!(idle.read("a", 10).unwrap(), b"x", "ended under a run");
    assert!(wait_until(Duration::from_secs(10), || idle.ended().is_some()), "never went idle");
    assert!(idle.ended().unwrap().contains("idle"), "{:?}", idle.ended());
    assert!(!mounted(&path) && !path.exists(), "an ended workspace stayed mounted");
    let err = idle.write("b", b"y").unwrap_err();
    assert!(matches!(err, WorkspaceError::Ended { .. }), "{err}");
    let run = Executor::run_on(&wasm, ExecRequest::source(Language::Python, "1").policy(policy()).workspace(&idle));
    let err = run.unwrap_err();
    assert!(err.to_string().contains("has ended"), "{err}");

    // A lifetime ends it in use.
    let Some(old) = create(WorkspaceConfig::default().lifetime(Duration::from_millis(800))) else { return };
    let used = wait_until(Duration::from_secs(10), || old.write("c", b"z").is_err());
    assert!(used && old.ended().unwrap().contains("lifetime"), "{:?}", old.ended());
}
