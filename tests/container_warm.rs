//! The warm one-shot container pool (`ContainerConfig::warm_containers`)
//! against a real engine: a pooled run sees a fresh container and keeps
//! every outcome of a cold one; a container killed from outside is
//! replaced; an empty pool falls back to a cold start; a forged end record
//! ends only its own run; the host's death leaves no warm container.
//!
//! Skips (printing why) when no engine answers; with
//! `EXECBOX_REQUIRE_CONTAINERS=1` (set by `.ci/run`) it fails instead.
//!
//! Its own binary: one test re-runs it as a host to kill, and a
//! `Container::shutdown` elsewhere in the process would remove every warm
//! container's staging directory (shutdown is for a host about to exit).
#![cfg(feature = "container")]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::docker::{ps, test_label};
use common::skip::labelled_container;
use common::wait::wait_until;
use execbox::backends::Container;
use execbox::backends::container::{ContainerConfig, KILL_GRACE};
use execbox::{Backend, ExecFile, ExecRequest, ExecResult, Executor, Language, Outcome, SandboxPolicy};
use serde_json::json;

/// A backend with a warm pool of `size`, its containers labelled for this
/// test (`None`: no engine, skipped).
fn warm_backend(label: &str, size: usize) -> Option<Container> {
    labelled_container(label, ContainerConfig::default().warm_containers(size))
}

/// Running containers carrying this test's label.
fn running(label: &str) -> Vec<String> {
    ps(&["--filter", &test_label(label)])
}

/// Containers (running or not) carrying this test's label.
fn leftovers(label: &str) -> Vec<String> {
    ps(&["--all", "--filter", &test_label(label)])
}

/// Asserts that no container carrying this test's label is left within
/// `limit`. Polled, not waited for on docker events: a start still in
/// flight when the pool or its host went may create one after any listing.
fn assert_nothing_left(label: &str, limit: Duration, what: &str) {
    assert!(wait_until(limit, || leftovers(label).is_empty()), "{what}: {:?}", leftovers(label));
}

/// Starts the plain pool and waits until `n` containers are ready.
fn fill(backend: &Container, n: usize) {
    backend.prepare(Duration::ZERO);
    assert!(
        wait_until(Duration::from_secs(60), || backend.readiness().is_some_and(|r| r.ready >= n)),
        "the warm pool did not fill: {:?}",
        backend.readiness()
    );
}

fn run(backend: &Container, request: ExecRequest) -> ExecResult {
    Executor::run_on(backend, request).expect("execute")
}

fn python(code: &str) -> ExecRequest {
    ExecRequest::source(Language::Python, code)
}

/// Python printing how long ago its container's first process started (s).
const CONTAINER_AGE: &str = "\
ticks = __import__('os').sysconf('SC_CLK_TCK')
start = int(open('/proc/1/stat').read().rsplit(')', 1)[1].split()[19]) / ticks
print(round(float(open('/proc/uptime').read().split()[0]) - start, 3))
";

fn age(result: &ExecResult) -> f64 {
    result.stdout.text().trim().parse().unwrap_or_else(|_| panic!("no age in {result:?}"))
}

#[test]
fn a_pooled_run_is_warm_fresh_and_removed() {
    let label = "warm-fresh";
    let Some(c) = warm_backend(label, 1) else { return };
    fill(&c, 1);
    // Labelled as waiting, so an operator (and serve's tests) can tell it apart.
    let waiting = ps(&["--filter", &test_label(label), "--filter", "label=execbox.role=warm"]);
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    // Not synchronisation: the container must be visibly older than a run.
    std::thread::sleep(Duration::from_millis(800));
    let first = run(&c, python(CONTAINER_AGE));
    assert_eq!(first.outcome, Outcome::Ok, "{first:?}");
    assert!(age(&first) >= 0.5, "the run did not take a warm container: {first:?}");

    // The first run leaves a file, a process and a variable behind ...
    let dirty = run(
        &c,
        python(
            "import os, subprocess\nopen('/tmp/left', 'w').write('x')\nos.environ['LEFT'] = '1'\n\
             subprocess.Popen(['/bin/sleep', '1000'])\nprint(open('/etc/hostname').read().strip())",
        ),
    );
    assert_eq!(dirty.outcome, Outcome::Ok, "{dirty:?}");
    fill(&c, 1);
    // ... and the next warm one sees none of it.
    let clean = run(
        &c,
        python(
            "import os\nprocs = [p for p in os.listdir('/proc') if p.isdigit()]\n\
             print(os.path.exists('/tmp/left'), 'LEFT' in os.environ, len(procs), \
             open('/etc/hostname').read().strip())",
        ),
    );
    assert_eq!(clean.outcome, Outcome::Ok, "{clean:?}");
    let text = clean.stdout.text();
    let fields: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(&fields[..2], ["False", "False"], "{text}");
    // The timer, the wrapper's shell and the program itself.
    assert!(fields[2].parse::<usize>().unwrap() <= 3, "processes of an earlier run: {text}");
    assert_ne!(fields[3], dirty.stdout.text().trim(), "the same container ran twice");

    drop(c);
    assert_nothing_left(label, Duration::from_secs(20), "left behind");
}

#[test]
fn a_pooled_run_keeps_every_outcome_of_a_cold_one() {
    let label = "warm-outcomes";
    let Some(c) = warm_backend(label, 1) else { return };
    fill(&c, 1);

    // Files in, JSON input, files out.
    let request = python(
        "import json\nprint(open('/work/data/in.txt').read(), input['n'])\n\
         open('/work/out/result.txt', 'w').write('made')\nraise SystemExit(3)",
    )
    .input(json!({"n": 7}))
    .input_file(ExecFile::new("data/in.txt", b"hello".to_vec()))
    .collect_output_files();
    let out = run(&c, request.clone());
    assert_eq!((out.outcome, out.exit_code), (Outcome::Failed, Some(3)), "{out:?}");
    assert_eq!(out.stdout.text().trim(), "hello 7");
    assert_eq!(out.output_files.len(), 1, "{out:?}");
    assert_eq!(out.output_files[0].content, b"made");
    // The outputs pool started on that first run: the next one is warm.
    assert!(wait_until(Duration::from_secs(60), || c.readiness().is_some_and(|r| r.ready >= 2)));
    let again = run(&c, request);
    assert_eq!(again.output_files.len(), 1, "{again:?}");

    // The deadline holds (killed on the daemon side, within the grace).
    fill(&c, 1);
    let started = Instant::now();
    let spin = run(&c, python("while True: pass").policy(SandboxPolicy::strict().timeout(Duration::from_millis(1500))));
    assert_eq!(spin.outcome, Outcome::TimedOut, "{spin:?}");
    assert!(started.elapsed() < Duration::from_millis(1500) + KILL_GRACE + Duration::from_secs(1));

    // The memory cap holds, and is told apart from other kills.
    fill(&c, 1);
    let oom = run(&c, python("x = []\nwhile True: x.append(bytearray(16 << 20))"));
    assert_eq!(oom.outcome, Outcome::OutOfMemory, "{oom:?}");

    // Output caps hold.
    fill(&c, 1);
    let loud = run(
        &c,
        python("import sys\nsys.stdout.write('x' * 100000)").policy(SandboxPolicy::strict().max_output_bytes(1000)),
    );
    assert_eq!(loud.stdout.bytes.len(), 1000);
    assert!(loud.stdout.truncated, "{loud:?}");

    drop(c);
    assert_nothing_left(label, Duration::from_secs(20), "left behind");
}

#[test]
fn a_pooled_container_killed_from_outside_is_replaced() {
    let label = "warm-killed";
    let Some(c) = warm_backend(label, 1) else { return };
    fill(&c, 1);
    let before = running(label);
    assert_eq!(before.len(), 1, "{before:?}");
    let killed = Command::new("docker").args(["kill"]).args(&before).output().expect("docker kill");
    assert!(killed.status.success());
    assert!(
        wait_until(Duration::from_secs(60), || {
            let now = running(label);
            now.len() == 1 && now != before && c.readiness().is_some_and(|r| r.ready == 1)
        }),
        "not replaced: {:?}",
        running(label)
    );
    // Not synchronisation: the replacement must be visibly older than a run.
    std::thread::sleep(Duration::from_millis(800));
    let r = run(&c, python(CONTAINER_AGE));
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    assert!(age(&r) >= 0.5, "the run did not take the replacement: {r:?}");
    drop(c);
    assert_nothing_left(label, Duration::from_secs(20), "left behind");
}

/// A ready container paused from outside (`docker pause`) is not handed
/// to a run (it would time out without running): it does not answer the
/// probe, is removed, and the run starts cold and ends `ok`.
#[test]
fn a_paused_pooled_container_is_not_handed_to_a_run() {
    let label = "warm-paused";
    let Some(c) = warm_backend(label, 1) else { return };
    fill(&c, 1);
    let paused = running(label);
    assert_eq!(paused.len(), 1, "{paused:?}");
    let out = Command::new("docker").arg("pause").args(&paused).output().expect("docker pause");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r = run(&c, python("print(6 * 7)").policy(SandboxPolicy::strict().timeout(Duration::from_secs(10))));
    assert_eq!((r.outcome, r.stdout.text().trim()), (Outcome::Ok, "42"), "{r:?}");
    assert!(
        wait_until(Duration::from_secs(30), || !leftovers(label).contains(&paused[0])),
        "the paused container was not removed: {:?}",
        leftovers(label)
    );
    drop(c);
    assert_nothing_left(label, Duration::from_secs(30), "left behind");
}

#[test]
fn an_empty_pool_falls_back_to_a_cold_start() {
    let label = "warm-empty";
    let Some(c) = warm_backend(label, 1) else { return };
    fill(&c, 1);
    let runs: Vec<ExecResult> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..3).map(|_| scope.spawn(|| run(&c, python(CONTAINER_AGE)))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in &runs {
        assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    }
    // Runs that do not fit the pool run cold, and right.
    let env = run(
        &c,
        python("import os\nprint(os.environ['GREETING'])")
            .env("GREETING", "hi")
            .policy(SandboxPolicy::strict().environment(execbox::Access::Allow(vec!["GREETING".into()]))),
    );
    assert_eq!(env.stdout.text().trim(), "hi", "{env:?}");
    let args = run(&c, python("import sys\nprint(sys.argv[1:])").arg("a").arg("b"));
    assert_eq!(args.stdout.text().trim(), "['a', 'b']", "{args:?}");
    drop(c);
    assert_nothing_left(label, Duration::from_secs(20), "left behind");
}

#[test]
fn a_forged_end_record_ends_only_its_own_run() {
    let label = "warm-forged";
    let Some(c) = warm_backend(label, 1) else { return };
    fill(&c, 1);
    // The nonce is on the wrapper's command line: the code can read it,
    // write the end record itself and go on running.
    let forge = "\
import os, sys, time
for pid in os.listdir('/proc'):
    try:
        argv = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')
    except OSError:
        continue
    if b'execbox-end' in argv:
        nonce = argv[argv.index(b'execbox-end') + 1].decode()
print('forged')
sys.stdout.flush()
record = f'\\0execbox:{nonce}:Z000\\n'.encode()
os.write(2, record)
os.write(1, record)
time.sleep(100)
";
    let started = Instant::now();
    let r = run(&c, python(forge).policy(SandboxPolicy::strict().timeout(Duration::from_secs(20))));
    assert!(started.elapsed() < Duration::from_secs(15), "the forged record was not taken: {:?}", started.elapsed());
    assert_eq!((r.outcome, r.stdout.text().trim()), (Outcome::Ok, "forged"), "{r:?}");
    // The container that went on sleeping is removed all the same.
    assert!(
        wait_until(Duration::from_secs(20), || running(label).len() <= 1),
        "the forging container still runs: {:?}",
        running(label)
    );
    drop(c);
    assert_nothing_left(label, Duration::from_secs(20), "left behind");
}

#[test]
fn the_hosts_death_leaves_no_warm_container() {
    if warm_backend("warm-probe", 0).is_none() {
        return;
    }
    let label = "warm-host-death";
    // This test binary, re-run as a host that keeps a warm pool and waits.
    let mut host = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "warm_pool_host", "--nocapture", "--ignored"])
        .env("EXECBOX_WARM_HOST_LABEL", label)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the host");
    assert!(
        wait_until(Duration::from_secs(60), || running(label).len() == 2),
        "the host's pool did not fill: {:?}",
        running(label)
    );
    host.kill().unwrap();
    host.wait().unwrap();
    assert_nothing_left(label, Duration::from_secs(30), "warm containers outlived their host");
}

/// The host of `the_hosts_death_leaves_no_warm_container` (run only by it).
#[test]
#[ignore = "run by the_hosts_death_leaves_no_warm_container"]
fn warm_pool_host() {
    let Ok(label) = std::env::var("EXECBOX_WARM_HOST_LABEL") else { return };
    let c = warm_backend(&label, 2).expect("an engine");
    fill(&c, 2);
    // Not synchronisation: this process waits to be killed.
    std::thread::sleep(Duration::from_secs(300));
}

#[test]
fn warm_and_cold_runs_end_the_same_way() {
    let label = "warm-agree";
    let Some(c) = warm_backend(label, 1) else { return };
    let Some(cold) = warm_backend(label, 0) else { return };
    // How a program ends: Python's own exit (cold) against the warm
    // bootstrap's hand-made one (no files collected: teardown skipped).
    let programs = [
        "print('a', end='')",
        "raise ValueError('boom')",
        "try:\n    1/0\nexcept Exception:\n    raise KeyError('k')",
        "import sys\nsys.exit()",
        "import sys\nsys.exit(3)",
        "import sys\nsys.exit('bye')",
        "import sys\nsys.exit(256)",
        "import sys\nsys.exit(-1)",
        "import sys\nsys.exit(True)",
        "raise KeyboardInterrupt",
        "import threading, time\ndef w():\n    time.sleep(0.2)\n    print('late')\nthreading.Thread(target=w).start()\nprint('early')",
        "import atexit\natexit.register(lambda: print('bye'))\nprint('hi')",
        "import sys\nsys.excepthook = lambda *a: print('hooked')\nraise ValueError()",
        "import sys\nsys.stdout.write('unflushed')\nsys.stderr.write('err')",
    ];
    for code in programs {
        fill(&c, 1);
        let warm = run(&c, python(&format!("{code}\n")));
        let cold = run(&cold, python(&format!("{code}\n")));
        let view =
            |r: &ExecResult| (r.outcome, r.exit_code, r.stdout.text().into_owned(), r.stderr.text().into_owned());
        assert_eq!(view(&warm), view(&cold), "{code}");
    }
    drop(c);
    drop(cold);
    assert_nothing_left(label, Duration::from_secs(20), "left behind");
}

/// Python finding its wrapper's end-record nonce and defining `rec(code)`,
/// the record with that code (as a program attacking its own run would).
const FORGER: &str = "\
import os, sys, time
for pid in os.listdir('/proc'):
    try:
        argv = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')
    except OSError:
        continue
    if b'execbox-end' in argv:
        nonce = argv[argv.index(b'execbox-end') + 1].decode()
def rec(code):
    return f'\\0execbox:{nonce}:Z{code}\\n'.encode()
";

#[test]
fn a_forged_end_record_never_makes_an_engine_error_or_a_foreign_exit_code() {
    let label = "warm-forged-codes";
    let Some(c) = warm_backend(label, 1) else { return };
    let policy = SandboxPolicy::strict().timeout(Duration::from_secs(20));
    let forged = |code: &str| {
        fill(&c, 1);
        let r = Executor::run_on(&c, python(&format!("{FORGER}{code}")).policy(policy.clone()));
        r.unwrap_or_else(|e| panic!("{code}: the program's own run ended as an error: {e}"))
    };
    // A forged code the daemon must explain (125-127, 137) then waits for
    // the engine: the wrapper's real record and the program's output that
    // follow must not cost the CLI a SIGPIPE (which read as "the docker CLI
    // was killed by a signal", an internal error).
    let r = forged("os.write(1, rec('125')); os.write(2, rec('125'))\ntime.sleep(0.5)\n");
    assert_eq!((r.outcome, r.exit_code), (Outcome::Ok, Some(0)), "{r:?}");
    let r = forged("os.write(1, rec('137')); os.write(2, rec('137'))\nsys.stdout.write('x' * (2 << 20))\n");
    assert_eq!((r.outcome, r.exit_code), (Outcome::Ok, Some(0)), "{r:?}");
    assert!(r.stdout.bytes.is_empty(), "nothing after the end record is output: {r:?}");
    // A record on one stream only: the run ends with the program's code,
    // not the CLI's (which exited 1 on a closed stdout).
    let r = forged("os.write(1, rec('000'))\nsys.stderr.write('y' * 100000)\nraise SystemExit(3)\n");
    assert_eq!((r.outcome, r.exit_code), (Outcome::Failed, Some(3)), "{r:?}");
    // No exit status is over 255: such a "record" is the program's text.
    let r = forged("os.write(1, rec('999')); os.write(2, rec('999'))\ntime.sleep(0.2)\nraise SystemExit(5)\n");
    assert_eq!((r.outcome, r.exit_code), (Outcome::Failed, Some(5)), "{r:?}");
    assert!(r.stdout.text().contains(":Z999"), "{r:?}");
    drop(c);
    assert_nothing_left(label, Duration::from_secs(20), "left behind");
}

#[test]
fn a_warm_run_may_start_as_many_processes_as_a_cold_one() {
    let label = "warm-pids";
    let Some(c) = warm_backend(label, 1) else { return };
    let code = format!(
        "{CONTAINER_AGE}import subprocess\ntry:\n    subprocess.run(['/bin/true'])\n    print('spawned')\n\
         except OSError:\n    print('refused')"
    );
    for (pids, expect) in [(2, "refused"), (3, "spawned")] {
        let request = python(&code).policy(SandboxPolicy::strict().max_processes(pids));
        // The first run of this process cap is cold and starts its pool.
        let cold = run(&c, request.clone());
        assert_eq!(cold.outcome, Outcome::Ok, "{cold:?}");
        assert_eq!(cold.stdout.text().lines().nth(1), Some(expect), "cold, --pids-limit={pids}: {cold:?}");
        // A warm container that fails its health probe (a loaded machine:
        // 250 ms) is replaced and the run goes cold; a later one is warm.
        let mut warm_runs = Vec::new();
        for _ in 0..3 {
            assert!(
                wait_until(Duration::from_secs(60), || c.readiness().is_some_and(|r| r.ready >= 1)),
                "no warm container starts under --pids-limit={pids}: {:?}",
                c.readiness()
            );
            // Not synchronisation: the container must be visibly older than a run.
            std::thread::sleep(Duration::from_millis(800));
            let warm = run(&c, request.clone());
            assert_eq!(warm.outcome, Outcome::Ok, "{warm:?}");
            assert_eq!(warm.stdout.text().lines().nth(1), Some(expect), "--pids-limit={pids}: {warm:?}");
            let age: f64 = warm.stdout.text().lines().next().and_then(|l| l.parse().ok()).unwrap_or(0.0);
            if age >= 0.5 {
                break;
            }
            warm_runs.push(warm);
        }
        assert!(warm_runs.len() < 3, "no run was warm: {warm_runs:?}");
    }
    drop(c);
    assert_nothing_left(label, Duration::from_secs(20), "left behind");
}

#[test]
fn a_warm_run_refuses_the_files_a_cold_one_refuses() {
    let label = "warm-staging";
    let Some(c) = warm_backend(label, 1) else { return };
    for request in [
        // A file where the JSON input goes.
        python("print(open('/work/input.json').read())")
            .input(json!({"n": 1}))
            .input_file(ExecFile::new("input.json", b"forged".to_vec())),
        // Two files of one name.
        python("print(open('/work/a.txt').read())")
            .input_file(ExecFile::new("a.txt", b"one".to_vec()))
            .input_file(ExecFile::new("a.txt", b"two".to_vec())),
    ] {
        fill(&c, 1);
        let r = Executor::run_on(&c, request);
        assert!(matches!(r, Err(execbox::ExecError::InvalidRequest(_))), "refused cold, but warm: {r:?}");
    }
    drop(c);
    assert_nothing_left(label, Duration::from_secs(20), "left behind");
}

#[test]
fn a_taken_container_is_younger_than_its_lifetime() {
    // Its in-container timer (warm_lifetime + the default timeout + 2 s)
    // runs from its start, which is before its packages were imported: its
    // lifetime must count from there too, or a run taking it late is killed
    // by that timer before its own deadline (exit 137, not timed_out).
    let label = "warm-lifetime";
    let Some(_) = warm_backend(label, 0) else { return };
    let lifetime = Duration::from_secs(10);
    let cfg = ContainerConfig::default()
        .warm_containers(1)
        .warm_lifetime(lifetime)
        .extra_run_args(vec![format!("--label=execbox.test={label}")]);
    let c = Container::new(cfg).expect("config");
    let request = python(CONTAINER_AGE).packages(["numpy", "pandas"]);
    // Cold; starts the pool of this package set.
    let first = run(&c, request.clone());
    assert_eq!(first.outcome, Outcome::Ok, "{first:?}");
    if !wait_until(Duration::from_secs(60), || c.readiness().is_some_and(|r| r.ready >= 1)) {
        eprintln!("skipping: no warm container of numpy and pandas started within 60 s (a slow machine)");
        return;
    }
    // Not synchronisation: the take must come late in its lifetime as the
    // pool counts it (ready a moment ago).
    std::thread::sleep(lifetime - Duration::from_millis(500));
    let late = run(&c, request);
    assert_eq!(late.outcome, Outcome::Ok, "{late:?}");
    assert!(
        age(&late) <= lifetime.as_secs_f64() + 0.25,
        "a run took a container {} s old, past its lifetime of {lifetime:?}",
        age(&late)
    );
    drop(c);
    assert_nothing_left(label, Duration::from_secs(20), "left behind");
}

/// The engine's record of a container's flags (all but its name, staging
/// path and command), one line per field.
fn flags(name: &str) -> Vec<String> {
    let format = "{{json .HostConfig.Memory}}\n{{json .HostConfig.MemorySwap}}\n{{json .HostConfig.PidsLimit}}\n\
                  {{json .HostConfig.NanoCpus}}\n{{json .HostConfig.ReadonlyRootfs}}\n{{json .HostConfig.NetworkMode}}\n\
                  {{json .HostConfig.CapDrop}}\n{{json .HostConfig.CapAdd}}\n{{json .HostConfig.SecurityOpt}}\n\
                  {{json .HostConfig.IpcMode}}\n{{json .HostConfig.Tmpfs}}\n{{json .HostConfig.Binds}}\n\
                  {{range .HostConfig.Mounts}}{{.Type}} {{.Target}} {{.ReadOnly}};{{end}}\n{{json .Config.User}}\n\
                  {{json .Config.Env}}\n{{json .HostConfig.Privileged}}\n{{json .Config.Image}}\n\
                  {{json .Config.WorkingDir}}\n{{json .HostConfig.LogConfig.Type}}";
    let out = Command::new("docker").args(["inspect", "--format", format, name]).output().expect("docker inspect");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

/// Whether the container runs the warm end-record wrapper.
fn is_warm(name: &str) -> bool {
    let out = Command::new("docker").args(["inspect", "--format", "{{json .Config.Cmd}}", name]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).contains("execbox-end")
}

#[test]
fn a_warm_container_has_the_flags_its_cold_run_would_have() {
    let label = "warm-flags";
    let Some(c) = warm_backend(label, 1) else { return };
    for collect in [false, true] {
        let mut request = python("import time\ntime.sleep(30)").policy(SandboxPolicy::strict().memory_bytes(200 << 20));
        if collect {
            request = request.collect_output_files();
        }
        // The first run of this pool is cold (an argument keeps it so)
        // and starts the pool: compare the two while both live.
        let before = running(label);
        let cold = std::thread::scope(|scope| {
            let cold_run = request
                .clone()
                .arg("cold")
                .policy(SandboxPolicy::strict().memory_bytes(200 << 20).timeout(Duration::from_secs(20)));
            let handle = scope.spawn(|| Executor::run_on(&c, cold_run));
            assert!(wait_until(Duration::from_secs(30), || running(label).len() > before.len()));
            let started = running(label).into_iter().find(|id| !before.contains(id)).unwrap();
            let cold = flags(&started);
            // Starts the pool of this key (a run that fits it), then waits
            // for its container.
            let _ = Executor::run_on(
                &c,
                request
                    .clone()
                    .policy(SandboxPolicy::strict().memory_bytes(200 << 20).timeout(Duration::from_millis(100))),
            );
            let new_warm = || running(label).into_iter().find(|id| !before.contains(id) && is_warm(id));
            assert!(wait_until(Duration::from_secs(60), || new_warm().is_some()), "no warm container started");
            let warm_id = new_warm().unwrap();
            let warm = flags(&warm_id);
            Command::new("docker").args(["kill", &started]).output().unwrap();
            drop(handle.join());
            (cold, warm)
        });
        let (mut cold, warm) = cold;
        // The one difference: without /work/out, one process more for the
        // end-record wrapper (so the program has as many as cold).
        if !collect {
            let pids: u64 = cold[2].parse().unwrap();
            cold[2] = (pids + 1).to_string();
        }
        assert_eq!(cold, warm, "collect={collect}: cold (left) and warm flags differ");
    }
    drop(c);
    assert_nothing_left(label, Duration::from_secs(20), "left behind");
}

/// A warm container is started under exactly execbox's seccomp profile
/// (the engine's record of it, read while it waits), and the run that takes
/// it meets it: `io_uring_setup` is `EPERM` (docker 20.10's default profile
/// let it reach the kernel).
#[test]
fn a_warm_container_runs_under_execbox_seccomp_profile() {
    use common::programs::{IO_URING_SETUP_ERRNO, SECCOMP_PROFILE};
    let label = "warm-seccomp";
    let Some(c) = warm_backend(label, 1) else { return };
    fill(&c, 1);
    let waiting = ps(&["--filter", &test_label(label), "--filter", "label=execbox.role=warm"]);
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    let expected: serde_json::Value = serde_json::from_str(SECCOMP_PROFILE).unwrap();
    assert_eq!(common::docker::seccomp_profile_of(&waiting[0]), Some(expected));
    // Not synchronisation: the container must be visibly older than a run.
    std::thread::sleep(Duration::from_millis(800));
    let r = run(&c, python(&format!("{IO_URING_SETUP_ERRNO}{CONTAINER_AGE}")));
    assert_eq!(r.outcome, Outcome::Ok, "{r:?}");
    let text = r.stdout.text();
    let (errno, age) = text.trim().split_once('\n').unwrap_or_else(|| panic!("{r:?}"));
    assert_eq!(errno, "1", "{r:?}");
    assert!(age.parse::<f64>().unwrap() >= 0.5, "the run did not take the warm container: {r:?}");
    drop(c);
    assert_nothing_left(label, Duration::from_secs(20), "left behind");
}
