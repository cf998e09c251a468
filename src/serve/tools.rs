//! The MCP tools: `run_code`, `list_backends`, `create_session`,
//! `close_session` (the workspaces' tools are in `workspaces.rs`).
//!
//! A program that ran is the tool's answer, whatever its outcome (`ok`,
//! `failed`, `timed_out`, `invalid_output`, ...): an ordinary result, its
//! outcome first in the text and in `structuredContent`, so an agent
//! framework's tool-retry budget does not pay for the model's bugs
//! (pydantic-ai's default of one retry ended an agent run after two
//! failing programs in a row). A refusal, `busy`, an unknown session, an
//! internal fault and malformed arguments (`invalid_arguments`, SEP-1303)
//! are failed tool calls (`isError: true`). [`ServeConfig::failures_as_errors`](super::ServeConfig::failures_as_errors)
//! brings back the old behaviour (a program's failure is `isError` too).
//! `structuredContent` of `run_code` is exactly the JSON `execbox run
//! --json` prints (an [`ExecResult`], or `{"error": {...}}`); the text
//! content is a short rendering for a model.

use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use base64::Engine as _;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, LoggingLevel, ServerCapabilities, ServerConfig, SetLevelRequestParams,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData as McpError, ServerHandler, schemars, tool, tool_handler, tool_router};
use serde::Deserialize;
use serde_json::{Value, json};

use super::shared::{Limits, Shared};
use super::stream;
use crate::error::ExecError;
use crate::file::ExecFile;
use crate::language::Language;
use crate::policy::SandboxPolicy;
use crate::request::{ExecRequest, Payload};
use crate::result::{ExecResult, Outcome};
use crate::session_spec::SessionSpec;
use crate::sessions::error::SessionError;

/// How long `list_backends`, `create_session` and `close_session` wait for a
/// turn: they use the blocking pool too, so they pass the same gate as runs.
const OTHER_TOOLS_WAIT: Duration = Duration::from_secs(10);

/// Most bytes of tool catalog `run_code`'s description carries.
const CATALOG_BYTES: usize = 12 << 10;

/// The longest `list_backends` and `close_session` run (the container
/// engine's housekeeping commands are bounded by 15 s).
const OTHER_TOOLS_LIMIT: Duration = Duration::from_secs(20);

/// The longest `create_session` runs (a container session's start is
/// bounded by 60 s).
const SESSION_OPEN_LIMIT: Duration = Duration::from_secs(65);

/// Most artifact scopes (its own and one per `artifact_key`) one connection
/// may use: each is removed when the connection ends.
#[cfg(feature = "artifacts")]
const MAX_SCOPES_PER_CONNECTION: usize = 64;

/// Longest `artifact_key`, in bytes.
#[cfg(feature = "artifacts")]
const MAX_ARTIFACT_KEY_BYTES: usize = 128;

/// The handler of one MCP connection. Its sessions are its own: ids are
/// looked up under this connection only, and close when it goes.
#[derive(Clone)]
pub struct ExecboxMcp {
    pub(super) shared: Arc<Shared>,
    pub(super) connection: Arc<Connection>,
    tool_router: ToolRouter<Self>,
}

/// Per-connection state; dropping the last handler clone closes the
/// connection's sessions.
pub(super) struct Connection {
    id: u64,
    pub(super) shared: Arc<Shared>,
    /// The level the client asked for with `logging/setLevel`, if any.
    log_level: Mutex<Option<LoggingLevel>>,
    /// The artifact scopes its runs used (removed when it ends).
    #[cfg(feature = "artifacts")]
    scopes: Mutex<std::collections::BTreeSet<String>>,
    /// Its workspaces by the ids it was given, each with its server-wide
    /// slot (unmounted and given back when it ends).
    pub(super) workspaces: Mutex<std::collections::HashMap<String, super::shared::HeldWorkspace>>,
    /// Its programs by the ids it was given, each with its workspace's id.
    pub(super) programs: Mutex<std::collections::HashMap<String, (crate::program::Program, String)>>,
    /// Programs being started (counted against the cap with `programs`).
    pub(super) programs_starting: std::sync::atomic::AtomicUsize,
}

impl Connection {
    /// The registry key of this connection's session `id`.
    pub(super) fn key(&self, id: &str) -> String {
        format!("{}/{id}", self.id)
    }
}

impl Connection {
    /// Marks the workspace session `session_id` was opened in, if any, used
    /// now (a call of the session uses it).
    fn touch_session_workspace(&self, session_id: &str) {
        let mut held = self.workspaces.lock();
        if let Some(entry) = held.values_mut().find(|w| w.sessions.iter().any(|s| s == session_id)) {
            entry.last_used = std::time::Instant::now();
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let prefix = format!("{}/", self.id);
        let sessions = self.shared.sessions.clone();
        #[cfg(feature = "artifacts")]
        let artifacts =
            self.shared.artifacts.as_ref().map(|a| (a.store.clone(), std::mem::take(&mut *self.scopes.lock())));
        // Closing ends worker processes or removes containers: off the
        // async threads, on a thread the drain waits for (an exit must not
        // cut a removal short: see `Server::drain`).
        self.shared.cleanups.spawn(move || {
            sessions.close_where(|key| key.starts_with(&prefix));
            #[cfg(feature = "artifacts")]
            if let Some((store, scopes)) = artifacts {
                for scope in scopes {
                    if let Err(e) = store.remove_scope(&scope) {
                        tracing::warn!(error = %e, "a closed connection's artifacts were not removed");
                    }
                }
            }
        });
    }
}

/// A language id (`javascript`/`js`, `python`/`py`, `shell`/`sh`, `rust`, `wasm`).
#[derive(Clone, Copy, Debug, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LanguageArg {
    /// A function body: `input` is bound, `return` gives `output`.
    #[serde(alias = "js")]
    Javascript,
    /// A script: `input` is bound; print JSON to give `output`.
    #[serde(alias = "py")]
    Python,
    /// A bash script (POSIX sh scripts run as well).
    #[serde(alias = "sh")]
    Shell,
    /// Defines `fn run(input: Value) -> Value` (serde_json's `Value` is in scope).
    Rust,
    /// WebAssembly text (WAT).
    Wasm,
}

impl From<LanguageArg> for Language {
    fn from(l: LanguageArg) -> Self {
        match l {
            LanguageArg::Javascript => Language::JavaScript,
            LanguageArg::Python => Language::Python,
            LanguageArg::Shell => Language::Shell,
            LanguageArg::Rust => Language::Rust,
            LanguageArg::Wasm => Language::Wasm,
        }
    }
}

/// A file staged for the code.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileArg {
    /// A relative path (no `..`); the code sees it in its working directory.
    pub name: String,
    /// The file's bytes, in standard base64.
    pub content_base64: String,
}

/// `run_code`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCodeArgs {
    /// The language of `code`.
    pub language: LanguageArg,
    /// The code. JavaScript: a function body (`input` bound, `return` gives
    /// the output). Python: a script (`input` bound; print JSON for
    /// structured output; with a session, globals persist between calls).
    /// Shell: a bash script. Rust: defines `fn run(input: Value) -> Value`.
    /// Wasm: a WAT module.
    pub code: String,
    /// A JSON value the code sees as `input`.
    #[serde(default)]
    pub input: Option<Value>,
    /// A shorter deadline than the server's, in milliseconds.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub timeout_ms: Option<u64>,
    /// A lower memory cap than the server's, in MiB.
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub memory_mb: Option<u64>,
    /// Run in this session (from `create_session`): state persists between calls.
    #[serde(default)]
    pub session_id: Option<String>,
    /// Run in this workspace (from `create_workspace`): it is /work, read-write, and its files stay.
    #[serde(default)]
    pub workspace_id: Option<String>,
    /// Files staged for the code.
    #[serde(default)]
    pub files: Option<Vec<FileArg>>,
    /// Return the files the code writes to its output directory (`/work/out`).
    #[serde(default)]
    pub collect_files: Option<bool>,
    /// Run on this backend only (see `list_backends`).
    #[serde(default)]
    pub backend: Option<String>,
    /// Packages the code needs (Python: e.g. numpy, pandas, matplotlib, scipy). Only a backend
    /// that provides every one runs it (list_backends shows who provides what).
    #[serde(default)]
    pub packages: Option<Vec<String>>,
    /// A JSON Schema (2020-12) the run's output must match: a run whose output does not (or that
    /// gives none) ends with outcome `invalid_output` and `output_errors` naming each failing place.
    /// References only within the schema (`#/$defs/...`); bounded in size and cost.
    #[serde(default)]
    pub output_schema: Option<Value>,
    /// Artifacts (when the server keeps them; the code's `artifacts.*` tools): runs and sessions of
    /// this connection share one scope; a key gives a separate scope of this connection. Removed
    /// when the connection ends.
    #[cfg(feature = "artifacts")]
    #[serde(default)]
    pub artifact_key: Option<String>,
}

/// `create_session`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSessionArgs {
    /// The session's language (see `list_backends` for those with sessions).
    pub language: LanguageArg,
    /// Packages the session needs (Python: numpy, pandas, ... put the session in a container).
    #[serde(default)]
    pub packages: Option<Vec<String>>,
    /// Open it in this workspace (from `create_workspace`): every call sees it at /work,
    /// read-write. Closing the workspace closes the session.
    #[serde(default)]
    pub workspace_id: Option<String>,
}

/// `close_session`'s arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CloseSessionArgs {
    /// The id `create_session` returned.
    pub session_id: String,
}

/// `list_backends` takes no arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

impl ExecboxMcp {
    /// `result` (a refusal about a session or workspace this process does
    /// not hold), naming this replica when the server is one of several.
    pub(super) fn not_held_here(&self, result: CallToolResult) -> CallToolResult {
        not_held_here(result, self.shared.cfg.replica.as_deref())
    }

    pub(super) fn new(shared: Arc<Shared>) -> Self {
        let id = shared.next_connection.fetch_add(1, Ordering::Relaxed);
        let connection = Arc::new(Connection {
            id,
            shared: shared.clone(),
            log_level: Mutex::new(None),
            #[cfg(feature = "artifacts")]
            scopes: Mutex::new(Default::default()),
            workspaces: Mutex::new(Default::default()),
            programs: Mutex::new(Default::default()),
            programs_starting: Default::default(),
        });
        let tool_router = Self::tool_router() + Self::workspace_router() + Self::program_router();
        Self::expire_idle_workspaces(&connection);
        Self { shared, connection, tool_router }
    }

    /// The request a call becomes: it asks only for the call's deadline and
    /// memory cap (the executor and the session registry hold it to the
    /// server's policy, which supplies everything else), with the server's
    /// environment values. `Err`: an argument that cannot be used, in words
    /// for the model.
    fn request(&self, args: RunCodeArgs) -> Result<(ExecRequest, Option<String>), String> {
        let language = Language::from(args.language);
        let payload = match language {
            Language::Wasm => Payload::WasmModule(args.code.into_bytes()),
            _ => Payload::Source(args.code),
        };
        let mut policy = SandboxPolicy::unstated();
        if let Some(ms) = args.timeout_ms {
            if ms == 0 {
                return Err("timeout_ms must be at least 1".into());
            }
            policy.timeout_ms = Some(ms);
        }
        if let Some(mb) = args.memory_mb {
            if mb == 0 {
                return Err("memory_mb must be at least 1".into());
            }
            policy.memory_bytes = Some(mb.saturating_mul(1 << 20));
        }
        let mut request = ExecRequest::new(language, payload).policy(policy);
        if let Some(id) = &args.workspace_id {
            // With a session_id too: the session must have opened in it.
            request.workspace = Some(self.workspace(id).ok_or_else(|| format!("no workspace {id} is open"))?);
        }
        if let Some(id) = &args.session_id {
            self.connection.touch_session_workspace(id);
        }
        request.input = args.input;
        if args.session_id.is_none() {
            // A session's environment is the server's too, fixed when it opened.
            request.env = self.shared.cfg.env.clone();
        }
        for file in args.files.unwrap_or_default() {
            let content = base64::engine::general_purpose::STANDARD
                .decode(file.content_base64.as_bytes())
                .map_err(|e| format!("file {:?}: content_base64: {e}", file.name))?;
            request.input_files.push(ExecFile::new(file.name, content));
        }
        request.collect_output_files = args.collect_files.unwrap_or(false);
        request.backend = args.backend;
        request.packages = args.packages.unwrap_or_default();
        if let Some(id) = &args.workspace_id
            && matches!(language, Language::Python | Language::Shell)
        {
            self.declare_workspace_packages(id, &mut request.packages);
        }
        if let Some(schema) = args.output_schema {
            request.output_schema =
                Some(crate::schema::JsonSchema::new(schema).map_err(|e| format!("output_schema: {e}"))?);
        }
        #[cfg(feature = "artifacts")]
        {
            request.artifact_scope = self.artifact_scope(args.artifact_key)?;
        }
        Ok((request, args.session_id))
    }

    /// The artifact scope of a call of this connection: the connection's,
    /// or its scope for `key`; none when the server keeps no artifacts.
    #[cfg(feature = "artifacts")]
    pub(super) fn artifact_scope(&self, key: Option<String>) -> Result<Option<String>, String> {
        let Some(artifacts) = &self.shared.artifacts else {
            return match key {
                Some(_) => Err("artifact_key: this server keeps no artifacts (see execbox serve --artifacts)".into()),
                None => Ok(None),
            };
        };
        let connection = format!("{}:{}", artifacts.prefix, self.connection.id);
        let scope = match key {
            None => connection,
            Some(key) => {
                if key.is_empty() || key.len() > MAX_ARTIFACT_KEY_BYTES || key.chars().any(char::is_control) {
                    return Err(format!(
                        "artifact_key must be 1 to {MAX_ARTIFACT_KEY_BYTES} bytes without control characters"
                    ));
                }
                format!("{connection}:key:{key}")
            }
        };
        let mut scopes = self.connection.scopes.lock();
        if !scopes.contains(&scope) {
            if scopes.len() >= MAX_SCOPES_PER_CONNECTION {
                return Err(format!(
                    "artifact_key: this connection already uses {MAX_SCOPES_PER_CONNECTION} artifact scopes"
                ));
            }
            scopes.insert(scope.clone());
        }
        Ok(Some(scope))
    }

    fn log_level(&self) -> Option<LoggingLevel> {
        *self.connection.log_level.lock()
    }
}

#[tool_router]
impl ExecboxMcp {
    /// Runs code once, or as the next call of a session.
    #[tool(
        description = "Run code in a sandbox: no network, no host files, no host environment unless the server grants \
            them. Languages: javascript, python, shell, rust, wasm. The result's structuredContent holds outcome \
            (ok, failed, timed_out, out_of_memory, out_of_fuel, killed, invalid_output), stdout, stderr, output \
            (the returned or printed JSON value), exit_code, message, output_errors (with output_schema) and \
            output_files (base64). A program that ran and failed is a normal result: read its outcome and fix \
            the code. Only a call that could not run (refused, busy, unknown session, bad arguments) has \
            isError: true. Pass session_id (from create_session) to keep state between calls, and \
            output_schema (a JSON Schema) to have the output checked."
    )]
    async fn run_code(
        &self,
        Parameters(args): Parameters<RunCodeArgs>,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, McpError> {
        let queued_at = std::time::Instant::now();
        let workspace_id = args.workspace_id.clone();
        if let Some(id) = args.workspace_id.as_deref().filter(|id| self.workspace(id).is_none()) {
            return Ok(self.no_workspace("run_code", id));
        }
        let (mut request, session_id) = match self.request(args) {
            Ok(parts) => parts,
            Err(message) => return Ok(invalid_arguments("run_code", &message)),
        };
        let timeout = Duration::from_millis(self.shared.run_timeout_ms(request.policy.timeout_ms));
        let turn = match self.shared.gate.enter(timeout, timeout + crate::limits::deadline::RUN_GRACE).await {
            Ok(turn) => turn,
            Err(e) => return Ok(refusal(&e)),
        };
        // The wait for a run slot counts against the call's deadline.
        request = request.deadline_from(queued_at);
        let peer = context.peer.clone();
        // Calls to tools that need approval ask this caller's client.
        request.tool_approver = super::approval::asking(&peer);
        let level = self.log_level().filter(|l| level_rank(*l) <= level_rank(LoggingLevel::Info));
        let lines = level.map(|_| stream::LineStream::start(peer.clone(), LoggingLevel::Info));
        if let Some(lines) = &lines {
            request.output_tap = Some(lines.tap());
        }
        let progress =
            context.meta.get_progress_token().map(|token| stream::start_progress(peer.clone(), token, timeout));

        let outcome = match session_id.clone() {
            Some(id) => {
                let key = self.connection.key(&id);
                self.shared
                    .sessions
                    .execute_async(&key, request)
                    .await
                    // Ids are per connection: name the caller's id, never the key.
                    .map_err(|e| Refusal::Session(e.with_id(&id)))
            }
            None => self.shared.exec.execute(request).await.map_err(Refusal::Exec),
        };
        drop(turn);
        // Its end is a use too: the idle time starts again after a long run.
        if let Some(id) = &workspace_id {
            self.workspace(id);
        }
        if let Some(id) = &session_id {
            self.connection.touch_session_workspace(id);
        }
        if let Some(progress) = progress {
            progress.abort();
        }
        if let (Some(lines), Some(level)) = (lines, level) {
            lines.finish(&peer, level).await;
        }
        Ok(match outcome {
            Ok(result) => rendered(result, self.shared.cfg.failures_as_errors),
            Err(Refusal::Exec(e)) => refusal(&e),
            Err(Refusal::Session(e)) => {
                let unknown = matches!(e, SessionError::Unknown { .. });
                let result = refusal(&e);
                if unknown { not_held_here(result, self.shared.cfg.replica.as_deref()) } else { result }
            }
        })
    }

    /// The live capability table.
    #[tool(description = "List the backends: which languages each runs, whether it is available (and why not), its \
            warm capacity, and how it enforces each control. Also the server's policy ceiling and load limits, \
            and the languages that have sessions.")]
    async fn list_backends(&self, Parameters(_): Parameters<NoArgs>) -> Result<CallToolResult, McpError> {
        let _turn = match self.shared.gate.enter(OTHER_TOOLS_WAIT, OTHER_TOOLS_LIMIT).await {
            Ok(turn) => turn,
            Err(e) => return Ok(refusal(&e)),
        };
        let shared = self.shared.clone();
        let status = tokio::task::spawn_blocking(move || shared.exec.status())
            .await
            .map_err(|e| McpError::internal_error(format!("status: {e}"), None))?;
        let sessions = &self.shared.sessions;
        let languages: Vec<&str> = sessions.languages().into_iter().map(Language::as_str).collect();
        let limits = Limits {
            ceiling: self.shared.cfg.policy.clone(),
            max_concurrent: self.shared.cfg.max_concurrent,
            max_queued: self.shared.cfg.max_queued,
            running: self.shared.gate.active(),
        };
        let body = json!({
            "backends": status,
            "sessions": {
                "languages": languages,
                "live": sessions.len(),
                "max": sessions.config().max_sessions,
                "idle_timeout_ms": sessions.config().idle_timeout.as_millis() as u64,
            },
            "limits": limits,
            "tools": {
                "granted": self.shared.granted_tools().iter().map(|s| s.name.clone()).collect::<Vec<_>>(),
                "upstreams": self.shared.upstreams,
                // What a call really gets: the ceiling's, or the defaults.
                "tool_limits": self.shared.cfg.policy.effective_tool_limits(),
            },
        });
        let mut text = String::new();
        for b in &status {
            let langs: Vec<&str> = b.capabilities.languages.iter().map(|l| l.as_str()).collect();
            let state = match (&b.unavailable, &b.readiness) {
                (Some(reason), _) => format!("unavailable: {reason}"),
                (None, Some(r)) => format!("available ({} of {} warm)", r.ready, r.target),
                (None, None) => "available".into(),
            };
            text.push_str(&format!("{} ({}): {state}\n", b.name, langs.join(", ")));
        }
        Ok(structured(body, text, false))
    }

    /// Opens a session.
    #[tool(description = "Open a session for a language: later run_code calls with its session_id share state \
            (JavaScript: top-level declarations persist and the last expression is the output; Python: the \
            globals; shell: one bash's variables, functions and working directory). With a workspace_id, every \
            call sees that workspace at /work, read-write (Python and shell, in a container). Sessions \
            close when idle, when closed, with their workspace, or when this connection ends; a session whose \
            call timed out or ran out of memory is lost, and later calls say so.")]
    async fn create_session(
        &self,
        Parameters(CreateSessionArgs { language, packages, workspace_id }): Parameters<CreateSessionArgs>,
    ) -> Result<CallToolResult, McpError> {
        let language = Language::from(language);
        let workspace = match &workspace_id {
            Some(id) => match self.workspace(id) {
                Some(workspace) => Some(workspace),
                None => return Ok(self.no_workspace("create_session", id)),
            },
            None => None,
        };
        let _turn = match self.shared.gate.enter(OTHER_TOOLS_WAIT, SESSION_OPEN_LIMIT).await {
            Ok(turn) => turn,
            Err(e) => return Ok(refusal(&e)),
        };
        let sessions = self.shared.sessions.clone();
        let connection = self.connection.clone();
        // Opened exactly as a one-shot run would run: under the server's
        // policy (the registry holds it to the ceiling) with its environment.
        let mut spec =
            SessionSpec::new(language).packages(packages.unwrap_or_default()).policy(self.shared.cfg.policy.clone());
        spec.env = self.shared.cfg.env.clone();
        if let Some(id) = &workspace_id {
            self.declare_workspace_packages(id, &mut spec.packages);
        }
        spec.workspace = workspace;
        let opened = tokio::task::spawn_blocking(move || {
            let id = crate::nonce::hex128();
            match sessions.open(&connection.key(&id), spec) {
                Ok(()) => Ok(id),
                Err(e) => Err(e.with_id(&id)),
            }
        })
        .await
        .map_err(|e| McpError::internal_error(format!("session task: {e}"), None))?;
        if let (Ok(id), Some(workspace_id)) = (&opened, &workspace_id) {
            // Closed with its workspace; if the workspace was closed
            // meanwhile, closed now.
            let recorded = match self.connection.workspaces.lock().get_mut(workspace_id) {
                Some(held) => {
                    let sessions = &self.shared.sessions;
                    held.sessions.retain(|other| sessions.is_open(&self.connection.key(other)));
                    held.sessions.push(id.clone());
                    true
                }
                None => false,
            };
            if !recorded {
                let (sessions, key) = (self.shared.sessions.clone(), self.connection.key(id));
                self.shared.cleanups.spawn(move || {
                    sessions.close(&key);
                });
                let why = format!("workspace {workspace_id} was closed while the session opened");
                return Ok(invalid_arguments("create_session", &why));
            }
        }
        Ok(match opened {
            Ok(id) => {
                let idle = self.shared.sessions.config().idle_timeout.as_millis() as u64;
                let body = json!({
                    "session_id": id,
                    "replica": self.shared.cfg.replica,
                    "language": language.as_str(),
                    "idle_timeout_ms": idle,
                    "workspace_id": workspace_id,
                });
                structured(body, format!("session {id} ({language}) is open"), false)
            }
            Err(e) => refusal(&e),
        })
    }

    /// Closes a session.
    #[tool(description = "Close a session now; its state and interpreter are freed.")]
    async fn close_session(
        &self,
        Parameters(CloseSessionArgs { session_id }): Parameters<CloseSessionArgs>,
    ) -> Result<CallToolResult, McpError> {
        let _turn = match self.shared.gate.enter(OTHER_TOOLS_WAIT, OTHER_TOOLS_LIMIT).await {
            Ok(turn) => turn,
            Err(e) => return Ok(refusal(&e)),
        };
        let sessions = self.shared.sessions.clone();
        let key = self.connection.key(&session_id);
        let closed = tokio::task::spawn_blocking(move || sessions.close(&key))
            .await
            .map_err(|e| McpError::internal_error(format!("session task: {e}"), None))?;
        let text =
            if closed { format!("session {session_id} closed") } else { format!("no session {session_id} is open") };
        Ok(structured(json!({"closed": closed}), text, false))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for ExecboxMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_logging().build())
            .with_server_info(Implementation::new("execbox", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "execbox runs untrusted code under a policy that fails closed. Use run_code; list_backends shows \
                 what runs where and what is enforced; create_session keeps state between calls.",
            )
    }

    /// The tools, with `run_code`'s description carrying the catalog of the
    /// host tools the server's policy grants (so an agent attaches one tool
    /// instead of N): TypeScript declarations when they fit, else a list,
    /// else a note on discovering them from code.
    async fn list_tools(
        &self,
        _request: Option<rmcp::model::PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::ListToolsResult, McpError> {
        let mut tools = self.tool_router.list_all();
        let granted = self.shared.granted_tools();
        if !granted.is_empty()
            && let Some(run_code) = tools.iter_mut().find(|t| t.name == "run_code")
        {
            let specs: Vec<&crate::tools::ToolSpec> = granted.iter().map(|s| s.as_ref()).collect();
            let description = format!(
                "{}\n\n{}\nlist_backends shows the tool_limits.",
                run_code.description.as_deref().unwrap_or_default(),
                crate::tools::catalog::code_mode_prompt(&specs, CATALOG_BYTES)
            );
            run_code.description = Some(description.into());
        }
        Ok(rmcp::model::ListToolsResult::with_all_items(tools))
    }

    /// Malformed arguments are tool results with `isError: true` and the
    /// reason, which a model can read and correct (MCP 2025-11-25,
    /// SEP-1303), checked here against each tool's own argument type before
    /// the router sees them; only a request that is not a `tools/call` at
    /// all, or names no tool of this server, is a JSON-RPC error.
    async fn call_tool(
        &self,
        request: rmcp::model::CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<rmcp::model::CallToolResponse, McpError> {
        let arguments = Value::Object(request.arguments.clone().unwrap_or_default());
        let checked = match request.name.as_ref() {
            "run_code" => serde_json::from_value::<RunCodeArgs>(arguments).map(drop),
            "create_session" => serde_json::from_value::<CreateSessionArgs>(arguments).map(drop),
            "close_session" => serde_json::from_value::<CloseSessionArgs>(arguments).map(drop),
            "list_backends" => serde_json::from_value::<NoArgs>(arguments).map(drop),
            // The workspaces' and programs' tools, or unknown ones (the
            // router answers those).
            other => Self::check_workspace_arguments(other, arguments.clone())
                .and_then(|()| Self::check_program_arguments(other, arguments)),
        };
        if let Err(e) = checked {
            return Ok(invalid_arguments(&request.name, &e.to_string()).into());
        }
        let call = rmcp::handler::server::tool::ToolCallContext::new(self, request, context);
        self.tool_router.call(call).await
    }

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        *self.connection.log_level.lock() = Some(request.level);
        Ok(())
    }
}

enum Refusal {
    Exec(ExecError),
    Session(SessionError),
}

/// A run's result: the CLI's JSON as structuredContent, a short text that
/// starts with the outcome, and image files as images. A program that ran
/// is not a failed tool call, unless `failures_as_errors`.
fn rendered(result: ExecResult, failures_as_errors: bool) -> CallToolResult {
    let body = result.to_json();
    let mut text = format!(
        "outcome: {}{} [{}, {:.1} ms]\n",
        result.outcome.as_str(),
        result.exit_code.filter(|c| *c != 0).map(|c| format!(" (exit code {c})")).unwrap_or_default(),
        result.backend,
        result.usage.duration.as_secs_f64() * 1e3,
    );
    let (message, is_error) = (result.message.clone(), failures_as_errors && result.outcome != Outcome::Ok);
    // The model's text is the agent layer's (the result moves there: no copy of its streams and files).
    let model = crate::agent::CodeExecutionResult::from(result);
    let body_text = model.model_text();
    if let Some(message) = message.filter(|m| !body_text.contains(m.as_str())) {
        text.push_str(&format!("{message}\n"));
    }
    text.push_str(&body_text);
    let mut out = structured(body, text, is_error);
    for file in model.output_files.iter().filter(|f| f.mime_type.as_deref().is_some_and(|m| m.starts_with("image/"))) {
        let data = base64::engine::general_purpose::STANDARD.encode(&file.content);
        out.content.push(ContentBlock::image(data, file.mime_type.clone().unwrap_or_default()));
    }
    out
}

/// Arguments a tool cannot use: `{"error": {"kind": "invalid_arguments",
/// "message", "violations": []}}`, `isError`.
pub(super) fn invalid_arguments(tool: &str, reason: &str) -> CallToolResult {
    let message = crate::text::cap_message(format!("invalid arguments for {tool}: {reason}"));
    let body = json!({"error": {"kind": "invalid_arguments", "message": message, "violations": []}});
    structured(body, format!("invalid_arguments: {message}"), true)
}

/// `result`, a refusal about a session or workspace this process does not
/// hold, naming the replica that answered (when the server is one of
/// several, [`ServeConfig::replica`](super::ServeConfig::replica)): they
/// live on the replica that opened them, so the caller learns it reached
/// another one.
pub(super) fn not_held_here(mut result: CallToolResult, replica: Option<&str>) -> CallToolResult {
    let Some(replica) = replica else { return result };
    let note = format!("replica {replica} answered; sessions and workspaces live only on the replica that opened them");
    if let Some(error) = result.structured_content.as_mut().and_then(|body| body.get_mut("error")) {
        error["replica"] = json!(replica);
        if let Some(message) = error["message"].as_str() {
            error["message"] = json!(format!("{message}; {note}"));
        }
    }
    if let Some(ContentBlock::Text(text)) = result.content.first_mut() {
        text.text = format!("{}; {note}", text.text);
    }
    result
}

/// A refusal or an error before any result: `{"error": {...}}`, `isError`.
pub(super) fn refusal(error: &impl serde::Serialize) -> CallToolResult {
    let body = json!({"error": error});
    let kind = body["error"]["kind"].as_str().unwrap_or("error").to_string();
    let message = body["error"]["message"].as_str().unwrap_or_default().to_string();
    // A refusal's message already starts "refused: ".
    let text = if message.starts_with(&format!("{kind}:")) { message } else { format!("{kind}: {message}") };
    structured(body, text, true)
}

pub(super) fn structured(body: Value, text: String, is_error: bool) -> CallToolResult {
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(body);
    result.is_error = Some(is_error);
    result
}

/// Severity order of MCP log levels (debug lowest).
fn level_rank(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}
