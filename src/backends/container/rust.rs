//! The Rust pipeline: `fn run(input: serde_json::Value) -> serde_json::Value`
//! plus a harness `main`, **compiled inside a container** (a host compile would
//! let `include_str!("/etc/shadow")` read host files), cached by source hash,
//! then run in a second container with the input as JSON on stdin.
//!
//! The compile container mounts the host's rustc sysroot and the prebuilt
//! serde_json rlibs (`scripts/build-rust-deps.sh`) read-only, has no network,
//! and may write only its output directory (files capped by `--ulimit fsize`).
//! Compiler messages come back as [`Diagnostic`]s with lines relative to the
//! caller's code: the code is the first part of `main.rs`, the harness after it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::argv::{Mount, RunSpec};
use super::{Container, RunEnd, process};
use crate::error::ExecError;
use crate::limits::{BoundedBuffer, Deadline};
use crate::request::{ExecRequest, Payload};
use crate::result::{Diagnostic, ExecResult, FailureKind, Outcome, Usage};

/// Where the compiled program is mounted in the run container.
pub const PROGRAM_PATH: &str = "/opt/execbox/program";
const SYSROOT_GUEST: &str = "/opt/rust";
const DEPS_GUEST: &str = "/opt/execbox/deps";

/// Appended after the caller's code (so its line numbers stay the caller's).
const HARNESS: &str = r#"
// ---- execbox harness: JSON input on stdin, run(input) printed as JSON ----
fn main() {
    use std::io::Read as _;
    let mut text = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut text) {
        eprintln!("execbox: cannot read the input: {e}");
        std::process::exit(2);
    }
    let input: serde_json::Value = if text.trim().is_empty() {
        serde_json::Value::Null
    } else {
        match serde_json::from_str(&text) {
            Ok(value) => value,
            Err(e) => {
                eprintln!("execbox: the input is not JSON: {e}");
                std::process::exit(2);
            }
        }
    };
    let output: serde_json::Value = run(input);
    println!("{output}");
}
"#;

/// Settings of the Rust pipeline.
#[derive(Clone, Debug)]
pub struct RustConfig {
    /// The host's `rustc`; its sysroot is mounted read-only into the compile container.
    pub rustc: PathBuf,
    /// Compiled programs and prebuilt crates. `None`: `$EXECBOX_RUST_CACHE`,
    /// else `$XDG_CACHE_HOME/execbox/rust`, else `~/.cache/execbox/rust`
    /// (where `scripts/build-rust-deps.sh` puts serde_json).
    pub cache_dir: Option<PathBuf>,
    /// `-C opt-level`.
    pub opt_level: u8,
    /// Wall-clock limit of one compile (the policy's timeout bounds the run).
    pub compile_timeout: Duration,
    /// Memory cap of the compile container.
    pub compile_memory_bytes: u64,
    /// CPUs of the compile container.
    pub compile_cpus: f64,
    /// Largest file the compiler may write (the program binary).
    pub max_binary_bytes: u64,
    /// Compiled programs kept (least recently used removed).
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

impl RustConfig {
    /// The cache directory in effect.
    pub fn cache_root(&self) -> Option<PathBuf> {
        match &self.cache_dir {
            Some(dir) => Some(dir.clone()),
            None => crate::backends::conventions::cache_dir("EXECBOX_RUST_CACHE", "rust"),
        }
    }
}

/// The toolchain and crates a compile mounts.
struct Toolchain {
    sysroot: PathBuf,
    deps: PathBuf,
    /// File name of serde_json's rlib in `deps`.
    serde_json: String,
    /// Where compiled programs are kept.
    binaries: PathBuf,
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
        let mut slot = self.toolchain.lock().unwrap_or_else(|p| p.into_inner());
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
    let fingerprint = format!("execbox-rust/1 {version} {serde_json} -C opt-level={}", cfg.opt_level);
    Ok(Toolchain { sysroot, deps, serde_json, binaries, fingerprint })
}

/// The run container's command: the program and the request's arguments.
pub(super) fn command(request: &ExecRequest) -> Vec<String> {
    std::iter::once(PROGRAM_PATH.to_string()).chain(request.args.iter().cloned()).collect()
}

/// Compiles (or finds) and runs a Rust request.
pub(super) fn execute(
    backend: &Container,
    mut request: ExecRequest,
    started: Deadline,
) -> Result<ExecResult, ExecError> {
    let Payload::Source(source) = std::mem::replace(&mut request.payload, Payload::Source(String::new())) else {
        return Err(ExecError::internal(Container::NAME, "matching let a module payload through"));
    };
    let pipeline = &backend.rust;
    let toolchain = pipeline.toolchain().map_err(|reason| backend.unavailable(reason))?;
    let input = backend.input_json(&mut request)?;

    let key = cache_key(&toolchain.fingerprint, &source);
    let binary = toolchain.binaries.join(&key);
    if binary.is_file() {
        pipeline.hits.fetch_add(1, Ordering::Relaxed);
        touch(&binary);
    } else {
        pipeline.compiles.fetch_add(1, Ordering::Relaxed);
        if let Some(failed) = compile(backend, &toolchain, &source, &binary, &request, &started)? {
            return Ok(failed);
        }
    }

    // The policy's deadline bounds the run itself; compiling had its own.
    let deadline = backend.deadline(&request);
    let staging = super::staging::Staging::new(&request, input.as_deref())?;
    let mut spec = backend.spec(&request, &staging, backend.cfg.rust_image.clone(), command(&request))?;
    spec.mounts.push(Mount { host: binary, guest: PROGRAM_PATH.into(), writable: false });
    let caps = (request.policy.max_stdout_bytes, request.policy.max_stderr_bytes);
    let end = backend.run_spec(&spec, input.unwrap_or_default(), caps, deadline);
    let mut result = backend.result(end, &deadline, &staging)?;
    result.usage.duration = started.elapsed();
    Ok(result)
}

/// Compiles `source` into `binary`. `Ok(Some(result))` when the code did not
/// compile (or the compiler hit a limit): that is the run's result.
fn compile(
    backend: &Container,
    toolchain: &Toolchain,
    source: &str,
    binary: &Path,
    request: &ExecRequest,
    started: &Deadline,
) -> Result<Option<ExecResult>, ExecError> {
    let cfg = &backend.rust.cfg;
    let io = |e: std::io::Error| ExecError::internal(Container::NAME, format!("cannot stage the compile: {e}"));
    let dir = crate::backends::owner::temp_dir("rustc").map_err(io)?;
    let (src, target) = (dir.path().join("src"), dir.path().join("target"));
    for (path, mode) in [(&src, 0o755), (&src.join("target"), 0o755), (&target, 0o777)] {
        std::fs::create_dir(path).map_err(io)?;
        set_mode(path, mode).map_err(io)?;
    }
    let user_lines = source.lines().count() as u32;
    let mut program = source.to_string();
    if !program.ends_with('\n') {
        program.push('\n');
    }
    program.push_str(HARNESS);
    std::fs::write(src.join("main.rs"), program).map_err(io)?;
    set_mode(&src.join("main.rs"), 0o644).map_err(io)?;

    let serde_json = format!("serde_json={DEPS_GUEST}/{}", toolchain.serde_json);
    let opt = format!("opt-level={}", cfg.opt_level);
    let command: Vec<String> = [
        &format!("{SYSROOT_GUEST}/bin/rustc"),
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
        &format!("dependency={DEPS_GUEST}"),
        "--extern",
        &serde_json,
        "-o",
        "/work/target/program",
        "main.rs",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let n = super::RUN_COUNTER.fetch_add(1, Ordering::Relaxed);
    let spec = RunSpec {
        name: format!("execbox-rustc-{}-{n}-{:08x}", std::process::id(), super::conventions::random_u64() as u32),
        image: backend.cfg.rust_image.clone(),
        memory_bytes: cfg.compile_memory_bytes,
        cpus: cfg.compile_cpus,
        pids: 256,
        tmp_bytes: 512 << 20,
        user: backend.cfg.user.clone(),
        max_file_bytes: Some(cfg.max_binary_bytes),
        env_file: None,
        mounts: vec![
            Mount { host: src.clone(), guest: super::WORKDIR.into(), writable: false },
            Mount { host: target.clone(), guest: "/work/target".into(), writable: true },
            Mount { host: toolchain.sysroot.clone(), guest: SYSROOT_GUEST.into(), writable: false },
            Mount { host: toolchain.deps.clone(), guest: DEPS_GUEST.into(), writable: false },
        ],
        workdir: super::WORKDIR.into(),
        extra_args: backend.cfg.extra_run_args.clone(),
        command,
    };
    let deadline = Deadline::start(Some(cfg.compile_timeout));
    let finished = match backend.run_spec(&spec, Vec::new(), (Some(64 << 10), Some(16 << 20)), deadline) {
        RunEnd::Finished(f) => f,
        RunEnd::SpawnFailed(reason) => return Err(backend.unavailable(reason)),
    };
    let (diagnostics, rendered) = parse_diagnostics(&finished.stderr.bytes, user_lines);
    let mut stderr = BoundedBuffer::new(request.policy.max_stderr_bytes);
    stderr.write_str(&rendered);
    let failed = |outcome: Outcome, message: String, kind: Option<FailureKind>, diagnostics: Vec<Diagnostic>| {
        Some(ExecResult {
            backend: Container::NAME.into(),
            outcome,
            exit_code: None,
            stdout: Default::default(),
            stderr: stderr.clone().into_captured(),
            output: None,
            output_truncated: false,
            message: Some(message),
            output_files: Vec::new(),
            failure_kind: kind,
            diagnostics,
            usage: Usage { duration: started.elapsed(), ..Usage::default() },
        })
    };
    match finished.ended {
        process::Ended::Exited { exit_code: 0, .. } => {
            store(&target.join("program"), binary, cfg.cached_binaries)
                .map_err(|e| ExecError::internal(Container::NAME, format!("cannot cache the compiled program: {e}")))?;
            Ok(None)
        }
        process::Ended::Exited { oom_killed: true, .. } => Ok(failed(
            Outcome::OutOfMemory,
            format!("the compiler ran out of its {} MiB", cfg.compile_memory_bytes >> 20),
            None,
            diagnostics,
        )),
        process::Ended::Exited { .. } => {
            let errors = diagnostics.iter().filter(|d| d.level == "error").count();
            let first = diagnostics.iter().find(|d| d.level == "error");
            let message = match first {
                Some(d) => format!(
                    "compile error{}: {}{}",
                    if errors > 1 { format!(" (1 of {errors})") } else { String::new() },
                    d.message,
                    d.line.map(|l| format!(" at line {l}")).unwrap_or_default()
                ),
                None => "the compiler failed".into(),
            };
            Ok(failed(Outcome::Failed, message, Some(FailureKind::CompileError), diagnostics))
        }
        process::Ended::TimedOut => Ok(failed(
            Outcome::TimedOut,
            format!("compiling exceeded its {} s limit", cfg.compile_timeout.as_secs()),
            None,
            diagnostics,
        )),
        process::Ended::EngineError(text) => Err(backend.engine_error(text)),
    }
}

/// rustc's JSON messages → errors and warnings located in the caller's code,
/// plus their human-readable rendering (what `cargo build` would print).
fn parse_diagnostics(stderr: &[u8], user_lines: u32) -> (Vec<Diagnostic>, String) {
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

/// Moves a fresh binary into the cache atomically and trims the cache.
fn store(built: &Path, binary: &Path, keep: usize) -> std::io::Result<()> {
    let dir = binary.parent().unwrap_or(Path::new("."));
    let staged = tempfile::Builder::new().prefix(".incoming-").tempfile_in(dir)?;
    std::fs::copy(built, staged.path())?;
    set_mode(staged.path(), 0o755)?;
    staged.persist(binary).map_err(|e| e.error)?;
    let mut entries: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(dir)?
        .filter_map(|e| {
            let e = e.ok()?;
            let modified = e.metadata().ok()?.modified().ok()?;
            (!e.file_name().to_string_lossy().starts_with('.')).then(|| (modified, e.path()))
        })
        .collect();
    if entries.len() > keep {
        entries.sort();
        for (_, path) in &entries[..entries.len() - keep] {
            drop(std::fs::remove_file(path));
        }
    }
    Ok(())
}

/// Marks a cached binary as recently used.
fn touch(path: &Path) {
    if let Ok(file) = std::fs::File::options().append(true).open(path) {
        drop(file.set_modified(std::time::SystemTime::now()));
    }
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
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
}
