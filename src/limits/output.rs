//! [`BoundedBuffer`]: keeps at most `cap` bytes of a stream and counts the rest.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::result::CapturedStream;

/// Which output stream a tapped chunk belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamKind {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// Sees a run's output while it is written, for streaming it to a client
/// ([`ExecRequest::output_tap`](crate::request::ExecRequest::output_tap)). It gets
/// only what the caps keep, so a flood reaches it no more than the result.
/// It is called on the backend's threads, under the stream's lock: it must
/// return quickly and never block (hand the bytes to a bounded channel).
#[derive(Clone)]
pub struct OutputTap(Arc<TapFn>);

/// What an [`OutputTap`] calls.
type TapFn = dyn Fn(StreamKind, &[u8]) + Send + Sync;

impl OutputTap {
    /// A tap calling `f` with each kept chunk.
    pub fn new(f: impl Fn(StreamKind, &[u8]) + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    /// This tap, handed at most the first `max` bytes of stdout (stderr
    /// as it comes): for a run that captures more stdout than its cap
    /// (spilled output), so a client streaming it sees no more than the cap.
    #[cfg_attr(not(feature = "artifacts"), allow(dead_code))]
    pub(crate) fn stdout_capped(self, max: u64) -> Self {
        use std::sync::atomic::{AtomicU64, Ordering};
        let seen = AtomicU64::new(0);
        let inner = self.0;
        Self(Arc::new(move |kind, bytes: &[u8]| {
            if kind == StreamKind::Stderr {
                return inner(kind, bytes);
            }
            let len = bytes.len() as u64;
            let before = seen.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| Some(n.saturating_add(len)));
            let room = max.saturating_sub(before.unwrap_or(u64::MAX));
            let n = usize::try_from(len.min(room)).unwrap_or(usize::MAX);
            if n > 0 {
                inner(kind, &bytes[..n]);
            }
        }))
    }

    fn call(&self, kind: StreamKind, bytes: &[u8]) {
        if !bytes.is_empty() {
            (self.0)(kind, bytes);
        }
    }
}

impl std::fmt::Debug for OutputTap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OutputTap")
    }
}

/// Taps compare equal when they are the same tap.
impl PartialEq for OutputTap {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// An output sink with a hard cap, applied as bytes are written (memory use
/// never exceeds the cap, whatever the program writes).
#[derive(Clone, Debug)]
pub struct BoundedBuffer {
    kept: Vec<u8>,
    cap: usize,
    total: u64,
    tap: Option<(OutputTap, StreamKind)>,
}

impl BoundedBuffer {
    /// A buffer keeping at most `cap` bytes (`None`: unbounded).
    pub fn new(cap: Option<u64>) -> Self {
        let cap = cap.map_or(usize::MAX, |c| usize::try_from(c).unwrap_or(usize::MAX));
        Self { kept: Vec::new(), cap, total: 0, tap: None }
    }

    /// Also hands each kept chunk to `tap` as `kind` (no-op for `None`).
    pub fn tapped(mut self, tap: Option<OutputTap>, kind: StreamKind) -> Self {
        self.tap = tap.map(|tap| (tap, kind));
        self
    }

    /// Appends raw bytes, keeping what fits under the cap.
    pub fn write(&mut self, bytes: &[u8]) {
        self.total = self.total.saturating_add(bytes.len() as u64);
        let room = self.cap.saturating_sub(self.kept.len());
        let kept = &bytes[..bytes.len().min(room)];
        self.kept.extend_from_slice(kept);
        if let Some((tap, kind)) = &self.tap {
            tap.call(*kind, kept);
        }
    }

    /// Appends text, cutting at a character boundary so kept text stays valid UTF-8.
    pub fn write_str(&mut self, text: &str) {
        self.total = self.total.saturating_add(text.len() as u64);
        let room = self.cap.saturating_sub(self.kept.len());
        let mut end = text.len().min(room);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        self.kept.extend_from_slice(&text.as_bytes()[..end]);
        if let Some((tap, kind)) = &self.tap {
            tap.call(*kind, &text.as_bytes()[..end]);
        }
    }

    /// True once any byte has been dropped.
    pub fn truncated(&self) -> bool {
        self.total > self.kept.len() as u64
    }

    /// True when no further byte would be kept (writers may skip formatting).
    pub fn is_full(&self) -> bool {
        self.kept.len() >= self.cap
    }

    /// Finishes the stream.
    pub fn into_captured(self) -> CapturedStream {
        let truncated = self.truncated();
        CapturedStream { bytes: self.kept, total_bytes: self.total, truncated }
    }

    /// A copy of the stream so far (used when a run is abandoned mid-way).
    pub fn snapshot(&self) -> CapturedStream {
        CapturedStream { bytes: self.kept.clone(), total_bytes: self.total, truncated: self.truncated() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capped_tap_sees_the_first_bytes_of_stdout_only() {
        let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let sink = seen.clone();
        let tap = OutputTap::new(move |kind, bytes| sink.lock().push((kind, bytes.to_vec()))).stdout_capped(5);
        for (kind, bytes) in
            [(StreamKind::Stdout, &b"abc"[..]), (StreamKind::Stderr, b"err"), (StreamKind::Stdout, b"defg")]
        {
            tap.call(kind, bytes);
        }
        tap.call(StreamKind::Stdout, b"more");
        let want = [(StreamKind::Stdout, &b"abc"[..]), (StreamKind::Stderr, b"err"), (StreamKind::Stdout, b"de")];
        assert_eq!(*seen.lock(), want.map(|(k, b)| (k, b.to_vec())));
    }

    #[test]
    fn a_tap_sees_only_what_is_kept() {
        let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let sink = seen.clone();
        let tap = OutputTap::new(move |kind, bytes| sink.lock().push((kind, bytes.to_vec())));
        let mut b = BoundedBuffer::new(Some(4)).tapped(Some(tap), StreamKind::Stderr);
        b.write(b"ab");
        b.write_str("c\u{e9}");
        b.write(b"zzz");
        let kept: Vec<_> = ["ab", "c", "z"].iter().map(|s| (StreamKind::Stderr, s.as_bytes().to_vec())).collect();
        assert_eq!(*seen.lock(), kept);
        assert_eq!(b.into_captured().total_bytes, 8);
    }

    #[test]
    fn keeps_prefix_and_counts_total() {
        let mut b = BoundedBuffer::new(Some(5));
        b.write(b"abc");
        b.write(b"defgh");
        let c = b.into_captured();
        assert_eq!(c.bytes, b"abcde");
        assert_eq!(c.total_bytes, 8);
        assert!(c.truncated);
    }

    #[test]
    fn cuts_text_on_char_boundary() {
        let mut b = BoundedBuffer::new(Some(4));
        b.write_str("aé€"); // 1 + 2 + 3 bytes
        let c = b.into_captured();
        assert_eq!(c.bytes, "aé".as_bytes());
        assert_eq!(c.total_bytes, 6);
        assert!(c.truncated);
    }

    #[test]
    fn zero_cap_keeps_nothing() {
        let mut b = BoundedBuffer::new(Some(0));
        b.write_str("x");
        assert!(b.is_full());
        assert!(b.into_captured().truncated);
    }

    #[test]
    fn exact_fit_is_not_truncated() {
        let mut b = BoundedBuffer::new(Some(3));
        b.write(b"abc");
        assert!(!b.truncated());
    }
}
