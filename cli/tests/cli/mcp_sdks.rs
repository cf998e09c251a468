//! `execbox serve` through the official MCP SDKs. Python (`mcp` on PyPI), as
//! agents in Python use it: stdio and streamable HTTP with a bearer token,
//! streamed output, progress, sessions (cli/tests/mcp_client.py); and Code
//! Mode against a real upstream server (cli/tests/mcp_code_mode.py).
//! TypeScript (`@modelcontextprotocol/sdk` on npm), as Node hosts start a
//! server: over a socket pair, not pipes (cli/tests/mcp_ts_client.mjs).
//!
//! Needs `scripts/install-mcp-client.sh` (and
//! `scripts/install-mcp-upstreams.sh`); skips without them unless
//! `EXECBOX_REQUIRE_MCP_CLIENT=1` (as in CI), which makes it fail instead.
#![cfg(all(feature = "serve", feature = "js", feature = "wasm"))]

use crate::common;

use std::path::PathBuf;

use common::skip::{self, installed};

fn venv_python() -> PathBuf {
    installed("EXECBOX_MCP_VENV", "mcp-venv").join("bin/python")
}

/// The reference upstream's entry point (scripts/install-mcp-upstreams.sh).
fn everything_server() -> PathBuf {
    installed("EXECBOX_MCP_UPSTREAMS", "mcp-upstreams")
        .join("node_modules/@modelcontextprotocol/server-everything/dist/index.js")
}

/// The official TypeScript SDK (scripts/install-mcp-upstreams.sh).
fn typescript_sdk() -> PathBuf {
    installed("EXECBOX_MCP_UPSTREAMS", "mcp-upstreams").join("node_modules/@modelcontextprotocol/sdk")
}

/// Whether `needed` exists; without it, skip (or fail when the client is required).
fn present(needed: &std::path::Path, install: &str) -> bool {
    let missing = || format!("{} is missing: run {install}", needed.display());
    skip::available(skip::MCP_CLIENT, if needed.exists() { Ok(()) } else { Err(missing()) })
}

/// Runs a client script with `interpreter`; it prints "ok" last when every
/// check held.
fn client_with(interpreter: &std::path::Path, script: &str, args: &[&std::ffi::OsStr]) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join(script);
    let out = std::process::Command::new(interpreter)
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_execbox"))
        .args(args)
        .env("PYTHONWARNINGS", "ignore")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim_end().ends_with("ok"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs a Python client script in the SDK's venv.
fn client(script: &str, args: &[&std::ffi::OsStr]) {
    client_with(&venv_python(), script, args)
}

#[test]
fn the_typescript_sdk_drives_the_server_over_a_socket_pair() {
    let sdk = typescript_sdk();
    if present(&sdk, "scripts/install-mcp-upstreams.sh") {
        client_with(std::path::Path::new("node"), "mcp_ts_client.mjs", &[sdk.as_os_str()]);
    }
}

#[test]
fn the_python_sdk_drives_the_server_over_stdio_and_http() {
    if present(&venv_python(), "scripts/install-mcp-client.sh") {
        client("mcp_client.py", &[]);
    }
}

#[test]
fn code_calls_a_real_upstream_servers_tools_with_approval_by_elicitation() {
    let everything = everything_server();
    if present(&venv_python(), "scripts/install-mcp-client.sh")
        && present(&everything, "scripts/install-mcp-upstreams.sh")
    {
        client("mcp_code_mode.py", &[everything.as_os_str()]);
    }
}
