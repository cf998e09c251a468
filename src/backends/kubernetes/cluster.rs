//! [`Cluster`]: the client of one cluster and namespace, on a runtime of
//! its own (the [`Backend`](crate::backend::Backend) calls are blocking),
//! and the one path a job takes: ConfigMap and Pod created, the pod's
//! start awaited, its log read as records, both objects deleted.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::AsyncReadExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, ContainerStatus, Pod};
use kube::api::{AttachParams, DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use super::config::KubernetesConfig;
use super::manifest::{EXPIRES, Job, MANAGED, OWNER_LABEL, POOL_LABEL, STATE_LABEL};
use super::records::{End, Lines, Records};
use crate::backend::Unavailable;

/// Bound on each API call off a run's deadline (availability, deletes, sweeps).
pub(super) const API_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a warm pool's refill waits after its first failure; each
/// failure in a row doubles it, up to [`MAX_REFILL_BACKOFF`].
const REFILL_BACKOFF: Duration = Duration::from_secs(10);
const MAX_REFILL_BACKOFF: Duration = Duration::from_secs(300);

/// Most bytes of a compile's messages read (the docker backend's cap on
/// a compile's stderr).
const MAX_COMPILE_LOG: i64 = 16 << 20;

/// Longest a run's end waits for the tool calls its program wrote last to
/// reach the host's socket.
const FLUSH_WAIT: Duration = Duration::from_millis(250);

/// Longest a replica holds a pool's refill lease (see [`Inner::lease`]):
/// a holder that died mid-refill is overtaken after it.
const REFILL_LEASE: Duration = Duration::from_secs(30);

/// How often the sweep of expired objects runs while the backend lives.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Why a warm pod ended before its deadline without being claimed (its
/// main container's exit), if it did: one at `activeDeadlineSeconds` has
/// merely expired.
fn ended_early(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    if !matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) || pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    if status.reason.as_deref() == Some("DeadlineExceeded") {
        return None;
    }
    let terminated = main_status(pod).and_then(|s| s.state.as_ref()?.terminated.as_ref());
    Some(match terminated {
        Some(t) => format!("exit {}{}", t.exit_code, t.reason.as_deref().map(|r| format!(", {r}")).unwrap_or_default()),
        None => status.reason.clone().unwrap_or_else(|| "ended".into()),
    })
}

/// Waiting reasons after which a container never starts: its image
/// cannot be had ...
const IMAGE_MISSING: &[&str] = &["ErrImageNeverPull", "ErrImagePull", "ImagePullBackOff", "InvalidImageName"];
/// ... or the runtime refused it.
const REFUSED: &[&str] = &["CreateContainerConfigError", "CreateContainerError", "RunContainerError"];

/// The cluster client and its runtime; see the module docs.
pub(super) struct Cluster {
    inner: Arc<Inner>,
    /// `None` only while dropping: shut down in the background, so a
    /// backend dropped inside an async context does not panic.
    runtime: Option<tokio::runtime::Runtime>,
}

struct Inner {
    cfg: KubernetesConfig,
    /// The owner label of this backend's objects: the process's token,
    /// this backend's number in it and 32 random bits (so one backend's
    /// shutdown leaves another's runs alone, in this process or another
    /// replica's).
    owner: String,
    client: OnceCell<Client>,
    /// The warm pools this backend keeps filled, by name.
    pools: parking_lot::Mutex<BTreeMap<String, Arc<Pool>>>,
    /// Set by [`Cluster::remove_own`]: the refill makes no more pods.
    stopped: std::sync::atomic::AtomicBool,
    /// Held by a refill while it creates: the removal waits for it, so no
    /// pod it was creating lands after the removal's list.
    refilling: tokio::sync::Mutex<()>,
    /// Runs' deletions under way in the background: the backend's drop
    /// waits for them (a process that exits after its last run would
    /// otherwise leave that run's ConfigMap, its code and input, until
    /// another process's sweep).
    deleting: parking_lot::Mutex<usize>,
    deleted: parking_lot::Condvar,
}

/// A warm pool's refill state.
#[derive(Default)]
struct Pool {
    /// Its claimable pods at the last count.
    ready: AtomicUsize,
    /// Wakes the refill after a claim.
    claimed: tokio::sync::Notify,
}

/// How a job ended, short of an error.
pub(super) enum JobEnd {
    /// The log was read to its end: the records, whether the kernel's
    /// OOM killer struck in the pod, and a Rust run's compile messages.
    Read { records: Records, oom_killed: bool, compile_log: Option<String> },
    /// The deadline passed first (the pod is being deleted); what came so
    /// far, and whether the program had started (not: the pod was starting
    /// or compiling).
    TimedOut { records: Records, started: bool },
    /// A Rust run's compile ended without a program: its messages, its
    /// exit code, and whether the OOM killer ended it.
    CompileFailed { log: String, exit_code: i32, oom_killed: bool },
}

impl JobEnd {
    /// The records read, if any were.
    fn records_mut(&mut self) -> Option<&mut Records> {
        match self {
            JobEnd::Read { records, .. } | JobEnd::TimedOut { records, .. } => Some(records),
            JobEnd::CompileFailed { .. } => None,
        }
    }
}

/// Why a job did not run to its end.
pub(super) enum JobError {
    /// The cluster cannot run it (unreachable, refused, an image missing).
    Unavailable(Unavailable),
    /// No node can take the pod now (the scheduler's words).
    Busy(String),
    /// The cluster misbehaved.
    Internal(String),
    /// A claimed warm pod could not be attached: nothing of the run reached
    /// it, so the run can go to a cold pod instead (with its records back).
    NotDelivered(String, Box<Records>),
}

impl Cluster {
    pub fn new(cfg: KubernetesConfig) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("execbox-kubernetes")
            .enable_all()
            .build()?;
        static BACKENDS: AtomicUsize = AtomicUsize::new(0);
        // Random too: replicas in pods all run as pid 1, often started in
        // the same clock tick, and one replica's shutdown must never take
        // another's pods.
        let owner = format!(
            "{}-{}-{:08x}",
            crate::owner::token(),
            BACKENDS.fetch_add(1, Ordering::Relaxed),
            crate::nonce::random_u64() as u32
        );
        let inner = Arc::new(Inner {
            cfg,
            owner,
            client: OnceCell::new(),
            pools: parking_lot::Mutex::new(BTreeMap::new()),
            stopped: std::sync::atomic::AtomicBool::new(false),
            refilling: tokio::sync::Mutex::new(()),
            deleting: parking_lot::Mutex::new(0),
            deleted: parking_lot::Condvar::new(),
        });
        Ok(Self { inner, runtime: Some(runtime) })
    }

    pub fn config(&self) -> &KubernetesConfig {
        &self.inner.cfg
    }

    /// Runs `future` on this cluster's runtime and waits for it; `None`
    /// when the runtime is gone.
    fn block<T: Send + 'static>(&self, future: impl Future<Output = T> + Send + 'static) -> Option<T> {
        let runtime = self.runtime.as_ref()?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        runtime.spawn(async move {
            let _ = tx.send(future.await);
        });
        rx.recv().ok()
    }

    /// Whether the namespace answers a list of execbox's pods.
    pub fn reachable(&self) -> Result<(), Unavailable> {
        let inner = self.inner.clone();
        self.block(async move {
            let pods: Api<Pod> = Api::namespaced(inner.client().await?, &inner.cfg.namespace);
            let listed = tokio::time::timeout(API_TIMEOUT, pods.list(&managed().limit(1))).await;
            match listed {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(api_unavailable(&inner.cfg, "cannot list pods", &e)),
                Err(_) => {
                    Err(Unavailable::because(format!("the cluster did not answer within {} s", API_TIMEOUT.as_secs())))
                }
            }
        })
        .unwrap_or_else(|| Err(Unavailable::because("the backend is shutting down")))
    }

    /// Runs `job` until its log ends or `deadline` passes; its objects are
    /// deleted either way (in the background once the deadline passed).
    /// `tools`: the host's tool socket its tool calls are carried to.
    pub fn run(
        &self,
        job: Job,
        records: Records,
        deadline: Option<Duration>,
        tools: Option<PathBuf>,
    ) -> Result<JobEnd, JobError> {
        let inner = self.inner.clone();
        let handle = self.runtime.as_ref().map(|r| r.handle().clone());
        self.block(async move {
            let at = deadline.map(|left| Instant::now() + left);
            let name = job.name.clone();
            let end = inner.run(job, records, at, tools).await;
            inner.delete_after(name, end, handle).await
        })
        .unwrap_or_else(|| Err(JobError::Unavailable(Unavailable::because("the backend is shutting down"))))
    }

    /// Claims a ready pod of warm `pool` for a run that expires at
    /// `expires` (`None`: none could be had within `deadline`; the caller
    /// runs cold). The claim is a label update with the pod's
    /// resourceVersion as precondition, so two replicas never claim one pod.
    pub fn claim(&self, pool: &str, expires: u64, deadline: Duration) -> Option<String> {
        let inner = self.inner.clone();
        let pool = pool.to_string();
        self.block(async move {
            let name = tokio::time::timeout(deadline, inner.claim(&pool, expires)).await.ok().flatten();
            if name.is_some()
                && let Some(pool) = inner.pools.lock().get(&pool)
            {
                // Not ready from now on, before the refill's next count.
                let _ = pool.ready.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
                pool.claimed.notify_one();
            }
            name
        })
        .flatten()
    }

    /// Hands the claimed warm pod `name` its run (`delivery`, see
    /// `Job::delivery`) and reads its log until it ends or `deadline`
    /// passes; the pod is deleted either way, as [`Cluster::run`]'s.
    pub fn run_claimed(
        &self,
        name: String,
        delivery: Vec<u8>,
        records: Records,
        deadline: Duration,
        tools: Option<PathBuf>,
    ) -> Result<JobEnd, JobError> {
        let inner = self.inner.clone();
        let handle = self.runtime.as_ref().map(|r| r.handle().clone());
        self.block(async move {
            let at = Instant::now() + deadline;
            let end = inner.run_claimed(&name, delivery, records, Some(at), tools).await;
            inner.delete_after(name, end, handle).await
        })
        .unwrap_or_else(|| Err(JobError::Unavailable(Unavailable::because("the backend is shutting down"))))
    }

    /// Keeps `target` claimable pods of `pool`, each made by `template`,
    /// counting every replica's (off the request path; woken by claims).
    /// A pool already kept is left as it is. With `idle_after`, a pool this
    /// backend has claimed nothing of for that long is given up: no more
    /// refills, its waiting pods of this backend deleted, and
    /// [`Cluster::keeps`] false, so a later run starts it again.
    pub fn start_warm(
        &self,
        pool: String,
        target: usize,
        idle_after: Option<Duration>,
        template: impl Fn() -> Job + Send + Sync + 'static,
    ) {
        let Some(runtime) = &self.runtime else { return };
        let state = match self.inner.pools.lock().entry(pool.clone()) {
            std::collections::btree_map::Entry::Occupied(_) => return,
            std::collections::btree_map::Entry::Vacant(entry) => entry.insert(Arc::default()).clone(),
        };
        let inner = self.inner.clone();
        runtime.spawn(async move {
            // Replicas that start together take turns at the refill's lease.
            let mut backoff = REFILL_BACKOFF;
            let mut last_claim = Instant::now();
            while !inner.stopped.load(Ordering::SeqCst) {
                let wait = match inner.refill(&pool, &state, target, &template).await {
                    Ok(()) => {
                        backoff = REFILL_BACKOFF;
                        Duration::from_secs(1)
                    }
                    Err(e) => {
                        tracing::warn!(pool = %pool, error = %e, "a kubernetes warm pool cannot refill");
                        let wait = backoff;
                        backoff = backoff.saturating_mul(2).min(MAX_REFILL_BACKOFF);
                        wait
                    }
                };
                if tokio::time::timeout(wait, state.claimed.notified()).await.is_ok() {
                    last_claim = Instant::now();
                }
                if idle_after.is_some_and(|idle| last_claim.elapsed() >= idle) {
                    inner.pools.lock().remove(&pool);
                    let _ = tokio::time::timeout(API_TIMEOUT, inner.give_up(&pool)).await;
                    tracing::info!(pool = %pool, "an idle kubernetes warm pool was given up");
                    break;
                }
            }
        });
    }

    /// Whether the warm pool `pool` is kept filled (not given up as idle).
    pub fn keeps(&self, pool: &str) -> bool {
        self.inner.pools.lock().contains_key(pool)
    }

    /// The warm pools kept: their claimable pods at the last count, and
    /// how many pools.
    pub fn warm_ready(&self) -> (usize, usize) {
        let pools = self.inner.pools.lock();
        (pools.values().map(|p| p.ready.load(Ordering::Relaxed)).sum(), pools.len())
    }

    /// Starts the periodic sweep of expired objects (any owner's: every
    /// object carries the time after which it is garbage).
    pub fn start_sweeps(&self) {
        let Some(runtime) = &self.runtime else { return };
        let inner = self.inner.clone();
        runtime.spawn(async move {
            loop {
                inner.sweep_expired().await;
                tokio::time::sleep(SWEEP_EVERY).await;
            }
        });
    }

    /// Deletes the expired objects now (bounded, 10 s).
    pub fn sweep(&self) {
        let inner = self.inner.clone();
        self.block(async move { inner.sweep_expired().await });
    }

    /// Deletes every object this backend made (for a host about to exit).
    pub fn remove_own(&self) {
        self.inner.stopped.store(true, Ordering::SeqCst);
        let inner = self.inner.clone();
        self.block(async move {
            let _no_refill = tokio::time::timeout(API_TIMEOUT, inner.refilling.lock()).await;
            let selector = format!("{}={},{}={}", MANAGED.0, MANAGED.1, OWNER_LABEL, inner.owner);
            let _ = tokio::time::timeout(API_TIMEOUT, inner.delete_matching(&selector, |_| true)).await;
        });
    }

    /// The pods and ConfigMaps of execbox in the namespace, by name: what
    /// a dead host or a sweep not yet run left, and what runs now.
    pub fn leftovers(&self) -> Result<Vec<String>, Unavailable> {
        let inner = self.inner.clone();
        self.block(async move {
            let client = inner.client().await?;
            let pods: Api<Pod> = Api::namespaced(client, &inner.cfg.namespace);
            match tokio::time::timeout(API_TIMEOUT, pods.list(&managed())).await {
                Ok(Ok(list)) => Ok(list.items.into_iter().filter_map(|p| p.metadata.name).collect()),
                Ok(Err(e)) => Err(api_unavailable(&inner.cfg, "cannot list pods", &e)),
                Err(_) => Err(Unavailable::because("the cluster did not answer")),
            }
        })
        .unwrap_or_else(|| Err(Unavailable::because("the backend is shutting down")))
    }
}

impl Drop for Cluster {
    /// Waits (up to [`API_TIMEOUT`]) for the runs' deletions in the
    /// background, then stops the runtime without waiting for its tasks.
    fn drop(&mut self) {
        let until = std::time::Instant::now() + API_TIMEOUT;
        let mut deleting = self.inner.deleting.lock();
        while *deleting > 0 && !self.inner.deleted.wait_until(&mut deleting, until).timed_out() {}
        drop(deleting);
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// An attachment to the main container's stdin alone (its output is the log).
fn stdin_only() -> AttachParams {
    AttachParams::default().container("main").stdin(true).stdout(false).stderr(false)
}

/// Whether an object is past its `execbox.dev/expires` time (Unix
/// seconds `now`), or carries none: garbage for any sweep.
fn expired(meta: &kube::api::ObjectMeta, now: u64) -> bool {
    meta.annotations.as_ref().and_then(|a| a.get(EXPIRES)).and_then(|t| t.parse::<u64>().ok()).is_none_or(|t| t < now)
}

/// A delete that takes effect only on the object as `meta` saw it (its
/// resourceVersion): one changed meanwhile (a warm pod claimed, a lease
/// taken over) stays.
fn as_seen(meta: &kube::api::ObjectMeta) -> DeleteParams {
    let unchanged = kube::api::Preconditions { resource_version: meta.resource_version.clone(), uid: None };
    DeleteParams { preconditions: Some(unchanged), ..DeleteParams::default() }
}

/// Selects execbox's objects.
fn managed() -> ListParams {
    ListParams::default().labels(&format!("{}={}", MANAGED.0, MANAGED.1))
}

impl Inner {
    /// The client, made once (a failure is tried again next time).
    async fn client(&self) -> Result<Client, Unavailable> {
        self.client
            .get_or_try_init(|| async {
                let fix = "pass the CLI --kubeconfig FILE (or --kube-in-cluster in a pod), or set \
                           KubernetesConfig::kubeconfig; scripts/kube/up.sh starts a test cluster \
                           and prints its kubeconfig";
                let mut config = match &self.cfg.kubeconfig {
                    Some(path) => {
                        let file = kube::config::Kubeconfig::read_from(path).map_err(|e| {
                            Unavailable::new(format!("cannot read the kubeconfig {}: {e}", path.display()), fix)
                        })?;
                        kube::Config::from_custom_kubeconfig(file, &Default::default()).await.map_err(|e| {
                            Unavailable::new(format!("cannot use the kubeconfig {}: {e}", path.display()), fix)
                        })?
                    }
                    None => kube::Config::infer()
                        .await
                        .map_err(|e| Unavailable::new(format!("no cluster configuration: {e}"), fix))?,
                };
                // A log is read for as long as a run lasts; every wait has its own deadline.
                config.read_timeout = None;
                config.connect_timeout = Some(API_TIMEOUT);
                Client::try_from(config).map_err(|e| Unavailable::because(format!("cannot make a client: {e}")))
            })
            .await
            .cloned()
    }

    async fn run(
        &self,
        job: Job,
        records: Records,
        at: Option<Instant>,
        tools: Option<PathBuf>,
    ) -> Result<JobEnd, JobError> {
        let client = self.client().await.map_err(JobError::Unavailable)?;
        let ns = &self.cfg.namespace;
        let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        let pods: Api<Pod> = Api::namespaced(client, ns);
        let map = job
            .config_map(ns, &self.owner)
            .map_err(|e| JobError::Internal(format!("cannot make the ConfigMap: {e}")))?;
        let pod =
            job.pod(&self.cfg, &self.owner).map_err(|e| JobError::Internal(format!("cannot make the pod: {e}")))?;
        let created = within(at, async {
            maps.create(&PostParams::default(), &map).await?;
            pods.create(&PostParams::default(), &pod).await
        })
        .await;
        match created {
            None => return Ok(JobEnd::TimedOut { records, started: false }),
            Some(Err(e)) => return Err(JobError::Unavailable(api_unavailable(&self.cfg, "cannot create the run", &e))),
            Some(Ok(_)) => {}
        }
        let started = within(at, kube::runtime::wait::await_condition(pods.clone(), &job.name, main_started)).await;
        let pod = match started {
            None => return Ok(JobEnd::TimedOut { records, started: false }),
            Some(Err(e)) => return Err(JobError::Internal(format!("cannot watch the pod: {e}"))),
            Some(Ok(None)) => return Err(JobError::Internal("the pod was deleted before it started".into())),
            Some(Ok(Some(pod))) => pod,
        };
        if let Some((exit_code, oom_killed)) = compile_failed(&pod) {
            let log = self.compile_log(&pods, &job.name, at).await.unwrap_or_default();
            return Ok(JobEnd::CompileFailed { log, exit_code, oom_killed });
        }
        if let Some(why) = never_starts(&pod) {
            return Err(why);
        }
        if job.compile.is_none() {
            return self.read_log(&pods, &job.name, records, at, tools).await;
        }
        // The compile's warnings, read while the program runs.
        let (compile_log, end) = futures_util::join!(
            self.compile_log(&pods, &job.name, at),
            self.read_log(&pods, &job.name, records, at, tools)
        );
        match end {
            Ok(JobEnd::Read { records, oom_killed, .. }) => Ok(JobEnd::Read { records, oom_killed, compile_log }),
            end => end,
        }
    }

    /// The log of the pod's `compile` container (its messages, at most
    /// [`MAX_COMPILE_LOG`] bytes), if it can be read before `at`.
    async fn compile_log(&self, pods: &Api<Pod>, name: &str, at: Option<Instant>) -> Option<String> {
        let params =
            LogParams { container: Some("compile".into()), limit_bytes: Some(MAX_COMPILE_LOG), ..LogParams::default() };
        // Read as bytes: the cap may cut a character, which `logs` (a
        // String) would turn into an error, losing every message.
        let read = async {
            let mut log = pods.log_stream(name, &params).await.ok()?;
            let mut bytes = Vec::new();
            log.read_to_end(&mut bytes).await.ok()?;
            Some(String::from_utf8_lossy(&bytes).into_owned())
        };
        within(at, read).await?
    }

    /// Reads the log of the running pod `name` to its end, then its end's
    /// OOM verdict; with `tools`, the pod is attached and its tool calls
    /// carried there meanwhile.
    async fn read_log(
        &self,
        pods: &Api<Pod>,
        name: &str,
        mut records: Records,
        at: Option<Instant>,
        tools: Option<PathBuf>,
    ) -> Result<JobEnd, JobError> {
        let Some(socket) = tools else {
            return match within(at, pods.log_stream(name, &log_params())).await {
                None => Ok(JobEnd::TimedOut { records, started: true }),
                Some(log) => self.read_opened_log(pods, name, log, records, at).await,
            };
        };
        let (attach_params, log_params) = (stdin_only(), log_params());
        let opened = within(
            at,
            futures_util::future::join(pods.attach(name, &attach_params), pods.log_stream(name, &log_params)),
        );
        let Some((attached, log)) = opened.await else { return Ok(JobEnd::TimedOut { records, started: true }) };
        // Without an attachment (a program that ended at once has ended its
        // container too; a Role without pods/attach) the calls still reach
        // the host's socket, as a container's do; their answers go nowhere.
        let mut attached = attached
            .inspect_err(
                |e| tracing::debug!(pod = %name, error = %e, "cannot attach a pod for its tool calls' answers"),
            )
            .ok();
        match attached.as_mut().and_then(|a| a.stdin()) {
            Some(stdin) => self.read_relaying(pods, name, log, records, at, stdin, socket).await,
            None => {
                records
                    .lose_tools("the pod could not be attached (its program had ended, or the Role lacks pods/attach)");
                self.read_relaying(pods, name, log, records, at, tokio::io::sink(), socket).await
            }
        }
    }

    /// [`Inner::read_opened_log`] while `relay.rs` carries the run's tool
    /// calls to the host's `socket` and their answers to `stdin`.
    #[allow(clippy::too_many_arguments)]
    async fn read_relaying(
        &self,
        pods: &Api<Pod>,
        name: &str,
        log: Result<impl futures_util::AsyncRead + Unpin, kube::Error>,
        mut records: Records,
        at: Option<Instant>,
        stdin: impl tokio::io::AsyncWrite + Unpin,
        socket: PathBuf,
    ) -> Result<JobEnd, JobError> {
        let (calls, from_pod) = tokio::sync::mpsc::unbounded_channel();
        records.carry_tools(calls);
        let relay = super::relay::carry(socket, from_pod, stdin);
        let read = self.read_opened_log(pods, name, log, records, at);
        tokio::pin!(relay, read);
        // The relay ends early only if stdin fails: the log is read on.
        let mut relay_done = false;
        let mut end = loop {
            tokio::select! {
                end = &mut read => break end,
                () = &mut relay, if !relay_done => relay_done = true,
            }
        };
        // What the program wrote before it ended reaches the host's socket
        // (a container's calls are read as they are written), within a
        // moment and the deadline; then the relay and its connections go.
        if let Some(records) = end.as_mut().ok().and_then(JobEnd::records_mut) {
            records.stop_tools();
        }
        let flush = at.map_or(FLUSH_WAIT, |at| at.saturating_duration_since(Instant::now()).min(FLUSH_WAIT));
        if !relay_done {
            let _ = tokio::time::timeout(flush, &mut relay).await;
        }
        end
    }

    /// [`Inner::read_log`] from a log stream opened already.
    async fn read_opened_log(
        &self,
        pods: &Api<Pod>,
        name: &str,
        log: Result<impl futures_util::AsyncRead + Unpin, kube::Error>,
        mut records: Records,
        at: Option<Instant>,
    ) -> Result<JobEnd, JobError> {
        let read = within(at, async {
            let mut log = log?;
            let mut lines = Lines::default();
            let mut buf = vec![0; 64 << 10];
            loop {
                let n = log.read(&mut buf).await.map_err(kube::Error::ReadEvents)?;
                if n == 0 {
                    break;
                }
                // The output tap runs here: a slow one must not hold the
                // runtime's thread, which every run's calls and timers share.
                tokio::task::block_in_place(|| lines.feed(&buf[..n], &mut records));
                // Nothing after the end record counts, and the log itself
                // ends only when the kubelet next looks at the container
                // (about a second later).
                if records.end.is_some() {
                    break;
                }
            }
            lines.finish(&mut records);
            Ok::<_, kube::Error>(())
        })
        .await;
        match read {
            None => return Ok(JobEnd::TimedOut { records, started: true }),
            Some(Err(e)) => return Err(JobError::Internal(format!("cannot read the run's log: {e}"))),
            Some(Ok(())) => {}
        }
        // The launcher read the OOM killer's count in its cgroup; only
        // when it could not (or never said: the launcher itself was killed)
        // is the verdict the container's termination reason, set once the
        // kubelet saw it end (its next relist: about a second).
        if let Some(End::Exited { oom_killed: Some(oom_killed), .. }) = records.end {
            return Ok(JobEnd::Read { records, oom_killed, compile_log: None });
        }
        let ended = within(at, kube::runtime::wait::await_condition(pods.clone(), name, main_terminated)).await;
        let oom_killed = match ended {
            None => return Ok(JobEnd::TimedOut { records, started: true }),
            Some(Ok(Some(pod))) => {
                let terminated = main_status(&pod).and_then(|s| s.state.as_ref()?.terminated.as_ref());
                // Only the OOM killer (or the pod's deletion, not the case
                // here) SIGKILLs the launcher, pid 1: the program cannot.
                let launcher_killed = records.end.is_none() && terminated.is_some_and(|t| t.exit_code == 137);
                launcher_killed || terminated.and_then(|t| t.reason.as_deref()) == Some("OOMKilled")
            }
            Some(_) => false,
        };
        Ok(JobEnd::Read { records, oom_killed, compile_log: None })
    }

    /// Claims a ready, running pod of `pool` young enough to cover any run
    /// (see [`Cluster::run_warm`]); it is this process's from then on, and
    /// expires at `expires`.
    async fn claim(&self, pool: &str, expires: u64) -> Option<String> {
        let pods: Api<Pod> = Api::namespaced(self.client().await.ok()?, &self.cfg.namespace);
        let selector = format!("{}={},{POOL_LABEL}={pool},{STATE_LABEL}=ready", MANAGED.0, MANAGED.1);
        let list = pods.list(&ListParams::default().labels(&selector)).await.ok()?;
        let running = |pod: &Pod| main_status(pod).and_then(|s| s.state.as_ref()).is_some_and(|s| s.running.is_some());
        for pod in list.items.iter().filter(|p| p.metadata.deletion_timestamp.is_none() && running(p) && self.young(p))
        {
            let (Some(name), Some(version)) = (&pod.metadata.name, &pod.metadata.resource_version) else { continue };
            let claim = serde_json::json!({"metadata": {
                "resourceVersion": version,
                "labels": {STATE_LABEL: "claimed", OWNER_LABEL: self.owner},
                "annotations": {EXPIRES: expires.to_string()},
            }});
            match pods.patch(name, &PatchParams::default(), &Patch::Merge(&claim)).await {
                Ok(_) => return Some(name.clone()),
                // 409: another claim (or a change) came first.
                Err(e) => tracing::debug!(pod = %name, error = %e, "a warm pod was not claimed"),
            }
        }
        None
    }

    /// Whether warm `pod` may still be claimed: younger than `warm_lifetime`
    /// (its deadline covers a whole run only until then).
    fn young(&self, pod: &Pod) -> bool {
        pod.metadata.creation_timestamp.as_ref().is_some_and(|t| {
            let age = SystemTime::now().duration_since(SystemTime::from(t.0)).unwrap_or_default();
            age < self.cfg.warm_lifetime
        })
    }

    /// Hands a claimed warm pod its run on its stdin, then reads its log.
    async fn run_claimed(
        &self,
        name: &str,
        delivery: Vec<u8>,
        records: Records,
        at: Option<Instant>,
        tools: Option<PathBuf>,
    ) -> Result<JobEnd, JobError> {
        use tokio::io::AsyncWriteExt as _;
        let client = self.client().await.map_err(JobError::Unavailable)?;
        let pods: Api<Pod> = Api::namespaced(client, &self.cfg.namespace);
        let params = stdin_only();
        // Not a byte of the run has gone to the pod until the attachment
        // stands (the pod may have died, or an older Role lacks
        // pods/attach): then the run can still go to a cold pod. The log
        // is opened meanwhile (the launcher writes to it only once the
        // run has come).
        let log_params = log_params();
        let opened =
            within(at, futures_util::future::join(pods.attach(name, &params), pods.log_stream(name, &log_params)));
        let Some((attached, log)) = opened.await else { return Ok(JobEnd::TimedOut { records, started: true }) };
        let mut attached = match attached {
            Err(e) => {
                return Err(JobError::NotDelivered(format!("cannot attach the warm pod: {e}"), Box::new(records)));
            }
            Ok(attached) => attached,
        };
        let Some(mut stdin) = attached.stdin() else {
            return Err(JobError::NotDelivered("the warm pod's attachment has no stdin".into(), Box::new(records)));
        };
        let delivered = within(at, async {
            stdin.write_all(&delivery).await?;
            stdin.flush().await
        })
        .await;
        let stdin = match delivered {
            None => return Ok(JobEnd::TimedOut { records, started: true }),
            Some(Err(e)) => return Err(JobError::Internal(format!("cannot hand the warm pod its run: {e}"))),
            Some(Ok(())) => stdin,
        };
        // The attachment stays open until the log ends: closing it early
        // could cut the delivery short inside the API server. A run that
        // may call tools has its answers come down the same stdin.
        match tools {
            Some(socket) => self.read_relaying(&pods, name, log, records, at, stdin, socket).await,
            None => {
                let _stdin = stdin;
                self.read_opened_log(&pods, name, log, records, at).await
            }
        }
    }

    /// Creates pods of `pool` until `target` are ready (claimable or about
    /// to be), counting every replica's.
    async fn refill(&self, pool: &str, state: &Pool, target: usize, template: &impl Fn() -> Job) -> Result<(), String> {
        let _refilling = self.refilling.lock().await;
        let client = self.client().await.map_err(|e| e.to_string())?;
        let ns = &self.cfg.namespace;
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let maps: Api<ConfigMap> = Api::namespaced(client, ns);
        let list = self.waiting_pods(&pods, pool).await?;
        let alive = self.alive(&list);
        let running = alive
            .iter()
            .filter(|p| main_status(p).and_then(|s| s.state.as_ref()).is_some_and(|s| s.running.is_some()))
            .count();
        state.ready.store(running, Ordering::Relaxed);
        // This backend's pods that ended unclaimed before their deadline: a
        // package pool whose program cannot get ready (its imports do not
        // fit the memory cap, an image without the packages). They go, and
        // the pool backs off instead of making more to fail the same way.
        let failed: Vec<(&str, String)> = list
            .items
            .iter()
            .filter(|p| p.metadata.labels.as_ref().and_then(|l| l.get(OWNER_LABEL)) == Some(&self.owner))
            .filter_map(|p| Some((p.metadata.name.as_deref()?, ended_early(p)?)))
            .collect();
        if let Some((_, why)) = failed.first() {
            for (name, _) in &failed {
                self.delete(name).await;
            }
            return Err(format!("{} warm pod(s) ended before a run claimed them ({why})", failed.len()));
        }
        if alive.len() >= target {
            return Ok(());
        }
        // One replica refills a pool at a time, counting again once it
        // holds the lease: replicas that start together would otherwise
        // each fill it.
        let Some(lease) = self.lease(&maps, pool).await? else { return Ok(()) };
        let list = self.waiting_pods(&pods, pool).await;
        let created = match list {
            Ok(list) => self.create_warm(&pods, &maps, self.alive(&list).len(), target, template).await,
            Err(e) => Err(e),
        };
        let _ = tokio::time::timeout(API_TIMEOUT, maps.delete(&lease.0, &lease.1)).await;
        created
    }

    /// The pods of warm `pool` not yet claimed (any phase).
    async fn waiting_pods(&self, pods: &Api<Pod>, pool: &str) -> Result<kube::api::ObjectList<Pod>, String> {
        let selector = format!("{}={},{POOL_LABEL}={pool},{STATE_LABEL}=ready", MANAGED.0, MANAGED.1);
        tokio::time::timeout(API_TIMEOUT, pods.list(&ListParams::default().labels(&selector)))
            .await
            .map_err(|_| "the cluster did not answer".to_string())?
            .map_err(|e| e.to_string())
    }

    /// Of a pool's waiting pods, those that count: not ended, not being
    /// deleted, and younger than `warm_lifetime` (older ones are never
    /// claimed).
    fn alive<'a>(&self, list: &'a kube::api::ObjectList<Pod>) -> Vec<&'a Pod> {
        list.items
            .iter()
            .filter(|p| {
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                p.metadata.deletion_timestamp.is_none()
                    && !matches!(phase, Some("Succeeded" | "Failed"))
                    && self.young(p)
            })
            .collect()
    }

    /// Takes warm `pool`'s refill lease: a ConfigMap
    /// `execbox-refill-<pool>`, whose creation only one replica wins (the
    /// others get 409 and leave this round to it); one past its time (its
    /// holder died mid-refill) is deleted, checked by resourceVersion, and
    /// taken. The lease (its name and a delete checked the same way) if
    /// this backend holds it; `None` if another does.
    async fn lease(&self, maps: &Api<ConfigMap>, pool: &str) -> Result<Option<(String, DeleteParams)>, String> {
        let name = format!("execbox-refill-{pool}");
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let expires = now.saturating_add(REFILL_LEASE).as_secs();
        let lease: ConfigMap = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": self.cfg.namespace,
                         "labels": {MANAGED.0: MANAGED.1, OWNER_LABEL: self.owner, POOL_LABEL: pool,
                                    "execbox.dev/role": "lease"},
                         "annotations": {EXPIRES: expires.to_string()}},
        }))
        .map_err(|e| e.to_string())?;
        let held = |made: ConfigMap| Some((name.clone(), as_seen(&made.metadata)));
        let post = PostParams::default();
        let create = || tokio::time::timeout(API_TIMEOUT, maps.create(&post, &lease));
        match create().await {
            Ok(Ok(made)) => return Ok(held(made)),
            Ok(Err(kube::Error::Api(status))) if status.is_already_exists() => {}
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err("the cluster did not answer".into()),
        }
        let Ok(Ok(other)) = tokio::time::timeout(API_TIMEOUT, maps.get(&name)).await else { return Ok(None) };
        if !expired(&other.metadata, now.as_secs()) {
            return Ok(None);
        }
        let stale = as_seen(&other.metadata);
        if !matches!(tokio::time::timeout(API_TIMEOUT, maps.delete(&name, &stale)).await, Ok(Ok(_))) {
            return Ok(None);
        }
        match create().await {
            Ok(Ok(made)) => Ok(held(made)),
            _ => Ok(None),
        }
    }

    /// Creates pods of a pool from `template` until `alive` of `target` are.
    async fn create_warm(
        &self,
        pods: &Api<Pod>,
        maps: &Api<ConfigMap>,
        alive: usize,
        target: usize,
        template: &impl Fn() -> Job,
    ) -> Result<(), String> {
        let ns = &self.cfg.namespace;
        for _ in alive..target {
            if self.stopped.load(Ordering::SeqCst) {
                break;
            }
            let job = template();
            let map = job.config_map(ns, &self.owner).map_err(|e| e.to_string())?;
            let pod = job.pod(&self.cfg, &self.owner).map_err(|e| e.to_string())?;
            let created = tokio::time::timeout(API_TIMEOUT, async {
                maps.create(&PostParams::default(), &map).await?;
                pods.create(&PostParams::default(), &pod).await
            })
            .await;
            match created {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(e.to_string()),
                Err(_) => return Err("the cluster did not answer".into()),
            }
        }
        Ok(())
    }

    /// `end`, with the job's objects being deleted in the background: the
    /// pod has ended (or is past its deadline), and its deletes (~30-70 ms
    /// of API calls) need not hold the result. The backend's drop waits for
    /// them; `shutdown` deletes whatever this backend made anyway.
    async fn delete_after(
        self: Arc<Self>,
        name: String,
        end: Result<JobEnd, JobError>,
        handle: Option<tokio::runtime::Handle>,
    ) -> Result<JobEnd, JobError> {
        let Some(handle) = handle else {
            self.delete(&name).await;
            return end;
        };
        *self.deleting.lock() += 1;
        let inner = self.clone();
        // Counted down however the task ends, dropped unpolled included.
        let done = crate::guard::on_drop(move || {
            *inner.deleting.lock() -= 1;
            inner.deleted.notify_all();
        });
        let inner = self.clone();
        drop(handle.spawn(async move {
            let _done = done;
            inner.delete(&name).await;
        }));
        end
    }

    /// Deletes the pod (at once: no grace) and the ConfigMap named `name`.
    async fn delete(&self, name: &str) {
        let Ok(client) = self.client().await else { return };
        let ns = &self.cfg.namespace;
        let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let maps: Api<ConfigMap> = Api::namespaced(client, ns);
        let _ = tokio::time::timeout(API_TIMEOUT, async {
            if let Err(e) = pods.delete(name, &now).await {
                tracing::debug!(pod = %name, error = %e, "deleting a run's pod");
            }
            if let Err(e) = maps.delete(name, &now).await {
                tracing::debug!(config_map = %name, error = %e, "deleting a run's ConfigMap");
            }
        })
        .await;
    }

    /// Deletes the objects past their expiry, whoever made them.
    async fn sweep_expired(&self) {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let selector = format!("{}={}", MANAGED.0, MANAGED.1);
        let _ = tokio::time::timeout(API_TIMEOUT, self.delete_matching(&selector, |meta| expired(meta, now))).await;
    }

    /// Deletes this backend's waiting pods of the idle pool `pool` (and their
    /// ConfigMaps), each only as it was listed: a pod claimed meanwhile has
    /// another resourceVersion, and its run goes on.
    async fn give_up(&self, pool: &str) {
        let Ok(client) = self.client().await else { return };
        let ns = &self.cfg.namespace;
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let maps: Api<ConfigMap> = Api::namespaced(client, ns);
        let selector =
            format!("{}={},{OWNER_LABEL}={},{POOL_LABEL}={pool},{STATE_LABEL}=ready", MANAGED.0, MANAGED.1, self.owner);
        let Ok(list) = pods.list(&ListParams::default().labels(&selector)).await else { return };
        for pod in list.items {
            let Some(name) = &pod.metadata.name else { continue };
            let now = DeleteParams { grace_period_seconds: Some(0), ..as_seen(&pod.metadata) };
            if pods.delete(name, &now).await.is_ok() {
                let _ = maps.delete(name, &DeleteParams::default()).await;
            }
        }
    }

    /// Deletes the pods and ConfigMaps of `selector` that `pick` picks.
    async fn delete_matching(&self, selector: &str, pick: impl Fn(&kube::api::ObjectMeta) -> bool) {
        let Ok(client) = self.client().await else { return };
        let ns = &self.cfg.namespace;
        let params = ListParams::default().labels(selector);
        let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        if let Ok(list) = pods.list(&params).await {
            for pod in list.items.iter().filter(|p| pick(&p.metadata)) {
                if let Some(name) = &pod.metadata.name {
                    let _ = pods.delete(name, &now).await;
                }
            }
        }
        let maps: Api<ConfigMap> = Api::namespaced(client, ns);
        if let Ok(list) = maps.list(&params).await {
            for map in list.items.iter().filter(|m| pick(&m.metadata)) {
                if let Some(name) = &map.metadata.name {
                    let _ = maps.delete(name, &now).await;
                }
            }
        }
    }
}

/// How a run's log is read: the launcher's container, followed.
fn log_params() -> LogParams {
    LogParams { container: Some("main".into()), follow: true, ..LogParams::default() }
}

/// `future`, unless `at` passes first (`None`).
async fn within<T>(at: Option<Instant>, future: impl Future<Output = T>) -> Option<T> {
    match at {
        Some(at) => tokio::time::timeout_at(at, future).await.ok(),
        None => Some(future.await),
    }
}

fn main_status(pod: &Pod) -> Option<&ContainerStatus> {
    pod.status.as_ref()?.container_statuses.as_ref()?.iter().find(|s| s.name == "main")
}

/// The pod's main container runs or ran, or the pod will never get there.
fn main_started(pod: Option<&Pod>) -> bool {
    let Some(pod) = pod else { return true };
    let state = main_status(pod).and_then(|s| s.state.as_ref());
    state.is_some_and(|s| s.running.is_some() || s.terminated.is_some())
        || compile_failed(pod).is_some()
        || never_starts(pod).is_some()
}

/// The exit code of a Rust run's compile that failed, and whether the OOM
/// killer ended it (the compiler is the container's only process: only
/// the OOM killer sends it SIGKILL).
fn compile_failed(pod: &Pod) -> Option<(i32, bool)> {
    let status = pod.status.as_ref()?.init_container_statuses.as_ref()?.iter().find(|s| s.name == "compile")?;
    let done = status.state.as_ref()?.terminated.as_ref()?;
    (done.exit_code != 0)
        .then(|| (done.exit_code, done.exit_code == 137 || done.reason.as_deref() == Some("OOMKilled")))
}

/// The main container's end is recorded (or the pod is gone).
fn main_terminated(pod: Option<&Pod>) -> bool {
    let Some(pod) = pod else { return true };
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    matches!(phase, Some("Succeeded" | "Failed"))
        || main_status(pod).and_then(|s| s.state.as_ref()).is_some_and(|s| s.terminated.is_some())
}

/// Why the main container will never start, if it will not: an image that
/// cannot be had, a container the runtime refused, a failed setup.
fn never_starts(pod: &Pod) -> Option<JobError> {
    let status = pod.status.as_ref()?;
    let all = status.init_container_statuses.iter().flatten().chain(status.container_statuses.iter().flatten());
    for container in all {
        let state = container.state.as_ref();
        if let Some(waiting) = state.and_then(|s| s.waiting.as_ref())
            && let Some(reason) = waiting.reason.as_deref()
        {
            let message = crate::text::cap_message(waiting.message.clone().unwrap_or_default());
            let what = format!("container {} cannot start: {reason} {message}", container.name);
            if IMAGE_MISSING.contains(&reason) {
                let fix = if container.name == "compile" {
                    "build the Rust toolchain image with scripts/build-rust-toolchain-image.sh (scripts/kube/up.sh's \
                     cluster uses docker's images), or set KubernetesConfig::rust_image"
                } else {
                    "build and load execbox's images with scripts/build-images.sh (scripts/kube/up.sh's \
                     cluster uses docker's images), or set KubernetesConfig's images"
                };
                return Some(JobError::Unavailable(Unavailable::new(what, fix)));
            }
            if REFUSED.contains(&reason) {
                return Some(JobError::Internal(what));
            }
        }
        if container.name == "setup"
            && let Some(done) = state.and_then(|s| s.terminated.as_ref())
            && done.exit_code != 0
        {
            let message = crate::text::cap_message(done.message.clone().unwrap_or_default());
            return Some(JobError::Internal(format!(
                "the pod's setup (network off, files staged) failed with code {}: {} {message}",
                done.exit_code,
                done.reason.as_deref().unwrap_or("")
            )));
        }
    }
    let unschedulable = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable"));
    if let Some(condition) = unschedulable {
        return Some(JobError::Busy(format!(
            "no node can take the pod now: {}",
            crate::text::cap_message(condition.message.clone().unwrap_or_default())
        )));
    }
    let phase = status.phase.as_deref();
    let ran =
        main_status(pod).and_then(|s| s.state.as_ref()).is_some_and(|s| s.running.is_some() || s.terminated.is_some());
    (matches!(phase, Some("Failed")) && !ran).then(|| {
        JobError::Internal(format!(
            "the pod failed before its program started: {} {}",
            status.reason.as_deref().unwrap_or(""),
            crate::text::cap_message(status.message.clone().unwrap_or_default())
        ))
    })
}

/// An API error as the reason the backend cannot run.
fn api_unavailable(cfg: &KubernetesConfig, doing: &str, e: &kube::Error) -> Unavailable {
    let text = crate::text::cap_message(e.to_string());
    match e {
        kube::Error::Api(status) if status.code == 403 => Unavailable::new(
            format!("{doing} in namespace {}: forbidden ({text})", cfg.namespace),
            "grant the service account the Role in deploy/kubernetes/rbac.yaml (pods, pods/log, configmaps)",
        ),
        kube::Error::Api(status) if status.code == 404 => Unavailable::new(
            format!("{doing} in namespace {}: not found ({text})", cfg.namespace),
            format!("create the namespace {} (scripts/kube/up.sh does)", cfg.namespace),
        ),
        _ => Unavailable::because(format!("{doing} in namespace {}: {text}", cfg.namespace)),
    }
}
