//! The wasm backends in one test binary (one link of wasmtime and boa
//! instead of three): raw guests on `wasm` (`backend`), CPython and QuickJS
//! in wasm (`interpreters`), Code Mode on all of them (`code_mode`), and
//! `wasm` runs on the caller's async task (`async_path`).
//!
//! The wasm tests that count this process's threads, descriptors or temp
//! dirs, or change its environment, have binaries of their own
//! (`wasm_ticker`, `wasm_warm_pool`, `wasm_soak`).

#[path = "../common/mod.rs"]
mod common;

mod async_path;
mod backend;
mod code_mode;
mod interpreters;
