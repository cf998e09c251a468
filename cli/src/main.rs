//! The `execbox` command line: run code under a policy (`run`), list the
//! backends (`backends`), serve the matrix over MCP (`serve`).
//!
//! Exit codes: 0 the program ran and its outcome is `ok`; 1 it ran and the
//! outcome is anything else; 2 nothing ran (refusal, invalid request, usage);
//! 128 + N when signal N (SIGTERM, SIGINT, SIGHUP) ended it, after it
//! removed the containers and staging directories it started.
//!
//! Modules by job: `run` (a one-shot run and its request), `serve` (the MCP
//! server's start and stop), `render` (what is printed).

// The flags' doc comments are their `--help` text, where `[:NAME]` is
// literal, not a link.
#![allow(rustdoc::broken_intra_doc_links)]

mod render;
mod run;
#[cfg(feature = "serve")]
mod serve;
mod workspace_dir;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use execbox::{BackendsConfig, ClusterAccess, Executor};

#[derive(Parser)]
#[command(name = "execbox", version, about = "Run untrusted code under a policy that fails closed")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run code once and report the result.
    Run(Box<RunArgs>),
    /// Serve the matrix over MCP (stdio by default, or streamable HTTP at /mcp).
    #[cfg(feature = "serve")]
    Serve(Box<ServeArgs>),
    /// List the registered backends and what they enforce.
    Backends {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        backends: BackendFlags,
    },
}

/// `execbox serve`'s flags.
#[cfg(feature = "serve")]
#[derive(clap::Args)]
pub(crate) struct ServeArgs {
    /// Serve streamable HTTP at http://ADDR/mcp instead of stdio (e.g. 127.0.0.1:8931).
    #[arg(long, value_name = "ADDR")]
    pub(crate) http: Option<std::net::SocketAddr>,
    /// A file holding the bearer token HTTP clients must send; required for a non-loopback ADDR.
    #[arg(long, value_name = "FILE")]
    pub(crate) token_file: Option<PathBuf>,
    /// Also accept requests whose Host header names this (NAME or NAME:PORT; repeatable), e.g. the name
    /// a reverse proxy forwards. Loopback names with the bound port are always accepted; `*` accepts any
    /// (only with --token-file). Other Hosts get 403: DNS-rebinding protection.
    #[arg(long = "allowed-host", value_name = "NAME", requires = "http")]
    pub(crate) allowed_hosts: Vec<String>,
    /// Also accept browser requests from this Origin (scheme://host:port, scheme://host:*, or null with
    /// --token-file; repeatable). Loopback origins are always accepted, requests without an Origin too;
    /// `*` accepts any (only with --token-file). Other Origins get 403.
    #[arg(long = "allowed-origin", value_name = "ORIGIN", requires = "http")]
    pub(crate) allowed_origins: Vec<String>,
    /// The policy ceiling, a SandboxPolicy in JSON (missing fields take strict's values; default: strict).
    /// Grants (directories, environment names) come only from here.
    #[arg(long, value_name = "FILE")]
    pub(crate) policy: Option<PathBuf>,
    /// Pass this variable's value from the server's environment to every run (repeatable; adds the
    /// name to the policy's environment allow-list).
    #[arg(long = "allow-env", value_name = "NAME")]
    pub(crate) allow_env: Vec<String>,
    /// Runs at once (default: 4 per core).
    #[arg(long, value_name = "N")]
    pub(crate) max_concurrent: Option<usize>,
    /// Calls that may wait for a run slot; more are refused as busy at once.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub(crate) max_queued: usize,
    /// Warm CPython-in-wasm instances kept ready.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub(crate) python_warm_pool: usize,
    /// JavaScript worker processes kept ready.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub(crate) js_idle_workers: usize,
    /// Warm one-shot Python containers kept ready per pool (image, packages, caps); each is used
    /// for one run, then removed; 0 turns the pool off.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub(crate) warm_containers: usize,
    /// Live sessions at most (all clients together).
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub(crate) max_sessions: usize,
    /// A session unused this many seconds is closed.
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    pub(crate) session_idle_secs: u64,
    /// Report a program that ran and did not end ok as a failed tool call (isError: true), as before
    /// this flag existed. By default such a run is the tool's normal answer, its outcome first: agent
    /// frameworks spend their tool-retry budget on failed calls.
    #[arg(long)]
    pub(crate) failures_as_errors: bool,
    /// Where `create_workspace` mounts workspaces (a tmpfs each; needs root).
    #[arg(long, value_name = "DIR", default_value = execbox::workspace::DEFAULT_ROOT)]
    pub(crate) workspace_root: std::path::PathBuf,
    /// The largest quota a workspace may have, and its default, in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 64)]
    pub(crate) workspace_quota_mb: u64,
    /// Workspaces live at once across all connections (each may hold its quota in memory).
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub(crate) max_workspaces: usize,
    /// The longest a program (`start_program`) may run, and the lifetime of one that states none.
    #[arg(long, value_name = "SECS", default_value_t = 600)]
    pub(crate) program_lifetime_secs: u64,
    /// Close a workspace no call used for this long (and in which no program runs).
    #[arg(long, value_name = "SECS", default_value_t = 900)]
    pub(crate) workspace_idle_secs: u64,
    /// Close a workspace this long after it was made, whatever runs in it.
    #[arg(long, value_name = "SECS", default_value_t = 3600)]
    pub(crate) workspace_lifetime_secs: u64,
    /// This server's name among replicas behind one address (e.g. its pod's name): session and
    /// workspace answers say which replica holds them, and a call that reaches another replica is
    /// told which one it reached (unknown_session).
    #[arg(long, value_name = "NAME", env = "EXECBOX_REPLICA")]
    pub(crate) replica: Option<String>,
    /// How the log on stderr is written (`EXECBOX_LOG` sets the level, e.g. `info` for one span per run; default warn).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
    #[command(flatten)]
    pub(crate) backends: BackendFlags,
    #[command(flatten)]
    pub(crate) tools: ToolFlags,
    #[cfg(feature = "artifacts")]
    #[command(flatten)]
    pub(crate) artifacts: ArtifactFlags,
}

/// Artifacts: files code keeps across runs (`artifacts.*` tools), and
/// spilled output (`run` and `serve`).
#[cfg(feature = "artifacts")]
#[derive(clap::Args, Clone, Default)]
pub(crate) struct ArtifactFlags {
    /// Keep artifacts in this directory: registers the tools artifacts.save, artifacts.load and
    /// artifacts.list (grant them with --allow-tool 'artifacts.*').
    #[arg(long = "artifacts", value_name = "DIR")]
    pub(crate) dir: Option<PathBuf>,
    /// When stdout passes its cap, keep all of it as an artifact (up to 8 MiB) and show its head
    /// and tail; the result's `spilled` names it.
    #[arg(long, requires = "dir")]
    pub(crate) spill_output: bool,
}

#[cfg(feature = "artifacts")]
impl ArtifactFlags {
    /// The store's settings, if `--artifacts` was given.
    pub(crate) fn config(&self) -> Option<execbox::artifacts::ArtifactStoreConfig> {
        self.dir.as_ref().map(|dir| execbox::artifacts::ArtifactStoreConfig::default().dir(dir.clone()))
    }

    /// Asks `policy` to spill output, with `--spill-output`.
    pub(crate) fn spill(&self, policy: &mut execbox::SandboxPolicy) {
        if self.spill_output {
            policy.spill_output = Some(true);
        }
    }
}

/// Code Mode: the tools code may call (`run` and `serve`).
#[derive(clap::Args, Clone, Default)]
pub(crate) struct ToolFlags {
    /// Connect the upstream MCP servers of this `mcpServers` document (the shape MCP clients use);
    /// their tools are named SERVER.TOOL. Granted with --allow-tool.
    #[cfg(feature = "upstream")]
    #[arg(long, value_name = "FILE")]
    pub(crate) upstreams: Option<PathBuf>,
    /// Let code call these tools: a name (server.tool), `server.*` or `*` (repeatable; adds to the
    /// policy's tool grants).
    #[arg(long = "allow-tool", value_name = "PATTERN")]
    pub(crate) allow_tools: Vec<String>,
}

impl ToolFlags {
    /// Adds the grants to `policy`'s.
    pub(crate) fn grant(&self, policy: &mut execbox::SandboxPolicy) {
        if self.allow_tools.is_empty() {
            return;
        }
        let mut grants = policy.tool_grants().map(<[String]>::to_vec).unwrap_or_default();
        grants.extend(self.allow_tools.iter().filter(|g| !grants.contains(g)).cloned().collect::<Vec<_>>());
        policy.tools = execbox::Access::Allow(grants);
    }

    /// The `mcpServers` document, if one was named.
    #[cfg(feature = "upstream")]
    pub(crate) fn upstreams(&self) -> Result<Option<execbox::tools::UpstreamsConfig>, String> {
        let Some(path) = &self.upstreams else { return Ok(None) };
        let bytes =
            read(path, 1 << 20, "execbox's limit for an mcpServers file").map_err(|e| format!("--upstreams: {e}"))?;
        let text = String::from_utf8(bytes).map_err(|_| format!("--upstreams {}: not UTF-8", path.display()))?;
        execbox::tools::UpstreamsConfig::from_json(&text)
            .map(Some)
            .map_err(|e| format!("--upstreams {}: {}", path.display(), execbox::with_causes(&e)))
    }
}

/// What every command configures about the backends (one
/// [`BackendsConfig`] for `run`, `backends` and `serve`).
#[derive(clap::Args, Clone)]
pub(crate) struct BackendFlags {
    /// Container engine CLI for python, shell and rust.
    #[arg(long, value_name = "docker|podman", env = "EXECBOX_ENGINE", default_value = "docker")]
    pub(crate) engine: PathBuf,
    /// Keep compiled wasm modules in this directory across runs.
    #[arg(long, value_name = "DIR", env = "EXECBOX_WASM_CACHE_DIR")]
    pub(crate) wasm_cache_dir: Option<PathBuf>,
    /// Add the kubernetes backend (Python and shell in pods, and Rust with --kube-rust-image; namespace execbox) on the cluster
    /// this kubeconfig names; needs execbox built with its `kubernetes` feature.
    #[arg(long, value_name = "FILE", env = "EXECBOX_KUBECONFIG")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// Add the kubernetes backend on the cluster this process runs in (its pod's service
    /// account), or the one $KUBECONFIG or ~/.kube/config names.
    #[arg(long, env = "EXECBOX_KUBE_IN_CLUSTER", conflicts_with = "kubeconfig")]
    pub(crate) kube_in_cluster: bool,
    /// Warm pods the kubernetes backend keeps waiting, counted across every execbox process
    /// using its namespace (each used for one run, then deleted).
    #[arg(long, value_name = "N", env = "EXECBOX_KUBE_WARM_PODS", default_value_t = 0)]
    pub(crate) kube_warm_pods: usize,
    /// Compile and run Rust on the kubernetes backend too, compiling in this image
    /// (scripts/build-rust-toolchain-image.sh builds localhost/execbox-rust-toolchain:current).
    #[arg(long, value_name = "IMAGE", env = "EXECBOX_KUBE_RUST_IMAGE")]
    pub(crate) kube_rust_image: Option<String>,
    /// Run the kubernetes backend's programs under this Localhost seccomp profile: execbox's own
    /// (src/backends/container/seccomp.json) installed on every node under this name
    /// (scripts/kube/up.sh installs it as execbox.json). Default: RuntimeDefault.
    #[arg(long, value_name = "NAME", env = "EXECBOX_KUBE_SECCOMP_PROFILE")]
    pub(crate) kube_seccomp_profile: Option<String>,
    /// The memory limit of a Rust compile on the kubernetes backend, in MiB (each Rust pod
    /// reserves it on a node). Default: 1024.
    #[arg(long, value_name = "MIB", env = "EXECBOX_KUBE_COMPILE_MEMORY_MB")]
    pub(crate) kube_compile_memory_mb: Option<u64>,
}

impl BackendFlags {
    /// The matrix's settings, with the pool sizes of this kind of process.
    pub(crate) fn config(&self, js_idle_workers: usize, python_warm_pool: usize) -> BackendsConfig {
        let mut config = BackendsConfig::default()
            .container_engine(self.engine.clone())
            .js_idle_workers(js_idle_workers)
            .python_warm_pool(python_warm_pool);
        config.wasm_cache_dir = self.wasm_cache_dir.clone();
        config.kubernetes = match (&self.kubeconfig, self.kube_in_cluster) {
            (Some(path), _) => Some(ClusterAccess::Kubeconfig(path.clone())),
            (None, true) => Some(ClusterAccess::Infer),
            (None, false) => None,
        };
        config.kubernetes_warm_pods = self.kube_warm_pods;
        config.kubernetes_rust_image = self.kube_rust_image.clone();
        config.kubernetes_seccomp_profile = self.kube_seccomp_profile.clone();
        config.kubernetes_compile_memory_bytes = self.kube_compile_memory_mb.map(|mib| mib.saturating_mul(1 << 20));
        config
    }
}

#[derive(clap::Args)]
pub(crate) struct RunArgs {
    /// Language id: js/javascript, python, shell, rust, wasm (`--code` is WAT text, `--file` a .wasm or .wat file).
    #[arg(long, default_value = "js")]
    pub(crate) lang: String,
    /// The code itself.
    #[arg(long, conflicts_with = "file", required_unless_present = "file")]
    pub(crate) code: Option<String>,
    /// Read the code from a file.
    #[arg(long)]
    pub(crate) file: Option<PathBuf>,
    /// JSON input (JS and Python: the `input` binding; Rust: `run`'s argument; wasm: the JSON-ABI
    /// argument, or stdin of a WASI command; containers also get it as /work/input.json).
    #[arg(long)]
    pub(crate) input: Option<String>,
    /// Wall-clock limit in milliseconds (default: the strict policy's 5000).
    #[arg(long)]
    pub(crate) timeout_ms: Option<u64>,
    /// Instruction/fuel budget.
    #[arg(long)]
    pub(crate) fuel: Option<u64>,
    /// Require a memory cap of this many MiB.
    #[arg(long)]
    pub(crate) memory_mb: Option<u64>,
    /// Cap on each of stdout and stderr, in bytes.
    #[arg(long)]
    pub(crate) max_output_bytes: Option<u64>,
    /// Largest accepted code (module) in bytes (default: the strict policy's 1 MiB).
    #[arg(long)]
    pub(crate) max_code_bytes: Option<u64>,
    /// Standard input for the program, from a file (`-`: this process's stdin).
    #[arg(long, value_name = "FILE")]
    pub(crate) stdin_file: Option<PathBuf>,
    /// A command-line argument for the program (repeatable).
    #[arg(long = "arg", value_name = "ARG", allow_hyphen_values = true)]
    pub(crate) args: Vec<String>,
    /// Pass this variable from execbox's own environment (repeatable).
    #[arg(long = "allow-env", value_name = "NAME")]
    pub(crate) allow_env: Vec<String>,
    /// Pass NAME=VALUE explicitly (repeatable).
    #[arg(long = "env", value_name = "NAME=VALUE")]
    pub(crate) env: Vec<String>,
    /// Grant a host directory as HOST:GUEST[:ro|rw] (repeatable; default ro).
    #[arg(long = "preopen", value_name = "HOST:GUEST[:ro|rw]")]
    pub(crate) preopens: Vec<String>,
    /// Stage a host file for the program as PATH[:NAME] (repeatable; NAME defaults to the file
    /// name). Containers see it under /work, wasm guests under /input.
    #[arg(long = "input-file", value_name = "PATH[:NAME]")]
    pub(crate) input_files: Vec<String>,
    /// Collect the files the program writes to /work/out and save them here.
    #[arg(long, value_name = "DIR")]
    pub(crate) output_dir: Option<PathBuf>,
    /// Run over this directory: it is copied into a workspace the code sees read-write at /work
    /// (any backend that carries files), and the files matching --collect are written back
    /// after the run. Needs root (the workspace is a quota-capped tmpfs).
    #[arg(long, value_name = "DIR")]
    pub(crate) workspace: Option<PathBuf>,
    /// With --workspace: what is written back, as globs relative to /work (repeatable;
    /// `*` within a name, `**` across directories; default `**`, everything).
    #[arg(long = "collect", value_name = "GLOB", requires = "workspace")]
    pub(crate) collect: Vec<String>,
    /// With --workspace: the workspace's quota in MiB (copied files and what the code writes).
    #[arg(long, value_name = "MIB", default_value_t = 64, requires = "workspace")]
    pub(crate) workspace_quota_mb: u64,
    /// With --workspace: where workspaces are mounted (default /run/execbox/workspaces).
    #[arg(long, value_name = "DIR", requires = "workspace")]
    pub(crate) workspace_root: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) backends: BackendFlags,
    #[command(flatten)]
    pub(crate) tools: ToolFlags,
    #[cfg(feature = "artifacts")]
    #[command(flatten)]
    pub(crate) artifacts: ArtifactFlags,
    /// The scope of this run's artifacts (with --artifacts): runs given the same key share them.
    #[cfg(feature = "artifacts")]
    #[arg(long, value_name = "KEY", requires = "dir")]
    pub(crate) artifact_key: Option<String>,
    /// A package the code needs (repeatable; Python: numpy, pandas, matplotlib, scipy on the
    /// container's data image). Only a backend that provides every one is chosen.
    #[arg(long = "package", value_name = "NAME")]
    pub(crate) packages: Vec<String>,
    /// Run on this backend only.
    #[arg(long)]
    pub(crate) backend: Option<String>,
    /// Print exactly one JSON object on stdout.
    #[arg(long)]
    pub(crate) json: bool,
    /// A JSON Schema (JSON file) the program's output must match: otherwise the outcome is
    /// invalid_output, with output_errors naming each failing place (exit code 1).
    #[arg(long, value_name = "FILE")]
    pub(crate) output_schema: Option<PathBuf>,
    /// How the log on stderr is written (`EXECBOX_LOG` sets the level; default warn).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
}

/// How the log (warnings, and with `EXECBOX_LOG=info` one span per run)
/// is written to stderr.
#[derive(Clone, Copy, Debug, Default, ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (with the span's fields).
    Json,
}

/// Writes the log to stderr: `EXECBOX_LOG` filters it (tracing's
/// `EnvFilter` syntax; default `default_level`).
fn init_log(format: LogFormat, default_level: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("EXECBOX_LOG").unwrap_or_else(|_| EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Text => builder.with_ansi(false).try_init(),
        LogFormat::Json => builder.json().with_current_span(true).with_span_list(false).try_init(),
    };
    if let Err(e) = installed {
        eprintln!("execbox: no log: {e}");
    }
}

fn main() -> ExitCode {
    // Spawned as a worker (contained JS, wasm compiles), serve and exit; otherwise go on.
    #[cfg(any(feature = "js", feature = "wasm"))]
    execbox::worker::serve_if_worker();
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => {
            init_log(args.log_format, "warn");
            run::run(*args)
        }
        #[cfg(feature = "serve")]
        Command::Serve(args) => {
            init_log(args.log_format, "warn");
            serve::serve(*args)
        }
        Command::Backends { json, backends: flags } => {
            init_log(LogFormat::Text, "warn");
            // A listing starts nothing it would not use.
            match Executor::builder().default_backends(&flags.config(0, 0)) {
                Ok(builder) => render::backends(&builder.build(), json),
                Err(err) => render::refuse_config(json, &err),
            }
        }
    }
}

/// Largest `--input-file` or `--stdin-file` the CLI reads, in bytes.
pub(crate) const MAX_INPUT_FILE_BYTES: u64 = 64 << 20;

/// Reads at most `max` bytes of a regular file, or of this process's stdin
/// for `-`. Anything but a regular file (a FIFO, socket or device, which
/// could block or never end) is refused: opened non-blocking and checked
/// on the handle, so a path swapped for a FIFO cannot hang the CLI.
pub(crate) fn read(path: &Path, max: u64, limit: &str) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let name = path.display();
    let source: Box<dyn Read> = if path == Path::new("-") {
        Box::new(std::io::stdin())
    } else {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| format!("cannot read {name}: {e}"))?;
        let meta = file.metadata().map_err(|e| format!("cannot read {name}: {e}"))?;
        if !meta.is_file() {
            return Err(format!("cannot read {name}: not a regular file (FIFOs, sockets and devices are refused)"));
        }
        Box::new(file)
    };
    let mut bytes = Vec::new();
    source.take(max.saturating_add(1)).read_to_end(&mut bytes).map_err(|e| format!("cannot read {name}: {e}"))?;
    if bytes.len() as u64 > max {
        return Err(format!("{name} is over {max} bytes ({limit})"));
    }
    Ok(bytes)
}
