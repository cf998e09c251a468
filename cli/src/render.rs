//! What the CLI prints: results for people (`print_human`), refusals
//! (one JSON object with `--json`, else a text on stderr), the backend table.

use std::io::Write;
use std::process::ExitCode;

use execbox::{CapturedStream, ConfigError, ExecError, ExecResult, Executor, Outcome};
use serde_json::Value;

/// Nothing ran: `err` as `{"error": ...}` on stdout (`--json`) or a text
/// on stderr; exit code 2.
pub(crate) fn refuse(as_json: bool, err: &ExecError) -> ExitCode {
    if as_json {
        print_out(&err.to_json().to_string());
    } else {
        eprintln!("execbox: {}", err.describe());
    }
    ExitCode::from(2)
}

/// The backends could not be built from the command line's settings.
pub(crate) fn refuse_config(as_json: bool, err: &ConfigError) -> ExitCode {
    if as_json {
        print_out(&err.to_json().to_string());
    } else {
        eprintln!("execbox: {err}");
    }
    ExitCode::from(2)
}

/// One line on stdout. A closed stdout (`| head`) is not an error worth a
/// panic: the reader has what it wanted.
pub(crate) fn print_out(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

pub(crate) fn print_human(result: &ExecResult) {
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

pub(crate) fn backends(exec: &Executor, as_json: bool) -> ExitCode {
    if as_json {
        print_out(&serde_json::to_value(exec.status()).unwrap_or_default().to_string());
        return ExitCode::SUCCESS;
    }
    for b in exec.backends() {
        let c = b.capabilities();
        let langs: Vec<&str> = c.languages.iter().map(|l| l.as_str()).collect();
        let status = match b.availability() {
            Ok(()) => "available".to_string(),
            Err(why) => format!("unavailable: {why}"),
        };
        print_out(&format!("{} ({}; {:?}, cost {:?}) — {}", b.name(), langs.join(", "), c.isolation, c.cost, status));
        if let Some(r) = b.readiness() {
            print_out(&format!("  {:<24} {} of {} ready", "pre-started", r.ready, r.target));
        }
        if let Some(left) = b.leftovers() {
            print_out(&format!("  {:<24} {} ({})", "outside this process", left.len(), left.join(", ")));
        }
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
