//! Tests that need something the machine may lack (the interpreters, a
//! container engine, the MCP clients) skip without it, saying why, and
//! fail instead when the variable that requires it is set (as `.ci/run`
//! sets them).

use std::fmt::Display;

/// Requires the interpreters in wasm (`scripts/fetch-interpreters.sh`).
pub const INTERPRETERS: &str = "EXECBOX_REQUIRE_INTERPRETERS";
/// Requires a container engine and execbox's images (`scripts/build-images.sh`).
pub const CONTAINERS: &str = "EXECBOX_REQUIRE_CONTAINERS";
/// Requires the MCP Python SDK, the reference upstream and the MCP
/// conformance suite (`scripts/install-mcp-*.sh`).
pub const MCP_CLIENT: &str = "EXECBOX_REQUIRE_MCP_CLIENT";
/// Requires the test cluster (`scripts/kube/up.sh`; `$EXECBOX_KUBECONFIG`
/// names its kubeconfig).
pub const KUBERNETES: &str = "EXECBOX_REQUIRE_KUBERNETES";

/// `$<variable>`, or `<name>` in execbox's cache dir (`$XDG_CACHE_HOME/execbox`
/// or `~/.cache/execbox`), where the install scripts put it.
pub fn installed(variable: &str, name: &str) -> std::path::PathBuf {
    use std::path::PathBuf;
    std::env::var_os(variable).map(PathBuf::from).unwrap_or_else(|| {
        let cache = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache"));
        cache.join("execbox").join(name)
    })
}

/// Whether the test can go on: true when `ready` is `Ok`; otherwise false
/// after saying why on stderr (the test returns: skipped), or a failure
/// when the variable `require` is set.
pub fn available(require: &str, ready: Result<(), impl Display>) -> bool {
    match ready {
        Ok(()) => true,
        Err(reason) => {
            assert!(std::env::var_os(require).is_none(), "{require} is set but {reason}");
            eprintln!("skipping: {reason}");
            false
        }
    }
}

/// Whether the container engine `engine` answers (`<engine> info`), as
/// [`available`] under [`CONTAINERS`].
pub fn engine_answers(engine: &std::path::Path) -> bool {
    let answers = std::process::Command::new(engine).arg("info").output().is_ok_and(|o| o.status.success());
    let why = || format!("no container engine answers ({} info failed)", engine.display());
    available(CONTAINERS, if answers { Ok(()) } else { Err(why()) })
}

/// `backend` warmed up (its module loaded, its warm pool started) if its
/// interpreter is installed; `None` (skipped) otherwise, as [`available`]
/// under [`INTERPRETERS`].
#[cfg(feature = "wasm")]
pub fn interpreter(backend: execbox::backends::WasmInterpreter) -> Option<execbox::backends::WasmInterpreter> {
    use execbox::Backend;
    available(INTERPRETERS, backend.availability()).then(|| {
        backend.warm_up().expect("the interpreter loads");
        backend
    })
}

/// A container backend on `cfg` whose containers carry the label
/// `execbox.test=<label>` (so a test can check that none of its own is
/// left), or `None` (skipped) when no engine answers. An engine that
/// answers without execbox's images is a failure.
#[cfg(feature = "container")]
pub fn labelled_container(
    label: &str,
    cfg: execbox::backends::container::ContainerConfig,
) -> Option<execbox::backends::Container> {
    use execbox::Backend;
    if !engine_answers(&cfg.engine) {
        return None;
    }
    let mut cfg = cfg;
    cfg.extra_run_args.push(format!("--label=execbox.test={label}"));
    let container = execbox::backends::Container::new(cfg).expect("config");
    if let Err(reason) = container.availability() {
        panic!("an engine answers but the backend is unavailable: {reason}");
    }
    Some(container)
}
