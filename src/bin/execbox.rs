//! The `execbox` command line: run code under a policy, list backends.
//!
//! Exit codes: 0 the program ran and its outcome is `ok`; 1 it ran and the
//! outcome is anything else; 2 nothing ran (refusal, invalid request, usage);
//! 128 + N when signal N (SIGTERM, SIGINT, SIGHUP) ended it, after it
//! removed the containers and staging directories it started.

use parking_lot::Mutex;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use execbox::{
    Access, BackendsConfig, CapturedStream, ExecError, ExecFile, ExecRequest, ExecResult, Executor, Language, Outcome,
    PathGrants, Payload, SandboxPolicy,
};
use serde_json::{Value, json};

#[cfg(feature = "container")]
use execbox::backends::container::OutputDir;

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
struct ServeArgs {
    /// Serve streamable HTTP at http://ADDR/mcp instead of stdio (e.g. 127.0.0.1:8931).
    #[arg(long, value_name = "ADDR")]
    http: Option<std::net::SocketAddr>,
    /// A file holding the bearer token HTTP clients must send; required for a non-loopback ADDR.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// The policy ceiling, a SandboxPolicy in JSON (missing fields take strict's values; default: strict).
    /// Grants (directories, environment names) come only from here.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// Pass this variable's value from the server's environment to every run (repeatable; adds the
    /// name to the policy's environment allow-list).
    #[arg(long = "allow-env", value_name = "NAME")]
    allow_env: Vec<String>,
    /// Runs at once (default: 4 per core).
    #[arg(long, value_name = "N")]
    max_concurrent: Option<usize>,
    /// Calls that may wait for a run slot; more are refused as busy at once.
    #[arg(long, value_name = "N", default_value_t = 64)]
    max_queued: usize,
    /// Warm CPython-in-wasm instances kept ready.
    #[arg(long, value_name = "N", default_value_t = 2)]
    python_warm_pool: usize,
    /// JavaScript worker processes kept ready.
    #[arg(long, value_name = "N", default_value_t = 2)]
    js_idle_workers: usize,
    /// Live sessions at most (all clients together).
    #[arg(long, value_name = "N", default_value_t = 16)]
    max_sessions: usize,
    /// A session unused this many seconds is closed.
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    session_idle_secs: u64,
    #[command(flatten)]
    backends: BackendFlags,
}

/// What every command configures about the backends (one
/// [`BackendsConfig`] for `run`, `backends` and `serve`).
#[derive(clap::Args, Clone)]
struct BackendFlags {
    /// Container engine CLI for python, shell and rust.
    #[arg(long, value_name = "docker|podman", env = "EXECBOX_ENGINE", default_value = "docker")]
    engine: PathBuf,
    /// Keep compiled wasm modules in this directory across runs.
    #[arg(long, value_name = "DIR", env = "EXECBOX_WASM_CACHE_DIR")]
    wasm_cache_dir: Option<PathBuf>,
}

impl BackendFlags {
    /// The matrix's settings, with the pool sizes of this kind of process.
    fn config(&self, js_idle_workers: usize, python_warm_pool: usize) -> BackendsConfig {
        BackendsConfig {
            container_engine: self.engine.clone(),
            wasm_cache_dir: self.wasm_cache_dir.clone(),
            js_idle_workers,
            python_warm_pool,
            ..BackendsConfig::default()
        }
    }
}

#[derive(clap::Args)]
struct RunArgs {
    /// Language id: js/javascript, python, shell, rust, wasm (`--code` is WAT text, `--file` a .wasm or .wat file).
    #[arg(long, default_value = "js")]
    lang: String,
    /// The code itself.
    #[arg(long, conflicts_with = "file", required_unless_present = "file")]
    code: Option<String>,
    /// Read the code from a file.
    #[arg(long)]
    file: Option<PathBuf>,
    /// JSON input (JS and Python: the `input` binding; Rust: `run`'s argument; wasm: the JSON-ABI
    /// argument, or stdin of a WASI command; containers also get it as /work/input.json).
    #[arg(long)]
    input: Option<String>,
    /// Wall-clock limit in milliseconds (default: the strict policy's 5000).
    #[arg(long)]
    timeout_ms: Option<u64>,
    /// Instruction/fuel budget.
    #[arg(long)]
    fuel: Option<u64>,
    /// Require a memory cap of this many MiB.
    #[arg(long)]
    memory_mb: Option<u64>,
    /// Cap on each of stdout and stderr, in bytes.
    #[arg(long)]
    max_output_bytes: Option<u64>,
    /// Largest accepted code (module) in bytes (default: the strict policy's 1 MiB).
    #[arg(long)]
    max_code_bytes: Option<u64>,
    /// Standard input for the program, from a file (`-`: this process's stdin).
    #[arg(long, value_name = "FILE")]
    stdin_file: Option<PathBuf>,
    /// A command-line argument for the program (repeatable).
    #[arg(long = "arg", value_name = "ARG", allow_hyphen_values = true)]
    args: Vec<String>,
    /// Pass this variable from execbox's own environment (repeatable).
    #[arg(long = "allow-env", value_name = "NAME")]
    allow_env: Vec<String>,
    /// Pass NAME=VALUE explicitly (repeatable).
    #[arg(long = "env", value_name = "NAME=VALUE")]
    env: Vec<String>,
    /// Grant a host directory as HOST:GUEST[:ro|rw] (repeatable; default ro).
    #[arg(long = "preopen", value_name = "HOST:GUEST[:ro|rw]")]
    preopens: Vec<String>,
    /// Stage a host file for the program as PATH[:NAME] (repeatable; NAME defaults to the file
    /// name). Containers see it under /work, wasm guests under /input.
    #[arg(long = "input-file", value_name = "PATH[:NAME]")]
    input_files: Vec<String>,
    /// Collect the files the program writes to /work/out and save them here.
    #[arg(long, value_name = "DIR")]
    output_dir: Option<PathBuf>,
    #[command(flatten)]
    backends: BackendFlags,
    /// A package the code needs (repeatable; Python: numpy, pandas, matplotlib, scipy on the
    /// container's data image). Only a backend that provides every one is chosen.
    #[arg(long = "package", value_name = "NAME")]
    packages: Vec<String>,
    /// Run on this backend only.
    #[arg(long)]
    backend: Option<String>,
    /// Print exactly one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// Held from the moment a result is in until the process exits, so a signal
/// arriving then waits for the answer instead of cutting it off, and an
/// answer never follows a signal's cleanup.
static ANSWERING: Mutex<()> = Mutex::new(());

fn main() -> ExitCode {
    // Spawned as a worker (contained JS, wasm compiles), serve and exit; otherwise go on.
    #[cfg(any(feature = "js", feature = "wasm"))]
    execbox::worker::serve_if_worker();
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => run(*args),
        #[cfg(feature = "serve")]
        Command::Serve(args) => serve(*args),
        Command::Backends { json, backends: flags } => {
            // A listing starts nothing it would not use.
            match Executor::builder().default_backends(&flags.config(0, 0)) {
                Ok(builder) => backends(&builder.build(), json),
                Err(err) => refuse(json, err.to_json(), &describe(&err)),
            }
        }
    }
}

/// On SIGTERM, SIGINT or SIGHUP (a closed terminal): shuts the executor's
/// backends down (kills and removes the containers this process started,
/// removes its staging directories) and exits with 128 + the signal. A
/// result already being printed is finished first. The handler holds the
/// executor weakly, so an ordinary exit still waits for the backends'
/// own cleanup.
fn exit_on_signals(exec: execbox::WeakExecutor) -> std::io::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])?;
    std::thread::Builder::new().name("execbox-signals".into()).spawn(move || {
        if let Some(signal) = signals.forever().next() {
            let _answering = ANSWERING.lock();
            if let Some(exec) = exec.upgrade() {
                exec.shutdown();
            }
            std::process::exit(128 + signal);
        }
    })?;
    Ok(())
}

fn run(args: RunArgs) -> ExitCode {
    let as_json = args.json;
    let invalid = |message: String| {
        refuse(as_json, json!({"error": {"kind": "invalid_request", "message": message, "violations": []}}), &message)
    };
    // Opened before the run: the program cannot redirect the save by
    // swapping the path for a link (see `OutputDir`).
    let output_dir = match args.output_dir.as_deref().map(OutputDir::open).transpose() {
        Ok(dir) => dir,
        Err(e) => {
            let path = args.output_dir.as_deref().unwrap_or(Path::new("")).display();
            return invalid(format!("--output-dir {path}: {e}"));
        }
    };
    // One run per process: one JS worker (starting now, while the rest is
    // built), no warm Python pool (it would only cost start-ups at exit).
    let exec = match Executor::builder().default_backends(&args.backends.config(1, 0)) {
        Ok(builder) => builder.build(),
        Err(err) => return refuse(as_json, err.to_json(), &describe(&err)),
    };
    if let Err(e) = exit_on_signals(exec.downgrade()) {
        eprintln!("execbox: cannot handle signals: {e}");
        return ExitCode::from(2);
    }
    let request = match build_request(args) {
        Ok(r) => r,
        Err(message) => return invalid(message),
    };
    // What a server does at start-up: the backend that will run this gets
    // ready (a JS worker started, an interpreter loaded or compiled once)
    // before the request's deadline starts.
    exec.prepare_for(&request, Duration::from_secs(10));
    let executed = exec.execute_blocking(request);
    // Not released: the process exits with this answer.
    std::mem::forget(ANSWERING.lock());
    match executed {
        Ok(result) => {
            // The program ran either way: a save that fails is reported
            // after its result, on stderr, with exit code 1.
            let saved = output_dir.as_ref().map(|dir| match dir.save(&result.output_files) {
                Ok(()) => Ok(format!("[{} output files saved to {}]", result.output_files.len(), dir.path().display())),
                Err(e) => Err(format!("execbox: output files not saved: {e} (in {})", dir.path().display())),
            });
            if as_json {
                print_out(&result.to_json().to_string());
            } else {
                print_human(&result);
            }
            match saved {
                Some(Err(e)) => {
                    eprintln!("{e}");
                    return ExitCode::from(1);
                }
                Some(Ok(note)) if !as_json => eprintln!("{note}"),
                _ => {}
            }
            if result.outcome == Outcome::Ok { ExitCode::SUCCESS } else { ExitCode::from(1) }
        }
        Err(err) => refuse(as_json, err.to_json(), &describe(&err)),
    }
}

/// Runs the MCP server until stdin ends (stdio), or SIGTERM/SIGINT/SIGHUP;
/// then drains (runs in flight finish or time out) and cleans up.
#[cfg(feature = "serve")]
fn serve(args: ServeArgs) -> ExitCode {
    use execbox::serve::{ServeConfig, Server};
    let fail = |message: String| {
        eprintln!("execbox serve: {message}");
        ExitCode::from(2)
    };
    let mut policy = match &args.policy {
        Some(path) => match read(path, 1 << 20, "execbox's limit for a policy file").and_then(|bytes| {
            serde_json::from_slice::<SandboxPolicy>(&bytes).map_err(|e| format!("not a SandboxPolicy: {e}"))
        }) {
            Ok(policy) => policy,
            Err(e) => return fail(format!("--policy: {e}")),
        },
        None => SandboxPolicy::strict(),
    };
    let mut env = std::collections::BTreeMap::new();
    for name in &args.allow_env {
        match std::env::var(name) {
            Ok(value) => env.insert(name.clone(), value),
            Err(_) => return fail(format!("--allow-env {name}: not set in this environment")),
        };
    }
    if !env.is_empty() {
        let mut names = match policy.environment {
            Access::Allow(names) => names,
            _ => Vec::new(),
        };
        names.extend(env.keys().filter(|n| !names.contains(n)).cloned().collect::<Vec<_>>());
        policy.environment = Access::Allow(names);
    }
    let token = match &args.token_file {
        Some(path) => match read(path, 4096, "execbox's limit for a token file").map(String::from_utf8) {
            Ok(Ok(text)) if !text.trim().is_empty() => Some(text.trim().to_string()),
            Ok(Ok(_)) => return fail(format!("--token-file {}: the file is empty", path.display())),
            Ok(Err(_)) => return fail(format!("--token-file {}: not UTF-8", path.display())),
            Err(e) => return fail(format!("--token-file: {e}")),
        },
        None => None,
    };
    if let Some(addr) = args.http
        && !addr.ip().is_loopback()
        && token.is_none()
    {
        return fail(format!(
            "refusing to serve {addr} without --token-file: only loopback addresses may go without a bearer token"
        ));
    }
    if token.is_some() && args.http.is_none() {
        return fail("--token-file applies to --http only".into());
    }
    let mut cfg = ServeConfig {
        policy,
        env,
        max_queued: args.max_queued,
        sessions: execbox::SessionConfig {
            max_sessions: args.max_sessions,
            idle_timeout: Duration::from_secs(args.session_idle_secs),
        },
        backends: args.backends.config(args.js_idle_workers, args.python_warm_pool),
        ..ServeConfig::default()
    };
    if let Some(n) = args.max_concurrent {
        cfg.max_concurrent = n.max(1);
    }
    // Every tool passes the run gate before it takes a blocking thread: a
    // flood never holds more than this.
    let blocking = cfg.max_concurrent + 16;
    let runtime = match tokio::runtime::Builder::new_multi_thread().max_blocking_threads(blocking).enable_all().build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(format!("cannot start the async runtime: {e}")),
    };
    let code = runtime.block_on(async move {
        let server = match Server::new(cfg) {
            Ok(server) => server,
            Err(e) => return fail(e.to_string()),
        };
        let stop = tokio_util::sync::CancellationToken::new();
        let on_signal = stop.clone();
        tokio::spawn(async move {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut term), Ok(mut int), Ok(mut hup)) =
                (signal(SignalKind::terminate()), signal(SignalKind::interrupt()), signal(SignalKind::hangup()))
            else {
                return;
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
                _ = hup.recv() => {}
            }
            on_signal.cancel();
        });
        let served = match args.http {
            Some(addr) => {
                server
                    .serve_http(addr, token, stop, |bound| eprintln!("execbox serve: listening on http://{bound}/mcp"))
                    .await
            }
            None => server.serve_stdio(stop).await,
        };
        match served {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(e.to_string()),
        }
    });
    // Do not wait for tokio's blocking read of stdin: after a signal the
    // client may never close it. Everything the server started is already
    // cleaned up (see `Server::drain`).
    runtime.shutdown_timeout(Duration::from_millis(100));
    code
}

fn build_request(args: RunArgs) -> Result<ExecRequest, String> {
    let language = Language::from_id(&args.lang).ok_or_else(|| format!("unknown language {:?}", args.lang))?;
    let code = match (args.code, &args.file) {
        (Some(code), _) => code.into_bytes(),
        (None, Some(path)) => {
            let max = args.max_code_bytes.or(SandboxPolicy::strict().max_code_bytes).unwrap_or(u64::MAX);
            read(path, max, "the policy's max_code_bytes")?
        }
        (None, None) => return Err("give --code or --file".into()),
    };
    let payload = if language == Language::Wasm {
        Payload::WasmModule(code)
    } else {
        let name = args.file.as_ref().map_or("--code".to_string(), |p| p.display().to_string());
        Payload::Source(String::from_utf8(code).map_err(|_| format!("{name} is not valid UTF-8"))?)
    };
    let mut policy = SandboxPolicy::strict();
    if let Some(ms) = args.timeout_ms {
        policy = policy.timeout(Duration::from_millis(ms));
    }
    if let Some(fuel) = args.fuel {
        policy = policy.fuel(fuel);
    }
    if let Some(mb) = args.memory_mb {
        policy = policy.memory_bytes(mb.saturating_mul(1 << 20));
    }
    if let Some(bytes) = args.max_output_bytes {
        policy = policy.max_output_bytes(bytes);
    }
    if let Some(bytes) = args.max_code_bytes {
        policy = policy.max_code_bytes(bytes);
    }
    let mut env_names = Vec::new();
    let mut request = ExecRequest::new(language, payload);
    for name in args.allow_env {
        let value = std::env::var(&name).map_err(|_| format!("--allow-env {name}: not set in this environment"))?;
        env_names.push(name.clone());
        request = request.env(name, value);
    }
    for pair in args.env {
        let (name, value) = pair.split_once('=').ok_or_else(|| format!("--env {pair:?}: expected NAME=VALUE"))?;
        env_names.push(name.to_string());
        request = request.env(name, value);
    }
    if !env_names.is_empty() {
        policy = policy.environment(Access::Allow(env_names));
    }
    if !args.preopens.is_empty() {
        let mut grants = PathGrants::new();
        for spec in &args.preopens {
            grants = match spec.split(':').collect::<Vec<_>>()[..] {
                [host, guest] | [host, guest, "ro"] => grants.read_only_at(host, guest),
                [host, guest, "rw"] => grants.read_write_at(host, guest),
                _ => return Err(format!("--preopen {spec:?}: expected HOST:GUEST[:ro|rw]")),
            };
        }
        policy = policy.filesystem(Access::Allow(grants));
    }
    request = request.policy(policy);
    for arg in args.args {
        request = request.arg(arg);
    }
    if let Some(path) = &args.stdin_file {
        request = request.stdin(read(path, MAX_INPUT_FILE_BYTES, "execbox's limit for standard input")?);
    }
    if let Some(text) = args.input {
        let value: Value = serde_json::from_str(&text).map_err(|e| format!("--input is not valid JSON: {e}"))?;
        request = request.input(value);
    }
    for spec in &args.input_files {
        let (path, name) = match spec.rsplit_once(':') {
            Some((path, name)) => (Path::new(path), name.to_string()),
            None => {
                let path = Path::new(spec);
                let name = path.file_name().ok_or_else(|| format!("--input-file {spec:?}: names no file"))?;
                (path, name.to_string_lossy().into_owned())
            }
        };
        request = request
            .input_file(ExecFile::new(name, read(path, MAX_INPUT_FILE_BYTES, "execbox's limit per input file")?));
    }
    if args.output_dir.is_some() {
        request = request.collect_output_files();
    }
    if let Some(name) = args.backend {
        request = request.on_backend(name);
    }
    request = request.packages(args.packages);
    Ok(request)
}

/// Largest `--input-file` or `--stdin-file` the CLI reads, in bytes.
const MAX_INPUT_FILE_BYTES: u64 = 64 << 20;

/// Reads at most `max` bytes of a regular file, or of this process's stdin
/// for `-`. Anything but a regular file (a FIFO, socket or device, which
/// could block or never end) is refused: opened non-blocking and checked
/// on the handle, so a path swapped for a FIFO cannot hang the CLI.
fn read(path: &Path, max: u64, limit: &str) -> Result<Vec<u8>, String> {
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

/// Without the container backend no backend returns files: `--output-dir`
/// is refused before anything runs.
#[cfg(not(feature = "container"))]
struct OutputDir(std::convert::Infallible);

#[cfg(not(feature = "container"))]
impl OutputDir {
    fn open(_: &Path) -> std::io::Result<Self> {
        Err(std::io::Error::other("this execbox has no container backend, the only one that returns files"))
    }
    fn path(&self) -> &Path {
        match self.0 {}
    }
    fn save(&self, _: &[ExecFile]) -> Result<(), String> {
        match self.0 {}
    }
}

fn refuse(as_json: bool, body: Value, text: &str) -> ExitCode {
    if as_json {
        print_out(&body.to_string());
    } else {
        eprintln!("execbox: {text}");
    }
    ExitCode::from(2)
}

/// One line on stdout. A closed stdout (`| head`) is not an error worth a
/// panic: the reader has what it wanted.
fn print_out(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

fn describe(err: &ExecError) -> String {
    err.describe()
}

fn print_human(result: &ExecResult) {
    // Container programs' `output` is their stdout parsed as JSON: don't print it twice.
    let from_stdout = std::str::from_utf8(&result.stdout.bytes)
        .ok()
        .and_then(|text| serde_json::from_str::<Value>(text.trim()).ok())
        .is_some_and(|value| Some(&value) == result.output.as_ref());
    let extra = if from_stdout { None } else { result.output.as_ref() };
    write_stream(&mut std::io::stdout().lock(), "stdout", &result.stdout, extra);
    let mut err = std::io::stderr().lock();
    write_stream(&mut err, "stderr", &result.stderr, None);
    let ms = result.usage.duration.as_secs_f64() * 1e3;
    match &result.message {
        Some(message) if result.outcome != Outcome::Failed => {
            let _ = writeln!(err, "[{}] {} in {ms:.2} ms: {message}", result.backend, result.outcome.as_str());
        }
        _ => {
            let code = result.exit_code.filter(|c| *c != 0).map(|c| format!(" with exit code {c}")).unwrap_or_default();
            let _ = writeln!(err, "[{}] {}{code} in {ms:.2} ms", result.backend, result.outcome.as_str());
        }
    }
}

/// Writes a captured stream, a note if it was truncated, then `extra` as pretty JSON.
fn write_stream(out: &mut impl Write, name: &str, stream: &CapturedStream, extra: Option<&Value>) {
    let _ = out.write_all(&stream.bytes);
    if stream.truncated {
        let _ = writeln!(out, "[{name} truncated: {} of {} bytes kept]", stream.bytes.len(), stream.total_bytes);
    }
    if let Some(value) = extra {
        let _ = writeln!(out, "{}", serde_json::to_string_pretty(value).unwrap_or_default());
    }
    let _ = out.flush();
}

fn backends(exec: &Executor, as_json: bool) -> ExitCode {
    if as_json {
        print_out(&serde_json::to_value(exec.status()).unwrap_or_default().to_string());
        return ExitCode::SUCCESS;
    }
    for b in exec.backends() {
        let c = b.capabilities();
        let langs: Vec<&str> = c.languages.iter().map(|l| l.as_str()).collect();
        let status = match b.availability() {
            Ok(()) => "available".to_string(),
            Err(reason) => format!("unavailable: {reason}"),
        };
        print_out(&format!("{} ({}; {:?}, cost {:?}) — {}", b.name(), langs.join(", "), c.isolation, c.cost, status));
        let rows = [
            ("network deny", &c.network.deny),
            ("network allow-list", &c.network.allow_list),
            ("filesystem deny", &c.filesystem.deny),
            ("filesystem allow-list", &c.filesystem.allow_list),
            ("environment deny", &c.environment.deny),
            ("environment allow-list", &c.environment.allow_list),
            ("timeout", &c.timeout),
            ("memory", &c.memory),
            ("fuel", &c.fuel),
            ("stdout cap", &c.stdout_cap),
            ("stderr cap", &c.stderr_cap),
            ("processes", &c.processes),
        ];
        for (name, e) in rows {
            let level = match e {
                execbox::Enforcement::Enforced { .. } => "enforced",
                execbox::Enforcement::ByOmission { .. } => "by omission",
                execbox::Enforcement::NotEnforced { .. } => "NOT enforced",
            };
            print_out(&format!("  {name:<24} {level:<13} {}", e.detail()));
        }
    }
    ExitCode::SUCCESS
}
