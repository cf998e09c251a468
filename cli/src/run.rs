//! `execbox run`: one request, built from the command line, run once.

use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use execbox::{
    Access, ExecError, ExecFile, ExecRequest, Executor, InvalidRequest, Language, Outcome, PathGrants, Payload,
    SandboxPolicy,
};
use parking_lot::Mutex;
use serde_json::Value;

#[cfg(feature = "container")]
use execbox::backends::container::OutputDir;

use super::render::{self, print_out};
use super::workspace_dir::DirWorkspace;
use super::{MAX_INPUT_FILE_BYTES, RunArgs, read};

/// Held from the moment a result is in until the process exits, so a signal
/// arriving then waits for the answer instead of cutting it off, and an
/// answer never follows a signal's cleanup.
static ANSWERING: Mutex<()> = Mutex::new(());

/// On SIGTERM, SIGINT or SIGHUP (a closed terminal): shuts the executor's
/// backends down (kills and removes the containers this process started,
/// removes its staging directories), ends the run's workspace (unmounted,
/// its directory removed) and exits with 128 + the signal. A result
/// already being printed is finished first. The handler holds the executor
/// and the workspace weakly, so an ordinary exit still waits for their own
/// cleanup.
fn exit_on_signals(exec: execbox::WeakExecutor, workspace: Option<execbox::WeakWorkspace>) -> std::io::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])?;
    std::thread::Builder::new().name("execbox-signals".into()).spawn(move || {
        if let Some(signal) = signals.forever().next() {
            let _answering = ANSWERING.lock();
            if let Some(exec) = exec.upgrade() {
                exec.shutdown();
            }
            if let Some(workspace) = workspace.as_ref().and_then(execbox::WeakWorkspace::upgrade) {
                workspace.end_now();
            }
            std::process::exit(128 + signal);
        }
    })?;
    Ok(())
}

/// Runs one request and prints its result (or why nothing ran).
pub(crate) fn run(mut args: RunArgs) -> ExitCode {
    let as_json = args.json;
    let invalid = |name: &str, reason: String| {
        render::refuse(as_json, &ExecError::from(InvalidRequest::Argument { name: name.into(), reason }))
    };
    // Opened before the run: the program cannot redirect the save by
    // swapping the path for a link (see `OutputDir`).
    let output_dir = match args.output_dir.as_deref().map(OutputDir::open).transpose() {
        Ok(dir) => dir,
        Err(e) => {
            let path = args.output_dir.as_deref().unwrap_or(Path::new("")).display();
            return invalid("--output-dir", format!("{path}: {e}"));
        }
    };
    // Copied in before anything else starts; mounted until this returns.
    let workspace = match args.workspace.as_deref() {
        Some(dir) => {
            let (globs, root) = (std::mem::take(&mut args.collect), args.workspace_root.take());
            match DirWorkspace::open(dir, globs, args.workspace_quota_mb, root) {
                Ok((workspace, not_copied)) => {
                    for note in not_copied {
                        eprintln!("execbox: not copied into the workspace: {note}");
                    }
                    Some(workspace)
                }
                Err(reason) => return invalid("--workspace", format!("{}: {reason}", dir.display())),
            }
        }
        None => None,
    };
    let staged_input = args.input.is_some();
    // One run per process: one JS worker (starting now, while the rest is
    // built), no warm Python pool (it would only cost start-ups at exit).
    // Upstream servers connect before the run (within 30 s each) and stay
    // up until this process exits; a server that fails is an error here.
    #[cfg(feature = "upstream")]
    let (tools, _upstreams) = match connect_upstreams(&args.tools) {
        Ok(tools) => tools,
        Err(reason) => return invalid("--upstreams", reason),
    };
    #[cfg(not(feature = "upstream"))]
    let tools = execbox::tools::ToolRegistry::default();
    #[cfg_attr(not(feature = "artifacts"), allow(unused_mut))]
    let mut builder = match Executor::builder().default_backends(&args.backends.config(1, 0)) {
        Ok(builder) => builder,
        Err(err) => return render::refuse_config(as_json, &err),
    };
    // Artifacts: the store's tools join the registry (granted like any
    // tool); its runs keep them under `key:<--artifact-key>`.
    #[cfg(feature = "artifacts")]
    let tools = match (args.artifacts.config(), &args.artifact_key) {
        (Some(config), Some(_)) => match execbox::artifacts::ArtifactStore::new(config) {
            Ok(store) => {
                let merged = execbox::tools::ToolRegistry::builder().tools(&tools).tools(&store.tools()).build();
                builder = builder.artifacts(store);
                match merged {
                    Ok(tools) => tools,
                    Err(e) => return invalid("--artifacts", e.to_string()),
                }
            }
            Err(err) => return render::refuse_config(as_json, &err),
        },
        (Some(_), None) => {
            return invalid(
                "--artifact-key",
                "--artifacts needs a key: runs given the same key share their artifacts".into(),
            );
        }
        _ => tools,
    };
    let exec = builder.tools(tools).build();
    if let Err(e) = exit_on_signals(exec.downgrade(), workspace.as_ref().map(|w| w.workspace().downgrade())) {
        eprintln!("execbox: cannot handle signals: {e}");
        return ExitCode::from(2);
    }
    let mut request = match build_request(args) {
        Ok(r) => r,
        Err((name, reason)) => return invalid(&name, reason),
    };
    if let Some(workspace) = &workspace {
        request = request.workspace(workspace.workspace());
    }
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
            // The run's own `input.json` is not the directory's.
            let skip: &[&str] = if staged_input { &["input.json"] } else { &[] };
            let written_back = workspace.as_ref().map(|w| match w.write_back(skip) {
                Ok(back) => {
                    for note in back.left_out {
                        eprintln!("execbox: not written back: {note}");
                    }
                    let to = w.path().display();
                    if back.failed.is_empty() {
                        Ok(format!("[{} files written back to {to}, {} unchanged]", back.written, back.unchanged))
                    } else {
                        for why in &back.failed {
                            eprintln!("execbox: not written back: {why}");
                        }
                        Err(format!("execbox: {} files written back to {to}, {} not", back.written, back.failed.len()))
                    }
                }
                Err(e) => Err(format!("execbox: the workspace was not written back: {e} (to {})", w.path().display())),
            });
            if as_json {
                print_out(&result.to_json().to_string());
            } else {
                render::print_human(&result);
            }
            for copied in [saved, written_back] {
                match copied {
                    Some(Err(e)) => {
                        eprintln!("{e}");
                        return ExitCode::from(1);
                    }
                    Some(Ok(note)) if !as_json => eprintln!("{note}"),
                    _ => {}
                }
            }
            if result.outcome == Outcome::Ok { ExitCode::SUCCESS } else { ExitCode::from(1) }
        }
        Err(err) => render::refuse(as_json, &err),
    }
}

/// The upstream servers `--upstreams` names, connected, and their tools.
#[cfg(feature = "upstream")]
fn connect_upstreams(
    flags: &crate::ToolFlags,
) -> Result<(execbox::tools::ToolRegistry, Option<execbox::tools::Upstreams>), String> {
    let Some(config) = flags.upstreams()? else { return Ok((Default::default(), None)) };
    let (upstreams, errors) = execbox::tools::Upstreams::connect(&config);
    if let Some(error) = errors.first() {
        return Err(execbox::with_causes(error));
    }
    let tools = upstreams.registry().map_err(|e| e.to_string())?;
    Ok((tools, Some(upstreams)))
}

/// The request the command line describes; `Err((argument, reason))`.
fn build_request(args: RunArgs) -> Result<ExecRequest, (String, String)> {
    let arg = |name: &str| {
        let name = name.to_string();
        move |reason: String| (name, reason)
    };
    let language = Language::from_id(&args.lang)
        .ok_or_else(|| ("--lang".to_string(), format!("unknown language {:?}", args.lang)))?;
    let code = match (args.code, &args.file) {
        (Some(code), _) => code.into_bytes(),
        (None, Some(path)) => {
            let max = args.max_code_bytes.or(SandboxPolicy::strict().max_code_bytes).unwrap_or(u64::MAX);
            read(path, max, "the policy's max_code_bytes").map_err(arg("--file"))?
        }
        (None, None) => return Err(("--code".into(), "give --code or --file".into())),
    };
    let payload = if language == Language::Wasm {
        Payload::WasmModule(code)
    } else {
        let name = args.file.as_ref().map_or("--code".to_string(), |p| p.display().to_string());
        let flag = if args.file.is_some() { "--file" } else { "--code" };
        Payload::Source(String::from_utf8(code).map_err(|_| (flag.to_string(), format!("{name} is not valid UTF-8")))?)
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
        let value = std::env::var(&name)
            .map_err(|_| ("--allow-env".to_string(), format!("{name}: not set in this environment")))?;
        env_names.push(name.clone());
        request = request.env(name, value);
    }
    for pair in args.env {
        let (name, value) =
            pair.split_once('=').ok_or_else(|| ("--env".to_string(), format!("{pair:?}: expected NAME=VALUE")))?;
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
                _ => return Err(("--preopen".into(), format!("{spec:?}: expected HOST:GUEST[:ro|rw]"))),
            };
        }
        policy = policy.filesystem(Access::Allow(grants));
    }
    args.tools.grant(&mut policy);
    #[cfg(feature = "artifacts")]
    {
        args.artifacts.spill(&mut policy);
        if let Some(key) = &args.artifact_key {
            if key.is_empty() || key.len() > 128 || key.chars().any(char::is_control) {
                return Err(("--artifact-key".into(), "1 to 128 bytes, no control characters".into()));
            }
            request = request.artifact_scope(format!("key:{key}"));
        }
    }
    request = request.policy(policy);
    for arg in args.args {
        request = request.arg(arg);
    }
    if let Some(path) = &args.stdin_file {
        let bytes =
            read(path, MAX_INPUT_FILE_BYTES, "execbox's limit for standard input").map_err(arg("--stdin-file"))?;
        request = request.stdin(bytes);
    }
    if let Some(text) = args.input {
        let value: Value =
            serde_json::from_str(&text).map_err(|e| ("--input".to_string(), format!("not valid JSON: {e}")))?;
        request = request.input(value);
    }
    for spec in &args.input_files {
        let (path, name) = match spec.rsplit_once(':') {
            Some((path, name)) => (Path::new(path), name.to_string()),
            None => {
                let path = Path::new(spec);
                let name =
                    path.file_name().ok_or_else(|| ("--input-file".to_string(), format!("{spec:?} names no file")))?;
                (path, name.to_string_lossy().into_owned())
            }
        };
        request = request.input_file(ExecFile::new(
            name,
            read(path, MAX_INPUT_FILE_BYTES, "execbox's limit per input file").map_err(arg("--input-file"))?,
        ));
    }
    if args.output_dir.is_some() {
        request = request.collect_output_files();
    }
    if let Some(name) = args.backend {
        request = request.on_backend(name);
    }
    request = request.packages(args.packages);
    if let Some(path) = &args.output_schema {
        let bytes = read(path, execbox::schema::MAX_SCHEMA_BYTES as u64, "execbox's limit for a schema")
            .map_err(arg("--output-schema"))?;
        let schema: Value = serde_json::from_slice(&bytes)
            .map_err(|e| ("--output-schema".to_string(), format!("not valid JSON: {e}")))?;
        let schema = execbox::JsonSchema::new(schema).map_err(|e| ("--output-schema".to_string(), e.to_string()))?;
        request = request.output_schema(schema);
    }
    Ok(request)
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
