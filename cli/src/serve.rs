//! `execbox serve`: the MCP server, from flags to a drained exit.

use std::process::ExitCode;
use std::time::Duration;

use execbox::{Access, SandboxPolicy};

use super::{ServeArgs, read};

/// Runs the MCP server until stdin ends (stdio), or SIGTERM/SIGINT/SIGHUP;
/// then drains (runs in flight finish or time out) and cleans up.
pub(crate) fn serve(args: ServeArgs) -> ExitCode {
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
    args.tools.grant(&mut policy);
    #[cfg(feature = "artifacts")]
    args.artifacts.spill(&mut policy);
    let token = match &args.token_file {
        Some(path) => match read(path, 4096, "execbox's limit for a token file").map(String::from_utf8) {
            Ok(Ok(text)) if !text.trim().is_empty() => Some(text.trim().to_string()),
            Ok(Ok(_)) => return fail(format!("--token-file {}: the file is empty", path.display())),
            Ok(Err(_)) => return fail(format!("--token-file {}: not UTF-8", path.display())),
            Err(e) => return fail(format!("--token-file: {e}")),
        },
        None => None,
    };
    let access = execbox::serve::HttpAccess::default()
        .allowed_hosts(args.allowed_hosts.clone())
        .allowed_origins(args.allowed_origins.clone());
    let access = match token.clone() {
        Some(token) => access.token(token),
        None => access,
    };
    if let Some(addr) = args.http
        && let Err(e) = access.check(addr)
    {
        return fail(e.to_string());
    }
    if token.is_some() && args.http.is_none() {
        return fail("--token-file applies to --http only".into());
    }
    let sessions = execbox::SessionConfig::default()
        .max_sessions(args.max_sessions)
        .idle_timeout(Duration::from_secs(args.session_idle_secs));
    let mut cfg = ServeConfig::default()
        .policy(policy)
        .env(env)
        .max_queued(args.max_queued)
        .sessions(sessions)
        .failures_as_errors(args.failures_as_errors)
        .workspaces(
            execbox::WorkspaceConfig::default()
                .root(args.workspace_root)
                .quota_bytes(args.workspace_quota_mb.saturating_mul(1 << 20)),
        )
        .max_workspaces(args.max_workspaces)
        .program_lifetime(std::time::Duration::from_secs(args.program_lifetime_secs))
        .workspace_idle(std::time::Duration::from_secs(args.workspace_idle_secs))
        .workspace_lifetime(std::time::Duration::from_secs(args.workspace_lifetime_secs))
        .backends(
            args.backends.config(args.js_idle_workers, args.python_warm_pool).warm_containers(args.warm_containers),
        );
    // A blank name (an empty EXECBOX_REPLICA in a manifest) is none; a name
    // goes into every answer that names the replica, so it is held to what
    // a Kubernetes object's name may be.
    cfg.replica = match args.replica.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(name) if name.len() > 253 || name.chars().any(char::is_control) => {
            return fail("--replica: at most 253 bytes, without control characters".into());
        }
        Some(name) => Some(name.to_string()),
    };
    #[cfg(feature = "upstream")]
    match args.tools.upstreams() {
        Ok(Some(upstreams)) => cfg.upstreams = upstreams,
        Ok(None) => {}
        Err(e) => return fail(e),
    }
    #[cfg(feature = "artifacts")]
    {
        cfg.artifacts = args.artifacts.config();
    }
    if let Some(n) = args.max_concurrent {
        cfg.max_concurrent = n.max(1);
    }
    // Every tool passes the run gate before it takes a blocking thread: a
    // flood never holds more than this.
    let blocking = cfg.max_concurrent + 16;
    // execbox's builder: runs may wait for their workers on its reactor.
    let runtime = match execbox::runtime_builder().max_blocking_threads(blocking).build() {
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
                    .serve_http(addr, access, stop, |bound| eprintln!("execbox serve: listening on http://{bound}/mcp"))
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
