//! The `execbox` binary from the outside, in one test binary: the `run` and
//! `backends` commands (`run`), `execbox serve` through rmcp's client
//! (`serve`) and through the official MCP SDKs (`mcp_sdks`: Python, with
//! the scripts `cli/tests/mcp_*.py`, and TypeScript, `cli/tests/mcp_ts_client.mjs`),
//! the official MCP conformance suite's server scenarios (`conformance`),
//! and `execbox serve` as replicas on the test Kubernetes cluster
//! (`replicas`, feature `kubernetes`).

#[path = "../../../tests/common/mod.rs"]
mod common;

mod conformance;
mod mcp_sdks;
mod replicas;
mod run;
mod serve;
