//! [`ContainerConfig`] and [`RustConfig`]: the settings of a
//! [`Container`](super::Container) backend, and their checks.

use std::path::PathBuf;
use std::time::Duration;

use super::argv::check_extra_args;
use crate::config::{RunDefaults, setters};
use crate::error::ConfigError;
use crate::policy::SandboxPolicy;

/// Smallest `--memory` docker accepts.
pub(super) const MIN_MEMORY_BYTES: u64 = 6 << 20;

/// Settings of a [`Container`](super::Container) backend. Every field has a
/// chainable setter: `ContainerConfig::default().engine("podman")`.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ContainerConfig {
    /// The engine CLI: `docker` or `podman`, a name on `PATH` or a path.
    /// Nothing is spawned until the first availability check or run.
    ///
    /// # Default
    /// `docker`.
    pub engine: PathBuf,
    /// Image for Python and shell (`scripts/build-images.sh` builds it
    /// offline). Never pulled (`--pull=never`).
    ///
    /// # Default
    /// `localhost/execbox-python:3.11`.
    pub python_image: String,
    /// Image for Python requests that declare packages: its
    /// `execbox.packages` label (written by `scripts/build-images.sh` after
    /// importing each package in the image) is what this backend provides.
    ///
    /// # Default
    /// `localhost/execbox-python-data:3.11`.
    pub python_data_image: String,
    /// Image that links and runs Rust programs (gcc + libc6-dev).
    ///
    /// # Default
    /// `localhost/execbox-rust:bookworm`.
    pub rust_image: String,
    /// What a run gets when its policy states nothing: its deadline (for
    /// Rust it covers the compile and the run together: no container runs
    /// unbounded), its `--memory`, and the deepest JSON `input` accepted.
    ///
    /// # Default
    /// 300 s, 512 MiB, 128 levels.
    pub defaults: RunDefaults,
    /// `--cpus` of every run container.
    ///
    /// # Default
    /// 1.0.
    pub cpus: f64,
    /// `--pids-limit` when the policy states no process cap. At least 1
    /// (the program itself).
    ///
    /// # Default
    /// 128.
    pub default_pids: u64,
    /// Size of the `/tmp` tmpfs (it also counts against the memory cap).
    ///
    /// # Default
    /// 64 MiB.
    pub tmp_bytes: u64,
    /// `uid:gid` the code runs as.
    ///
    /// # Default
    /// `65534:65534` (nobody).
    pub user: String,
    /// Extra `run` arguments, each one `--flag=value` token from a fixed
    /// allow-list that cannot weaken isolation: `--runtime` (e.g.
    /// `--runtime=runsc`), `--label`, `--cpu-shares`, `--cpuset-cpus`,
    /// `--cpuset-mems`, `--hostname`. Anything else (`--network`,
    /// `--privileged`, `-v`, `--cap-add`, `--security-opt`, `--init`, ...)
    /// is refused by [`Container::new`](super::Container::new). They come
    /// before the locked flags, so a locked value always wins.
    ///
    /// # Default
    /// None.
    pub extra_run_args: Vec<String>,
    /// Most output files returned per run.
    ///
    /// # Default
    /// 64.
    pub max_output_files: usize,
    /// Largest file the code may write anywhere (`RLIMIT_FSIZE`, enforced by
    /// the kernel) and so the largest output file.
    ///
    /// # Default
    /// 8 MiB.
    pub max_output_file_bytes: u64,
    /// Most output bytes returned per run, all files together.
    ///
    /// # Default
    /// 32 MiB.
    pub max_output_total_bytes: u64,
    /// How long a positive availability check is trusted (a negative one:
    /// 2 s). A recheck asks the engine for the images again; the seccomp
    /// probe's positive verdict (one container start) is kept for the
    /// process's life until the engine fails (see
    /// [`Backend::availability`](crate::backend::Backend::availability) on
    /// [`Container`](super::Container)).
    ///
    /// # Default
    /// 30 s.
    pub availability_ttl: Duration,
    /// The Rust pipeline.
    ///
    /// # Default
    /// [`RustConfig::default`].
    pub rust: RustConfig,
    /// A Python session's memory cap when its spec's policy states none
    /// (its container's cgroup, fixed when it starts); a call asking for a
    /// lower cap than the session's is refused.
    ///
    /// # Default
    /// 256 MiB ([`SandboxPolicy::STRICT_MEMORY_BYTES`]).
    pub session_memory_bytes: u64,
    /// Longest life of a session's container (its in-container timer).
    ///
    /// # Default
    /// 1 h.
    pub session_lifetime: Duration,
    /// One-shot Python containers kept started and waiting, per image,
    /// package set, `/work/out` and caps: the **warm pool**. A run that fits
    /// one (Python without environment, arguments, path grants or tools, a
    /// deadline within `defaults.timeout`) takes a warm container, started
    /// with exactly the locked flags its cold container would have had and
    /// its declared packages already imported, sends it the code, and the
    /// container is removed after that one run: **never reused**. Other
    /// runs, and runs that find the pool empty, start a container as
    /// before. A pool starts on its first run (the plain image's under
    /// [`SandboxPolicy::strict`](crate::SandboxPolicy::strict)'s caps at
    /// [`Backend::prepare`](crate::backend::Backend::prepare)) and refills
    /// off the request path; at most 8 pools are kept (the least recently
    /// used goes). 0 turns the pool off.
    ///
    /// # Default
    /// 0: off (each warm container holds memory; the MCP server turns it
    /// on, see `execbox serve --warm-containers`).
    pub warm_containers: usize,
    /// Longest a warm container waits for a run before it is replaced, so
    /// none idles forever. Its in-container timer is this plus
    /// `defaults.timeout` plus the kill grace: it covers any run it may
    /// take.
    ///
    /// # Default
    /// 120 s.
    pub warm_lifetime: Duration,
}

impl Default for ContainerConfig {
    fn default() -> Self {
        Self {
            engine: "docker".into(),
            python_image: "localhost/execbox-python:3.11".into(),
            python_data_image: "localhost/execbox-python-data:3.11".into(),
            rust_image: "localhost/execbox-rust:bookworm".into(),
            defaults: RunDefaults::default().timeout(Duration::from_secs(300)).memory_bytes(512 << 20),
            cpus: 1.0,
            default_pids: 128,
            tmp_bytes: 64 << 20,
            user: "65534:65534".into(),
            extra_run_args: Vec::new(),
            max_output_files: 64,
            max_output_file_bytes: 8 << 20,
            max_output_total_bytes: 32 << 20,
            availability_ttl: Duration::from_secs(30),
            rust: RustConfig::default(),
            session_memory_bytes: SandboxPolicy::STRICT_MEMORY_BYTES,
            session_lifetime: Duration::from_secs(3600),
            warm_containers: 0,
            warm_lifetime: Duration::from_secs(120),
        }
    }
}

setters!(ContainerConfig {
    defaults: RunDefaults,
    cpus: f64,
    default_pids: u64,
    tmp_bytes: u64,
    extra_run_args: Vec<String>,
    max_output_files: usize,
    max_output_file_bytes: u64,
    max_output_total_bytes: u64,
    availability_ttl: Duration,
    rust: RustConfig,
    session_memory_bytes: u64,
    session_lifetime: Duration,
    warm_containers: usize,
    warm_lifetime: Duration,
} into {
    engine: PathBuf,
    python_image: String,
    python_data_image: String,
    rust_image: String,
    user: String,
});

impl ContainerConfig {
    /// The settings a caller got wrong, checked by
    /// [`Container::new`](super::Container::new): extra arguments outside
    /// the allow-list, and caps no run could start under.
    pub(super) fn check(&self) -> Result<(), ConfigError> {
        check_extra_args(&self.extra_run_args)?;
        for (setting, bytes) in [
            ("ContainerConfig::defaults", self.defaults.memory_bytes),
            ("ContainerConfig::session_memory_bytes", self.session_memory_bytes),
        ] {
            if bytes < MIN_MEMORY_BYTES {
                return Err(ConfigError::invalid(
                    setting,
                    format!("a memory cap of {bytes} bytes: containers need at least {MIN_MEMORY_BYTES}"),
                ));
            }
        }
        if self.warm_containers > 0 && self.warm_lifetime.is_zero() {
            return Err(ConfigError::invalid(
                "ContainerConfig::warm_lifetime",
                "0 s: a warm container would be replaced before any run could take it",
            ));
        }
        if self.default_pids == 0 {
            return Err(ConfigError::invalid(
                "ContainerConfig::default_pids",
                "0 processes: the program itself is one process",
            ));
        }
        if !(self.cpus.is_finite() && self.cpus > 0.0) {
            return Err(ConfigError::invalid("ContainerConfig::cpus", format!("{}: must be above 0", self.cpus)));
        }
        Ok(())
    }
}

/// Settings of the Rust pipeline: `fn run(input: serde_json::Value) ->
/// serde_json::Value` compiled inside a locked-down container, cached by
/// source hash, then run in a second one.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RustConfig {
    /// The host's `rustc`; its sysroot is mounted read-only into the compile
    /// container (never run on the host's files).
    ///
    /// # Default
    /// `rustc` (on `PATH`).
    pub rustc: PathBuf,
    /// Compiled programs and prebuilt crates (`scripts/build-rust-deps.sh`
    /// puts serde_json there).
    ///
    /// # Default
    /// None: `$EXECBOX_RUST_CACHE`, else `$XDG_CACHE_HOME/execbox/rust`,
    /// else `~/.cache/execbox/rust` (see [`RustConfig::cache_root`]).
    pub cache_dir: Option<PathBuf>,
    /// `-C opt-level`.
    ///
    /// # Default
    /// 1.
    pub opt_level: u8,
    /// Ceiling of one compile. The request's deadline (the policy's
    /// `timeout_ms`) bounds the compile and the run together; this caps the
    /// compile's share of it.
    ///
    /// # Default
    /// 120 s.
    pub compile_timeout: Duration,
    /// Memory cap of the compile container.
    ///
    /// # Default
    /// 2 GiB.
    pub compile_memory_bytes: u64,
    /// CPUs of the compile container.
    ///
    /// # Default
    /// 2.0.
    pub compile_cpus: f64,
    /// Largest file the compiler may write (the program binary).
    ///
    /// # Default
    /// 256 MiB.
    pub max_binary_bytes: u64,
    /// Compiled programs kept (least recently used removed).
    ///
    /// # Default
    /// 256.
    pub cached_binaries: usize,
}

impl Default for RustConfig {
    fn default() -> Self {
        Self {
            rustc: "rustc".into(),
            cache_dir: None,
            opt_level: 1,
            compile_timeout: Duration::from_secs(120),
            compile_memory_bytes: 2 << 30,
            compile_cpus: 2.0,
            max_binary_bytes: 256 << 20,
            cached_binaries: 256,
        }
    }
}

setters!(RustConfig {
    opt_level: u8,
    compile_timeout: Duration,
    compile_memory_bytes: u64,
    compile_cpus: f64,
    max_binary_bytes: u64,
    cached_binaries: usize,
} some {
    cache_dir: PathBuf,
} into {
    rustc: PathBuf,
});

impl RustConfig {
    /// The cache directory in effect: [`Self::cache_dir`], else the default
    /// described there; `None` when neither the variables nor `HOME` are set.
    pub fn cache_root(&self) -> Option<PathBuf> {
        match &self.cache_dir {
            Some(dir) => Some(dir.clone()),
            None => crate::backends::conventions::cache_dir("EXECBOX_RUST_CACHE", "rust"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_pass_their_own_checks() {
        let cfg = ContainerConfig::default();
        assert_eq!(cfg.check(), Ok(()));
        assert_eq!(
            (cfg.defaults.timeout, cfg.defaults.memory_bytes, cfg.defaults.max_input_nesting),
            (Duration::from_secs(300), 512 << 20, 128)
        );
    }

    #[test]
    fn settings_no_run_could_start_under_are_config_errors() {
        let setting = |cfg: ContainerConfig| match cfg.check() {
            Err(ConfigError::Invalid { setting, .. }) => setting,
            other => panic!("expected a refusal, got {other:?}"),
        };
        let base = ContainerConfig::default;
        assert_eq!(setting(base().extra_run_args(vec!["--privileged".into()])), "ContainerConfig::extra_run_args");
        assert_eq!(setting(base().defaults(RunDefaults::default().memory_bytes(1 << 20))), "ContainerConfig::defaults");
        assert_eq!(setting(base().session_memory_bytes(1024)), "ContainerConfig::session_memory_bytes");
        assert_eq!(setting(base().default_pids(0)), "ContainerConfig::default_pids");
        assert_eq!(setting(base().cpus(0.0)), "ContainerConfig::cpus");
        assert_eq!(setting(base().cpus(f64::NAN)), "ContainerConfig::cpus");
    }

    #[test]
    fn setters_take_what_converts() {
        let cfg =
            ContainerConfig::default().engine("podman").user("1000:1000").rust(RustConfig::default().cache_dir("/c"));
        assert_eq!(cfg.engine, PathBuf::from("podman"));
        assert_eq!(cfg.user, "1000:1000");
        assert_eq!(cfg.rust.cache_dir, Some(PathBuf::from("/c")));
    }
}
