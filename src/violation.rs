//! [`Violation`]: one control a backend cannot enforce for a request, and
//! the [`Control`] it is about. A leaf: refusals, matching and sessions
//! all speak it.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The control a violation is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Control {
    /// The request's language.
    Language,
    /// The request's payload form.
    Payload,
    /// Structured JSON input.
    JsonInput,
    /// Standard input.
    Stdin,
    /// Command-line arguments.
    Args,
    /// Input files.
    InputFiles,
    /// Returned output files.
    OutputFiles,
    /// Network access.
    Network,
    /// Filesystem access.
    Filesystem,
    /// Environment variables.
    Environment,
    /// Wall-clock deadline.
    Timeout,
    /// Memory cap.
    Memory,
    /// Instruction / fuel budget.
    Fuel,
    /// Stdout cap.
    StdoutCap,
    /// Stderr cap.
    StderrCap,
    /// Process count cap.
    Processes,
    /// Third-party packages the code needs (e.g. Python's numpy).
    Packages,
    /// Host tools the code may call.
    Tools,
    /// A workspace seen read-write at `/work`, within its quota.
    Workspace,
    /// A program that keeps running after the call that started it.
    Programs,
}

impl Control {
    /// Stable snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Control::Language => "language",
            Control::Payload => "payload",
            Control::JsonInput => "json_input",
            Control::Stdin => "stdin",
            Control::Args => "args",
            Control::InputFiles => "input_files",
            Control::OutputFiles => "output_files",
            Control::Network => "network",
            Control::Filesystem => "filesystem",
            Control::Environment => "environment",
            Control::Timeout => "timeout",
            Control::Memory => "memory",
            Control::Fuel => "fuel",
            Control::StdoutCap => "stdout_cap",
            Control::StderrCap => "stderr_cap",
            Control::Processes => "processes",
            Control::Packages => "packages",
            Control::Tools => "tools",
            Control::Workspace => "workspace",
            Control::Programs => "programs",
        }
    }
}

/// One control a backend cannot enforce for a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// Which control.
    pub control: Control,
    /// What the request asked for.
    pub requested: String,
    /// Why the backend cannot provide it.
    pub reason: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.control.as_str(), self.requested, self.reason)
    }
}
