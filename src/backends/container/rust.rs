//! The Rust pipeline: `fn run(input: serde_json::Value) -> serde_json::Value`
//! plus a harness `main`, **compiled inside a container** (a host compile would
//! let `include_str!("/etc/shadow")` read host files), cached by source hash,
//! then run in a second container with the input as JSON on stdin.
//!
//! The compile container mounts the host's rustc sysroot and the prebuilt
//! serde_json rlibs (`scripts/build-rust-deps.sh`) read-only, has no network,
//! and may write only its output directory (files capped by `RLIMIT_FSIZE`).
//! Compiler messages come back as [`Diagnostic`]s with lines relative to the
//! caller's code: the code is the first part of `main.rs`, the harness after it.
//!
//! One deadline covers the request: the compile gets what is left of it (at
//! most [`RustConfig::compile_timeout`]), the run what is left after that.
//!
//! Host-side files (the compile's staging, the binary cache) are handled
//! through cap-std handles, never through a link (see `hostfs.rs`).

use parking_lot::Mutex;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use cap_std::fs::Dir;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::argv::{Mount, RunSpec};
use super::config::RustConfig;
use super::process::{self, KILL_GRACE};
use super::runner::{Caps, NAME, RunEnd, Runner, container_name};
use super::seccomp;
use super::staging::{Staging, WORKDIR};
use crate::admission::Admitted;
use crate::error::ExecError;
use crate::hostfs;
use crate::limits::deadline::Deadline;
use crate::limits::output::BoundedBuffer;
use crate::request::ExecRequest;
use crate::result::{Diagnostic, ExecResult, FailureKind, Outcome};

/// Where the compiled program is mounted in the run container.
const PROGRAM_PATH: &str = "/opt/execbox/program";
const SYSROOT_GUEST: &str = "/opt/rust";
const DEPS_GUEST: &str = "/opt/execbox/deps";

/// Appended after the caller's code (so its line numbers stay the caller's).
///
/// `Value` and `tools` are in scope without a `use` (the contract of
/// adk-code's `RustExecutor`: `fn run(input: Value) -> Value`): through a
/// glob import of a private module that re-exports only them. A glob import
/// is shadowed, without error, by the caller's own `use serde_json::Value;`
/// (or a `Value` or `tools` of their own), and two globs naming the same
/// item agree.
///
/// `tools` is Code Mode for Rust (see `tool_socket.rs` for the wire):
/// `tools::call("ns.tool", json!({...})) -> Result<Value, tools::ToolError>`,
/// `tools::list()`, `tools::describe("ns.tool")`; a `ToolError` has `tool`,
/// `kind` and `message`. Calls go, one at a time, over one connection to
/// the socket named by `$EXECBOX_TOOLS`; without it (a run that grants no
/// tools) every call fails `not_granted`.
const HARNESS: &str = concat!("\n", include_str!("rust/harness.rs"));

/// `main.rs` of `source`: the caller's code, then the harness (so the
/// code's line numbers stay the caller's); and how many lines are the
/// caller's. Both backends compile this file.
pub(crate) fn main_rs(source: &str) -> (String, u32) {
    let user_lines = source.lines().count() as u32;
    let mut program = source.to_string();
    if !program.ends_with('\n') {
        program.push('\n');
    }
    program.push_str(HARNESS);
    (program, user_lines)
}

/// rustc's arguments after the binary's path, run in the directory of
/// `main.rs`: the program against `deps` (where `serde_json` is that
/// crate's rlib), written to `output`, messages as JSON on stderr.
pub(crate) fn rustc_args(opt_level: u8, deps: &str, serde_json: &str, output: &str) -> Vec<String> {
    let opt = format!("opt-level={opt_level}");
    let serde_json = format!("serde_json={serde_json}");
    let dependency = format!("dependency={deps}");
    [
        "--edition=2021",
        "--crate-type=bin",
        "--crate-name=program",
        "-C",
        &opt,
        "-C",
        "debuginfo=0",
        "-C",
        "strip=debuginfo",
        "--error-format=json",
        "-L",
        &dependency,
        "--extern",
        &serde_json,
        "-o",
        output,
        "main.rs",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The warnings of a compile that succeeded, as the caller sees them:
/// those in the caller's code (warnings about the harness, e.g. its
/// prelude unused when the code imports `Value` itself, are not theirs).
pub(crate) fn caller_warnings(diagnostics: Vec<Diagnostic>) -> Vec<Diagnostic> {
    diagnostics.into_iter().filter(|d| d.level == "warning" && d.line.is_some()).collect()
}

/// The message of a compile that failed: its first error, where it is,
/// and how many there were.
pub(crate) fn compile_error_message(diagnostics: &[Diagnostic]) -> String {
    let errors = diagnostics.iter().filter(|d| d.level == "error").count();
    match diagnostics.iter().find(|d| d.level == "error") {
        Some(d) => format!(
            "compile error{}: {}{}",
            if errors > 1 { format!(" (1 of {errors})") } else { String::new() },
            d.message,
            d.line.map(|l| format!(" at line {l}")).unwrap_or_default()
        ),
        None => "the compiler failed".into(),
    }
}

/// A run's `output` from the harness's last line of stdout: the value
/// `run` returned, taken out of stdout. A cut stdout is a cut value, so a
/// failed run (never an `ok` one with no output); a run that did not end
/// `ok` has none.
pub(crate) fn take_output(result: &mut ExecResult, max_stdout_bytes: Option<u64>) {
    if result.outcome == Outcome::Ok && result.stdout.truncated {
        let max = max_stdout_bytes.unwrap_or(0);
        result.outcome = Outcome::Failed;
        result.output = None;
        result.output_truncated = true;
        result.message = Some(format!("the returned value is over the output cap of {max} bytes (max_stdout_bytes)"));
    } else if result.outcome == Outcome::Ok {
        result.output = take_returned_value(&mut result.stdout);
    } else {
        result.output = None;
    }
}

/// The toolchain and crates a compile mounts.
struct Toolchain {
    sysroot: PathBuf,
    deps: PathBuf,
    /// File name of serde_json's rlib in `deps`.
    serde_json: String,
    /// Where compiled programs are kept: the path (for mounts) and a handle
    /// (for every file operation).
    binaries: PathBuf,
    binaries_dir: Dir,
    /// Identifies rustc, the crates and the flags: part of every cache key.
    fingerprint: String,
}

/// Counters of the pipeline: a repeated program is a hit, not a compile.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RustCacheStats {
    /// Compiles started.
    pub compiles: u64,
    /// Runs that reused a compiled program.
    pub hits: u64,
}

pub(super) struct Pipeline {
    cfg: RustConfig,
    /// Found once; a failure is not cached, so running the setup script fixes it.
    toolchain: Mutex<Option<Arc<Toolchain>>>,
    compiles: AtomicU64,
    hits: AtomicU64,
}

impl Pipeline {
    pub fn new(cfg: RustConfig) -> Self {
        Self { cfg, toolchain: Mutex::new(None), compiles: AtomicU64::new(0), hits: AtomicU64::new(0) }
    }

    pub fn stats(&self) -> RustCacheStats {
        RustCacheStats { compiles: self.compiles.load(Ordering::Relaxed), hits: self.hits.load(Ordering::Relaxed) }
    }

    fn toolchain(&self) -> Result<Arc<Toolchain>, String> {
        let mut slot = self.toolchain.lock();
        if let Some(found) = slot.as_ref() {
            return Ok(Arc::clone(found));
        }
        let found = Arc::new(find_toolchain(&self.cfg)?);
        *slot = Some(Arc::clone(&found));
        Ok(found)
    }
}

fn find_toolchain(cfg: &RustConfig) -> Result<Toolchain, String> {
    let rustc = |args: &[&str]| -> Result<String, String> {
        let out = std::process::Command::new(&cfg.rustc).args(args).output().map_err(|e| {
            format!("cannot run {}: {e} — the Rust pipeline mounts the host's toolchain", cfg.rustc.display())
        })?;
        if !out.status.success() {
            return Err(format!("{} {} failed", cfg.rustc.display(), args.join(" ")));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let sysroot = PathBuf::from(rustc(&["--print", "sysroot"])?);
    let sysroot = sysroot.canonicalize().map_err(|e| format!("rustc's sysroot {}: {e}", sysroot.display()))?;
    let version = rustc(&["-vV"])?;
    let commit = version
        .lines()
        .find_map(|l| l.strip_prefix("commit-hash: "))
        .map(|h| h.chars().take(12).collect::<String>())
        .ok_or("rustc -vV printed no commit hash")?;
    let root = cfg.cache_root().ok_or("no cache directory: set EXECBOX_RUST_CACHE or HOME")?;
    let deps = root.join(format!("deps-{commit}"));
    let fix = "— build them with scripts/build-rust-deps.sh";
    if !deps.join("READY").is_file() {
        return Err(format!("no prebuilt crates for rustc {commit} in {} {fix}", deps.display()));
    }
    let serde_json = std::fs::read_dir(&deps)
        .map_err(|e| format!("{}: {e} {fix}", deps.display()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .find(|name| name.starts_with("libserde_json-") && name.ends_with(".rlib"))
        .ok_or_else(|| format!("no serde_json rlib in {} {fix}", deps.display()))?;
    let binaries = root.join(format!("bin-{commit}"));
    std::fs::create_dir_all(&binaries).map_err(|e| format!("cannot create {}: {e}", binaries.display()))?;
    let binaries_dir =
        hostfs::open_ambient(&binaries).map_err(|e| format!("cannot open {}: {e}", binaries.display()))?;
    let fingerprint = format!("execbox-rust/2 {version} {serde_json} -C opt-level={}", cfg.opt_level);
    Ok(Toolchain { sysroot, deps, serde_json, binaries, binaries_dir, fingerprint })
}

/// The run container's command: the program and the request's arguments.
pub(super) fn command(request: &ExecRequest) -> Vec<String> {
    std::iter::once(PROGRAM_PATH.to_string()).chain(request.args.iter().cloned()).collect()
}

/// Compiles (or finds, in `pipeline`'s cache) and runs a Rust request with
/// `runner`, both within the request's deadline.
pub(super) fn execute(runner: &Runner, pipeline: &Pipeline, mut call: Admitted) -> Result<ExecResult, ExecError> {
    let deadline = call.deadline();
    let source = call.take_source(NAME)?;
    let toolchain = pipeline.toolchain().map_err(|reason| runner.unavailable(reason))?;
    let input = call.take_input_json(runner.config().defaults.max_input_nesting, NAME)?;
    let bridge = call.tools().cloned();
    let request = call.into_request();

    let key = cache_key(&toolchain.fingerprint, &source);
    let cached = toolchain.binaries_dir.symlink_metadata(&key).is_ok_and(|meta| meta.is_file());
    let warnings = if cached {
        pipeline.hits.fetch_add(1, Ordering::Relaxed);
        touch(&toolchain.binaries_dir, &key);
        cached_warnings(&toolchain.binaries_dir, &key)
    } else {
        pipeline.compiles.fetch_add(1, Ordering::Relaxed);
        match compile(runner, &pipeline.cfg, &toolchain, &source, &key, &request, &deadline)? {
            Compiled::Program { warnings } => warnings,
            Compiled::Failed(failed) => return Ok(*failed),
        }
    };

    let staging = Staging::new(&request, input.as_deref())?;
    let limit = deadline.remaining().unwrap_or(Duration::MAX);
    let image = runner.config().rust_image.clone();
    let mut spec = runner.spec(&request, &staging, image, command(&request), limit)?;
    spec.mounts.push(Mount { host: toolchain.binaries.join(&key), guest: PROGRAM_PATH.into(), writable: false });
    // The run (never the compile) gets the tool socket when tools are granted.
    let socket = runner.tool_socket(bridge.as_ref())?;
    if let Some(socket) = &socket {
        socket.attach(&mut spec, false)?;
    }
    let end = runner.run_spec(&spec, input.unwrap_or_default(), Caps::of(&request), deadline);
    drop(socket);
    let mut result = runner.result(end, &deadline, staging)?;
    result.diagnostics = warnings;
    take_output(&mut result, request.policy.max_stdout_bytes);
    Ok(result)
}

/// Takes the harness's line (the returned value, and the newline printed
/// before it) out of `stdout`: what is left is what the program printed.
/// `None` when the last line is not JSON (the program exited without
/// returning, e.g. `std::process::exit`).
fn take_returned_value(stdout: &mut crate::result::CapturedStream) -> Option<Value> {
    let bytes = &stdout.bytes;
    let body = bytes.strip_suffix(b"\n")?;
    let start = body.iter().rposition(|&b| b == b'\n')?;
    // serde_json stops at 128 levels of nesting: a hostile line cannot
    // exhaust the stack here.
    let value: Value = serde_json::from_slice(&body[start + 1..]).ok()?;
    let kept = start; // the harness's own newline goes too
    stdout.total_bytes = stdout.total_bytes.saturating_sub((bytes.len() - kept) as u64);
    stdout.bytes.truncate(kept);
    Some(value)
}

/// What a compile gave: a program in the cache (with the compiler's
/// warnings), or the run's result when there is none.
enum Compiled {
    Program { warnings: Vec<Diagnostic> },
    Failed(Box<ExecResult>),
}

/// Where a cached program's warnings are kept, beside the programs.
const WARNINGS_DIR: &str = "warnings";

/// The warnings the compile of the cached program `key` gave (none when
/// they were not kept).
fn cached_warnings(cache: &Dir, key: &str) -> Vec<Diagnostic> {
    let Ok(dir) = hostfs::open_dir(cache, OsStr::new(WARNINGS_DIR)) else { return Vec::new() };
    hostfs::read_regular(&dir, OsStr::new(key), 1 << 20)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

/// Compiles `source` into the cache entry `key`, within what is left of the
/// request's `deadline` (at most `compile_timeout`). [`Compiled::Failed`]
/// when the code did not compile (or the compiler hit a limit): that is
/// the run's result.
fn compile(
    runner: &Runner,
    cfg: &RustConfig,
    toolchain: &Toolchain,
    source: &str,
    key: &str,
    request: &ExecRequest,
    deadline: &Deadline,
) -> Result<Compiled, ExecError> {
    let io = |e: std::io::Error| ExecError::internal_caused(NAME, "cannot stage the compile", e);
    let dir = crate::owner::temp_dir("rustc").map_err(io)?;
    let handle = hostfs::open_ambient(dir.path()).map_err(io)?;
    let src_dir = hostfs::create_dirs(&handle, Path::new("src"), Some(0o755)).map_err(io)?;
    hostfs::create_dirs(&src_dir, Path::new("target"), Some(0o755)).map_err(io)?;
    // Writable by the compiler's unprivileged user.
    let target_dir = hostfs::create_dirs(&handle, Path::new("target"), Some(0o777)).map_err(io)?;
    let (program, user_lines) = main_rs(source);
    hostfs::write_new(&src_dir, OsStr::new("main.rs"), program.as_bytes(), 0o644).map_err(io)?;

    // The request's deadline bounds the compile; compile_timeout caps it.
    let request_left = deadline.remaining().unwrap_or(cfg.compile_timeout);
    let bound_by_request = request_left <= cfg.compile_timeout;
    let compile_deadline = Deadline::start(Some(request_left.min(cfg.compile_timeout)));

    let serde_json = format!("{DEPS_GUEST}/{}", toolchain.serde_json);
    let command: Vec<String> = std::iter::once(format!("{SYSROOT_GUEST}/bin/rustc"))
        .chain(rustc_args(cfg.opt_level, DEPS_GUEST, &serde_json, "/work/target/program"))
        .collect();
    let spec = RunSpec {
        name: container_name("execbox-rustc-"),
        image: runner.config().rust_image.clone(),
        memory_bytes: cfg.compile_memory_bytes,
        cpus: cfg.compile_cpus,
        pids: 256,
        tmp_bytes: 512 << 20,
        user: runner.config().user.clone(),
        seccomp_profile: seccomp::profile_path().map_err(|e| runner.unavailable(e.to_string()))?,
        max_file_bytes: Some(cfg.max_binary_bytes),
        env_file: None,
        env: Vec::new(),
        output_dir: None,
        mounts: vec![
            Mount { host: dir.path().join("src"), guest: WORKDIR.into(), writable: false },
            Mount { host: dir.path().join("target"), guest: "/work/target".into(), writable: true },
            Mount { host: toolchain.sysroot.clone(), guest: SYSROOT_GUEST.into(), writable: false },
            Mount { host: toolchain.deps.clone(), guest: DEPS_GUEST.into(), writable: false },
        ],
        workdir: WORKDIR.into(),
        extra_args: runner.config().extra_run_args.clone(),
        command,
        stop_after: compile_deadline.remaining().unwrap_or(Duration::MAX).saturating_add(KILL_GRACE),
        end_nonce: None,
        role: "compile",
    };
    let caps = Caps { stdout: Some(64 << 10), stderr: Some(16 << 20), tap: None };
    let end = runner.run_spec(&spec, Vec::new(), caps, compile_deadline);
    let outcome =
        compiled(runner, cfg, end, &target_dir, toolchain, key, request, deadline, user_lines, bound_by_request);
    runner.reaper().discard(dir);
    outcome
}

/// The result of a compile that did not produce a program, or the
/// program's warnings once it is in the cache.
#[allow(clippy::too_many_arguments)]
fn compiled(
    runner: &Runner,
    cfg: &RustConfig,
    end: RunEnd,
    target_dir: &Dir,
    toolchain: &Toolchain,
    key: &str,
    request: &ExecRequest,
    deadline: &Deadline,
    user_lines: u32,
    bound_by_request: bool,
) -> Result<Compiled, ExecError> {
    let finished = match end {
        RunEnd::Finished(f) => f,
        RunEnd::SpawnFailed(reason) => return Err(runner.unavailable(reason)),
    };
    let (diagnostics, rendered) = parse_diagnostics(&finished.stderr.bytes, user_lines);
    let failed = |outcome: Outcome, message: String, kind: Option<FailureKind>, diagnostics: Vec<Diagnostic>| {
        let mut result = compile_failed(NAME, outcome, message, diagnostics, &rendered, request);
        result.failure_kind = kind;
        result.usage.duration = deadline.elapsed();
        Compiled::Failed(Box::new(result))
    };
    match finished.ended {
        process::Ended::Exited { exit_code: 0, .. } => {
            let warnings = caller_warnings(diagnostics);
            store(target_dir, toolchain, key, cfg, &warnings)
                .map_err(|e| ExecError::internal_caused(NAME, "cannot cache the compiled program", e))?;
            Ok(Compiled::Program { warnings })
        }
        process::Ended::Exited { oom_killed: true, .. } => Ok(failed(
            Outcome::OutOfMemory,
            format!("the compiler ran out of its {} MiB", cfg.compile_memory_bytes >> 20),
            None,
            diagnostics,
        )),
        process::Ended::Exited { .. } => {
            let message = compile_error_message(&diagnostics);
            Ok(failed(Outcome::Failed, message, Some(FailureKind::CompileError), diagnostics))
        }
        process::Ended::TimedOut => {
            let message = if bound_by_request {
                format!("{} while compiling", deadline.exceeded_message())
            } else {
                format!(
                    "compiling exceeded its {} s limit (RustConfig::compile_timeout)",
                    cfg.compile_timeout.as_secs()
                )
            };
            Ok(failed(Outcome::TimedOut, message, None, diagnostics))
        }
        process::Ended::EngineError(text) => Err(runner.engine_error(text)),
    }
}

/// The result of a compile that gave no program: the compiler's messages
/// (`rendered`, as `cargo build` prints them) as stderr within the
/// request's cap, and located in `diagnostics`.
pub(crate) fn compile_failed(
    backend: &str,
    outcome: Outcome,
    message: String,
    diagnostics: Vec<Diagnostic>,
    rendered: &str,
    request: &ExecRequest,
) -> ExecResult {
    let mut stderr = BoundedBuffer::new(request.policy.max_stderr_bytes);
    stderr.write_str(rendered);
    let mut result = ExecResult::new(backend, outcome);
    result.stderr = stderr.into_captured();
    result.message = Some(message);
    result.diagnostics = diagnostics;
    result
}

/// rustc's JSON messages → errors and warnings located in the caller's code,
/// plus their human-readable rendering (what `cargo build` would print).
pub(crate) fn parse_diagnostics(stderr: &[u8], user_lines: u32) -> (Vec<Diagnostic>, String) {
    let mut diagnostics = Vec::new();
    let mut rendered = String::new();
    for line in String::from_utf8_lossy(stderr).lines() {
        let Ok(message) = serde_json::from_str::<Value>(line) else {
            rendered.push_str(line);
            rendered.push('\n');
            continue;
        };
        if let Some(text) = message["rendered"].as_str() {
            rendered.push_str(text);
        }
        let level = message["level"].as_str().unwrap_or_default();
        let text = message["message"].as_str().unwrap_or_default();
        if !matches!(level, "error" | "warning") || text.starts_with("aborting due to") {
            continue;
        }
        let primary = message["spans"].as_array().and_then(|spans| spans.iter().find(|s| s["is_primary"] == true));
        let position = primary
            .and_then(|s| Some((s["line_start"].as_u64()? as u32, s["column_start"].as_u64()? as u32)))
            .filter(|(line, _)| *line <= user_lines);
        diagnostics.push(Diagnostic {
            level: level.into(),
            code: message["code"]["code"].as_str().map(str::to_string),
            message: text.lines().next().unwrap_or_default().to_string(),
            line: position.map(|p| p.0),
            column: position.map(|p| p.1),
        });
    }
    (diagnostics, rendered)
}

fn cache_key(fingerprint: &str, source: &str) -> String {
    let mut hash = Sha256::new();
    for part in [fingerprint, HARNESS, source] {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part.as_bytes());
    }
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// Copies the compiled program (read without following a link the
/// compiler's container could have planted) into the cache entry `key`
/// (a fresh file renamed into place), keeps its compile's warnings beside
/// it (a later hit reports them too), then trims the cache.
fn store(
    target_dir: &Dir,
    toolchain: &Toolchain,
    key: &str,
    cfg: &RustConfig,
    warnings: &[Diagnostic],
) -> std::io::Result<()> {
    let cache = &toolchain.binaries_dir;
    if !warnings.is_empty() {
        let dir = hostfs::create_dirs(cache, Path::new(WARNINGS_DIR), Some(0o700))?;
        let text = serde_json::to_vec(warnings).map_err(std::io::Error::other)?;
        hostfs::replace(&dir, OsStr::new(key), &text)?;
    }
    hostfs::copy_regular(target_dir, OsStr::new("program"), cache, OsStr::new(key), 0o755, cfg.max_binary_bytes)?;
    trim(cache, cfg.cached_binaries);
    Ok(())
}

/// Keeps the `keep` most recently used programs, and removes temp files of
/// copies that never finished (a host killed mid-copy) once they are old.
fn trim(cache: &Dir, keep: usize) {
    let Ok(entries) = cache.entries() else { return };
    let stale_before = SystemTime::now() - Duration::from_secs(600);
    let mut programs: Vec<(SystemTime, std::ffi::OsString)> = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Ok(meta) = cache.symlink_metadata(&name) else { continue };
        let modified = meta.modified().map(|t| t.into_std()).unwrap_or(SystemTime::UNIX_EPOCH);
        if name.to_string_lossy().starts_with('.') {
            if meta.is_file() && modified < stale_before {
                drop(cache.remove_file(&name));
            }
        } else if meta.is_file() {
            programs.push((modified, name));
        }
    }
    if programs.len() > keep {
        programs.sort();
        let warnings = hostfs::open_dir(cache, OsStr::new(WARNINGS_DIR)).ok();
        for (_, name) in &programs[..programs.len() - keep] {
            drop(cache.remove_file(name));
            if let Some(warnings) = &warnings {
                drop(warnings.remove_file(name));
            }
        }
    }
}

/// Marks a cached program as recently used (never through a link).
fn touch(cache: &Dir, key: &str) {
    use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
    let mut options = cap_std::fs::OpenOptions::new();
    options.append(true).follow(FollowSymlinks::No);
    if let Ok(file) = cache.open_with(key, &options) {
        drop(file.into_std().set_modified(SystemTime::now()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diagnostics_are_located_in_user_code_or_not_at_all() {
        let stderr = br#"{"$message_type":"diagnostic","message":"mismatched types","code":{"code":"E0308"},"level":"error","spans":[{"is_primary":true,"line_start":3,"column_start":5}],"rendered":"error[E0308]: mismatched types\n"}
{"$message_type":"diagnostic","message":"cannot find function `run`","code":{"code":"E0425"},"level":"error","spans":[{"is_primary":true,"line_start":40,"column_start":9}],"rendered":"error[E0425]\n"}
{"$message_type":"diagnostic","message":"aborting due to 2 previous errors","code":null,"level":"error","spans":[],"rendered":"error: aborting\n"}
"#;
        let (diags, rendered) = parse_diagnostics(stderr, 10);
        assert_eq!(diags.len(), 2);
        assert_eq!((diags[0].line, diags[0].column, diags[0].code.as_deref()), (Some(3), Some(5), Some("E0308")));
        assert_eq!(diags[1].line, None, "a harness line is not reported as the caller's");
        assert!(rendered.starts_with("error[E0308]"));
    }

    #[test]
    fn the_returned_value_is_the_harness_line_and_the_rest_stays_stdout() {
        let take = |printed: &str| {
            let mut stdout = crate::result::CapturedStream {
                bytes: printed.as_bytes().to_vec(),
                total_bytes: printed.len() as u64,
                truncated: false,
            };
            let value = take_returned_value(&mut stdout);
            (value, String::from_utf8(stdout.bytes).unwrap(), stdout.total_bytes)
        };
        assert_eq!(take("\n[1,2]\n"), (Some(serde_json::json!([1, 2])), String::new(), 0));
        assert_eq!(take("hello\n{\"a\":1}\n\n7\n"), (Some(serde_json::json!(7)), "hello\n{\"a\":1}\n".into(), 14));
        assert_eq!(take("no newline\n\"s\"\n"), (Some(serde_json::json!("s")), "no newline".into(), 10));
        assert_eq!(take("exited early\n").0, None, "a last line that is not JSON is no value");
        assert_eq!(take("").0, None);
    }
}
