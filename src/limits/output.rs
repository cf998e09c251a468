//! [`BoundedBuffer`]: keeps at most `cap` bytes of a stream and counts the rest.

use crate::result::CapturedStream;

/// An output sink with a hard cap, applied as bytes are written (memory use
/// never exceeds the cap, whatever the program writes).
#[derive(Clone, Debug)]
pub struct BoundedBuffer {
    kept: Vec<u8>,
    cap: usize,
    total: u64,
}

impl BoundedBuffer {
    /// A buffer keeping at most `cap` bytes (`None`: unbounded).
    pub fn new(cap: Option<u64>) -> Self {
        let cap = cap.map_or(usize::MAX, |c| usize::try_from(c).unwrap_or(usize::MAX));
        Self { kept: Vec::new(), cap, total: 0 }
    }

    /// Appends raw bytes, keeping what fits under the cap.
    pub fn write(&mut self, bytes: &[u8]) {
        self.total = self.total.saturating_add(bytes.len() as u64);
        let room = self.cap.saturating_sub(self.kept.len());
        self.kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
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
