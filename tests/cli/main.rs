//! The `execbox` binary from the outside, in one test binary: the `run` and
//! `backends` commands (`run`), `execbox serve` through rmcp's client
//! (`serve`) and through the MCP Python SDK (`mcp_python`, with the
//! scripts `tests/mcp_*.py`).

#[path = "../common/mod.rs"]
mod common;

mod mcp_python;
mod run;
mod serve;
