// ---- execbox harness: JSON input on stdin, run(input) printed as JSON ----
mod __execbox_prelude {
    pub use serde_json::Value;

    /// The host's tools this run may call (Code Mode).
    #[allow(dead_code)]
    pub mod tools {
        use serde_json::Value;
        use std::io::{BufRead, BufReader, Write};
        use std::os::unix::net::UnixStream;
        use std::sync::Mutex;

        /// A tool call that produced no value: `kind` is `not_granted`,
        /// `failed`, `timed_out`, `budget_exhausted`, ...
        #[derive(Clone, Debug, PartialEq)]
        pub struct ToolError {
            pub tool: String,
            pub kind: String,
            pub message: String,
        }

        impl std::fmt::Display for ToolError {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}: {} ({})", self.tool, self.kind, self.message)
            }
        }

        impl std::error::Error for ToolError {}

        /// The connection (opened at the first call) and the last call id.
        static LINK: Mutex<Option<(u64, BufReader<UnixStream>)>> = Mutex::new(None);

        /// Calls the tool `name` (`namespace.tool`) with `args` (an object).
        pub fn call(name: &str, args: Value) -> Result<Value, ToolError> {
            let fail =
                |kind: &str, message: String| ToolError { tool: name.to_string(), kind: kind.to_string(), message };
            let Some(path) = std::env::var_os("EXECBOX_TOOLS") else {
                return Err(fail("not_granted", "this run's policy grants no tools".to_string()));
            };
            let mut link = LINK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if link.is_none() {
                let stream = UnixStream::connect(&path)
                    .map_err(|e| fail("unavailable", format!("cannot reach the host's tools: {e}")))?;
                *link = Some((0, BufReader::new(stream)));
            }
            let answer = match link.as_mut() {
                Some((last, reader)) => {
                    *last += 1;
                    exchange(reader, *last, name, &args)
                }
                None => unreachable!(),
            };
            let result = match answer {
                Ok(result) => result,
                Err(e) => {
                    *link = None;
                    return Err(fail("cancelled", format!("no answer: the run is over ({e})")));
                }
            };
            if result["ok"] == true {
                return Ok(result["value"].clone());
            }
            let error = &result["error"];
            let text = |key: &str, default: &str| error[key].as_str().unwrap_or(default).to_string();
            Err(ToolError { tool: text("tool", name), kind: text("kind", "protocol"), message: text("message", "") })
        }

        /// One call frame out, answers in until the one with `id`.
        fn exchange(reader: &mut BufReader<UnixStream>, id: u64, name: &str, args: &Value) -> std::io::Result<Value> {
            let frame = format!("{{\"tool_call\":{{\"id\":{id},\"name\":{},\"args\":{args}}}}}\n", Value::from(name));
            reader.get_mut().write_all(frame.as_bytes())?;
            let mut line = String::new();
            loop {
                line.clear();
                if reader.read_line(&mut line)? == 0 {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the host closed the connection",
                    ));
                }
                let mut frame: Value = serde_json::from_str(&line)?;
                if frame["tool_result"]["id"] == id {
                    return Ok(frame["tool_result"].take());
                }
            }
        }

        /// The names of the tools this run may call.
        pub fn list() -> Result<Vec<String>, ToolError> {
            let names = call("tools.list", Value::Object(Default::default()))?;
            Ok(names.as_array().into_iter().flatten().filter_map(|n| n.as_str().map(str::to_string)).collect())
        }

        /// The spec of the tool `name`: description, input_schema, ...
        pub fn describe(name: &str) -> Result<Value, ToolError> {
            call("tools.describe", serde_json::json!({ "name": name }))
        }
    }
}
#[allow(unused_imports)]
use __execbox_prelude::*;

fn main() {
    use std::io::Read as _;
    let mut text = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut text) {
        eprintln!("execbox: cannot read the input: {e}");
        std::process::exit(2);
    }
    let input: serde_json::Value = if text.trim().is_empty() {
        serde_json::Value::Null
    } else {
        match serde_json::from_str(&text) {
            Ok(value) => value,
            Err(e) => {
                eprintln!("execbox: the input is not JSON: {e}");
                std::process::exit(2);
            }
        }
    };
    let output: serde_json::Value = run(input);
    // On a line of its own, after whatever the program printed (the host
    // takes this line out of stdout, and the newline before it).
    print!("\n{output}\n");
}
