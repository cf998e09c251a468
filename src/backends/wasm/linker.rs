//! The WASI preview-1 linker of an engine: wasmtime-wasi's functions, with
//! execbox's own `poll_oneoff` (sleeps end at the run's deadline) and the
//! file guards of `fs_guard.rs` in front of theirs; and the `execbox_tools`
//! import module (`tool_import.rs`).

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
/// and `execbox_tools` (see `tool_import.rs`).
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
    linker.allow_shadowing(false);
    tool_import::add_to_linker(&mut linker)?;
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
    const SUB_SIZE: usize = 48; // sizeof(subscription)
    const EVENT_SIZE: usize = 32; // sizeof(event)
    const ABSTIME: u16 = 1;
    let Some(memory) = caller.get_export("memory").and_then(|e| e.into_memory()) else {
        return Ok(ERRNO_FAULT);
    };
    let n = n as u32 as usize;
    if n == 0 {
        return Ok(ERRNO_INVAL);
    }
    let mut raw = vec![0u8; n.saturating_mul(SUB_SIZE).min(1 << 20)];
    if raw.len() != n * SUB_SIZE || memory.read(&caller, subs as u32 as usize, &mut raw).is_err() {
        return Ok(ERRNO_FAULT);
    }

    // Each subscription: (userdata, event type, time until due; fds are due now).
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
    if !wait.is_zero() && caller.data().controls.sleep(wait) {
        return Err(wasmtime::Error::new(DeadlineReached));
    }

    let mut count = 0u32;
    for &(userdata, tag, due) in &pending {
        if due > wait {
            continue;
        }
        let mut event = [0u8; EVENT_SIZE];
        event[0..8].copy_from_slice(&userdata.to_le_bytes());
        event[10] = tag; // event type mirrors the subscription tag
        if tag != 0 {
            event[16..24].copy_from_slice(&1u64.to_le_bytes()); // nbytes, as wasmtime-wasi reports
        }
        let at = (events as u32 as usize).saturating_add(count as usize * EVENT_SIZE);
        if memory.write(&mut caller, at, &event).is_err() {
            return Ok(ERRNO_FAULT);
        }
        count += 1;
    }
    if memory.write(&mut caller, nevents as u32 as usize, &count.to_le_bytes()).is_err() {
        return Ok(ERRNO_FAULT);
    }
    Ok(ERRNO_SUCCESS)
}
