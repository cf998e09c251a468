//! How a JavaScript function body runs on QuickJS-in-wasm with boa's
//! request semantics, and how its returned value reaches the host without
//! the code being able to forge or silently cut it.
//!
//! **The program.** The script is a runner closure followed by the user's
//! function, both starting on line 1 so error lines are the caller's:
//!
//! ```text
//! (() => { RUNNER })(); function __execbox_main() {USER CODE
//! }
//! ```
//!
//! The runner is the script's first statement, so it runs before any of the
//! user's top-level code (even code that breaks out of the function body with
//! a stray `}`; function declarations are hoisted but not run). It reads
//! stdin — a per-run nonce on the first line, then the JSON input — so the
//! nonce lives only in the closure: it is not in the script text, not in a
//! global, and stdin is at its end before user code runs. It keeps its own
//! references to `JSON.stringify`, `std.out.puts` and the other functions it
//! calls later, so user code that replaces them changes nothing. Then it calls
//! `__execbox_main()` and reports through **records** on stdout:
//!
//! ```text
//! \0execbox:<nonce>:A\n                   the function returned; its value is being awaited
//! \0execbox:<nonce>:R<len>:<json>\n       the value: <len> bytes of UTF-8 JSON (0: undefined)
//! ```
//!
//! **Tools.** When the run grants tools (Code Mode) the runner reads stdin
//! framed instead ([`tools_stdin`]: the nonce line, then the granted names
//! and the input as messages, with `std.in.getline` and
//! `std.in.readAsString(n)`), and stdin stays open: each call writes a
//! `\0execbox:<nonce>:T<len>:<json>\n` record and reads messages until its
//! answer (see `tool_channel.rs`). The `tools` global and `ToolError` are
//! defined before the user's code runs, from functions the runner keeps.
//!
//! **The tap.** [`ResultTap`] sits on the guest's stdout (host side) and
//! diverts records out of the stream as they are written: what the code
//! prints is capped by `max_stdout_bytes` as usual, and the record is parsed
//! by its length, so a value is never cut to a shorter valid JSON document.
//! A value whose JSON is over `max_stdout_bytes` is `failed` with
//! `output_truncated`, as the executor's result caps decide for every
//! backend; exit 0 without a value is `failed` ("the returned promise never
//! settled" when the function returned a promise that never settled).

use crate::limits::records::{Records, Returned};
use crate::result::{ExecResult, Outcome};

/// The user's function's name in the script.
const MAIN: &str = "__execbox_main";

/// A per-run nonce: 128 random bits as hex.
pub(crate) fn nonce() -> String {
    crate::nonce::hex128()
}

/// What the guest reads on stdin: the nonce line, then the JSON input.
pub(crate) fn stdin(nonce: &str, input_json: Option<&[u8]>) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(nonce.len() + 1 + input_json.map_or(0, <[u8]>::len));
    bytes.extend_from_slice(nonce.as_bytes());
    bytes.push(b'\n');
    bytes.extend_from_slice(input_json.unwrap_or_default());
    bytes
}

/// What the guest reads on stdin when its run calls tools: the nonce line,
/// then two framed messages (`<len>\n<bytes>`): the granted tools' names
/// (a JSON array) and the JSON input (empty without one). Stdin stays open
/// after them: the calls' answers follow, one message each.
pub(crate) fn tools_stdin(nonce: &str, names: &[String], input_json: Option<&[u8]>) -> Vec<u8> {
    let names = serde_json::to_vec(names).unwrap_or_else(|_| b"[]".to_vec());
    let input = input_json.unwrap_or_default();
    let mut bytes = format!("{nonce}\n{}\n", names.len()).into_bytes();
    bytes.extend_from_slice(&names);
    bytes.extend_from_slice(format!("{}\n", input.len()).as_bytes());
    bytes.extend_from_slice(input);
    bytes
}

/// The runner's first constants (the functions it keeps for itself).
const RUNNER_HEAD: &str = concat!(
    "(() => { ",
    "const S = std, out = S.out, err = S.err, exit = S.exit; ",
    "const puts = out.puts.bind(out), flush = out.flush.bind(out); ",
    "const eputs = err.puts.bind(err), eflush = err.flush.bind(err); ",
    "const stringify = JSON.stringify, parse = JSON.parse, P = Promise, resolve = P.resolve.bind(P); ",
    "const call = Function.prototype.call, then = call.bind(P.prototype.then); ",
    "const codeAt = call.bind(String.prototype.charCodeAt), str = String; ",
);

/// Reads the nonce and the input (all of stdin, see [`stdin`]).
const READ_ALL: &str = concat!(
    "const all = S.in.readAsString(), nl = all.indexOf('\\n'); ",
    "const MARK = '\\0execbox:' + all.slice(0, nl) + ':', text = all.slice(nl + 1); ",
);

/// Reads the nonce, the tools' names and the input (see [`tools_stdin`]),
/// leaving stdin open; `msg()` reads one framed message (`null` at its end).
const READ_FRAMED: &str = concat!(
    "const IN = S.in, getline = IN.getline.bind(IN), readN = IN.readAsString.bind(IN); ",
    "const sliceOf = call.bind(String.prototype.slice), indexOf = call.bind(String.prototype.indexOf); ",
    "const msg = () => { const h = getline(); if (h === null) return null; const n = +h; return n > 0 ? readN(n) : ''; }; ",
    "const MARK = '\\0execbox:' + getline() + ':', NAMES = parse(msg()), text = msg() || ''; ",
);

/// The input, `console` and the byte counter of records.
const RUNNER_BODY: &str = concat!(
    "globalThis.input = text.trim() === '' ? undefined : parse(text); ",
    "const fmt = (v) => { if (typeof v === 'string') return v; ",
    "try { const j = stringify(v); return j === undefined ? str(v) : j; } catch (e) { return str(v); } }; ",
    "const line = (w, a) => { w(a.map(fmt).join(' ') + '\\n'); }; ",
    "globalThis.console = { log: (...a) => line(puts, a), info: (...a) => line(puts, a), ",
    "debug: (...a) => line(puts, a), warn: (...a) => line(eputs, a), error: (...a) => line(eputs, a) }; ",
    "const utf8 = (s) => { let n = 0; for (let i = 0; i < s.length; i++) { const c = codeAt(s, i); ",
    "n += c < 0x80 ? 1 : c < 0x800 ? 2 : (c >= 0xd800 && c < 0xdc00) ? (i++, 4) : 3; } return n; }; ",
);

/// The `tools` global and `ToolError` (with [`READ_FRAMED`]): a call writes
/// a `T` record and reads answers until its own (synchronously: calls are
/// serialized, `Promise.all` included); its promise settles with the value
/// or a `ToolError`.
const TOOLS: &str = concat!(
    "class ToolError extends Error { constructor(tool, kind, message) { super(message); ",
    "this.name = 'ToolError'; this.tool = tool; this.kind = kind; } } ",
    "const define = Object.defineProperty, freeze = Object.freeze, hasOwn = Object.hasOwn; let last = 0; ",
    "const callNow = (name, args) => { ",
    "if (typeof name !== 'string') throw new ToolError(str(name), 'not_found', 'a tool name is a string'); ",
    "const id = ++last; let j; ",
    "try { j = stringify({ tool_call: { id, name, args: args == null ? {} : args } }); } ",
    "catch (e) { throw new ToolError(name, 'invalid_arguments', 'the arguments are not JSON: ' + str(e)); } ",
    "puts(MARK + 'T' + utf8(j) + ':' + j + '\\n'); flush(); ",
    "for (;;) { const m = msg(); ",
    "if (m === null || codeAt(m, 0) !== 0) throw new ToolError(name, 'cancelled', 'no answer: the run is over'); ",
    "const r = parse(sliceOf(m, 1)).tool_result || {}; if (r.id !== id) continue; if (r.ok) return r.value; ",
    "const e = r.error || {}; throw new ToolError(e.tool || name, e.kind || 'protocol', e.message || ''); } }; ",
    "const tcall = (name, args) => new P((ok, no) => { try { ok(callNow(name, args)); } catch (e) { no(e); } }); ",
    "const tools = { call: tcall, list: () => tcall('tools.list', {}), ",
    "describe: (name) => tcall('tools.describe', { name }), ToolError }; ",
    "const spaces = new Map(); ",
    "for (const full of NAMES) { const dot = indexOf(full, '.'), ns = sliceOf(full, 0, dot); let space = spaces.get(ns); ",
    "if (!space) { space = {}; spaces.set(ns, space); ",
    "if (!hasOwn(tools, ns)) define(tools, ns, { value: space, enumerable: true }); } ",
    "define(space, sliceOf(full, dot + 1), { value: (args) => tcall(full, args), enumerable: true }); } ",
    "spaces.forEach((space) => freeze(space)); globalThis.tools = freeze(tools); globalThis.ToolError = ToolError; ",
);

/// Reports the function's end (see the module docs) and starts it.
const RUNNER_TAIL: &str = concat!(
    "let done = false; ",
    "const fail = (e) => { if (done) return; done = true; flush(); ",
    "eputs('Uncaught ' + (e instanceof Error ? e.name + ': ' + e.message : str(e)) + '\\n'); eflush(); exit(1); }; ",
    "const emit = (v) => { if (done) return; let j; try { j = stringify(v); } catch (e) { return fail(e); } ",
    "done = true; j = j === undefined ? '' : j; puts(MARK + 'R' + utf8(j) + ':' + j + '\\n'); flush(); }; ",
    "let r; try { r = ",
);

/// The script for `source` (see the module docs); with `tools`, the runner
/// reads [`tools_stdin`] and defines the `tools` global. The code starts on
/// the script's first line.
pub(crate) fn program(source: &str, tools: bool) -> String {
    let function = if source.contains("await") { "async function" } else { "function" };
    // One line: everything before the user's code sits on line 1.
    let runner = if tools {
        [RUNNER_HEAD, READ_FRAMED, RUNNER_BODY, TOOLS, RUNNER_TAIL].concat()
    } else {
        [RUNNER_HEAD, READ_ALL, RUNNER_BODY, RUNNER_TAIL].concat()
    };
    format!(
        "{runner}{MAIN}(); }} catch (e) {{ return fail(e); }} \
         puts(MARK + 'A\\n'); flush(); then(resolve(r), emit, fail); }})(); \
         {function} {MAIN}() {{{source}\n}}\n"
    )
}

/// Sets `result`'s `output` (and outcome, when the records say the run did
/// not return a whole value) from the runner's `records`.
pub(crate) fn take_output(result: &mut ExecResult, records: Records, max_stdout: Option<u64>) {
    if result.outcome == Outcome::Ok {
        let failed = |result: &mut ExecResult, why: String| {
            result.outcome = Outcome::Failed;
            result.message = Some(why);
        };
        match records.value {
            _ if records.malformed => failed(result, "the runner's result record was malformed".into()),
            Some(Returned { complete: true, json: Some(json), .. }) if json.is_empty() => {}
            Some(Returned { complete: true, json: Some(json), .. }) => match serde_json::from_slice(&json) {
                Ok(value) => result.output = Some(value),
                Err(e) => failed(result, format!("the returned value is not JSON: {e}")),
            },
            Some(Returned { complete: true, json: None, len }) => {
                // As `result_caps::cap_result` decides for every backend.
                result.output_truncated = true;
                let max = max_stdout.unwrap_or(len);
                failed(result, format!("the returned value is over the output cap of {max} bytes (max_stdout_bytes)"));
            }
            Some(Returned { complete: false, .. }) => failed(result, "the returned value was cut off".into()),
            None if records.awaiting => failed(result, "the returned promise never settled".into()),
            None => failed(result, "the code exited (std.exit) before returning a value".into()),
        }
    }
    if result.outcome == Outcome::Failed
        && result.message.as_deref().is_none_or(|m| m.starts_with("exited with"))
        && let Some(message) = error_from_stderr(&result.stderr.text())
    {
        result.message = Some(message);
    }
}

/// The error QuickJS reported on stderr, as `message`: the runner's
/// `Uncaught Name: message`; else QuickJS's own report of an unhandled
/// rejection or a syntax error (with the line, which is the caller's;
/// QuickJS's columns count from the runner's start, so they are left out).
fn error_from_stderr(stderr: &str) -> Option<String> {
    if let Some(uncaught) = stderr.lines().rev().find_map(|l| l.strip_prefix("Uncaught ")) {
        return Some(uncaught.to_string());
    }
    if let Some(rejection) = stderr.lines().find_map(|l| l.strip_prefix("Possibly unhandled promise rejection: ")) {
        return Some(format!("unhandled promise rejection: {rejection}"));
    }
    let mut lines = stderr.lines();
    let error = lines.find(|l| {
        l.split_once(": ").is_some_and(|(name, _)| name.ends_with("Error") && name.chars().all(char::is_alphanumeric))
    })?;
    let line = lines
        .next()
        .and_then(|l| l.trim_start().strip_prefix("at <cmdline>:"))
        .and_then(|at| at.split(':').next())
        .and_then(|n| n.parse::<u32>().ok());
    Some(match line {
        Some(n) => format!("{error} (line {n})"),
        None => error.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::output::BoundedBuffer;
    use crate::limits::records::ResultTap;

    const MARK: &[u8] = b"\0execbox:00ff:";

    fn tap(chunks: &[&[u8]], cap: Option<u64>) -> (Vec<u8>, Records) {
        let mut tap = ResultTap::new(MARK.to_vec(), cap);
        let mut text = BoundedBuffer::new(None);
        for chunk in chunks {
            tap.feed(chunk, &mut text);
        }
        let records = tap.finish(&mut text);
        (text.into_captured().bytes, records)
    }

    fn record(json: &str) -> Vec<u8> {
        [MARK, b"A\n", MARK, format!("R{}:{json}\n", json.len()).as_bytes()].concat()
    }

    #[test]
    fn records_leave_the_text_whatever_the_chunking() {
        let stream = [b"hello\n".as_slice(), &record("[1,\"\\u0000\",\"\0\"]"), b"after\n"].concat();
        for size in [1, 2, 3, 7, stream.len()] {
            let chunks: Vec<&[u8]> = stream.chunks(size).collect();
            let (text, records) = tap(&chunks, None);
            assert_eq!(text, b"hello\nafter\n", "chunks of {size}");
            assert!(records.awaiting && !records.malformed);
            let value = records.value.unwrap();
            assert!(value.complete);
            assert_eq!(value.json.unwrap(), b"[1,\"\\u0000\",\"\0\"]");
        }
    }

    #[test]
    fn text_that_resembles_a_marker_stays_text() {
        let (text, records) = tap(&[b"a\0execbox:00f", b"e:R2:12\n\0\0b"], None);
        assert_eq!(text, b"a\0execbox:00fe:R2:12\n\0\0b");
        assert!(records.value.is_none() && !records.awaiting);
        // A prefix held at the end of the stream is output too.
        let (text, _) = tap(&[b"x\0execbox:0"], None);
        assert_eq!(text, b"x\0execbox:0");
    }

    #[test]
    fn a_value_over_the_cap_is_counted_not_kept() {
        let (_, records) = tap(&[&record("\"0123456789\"")], Some(5));
        let value = records.value.unwrap();
        assert_eq!((value.len, value.json, value.complete), (12, None, true));
    }

    #[test]
    fn a_cut_record_is_incomplete() {
        let full = record("12345");
        let (_, records) = tap(&[&full[..full.len() - 4]], None);
        let value = records.value.unwrap();
        assert!(!value.complete, "{value:?}");
    }

    #[test]
    fn outcomes_from_records() {
        let ok = |records: Records, max: Option<u64>| {
            let mut result = ExecResult::new("quickjs-wasm", Outcome::Ok);
            take_output(&mut result, records, max);
            result
        };
        let r = ok(tap(&[&record("12345")], Some(96)).1, Some(96));
        assert_eq!((r.outcome, r.output), (Outcome::Ok, Some(serde_json::json!(12345))));
        let r = ok(tap(&[&record("\"0123456789\"")], Some(5)).1, Some(5));
        assert_eq!((r.outcome, r.output_truncated), (Outcome::Failed, true));
        assert_eq!(
            r.message.as_deref(),
            Some("the returned value is over the output cap of 5 bytes (max_stdout_bytes)")
        );
        let r = ok(tap(&[[MARK, b"A\n".as_slice()].concat().as_slice()], None).1, None);
        assert_eq!(r.message.as_deref(), Some("the returned promise never settled"));
        let r = ok(Records::default(), None);
        assert_eq!(r.outcome, Outcome::Failed);
        let r = ok(tap(&[[MARK, b"R0:\n".as_slice()].concat().as_slice()], None).1, None);
        assert_eq!((r.outcome, r.output), (Outcome::Ok, None));
    }

    #[test]
    fn errors_are_read_from_quickjs_stderr() {
        let syntax = "SyntaxError: variable name expected\n    at <cmdline>:3:1754\n\n";
        assert_eq!(error_from_stderr(syntax).as_deref(), Some("SyntaxError: variable name expected (line 3)"));
        let rejection = "Possibly unhandled promise rejection: Error: lost\n    at __execbox_main (<cmdline>:1:9)\n";
        assert_eq!(error_from_stderr(rejection).as_deref(), Some("unhandled promise rejection: Error: lost"));
        assert_eq!(error_from_stderr("log\nUncaught TypeError: x\n").as_deref(), Some("TypeError: x"));
        assert_eq!(error_from_stderr("just a message from the code\n"), None);
    }
}
