//! Records: length-prefixed messages a runner writes into a program's
//! stdout (`\0execbox:<nonce>:R<len>:<json>\n`, and `A\n` for "awaiting"),
//! taken out of the stream by [`ResultTap`] on the host side before the
//! output cap applies. Used by the QuickJS runner (the returned value) and
//! Python sessions (each cell's status).

use crate::limits::output::BoundedBuffer;

/// The bytes that open a record of the run with `nonce`.
pub(crate) fn marker(nonce: &str) -> Vec<u8> {
    format!("\u{0}execbox:{nonce}:").into_bytes()
}

/// What the runner reported through its records.
#[derive(Debug, Default)]
pub(crate) struct Records {
    /// The function returned (its value was being resolved).
    pub awaiting: bool,
    /// The returned value's record, if one started.
    pub value: Option<Returned>,
    /// A record broke the format (only the runner can write one).
    pub malformed: bool,
}

/// The `R` record.
#[derive(Debug)]
pub(crate) struct Returned {
    /// Bytes of JSON announced.
    #[cfg_attr(not(feature = "wasm"), allow(dead_code))]
    pub len: u64,
    /// The JSON, or `None` when `len` is over the cap (the bytes were
    /// counted, not kept).
    pub json: Option<Vec<u8>>,
    /// The record ended with its terminator.
    pub complete: bool,
}

#[derive(Clone, Copy, Debug)]
enum State {
    /// Ordinary output; `held` bytes of the marker matched so far.
    Text { held: usize },
    /// The marker was seen: `A` or `R` follows.
    Tag,
    /// Digits of an `R` record's length.
    Len { value: u64, digits: u8 },
    /// JSON bytes still to come.
    Body { left: u64 },
    /// The record's `\n`.
    End { value: bool },
}

/// Diverts the runner's records out of a guest's stdout; see the module docs.
pub(crate) struct ResultTap {
    marker: Vec<u8>,
    /// Most JSON bytes kept for a value (the policy's `max_stdout_bytes`).
    value_cap: u64,
    state: State,
    records: Records,
}

impl ResultTap {
    pub fn new(marker: Vec<u8>, value_cap: Option<u64>) -> Self {
        debug_assert!(marker.first() == Some(&0) && !marker[1..].contains(&0));
        Self {
            marker,
            value_cap: value_cap.unwrap_or(u64::MAX),
            state: State::Text { held: 0 },
            records: Records::default(),
        }
    }

    /// Feeds what the guest wrote; ordinary output goes on to `text`.
    pub fn feed(&mut self, mut bytes: &[u8], text: &mut BoundedBuffer) {
        while let Some((&byte, rest)) = bytes.split_first() {
            match self.state {
                State::Text { held: 0 } => {
                    // The marker starts with the only NUL it holds.
                    match bytes.iter().position(|&b| b == 0) {
                        None => {
                            text.write(bytes);
                            return;
                        }
                        Some(at) => {
                            text.write(&bytes[..at]);
                            bytes = &bytes[at + 1..];
                            self.advance_marker(1);
                        }
                    }
                    continue;
                }
                State::Text { held } => {
                    if byte == self.marker[held] {
                        self.advance_marker(held + 1);
                        bytes = rest;
                    } else {
                        // Not a record after all: what was held is output,
                        // and `byte` is looked at again (it may start one).
                        text.write(&self.marker[..held]);
                        self.state = State::Text { held: 0 };
                    }
                    continue;
                }
                State::Tag => {
                    self.state = match byte {
                        b'A' => {
                            self.records.awaiting = true;
                            State::End { value: false }
                        }
                        b'R' => State::Len { value: 0, digits: 0 },
                        _ => self.malformed(),
                    };
                }
                State::Len { value, digits } => {
                    self.state = match byte {
                        b'0'..=b'9' if digits < 19 => {
                            State::Len { value: value * 10 + u64::from(byte - b'0'), digits: digits + 1 }
                        }
                        b':' if digits > 0 => self.start_value(value),
                        _ => self.malformed(),
                    };
                }
                State::Body { left } => {
                    let take = usize::try_from(left).unwrap_or(usize::MAX).min(bytes.len());
                    if let Some(Returned { json: Some(json), .. }) = &mut self.records.value {
                        json.extend_from_slice(&bytes[..take]);
                    }
                    let left = left - take as u64;
                    self.state = if left == 0 { State::End { value: true } } else { State::Body { left } };
                    bytes = &bytes[take..];
                    continue;
                }
                State::End { value } => {
                    if byte != b'\n' {
                        self.state = self.malformed();
                    } else {
                        if value && let Some(returned) = &mut self.records.value {
                            returned.complete = true;
                        }
                        self.state = State::Text { held: 0 };
                    }
                }
            }
            bytes = rest;
        }
    }

    fn advance_marker(&mut self, held: usize) {
        self.state = if held == self.marker.len() { State::Tag } else { State::Text { held } };
    }

    fn start_value(&mut self, len: u64) -> State {
        if self.records.value.is_some() {
            // The runner emits once.
            return self.malformed();
        }
        let json = (len <= self.value_cap).then(|| Vec::with_capacity(usize::try_from(len.min(1 << 20)).unwrap_or(0)));
        self.records.value = Some(Returned { len, json, complete: false });
        if len == 0 { State::End { value: true } } else { State::Body { left: len } }
    }

    fn malformed(&mut self) -> State {
        self.records.malformed = true;
        State::Text { held: 0 }
    }

    /// True once a value record has been read to its terminator.
    #[cfg_attr(not(feature = "container"), allow(dead_code))]
    pub fn value_complete(&self) -> bool {
        self.records.value.as_ref().is_some_and(|v| v.complete)
    }

    /// Ends the stream: a marker prefix still held was output after all.
    pub fn finish(&mut self, text: &mut BoundedBuffer) -> Records {
        if let State::Text { held } = self.state
            && held > 0
        {
            text.write(&self.marker[..held]);
        }
        self.state = State::Text { held: 0 };
        std::mem::take(&mut self.records)
    }
}
