//! Records: length-prefixed messages a runner writes into a program's
//! stdout (`\0execbox:<nonce>:R<len>:<json>\n`, and `A\n` for "awaiting"),
//! taken out of the stream by [`ResultTap`] on the host side before the
//! output cap applies. Used by the QuickJS runner (the returned value) and
//! Python sessions (each cell's status).
//!
//! A tap made [`ResultTap::with_calls`] also takes tool calls out of the
//! stream: `\0execbox:<nonce>:T<len>:<json>\n`, where `<json>` is a
//! [`ToCodeHost`](crate::tools::frame::ToCodeHost) frame (Code Mode on the
//! wasm interpreters). Each is handed over whole ([`CallFrame::Whole`]) as
//! soon as its terminator is read, so the host answers while the program
//! waits; one longer than the tap keeps is counted, and only its first
//! bytes are kept ([`CallFrame::TooLarge`]).

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

/// A tool call taken out of the stream (a `T` record).
#[derive(Debug, PartialEq)]
pub(crate) enum CallFrame {
    /// The frame's JSON, whole.
    Whole(Vec<u8>),
    /// A frame longer than the tap keeps: its length and first
    /// [`CALL_HEAD`] bytes.
    TooLarge { head: Vec<u8>, len: u64 },
}

/// A `T` record being read.
#[derive(Debug)]
struct CallInProgress {
    frame: Vec<u8>,
    /// Bytes of the frame kept: all of them, or the head of a long one.
    keep: usize,
    /// Bytes announced.
    len: u64,
}

/// Bytes kept of a tool call's frame that is over the tap's limit (enough
/// for its id and name, which the runners write before the arguments).
pub(crate) const CALL_HEAD: usize = 1024;

#[derive(Clone, Copy, Debug)]
enum State {
    /// Ordinary output; `held` bytes of the marker matched so far.
    Text { held: usize },
    /// The marker was seen: `A`, `R` or (with calls) `T` follows.
    Tag,
    /// Digits of an `R` (or `T`) record's length.
    Len { value: u64, digits: u8, call: bool },
    /// JSON bytes still to come.
    Body { left: u64, call: bool },
    /// The record's `\n`.
    End { record: Ended },
}

/// What a record's terminator ends.
#[derive(Clone, Copy, Debug)]
enum Ended {
    Awaiting,
    Value,
    Call,
}

/// Diverts the runner's records out of a guest's stdout; see the module docs.
pub(crate) struct ResultTap {
    marker: Vec<u8>,
    /// Most JSON bytes kept for a value (the policy's `max_stdout_bytes`).
    value_cap: u64,
    state: State,
    records: Records,
    /// Tool calls: most bytes of a frame kept whole (`None`: a `T` record
    /// is malformed).
    call_cap: Option<u64>,
    /// The call being read.
    call: Option<CallInProgress>,
    /// Calls read to their terminator, not yet taken.
    calls: Vec<CallFrame>,
}

impl ResultTap {
    pub fn new(marker: Vec<u8>, value_cap: Option<u64>) -> Self {
        debug_assert!(marker.first() == Some(&0) && !marker[1..].contains(&0));
        Self {
            marker,
            value_cap: value_cap.unwrap_or(u64::MAX),
            state: State::Text { held: 0 },
            records: Records::default(),
            call_cap: None,
            call: None,
            calls: Vec::new(),
        }
    }

    /// Also takes tool calls (`T` records) out of the stream, keeping
    /// frames of at most `cap` bytes whole (see [`ResultTap::take_calls`]).
    #[cfg_attr(not(feature = "wasm"), allow(dead_code))]
    pub fn with_calls(mut self, cap: u64) -> Self {
        self.call_cap = Some(cap);
        self
    }

    /// The tool calls read whole since the last call, in order.
    #[cfg_attr(not(feature = "wasm"), allow(dead_code))]
    pub fn take_calls(&mut self) -> Vec<CallFrame> {
        std::mem::take(&mut self.calls)
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
                            State::End { record: Ended::Awaiting }
                        }
                        b'R' => State::Len { value: 0, digits: 0, call: false },
                        b'T' if self.call_cap.is_some() => State::Len { value: 0, digits: 0, call: true },
                        _ => self.malformed(),
                    };
                }
                State::Len { value, digits, call } => {
                    self.state = match byte {
                        b'0'..=b'9' if digits < 19 => {
                            State::Len { value: value * 10 + u64::from(byte - b'0'), digits: digits + 1, call }
                        }
                        b':' if digits > 0 && call => self.start_call(value),
                        b':' if digits > 0 => self.start_value(value),
                        _ => self.malformed(),
                    };
                }
                State::Body { left, call } => {
                    let take = usize::try_from(left).unwrap_or(usize::MAX).min(bytes.len());
                    if call {
                        if let Some(call) = &mut self.call {
                            let room = call.keep - call.frame.len();
                            call.frame.extend_from_slice(&bytes[..take.min(room)]);
                        }
                    } else if let Some(Returned { json: Some(json), .. }) = &mut self.records.value {
                        json.extend_from_slice(&bytes[..take]);
                    }
                    let left = left - take as u64;
                    self.state = match (left, call) {
                        (0, true) => State::End { record: Ended::Call },
                        (0, false) => State::End { record: Ended::Value },
                        _ => State::Body { left, call },
                    };
                    bytes = &bytes[take..];
                    continue;
                }
                State::End { record } => {
                    if byte != b'\n' {
                        self.call = None;
                        self.state = self.malformed();
                    } else {
                        match record {
                            Ended::Value => {
                                if let Some(returned) = &mut self.records.value {
                                    returned.complete = true;
                                }
                            }
                            Ended::Call => self.end_call(),
                            Ended::Awaiting => {}
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
        if len == 0 { State::End { record: Ended::Value } } else { State::Body { left: len, call: false } }
    }

    /// A `T` record of `len` bytes starts: kept whole up to the cap, else
    /// its head only (the buffer's capacity is what is kept).
    fn start_call(&mut self, len: u64) -> State {
        let cap = self.call_cap.unwrap_or(0);
        let keep = if len <= cap { len } else { len.min(CALL_HEAD as u64) };
        let keep = usize::try_from(keep).unwrap_or(CALL_HEAD);
        self.call = Some(CallInProgress { frame: Vec::with_capacity(keep.min(1 << 20)), keep, len });
        if len == 0 { State::End { record: Ended::Call } } else { State::Body { left: len, call: true } }
    }

    fn end_call(&mut self) {
        if let Some(CallInProgress { frame, len, .. }) = self.call.take() {
            let cap = self.call_cap.unwrap_or(0);
            self.calls.push(if len <= cap {
                CallFrame::Whole(frame)
            } else {
                CallFrame::TooLarge { head: frame, len }
            });
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    const MARK: &[u8] = b"\0execbox:00ff:";

    fn call_record(json: &str) -> Vec<u8> {
        [MARK, format!("T{}:{json}\n", json.len()).as_bytes()].concat()
    }

    #[test]
    fn tool_calls_leave_the_stream_whole_whatever_the_chunking() {
        let call = r#"{"tool_call":{"id":1,"name":"a.b","args":{"s":"\u0000"}}}"#;
        let stream = [b"before ".as_slice(), &call_record(call), b"after", &call_record("{}")].concat();
        for size in [1, 2, 5, stream.len()] {
            let mut tap = ResultTap::new(MARK.to_vec(), None).with_calls(1 << 10);
            let mut text = BoundedBuffer::new(None);
            let mut calls = Vec::new();
            for chunk in stream.chunks(size) {
                tap.feed(chunk, &mut text);
                calls.extend(tap.take_calls());
            }
            let records = tap.finish(&mut text);
            assert!(!records.malformed && records.value.is_none());
            assert_eq!(text.into_captured().bytes, b"before after", "chunks of {size}");
            assert_eq!(calls, [CallFrame::Whole(call.as_bytes().to_vec()), CallFrame::Whole(b"{}".to_vec())]);
        }
    }

    #[test]
    fn a_long_call_keeps_its_head_and_a_tap_without_calls_refuses_them() {
        let long = format!(r#"{{"tool_call":{{"id":9,"name":"a.b","args":"{}"}}}}"#, "x".repeat(5000));
        let mut tap = ResultTap::new(MARK.to_vec(), None).with_calls(100);
        let mut text = BoundedBuffer::new(None);
        tap.feed(&call_record(&long), &mut text);
        match tap.take_calls().as_slice() {
            [CallFrame::TooLarge { head, len }] => {
                assert_eq!(*len, long.len() as u64);
                assert_eq!(head.as_slice(), &long.as_bytes()[..CALL_HEAD]);
            }
            other => panic!("{other:?}"),
        }
        let mut plain = ResultTap::new(MARK.to_vec(), None);
        plain.feed(&call_record("{}"), &mut text);
        assert!(plain.take_calls().is_empty());
        assert!(plain.finish(&mut text).malformed);
    }
}
