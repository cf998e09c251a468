//! Untrusted modules are compiled in a worker process (see [`crate::backends::worker`]).
//!
//! Cranelift cannot be interrupted and its memory cannot be capped inside
//! the host: a module built to be expensive (thousands of blocks in one
//! function, huge bodies) held a host thread for minutes and gigabytes. The
//! static limits (`module_limits.rs`) bound that to seconds; the worker makes
//! it a non-event for the host. A compile worker is killed at the run's
//! deadline and its address space is capped (`RLIMIT_AS` at its size plus
//! [`WasmGuestConfig::max_compile_memory_bytes`](super::config::WasmGuestConfig::max_compile_memory_bytes)),
//! so a compile that runs out of either is `timed_out` / `out_of_memory` and
//! the host is untouched. The worker is locked down like a JS worker
//! (seccomp, dies with the host, no files).
//!
//! The worker compiles with the host engine's settings
//! (`Engine::precompile_module`) and sends the artifact back; the host loads
//! it with `Module::deserialize`. Trust: the artifact is machine code the
//! host will run. It comes from wasmtime in a worker of this same build; a
//! Cranelift bug that an attacker could exploit to forge it would, without
//! the worker, be exploitable in the host directly. The worker adds no trust
//! and removes the unbounded compile.
//!
//! One worker is kept warm after a compile; concurrent compiles of
//! different modules start more (at most [`MAX_COMPILE_WORKERS`]).

use parking_lot::{Condvar, Mutex};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};
use wasmtime::{Config, Engine};

use crate::backends::worker::frame::{self, RecvError};
use crate::backends::worker::lockdown;
use crate::backends::worker::process::{Death, SendError, SpawnSpec, WorkerProcess};
use crate::backends::worker::role::{EXIT_PROTOCOL_MISMATCH, Role};
use crate::limits::deadline::Deadline;

/// Most compile workers alive at once (concurrent compiles of different
/// modules); more wait within their deadline.
pub(crate) const MAX_COMPILE_WORKERS: usize = 4;

/// How long a compile worker may take to start, at most (within the run's deadline).
const START_LIMIT: Duration = Duration::from_secs(10);

/// Stack for the host functions a guest calls, above its wasm stack: a
/// thread of its own has this much (`WasmEngine::on_blocking_thread`), and
/// so has the fiber of a run on an async task.
pub(crate) const HOST_STACK: usize = 2 << 20;

/// The engine settings that decide whether an artifact loads into the
/// host's engine: the worker builds its engine from these, without the
/// pooling allocator (which does not change artifact compatibility).
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(crate) struct CompileSettings {
    pub consume_fuel: bool,
    pub max_wasm_stack: usize,
    /// The on-demand fallback's small memory reservations (they change how
    /// bounds checks are compiled).
    pub small_reservations: bool,
}

impl CompileSettings {
    /// The wasmtime config both the host and the worker build their engines
    /// from. A run on an async task runs on a stack of its own (a fiber):
    /// the wasm stack plus [`HOST_STACK`] for the host functions it calls.
    pub fn config(&self) -> Config {
        let mut config = Config::new();
        config
            .consume_fuel(self.consume_fuel)
            .epoch_interruption(true)
            .max_wasm_stack(self.max_wasm_stack)
            .async_stack_size(self.max_wasm_stack.saturating_add(HOST_STACK));
        if self.small_reservations {
            config.memory_reservation(0).memory_reservation_for_growth(16 << 20).memory_guard_size(64 << 10);
        }
        config
    }
}

/// A stable fingerprint of what makes artifacts loadable into `engine`.
fn compatibility(engine: &Engine) -> u64 {
    use std::hash::{Hash, Hasher};
    // DefaultHasher::new() has fixed keys: the same value in every process.
    let mut hasher = std::hash::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    hasher.finish()
}

/// How a contained compile ended.
pub(crate) enum Compiled {
    /// The serialized module, for `Module::deserialize` on the host's engine.
    Artifact(Vec<u8>),
    /// The module is invalid (wasmtime's words).
    Invalid(String),
    /// The deadline passed; the worker was killed.
    TimedOut,
    /// The compile needed more memory than its cap.
    OutOfMemory(String),
    /// No worker can compile here (no worker program, a mismatched build):
    /// the caller compiles in-process, bounded by the static limits only.
    Unavailable(String),
}

/// Host → compile worker.
#[derive(Serialize, Deserialize)]
enum ToCompiler {
    Init(CompileSettings),
    /// A module, base64.
    Compile(String),
}

/// Compile worker → host.
#[derive(Serialize, Deserialize)]
enum FromCompiler {
    Ready {
        compatibility: u64,
    },
    /// The artifact, base64.
    Compiled(String),
    Invalid(String),
}

/// The host's compile workers of one engine.
pub(crate) struct CompileWorkers {
    settings: CompileSettings,
    /// The host engine's fingerprint: a worker whose artifacts would not load is not used.
    compatibility: u64,
    program: Result<PathBuf, String>,
    max_memory: u64,
    state: Mutex<State>,
    freed: Condvar,
}

#[derive(Default)]
struct State {
    idle: Option<WorkerProcess>,
    live: usize,
}

impl CompileWorkers {
    pub fn new(engine: &Engine, settings: CompileSettings, program: Option<PathBuf>, max_memory: u64) -> Self {
        let program = match crate::backends::worker::program::find_program(program.as_deref()) {
            Ok(_) if !lockdown::supported() => Err("no seccomp filter for this architecture".to_string()),
            Ok(program) => Ok(program),
            Err(error) => Err(crate::error::with_causes(&error)),
        };
        Self {
            settings,
            compatibility: compatibility(engine),
            program,
            max_memory,
            state: Mutex::new(State::default()),
            freed: Condvar::new(),
        }
    }

    /// Whether compiles run contained (a worker program exists), for the
    /// capability text.
    pub fn contained(&self) -> bool {
        self.program.is_ok()
    }

    /// Compiles `wasm` in a worker, within `deadline`.
    pub fn compile(&self, wasm: &[u8], deadline: &Deadline) -> Compiled {
        if let Err(reason) = &self.program {
            return Compiled::Unavailable(reason.clone());
        }
        let mut worker = match self.take(deadline) {
            Ok(worker) => worker,
            Err(end) => return end,
        };
        let compiled = self.converse(&mut worker, wasm, deadline);
        let reusable = matches!(compiled, Compiled::Artifact(_) | Compiled::Invalid(_));
        self.give_back(reusable.then_some(worker));
        compiled
    }

    /// The idle worker, or a new one (waiting within the deadline when
    /// [`MAX_COMPILE_WORKERS`] are busy).
    fn take(&self, deadline: &Deadline) -> Result<WorkerProcess, Compiled> {
        let mut state = self.lock();
        loop {
            if let Some(mut worker) = state.idle.take() {
                if !worker.has_exited() {
                    return Ok(worker);
                }
                state.live -= 1;
                continue;
            }
            if state.live < MAX_COMPILE_WORKERS {
                state.live += 1;
                drop(state);
                return self.start(deadline).inspect_err(|_| self.give_back(None));
            }
            let left = deadline.remaining().unwrap_or(Duration::from_secs(3600));
            if left.is_zero() {
                return Err(Compiled::TimedOut);
            }
            self.freed.wait_for(&mut state, left);
        }
    }

    fn give_back(&self, worker: Option<WorkerProcess>) {
        let mut state = self.lock();
        let surplus = match worker {
            Some(worker) if state.idle.is_none() => {
                state.idle = Some(worker);
                None
            }
            other => {
                state.live -= 1;
                other
            }
        };
        drop(state);
        self.freed.notify_one();
        drop(surplus); // killed and reaped
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Starts a worker and checks that its artifacts will load here.
    fn start(&self, deadline: &Deadline) -> Result<WorkerProcess, Compiled> {
        let program = self.program.clone().map_err(Compiled::Unavailable)?;
        let spec = SpawnSpec { program: program.clone(), role: Role::WasmCompile, stack_bytes: 64 << 20 };
        let unavailable = |why: String| Compiled::Unavailable(format!("{}: {why}", program.display()));
        let mut worker = WorkerProcess::spawn(&spec).map_err(|e| unavailable(e.to_string()))?;
        let until = match deadline.remaining() {
            Some(left) => Instant::now() + left.min(START_LIMIT),
            None => Instant::now() + START_LIMIT,
        };
        let answer = match worker.send(&ToCompiler::Init(self.settings), Some(until)) {
            Ok(()) => worker.recv::<FromCompiler>(Some(until), 1 << 10),
            Err(_) => Err(RecvError::Closed),
        };
        match answer {
            Ok(FromCompiler::Ready { compatibility }) if compatibility == self.compatibility => Ok(worker),
            Ok(FromCompiler::Ready { .. }) => Err(unavailable("its artifacts would not load into this engine".into())),
            Ok(_) => Err(unavailable("it answered out of turn".into())),
            Err(RecvError::TimedOut) if deadline.expired() => Err(Compiled::TimedOut),
            Err(RecvError::TimedOut) => Err(unavailable("it did not start in time".into())),
            Err(RecvError::Invalid(why)) => Err(unavailable(why)),
            Err(RecvError::Closed) => Err(unavailable(match worker.death() {
                Death::Exited { code: EXIT_PROTOCOL_MISMATCH, .. } => "another build of execbox".into(),
                death => format!("it failed to start ({})", death.stderr()),
            })),
        }
    }

    fn converse(&self, worker: &mut WorkerProcess, wasm: &[u8], deadline: &Deadline) -> Compiled {
        let until = deadline.remaining().map(|left| Instant::now() + left);
        if worker.limit_memory(self.max_memory).is_err() {
            worker.kill();
            return Compiled::Unavailable("the compile worker died before it took the module".into());
        }
        match worker.send(&ToCompiler::Compile(STANDARD.encode(wasm)), until) {
            Ok(()) => {}
            Err(SendError::TimedOut) => {
                worker.kill();
                return Compiled::TimedOut;
            }
            Err(SendError::Closed { .. }) => {
                worker.kill();
                return Compiled::Unavailable("the compile worker died before it took the module".into());
            }
        }
        match worker.recv::<FromCompiler>(until, frame::MAX_FRAME_BYTES) {
            Ok(FromCompiler::Compiled(artifact)) => match STANDARD.decode(artifact) {
                Ok(bytes) => Compiled::Artifact(bytes),
                Err(e) => {
                    worker.kill();
                    Compiled::Invalid(format!("the compile worker sent an unreadable artifact: {e}"))
                }
            },
            Ok(FromCompiler::Invalid(reason)) => Compiled::Invalid(reason),
            Ok(FromCompiler::Ready { .. }) => {
                worker.kill();
                Compiled::Invalid("the compile worker broke the protocol".into())
            }
            Err(RecvError::TimedOut) => {
                worker.kill();
                Compiled::TimedOut
            }
            Err(RecvError::Invalid(why)) => {
                worker.kill();
                Compiled::Invalid(format!("the compile worker sent {why}"))
            }
            Err(RecvError::Closed) => {
                let death = worker.death();
                if death.ran_out_of_memory() {
                    Compiled::OutOfMemory(format!(
                        "compiling the module needed more than {} bytes (the compile memory cap)",
                        self.max_memory
                    ))
                } else {
                    let detail = death.first_stderr_line().unwrap_or("no message");
                    Compiled::Invalid(format!("the compiler crashed on this module: {detail}"))
                }
            }
        }
    }
}

/// The compile worker's main loop; returns its exit code.
pub(crate) fn serve() -> i32 {
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let send = |message: &FromCompiler| -> std::io::Result<()> {
        use std::io::Write as _;
        let bytes = frame::encode(message)?;
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        out.write_all(&bytes)?;
        out.flush()
    };
    let settings = match frame::read_blocking::<ToCompiler>(&mut input) {
        Ok(Some(ToCompiler::Init(settings))) => settings,
        Ok(None) => return 0,
        _ => {
            eprintln!("execbox compile worker: bad init frame");
            return 2;
        }
    };
    let mut config = settings.config();
    // One thread: nothing to spawn after lockdown.
    config.parallel_compilation(false);
    let engine = match Engine::new(&config) {
        Ok(engine) => engine,
        Err(e) => {
            eprintln!("execbox compile worker: cannot build the engine: {e:#}");
            return 2;
        }
    };
    // Lazy initializations (ISA detection, tables) happen before the lockdown.
    let _ = engine.precompile_module(b"(module (func (export \"f\") (result i32) i32.const 1))");
    if let Err(e) = lockdown::apply() {
        eprintln!("execbox compile worker: {}", crate::error::with_causes(&e));
        return 2;
    }
    if send(&FromCompiler::Ready { compatibility: compatibility(&engine) }).is_err() {
        return 0;
    }
    loop {
        let wasm = match frame::read_blocking::<ToCompiler>(&mut input) {
            Ok(Some(ToCompiler::Compile(wasm))) => wasm,
            Ok(None) => return 0,
            _ => {
                eprintln!("execbox compile worker: bad frame");
                return 2;
            }
        };
        let answer = match STANDARD.decode(wasm) {
            Err(e) => FromCompiler::Invalid(format!("unreadable module bytes: {e}")),
            Ok(bytes) => match engine.precompile_module(&bytes) {
                Ok(artifact) => FromCompiler::Compiled(STANDARD.encode(artifact)),
                Err(e) => FromCompiler::Invalid(format!("{e:#}")),
            },
        };
        if send(&answer).is_err() {
            return 0;
        }
    }
}
