//! The `wasm` backend: WebAssembly guest modules in-process on wasmtime.
//!
//! Two guest ABIs, chosen from the module's exports:
//! - **WASI preview-1 commands** (`_start`): stdin from the request (or the
//!   JSON `input` when no stdin is given), argv, env only from the request's
//!   allow-listed values, capped stdout/stderr, exit code from `proc_exit`.
//! - **JSON ABI** reactors (`memory`, `alloc(len) -> ptr`,
//!   `run(ptr, len) -> (out_ptr << 32) | out_len`, optional `_initialize`):
//!   `input` goes in as UTF-8 JSON, the returned bytes must be UTF-8 JSON and
//!   become `output`. Such a guest may import WASI too (stderr for logs).
//!
//! What holds against a hostile guest:
//! - **compile**: static [`ModuleLimits`] (functions, body sizes, nesting,
//!   locals) checked with wasmparser before Cranelift sees the module; the
//!   compile counts against the run's deadline (see `compile.rs`).
//! - **fuel**: wasmtime fuel (≈1 unit per wasm instruction) → `out_of_fuel`.
//! - **deadline**: epoch interruption from one ticker thread per engine,
//!   preemptive in wasm code; `poll_oneoff` sleeps end at the deadline →
//!   `timed_out`. Every run has a deadline (the policy's, else
//!   [`WasmGuestConfig::defaults`]' `timeout`), started at admission, before
//!   its module is looked up or compiled.
//! - **memory**: a per-store [`ResourceLimiter`](wasmtime::ResourceLimiter):
//!   `memory.grow` past the cap (the policy's, else
//!   [`WasmGuestConfig::defaults`]' `memory_bytes`, at most
//!   [`WasmGuestConfig::max_memory_bytes`]) returns -1 (the guest sees an
//!   allocation failure); a run that then fails is `out_of_memory`. Never a
//!   host abort.
//! - **files**: only preopened directories (cap-std's primitives inside
//!   wasmtime-wasi): `..` and symlinks cannot leave a preopen, read-only
//!   grants refuse writes; guests cannot create symlinks, and FIFOs, sockets
//!   and devices are refused at open (`fs_guard.rs`). **network**: WASI
//!   preview 1 cannot open sockets.
//! - **output**: stdout/stderr through the shared bounded buffer.
//!
//! **Code Mode** (a policy that grants tools, see [`crate::tools`]): every
//! backend here carries the run's tool bridge. A guest of [`WasmGuest`]
//! imports the `execbox_tools` module (`call`/`result`, JSON in and out; the
//! ABI is in `tool_import.rs`, an example guest in `guests/c/tool_caller.c`).
//! Code on the interpreters gets a `tools` API (Python: `import tools`;
//! JavaScript: the `tools` global) whose calls travel over the instance's
//! stdio: a record on stdout taken out by the host's tap, the answer as a
//! message on stdin (see `tool_channel.rs`), since the prebuilt interpreter
//! modules cannot import host functions.
//!
//! Modules are compiled once per sha256 (memory cache, optional disk cache)
//! and kept as `InstancePre`; instances come from the pooling allocator of a
//! [`WasmEngine`] that the wasm backends of a matrix share.
//!
//! **The backends.** [`WasmGuest`] (`wasm`) runs a request's module;
//! [`WasmInterpreter`] runs Python (`python-wasm`, with [`PythonSession`]s)
//! or JavaScript (`quickjs-wasm`) on an interpreter compiled to wasm. Each
//! has `new(config)` (an engine of its own) and `on_engine` (a shared one):
//!
//! ```no_run
//! use execbox::backends::wasm::{InterpreterConfig, Interpreter, WasmEngine, WasmGuest, WasmGuestConfig, WasmInterpreter};
//! # fn main() -> Result<(), execbox::error::ConfigError> {
//! let engine = WasmEngine::new(WasmGuestConfig::default().pooled_instances(16))?;
//! let wasm = WasmGuest::on_engine(engine.clone());
//! let python = WasmInterpreter::on_engine(engine.clone(), InterpreterConfig::default().warm_pool(1));
//! let quickjs = WasmInterpreter::on_engine(engine, InterpreterConfig::default().kind(Interpreter::QuickJs));
//! # Ok(()) }
//! ```
//!
//! **Layout.** This file is the front door (module list and public names
//! only). `config.rs` has the settings; `guest.rs` the types every run
//! shares (store data, compiled modules, run controls); `engine.rs` the
//! engine and its slots; `linker.rs` and `fs_guard.rs` the WASI functions;
//! `compile.rs`, `disk_cache.rs`, `module_limits.rs` and `compile_worker.rs`
//! the way from bytes to a ready module; `run.rs` one run; `staging.rs` the
//! files a run sees; `guest_backend.rs` and `interpreters.rs` the backends
//! (with `warm.rs`, `quickjs.rs` and `session.rs` for the interpreters);
//! `tool_import.rs` and `tool_channel.rs` carry tool calls (Code Mode).

mod capabilities;
mod compile;
pub(crate) mod compile_worker;
pub(crate) mod config;
mod disk_cache;
pub(crate) mod engine;
mod fs_guard;
mod guest;
pub(crate) mod guest_backend;
pub(crate) mod interpreters;
mod linker;
mod module_limits;
mod priority;
mod quickjs;
mod run;
pub(crate) mod session;
mod staging;
mod stdio;
mod ticker;
mod tool_channel;
mod tool_import;
mod warm;

pub use compile::CacheStats;
pub use config::{Interpreter, InterpreterConfig, WasmGuestConfig, interpreters_dir};
pub use engine::WasmEngine;
pub use guest_backend::WasmGuest;
pub use interpreters::WasmInterpreter;
pub use module_limits::ModuleLimits;
pub use session::PythonSession;
