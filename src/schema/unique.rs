//! `uniqueItems`, in place of the validator's own: items are told apart by
//! an exact canonical text of each (numbers by their value, objects with
//! their keys in order) in a hash set keyed at random.
//!
//! The validator hashes a number as its `f64`, so the 2,048 integers
//! around 2^64 that round to one `f64` share a hash and compare unequal:
//! pairs of them make millions of distinct items with one hash, and a
//! 1 MiB array of them took 13 s of a debug build (9 ms for as many
//! ordinary pairs), its time growing with the square of the array.

use std::collections::HashMap;
use std::fmt::Write as _;

use jsonschema::paths::Location;
use jsonschema::{Keyword, ValidationError};
use serde_json::{Map, Value};

/// The keyword's factory (`uniqueItems: true`; `false` checks nothing).
pub(super) fn factory<'a>(
    _parent: &'a Map<String, Value>,
    value: &'a Value,
    _path: Location,
) -> Result<Box<dyn for<'i> Keyword<'i>>, ValidationError<'a>> {
    match value {
        Value::Bool(on) => Ok(Box::new(UniqueItems { on: *on })),
        _ => Err(ValidationError::schema("uniqueItems must be a boolean")),
    }
}

struct UniqueItems {
    on: bool,
}

impl<'i> Keyword<'i> for UniqueItems {
    fn validate(&self, instance: &'i Value) -> Result<(), ValidationError<'i>> {
        match self.repeated(instance) {
            None => Ok(()),
            Some((first, again)) => Err(ValidationError::custom(format!(
                "items {first} and {again} are equal: uniqueItems asks every item to differ"
            ))),
        }
    }

    fn is_valid(&self, instance: &'i Value) -> bool {
        self.repeated(instance).is_none()
    }
}

impl UniqueItems {
    /// The indexes of the first item found again and of its repeat.
    fn repeated(&self, instance: &Value) -> Option<(usize, usize)> {
        let Value::Array(items) = instance else { return None };
        if !self.on || items.len() < 2 {
            return None;
        }
        let mut seen: HashMap<String, usize> = HashMap::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            let mut text = String::new();
            canonical(item, &mut text);
            if let Some(&first) = seen.get(&text) {
                return Some((first, index));
            }
            seen.insert(text, index);
        }
        None
    }
}

/// Appends a text of `value` that two values share exactly when JSON
/// Schema calls them equal: numbers by value (`1`, `1.0` and `1e0` alike,
/// `-0` as `0`), objects whatever the order of their keys.
fn canonical(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push('n'),
        Value::Bool(b) => out.push(if *b { 't' } else { 'f' }),
        Value::Number(n) => {
            let _ = match (n.as_u64(), n.as_i64(), n.as_f64()) {
                (Some(u), _, _) => write!(out, "i{u}"),
                (_, Some(i), _) => write!(out, "i{i}"),
                // Integral floats within i128 compare equal to integers.
                (_, _, Some(x)) if x.fract() == 0.0 && x.abs() < 1.0e38 => write!(out, "i{}", x as i128),
                (_, _, Some(x)) => write!(out, "f{:x}", x.to_bits()),
                _ => write!(out, "?{n}"),
            };
        }
        Value::String(s) => {
            out.push('s');
            out.push_str(&Value::String(s.clone()).to_string());
        }
        Value::Array(items) => {
            out.push('[');
            for item in items {
                canonical(item, out);
                out.push(',');
            }
            out.push(']');
        }
        Value::Object(fields) => {
            let mut keys: Vec<&String> = fields.keys().collect();
            keys.sort();
            out.push('{');
            for key in keys {
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                canonical(&fields[key], out);
                out.push(',');
            }
            out.push('}');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn unique(items: Value) -> bool {
        UniqueItems { on: true }.repeated(&items).is_none()
    }

    #[test]
    fn equal_as_json_schema_says() {
        assert!(!unique(json!([1, 1.0])));
        assert!(!unique(json!([0, -0.0])));
        assert!(!unique(json!([{"a": 1, "b": [2]}, {"b": [2.0], "a": 1}])));
        assert!(!unique(json!(["x", "x"])));
        assert!(unique(json!([1, "1", [1], {"1": 1}, true, null, 1.5])));
        assert!(unique(json!([{"a": 1}, {"a": 1, "b": 1}])));
        // Integers an f64 cannot tell apart are different numbers.
        assert!(!unique(json!([u64::MAX, u64::MAX - 1, 18446744073709549568u64, 18446744073709549568.0])));
        assert!(unique(json!([u64::MAX, u64::MAX - 1])));
        assert!(!unique(json!([1e300, 1e300])) && unique(json!([1e300, 1e301])));
        assert!(!unique(json!(["a\"b", "a\"b"])) && unique(json!(["a", "a,"])));
    }

    /// 24,000 pairs of integers that round to the same f64 pairs.
    #[test]
    fn integers_that_share_an_f64_are_not_quadratic() {
        let xs: Vec<u64> = (0..1000).map(|k| u64::MAX - k).collect();
        let items: Vec<Value> = (0..24_000).map(|i| json!([xs[i % 1000], xs[i / 1000]])).collect();
        let schema = crate::schema::JsonSchema::new(json!({"uniqueItems": true})).unwrap();
        let started = std::time::Instant::now();
        assert!(schema.validate(&Value::Array(items)).is_ok());
        assert!(started.elapsed() < std::time::Duration::from_secs(3), "{:?}", started.elapsed());
    }
}
