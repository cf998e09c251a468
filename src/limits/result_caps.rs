//! Caps on the fields of a result that are not streams: `message`,
//! `output`, `diagnostics`. Streams are capped as they are written
//! ([`BoundedBuffer`](super::BoundedBuffer)); these fields are capped here,
//! once, for every backend, by [`cap_result`] (the executor calls it on every
//! result, and backends may call it earlier to avoid building huge values).
//!
//! | field | bound |
//! |---|---|
//! | `output` | its JSON text at most the policy's `max_stdout_bytes`; a larger value is dropped, `output_truncated` is set and the run is `failed` |
//! | `message` | [`MAX_MESSAGE_BYTES`], cut at a character boundary with a note saying how long it was |
//! | `diagnostics` | [`MAX_DIAGNOSTICS`] entries, each message at most [`MAX_MESSAGE_BYTES`] |

use crate::policy::SandboxPolicy;
use crate::result::{ExecResult, Outcome};

/// Longest `message` (and diagnostic message) kept, in bytes.
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// Most diagnostics kept.
pub const MAX_DIAGNOSTICS: usize = 64;

/// Longest list of names (skipped files, ...) spelled out in a message;
/// the rest are counted.
pub const MAX_LISTED_NAMES: usize = 16;

/// `text` cut to [`MAX_MESSAGE_BYTES`] at a character boundary, with a note
/// of its full length when cut.
pub fn cap_message(text: String) -> String {
    cap_text(text, MAX_MESSAGE_BYTES)
}

/// `text` cut to `max` bytes at a character boundary, with a note of its full
/// length when cut (the note may take the result slightly past `max`).
pub fn cap_text(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let total = text.len();
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(&format!("… [cut: {total} bytes in all]"));
    text
}

/// "a, b, c and 7 more": at most [`MAX_LISTED_NAMES`] items spelled out.
pub fn list_names<S: AsRef<str>>(names: &[S]) -> String {
    let shown: Vec<&str> = names.iter().take(MAX_LISTED_NAMES).map(AsRef::as_ref).collect();
    let mut text = shown.join(", ");
    if names.len() > shown.len() {
        text.push_str(&format!(" and {} more", names.len() - shown.len()));
    }
    text
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

/// Applies the bounds of the module docs to `result` under `policy`.
pub fn cap_result(result: &mut ExecResult, policy: &SandboxPolicy) {
    if let (Some(max), Some(value)) = (policy.max_stdout_bytes, result.output.as_ref())
        && !json_fits(value, max)
    {
        let output = result.output.take();
        if let Some(value) = output {
            crate::limits::nesting::drop_deep(value);
        }
        result.output_truncated = true;
        if result.outcome == Outcome::Ok {
            result.outcome = Outcome::Failed;
        }
        let note = format!("the returned value is over the output cap of {max} bytes (max_stdout_bytes)");
        result.message = Some(match result.message.take() {
            Some(m) => format!("{m}; {note}"),
            None => note,
        });
    }
    if let Some(message) = result.message.take() {
        result.message = Some(cap_message(message));
    }
    if result.diagnostics.len() > MAX_DIAGNOSTICS {
        result.diagnostics.truncate(MAX_DIAGNOSTICS);
    }
    for diagnostic in &mut result.diagnostics {
        let message = std::mem::take(&mut diagnostic.message);
        diagnostic.message = cap_message(message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn long_messages_are_cut_on_a_char_boundary() {
        let text = "é".repeat(MAX_MESSAGE_BYTES);
        let capped = cap_message(text);
        assert!(capped.len() < MAX_MESSAGE_BYTES + 64);
        assert!(capped.ends_with(&format!("[cut: {} bytes in all]", 2 * MAX_MESSAGE_BYTES)));
        assert_eq!(cap_message("short".into()), "short");
    }

    #[test]
    fn names_are_listed_up_to_a_bound() {
        let names: Vec<String> = (0..100).map(|i| format!("f{i}")).collect();
        let text = list_names(&names);
        assert!(text.ends_with("f15 and 84 more"), "{text}");
        assert_eq!(list_names(&["a", "b"]), "a, b");
    }

    #[test]
    fn output_over_the_cap_is_dropped_and_flagged() {
        let mut result = ExecResult::new("x", Outcome::Ok);
        result.output = Some(json!("x".repeat(200)));
        cap_result(&mut result, &SandboxPolicy::strict().max_output_bytes(100));
        assert_eq!(result.output, None);
        assert!(result.output_truncated);
        assert_eq!(result.outcome, Outcome::Failed);
        assert!(result.message.unwrap().contains("over the output cap of 100 bytes"));

        let mut fits = ExecResult::new("x", Outcome::Ok);
        fits.output = Some(json!([1, 2, 3]));
        cap_result(&mut fits, &SandboxPolicy::strict().max_output_bytes(7));
        assert_eq!(fits.output, Some(json!([1, 2, 3])));
        assert!(!fits.output_truncated);
    }
}
