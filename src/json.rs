//! Bounds on JSON values measured without recursion, in linear time and
//! constant stack: how deep a value nests, whether its text fits a size,
//! and dropping one of any depth. Serializers, parsers and converters
//! recurse per nesting level, and a native stack overflow aborts the whole
//! host process: these measures come first.

use serde_json::Value;

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
