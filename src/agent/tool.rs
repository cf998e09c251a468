//! execbox as one tool for function-calling LLM APIs: a JSON schema and a
//! dispatch function whose every answer, error included, is JSON.

use std::time::Duration;

use serde_json::{Value, json};

use super::executor::{ExecboxCodeExecutor, InvocationContext};
use super::result::CodeExecutionInput;

/// The tool's name in [`tool_schema`].
pub const TOOL_NAME: &str = "execute_code";

/// `{name, description, parameters}` with a JSON Schema for
/// `{language, code, input, timeout_secs, session_id, packages}`.
pub fn tool_schema() -> Value {
    json!({
        "name": TOOL_NAME,
        "description": "Run code in a sandbox with no network, no host files and no host environment. \
            JavaScript: a function body; `input` holds the JSON input and `return` gives the output. \
            Python: `input` holds the JSON input; print JSON to give structured output. \
            Rust: define `fn run(input: serde_json::Value) -> serde_json::Value`. \
            Shell: a bash script. Returns stdout, stderr, exit_code, outcome and output.",
        "parameters": {
            "type": "object",
            "properties": {
                "language": {
                    "type": "string",
                    "enum": ["javascript", "python", "rust", "shell", "wasm"],
                    "description": "Language of `code`."
                },
                "code": {"type": "string", "description": "The code to run."},
                "input": {"description": "Optional JSON value made available to the code as `input`."},
                "timeout_secs": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "description": "Optional wall-clock limit; it can shorten, never extend, the configured limit."
                },
                "session_id": {
                    "type": "string",
                    "description": "Optional: calls with the same id share interpreter state (when the executor keeps sessions)."
                },
                "packages": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "Optional: packages the code imports (Python: numpy, pandas, matplotlib, scipy)."
                }
            },
            "required": ["language", "code"],
            "additionalProperties": false
        }
    })
}

/// Runs one tool call. `arguments` is the JSON object the model produced, or
/// that object as a JSON string (as some APIs deliver it). Always answers
/// JSON: the result's fields, or `{"error": {"kind", "message", ...}}`.
pub async fn dispatch(executor: &ExecboxCodeExecutor, arguments: &Value) -> Value {
    let parsed;
    let args = match arguments {
        Value::String(text) => match serde_json::from_str::<Value>(text) {
            Ok(v) => {
                parsed = v;
                &parsed
            }
            Err(e) => return invalid(format!("arguments are not JSON: {e}")),
        },
        other => other,
    };
    let Some(object) = args.as_object() else { return invalid("arguments must be a JSON object".into()) };
    const KNOWN: [&str; 6] = ["language", "code", "input", "timeout_secs", "session_id", "packages"];
    if let Some(unknown) = object.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return invalid(format!("unknown argument {unknown:?}"));
    }
    let (Some(language), Some(code)) =
        (object.get("language").and_then(Value::as_str), object.get("code").and_then(Value::as_str))
    else {
        return invalid("`language` and `code` are required strings".into());
    };
    let timeout = match object.get("timeout_secs") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_f64().filter(|s| s.is_finite() && *s > 0.0) {
            Some(secs) => Some(Duration::from_secs_f64(secs.min(1e9))),
            None => return invalid("`timeout_secs` must be a positive number".into()),
        },
    };
    let session_id = match object.get("session_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(id.clone()),
        Some(_) => return invalid("`session_id` must be a string".into()),
    };
    let packages = match object.get("packages") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(names)) if names.iter().all(Value::is_string) => {
            names.iter().filter_map(Value::as_str).map(str::to_string).collect()
        }
        Some(_) => return invalid("`packages` must be an array of strings".into()),
    };
    let input = CodeExecutionInput {
        code: code.to_string(),
        language: language.to_string(),
        input: object.get("input").cloned(),
        execution_id: session_id,
        packages,
        ..Default::default()
    };
    match executor.run_with_timeout(&InvocationContext::default(), input, timeout).await {
        // The result's own JSON (files included, content in base64), plus
        // the verdict a model should act on.
        Ok(result) => {
            let mut answer = serde_json::to_value(&result).unwrap_or_else(|_| json!({}));
            answer["success"] = Value::Bool(result.is_success());
            answer
        }
        Err(err) => err.to_json(),
    }
}

fn invalid(message: String) -> Value {
    json!({"error": {"kind": "invalid_arguments", "message": message, "violations": []}})
}
