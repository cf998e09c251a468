//! The `execbox` command line: run code under a policy, list backends.
//!
//! Exit codes: 0 the program ran and its outcome is `ok`; 1 it ran and the
//! outcome is anything else; 2 nothing ran (refusal, invalid request, usage);
//! 128 + N when signal N (SIGTERM, SIGINT, SIGHUP) ended it, after it
//! removed the containers and staging directories it started.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Duration;

use clap::{Parser, Subcommand};
use execbox::{
    Access, CapturedStream, ExecError, ExecFile, ExecRequest, ExecResult, Executor, Language, Outcome, PathGrants,
    Payload, SandboxPolicy,
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
    /// List the registered backends and what they enforce.
    Backends {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
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
    /// Container engine CLI for python, shell and rust.
    #[arg(long, value_name = "docker|podman", env = "EXECBOX_ENGINE", default_value = "docker")]
    engine: PathBuf,
    /// Keep compiled wasm modules in this directory across runs.
    #[arg(long, value_name = "DIR", env = "EXECBOX_WASM_CACHE_DIR")]
    wasm_cache_dir: Option<PathBuf>,
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
        Command::Run(args) => match executor(&args) {
            Ok((exec, cleanup)) => {
                if let Err(e) = exit_on_signals(cleanup) {
                    eprintln!("execbox: cannot handle signals: {e}");
                    return ExitCode::from(2);
                }
                run(&exec, *args)
            }
            Err(err) => refuse(args.json, err.to_json(), &describe(&err)),
        },
        Command::Backends { json } => backends(&Executor::with_default_backends(), json),
    }
}

/// What a signal must clean up before the process exits.
type Cleanup = Box<dyn Fn() + Send>;

/// On SIGTERM, SIGINT or SIGHUP (a closed terminal): runs `cleanup` (kills
/// and removes the containers this process started, removes its staging
/// directories) and exits with 128 + the signal. A result already being
/// printed is finished first.
fn exit_on_signals(cleanup: Cleanup) -> std::io::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])?;
    std::thread::Builder::new().name("execbox-signals".into()).spawn(move || {
        if let Some(signal) = signals.forever().next() {
            let _answering = ANSWERING.lock().unwrap_or_else(|p| p.into_inner());
            cleanup();
            std::process::exit(128 + signal);
        }
    })?;
    Ok(())
}

/// The default backends, configured by the run's flags (a wasm module cache
/// directory, the container engine), and what a signal must clean up.
fn executor(args: &RunArgs) -> Result<(Executor, Cleanup), ExecError> {
    #[allow(unused_mut)]
    let mut builder = Executor::builder();
    // One run per process: one JS worker, starting now while the rest is built.
    #[cfg(feature = "js")]
    let boa = execbox::backends::BoaJs::new(execbox::backends::BoaJsConfig { idle_workers: 1, ..Default::default() });
    #[cfg(feature = "js")]
    {
        builder = builder.backend(boa.clone());
    }
    #[cfg(feature = "wasm")]
    {
        use execbox::backends::wasm::interpreters::interpreters_dir;
        use execbox::backends::{Interpreter, WasmEngine, WasmGuest, WasmGuestConfig, WasmInterpreter};
        let cfg = WasmGuestConfig { disk_cache_dir: args.wasm_cache_dir.clone(), ..Default::default() };
        // One engine (one instance pool, one ticker thread) for the three.
        let engine = WasmEngine::new(cfg)?;
        builder = builder.backend(WasmGuest::on_engine(engine.clone())?);
        // One run per process: a warm pool would only cost start-ups at exit.
        for kind in [Interpreter::QuickJs, Interpreter::Python] {
            let interpreter = WasmInterpreter::on_engine(kind, interpreters_dir(), engine.clone())?.with_warm_pool(0);
            // Load the interpreter this run will likely need before its
            // deadline starts, as a server would at start-up: a disk-cache
            // hit takes milliseconds, the first use on a machine compiles it
            // (seconds), which would otherwise count against the deadline.
            let likely = match kind {
                Interpreter::Python => args.lang == "python",
                _ => {
                    matches!(args.lang.as_str(), "js" | "javascript")
                        && (args.memory_mb.is_some() || args.backend.as_deref() == Some("quickjs-wasm"))
                }
            };
            if likely {
                // A failure shows up again, typed, when the request runs.
                let _ = interpreter.warm_up();
            }
            builder = builder.backend(interpreter);
        }
    }
    #[cfg(feature = "container")]
    let cleanup: Cleanup = {
        use execbox::backends::{Container, ContainerConfig};
        let cfg = ContainerConfig { engine: args.engine.clone(), ..Default::default() };
        let container = Container::with_config(cfg).map_err(|e| ExecError::internal(Container::NAME, e.to_string()))?;
        let container = std::sync::Arc::new(container);
        builder = builder.shared_backend(container.clone());
        // Weak: the executor owns the backend, so dropping it at the end of
        // an ordinary run waits for the reaper.
        let container = std::sync::Arc::downgrade(&container);
        Box::new(move || {
            if let Some(container) = container.upgrade() {
                container.shutdown();
            }
        })
    };
    #[cfg(not(feature = "container"))]
    let cleanup: Cleanup = Box::new(|| {});
    // A JS run waits for its worker, so that start-up (process, lockdown,
    // first context) does not count against the program's own deadline.
    #[cfg(feature = "js")]
    if Language::from_id(&args.lang) == Some(Language::JavaScript) {
        boa.wait_ready(Duration::from_secs(10));
    }
    let _ = args;
    Ok((builder.build(), cleanup))
}

fn run(exec: &Executor, args: RunArgs) -> ExitCode {
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
    let request = match build_request(args) {
        Ok(r) => r,
        Err(message) => return invalid(message),
    };
    let executed = exec.execute_blocking(request);
    // Not released: the process exits with this answer.
    std::mem::forget(ANSWERING.lock().unwrap_or_else(|p| p.into_inner()));
    match executed {
        Ok(result) => {
            if let Some(dir) = &output_dir
                && let Err(e) = dir.save(&result.output_files)
            {
                let message = format!("{e} (in {})", dir.path().display());
                return refuse(
                    as_json,
                    json!({"error": {"kind": "output_files", "message": message, "violations": []}}),
                    &message,
                );
            }
            if as_json {
                println!("{}", result.to_json());
            } else {
                print_human(&result);
                if let Some(dir) = &output_dir {
                    eprintln!("[{} output files saved to {}]", result.output_files.len(), dir.path().display());
                }
            }
            if result.outcome == Outcome::Ok { ExitCode::SUCCESS } else { ExitCode::from(1) }
        }
        Err(err) => refuse(as_json, err.to_json(), &describe(&err)),
    }
}

fn build_request(args: RunArgs) -> Result<ExecRequest, String> {
    let language = Language::from_id(&args.lang).ok_or_else(|| format!("unknown language {:?}", args.lang))?;
    let code = match (args.code, &args.file) {
        (Some(code), _) => code.into_bytes(),
        (None, Some(path)) => read(path)?,
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
        request = request.stdin(read(path)?);
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
        request = request.input_file(ExecFile::new(name, read(path)?));
    }
    if args.output_dir.is_some() {
        request = request.collect_output_files();
    }
    if let Some(name) = args.backend {
        request = request.on_backend(name);
    }
    Ok(request)
}

/// Reads a file, or this process's stdin for `-`.
fn read(path: &Path) -> Result<Vec<u8>, String> {
    if path == Path::new("-") {
        let mut bytes = Vec::new();
        std::io::stdin().read_to_end(&mut bytes).map_err(|e| format!("cannot read stdin: {e}"))?;
        return Ok(bytes);
    }
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
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
        println!("{body}");
    } else {
        eprintln!("execbox: {text}");
    }
    ExitCode::from(2)
}

fn describe(err: &ExecError) -> String {
    let mut text = err.to_string();
    if let ExecError::Refused { rejections } = err {
        text = "refused: no backend can enforce this request".into();
        for r in rejections {
            for v in &r.violations {
                text.push_str(&format!("\n  {}: {v}", r.backend));
            }
        }
    }
    text
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
    let list: Vec<Value> = exec
        .backends()
        .map(|b| {
            json!({
                "name": b.name(),
                "available": b.availability().is_ok(),
                "unavailable_reason": b.availability().err(),
                "capabilities": b.capabilities(),
            })
        })
        .collect();
    if as_json {
        println!("{}", Value::Array(list));
        return ExitCode::SUCCESS;
    }
    for b in exec.backends() {
        let c = b.capabilities();
        let langs: Vec<&str> = c.languages.iter().map(|l| l.as_str()).collect();
        let status = match b.availability() {
            Ok(()) => "available".to_string(),
            Err(reason) => format!("unavailable: {reason}"),
        };
        println!("{} ({}; {:?}, cost {:?}) — {}", b.name(), langs.join(", "), c.isolation, c.cost, status);
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
            println!("  {name:<24} {level:<13} {}", e.detail());
        }
    }
    ExitCode::SUCCESS
}
