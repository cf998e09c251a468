//! Nesting bounds on JSON values, checked before anything recursive sees
//! them (source text is measured by the JavaScript lexer of the boa backend,
//! `backends::boa::lexer`, its only user).
//!
//! Serializers, parsers and converters recurse per nesting level, and a
//! native stack overflow aborts the whole host process. So depth is measured
//! up front, in linear time and constant stack, and refused beyond a bound.

use serde_json::Value;

use crate::error::InvalidRequest;

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
        .map_err(|e| crate::error::ExecError::internal(backend, format!("cannot serialize input: {e}")))
}

/// Returns the nesting depth of `value` if it exceeds `max` (containers count
/// one level each), without recursion.
pub fn json_depth_exceeds(value: &Value, max: usize) -> Option<usize> {
    let mut stack: Vec<(&Value, usize)> = vec![(value, 1)];
    while let Some((v, depth)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Array(a) => Box::new(a.iter()),
            Value::Object(o) => Box::new(o.values()),
            _ => continue,
        };
        if depth > max {
            return Some(depth);
        }
        stack.extend(children.map(|c| (c, depth + 1)));
    }
    None
}

/// Whether `value` serializes to at most `max` bytes of JSON; stops
/// serializing as soon as it is over.
pub fn json_fits(value: &serde_json::Value, max: u64) -> bool {
    struct Counter {
        written: u64,
        max: u64,
    }
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.written = self.written.saturating_add(buf.len() as u64);
            if self.written > self.max {
                return Err(std::io::Error::other("over the cap"));
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    serde_json::to_writer(Counter { written: 0, max }, value).is_ok()
}

/// Drops a `Value` of any depth without recursion (serde_json's own `Drop`
/// recurses, so dropping a hostile 100,000-deep input could overflow a stack).
pub fn drop_deep(value: Value) {
    let mut pending = vec![value];
    while let Some(v) = pending.pop() {
        match v {
            Value::Array(a) => pending.extend(a),
            Value::Object(o) => pending.extend(o.into_iter().map(|(_, v)| v)),
            _ => {}
        }
    }
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
