//! The `execbox` command line: run code under a policy, list backends.
//!
//! Exit codes: 0 the program ran and its outcome is `ok`; 1 it ran and the
//! outcome is anything else; 2 nothing ran (refusal, invalid request, usage).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use execbox::{
    Access, CapturedStream, ExecError, ExecRequest, ExecResult, Executor, Language, Outcome, PathGrants, Payload,
    SandboxPolicy,
};
use serde_json::{Value, json};

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
    /// Language id: js/javascript, wasm (`--code` is WAT text, `--file` a .wasm or .wat file).
    #[arg(long, default_value = "js")]
    lang: String,
    /// The code itself.
    #[arg(long, conflicts_with = "file", required_unless_present = "file")]
    code: Option<String>,
    /// Read the code from a file.
    #[arg(long)]
    file: Option<PathBuf>,
    /// JSON input (JS: the `input` binding; wasm: the JSON-ABI argument, or stdin of a WASI command).
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => match executor(args.wasm_cache_dir.clone()) {
            Ok(exec) => run(&exec, *args),
            Err(err) => refuse(args.json, err.to_json(), &describe(&err)),
        },
        Command::Backends { json } => backends(&Executor::with_default_backends(), json),
    }
}

/// The default backends; with a cache directory, the wasm backend keeps
/// compiled modules there.
fn executor(wasm_cache_dir: Option<PathBuf>) -> Result<Executor, ExecError> {
    #[cfg(feature = "wasm")]
    if let Some(dir) = wasm_cache_dir {
        use execbox::backends::{WasmGuest, WasmGuestConfig};
        let wasm = WasmGuest::with_config(WasmGuestConfig { disk_cache_dir: Some(dir), ..Default::default() })?;
        #[allow(unused_mut)]
        let mut builder = Executor::builder();
        #[cfg(feature = "js")]
        {
            builder = builder.backend(execbox::backends::BoaJs::default());
        }
        return Ok(builder.backend(wasm).build());
    }
    let _ = wasm_cache_dir;
    Ok(Executor::with_default_backends())
}

fn run(exec: &Executor, args: RunArgs) -> ExitCode {
    let as_json = args.json;
    let request = match build_request(args) {
        Ok(r) => r,
        Err(message) => {
            return refuse(
                as_json,
                json!({"error": {"kind": "invalid_request", "message": message, "violations": []}}),
                &message,
            );
        }
    };
    match exec.execute_blocking(request) {
        Ok(result) => {
            if as_json {
                println!("{}", result.to_json());
            } else {
                print_human(&result);
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
    write_stream(&mut std::io::stdout().lock(), "stdout", &result.stdout, result.output.as_ref());
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
