//! JavaScript on `boa_engine`, two ways:
//!
//! | | [`BoaJs`] (`boa-js`, the default) | [`BoaJsInThread`] (`boa-js-inthread`, opt-in) |
//! |---|---|---|
//! | where | a worker process of execbox's own ([`crate::backends::worker`]) | a thread of the host process |
//! | isolation | [`IsolationKind::WorkerProcess`](crate::capabilities::IsolationKind::WorkerProcess): a crash, an abort or a runaway allocation ends the worker | [`IsolationKind::InProcess`](crate::capabilities::IsolationKind::InProcess): boa's faults are the host's |
//! | deadline | cooperative stop at the deadline, then `SIGKILL` | cooperative stop; code inside a native callback is abandoned and stopped by the instruction budget |
//! | memory cap | **enforced**: `RLIMIT_AS` of the worker = its size + the cap | **not enforced** (refused if asked) |
//! | syscalls | seccomp: read/write its pipes, memory, clocks, exit | the host's |
//! | cost | a socket round trip per call (see docs/performance.md) | a thread hand-off |
//!
//! What a request means is the same on both: the code is a function body,
//! `input` is bound to the request's JSON input, `return` sets the output (a
//! returned Promise is awaited; a body containing `await` runs as an `async`
//! function), `console.*` goes to stdout/stderr as one line per call
//! (strings as they are, other values as their JSON, like QuickJS's
//! bootstrap). A promise rejected with no handler fails the run. Local time
//! is UTC. There is no module loader, no timer, no file, network or process
//! API: network, filesystem, environment and processes are denied by
//! omission.
//!
//! **Code Mode** (see [`crate::tools`]): a run whose policy grants tools
//! gets two globals, on both backends and in sessions (per cell):
//!
//! ```text
//! await tools.ns.name({...})         // a granted tool: resolves to its value, rejects with a ToolError
//! await tools.call("ns.name", {...}) // any name (not an identifier, not granted: the host answers)
//! await tools.list()                 // the granted tools' names
//! await tools.describe("ns.name")    // a granted tool's spec (description, input_schema, ...)
//! try { ... } catch (e) { e instanceof ToolError; e.tool; e.kind; e.message }
//! ```
//!
//! `tools.<ns>` exists only for granted namespaces (a namespace called
//! `call`, `list` or `describe` is reached through `tools.call`); calls to
//! other names go to the host and come back `not_granted` or `not_found`.
//! `ToolError` is an `Error` subclass (`instanceof Error` holds), with
//! `.kind` one of [`ToolErrorKind`](crate::tools::ToolErrorKind)'s names;
//! code may make its own with `new ToolError(tool, kind, message)`.
//! Arguments (`undefined`/`null` mean `{}`) are converted to JSON once,
//! through the bounded snapshot `JSON.stringify` uses; arguments over the
//! policy's `max_argument_bytes` are refused (`invalid_arguments`) before
//! they leave the sandbox, so they are not in the ledger. Every call
//! returns a Promise at once and the calls run **concurrently** on the
//! host: `Promise.all` of several calls takes about as long as the
//! slowest, up to the policy's `max_concurrent` (the bridge refuses more
//! with `too_many_in_flight`; at most 256 calls of a run may wait for
//! answers at once). As in Node, a run goes on until every call it made
//! is answered (awaited or not; an unhandled rejection fails it), within
//! its deadline. Without a grant neither global exists. On `boa-js` calls
//! and answers are frames on the worker's own stdin and stdout (its seccomp
//! filter allows nothing more); on `boa-js-inthread` the engine thread calls
//! the bridge directly.
//!
//! Guards are the first line on both (nesting bounds before parsing,
//! single-call size bounds on built-ins, bounded walks before native
//! recursion): they turn common bombs into typed errors. On `boa-js` the
//! operating system is the second line, for everything the guards miss.
//!
//! Sessions ([`JsSession`], on [`BoaJs`]) keep one realm across calls; a
//! cell runs as a script (its declarations persist, its last expression is
//! the output), or as a function body when it has a top-level `return` (see
//! [`JsSession`] for the exact rules).
//!
//! Both backends are configured by [`BoaJsConfig`] and count their workers
//! with a [`WorkerGauge`].
//!
//! Inside (private modules): `config`, the two backends (`contained`, with
//! the worker process's side in `worker`, and `inthread`), `session`, the
//! `engine` that runs one job on a context (built by `job`), the `realm` it
//! installs (console, JSON snapshot, built-in guards, and `tools` for Code
//! Mode), the `port` a run's tool calls leave by, the JavaScript `lexer`
//! that checks code before boa's parser sees it, `capabilities` and the
//! `gauge`.

mod capabilities;
mod config;
mod contained;
mod conversation;
mod engine;
mod gauge;
mod inthread;
mod job;
mod lexer;
mod pool;
mod port;
mod realm;
mod session;
pub(crate) mod worker;

pub use config::BoaJsConfig;
pub use contained::BoaJs;
pub use gauge::WorkerGauge;
pub use inthread::BoaJsInThread;
pub use session::JsSession;
