//! What the boa backends declare they enforce: shared by both, with the
//! deadline and memory statements of each.

use crate::backends::boa::config::BoaJsConfig;
use crate::capabilities::{
    BackendCapabilities, CostClass, Enforcement, IsolationKind, PayloadKind, RequestFeatures, SurfaceCapability,
};
use crate::language::Language;

/// The contained backend's name (`BoaJs::NAME`), here so that the modules
/// it uses can name it without importing it.
pub(crate) const CONTAINED_NAME: &str = "boa-js";

/// What both backends enforce the same way.
fn common(cfg: &BoaJsConfig, isolation: IsolationKind) -> BackendCapabilities {
    let none = |what: &'static str| Enforcement::by_omission(what);
    BackendCapabilities {
        isolation,
        cost: CostClass::Low,
        languages: vec![Language::JavaScript],
        payloads: vec![PayloadKind::Source],
        features: RequestFeatures {
            json_input: true,
            stdin: false,
            args: false,
            input_files: false,
            output_files: false,
        },
        network: SurfaceCapability {
            deny: none("the realm has no network API (no fetch, XMLHttpRequest, sockets)"),
            allow_list: Enforcement::not_enforced("boa has no network API to grant"),
        },
        filesystem: SurfaceCapability {
            deny: none("the realm has no filesystem API (no require, fs, Deno) and no module loader"),
            allow_list: Enforcement::not_enforced("boa has no filesystem API to grant"),
        },
        environment: SurfaceCapability {
            deny: none("the realm has no process or environment object"),
            allow_list: Enforcement::not_enforced("boa has no environment API to grant"),
        },
        timeout: Enforcement::not_enforced("set per backend"),
        memory: Enforcement::not_enforced("set per backend"),
        fuel: Enforcement::enforced("boa VM instruction budget, uncatchable by JS"),
        stdout_cap: Enforcement::enforced("console.log/info/debug written through a bounded buffer"),
        stderr_cap: Enforcement::enforced("console.warn/error written through a bounded buffer"),
        processes: none("the realm cannot create processes or threads"),
        tools: SurfaceCapability {
            deny: none("without a grant the realm has no `tools` object and no channel to the host's tools"),
            allow_list: Enforcement::not_enforced("set per backend"),
        },
        workspace: Enforcement::not_enforced("the realm has no filesystem API to see a workspace with"),
        default_timeout_ms: cfg.default_timeout_ms(),
    }
}

/// `boa-js`: contained in worker processes.
pub(crate) fn contained(cfg: &BoaJsConfig) -> BackendCapabilities {
    let mut caps = common(cfg, IsolationKind::WorkerProcess);
    caps.timeout = Enforcement::enforced(format!(
        "the VM stops at the deadline (checked every {} budget cycles); a worker still busy {} ms later \
         (e.g. in a native callback) is killed (SIGKILL)",
        cfg.yield_every,
        cfg.deadline_grace.as_millis()
    ));
    caps.memory = Enforcement::enforced(format!(
        "the worker's address space (RLIMIT_AS) is capped at its size plus the cap (default {} MiB); \
         an allocation past it ends the run as out_of_memory",
        cfg.defaults.memory_bytes >> 20
    ));
    caps.tools.allow_list = Enforcement::enforced(
        "a granted run gets a global `tools` (`await tools.ns.name(args)`) whose calls cross as frames on the \
         worker's own stdin/stdout (its seccomp filter allows nothing more); the host's tool bridge answers \
         each against the grant and the tool limits, so only granted tools run",
    );
    caps
}

/// `boa-js-inthread`: on threads of the host process.
pub(crate) fn inthread(cfg: &BoaJsConfig) -> BackendCapabilities {
    let mut caps = common(cfg, IsolationKind::InProcess);
    caps.timeout = Enforcement::enforced(format!(
        "the VM stops at the deadline (checked every {} budget cycles); for JS called from native code the \
         caller gets timed_out at the deadline and the instruction backstop stops the thread",
        cfg.yield_every
    ));
    caps.memory = Enforcement::not_enforced(
        "shares the host's process and boa has no heap limit: use boa-js (contained) for a memory cap",
    );
    caps.tools.allow_list = Enforcement::enforced(
        "a granted run gets a global `tools` (`await tools.ns.name(args)`) whose calls go, as JSON converted \
         once, to the host's tool bridge, which answers each against the grant and the tool limits, so only \
         granted tools run",
    );
    caps
}
