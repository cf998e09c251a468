//! JavaScript on `boa_engine`, two ways:
//!
//! | | [`BoaJs`] (`boa-js`, the default) | [`BoaJsInThread`] (`boa-js-inthread`, opt-in) |
//! |---|---|---|
//! | where | a worker process of execbox's own ([`crate::worker`]) | a thread of the host process |
//! | isolation | [`IsolationKind::WorkerProcess`]: a crash, an abort or a runaway allocation ends the worker | [`IsolationKind::InProcess`]: boa's faults are the host's |
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

mod contained;
mod engine;
mod inthread;
mod realm;
mod session;
pub(crate) mod worker;

pub use contained::BoaJs;
pub use inthread::BoaJsInThread;
pub use session::JsSession;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::admission::Admitted;
use crate::capabilities::{
    BackendCapabilities, CostClass, Enforcement, IsolationKind, PayloadKind, RequestFeatures, SurfaceCapability,
};
use crate::error::{ExecError, InvalidRequest};
use crate::language::Language;
use crate::limits::nesting;

/// The deadline of a run whose policy states none.
const DEFAULT_TIMEOUT_MS: u64 = 30_000;

/// Settings of both boa backends. Each field says which backend it applies
/// to and its default; the defaults suit agent loops on a small machine.
#[derive(Clone, Debug)]
pub struct BoaJsConfig {
    /// Both: deepest nesting accepted in code, input, and values walked by
    /// `JSON.stringify`/`join`/`console` (serde_json's parser stops at 128).
    ///
    /// Default: 128.
    pub max_nesting: usize,
    /// Both: longest string or array a guarded built-in (`repeat`,
    /// `padStart`, `padEnd`, `fill`, `join`, `sort`) may produce or take.
    ///
    /// Default: 16 Mi units.
    pub max_builtin_len: u64,
    /// Both: most values one guarded walk (`JSON.stringify`, `console.*`)
    /// visits; shared sub-values count each time they are reached.
    ///
    /// Default: 1 Mi.
    pub max_walk_nodes: u64,
    /// Both: VM budget cycles between deadline checks.
    ///
    /// Default: 10,000.
    pub yield_every: u32,
    /// Both: JS call depth limit (boa's `RuntimeLimits`, uncatchable when hit).
    ///
    /// Default: 512.
    pub recursion_limit: usize,
    /// Both: workers kept ready (processes for `boa-js`, threads for
    /// `boa-js-inthread`), each with a fresh context built.
    ///
    /// Default: 2.
    pub idle_workers: usize,
    /// `boa-js`: most worker processes at once; more concurrent requests
    /// wait for one within their deadline, then get [`ExecError::Busy`].
    ///
    /// Default: 16.
    pub max_workers: usize,
    /// `boa-js`: the program that serves as a worker (see
    /// [`crate::worker`]); `None` finds one.
    ///
    /// Default: `None`.
    pub worker_program: Option<PathBuf>,
    /// `boa-js`: the memory cap of a run whose policy states none (the worker
    /// may grow by this much beyond its size), and of an idle worker.
    ///
    /// Default: 256 MiB.
    pub default_memory_bytes: u64,
    /// `boa-js`: the worker process's stack limit (`RLIMIT_STACK`; the engine
    /// runs on its main thread, whose stack grows on demand). Native
    /// recursion past it ends the run as `failed` ("stack overflow"); it is
    /// well under the default memory cap so that it, not the cap, is hit.
    ///
    /// Default: 64 MiB.
    pub worker_stack_bytes: usize,
    /// `boa-js-inthread`: the reserved stack of each worker thread (address
    /// space, committed only as used; boa's parser needs ~100 KB per nesting
    /// level in debug builds, much less in release).
    ///
    /// Default: 1 GiB.
    pub thread_stack_bytes: usize,
    /// `boa-js`: how long a new worker may take to start and lock down.
    ///
    /// Default: 10 s.
    pub worker_start_timeout: Duration,
    /// Both: how long past the deadline a run may take to report itself.
    /// Then `boa-js` kills the worker; `boa-js-inthread` returns `timed_out`
    /// and abandons the thread to its instruction budget.
    ///
    /// Default: 20 ms.
    pub deadline_grace: Duration,
    /// `boa-js-inthread`: without a policy `fuel`, the instruction backstop
    /// is the timeout times this rate (a generous multiple of what boa
    /// executes per ms here), so an abandoned thread stops.
    ///
    /// Default: 200,000.
    pub backstop_instructions_per_ms: u64,
    /// `boa-js-inthread`: the backstop when the policy has neither `fuel`
    /// nor a timeout, and the budget of a session.
    ///
    /// Default: 2^32.
    pub backstop_without_timeout: u64,
}

impl BoaJsConfig {
    /// The in-thread instruction backstop for a run without a policy `fuel`.
    pub fn backstop_budget(&self, timeout_ms: Option<u64>) -> u64 {
        timeout_ms
            .map_or(self.backstop_without_timeout, |ms| ms.saturating_mul(self.backstop_instructions_per_ms).max(1))
    }

    /// What the engine itself needs (sent to worker processes).
    fn engine(&self) -> EngineSettings {
        EngineSettings {
            max_nesting: self.max_nesting,
            max_builtin_len: self.max_builtin_len,
            max_walk_nodes: self.max_walk_nodes,
            yield_every: self.yield_every,
            recursion_limit: self.recursion_limit,
        }
    }
}

impl Default for BoaJsConfig {
    fn default() -> Self {
        Self {
            max_nesting: 128,
            max_builtin_len: 1 << 24,
            max_walk_nodes: 1 << 20,
            yield_every: 10_000,
            recursion_limit: 512,
            idle_workers: 2,
            max_workers: 16,
            worker_program: None,
            default_memory_bytes: 256 << 20,
            worker_stack_bytes: 64 << 20,
            thread_stack_bytes: 1 << 30,
            worker_start_timeout: Duration::from_secs(10),
            deadline_grace: Duration::from_millis(20),
            backstop_instructions_per_ms: 200_000,
            backstop_without_timeout: 1 << 32,
        }
    }
}

/// The engine's own settings, as a worker process receives them.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
struct EngineSettings {
    max_nesting: usize,
    max_builtin_len: u64,
    max_walk_nodes: u64,
    yield_every: u32,
    recursion_limit: usize,
}

impl Default for EngineSettings {
    fn default() -> Self {
        BoaJsConfig::default().engine()
    }
}

/// A read-only count of a boa backend's workers (processes or threads).
#[derive(Clone, Debug)]
pub struct WorkerGauge(Arc<AtomicUsize>);

impl WorkerGauge {
    /// Workers alive now (idle, running, or winding down).
    pub fn live(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Checks an admitted call's code and input and turns it into a job.
/// Contained runs get no instruction budget unless the policy asks for
/// `fuel` (the host's kill ends runaway code); in-thread runs get the
/// backstop.
fn job(cfg: &BoaJsConfig, mut call: Admitted, mode: engine::Mode, backstop: bool) -> Result<engine::Job, ExecError> {
    let max = cfg.max_nesting;
    let source = call.take_source("boa")?;
    if let Some(depth) = nesting::source_nesting_exceeds(&source, max) {
        return Err(InvalidRequest::TooDeep { what: "code", depth, max }.into());
    }
    let deadline = call.deadline();
    let mut request = call.into_request();
    let input = nesting::take_bounded_input(&mut request.input, max)?;
    let policy = &request.policy;
    let (budget, fuel_asked) = match policy.fuel {
        Some(fuel) => (fuel, true),
        None if backstop => (cfg.backstop_budget(policy.timeout_ms), false),
        None => (u64::MAX, false),
    };
    Ok(engine::Job {
        source,
        mode,
        input,
        budget,
        fuel_asked,
        timeout: deadline.limit(),
        max_stdout: policy.max_stdout_bytes,
        max_stderr: policy.max_stderr_bytes,
    })
}

/// What both backends enforce the same way.
fn common_capabilities(isolation: IsolationKind) -> BackendCapabilities {
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
        default_timeout_ms: DEFAULT_TIMEOUT_MS,
    }
}

fn contained_capabilities(cfg: &BoaJsConfig) -> BackendCapabilities {
    let mut caps = common_capabilities(IsolationKind::WorkerProcess);
    caps.timeout = Enforcement::enforced(format!(
        "the VM stops at the deadline (checked every {} budget cycles); a worker still busy {} ms later \
         (e.g. in a native callback) is killed (SIGKILL)",
        cfg.yield_every,
        cfg.deadline_grace.as_millis()
    ));
    caps.memory = Enforcement::enforced(format!(
        "the worker's address space (RLIMIT_AS) is capped at its size plus the cap (default {} MiB); \
         an allocation past it ends the run as out_of_memory",
        cfg.default_memory_bytes >> 20
    ));
    caps
}

fn inthread_capabilities(cfg: &BoaJsConfig) -> BackendCapabilities {
    let mut caps = common_capabilities(IsolationKind::InProcess);
    caps.timeout = Enforcement::enforced(format!(
        "the VM stops at the deadline (checked every {} budget cycles); for JS called from native code the \
         caller gets timed_out at the deadline and the instruction backstop stops the thread",
        cfg.yield_every
    ));
    caps.memory = Enforcement::not_enforced(
        "shares the host's process and boa has no heap limit: use boa-js (contained) for a memory cap",
    );
    caps
}
