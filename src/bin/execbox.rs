//! The `execbox` command line: run code under a policy, list backends.
//!
//! Exit codes: 0 the program ran and its outcome is `ok`; 1 it ran and the
//! outcome is anything else; 2 nothing ran (refusal, invalid request, usage).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use execbox::{CapturedStream, ExecError, ExecRequest, ExecResult, Executor, Language, Outcome, SandboxPolicy};
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
    Run(RunArgs),
    /// List the registered backends and what they enforce.
    Backends {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// Language id: js/javascript (more with other backends).
    #[arg(long, default_value = "js")]
    lang: String,
    /// The code itself.
    #[arg(long, conflicts_with = "file", required_unless_present = "file")]
    code: Option<String>,
    /// Read the code from a file.
    #[arg(long)]
    file: Option<PathBuf>,
    /// JSON input (JS: the `input` binding).
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
    /// Run on this backend only.
    #[arg(long)]
    backend: Option<String>,
    /// Print exactly one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let exec = Executor::with_default_backends();
    match cli.command {
        Command::Run(args) => run(&exec, args),
        Command::Backends { json } => backends(&exec, json),
    }
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
    let code = match (args.code, args.file) {
        (Some(code), _) => code,
        (None, Some(path)) => {
            let bytes = std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            String::from_utf8(bytes).map_err(|_| format!("{} is not valid UTF-8", path.display()))?
        }
        (None, None) => return Err("give --code or --file".into()),
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
    let mut request = ExecRequest::source(language, code).policy(policy);
    if let Some(text) = args.input {
        let value: Value = serde_json::from_str(&text).map_err(|e| format!("--input is not valid JSON: {e}"))?;
        request = request.input(value);
    }
    if let Some(name) = args.backend {
        request = request.on_backend(name);
    }
    Ok(request)
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
            let _ = writeln!(err, "[{}] {} in {ms:.2} ms", result.backend, result.outcome.as_str());
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
