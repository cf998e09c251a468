//! `execbox serve` through the official MCP Python SDK (`mcp` on PyPI), as
//! agents in Python use it: stdio and streamable HTTP with a bearer token,
//! streamed output, progress, sessions (tests/mcp_client.py).
//!
//! Needs `scripts/install-mcp-client.sh`; skips without it unless
//! `EXECBOX_REQUIRE_MCP_CLIENT=1` (as in CI), which makes it fail instead.
#![cfg(all(feature = "serve", feature = "js", feature = "wasm"))]

use std::path::PathBuf;

fn venv_python() -> PathBuf {
    let venv = std::env::var_os("EXECBOX_MCP_VENV").map(PathBuf::from).unwrap_or_else(|| {
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache"));
        cache.join("execbox/mcp-venv")
    });
    venv.join("bin/python")
}

#[test]
fn the_python_sdk_drives_the_server_over_stdio_and_http() {
    let python = venv_python();
    if !python.exists() {
        assert!(
            std::env::var("EXECBOX_REQUIRE_MCP_CLIENT").is_err(),
            "EXECBOX_REQUIRE_MCP_CLIENT is set but {} is missing: run scripts/install-mcp-client.sh",
            python.display()
        );
        eprintln!("skipping: no MCP Python SDK (scripts/install-mcp-client.sh)");
        return;
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_client.py");
    let out = std::process::Command::new(python)
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_execbox"))
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
