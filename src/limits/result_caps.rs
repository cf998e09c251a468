//! Caps on the fields of a result that are not streams: `message`,
//! `output`, `diagnostics`. Streams are capped as they are written
//! ([`BoundedBuffer`](super::BoundedBuffer)); these fields are capped here,
//! once, for every backend, by [`cap_result`] (the executor calls it on every
//! result, and backends may call it earlier to avoid building huge values).
//!
//! | field | bound |
//! |---|---|
//! | `output` | its JSON text at most the policy's `max_stdout_bytes`; a larger value is dropped, `output_truncated` is set and the run is `failed` |
//! | `message` | [`MAX_MESSAGE_BYTES`](crate::text::MAX_MESSAGE_BYTES), cut at a character boundary with a note saying how long it was |
//! | `diagnostics` | [`MAX_DIAGNOSTICS`] entries, each message at most [`MAX_MESSAGE_BYTES`](crate::text::MAX_MESSAGE_BYTES) |

use crate::text::cap_message;

/// Most diagnostics kept.
pub const MAX_DIAGNOSTICS: usize = 64;
use crate::policy::SandboxPolicy;
use crate::result::{ExecResult, Outcome};

pub use super::nesting::json_fits;

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
        crate::text::add_note(&mut result.message, note);
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
