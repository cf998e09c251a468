//! Programs in containers: every program of a workspace runs in one
//! locked-down container, the workspace's *machine*, which execbox starts
//! with the workspace's first program and removes when the workspace goes.
//!
//! One container per workspace is what makes programs useful together: a
//! server started by one program is reached from another over loopback,
//! and the memory, process and CPU caps (its cgroup) hold for all of them
//! at once. It gets the same locked flags as a one-shot run (no network
//! unless the policy grants it, no capabilities, execbox's seccomp profile,
//! the code's user), the workspace read-write at `/work`, and as its first
//! process the in-container timer around the supervisor
//! (`conventions/supervisor.py`), which the host drives over the attached
//! stdin and stdout in JSON lines: start, write, end of input, signal, kill;
//! started, output, exit.
//!
//! The supervisor runs each program under a subreaper shim, so a program's
//! processes (a double-forked daemon too) end with it. It is not a trust
//! boundary: a program can stop or kill it, which ends its own workspace's
//! programs and nothing else. The host believes only bounded lines, and
//! every write to it has a deadline; a machine that stops answering is
//! removed. End of its stdin (the host gone) makes the supervisor kill every
//! program and exit, and the container dies with its host like every other
//! (the watcher and the sweep, see `owners.rs`); its whole life is bounded
//! by [`ContainerConfig::session_lifetime`](super::ContainerConfig::session_lifetime).

use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Component, Path};
use std::process::{Child, ChildStdin};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::Deserialize;

use super::process;
use super::runner::Runner;
use super::staging::Staging;
use crate::error::ExecError;
use crate::language::Language;
use crate::limits::write::{Endpoint, set_nonblocking, write_all_until};
use crate::policy::SandboxPolicy;
use crate::program::{Program, ProgramControl, ProgramError, ProgramOp, ProgramSpec, ProgramState};
use crate::request::ExecRequest;
use crate::violation::{Control, Violation};
use crate::workspace::{GUEST_PATH, Workspace};

/// The supervisor's source (run by `python3 -c`).
const SUPERVISOR: &str = include_str!("../conventions/supervisor.py");

/// How long the machine may take to start and say it is ready.
const OPEN_LIMIT: Duration = Duration::from_secs(60);

/// How long a write to the supervisor may wait for room.
const WRITE_LIMIT: Duration = Duration::from_secs(5);

/// The longest line the host reads from the supervisor (64 KiB of output in
/// base64, and the JSON around it).
const MAX_LINE: u64 = 128 << 10;

/// Programs one machine runs at once.
pub const MAX_PROGRAMS: usize = 16;

/// The name programs report in refusals.
pub const NAME: &str = "container-programs";

/// A workspace's machine. See the module docs.
pub(super) struct Machine {
    runner: Arc<Runner>,
    name: String,
    shared: Arc<Shared>,
    input: Mutex<Option<ChildStdin>>,
    cli: Mutex<Child>,
    staging: Option<Staging>,
    next_id: AtomicU64,
    /// What its container was started with: a later program may not ask
    /// for less, or for another network or filesystem.
    policy: SandboxPolicy,
    /// Its image is the data image (its first program declared packages).
    packages: bool,
    memory_bytes: u64,
    pids: u64,
    /// Handed to each program: the machine, as long as it is there.
    this: Weak<Machine>,
    /// When its in-container timer ends it.
    ends_at: Instant,
}

/// What the reader thread and the machine share.
struct Shared {
    programs: Mutex<HashMap<u64, Arc<ProgramState>>>,
    alive: AtomicBool,
    ready: Mutex<Option<bool>>,
    readied: Condvar,
    /// The last of the container's stderr, for an error message.
    stderr_tail: Mutex<Vec<u8>>,
}

impl Shared {
    /// The machine is gone: every program still running ends, killed.
    fn lose(&self) {
        self.alive.store(false, Ordering::SeqCst);
        self.set_ready(false);
        let programs: Vec<_> = self.programs.lock().drain().map(|(_, state)| state).collect();
        for state in programs {
            state.ended(None);
        }
    }

    fn set_ready(&self, ready: bool) {
        self.ready.lock().get_or_insert(ready);
        self.readied.notify_all();
    }
}

/// One line from the supervisor.
#[derive(Deserialize)]
#[serde(tag = "e", rename_all = "snake_case")]
enum Event {
    Ready,
    Started {},
    Failed { id: u64, error: String },
    Out { id: u64, data: String },
    Exit { id: u64, code: Option<i32> },
    InputDropped { id: u64, bytes: u64, why: String },
    Error { error: String },
}

impl Machine {
    /// Starts the machine of `workspace` under `first`'s policy (its caps,
    /// network and granted directories) and in the image that has its
    /// packages, and waits until its supervisor is ready.
    pub fn open(runner: Arc<Runner>, workspace: &Workspace, first: &ExecRequest) -> Result<Arc<Self>, ExecError> {
        let unavailable = |reason: String| ExecError::unavailable(NAME, reason);
        runner.check_available(super::runner::NAME)?;
        let cfg = runner.config();
        let mut template = ExecRequest::source(Language::Shell, "").policy(first.policy.clone());
        template.workspace = Some(workspace.clone());
        template.packages = first.packages.clone();
        let memory_bytes = *template.policy.memory_bytes.get_or_insert(cfg.session_memory_bytes);
        let pids = *template.policy.max_processes.get_or_insert(cfg.default_pids);
        let staging = Staging::for_workspace(workspace)?;
        let command = vec!["/usr/bin/python3".to_string(), "-c".to_string(), SUPERVISOR.to_string()];
        let image = runner.script_image(&template);
        let mut spec = runner.spec(&template, &staging, image, command, cfg.session_lifetime)?;
        spec.role = "programs";
        let mut child = process::spawn(&cfg.engine, &spec.argv())
            .map_err(|e| unavailable(format!("cannot run {}: {e}", cfg.engine.display())))?
            .child;
        let shared = Arc::new(Shared {
            programs: Mutex::new(HashMap::new()),
            alive: AtomicBool::new(true),
            ready: Mutex::new(None),
            readied: Condvar::new(),
            stderr_tail: Mutex::new(Vec::new()),
        });
        let stdin = child.stdin.take();
        if let Some(Err(e)) = stdin.as_ref().map(set_nonblocking) {
            tracing::warn!(error = %e, "cannot make a program machine's stdin non-blocking");
        }
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let ends_at = Instant::now() + cfg.session_lifetime;
        let machine = Arc::new_cyclic(|this| Self {
            runner,
            name: spec.name.clone(),
            shared: shared.clone(),
            input: Mutex::new(stdin),
            cli: Mutex::new(child),
            staging: Some(staging),
            next_id: AtomicU64::new(1),
            policy: template.policy.clone(),
            packages: !template.packages.is_empty(),
            memory_bytes,
            pids,
            this: this.clone(),
            ends_at,
        });
        let readers = [
            stdout.map(|out| {
                let shared = shared.clone();
                Box::new(move || read_events(out, &shared)) as Box<dyn FnOnce() + Send>
            }),
            stderr.map(|err| {
                let shared = shared.clone();
                Box::new(move || read_stderr(err, &shared)) as Box<dyn FnOnce() + Send>
            }),
        ];
        for reader in readers.into_iter().flatten() {
            // Detached: each ends when the container's stream does.
            let spawned =
                std::thread::Builder::new().name("execbox-programs-io".into()).stack_size(128 << 10).spawn(reader);
            if let Err(e) = spawned {
                return Err(unavailable(format!("cannot start a reader thread: {e}")));
            }
        }
        let until = Instant::now() + OPEN_LIMIT;
        let mut ready = shared.ready.lock();
        while ready.is_none() {
            if shared.readied.wait_until(&mut ready, until).timed_out() {
                break;
            }
        }
        if *ready != Some(true) {
            drop(ready);
            let tail = String::from_utf8_lossy(&shared.stderr_tail.lock()).into_owned();
            return Err(unavailable(crate::text::cap_message(format!(
                "the workspace's program container did not start: {}",
                tail.trim()
            ))));
        }
        Ok(machine)
    }

    /// What `request` asks that this machine, fixed when it started, cannot
    /// give: lower memory or process caps, another network or filesystem,
    /// packages its image lacks.
    pub fn refusals(&self, request: &ExecRequest) -> Vec<Violation> {
        let mut violations = Vec::new();
        let policy = &request.policy;
        let fixed = |control, requested: String, reason: String| Violation { control, requested, reason };
        if let Some(asked) = policy.memory_bytes.filter(|asked| *asked < self.memory_bytes) {
            violations.push(fixed(
                Control::Memory,
                format!("{asked} bytes"),
                format!(
                    "the workspace's programs share a cap of {} bytes, fixed by its first program",
                    self.memory_bytes
                ),
            ));
        }
        if let Some(asked) = policy.max_processes.filter(|asked| *asked < self.pids) {
            violations.push(fixed(
                Control::Processes,
                format!("{asked} processes"),
                format!("the workspace's programs share a cap of {} processes, fixed by its first program", self.pids),
            ));
        }
        if policy.network != self.policy.network {
            violations.push(fixed(
                Control::Network,
                format!("{:?}", policy.network),
                "the workspace's programs share the network of its first program".into(),
            ));
        }
        if policy.filesystem != self.policy.filesystem {
            violations.push(fixed(
                Control::Filesystem,
                format!("{:?}", policy.filesystem),
                "the workspace's programs share the granted directories of its first program".into(),
            ));
        }
        if !request.packages.is_empty() && !self.packages {
            violations.push(fixed(
                Control::Packages,
                crate::text::list_names(&request.packages),
                "the workspace's container was started by a program without packages, in the image without them; \
                 declare them on its first program (or on the workspace)"
                    .into(),
            ));
        }
        violations
    }

    /// Whether its container still runs.
    pub fn is_alive(&self) -> bool {
        self.shared.alive.load(Ordering::SeqCst)
    }

    /// Starts `spec` (held and matched as `request`) in this machine.
    pub fn start(&self, request: &ExecRequest, spec: &ProgramSpec) -> Result<Program, ExecError> {
        let refuse = |reason: String| ExecError::unavailable(NAME, reason);
        if !self.is_alive() {
            return Err(refuse("the workspace's program container is gone".into()));
        }
        let cwd = guest_cwd(spec.cwd.as_deref())?;
        let argv = spec.command.argv();
        if argv.first().is_none_or(String::is_empty) {
            return Err(crate::error::InvalidRequest::BadPath {
                path: "<command>".into(),
                reason: "the command is empty".into(),
            }
            .into());
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let state = ProgramState::new(spec.max_output_bytes);
        {
            let mut programs = self.shared.programs.lock();
            if programs.len() >= MAX_PROGRAMS {
                return Err(refuse(format!(
                    "the workspace runs {MAX_PROGRAMS} programs already: kill one, or wait for one to end"
                )));
            }
            programs.insert(id, state.clone());
        }
        let mut env = request.env.clone();
        env.entry("HOME".into()).or_insert_with(|| "/tmp".into());
        if spec.tty {
            env.entry("TERM".into()).or_insert_with(|| "xterm".into());
        }
        let line = serde_json::json!({
            "op": "start", "id": id, "argv": argv, "cwd": cwd, "env": env, "tty": spec.tty,
        });
        if let Err(e) = self.send_line(&line) {
            self.shared.programs.lock().remove(&id);
            return Err(refuse(e.to_string()));
        }
        // Not past the container's own end (its in-container timer).
        let lifetime = spec.lifetime.min(self.ends_at.saturating_duration_since(Instant::now()));
        let link: Arc<dyn ProgramControl> = Arc::new(Link(self.this.clone()));
        Ok(Program::start(id, spec.tty, state, link, lifetime))
    }

    /// Writes one JSON line to the supervisor, within [`WRITE_LIMIT`]; a
    /// supervisor that does not take it loses the machine.
    fn send_line(&self, line: &serde_json::Value) -> Result<(), ProgramError> {
        let mut bytes = serde_json::to_vec(line).map_err(|e| ProgramError::Lost(e.to_string()))?;
        bytes.push(b'\n');
        let input = self.input.lock();
        let Some(stdin) = input.as_ref().filter(|_| self.is_alive()) else {
            return Err(ProgramError::Lost("the workspace's program container is gone".into()));
        };
        if let Err(e) = write_all_until(stdin, Endpoint::Pipe, &bytes, Some(Instant::now() + WRITE_LIMIT)) {
            drop(input);
            self.abandon();
            return Err(ProgramError::Lost(format!("its supervisor does not read ({e:?}); the container was removed")));
        }
        Ok(())
    }

    /// Ends the machine now: its programs end, killed; the container goes.
    fn abandon(&self) {
        self.shared.lose();
        drop(self.input.lock().take());
        process::kill_group(&mut self.cli.lock());
        self.runner.reaper().remove(self.name.clone());
    }
}

impl Drop for Machine {
    /// Closes the supervisor's stdin (it kills every program and exits),
    /// removes the container (by the reaper), ends the CLI and hands the
    /// staging directory over for removal.
    fn drop(&mut self) {
        self.abandon();
        let _ = self.cli.get_mut().wait();
        if let Some(staging) = self.staging.take() {
            self.runner.reaper().discard(staging.into_dir());
        }
    }
}

/// A program's way to its machine: gone once the workspace is.
struct Link(Weak<Machine>);

impl ProgramControl for Link {
    fn send(&self, id: u64, op: ProgramOp) -> Result<(), ProgramError> {
        let machine = self.0.upgrade().ok_or_else(|| ProgramError::Lost("its workspace was closed".into()))?;
        let line = match op {
            ProgramOp::Write(data) => serde_json::json!({"op": "write", "id": id, "data": BASE64.encode(data)}),
            ProgramOp::Eof => serde_json::json!({"op": "eof", "id": id}),
            ProgramOp::Signal(sig) => serde_json::json!({"op": "signal", "id": id, "sig": sig}),
            ProgramOp::Kill => serde_json::json!({"op": "kill", "id": id}),
        };
        machine.send_line(&line)
    }

    fn abandon(&self) {
        if let Some(machine) = self.0.upgrade() {
            machine.abandon();
        }
    }
}

/// `/work`, or `/work/<cwd>` for a relative path without `..`.
fn guest_cwd(cwd: Option<&str>) -> Result<String, ExecError> {
    let Some(cwd) = cwd.filter(|c| !c.is_empty() && *c != ".") else { return Ok(GUEST_PATH.into()) };
    let relative = match cwd.strip_prefix(GUEST_PATH) {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => rest.trim_start_matches('/'),
        _ => cwd,
    };
    if relative.is_empty() {
        return Ok(GUEST_PATH.into());
    }
    let fine = Path::new(relative).components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if !fine || relative.contains('\0') {
        return Err(crate::error::InvalidRequest::BadPath {
            path: cwd.into(),
            reason: "a program's directory is a path relative to the workspace (or under /work), without `..`".into(),
        }
        .into());
    }
    Ok(format!("{GUEST_PATH}/{relative}"))
}

/// Reads the supervisor's events into the programs' states until the
/// container's stdout ends (or breaks the protocol): then the machine is lost.
fn read_events(stdout: impl Read, shared: &Shared) {
    let mut reader = BufReader::new(stdout);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.by_ref().take(MAX_LINE).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) if line.last() != Some(&b'\n') => {
                tracing::warn!("a program supervisor wrote a line past the limit; its container is removed");
                break;
            }
            Ok(_) => {}
        }
        let Ok(event) = serde_json::from_slice::<Event>(&line) else {
            tracing::warn!("a program supervisor wrote a line that is not an event; ignored");
            continue;
        };
        let state = |id: u64| shared.programs.lock().get(&id).cloned();
        match event {
            Event::Ready => shared.set_ready(true),
            Event::Started { .. } => {}
            Event::Failed { id, error } => {
                if let Some(state) = state(id) {
                    state.output(format!("execbox: the program did not start: {error}\n").as_bytes());
                }
            }
            Event::Out { id, data } => {
                if let (Some(state), Ok(bytes)) = (state(id), BASE64.decode(data)) {
                    state.output(&bytes);
                }
            }
            Event::Exit { id, code } => {
                if let Some(state) = shared.programs.lock().remove(&id) {
                    state.ended(code);
                }
            }
            Event::InputDropped { id, bytes, why } => {
                if let Some(state) = state(id) {
                    state.input_dropped(bytes, why == "closed");
                }
            }
            Event::Error { error } => tracing::warn!(error, "a program supervisor refused a line"),
        }
    }
    shared.lose();
}

/// Keeps the last 4 KiB of the container's stderr (the engine's errors).
fn read_stderr(mut stderr: impl Read, shared: &Shared) {
    let mut buf = [0u8; 4096];
    while let Ok(n) = stderr.read(&mut buf) {
        if n == 0 {
            break;
        }
        let mut tail = shared.stderr_tail.lock();
        tail.extend_from_slice(&buf[..n]);
        let excess = tail.len().saturating_sub(4096);
        tail.drain(..excess);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_directory_stays_inside_the_workspace() {
        assert_eq!(guest_cwd(None).unwrap(), "/work");
        assert_eq!(guest_cwd(Some("src/app")).unwrap(), "/work/src/app");
        assert_eq!(guest_cwd(Some("/work/src")).unwrap(), "/work/src");
        assert_eq!(guest_cwd(Some("/work")).unwrap(), "/work");
        for bad in ["../etc", "/etc", "a/../../b", "/work/../x", "/workx", "/"] {
            assert!(guest_cwd(Some(bad)).is_err(), "{bad}");
        }
    }
}
