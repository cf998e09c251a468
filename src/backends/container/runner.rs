//! [`Runner`]: what runs a container for a spec — the settings, the
//! capabilities, the reaper, the availability cache — shared by one-shot
//! runs, the Rust pipeline and sessions. The front door (`mod.rs`) wraps
//! it as [`Container`](super::Container).

use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::argv::{OutputTmpfs, RunSpec};
use super::config::{ContainerConfig, MIN_MEMORY_BYTES};
use super::outputs::{self, OUTPUT_INODES, OutputLimits};
use super::owners;
use super::process::{self, KILL_GRACE};
use super::reaper::Reaper;
use super::seccomp::{self, ProbeKey};
use super::staging::{self, Staging, WORKDIR};
use super::tool_socket::ToolSocket;
use super::warm::{Warm, WarmKey, WarmPool};
use crate::admission::Admitted;
use crate::backend::Unavailable;
use crate::backends::conventions;
use crate::capabilities::{
    BackendCapabilities, CostClass, Enforcement, IsolationKind, PayloadKind, RequestFeatures, SurfaceCapability,
};
use crate::error::{ExecError, InvalidRequest};
use crate::language::Language;
use crate::limits::deadline::Deadline;
use crate::limits::output::OutputTap;
use crate::policy::{Access, SandboxPolicy};
use crate::request::ExecRequest;
use crate::result::{ExecResult, Outcome, Usage};
use crate::tools::bridge::ToolBridge;
use crate::tools::wire::python_header;

/// The backend's name in results and refusals.
pub(super) const NAME: &str = "container";

/// How long a negative availability check (or a missing package label) is trusted.
const NEGATIVE_TTL: Duration = Duration::from_secs(2);

/// Deadline of the seccomp probe's container (one container start): as
/// long as any other engine command of the availability check.
const PROBE_TIMEOUT: Duration = process::HOUSEKEEPING_TIMEOUT;

static RUN_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A fresh container name `<prefix><pid>-<counter>-<nonce>`: unique even
/// across processes with reused pids.
pub(super) fn container_name(prefix: &str) -> String {
    let n = RUN_COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{}-{n}-{:08x}", std::process::id(), crate::nonce::random_u64() as u32)
}

/// Runs containers for specs; see the module docs.
pub(super) struct Runner {
    cfg: ContainerConfig,
    caps: BackendCapabilities,
    session_caps: BackendCapabilities,
    reaper: Reaper,
    /// Last availability check: when, and its result.
    availability: Mutex<Option<(Instant, Result<(), Unavailable>)>>,
    /// Last read of the data image's package label: when, and the packages.
    data_packages: Mutex<Option<(Instant, Vec<String>)>>,
    /// Set by [`Runner::shutdown`]: no new container starts.
    shut_down: AtomicBool,
    /// Warm one-shot containers (`warm.rs`; it removes its own).
    warm: WarmPool,
    /// This backend's hold on the process's copy of the seccomp profile.
    /// Last: dropped after the warm pool, whose starts may still read it.
    _profile: seccomp::Hold,
}

/// How a [`Runner::run_spec`] ended.
pub(super) enum RunEnd {
    Finished(process::Finished),
    SpawnFailed(String),
}

/// What a container's output may keep, and who sees it as it comes.
pub(super) struct Caps {
    pub stdout: Option<u64>,
    pub stderr: Option<u64>,
    pub tap: Option<OutputTap>,
}

impl Caps {
    /// The request's caps and tap.
    pub fn of(request: &ExecRequest) -> Self {
        Caps {
            stdout: request.policy.max_stdout_bytes,
            stderr: request.policy.max_stderr_bytes,
            tap: request.output_tap.clone(),
        }
    }
}

/// The in-container command of a shell run (its arguments follow): the
/// script on stdin becomes bash's script file, and stdin `/dev/null`.
const SHELL_FROM_STDIN: &str = "exec 3<&0 0</dev/null; exec /bin/bash /dev/fd/3 \"$@\"";

impl Runner {
    /// A runner with `cfg` (already checked). Nothing is spawned until the
    /// first run or availability check.
    pub fn new(cfg: ContainerConfig) -> Self {
        let launch_cfg = cfg.clone();
        let launch = Box::new(move |key: &WarmKey| warm_spec(&launch_cfg, key));
        Self {
            warm: WarmPool::new(cfg.engine.clone(), cfg.warm_containers, cfg.warm_lifetime, launch),
            caps: capabilities(&cfg),
            session_caps: BackendCapabilities {
                isolation: crate::capabilities::IsolationKind::ContainerPersistent,
                workspace: Enforcement::enforced(
                    "a session opened in a workspace has it bind-mounted read-write at /work for its life \
                     (each cell's input files written into it; /work/out stays the container's own tmpfs); \
                     the quota is the workspace's tmpfs, enforced by the kernel",
                ),
                ..capabilities(&cfg)
            },
            reaper: Reaper::new(cfg.engine.clone()),
            availability: Mutex::new(None),
            data_packages: Mutex::new(None),
            shut_down: AtomicBool::new(false),
            _profile: seccomp::Hold::new(),
            cfg,
        }
    }

    /// The settings in use.
    pub fn config(&self) -> &ContainerConfig {
        &self.cfg
    }

    /// The one-shot runs' capabilities.
    pub fn capabilities(&self) -> &BackendCapabilities {
        &self.caps
    }

    /// Its sessions' capabilities: the one-shot runs', in a container that
    /// persists across calls.
    pub fn session_capabilities(&self) -> &BackendCapabilities {
        &self.session_caps
    }

    /// Removes finished containers and staging directories off the request path.
    pub fn reaper(&self) -> &Reaper {
        &self.reaper
    }

    /// See [`Container::shutdown`](super::Container::shutdown).
    pub fn shutdown(&self) {
        self.shut_down.store(true, Ordering::SeqCst);
        self.warm.shutdown();
        owners::remove_own(&self.cfg.engine, Duration::from_secs(5));
        owners::remove_own_temp_dirs();
    }

    /// Cached: a positive answer for `availability_ttl`, a negative one for
    /// 2 s (the seccomp probe's positive verdict for the process's life, see
    /// `seccomp.rs`). The first check in a process also starts the cleanup
    /// of dead owners' containers (see `owners.rs`), off the request path.
    pub fn availability(&self) -> Result<(), Unavailable> {
        owners::start(&self.cfg.engine);
        let mut cached = self.availability.lock();
        if let Some((at, result)) = cached.as_ref() {
            let ttl = if result.is_ok() { self.cfg.availability_ttl } else { NEGATIVE_TTL };
            if at.elapsed() < ttl {
                return result.clone();
            }
        }
        let result = self.check_availability();
        *cached = Some((Instant::now(), result.clone()));
        result
    }

    /// `Ok` if the engine and images are there, else `backend_unavailable`
    /// (named `backend`: this backend's or its sessions').
    pub fn check_available(&self, backend: &str) -> Result<(), ExecError> {
        self.availability().map_err(|why| why.into_error(backend))
    }

    /// Forgets the cached answer and the seccomp verdict: the engine failed,
    /// and may come back as another engine.
    fn forget_availability(&self) {
        *self.availability.lock() = None;
        seccomp::forget(&self.probe_key());
    }

    /// Asks the engine whether the images exist (which also proves the
    /// daemon answers), then whether it applies execbox's seccomp profile
    /// (see `seccomp.rs`: kept once verified).
    fn check_availability(&self) -> Result<(), Unavailable> {
        let images = self.check_images();
        if images.is_err() {
            seccomp::forget(&self.probe_key());
        }
        images?;
        seccomp::verified(&self.probe_key(), || self.probe_seccomp())
    }

    /// What this backend's seccomp verdict depends on.
    fn probe_key(&self) -> ProbeKey {
        ProbeKey::new(&self.cfg.engine, &self.cfg.python_image, &self.cfg.extra_run_args)
    }

    /// Starts one container exactly as a run's (the locked flags, the
    /// configured extra arguments, the Python image) whose program is
    /// [`seccomp::PROBE`], and judges what it saw: unavailable unless the
    /// engine applied execbox's profile.
    fn probe_seccomp(&self) -> Result<(), Unavailable> {
        let engine = self.cfg.engine.display();
        let fix = "use docker or podman with a runtime that applies OCI seccomp profiles (runc, crun; \
                   gVisor's runsc only with --oci-seccomp)";
        let staging = Staging::empty(false)
            .map_err(|e| Unavailable::because(format!("cannot stage the seccomp probe's container: {e}")))?;
        let command = vec!["/usr/bin/python3".into(), "-I".into(), "-c".into(), seccomp::PROBE.into()];
        let limits = Limits {
            memory_bytes: SandboxPolicy::STRICT_MEMORY_BYTES,
            pids: self.cfg.default_pids,
            stop_after: PROBE_TIMEOUT.saturating_add(KILL_GRACE),
        };
        // On an error the staging, dropped, removes itself.
        let mut spec =
            locked_spec(&self.cfg, &staging, staging.mounts(), self.cfg.python_image.clone(), command, limits)
                .map_err(|e| Unavailable::because(e.to_string()))?;
        spec.role = "probe";
        let caps = Caps { stdout: Some(4 << 10), stderr: Some(4 << 10), tap: None };
        let end = self.run_spec(&spec, Vec::new(), caps, Deadline::start(Some(PROBE_TIMEOUT)));
        self.reaper.discard(staging.into_dir());
        let finished = match end {
            RunEnd::Finished(finished) => finished,
            RunEnd::SpawnFailed(reason) => return Err(Unavailable::because(reason)),
        };
        let stdout = finished.stdout.text();
        let exit = match finished.ended {
            process::Ended::EngineError(text) => {
                let text = crate::text::cap_message(text);
                return Err(Unavailable::new(
                    format!("{engine} cannot start a container under execbox's seccomp profile ({text})"),
                    fix,
                ));
            }
            process::Ended::TimedOut => {
                return Err(Unavailable::because(format!(
                    "the seccomp probe's container did not finish within {} s on {engine}",
                    PROBE_TIMEOUT.as_secs()
                )));
            }
            process::Ended::Exited { exit_code, .. } => exit_code,
        };
        seccomp::judge(&stdout).map_err(|seen| {
            let stderr = finished.stderr.text();
            let detail = match (exit, stderr.trim()) {
                (0, _) | (_, "") => seen,
                (code, stderr) => {
                    format!("{seen}; exit code {code}: {}", crate::text::cap_message(stderr.to_string()))
                }
            };
            Unavailable::new(
                format!(
                    "{engine} does not apply execbox's seccomp profile to its containers (the probe saw: {detail})"
                ),
                fix,
            )
        })
    }

    /// Asks the engine whether the images exist (which also proves the
    /// daemon answers).
    fn check_images(&self) -> Result<(), Unavailable> {
        let engine = self.cfg.engine.display();
        let images = [&self.cfg.python_image, &self.cfg.rust_image];
        let output = process::bounded_output(
            process::engine_command(&self.cfg.engine).args(["image", "inspect", "--format={{.Id}}"]).args(images),
            process::HOUSEKEEPING_TIMEOUT,
            64 << 10,
        )
        .map_err(|e| {
            Unavailable::new(
                format!("cannot run the container engine {engine}: {e}"),
                "install and start one with scripts/start-container-engine.sh",
            )
        })?;
        if output.status.success() {
            return Ok(());
        }
        let text = crate::text::cap_message(String::from_utf8_lossy(&output.stderr).trim().to_string());
        if text.to_ascii_lowercase().contains("no such image") {
            Err(Unavailable::new(
                format!("execbox's images are missing from {engine} ({text})"),
                "build them with scripts/build-images.sh",
            ))
        } else {
            Err(Unavailable::new(
                format!("the container engine {engine} does not answer ({text})"),
                "start one with scripts/start-container-engine.sh",
            ))
        }
    }

    /// The packages the data image declares (its `execbox.packages`
    /// label), cached like availability; none when the image is missing.
    pub fn data_image_packages(&self) -> Vec<String> {
        let mut cached = self.data_packages.lock();
        if let Some((at, packages)) = cached.as_ref() {
            let ttl = if packages.is_empty() { NEGATIVE_TTL } else { self.cfg.availability_ttl };
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

    /// The image a Python or shell request runs in: the data image when it
    /// declares packages (matching has checked that the image has them).
    pub fn script_image(&self, request: &ExecRequest) -> String {
        if request.packages.is_empty() { self.cfg.python_image.clone() } else { self.cfg.python_data_image.clone() }
    }

    /// The in-container command of a Python or shell request; `tools`: the
    /// run may call tools (see [`script_argv`]).
    pub fn script_command(&self, request: &ExecRequest, tools: bool) -> Result<Vec<String>, ExecError> {
        script_argv(request.language, tools, &request.args)
            .ok_or_else(|| ExecError::internal(NAME, format!("no script command for {}", request.language)))
    }

    /// Builds the run spec of `request` with its staged files; `limit` is
    /// the time the run has left (the in-container timer adds [`KILL_GRACE`]).
    pub fn spec(
        &self,
        request: &ExecRequest,
        staging: &Staging,
        image: String,
        command: Vec<String>,
        limit: Duration,
    ) -> Result<RunSpec, ExecError> {
        let policy = &request.policy;
        let memory_bytes = policy.memory_bytes.unwrap_or(self.cfg.defaults.memory_bytes);
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
        if let Some(workspace) = &request.workspace {
            self.check_workspace_user(workspace)?;
        }
        let mut mounts = staging.mounts();
        if let Access::Allow(grants) = &policy.filesystem {
            for (list, writable) in [(&grants.read_only, false), (&grants.read_write, true)] {
                for grant in list {
                    mounts.push(staging::grant_mount(&grant.host, grant.guest_path(), writable)?);
                }
            }
        }
        let limits = Limits { memory_bytes, pids, stop_after: limit.saturating_add(KILL_GRACE) };
        locked_spec(&self.cfg, staging, mounts, image, command, limits).map_err(|e| self.unavailable(e.to_string()))
    }

    /// Refuses a workspace whose files belong to another user than the one
    /// code runs as here: the code could not write them.
    fn check_workspace_user(&self, workspace: &crate::workspace::Workspace) -> Result<(), ExecError> {
        let (uid, gid) = workspace.code_user();
        let user = self.cfg.user.as_str();
        let matches = match user.split_once(':') {
            Some((u, g)) => u == uid.to_string() && g == gid.to_string(),
            None => user == uid.to_string(),
        };
        if matches {
            return Ok(());
        }
        Err(ExecError::BackendUnavailable {
            backend: NAME.into(),
            reason: format!("the workspace's files belong to {uid}:{gid}, but code runs as {user:?} here"),
            fix: Some("set WorkspaceConfig::code_user to the container backend's user (ContainerConfig::user)".into()),
        })
    }

    /// Runs one container for `spec`, capturing at most `caps` (stdout,
    /// stderr) bytes, streamed to the request's tap if it has one. The
    /// container goes to the reaper once it may exist.
    pub fn run_spec(&self, spec: &RunSpec, stdin: Vec<u8>, caps: Caps, deadline: Deadline) -> RunEnd {
        self.run_started(spec, None, stdin, caps, deadline)
    }

    /// [`Runner::run_spec`] on a container whose CLI was spawned already
    /// (`started`: a warm one), or spawned now (`None`).
    fn run_started(
        &self,
        spec: &RunSpec,
        started: Option<process::Spawned>,
        stdin: Vec<u8>,
        caps: Caps,
        deadline: Deadline,
    ) -> RunEnd {
        if self.shut_down.load(Ordering::SeqCst) {
            if let Some(mut started) = started {
                process::kill_group(&mut started.child);
                drop(started.child.wait());
                self.reaper.remove(spec.name.clone());
            }
            return RunEnd::SpawnFailed("the backend is shutting down".into());
        }
        let listing =
            spec.output_dir.as_ref().and_then(|out| out.listing_nonce.as_deref()).map(|nonce| {
                outputs::ListingTap::new(outputs::listing_marker(nonce), self.output_limits().listing_cap())
            });
        let invocation = process::Invocation {
            engine: &self.cfg.engine,
            listing,
            argv: if started.is_some() { Vec::new() } else { spec.argv() },
            started,
            end_nonce: spec.end_nonce.clone(),
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
    pub fn result(&self, end: RunEnd, deadline: &Deadline, staging: Staging) -> Result<ExecResult, ExecError> {
        let result = self.result_of(end, deadline, &staging);
        self.reaper.discard(staging.into_dir());
        result
    }

    fn result_of(&self, end: RunEnd, deadline: &Deadline, staging: &Staging) -> Result<ExecResult, ExecError> {
        let finished = match end {
            RunEnd::Finished(f) => f,
            RunEnd::SpawnFailed(reason) => return Err(self.unavailable(reason)),
        };
        let timed_out = matches!(finished.ended, process::Ended::TimedOut);
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
        let output_files = outputs::returned_files(
            staging.collects_outputs(),
            finished.listing.as_ref(),
            timed_out,
            "the container ended before it listed out/",
            self.output_limits(),
            &mut message,
        );
        let mut result = ExecResult::new(NAME, outcome);
        result.exit_code = exit_code;
        result.output = conventions::json_stdout(&finished.stdout);
        result.stdout = finished.stdout;
        result.stderr = finished.stderr;
        result.message = message;
        result.output_files = output_files;
        result.usage = Usage { duration: deadline.elapsed(), ..Usage::default() };
        Ok(result)
    }

    /// The caps on the files a run returns.
    pub fn output_limits(&self) -> OutputLimits {
        output_limits(&self.cfg)
    }

    /// This backend is unavailable because of `reason`.
    pub fn unavailable(&self, reason: String) -> ExecError {
        ExecError::unavailable(NAME, reason)
    }

    /// An engine failure: unavailable if it names a missing daemon or image
    /// (with the fix), internal otherwise.
    pub fn engine_error(&self, text: String) -> ExecError {
        self.forget_availability();
        let text = crate::text::cap_message(text);
        let lower = text.to_ascii_lowercase();
        if lower.contains("no such image") || lower.contains("unable to find image") {
            Unavailable::new(text, "build the images with scripts/build-images.sh").into_error(NAME)
        } else if lower.contains("cannot connect") || lower.contains("is the docker daemon running") {
            Unavailable::new(text, "start an engine with scripts/start-container-engine.sh").into_error(NAME)
        } else {
            ExecError::internal(NAME, format!("the container engine failed: {text}"))
        }
    }

    /// Runs a Python or shell request in one container; when its policy
    /// grants tools, with the run's tool socket (see `tool_socket.rs`),
    /// closed before the result is made.
    pub fn execute_script(&self, mut call: Admitted) -> Result<ExecResult, ExecError> {
        let deadline = call.deadline();
        let source = call.take_source(NAME)?;
        let input = call.take_input_json(self.cfg.defaults.max_input_nesting, NAME)?;
        let bridge = call.tools().cloned();
        let request = call.into_request();
        if let Some(key) = self.warm_key(&request, bridge.is_some(), &deadline)
            && let Some(warm) = self.warm.take(&key)
        {
            return self.run_warm(warm, &request, source.into_bytes(), input.as_deref(), deadline);
        }
        let staging = Staging::new(&request, input.as_deref())?;
        let socket = self.tool_socket(bridge.as_ref())?;
        let command = self.script_command(&request, socket.is_some())?;
        let limit = deadline.remaining().unwrap_or(Duration::MAX);
        let mut spec = self.spec(&request, &staging, self.script_image(&request), command, limit)?;
        let mut stdin = Vec::new();
        if let (Some(socket), Some(bridge)) = (&socket, &bridge) {
            socket.attach(&mut spec, request.language == Language::Shell)?;
            if request.language == Language::Python {
                stdin = python_header("", bridge);
            }
        }
        stdin.extend_from_slice(source.as_bytes());
        drop(source);
        let end = self.run_spec(&spec, stdin, Caps::of(&request), deadline);
        drop(socket);
        self.result(end, &deadline, staging)
    }

    /// The warm pool a run can take a container from, if it fits one (see
    /// `warm.rs`): Python without environment, arguments, path grants or
    /// tools, with a deadline the warm container's timer covers; its image,
    /// packages, `/work/out` and caps name the pool.
    fn warm_key(&self, request: &ExecRequest, tools: bool, deadline: &Deadline) -> Option<WarmKey> {
        let policy = &request.policy;
        let grants = match &policy.filesystem {
            Access::Allow(grants) => !grants.read_only.is_empty() || !grants.read_write.is_empty(),
            _ => false,
        };
        let fits = self.warm.enabled()
            && request.language == Language::Python
            && !tools
            && request.args.is_empty()
            && request.env.is_empty()
            && !grants
            && request.workspace.is_none()
            && deadline.remaining().is_some_and(|left| left <= self.cfg.defaults.timeout);
        fits.then(|| {
            let mut packages = request.packages.clone();
            packages.sort();
            packages.dedup();
            WarmKey {
                image: self.script_image(request),
                packages,
                outputs: request.collect_output_files,
                memory_bytes: policy.memory_bytes.unwrap_or(self.cfg.defaults.memory_bytes),
                pids: policy.max_processes.unwrap_or(self.cfg.default_pids),
            }
        })
        .filter(|key| key.memory_bytes >= MIN_MEMORY_BYTES && key.pids > 0)
    }

    /// Runs `request` in a warm container: its files staged into the
    /// container's `/work`, its code sent; the container is removed after.
    fn run_warm(
        &self,
        warm: Warm,
        request: &ExecRequest,
        source: Vec<u8>,
        input: Option<&[u8]>,
        deadline: Deadline,
    ) -> Result<ExecResult, ExecError> {
        let Warm { spec, staging, mut spawned, .. } = warm;
        if let Err(e) = staging.stage_run(request, input) {
            process::kill_group(&mut spawned.child);
            drop(spawned.child.wait());
            self.reaper.remove(spec.name.clone());
            self.reaper.discard(staging.into_dir());
            return Err(e);
        }
        let end = self.run_started(&spec, Some(spawned), source, Caps::of(request), deadline);
        self.result(end, &deadline, staging)
    }

    /// Starts the warm pool of plain Python runs (no packages, no output
    /// files) under [`SandboxPolicy::strict`]'s caps, a request's default
    /// policy, if the pool is on.
    pub fn prepare_warm(&self) {
        self.warm.want(WarmKey {
            image: self.cfg.python_image.clone(),
            packages: Vec::new(),
            outputs: false,
            memory_bytes: SandboxPolicy::STRICT_MEMORY_BYTES,
            pids: self.cfg.default_pids,
        });
    }

    /// The warm pool's ready containers and target, if it is on.
    pub fn warm_counts(&self) -> Option<(usize, usize)> {
        self.warm.enabled().then(|| self.warm.counts())
    }

    /// The tool socket of a run with `bridge` (none without), its calls
    /// going to `bridge` from now on.
    pub fn tool_socket(&self, bridge: Option<&Arc<ToolBridge>>) -> Result<Option<ToolSocket>, ExecError> {
        let Some(bridge) = bridge else { return Ok(None) };
        let socket =
            ToolSocket::start().map_err(|e| self.unavailable(format!("cannot open the run's tool socket: {e}")))?;
        socket.begin(Some(bridge.clone()));
        Ok(Some(socket))
    }
}

/// The command of a Python or shell run whose code comes on stdin, with
/// its arguments (`None` for other languages); `tools`: the run may call
/// tools (Python's bootstrap then installs the `tools` module from the
/// header before the code). Kubernetes runs start the same command.
pub(crate) fn script_argv(language: Language, tools: bool, args: &[String]) -> Option<Vec<String>> {
    let bootstrap = if tools { conventions::PYTHON_SOCKET_TOOLS_BOOTSTRAP } else { conventions::PYTHON_BOOTSTRAP };
    let mut command: Vec<String> = match language {
        // Absolute: the request's environment may set its own PATH.
        Language::Python => vec!["/usr/bin/python3".into(), "-c".into(), bootstrap.into()],
        // Shell scripts are bash scripts (a POSIX script runs as well);
        // execbox's images carry bash beside dash, their /bin/sh. The
        // script comes on stdin; bash reads it from there as a file
        // (fd 3), and its commands get /dev/null (`bash -s` read its
        // script from their stdin a line at a time, so `read` or `wc`
        // took the rest of the script as their input).
        Language::Shell => vec!["/bin/bash".into(), "-c".into(), SHELL_FROM_STDIN.into(), "bash".into()],
        _ => return None,
    };
    command.extend(args.iter().cloned());
    Some(command)
}

/// The caps a spec is built with.
struct Limits {
    memory_bytes: u64,
    pids: u64,
    stop_after: Duration,
}

/// The one place a run's spec is made, cold or warm (and the seccomp
/// probe's): every locked setting from `cfg`, execbox's seccomp profile
/// (written now if this process has no copy: the only error), the
/// staging's env file, `mounts`, and `/work/out` when the staging collects
/// outputs.
fn locked_spec(
    cfg: &ContainerConfig,
    staging: &Staging,
    mounts: Vec<super::argv::Mount>,
    image: String,
    command: Vec<String>,
    limits: Limits,
) -> std::io::Result<RunSpec> {
    Ok(RunSpec {
        name: container_name("execbox-"),
        image,
        memory_bytes: limits.memory_bytes,
        cpus: cfg.cpus,
        pids: limits.pids,
        tmp_bytes: cfg.tmp_bytes,
        user: cfg.user.clone(),
        seccomp_profile: seccomp::profile_path()?,
        max_file_bytes: Some(cfg.max_output_file_bytes),
        env_file: staging.env_file(),
        env: Vec::new(),
        mounts,
        output_dir: staging.collects_outputs().then(|| OutputTmpfs {
            bytes: output_limits(cfg).tmpfs_bytes(),
            inodes: OUTPUT_INODES,
            listing_nonce: Some(crate::nonce::hex128()),
        }),
        workdir: WORKDIR.into(),
        extra_args: cfg.extra_run_args.clone(),
        command,
        stop_after: limits.stop_after,
        end_nonce: None,
        role: "run",
    })
}

/// A warm container's spec and staging for `key` (see `warm.rs`): a cold
/// run's locked spec at the default caps, its command the warm bootstrap,
/// its end record's nonce the listing's, its timer covering the longest
/// wait and run.
pub(super) fn warm_spec(cfg: &ContainerConfig, key: &WarmKey) -> std::io::Result<(RunSpec, Staging)> {
    let staging = Staging::empty(key.outputs)?;
    let command = warm_python_argv(&key.packages, key.outputs);
    let stop_after = cfg.warm_lifetime.saturating_add(cfg.defaults.timeout).saturating_add(KILL_GRACE);
    // The end-record wrapper is one process more than a cold run has (a
    // cold run that collects outputs has its own wrapper): the cap counts
    // it, so that the program may start exactly as many as in a cold run.
    let pids = if key.outputs { key.pids } else { key.pids.saturating_add(1) };
    let limits = Limits { memory_bytes: key.memory_bytes, pids, stop_after };
    let mut spec = locked_spec(cfg, &staging, staging.mounts(), key.image.clone(), command, limits)?;
    let nonce = match spec.output_dir.as_ref().and_then(|out| out.listing_nonce.clone()) {
        Some(nonce) => nonce,
        None => crate::nonce::hex128(),
    };
    spec.end_nonce = Some(nonce);
    spec.role = "warm";
    Ok((spec, staging))
}

/// A package name Python can import as it is (dotted identifiers); others
/// are left for the code to import.
/// The command of a warm Python (a container's or a pod's): the warm
/// bootstrap, which imports `packages` (those that can name a module), says
/// ready and waits for its code. `collects`: the run collects output files,
/// so the interpreter's teardown (which closes the files the code left
/// open) is kept.
pub(crate) fn warm_python_argv(packages: &[String], collects: bool) -> Vec<String> {
    vec![
        "/usr/bin/python3".to_string(),
        "-c".into(),
        if collects {
            conventions::PYTHON_WARM_CONTAINER_BOOTSTRAP.into()
        } else {
            conventions::PYTHON_WARM_CONTAINER_FAST_EXIT_BOOTSTRAP.into()
        },
        packages.iter().filter(|p| importable(p)).cloned().collect::<Vec<_>>().join(","),
    ]
}

fn importable(name: &str) -> bool {
    !name.is_empty()
        && name.split('.').all(|part| {
            part.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

/// The caps on the files a run returns.
fn output_limits(cfg: &ContainerConfig) -> OutputLimits {
    OutputLimits {
        max_files: cfg.max_output_files,
        max_file_bytes: cfg.max_output_file_bytes,
        max_total_bytes: cfg.max_output_total_bytes,
    }
}

impl Drop for Runner {
    /// Waits for the start-up sweep (the reaper, a field, is joined next):
    /// nothing this backend started outlives it.
    fn drop(&mut self) {
        owners::finish_sweeps();
    }
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
                "read-only root filesystem; no host path is mounted but execbox's own staging (/work, \
                 read-only); /tmp and, when output files are collected, /work/out are private tmpfs \
                 (/work/out capped at max_output_total_bytes and 32768 entries)",
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
             host dies (a warm container's, started before its run: at its start + warm_lifetime + the default \
             timeout + 2 s, which covers any run it takes; the host's watcher removes it as soon as the host \
             dies); Rust: the compile and the run share the request's deadline (the compile is also capped \
             by RustConfig::compile_timeout)",
        ),
        memory: E::enforced(format!(
            "cgroup --memory = --memory-swap (default {} MiB); the OOM killer ends the run",
            cfg.defaults.memory_bytes >> 20
        )),
        fuel: E::not_enforced("containers have no instruction budget; use the timeout"),
        stdout_cap: E::enforced(cap),
        stderr_cap: E::enforced(cap),
        processes: E::enforced(format!("cgroup --pids-limit (default {})", cfg.default_pids)),
        tools: SurfaceCapability {
            deny: E::by_omission(
                "a run whose policy grants no tools gets no tool socket (no mount, no variable): its code has \
                 no channel to the host's tools; a session's cell without a grant has every call answered \
                 not_granted",
            ),
            allow_list: E::enforced(
                "a granted run gets a Unix socket bind-mounted read-only at /run/execbox/tools.sock (also in \
                 $EXECBOX_TOOLS; --network=none stays): Python's `tools` module, the shell's `tool` command and \
                 Rust's `tools` module send each call there as a JSON line, and the host hands it to the run's \
                 tool bridge, which runs only granted tools within the run's tool budgets; no answer is waited \
                 for past the run's deadline and the socket closes when the run ends",
            ),
        },
        workspace: E::enforced(
            "bind-mounted read-write at /work (the input files and input.json written into it first; \
             /work/out, when collected, stays the run's own tmpfs); the quota is the workspace's own tmpfs \
             size and inode cap, enforced by the kernel on the container's writes (ENOSPC), and a hard link \
             to a file outside it fails (EXDEV)",
        ),
        default_timeout_ms: u64::try_from(cfg.defaults.timeout.as_millis()).unwrap_or(u64::MAX),
    }
}
