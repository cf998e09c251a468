//! [`ExecRequest`]: code, its inputs, and the policy it must run under.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::capabilities::PayloadKind;
use crate::file::ExecFile;
use crate::language::Language;
use crate::limits::output::OutputTap;
use crate::policy::SandboxPolicy;
use crate::schema::JsonSchema;

/// The code to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Payload {
    /// Source text.
    Source(String),
    /// WebAssembly module bytes (binary or WAT text).
    WasmModule(Vec<u8>),
}

impl Payload {
    /// The payload's form.
    pub fn kind(&self) -> PayloadKind {
        match self {
            Payload::Source(_) => PayloadKind::Source,
            Payload::WasmModule(_) => PayloadKind::WasmModule,
        }
    }

    /// Size in bytes, the quantity `max_code_bytes` limits.
    pub fn len(&self) -> usize {
        match self {
            Payload::Source(s) => s.len(),
            Payload::WasmModule(b) => b.len(),
        }
    }

    /// True for an empty payload.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One execution request. Build with a language constructor and chain setters:
///
/// ```
/// use execbox::{ExecRequest, SandboxPolicy};
/// let req = ExecRequest::javascript("return input.x + 1;")
///     .input(serde_json::json!({"x": 41}))
///     .policy(SandboxPolicy::strict());
/// ```
///
/// In JSON (serde, both ways):
/// `{"language", "code" | "module_base64", "input", "stdin_base64", "args",
/// "env", "input_files", "collect_output_files", "policy", "backend",
/// "packages"}`.
/// Only `language` and one of `code` / `module_base64` are required; a
/// missing `policy` is [`SandboxPolicy::strict`] (and a policy's missing
/// fields take strict's values). `code` with language `wasm` is WAT text.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(into = "RequestJson", try_from = "RequestJson")]
#[non_exhaustive]
pub struct ExecRequest {
    /// Language of the payload.
    pub language: Language,
    /// The code.
    pub payload: Payload,
    /// Structured input, visible to the code (JS: the `input` binding).
    pub input: Option<Value>,
    /// Standard input bytes.
    pub stdin: Option<Vec<u8>>,
    /// Command-line arguments (after the program name).
    pub args: Vec<String>,
    /// Environment values; names must be in the policy's environment allow-list.
    pub env: BTreeMap<String, String>,
    /// Files staged for the code.
    pub input_files: Vec<ExecFile>,
    /// Return the files the code writes to its output directory as
    /// [`ExecResult::output_files`](crate::result::ExecResult::output_files).
    pub collect_output_files: bool,
    /// What the run must be held to.
    pub policy: SandboxPolicy,
    /// Run on this backend only (by name), instead of letting the executor pick.
    pub backend: Option<String>,
    /// Third-party packages the code needs (Python: import names such as
    /// `numpy`, `pandas`, `matplotlib`). Only a backend that provides every
    /// one is chosen; names are `[A-Za-z0-9_.-]`, at most 64 of them.
    pub packages: Vec<String>,
    /// Sees stdout and stderr while the run writes them (never in JSON).
    /// Backends that capture output in this process call it as bytes
    /// arrive (`wasm`, `python-wasm`, `quickjs-wasm`, `container`); `boa-js`
    /// runs in a worker process and delivers its console output with the
    /// result only.
    pub output_tap: Option<OutputTap>,
    /// When the run's deadline starts counting, if before admission: a
    /// caller that queued the request (a server's run slot) set it, so the
    /// wait counts against the deadline (never in JSON). See
    /// [`ExecRequest::deadline_from`].
    pub(crate) deadline_from: Option<std::time::Instant>,
    /// Decides this run's calls to tools that require approval, in place of
    /// the registry's approver (never in JSON). `execbox serve` sets one
    /// that asks its client (MCP elicitation).
    pub tool_approver: Option<crate::tools::ToolApprover>,
    /// The run's scope (never in JSON, never from the code: the host
    /// sets it): the tools that keep state per caller — the
    /// artifact store's `artifacts.*` — keep this run's under it, and a run
    /// whose policy spills output ([`SandboxPolicy::spill_output`]) keeps
    /// the whole stdout there. A session's cells get
    /// `session:<the session's id>` unless their caller set one. Two runs
    /// with the same scope share their artifacts; a run without one has no
    /// artifacts (the tools answer `unavailable`).
    pub artifact_scope: Option<String>,
    /// What the run's structured output must match: a run that ends `ok`
    /// with an output that does not (or with no output) ends
    /// [`Outcome::InvalidOutput`](crate::result::Outcome::InvalidOutput),
    /// its [`ExecResult::output_errors`](crate::result::ExecResult::output_errors)
    /// naming each failing place. Checked in the one finish path, for
    /// every backend alike.
    pub output_schema: Option<JsonSchema>,
    /// Who asked (an agent framework's invocation id): carried into the
    /// run's tracing span as `invocation`, never interpreted.
    pub invocation_id: Option<String>,
    /// The workspace the run sees read-write at `/work` (never in JSON):
    /// its files outlive the run, its quota holds the run's writes. Only
    /// backends that enforce [`BackendCapabilities::workspace`](crate::capabilities::BackendCapabilities::workspace)
    /// run it. See [`ExecRequest::workspace`].
    pub workspace: Option<crate::workspace::Workspace>,
}

impl ExecRequest {
    /// A request with the strict policy and no inputs.
    pub fn new(language: Language, payload: Payload) -> Self {
        Self {
            language,
            payload,
            input: None,
            stdin: None,
            args: Vec::new(),
            env: BTreeMap::new(),
            input_files: Vec::new(),
            collect_output_files: false,
            policy: SandboxPolicy::strict(),
            backend: None,
            packages: Vec::new(),
            output_tap: None,
            deadline_from: None,
            tool_approver: None,
            artifact_scope: None,
            output_schema: None,
            invocation_id: None,
            workspace: None,
        }
    }

    /// JavaScript source: a function body where `input` is bound and `return` sets the output.
    pub fn javascript(source: impl Into<String>) -> Self {
        Self::new(Language::JavaScript, Payload::Source(source.into()))
    }

    /// Source code in `language`.
    pub fn source(language: Language, source: impl Into<String>) -> Self {
        Self::new(language, Payload::Source(source.into()))
    }

    /// A WebAssembly module (binary or WAT).
    pub fn wasm(module: impl Into<Vec<u8>>) -> Self {
        Self::new(Language::Wasm, Payload::WasmModule(module.into()))
    }

    /// Sets the structured input.
    pub fn input(mut self, input: Value) -> Self {
        self.input = Some(input);
        self
    }

    /// Sets standard input.
    pub fn stdin(mut self, bytes: impl Into<Vec<u8>>) -> Self {
        self.stdin = Some(bytes.into());
        self
    }

    /// Appends a command-line argument.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Sets an environment variable (its name must be allowed by the policy).
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(name.into(), value.into());
        self
    }

    /// Stages an input file.
    pub fn input_file(mut self, file: ExecFile) -> Self {
        self.input_files.push(file);
        self
    }

    /// Asks for the files the code writes to its output directory.
    pub fn collect_output_files(mut self) -> Self {
        self.collect_output_files = true;
        self
    }

    /// Sets the policy.
    pub fn policy(mut self, policy: SandboxPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Streams the run's output to `tap` as it is written (see [`ExecRequest::output_tap`]).
    pub fn tap_output(mut self, tap: OutputTap) -> Self {
        self.output_tap = Some(tap);
        self
    }

    /// Declares the packages the code needs (see [`ExecRequest::packages`]).
    pub fn packages<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.packages.extend(names.into_iter().map(Into::into));
        self
    }

    /// Decides this run's tool approvals with `approver` (see
    /// [`ExecRequest::tool_approver`]).
    pub fn approve_tools_with(mut self, approver: crate::tools::ToolApprover) -> Self {
        self.tool_approver = Some(approver);
        self
    }

    /// Gives the run the scope `scope` (see [`ExecRequest::artifact_scope`]).
    pub fn artifact_scope(mut self, scope: impl Into<String>) -> Self {
        self.artifact_scope = Some(scope.into());
        self
    }

    /// Counts the run's deadline from `instant` (e.g. when the caller began
    /// waiting for a slot to run it) instead of from admission: time spent
    /// waiting is time the run does not get.
    pub fn deadline_from(mut self, instant: std::time::Instant) -> Self {
        self.deadline_from = Some(instant);
        self
    }

    /// Pins the request to the backend called `name`.
    pub fn on_backend(mut self, name: impl Into<String>) -> Self {
        self.backend = Some(name.into());
        self
    }

    /// Requires the output to match `schema` (see [`ExecRequest::output_schema`]).
    pub fn output_schema(mut self, schema: JsonSchema) -> Self {
        self.output_schema = Some(schema);
        self
    }

    /// Carries `id` into the run's span (see [`ExecRequest::invocation_id`]).
    pub fn invocation_id(mut self, id: impl Into<String>) -> Self {
        self.invocation_id = Some(id.into());
        self
    }

    /// Runs in `workspace`: seen read-write at `/work`, where the request's
    /// input files (and `input.json`, if it has an input) are written before
    /// the run; what the code leaves there stays for the next run, on any
    /// backend that carries files.
    pub fn workspace(mut self, workspace: &crate::workspace::Workspace) -> Self {
        self.workspace = Some(workspace.clone());
        self
    }
}

/// [`ExecRequest`]'s JSON shape.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestJson {
    language: Language,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "base64_opt")]
    module_base64: Option<Vec<u8>>,
    #[serde(default)]
    input: Option<Value>,
    #[serde(default, with = "base64_opt")]
    stdin_base64: Option<Vec<u8>>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    input_files: Vec<ExecFile>,
    #[serde(default)]
    collect_output_files: bool,
    #[serde(default)]
    policy: SandboxPolicy,
    #[serde(default)]
    backend: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    packages: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    output_schema: Option<JsonSchema>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    invocation_id: Option<String>,
}

impl From<ExecRequest> for RequestJson {
    fn from(r: ExecRequest) -> Self {
        let (code, module_base64) = match r.payload {
            Payload::Source(code) => (Some(code), None),
            Payload::WasmModule(bytes) => (None, Some(bytes)),
        };
        RequestJson {
            language: r.language,
            code,
            module_base64,
            input: r.input,
            stdin_base64: r.stdin,
            args: r.args,
            env: r.env,
            input_files: r.input_files,
            collect_output_files: r.collect_output_files,
            policy: r.policy,
            backend: r.backend,
            packages: r.packages,
            output_schema: r.output_schema,
            invocation_id: r.invocation_id,
        }
    }
}

impl TryFrom<RequestJson> for ExecRequest {
    type Error = &'static str;
    fn try_from(j: RequestJson) -> Result<Self, Self::Error> {
        let payload = match (j.code, j.module_base64, j.language) {
            (Some(code), None, Language::Wasm) => Payload::WasmModule(code.into_bytes()),
            (Some(code), None, _) => Payload::Source(code),
            (None, Some(bytes), Language::Wasm) => Payload::WasmModule(bytes),
            (None, Some(_), _) => return Err("module_base64 is only for language wasm"),
            _ => return Err("give exactly one of code and module_base64"),
        };
        Ok(ExecRequest {
            language: j.language,
            payload,
            input: j.input,
            stdin: j.stdin_base64,
            args: j.args,
            env: j.env,
            input_files: j.input_files,
            collect_output_files: j.collect_output_files,
            policy: j.policy,
            backend: j.backend,
            packages: j.packages,
            output_tap: None,
            deadline_from: None,
            tool_approver: None,
            artifact_scope: None,
            output_schema: j.output_schema,
            invocation_id: j.invocation_id,
            workspace: None,
        })
    }
}

/// Serde for optional byte contents as standard base64 text.
mod base64_opt {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &Option<Vec<u8>>, serializer: S) -> Result<S::Ok, S::Error> {
        match bytes {
            Some(bytes) => crate::file::base64_bytes::serialize(bytes, serializer),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Vec<u8>>, D::Error> {
        #[derive(Deserialize)]
        struct Wrapped(#[serde(with = "crate::file::base64_bytes")] Vec<u8>);
        Ok(Option::<Wrapped>::deserialize(deserializer)?.map(|Wrapped(bytes)| bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_file_content_is_base64_in_json() {
        let file = ExecFile { name: "a.bin".into(), content: vec![0, 255, 10], mime_type: None };
        let text = serde_json::to_string(&file).unwrap();
        assert_eq!(text, r#"{"name":"a.bin","mime_type":null,"size":3,"content":"AP8K"}"#);
        assert_eq!(serde_json::from_str::<ExecFile>(&text).unwrap(), file);
        assert_eq!(serde_json::from_str::<ExecFile>(r#"{"name":"a.bin","content":"AP8K"}"#).unwrap(), file);
        assert!(serde_json::from_str::<ExecFile>(r#"{"name":"a","content":"%%","mime_type":null}"#).is_err());
        assert!(serde_json::from_str::<ExecFile>(r#"{"name":"a.bin","size":4,"content":"AP8K"}"#).is_err());
        assert!(ExecFile::new("a/", "x").relative_path().is_err(), "a directory name is not a file");
        assert!(ExecFile::new("a/b", "x").relative_path().is_ok());
    }

    #[test]
    fn requests_round_trip_through_json() {
        let js = ExecRequest::javascript("return input")
            .input(serde_json::json!({"a": [1]}))
            .stdin(vec![0u8, 1])
            .arg("x")
            .input_file(ExecFile::new("in.csv", "a,b"))
            .on_backend("boa-js");
        let wasm = ExecRequest::wasm(vec![0u8, 97, 115, 109]).collect_output_files();
        for request in [js, wasm] {
            let text = serde_json::to_string(&request).unwrap();
            assert_eq!(serde_json::from_str::<ExecRequest>(&text).unwrap(), request, "{text}");
        }
        let minimal: ExecRequest = serde_json::from_str(r#"{"language": "python", "code": "print(1)"}"#).unwrap();
        assert_eq!(minimal, ExecRequest::source(Language::Python, "print(1)"));
        let wat: ExecRequest = serde_json::from_str(r#"{"language": "wasm", "code": "(module)"}"#).unwrap();
        assert_eq!(wat.payload, Payload::WasmModule(b"(module)".to_vec()));
        for bad in [
            r#"{"language": "python"}"#,
            r#"{"language": "python", "code": "1", "module_base64": "AA=="}"#,
            r#"{"language": "python", "module_base64": "AA=="}"#,
            r#"{"language": "python", "code": "1", "polcy": {}}"#,
        ] {
            assert!(serde_json::from_str::<ExecRequest>(bad).is_err(), "{bad}");
        }
    }
}
