//! The one frame schema between sandboxed code and the host, whatever
//! carries it (a worker's socket, a wasm instance's stdio or host import,
//! a container's Unix socket):
//!
//! ```text
//! code → host  {"tool_call": {"id": 7, "name": "memory.read_graph", "args": {...}}}
//! host → code  {"tool_result": {"id": 7, "ok": true, "value": ..., "truncated": false}}
//! host → code  {"tool_result": {"id": 7, "ok": false, "error": {"tool", "kind", "message"}}}
//! ```
//!
//! `id` is the code's own number for the call, echoed back; the host keeps
//! its own ledger and trusts nothing else the code sends. Two built-in
//! names need no grant: `tools.list` (the granted tools' names) and
//! `tools.describe` (`{"name"}` → the spec).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::tool::ToolError;

/// A call from code.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The code's number for this call, echoed in its result.
    pub id: u64,
    /// `namespace.tool`.
    pub name: String,
    /// A JSON object.
    #[serde(default)]
    pub args: Value,
}

/// The answer to a [`ToolCall`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The call's `id`.
    pub id: u64,
    /// Whether the call produced a value.
    pub ok: bool,
    /// The value, when `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
    /// True when `value` was cut to the result cap (its shape kept).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// The error, when not `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ToolError>,
}

impl ToolResult {
    /// A value for call `id`.
    pub fn value(id: u64, value: Value, truncated: bool) -> Self {
        Self { id, ok: true, value: Some(value), truncated, error: None }
    }

    /// An error for call `id`.
    pub fn error(id: u64, error: ToolError) -> Self {
        Self { id, ok: false, value: None, truncated: false, error: Some(error) }
    }
}

/// Code → host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToCodeHost {
    /// A call.
    ToolCall(ToolCall),
}

/// Host → code.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToCode {
    /// A call's answer.
    ToolResult(ToolResult),
}

/// `value` cut so that its JSON text fits `max` bytes, keeping its shape:
/// objects keep their keys, long strings end in `…`, long arrays keep their
/// first elements and end with a string saying how many were left out. If
/// even the shape does not fit, a string saying how large the value was.
/// Returns the value and whether it was cut.
pub fn cut_to_fit(value: Value, max: u64) -> (Value, bool) {
    let size = json_len(&value);
    if size <= max {
        return (value, false);
    }
    // Halve the allowance per string and array until the whole fits.
    let (mut string_max, mut array_max) = (4096usize, 256usize);
    while string_max >= 8 || array_max >= 1 {
        let cut = cut_with(&value, string_max, array_max, 0);
        if json_len(&cut) <= max {
            return (cut, true);
        }
        string_max /= 2;
        array_max /= 2;
        if string_max < 8 && array_max == 0 {
            break;
        }
    }
    (Value::String(format!("[result of {size} bytes of JSON, over the cap of {max}: cut]")), true)
}

/// Deepest level cut recursively; below it, values become a marker.
const MAX_CUT_DEPTH: usize = 64;

fn cut_with(value: &Value, string_max: usize, array_max: usize, depth: usize) -> Value {
    if depth >= MAX_CUT_DEPTH {
        return Value::String("…".into());
    }
    match value {
        Value::String(s) if s.len() > string_max => {
            let mut end = string_max;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            Value::String(format!("{}…", &s[..end]))
        }
        Value::Array(items) => {
            let mut kept: Vec<Value> =
                items.iter().take(array_max).map(|v| cut_with(v, string_max, array_max, depth + 1)).collect();
            if items.len() > array_max {
                kept.push(Value::String(format!("… {} more", items.len() - array_max)));
            }
            Value::Array(kept)
        }
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), cut_with(v, string_max, array_max, depth + 1))).collect())
        }
        other => other.clone(),
    }
}

/// The length of `value`'s JSON text (without building it).
pub(crate) fn json_len(value: &Value) -> u64 {
    struct Counter(u64);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn frames_have_one_shape() {
        let call: ToCodeHost =
            serde_json::from_str(r#"{"tool_call": {"id": 7, "name": "memory.read_graph", "args": {}}}"#).unwrap();
        assert_eq!(call, ToCodeHost::ToolCall(ToolCall { id: 7, name: "memory.read_graph".into(), args: json!({}) }));
        let ok = serde_json::to_value(ToCode::ToolResult(ToolResult::value(7, json!([1]), false))).unwrap();
        assert_eq!(ok, json!({"tool_result": {"id": 7, "ok": true, "value": [1]}}));
        let err = ToolResult::error(7, ToolError::failed("a.b", "no"));
        assert_eq!(
            serde_json::to_value(&err).unwrap(),
            json!({"id": 7, "ok": false, "error": {"tool": "a.b", "kind": "failed", "message": "no"}})
        );
    }

    #[test]
    fn a_large_result_is_cut_keeping_its_shape() {
        let big = json!({"rows": (0..10_000).map(|i| json!({"id": i, "text": "x".repeat(200)})).collect::<Vec<_>>(), "count": 10_000});
        let (cut, truncated) = cut_to_fit(big, 8 << 10);
        assert!(truncated);
        assert!(json_len(&cut) <= 8 << 10);
        assert_eq!(cut["count"], 10_000, "keys and scalars kept");
        let rows = cut["rows"].as_array().unwrap();
        assert!(rows.last().unwrap().as_str().unwrap().ends_with("more"));
        assert!(rows[0]["text"].as_str().unwrap().len() <= 210);
        let (small, truncated) = cut_to_fit(json!({"a": 1}), 100);
        assert_eq!((small, truncated), (json!({"a": 1}), false));
        let (tiny, truncated) = cut_to_fit(json!({"a": "x".repeat(100)}), 5);
        assert!(truncated && tiny.as_str().unwrap().contains("over the cap"), "{tiny}");
    }
}
