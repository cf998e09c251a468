//! The capabilities of the `wasm` backend on an engine (the interpreter
//! backends start from these and adjust them).

use super::engine::WasmEngine;
use crate::capabilities::{
    BackendCapabilities, CostClass, Enforcement, IsolationKind, PayloadKind, RequestFeatures, SurfaceCapability,
};
use crate::language::Language;

/// What a `wasm` guest on `engine` runs and enforces.
pub(crate) fn capabilities(engine: &WasmEngine) -> BackendCapabilities {
    use Enforcement as E;
    let cfg = engine.config();
    let allocation = if engine.pooling_allocator() {
        format!("instances from a pooling allocator of {} slots shared by the wasm backends", cfg.pooled_instances)
    } else if cfg.pooled_instances > 0 {
        format!(
            "instances allocated on demand: the pooling allocator's reservation was refused; at most {} at once",
            cfg.pooled_instances
        )
    } else {
        "instances allocated on demand".to_string()
    };
    BackendCapabilities {
        isolation: IsolationKind::InProcess,
        cost: CostClass::Low,
        languages: vec![Language::Wasm],
        payloads: vec![PayloadKind::WasmModule],
        features: RequestFeatures { json_input: true, stdin: true, args: true, input_files: true, output_files: false },
        network: SurfaceCapability {
            deny: E::by_omission("WASI preview 1 has no call that opens a socket, and none is preopened"),
            allow_list: E::not_enforced("WASI preview 1 cannot grant network access"),
        },
        filesystem: SurfaceCapability {
            deny: E::enforced("no directory is preopened; WASI preview 1 reaches files only through preopens"),
            allow_list: E::enforced(
                "each granted directory is a cap-std preopen (read-only grants refuse writes); \
                 `..` and symlinks cannot leave it; guests cannot create symlinks; FIFOs, sockets and \
                 devices are refused at open",
            ),
        },
        environment: SurfaceCapability {
            deny: E::enforced("the guest's environment is empty"),
            allow_list: E::enforced("only the request's values for allow-listed names; nothing is inherited"),
        },
        timeout: E::enforced(format!(
            "preemptive: epoch interruption every {} µs in wasm code; sleeps in poll_oneoff end at the deadline; \
             the module's compile counts against it ({compile})",
            cfg.epoch_tick.as_micros(),
            compile = if engine.compiles_contained() {
                "in a compile worker process, killed at the deadline, memory capped"
            } else {
                "in this process, bounded by the static module limits only: no compile worker program"
            }
        )),
        memory: E::enforced(format!(
            "per-store limiter on linear memory and tables (ceiling {} bytes; {} when the policy states none); \
             memory.grow past it returns -1; {allocation}",
            cfg.max_memory_bytes,
            cfg.defaults.memory_bytes.min(cfg.max_memory_bytes)
        )),
        fuel: if cfg.consume_fuel {
            E::enforced("wasmtime fuel metering, uncatchable by the guest")
        } else {
            E::not_enforced("fuel metering is off in this backend's config")
        },
        stdout_cap: E::enforced("guest writes go through a bounded buffer; the rest is counted and dropped"),
        stderr_cap: E::enforced("guest writes go through a bounded buffer; the rest is counted and dropped"),
        processes: E::by_omission("WASI preview 1 cannot create processes or threads"),
        tools: SurfaceCapability {
            deny: E::enforced(
                "the execbox_tools import answers every call not_granted when the run grants no tools; \
                 nothing reaches the host's tools",
            ),
            allow_list: E::enforced(
                "the execbox_tools import (call/result, JSON in and out) hands each call to the run's tool \
                 bridge, which runs only granted tools within the run's tool budgets; the guest waits in the \
                 host call at most the call's timeout, never past the run's deadline",
            ),
        },
        workspace: E::enforced(
            "preopened read-write at /work (cap-std: `..` and symlinks cannot leave it, FIFOs and devices are \
             refused at open); the quota is the workspace's own tmpfs size and inode cap, so a write past it \
             fails with ENOSPC; a run in a workspace starts a fresh instance",
        ),
        default_timeout_ms: u64::try_from(cfg.defaults.timeout.as_millis()).unwrap_or(u64::MAX),
    }
}
