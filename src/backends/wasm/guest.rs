//! What every part of a guest run shares: a compiled module and its ABI
//! ([`Compiled`], [`GuestAbi`]), a store's data ([`GuestState`]), the limits
//! the host may change while the guest runs ([`RunControls`]) and the
//! directories it sees ([`Preopen`]).
//!
//! A leaf: the compile cache, the engine, the WASI linker and the runs all
//! build on these types, and none of them is imported from here.

use parking_lot::{Condvar, Mutex};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use wasmtime::{InstancePre, ResourceLimiter};
use wasmtime_wasi::FsPerms;
use wasmtime_wasi::p1::WasiP1Ctx;

use super::ticker::{Alarm, Alarms};
use crate::limits::deadline::Deadline;
use crate::tools::ToolBridge;

/// How execbox talks to a guest, decided from its exports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GuestAbi {
    /// A WASI preview-1 command: `_start`, stdio, argv, env, exit code.
    Command,
    /// The JSON ABI: `memory`, `alloc(len) -> ptr`, `run(ptr, len) -> (ptr << 32 | len)`;
    /// `_initialize` runs first when exported (wasi-libc reactors).
    JsonAbi {
        /// The module exports `_initialize`.
        initialize: bool,
    },
}

/// A module ready to instantiate: linked for runs that may block their
/// thread, and for runs on an async task.
pub(crate) struct Compiled {
    pub(crate) pre: InstancePre<GuestState>,
    pub(crate) pre_async: InstancePre<GuestState>,
    pub(crate) abi: GuestAbi,
}

/// A host directory the guest sees at `guest`.
pub(crate) struct Preopen {
    pub(crate) host: PathBuf,
    pub(crate) guest: String,
    pub(crate) perms: FsPerms,
}

/// The store's data: the WASI context and the per-run limits.
pub(crate) struct GuestState {
    pub(crate) wasi: WasiP1Ctx,
    pub(crate) limits: MemoryLimits,
    pub(crate) controls: Arc<RunControls>,
    /// When the guest's monotonic clock started (with the store).
    pub(crate) clock_start: Instant,
    /// The run's tool bridge, for the `execbox_tools` import (`None`: every
    /// call answers `not_granted`).
    pub(crate) tools: Option<Arc<ToolBridge>>,
    /// The last answer of `execbox_tools.call`, until `result` copies it.
    pub(crate) tool_answer: Vec<u8>,
    /// The engine ticker's alarms, for a guest that sleeps on an async task.
    pub(crate) alarms: Arc<Alarms>,
}

/// The limits of a run that the host may set while the guest is already
/// running: a warm instance gets its deadline and memory cap only when its
/// code arrives.
pub(crate) struct RunControls {
    deadline: Mutex<Deadline>,
    /// Wakes a guest sleeping in `poll_oneoff` when the deadline moves
    /// (a killed session's is moved to now).
    moved: Condvar,
    memory_cap: AtomicUsize,
    /// Largest linear memory so far.
    peak: AtomicUsize,
    /// Memory was refused since the last [`RunControls::arm`].
    denied: AtomicBool,
}

impl RunControls {
    pub(crate) fn new(deadline: Deadline, memory_cap: usize) -> Arc<Self> {
        Arc::new(Self {
            deadline: Mutex::new(deadline),
            moved: Condvar::new(),
            memory_cap: AtomicUsize::new(memory_cap),
            peak: AtomicUsize::new(0),
            denied: AtomicBool::new(false),
        })
    }

    pub(crate) fn deadline(&self) -> Deadline {
        *self.deadline.lock()
    }

    /// Starts the run's clock and sets its memory cap.
    pub(crate) fn arm(&self, deadline: Deadline, memory_cap: usize) {
        *self.deadline.lock() = deadline;
        self.memory_cap.store(memory_cap, Ordering::SeqCst);
        self.denied.store(false, Ordering::SeqCst);
        self.moved.notify_all();
    }

    /// Moves the deadline to now: the guest stops at its next epoch tick,
    /// and a guest sleeping in `poll_oneoff` wakes and stops at once.
    pub(crate) fn expire_now(&self) {
        *self.deadline.lock() = Deadline::start(Some(Duration::ZERO));
        self.moved.notify_all();
    }

    /// Sleeps for `wait`, or until the deadline if that comes first
    /// (true: the deadline was reached). Wakes when the deadline moves.
    pub(crate) fn sleep(&self, wait: Duration) -> bool {
        let until = Instant::now() + wait;
        let mut deadline = self.deadline.lock();
        loop {
            if deadline.expired() {
                return true;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let step = deadline.remaining().map_or(left, |d| d.min(left));
            self.moved.wait_for(&mut deadline, step);
        }
    }

    /// [`RunControls::sleep`] for a guest on an async task: awaits an
    /// [`Alarm`] of `alarms` (rung by the epoch ticker, within a tick of its
    /// time) instead of blocking the thread. The deadline of a run on an
    /// async task never moves (only warm instances and sessions move
    /// theirs, and they run on threads of their own), so it is read once.
    pub(crate) async fn sleep_async(&self, wait: Duration, alarms: &Alarms) -> bool {
        let deadline = self.deadline();
        let until = Instant::now() + wait;
        // `now` read after `remaining`: the alarm is never set before the deadline.
        let wake = deadline.remaining().map_or(until, |left| until.min(Instant::now() + left));
        Alarm::at(alarms, wake).await;
        deadline.expired()
    }

    /// The memory cap in force, in bytes.
    pub(crate) fn memory_cap(&self) -> usize {
        self.memory_cap.load(Ordering::SeqCst)
    }

    /// True if memory (or a table) was refused since the last `arm`.
    pub(crate) fn denied(&self) -> bool {
        self.denied.load(Ordering::SeqCst)
    }

    /// Largest linear memory so far, in bytes.
    pub(crate) fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }
}

/// Caps linear memory and tables per store and remembers whether the guest
/// was refused memory, so a failure after that reads as `out_of_memory`.
pub(crate) struct MemoryLimits {
    controls: Arc<RunControls>,
    table_elements: usize,
    denied: bool,
}

impl MemoryLimits {
    /// Limits read from `controls` (memory) and at most `table_elements` per table.
    pub(crate) fn new(controls: Arc<RunControls>, table_elements: usize) -> Self {
        Self { controls, table_elements, denied: false }
    }

    /// True if this store was refused memory (or a table) at any time.
    pub(crate) fn denied(&self) -> bool {
        self.denied
    }
}

impl ResourceLimiter for MemoryLimits {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.controls.memory_cap() {
            self.denied = true;
            self.controls.denied.store(true, Ordering::SeqCst);
            return Ok(false); // the guest's memory.grow returns -1
        }
        self.controls.peak.fetch_max(desired, Ordering::SeqCst);
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.table_elements {
            self.denied = true;
            self.controls.denied.store(true, Ordering::SeqCst);
            return Ok(false);
        }
        Ok(true)
    }

    fn instances(&self) -> usize {
        1
    }

    fn memories(&self) -> usize {
        1
    }

    fn tables(&self) -> usize {
        8
    }
}
