//! Nesting bounds on JSON values, checked before anything recursive sees
//! them (source text is measured by the JavaScript lexer of the boa backend,
//! `backends::boa::lexer`, its only user).
//!
//! Serializers, parsers and converters recurse per nesting level, and a
//! native stack overflow aborts the whole host process. So depth is measured
//! up front, in linear time and constant stack, and refused beyond a bound.

use serde_json::Value;

use crate::error::InvalidRequest;
pub use crate::json::{drop_deep, json_depth_exceeds, json_fits};

/// Takes the request's JSON input out of `slot` if it nests at most `max`
/// levels; a deeper one is dropped without recursion and refused.
pub fn take_bounded_input(slot: &mut Option<Value>, max: usize) -> Result<Option<Value>, InvalidRequest> {
    let Some(input) = slot.take() else { return Ok(None) };
    match json_depth_exceeds(&input, max) {
        None => Ok(Some(input)),
        Some(depth) => {
            drop_deep(input);
            Err(InvalidRequest::TooDeep { what: "input", depth, max })
        }
    }
}

/// [`take_bounded_input`], serialized as the JSON text a program reads
/// (`input.json`, stdin); `backend` names the (never expected) failure.
pub fn take_input_json(
    slot: &mut Option<Value>,
    max: usize,
    backend: &str,
) -> Result<Option<Vec<u8>>, crate::error::ExecError> {
    take_bounded_input(slot, max)?
        .map(|value| serde_json::to_vec(&value))
        .transpose()
        .map_err(|e| crate::error::ExecError::internal_caused(backend, "cannot serialize input", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_depth() {
        assert_eq!(json_depth_exceeds(&json!([[[1]]]), 3), None);
        assert_eq!(json_depth_exceeds(&json!([[[1]]]), 2), Some(3));
        assert_eq!(json_depth_exceeds(&json!({"a": {"b": 1}}), 2), None);
        let mut deep = json!(1);
        for _ in 0..100_000 {
            deep = Value::Array(vec![deep]);
        }
        assert!(json_depth_exceeds(&deep, 1000).is_some());
        drop_deep(deep);
    }
}
