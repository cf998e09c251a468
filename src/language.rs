//! [`Language`]: what a request's code is written in (a leaf: refusals,
//! requests and capabilities all name it).

use std::fmt;

use serde::{Deserialize, Serialize};

/// A language (or payload family) a request is written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Language {
    /// JavaScript source: a function body, `input` in scope, `return` gives `output`.
    JavaScript,
    /// Python source.
    Python,
    /// Rust source.
    Rust,
    /// Shell script, run by bash in containers (POSIX sh scripts run as well).
    Shell,
    /// A WebAssembly module.
    Wasm,
}

impl Language {
    /// The identifier used by the CLI and in JSON (`javascript`, `python`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Language::JavaScript => "javascript",
            Language::Python => "python",
            Language::Rust => "rust",
            Language::Shell => "shell",
            Language::Wasm => "wasm",
        }
    }

    /// Parses a language id, accepting common aliases (`js`, `py`, `sh`, `rs`).
    pub fn from_id(id: &str) -> Option<Self> {
        Some(match id.to_ascii_lowercase().as_str() {
            "javascript" | "js" => Language::JavaScript,
            "python" | "py" | "python3" => Language::Python,
            "rust" | "rs" => Language::Rust,
            "shell" | "sh" | "bash" => Language::Shell,
            "wasm" | "webassembly" => Language::Wasm,
            _ => return None,
        })
    }
}

impl fmt::Display for Language {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
