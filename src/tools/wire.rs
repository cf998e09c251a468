//! What every carrier of the tool bridge reads and writes the same way,
//! whatever moves the bytes (a wasm instance's stdio, a wasm guest's host
//! import, a container's Unix socket): how long a call frame may be
//! ([`frame_limit`]), what a carrier made of a frame ([`Request`], read by
//! [`read_frame`] or [`read_bare_call`]) and how it is answered
//! ([`Request::dispatch`]), and the header that installs a Python run's
//! `tools` package ([`python_header`]).

use std::sync::Arc;

use serde::Deserialize;

use super::bridge::ToolBridge;
use super::frame::{ToCodeHost, ToolCall, ToolResult};
use crate::error::tool::{ToolError, ToolErrorKind};
use crate::limits::records::CallFrame;

/// Bytes a call frame may have beyond its arguments (the id, the name, the
/// frame's own keys).
pub(crate) const FRAME_OVERHEAD: u64 = 64 << 10;

/// Most bytes of one call frame a carrier reads whole: the arguments'
/// limit (`max_argument_bytes` of `bridge`'s limits, 0 without a bridge)
/// and [`FRAME_OVERHEAD`]. A longer call is refused without being parsed.
pub(crate) fn frame_limit(bridge: Option<&ToolBridge>) -> u64 {
    bridge.map_or(0, |b| b.limits().max_argument_bytes).saturating_add(FRAME_OVERHEAD)
}

/// The names of the tools `bridge` grants, sorted: what the code's `tools`
/// API is built from.
pub(crate) fn granted_names(bridge: &ToolBridge) -> Vec<String> {
    bridge.granted_specs().iter().map(|spec| spec.name.clone()).collect()
}

/// What goes before a Python run's code (or a session's cell) that may call
/// tools: `\0tools:{"nonce": ..., "names": [...]}\n`. The runner takes it
/// off and installs the `tools` package (a NUL never starts Python code);
/// see `python_tools_def!` in `backends/conventions.rs`. Carriers whose
/// calls need no nonce (a container's socket) pass an empty one.
pub(crate) fn python_header(nonce: &str, bridge: &ToolBridge) -> Vec<u8> {
    let spec = serde_json::json!({"nonce": nonce, "names": granted_names(bridge)});
    let mut header = b"\0tools:".to_vec();
    // A JSON value always serializes; it holds no newline.
    let _ = serde_json::to_writer(&mut header, &spec);
    header.push(b'\n');
    header
}

/// The answer to a call made without a grant: nothing reaches the tools.
pub(crate) fn not_granted(id: u64, name: &str) -> ToolResult {
    ToolResult::error(
        id,
        ToolError::new(name, ToolErrorKind::NotGranted, "this run's policy grants no tools".to_string()),
    )
}

/// What a carrier read of a call.
pub(crate) enum Request {
    /// A call frame.
    Call(ToolCall),
    /// A frame too long to read whole: its id and name, and its length.
    TooLarge { id: u64, name: String, len: u64 },
    /// Not a call frame: answered `protocol`, echoing its id if one was found.
    Malformed { id: u64, why: String },
}

impl Request {
    /// Answers it through `bridge` (or `not_granted` without one), calling
    /// `reply` exactly once unless the run ends first.
    pub(crate) fn dispatch(self, bridge: Option<&Arc<ToolBridge>>, reply: impl FnOnce(ToolResult) + Send + 'static) {
        match (self, bridge) {
            (Request::Call(call), Some(bridge)) => bridge.call(call, reply),
            (Request::Call(call), None) => reply(not_granted(call.id, &call.name)),
            (Request::TooLarge { id, name, len }, Some(bridge)) => reply(bridge.refuse_unread(id, &name, len)),
            (Request::TooLarge { id, name, .. }, None) => reply(not_granted(id, &name)),
            (Request::Malformed { id, why }, _) => {
                reply(ToolResult::error(id, ToolError::new("", ToolErrorKind::Protocol, why)))
            }
        }
    }
}

/// The id and name of a call, its arguments skipped without being kept.
#[derive(Deserialize)]
struct Head {
    id: u64,
    name: String,
    #[serde(default)]
    #[allow(dead_code)]
    args: serde::de::IgnoredAny,
}

/// Reads a bare [`ToolCall`] (`{"id","name","args"}`, the `execbox_tools`
/// import's request) of `json`, at most `limit` bytes of it whole.
#[cfg_attr(not(feature = "wasm"), allow(dead_code))]
pub(crate) fn read_bare_call(json: &[u8], limit: u64) -> Request {
    if json.len() as u64 <= limit {
        return match serde_json::from_slice::<ToolCall>(json) {
            Ok(call) => Request::Call(call),
            Err(e) => malformed(json, e),
        };
    }
    // Parsed, but the arguments skipped: nothing of them is kept.
    match serde_json::from_slice::<Head>(json) {
        Ok(head) => Request::TooLarge { id: head.id, name: head.name, len: json.len() as u64 },
        Err(e) => Request::Malformed { id: 0, why: format!("not a tool call: {e}") },
    }
}

/// Reads a call frame (`{"tool_call": {...}}`): whole, or only its head
/// when it was too long to keep.
pub(crate) fn read_frame(frame: CallFrame) -> Request {
    match frame {
        CallFrame::Whole(json) => match serde_json::from_slice::<ToCodeHost>(&json) {
            Ok(ToCodeHost::ToolCall(call)) => Request::Call(call),
            Err(e) => malformed(&json, e),
        },
        CallFrame::TooLarge { head, len } => match frame_head(&head) {
            Some((id, name)) => Request::TooLarge { id, name, len },
            None => Request::Malformed { id: 0, why: format!("a call of {len} bytes whose id and name come too late") },
        },
    }
}

/// The id and name of a long frame from its first bytes: the runners write
/// `{"tool_call":{"id":N,"name":"...",` before the arguments, so the head
/// cut just before `,"args":` and closed is a frame of its own. (That byte
/// sequence cannot occur inside a JSON string, whose quotes are escaped.)
fn frame_head(head: &[u8]) -> Option<(u64, String)> {
    const ARGS: &[u8] = b",\"args\":";
    let at = head.windows(ARGS.len()).position(|w| w == ARGS)?;
    let closed = [&head[..at], b"}}"].concat();
    match serde_json::from_slice::<ToCodeHost>(&closed).ok()? {
        ToCodeHost::ToolCall(call) => Some((call.id, call.name)),
    }
}

/// A frame that did not parse: answered `protocol` with its id when it has one.
fn malformed(json: &[u8], e: serde_json::Error) -> Request {
    let value: Option<serde_json::Value> = serde_json::from_slice(json).ok();
    let id = value
        .as_ref()
        .and_then(|v| v.get("tool_call").unwrap_or(v).get("id"))
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0);
    Request::Malformed { id, why: format!("not a tool call frame: {e}") }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn frames_are_read_whole_or_by_their_head() {
        let whole = br#"{"tool_call":{"id":3,"name":"a.b","args":{"x":1}}}"#.to_vec();
        match read_frame(CallFrame::Whole(whole)) {
            Request::Call(call) => assert_eq!((call.id, call.name, call.args), (3, "a.b".into(), json!({"x": 1}))),
            _ => panic!("a call"),
        }
        let head = br#"{"tool_call":{"id":4,"name":"a.\",\"args\":b","args":{"x":"xxxx"#.to_vec();
        match read_frame(CallFrame::TooLarge { head, len: 1 << 20 }) {
            Request::TooLarge { id, name, len } => {
                assert_eq!((id, name.as_str(), len), (4, "a.\",\"args\":b", 1 << 20))
            }
            _ => panic!("too large"),
        }
        match read_frame(CallFrame::Whole(br#"{"tool_call":{"id":5,"args":{}}}"#.to_vec())) {
            Request::Malformed { id, .. } => assert_eq!(id, 5),
            _ => panic!("malformed"),
        }
        match read_frame(CallFrame::TooLarge { head: b"{\"args\":".to_vec(), len: 1 << 20 }) {
            Request::Malformed { id, .. } => assert_eq!(id, 0),
            _ => panic!("malformed"),
        }
        let bare = format!(r#"{{"id":6,"name":"a.b","args":{{"s":"{}"}}}}"#, "x".repeat(100));
        assert!(matches!(read_bare_call(bare.as_bytes(), 1000), Request::Call(_)));
        let len = bare.len() as u64;
        assert!(matches!(read_bare_call(bare.as_bytes(), 10), Request::TooLarge { id: 6, len: l, .. } if l == len));
        assert!(matches!(read_bare_call(b"[1]", 10), Request::Malformed { id: 0, .. }));
    }
}
