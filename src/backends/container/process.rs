//! One container run through the engine CLI: feed stdin, capture both streams
//! under their caps, enforce the deadline on the daemon side, classify the
//! exit. Removal is the caller's (the runner hands the container to its
//! reaper, off the request path): [`run`] says when through its `remove`
//! callback.
//!
//! **Time bound**: [`run`] returns at most [`KILL_GRACE`] after the deadline,
//! whatever the daemon does. At the deadline the container is killed on the
//! daemon side; if the kill and the CLI's exit take longer than the grace,
//! the CLI is killed and the container left to the reaper (and to its own
//! in-container timer, which fires at the deadline plus the same grace).

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::outputs::{Listing, ListingTap};
use crate::limits::child::ChildHandle;
use crate::limits::deadline::Deadline;
use crate::limits::output::{BoundedBuffer, OutputTap, StreamKind};
use crate::result::CapturedStream;
use crate::text;

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

/// The most a container run takes past its deadline: a guarantee.
///
/// At the deadline the container is killed on the daemon side; the daemon
/// and the CLI get this long to end it, then execbox stops waiting (the
/// container is left to the reaper and to its own timer) and returns, so
/// [`Backend::execute`](crate::backend::Backend::execute) on a
/// [`Container`](super::Container) returns at most this long after the
/// deadline whatever the engine does (a `docker kill` takes ~0.2 s). It is
/// also the margin of the in-container timer over the deadline: a container
/// whose host died stops by itself at the deadline plus this grace.
pub const KILL_GRACE: Duration = Duration::from_secs(2);

/// Longest an engine housekeeping command off the request path (remove,
/// sweep, availability) may take: a hung daemon must not hang anyone.
pub(super) const HOUSEKEEPING_TIMEOUT: Duration = Duration::from_secs(15);

/// Exit codes that may come from the CLI rather than the program (daemon
/// error, command not invocable / not found) or from the OOM killer (137):
/// only the daemon's record of the container tells which.
const AMBIGUOUS_EXIT_CODES: &[i32] = &[125, 126, 127, 137];

/// Largest output kept from a housekeeping command (`inspect`, `kill`).
const SMALL_OUTPUT: usize = 64 << 10;

/// One invocation of `<engine> run ...`.
pub(super) struct Invocation<'a> {
    pub engine: &'a Path,
    /// The CLI's arguments (unused with [`Invocation::started`]).
    pub argv: Vec<String>,
    /// A CLI spawned earlier and waiting (a warm container, `warm.rs`):
    /// this invocation feeds it and collects it rather than spawning one.
    pub started: Option<Spawned>,
    /// The end record both streams carry when the program has ended (a
    /// warm container's wrapper writes it): once both have it, the run is
    /// over without waiting for the engine to stop the container.
    pub end_nonce: Option<String>,
    /// The container's name (as in `argv`).
    pub name: &'a str,
    pub stdin: Vec<u8>,
    pub deadline: Deadline,
    pub max_stdout: Option<u64>,
    pub max_stderr: Option<u64>,
    pub tap: Option<OutputTap>,
    /// Takes the listing of `/work/out` out of stdout (a run that collects
    /// output files; see `outputs.rs`).
    pub listing: Option<ListingTap>,
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
    /// The listing of `/work/out`, if the run asked for one and it came.
    pub listing: Option<Listing>,
}

/// Runs one container to its end, or to its deadline plus [`KILL_GRACE`].
/// Returns `Err` only if the CLI cannot be spawned (or watched) at all.
/// Once the CLI has been spawned, whatever follows, `remove` gets the
/// container's name: a container may exist, and it is the caller's to
/// remove.
pub(super) fn run(mut inv: Invocation<'_>, remove: &dyn Fn(&str)) -> std::io::Result<Finished> {
    let Spawned { mut child, exit } = match inv.started.take() {
        Some(started) => started,
        None => match spawn(inv.engine, &inv.argv) {
            Ok(spawned) => spawned,
            Err(e) => {
                remove(inv.name);
                return Err(e);
            }
        },
    };

    let (stdin, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let (eof_tx, eof_rx) = mpsc::channel::<Option<i32>>();
    let (timed_out, status, out, err) = std::thread::scope(|scope| {
        if let Some(mut pipe) = stdin {
            let bytes = inv.stdin;
            // A program that exits without reading stdin closes the pipe: ignore EPIPE.
            scope.spawn(move || drop(pipe.write_all(&bytes)));
        }
        let capture = |pipe: Option<Box<dyn Read + Send>>,
                       cap: Option<u64>,
                       kind: StreamKind,
                       mut listing: Option<ListingTap>| {
            let tx = eof_tx.clone();
            let tap = inv.tap.clone();
            let mut end = inv.end_nonce.as_deref().map(EndTap::new);
            scope.spawn(move || {
                let mut buffer = BoundedBuffer::new(cap).tapped(tap, kind);
                let mut text = |chunk: &[u8]| match listing.as_mut() {
                    Some(listing) => listing.feed(chunk, &mut buffer),
                    None => buffer.write(chunk),
                };
                let mut pipe = pipe;
                if let Some(pipe) = pipe.as_mut() {
                    drain(pipe, &mut |chunk: &[u8]| match end.as_mut() {
                        Some(end) => end.feed(chunk, &mut text),
                        None => {
                            text(chunk);
                            true
                        }
                    });
                }
                let status = end.and_then(|end| end.finish(&mut text));
                let listing = listing.and_then(|listing| listing.finish(&mut buffer));
                let _ = tx.send(status);
                // After the end record nothing is the run's, but the pipe
                // stays read to its end (the CLI is killed, or exits, soon):
                // closed, it would cost the CLI a SIGPIPE on whatever comes
                // next (a forged record's real one), and the run a "killed
                // by a signal" engine error instead of the program's exit.
                if let Some(pipe) = pipe.as_mut() {
                    drain(pipe, &mut |_: &[u8]| true);
                }
                (buffer, listing)
            })
        };
        let stdout = stdout.map(|p| Box::new(p) as Box<dyn Read + Send>);
        let out = capture(stdout, inv.max_stdout, StreamKind::Stdout, inv.listing);
        let stderr = stderr.map(|p| Box::new(p) as Box<dyn Read + Send>);
        let err = capture(stderr, inv.max_stderr, StreamKind::Stderr, None);
        drop(eof_tx);

        let mut open_streams = 2;
        let mut recorded = Recorded::default();
        let mut status = wait_end(&mut child, &exit, &eof_rx, &mut open_streams, &mut recorded, &inv.deadline);
        let timed_out = status.is_none();
        if timed_out {
            // Kill on the daemon side: killing only the CLI would leave the
            // container running. Its streams end once it is gone.
            let grace = Deadline::start(Some(KILL_GRACE));
            kill_container(inv.engine, inv.name, KILL_GRACE);
            status = wait_end(&mut child, &exit, &eof_rx, &mut open_streams, &mut recorded, &grace);
            if status.is_none() {
                // The daemon did not answer in time. Stop waiting for it:
                // the reaper removes the container, its own timer stops it.
                tracing::warn!(container = inv.name, "the engine did not end a timed-out container within the grace");
                kill_group(&mut child);
                status = child.wait().ok().map(Status::Exited);
            }
        }
        let (out, listing) = out.join().map(|(b, listing)| (b.into_captured(), listing)).unwrap_or_default();
        let err = err.join().map(|(b, _)| b.into_captured()).unwrap_or_default();
        (timed_out, status, (out, listing), err)
    });
    let (out, listing) = out;

    let ended = if timed_out {
        Ended::TimedOut
    } else if let Some(Status::Recorded(exit_code)) = status {
        Ended::Exited { exit_code, oom_killed: false }
    } else {
        let limit = inv.deadline.remaining().map_or(HOUSEKEEPING_TIMEOUT, |left| left.saturating_add(KILL_GRACE));
        let status = match status {
            Some(Status::Exited(status)) => Some(status),
            _ => None,
        };
        classify(inv.engine, inv.name, status, &err, limit)
    };
    remove(inv.name);
    Ok(Finished { ended, stdout: out, stderr: err, listing })
}

/// How the program's end was known.
enum Status {
    /// The CLI exited with this status.
    Exited(ExitStatus),
    /// Both streams carried the end record with this exit code, which needs
    /// no daemon record to be read (see [`AMBIGUOUS_EXIT_CODES`]): the CLI
    /// was not waited for, and was killed (the container goes to the reaper).
    Recorded(i32),
}

/// The end records the streams carried so far (a warm container's).
#[derive(Default)]
struct Recorded {
    codes: Vec<i32>,
}

impl Recorded {
    /// The program's exit code once both streams carry the same
    /// unambiguous one.
    fn settled(&self) -> Option<i32> {
        match self.codes.as_slice() {
            [a, b] if a == b && !AMBIGUOUS_EXIT_CODES.contains(a) => Some(*a),
            _ => None,
        }
    }
}

/// Waits, within `deadline`, until both streams reached EOF or their end
/// record (counted down in `open`, the records kept in `recorded`) and the
/// CLI exited: a program that closed its streams and runs on has not ended.
/// With both end records (an unambiguous code), the CLI is not waited for:
/// it is killed, and the container left to the caller's removal. `None` if
/// the deadline passed first.
fn wait_end(
    child: &mut Child,
    exit: &ChildHandle,
    eof: &mpsc::Receiver<Option<i32>>,
    open: &mut usize,
    recorded: &mut Recorded,
    deadline: &Deadline,
) -> Option<Status> {
    while *open > 0 {
        let left = deadline.remaining().unwrap_or(Duration::MAX);
        match eof.recv_timeout(left) {
            Ok(code) => {
                *open -= 1;
                recorded.codes.extend(code);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => *open = 0,
            Err(mpsc::RecvTimeoutError::Timeout) => return None,
        }
    }
    if let Some(code) = recorded.settled() {
        // The engine's teardown of the container (tens of ms) is not the
        // caller's wait: the CLI goes now, the container to the reaper.
        kill_group(child);
        drop(child.wait());
        return Some(Status::Recorded(code));
    }
    wait_until(child, exit, until(deadline.remaining())).ok().flatten().map(Status::Exited)
}

/// A spawned `<engine> run` CLI, its stdio piped, watched by a pidfd.
pub(super) struct Spawned {
    pub child: Child,
    pub exit: ChildHandle,
}

/// Spawns `<engine> <argv>` with piped stdio (see [`engine_command`]).
pub(super) fn spawn(engine: &Path, argv: &[String]) -> std::io::Result<Spawned> {
    let mut command = engine_command(engine);
    command.args(argv).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn()?;
    let exit = watch(&mut child)?;
    Ok(Spawned { child, exit })
}

/// Takes a warm container's end record, `\0execbox:<nonce>:Z<ddd>\n`
/// (`<ddd>`: the program's exit code, three digits), out of one stream: the
/// bytes before it are the stream's text, and the stream is over with it.
/// The program can write the record itself (the nonce is on its wrapper's
/// command line); it then only ends its own run early, with its own output,
/// and its container is removed all the same.
pub(super) struct EndTap {
    marker: Vec<u8>,
    /// Bytes of a possible record matched so far.
    held: Vec<u8>,
    code: Option<i32>,
}

impl EndTap {
    fn new(nonce: &str) -> Self {
        let mut marker = crate::limits::records::marker(nonce);
        marker.push(b'Z');
        Self { marker, held: Vec::new(), code: None }
    }

    /// Feeds bytes read from the stream; its text goes to `text`. False once
    /// the record is complete (nothing after it is read).
    fn feed(&mut self, bytes: &[u8], text: &mut dyn FnMut(&[u8])) -> bool {
        let whole = self.marker.len() + 4;
        let mut i = 0;
        while i < bytes.len() {
            if self.held.is_empty() {
                // The marker starts with the only NUL it holds.
                match bytes[i..].iter().position(|&b| b == 0) {
                    None => {
                        text(&bytes[i..]);
                        return true;
                    }
                    Some(at) => {
                        text(&bytes[i..i + at]);
                        i += at + 1;
                        self.held.push(0);
                        continue;
                    }
                }
            }
            let b = bytes[i];
            let at = self.held.len();
            let fits = match at {
                _ if at < self.marker.len() => b == self.marker[at],
                _ if at < whole - 1 => b.is_ascii_digit(),
                _ => b == b'\n',
            };
            if !fits {
                // Not the record: what was held is text; this byte is looked
                // at again (it may open a record).
                text(&self.held);
                self.held.clear();
                continue;
            }
            self.held.push(b);
            i += 1;
            if self.held.len() == whole {
                let digits = &self.held[self.marker.len()..whole - 1];
                // An exit status is at most 255: anything else is not a
                // record (only a program can have written it) but text.
                match std::str::from_utf8(digits).ok().and_then(|d| d.parse::<i32>().ok()).filter(|c| *c <= 255) {
                    Some(code) => {
                        self.code = Some(code);
                        return false;
                    }
                    None => {
                        text(&self.held);
                        self.held.clear();
                    }
                }
            }
        }
        true
    }

    /// At the stream's end: the exit code if the record came (what was held
    /// of an unfinished one is text).
    fn finish(mut self, text: &mut dyn FnMut(&[u8])) -> Option<i32> {
        if self.code.is_none() && !self.held.is_empty() {
            text(&std::mem::take(&mut self.held));
        }
        self.code
    }
}

/// Reads a pipe to its end, handing each chunk to `sink` (which keeps what
/// fits its caps and counts the rest), so the writer never blocks on a full
/// pipe; stops early when `sink` returns false.
fn drain(pipe: &mut dyn Read, sink: &mut dyn FnMut(&[u8]) -> bool) {
    let mut chunk = [0u8; 16 * 1024];
    loop {
        match pipe.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => {
                if !sink(&chunk[..n]) {
                    return;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// A pidfd on a just-spawned CLI, to wait for its exit without polling. If
/// none can be opened, the CLI is killed and reaped (it is still this
/// process's unreaped child, so its pid names it) and the error returned.
fn watch(child: &mut Child) -> std::io::Result<ChildHandle> {
    ChildHandle::of(child).inspect_err(|_| {
        kill_group(child);
        drop(child.wait());
    })
}

/// The instant `left` from now; `None` (no bound) for no limit or one past
/// what an `Instant` can hold.
fn until(left: Option<Duration>) -> Option<Instant> {
    left.and_then(|left| Instant::now().checked_add(left))
}

/// Waits until `child` (watched by `exit`) has exited, or `until` passes:
/// its status, or `None` if it still runs then. A `poll` on the pidfd, not a
/// sleep loop.
fn wait_until(child: &mut Child, exit: &ChildHandle, until: Option<Instant>) -> std::io::Result<Option<ExitStatus>> {
    if !exit.wait_exit(until) {
        return Ok(None);
    }
    child.try_wait()
}

/// The CLI's exit code, checked against the daemon's record where it is
/// ambiguous (the `inspect` bounded by `limit`).
pub(super) fn classify(
    engine: &Path,
    name: &str,
    status: Option<ExitStatus>,
    stderr: &CapturedStream,
    limit: Duration,
) -> Ended {
    let engine_error = || Ended::EngineError(text::cap_message(stderr.text().trim().to_string()));
    let Some(code) = status.and_then(|s| s.code()) else {
        return Ended::EngineError(format!("the {} CLI was killed by a signal", engine.display()));
    };
    if !AMBIGUOUS_EXIT_CODES.contains(&code) {
        return Ended::Exited { exit_code: code, oom_killed: false };
    }
    let format = "--format={{.State.Status}} {{.State.ExitCode}} {{.State.OOMKilled}}";
    let inspected =
        bounded_output(engine_command(engine).args(["inspect", "--type=container", format, name]), limit, SMALL_OUTPUT);
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

/// Kills an engine CLI and whatever it started in its process group (see
/// [`engine_command`]): anything still holding its pipes would keep the
/// stream readers waiting.
pub(super) fn kill_group(child: &mut Child) {
    kill_process_group(child.id());
    drop(child.kill());
}

/// `SIGKILL` to the process group `pgid` (a CLI this process spawned in a
/// group of its own, not yet reaped); a group already gone is no error.
pub(super) fn kill_process_group(pgid: u32) {
    if let Some(pgid) = i32::try_from(pgid).ok().and_then(rustix::process::Pid::from_raw) {
        let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
    }
}

pub(super) fn kill_container(engine: &Path, name: &str, limit: Duration) {
    drop(quiet(engine, &["kill", "--signal=KILL", name], limit));
}

/// The engine CLI with only the environment it needs, in a process group of
/// its own: a terminal's Ctrl-C reaches the host process (which cleans up),
/// not the CLIs it runs.
pub(super) fn engine_command(engine: &Path) -> Command {
    let mut command = Command::new(engine);
    command.env_clear().envs(CLI_ENV.iter().filter_map(|name| std::env::var_os(name).map(|value| (name, value))));
    command.process_group(0);
    command
}

/// Runs an engine subcommand within `limit`, ignoring its output; whether it succeeded.
pub(super) fn quiet(engine: &Path, args: &[&str], limit: Duration) -> std::io::Result<bool> {
    bounded_output(engine_command(engine).args(args), limit, SMALL_OUTPUT).map(|o| o.status.success())
}

/// `Command::output` within `limit`, keeping at most `max_bytes` of each
/// stream (the rest is read and dropped, so the command never blocks on a
/// full pipe). The command is killed, and this fails with `TimedOut`, if it
/// does not finish in time.
pub(super) fn bounded_output(command: &mut Command, limit: Duration, max_bytes: usize) -> std::io::Result<Output> {
    let mut child = command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let exit = watch(&mut child)?;
    let pipes = [
        child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>),
        child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>),
    ];
    std::thread::scope(|scope| {
        let [out, err] = pipes.map(|pipe| {
            scope.spawn(move || {
                let mut buffer = BoundedBuffer::new(Some(max_bytes as u64));
                if let Some(mut pipe) = pipe {
                    drain(&mut pipe, &mut |chunk: &[u8]| {
                        buffer.write(chunk);
                        true
                    });
                }
                buffer.into_captured().bytes
            })
        });
        let status = match wait_until(&mut child, &exit, until(Some(limit))) {
            Ok(Some(status)) => Ok(status),
            finished => {
                kill_group(&mut child);
                drop(child.wait());
                Err(finished.err().unwrap_or_else(|| {
                    std::io::Error::new(std::io::ErrorKind::TimedOut, "the container engine did not answer in time")
                }))
            }
        };
        let (stdout, stderr) = (out.join().unwrap_or_default(), err.join().unwrap_or_default());
        status.map(|status| Output { status, stdout, stderr })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `chunks` to an end tap: the text, and the code if a record came.
    fn tap(chunks: &[&[u8]]) -> (Vec<u8>, Option<i32>) {
        let mut end = EndTap::new("n1");
        let mut text = Vec::new();
        for chunk in chunks {
            if !end.feed(chunk, &mut |t: &[u8]| text.extend_from_slice(t)) {
                break;
            }
        }
        let code = end.finish(&mut |t: &[u8]| text.extend_from_slice(t));
        (text, code)
    }

    #[test]
    fn an_end_record_holds_an_exit_status_or_is_text() {
        assert_eq!(tap(&[b"hi\0execbox:n1:Z007\n", b"after"]), (b"hi".to_vec(), Some(7)));
        // Split across reads, byte by byte.
        let record = b"\0execbox:n1:Z255\n";
        let bytes: Vec<&[u8]> = record.chunks(1).collect();
        assert_eq!(tap(&bytes), (Vec::new(), Some(255)));
        // No exit status is over 255: a program wrote that, and it is text.
        let (text, code) = tap(&[b"\0execbox:n1:Z999\nmore\0execbox:n1:Z003\n"]);
        assert_eq!((text.as_slice(), code), (b"\0execbox:n1:Z999\nmore".as_slice(), Some(3)));
        // Another nonce, a sign, a missing newline: text.
        for fake in [&b"\0execbox:n2:Z000\n"[..], b"\0execbox:n1:Z-01\n", b"\0execbox:n1:Z000x"] {
            assert_eq!(tap(&[fake]), (fake.to_vec(), None), "{fake:?}");
        }
    }

    #[test]
    fn bounded_output_waits_on_the_pidfd_and_kills_what_overruns() {
        let out = bounded_output(Command::new("/bin/sh").args(["-c", "echo hi"]), Duration::from_secs(10), 1024)
            .expect("runs");
        assert_eq!((out.status.success(), out.stdout.as_slice()), (true, b"hi\n".as_slice()));
        let started = Instant::now();
        // The grandchild holds the pipes too: killing the group ends it.
        let err = bounded_output(
            Command::new("/bin/sh").args(["-c", "sleep 30 & sleep 30"]).process_group(0),
            Duration::from_millis(200),
            1024,
        )
        .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    }
}
