//! The `execbox` CLI contract: JSON fields, outcomes and exit codes.

use crate::common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::wait::wait_until;
use common::{process, procfs};

use serde_json::{Value, json};

fn execbox(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_execbox")).args(args).output().expect("execbox runs")
}

fn json_out(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let value = serde_json::from_str(lines.next().expect("one line")).expect("valid JSON");
    assert_eq!(lines.next(), None, "exactly one JSON object on stdout");
    value
}

#[test]
fn run_json_ok_has_the_documented_fields() {
    let out = execbox(&[
        "run",
        "--lang",
        "js",
        "--code",
        "console.log('hi'); return input.items.map(x => x * 2)",
        "--input",
        r#"{"items":[1,2,3]}"#,
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let v = json_out(&out);
    for key in [
        "backend",
        "outcome",
        "exit_code",
        "stdout",
        "stderr",
        "stdout_truncated",
        "stderr_truncated",
        "stdout_total_bytes",
        "stderr_total_bytes",
        "output",
        "message",
        "duration_ms",
        "instructions",
    ] {
        assert!(v.get(key).is_some(), "missing {key}: {v}");
    }
    assert_eq!(v["backend"], "boa-js");
    assert_eq!(v["outcome"], "ok");
    assert_eq!(v["output"], json!([2, 4, 6]));
    assert_eq!(v["stdout"], "hi\n");
    assert_eq!(v["exit_code"], Value::Null);
}

#[test]
fn a_kubeconfig_is_a_config_error_without_the_kubernetes_feature() {
    if cfg!(feature = "kubernetes") {
        return;
    }
    let out = execbox(&["run", "--kubeconfig", "/nonexistent", "--code", "return 1", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let v = json_out(&out);
    assert_eq!(v["error"]["kind"], "config");
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("kubernetes feature")), "{v}");
}

#[test]
fn program_failure_exits_1_with_outcome() {
    let out = execbox(&["run", "--code", "throw new Error('boom')", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v = json_out(&out);
    assert_eq!(v["outcome"], "failed");
    assert_eq!(v["message"], "Error: boom");

    let out = execbox(&["run", "--code", "while(true){}", "--timeout-ms", "200", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json_out(&out)["outcome"], "timed_out");

    let out = execbox(&["run", "--code", "while(true){}", "--fuel", "10000", "--json"]);
    assert_eq!(json_out(&out)["outcome"], "out_of_fuel");

    let out = execbox(&["run", "--code", "console.log('x'.repeat(100))", "--max-output-bytes", "10", "--json"]);
    let v = json_out(&out);
    assert_eq!((v["stdout"].as_str(), v["stdout_truncated"].as_bool()), (Some("xxxxxxxxxx"), Some(true)));
    assert_eq!(v["stdout_total_bytes"], 101);
}

#[test]
fn refusal_exits_2_with_violations() {
    // boa has no environment to grant (the wasm guests could: pin boa to see the refusal).
    let out = execbox(&["run", "--code", "return 1", "--env", "A=1", "--backend", "boa-js", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let v = json_out(&out);
    assert_eq!(v["error"]["kind"], "refused");
    assert_eq!(v["error"]["violations"][0]["control"], "environment");
    assert_eq!(v["error"]["violations"][0]["backend"], "boa-js");
    assert!(v["error"]["message"].as_str().unwrap().contains("no environment API"));

    let out = execbox(&["run", "--code", "return 1", "--backend", "nope", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(json_out(&out)["error"]["kind"], "unknown_backend");

    let out = execbox(&["run", "--code", "return 1", "--input", "{not json", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(json_out(&out)["error"]["kind"], "invalid_request");
}

#[test]
fn file_input_and_invalid_utf8_are_handled() {
    let dir = std::env::temp_dir().join(format!("execbox-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("t.js");
    std::fs::write(&good, "return input * 3 // trailing").unwrap();
    let out = execbox(&["run", "--file", good.to_str().unwrap(), "--input", "5", "--json"]);
    assert_eq!(json_out(&out)["output"], 15);
    let bad = dir.join("bad.js");
    std::fs::write(&bad, [0xff, 0xfe, b'1']).unwrap();
    let out = execbox(&["run", "--file", bad.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(json_out(&out)["error"]["message"].as_str().unwrap().contains("UTF-8"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn human_output_is_readable() {
    let out = execbox(&["run", "--code", "console.log('hello'); return {a: 1}"]);
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("hello\n{\n  \"a\": 1\n}"), "{stdout}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("[boa-js] ok"));
}

#[test]
fn backends_lists_capabilities() {
    let out = execbox(&["backends", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let v = json_out(&out);
    assert_eq!(v[0]["name"], "boa-js");
    assert_eq!(v[0]["available"], true);
    assert_eq!(v[0]["capabilities"]["memory"]["level"], "enforced");
    assert_eq!(v[0]["capabilities"]["isolation"], "worker_process");
    assert_eq!(v[0]["capabilities"]["network"]["deny"]["level"], "by_omission");
    let text = execbox(&["backends"]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("NOT enforced"));
}

/// The CLI's JS worker (a child process) dies with the CLI, whatever kills it.
#[test]
fn a_killed_cli_takes_its_js_worker_with_it() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_execbox"))
        .args(["run", "--code", "[1].map(() => { while (true) {} })", "--timeout-ms", "60000"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let cli = child.id();
    let children_of_cli = || -> Vec<u32> {
        let children = procfs::live_children(cli);
        children.into_iter().filter(|&pid| procfs::has_env(pid, "EXECBOX_WORKER_ROLE=boa-js")).collect()
    };
    // The worker has no way to say it started: its parent's children are looked at.
    wait_until(Duration::from_secs(20), || !children_of_cli().is_empty());
    let workers = children_of_cli();
    assert!(!workers.is_empty(), "the CLI started no worker");
    // The run has reached its endless native loop once its worker has spent
    // 200 ms on a CPU (starting and answering `return 1` takes ~10 ms).
    wait_until(Duration::from_secs(20), || workers.iter().any(|&w| procfs::cpu_ticks(w) >= 20));
    child.kill().unwrap(); // SIGKILL: nothing in the CLI runs
    child.wait().unwrap();
    let until = Instant::now() + Duration::from_secs(5);
    for &worker in &workers {
        process::wait_exit(worker, until.saturating_duration_since(Instant::now()));
    }
    let left: Vec<&u32> = workers.iter().filter(|&&p| procfs::alive(p)).collect();
    assert!(left.is_empty(), "workers outlived their killed host: {left:?}");
}

#[cfg(feature = "wasm")]
mod wasm {
    use super::*;

    const GUESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../guests");

    #[test]
    fn json_abi_guest_from_a_file() {
        let file = format!("{GUESTS}/prebuilt/json_transform.wasm");
        let out = execbox(&["run", "--lang", "wasm", "--file", &file, "--input", r#"{"items":[1,2]}"#, "--json"]);
        assert_eq!(out.status.code(), Some(0));
        let v = json_out(&out);
        assert_eq!(v["backend"], "wasm");
        assert_eq!(v["output"], json!({"items": [2, 4], "sum": 3, "count": 2}));
    }

    #[test]
    fn command_with_args_env_preopen_and_exit_code() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "from host").unwrap();
        let tool = format!("{GUESTS}/prebuilt/wasi_tool.wasm");
        let preopen = format!("{}:/data:ro", dir.path().display());
        let out = execbox(&[
            "run",
            "--lang",
            "wasm",
            "--file",
            &tool,
            "--arg",
            "read",
            "--arg",
            "/data/a.txt",
            "--preopen",
            &preopen,
            "--json",
        ]);
        assert_eq!(json_out(&out)["stdout"], "from host");

        let out = execbox(&["run", "--lang", "wasm", "--file", &tool, "--arg", "env", "--env", "K=v", "--json"]);
        assert_eq!(json_out(&out)["stdout"], "K=v\n");

        let out = execbox(&["run", "--lang", "wasm", "--file", &tool, "--arg", "exit", "--arg", "7", "--json"]);
        assert_eq!(out.status.code(), Some(1));
        let v = json_out(&out);
        assert_eq!((v["outcome"].as_str(), v["exit_code"].as_i64()), (Some("failed"), Some(7)));
    }

    #[test]
    fn wat_code_and_bad_modules() {
        let out =
            execbox(&["run", "--lang", "wasm", "--code", "(module (func (export \"_start\") unreachable))", "--json"]);
        assert_eq!(out.status.code(), Some(1));
        assert!(json_out(&out)["message"].as_str().unwrap().contains("unreachable"));

        let out = execbox(&["run", "--lang", "wasm", "--code", "(module)", "--json"]);
        assert_eq!(out.status.code(), Some(2));
        assert_eq!(json_out(&out)["error"]["kind"], "invalid_request");
    }
}

/// Python, shell and Rust through the CLI; skipped (with the reason) only
/// when no container engine answers.
#[cfg(feature = "container")]
mod containers {
    use super::*;
    use crate::common::docker;

    fn engine_answers() -> bool {
        crate::common::skip::engine_answers("docker".as_ref())
    }

    /// `run --workspace DIR`: the directory is copied in (its symlinks and
    /// FIFOs are not), the code changes it at /work, and what `--collect`
    /// matches is written back with its mode; a link the code plants is
    /// not written back, the run's `input.json` is not either, and no
    /// mount is left. Needs root (the workspace) and containers (shell).
    #[test]
    fn a_run_over_a_directory_changes_it_through_a_workspace() {
        let ready = if rustix::process::geteuid().is_root() { Ok(()) } else { Err("workspaces need root") };
        if !crate::common::skip::available("EXECBOX_REQUIRE_WORKSPACES", ready) || !engine_answers() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir(d.join("src")).unwrap();
        std::fs::write(d.join("src/data.csv"), "1,2\n").unwrap();
        std::fs::write(d.join("build.sh"), "#!/bin/sh\necho built\n").unwrap();
        std::fs::set_permissions(d.join("build.sh"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.join("passwd")).unwrap();
        // Unchanged by the code: left alone, its set-id bit with it.
        std::fs::write(d.join("src/tool"), "unchanged").unwrap();
        std::fs::set_permissions(d.join("src/tool"), std::os::unix::fs::PermissionsExt::from_mode(0o4755)).unwrap();
        let code = "set -e\n[ ! -e /work/passwd ]\n/work/build.sh > /work/src/log.txt\n\
                    sort -r /work/src/data.csv > /work/src/sorted.csv\nln -s /etc/shadow /work/src/shadow\n\
                    echo skipped > /work/other.txt\ncat /work/input.json";
        let args = [
            "run",
            "--lang",
            "shell",
            "--code",
            code,
            "--input",
            "{\"n\": 1}",
            "--workspace",
            d.to_str().unwrap(),
            "--collect",
            "src/**",
            "--collect",
            "*.sh",
            "--collect",
            "input.json",
            "--workspace-root",
            root.path().to_str().unwrap(),
            "--json",
        ];
        let out = execbox(&args);
        let v = json_out(&out);
        assert_eq!(v["outcome"], "ok", "{v} {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(v["stdout"].as_str().unwrap().trim(), r#"{"n":1}"#, "{v}");
        assert_eq!(std::fs::read_to_string(d.join("src/log.txt")).unwrap(), "built\n");
        assert_eq!(std::fs::read_to_string(d.join("src/sorted.csv")).unwrap(), "1,2\n");
        let mode =
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(d.join("build.sh")).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o755, "the write-back kept the mode");
        let tool =
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(d.join("src/tool")).unwrap().permissions());
        assert_eq!(tool & 0o7777, 0o4755, "an unchanged file was rewritten");
        assert!(std::fs::symlink_metadata(d.join("src/shadow")).is_err(), "a planted link was written back");
        assert!(!d.join("other.txt").exists(), "a file --collect does not match was written back");
        assert!(!d.join("input.json").exists(), "the run's input.json was written back");
        assert_eq!(
            std::fs::read_link(d.join("passwd")).unwrap(),
            std::path::Path::new("/etc/passwd"),
            "the host's link changed"
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("passwd: not a regular file or a directory"), "{stderr}");
        assert!(stderr.contains("src/shadow: not a regular file"), "{stderr}");
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0, "the workspace's mount stayed");

        // SIGTERM mid-run: the workspace is unmounted before the exit (the
        // adversarial pass found it left mounted until a later sweep).
        let mut child = Command::new(env!("CARGO_BIN_EXE_execbox"))
            .args(["run", "--lang", "shell", "--code", "touch /work/started; sleep 60", "--timeout-ms", "60000"])
            .args(["--workspace", d.to_str().unwrap(), "--workspace-root", root.path().to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mounted = || std::fs::read_dir(root.path()).unwrap().flatten().any(|e| e.path().join("started").exists());
        assert!(wait_until(Duration::from_secs(60), mounted), "the run never started");
        // SAFETY: kill(2) on our own child; no memory involved.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
        assert_eq!(child.wait().unwrap().code(), Some(128 + 15));
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0, "a signalled run left its workspace");

        // A glob that could only match outside: refused before anything runs.
        let marker = d.join("src/ran.txt");
        let glob_args = ["run", "--lang", "shell", "--code", "touch /work/src/ran.txt", "--json", "--workspace"];
        let out = execbox(&[&glob_args[..], &[d.to_str().unwrap(), "--collect", "../x"]].concat());
        assert_eq!((out.status.code(), &json_out(&out)["error"]["kind"]), (Some(2), &json!("invalid_request")));
        assert!(!marker.exists(), "the code ran (or was written back) before the glob was refused");

        // A symlink of the directory's, reused as a name by the code: that
        // file is skipped and named, the rest written back, exit 1.
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), d.join("lnkdir")).unwrap();
        let code = "mkdir /work/lnkdir && echo pwn > /work/lnkdir/pwn.txt && echo ok > /work/zz.txt";
        let args = ["run", "--lang", "shell", "--code", code, "--workspace", d.to_str().unwrap()];
        let out = execbox(&[&args[..], &["--workspace-root", root.path().to_str().unwrap()]].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("lnkdir/pwn.txt") && stderr.contains(" not"), "{stderr}");
        assert_eq!(std::fs::read_to_string(d.join("zz.txt")).unwrap(), "ok\n", "the rest was written back");
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0, "a write went through the symlink");

        // Not a directory: refused before anything runs.
        let file = d.join("build.sh");
        let out =
            execbox(&["run", "--lang", "shell", "--code", "true", "--workspace", file.to_str().unwrap(), "--json"]);
        assert_eq!((out.status.code(), &json_out(&out)["error"]["kind"]), (Some(2), &json!("invalid_request")));
    }

    #[test]
    fn python_runs_and_the_host_environment_does_not_leak() {
        if !engine_answers() {
            return;
        }
        for backend in ["container", "python-wasm"] {
            let code = "import os, json\nprint(json.dumps(dict(os.environ)))";
            let out = Command::new(env!("CARGO_BIN_EXE_execbox"))
                .args(["run", "--lang", "python", "--code", code, "--backend", backend, "--json"])
                .env("EXECBOX_CANARY", "canary-4c1d")
                .output()
                .unwrap();
            let v = json_out(&out);
            if backend == "python-wasm" && v["error"]["kind"] == "backend_unavailable" {
                continue; // interpreters not fetched: tests/wasm/interpreters.rs says so
            }
            assert_eq!(out.status.code(), Some(0), "{v}");
            assert_eq!(v["backend"], backend);
            assert!(v["output"].is_object());
            assert!(!v["stdout"].as_str().unwrap().contains("canary-4c1d"), "host env leaked on {backend}");
        }

        let out = Command::new(env!("CARGO_BIN_EXE_execbox"))
            .args(["run", "--lang", "python", "--code", "import os\nprint(os.environ['EXECBOX_CANARY'])"])
            .args(["--allow-env", "EXECBOX_CANARY", "--backend", "container"])
            .env("EXECBOX_CANARY", "canary-4c1d")
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "canary-4c1d\n", "an explicit grant passes the value");
    }

    #[test]
    fn input_and_output_files_round_trip_through_the_cli() {
        if !engine_answers() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("numbers.txt");
        std::fs::write(&input, "1\n2\n3\n").unwrap();
        let out_dir = dir.path().join("results");
        let code =
            "total = sum(int(l) for l in open('/work/n.txt'))\nopen('/work/out/total.txt', 'w').write(str(total))";
        let out = execbox(&[
            "run",
            "--lang",
            "python",
            "--code",
            code,
            "--input-file",
            &format!("{}:n.txt", input.display()),
            "--output-dir",
            out_dir.to_str().unwrap(),
            "--json",
        ]);
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
        assert_eq!(json_out(&out)["output_files"][0]["name"], "total.txt");
        assert_eq!(std::fs::read_to_string(out_dir.join("total.txt")).unwrap(), "6");
    }

    #[test]
    fn shell_exit_codes_map_to_cli_exit_codes() {
        if !engine_answers() {
            return;
        }
        let out = execbox(&["run", "--lang", "shell", "--code", "echo hi; exit 4", "--json"]);
        assert_eq!(out.status.code(), Some(1));
        let v = json_out(&out);
        assert_eq!(
            (v["outcome"].as_str(), v["exit_code"].as_i64(), v["stdout"].as_str()),
            (Some("failed"), Some(4), Some("hi\n"))
        );
    }

    #[test]
    fn an_env_value_over_the_limit_is_an_invalid_request() {
        if !engine_answers() {
            return;
        }
        let value = "x".repeat(70 * 1024);
        let env = format!("BIG={value}");
        let out = execbox(&["run", "--lang", "python", "--code", "print(1)", "--env", &env, "--json"]);
        assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stdout));
        let v = json_out(&out);
        assert_eq!(v["error"]["kind"], "invalid_request", "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("BIG"), "{v}");
    }

    /// A host file outside every grant, and a read-write grant whose
    /// `out/` is also the CLI's `--output-dir`.
    fn grant_and_secret() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let grant = root.path().join("grant");
        let secret = root.path().join("secret.txt");
        std::fs::create_dir_all(grant.join("out")).unwrap();
        for dir in [&grant, &grant.join("out")] {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        std::fs::write(&secret, "precious").unwrap();
        (root, grant, secret)
    }

    /// `code` in Python with `grant` read-write at `/data`, saving its output
    /// files into the grant's `out/`.
    fn python_in_grant(grant: &std::path::Path, code: &str) -> Output {
        let preopen = format!("{}:/data:rw", grant.display());
        let out_dir = grant.join("out");
        let args = ["run", "--lang", "python", "--code", code, "--preopen", &preopen, "--output-dir"];
        execbox(&[&args[..], &[out_dir.to_str().unwrap(), "--json"]].concat())
    }

    #[test]
    fn a_symlink_planted_by_the_program_in_a_grant_is_never_written_through() {
        if !engine_answers() {
            return;
        }
        let (_root, grant, secret) = grant_and_secret();
        let code = format!(
            "import os\nos.symlink({secret:?}, '/data/out/evil')\nos.symlink({dir:?}, '/data/out/sub')\n\
             os.makedirs('/work/out/sub')\nopen('/work/out/evil', 'w').write('pwned')\n\
             open('/work/out/sub/secret.txt', 'w').write('pwned')\n",
            secret = secret.display().to_string(),
            dir = secret.parent().unwrap().display().to_string(),
        );
        let out = python_in_grant(&grant, &code);
        // The program ran: its result is printed, the failed save goes to
        // stderr, and the exit code is 1 (not 2, "nothing ran").
        let v = json_out(&out);
        assert_eq!(out.status.code(), Some(1), "{v}");
        assert_eq!(v["outcome"], "ok", "{v}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("output files not saved") && stderr.contains("symlink"), "{stderr}");
        assert_eq!(
            std::fs::read_to_string(&secret).unwrap(),
            "precious",
            "a host file outside every grant was written"
        );
    }

    #[test]
    fn swapping_the_output_dir_for_a_link_during_the_run_does_not_redirect_the_save() {
        if !engine_answers() {
            return;
        }
        let (_root, grant, secret) = grant_and_secret();
        let code = format!(
            "import os\nos.rename('/data/out', '/data/moved')\nos.symlink({dir:?}, '/data/out')\n\
             open('/work/out/secret.txt', 'w').write('pwned')\n",
            dir = secret.parent().unwrap().display().to_string(),
        );
        let out = python_in_grant(&grant, &code);
        assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
        assert_eq!(std::fs::read_to_string(&secret).unwrap(), "precious", "the save followed the swapped-in link");
        assert_eq!(
            std::fs::read_to_string(grant.join("moved/secret.txt")).unwrap(),
            "pwned",
            "saved where it was opened"
        );
    }

    #[test]
    fn saving_into_a_dir_with_a_pre_planted_symlink_is_refused() {
        if !engine_answers() {
            return;
        }
        let (_root, grant, secret) = grant_and_secret();
        let out_dir = grant.join("out");
        std::os::unix::fs::symlink(&secret, out_dir.join("report.txt")).unwrap();
        let code = "open('/work/out/report.txt', 'w').write('pwned')";
        let out = execbox(&["run", "--lang", "python", "--code", code, "--output-dir", out_dir.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("refusing to go through the symlink report.txt"), "{stderr}");
        assert_eq!(std::fs::read_to_string(&secret).unwrap(), "precious");
    }

    fn temp_dirs_in(dir: &std::path::Path) -> Vec<String> {
        std::fs::read_dir(dir).unwrap().filter_map(|e| e.ok()?.file_name().into_string().ok()).collect()
    }

    /// Starts `execbox run` of an endless shell loop with its temp dir in
    /// `tmp`; returns once its container runs, with its owner token.
    fn endless_run(tmp: &std::path::Path, timeout_ms: u64) -> (std::process::Child, String) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_execbox"))
            .args(["run", "--lang", "shell", "--code", "while :; do :; done", "--json"])
            .args(["--timeout-ms", &timeout_ms.to_string()])
            .env("TMPDIR", tmp)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let token = procfs::owner_token(child.id());
        let started = docker::Events::new(&[&docker::owned_by(&token), "event=start"]);
        if started.next_before(Instant::now() + Duration::from_secs(30)).is_none() {
            drop(child.kill());
            panic!("the container never started");
        }
        (child, token)
    }

    #[test]
    fn sigkill_mid_run_leaves_nothing_past_the_deadline_plus_grace() {
        use execbox::backends::container::KILL_GRACE;
        if !engine_answers() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let deadline = std::time::Duration::from_secs(3);
        let (mut child, token) = endless_run(tmp.path(), deadline.as_millis() as u64);
        assert!(!temp_dirs_in(tmp.path()).is_empty(), "the run stages its files in TMPDIR");
        child.kill().unwrap(); // SIGKILL: no handler runs
        child.wait().unwrap();
        // The deadline started before the kill: this bound is generous.
        let gone = docker::wait_gone(&[&docker::owned_by(&token)], deadline + KILL_GRACE);
        assert!(gone, "container of a SIGKILLed host still there: {:?}", docker::owned(&token, true));
        // Nothing announces a removed directory: it is looked for.
        let cleaned = wait_until(deadline + KILL_GRACE, || temp_dirs_in(tmp.path()).is_empty());
        assert!(cleaned, "temp dirs of a SIGKILLed host still there: {:?}", temp_dirs_in(tmp.path()));
    }

    #[test]
    fn sigterm_mid_run_cleans_up_then_exits_143() {
        if !engine_answers() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let (child, token) = endless_run(tmp.path(), 60_000);
        // SAFETY: kill(2) on our own child; no memory involved.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(128 + 15));
        // Cleaned up before it exited: nothing to wait for.
        assert_eq!(docker::owned(&token, true), Vec::<String>::new());
        assert_eq!(temp_dirs_in(tmp.path()), Vec::<String>::new());
    }

    #[test]
    fn a_start_sweeps_containers_of_dead_owners_in_its_own_scope_only() {
        if !engine_answers() {
            return;
        }
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap().trim().to_string();
        let pidns: String = std::fs::read_link("/proc/self/ns/pid")
            .unwrap()
            .display()
            .to_string()
            .chars()
            .filter(char::is_ascii_digit)
            .collect();
        let create = |scope: &str| {
            let out = Command::new("docker")
                .args(["create", "--label=execbox=1", "--label=execbox.owner=999999999.1"])
                .arg(format!("--label=execbox.scope={scope}"))
                .args(["--label=execbox.test=sweep", "localhost/execbox-python:3.11", "true"])
                .output()
                .unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        let exists = |id: &str| {
            Command::new("docker").args(["inspect", "--type=container", id]).output().unwrap().status.success()
        };
        // A dead owner (no pid 999999999) in this PID namespace, and one in another namespace of this boot.
        let dead_here = create(&format!("{boot}.{pidns}"));
        let elsewhere = create(&format!("{boot}.1"));
        let out = execbox(&["run", "--lang", "shell", "--code", "true", "--json"]);
        assert_eq!(out.status.code(), Some(0));
        let (swept, kept) = (!exists(&dead_here), exists(&elsewhere));
        drop(Command::new("docker").args(["rm", "--force", &dead_here, &elsewhere]).output());
        assert!(swept, "the container of a dead owner in this scope was left");
        assert!(kept, "a container of another PID namespace was removed: its owner's liveness cannot be judged");
    }
}

/// The CLI reads only regular files, and no more than a limit: a FIFO
/// (which would block forever) or `/dev/zero` (which never ends) given as
/// code, input file or stdin is refused at once.
#[test]
fn files_the_cli_reads_are_regular_and_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let fifo = fifo.to_str().unwrap();
    let input_file = format!("{fifo}:f");
    let started = std::time::Instant::now();
    for args in [
        vec!["run", "--file", fifo, "--json"],
        vec!["run", "--file", "/dev/zero", "--json"],
        vec![
            "run",
            "--lang",
            "wasm",
            "--file",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../guests/prebuilt/wasi_tool.wasm"),
            "--stdin-file",
            "/dev/zero",
            "--json",
        ],
        vec!["run", "--code", "return 1", "--input-file", &input_file, "--json"],
    ] {
        let out = execbox(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let v = json_out(&out);
        assert_eq!(v["error"]["kind"], "invalid_request", "{args:?}: {v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("not a regular file"), "{v}");
    }
    // A regular file over the code limit is refused without reading it all.
    let big = dir.path().join("big.js");
    std::fs::write(&big, "1;".repeat(600_000)).unwrap();
    let out = execbox(&["run", "--file", big.to_str().unwrap(), "--json"]);
    let v = json_out(&out);
    assert!(v["error"]["message"].as_str().unwrap().contains("max_code_bytes"), "{v}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
}

/// A refusal's message is capped like a result's: an invalid module's
/// error quotes the payload.
#[test]
fn refusal_messages_are_capped() {
    let wat = dir_file(&format!("(module {})", "x".repeat(900_000)));
    let out = execbox(&["run", "--lang", "wasm", "--file", wat.1.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let v = json_out(&out);
    assert_eq!(v["error"]["kind"], "invalid_request", "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.len() < 4300, "{} bytes", message.len());
    // WAT over its own limit (1 MiB) is refused before it is parsed.
    let huge = dir_file(&format!("(module {})", " ".repeat(1_100_000)));
    let out = execbox(&[
        "run",
        "--lang",
        "wasm",
        "--file",
        huge.1.to_str().unwrap(),
        "--max-code-bytes",
        "4000000",
        "--json",
    ]);
    let v = json_out(&out);
    assert!(v["error"]["message"].as_str().unwrap().contains("max_wat_bytes"), "{v}");
}

fn dir_file(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.wat");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

/// A reader that stops early (`| head`) does not make the CLI panic.
#[test]
fn a_closed_stdout_is_not_a_panic() {
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_execbox"))
        .args(["run", "--code", "return 'x'.repeat(200000)", "--json", "--max-output-bytes", "1000000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0));
}

/// Code Mode from the command line: `--allow-tool` grants, `--upstreams`
/// connects. A tool granted with nothing behind it is refused before
/// anything runs; a bad mcpServers file or a server that cannot start is a
/// usage error (exit 2), never a run without the tools.
#[cfg(feature = "upstream")]
#[test]
fn tool_flags_refuse_unknown_tools_and_unusable_upstreams() {
    let out = execbox(&["run", "--allow-tool", "nothing.here", "--code", "return 1", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing.here"), "{out:?}");

    let dir = tempfile::tempdir().unwrap();
    for (body, expected) in [
        ("{\"mcpServers\": {\"a-b\": {\"command\": \"x\"}}}", "identifier"),
        ("{\"mcpServers\": {\"gone\": {\"command\": \"/nonexistent/server\"}}}", "cannot start"),
        ("not json", "not an mcpServers document"),
    ] {
        let path = dir.path().join("up.json");
        std::fs::write(&path, body).unwrap();
        let out = execbox(&["run", "--upstreams", path.to_str().unwrap(), "--code", "return 1", "--json"]);
        assert_eq!(out.status.code(), Some(2), "{body}: {out:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains(expected), "{body}: {out:?}");
    }
}

/// Artifacts from the command line: `--artifacts DIR --artifact-key KEY`
/// registers the `artifacts.*` tools (granted with `--allow-tool`) in the
/// key's scope, so a later run with the same key reads what an earlier one
/// saved, and another key does not; `--spill-output` keeps the whole
/// stdout. `--artifacts` without a key is a usage error.
#[cfg(all(feature = "artifacts", feature = "js"))]
#[test]
fn artifacts_persist_across_runs_of_one_key() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().to_str().unwrap();
    let run = |key: &str, code: &str, extra: &[&str]| {
        let mut args =
            vec!["run", "--artifacts", store, "--artifact-key", key, "--allow-tool", "artifacts.*", "--json"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--code", code]);
        execbox(&args)
    };
    let out = run("k1", "return (await tools.artifacts.save({name: 'a.txt', content: 'kept'})).version", &[]);
    assert_eq!((out.status.code(), json_out(&out)["output"].clone()), (Some(0), json!(1)), "{out:?}");
    let out = run("k1", "return (await tools.artifacts.load({name: 'a.txt'})).content", &[]);
    assert_eq!(json_out(&out)["output"], "kept", "{out:?}");
    let out = run("k2", "try { await tools.artifacts.load({name: 'a.txt'}) } catch (e) { return e.kind }", &[]);
    assert_eq!(json_out(&out)["output"], "not_found", "{out:?}");

    let out = run(
        "k1",
        "for (let i = 0; i < 500; i++) console.log('line ' + i)",
        &["--spill-output", "--max-output-bytes", "500"],
    );
    let v = json_out(&out);
    let name = v["spilled"].as_str().unwrap_or_else(|| panic!("spilled: {v}"));
    assert!(v["stdout"].as_str().unwrap().len() <= 500, "{v}");
    assert_eq!(v["stdout_total_bytes"], (0..500).map(|i| format!("line {i}\n").len()).sum::<usize>());
    let code = format!("return (await tools.artifacts.load({{name: {name:?}, offset: 0, length: 14}})).content");
    let out = run("k1", &code, &[]);
    assert_eq!(json_out(&out)["output"], "line 0\nline 1\n", "{out:?}");

    let out = execbox(&["run", "--artifacts", store, "--code", "return 1", "--json"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("--artifact-key"), "{out:?}");
}

#[test]
#[cfg(feature = "wasm")]
fn under_an_address_space_limit_the_wasm_engine_falls_back_and_still_runs() {
    // What refuses the pool's reservation (`ulimit -v`) would refuse the
    // 4 GiB each on-demand memory reserves by default too.
    let cli = env!("CARGO_BIN_EXE_execbox");
    let tool = concat!(env!("CARGO_MANIFEST_DIR"), "/../guests/prebuilt/wasi_tool.wasm");
    let limited = |args: &str| {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("ulimit -v 8000000 && exec {cli} {args}"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let backends: serde_json::Value = serde_json::from_str(&limited("backends --json")).unwrap();
    let wasm = backends.as_array().unwrap().iter().find(|b| b["name"] == "wasm").unwrap();
    let memory = wasm["capabilities"]["memory"]["how"].as_str().unwrap();
    assert!(memory.contains("allocated on demand: the pooling allocator's reservation was refused"), "{memory}");
    let run: serde_json::Value =
        serde_json::from_str(&limited(&format!("run --lang wasm --file {tool} --arg args --arg hi --json"))).unwrap();
    assert_eq!((run["outcome"].as_str(), run["stdout"].as_str()), (Some("ok"), Some("hi\n")), "{run}");
}
