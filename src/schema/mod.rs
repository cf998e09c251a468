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
    MAX_EVALUATIONS_PER_VALUE, MAX_IN_PLACE_CHAIN, MAX_LISTED_ERROR_WORK, MAX_REPORTED_ERRORS, MAX_SCHEMA_BYTES,
    MAX_SCHEMA_NESTING, MAX_VALIDATION_WORK, MAX_VALUE_NESTING, SchemaError,
};

use std::sync::Arc;

use serde_json::Value;

use serde::{Deserialize, Serialize};

use crate::json::{json_depth_exceeds, json_fits};

mod pattern;
mod unique;

/// Values nested deeper than this are checked on a thread of their own
/// with [`VALIDATION_STACK`]: reporting a mismatch 100 levels down took
/// more than 2 MiB of a debug build's stack (tokio's workers have 2 MiB),
/// where checking a valid value as deep fits.
const INLINE_DEPTH: usize = 32;

/// Most work [`JsonSchema::is_quick`] calls quick (about 2 ms of a debug
/// build).
const QUICK_WORK: u64 = 100_000;

/// The stack of the thread that checks a value deeper than [`INLINE_DEPTH`].
const VALIDATION_STACK: usize = 64 << 20;

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
    /// What it costs per part of a value (see `bounds.rs`).
    costs: bounds::Costs,
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
        let costs = bounds::costs(&schema)?;
        let validator = jsonschema::options()
            .should_validate_formats(true)
            .should_ignore_unknown_formats(true)
            // The `regex` format would compile the value's text as a
            // pattern on a backtracking engine: an annotation only.
            .with_format("regex", |_: &str| true)
            .with_pattern_options(
                jsonschema::PatternOptions::regex()
                    .size_limit(pattern::REGEX_SIZE_LIMIT)
                    .dfa_size_limit(pattern::REGEX_SIZE_LIMIT),
            )
            // Exact: the validator's own hashes numbers as f64, so 2,048
            // different large integers share one, and a 1 MiB array of
            // pairs of them took 13 s of a debug build (quadratic).
            .with_keyword("uniqueItems", unique::factory)
            // Bounded: the validator's own falls back to the PikeVM, whose
            // time is the text's length times the pattern's NFA (61 s of a
            // debug build for a 70-byte pattern over 100 KB).
            .with_keyword("pattern", pattern::factory)
            .build(&schema)
            .map_err(|e| SchemaError::new(format!("not a valid JSON Schema: {e}")))?;
        Ok(Self { source: Arc::new(schema), validator: Arc::new(validator), costs })
    }

    /// The schema as given.
    pub fn as_value(&self) -> &Value {
        &self.source
    }

    /// Checks `value`: `Ok` when it matches, else every failing place (at
    /// most [`MAX_REPORTED_ERRORS`]). A value too deep or too large to
    /// validate within [`MAX_VALIDATION_WORK`] does not match, and the
    /// mismatch says why. A mismatch of a large value names its first
    /// failing place only (see [`MAX_LISTED_ERROR_WORK`]).
    pub fn validate(&self, value: &Value) -> Result<(), Mismatch> {
        let Some(depth) = depth_within(value, MAX_VALUE_NESTING) else {
            return Err(Mismatch::single(
                "",
                format!(
                    "the value nests over {MAX_VALUE_NESTING} levels deep; at most {MAX_VALUE_NESTING} can be validated"
                ),
            ));
        };
        let costs = self.costs;
        let size = Size::of(value, MAX_VALIDATION_WORK);
        let work = size.parts.saturating_mul(costs.work).saturating_add(size.text.saturating_mul(costs.byte_work));
        if work > MAX_VALIDATION_WORK {
            return Err(Mismatch::single(
                "",
                format!(
                    "the value has {}{} parts and {}{} bytes of text: too many to validate against this schema \
                     ({} evaluations per part, {} per byte of text; execbox validates at most {MAX_VALIDATION_WORK})",
                    if size.cut { "over " } else { "" },
                    size.parts,
                    if size.cut { "over " } else { "" },
                    size.text,
                    costs.work,
                    costs.byte_work
                ),
            ));
        }
        let check = || {
            if self.validator.is_valid(value) {
                return Ok(());
            }
            if size.parts.saturating_mul(costs.errors) <= MAX_LISTED_ERROR_WORK {
                return Err(self.every_error(value));
            }
            Err(self.first_error(value, size.parts))
        };
        if depth <= INLINE_DEPTH {
            return check();
        }
        std::thread::scope(|scope| {
            match std::thread::Builder::new()
                .name("execbox-schema".into())
                .stack_size(VALIDATION_STACK)
                .spawn_scoped(scope, check)
            {
                Ok(thread) => {
                    thread.join().unwrap_or_else(|_| Err(Mismatch::single("", "the output schema's check failed")))
                }
                Err(e) => Err(Mismatch::single("", format!("no thread to check a value this deep: {e}"))),
            }
        })
    }

    /// Whether checking `value` is quick (well under a millisecond or so
    /// of a release build: a small value, not deep): a caller on an async
    /// runtime checks a value that is not on a thread where blocking is
    /// fine.
    pub fn is_quick(&self, value: &Value) -> bool {
        let size = Size::of(value, QUICK_WORK);
        let work =
            size.parts.saturating_mul(self.costs.work).saturating_add(size.text.saturating_mul(self.costs.byte_work));
        !size.cut && work <= QUICK_WORK && depth_within(value, INLINE_DEPTH).is_some()
    }

    /// Every failing place, at most [`MAX_REPORTED_ERRORS`] of them.
    fn every_error(&self, value: &Value) -> Mismatch {
        let mut errors = Vec::new();
        let mut more = false;
        for error in self.validator.iter_errors(value) {
            if errors.len() == MAX_REPORTED_ERRORS {
                more = true;
                break;
            }
            errors.push(output_error(&error));
        }
        Mismatch { errors, more }
    }

    /// The first failing place of a value too large for its errors to be
    /// listed (the validator builds them all before the first can be
    /// read): one error, when the schema has no `anyOf` or `oneOf` (whose
    /// error holds every branch's), else a mismatch that says so.
    fn first_error(&self, value: &Value, parts: u64) -> Mismatch {
        let first = if self.costs.branches { None } else { self.validator.validate(value).err() };
        match first {
            Some(error) => Mismatch { errors: vec![output_error(&error)], more: true },
            None => Mismatch::single(
                "",
                format!(
                    "the value does not match the schema; with {parts} parts it is too large for execbox to list \
                     where (anyOf/oneOf keep every branch's errors): check a smaller part of it"
                ),
            ),
        }
    }
}

/// One of the validator's errors as an [`OutputError`].
fn output_error(error: &jsonschema::ValidationError<'_>) -> OutputError {
    OutputError {
        path: error.instance_path().to_string(),
        schema_path: error.schema_path().to_string(),
        message: crate::text::cap_message(error.to_string()),
    }
}

/// How deep `value` nests (a scalar is 1), or `None` past `max`.
fn depth_within(value: &Value, max: usize) -> Option<usize> {
    let mut deepest = 1;
    let mut stack: Vec<(&Value, usize)> = vec![(value, 1)];
    while let Some((v, depth)) = stack.pop() {
        deepest = deepest.max(depth);
        if depth > max {
            return None;
        }
        match v {
            Value::Array(items) => stack.extend(items.iter().map(|c| (c, depth + 1))),
            Value::Object(fields) => stack.extend(fields.values().map(|c| (c, depth + 1))),
            _ => {}
        }
    }
    Some(deepest)
}

/// What a value weighs for a check: its parts (every value, containers
/// included) and its bytes of text (strings and keys), counted without
/// recursion up to just past `limit` each.
#[derive(Clone, Copy, Debug)]
struct Size {
    parts: u64,
    text: u64,
    /// Counting stopped at `limit`.
    cut: bool,
}

impl Size {
    fn of(value: &Value, limit: u64) -> Self {
        let mut size = Size { parts: 0, text: 0, cut: false };
        let mut stack = vec![value];
        while let Some(v) = stack.pop() {
            size.parts += 1;
            if size.parts > limit || size.text > limit {
                size.cut = true;
                break;
            }
            match v {
                Value::String(text) => size.text += text.len() as u64,
                Value::Array(items) => stack.extend(items),
                Value::Object(fields) => {
                    for (key, field) in fields {
                        size.text += key.len() as u64;
                        stack.push(field);
                    }
                }
                _ => {}
            }
        }
        size
    }
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
        // Reporting where a value that deep fails takes more stack than
        // checking it (past 2 MiB of a debug build at 100 levels: the
        // process aborted), on a thread with tokio's workers' stack.
        let mut defs = serde_json::Map::new();
        for i in 0..last {
            defs.insert(format!("a{i}"), json!({"$ref": format!("#/$defs/a{}", i + 1)}));
        }
        defs.insert(format!("a{last}"), json!({"type": "array", "items": {"$ref": "#/$defs/a0"}}));
        let arrays = JsonSchema::new(json!({"$defs": defs, "$ref": "#/$defs/a0"})).unwrap();
        let mut bad = json!(1);
        for _ in 0..MAX_VALUE_NESTING - 1 {
            bad = json!([bad]);
        }
        let on_2_mib = std::thread::Builder::new().stack_size(2 << 20).spawn(move || arrays.validate(&bad));
        let mismatch = on_2_mib.unwrap().join().unwrap().unwrap_err();
        assert!(mismatch.errors[0].path.ends_with("/0/0"), "{mismatch:?}");
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

    /// The validator builds every error of a mismatch before the first can
    /// be read (about 450 bytes each): 48,000 numbers under 60 failing
    /// checks each made 2.9 million errors, 1.07 GB and 3 s of a debug
    /// build, for a 96 KB output (a 960 KB one went past 4 GB and aborted
    /// the process); a `required` list of 7,000 names over 300,000 empty
    /// objects, past 6 GB. A large value's mismatch names its first place.
    #[test]
    fn mismatches_of_large_values_name_their_first_place() {
        let schema = JsonSchema::new(json!({"items": {"allOf": vec![json!({"type": "string"}); 60]}})).unwrap();
        let started = std::time::Instant::now();
        let mismatch = schema.validate(&Value::Array(vec![json!(0); 48_000])).unwrap_err();
        assert_eq!(mismatch.errors.len(), 1, "{:?}", &mismatch.errors[..2.min(mismatch.errors.len())]);
        assert_eq!((mismatch.errors[0].path.as_str(), mismatch.more), ("/0", true));
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
        // Small values still list every place (up to 16).
        assert_eq!(schema.validate(&json!([0, "x", 1])).unwrap_err().errors.len(), 16);
        // With anyOf, even the first error holds every branch's: it is not built.
        let branches = JsonSchema::new(json!({"anyOf": [{"items": {"type": "string"}}, {"type": "object"}]})).unwrap();
        let mismatch = branches.validate(&Value::Array(vec![json!(0); 200_000])).unwrap_err();
        assert!(mismatch.describe().contains("too large for execbox to list where"), "{}", mismatch.describe());
    }

    /// Work the evaluation count did not see: `dependentRequired` looks
    /// up every name of its map, `enum` (of other than strings or
    /// integers) compares with every entry, `multipleOf` a fraction with
    /// exact fractions. A 60 KB map over 300,000 empty objects took 80 s of a
    /// debug build; 9,000 floats in an enum over 480,000 numbers, 170 s;
    /// `not: {multipleOf: 0.7}` over 130,000 × `1.1e300`, 5.9 s (the
    /// bound's own worst case, 30 million evaluations, takes 0.6 s).
    #[test]
    fn per_check_work_counts_against_the_work_bound() {
        let too_many = |schema: Value, value: Value| {
            let schema = JsonSchema::new(schema).unwrap();
            let started = std::time::Instant::now();
            let mismatch = schema.validate(&value).unwrap_err().describe();
            assert!(mismatch.contains("too many to validate"), "{mismatch}");
            assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
        };
        let names: serde_json::Map<String, Value> = (0..4000).map(|i| (format!("k{i}"), json!(["a"]))).collect();
        too_many(json!({"items": {"dependentRequired": names}}), Value::Array(vec![json!({}); 30_000]));
        let floats: Vec<f64> = (0..4000).map(|i| i as f64 + 0.5).collect();
        too_many(json!({"items": {"enum": floats}}), Value::Array(vec![json!(7); 30_000]));
        too_many(json!({"items": {"not": {"multipleOf": 0.7}}}), Value::Array(vec![json!(1.1e300); 40_000]));
        // Text is weighed by its bytes under a format or a pattern.
        too_many(json!({"allOf": vec![json!({"format": "email"}); 400]}), json!("a".repeat(1 << 20)));
        // Enums the validator hashes stay cheap.
        let strings =
            JsonSchema::new(json!({"items": {"enum": (0..5000).map(|i| format!("s{i}")).collect::<Vec<_>>()}}));
        assert!(strings.unwrap().validate(&Value::Array(vec![json!("s7"); 30_000])).is_ok());
    }

    /// A pattern whose lazy DFA runs out of room (its cache thrashed by
    /// `[ab]{400}`-style repeats) was matched by the regex crate's PikeVM,
    /// whose cost per byte grows with the pattern: a 100 KB string and this
    /// 70-byte pattern took 61 s of a debug build (`execbox run --timeout-ms
    /// 5000` answered after 54.6 s). Now the bound weighs the pattern's
    /// bytes by its NFA (100 KB: refused up front), and a string the bound
    /// lets through (40 KB) is not accepted unchecked when the DFA gives up.
    #[test]
    fn a_pattern_over_a_long_string_is_bounded() {
        let schema = JsonSchema::new(json!({"pattern": pattern::COSTLY})).unwrap();
        let text = pattern::coin_flips(100_000);
        for (length, says) in [(100_000, "too many to validate"), (40_000, "too costly to match")] {
            let started = std::time::Instant::now();
            let mismatch = schema.validate(&json!(text[..length])).unwrap_err();
            assert!(mismatch.errors[0].message.contains(says), "{length}: {mismatch:?}");
            assert!(started.elapsed() < std::time::Duration::from_secs(2), "{length}: {:?}", started.elapsed());
        }
        // Short strings are told: what it matches, it still matches.
        assert!(schema.validate(&json!("abé")).is_ok());
        let mismatch = schema.validate(&json!("xxx")).unwrap_err();
        assert!(mismatch.errors[0].message.contains("does not match"), "{mismatch:?}");
    }

    #[test]
    fn schemas_round_trip_through_serde() {
        let schema: JsonSchema = serde_json::from_value(json!({"type": "integer"})).unwrap();
        assert_eq!(serde_json::to_value(&schema).unwrap(), json!({"type": "integer"}));
        assert!(serde_json::from_value::<JsonSchema>(json!({"$ref": "#"})).is_err());
    }
}
