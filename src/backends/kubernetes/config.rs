//! [`KubernetesConfig`]: which cluster, namespace and images, and the caps
//! a run gets when its policy states none.

use std::path::PathBuf;
use std::time::Duration;

use crate::config::{RunDefaults, setters};
use crate::error::ConfigError;

/// Settings of the [`Kubernetes`](super::Kubernetes) backend.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct KubernetesConfig {
    /// The kubeconfig file to use.
    ///
    /// # Default
    /// `None`: what kube-rs infers (`$KUBECONFIG`, `~/.kube/config`, or the
    /// in-cluster service account).
    pub kubeconfig: Option<PathBuf>,
    /// The namespace every pod and ConfigMap is made in; it must exist.
    ///
    /// # Default
    /// `execbox` (what `scripts/kube/up.sh` creates).
    pub namespace: String,
    /// The image of plain Python and shell runs (and of the setup init
    /// container), as the cluster's nodes know it.
    ///
    /// # Default
    /// `localhost/execbox-python:3.11` (`scripts/build-images.sh`).
    pub python_image: String,
    /// The image of runs that declare packages.
    ///
    /// # Default
    /// `localhost/execbox-python-data:3.11`.
    pub python_data_image: String,
    /// The packages the data image is asked for: the availability probe
    /// runs there and declares those it finds importable.
    ///
    /// # Default
    /// numpy, pandas, matplotlib, scipy (what `scripts/build-images.sh` installs).
    pub data_packages: Vec<String>,
    /// The image Rust is compiled in: rustc at `/opt/rust/bin/rustc`, a C
    /// linker on `PATH`, and the harness's crates at `/opt/execbox/deps`
    /// (`libserde_json.rlib` among them). The program then runs in
    /// [`python_image`](Self::python_image) (glibc, and the launcher).
    ///
    /// # Default
    /// `None`: Rust is not declared, and refused by name.
    /// `scripts/build-rust-toolchain-image.sh` builds
    /// `localhost/execbox-rust-toolchain:current` from the host's rustc.
    pub rust_image: Option<String>,
    /// The memory of a Rust run's compile (its init container's limit;
    /// the run's own cap is the policy's).
    ///
    /// # Default
    /// 1 GiB.
    pub compile_memory_bytes: u64,
    /// The `Localhost` seccomp profile the program (and a Rust run's
    /// compiler) runs under: a file under each node's kubelet seccomp root
    /// holding execbox's own profile (`src/backends/container/seccomp.json`,
    /// the docker backend's, narrower than the runtime's default: no
    /// io_uring, `ptrace`, `userfaultfd`, ...). The availability probe
    /// checks that it is in effect. `setup` keeps `RuntimeDefault`.
    ///
    /// # Default
    /// `None`: `RuntimeDefault`. `scripts/kube/up.sh` installs the profile
    /// as `execbox.json`.
    pub seccomp_profile: Option<String>,
    /// The pods' `imagePullPolicy`.
    ///
    /// # Default
    /// `IfNotPresent` (a cluster without a registry has the images loaded).
    pub image_pull_policy: String,
    /// Timeout and memory of a run whose policy states none.
    ///
    /// # Default
    /// 60 s, 256 MiB.
    pub defaults: RunDefaults,
    /// CPU limit of a run's containers, in millicores.
    ///
    /// # Default
    /// 1000.
    pub cpu_millis: u32,
    /// Size of `/tmp` (and of `/dev/shm`), memory-backed `emptyDir`s.
    ///
    /// # Default
    /// 64 MiB.
    pub tmp_bytes: u64,
    /// Most files a run returns from `/work/out`.
    ///
    /// # Default
    /// 64.
    pub max_output_files: usize,
    /// Largest file a run returns.
    ///
    /// # Default
    /// 8 MiB.
    pub max_output_file_bytes: u64,
    /// Most bytes of files a run returns (and the size of `/work/out`).
    ///
    /// # Default
    /// 32 MiB.
    pub max_output_total_bytes: u64,
    /// How long a positive availability check (the namespace answered) is
    /// trusted; the pod-shape probe runs once per process.
    ///
    /// # Default
    /// 30 s.
    pub availability_ttl: Duration,
    /// Warm pods kept claimable (all replicas' together, counted on the
    /// cluster): plain-image runs at the default memory cap and within the
    /// default timeout take one, each pod one run, and are never reused.
    ///
    /// # Default
    /// 0 (off: each one holds a pod's memory on the cluster).
    pub warm_pods: usize,
    /// How long a warm pod waits to be claimed; older ones are left to
    /// expire and are replaced.
    ///
    /// # Default
    /// 10 min.
    pub warm_lifetime: Duration,
}

setters!(KubernetesConfig {
    defaults: RunDefaults,
    cpu_millis: u32,
    tmp_bytes: u64,
    max_output_files: usize,
    max_output_file_bytes: u64,
    max_output_total_bytes: u64,
    availability_ttl: Duration,
    data_packages: Vec<String>,
    warm_pods: usize,
    warm_lifetime: Duration,
    compile_memory_bytes: u64,
} some {
    kubeconfig: PathBuf,
    rust_image: String,
    seccomp_profile: String,
} into {
    namespace: String,
    python_image: String,
    python_data_image: String,
    image_pull_policy: String,
});

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            namespace: "execbox".into(),
            python_image: "localhost/execbox-python:3.11".into(),
            python_data_image: "localhost/execbox-python-data:3.11".into(),
            data_packages: ["numpy", "pandas", "matplotlib", "scipy"].map(String::from).to_vec(),
            rust_image: None,
            seccomp_profile: None,
            compile_memory_bytes: 1 << 30,
            image_pull_policy: "IfNotPresent".into(),
            defaults: RunDefaults::default().timeout(Duration::from_secs(60)).memory_bytes(256 << 20),
            cpu_millis: 1000,
            tmp_bytes: 64 << 20,
            max_output_files: 64,
            max_output_file_bytes: 8 << 20,
            max_output_total_bytes: 32 << 20,
            availability_ttl: Duration::from_secs(30),
            warm_pods: 0,
            warm_lifetime: Duration::from_secs(600),
        }
    }
}

/// The smallest memory cap a run can start under: the launcher's Python
/// and the program's share it.
pub(super) const MIN_MEMORY_BYTES: u64 = 32 << 20;

/// The largest memory cap a run may ask for (1 TiB): past it, no node.
pub(super) const MAX_MEMORY_BYTES: u64 = 1 << 40;

impl KubernetesConfig {
    /// Refuses settings no pod could start under, and names that are not
    /// Kubernetes names.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        let dns_label = |s: &str| {
            !s.is_empty()
                && s.len() <= 63
                && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !s.starts_with('-')
                && !s.ends_with('-')
        };
        if !dns_label(&self.namespace) {
            return Err(ConfigError::invalid("KubernetesConfig::namespace", "not a DNS label"));
        }
        if !matches!(self.image_pull_policy.as_str(), "Always" | "IfNotPresent" | "Never") {
            return Err(ConfigError::invalid(
                "KubernetesConfig::image_pull_policy",
                "one of Always, IfNotPresent, Never",
            ));
        }
        if self.defaults.memory_bytes < MIN_MEMORY_BYTES {
            return Err(ConfigError::invalid(
                "KubernetesConfig::defaults",
                format!("a pod needs at least {MIN_MEMORY_BYTES} bytes of memory"),
            ));
        }
        if self.compile_memory_bytes < MIN_MEMORY_BYTES {
            return Err(ConfigError::invalid(
                "KubernetesConfig::compile_memory_bytes",
                format!("a compile needs at least {MIN_MEMORY_BYTES} bytes of memory"),
            ));
        }
        if let Some(profile) = &self.seccomp_profile {
            // A name under the kubelet's seccomp root, as the API takes it.
            let relative = std::path::Path::new(profile)
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_) | std::path::Component::CurDir));
            if profile.trim().is_empty() || profile.len() > 255 || !relative {
                return Err(ConfigError::invalid(
                    "KubernetesConfig::seccomp_profile",
                    "a file name under the kubelet's seccomp root (no `..`, not absolute, not empty)",
                ));
            }
        }
        if self.cpu_millis == 0 {
            return Err(ConfigError::invalid("KubernetesConfig::cpu_millis", "a run needs some CPU"));
        }
        if self.tmp_bytes < 4096 || self.max_output_total_bytes < 4096 {
            return Err(ConfigError::invalid(
                "KubernetesConfig::tmp_bytes",
                "tmp_bytes and max_output_total_bytes are tmpfs sizes: at least a page",
            ));
        }
        Ok(())
    }
}
