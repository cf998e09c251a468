//! What host and worker agree on before the first frame: the worker's
//! role, the protocol revision, and the environment variables that carry
//! them.

use std::sync::OnceLock;

/// Environment variable naming the role of a process spawned as a worker.
pub(crate) const ROLE_ENV: &str = "EXECBOX_WORKER_ROLE";
/// Environment variable holding the protocol the host speaks.
pub(crate) const PROTOCOL_ENV: &str = "EXECBOX_WORKER_PROTOCOL";
/// Environment variable naming a worker program (see the module docs).
pub const PROGRAM_ENV: &str = "EXECBOX_WORKER";

/// Host and worker must agree on every frame: same crate version, same
/// protocol revision.
pub(crate) const PROTOCOL: &str = concat!("execbox-", env!("CARGO_PKG_VERSION"), "-p1");

/// Exit code of a worker that was started by a host of another build.
pub(crate) const EXIT_PROTOCOL_MISMATCH: i32 = 3;

/// Set by [`serve_if_worker`] in a process that is not a worker: its own
/// executable can then serve as one.
pub(crate) static HOOKED: OnceLock<()> = OnceLock::new();

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
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            #[cfg(feature = "js")]
            Role::BoaJs => "boa-js",
            #[cfg(feature = "wasm")]
            Role::WasmCompile => "wasm-compile",
            Role::SeccompProbe => "seccomp-probe",
        }
    }

    pub(crate) fn parse(text: &str) -> Option<Self> {
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
