//! [`serve_if_worker`]: the entry point of a process spawned as a worker,
//! which hands it to the backend its role names.

use super::lockdown;
use super::process;
use super::role::{EXIT_PROTOCOL_MISMATCH, HOOKED, PROTOCOL, PROTOCOL_ENV, ROLE_ENV, Role};

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
        eprintln!("execbox worker: {}", crate::error::with_causes(&e));
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
pub fn probe_seccomp(program: Option<&std::path::Path>) -> std::io::Result<std::process::ExitStatus> {
    use std::io::Error;
    let program = super::program::find_program(program).map_err(Error::other)?;
    let spec = process::SpawnSpec { program, role: Role::SeccompProbe, stack_bytes: 8 << 20 };
    let mut worker = process::WorkerProcess::spawn(&spec)?;
    let _ = worker.recv::<()>(Some(std::time::Instant::now() + std::time::Duration::from_secs(10)), 64);
    let death = worker.death();
    use std::os::unix::process::ExitStatusExt;
    match death {
        process::Death::Signal { signal, .. } => Ok(std::process::ExitStatus::from_raw(signal)),
        process::Death::Exited { code, stderr } => Err(Error::other(format!("exited with {code}: {stderr}"))),
        process::Death::KilledByHost => Err(Error::other("did not end in time")),
    }
}
