//! Upstream MCP servers as tool sources: execbox connects to them as an
//! MCP client (rmcp's) and registers their tools under the server's name
//! (`memory.read_graph`), so sandboxed code calls them like any tool.
//!
//! Configured the way MCP clients already do it (Claude Desktop, Cursor):
//!
//! ```json
//! {"mcpServers": {
//!   "memory": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"], "env": {"K": "v"}},
//!   "search": {"url": "http://127.0.0.1:9000/mcp", "headers": {"X-Team": "a"}, "bearerTokenFile": "/run/secrets/t",
//!              "requireApproval": ["delete_index"]}
//! }}
//! ```
//!
//! What holds:
//! - **Nothing of an upstream reaches the sandbox**: its environment, its
//!   token and its process stay on the host; code sees only arguments and
//!   results.
//! - **A stdio server** starts with exactly its configured environment plus
//!   `PATH` and `HOME` (nothing else of the host's), and dies with execbox.
//! - **A call that ends early is cancelled upstream**: when a run ends, or
//!   a call times out, the call's future is dropped and rmcp sends
//!   `notifications/cancelled`.
//! - **A server that dies or hangs** gives typed tool errors
//!   (`unavailable`, `timed_out`), never a hung run.
//! - **Approval** (`requireApproval`: `true`, or a list of the server's
//!   tool names): each call first goes to the run's approver
//!   ([`ExecRequest::tool_approver`](crate::request::ExecRequest::tool_approver),
//!   which `execbox serve` sets to ask its client), else the registry's;
//!   with neither it is `denied`.
//! - HTTP upstreams are plain `http://` (no TLS stack is compiled in): use
//!   them on loopback or a trusted network.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock};
use rmcp::service::{RoleClient, RunningService};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::registry::{Tool, ToolAnnotations, ToolRegistry, ToolSpec};
use crate::error::tool::{ToolError, ToolErrorKind};
use crate::error::{Cause, with_causes};

/// The `mcpServers` document.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamsConfig {
    /// Servers by name; the name is the namespace of their tools.
    #[serde(rename = "mcpServers", default)]
    pub servers: BTreeMap<String, UpstreamConfig>,
}

/// One upstream server: a command to run (stdio) or a URL (streamable HTTP).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged, deny_unknown_fields)]
pub enum UpstreamConfig {
    /// A server execbox starts and talks to over its stdin and stdout.
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        #[serde(default)]
        args: Vec<String>,
        /// Its environment, besides `PATH` and `HOME`.
        #[serde(default)]
        env: BTreeMap<String, String>,
        /// Which of its tools need the host's approval per call.
        #[serde(default, rename = "requireApproval")]
        require_approval: RequireApproval,
    },
    /// A server at a streamable-HTTP URL.
    Http {
        /// `http://host:port/path`.
        url: String,
        /// Headers sent with every request.
        #[serde(default)]
        headers: BTreeMap<String, String>,
        /// A file holding a bearer token (sent as `Authorization: Bearer`).
        #[serde(default, rename = "bearerTokenFile")]
        bearer_token_file: Option<PathBuf>,
        /// Which of its tools need the host's approval per call.
        #[serde(default, rename = "requireApproval")]
        require_approval: RequireApproval,
    },
}

/// Which of a server's tools need approval before each call
/// ([`ToolAnnotations::requires_approval`]): `true` (all), `false` (none,
/// the default) or a list of the server's own tool names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RequireApproval {
    /// All of them, or none.
    All(bool),
    /// These (unprefixed) names.
    Tools(Vec<String>),
}

impl Default for RequireApproval {
    fn default() -> Self {
        RequireApproval::All(false)
    }
}

impl RequireApproval {
    /// Whether the server's tool `name` needs approval.
    fn covers(&self, name: &str) -> bool {
        match self {
            RequireApproval::All(all) => *all,
            RequireApproval::Tools(names) => names.iter().any(|n| n == name),
        }
    }
}

impl UpstreamConfig {
    fn require_approval(&self) -> &RequireApproval {
        match self {
            UpstreamConfig::Stdio { require_approval, .. } | UpstreamConfig::Http { require_approval, .. } => {
                require_approval
            }
        }
    }
}

/// Why an upstream could not be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("upstream {server:?}: {reason}")]
pub struct UpstreamError {
    /// The server's name.
    pub server: String,
    /// What failed.
    pub reason: String,
    /// The error underneath (a spawn, the handshake, a header), if any.
    #[source]
    pub cause: Option<Cause>,
}

impl UpstreamError {
    /// What failed and every cause under it, in one line (no server name).
    pub fn explain(&self) -> String {
        match &self.cause {
            Some(cause) => format!("{}: {}", self.reason, with_causes(cause)),
            None => self.reason.clone(),
        }
    }
}

/// Why an `mcpServers` document cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UpstreamsConfigError {
    /// It is not JSON of the expected shape.
    #[error("not an mcpServers document")]
    NotMcpServers(#[source] serde_json::Error),
    /// A server's name cannot be a tools' namespace.
    #[error("server name {0:?}: it becomes the tools' namespace, so it must be an identifier ([A-Za-z_][A-Za-z0-9_]*)")]
    BadServerName(String),
}

/// One server's failure to connect: what failed, and the error underneath.
struct Failed {
    reason: String,
    cause: Option<Cause>,
}

impl Failed {
    fn because(
        reason: impl Into<String>,
        cause: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        Failed { reason: reason.into(), cause: Some(Cause::new(cause)) }
    }
}

/// How long connecting to one server and listing its tools may take.
const CONNECT_LIMIT: Duration = Duration::from_secs(30);

/// The connected upstream servers. Dropping the last handle disconnects
/// them (a stdio server's process is killed).
#[derive(Clone, Default)]
pub struct Upstreams {
    services: Arc<Vec<(String, RunningService<RoleClient, ()>)>>,
    tools: Vec<Tool>,
}

impl std::fmt::Debug for Upstreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstreams")
            .field("servers", &self.services.iter().map(|(n, _)| n).collect::<Vec<_>>())
            .field("tools", &self.tools.len())
            .finish()
    }
}

impl UpstreamsConfig {
    /// Reads an `mcpServers` document.
    pub fn from_json(text: &str) -> Result<Self, UpstreamsConfigError> {
        let config: UpstreamsConfig = serde_json::from_str(text).map_err(UpstreamsConfigError::NotMcpServers)?;
        for name in config.servers.keys() {
            let mut chars = name.bytes();
            let identifier = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == b'_')
                && name.len() <= 64;
            if !identifier {
                return Err(UpstreamsConfigError::BadServerName(name.clone()));
            }
        }
        Ok(config)
    }
}

impl Upstreams {
    /// Connects to every server of `config` (each within 30 s) and lists
    /// its tools. The connections live on execbox's tool runtime, whatever
    /// runtime (if any) calls this. Every server that fails is an error of
    /// its own; the ones that connected are returned anyway.
    pub fn connect(config: &UpstreamsConfig) -> (Upstreams, Vec<UpstreamError>) {
        let Some(runtime) = super::bridge::tool_runtime() else {
            let errors = config
                .servers
                .keys()
                .map(|server| UpstreamError { server: server.clone(), reason: "no tool runtime".into(), cause: None })
                .collect();
            return (Upstreams::default(), errors);
        };
        let servers: Vec<(String, UpstreamConfig)> =
            config.servers.iter().map(|(n, c)| (n.clone(), c.clone())).collect();
        let (tx, rx) = std::sync::mpsc::channel();
        runtime.spawn(async move {
            let mut services = Vec::new();
            let mut tools = Vec::new();
            let mut errors = Vec::new();
            for (name, server) in servers {
                match tokio::time::timeout(CONNECT_LIMIT, connect_one(&name, &server)).await {
                    Ok(Ok((service, listed))) => {
                        tools.extend(listed);
                        services.push((name, service));
                    }
                    Ok(Err(Failed { reason, cause })) => errors.push(UpstreamError { server: name, reason, cause }),
                    Err(_) => errors.push(UpstreamError {
                        server: name,
                        reason: format!("did not connect and list its tools within {} s", CONNECT_LIMIT.as_secs()),
                        cause: None,
                    }),
                }
            }
            let _ = tx.send((Upstreams { services: Arc::new(services), tools }, errors));
        });
        rx.recv().unwrap_or_else(|_| (Upstreams::default(), Vec::new()))
    }

    /// The names of the connected servers.
    pub fn servers(&self) -> Vec<&str> {
        self.services.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// A registry of the upstreams' tools (to merge with the host's own).
    pub fn registry(&self) -> Result<ToolRegistry, super::registry::RegistryError> {
        self.tools.iter().cloned().fold(ToolRegistry::builder(), |b, t| b.add_tool(t)).build()
    }
}

/// Connects to one server and lists its tools as execbox tools.
async fn connect_one(
    name: &str,
    server: &UpstreamConfig,
) -> Result<(RunningService<RoleClient, ()>, Vec<Tool>), Failed> {
    let service = match server {
        UpstreamConfig::Stdio { command, args, env, .. } => {
            let mut cmd = tokio::process::Command::new(command);
            cmd.args(args).env_clear();
            for keep in ["PATH", "HOME"] {
                if let Some(value) = std::env::var_os(keep) {
                    cmd.env(keep, value);
                }
            }
            cmd.envs(env).kill_on_drop(true);
            let (transport, stderr) = rmcp::transport::TokioChildProcess::builder(cmd)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| Failed::because(format!("cannot start {command}"), e))?;
            if let Some(stderr) = stderr {
                tokio::spawn(log_stderr(name.to_string(), stderr));
            }
            ().serve(transport).await.map_err(|e| Failed::because("MCP handshake failed", e))?
        }
        UpstreamConfig::Http { url, headers, bearer_token_file, .. } => {
            use rmcp::transport::StreamableHttpClientTransport;
            use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
            let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
            if let Some(path) = bearer_token_file {
                let token = std::fs::read_to_string(path)
                    .map_err(|e| Failed::because(format!("bearerTokenFile {}", path.display()), e))?;
                config.auth_header = Some(token.trim().to_string());
            }
            for (header, value) in headers {
                let header = http::HeaderName::try_from(header.as_str())
                    .map_err(|e| Failed::because(format!("header {header}"), e))?;
                let value =
                    http::HeaderValue::try_from(value.as_str()).map_err(|e| Failed::because("header value", e))?;
                config.custom_headers.insert(header, value);
            }
            let transport = StreamableHttpClientTransport::from_config(config);
            ().serve(transport).await.map_err(|e| Failed::because("MCP handshake failed", e))?
        }
    };
    let listed = service.peer().list_all_tools().await.map_err(|e| Failed::because("cannot list its tools", e))?;
    let mut tools = Vec::new();
    for tool in listed {
        let full = format!("{name}.{}", tool.name);
        let annotations = tool.annotations.as_ref();
        let spec = ToolSpec::new(&full)
            .description(tool.description.as_deref().unwrap_or_default())
            .input_schema(Value::Object((*tool.input_schema).clone()))
            .annotations(
                ToolAnnotations::default()
                    .read_only(annotations.and_then(|a| a.read_only_hint).unwrap_or(false))
                    .destructive(annotations.and_then(|a| a.destructive_hint).unwrap_or(false))
                    .requires_approval(server.require_approval().covers(&tool.name)),
            );
        let spec = match &tool.output_schema {
            Some(schema) => spec.output_schema(Value::Object((**schema).clone())),
            None => spec,
        };
        let peer = service.peer().clone();
        let upstream_name = tool.name.to_string();
        let handler = move |args: Value| {
            let peer = peer.clone();
            let upstream_name = upstream_name.clone();
            let full = full.clone();
            async move {
                let arguments = match args {
                    Value::Object(map) => Some(map),
                    _ => None,
                };
                let mut params = CallToolRequestParams::new(upstream_name.clone());
                if let Some(arguments) = arguments {
                    params = params.with_arguments(arguments);
                }
                // Dropped (the run ended, the call timed out): rmcp cancels it upstream.
                match peer.call_tool(params).await {
                    Ok(result) => from_call_result(&full, result),
                    Err(e) => Err(ToolError::new(&full, ToolErrorKind::Unavailable, format!("upstream: {e}"))),
                }
            }
        };
        tools.push(Tool::lenient(spec, Arc::new(handler)));
    }
    Ok((service, tools))
}

/// A stdio server's stderr, as debug events of the log (never on
/// execbox's own stderr, which may be a client's channel).
async fn log_stderr(server: String, mut stderr: tokio::process::ChildStderr) {
    use tokio::io::AsyncReadExt;
    let mut chunk = vec![0u8; 4096];
    while let Ok(n @ 1..) = stderr.read(&mut chunk).await {
        let text = String::from_utf8_lossy(&chunk[..n]);
        tracing::debug!(upstream = %server, stderr = %text.trim_end(), "upstream stderr");
    }
}

/// A call's result as a JSON value: its structured content if any, else
/// its text (parsed as JSON when it is JSON), else its content blocks.
fn from_call_result(tool: &str, result: CallToolResult) -> Result<Value, ToolError> {
    let texts: Vec<String> = result
        .content
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text(text) => Some(text.text.clone()),
            _ => None,
        })
        .collect();
    if result.is_error == Some(true) {
        return Err(ToolError::failed(tool, texts.join("\n")));
    }
    if let Some(structured) = result.structured_content {
        return Ok(structured);
    }
    match texts.as_slice() {
        [one] => Ok(serde_json::from_str(one).unwrap_or_else(|_| Value::String(one.clone()))),
        [] => Ok(serde_json::to_value(&result.content).unwrap_or(Value::Null)),
        many => Ok(Value::Array(many.iter().map(|t| Value::String(t.clone())).collect())),
    }
}
