//! A run's two objects: its ConfigMap (the launcher, the code, the input
//! and files) and its Pod, in execbox's locked shape. One place makes
//! them, for runs and for the availability probe alike.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use serde_json::{Value, json};

use super::config::KubernetesConfig;
use crate::error::{ExecError, InvalidRequest};
use crate::file::ExecFile;

/// Label every object of execbox carries (the sweep's selector).
pub(super) const MANAGED: (&str, &str) = ("app.kubernetes.io/managed-by", "execbox");
/// Label naming the process that made the object ([`crate::owner::token`]).
pub(super) const OWNER_LABEL: &str = "execbox.dev/owner";
/// Annotation: the Unix time after which the object is garbage for any sweep.
pub(super) const EXPIRES: &str = "execbox.dev/expires";
/// Label of a warm pod's pool (its image and memory).
pub(super) const POOL_LABEL: &str = "execbox.dev/pool";
/// Label of a warm pod's state: `ready` until a run claims it (`claimed`).
pub(super) const STATE_LABEL: &str = "execbox.dev/state";

/// Where the job's ConfigMap is mounted in both containers.
const JOB_DIR: &str = "/run/execbox/job";

/// The directory of the pod's tool socket (`TOOLS_SOCKET`): a small
/// emptyDir of its own, the launcher's to bind in (the root is read-only).
const TOOLS_DIR: &str = "/run/execbox";

/// Bytes of the tool socket's emptyDir (a socket takes none).
const TOOLS_DIR_BYTES: u64 = 1 << 20;

/// Where a Rust run's compile writes the program (and its temporary
/// files), read-only to the main container.
pub(super) const BUILD_DIR: &str = "/opt/execbox/build";

/// Most bytes of a compiled program (and of each temporary file of its
/// compile): the compile's `RLIMIT_FSIZE`; the build emptyDir holds twice
/// that.
const MAX_PROGRAM_BYTES: u64 = 64 << 20;

/// Most bytes of a ConfigMap's keys and values: the API server's 1 MiB
/// less room for its metadata.
const MAX_CONFIG_MAP_BYTES: u64 = (1 << 20) - (8 << 10);

/// What one pod runs.
pub(super) struct Job {
    /// The pod's and the ConfigMap's name.
    pub name: String,
    /// `run` or `probe`.
    pub role: &'static str,
    pub image: String,
    /// The program, its stdin the code.
    pub argv: Vec<String>,
    pub code: Vec<u8>,
    /// `input.json` and the input files, named relative to `/work`.
    pub files: Vec<ExecFile>,
    pub env: BTreeMap<String, String>,
    pub memory_bytes: u64,
    pub stdout_cap: u64,
    pub stderr_cap: u64,
    /// `/work/out`, when the run collects files: its size and how the
    /// launcher lists it (argv, byte cap).
    pub outputs: Option<Outputs>,
    /// How long the run has from now (a warm pod: how long it may wait
    /// and then run).
    pub limit: Duration,
    /// A warm pod of this pool: it waits for its run on stdin (see
    /// `launch.py`), with `/work` its own and `/work/out` mounted.
    pub pool: Option<String>,
    /// A warm pod's Python, started before its run (the warm bootstrap,
    /// with a package pool's packages imported).
    pub preload: Option<Vec<String>>,
    /// A Rust run's compile, before the program (`argv`) starts.
    pub compile: Option<Compile>,
    /// The run may call tools: the launcher listens at the tool socket and
    /// carries its connections to the host (see `relay.rs`).
    pub tools: Option<Tools>,
}

/// A run's Code Mode in its pod.
pub(super) struct Tools {
    /// Most bytes of answers a connection may leave unread (the host
    /// socket's own bound, `tool_socket::unread_limit`).
    pub max_unread: u64,
}

/// A Rust run's compile: the `compile` init container, in the toolchain
/// `image`, turns the ConfigMap's `main.rs` (the caller's code, then the
/// harness) into `BUILD_DIR/program` with the docker backend's rustc
/// arguments, under its own memory limit, unprivileged and (the pod's
/// network being down by then) offline. Its messages are its log.
pub(super) struct Compile {
    pub image: String,
    pub main_rs: String,
    /// How many of `main_rs`'s lines are the caller's.
    pub user_lines: u32,
    pub memory_bytes: u64,
    pub opt_level: u8,
}

impl Compile {
    /// The container's command: rustc in the job's directory, each file it
    /// writes capped, its status the container's, the linker's temporary
    /// files beside the program.
    fn command(&self) -> Vec<String> {
        let rustc = std::iter::once("/opt/rust/bin/rustc".to_string())
            .chain(crate::backends::container::rust::rustc_args(
                self.opt_level,
                "/opt/execbox/deps",
                "/opt/execbox/deps/libserde_json.rlib",
                &format!("{BUILD_DIR}/program"),
            ))
            .collect::<Vec<_>>()
            .join(" ");
        // dash counts RLIMIT_FSIZE in 512-byte blocks. The kubelet's
        // variables (KUBERNETES_*, HOSTNAME) are not the compiler's: an
        // `include_str!("/proc/self/environ")` would hand them to the code.
        let script = format!(
            "ulimit -f {} && exec /usr/bin/env -i PATH=/usr/bin:/bin TMPDIR={BUILD_DIR} {rustc}",
            MAX_PROGRAM_BYTES / 512
        );
        vec!["/bin/sh".into(), "-c".into(), script]
    }
}

/// A run's `/work/out`.
pub(super) struct Outputs {
    pub tmpfs_bytes: u64,
    pub listing_argv: Vec<String>,
    pub listing_cap: u64,
}

/// Seconds past the deadline the launcher waits before killing the
/// program itself, and the pod's `activeDeadlineSeconds` after that: the
/// host's own kill comes first.
pub(super) const POD_GRACE: Duration = Duration::from_secs(2);

/// The CPU a pod asks the scheduler for (its limit is `cpu_millis`).
const CPU_REQUEST_MILLIS: u32 = 50;

/// How long after its deadline an object is garbage for any sweep.
const SWEEP_AFTER: Duration = Duration::from_secs(10);

impl Job {
    /// Refuses a payload the ConfigMap cannot carry: its data (code, files,
    /// the spec with the environment and arguments, the launcher) counted
    /// as the API server counts it, keys and values.
    pub fn check_size(&self) -> Result<(), ExecError> {
        let map = self.config_map("-", "-").map_err(|e| ExecError::internal("kubernetes", e.to_string()))?;
        let data = map.data.iter().flatten().map(|(k, v)| k.len() + v.len());
        let binary = map.binary_data.iter().flatten().map(|(k, v)| k.len() + v.0.len());
        let total = data.chain(binary).sum::<usize>() as u64;
        if total > MAX_CONFIG_MAP_BYTES {
            return Err(InvalidRequest::LimitOutOfRange {
                limit: "payload_bytes",
                value: total,
                reason: format!(
                    "a Kubernetes run carries its code, JSON input, input files, environment and arguments in \
                     one ConfigMap, beside execbox's launcher: at most {MAX_CONFIG_MAP_BYTES} bytes together"
                ),
            }
            .into());
        }
        Ok(())
    }

    /// What the job's files take staged in a tmpfs (each rounded up to a
    /// page, and room for the directories).
    pub fn work_bytes(&self) -> u64 {
        self.files.iter().map(|f| f.content.len() as u64 + 4096).sum::<u64>() + (1 << 20)
    }

    /// The labels of both objects.
    fn labels(&self, owner: &str) -> Value {
        let mut labels = json!({MANAGED.0: MANAGED.1, OWNER_LABEL: owner, "execbox.dev/role": self.role});
        if let Some(pool) = &self.pool {
            labels[POOL_LABEL] = pool.as_str().into();
            labels[STATE_LABEL] = "ready".into();
        }
        labels
    }

    /// Unix seconds: the launcher's own kill, and when the objects expire.
    fn times(&self) -> (f64, u64) {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let stop_at = now.saturating_add(self.limit).saturating_add(POD_GRACE);
        (stop_at.as_secs_f64(), stop_at.saturating_add(POD_GRACE).saturating_add(SWEEP_AFTER).as_secs())
    }

    /// The ConfigMap: `launch.py`, `setup.py`, `spec.json`, `files.json`,
    /// the code, and each file as `f<n>`.
    pub fn config_map(&self, namespace: &str, owner: &str) -> Result<ConfigMap, serde_json::Error> {
        let (stop_at, expires) = self.times();
        let mut names = serde_json::Map::new();
        let mut binary = serde_json::Map::new();
        binary.insert("code".into(), STANDARD.encode(&self.code).into());
        for (i, file) in self.files.iter().enumerate() {
            let key = format!("f{i}");
            names.insert(key.clone(), file.name.clone().into());
            binary.insert(key, STANDARD.encode(&file.content).into());
        }
        let spec = match &self.pool {
            Some(_) => json!({"warm": true, "preload": self.preload}),
            None => self.spec(stop_at),
        };
        let outputs = self.pool.is_some() || self.outputs.is_some();
        let mut map: ConfigMap = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": self.name, "namespace": namespace, "labels": self.labels(owner),
                         "annotations": {EXPIRES: expires.to_string()}},
            "data": {
                "launch.py": include_str!("launch.py"),
                "setup.py": include_str!("setup.py"),
                "spec.json": spec.to_string(),
                "files.json": json!({"files": names, "outputs": outputs}).to_string(),
            },
            "binaryData": binary,
        }))?;
        if let (Some(compile), Some(data)) = (&self.compile, map.data.as_mut()) {
            data.insert("main.rs".into(), compile.main_rs.clone());
        }
        if let (true, Some(data)) = (self.may_call_tools(), map.data.as_mut()) {
            data.insert("tool".into(), crate::backends::conventions::TOOL_COMMAND.into());
        }
        Ok(map)
    }

    /// What the launcher runs: the program, its environment, caps, its own
    /// deadline (Unix seconds) and the listing.
    fn spec(&self, stop_at: f64) -> Value {
        let listing = self.outputs.as_ref().map(|o| json!({"argv": o.listing_argv, "cap": o.listing_cap}));
        let tools = self.tools.as_ref().map(|t| {
            json!({
                "socket": crate::backends::conventions::TOOLS_SOCKET,
                "max_bytes": super::records::MAX_TOOL_BYTES,
                "max_unread": t.max_unread,
            })
        });
        json!({
            "argv": self.argv,
            "env": self.env,
            "stdout_cap": self.stdout_cap,
            "stderr_cap": self.stderr_cap,
            "stop_at": stop_at,
            "listing": listing,
            "tools": tools,
        })
    }

    /// Whether the pod is made for runs that call tools: its own run does,
    /// or it is a warm pod (any run may claim it). Such a pod has stdin,
    /// the tool socket's directory and the shell's `tool` command.
    fn may_call_tools(&self) -> bool {
        self.tools.is_some() || self.pool.is_some()
    }

    /// What the host writes to a claimed warm pod's stdin: the run's spec,
    /// code and files (see `launch.py`'s `receive`), and the new expiry.
    /// `preloaded`: the run is for the pod's waiting Python (Python without
    /// environment values or arguments); else the launcher starts `argv`.
    pub fn delivery(&self, preloaded: bool) -> (Vec<u8>, u64) {
        let (stop_at, expires) = self.times();
        let files: Vec<Value> = self.files.iter().map(|f| json!([f.name, STANDARD.encode(&f.content)])).collect();
        let mut spec = self.spec(stop_at);
        spec["preloaded"] = preloaded.into();
        let job = json!({"spec": spec, "code": STANDARD.encode(&self.code), "files": files}).to_string();
        let mut bytes = format!("{}\n", job.len()).into_bytes();
        bytes.extend_from_slice(job.as_bytes());
        (bytes, expires)
    }

    /// The pod: the `setup` init container (the only one with a
    /// capability: `NET_ADMIN`, as root) takes it off the network and
    /// stages `/work`; `main` runs the launcher as uid 65534 with nothing.
    pub fn pod(&self, cfg: &KubernetesConfig, owner: &str) -> Result<Pod, serde_json::Error> {
        let (_, expires) = self.times();
        // The API takes at most i32::MAX seconds (68 years).
        let active = self.limit.saturating_add(POD_GRACE).saturating_add(POD_GRACE).as_secs().saturating_add(1);
        let active = active.min(i32::MAX as u64);
        // CPU is requested small and limited to cpu_millis: a node fits as
        // many waiting warm pods as its memory holds, not one per core.
        let limits = json!({
            "limits": {"memory": self.memory_bytes.to_string(), "cpu": format!("{}m", cfg.cpu_millis)},
            "requests": {"memory": self.memory_bytes.to_string(), "cpu": format!("{}m", CPU_REQUEST_MILLIS.min(cfg.cpu_millis))},
        });
        let locked = |extra: Value| {
            let mut context = json!({
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "capabilities": {"drop": ["ALL"]},
            });
            if let (Some(context), Value::Object(extra)) = (context.as_object_mut(), extra) {
                context.extend(extra);
            }
            context
        };
        // A warm pod's /work takes whatever run comes: its size is the
        // pod's memory cap, which holds it anyway (a memory-backed emptyDir
        // counts against it).
        let work_bytes = match self.pool {
            Some(_) => self.memory_bytes,
            None => self.work_bytes(),
        };
        // What runs the caller's code (the program, the compiler) runs under
        // execbox's own seccomp profile when the nodes have it.
        let program = match &cfg.seccomp_profile {
            Some(profile) => json!({"seccompProfile": {"type": "Localhost", "localhostProfile": profile}}),
            None => json!({}),
        };
        let job = json!({"name": "job", "mountPath": JOB_DIR, "readOnly": true});
        let warm = self.pool.is_some();
        let mut main_mounts = vec![
            job.clone(),
            json!({"name": "work", "mountPath": "/work", "readOnly": !warm}),
            json!({"name": "tmp", "mountPath": "/tmp"}),
            json!({"name": "shm", "mountPath": "/dev/shm"}),
        ];
        let memory_volume = |bytes: u64| json!({"emptyDir": {"medium": "Memory", "sizeLimit": bytes.to_string()}});
        let mut volumes = vec![
            json!({"name": "job", "configMap": {"name": self.name, "defaultMode": 0o444}}),
            json!({"name": "work"}).merged(memory_volume(work_bytes)),
            json!({"name": "tmp"}).merged(memory_volume(cfg.tmp_bytes)),
            json!({"name": "shm"}).merged(memory_volume(cfg.tmp_bytes)),
        ];
        if let Some(outputs) = &self.outputs {
            main_mounts.push(json!({"name": "out", "mountPath": "/work/out"}));
            volumes.push(json!({"name": "out"}).merged(memory_volume(outputs.tmpfs_bytes)));
        }
        if warm && self.outputs.is_none() {
            main_mounts.push(json!({"name": "out", "mountPath": "/work/out"}));
            volumes.push(json!({"name": "out"}).merged(memory_volume(cfg.max_output_total_bytes.max(4096))));
        }
        if self.may_call_tools() {
            // The job's directory is mounted inside the socket's.
            main_mounts.insert(0, json!({"name": "tools", "mountPath": TOOLS_DIR}));
            volumes.push(json!({"name": "tools"}).merged(memory_volume(TOOLS_DIR_BYTES)));
            main_mounts
                .push(json!({"name": "tool-command", "mountPath": crate::backends::container::TOOL_COMMAND_PATH,
                                    "subPath": "tool", "readOnly": true}));
            volumes.push(json!({"name": "tool-command", "configMap": {"name": self.name,
                                "items": [{"key": "tool", "path": "tool", "mode": 0o555}]}}));
        }
        let mut init = vec![json!({
            "name": "setup", "image": self.image, "imagePullPolicy": cfg.image_pull_policy,
            // Its refusal, if any, is the failure's message.
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "command": ["/usr/bin/python3", "-I", "-S", format!("{JOB_DIR}/setup.py")],
            "securityContext": locked(json!({"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": false,
                "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]}})),
            "resources": limits,
            "volumeMounts": [job.clone(), {"name": "work", "mountPath": "/work"}],
        })];
        if let Some(compile) = &self.compile {
            let memory = compile.memory_bytes.to_string();
            init.push(json!({
                "name": "compile", "image": compile.image, "imagePullPolicy": cfg.image_pull_policy,
                "command": compile.command(),
                "workingDir": JOB_DIR,
                "securityContext": locked(program.clone()),
                "resources": {
                    "limits": {"memory": memory, "cpu": format!("{}m", cfg.cpu_millis)},
                    "requests": {"memory": memory, "cpu": format!("{}m", CPU_REQUEST_MILLIS.min(cfg.cpu_millis))},
                },
                "volumeMounts": [job.clone(), {"name": "build", "mountPath": BUILD_DIR}],
            }));
            main_mounts.push(json!({"name": "build", "mountPath": BUILD_DIR, "readOnly": true}));
            volumes.push(json!({"name": "build"}).merged(memory_volume(2 * MAX_PROGRAM_BYTES)));
        }
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": self.name, "namespace": cfg.namespace, "labels": self.labels(owner),
                         "annotations": {EXPIRES: expires.to_string()}},
            "spec": {
                "restartPolicy": "Never",
                "automountServiceAccountToken": false,
                "enableServiceLinks": false,
                "activeDeadlineSeconds": active,
                "terminationGracePeriodSeconds": 0,
                "securityContext": {"runAsNonRoot": true, "runAsUser": 65534, "runAsGroup": 65534,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "initContainers": init,
                "containers": [{
                    "name": "main", "image": self.image, "imagePullPolicy": cfg.image_pull_policy,
                    "command": ["/usr/bin/python3", "-I", "-S", format!("{JOB_DIR}/launch.py")],
                    "stdin": self.may_call_tools(),
                    "securityContext": locked(program.clone()),
                    "resources": limits,
                    "volumeMounts": main_mounts,
                }],
                "volumes": volumes,
            },
        }))
    }
}

/// `json!({...}).merged(json!({...}))`: the first object with the second's keys.
trait Merged {
    fn merged(self, other: Value) -> Value;
}

impl Merged for Value {
    fn merged(mut self, other: Value) -> Value {
        if let (Some(this), Value::Object(other)) = (self.as_object_mut(), other) {
            this.extend(other);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Job {
        Job {
            name: "execbox-1-2-3".into(),
            role: "run",
            image: "img".into(),
            argv: vec!["/bin/bash".into()],
            code: b"echo hi".to_vec(),
            files: vec![ExecFile { name: "a/b.txt".into(), content: b"x".to_vec(), mime_type: None }],
            env: BTreeMap::from([("A".to_string(), "$(B)".to_string())]),
            memory_bytes: 64 << 20,
            stdout_cap: 10,
            stderr_cap: 10,
            outputs: None,
            limit: Duration::from_secs(5),
            pool: None,
            preload: None,
            compile: None,
            tools: None,
        }
    }

    #[test]
    fn the_pod_is_locked_and_only_setup_holds_a_capability() {
        let pod = serde_json::to_value(job().pod(&KubernetesConfig::default(), "o").expect("a pod")).expect("json");
        let spec = &pod["spec"];
        assert_eq!(spec["automountServiceAccountToken"], false);
        assert_eq!(spec["securityContext"]["runAsUser"], 65534);
        assert_eq!(spec["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
        assert_eq!(spec["activeDeadlineSeconds"], 10);
        let mut forever = job();
        forever.limit = Duration::MAX;
        let pod = serde_json::to_value(forever.pod(&KubernetesConfig::default(), "o").expect("a pod")).expect("json");
        assert_eq!(pod["spec"]["activeDeadlineSeconds"], i32::MAX);
        let main = &spec["containers"][0]["securityContext"];
        assert_eq!(main["capabilities"], json!({"drop": ["ALL"]}));
        assert_eq!(main["readOnlyRootFilesystem"], true);
        assert_eq!(main["allowPrivilegeEscalation"], false);
        assert!(main.get("runAsUser").is_none(), "main runs as the pod's uid");
        let setup = &spec["initContainers"][0]["securityContext"];
        assert_eq!(setup["capabilities"], json!({"drop": ["ALL"], "add": ["NET_ADMIN"]}));
        let mounts = &spec["containers"][0]["volumeMounts"];
        assert!(mounts.as_array().expect("mounts").iter().any(|m| m["mountPath"] == "/work" && m["readOnly"] == true));
        assert_eq!(pod["metadata"]["labels"][MANAGED.0], MANAGED.1);
    }

    /// A Rust run's compile is as locked as the program, under its own
    /// memory limit, with nothing of the kubelet's environment; the
    /// program reads what it wrote, never writes it.
    #[test]
    fn a_rust_compile_is_locked_and_hands_the_program_read_only() {
        let mut job = job();
        job.compile = Some(Compile {
            image: "toolchain".into(),
            main_rs: "fn run() {}".into(),
            user_lines: 1,
            memory_bytes: 1 << 30,
            opt_level: 1,
        });
        let pod = serde_json::to_value(job.pod(&KubernetesConfig::default(), "o").expect("a pod")).expect("json");
        let init = pod["spec"]["initContainers"].as_array().expect("init containers");
        let names: Vec<&str> = init.iter().filter_map(|c| c["name"].as_str()).collect();
        assert_eq!(names, ["setup", "compile"], "the network is down before the compiler starts");
        let compile = &init[1];
        assert_eq!(compile["image"], "toolchain");
        assert_eq!(compile["securityContext"]["capabilities"], json!({"drop": ["ALL"]}));
        assert_eq!(compile["securityContext"]["readOnlyRootFilesystem"], true);
        assert!(compile["securityContext"].get("runAsUser").is_none(), "the pod's uid 65534");
        assert_eq!(compile["resources"]["limits"]["memory"], (1u64 << 30).to_string());
        let script = compile["command"][2].as_str().expect("a script");
        assert!(script.starts_with("ulimit -f 131072 && exec /usr/bin/env -i PATH="), "{script}");
        let main_mounts = &pod["spec"]["containers"][0]["volumeMounts"];
        let build = main_mounts.as_array().expect("mounts").iter().find(|m| m["name"] == "build").expect("build");
        assert_eq!(build["readOnly"], true);
        let map = job.config_map("ns", "o").expect("a config map");
        assert_eq!(map.data.expect("data")["main.rs"], "fn run() {}");
        // Under execbox's profile when configured; setup keeps the runtime's.
        let cfg = KubernetesConfig::default().seccomp_profile("execbox.json");
        let pod = serde_json::to_value(job.pod(&cfg, "o").expect("a pod")).expect("json");
        let localhost = json!({"type": "Localhost", "localhostProfile": "execbox.json"});
        assert_eq!(pod["spec"]["containers"][0]["securityContext"]["seccompProfile"], localhost);
        assert_eq!(pod["spec"]["initContainers"][1]["securityContext"]["seccompProfile"], localhost);
        assert!(pod["spec"]["initContainers"][0]["securityContext"].get("seccompProfile").is_none());
        assert_eq!(pod["spec"]["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
    }

    /// Only a pod that may call tools (its run's grant, or a warm pod) has
    /// stdin, the socket's directory and the `tool` command; the launcher
    /// is told where to listen and the host socket's bound.
    #[test]
    fn only_a_run_that_may_call_tools_gets_stdin_and_the_socket() {
        let cfg = KubernetesConfig::default();
        let mounts = |job: &Job| {
            let pod = serde_json::to_value(job.pod(&cfg, "o").expect("a pod")).expect("json");
            let main = &pod["spec"]["containers"][0];
            let paths: Vec<String> = main["volumeMounts"]
                .as_array()
                .expect("mounts")
                .iter()
                .filter_map(|m| m["mountPath"].as_str().map(str::to_string))
                .collect();
            (main["stdin"].as_bool().unwrap_or(false), paths)
        };
        let plain = job();
        let (stdin, paths) = mounts(&plain);
        assert!(!stdin && !paths.iter().any(|p| p == TOOLS_DIR || p.ends_with("/tool")), "{paths:?}");
        assert!(!plain.config_map("ns", "o").expect("map").data.expect("data").contains_key("tool"));
        let mut granted = job();
        granted.tools = Some(Tools { max_unread: 1000 });
        let (stdin, paths) = mounts(&granted);
        assert!(stdin, "answers come down stdin");
        assert!(paths.iter().any(|p| p == TOOLS_DIR) && paths.iter().any(|p| p == "/usr/local/bin/tool"), "{paths:?}");
        let map = granted.config_map("ns", "o").expect("map");
        let data = map.data.expect("data");
        assert!(data["tool"].starts_with("#!/usr/bin/python3"));
        let spec: Value = serde_json::from_str(&data["spec.json"]).expect("spec");
        assert_eq!(spec["tools"]["socket"], "/run/execbox/tools.sock");
        assert_eq!(spec["tools"]["max_unread"], 1000);
        let mut warm = job();
        warm.pool = Some("p".into());
        assert!(mounts(&warm).0, "a warm pod may take a run that calls tools");
    }

    #[test]
    fn env_values_travel_in_the_config_map_never_expanded_in_the_pod() {
        let job = job();
        let pod = serde_json::to_value(job.pod(&KubernetesConfig::default(), "o").expect("a pod")).expect("json");
        assert!(pod["spec"]["containers"][0].get("env").is_none());
        let map = job.config_map("ns", "o").expect("a config map");
        let spec: Value = serde_json::from_str(&map.data.expect("data")["spec.json"]).expect("spec");
        assert_eq!(spec["env"]["A"], "$(B)");
    }

    #[test]
    fn a_payload_over_the_config_map_is_refused() {
        let mut job = job();
        let refused = |job: &Job| {
            matches!(
                job.check_size(),
                Err(ExecError::InvalidRequest(InvalidRequest::LimitOutOfRange { limit: "payload_bytes", .. }))
            )
        };
        assert!(!refused(&job));
        job.code = vec![b'#'; MAX_CONFIG_MAP_BYTES as usize];
        assert!(refused(&job));
        // The environment counts too.
        job.code = vec![b'#'; 600 << 10];
        assert!(!refused(&job));
        job.env = (0..14).map(|i| (format!("V{i}"), "x".repeat(32 << 10))).collect();
        assert!(refused(&job));
    }
}
