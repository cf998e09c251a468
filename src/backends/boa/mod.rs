//! JavaScript on `boa_engine`, two ways:
//!
//! | | [`BoaJs`] (`boa-js`, the default) | [`BoaJsInThread`] (`boa-js-inthread`, opt-in) |
//! |---|---|---|
//! | where | a worker process of execbox's own ([`crate::worker`]) | a thread of the host process |
//! | isolation | [`IsolationKind::WorkerProcess`](crate::capabilities::IsolationKind::WorkerProcess): a crash, an abort or a runaway allocation ends the worker | [`IsolationKind::InProcess`](crate::capabilities::IsolationKind::InProcess): boa's faults are the host's |
//! | deadline | cooperative stop at the deadline, then `SIGKILL` | cooperative stop; code inside a native callback is abandoned and stopped by the instruction budget |
//! | memory cap | **enforced**: `RLIMIT_AS` of the worker = its size + the cap | **not enforced** (refused if asked) |
//! | syscalls | seccomp: read/write its pipes, memory, clocks, exit | the host's |
//! | cost | a pipe round trip per call (see the README's performance table) | a thread hand-off |
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
//! installs (console, JSON snapshot, built-in guards), the JavaScript
//! `lexer` that checks code before boa's parser sees it, `capabilities` and
//! the `gauge`.

mod capabilities;
mod config;
mod contained;
mod engine;
mod gauge;
mod inthread;
mod job;
mod lexer;
mod realm;
mod session;
pub(crate) mod worker;

pub use config::BoaJsConfig;
pub use contained::BoaJs;
pub use gauge::WorkerGauge;
pub use inthread::BoaJsInThread;
pub use session::JsSession;
