//! One container run through the engine CLI: feed stdin, capture both streams
//! under their caps, enforce the deadline on the daemon side, classify the
//! exit, and remove the container.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::limits::{BoundedBuffer, Deadline};
use crate::result::CapturedStream;

/// Environment the engine CLI itself needs; nothing else is inherited.
const CLI_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "DOCKER_HOST",
    "DOCKER_CONFIG",
    "DOCKER_CONTEXT",
    "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY",
    "CONTAINER_HOST",
    "CONTAINERS_CONF",
    "XDG_RUNTIME_DIR",
    "XDG_CONFIG_HOME",
];

/// How long the CLI may take to exit after the daemon killed its container.
const KILL_GRACE: Duration = Duration::from_secs(10);

/// Longest an engine housekeeping command (inspect, kill, rm, availability)
/// may take: a hung daemon must not hang the caller.
pub(super) const HOUSEKEEPING_TIMEOUT: Duration = Duration::from_secs(15);

/// Exit codes that may come from the CLI rather than the program (daemon
/// error, command not invocable / not found) or from the OOM killer (137):
/// only the daemon's record of the container tells which.
const AMBIGUOUS_EXIT_CODES: &[i32] = &[125, 126, 127, 137];

/// One invocation of `<engine> run ...`.
pub(super) struct Invocation<'a> {
    pub engine: &'a Path,
    pub argv: Vec<String>,
    /// The container's name (as in `argv`).
    pub name: &'a str,
    pub stdin: Vec<u8>,
    pub deadline: Deadline,
    pub max_stdout: Option<u64>,
    pub max_stderr: Option<u64>,
}

/// How an invocation ended.
pub(super) enum Ended {
    /// The program ran; `exit_code` is its own.
    Exited { exit_code: i32, oom_killed: bool },
    /// The deadline passed and the container was killed.
    TimedOut,
    /// The engine failed before the program ran (no daemon, no image, bad mount...).
    EngineError(String),
}

pub(super) struct Finished {
    pub ended: Ended,
    pub stdout: CapturedStream,
    pub stderr: CapturedStream,
}

/// Runs one container to its end. Returns `Err` only if the CLI cannot be
/// spawned at all. The container is removed before this returns (by the
/// `reaper` for ordinary exits, here for kills).
pub(super) fn run(inv: Invocation<'_>, reaper: &super::reaper::Reaper) -> std::io::Result<Finished> {
    let mut command = engine_command(inv.engine);
    command.args(&inv.argv).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn()?;

    let (stdin, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let (eof_tx, eof_rx) = mpsc::channel::<()>();
    let (status, timed_out, out, err) = std::thread::scope(|scope| {
        if let Some(mut pipe) = stdin {
            let bytes = inv.stdin;
            // A program that exits without reading stdin closes the pipe: ignore EPIPE.
            scope.spawn(move || drop(pipe.write_all(&bytes)));
        }
        let capture = |pipe: Option<Box<dyn Read + Send>>, cap: Option<u64>| {
            let tx = eof_tx.clone();
            scope.spawn(move || {
                let mut buffer = BoundedBuffer::new(cap);
                if let Some(mut pipe) = pipe {
                    drain(&mut pipe, &mut buffer);
                }
                let _ = tx.send(());
                buffer
            })
        };
        let out = capture(stdout.map(|p| Box::new(p) as Box<dyn Read + Send>), inv.max_stdout);
        let err = capture(stderr.map(|p| Box::new(p) as Box<dyn Read + Send>), inv.max_stderr);
        drop(eof_tx);

        let exited = wait_for_eof(&eof_rx, 2, inv.deadline.remaining());
        let timed_out = !exited;
        if timed_out {
            // Kill on the daemon side: killing only the CLI would leave the
            // container running. Its streams end once it is gone.
            kill_container(inv.engine, inv.name);
            if !wait_for_eof(&eof_rx, 2, Some(KILL_GRACE)) {
                drop(child.kill());
            }
        }
        let status = wait_child(&mut child);
        let out = out.join().map(BoundedBuffer::into_captured).unwrap_or_default();
        let err = err.join().map(BoundedBuffer::into_captured).unwrap_or_default();
        (status, timed_out, out, err)
    });

    let ended = if timed_out {
        remove_now(inv.engine, inv.name);
        Ended::TimedOut
    } else {
        let ended = classify(inv.engine, inv.name, status, &err);
        reaper.remove(inv.name.to_string());
        ended
    };
    Ok(Finished { ended, stdout: out, stderr: err })
}

/// Reads a pipe to its end, keeping what fits the cap and counting the rest,
/// so the writer never blocks on a full pipe.
fn drain(pipe: &mut dyn Read, buffer: &mut BoundedBuffer) {
    let mut chunk = [0u8; 16 * 1024];
    loop {
        match pipe.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => buffer.write(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// Waits until `count` streams reached EOF; false if `limit` passed first.
fn wait_for_eof(rx: &mpsc::Receiver<()>, count: usize, limit: Option<Duration>) -> bool {
    let until = limit.map(|l| std::time::Instant::now() + l);
    for _ in 0..count {
        let got = match until {
            None => rx.recv().is_ok(),
            Some(until) => rx.recv_timeout(until.saturating_duration_since(std::time::Instant::now())).is_ok(),
        };
        if !got {
            return false;
        }
    }
    true
}

/// Reaps the CLI process; a CLI that outlives its closed streams is killed.
fn wait_child(child: &mut Child) -> Option<ExitStatus> {
    match wait_within(child, KILL_GRACE) {
        Ok(Some(status)) => Some(status),
        Ok(None) => {
            drop(child.kill());
            child.wait().ok()
        }
        Err(_) => None,
    }
}

/// Waits up to `limit` for `child` to exit; `None` if it still runs then.
/// Polls from 1 ms up to 20 ms apart (no signal handler in a library).
fn wait_within(child: &mut Child, limit: Duration) -> std::io::Result<Option<ExitStatus>> {
    let until = std::time::Instant::now() + limit;
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if std::time::Instant::now() >= until {
            return Ok(None);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// The CLI's exit code, checked against the daemon's record where it is
/// ambiguous.
fn classify(engine: &Path, name: &str, status: Option<ExitStatus>, stderr: &CapturedStream) -> Ended {
    let Some(code) = status.and_then(|s| s.code()) else {
        return Ended::EngineError(format!("the {} CLI was killed by a signal", engine.display()));
    };
    if !AMBIGUOUS_EXIT_CODES.contains(&code) {
        return Ended::Exited { exit_code: code, oom_killed: false };
    }
    let format = "--format={{.State.Status}} {{.State.ExitCode}} {{.State.OOMKilled}}";
    let inspected = bounded_output(engine_command(engine).args(["inspect", "--type=container", format, name]));
    let engine_error = || Ended::EngineError(String::from_utf8_lossy(&stderr.bytes).trim().to_string());
    let Some(output) = inspected.ok().filter(|o| o.status.success()) else {
        return engine_error();
    };
    let text = String::from_utf8_lossy(&output.stdout);
    let mut fields = text.split_whitespace();
    match (fields.next(), fields.next().and_then(|c| c.parse::<i32>().ok()), fields.next()) {
        (Some("exited"), Some(exit_code), oom) => Ended::Exited { exit_code, oom_killed: oom == Some("true") },
        _ => engine_error(),
    }
}

fn kill_container(engine: &Path, name: &str) {
    drop(quiet(engine, &["kill", "--signal=KILL", name]));
}

/// Removes a container and waits for it to be gone.
pub(super) fn remove_now(engine: &Path, name: &str) {
    drop(quiet(engine, &["rm", "--force", name]));
}

/// The engine CLI with only the environment it needs.
pub(super) fn engine_command(engine: &Path) -> Command {
    let mut command = Command::new(engine);
    command.env_clear().envs(CLI_ENV.iter().filter_map(|name| std::env::var_os(name).map(|value| (name, value))));
    command
}

/// Runs an engine subcommand, ignoring its output; whether it succeeded.
pub(super) fn quiet(engine: &Path, args: &[&str]) -> std::io::Result<bool> {
    bounded_output(engine_command(engine).args(args)).map(|o| o.status.success())
}

/// `Command::output` with [`HOUSEKEEPING_TIMEOUT`]: the command is killed
/// (and this fails with `TimedOut`) if it does not finish in time. Meant for
/// commands with small output, which fits the pipe buffers while waiting.
pub(super) fn bounded_output(command: &mut Command) -> std::io::Result<std::process::Output> {
    let mut child = command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    if wait_within(&mut child, HOUSEKEEPING_TIMEOUT)?.is_some() {
        return child.wait_with_output();
    }
    drop(child.kill());
    drop(child.wait());
    Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the container engine did not answer in time"))
}
