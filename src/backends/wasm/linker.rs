//! The WASI preview-1 linkers of an engine, one for runs that may block
//! their thread and one for runs on an async task: wasmtime-wasi's
//! functions, with execbox's own `poll_oneoff` (sleeps end at the run's
//! deadline) and the file guards of `fs_guard.rs` in front of theirs; and
//! the `execbox_tools` import module (`tool_import.rs`).

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use wasmtime::{Caller, Engine, Linker};

use super::fs_guard;
use super::guest::GuestState;
use super::tool_import;

/// The host error that ends a run whose guest sleeps past its deadline.
#[derive(Debug)]
pub(crate) struct DeadlineReached;

impl std::fmt::Display for DeadlineReached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("deadline reached while the guest slept")
    }
}

impl std::error::Error for DeadlineReached {}

/// WASI preview 1, with execbox's own `poll_oneoff`, and its own
/// `path_open`, `path_symlink`, `path_rename` and `path_link` (see `fs_guard.rs`);
/// and `execbox_tools` (see `tool_import.rs`). For stores called with the
/// synchronous API (a run on a thread that may block).
///
/// Epoch interruption only fires in wasm code, and wasmtime-wasi's
/// `poll_oneoff` sleeps on the host thread: `sleep(3600)` would hold the
/// caller for an hour. This replacement never sleeps past the deadline (it
/// sleeps until the deadline and stops the run as `timed_out`). Every file
/// descriptor here is always ready (stdin is in memory, files are local,
/// output is buffered), so a poll with any fd subscription returns at once,
/// reporting the fds and any clock already due, as wasmtime-wasi would.
pub(crate) fn linker(engine: &Engine) -> wasmtime::Result<Linker<GuestState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |s: &mut GuestState| &mut s.wasi)?;
    linker.allow_shadowing(true);
    linker.func_wrap("wasi_snapshot_preview1", "poll_oneoff", poll_oneoff)?;
    linker.func_wrap("wasi_snapshot_preview1", "path_open", fs_guard::path_open)?;
    linker.func_wrap("wasi_snapshot_preview1", "path_symlink", fs_guard::path_symlink)?;
    linker.func_wrap("wasi_snapshot_preview1", "path_rename", fs_guard::path_rename)?;
    linker.func_wrap("wasi_snapshot_preview1", "path_link", fs_guard::path_link)?;
    linker.func_wrap("wasi_snapshot_preview1", "random_get", random_get)?;
    linker.allow_shadowing(false);
    tool_import::add_to_linker(&mut linker)?;
    Ok(linker)
}

/// The same functions as [`linker`], for stores called with the async API
/// (a run on the caller's async task, see `run.rs`): wasmtime-wasi's async
/// preview 1, and execbox's own functions in async form. Nothing here
/// blocks the thread: `poll_oneoff` awaits an alarm of the epoch ticker,
/// a tool call awaits its answer, and file operations (a run with no
/// preopens has none to make) go to tokio's blocking pool.
pub(crate) fn linker_async(engine: &Engine) -> wasmtime::Result<Linker<GuestState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p1::add_to_linker_async(&mut linker, |s: &mut GuestState| &mut s.wasi)?;
    linker.allow_shadowing(true);
    linker.func_wrap_async("wasi_snapshot_preview1", "poll_oneoff", poll_oneoff_async)?;
    linker.func_wrap_async("wasi_snapshot_preview1", "random_get", random_get_async)?;
    fs_guard::add_async(&mut linker)?;
    linker.allow_shadowing(false);
    tool_import::add_async(&mut linker)?;
    Ok(linker)
}

/// WASI preview-1 errno values used here.
const ERRNO_SUCCESS: i32 = 0;
const ERRNO_FAULT: i32 = 21;
const ERRNO_INVAL: i32 = 28;

fn poll_oneoff(
    mut caller: Caller<'_, GuestState>,
    subs: i32,
    events: i32,
    n: i32,
    nevents: i32,
) -> wasmtime::Result<i32> {
    let poll = match Subscriptions::read(&mut caller, subs, n) {
        Ok(poll) => poll,
        Err(errno) => return Ok(errno),
    };
    if !poll.wait.is_zero() && caller.data().controls.sleep(poll.wait) {
        return Err(wasmtime::Error::new(DeadlineReached));
    }
    Ok(poll.answer(&mut caller, events, nevents))
}

/// [`poll_oneoff`] on an async task: the sleep awaits.
fn poll_oneoff_async<'a>(
    mut caller: Caller<'a, GuestState>,
    (subs, events, n, nevents): (i32, i32, i32, i32),
) -> Box<dyn Future<Output = wasmtime::Result<i32>> + Send + 'a> {
    Box::new(async move {
        let poll = match Subscriptions::read(&mut caller, subs, n) {
            Ok(poll) => poll,
            Err(errno) => return Ok(errno),
        };
        if !poll.wait.is_zero() {
            let state = caller.data();
            let (controls, alarms) = (state.controls.clone(), state.alarms.clone());
            if controls.sleep_async(poll.wait, &alarms).await {
                return Err(wasmtime::Error::new(DeadlineReached));
            }
        }
        Ok(poll.answer(&mut caller, events, nevents))
    })
}

/// Bytes of a guest's buffer `random_get` fills at a time: between two, the
/// run stops if its deadline passed, and a run on an async task yields.
const RANDOM_CHUNK: usize = 64 << 10;

/// `random_get`: fills the guest's buffer from the OS's random source in
/// place, [`RANDOM_CHUNK`] bytes at a time, and stops the run at its
/// deadline between two. wasmtime-wasi's builds the whole buffer on the
/// host first (up to 64 MiB, outside the run's memory cap), a byte at a
/// time and with no look at the deadline: a guest that asked for 64 MiB in
/// a loop held its thread for seconds past its deadline.
fn random_get(mut caller: Caller<'_, GuestState>, buf: i32, len: i32) -> wasmtime::Result<i32> {
    let Ok((memory, chunks)) = RandomFill::new(&mut caller, buf, len) else { return Ok(ERRNO_FAULT) };
    let controls = caller.data().controls.clone();
    for chunk in chunks {
        if controls.deadline().expired() {
            return Err(wasmtime::Error::new(DeadlineReached));
        }
        fill_random(&mut memory.data_mut(&mut caller)[chunk])?;
    }
    Ok(ERRNO_SUCCESS)
}

/// [`random_get`] on an async task: it yields to the runtime between two
/// chunks.
fn random_get_async<'a>(
    mut caller: Caller<'a, GuestState>,
    (buf, len): (i32, i32),
) -> Box<dyn Future<Output = wasmtime::Result<i32>> + Send + 'a> {
    Box::new(async move {
        let Ok((memory, chunks)) = RandomFill::new(&mut caller, buf, len) else { return Ok(ERRNO_FAULT) };
        let deadline = caller.data().controls.deadline();
        let mut first = true;
        for chunk in chunks {
            if !std::mem::take(&mut first) {
                tokio::task::yield_now().await;
            }
            if deadline.expired() {
                return Err(wasmtime::Error::new(DeadlineReached));
            }
            fill_random(&mut memory.data_mut(&mut caller)[chunk])?;
        }
        Ok(ERRNO_SUCCESS)
    })
}

/// The chunks of a `random_get` buffer, checked to lie in the guest's memory.
struct RandomFill {
    at: usize,
    end: usize,
}

impl RandomFill {
    /// The guest's memory and the chunks of `buf..buf+len`; `Err` when the
    /// guest has no memory or the buffer is outside it (`EFAULT`).
    fn new(caller: &mut Caller<'_, GuestState>, buf: i32, len: i32) -> Result<(wasmtime::Memory, Self), ()> {
        let memory = caller.get_export("memory").and_then(|e| e.into_memory()).ok_or(())?;
        let at = buf as u32 as usize;
        let end = at.checked_add(len as u32 as usize).filter(|&end| end <= memory.data_size(&*caller)).ok_or(())?;
        Ok((memory, Self { at, end }))
    }
}

impl Iterator for RandomFill {
    type Item = std::ops::Range<usize>;

    fn next(&mut self) -> Option<Self::Item> {
        (self.at < self.end).then(|| {
            let chunk = self.at..self.end.min(self.at.saturating_add(RANDOM_CHUNK));
            self.at = chunk.end;
            chunk
        })
    }
}

fn fill_random(bytes: &mut [u8]) -> wasmtime::Result<()> {
    getrandom::fill(bytes).map_err(|e| wasmtime::format_err!("the OS random source failed: {e}"))
}

/// A guest's `poll_oneoff` subscriptions, read from its memory: each one's
/// (userdata, event type, time until due; fds are due now), and how long
/// the poll waits (until the first is due).
struct Subscriptions {
    memory: wasmtime::Memory,
    pending: Vec<(u64, u8, Duration)>,
    wait: Duration,
}

impl Subscriptions {
    /// The `n` subscriptions at `subs`, or the errno of a bad request.
    fn read(caller: &mut Caller<'_, GuestState>, subs: i32, n: i32) -> Result<Self, i32> {
        const SUB_SIZE: usize = 48; // sizeof(subscription)
        const ABSTIME: u16 = 1;
        let Some(memory) = caller.get_export("memory").and_then(|e| e.into_memory()) else {
            return Err(ERRNO_FAULT);
        };
        let n = n as u32 as usize;
        if n == 0 {
            return Err(ERRNO_INVAL);
        }
        let mut raw = vec![0u8; n.saturating_mul(SUB_SIZE).min(1 << 20)];
        if raw.len() != n * SUB_SIZE || memory.read(&*caller, subs as u32 as usize, &mut raw).is_err() {
            return Err(ERRNO_FAULT);
        }

        let guest_now = caller.data().clock_start.elapsed();
        let wall_now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let mut pending = Vec::with_capacity(n);
        for sub in raw.chunks_exact(SUB_SIZE) {
            let le_u64 = |at: usize| u64::from_le_bytes(sub[at..at + 8].try_into().unwrap_or([0; 8]));
            let userdata = le_u64(0);
            let tag = sub[8];
            let due = if tag == 0 {
                let clock_id = u32::from_le_bytes(sub[16..20].try_into().unwrap_or([0; 4]));
                let timeout = Duration::from_nanos(le_u64(24));
                let flags = u16::from_le_bytes([sub[40], sub[41]]);
                match (flags & ABSTIME != 0, clock_id) {
                    (false, _) => timeout,
                    (true, 0) => timeout.saturating_sub(wall_now),
                    (true, 1) => timeout.saturating_sub(guest_now),
                    (true, _) => Duration::ZERO,
                }
            } else {
                Duration::ZERO
            };
            pending.push((userdata, tag, due));
        }
        let wait = pending.iter().map(|&(_, _, due)| due).min().unwrap_or_default();
        Ok(Self { memory, pending, wait })
    }

    /// Writes the events due after the wait at `events` and their count at
    /// `nevents`; the errno of the poll.
    fn answer(&self, caller: &mut Caller<'_, GuestState>, events: i32, nevents: i32) -> i32 {
        const EVENT_SIZE: usize = 32; // sizeof(event)
        let mut count = 0u32;
        for &(userdata, tag, due) in &self.pending {
            if due > self.wait {
                continue;
            }
            let mut event = [0u8; EVENT_SIZE];
            event[0..8].copy_from_slice(&userdata.to_le_bytes());
            event[10] = tag; // event type mirrors the subscription tag
            if tag != 0 {
                event[16..24].copy_from_slice(&1u64.to_le_bytes()); // nbytes, as wasmtime-wasi reports
            }
            let at = (events as u32 as usize).saturating_add(count as usize * EVENT_SIZE);
            if self.memory.write(&mut *caller, at, &event).is_err() {
                return ERRNO_FAULT;
            }
            count += 1;
        }
        if self.memory.write(&mut *caller, nevents as u32 as usize, &count.to_le_bytes()).is_err() {
            return ERRNO_FAULT;
        }
        ERRNO_SUCCESS
    }
}
