//! The static bounds a schema passes before it is compiled (see the module
//! docs of `schema`), and their numbers.
//!
//! A schema is a graph: its subschemas are the nodes (each named by its
//! JSON pointer), and each applicator keyword is an edge. An edge either
//! applies its subschema to the *same* value (`$ref`, `allOf`, `anyOf`,
//! `oneOf`, `not`, `if`/`then`/`else`, `dependentSchemas`) or to a part of
//! it, one level down (`properties`, `items`, `contains`, ...). The
//! validator walks exactly these edges, so:
//!
//! - a cycle of same-value edges never ends (refused), and a long chain of
//!   them is one stack frame per link on every value (refused past
//!   [`MAX_IN_PLACE_CHAIN`]);
//! - the evaluations one value costs are the paths that reach it: at depth
//!   0 the same-value paths from the root; at depth k + 1 those from every
//!   descending edge of depth k. Counting paths level by level, with
//!   saturating arithmetic, bounds the work of any value of any shape
//!   (refused past [`MAX_EVALUATIONS_PER_VALUE`]).
//!
//! `if`/`then`/`else` count both branches and the `unevaluated*` keywords
//! count the same-value applicators of their node once more (they look at
//! them again for annotations): the count may be above the validator's
//! real work, never below.

use std::collections::HashMap;

use serde_json::Value;

/// Largest schema, as JSON text.
pub const MAX_SCHEMA_BYTES: usize = 64 << 10;

/// Deepest schema nesting (objects and arrays, one level each).
pub const MAX_SCHEMA_NESTING: usize = 64;

/// Most `$ref`s and in-place applicators in a row on one value.
pub const MAX_IN_PLACE_CHAIN: usize = 32;

/// Most subschema evaluations of any one value.
pub const MAX_EVALUATIONS_PER_VALUE: u64 = 4096;

/// Most subschema evaluations of one validation (evaluations per value
/// times the value's nodes): about a second of a release build.
pub const MAX_VALIDATION_WORK: u64 = 30_000_000;

/// Most validation work the errors of one mismatch may be listed for
/// (the value's weight times the errors one part of it can give): the
/// validator builds every error before the first can be read (about 450
/// bytes each), so a 96 KB output that failed 60 checks per number made
/// 2.9 million of them (1.07 GB). Past it, only the first failing place is
/// named.
pub const MAX_LISTED_ERROR_WORK: u64 = 100_000;

/// What one check of `multipleOf` with a fraction can cost, in
/// evaluations: exact fractions of numbers far outside `i128`'s decimal
/// range (`1e300` against `0.7`: 45 µs each in a debug build, where an
/// evaluation is about 21 ns).
const FRACTION_MULTIPLE_COST: u64 = 1024;

/// Deepest value validated (the nesting serde_json parses outputs to).
pub const MAX_VALUE_NESTING: usize = 128;

/// Most errors one validation reports.
pub const MAX_REPORTED_ERRORS: usize = 16;

/// Why a schema was refused, in words for whoever wrote it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct SchemaError {
    /// What is wrong, naming the place in the schema where there is one.
    pub reason: String,
}

impl SchemaError {
    pub(super) fn new(reason: impl Into<String>) -> Self {
        Self { reason: crate::text::cap_message(reason.into()) }
    }
}

/// Keywords whose subschema applies to the same value.
const SAME_VALUE_ONE: [&str; 4] = ["not", "if", "then", "else"];
const SAME_VALUE_LIST: [&str; 3] = ["allOf", "anyOf", "oneOf"];
const SAME_VALUE_MAP: [&str; 2] = ["dependentSchemas", "dependencies"];

/// Keywords whose subschema applies one level down.
const DESCENDING_ONE: [&str; 7] = [
    "additionalProperties",
    "propertyNames",
    "contains",
    "additionalItems",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentSchema",
];
const DESCENDING_MAP: [&str; 2] = ["properties", "patternProperties"];
const DESCENDING_LIST: [&str; 1] = ["prefixItems"];

/// Keywords that resolve references at validation time (refused).
const DYNAMIC: [&str; 2] = ["$dynamicRef", "$recursiveRef"];

/// One subschema and its edges, by node index.
#[derive(Default)]
struct Node {
    /// Same-value edges, each listed as often as it applies.
    same_value: Vec<usize>,
    /// Edges one level down, each listed as often as it applies.
    descending: Vec<usize>,
    /// What one evaluation of it costs, in evaluations: 1, plus what its
    /// assertions do per check whatever the value (compare with each
    /// `enum` entry, look up each `required` or `dependentRequired` name).
    cost: u64,
    /// Most errors one evaluation of it can give: one per keyword, one per
    /// name a `required` or `dependentRequired` list may find missing.
    errors: u64,
    /// What one evaluation costs per byte of text it reads (a string, or
    /// an object's keys), in evaluations: a `format` or pattern reads it
    /// all (email: ~130 ns a byte in a debug build), a length or an equality
    /// check counts or compares it.
    byte_cost: u64,
}

/// What a schema costs per part of a value, found by [`check`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Costs {
    /// Most subschema evaluations of one part.
    pub(super) evaluations: u64,
    /// Most work of one part: its evaluations, each weighed by its cost.
    pub(super) work: u64,
    /// Most errors one part can give.
    pub(super) errors: u64,
    /// Most work of one byte of text.
    pub(super) byte_work: u64,
    /// Whether an `anyOf` or `oneOf` is reached: its error holds every
    /// branch's errors, so even the first error is not bounded by one.
    pub(super) branches: bool,
}

/// The schema's graph, built from its root.
struct Graph<'a> {
    root: &'a Value,
    nodes: Vec<Node>,
    index: HashMap<String, usize>,
    /// Nodes whose edges are not listed yet: (index, pointer).
    pending: Vec<(usize, String)>,
    /// An `anyOf` or `oneOf` is reached.
    branches: bool,
}

/// Checks `schema` (already bounded in size and nesting) and returns the
/// most subschema evaluations one value can cost.
#[cfg(test)]
pub(super) fn check(schema: &Value) -> Result<u64, SchemaError> {
    costs(schema).map(|costs| costs.evaluations)
}

/// Checks `schema` (already bounded in size and nesting) and returns what
/// it costs per part of a value.
pub(super) fn costs(schema: &Value) -> Result<Costs, SchemaError> {
    let mut graph =
        Graph { root: schema, nodes: Vec::new(), index: HashMap::new(), pending: Vec::new(), branches: false };
    graph.node("")?;
    while let Some((index, pointer)) = graph.pending.pop() {
        graph.list_edges(index, &pointer)?;
    }
    let order = graph.same_value_order()?;
    graph.evaluations(&order)
}

/// What one evaluation of the subschema `fields` costs beyond the walk
/// (see [`Node::cost`]), and the most errors it can give ([`Node::errors`]).
fn cost_and_errors(fields: &serde_json::Map<String, Value>) -> (u64, u64) {
    let names = |value: &Value| value.as_array().map_or(0, |names| names.len() as u64);
    // Lists of names per key (`dependentRequired`, draft 7's `dependencies`).
    let dependent = |value: Option<&Value>| {
        value.and_then(Value::as_object).map_or(0, |map| map.values().map(|v| 1 + names(v)).sum::<u64>())
    };
    let mut cost = 1u64;
    let mut errors = fields.len().max(1) as u64;
    if let Some(Value::Array(options)) = fields.get("enum") {
        // The validator hashes an enum of strings (over 10) or of
        // integers; it compares with every entry otherwise.
        let strings = options.len() > 10 && options.iter().all(|v| v.is_string() || v.is_null());
        let integers = options.iter().all(|v| v.is_i64() || v.is_null());
        if !(strings || integers) {
            cost = cost.saturating_add(options.iter().map(parts).sum::<u64>());
        }
    }
    if let Some(value) = fields.get("const") {
        cost = cost.saturating_add(parts(value));
    }
    let required = fields.get("required").map_or(0, names);
    let depending = dependent(fields.get("dependentRequired")).saturating_add(dependent(fields.get("dependencies")));
    cost = cost.saturating_add(required).saturating_add(depending);
    errors = errors.saturating_add(required).saturating_add(depending);
    if fields.get("multipleOf").and_then(Value::as_f64).is_some_and(|m| m.fract() != 0.0) {
        cost = cost.saturating_add(FRACTION_MULTIPLE_COST);
    }
    (cost, errors)
}

/// What one evaluation of `fields` costs per byte of text it reads (see
/// [`Node::byte_cost`]).
fn byte_cost(fields: &serde_json::Map<String, Value>) -> u64 {
    let has = |keywords: &[&str]| keywords.iter().any(|k| fields.contains_key(*k));
    let mut cost = 0;
    if has(&["format", "contentEncoding", "contentMediaType"]) {
        cost += 8;
    }
    // A pattern's automaton may cost per byte up to its NFA's size (see
    // `pattern.rs`); `patternProperties` is the validator's own matcher,
    // whose fallback visits every NFA state per byte of a key.
    if let Some(Value::String(pattern)) = fields.get("pattern") {
        cost += super::pattern::byte_cost(pattern).unwrap_or(8);
    }
    if let Some(Value::Object(patterns)) = fields.get("patternProperties") {
        let states = patterns.keys().map(|p| super::pattern::nfa_states(p).unwrap_or(0)).sum::<u64>();
        cost += states.max(8);
    }
    if has(&["minLength", "maxLength", "enum", "const", "uniqueItems"]) {
        cost += 1;
    }
    cost
}

/// The values in `value`, itself included.
fn parts(value: &Value) -> u64 {
    match value {
        Value::Array(items) => 1 + items.iter().map(parts).sum::<u64>(),
        Value::Object(fields) => 1 + fields.values().map(parts).sum::<u64>(),
        _ => 1,
    }
}

impl<'a> Graph<'a> {
    /// The index of the subschema at `pointer`, made (and queued) on first sight.
    fn node(&mut self, pointer: &str) -> Result<usize, SchemaError> {
        if let Some(&index) = self.index.get(pointer) {
            return Ok(index);
        }
        let value = self
            .root
            .pointer(pointer)
            .ok_or_else(|| SchemaError::new(format!("$ref \"#{pointer}\" points nowhere in the schema")))?;
        if !value.is_object() && !value.is_boolean() {
            return Err(SchemaError::new(format!("\"#{pointer}\" is not a schema (an object or a boolean)")));
        }
        self.within_the_root_resource(pointer)?;
        let index = self.nodes.len();
        self.nodes.push(Node::default());
        self.index.insert(pointer.to_string(), index);
        self.pending.push((index, pointer.to_string()));
        Ok(index)
    }

    /// Refuses a subschema that is, or lies inside, a resource of its own:
    /// an object on the way to it from the root (the subschema included)
    /// that sets `$id`, `$schema` or, under draft 4, `id`. Inside one, a
    /// `$ref` resolves against that resource, not the root, so this graph
    /// would not be the validator's (a `$defs` entry with an `$id`, never a
    /// node itself, let refs below it reach a doubling chain the graph saw
    /// as empty schemas).
    fn within_the_root_resource(&self, pointer: &str) -> Result<(), SchemaError> {
        let draft4 = self.root.get("$schema").and_then(Value::as_str).is_some_and(|s| s.contains("draft-04"));
        let mut end = 0;
        while end < pointer.len() {
            end = pointer[end + 1..].find('/').map_or(pointer.len(), |i| end + 1 + i);
            let at = &pointer[..end];
            let Some(Value::Object(fields)) = self.root.pointer(at) else { continue };
            // As keywords they are strings; a property named so (a key of
            // `properties`) maps to a schema.
            let sets = |keyword: &str| fields.get(keyword).is_some_and(Value::is_string);
            let keyword = if sets("$id") {
                "$id"
            } else if sets("$schema") {
                "$schema"
            } else if draft4 && sets("id") {
                "id"
            } else {
                continue;
            };
            return Err(SchemaError::new(format!(
                "{keyword} at \"#{at}\": only the root may set $id or $schema (a nested one changes what $ref \
                 means below it)"
            )));
        }
        Ok(())
    }

    /// Lists the edges of the subschema at `pointer`.
    fn list_edges(&mut self, index: usize, pointer: &str) -> Result<(), SchemaError> {
        let Some(Value::Object(fields)) = self.root.pointer(pointer) else { return Ok(()) };
        let at = |keyword: &str| format!("{pointer}/{}", escape(keyword));
        for keyword in DYNAMIC {
            if fields.contains_key(keyword) {
                return Err(SchemaError::new(format!(
                    "{keyword} at \"#{pointer}\": dynamic references are not supported; use $ref to a JSON pointer"
                )));
            }
        }
        let mut same_value = Vec::new();
        let mut descending = Vec::new();
        if let Some(reference) = fields.get("$ref") {
            let target = reference.as_str().and_then(local_pointer).ok_or_else(|| {
                SchemaError::new(format!(
                    "$ref {reference} at \"#{pointer}\": only references to a JSON pointer in the same \
                         document (\"#/$defs/name\") are supported; nothing is fetched"
                ))
            })?;
            same_value.push(self.node(&target)?);
        }
        for (keyword, child) in fields {
            let keyword = keyword.as_str();
            let here = at(keyword);
            if SAME_VALUE_ONE.contains(&keyword) {
                same_value.push(self.node(&here)?);
            } else if DESCENDING_ONE.contains(&keyword) {
                descending.push(self.node(&here)?);
            } else if keyword == "items" {
                match child {
                    Value::Array(items) => {
                        for i in 0..items.len() {
                            descending.push(self.node(&format!("{here}/{i}"))?);
                        }
                    }
                    _ => descending.push(self.node(&here)?),
                }
            } else if let (true, Value::Array(items)) =
                (SAME_VALUE_LIST.contains(&keyword) || DESCENDING_LIST.contains(&keyword), child)
            {
                let edges = if DESCENDING_LIST.contains(&keyword) { &mut descending } else { &mut same_value };
                for i in 0..items.len() {
                    edges.push(self.node(&format!("{here}/{i}"))?);
                }
            } else if let (true, Value::Object(map)) =
                (SAME_VALUE_MAP.contains(&keyword) || DESCENDING_MAP.contains(&keyword), child)
            {
                let descends = DESCENDING_MAP.contains(&keyword);
                for (name, sub) in map {
                    // draft-07 `dependencies` also takes lists of names.
                    if !(sub.is_object() || sub.is_boolean()) {
                        continue;
                    }
                    let node = self.node(&format!("{here}/{}", escape(name)))?;
                    if descends { descending.push(node) } else { same_value.push(node) }
                }
            }
        }
        // The `unevaluated*` keywords evaluate the same-value applicators
        // once more, for their annotations.
        let again = fields.keys().filter(|k| k.starts_with("unevaluated")).count();
        let base = same_value.clone();
        for _ in 0..again {
            same_value.extend_from_slice(&base);
        }
        self.branches |= fields.contains_key("anyOf") || fields.contains_key("oneOf");
        let (cost, errors) = cost_and_errors(fields);
        self.nodes[index] = Node { same_value, descending, cost, errors, byte_cost: byte_cost(fields) };
        Ok(())
    }

    /// The nodes in an order where every node comes before the nodes its
    /// same-value edges reach; a cycle of such edges, or a chain longer
    /// than [`MAX_IN_PLACE_CHAIN`], is refused.
    fn same_value_order(&self) -> Result<Vec<usize>, SchemaError> {
        #[derive(Clone, Copy, PartialEq)]
        enum Mark {
            New,
            Open,
            Done,
        }
        let mut mark = vec![Mark::New; self.nodes.len()];
        // Longest same-value chain starting at each node (in edges).
        let mut chain = vec![0usize; self.nodes.len()];
        let mut post_order = Vec::with_capacity(self.nodes.len());
        for start in 0..self.nodes.len() {
            if mark[start] != Mark::New {
                continue;
            }
            // Iterative depth-first search: (node, next edge to look at).
            let mut stack = vec![(start, 0usize)];
            mark[start] = Mark::Open;
            while let Some(&mut (node, ref mut next)) = stack.last_mut() {
                if let Some(&child) = self.nodes[node].same_value.get(*next) {
                    *next += 1;
                    match mark[child] {
                        Mark::Open => {
                            return Err(SchemaError::new(format!(
                                "the schema loops through $ref or allOf/anyOf/oneOf/not/if at \"#{}\" without \
                                 descending into the value",
                                self.pointer_of(child)
                            )));
                        }
                        Mark::New => {
                            mark[child] = Mark::Open;
                            stack.push((child, 0));
                        }
                        Mark::Done => {}
                    }
                    continue;
                }
                stack.pop();
                mark[node] = Mark::Done;
                chain[node] = self.nodes[node].same_value.iter().map(|&c| chain[c] + 1).max().unwrap_or(0);
                if chain[node] > MAX_IN_PLACE_CHAIN {
                    return Err(SchemaError::new(format!(
                        "\"#{}\" applies {} subschemas in a row to one value ($ref and allOf/anyOf/oneOf/not/if); \
                         at most {MAX_IN_PLACE_CHAIN}",
                        self.pointer_of(node),
                        chain[node]
                    )));
                }
                post_order.push(node);
            }
        }
        // Post-order puts children first: parents first is its reverse.
        post_order.reverse();
        Ok(post_order)
    }

    /// The most evaluations any one value can cost, level by level (see
    /// the module docs; refused past [`MAX_EVALUATIONS_PER_VALUE`]), and
    /// with them its work and errors.
    fn evaluations(&self, order: &[usize]) -> Result<Costs, SchemaError> {
        // Evaluations entering each node at this depth, by a descending
        // edge (the root at depth 0).
        let mut entering = vec![0u64; self.nodes.len()];
        entering[0] = 1;
        let mut most = Costs { branches: self.branches, ..Costs::default() };
        for depth in 0..=MAX_VALUE_NESTING {
            // Spread along same-value edges, parents first.
            let mut reached = entering.clone();
            for &node in order {
                let count = reached[node];
                if count == 0 {
                    continue;
                }
                for &child in &self.nodes[node].same_value {
                    reached[child] = reached[child].saturating_add(count);
                }
            }
            let total = reached.iter().fold(0u64, |sum, &n| sum.saturating_add(n));
            if total > MAX_EVALUATIONS_PER_VALUE {
                return Err(SchemaError::new(format!(
                    "a value {depth} levels down can cost {} subschema evaluations (every way the schema reaches \
                     it counts); at most {MAX_EVALUATIONS_PER_VALUE}",
                    if total == u64::MAX { "more than 2^64".to_string() } else { total.to_string() }
                )));
            }
            most.evaluations = most.evaluations.max(total);
            let weighed = |per: fn(&Node) -> u64| {
                reached
                    .iter()
                    .zip(&self.nodes)
                    .fold(0u64, |sum, (&n, node)| sum.saturating_add(n.saturating_mul(per(node))))
            };
            // A boolean schema's node has no keywords: it costs one.
            most.work = most.work.max(weighed(|node| node.cost.max(1)));
            most.errors = most.errors.max(weighed(|node| node.errors.max(1)));
            most.byte_work = most.byte_work.max(weighed(|node| node.byte_cost));
            let mut next = vec![0u64; self.nodes.len()];
            let mut any = false;
            for (node, &count) in reached.iter().enumerate() {
                if count == 0 {
                    continue;
                }
                for &child in &self.nodes[node].descending {
                    next[child] = next[child].saturating_add(count);
                    any = true;
                }
            }
            if !any {
                break;
            }
            entering = next;
        }
        if most.work > MAX_VALIDATION_WORK {
            return Err(SchemaError::new(format!(
                "checking one value against this schema can cost {} evaluations (long enum, const, required or \
                 dependentRequired lists, fractional multipleOf, each counted every way the schema reaches them); \
                 at most {MAX_VALIDATION_WORK}",
                most.work
            )));
        }
        Ok(most)
    }

    fn pointer_of(&self, node: usize) -> &str {
        self.index.iter().find(|(_, i)| **i == node).map_or("", |(p, _)| p.as_str())
    }
}

/// The JSON pointer of a same-document `$ref` (`#` or `#/...`, with
/// percent-escapes decoded); `None` for anything else.
fn local_pointer(reference: &str) -> Option<String> {
    let fragment = reference.strip_prefix('#')?;
    if !(fragment.is_empty() || fragment.starts_with('/')) {
        return None; // an anchor name
    }
    let bytes = fragment.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = fragment.get(i + 1..i + 3)?;
            decoded.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            decoded.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(decoded).ok()
}

/// A key as one JSON pointer token.
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn evaluations_count_every_path_to_a_value() {
        assert_eq!(check(&json!({"type": "integer"})).unwrap(), 1);
        assert_eq!(check(&json!(true)).unwrap(), 1);
        // Root plus two branches.
        assert_eq!(check(&json!({"anyOf": [{"type": "integer"}, {"type": "string"}]})).unwrap(), 3);
        // Items see the items schema and its $ref target.
        let s = json!({"$defs": {"i": {"type": "integer"}}, "items": {"$ref": "#/$defs/i"}});
        assert_eq!(check(&s).unwrap(), 2);
        // Two descending edges to one place double the next level.
        let s = json!({"properties": {"a": {"$ref": "#/$defs/x"}}, "additionalProperties": {"$ref": "#/$defs/x"},
                       "$defs": {"x": {"allOf": [true, true]}}});
        assert_eq!(check(&s).unwrap(), 2 * (1 + 1 + 2));
    }

    /// A `$ref` below a nested `$id` (or a draft-4 `id`, or a nested
    /// `$schema` that makes one count) resolves against that resource: the
    /// graph would be another schema than the validator's. Here the `$defs`
    /// entry holding the `$id` is never a node itself, and the refs below it
    /// name `#/$defs/aN`, empty schemas at the root, while the validator
    /// follows a chain that doubles at every link (2^40 evaluations of `1`;
    /// 18 links took 3.6 s of a debug build, each link doubles it).
    #[test]
    fn references_inside_a_nested_resource_are_refused() {
        let chain = |links: usize, id: &str, defs: &str| {
            let mut inner = serde_json::Map::new();
            for i in 0..links {
                let next = format!("#/{defs}/a{}", i + 1);
                inner.insert(format!("a{i}"), json!({"anyOf": [{"$ref": next}, {"$ref": next}]}));
            }
            inner.insert(format!("a{links}"), json!({"type": "string"}));
            let mut outer: serde_json::Map<String, Value> = (0..=links).map(|i| (format!("a{i}"), json!({}))).collect();
            outer.insert("x".into(), json!({id: "https://e.example/x", defs: inner}));
            json!({defs: outer, "$ref": format!("#/{defs}/x/{defs}/a0")})
        };
        let refused = |schema: Value, why: &str| {
            let reason = check(&schema).map(|n| format!("accepted at {n} evaluations")).unwrap_or_else(|e| e.reason);
            assert!(reason.contains(why), "expected {why:?}: {reason}");
        };
        refused(chain(40, "$id", "$defs"), "$id at \"#/$defs/x\"");
        // Draft 4 names it `id`; a nested `$schema` can make a subschema draft 4.
        let mut draft4 = chain(40, "id", "definitions");
        draft4["$schema"] = json!("http://json-schema.org/draft-04/schema#");
        refused(draft4, "id at \"#/definitions/x\"");
        let mut nested = chain(40, "id", "definitions");
        nested["definitions"]["x"]["$schema"] = json!("http://json-schema.org/draft-04/schema#");
        refused(nested, "$schema at \"#/definitions/x\"");
        // Words that are only property names, and `id` outside draft 4, are fine.
        let names = json!({"properties": {"$id": {"type": "string"}, "$schema": {}, "id": {"properties": {"id": {}}}}});
        assert_eq!(check(&names).unwrap(), 3);
        assert!(check(&json!({"properties": {"a": {"id": "x", "type": "string"}}})).is_ok());
    }

    /// Known over-refusal, not fixed: the count sums every subschema a
    /// level reaches, though a value under `properties` is reached by its
    /// own name only, so 65 properties of 65 properties each (39 KB, every
    /// value one evaluation) are refused as "4225 evaluations" of one value.
    #[test]
    #[ignore = "known limit: properties of different names are counted as if one value met them all"]
    fn distinct_property_names_reach_distinct_values() {
        let inner: serde_json::Map<String, Value> = (0..65).map(|j| (format!("b{j}"), json!({}))).collect();
        let outer: serde_json::Map<String, Value> =
            (0..65).map(|i| (format!("a{i}"), json!({"properties": inner.clone()}))).collect();
        assert!(check(&json!({"properties": outer})).is_ok());
    }

    #[test]
    fn references_resolve_escaped_pointers() {
        assert_eq!(local_pointer("#/$defs/a%20b").as_deref(), Some("/$defs/a b"));
        assert_eq!(local_pointer("#").as_deref(), Some(""));
        assert_eq!(local_pointer("#anchor"), None);
        assert_eq!(local_pointer("other.json#/a"), None);
        let s = json!({"$defs": {"a/b": {"type": "string"}}, "$ref": "#/$defs/a~1b"});
        assert_eq!(check(&s).unwrap(), 2);
    }
}
