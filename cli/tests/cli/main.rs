//! The `execbox` binary from the outside, in one test binary: the `run` and
//! `backends` commands (`run`), `execbox serve` through rmcp's client
//! (`serve`) and through the official MCP SDKs (`mcp_sdks`: Python, with
//! the scripts `cli/tests/mcp_*.py`, and TypeScript, `cli/tests/mcp_ts_client.mjs`)
//! and the official MCP conformance suite's server scenarios (`conformance`).

#[path = "../../../tests/common/mod.rs"]
mod common;

mod conformance;
mod mcp_sdks;
mod run;
mod serve;
