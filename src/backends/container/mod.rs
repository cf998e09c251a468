//! The `container` backend: Python, shell and Rust in a fresh, locked-down
//! container per call, through the `docker` or `podman` CLI (no SDK).
//!
//! Build one with [`Container::new`] (or [`Container::default`]: docker,
//! default settings); its settings are a [`ContainerConfig`].
//!
//! Every run gets the flags of [`RunSpec::argv`] (see [`Container::plan`]):
//! no network, read-only root filesystem with a size-capped `/tmp` tmpfs,
//! `--memory` = `--memory-swap`,
//! `--cpus`, `--pids-limit`, an unprivileged user, no capabilities,
//! `no-new-privileges`, execbox's own seccomp profile (not the engine's
//! default, which differs between engine versions: see `seccomp.rs`), no
//! IPC namespace sharing, no log driver, and an explicit name so a timeout
//! kills the container on the daemon side.
//!
//! What the code sees:
//! - `/work` (read-only, the working directory): `input.json` holding the
//!   request's JSON `input`, and the staged input files;
//! - `/work/out` (only when the request collects output files): a tmpfs
//!   inside the container, capped by the kernel at
//!   [`ContainerConfig::max_output_total_bytes`] and 32,768 entries (a write
//!   past either fails with `ENOSPC`; nothing of it is on the host). Regular
//!   files left there when the program ends come back as `output_files`,
//!   within [`ContainerConfig::max_output_files`] and the byte caps beside
//!   it; symlinks and special files are never followed, and no more than
//!   10,000 entries, 16 directories deep, are looked at (the result's
//!   `message` says what was left out). They are listed inside the
//!   container when the program ends, within the run's deadline (a run
//!   that times out returns none; the listing's shell is one of the run's
//!   processes);
//! - `/tmp`: a private tmpfs; `/opt/execbox/stop`: a tiny one holding the
//!   in-container timer's copy; nothing else is writable.
//!
//! Per language:
//! - **Python**: the code arrives on stdin and runs as `__main__` with the
//!   global `input` bound to the JSON input (`None` without one).
//! - **Shell**: the script arrives on stdin to `sh -s`.
//! - **Rust**: `fn run(input: serde_json::Value) -> serde_json::Value`,
//!   compiled inside a sandbox (see [`RustConfig`]), then run with the input
//!   as JSON on stdin; its result is printed as JSON.
//!
//! **Structured output** (every language): when the whole stdout is one JSON
//! value and was not truncated, it becomes `output`.
//!
//! **Code Mode** (every language, sessions included): a run whose policy
//! grants tools gets a Unix socket bind-mounted read-only at
//! `/run/execbox/tools.sock` (its path also in `$EXECBOX_TOOLS`), through
//! which its code calls exactly the granted tools (see `tool_socket.rs` for
//! the wire and its bounds):
//! - **Python**: `import tools`; `tools.ns.name(**kwargs)`, `from tools.ns
//!   import name`, `tools.call("ns.tool", {...})`, `tools.list()`,
//!   `tools.describe("ns.tool")`; failures raise `tools.ToolError`
//!   (`.tool`, `.kind`, `.message`) — the same module as CPython-in-wasm's;
//! - **Shell**: `tool ns.name '{"a": 1}'` (or `-` to read the arguments from
//!   stdin) prints the value as one line of JSON and exits 0, or prints the
//!   error as JSON (`{"tool", "kind", "message"}`) on stderr and exits 1;
//! - **Rust**: `tools::call("ns.tool", json!({...})) -> Result<Value,
//!   tools::ToolError>`, `tools::list()`, `tools::describe(..)` (in scope
//!   like `Value`); any program may also speak the wire itself over
//!   `std::os::unix::net::UnixStream`.
//!
//! A run that grants no tools gets no socket, no variable and no `tool`
//! command: its `run` arguments are exactly what they were without Code
//! Mode. Calls are synchronous in Python (one in flight per process), the
//! shell and the Rust module; the wire allows several in flight.
//!
//! **Lifetime**: a container never outlives its deadline plus a grace, even
//! if the host process dies: the host kills it at the deadline, its first
//! process (an in-container timer) kills its command at the deadline plus
//! [`KILL_GRACE`], and what a dead host left is removed by its watcher or by
//! the next process's sweep (see `owners.rs`). `execute` itself returns at
//! most `KILL_GRACE` after the deadline. [`Container::shutdown`] is for a
//! host about to exit on a signal.

mod argv;
mod config;
pub(crate) mod outputs;
mod owners;
mod process;
mod programs;
mod reaper;
mod runner;
pub(crate) mod rust;
mod seccomp;
mod session;
mod staging;
mod tool_socket;
mod warm;

use std::sync::Arc;
use std::time::Duration;

pub use crate::hostfs::{OutputDir, SaveError};
pub use argv::{Mount, OutputTmpfs, RunSpec};
pub use config::{ContainerConfig, RustConfig};
pub use process::KILL_GRACE;
pub use rust::RustCacheStats;
pub use session::ContainerSession;

use crate::admission::Admitted;
use crate::backend::ProgramBackend;
use crate::backend::{Backend, Readiness, Unavailable};
use crate::backend::{Session, SessionBackend};
use crate::capabilities::BackendCapabilities;
use crate::error::{BackendRejection, ConfigError, ExecError};
use crate::language::Language;
use crate::program::{Program, ProgramSpec};
use crate::request::ExecRequest;
use crate::result::ExecResult;
use runner::Runner;
#[cfg(feature = "kubernetes")]
pub(crate) use runner::{script_argv, warm_python_argv};
use staging::Staging;
pub(crate) use tool_socket::ToolSocket;
#[cfg(feature = "kubernetes")]
pub(crate) use tool_socket::{TOOL_COMMAND_PATH, unread_limit};

/// Python, shell and Rust in ephemeral containers. See the module docs.
///
/// A handle: clones share the same settings, caches, reaper and Rust
/// pipeline; the last one dropped waits for the containers and staging
/// directories it queued for removal.
#[derive(Clone)]
pub struct Container {
    /// What runs a spec (its sessions keep one too).
    runner: Arc<Runner>,
    rust: Arc<rust::Pipeline>,
}

impl Container {
    /// The backend's name in results and refusals.
    pub const NAME: &'static str = runner::NAME;

    /// A backend with `cfg`. Refuses, as [`ConfigError::Invalid`] naming the
    /// setting, extra `run` arguments outside the allow-list (see
    /// [`ContainerConfig::extra_run_args`]) and caps no run could start
    /// under (a default memory cap below 6 MiB, 0 processes, no CPUs).
    /// Nothing is spawned until the first run or availability check: a
    /// missing engine or image shows in [`Backend::availability`].
    ///
    /// podman instead of docker: `Container::new(ContainerConfig::default().engine("podman"))`.
    pub fn new(cfg: ContainerConfig) -> Result<Self, ConfigError> {
        cfg.check()?;
        Ok(Self::build(cfg))
    }

    fn build(cfg: ContainerConfig) -> Self {
        let rust = Arc::new(rust::Pipeline::new(cfg.rust.clone()));
        Self { runner: Arc::new(Runner::new(cfg)), rust }
    }

    /// The value of the `execbox.owner` label on every container this
    /// process starts (its pid and start time): `docker ps --filter
    /// label=execbox.owner=<token>` lists them.
    pub fn owner_token() -> &'static str {
        crate::owner::token()
    }

    /// For a host about to exit (a SIGTERM/SIGINT handler's thread): kills
    /// and removes every container this process started on this engine,
    /// removes this process's staging directories, and refuses every later
    /// run (of every container backend of this process: none makes a staging
    /// directory again). Each engine command is bounded (5 s); runs in flight end with an
    /// error. What a run was starting at that very moment is left to its
    /// in-container timer and to the watcher (see the module docs).
    pub fn shutdown(&self) {
        self.runner.shutdown();
    }

    /// The settings in use.
    pub fn config(&self) -> &ContainerConfig {
        self.runner.config()
    }

    /// Rust pipeline counters: a repeated program is a hit, not a compile.
    pub fn rust_cache_stats(&self) -> RustCacheStats {
        self.rust.stats()
    }

    /// For audits: the exact run a request would get — image, limits,
    /// mounts, command, and through [`RunSpec::argv`] every argument after
    /// the engine program — without running anything. The staging paths are
    /// placeholders (a fresh directory, removed when this returns) and the
    /// name is fresh; the request's timeout (else the default) is the
    /// deadline. Errors are the ones a run of the request would get before
    /// starting (a bad grant, env value or limit). A request whose policy
    /// grants tools shows its tool socket's mounts and variable (a
    /// placeholder socket, closed when this returns); one that grants none
    /// has none of them.
    pub fn plan(&self, request: &ExecRequest) -> Result<RunSpec, ExecError> {
        let runner = &self.runner;
        let staging = Staging::new(request, request.input.as_ref().map(|_| b"null".as_slice()))?;
        let socket = match request.policy.tool_grants() {
            Some(_) => {
                Some(ToolSocket::start().map_err(|e| runner.unavailable(format!("cannot open a tool socket: {e}")))?)
            }
            None => None,
        };
        let (image, command) = match request.language {
            Language::Rust => (runner.config().rust_image.clone(), rust::command(request)),
            _ => (runner.script_image(request), runner.script_command(request, socket.is_some())?),
        };
        let timeout = runner.capabilities().effective_timeout(&request.policy);
        let mut spec = runner.spec(request, &staging, image, command, timeout)?;
        if let Some(socket) = &socket {
            socket.attach(&mut spec, request.language == Language::Shell)?;
        }
        Ok(spec)
    }
}

impl Default for Container {
    /// The docker CLI with [`ContainerConfig::default`] (which passes every
    /// check of [`Container::new`]).
    fn default() -> Self {
        Self::build(ContainerConfig::default())
    }
}

impl std::fmt::Debug for Container {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Container").field("config", self.config()).finish_non_exhaustive()
    }
}

impl Backend for Container {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn capabilities(&self) -> &BackendCapabilities {
        self.runner.capabilities()
    }

    /// Whether the engine answers, has the Python and Rust images, and
    /// applies execbox's seccomp profile: a probe container (once per
    /// process and engine while the engine does not fail) must see its
    /// calls denied, else the backend is unavailable with what the probe
    /// saw. Cached: a positive answer for
    /// [`availability_ttl`](ContainerConfig::availability_ttl), a negative
    /// one for 2 s. The first check in a process also starts the cleanup of
    /// dead owners' containers (see the module docs), off the request path.
    fn availability(&self) -> Result<(), Unavailable> {
        self.runner.availability()
    }

    fn execute(&self, call: Admitted) -> Result<ExecResult, ExecError> {
        self.runner.check_available(Self::NAME)?;
        match call.request().language {
            Language::Python | Language::Shell => self.runner.execute_script(call),
            Language::Rust => rust::execute(&self.runner, &self.rust, call),
            other => Err(ExecError::internal(Self::NAME, format!("matching let {other} through"))),
        }
    }

    /// Checks for the engine and images (which also starts the sweep of
    /// dead owners' containers, off the request path).
    /// With a warm pool, also starts the plain Python image's (it fills
    /// off the caller's path: `limit` is not waited).
    fn prepare(&self, _limit: Duration) {
        if self.runner.availability().is_ok() {
            self.runner.prepare_warm();
        }
    }

    /// The warm pool's ready containers (all package sets), if it is on.
    fn readiness(&self) -> Option<Readiness> {
        self.runner.warm_counts().map(|(ready, target)| Readiness { ready, target })
    }

    fn shutdown(&self) {
        Container::shutdown(self);
    }

    /// Python and shell: what the data image declares (a shell script that
    /// declares packages runs there too, so its `python3` has them); Rust:
    /// none.
    fn packages(&self, language: Language) -> Vec<String> {
        match language {
            Language::Python | Language::Shell => self.runner.data_image_packages(),
            _ => Vec::new(),
        }
    }

    /// Programs in a workspace's container (see `programs.rs`).
    fn program_backend(&self) -> Option<Arc<dyn ProgramBackend>> {
        Some(Arc::new(self.clone()))
    }

    /// Python and shell sessions in containers ([`ContainerSession`]).
    fn session_backends(&self) -> Vec<Arc<dyn SessionBackend>> {
        vec![Arc::new(self.clone()), Arc::new(ShellSessions(self.clone()))]
    }
}

impl ProgramBackend for Container {
    /// Starts `spec` in the workspace's container, starting that container
    /// (the workspace's machine) with its first program, under that
    /// program's caps; a later program that asks for lower caps or another
    /// network is refused.
    fn start_program(&self, request: &ExecRequest, spec: &ProgramSpec) -> Result<Program, ExecError> {
        self.runner.check_available(Self::NAME)?;
        let Some(workspace) = &request.workspace else {
            return Err(ExecError::internal(programs::NAME, "a program without a workspace"));
        };
        let machine = {
            let mut slot = workspace.carrier();
            let running = slot.clone().and_then(|c| c.downcast::<programs::Machine>().ok()).filter(|m| m.is_alive());
            match running {
                Some(machine) => machine,
                None => {
                    let machine = programs::Machine::open(self.runner.clone(), workspace, request)?;
                    *slot = Some(machine.clone());
                    machine
                }
            }
        };
        let violations = machine.refusals(request);
        if !violations.is_empty() {
            let rejections = vec![BackendRejection { backend: programs::NAME.into(), violations }];
            return Err(ExecError::Refused { rejections });
        }
        machine.start(request, spec)
    }
}

/// The container's Python sessions (a registry built by hand may add it;
/// [`Backend::session_backends`] gives its shell sessions too).
impl SessionBackend for Container {
    fn session_name(&self) -> &str {
        ContainerSession::NAME
    }

    fn session_language(&self) -> Language {
        Language::Python
    }

    fn session_capabilities(&self) -> &BackendCapabilities {
        self.runner.session_capabilities()
    }

    fn session_packages(&self) -> Vec<String> {
        self.runner.data_image_packages()
    }

    fn open_session(&self, spec: &crate::session_spec::SessionSpec) -> Result<Box<dyn Session>, ExecError> {
        Ok(Box::new(ContainerSession::open(Arc::clone(&self.runner), spec)?))
    }
}

/// The container's shell sessions: its Python sessions' opener
/// (`impl SessionBackend for Container`) under another language.
struct ShellSessions(Container);

impl SessionBackend for ShellSessions {
    fn session_name(&self) -> &str {
        self.0.session_name()
    }

    fn session_language(&self) -> Language {
        Language::Shell
    }

    fn session_capabilities(&self) -> &BackendCapabilities {
        self.0.session_capabilities()
    }

    fn session_packages(&self) -> Vec<String> {
        self.0.session_packages()
    }

    fn open_session(&self, spec: &crate::session_spec::SessionSpec) -> Result<Box<dyn Session>, ExecError> {
        self.0.open_session(spec)
    }
}
