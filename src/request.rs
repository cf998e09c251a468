//! [`ExecRequest`]: code, its inputs, and the policy it must run under.

use std::collections::BTreeMap;
use std::path::{Component, Path};

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::capabilities::{Language, PayloadKind};
use crate::error::InvalidRequest;
use crate::policy::SandboxPolicy;

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

/// A named file handed to or produced by the code. In JSON, `content` is base64.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecFile {
    /// Path relative to the working directory; never absolute, never `..`.
    pub name: String,
    /// File contents.
    #[serde(with = "base64_bytes")]
    pub content: Vec<u8>,
    /// MIME type, if known.
    pub mime_type: Option<String>,
}

impl ExecFile {
    /// A file with no MIME type.
    pub fn new(name: impl Into<String>, content: impl Into<Vec<u8>>) -> Self {
        Self { name: name.into(), content: content.into(), mime_type: None }
    }

    /// The JSON shape used in results: name, MIME type, size, base64 content.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "name": self.name,
            "mime_type": self.mime_type,
            "size": self.content.len(),
            "content": base64::engine::general_purpose::STANDARD.encode(&self.content),
        })
    }

    /// The file's name as a path under a staging directory: relative, no
    /// `..`, no root or prefix components, not empty.
    pub fn relative_path(&self) -> Result<&Path, InvalidRequest> {
        let path = Path::new(&self.name);
        let bad = |reason: &str| InvalidRequest::BadPath { path: self.name.clone(), reason: reason.into() };
        if self.name.is_empty() {
            return Err(bad("file name is empty"));
        }
        if !path.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir)) {
            return Err(bad("file names must be relative, without `..`"));
        }
        if path.components().all(|c| matches!(c, Component::CurDir)) {
            return Err(bad("file name names no file"));
        }
        Ok(path)
    }
}

/// Serde for byte contents as standard base64 text.
mod base64_bytes {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        STANDARD.decode(text.as_bytes()).map_err(serde::de::Error::custom)
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
#[derive(Clone, Debug, PartialEq)]
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
    /// [`ExecResult::output_files`](crate::ExecResult::output_files).
    pub collect_output_files: bool,
    /// What the run must be held to.
    pub policy: SandboxPolicy,
    /// Run on this backend only (by name), instead of letting the executor pick.
    pub backend: Option<String>,
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

    /// Pins the request to the backend called `name`.
    pub fn on_backend(mut self, name: impl Into<String>) -> Self {
        self.backend = Some(name.into());
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_file_content_is_base64_in_json() {
        let file = ExecFile { name: "a.bin".into(), content: vec![0, 255, 10], mime_type: None };
        let text = serde_json::to_string(&file).unwrap();
        assert_eq!(text, r#"{"name":"a.bin","content":"AP8K","mime_type":null}"#);
        assert_eq!(serde_json::from_str::<ExecFile>(&text).unwrap(), file);
        assert!(serde_json::from_str::<ExecFile>(r#"{"name":"a","content":"%%","mime_type":null}"#).is_err());
    }
}
