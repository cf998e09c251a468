//! The `kubernetes` backend: Python, shell and Rust in a fresh, locked-down pod
//! per call, created through the Kubernetes API (kube-rs), on any cluster
//! a kubeconfig names. Build one with [`Kubernetes::new`]; its settings
//! are a [`KubernetesConfig`].
//!
//! **A run is two objects**, made by `manifest.rs` and deleted when the
//! run ends:
//! - a ConfigMap carrying the launcher (`launch.py`), the setup
//!   (`setup.py`), the code, `input.json` and the input files (at most
//!   700 KiB together: a ConfigMap's own limit);
//! - a Pod in the docker backend's locked shape: uid 65534, read-only root,
//!   every capability dropped, no privilege escalation, seccomp
//!   `RuntimeDefault`, no service account token, no service links, memory
//!   and CPU limits, `activeDeadlineSeconds`, and memory-backed, size-capped
//!   `emptyDir`s at `/tmp`, `/dev/shm` and (when collected) `/work/out`.
//!
//! **Network denied by construction**, not by a NetworkPolicy (which a
//! cluster may not enforce): the pod's init container `setup`, root with
//! only `NET_ADMIN`, takes every interface but `lo` down and removes its
//! address before the unprivileged program starts, then stages `/work`
//! (read-only to the program).
//!
//! **The launcher** (`launch.py`, pid 1 of the main container, not
//! dumpable) starts the program with the code on stdin, exactly as the
//! docker backend's command (`container::script_argv`), with the image's
//! environment, the request's values, and no `KUBERNETES_*` variable;
//! frames its stdout and stderr as base64 records in the pod's log up to
//! the run's caps (`records.rs`); kills what is left of it when it ends;
//! lists `/work/out` with the docker backend's listing; and reports the
//! status. The host reads the log as it comes (the output tap sees it
//! live) and holds every record to the caps again.
//!
//! **Lifetime**: the host deletes the pod at the deadline; the launcher
//! kills the program by itself 2 s later, and the kubelet ends the pod at
//! `activeDeadlineSeconds` even if the host died. Every object carries the
//! label `app.kubernetes.io/managed-by=execbox`, its maker's
//! `execbox.dev/owner`, and an `execbox.dev/expires` time after which any
//! execbox process's sweep (once a minute) deletes it.
//!
//! **Available only where proven**: the first availability check in a
//! process runs a probe pod of exactly a run's shape (`probe.rs`): unless
//! it finds itself off the network, unprivileged, filtered by seccomp,
//! without a token and with capped `/tmp`, the backend is unavailable,
//! saying which control failed.
//!
//! **Warm pods** (`warm_pods`): pods of a run's shape, started ahead and
//! claimed by one run each (a resourceVersion-checked label patch, so
//! replicas share the pools); the run is delivered over the pod's stdin.
//! Their launcher has started Python ahead (a package set's pool: with the
//! set imported); a Python run without environment values or arguments is
//! handed to it, any other run gets a fresh program.
//!
//! **Rust** (with [`KubernetesConfig::rust_image`]): the pod's `compile`
//! init container, in the toolchain image and as unprivileged as `main`,
//! compiles the docker backend's `main.rs` (the code and the harness) with
//! its rustc arguments; `main` runs the program with the input on stdin.
//! The compiler's log gives the diagnostics; a failed compile ends the pod
//! before `main` starts. Always cold, with no binary cache.
//!
//! **Code Mode** (a run whose policy grants tools): the launcher listens at
//! the docker backend's socket path in the pod and carries its connections
//! up the log and down the pod's attached stdin to the run's host tool
//! socket, the docker backend's (`relay.rs`), so every call meets the same
//! bridge and bounds. A warm pod takes such a run with a fresh program.
//!
//! Not here (refused at admission, named): host path grants and workspaces
//! (the cluster's nodes are not the host), per-request process caps
//! (Kubernetes 1.20 has only the kubelet's node-wide `podPidsLimit`),
//! sessions.

mod cluster;
mod config;
mod manifest;
mod probe;
mod records;
mod relay;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub use config::KubernetesConfig;

use crate::admission::Admitted;
use crate::backend::{Backend, Readiness, Unavailable};
use crate::backends::container::outputs::{self, OutputLimits};
use crate::backends::container::{ToolSocket, rust};
use crate::backends::conventions;
use crate::capabilities::{
    BackendCapabilities, CostClass, Enforcement, IsolationKind, PayloadKind, RequestFeatures, SurfaceCapability,
};
use crate::error::{ConfigError, ExecError, InvalidRequest};
use crate::file::ExecFile;
use crate::language::Language;
use crate::limits::deadline::Deadline;
use crate::result::{ExecResult, FailureKind, Outcome, Usage};
use cluster::{Cluster, JobEnd, JobError};
use manifest::Job;
use records::{End, Records};

/// Most stdout or stderr the launcher sends of a run whose policy caps
/// neither: the pod's log is on the node's disk.
const UNCAPPED_STREAM_BYTES: u64 = 64 << 20;

/// How long a negative availability answer is trusted.
const NEGATIVE_TTL: Duration = Duration::from_secs(2);

/// Most package sets with a warm pool of their own (each holds
/// `warm_pods` pods, each reserving the default memory on a node).
const MAX_PACKAGE_POOLS: usize = 4;

/// rustc's `opt-level` (the docker backend's default, `RustConfig::opt_level`).
const RUST_OPT_LEVEL: u8 = 1;

/// The probe pod's deadline (a cold start on a busy node included).
const PROBE_TIMEOUT: Duration = Duration::from_secs(60);

/// Python and shell in fresh pods; see the module docs.
///
/// A handle: clones share the client, its runtime and the availability
/// verdict.
#[derive(Clone)]
pub struct Kubernetes {
    inner: Arc<Inner>,
}

struct Inner {
    cluster: Cluster,
    caps: BackendCapabilities,
    /// The last reachability check: when, and its answer.
    reachable: OneAtATime<()>,
    /// The probe's verdict (the packages found), once positive; a negative
    /// one with its time.
    probe: OneAtATime<Vec<String>>,
    sweeping: AtomicBool,
    /// The plain warm pool's refill was started.
    warming: AtomicBool,
    /// The plain warm pool's name (see [`Kubernetes::plain_pool`]), hashed
    /// once rather than on every run.
    plain_pool: String,
    /// The package sets' warm pools started.
    package_pools: Mutex<std::collections::BTreeSet<String>>,
    shut_down: AtomicBool,
}

/// An availability answer and when it was made.
type Checked<T> = (Instant, Result<T, Unavailable>);

/// A check that one caller makes at a time while the others take the last
/// answer at once: a cluster that accepts connections and never answers
/// makes a check last ~20 s (a probe pod up to a minute), and callers
/// queued behind it (every admission, every `/readyz`) would hold runs of
/// other backends and tie up threads for as long.
struct OneAtATime<T> {
    last: Mutex<Option<Checked<T>>>,
    running: AtomicBool,
}

impl<T: Clone> OneAtATime<T> {
    fn new() -> Self {
        Self { last: Mutex::new(None), running: AtomicBool::new(false) }
    }

    /// The last answer if `fresh` says it still holds; else a new one from
    /// `check`, or, while another caller checks, the last answer (or
    /// `unavailable: being checked` before the first).
    fn get(
        &self,
        fresh: impl Fn(&Checked<T>) -> bool,
        check: impl FnOnce() -> Result<T, Unavailable>,
    ) -> Result<T, Unavailable> {
        if let Some((_, answer)) = self.last.lock().as_ref().filter(|c| fresh(c)) {
            return answer.clone();
        }
        if self.running.swap(true, Ordering::SeqCst) {
            return match self.last.lock().as_ref() {
                Some((_, answer)) => answer.clone(),
                None => Err(Unavailable::because("the cluster is being checked; try again in a moment")),
            };
        }
        // Lets the next caller check even if `check` panics.
        let _done = crate::guard::on_drop(|| self.running.store(false, Ordering::SeqCst));
        let answer = check();
        *self.last.lock() = Some((Instant::now(), answer.clone()));
        answer
    }

    /// The last answer, if any, without checking.
    fn answer(&self) -> Option<Result<T, Unavailable>> {
        self.last.lock().as_ref().map(|(_, answer)| answer.clone())
    }

    /// Forgets the last answer: the next caller checks again.
    fn forget(&self) {
        *self.last.lock() = None;
    }
}

impl Kubernetes {
    /// The backend's name in results and refusals.
    pub const NAME: &'static str = "kubernetes";

    /// A backend with `cfg`. Refuses settings no pod could run under.
    /// Nothing talks to the cluster until the first availability check.
    pub fn new(cfg: KubernetesConfig) -> Result<Self, ConfigError> {
        cfg.check()?;
        let caps = capabilities(&cfg);
        let plain_pool =
            pool_name(&cfg, "python", &cfg.python_image, crate::backends::container::warm_python_argv(&[], true));
        let cluster = Cluster::new(cfg)
            .map_err(|e| ConfigError::Unsupported { reason: format!("cannot start the client's runtime: {e}") })?;
        let inner = Inner {
            cluster,
            caps,
            reachable: OneAtATime::new(),
            probe: OneAtATime::new(),
            sweeping: AtomicBool::new(false),
            warming: AtomicBool::new(false),
            plain_pool,
            package_pools: Mutex::new(Default::default()),
            shut_down: AtomicBool::new(false),
        };
        Ok(Self { inner: Arc::new(inner) })
    }

    /// The settings in use.
    pub fn config(&self) -> &KubernetesConfig {
        self.inner.cluster.config()
    }

    /// The names of execbox's pods in the namespace now: runs in flight
    /// (this process's and others') and what a dead host left before its
    /// objects expired and were swept.
    pub fn leftovers(&self) -> Result<Vec<String>, Unavailable> {
        self.inner.cluster.leftovers()
    }

    /// Deletes now the pods and ConfigMaps past their `execbox.dev/expires`
    /// time, whoever made them (what the once-a-minute sweep does).
    pub fn sweep(&self) {
        self.inner.cluster.sweep();
    }

    /// The reachability check (cached), then the probe (once positive).
    fn check(&self) -> Result<(), Unavailable> {
        if self.inner.shut_down.load(Ordering::SeqCst) {
            return Err(Unavailable::because("the backend is shutting down"));
        }
        let ttl = self.config().availability_ttl;
        self.inner.reachable.get(
            |(at, answer)| at.elapsed() < if answer.is_ok() { ttl } else { NEGATIVE_TTL },
            || self.inner.cluster.reachable(),
        )?;
        if !self.inner.sweeping.swap(true, Ordering::SeqCst) {
            self.inner.cluster.start_sweeps();
        }
        self.probed()?;
        if self.config().warm_pods > 0 && !self.inner.warming.swap(true, Ordering::SeqCst) {
            let python = crate::backends::container::warm_python_argv(&[], true);
            self.start_pool(self.plain_pool(), self.config().python_image.clone(), Some(python), None);
        }
        Ok(())
    }

    /// Keeps warm pods of `pool` in `image`, their program `preload` if any,
    /// until the pool is idle for `idle_after`, if given.
    fn start_pool(&self, pool: String, image: String, preload: Option<Vec<String>>, idle_after: Option<Duration>) {
        // The template holds the settings, never the backend: the refill
        // runs on the backend's runtime and must not keep it alive.
        let (cfg, name) = (self.config().clone(), pool.clone());
        let template = move || warm_job(&cfg, &name, &image, preload.clone());
        self.inner.cluster.start_warm(pool, self.config().warm_pods, idle_after, template);
    }

    /// The plain pool's name: the plain image at the default memory cap.
    /// Its pods take Python and shell runs with any environment and
    /// arguments: their waiting Python takes a run without either, any
    /// other gets a fresh program.
    fn plain_pool(&self) -> String {
        self.inner.plain_pool.clone()
    }

    /// The warm pool `job` (of `request`) may run on, if any: the pool's
    /// memory, and a deadline the pod's remaining life covers; the plain
    /// image's runs take the plain pool. A Python run with packages takes
    /// the pool of its package set, whose pods have imported them already
    /// (so it brings no environment values or arguments: the program has
    /// started without them). Such a pool is started by the first run of
    /// its set, which runs cold; at most [`MAX_PACKAGE_POOLS`] are kept,
    /// each until nothing was claimed of it for `warm_lifetime`.
    /// `preloaded`: the run can be a waiting Python's (see
    /// [`takes_waiting_python`]; not when it calls tools).
    fn warm_pool_for(&self, job: &Job, request: &crate::request::ExecRequest, preloaded: bool) -> Option<String> {
        let cfg = self.config();
        // A Rust run's pod compiles before its program starts.
        let cold_only = job.compile.is_some();
        if cfg.warm_pods == 0
            || cold_only
            || job.memory_bytes != cfg.defaults.memory_bytes
            || job.limit > cfg.defaults.timeout
        {
            return None;
        }
        // A warm pod mounts /work/out whether the run collects or not, and
        // its /work is the memory cap's size.
        let out = |f: &ExecFile| f.name == "out" || f.name.starts_with("out/");
        if job.files.iter().any(out) || job.work_bytes() > job.memory_bytes {
            return None;
        }
        if job.image == cfg.python_image {
            return Some(self.plain_pool());
        }
        if !preloaded {
            return None;
        }
        // The names as the probe found them (admission matched them without
        // regard to case), so `Pandas` and `pandas` are one set.
        let found = self.probed().unwrap_or_default();
        let mut packages: Vec<String> = request
            .packages
            .iter()
            .map(|name| found.iter().find(|f| f.eq_ignore_ascii_case(name)).unwrap_or(name).clone())
            .collect();
        packages.sort();
        packages.dedup();
        let preload = crate::backends::container::warm_python_argv(&packages, job.outputs.is_some());
        let pool = pool_name(cfg, "data", &cfg.python_data_image, preload.clone());
        let mut kept = self.inner.package_pools.lock();
        // A pool given up as idle frees its place; its set's next run starts it again.
        kept.retain(|pool| self.inner.cluster.keeps(pool));
        if kept.contains(&pool) {
            return Some(pool);
        }
        if kept.len() < MAX_PACKAGE_POOLS {
            kept.insert(pool.clone());
            let idle_after = Some(cfg.warm_lifetime);
            self.start_pool(pool, cfg.python_data_image.clone(), Some(preload), idle_after);
        }
        None
    }

    /// The probe's verdict: run once per process while it passes.
    fn probed(&self) -> Result<Vec<String>, Unavailable> {
        self.inner.probe.get(|(at, answer)| answer.is_ok() || at.elapsed() < NEGATIVE_TTL, || self.probe())
    }

    /// Runs `probe.py` in the data image, through a run's whole path.
    fn probe(&self) -> Result<Vec<String>, Unavailable> {
        let cfg = self.config();
        let mut argv = vec!["/usr/bin/python3".to_string(), "-I".into(), "-".into()];
        argv.extend(cfg.data_packages.iter().cloned());
        let job = Job {
            name: pod_name(),
            role: "probe",
            image: cfg.python_data_image.clone(),
            argv,
            code: probe::SOURCE.as_bytes().to_vec(),
            files: Vec::new(),
            env: BTreeMap::new(),
            memory_bytes: cfg.defaults.memory_bytes,
            stdout_cap: 64 << 10,
            stderr_cap: 64 << 10,
            outputs: None,
            limit: PROBE_TIMEOUT,
            pool: None,
            preload: None,
            compile: None,
            tools: None,
        };
        let records = Records::new(Some(64 << 10), Some(64 << 10), None, 0);
        let records = match self.inner.cluster.run(job, records, Some(PROBE_TIMEOUT), None) {
            Ok(JobEnd::Read { records, .. }) => records,
            Ok(JobEnd::TimedOut { .. } | JobEnd::CompileFailed { .. }) => {
                return Err(Unavailable::because(format!(
                    "the probe pod did not finish within {} s",
                    PROBE_TIMEOUT.as_secs()
                )));
            }
            Err(JobError::Unavailable(why)) => return Err(why),
            Err(JobError::Internal(why) | JobError::Busy(why) | JobError::NotDelivered(why, _)) => {
                return Err(Unavailable::because(format!("the probe pod: {why}")));
            }
        };
        let stdout = records.stdout.into_captured().text().into_owned();
        match records.end {
            Some(End::Exited { status: 0, .. }) => probe::judge(&stdout, cfg.tmp_bytes, cfg.seccomp_profile.as_deref()),
            end => Err(Unavailable::because(format!(
                "the probe pod ended {end:?}: {}",
                crate::text::cap_message(format!("{}{}", records.stderr.into_captured().text(), records.noise))
            ))),
        }
    }

    /// The caps on the files a run returns.
    fn output_limits(&self) -> OutputLimits {
        let cfg = self.config();
        OutputLimits {
            max_files: cfg.max_output_files,
            max_file_bytes: cfg.max_output_file_bytes,
            max_total_bytes: cfg.max_output_total_bytes,
        }
    }

    /// The pod job of an admitted request.
    fn job(&self, call: &mut Admitted, limit: Duration) -> Result<Job, ExecError> {
        let cfg = self.config();
        let source = call.take_source(Self::NAME)?;
        let input = call.take_input_json(cfg.defaults.max_input_nesting, Self::NAME)?;
        let request = call.request();
        let policy = &request.policy;
        let memory_bytes = policy.memory_bytes.unwrap_or(cfg.defaults.memory_bytes);
        if !(config::MIN_MEMORY_BYTES..=config::MAX_MEMORY_BYTES).contains(&memory_bytes) {
            return Err(InvalidRequest::LimitOutOfRange {
                limit: "memory_bytes",
                value: memory_bytes,
                reason: format!(
                    "a Kubernetes run takes {} to {} bytes",
                    config::MIN_MEMORY_BYTES,
                    config::MAX_MEMORY_BYTES
                ),
            }
            .into());
        }
        // The executor's rules hold for direct `Backend::execute` calls too;
        // a NUL cannot reach a program's environment.
        crate::admission::validate_env(request)?;
        if let Some((name, _)) = request.env.iter().find(|(n, v)| n.contains('\0') || v.contains('\0')) {
            return Err(InvalidRequest::BadEnv {
                name: name.clone(),
                reason: "names and values cannot hold NUL".into(),
            }
            .into());
        }
        // A run that may call tools: the docker backend's program, header
        // and variable; the launcher listens at the socket (`relay.rs`).
        let bridge = call.tools();
        let tools = bridge.map(|b| manifest::Tools { max_unread: crate::backends::container::unread_limit(Some(b)) });
        let mut env = request.env.clone();
        if tools.is_some() {
            env.insert("EXECBOX_TOOLS".into(), conventions::TOOLS_SOCKET.into());
        }
        // Python and shell read the code on stdin; a Rust program (compiled
        // first) reads the JSON input there, as the docker backend's.
        let (argv, code, compile) = match (request.language, &cfg.rust_image) {
            (Language::Rust, Some(image)) => {
                let (main_rs, user_lines) = rust::main_rs(&source);
                let compile = manifest::Compile {
                    image: image.clone(),
                    main_rs,
                    user_lines,
                    memory_bytes: cfg.compile_memory_bytes,
                    opt_level: RUST_OPT_LEVEL,
                };
                let program = format!("{}/program", manifest::BUILD_DIR);
                let argv = std::iter::once(program).chain(request.args.iter().cloned()).collect();
                (argv, input.clone().unwrap_or_default(), Some(compile))
            }
            (language, _) => {
                let argv = crate::backends::container::script_argv(language, tools.is_some(), &request.args)
                    .ok_or_else(|| ExecError::internal(Self::NAME, format!("matching let {language} through")))?;
                let mut code = match bridge {
                    Some(bridge) if language == Language::Python => crate::tools::wire::python_header("", bridge),
                    _ => Vec::new(),
                };
                code.extend_from_slice(source.as_bytes());
                (argv, code, None)
            }
        };
        let mut files = Vec::with_capacity(request.input_files.len() + 1);
        if let Some(json) = input {
            files.push(ExecFile { name: "input.json".into(), content: json, mime_type: None });
        }
        files.extend(request.input_files.iter().cloned());
        let files = staged_names(files, request.collect_output_files)?;
        let limits = self.output_limits();
        let outputs = request.collect_output_files.then(|| {
            let mut listing_argv =
                vec!["/bin/sh".to_string(), "-c".into(), outputs::COLLECT_SCRIPT.into(), "execbox-out".into()];
            listing_argv.extend(outputs::script_args(limits.tmpfs_bytes()));
            manifest::Outputs { tmpfs_bytes: limits.tmpfs_bytes(), listing_argv, listing_cap: limits.listing_cap() }
        });
        let job = Job {
            name: pod_name(),
            role: "run",
            image: if request.packages.is_empty() { cfg.python_image.clone() } else { cfg.python_data_image.clone() },
            argv,
            code,
            files,
            env,
            memory_bytes,
            stdout_cap: policy.max_stdout_bytes.unwrap_or(UNCAPPED_STREAM_BYTES).min(UNCAPPED_STREAM_BYTES),
            stderr_cap: policy.max_stderr_bytes.unwrap_or(UNCAPPED_STREAM_BYTES).min(UNCAPPED_STREAM_BYTES),
            outputs,
            limit,
            pool: None,
            preload: None,
            compile,
            tools,
        };
        job.check_size()?;
        Ok(job)
    }

    /// The result of a job that ran; `collects`: it collected output files.
    fn result(&self, end: JobEnd, deadline: &Deadline, collects: bool) -> Result<ExecResult, ExecError> {
        let (records, oom_killed, timed_out, started) = match end {
            JobEnd::Read { records, oom_killed, .. } => (records, oom_killed, false, true),
            JobEnd::TimedOut { records, started } => (records, false, true, started),
            JobEnd::CompileFailed { .. } => {
                return Err(ExecError::internal(Self::NAME, "a compile's end taken for a run's"));
            }
        };
        let ended = if timed_out { Some(End::TimedOut) } else { records.end };
        let (outcome, exit_code, mut message) = match ended {
            Some(End::Exited { status: 0, .. }) => (Outcome::Ok, Some(0), None),
            Some(End::Exited { status, .. }) if oom_killed => (
                Outcome::OutOfMemory,
                Some(status),
                Some("killed by the kernel's OOM killer at the memory cap".to_string()),
            ),
            Some(End::Exited { status, .. }) => {
                (Outcome::Failed, Some(status), Some(format!("exited with code {status}")))
            }
            Some(End::TimedOut) if !started => (
                Outcome::TimedOut,
                None,
                Some(format!(
                    "{} before the program started (the pod's start and any compile count)",
                    deadline.exceeded_message()
                )),
            ),
            Some(End::TimedOut) => (Outcome::TimedOut, None, Some(deadline.exceeded_message())),
            None if oom_killed => {
                (Outcome::OutOfMemory, None, Some("the pod was killed by the OOM killer at the memory cap".into()))
            }
            None => {
                let why = records.broken.unwrap_or("the launcher ended without its end record");
                let noise = crate::text::cap_message(records.noise.clone());
                return Err(ExecError::internal(Self::NAME, format!("{why}: {noise}")));
            }
        };
        if let Some(why) = records.broken {
            crate::text::add_note(&mut message, format!("the run's log was damaged ({why})"));
        }
        if let Some(why) = records.tools_lost() {
            crate::text::add_note(&mut message, format!("the program's tool calls got no answer: {why}"));
        }
        if records.tools_capped {
            crate::text::add_note(
                &mut message,
                format!(
                    "the program wrote over {} MiB to its tool socket, which was then closed",
                    records::MAX_TOOL_BYTES >> 20
                ),
            );
        }
        let output_files = outputs::returned_files(
            collects,
            records.listing.as_ref(),
            timed_out,
            "the pod ended before it listed out/",
            self.output_limits(),
            &mut message,
        );
        let (mut stdout, mut stderr) = (records.stdout.into_captured(), records.stderr.into_captured());
        if let Some(End::Exited { stdout_total, stderr_total, .. }) = records.end {
            // What the launcher counted but did not send.
            for (stream, total) in [(&mut stdout, stdout_total), (&mut stderr, stderr_total)] {
                stream.total_bytes = stream.total_bytes.max(total);
                stream.truncated |= stream.total_bytes > stream.bytes.len() as u64;
            }
        }
        let mut result = ExecResult::new(Self::NAME, outcome);
        result.exit_code = exit_code;
        result.output = conventions::json_stdout(&stdout);
        result.stdout = stdout;
        result.stderr = stderr;
        result.message = message;
        result.output_files = output_files;
        result.usage = Usage { duration: deadline.elapsed(), ..Usage::default() };
        Ok(result)
    }

    /// The result of a Rust job: a compile's failure as the docker
    /// backend gives it; else the run's, with the compile's warnings (in
    /// the caller's `user_lines`) and the returned value as `output`.
    fn rust_result(
        &self,
        mut end: JobEnd,
        deadline: &Deadline,
        collects: bool,
        user_lines: u32,
        request: &crate::request::ExecRequest,
    ) -> Result<ExecResult, ExecError> {
        let compile_log = match &mut end {
            JobEnd::Read { compile_log, .. } => compile_log.take(),
            JobEnd::CompileFailed { log, exit_code, oom_killed } => {
                // The shell could not start rustc: the image is not a toolchain.
                if *exit_code == 127 {
                    return Err(ExecError::BackendUnavailable {
                        backend: Self::NAME.into(),
                        reason: format!(
                            "the Rust image {} has no /opt/rust/bin/rustc: {}",
                            self.config().rust_image.as_deref().unwrap_or_default(),
                            crate::text::cap_message(log.clone())
                        ),
                        fix: Some(
                            "build it with scripts/build-rust-toolchain-image.sh, or set KubernetesConfig::rust_image"
                                .into(),
                        ),
                    });
                }
                let (diagnostics, rendered) = rust::parse_diagnostics(log.as_bytes(), user_lines);
                let (outcome, message, kind) = if *oom_killed {
                    let mib = self.config().compile_memory_bytes >> 20;
                    let message =
                        format!("the compiler ran out of its {mib} MiB (KubernetesConfig::compile_memory_bytes)");
                    (Outcome::OutOfMemory, message, None)
                } else if diagnostics.iter().any(|d| d.level == "error") {
                    (Outcome::Failed, rust::compile_error_message(&diagnostics), Some(FailureKind::CompileError))
                } else {
                    (
                        Outcome::Failed,
                        format!("the compiler failed with code {exit_code}"),
                        Some(FailureKind::CompileError),
                    )
                };
                let mut result = rust::compile_failed(Self::NAME, outcome, message, diagnostics, &rendered, request);
                result.failure_kind = kind;
                result.usage.duration = deadline.elapsed();
                return Ok(result);
            }
            JobEnd::TimedOut { .. } => None,
        };
        let mut result = self.result(end, deadline, collects)?;
        let (diagnostics, _) = rust::parse_diagnostics(compile_log.unwrap_or_default().as_bytes(), user_lines);
        result.diagnostics = rust::caller_warnings(diagnostics);
        rust::take_output(&mut result, request.policy.max_stdout_bytes);
        Ok(result)
    }
}

/// `files` named as they are staged under `/work`: each name relative,
/// without `..` (normalised: `./a//b` is `a/b`), none twice (`input.json`
/// beside a JSON input included), none both a file and another's
/// directory, and none under `out/` when `/work/out` is mounted there:
/// the docker backend's rules, checked before anything is created.
fn staged_names(files: Vec<ExecFile>, collects: bool) -> Result<Vec<ExecFile>, ExecError> {
    use std::collections::BTreeSet;
    use std::path::Component;
    let mut names = BTreeSet::new();
    let mut dirs = BTreeSet::new();
    let mut staged = Vec::with_capacity(files.len());
    for mut file in files {
        let bad = |reason: &str| InvalidRequest::BadPath { path: file.name.clone(), reason: reason.into() };
        let parts: Vec<String> = file
            .relative_path()?
            .components()
            .filter_map(|c| match c {
                Component::Normal(part) => Some(part.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect();
        if collects && parts.first().is_some_and(|first| first == "out") {
            return Err(bad("out/ is the output directory").into());
        }
        let name = parts.join("/");
        for depth in 1..parts.len() {
            dirs.insert(parts[..depth].join("/"));
        }
        if dirs.contains(&name) || !names.insert(name.clone()) {
            return Err(bad("staged twice, or both a file and a directory").into());
        }
        file.name = name;
        staged.push(file);
    }
    if let Some(clash) = staged.iter().find(|f| dirs.contains(&f.name)) {
        return Err(InvalidRequest::BadPath {
            path: clash.name.clone(),
            reason: "staged twice, or both a file and a directory".into(),
        }
        .into());
    }
    Ok(staged)
}

/// A warm pod of `pool` in `image`: a run's shape at the default caps,
/// waiting for its run up to `warm_lifetime`, then able to run for the
/// default timeout; its program `preload`, started before the run, if any.
fn warm_job(cfg: &KubernetesConfig, pool: &str, image: &str, preload: Option<Vec<String>>) -> Job {
    Job {
        name: pod_name(),
        role: "warm",
        image: image.to_string(),
        argv: Vec::new(),
        code: Vec::new(),
        files: Vec::new(),
        env: BTreeMap::new(),
        memory_bytes: cfg.defaults.memory_bytes,
        stdout_cap: 0,
        stderr_cap: 0,
        outputs: None,
        limit: cfg.warm_lifetime.saturating_add(cfg.defaults.timeout),
        pool: Some(pool.to_string()),
        preload,
        compile: None,
        tools: None,
    }
}

/// The name of a warm pool (`<kind>-<hash>-<MiB>mi`, a valid label
/// value): the hash of its pods' whole shape, the pod's spec and its
/// ConfigMap's data as `cfg` makes them (image, waiting program `preload`,
/// launcher, seccomp profile, limits, sizes, lifetime). Every replica with
/// the same settings names the same pool; a pod made under any other
/// setting (another profile, smaller caps, another build) is never
/// claimed, since a claim trusts the pod's shape.
fn pool_name(cfg: &KubernetesConfig, kind: &str, image: &str, preload: Vec<String>) -> String {
    use sha2::{Digest, Sha256};
    let mut job = warm_job(cfg, "-", image, Some(preload));
    // The one part of the shape that differs between a pool's pods.
    job.name = "execbox-pool".into();
    let spec = job.pod(cfg, "-").ok().and_then(|pod| serde_json::to_vec(&pod.spec).ok()).unwrap_or_default();
    let data = job.config_map("-", "-").ok().and_then(|map| serde_json::to_vec(&map.data).ok()).unwrap_or_default();
    let mut hash = Sha256::new();
    for part in [kind.as_bytes(), &spec, &data] {
        hash.update(part);
        hash.update([0]);
    }
    let digest = hash.finalize();
    format!("{kind}-{}-{}mi", hex::encode(&digest[..8]), cfg.defaults.memory_bytes >> 20)
}

/// Whether a warm pod's waiting Python can be `request`'s program: it was
/// started exactly as the run's would be, Python without environment
/// values or arguments.
fn takes_waiting_python(request: &crate::request::ExecRequest) -> bool {
    request.language == Language::Python && request.env.is_empty() && request.args.is_empty()
}

/// A fresh object name `execbox-<pid>-<counter>-<nonce>`.
fn pod_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("execbox-{}-{n}-{:08x}", std::process::id(), crate::nonce::random_u64() as u32)
}

impl std::fmt::Debug for Kubernetes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kubernetes").field("config", self.config()).finish_non_exhaustive()
    }
}

impl Backend for Kubernetes {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn capabilities(&self) -> &BackendCapabilities {
        &self.inner.caps
    }

    /// Whether the namespace answers (cached for
    /// [`availability_ttl`](KubernetesConfig::availability_ttl)) and the
    /// probe pod found every locked control holding (once per process).
    /// The first check also starts the sweep of expired objects.
    fn availability(&self) -> Result<(), Unavailable> {
        self.check()
    }

    fn execute(&self, mut call: Admitted) -> Result<ExecResult, ExecError> {
        self.check().map_err(|why| why.into_error(Self::NAME))?;
        if call.request().workspace.is_some() {
            return Err(ExecError::internal(Self::NAME, "matching let a workspace through"));
        }
        let deadline = call.deadline();
        let limit = deadline.remaining().unwrap_or(self.config().defaults.timeout);
        let job = self.job(&mut call, limit)?;
        // The host's end of the run's tool calls (the docker backend's
        // socket, bounds and bridge), closed before the result is made.
        let socket = match call.tools() {
            Some(bridge) => {
                let socket = ToolSocket::start().map_err(|e| {
                    Unavailable::because(format!("cannot open the run's tool socket: {e}")).into_error(Self::NAME)
                })?;
                socket.begin(Some(bridge.clone()));
                Some(socket)
            }
            None => None,
        };
        let socket_path = socket.as_ref().map(ToolSocket::path);
        let collects = job.outputs.is_some();
        let compiles = job.compile.as_ref().map(|c| c.user_lines);
        let request = call.into_request();
        let listing_cap = job.outputs.as_ref().map_or(0, |o| o.listing_cap);
        let records = Records::new(
            request.policy.max_stdout_bytes,
            request.policy.max_stderr_bytes,
            request.output_tap.clone(),
            listing_cap,
        );
        let cluster = &self.inner.cluster;
        // A run that calls tools gets a fresh program (the waiting one has
        // no `tools` module).
        let preloaded = takes_waiting_python(&request) && socket.is_none();
        let claimed = self.warm_pool_for(&job, &request, preloaded).and_then(|pool| {
            let (delivery, expires) = job.delivery(preloaded);
            cluster.claim(&pool, expires, limit).map(|name| (name, delivery))
        });
        let ran = match claimed {
            Some((name, delivery)) => {
                let left = deadline.remaining().unwrap_or(limit);
                match cluster.run_claimed(name, delivery, records, left, socket_path.clone()) {
                    // Nothing reached the warm pod: the run goes cold, as
                    // with an empty pool.
                    Err(JobError::NotDelivered(why, records)) => {
                        tracing::warn!(backend = Self::NAME, "{why}; running on a cold pod");
                        cluster.run(job, *records, deadline.remaining().or(Some(limit)), socket_path)
                    }
                    ran => ran,
                }
            }
            None => cluster.run(job, records, deadline.remaining().or(Some(limit)), socket_path),
        };
        drop(socket);
        match ran {
            Ok(end) => match compiles {
                Some(user_lines) => self.rust_result(end, &deadline, collects, user_lines, &request),
                None => self.result(end, &deadline, collects),
            },
            Err(JobError::Unavailable(why)) => {
                self.inner.reachable.forget();
                Err(why.into_error(Self::NAME))
            }
            Err(JobError::Busy(reason)) => Err(ExecError::Busy { backend: Self::NAME.into(), reason }),
            Err(JobError::Internal(why) | JobError::NotDelivered(why, _)) => Err(ExecError::internal(Self::NAME, why)),
        }
    }

    /// The warm pools' claimable pods, if they are on (the plain pool's
    /// and those of the package sets started).
    fn readiness(&self) -> Option<Readiness> {
        let per_pool = self.config().warm_pods;
        let (ready, pools) = self.inner.cluster.warm_ready();
        (per_pool > 0).then(|| Readiness { ready, target: per_pool * pools.max(1) })
    }

    /// Checks the cluster and runs the probe, off the first request's path.
    fn prepare(&self, _limit: Duration) {
        let _ = self.check();
    }

    /// Execbox's pods in the namespace ([`Kubernetes::leftovers`]); `None`
    /// when the cluster does not answer.
    fn leftovers(&self) -> Option<Vec<String>> {
        Kubernetes::leftovers(self).ok()
    }

    /// Deletes this process's pods and ConfigMaps (bounded, 10 s) and
    /// refuses later runs.
    fn shutdown(&self) {
        self.inner.shut_down.store(true, Ordering::SeqCst);
        self.inner.cluster.remove_own();
    }

    /// Those of [`KubernetesConfig::data_packages`] the probe found
    /// importable in the data image.
    ///
    /// Before the probe has answered (a fresh process's first seconds),
    /// the configured list: a run asking for them is then told the backend
    /// is being checked (`backend_unavailable`, to try again), not that the
    /// packages are not there.
    fn packages(&self, language: Language) -> Vec<String> {
        match (language, self.inner.probe.answer()) {
            (Language::Python | Language::Shell, Some(Ok(found))) => found,
            (Language::Python | Language::Shell, None) => self.config().data_packages.clone(),
            _ => Vec::new(),
        }
    }
}

fn capabilities(cfg: &KubernetesConfig) -> BackendCapabilities {
    use Enforcement as E;
    let cap = "framed by the pod's launcher up to the cap (the rest counted, never sent), and held to it again by \
               the host as it reads the pod's log";
    BackendCapabilities {
        isolation: IsolationKind::ContainerEphemeral,
        cost: CostClass::High,
        languages: if cfg.rust_image.is_some() {
            vec![Language::Python, Language::Shell, Language::Rust]
        } else {
            vec![Language::Python, Language::Shell]
        },
        payloads: vec![PayloadKind::Source],
        features: RequestFeatures { json_input: true, stdin: false, args: true, input_files: true, output_files: true },
        network: SurfaceCapability {
            deny: E::enforced(
                "the pod's init container (root with only NET_ADMIN) takes every interface but lo down before \
                 the program starts; the program holds no capability to bring one back; the availability probe \
                 checks this on the cluster itself",
            ),
            allow_list: E::not_enforced("a pod is either off the network or on the cluster's whole network"),
        },
        filesystem: SurfaceCapability {
            deny: E::enforced(
                "read-only root filesystem; /work (the staged input, read-only), /tmp, /dev/shm and /work/out are \
                 the pod's own memory-backed emptyDirs, size-capped; nothing of the host or the node",
            ),
            allow_list: E::not_enforced("host paths are not on the cluster's nodes"),
        },
        environment: SurfaceCapability {
            deny: E::enforced("only the image's own variables: the launcher removes the cluster's KUBERNETES_*"),
            allow_list: E::enforced(
                "exactly the request's values for allow-listed names, carried in the run's ConfigMap (never \
                 expanded by the kubelet)",
            ),
        },
        timeout: E::enforced(
            "at the deadline the host deletes the pod (no grace); the launcher kills every process of the \
             program 2 s later by itself, and the kubelet ends the pod at activeDeadlineSeconds even if the \
             host died; the deadline counts the pod's start",
        ),
        memory: E::enforced(format!(
            "the pod's memory limit, a cgroup (default {} MiB; the launcher and the memory-backed emptyDirs \
             count against it); the OOM killer ends the run",
            cfg.defaults.memory_bytes >> 20
        )),
        fuel: E::not_enforced("pods have no instruction budget; use the timeout"),
        stdout_cap: E::enforced(cap),
        stderr_cap: E::enforced(cap),
        processes: E::not_enforced(
            "Kubernetes 1.20 has no per-pod process limit: only the kubelet's podPidsLimit, the same for every pod \
             (1024 on scripts/kube/up.sh's cluster)",
        ),
        tools: SurfaceCapability {
            deny: E::by_omission(
                "a run whose policy grants no tools gets no tool socket, no stdin and no relay: its pod has no \
                 channel to the host's tools",
            ),
            allow_list: E::enforced(
                "a granted run's launcher listens at /run/execbox/tools.sock in the pod (also in $EXECBOX_TOOLS; \
                 the pod stays off the network): Python's `tools` module, the shell's `tool` command and Rust's \
                 `tools` module send each call there, the launcher carries the bytes up the pod's log and the \
                 answers down its attached stdin, and the host hands them to the docker backend's tool socket, \
                 whose bridge runs only granted tools within the run's tool budgets; at most 16 connections at \
                 once and 64 MiB of calls a run; the socket closes when the run ends",
            ),
        },
        workspace: E::not_enforced("workspaces are host directories, not on the cluster's nodes"),
        default_timeout_ms: u64::try_from(cfg.defaults.timeout.as_millis()).unwrap_or(u64::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `during` while another thread's check is under way (it ends
    /// with `answer` once `during` returns), and gives that check's answer.
    fn while_checking<T: Clone + Send + Sync>(
        checks: &OneAtATime<T>,
        answer: Result<T, Unavailable>,
        during: impl FnOnce(),
    ) -> Result<T, Unavailable> {
        let (started, release) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
        std::thread::scope(|scope| {
            let slow = scope.spawn(|| {
                checks.get(
                    |_| false,
                    || {
                        started.wait();
                        release.wait();
                        answer
                    },
                )
            });
            started.wait();
            during();
            release.wait();
            slow.join().unwrap()
        })
    }

    /// A warm pod is claimed only by a backend that would have made it
    /// the same: its pool's name hashes the pod's whole shape (an
    /// adversarial pass had a backend with execbox's seccomp profile claim
    /// pods made without it).
    #[test]
    fn a_pool_is_named_by_its_pods_whole_shape() {
        let base = KubernetesConfig::default();
        let name = |cfg: &KubernetesConfig| pool_name(cfg, "python", &cfg.python_image, vec!["py".into()]);
        assert_eq!(name(&base), name(&base.clone()), "replicas with one configuration share their pools");
        assert!(name(&base).ends_with("-256mi"), "{}", name(&base));
        let others = [
            base.clone().seccomp_profile("execbox.json"),
            base.clone().cpu_millis(500),
            base.clone().tmp_bytes(32 << 20),
            base.clone().defaults(base.defaults.clone().timeout(Duration::from_secs(90))),
            base.clone().warm_lifetime(Duration::from_secs(60)),
        ];
        for other in &others {
            assert_ne!(name(&base), name(other), "{other:?}");
        }
        assert_ne!(name(&base), pool_name(&base, "python", &base.python_image, vec!["other".into()]));
    }

    /// Before the probe has answered, the configured packages are declared
    /// (a run asking for them is told the backend is being checked, not
    /// that they are missing).
    #[test]
    fn packages_before_the_probe_are_the_configured_ones() {
        let k = Kubernetes::new(KubernetesConfig::default().kubeconfig("/nonexistent")).expect("a backend");
        assert_eq!(k.packages(Language::Python), KubernetesConfig::default().data_packages);
        assert!(k.packages(Language::Rust).is_empty());
        assert!(Kubernetes::new(KubernetesConfig::default().seccomp_profile("")).is_err());
        assert!(Kubernetes::new(KubernetesConfig::default().seccomp_profile("../x.json")).is_err());
        assert!(Kubernetes::new(KubernetesConfig::default().seccomp_profile("/etc/x.json")).is_err());
        assert!(Kubernetes::new(KubernetesConfig::default().seccomp_profile("profiles/execbox.json")).is_ok());
    }

    /// While one caller checks, the others get the last answer at once,
    /// not a place in a queue behind a check that may take a minute.
    #[test]
    fn callers_never_wait_behind_a_check() {
        let checks = OneAtATime::<u32>::new();
        let first = while_checking(&checks, Ok(1), || {
            let before_any = checks.get(|_| false, || panic!("a second check while one runs"));
            assert!(before_any.unwrap_err().to_string().contains("being checked"));
        });
        assert_eq!(first.unwrap(), 1);
        // A fresh answer is kept; a stale one is checked again.
        assert_eq!(checks.get(|_| true, || panic!("the answer was fresh")).unwrap(), 1);
        assert_eq!(checks.get(|_| false, || Ok(2)).unwrap(), 2);
        // While a re-check runs, the others take the last answer.
        let again = while_checking(&checks, Err(Unavailable::because("gone")), || {
            assert_eq!(checks.get(|_| false, || panic!("a second check while one runs")).unwrap(), 2);
        });
        assert!(again.is_err());
        // A check that panics lets the next caller check.
        let panicked =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| checks.get(|_| false, || panic!("boom"))));
        assert!(panicked.is_err());
        assert_eq!(checks.get(|_| false, || Ok(3)).unwrap(), 3);
    }
}
