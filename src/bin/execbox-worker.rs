//! `execbox-worker`: a program that only serves as execbox's worker process
//! (contained JavaScript, wasm compiles, the seccomp probe). The `execbox`
//! command (package `execbox-cli`) serves as one too; this one lets the
//! library, its tests and its examples find a worker without the command-line
//! tool (see `execbox::worker` for where a worker program is looked for).

use std::process::ExitCode;

#[cfg(any(feature = "js", feature = "wasm"))]
fn main() -> ExitCode {
    execbox::worker::serve_if_worker();
    eprintln!("execbox-worker: execbox starts this program as its worker process; run by hand it does nothing");
    ExitCode::from(2)
}

/// Built without `js` and `wasm`, no backend has workers.
#[cfg(not(any(feature = "js", feature = "wasm")))]
fn main() -> ExitCode {
    eprintln!("execbox-worker: built without the js and wasm features, no backend needs a worker");
    ExitCode::from(2)
}
