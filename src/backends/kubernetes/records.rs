//! The launcher's records (`launch.py`), read back from the pod's log:
//! one a line, `<tag> <base64>`. The host holds them to the run's caps
//! again, whatever the launcher did.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use tokio::sync::mpsc::UnboundedSender;

use super::relay::FromPod;
use crate::backends::container::outputs::Listing;
use crate::limits::output::{BoundedBuffer, OutputTap, StreamKind};

/// Longest record line taken: the launcher writes at most 8 KiB of bytes
/// a record (10,924 characters of base64).
pub(super) const MAX_LINE: usize = 16 << 10;

/// Most bytes of lines that are not records kept (the launcher's own
/// complaints, a Python traceback).
const MAX_NOISE: usize = 4 << 10;

/// How the launcher said the program ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum End {
    /// `x`: the status (128 + signal when a signal ended it), how many
    /// bytes it wrote to stdout and stderr, kept or not, and whether the
    /// OOM killer struck in the container (`None`: the launcher could not
    /// tell).
    Exited { status: i32, stdout_total: u64, stderr_total: u64, oom_killed: Option<bool> },
    /// `t`: the deadline passed inside the pod.
    TimedOut,
}

/// Most bytes of Code Mode records (`k`) taken from one run's log: the
/// launcher stops its tool socket there too (its `max_bytes`). The log is
/// on the node's disk, as the output's cap says.
pub(super) const MAX_TOOL_BYTES: u64 = 64 << 20;

/// Everything read from a run's log.
pub(super) struct Records {
    pub stdout: BoundedBuffer,
    pub stderr: BoundedBuffer,
    pub listing: Option<Listing>,
    listing_cap: u64,
    pub end: Option<End>,
    /// Lines that were not records (bounded), for the result's message.
    pub noise: String,
    /// Records that could not be read (a broken line): the first one's reason.
    pub broken: Option<&'static str>,
    /// Where a run that may call tools hands its `k` and `K` records (see
    /// `relay.rs`), and how many bytes of them it may still take.
    tools: Option<(UnboundedSender<FromPod>, u64)>,
    /// Why the run's tool calls could not be carried, if so.
    tools_lost: Option<String>,
    /// The program used its tool socket.
    called_tools: bool,
    /// The launcher closed the tool socket at the run's cap of calls.
    pub tools_capped: bool,
}

impl Records {
    /// Reads records into buffers capped at `stdout`/`stderr`, streamed to
    /// `tap`; the listing is kept up to `listing_cap` bytes.
    pub fn new(stdout: Option<u64>, stderr: Option<u64>, tap: Option<OutputTap>, listing_cap: u64) -> Self {
        Self {
            stdout: BoundedBuffer::new(stdout).tapped(tap.clone(), StreamKind::Stdout),
            stderr: BoundedBuffer::new(stderr).tapped(tap, StreamKind::Stderr),
            listing: None,
            listing_cap,
            end: None,
            noise: String::new(),
            broken: None,
            tools: None,
            tools_lost: None,
            called_tools: false,
            tools_capped: false,
        }
    }

    /// Hands this run's Code Mode records to `relay` from now on.
    pub fn carry_tools(&mut self, relay: UnboundedSender<FromPod>) {
        self.tools = Some((relay, MAX_TOOL_BYTES));
    }

    /// The log is read: no more Code Mode records go to the relay (which
    /// forwards what it has, then ends).
    pub fn stop_tools(&mut self) {
        self.tools = None;
    }

    /// The answers to the run's tool calls cannot be delivered (`why`):
    /// said in the result if the program made any.
    pub fn lose_tools(&mut self, why: &str) {
        self.tools_lost = Some(why.to_string());
    }

    /// Takes one line (without its `\n`). Nothing after the end record counts.
    pub fn line(&mut self, line: &[u8]) {
        if self.end.is_some() {
            return;
        }
        let (tag, rest) = match line {
            [tag, b' ', rest @ ..] => (*tag, rest),
            _ => return self.noise(line),
        };
        let Ok(bytes) = STANDARD.decode(rest) else {
            return match tag {
                b'o' | b'e' | b'l' | b't' | b'x' | b'k' | b'K' | b'q' => self.broke("a record's base64 is broken"),
                _ => self.noise(line),
            };
        };
        match tag {
            b'o' => self.stdout.write(&bytes),
            b'e' => self.stderr.write(&bytes),
            b'l' => {
                let listing = self.listing.get_or_insert_with(Listing::default);
                let room =
                    usize::try_from(self.listing_cap.saturating_sub(listing.bytes.len() as u64)).unwrap_or(usize::MAX);
                listing.bytes.extend_from_slice(&bytes[..bytes.len().min(room)]);
                listing.cut |= bytes.len() > room;
            }
            b't' => self.end = Some(End::TimedOut),
            b'x' => match parse_exit(&bytes) {
                Some(end) => self.end = Some(end),
                None => self.broke("the end record is broken"),
            },
            b'k' | b'K' => self.tool_record(tag, &bytes),
            b'q' => self.tools_capped = true,
            _ => self.noise(line),
        }
    }

    /// `k`: "<connection> <bytes>", `K`: "<connection>"; dropped past
    /// [`MAX_TOOL_BYTES`], or in a run that calls no tools.
    fn tool_record(&mut self, tag: u8, bytes: &[u8]) {
        let Some((relay, left)) = &mut self.tools else { return self.broke("a tool record in a run without tools") };
        self.called_tools = true;
        let (number, data) = match bytes.iter().position(|&b| b == b' ') {
            Some(at) => (&bytes[..at], &bytes[at + 1..]),
            None => (bytes, &[][..]),
        };
        let Some(number) = std::str::from_utf8(number).ok().and_then(|n| n.parse().ok()) else {
            return self.broke("a tool record is broken");
        };
        let message = match tag {
            b'K' => FromPod::Shut(number),
            _ if data.len() as u64 > *left => return,
            _ => {
                *left -= data.len() as u64;
                FromPod::Data(number, data.to_vec())
            }
        };
        // The relay is gone only once the run is over.
        let _ = relay.send(message);
    }

    /// Why the program's tool calls got no answer, if it made any and
    /// they could not be carried.
    pub fn tools_lost(&self) -> Option<&str> {
        self.tools_lost.as_deref().filter(|_| self.called_tools)
    }

    /// A line longer than [`MAX_LINE`]: the log is not the launcher's.
    pub fn overlong(&mut self) {
        self.broke("a log line is longer than any record");
    }

    fn broke(&mut self, why: &'static str) {
        self.broken.get_or_insert(why);
    }

    fn noise(&mut self, line: &[u8]) {
        if self.noise.len() >= MAX_NOISE {
            return;
        }
        let text = String::from_utf8_lossy(line);
        let room = MAX_NOISE - self.noise.len();
        let cut = text.char_indices().map(|(i, c)| i + c.len_utf8()).take_while(|&end| end <= room).last();
        self.noise.push_str(&text[..cut.unwrap_or(0)]);
        self.noise.push('\n');
    }
}

/// `<status> <stdout total> <stderr total> <OOM kills>` (-1: unknown).
fn parse_exit(bytes: &[u8]) -> Option<End> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut parts = text.split(' ');
    let status = parts.next()?.parse().ok()?;
    let stdout_total = parts.next()?.parse().ok()?;
    let stderr_total = parts.next()?.parse().ok()?;
    let kills: i64 = parts.next()?.parse().ok()?;
    let oom_killed = (kills >= 0).then_some(kills > 0);
    parts.next().is_none().then_some(End::Exited { status, stdout_total, stderr_total, oom_killed })
}

/// Splits a byte stream into lines of at most [`MAX_LINE`] bytes for
/// [`Records::line`], across reads of any size.
#[derive(Default)]
pub(super) struct Lines {
    held: Vec<u8>,
    /// The current line passed [`MAX_LINE`]: dropped up to its end.
    skipping: bool,
}

impl Lines {
    /// Feeds `bytes`; every whole line goes to `records`.
    pub fn feed(&mut self, mut bytes: &[u8], records: &mut Records) {
        while !bytes.is_empty() {
            let (part, line_ends) = match bytes.iter().position(|&b| b == b'\n') {
                Some(at) => (&bytes[..at], true),
                None => (bytes, false),
            };
            bytes = &bytes[(part.len() + usize::from(line_ends)).min(bytes.len())..];
            if !self.skipping {
                if self.held.len() + part.len() > MAX_LINE {
                    records.overlong();
                    self.held.clear();
                    self.skipping = true;
                } else {
                    self.held.extend_from_slice(part);
                }
            }
            if line_ends {
                if !self.skipping {
                    records.line(&self.held);
                }
                self.held.clear();
                self.skipping = false;
            }
        }
    }

    /// The log ended: a last line without `\n` counts too.
    pub fn finish(mut self, records: &mut Records) {
        if !self.held.is_empty() && !self.skipping {
            records.line(&std::mem::take(&mut self.held));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(tag: u8, bytes: &[u8]) -> Vec<u8> {
        let mut line = vec![tag, b' '];
        line.extend_from_slice(STANDARD.encode(bytes).as_bytes());
        line.push(b'\n');
        line
    }

    #[test]
    fn records_come_back_whatever_the_chunks() {
        let mut log = Vec::new();
        log.extend(record(b'o', b"hello "));
        log.extend(b"Traceback: the launcher's own words\n");
        log.extend(record(b'e', b"warn\n"));
        log.extend(record(b'o', &[0, 255, b'\n']));
        log.extend(record(b'l', b"E\n"));
        log.extend(record(b'x', b"3 9 5 -1"));
        log.extend(record(b'o', b"after the end"));
        for size in [1, 2, 7, 64, log.len()] {
            let mut records = Records::new(Some(100), Some(100), None, 100);
            let mut lines = Lines::default();
            for chunk in log.chunks(size) {
                lines.feed(chunk, &mut records);
            }
            lines.finish(&mut records);
            assert_eq!(records.stdout.into_captured().bytes, b"hello \0\xff\n");
            assert_eq!(records.stderr.into_captured().bytes, b"warn\n");
            assert_eq!(records.listing.as_ref().map(|l| l.bytes.clone()), Some(b"E\n".to_vec()));
            assert_eq!(
                records.end,
                Some(End::Exited { status: 3, stdout_total: 9, stderr_total: 5, oom_killed: None })
            );
            assert_eq!(records.noise, "Traceback: the launcher's own words\n");
            assert_eq!(records.broken, None);
        }
    }

    #[test]
    fn caps_hold_whatever_the_launcher_sent() {
        let mut records = Records::new(Some(4), Some(0), None, 3);
        let mut lines = Lines::default();
        lines.feed(&record(b'o', b"0123456789"), &mut records);
        lines.feed(&record(b'e', b"err"), &mut records);
        lines.feed(&record(b'l', b"listing"), &mut records);
        let listing = records.listing.take().expect("a listing");
        assert_eq!((listing.bytes.as_slice(), listing.cut), (b"lis".as_slice(), true));
        let out = records.stdout.into_captured();
        assert_eq!((out.bytes.as_slice(), out.truncated), (b"0123".as_slice(), true));
        assert!(records.stderr.into_captured().bytes.is_empty());
    }

    /// `k` and `K` go to the run's relay, up to [`MAX_TOOL_BYTES`] of
    /// calls; in a run without tools they are a damaged log, never output.
    #[test]
    fn tool_records_reach_the_relay_within_their_cap() {
        let mut records = Records::new(None, None, None, 0);
        let (relay, mut from_pod) = tokio::sync::mpsc::unbounded_channel();
        records.carry_tools(relay);
        let mut lines = Lines::default();
        lines.feed(&record(b'k', b"3 {\"tool_call\"\n"), &mut records);
        lines.feed(&record(b'K', b"3"), &mut records);
        lines.feed(&record(b'k', b"x y"), &mut records);
        assert_eq!(from_pod.try_recv().ok(), Some(FromPod::Data(3, b"{\"tool_call\"\n".to_vec())));
        assert_eq!(from_pod.try_recv().ok(), Some(FromPod::Shut(3)));
        assert!(from_pod.try_recv().is_err());
        assert_eq!(records.broken, Some("a tool record is broken"));
        records.tools.as_mut().expect("tools").1 = 2;
        lines.feed(&record(b'k', b"4 abc"), &mut records);
        lines.feed(&record(b'k', b"4 ab"), &mut records);
        assert_eq!(from_pod.try_recv().ok(), Some(FromPod::Data(4, b"ab".to_vec())), "past the cap: dropped");
        assert_eq!(records.tools_lost(), None);
        assert!(records.stdout.into_captured().bytes.is_empty());

        let mut records = Records::new(None, None, None, 0);
        Lines::default().feed(&record(b'k', b"1 {}"), &mut records);
        assert_eq!(records.broken, Some("a tool record in a run without tools"));
        let mut records = Records::new(None, None, None, 0);
        let (relay, _from_pod) = tokio::sync::mpsc::unbounded_channel();
        records.carry_tools(relay);
        records.lose_tools("no attachment");
        assert_eq!(records.tools_lost(), None, "said only when the program called");
        Lines::default().feed(&record(b'k', b"1 {}"), &mut records);
        assert_eq!(records.tools_lost(), Some("no attachment"));
        Lines::default().feed(&record(b'q', b""), &mut records);
        assert!(records.tools_capped);
    }

    #[test]
    fn broken_and_overlong_lines_are_named_never_taken() {
        let mut records = Records::new(None, None, None, 10);
        let mut lines = Lines::default();
        lines.feed(b"o !!notbase64\n", &mut records);
        assert_eq!(records.broken, Some("a record's base64 is broken"));
        let mut records = Records::new(None, None, None, 10);
        let mut long = record(b'o', &vec![b'a'; MAX_LINE]);
        long.extend(record(b'x', b"0 1 0 1"));
        lines.feed(&long, &mut records);
        assert_eq!(records.broken, Some("a log line is longer than any record"));
        assert!(records.stdout.into_captured().bytes.is_empty());
        assert_eq!(
            records.end,
            Some(End::Exited { status: 0, stdout_total: 1, stderr_total: 0, oom_killed: Some(true) })
        );
        let mut records = Records::new(None, None, None, 10);
        Lines::default().feed(&record(b'x', b"0 1"), &mut records);
        assert_eq!((records.end, records.broken), (None, Some("the end record is broken")));
    }
}
