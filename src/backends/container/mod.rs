//! The `container` backend: Python, shell and Rust in a fresh, locked-down
//! container per call, through the `docker` or `podman` CLI (no SDK).
//!
//! Every run gets the flags of [`run_argv`]: no network, read-only root
//! filesystem with a size-capped `/tmp` tmpfs, `--memory` = `--memory-swap`,
//! `--cpus`, `--pids-limit`, an unprivileged user, no capabilities,
//! `no-new-privileges`, no IPC namespace sharing, no log driver, and an
//! explicit name so a timeout kills the container on the daemon side.
//!
//! What the code sees:
//! - `/work` (read-only, the working directory): `input.json` holding the
//!   request's JSON `input`, and the staged input files;
//! - `/work/out` (read-write, only when the request collects output files):
//!   regular files left there come back as `output_files`;
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
//! **Lifetime**: a container never outlives its deadline plus a grace, even
//! if the host process dies: the host kills it at the deadline, its first
//! process (an in-container timer) kills its command at the deadline plus
//! [`KILL_GRACE`], and what a dead host left is removed by its watcher or by
//! the next process's sweep (see `owners.rs`). `execute` itself returns at
//! most `KILL_GRACE` after the deadline. [`Container::shutdown`] is for a
//! host about to exit on a signal.

mod argv;
pub(crate) mod hostfs;
mod owners;
mod process;
mod reaper;
mod rust;
mod session;
mod staging;

use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub use argv::{Mount, RunSpec, STOP_DIR, UnsafeExtraArg, check_extra_args, run_argv};
pub use hostfs::{OutputDir, SaveError};
pub use process::KILL_GRACE;
pub use rust::{RustCacheStats, RustConfig};
pub use session::ContainerSession;
pub use staging::{INPUT_JSON, MAX_OUTPUT_DEPTH, MAX_OUTPUT_ENTRIES, OUTPUT_DIR, WORKDIR};

use super::conventions;
use crate::admission::Admitted;
use crate::backend::{Backend, Unavailable};
use crate::capabilities::{
    BackendCapabilities, CostClass, Enforcement, IsolationKind, PayloadKind, RequestFeatures, SurfaceCapability,
};
use crate::error::{ExecError, InvalidRequest};
use crate::language::Language;
use crate::limits::deadline::Deadline;
use crate::policy::Access;
use crate::request::ExecRequest;
use crate::result::{ExecResult, Outcome, Usage};

/// Settings of a [`Container`] backend.
#[derive(Clone, Debug)]
pub struct ContainerConfig {
    /// The engine CLI: `docker` or `podman` (a name on `PATH` or a path).
    pub engine: PathBuf,
    /// Image for Python and shell (`scripts/build-images.sh` builds it offline).
    pub python_image: String,
    /// Image for Python requests that declare packages: its
    /// `execbox.packages` label (written by `scripts/build-images.sh` after
    /// importing each package in the image) is what this backend provides.
    pub python_data_image: String,
    /// Image that links and runs Rust programs (gcc + libc6-dev).
    pub rust_image: String,
    /// `--memory` when the policy states no memory cap.
    pub default_memory_bytes: u64,
    /// `--cpus`.
    pub cpus: f64,
    /// `--pids-limit` when the policy states no process cap.
    pub default_pids: u64,
    /// Size of the `/tmp` tmpfs (it also counts against the memory cap).
    pub tmp_bytes: u64,
    /// `uid:gid` the code runs as.
    pub user: String,
    /// Extra `run` arguments, from a fixed allow-list (see [`check_extra_args`]):
    /// e.g. `--runtime=runsc`.
    pub extra_run_args: Vec<String>,
    /// Most output files returned.
    pub max_output_files: usize,
    /// Largest file the code may write anywhere (`RLIMIT_FSIZE`, enforced by
    /// the kernel) and so the largest output file.
    pub max_output_file_bytes: u64,
    /// Most output bytes returned in all.
    pub max_output_total_bytes: u64,
    /// Deepest JSON `input` accepted (serialization recurses).
    pub max_input_nesting: usize,
    /// How long a positive availability check is trusted.
    pub availability_ttl: Duration,
    /// Deadline of a run whose policy states none: no container runs
    /// unbounded. For Rust it covers the compile and the run together.
    pub default_timeout: Duration,
    /// The Rust pipeline.
    pub rust: RustConfig,
    /// A Python session's memory cap when its spec's policy states none
    /// (its container's cgroup, fixed when it starts); a call asking for a
    /// lower cap than the session's is refused.
    pub session_memory_bytes: u64,
    /// Longest life of a session's container (its in-container timer).
    pub session_lifetime: Duration,
}

impl Default for ContainerConfig {
    fn default() -> Self {
        Self {
            engine: "docker".into(),
            python_image: "localhost/execbox-python:3.11".into(),
            python_data_image: "localhost/execbox-python-data:3.11".into(),
            rust_image: "localhost/execbox-rust:bookworm".into(),
            default_memory_bytes: 512 << 20,
            cpus: 1.0,
            default_pids: 128,
            tmp_bytes: 64 << 20,
            user: "65534:65534".into(),
            extra_run_args: Vec::new(),
            max_output_files: 64,
            max_output_file_bytes: 8 << 20,
            max_output_total_bytes: 32 << 20,
            max_input_nesting: 128,
            availability_ttl: Duration::from_secs(30),
            default_timeout: Duration::from_secs(300),
            rust: RustConfig::default(),
            session_memory_bytes: crate::policy::SandboxPolicy::STRICT_MEMORY_BYTES,
            session_lifetime: Duration::from_secs(3600),
        }
    }
}

/// Smallest `--memory` docker accepts.
const MIN_MEMORY_BYTES: u64 = 6 << 20;

/// Python, shell and Rust in ephemeral containers. See the module docs.
#[derive(Clone)]
pub struct Container(Arc<ContainerInner>);

/// What a [`Container`] handle shares (its sessions keep one).
#[doc(hidden)]
pub struct ContainerInner {
    cfg: ContainerConfig,
    caps: BackendCapabilities,
    reaper: reaper::Reaper,
    /// Last availability check: when, and its result.
    availability: Mutex<Option<(Instant, Result<(), Unavailable>)>>,
    /// Last read of the data image's package label: when, and the packages.
    data_packages: Mutex<Option<(Instant, Vec<String>)>>,
    rust: rust::Pipeline,
    /// Set by [`Container::shutdown`]: no new container starts.
    shut_down: AtomicBool,
}

static RUN_COUNTER: AtomicU64 = AtomicU64::new(0);

impl std::ops::Deref for Container {
    type Target = ContainerInner;
    fn deref(&self) -> &ContainerInner {
        &self.0
    }
}

impl Container {
    /// The backend's name in results and refusals.
    pub const NAME: &'static str = "container";

    /// The docker CLI with default settings.
    pub fn docker() -> Self {
        Self::build(ContainerConfig::default())
    }

    /// The podman CLI with default settings.
    pub fn podman() -> Self {
        Self::build(ContainerConfig { engine: "podman".into(), ..Default::default() })
    }

    /// A backend with `cfg`; refuses extra arguments outside the allow-list.
    /// Nothing is spawned until the first run or availability check.
    pub fn with_config(cfg: ContainerConfig) -> Result<Self, UnsafeExtraArg> {
        check_extra_args(&cfg.extra_run_args)?;
        Ok(Self::build(cfg))
    }

    fn build(cfg: ContainerConfig) -> Self {
        Self(Arc::new(ContainerInner {
            caps: capabilities(&cfg),
            reaper: reaper::Reaper::new(cfg.engine.clone()),
            availability: Mutex::new(None),
            data_packages: Mutex::new(None),
            rust: rust::Pipeline::new(cfg.rust.clone()),
            shut_down: AtomicBool::new(false),
            cfg,
        }))
    }

    /// The value of the `execbox.owner` label on every container this
    /// process starts (its pid and start time): `docker ps --filter
    /// label=execbox.owner=<token>` lists them.
    pub fn owner_token() -> &'static str {
        crate::backends::owner::token()
    }

    /// For a host about to exit (a SIGTERM/SIGINT handler's thread): kills
    /// and removes every container this process started on this engine,
    /// removes this process's staging directories, and refuses every later
    /// run. Each engine command is bounded (5 s); runs in flight end with an
    /// error. What a run was starting at that very moment is left to its
    /// in-container timer and to the watcher (see the module docs).
    pub fn shutdown(&self) {
        self.shut_down.store(true, Ordering::SeqCst);
        owners::remove_own(&self.cfg.engine, Duration::from_secs(5));
        owners::remove_own_temp_dirs();
    }

    /// The settings in use.
    pub fn config(&self) -> &ContainerConfig {
        &self.cfg
    }

    /// Rust pipeline counters: a repeated program is a hit, not a compile.
    pub fn rust_cache_stats(&self) -> RustCacheStats {
        self.rust.stats()
    }

    /// The exact `run` arguments a request would get (after the engine
    /// program), with placeholder staging paths; for audits and tests.
    pub fn plan(&self, request: &ExecRequest) -> Result<RunSpec, ExecError> {
        let staging = staging::Staging::new(request, request.input.as_ref().map(|_| b"null".as_slice()))?;
        let (image, command) = match request.language {
            Language::Rust => (self.cfg.rust_image.clone(), rust::command(request)),
            _ => (self.script_image(request), self.script_command(request)?),
        };
        self.spec(request, &staging, image, command, self.caps.effective_timeout(&request.policy))
    }

    /// The image a Python or shell request runs in: the data image when it
    /// declares packages (matching has checked that the image has them).
    fn script_image(&self, request: &ExecRequest) -> String {
        if request.packages.is_empty() { self.cfg.python_image.clone() } else { self.cfg.python_data_image.clone() }
    }

    /// `Ok` if the engine and images are there, else `backend_unavailable`.
    fn check_available(&self) -> Result<(), ExecError> {
        Backend::availability(self).map_err(|why| why.into_error(Self::NAME))
    }

    /// This backend's capabilities (its sessions check against them too).
    fn capabilities_ref(&self) -> &BackendCapabilities {
        &self.caps
    }

    /// The packages the data image declares (its `execbox.packages`
    /// label), cached like availability; none when the image is missing.
    fn data_image_packages(&self) -> Vec<String> {
        let mut cached = self.data_packages.lock();
        if let Some((at, packages)) = cached.as_ref() {
            let ttl = if packages.is_empty() { Duration::from_secs(2) } else { self.cfg.availability_ttl };
            if at.elapsed() < ttl {
                return packages.clone();
            }
        }
        let format = "--format={{index .Config.Labels \"execbox.packages\"}}";
        let output = process::bounded_output(
            process::engine_command(&self.cfg.engine).args(["image", "inspect", format, &self.cfg.python_data_image]),
            process::HOUSEKEEPING_TIMEOUT,
            64 << 10,
        );
        let packages: Vec<String> = match output {
            Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout)
                .trim()
                .split(',')
                .filter(|p| !p.is_empty() && *p != "<no value>")
                .map(str::to_string)
                .collect(),
            _ => Vec::new(),
        };
        *cached = Some((Instant::now(), packages.clone()));
        packages
    }

    /// Builds the run spec of `request` with its staged files; `limit` is
    /// the time the run has left (the in-container timer adds [`KILL_GRACE`]).
    fn spec(
        &self,
        request: &ExecRequest,
        staging: &staging::Staging,
        image: String,
        command: Vec<String>,
        limit: Duration,
    ) -> Result<RunSpec, ExecError> {
        let policy = &request.policy;
        let memory_bytes = policy.memory_bytes.unwrap_or(self.cfg.default_memory_bytes);
        if memory_bytes < MIN_MEMORY_BYTES {
            return Err(InvalidRequest::LimitOutOfRange {
                limit: "memory_bytes",
                value: memory_bytes,
                reason: format!("containers need at least {MIN_MEMORY_BYTES} bytes"),
            }
            .into());
        }
        let pids = policy.max_processes.unwrap_or(self.cfg.default_pids);
        if pids == 0 {
            return Err(InvalidRequest::LimitOutOfRange {
                limit: "max_processes",
                value: 0,
                reason: "the program itself is one process".into(),
            }
            .into());
        }
        let mut mounts = staging.mounts();
        if let Access::Allow(grants) = &policy.filesystem {
            for (list, writable) in [(&grants.read_only, false), (&grants.read_write, true)] {
                for grant in list {
                    mounts.push(staging::grant_mount(&grant.host, grant.guest_path(), writable)?);
                }
            }
        }
        let n = RUN_COUNTER.fetch_add(1, Ordering::Relaxed);
        Ok(RunSpec {
            // pid + counter + nonce: unique even across processes with reused pids.
            name: format!("execbox-{}-{n}-{:08x}", std::process::id(), crate::nonce::random_u64() as u32),
            image,
            memory_bytes,
            cpus: self.cfg.cpus,
            pids,
            tmp_bytes: self.cfg.tmp_bytes,
            user: self.cfg.user.clone(),
            max_file_bytes: Some(self.cfg.max_output_file_bytes),
            env_file: staging.env_file(),
            mounts,
            workdir: WORKDIR.into(),
            extra_args: self.cfg.extra_run_args.clone(),
            command,
            stop_after: limit.saturating_add(KILL_GRACE),
        })
    }

    /// The in-container command of a Python or shell request.
    fn script_command(&self, request: &ExecRequest) -> Result<Vec<String>, ExecError> {
        let mut command: Vec<String> = match request.language {
            // Absolute: the request's environment may set its own PATH.
            Language::Python => vec!["/usr/bin/python3".into(), "-c".into(), conventions::PYTHON_BOOTSTRAP.into()],
            Language::Shell => vec!["/bin/sh".into(), "-s".into(), "--".into()],
            other => return Err(ExecError::internal(Self::NAME, format!("no script command for {other}"))),
        };
        command.extend(request.args.iter().cloned());
        Ok(command)
    }

    /// Runs one container for `spec`, capturing at most `caps` (stdout,
    /// stderr) bytes, streamed to the request's tap if it has one.
    fn run_spec(&self, spec: &RunSpec, stdin: Vec<u8>, caps: Caps, deadline: Deadline) -> RunEnd {
        if self.shut_down.load(Ordering::SeqCst) {
            return RunEnd::SpawnFailed("the backend is shutting down".into());
        }
        let invocation = process::Invocation {
            engine: &self.cfg.engine,
            argv: run_argv(spec),
            name: &spec.name,
            stdin,
            deadline,
            max_stdout: caps.stdout,
            max_stderr: caps.stderr,
            tap: caps.tap,
        };
        match process::run(invocation, &|name| self.reaper.remove(name.to_string())) {
            Ok(finished) => RunEnd::Finished(finished),
            Err(e) => RunEnd::SpawnFailed(format!("cannot run {}: {e}", self.cfg.engine.display())),
        }
    }

    /// A result from a finished container; engine errors become `ExecError`s.
    /// The staging directory goes to the reaper either way.
    fn result(&self, end: RunEnd, deadline: &Deadline, staging: staging::Staging) -> Result<ExecResult, ExecError> {
        let result = self.result_of(end, deadline, &staging);
        self.reaper.discard(staging.into_dir());
        result
    }

    fn result_of(&self, end: RunEnd, deadline: &Deadline, staging: &staging::Staging) -> Result<ExecResult, ExecError> {
        let finished = match end {
            RunEnd::Finished(f) => f,
            RunEnd::SpawnFailed(reason) => return Err(self.unavailable(reason)),
        };
        let (outcome, exit_code, mut message) = match finished.ended {
            process::Ended::Exited { exit_code: 0, .. } => (Outcome::Ok, Some(0), None),
            process::Ended::Exited { exit_code, oom_killed: true } => (
                Outcome::OutOfMemory,
                Some(exit_code),
                Some("killed by the kernel's OOM killer at the memory cap".to_string()),
            ),
            process::Ended::Exited { exit_code, .. } => {
                (Outcome::Failed, Some(exit_code), Some(format!("exited with code {exit_code}")))
            }
            process::Ended::TimedOut => (Outcome::TimedOut, None, Some(deadline.exceeded_message())),
            process::Ended::EngineError(text) => return Err(self.engine_error(text)),
        };
        let (output_files, note) = staging.collect_outputs(self.output_limits());
        if let Some(note) = note {
            message = Some(match message {
                Some(m) => format!("{m}; {note}"),
                None => note,
            });
        }
        let mut result = ExecResult::new(Self::NAME, outcome);
        result.exit_code = exit_code;
        result.output = conventions::json_stdout(&finished.stdout);
        result.stdout = finished.stdout;
        result.stderr = finished.stderr;
        result.message = message;
        result.output_files = output_files;
        result.usage = Usage { duration: deadline.elapsed(), ..Usage::default() };
        Ok(result)
    }

    fn output_limits(&self) -> staging::OutputLimits {
        staging::OutputLimits {
            max_files: self.cfg.max_output_files,
            max_file_bytes: self.cfg.max_output_file_bytes,
            max_total_bytes: self.cfg.max_output_total_bytes,
        }
    }

    fn unavailable(&self, reason: String) -> ExecError {
        ExecError::BackendUnavailable { backend: Self::NAME.into(), reason }
    }

    /// An engine failure: unavailable if it names a missing daemon or image
    /// (with the fix), internal otherwise.
    fn engine_error(&self, text: String) -> ExecError {
        self.forget_availability();
        let text = crate::limits::text::cap_message(text);
        let lower = text.to_ascii_lowercase();
        if lower.contains("no such image") || lower.contains("unable to find image") {
            self.unavailable(format!("{text} — build the images with scripts/build-images.sh"))
        } else if lower.contains("cannot connect") || lower.contains("is the docker daemon running") {
            self.unavailable(format!("{text} — start an engine with scripts/start-container-engine.sh"))
        } else {
            ExecError::internal(Self::NAME, format!("the container engine failed: {text}"))
        }
    }

    fn forget_availability(&self) {
        *self.availability.lock() = None;
    }

    /// Asks the engine whether the images exist (which also proves the
    /// daemon answers).
    fn check_availability(&self) -> Result<(), Unavailable> {
        let images = [&self.cfg.python_image, &self.cfg.rust_image];
        let output = process::bounded_output(
            process::engine_command(&self.cfg.engine).args(["image", "inspect", "--format={{.Id}}"]).args(images),
            process::HOUSEKEEPING_TIMEOUT,
            64 << 10,
        )
        .map_err(|e| {
            Unavailable::new(
                format!("cannot run the container engine {:?}: {e}", self.cfg.engine),
                "install and start one with scripts/start-container-engine.sh",
            )
        })?;
        if output.status.success() {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&output.stderr).trim().to_string();
        if text.to_ascii_lowercase().contains("no such image") {
            Err(Unavailable::new(text, "build the images with scripts/build-images.sh"))
        } else {
            Err(Unavailable::new(
                format!("the engine does not answer: {text}"),
                "start one with scripts/start-container-engine.sh",
            ))
        }
    }

    fn execute_script(&self, mut call: Admitted) -> Result<ExecResult, ExecError> {
        let deadline = call.deadline();
        let source = call.take_source(Self::NAME)?;
        let input = call.take_input_json(self.cfg.max_input_nesting, Self::NAME)?;
        let request = call.into_request();
        let staging = staging::Staging::new(&request, input.as_deref())?;
        let command = self.script_command(&request)?;
        let limit = deadline.remaining().unwrap_or(Duration::MAX);
        let spec = self.spec(&request, &staging, self.script_image(&request), command, limit)?;
        let end = self.run_spec(&spec, source.into_bytes(), Caps::of(&request), deadline);
        self.result(end, &deadline, staging)
    }
}

impl Drop for ContainerInner {
    /// Waits for the start-up sweep (the reaper, a field, is joined next):
    /// nothing this backend started outlives it.
    fn drop(&mut self) {
        owners::finish_sweeps();
    }
}

/// How a `run_spec` ended.
enum RunEnd {
    Finished(process::Finished),
    SpawnFailed(String),
}

fn capabilities(cfg: &ContainerConfig) -> BackendCapabilities {
    use Enforcement as E;
    let cap = "read by execbox through a bounded buffer while the container runs; the rest is counted and dropped";
    BackendCapabilities {
        isolation: IsolationKind::ContainerEphemeral,
        cost: CostClass::High,
        languages: vec![Language::Python, Language::Shell, Language::Rust],
        payloads: vec![PayloadKind::Source],
        // stdin carries the code (Python, shell) or the JSON input (Rust).
        features: RequestFeatures { json_input: true, stdin: false, args: true, input_files: true, output_files: true },
        network: SurfaceCapability {
            deny: E::enforced("--network=none: the container has only a loopback interface"),
            allow_list: E::not_enforced("the engine cannot restrict a container's network to a host allow-list"),
        },
        filesystem: SurfaceCapability {
            deny: E::enforced(
                "read-only root filesystem; no host path is mounted but execbox's own staging \
                 (/work read-only, /work/out only when output files are collected); /tmp is a private tmpfs",
            ),
            allow_list: E::enforced("each granted path is a bind mount, read-only or read-write as granted"),
        },
        environment: SurfaceCapability {
            deny: E::enforced("only the image's own variables; nothing from the host"),
            allow_list: E::enforced("exactly the request's values for allow-listed names, via a private env file"),
        },
        timeout: E::enforced(
            "at the deadline the named container is killed on the daemon side (SIGKILL); the result comes at \
             most 2 s (KILL_GRACE) later whatever the daemon does; the container's first process, an \
             execute-only coreutils timeout, kills the program by itself at the deadline + 2 s even if the \
             host dies; Rust: the compile and the run share the request's deadline (the compile is also capped \
             by RustConfig::compile_timeout)",
        ),
        memory: E::enforced(format!(
            "cgroup --memory = --memory-swap (default {} MiB); the OOM killer ends the run",
            cfg.default_memory_bytes >> 20
        )),
        fuel: E::not_enforced("containers have no instruction budget; use the timeout"),
        stdout_cap: E::enforced(cap),
        stderr_cap: E::enforced(cap),
        processes: E::enforced(format!("cgroup --pids-limit (default {})", cfg.default_pids)),
        default_timeout_ms: u64::try_from(cfg.default_timeout.as_millis()).unwrap_or(u64::MAX),
    }
}

/// What a container's output may keep, and who sees it as it comes.
struct Caps {
    stdout: Option<u64>,
    stderr: Option<u64>,
    tap: Option<crate::limits::output::OutputTap>,
}

impl Caps {
    /// The request's caps and tap.
    fn of(request: &ExecRequest) -> Self {
        Caps {
            stdout: request.policy.max_stdout_bytes,
            stderr: request.policy.max_stderr_bytes,
            tap: request.output_tap.clone(),
        }
    }
}

impl Backend for Container {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn capabilities(&self) -> &BackendCapabilities {
        &self.caps
    }

    /// Cached: a positive answer for `availability_ttl`, a negative one for 2 s.
    /// The first check in a process also starts the cleanup of dead owners'
    /// containers (see the module docs), off the request path.
    fn availability(&self) -> Result<(), Unavailable> {
        owners::start(&self.cfg.engine);
        let mut cached = self.availability.lock();
        if let Some((at, result)) = cached.as_ref() {
            let ttl = if result.is_ok() { self.cfg.availability_ttl } else { Duration::from_secs(2) };
            if at.elapsed() < ttl {
                return result.clone();
            }
        }
        let result = self.check_availability();
        *cached = Some((Instant::now(), result.clone()));
        result
    }

    fn execute(&self, call: Admitted) -> Result<ExecResult, ExecError> {
        Backend::availability(self).map_err(|why| why.into_error(Self::NAME))?;
        match call.request().language {
            Language::Python | Language::Shell => self.execute_script(call),
            Language::Rust => rust::execute(self, call),
            other => Err(ExecError::internal(Self::NAME, format!("matching let {other} through"))),
        }
    }

    /// Checks for the engine and images (which also starts the sweep of
    /// dead owners' containers, off the request path).
    fn prepare(&self, _limit: Duration) {
        let _ = Backend::availability(self);
    }

    fn shutdown(&self) {
        Container::shutdown(self);
    }

    /// Python: what the data image declares (shell and Rust: none).
    fn packages(&self, language: Language) -> Vec<String> {
        if language == Language::Python { self.data_image_packages() } else { Vec::new() }
    }

    /// Python sessions in containers ([`ContainerSession`]).
    fn session_backend(&self) -> Option<Arc<dyn crate::sessions::session::SessionBackend>> {
        Some(Arc::new(self.clone()))
    }
}

impl crate::sessions::session::SessionBackend for Container {
    fn session_name(&self) -> &str {
        ContainerSession::NAME
    }

    fn session_language(&self) -> Language {
        Language::Python
    }

    fn session_capabilities(&self) -> &BackendCapabilities {
        &self.caps
    }

    fn session_packages(&self) -> Vec<String> {
        self.data_image_packages()
    }

    fn open_session(
        &self,
        spec: &crate::sessions::spec::SessionSpec,
    ) -> Result<Box<dyn crate::sessions::session::Session>, ExecError> {
        Ok(Box::new(ContainerSession::open(self.clone(), spec)?))
    }
}
