//! In-process JavaScript on `boa_engine`.
//!
//! The code is a function body: `input` is bound to the request's JSON input,
//! `return` sets the output (a returned Promise is awaited), `console.*` goes
//! to stdout/stderr. If the body contains the word `await` it runs as an
//! `async` function.
//!
//! # What is enforced, and how
//! - **network, filesystem, environment, processes**: by omission — the realm
//!   has no such APIs (no `require`, `process`, `fetch`, `Deno`, timers).
//! - **deadline**: the VM yields every [`BoaJsConfig::yield_every`] budget
//!   cycles and the worker stops at the deadline. JS invoked from native code
//!   (e.g. an `Array.prototype.map` callback) does not yield; there the caller
//!   still gets `timed_out` at the deadline (plus a few ms of grace) and the
//!   abandoned worker is stopped by the instruction budget below.
//! - **fuel**: boa's VM instruction budget (the `fuzz` feature); uncatchable.
//!   Without a policy `fuel`, a backstop budget derived from the timeout
//!   ([`BoaJsConfig::backstop_instructions_per_ms`]) bounds abandoned workers.
//! - **output caps**: applied as `console.*` writes.
//! - **native stack**: each run is on a worker thread with a large reserved
//!   stack; code and input nesting is bounded before parsing; `eval`,
//!   `Function` constructors and `JSON.parse` scan their text the same way;
//!   `JSON.stringify`, `Array.prototype.join` and `console.*` bound the depth
//!   and size of the values they walk; `repeat`/`padStart`/`padEnd`/`fill`
//!   bound the length they create.
//! - **memory: not enforced.** boa has no heap cap; a request with
//!   `memory_bytes` is refused. Allocation by doubling strings or arrays is
//!   bounded only by the instruction budget and the host's memory.
//!
//! Contexts are never reused: every run gets a fresh `Context`, built ahead of
//! time on an idle worker so the caller does not wait for it.

mod engine;
mod pool;
mod realm;
mod session;

pub use session::JsSession;

use std::sync::Arc;
use std::time::Duration;

use crate::capabilities::{
    BackendCapabilities, CostClass, Enforcement, IsolationKind, Language, PayloadKind, RequestFeatures,
    SurfaceCapability,
};
use crate::error::{ExecError, InvalidRequest};
use crate::executor::Backend;
use crate::limits::nesting;
use crate::request::{ExecRequest, Payload};
use crate::result::ExecResult;

use pool::Pool;

/// The deadline of a run whose policy states none.
const DEFAULT_TIMEOUT_MS: u64 = 30_000;

/// Tuning for [`BoaJs`]. The defaults suit agent loops on a small machine.
#[derive(Clone, Debug)]
pub struct BoaJsConfig {
    /// Stack reserved for each worker thread. Address space only: pages are
    /// committed as used. boa's parser needs ~100 KB per nesting level in
    /// debug builds and much less in release.
    pub worker_stack_bytes: usize,
    /// Workers kept with a fresh context ready (and started at construction).
    pub idle_workers: usize,
    /// Deepest nesting accepted in code, input, and values walked by
    /// `JSON.stringify`/`join`/`console` (serde_json's parser stops at 128).
    pub max_nesting: usize,
    /// Longest string/array a guarded built-in (`repeat`, `padStart`,
    /// `padEnd`, `fill`) may produce.
    pub max_builtin_len: u64,
    /// Most values one guarded walk (`JSON.stringify`, `join`, `console.*`)
    /// visits; shared sub-values count each time they are reached.
    pub max_walk_nodes: u64,
    /// VM budget cycles between deadline checks.
    pub yield_every: u32,
    /// Without a policy `fuel`, the instruction backstop is the timeout times
    /// this rate (a generous multiple of what boa executes per ms here).
    pub backstop_instructions_per_ms: u64,
    /// Backstop used when the policy has neither `fuel` nor a timeout.
    pub backstop_without_timeout: u64,
    /// JS call depth limit (boa `RuntimeLimits`, uncatchable when hit).
    pub recursion_limit: usize,
    /// How long past the deadline the caller waits for a worker that is
    /// inside native code before returning `timed_out` without it.
    pub abandon_grace: Duration,
}

impl BoaJsConfig {
    /// The instruction backstop for a run without a policy `fuel`.
    pub fn backstop_budget(&self, timeout_ms: Option<u64>) -> u64 {
        timeout_ms
            .map_or(self.backstop_without_timeout, |ms| ms.saturating_mul(self.backstop_instructions_per_ms).max(1))
    }
}

impl Default for BoaJsConfig {
    fn default() -> Self {
        Self {
            worker_stack_bytes: 1 << 30,
            idle_workers: 4,
            max_nesting: 128,
            max_builtin_len: 1 << 24,
            max_walk_nodes: 1 << 20,
            yield_every: 10_000,
            backstop_instructions_per_ms: 200_000,
            backstop_without_timeout: 1 << 32,
            recursion_limit: 512,
            abandon_grace: Duration::from_millis(20),
        }
    }
}

/// A read-only count of a [`BoaJs`] backend's worker threads.
#[derive(Clone, Debug)]
pub struct WorkerGauge(Arc<std::sync::atomic::AtomicUsize>);

impl WorkerGauge {
    /// Worker threads alive now (idle, running, or abandoned and winding down).
    pub fn live(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// The boa JavaScript backend. Cheap to clone (shares its worker pool).
#[derive(Clone)]
pub struct BoaJs {
    pool: Arc<Pool>,
    caps: Arc<BackendCapabilities>,
}

impl Default for BoaJs {
    fn default() -> Self {
        Self::new(BoaJsConfig::default())
    }
}

impl std::fmt::Debug for BoaJs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoaJs").field("config", self.pool.config()).finish_non_exhaustive()
    }
}

impl BoaJs {
    /// The backend's name.
    pub const NAME: &'static str = "boa-js";

    /// Starts the backend; idle workers build their contexts in the background.
    pub fn new(config: BoaJsConfig) -> Self {
        Self { pool: Pool::start(config), caps: Arc::new(capabilities()) }
    }

    /// Counts this backend's live worker threads without keeping the backend
    /// alive: for leak checks after the last handle is dropped.
    pub fn worker_gauge(&self) -> WorkerGauge {
        WorkerGauge(self.pool.live_counter())
    }

    /// The instruction budget a run under `policy` gets.
    fn budget_for(&self, request: &ExecRequest) -> (u64, bool) {
        match request.policy.fuel {
            Some(fuel) => (fuel, true),
            None => (self.pool.config().backstop_budget(request.policy.timeout_ms), false),
        }
    }
}

fn capabilities() -> BackendCapabilities {
    let none = |what: &'static str| Enforcement::by_omission(what);
    BackendCapabilities {
        isolation: IsolationKind::InProcess,
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
            deny: none("the realm has no filesystem API (no require, fs, Deno)"),
            allow_list: Enforcement::not_enforced("boa has no filesystem API to grant"),
        },
        environment: SurfaceCapability {
            deny: none("the realm has no process or environment object"),
            allow_list: Enforcement::not_enforced("boa has no environment API to grant"),
        },
        timeout: Enforcement::enforced(
            "VM yields every N budget cycles and stops at the deadline; for JS called from native code \
             the caller gets timed_out at the deadline and the instruction budget stops the worker",
        ),
        memory: Enforcement::not_enforced("boa has no heap limit"),
        fuel: Enforcement::enforced("boa VM instruction budget, uncatchable by JS"),
        stdout_cap: Enforcement::enforced("console.log/info/debug written through a bounded buffer"),
        stderr_cap: Enforcement::enforced("console.warn/error written through a bounded buffer"),
        processes: none("the realm cannot create processes or threads"),
        default_timeout_ms: DEFAULT_TIMEOUT_MS,
    }
}

impl Backend for BoaJs {
    fn name(&self) -> &str {
        Self::NAME
    }

    fn capabilities(&self) -> &BackendCapabilities {
        &self.caps
    }

    fn execute(&self, request: ExecRequest) -> Result<ExecResult, ExecError> {
        let job = self.job(request, engine::Mode::FunctionBody)?;
        self.pool.run(job)
    }
}

impl BoaJs {
    /// Checks a request's code and input and turns it into a job.
    fn job(&self, mut request: ExecRequest, mode: engine::Mode) -> Result<engine::Job, ExecError> {
        let max = self.pool.config().max_nesting;
        let source = match std::mem::replace(&mut request.payload, Payload::Source(String::new())) {
            Payload::Source(s) => s,
            Payload::WasmModule(_) => {
                return Err(ExecError::internal(Self::NAME, "matching let a non-source payload through"));
            }
        };
        if let Some(depth) = nesting::source_nesting_exceeds(&source, max) {
            return Err(InvalidRequest::TooDeep { what: "code", depth, max }.into());
        }
        let input = nesting::take_bounded_input(&mut request.input, max)?;
        let (budget, fuel_asked) = self.budget_for(&request);
        Ok(engine::Job {
            source,
            mode,
            input,
            budget,
            fuel_asked,
            timeout: Some(self.caps.effective_timeout(&request.policy)),
            max_stdout: request.policy.max_stdout_bytes,
            max_stderr: request.policy.max_stderr_bytes,
        })
    }
}
