//! [`JsonSchema`]: a JSON Schema checked for cost, then compiled, that
//! validates a run's output ([`ExecRequest::output_schema`](crate::request::ExecRequest::output_schema))
//! and a tool's arguments and results.
//!
//! Schemas come from callers that may be hostile (a model's `output_schema`
//! over MCP, an upstream MCP server's tool schemas), and the validator runs
//! in the host, where nothing can interrupt it. The validator itself
//! (the `jsonschema` crate) has no depth, time or size limit: measured here,
//! a chain of 100,000 `$ref`s or a schema nested 100,000 deep overflows the
//! stack at compile time and aborts the process, and 30 nested `anyOf`s of
//! two `$ref`s to the same definition took 12.5 s to reject one value. So
//! every schema passes static bounds before it is compiled (`bounds.rs`):
//!
//! - at most [`MAX_SCHEMA_BYTES`] of JSON text, nesting at most
//!   [`MAX_SCHEMA_NESTING`] levels;
//! - `$ref` only to a JSON pointer in the same document (`#/$defs/x`);
//!   no `$dynamicRef`, `$recursiveRef`, anchors, nor a nested `$id`,
//!   `$schema` or draft-4 `id` on or above a reached subschema, and
//!   nothing is ever fetched (the crate's HTTP and file resolvers are not
//!   compiled in);
//! - no loop through `$ref` or the in-place applicators (`allOf`, `anyOf`,
//!   `oneOf`, `not`, `if`/`then`/`else`, `dependentSchemas`) that does
//!   not descend into the value, and at most [`MAX_IN_PLACE_CHAIN`] of them
//!   in a row;
//! - at most [`MAX_EVALUATIONS_PER_VALUE`] subschema evaluations of any one
//!   value (counting every path a value can be reached by), at every depth
//!   of the value;
//! - `pattern` and `patternProperties` on the `regex` crate (linear time,
//!   size-limited), never on a backtracking engine.
//!
//! Validating a value then costs at most the evaluation bound times the
//! value's nodes; [`JsonSchema::validate`] counts the nodes first (no
//! recursion) and refuses a value past [`MAX_VALIDATION_WORK`].

mod bounds;

pub use bounds::{
    MAX_EVALUATIONS_PER_VALUE, MAX_IN_PLACE_CHAIN, MAX_REPORTED_ERRORS, MAX_SCHEMA_BYTES, MAX_SCHEMA_NESTING,
    MAX_VALIDATION_WORK, MAX_VALUE_NESTING, SchemaError,
};

use std::sync::Arc;

use serde_json::Value;

use serde::{Deserialize, Serialize};

use crate::limits::nesting::{json_depth_exceeds, json_fits};

/// Largest regular expression program a `pattern` may compile to.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// One place where a run's output does not match its output schema.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputError {
    /// Where in the output: a JSON pointer (`/items/3/id`; empty for the
    /// whole value).
    pub path: String,
    /// Where in the schema: the keyword that failed, as a JSON pointer
    /// (`/items/properties/id/type`).
    pub schema_path: String,
    /// What is wrong, in words (`"x" is not of type "integer"`).
    pub message: String,
}

impl OutputError {
    /// `path: message`, with `/` for the whole value.
    pub fn line(&self) -> String {
        let path = if self.path.is_empty() { "/" } else { self.path.as_str() };
        format!("{path}: {}", self.message)
    }
}

/// A JSON Schema (2020-12 unless its `$schema` says otherwise) that passed
/// the bounds of the module docs and compiled. Cheap to clone; serializes
/// as the schema's JSON.
#[derive(Clone)]
pub struct JsonSchema {
    source: Arc<Value>,
    validator: Arc<jsonschema::Validator>,
    /// Most subschema evaluations of any one value.
    evaluations_per_value: u64,
}

/// Why a value does not match: every failing place, at most
/// [`MAX_REPORTED_ERRORS`] of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// The failing places, in the validator's order.
    pub errors: Vec<OutputError>,
    /// True when more places failed than are listed.
    pub more: bool,
}

impl Mismatch {
    /// One line per error (`/items/3: "x" is not of type "integer"`), and
    /// a last line when more were left out.
    pub fn describe(&self) -> String {
        let mut lines: Vec<String> = self.errors.iter().map(OutputError::line).collect();
        if self.more {
            lines.push(format!("(more errors after the first {MAX_REPORTED_ERRORS})"));
        }
        lines.join("\n")
    }

    fn single(path: &str, message: impl Into<String>) -> Self {
        Self {
            errors: vec![OutputError { path: path.to_string(), schema_path: String::new(), message: message.into() }],
            more: false,
        }
    }
}

impl JsonSchema {
    /// Checks `schema` against the bounds of the module docs and compiles
    /// it; formats (`date`, `email`, `uri`, ...) are asserted, not only
    /// annotated.
    pub fn new(schema: Value) -> Result<Self, SchemaError> {
        let size = json_fits(&schema, MAX_SCHEMA_BYTES as u64);
        if !size {
            return Err(SchemaError::new(format!("the schema is over {MAX_SCHEMA_BYTES} bytes of JSON")));
        }
        if let Some(depth) = json_depth_exceeds(&schema, MAX_SCHEMA_NESTING) {
            return Err(SchemaError::new(format!(
                "the schema nests {depth} levels deep, over the limit of {MAX_SCHEMA_NESTING}"
            )));
        }
        let evaluations_per_value = bounds::check(&schema)?;
        let validator = jsonschema::options()
            .should_validate_formats(true)
            .should_ignore_unknown_formats(true)
            // The `regex` format would compile the value's text as a
            // pattern on a backtracking engine: an annotation only.
            .with_format("regex", |_: &str| true)
            .with_pattern_options(
                jsonschema::PatternOptions::regex().size_limit(REGEX_SIZE_LIMIT).dfa_size_limit(REGEX_SIZE_LIMIT),
            )
            .build(&schema)
            .map_err(|e| SchemaError::new(format!("not a valid JSON Schema: {e}")))?;
        Ok(Self { source: Arc::new(schema), validator: Arc::new(validator), evaluations_per_value })
    }

    /// The schema as given.
    pub fn as_value(&self) -> &Value {
        &self.source
    }

    /// Checks `value`: `Ok` when it matches, else every failing place (at
    /// most [`MAX_REPORTED_ERRORS`]). A value too deep or too large to
    /// validate within [`MAX_VALIDATION_WORK`] does not match, and the
    /// mismatch says why.
    pub fn validate(&self, value: &Value) -> Result<(), Mismatch> {
        if let Some(depth) = json_depth_exceeds(value, MAX_VALUE_NESTING) {
            return Err(Mismatch::single(
                "",
                format!("the value nests {depth} levels deep; at most {MAX_VALUE_NESTING} can be validated"),
            ));
        }
        let limit = MAX_VALIDATION_WORK / self.evaluations_per_value.max(1);
        let nodes = count_nodes(value, limit);
        if nodes > limit {
            return Err(Mismatch::single(
                "",
                format!(
                    "the value has over {limit} parts: too many to validate against this schema \
                     ({} evaluations per part; execbox validates at most {MAX_VALIDATION_WORK})",
                    self.evaluations_per_value
                ),
            ));
        }
        if self.validator.is_valid(value) {
            return Ok(());
        }
        let mut errors = Vec::new();
        let mut more = false;
        for error in self.validator.iter_errors(value) {
            if errors.len() == MAX_REPORTED_ERRORS {
                more = true;
                break;
            }
            errors.push(OutputError {
                path: error.instance_path().to_string(),
                schema_path: error.schema_path().to_string(),
                message: crate::limits::text::cap_message(error.to_string()),
            });
        }
        Err(Mismatch { errors, more })
    }
}

/// Nodes of `value` (every value, containers included), counted up to
/// just past `limit`, without recursion.
fn count_nodes(value: &Value, limit: u64) -> u64 {
    let mut count = 0u64;
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        count += 1;
        if count > limit {
            break;
        }
        match v {
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => stack.extend(fields.values()),
            _ => {}
        }
    }
    count
}

impl std::fmt::Debug for JsonSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("JsonSchema").field(&self.source).finish()
    }
}

impl PartialEq for JsonSchema {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl serde::Serialize for JsonSchema {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.source.serialize(serializer)
    }
}

impl<'de> serde::Deserialize<'de> for JsonSchema {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        JsonSchema::new(Value::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

impl TryFrom<Value> for JsonSchema {
    type Error = SchemaError;

    fn try_from(schema: Value) -> Result<Self, SchemaError> {
        JsonSchema::new(schema)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn mismatches_name_every_failing_path() {
        let schema = JsonSchema::new(json!({
            "$defs": {"item": {"type": "object", "properties": {"id": {"type": "integer"}, "when": {"format": "date"}},
                               "required": ["id"]}},
            "type": "array",
            "items": {"$ref": "#/$defs/item"}
        }))
        .unwrap();
        assert!(schema.validate(&json!([{"id": 1, "when": "2026-11-27"}])).is_ok());
        let mismatch =
            schema.validate(&json!([{"id": 1}, {"id": "x"}, {"when": "yesterday", "id": 2}, {}])).unwrap_err();
        let paths: Vec<&str> = mismatch.errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["/1/id", "/2/when", "/3"], "{mismatch:?}");
        let text = mismatch.describe();
        assert!(text.contains("/1/id: \"x\" is not of type \"integer\""), "{text}");
        assert!(text.contains("\"id\" is a required property"), "{text}");
    }

    #[test]
    fn many_errors_are_capped_and_say_so() {
        let schema = JsonSchema::new(json!({"type": "array", "items": {"type": "string"}})).unwrap();
        let mismatch = schema.validate(&json!((0..100).collect::<Vec<_>>())).unwrap_err();
        assert_eq!(mismatch.errors.len(), MAX_REPORTED_ERRORS);
        assert!(mismatch.more && mismatch.describe().ends_with(&format!("first {MAX_REPORTED_ERRORS})")));
    }

    #[test]
    fn hostile_schemas_are_refused_before_compiling() {
        let refused = |schema: Value, why: &str| {
            let err = JsonSchema::new(schema).map(drop).unwrap_err().reason;
            assert!(err.contains(why), "expected {why:?} in {err:?}");
        };
        // A chain of refs far longer than any real schema's.
        let mut defs = serde_json::Map::new();
        for i in 0..1000 {
            defs.insert(format!("a{i}"), json!({"$ref": format!("#/$defs/a{}", i + 1)}));
        }
        defs.insert("a1000".into(), json!({"type": "integer"}));
        refused(json!({"$defs": defs, "$ref": "#/$defs/a0"}), "in a row");
        // Deep nesting (it overflowed the stack at 100,000).
        let mut deep = json!({"type": "integer"});
        for _ in 0..100 {
            deep = json!({"items": deep});
        }
        refused(deep, "nests");
        // Exponential: each level reaches the next twice (30 levels took
        // 12.5 s to reject one value; 13 are 2^13 paths, within the chain bound).
        let mut defs = serde_json::Map::new();
        for i in 0..13 {
            let next = format!("#/$defs/a{}", i + 1);
            defs.insert(format!("a{i}"), json!({"anyOf": [{"$ref": next}, {"$ref": next}]}));
        }
        defs.insert("a13".into(), json!({"type": "string"}));
        refused(json!({"$defs": defs, "$ref": "#/$defs/a0"}), "evaluations");
        // The same, through the value's items: each level doubles.
        let mut defs = serde_json::Map::new();
        for i in 0..30 {
            let next = format!("#/$defs/a{}", i + 1);
            defs.insert(format!("a{i}"), json!({"allOf": [{"items": {"$ref": next}}, {"items": {"$ref": next}}]}));
        }
        defs.insert("a30".into(), json!(true));
        refused(json!({"$defs": defs, "$ref": "#/$defs/a0"}), "evaluations");
        // A loop that never descends into the value.
        refused(json!({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}]}}, "$ref": "#/$defs/a"}), "loops");
        refused(json!({"$ref": "#"}), "loops");
        // Nothing is fetched; no dynamic scopes.
        refused(json!({"$ref": "https://example.com/s.json"}), "same document");
        refused(json!({"$ref": "file:///etc/passwd"}), "same document");
        refused(json!({"$dynamicRef": "#x"}), "$dynamicRef");
        refused(json!({"properties": {"a": {"$id": "https://x/y", "type": "string"}}}), "$id");
        refused(json!({"$ref": "#/$defs/missing"}), "points nowhere");
        // Patterns are linear-time and size-limited.
        refused(json!({"pattern": "a{1000}{1000}"}), "not a valid JSON Schema");
        refused(json!({"pattern": "(?<=a)b"}), "not a valid JSON Schema");
        // Size.
        refused(json!({"enum": ["x".repeat(MAX_SCHEMA_BYTES)]}), "bytes");
    }

    #[test]
    fn recursive_schemas_that_descend_are_fine() {
        let tree = JsonSchema::new(json!({
            "$defs": {"node": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
            "$ref": "#/$defs/node"
        }))
        .unwrap();
        let mut value = json!({});
        for _ in 0..60 {
            value = json!({"children": [value]});
        }
        assert!(tree.validate(&value).is_ok());
        value = json!({"children": [{"children": 3}]});
        assert_eq!(tree.validate(&value).unwrap_err().errors[0].path, "/children/0/children");
        // As deep as the bounds let a schema go, on a test thread's 2 MiB
        // stack in a debug build: compiled and applied to a value as deep.
        let mut deep = json!({"type": "integer"});
        let mut value = json!(1);
        for _ in 0..MAX_SCHEMA_NESTING - 1 {
            deep = json!({"items": deep});
            value = json!([value]);
        }
        let deep = JsonSchema::new(deep).unwrap();
        assert!(deep.validate(&value).is_ok());
        // The longest same-value chain allowed, entered again at every
        // level of the deepest value validated: the most stack a
        // validation can take.
        let mut defs = serde_json::Map::new();
        let last = MAX_IN_PLACE_CHAIN - 1; // the root's $ref is the first link
        for i in 0..last {
            defs.insert(format!("a{i}"), json!({"$ref": format!("#/$defs/a{}", i + 1)}));
        }
        defs.insert(format!("a{last}"), json!({"items": {"$ref": "#/$defs/a0"}}));
        let looping = JsonSchema::new(json!({"$defs": defs, "$ref": "#/$defs/a0"})).unwrap();
        let mut value = json!([]);
        for _ in 0..MAX_VALUE_NESTING - 1 {
            value = json!([value]);
        }
        assert!(looping.validate(&value).is_ok());
    }

    #[test]
    fn values_too_large_or_deep_to_validate_do_not_match() {
        let schema = JsonSchema::new(json!({"type": "array"})).unwrap();
        let mut deep = json!(1);
        for _ in 0..200 {
            deep = json!([deep]);
        }
        assert!(schema.validate(&deep).unwrap_err().describe().contains("levels deep"));
        // 3,001 evaluations of every item: 10,000 items are past the work bound.
        let costly = JsonSchema::new(json!({"items": {"allOf": vec![json!(true); 3000]}})).unwrap();
        let items = Value::Array(vec![json!(0); 10_000]);
        assert!(costly.validate(&items).unwrap_err().describe().contains("too many to validate"));
        assert!(costly.validate(&Value::Array(vec![json!(0); 1_000])).is_ok());
    }

    #[test]
    fn schemas_round_trip_through_serde() {
        let schema: JsonSchema = serde_json::from_value(json!({"type": "integer"})).unwrap();
        assert_eq!(serde_json::to_value(&schema).unwrap(), json!({"type": "integer"}));
        assert!(serde_json::from_value::<JsonSchema>(json!({"$ref": "#"})).is_err());
    }
}
