//! The library's API through its backends, in one test binary (one link of
//! wasmtime and boa instead of five): matching and selection
//! (`policy_matrix`), contained and in-thread boa (`js_backend`), the
//! container backend against a real engine (`container_backend`), the agent
//! layer (`agent`) and artifacts (`artifacts`).
//!
//! Tests that measure or count what belongs to this whole process (its
//! memory, threads, descriptors, zombies, the containers and temp dirs of
//! its owner token) have binaries of their own: `js_containment`,
//! `js_host_memory`, `code_mode_container`, `hostile_sessions`,
//! `python_sessions`, `container_soak`, `soak`.

#[path = "../common/mod.rs"]
mod common;

mod agent;
mod artifacts;
mod container_backend;
mod js_backend;
mod policy_matrix;
mod programs;
mod workspace;
