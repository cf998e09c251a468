//! What the model sees of the granted tools, generated from their JSON
//! Schemas: TypeScript declarations (for JavaScript), typed Python stubs,
//! and a catalog text for prompts with a size cap. Past the cap the
//! catalog is a short note, and code discovers tools at run time
//! (`tools.list()`, `tools.describe(name)`).

use std::collections::BTreeMap;
use std::fmt::Write;

use serde_json::Value;

use super::registry::ToolSpec;

/// Deepest schema level turned into a type (deeper is `unknown` / `Any`).
const MAX_SCHEMA_DEPTH: usize = 8;

/// Longest description kept per tool in declarations and the catalog.
const MAX_DESCRIPTION: usize = 400;

/// TypeScript declarations of `tools` for `specs`.
pub fn typescript(specs: &[&ToolSpec]) -> String {
    let mut out = String::from(
        "/** Thrown by a failed tool call: `kind` says why (not_granted, failed, timed_out, ...). */\n\
         declare class ToolError extends Error { tool: string; kind: string; }\n\
         declare const tools: {\n",
    );
    for (namespace, specs) in by_namespace(specs) {
        let _ = writeln!(out, "  {}: {{", ts_key(namespace));
        for spec in specs {
            let description = short(&spec.description);
            if !description.is_empty() {
                let _ = writeln!(out, "    /** {} */", description.replace("*/", "* /"));
            }
            let output = spec.output_schema.as_ref().map_or("unknown".to_string(), |s| ts_type(s, 0));
            let _ = writeln!(
                out,
                "    {}(args: {}): Promise<{}>;",
                ts_key(spec.short_name()),
                ts_type(&spec.input_schema, 0),
                output
            );
        }
        out.push_str("  };\n");
    }
    out.push_str(
        "  /** Calls a tool by its full name (for names that are not identifiers). */\n\
         \x20 call(name: string, args?: object): Promise<unknown>;\n\
         \x20 /** The granted tools' names. */\n\
         \x20 list(): Promise<string[]>;\n\
         \x20 /** A granted tool's description and schemas. */\n\
         \x20 describe(name: string): Promise<object>;\n\
         };\n",
    );
    out
}

/// Typed Python stubs of the `tools` package for `specs`.
pub fn python(specs: &[&ToolSpec]) -> String {
    let mut out = String::from(
        "# import tools; tools.NAMESPACE.TOOL(**kwargs), or tools.call(\"ns.tool\", {...});\n\
         # a failed call raises tools.ToolError (.tool, .kind, .message).\n",
    );
    for (namespace, specs) in by_namespace(specs) {
        let _ = writeln!(out, "\n# tools.{namespace}");
        for spec in specs {
            let params = py_params(&spec.input_schema);
            let returns = spec.output_schema.as_ref().map_or("Any".to_string(), |s| py_type(s, 0));
            let name = spec.short_name();
            let callable =
                if is_identifier(name) { name.to_string() } else { format!("# tools.call({:?}, ...)\n# ", spec.name) };
            let _ = write!(out, "def {callable}({params}) -> {returns}:");
            let description = short(&spec.description);
            if description.is_empty() {
                out.push_str(" ...\n");
            } else {
                let _ = writeln!(out, " \"\"\"{}\"\"\"", description.replace("\"\"\"", "'''"));
            }
        }
    }
    out
}

/// One line per tool (`name(args) — description`), in at most `max_bytes`;
/// past that, a note naming the namespaces and how to discover the tools.
pub fn text(specs: &[&ToolSpec], max_bytes: usize) -> String {
    let mut out = String::new();
    for spec in specs {
        let description = short(&spec.description);
        let line = format!(
            "- {}({}){}\n",
            spec.name,
            ts_type(&spec.input_schema, 0),
            if description.is_empty() { String::new() } else { format!(" — {description}") }
        );
        if out.len() + line.len() > max_bytes {
            let namespaces: Vec<&str> = by_namespace(specs).into_keys().collect();
            return format!(
                "{} tools are granted, in namespaces {}. Discover them from code: `await tools.list()` and \
                 `await tools.describe(name)` (Python: tools.list(), tools.describe(name)).\n",
                specs.len(),
                namespaces.join(", ")
            );
        }
        out.push_str(&line);
    }
    out
}

/// What a model needs to call `specs` from its code: how (JavaScript,
/// Python), what a failure looks like, and the catalog: TypeScript
/// declarations when they fit in `max_bytes`, else the text list, else a
/// note on discovering them from code. One text for every prompt execbox
/// writes (the MCP `run_code` description, the agent layer's system
/// instruction).
pub fn code_mode_prompt(specs: &[&ToolSpec], max_bytes: usize) -> String {
    let declarations = typescript(specs);
    let catalog =
        if declarations.len() <= max_bytes { format!("```ts\n{declarations}```") } else { text(specs, max_bytes) };
    format!(
        "Code Mode: the code may call these host tools (JavaScript: `await tools.ns.name({{...}})`; Python: \
         `import tools` then `tools.ns.name(**kwargs)`; a failure raises ToolError with .kind). Calls per run, \
         timeouts and sizes are limited; the result's tool_calls ledger says what each call did.\n{catalog}"
    )
}

fn by_namespace<'a>(specs: &[&'a ToolSpec]) -> BTreeMap<&'a str, Vec<&'a ToolSpec>> {
    let mut map: BTreeMap<&str, Vec<&ToolSpec>> = BTreeMap::new();
    for spec in specs {
        map.entry(spec.namespace()).or_default().push(spec);
    }
    map
}

fn short(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    crate::text::cap_text(line, MAX_DESCRIPTION)
}

fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn ts_key(name: &str) -> String {
    if is_identifier(name) { name.to_string() } else { format!("{name:?}") }
}

/// The TypeScript type of a JSON Schema.
fn ts_type(schema: &Value, depth: usize) -> String {
    if depth >= MAX_SCHEMA_DEPTH {
        return "unknown".into();
    }
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        let literals: Vec<String> = values.iter().take(32).map(|v| v.to_string()).collect();
        return if literals.is_empty() { "never".into() } else { literals.join(" | ") };
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(options) = schema.get(key).and_then(Value::as_array) {
            let types: Vec<String> = options.iter().take(16).map(|o| ts_type(o, depth + 1)).collect();
            return types.join(" | ");
        }
    }
    match schema.get("type") {
        Some(Value::String(t)) => ts_named(t, schema, depth),
        Some(Value::Array(types)) => {
            // Each name once: every one renders this same schema again, so
            // repeats (`["object", "object", ...]`) at every level multiplied
            // the text by their count per level (100 of them 8 levels deep
            // never finished, in memory).
            let mut names: Vec<&str> = Vec::new();
            for name in types.iter().filter_map(Value::as_str) {
                if !names.contains(&name) && names.len() < 8 {
                    names.push(name);
                }
            }
            names.iter().map(|t| ts_named(t, schema, depth)).collect::<Vec<_>>().join(" | ")
        }
        _ if schema.get("properties").is_some() => ts_named("object", schema, depth),
        _ => "unknown".into(),
    }
}

fn ts_named(name: &str, schema: &Value, depth: usize) -> String {
    match name {
        "string" => "string".into(),
        "number" | "integer" => "number".into(),
        "boolean" => "boolean".into(),
        "null" => "null".into(),
        "array" => {
            let item = schema.get("items").map_or("unknown".to_string(), |i| ts_type(i, depth + 1));
            if item.contains(' ') { format!("Array<{item}>") } else { format!("{item}[]") }
        }
        "object" => {
            let Some(props) = schema.get("properties").and_then(Value::as_object) else {
                return "Record<string, unknown>".into();
            };
            let required: Vec<&str> = schema
                .get("required")
                .and_then(Value::as_array)
                .map_or(Vec::new(), |r| r.iter().filter_map(Value::as_str).collect());
            let fields: Vec<String> = props
                .iter()
                .take(64)
                .map(|(k, v)| {
                    let optional = if required.contains(&k.as_str()) { "" } else { "?" };
                    format!("{}{optional}: {}", ts_key(k), ts_type(v, depth + 1))
                })
                .collect();
            if fields.is_empty() { "{}".into() } else { format!("{{ {} }}", fields.join("; ")) }
        }
        _ => "unknown".into(),
    }
}

/// Python keyword parameters from an object schema.
fn py_params(schema: &Value) -> String {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else { return "**kwargs: Any".into() };
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map_or(Vec::new(), |r| r.iter().filter_map(Value::as_str).collect());
    let mut params: Vec<String> = Vec::new();
    for (name, prop) in props.iter().take(64) {
        if !is_identifier(name) {
            continue;
        }
        let ty = py_type(prop, 1);
        if required.contains(&name.as_str()) {
            params.push(format!("{name}: {ty}"));
        } else {
            params.push(format!("{name}: {ty} | None = None"));
        }
    }
    if params.is_empty() { String::new() } else { format!("*, {}", params.join(", ")) }
}

/// The Python type of a JSON Schema.
fn py_type(schema: &Value, depth: usize) -> String {
    if depth >= MAX_SCHEMA_DEPTH {
        return "Any".into();
    }
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        let literals: Vec<String> = values.iter().take(32).map(py_literal).collect();
        return format!("Literal[{}]", literals.join(", "));
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("string") => "str".into(),
        Some("integer") => "int".into(),
        Some("number") => "float".into(),
        Some("boolean") => "bool".into(),
        Some("null") => "None".into(),
        Some("array") => format!("list[{}]", schema.get("items").map_or("Any".to_string(), |i| py_type(i, depth + 1))),
        Some("object") => "dict[str, Any]".into(),
        _ => "Any".into(),
    }
}

fn py_literal(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Null => "None".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn specs() -> Vec<ToolSpec> {
        vec![
            ToolSpec::new("memory.read_graph").description("Reads the whole graph.").input_schema(json!({
                "type": "object",
                "properties": {"depth": {"type": "integer"}, "kind": {"enum": ["a", "b"]}},
                "required": ["depth"]
            })),
            ToolSpec::new("everything.get-sum").description("Sum of two numbers").input_schema(json!({
                "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]
            })),
        ]
    }

    /// An upstream server's schema is hostile: a `type` list that names
    /// `object` again and again, at every level, rendered each level that
    /// many times over (8 levels of 100 names: `tools/list` of `execbox
    /// serve --upstreams` never answered, its memory growing).
    #[test]
    fn repeated_type_names_are_rendered_once() {
        let mut schema = json!({"type": "string"});
        for _ in 0..8 {
            schema = json!({"type": vec!["object"; 6], "properties": {"a": schema}});
        }
        let spec = ToolSpec::new("up.t").input_schema(schema);
        let started = std::time::Instant::now();
        let ts = typescript(&[&spec]);
        assert!(ts.len() < 4096, "{} bytes of declarations", ts.len());
        assert!(text(&[&spec], 12 << 10).len() < 4096);
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
    }

    #[test]
    fn declarations_are_typed_from_the_schemas() {
        let specs = specs();
        let refs: Vec<&ToolSpec> = specs.iter().collect();
        let ts = typescript(&refs);
        assert!(ts.contains("read_graph(args: { depth: number; kind?: \"a\" | \"b\" }): Promise<unknown>;"), "{ts}");
        assert!(ts.contains("\"get-sum\"(args: { a: number; b: number })"), "{ts}");
        assert!(ts.contains("declare class ToolError"), "{ts}");
        let py = python(&refs);
        assert!(
            py.contains("def read_graph(*, depth: int, kind: Literal[\"a\", \"b\"] | None = None) -> Any:"),
            "{py}"
        );
        assert!(py.contains("tools.call(\"everything.get-sum\""), "{py}");
        let catalog = text(&refs, 10_000);
        assert_eq!(catalog.lines().count(), 2, "{catalog}");
        let small = text(&refs, 40);
        assert!(small.contains("2 tools are granted") && small.contains("tools.list()"), "{small}");
    }
}
