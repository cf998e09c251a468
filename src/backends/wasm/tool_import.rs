//! `execbox_tools`: the host import module through which a WebAssembly
//! guest (backend `wasm`) calls the host's tools (Code Mode). JSON in, JSON
//! out, so any guest language can use it. Every module may import it; in a
//! run whose policy grants no tools every call answers `not_granted` and
//! nothing reaches the host's tools.
//!
//! ```wat
//! (import "execbox_tools" "call"   (func $call   (param i32 i32) (result i64)))
//! (import "execbox_tools" "result" (func $result (param i32 i32) (result i32)))
//! ```
//!
//! - `call(ptr, len) -> i64`: reads `len` bytes at `ptr` of the guest's
//!   exported `memory`: a call as UTF-8 JSON,
//!   `{"id": <u64>, "name": "ns.tool", "args": {...}}` (`id` is the guest's
//!   own number for the call, echoed in the answer; `tools.list` and
//!   `tools.describe` with `{"name"}` are built in). It runs the call through
//!   the run's tool bridge — the guest waits, at most the call's timeout
//!   (`tool_limits.call_timeout_ms`) and never past the run's deadline, since
//!   the epoch deadline cannot interrupt a host call (on an async task it
//!   awaits the answer; elsewhere it blocks its thread) — keeps the answer and
//!   returns its length in bytes. The answer is a `ToolResult` as JSON:
//!   `{"id", "ok": true, "value": ..., "truncated"?: true}` or
//!   `{"id", "ok": false, "error": {"tool", "kind", "message"}}` (`kind` is
//!   `not_granted`, `budget_exhausted`, `timed_out`, `failed`, ... as in
//!   [`ToolErrorKind`](crate::tools::ToolErrorKind)).
//!   Negative when the request is malformed (nothing ran, no answer kept):
//!   `-1` it lies outside the guest's memory (or the module exports no
//!   `memory`), `-2` it is not such a JSON object.
//! - `result(ptr, len) -> i32`: copies the kept answer to `ptr` (at most
//!   `len` bytes) and returns how many bytes it copied; `-1` if
//!   `ptr..ptr+len` lies outside the guest's memory. The answer stays
//!   until the next `call`.
//!
//! A call whose JSON is longer than `tool_limits.max_argument_bytes` plus
//! 64 KiB is answered `invalid_arguments` without its arguments being
//! parsed. See `guests/c/tool_caller.c` for a guest in C.

use std::future::Future;

use wasmtime::{Caller, Linker, Memory};

use super::guest::GuestState;
use crate::tools::bridge::ToolBridge;
use crate::tools::frame::{ToolCall, ToolResult};
use crate::tools::wire::{Request, frame_limit, not_granted, read_bare_call};

/// The import module's name.
pub(crate) const MODULE: &str = "execbox_tools";

/// `call`'s answer to a request outside the guest's memory.
const OUT_OF_BOUNDS: i64 = -1;
/// `call`'s answer to a request that is not a call.
const MALFORMED: i64 = -2;

/// Adds `execbox_tools.call` and `execbox_tools.result` to `linker`.
pub(crate) fn add_to_linker(linker: &mut Linker<GuestState>) -> wasmtime::Result<()> {
    linker.func_wrap(MODULE, "call", call)?;
    linker.func_wrap(MODULE, "result", result)?;
    Ok(())
}

/// [`add_to_linker`] for the async linker: `call` awaits the answer
/// instead of blocking the thread.
pub(crate) fn add_async(linker: &mut Linker<GuestState>) -> wasmtime::Result<()> {
    linker.func_wrap_async(MODULE, "call", call_async)?;
    linker.func_wrap(MODULE, "result", result)?;
    Ok(())
}

fn memory(caller: &mut Caller<'_, GuestState>) -> Option<Memory> {
    caller.get_export("memory").and_then(|e| e.into_memory())
}

/// What a guest's `call` asks.
enum Asked {
    /// A call for the run's bridge.
    Call(ToolCall, std::sync::Arc<ToolBridge>),
    /// Answered at once (refused, not granted).
    Answered(ToolResult),
    /// `call`'s negative return: nothing ran, no answer kept.
    Bad(i64),
}

/// Reads the request at `ptr..ptr+len` of the guest's memory (parsed in
/// place: a long request is not copied out of the guest).
fn ask(caller: &mut Caller<'_, GuestState>, ptr: i32, len: i32) -> Asked {
    let Some(memory) = memory(caller) else { return Asked::Bad(OUT_OF_BOUNDS) };
    let bridge = caller.data().tools.clone();
    let (start, len) = (ptr as u32 as usize, len as u32 as usize);
    let request = match memory.data(&*caller).get(start..start.saturating_add(len)) {
        Some(bytes) => read_bare_call(bytes, frame_limit(bridge.as_deref())),
        None => return Asked::Bad(OUT_OF_BOUNDS),
    };
    match (request, bridge) {
        (Request::Malformed { .. }, _) => Asked::Bad(MALFORMED),
        (Request::Call(call), Some(bridge)) => Asked::Call(call, bridge),
        (Request::Call(call), None) => Asked::Answered(not_granted(call.id, &call.name)),
        (Request::TooLarge { id, name, len }, Some(bridge)) => Asked::Answered(bridge.refuse_unread(id, &name, len)),
        (Request::TooLarge { id, name, .. }, None) => Asked::Answered(not_granted(id, &name)),
    }
}

/// Keeps `answer` for `result` and returns its length.
fn keep(caller: &mut Caller<'_, GuestState>, answer: &ToolResult) -> wasmtime::Result<i64> {
    let answer = serde_json::to_vec(answer)?;
    let len = answer.len() as i64;
    caller.data_mut().tool_answer = answer;
    Ok(len)
}

fn call(mut caller: Caller<'_, GuestState>, ptr: i32, len: i32) -> wasmtime::Result<i64> {
    let answer = match ask(&mut caller, ptr, len) {
        Asked::Bad(code) => return Ok(code),
        Asked::Answered(answer) => answer,
        Asked::Call(call, bridge) => bridge.call_blocking(call),
    };
    keep(&mut caller, &answer)
}

fn call_async<'a>(
    mut caller: Caller<'a, GuestState>,
    (ptr, len): (i32, i32),
) -> Box<dyn Future<Output = wasmtime::Result<i64>> + Send + 'a> {
    Box::new(async move {
        let answer = match ask(&mut caller, ptr, len) {
            Asked::Bad(code) => return Ok(code),
            Asked::Answered(answer) => answer,
            Asked::Call(call, bridge) => bridge.call_async(call).await,
        };
        keep(&mut caller, &answer)
    })
}

fn result(mut caller: Caller<'_, GuestState>, ptr: i32, len: i32) -> wasmtime::Result<i32> {
    let Some(memory) = memory(&mut caller) else { return Ok(-1) };
    let (start, len) = (ptr as u32 as usize, len as u32 as usize);
    let (data, state) = memory.data_and_store_mut(&mut caller);
    let Some(target) = data.get_mut(start..start.saturating_add(len)) else { return Ok(-1) };
    let n = len.min(state.tool_answer.len());
    target[..n].copy_from_slice(&state.tool_answer[..n]);
    Ok(i32::try_from(n).unwrap_or(i32::MAX))
}
