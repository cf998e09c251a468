//! Worker processes: execbox's own locked-down OS processes that run an
//! engine for the host, so that a crash, a runaway allocation or a loop that
//! never yields ends a worker, never the host.
//!
//! # Where a worker comes from
//!
//! Two kinds exist: JavaScript workers (the contained `boa-js` backend and its
//! sessions) and wasm compile workers (every untrusted module is compiled in
//! one). A worker is this crate's code running in another process: any
//! binary that calls [`serve_if_worker`] first thing in `main` (the `execbox`
//! command and this crate's own `execbox-worker` binary do).
//! Spawned as a worker, that call serves requests on stdin/stdout and exits;
//! in any other process it returns at once. The program is found in this
//! order (the first that applies wins):
//!
//! 1. the backend's configured worker program (e.g. `BoaJsConfig::worker_program`);
//! 2. `$EXECBOX_WORKER`: a path to a binary that calls [`serve_if_worker`]
//!    (an installed `execbox` CLI works);
//! 3. this process's own executable, if it called [`serve_if_worker`];
//! 4. an `execbox-worker` or `execbox` binary beside this executable or one
//!    directory up (where cargo puts them for a crate's tests, examples and
//!    benches).
//!
//! If none applies, backends that need workers report themselves
//! unavailable with this list as the fix; nothing falls back silently to
//! running in-process. Host and worker must come from the same build of
//! execbox (checked at start-up: a mismatch is reported as unavailable).
//!
//! # What holds a worker
//!
//! - **It dies with the host.** It is forked from one long-lived thread with
//!   `PR_SET_PDEATHSIG(SIGKILL)`, so it is killed whenever the host process
//!   ends, however it ends (see `process::spawner`).
//! - **It starts with nothing.** A new session (`setsid`), `/` as its working
//!   directory, an empty environment, no file descriptors but its three
//!   pipes, core dumps off.
//! - **It is locked down before it sees a request**: `no_new_privs` and a
//!   seccomp filter that allows reading its requests, writing its answers,
//!   managing (never executable) memory and little else (see `lockdown`);
//!   any other system call kills it with `SIGSYS`.
//! - **Per run**, the host caps its address space (`RLIMIT_AS`, set from
//!   outside with `prlimit`) at its size plus the run's memory cap, and
//!   SIGKILLs it at the deadline. A killed or crashed worker is replaced off
//!   the request path.

mod entry;
pub(crate) mod frame;
pub(crate) mod lockdown;
#[cfg(feature = "js")]
pub(crate) mod on_reactor;
pub(crate) mod process;
pub(crate) mod program;
#[cfg(feature = "js")]
pub(crate) mod registered;
pub(crate) mod role;

pub use entry::{lockdown_supported, probe_seccomp, serve_if_worker};
pub use program::WorkerProgramError;
pub use role::PROGRAM_ENV;
