//! Spilled output: a run whose policy asks it
//! ([`SandboxPolicy::spill_output`](crate::policy::SandboxPolicy::spill_output))
//! keeps its whole stdout as an artifact when the stream passes its cap.
//!
//! How, for every backend alike (admission does it, see
//! [`crate::admission`]): the run captures stdout up to the store's largest
//! file ([`ArtifactStoreConfig::max_file_bytes`](super::config::ArtifactStoreConfig::max_file_bytes))
//! instead of the policy's cap (backends cap streams as they are written,
//! so nothing past the cap would be left to keep); after the run, if stdout
//! passed the cap, what was captured is saved as `stdout-<random>` in the
//! run's scope and the result's stdout becomes its head and tail, with one
//! line between them saying how much was cut and which artifact holds it,
//! all within the cap. A stream longer than the store's largest file is
//! kept up to that size (the line says so). A save the store refuses
//! (quota) leaves the head and tail and a line saying why.

use super::store::ArtifactStore;
use crate::result::{CapturedStream, ExecResult};

/// Longest reason, in bytes, the line in stdout gives for a failed save.
const MAX_REASON_BYTES: usize = 200;

/// Where and how one run spills its stdout.
#[derive(Clone, Debug)]
pub(crate) struct Spill {
    store: ArtifactStore,
    scope: String,
    /// The policy's `max_stdout_bytes`: what the result may hold.
    cap: u64,
}

impl Spill {
    /// Spills into `scope` of `store`, for a run whose stdout cap is `cap`.
    pub(crate) fn new(store: ArtifactStore, scope: String, cap: u64) -> Self {
        Self { store, scope, cap }
    }

    /// The stdout cap the run itself gets: at least its own, up to the
    /// store's largest file.
    pub(crate) fn capture_bytes(&self) -> u64 {
        self.cap.max(self.store.config().max_file_bytes)
    }

    /// The cap the result is held to.
    pub(crate) fn cap(&self) -> u64 {
        self.cap
    }

    /// If `result`'s stdout passed the cap: saves it, leaves its head and
    /// tail (see the module docs) and names the artifact in
    /// [`ExecResult::spilled`]. Does file work: call it where blocking is
    /// fine.
    pub(crate) fn finish(&self, result: &mut ExecResult) {
        let stdout = &result.stdout;
        if stdout.total_bytes <= self.cap && stdout.bytes.len() as u64 <= self.cap {
            return;
        }
        let max_file = self.store.config().max_file_bytes;
        let kept = &stdout.bytes[..stdout.bytes.len().min(usize::try_from(max_file).unwrap_or(usize::MAX))];
        let name = format!("stdout-{:016x}", crate::nonce::random_u64());
        let saved = match text_of(kept) {
            Some(text) => self.store.save_text(&self.scope, &name, text, Some("text/plain")),
            None => self.store.save_bytes(&self.scope, &name, kept, None),
        };
        let total = stdout.total_bytes.max(stdout.bytes.len() as u64);
        let line = match &saved {
            Ok(version) if version.size >= total => format!("the whole stdout ({total} bytes) is artifact {name:?}"),
            Ok(version) => format!(
                "stdout was {total} bytes: its first {} (the artifact store's largest file) are artifact {name:?}, \
                 and the tail shown ends there",
                version.size
            ),
            Err(e) => {
                tracing::warn!(error = %e, "spilled stdout not kept");
                let reason = crate::text::cap_text(e.to_string(), MAX_REASON_BYTES);
                format!("stdout was {total} bytes and could not be kept: {reason}")
            }
        };
        let bytes = head_and_tail(&stdout.bytes, self.cap, &line);
        result.stdout = CapturedStream { bytes, total_bytes: stdout.total_bytes, truncated: true };
        if saved.is_ok() {
            result.spilled = Some(name);
        }
    }
}

/// `bytes` as text: valid UTF-8, or valid up to a character the capture
/// cut at its very end (left out). `None` for anything else (kept as bytes).
fn text_of(bytes: &[u8]) -> Option<&str> {
    match std::str::from_utf8(bytes) {
        Ok(text) => Some(text),
        Err(e) if e.error_len().is_none() => std::str::from_utf8(&bytes[..e.valid_up_to()]).ok(),
        Err(_) => None,
    }
}

/// At most `cap` bytes: the head of `bytes`, a line saying `what` was cut,
/// the tail. Cut at UTF-8 character boundaries (for text). When the cap
/// cannot hold the line and a little of each end, just the head.
fn head_and_tail(bytes: &[u8], cap: u64, what: &str) -> Vec<u8> {
    let cap = usize::try_from(cap).unwrap_or(usize::MAX);
    let mut line = format!("\n[execbox: {{}} bytes of stdout cut here; {what}]\n");
    // The count of cut bytes takes at most 20 digits.
    if cap < line.len() + 20 + 16 {
        let mut end = cap.min(bytes.len());
        end = back_to_boundary(bytes, end);
        return bytes[..end].to_vec();
    }
    let room = cap - (line.len() + 20);
    if bytes.len() <= room {
        // All of it fits (the capture kept no more than the cap): the line goes last.
        let mut out = bytes.to_vec();
        out.extend_from_slice(format!("\n[execbox: {what}]\n").as_bytes());
        return out;
    }
    let head_end = back_to_boundary(bytes, room / 2);
    let tail_start = forward_to_boundary(bytes, bytes.len() - (room - head_end));
    line = line.replace("{}", &(tail_start - head_end).to_string());
    let mut out = Vec::with_capacity(head_end + line.len() + bytes.len() - tail_start);
    out.extend_from_slice(&bytes[..head_end]);
    out.extend_from_slice(line.as_bytes());
    out.extend_from_slice(&bytes[tail_start..]);
    out
}

/// The largest index at most `at` that does not split a UTF-8 sequence.
fn back_to_boundary(bytes: &[u8], mut at: usize) -> usize {
    while at > 0 && at < bytes.len() && is_continuation(bytes[at]) {
        at -= 1;
    }
    at
}

/// The smallest index at least `at` that does not split a UTF-8 sequence.
fn forward_to_boundary(bytes: &[u8], mut at: usize) -> usize {
    while at < bytes.len() && is_continuation(bytes[at]) {
        at += 1;
    }
    at
}

fn is_continuation(byte: u8) -> bool {
    byte & 0b1100_0000 == 0b1000_0000
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::artifacts::config::ArtifactStoreConfig;
    use crate::result::Outcome;

    fn store(dir: &std::path::Path, max_file: u64, max_scope: u64) -> ArtifactStore {
        let cfg = ArtifactStoreConfig::default().dir(dir).max_file_bytes(max_file).max_scope_bytes(max_scope);
        ArtifactStore::new(cfg).unwrap()
    }

    fn ran(stdout: &[u8], total: u64) -> ExecResult {
        let mut r = ExecResult::new("x", Outcome::Ok);
        r.stdout =
            CapturedStream { bytes: stdout.to_vec(), total_bytes: total, truncated: total > stdout.len() as u64 };
        r
    }

    #[test]
    fn stdout_over_the_cap_is_kept_whole_and_shown_as_head_and_tail() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path(), 1 << 20, 8 << 20);
        let spill = Spill::new(store.clone(), "key:t".into(), 200);
        assert_eq!(spill.capture_bytes(), 1 << 20);
        let text: String = (0..2000).map(|i| format!("line {i}\n")).collect();
        let mut r = ran(text.as_bytes(), text.len() as u64);
        spill.finish(&mut r);
        let name = r.spilled.clone().expect("spilled");
        assert!(name.starts_with("stdout-"), "{name}");
        assert!(r.stdout.bytes.len() <= 200, "{}", r.stdout.bytes.len());
        assert!(r.stdout.truncated);
        assert_eq!(r.stdout.total_bytes, text.len() as u64);
        let shown = r.stdout.text();
        assert!(shown.starts_with("line 0\n"), "{shown}");
        assert!(shown.ends_with("line 1999\n"), "{shown}");
        assert!(shown.contains(&format!("is artifact {name:?}")), "{shown}");
        let saved = store.load("key:t", &name, None).unwrap();
        assert_eq!(saved.content, text.as_bytes());
        assert!(saved.version.text);
    }

    #[test]
    fn within_the_cap_nothing_is_spilled() {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path(), 1 << 20, 8 << 20);
        let spill = Spill::new(store.clone(), "key:t".into(), 200);
        let mut r = ran(b"short", 5);
        spill.finish(&mut r);
        assert_eq!((r.spilled, r.stdout.bytes.as_slice()), (None, &b"short"[..]));
        assert!(store.list("key:t").unwrap().is_empty());
    }

    #[test]
    fn a_stream_past_the_largest_file_is_kept_up_to_it_and_a_refused_save_says_why() {
        let dir = tempfile::tempdir().unwrap();
        // Captured 1000 of 5000 bytes; the store keeps at most 600 per file.
        let store = store(dir.path(), 600, 2000);
        let spill = Spill::new(store.clone(), "key:t".into(), 400);
        let mut r = ran(&[b'a'; 1000], 5000);
        spill.finish(&mut r);
        let name = r.spilled.clone().unwrap();
        assert_eq!(store.load("key:t", &name, None).unwrap().content.len(), 600);
        assert!(r.stdout.text().contains("its first 600"), "{}", r.stdout.text());
        // The scope's quota (2000 bytes) cannot take another 600 after two more.
        let mut refused = None;
        for _ in 0..4 {
            let mut r = ran(&[b'b'; 1000], 1000);
            spill.finish(&mut r);
            if r.spilled.is_none() {
                refused = Some(r);
                break;
            }
        }
        let r = refused.expect("the quota refuses a save");
        assert!(r.stdout.bytes.len() <= 400);
        assert!(r.stdout.text().contains("could not be kept"), "{}", r.stdout.text());
    }

    #[test]
    fn head_and_tail_respect_the_cap_and_characters() {
        let text = "é".repeat(500);
        for cap in [0u64, 10, 80, 101, 200, 333, 999, 1000, 5000] {
            let out = head_and_tail(text.as_bytes(), cap, "x");
            assert!(out.len() as u64 <= cap, "{cap}: {}", out.len());
            assert!(std::str::from_utf8(&out).is_ok(), "{cap}");
        }
        // Everything captured fits: all of it, the line last.
        let out = head_and_tail(b"abc", 100, "x");
        assert_eq!(out, b"abc\n[execbox: x]\n");
        assert_eq!(text_of(&"é".as_bytes()[..1]), Some(""));
        assert_eq!(text_of(&[0xff, b'a']), None);
    }
}
