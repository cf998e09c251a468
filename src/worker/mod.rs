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
//! CLI does).
//! Spawned as a worker, that call serves requests on stdin/stdout and exits;
//! in any other process it returns at once. The program is found in this
//! order (the first that applies wins):
//!
//! 1. the backend's configured worker program (e.g. `BoaJsConfig::worker_program`);
//! 2. `$EXECBOX_WORKER`: a path to a binary that calls [`serve_if_worker`]
//!    (an installed `execbox` CLI works);
//! 3. this process's own executable, if it called [`serve_if_worker`];
//! 4. an `execbox` binary beside this executable or one directory up (where
//!    cargo puts it for a crate's tests and benches).
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

pub(crate) mod frame;
pub(crate) mod lockdown;
pub(crate) mod process;

use std::sync::OnceLock;

/// Environment variable naming the role of a process spawned as a worker.
const ROLE_ENV: &str = "EXECBOX_WORKER_ROLE";
/// Environment variable holding the protocol the host speaks.
const PROTOCOL_ENV: &str = "EXECBOX_WORKER_PROTOCOL";
/// Environment variable naming a worker program (see the module docs).
pub const PROGRAM_ENV: &str = "EXECBOX_WORKER";

/// Host and worker must agree on every frame: same crate version, same
/// protocol revision.
const PROTOCOL: &str = concat!("execbox-", env!("CARGO_PKG_VERSION"), "-p1");

/// Exit code of a worker that was started by a host of another build.
pub(crate) const EXIT_PROTOCOL_MISMATCH: i32 = 3;

/// Set by [`serve_if_worker`] in a process that is not a worker: its own
/// executable can then serve as one.
static HOOKED: OnceLock<()> = OnceLock::new();

/// What a worker process does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Runs JavaScript on boa (contained `boa-js` and its sessions).
    #[cfg(feature = "js")]
    BoaJs,
    /// Compiles untrusted wasm modules for the wasm backends.
    #[cfg(feature = "wasm")]
    WasmCompile,
    /// Installs the seccomp filter, then makes a forbidden system call: the
    /// test that the filter kills.
    SeccompProbe,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            #[cfg(feature = "js")]
            Role::BoaJs => "boa-js",
            #[cfg(feature = "wasm")]
            Role::WasmCompile => "wasm-compile",
            Role::SeccompProbe => "seccomp-probe",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        Some(match text {
            #[cfg(feature = "js")]
            "boa-js" => Role::BoaJs,
            #[cfg(feature = "wasm")]
            "wasm-compile" => Role::WasmCompile,
            "seccomp-probe" => Role::SeccompProbe,
            _ => return None,
        })
    }
}

/// Serves as an execbox worker if this process was spawned as one, and never
/// returns then; otherwise returns at once and lets this process's own
/// executable serve as the worker program.
///
/// Call it first thing in `main`, before any thread starts:
///
/// ```no_run
/// # #[allow(clippy::needless_doctest_main)]
/// fn main() {
///     execbox::worker::serve_if_worker();
///     // ... the program as usual ...
/// }
/// ```
pub fn serve_if_worker() {
    let Some(role) = std::env::var_os(ROLE_ENV) else {
        let _ = HOOKED.set(());
        return;
    };
    if std::env::var_os(PROTOCOL_ENV).as_deref() != Some(std::ffi::OsStr::new(PROTOCOL)) {
        eprintln!("execbox worker: the host speaks another protocol than {PROTOCOL}");
        std::process::exit(EXIT_PROTOCOL_MISMATCH);
    }
    let role = role.to_str().and_then(Role::parse);
    let code = match role {
        #[cfg(feature = "js")]
        Some(Role::BoaJs) => crate::backends::boa::worker::serve(),
        #[cfg(feature = "wasm")]
        Some(Role::WasmCompile) => crate::backends::wasm::compile_worker::serve(),
        Some(Role::SeccompProbe) => seccomp_probe(),
        None => {
            eprintln!("execbox worker: unknown role");
            2
        }
    };
    std::process::exit(code);
}

/// Locks down, then opens a file: the seccomp filter must kill us first.
fn seccomp_probe() -> i32 {
    if let Err(e) = lockdown::apply() {
        eprintln!("execbox worker: {e}");
        return 2;
    }
    // Forbidden: must never return.
    let opened = std::fs::File::open("/etc/hostname");
    eprintln!("execbox worker: a forbidden open returned {:?}", opened.map(drop));
    0
}

/// Whether workers can be locked down on this machine (seccomp filters
/// exist for x86_64 and aarch64 only).
pub fn lockdown_supported() -> bool {
    lockdown::supported()
}

/// Spawns a worker that installs the seccomp filter and then makes a
/// forbidden system call, and returns how it ended (a test of the filter:
/// it must be killed by `SIGSYS`). `program` as in the module docs.
#[doc(hidden)]
pub fn probe_seccomp(program: Option<&std::path::Path>) -> Result<std::process::ExitStatus, String> {
    let program = process::find_program(program)?;
    let spec = process::SpawnSpec { program, role: Role::SeccompProbe, stack_bytes: 8 << 20 };
    let mut worker = process::WorkerProcess::spawn(&spec).map_err(|e| e.to_string())?;
    let _ = worker.recv::<()>(Some(std::time::Instant::now() + std::time::Duration::from_secs(10)), 64);
    let death = worker.death();
    use std::os::unix::process::ExitStatusExt;
    match death {
        process::Death::Signal { signal, .. } => Ok(std::process::ExitStatus::from_raw(signal)),
        process::Death::Exited { code, stderr } => Err(format!("exited with {code}: {stderr}")),
        process::Death::KilledByHost => Err("did not end in time".into()),
    }
}
