//! [`BackendsConfig`]: what every entry point — a library caller, `execbox
//! run`, `execbox backends`, `execbox serve` — configures about the default
//! matrix, and the one path that builds it
//! ([`ExecutorBuilder::default_backends`]).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::config::setters;
use crate::error::ConfigError;
use crate::executor::{Executor, ExecutorBuilder};

/// Settings of the default backends. `Default` is what
/// [`Executor::with_default_backends`](crate::executor::Executor::with_default_backends) uses.
///
/// One rule for failures, whoever builds the matrix: a setting the caller
/// made that cannot be honoured (a cache directory others can write, a
/// container configuration with an unsafe flag) is an error; what the
/// machine lacks (no container engine, no interpreter modules, no address
/// space for the instance pool) leaves that backend out or unavailable, with
/// the reason in [`Backend::availability`](crate::backend::Backend::availability).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct BackendsConfig {
    /// The container engine CLI (`docker`, `podman`, or a path).
    ///
    /// # Default
    /// `docker`.
    pub container_engine: PathBuf,
    /// Keep compiled wasm modules here across processes.
    ///
    /// # Default
    /// `None` (in memory only).
    pub wasm_cache_dir: Option<PathBuf>,
    /// Where `python.wasm` and `quickjs.wasm` are.
    ///
    /// # Default
    /// `None`: the directory `scripts/fetch-interpreters.sh` fills
    /// (`$EXECBOX_INTERPRETERS_DIR`, else `~/.cache/execbox/interpreters`).
    pub interpreters_dir: Option<PathBuf>,
    /// CPython-in-wasm instances kept started and waiting for code; a
    /// one-shot process should use 0.
    ///
    /// # Default
    /// 2.
    pub python_warm_pool: usize,
    /// JavaScript worker processes kept started and waiting.
    ///
    /// # Default
    /// 2.
    pub js_idle_workers: usize,
    /// Warm one-shot Python containers kept per pool
    /// ([`ContainerConfig::warm_containers`](crate::backends::ContainerConfig::warm_containers));
    /// a one-shot process should use 0.
    ///
    /// # Default
    /// 0 (off: each one holds memory outside this process; `execbox serve`
    /// keeps 1 unless told otherwise).
    pub warm_containers: usize,
    /// Registers the `Kubernetes` backend (`execbox::backends::Kubernetes`)
    /// (feature `kubernetes`) on this cluster, in namespace `execbox`,
    /// after the container backend (which a request gets first when both
    /// can run it; pin `kubernetes` to choose it). Set without the feature:
    /// a [`ConfigError::Unsupported`].
    ///
    /// # Default
    /// `None`: no Kubernetes backend.
    pub kubernetes: Option<ClusterAccess>,
    /// Warm pods the Kubernetes backend keeps waiting, counted across every
    /// process that uses the same namespace (`KubernetesConfig::warm_pods`).
    ///
    /// # Default
    /// 0.
    pub kubernetes_warm_pods: usize,
    /// The image the Kubernetes backend compiles Rust in
    /// (`KubernetesConfig::rust_image`): with it, the backend declares Rust.
    ///
    /// # Default
    /// `None`: Rust is not run on the cluster.
    pub kubernetes_rust_image: Option<String>,
    /// The `Localhost` seccomp profile the Kubernetes backend's programs
    /// run under (`KubernetesConfig::seccomp_profile`).
    ///
    /// # Default
    /// `None`: `RuntimeDefault`.
    pub kubernetes_seccomp_profile: Option<String>,
    /// The memory limit of a Rust compile on the Kubernetes backend
    /// (`KubernetesConfig::compile_memory_bytes`; each Rust pod reserves
    /// it on a node).
    ///
    /// # Default
    /// `None`: 1 GiB.
    pub kubernetes_compile_memory_bytes: Option<u64>,
}

/// How the Kubernetes backend reaches its cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ClusterAccess {
    /// The cluster and credentials this kubeconfig file names.
    Kubeconfig(PathBuf),
    /// What kube-rs infers: `$KUBECONFIG`, `~/.kube/config`, or, in a pod,
    /// the pod's service account (an `execbox serve` replica in the
    /// cluster it runs code on).
    Infer,
}

setters!(BackendsConfig {
    container_engine: PathBuf,
    python_warm_pool: usize,
    js_idle_workers: usize,
    warm_containers: usize,
    kubernetes_warm_pods: usize,
} some {
    wasm_cache_dir: PathBuf,
    interpreters_dir: PathBuf,
    kubernetes: ClusterAccess,
    kubernetes_rust_image: String,
    kubernetes_seccomp_profile: String,
    kubernetes_compile_memory_bytes: u64,
});

impl Default for BackendsConfig {
    fn default() -> Self {
        Self {
            container_engine: PathBuf::from("docker"),
            wasm_cache_dir: None,
            interpreters_dir: None,
            python_warm_pool: 2,
            js_idle_workers: 2,
            warm_containers: 0,
            kubernetes: None,
            kubernetes_warm_pods: 0,
            kubernetes_rust_image: None,
            kubernetes_seccomp_profile: None,
            kubernetes_compile_memory_bytes: None,
        }
    }
}

impl ExecutorBuilder {
    /// Registers every backend compiled in, configured by `cfg`:
    /// [`BoaJs`](crate::backends::BoaJs) (feature `js`), [`WasmGuest`](crate::backends::WasmGuest)
    /// and the QuickJS and CPython [`WasmInterpreter`](crate::backends::WasmInterpreter)s
    /// on one shared [`WasmEngine`](crate::backends::WasmEngine) (feature `wasm`), and
    /// [`Container`](crate::backends::Container) (feature `container`).
    /// Errors only for settings that cannot be honoured (see [`BackendsConfig`]).
    pub fn default_backends(self, cfg: &BackendsConfig) -> Result<Self, ConfigError> {
        #[allow(unused_mut)]
        let mut builder = self;
        // What killed execbox processes left in the temp dir goes now, in
        // the background, not on the first run that stages files.
        #[cfg(any(feature = "wasm", feature = "container"))]
        crate::owner::sweep_stale_temp_dirs();
        #[cfg(feature = "js")]
        {
            use crate::backends::boa::{BoaJs, BoaJsConfig};
            let js = BoaJs::new(BoaJsConfig::default().idle_workers(cfg.js_idle_workers))?;
            builder = builder.backend(js);
        }
        #[cfg(feature = "wasm")]
        {
            builder = wasm_backends(builder, cfg)?;
        }
        #[cfg(feature = "container")]
        {
            use crate::backends::{Container, ContainerConfig};
            let config =
                ContainerConfig::default().engine(cfg.container_engine.clone()).warm_containers(cfg.warm_containers);
            let container = Container::new(config)?;
            builder = builder.backend(container);
        }
        #[cfg(feature = "kubernetes")]
        if let Some(access) = &cfg.kubernetes {
            use crate::backends::{Kubernetes, KubernetesConfig};
            let mut config = KubernetesConfig::default().warm_pods(cfg.kubernetes_warm_pods);
            config.rust_image = cfg.kubernetes_rust_image.clone();
            config.seccomp_profile = cfg.kubernetes_seccomp_profile.clone();
            if let Some(bytes) = cfg.kubernetes_compile_memory_bytes {
                config.compile_memory_bytes = bytes;
            }
            config.kubeconfig = match access {
                ClusterAccess::Kubeconfig(path) => Some(path.clone()),
                ClusterAccess::Infer => None,
            };
            builder = builder.backend(Kubernetes::new(config)?);
        }
        #[cfg(not(feature = "kubernetes"))]
        if cfg.kubernetes.is_some() {
            return Err(ConfigError::Unsupported {
                reason: "a Kubernetes cluster was given, but execbox was built without its kubernetes feature".into(),
            });
        }
        let _ = cfg;
        Ok(builder)
    }
}

impl Executor {
    /// Every backend compiled in with its default configuration
    /// ([`BackendsConfig::default`](crate::defaults::BackendsConfig), see
    /// [`ExecutorBuilder::default_backends`]). The container backend reports
    /// itself unavailable until an engine and its images exist.
    pub fn with_default_backends() -> Self {
        match Self::builder().default_backends(&BackendsConfig::default()) {
            Ok(builder) => builder.build(),
            Err(e) => {
                // The defaults name no setting that can be refused.
                tracing::error!(error = %e, "default backends");
                Self::builder().build()
            }
        }
    }
}

#[cfg(feature = "wasm")]
impl ExecutorBuilder {
    /// Only the wasm guest backend and the interpreters in wasm (QuickJS,
    /// CPython), with [`BackendsConfig::default`]'s settings, on one shared
    /// [`WasmEngine`](crate::backends::WasmEngine).
    pub fn wasm_backends(self) -> Self {
        let builder = ExecutorBuilder::default();
        match wasm_backends(builder, &BackendsConfig::default()) {
            Ok(wasm) => self.append(wasm),
            Err(e) => {
                tracing::warn!(error = %e, "no wasm backends");
                self
            }
        }
    }
}

/// The wasm guest backend and the interpreters, on one engine.
#[cfg(feature = "wasm")]
fn wasm_backends(mut builder: ExecutorBuilder, cfg: &BackendsConfig) -> Result<ExecutorBuilder, ConfigError> {
    use crate::backends::wasm::config::{Interpreter, InterpreterConfig, WasmGuestConfig, interpreters_dir};
    use crate::backends::wasm::engine::WasmEngine;
    use crate::backends::wasm::guest_backend::WasmGuest;
    use crate::backends::wasm::interpreters::WasmInterpreter;
    let engine_cfg = WasmGuestConfig { disk_cache_dir: cfg.wasm_cache_dir.clone(), ..Default::default() };
    let engine = match WasmEngine::new(engine_cfg) {
        Ok(engine) => engine,
        Err(e @ ConfigError::Unsupported { .. }) => {
            // Only when even on-demand allocation is refused: the machine's doing.
            tracing::warn!(error = %e, "no wasm backends: cannot build the wasm engine");
            return Ok(builder);
        }
        // A cache directory the caller named but that cannot be used safely is theirs to fix.
        Err(e) => return Err(e),
    };
    builder = builder.backend(WasmGuest::on_engine(engine.clone()));
    let dir = cfg.interpreters_dir.clone().or_else(interpreters_dir);
    for kind in [Interpreter::QuickJs, Interpreter::Python] {
        let interpreter = InterpreterConfig { kind, dir: dir.clone(), warm_pool: cfg.python_warm_pool };
        builder = builder.backend(WasmInterpreter::on_engine(engine.clone(), interpreter));
    }
    Ok(builder)
}
