//! Code Mode on the wasm interpreters: how code in CPython-in-wasm and
//! QuickJS-in-wasm reaches the run's [`ToolBridge`] over its stdio (the
//! prebuilt interpreter modules cannot import host functions).
//!
//! **Wire.** A call is a record on the guest's stdout, written in one go by
//! the runner's `tools` code:
//!
//! ```text
//! \0execbox:<nonce>:T<len>:{"tool_call":{"id":N,"name":"ns.tool","args":{...}}}\n
//! ```
//!
//! (`<len>` bytes of UTF-8 JSON: a [`ToCodeHost`](crate::tools::frame::ToCodeHost)
//! frame). The stdout tap ([`ResultTap::with_calls`](crate::limits::records::ResultTap::with_calls))
//! takes it out of the stream as soon as its terminator is written, and
//! hands it to the channel, which dispatches it with [`ToolBridge::call`]
//! (never blocking the guest's thread). The answer goes back as one
//! message on the instance's message stdin (`<len>\n<bytes>`), whose bytes
//! are a NUL and a [`ToCode`] frame:
//!
//! ```text
//! <len>\n\0{"tool_result":{"id":N,"ok":true,"value":...}}
//! ```
//!
//! The leading NUL tells an answer from code: Python source cannot hold a
//! NUL, so a session's loop never takes a late answer for its next cell.
//!
//! **What holds.** The nonce is the run's (a session's: the session's),
//! 128 random bits sent only to its own instance: another run cannot
//! make a record this run's tap takes. The code itself can forge records
//! (it can read its runner's nonce): a forged call is just a call — it goes
//! through the bridge, which runs only granted tools within the budgets —
//! and a forged or stolen answer confuses only its own run. A frame longer
//! than the tap keeps ([`frame_limit`]) is refused `invalid_arguments`
//! without being read; one that is not a call frame is answered `protocol`.
//! Answers stop when the run (or the session's cell) ends ([`ToolChannel::end`]).

use parking_lot::Mutex;
use std::sync::{Arc, Weak, mpsc};
use std::thread::JoinHandle;

use serde::Deserialize;

use super::stdio::{CallSink, MessageSender};
use crate::limits::deadline::Deadline;
use crate::limits::records::CallFrame;
use crate::result::{ExecResult, Outcome};
use crate::tools::frame::{ToCode, ToCodeHost, ToolCall, ToolResult};
use crate::tools::{ToolBridge, ToolError, ToolErrorKind};

/// Bytes a call frame may have beyond its arguments (the id, the name, the
/// frame's own keys).
const FRAME_OVERHEAD: u64 = 64 << 10;

/// Most bytes of one call frame a carrier reads whole: the arguments'
/// limit (`max_argument_bytes` of `bridge`'s limits, 0 without a bridge)
/// and [`FRAME_OVERHEAD`]. A longer call is refused without being parsed.
pub(crate) fn frame_limit(bridge: Option<&ToolBridge>) -> u64 {
    bridge.map_or(0, |b| b.limits().max_argument_bytes).saturating_add(FRAME_OVERHEAD)
}

/// The names of the tools `bridge` grants, sorted: what the code's `tools`
/// API is built from.
pub(crate) fn granted_names(bridge: &ToolBridge) -> Vec<String> {
    bridge.granted_specs().iter().map(|spec| spec.name.clone()).collect()
}

/// What goes before a Python run's code (or a session's cell) that may call
/// tools: `\0tools:{"nonce": ..., "names": [...]}\n`. The bootstrap takes
/// it off and installs the `tools` package (a NUL never starts Python code).
pub(crate) fn python_header(nonce: &str, bridge: &ToolBridge) -> Vec<u8> {
    let spec = serde_json::json!({"nonce": nonce, "names": granted_names(bridge)});
    let mut header = b"\0tools:".to_vec();
    // A JSON value always serializes; it holds no newline.
    let _ = serde_json::to_writer(&mut header, &spec);
    header.push(b'\n');
    header
}

/// The answer to a call made without a grant: nothing reaches the tools.
pub(crate) fn not_granted(id: u64, name: &str) -> ToolResult {
    ToolResult::error(
        id,
        ToolError::new(name, ToolErrorKind::NotGranted, "this run's policy grants no tools".to_string()),
    )
}

/// What a carrier read of a call.
pub(crate) enum Request {
    /// A call frame.
    Call(ToolCall),
    /// A frame too long to read whole: its id and name, and its length.
    TooLarge { id: u64, name: String, len: u64 },
    /// Not a call frame: answered `protocol`, echoing its id if one was found.
    Malformed { id: u64, why: String },
}

impl Request {
    /// Answers it through `bridge` (or `not_granted` without one), calling
    /// `reply` exactly once unless the run ends first.
    pub(crate) fn dispatch(self, bridge: Option<&Arc<ToolBridge>>, reply: impl FnOnce(ToolResult) + Send + 'static) {
        match (self, bridge) {
            (Request::Call(call), Some(bridge)) => bridge.call(call, reply),
            (Request::Call(call), None) => reply(not_granted(call.id, &call.name)),
            (Request::TooLarge { id, name, len }, Some(bridge)) => reply(bridge.refuse_unread(id, &name, len)),
            (Request::TooLarge { id, name, .. }, None) => reply(not_granted(id, &name)),
            (Request::Malformed { id, why }, _) => {
                reply(ToolResult::error(id, ToolError::new("", ToolErrorKind::Protocol, why)))
            }
        }
    }
}

/// The id and name of a call, its arguments skipped without being kept.
#[derive(Deserialize)]
struct Head {
    id: u64,
    name: String,
    #[serde(default)]
    #[allow(dead_code)]
    args: serde::de::IgnoredAny,
}

/// Reads a bare [`ToolCall`] (`{"id","name","args"}`, the `execbox_tools`
/// import's request) of `json`, at most `limit` bytes of it whole.
pub(crate) fn read_bare_call(json: &[u8], limit: u64) -> Request {
    if json.len() as u64 <= limit {
        return match serde_json::from_slice::<ToolCall>(json) {
            Ok(call) => Request::Call(call),
            Err(e) => malformed(json, e),
        };
    }
    // Parsed, but the arguments skipped: nothing of them is kept.
    match serde_json::from_slice::<Head>(json) {
        Ok(head) => Request::TooLarge { id: head.id, name: head.name, len: json.len() as u64 },
        Err(e) => Request::Malformed { id: 0, why: format!("not a tool call: {e}") },
    }
}

/// Reads a `T` record's frame (`{"tool_call": {...}}`).
pub(crate) fn read_frame(frame: CallFrame) -> Request {
    match frame {
        CallFrame::Whole(json) => match serde_json::from_slice::<ToCodeHost>(&json) {
            Ok(ToCodeHost::ToolCall(call)) => Request::Call(call),
            Err(e) => malformed(&json, e),
        },
        CallFrame::TooLarge { head, len } => match frame_head(&head) {
            Some((id, name)) => Request::TooLarge { id, name, len },
            None => Request::Malformed { id: 0, why: format!("a call of {len} bytes whose id and name come too late") },
        },
    }
}

/// The id and name of a long frame from its first bytes: the runners write
/// `{"tool_call":{"id":N,"name":"...",` before the arguments, so the head
/// cut just before `,"args":` and closed is a frame of its own. (That byte
/// sequence cannot occur inside a JSON string, whose quotes are escaped.)
fn frame_head(head: &[u8]) -> Option<(u64, String)> {
    const ARGS: &[u8] = b",\"args\":";
    let at = head.windows(ARGS.len()).position(|w| w == ARGS)?;
    let closed = [&head[..at], b"}}"].concat();
    match serde_json::from_slice::<ToCodeHost>(&closed).ok()? {
        ToCodeHost::ToolCall(call) => Some((call.id, call.name)),
    }
}

/// A frame that did not parse: answered `protocol` with its id when it has one.
fn malformed(json: &[u8], e: serde_json::Error) -> Request {
    let value: Option<serde_json::Value> = serde_json::from_slice(json).ok();
    let id = value
        .as_ref()
        .and_then(|v| v.get("tool_call").unwrap_or(v).get("id"))
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0);
    Request::Malformed { id, why: format!("not a tool call frame: {e}") }
}

/// An answer as the runners read it: a NUL, then the [`ToCode`] frame.
pub(crate) fn answer_message(result: ToolResult) -> Vec<u8> {
    let mut message = vec![0u8];
    // A ToolResult always serializes (its value is JSON already).
    let _ = serde_json::to_writer(&mut message, &ToCode::ToolResult(result));
    message
}

/// Makes `result` `timed_out` when its run was cut off by its deadline while
/// it waited for input (stdin was ended then): the guest may have exited
/// on the end-of-file before its epoch check stopped it.
pub(crate) fn cut_off_at_deadline(result: &mut ExecResult, deadline: &Deadline) {
    if result.outcome != Outcome::TimedOut {
        result.outcome = Outcome::TimedOut;
        result.message = Some(deadline.exceeded_message());
        result.output = None;
    }
}

/// The host's end of one instance's tool calls: takes them from the stdout
/// tap (as a [`CallSink`]), dispatches them to the bridge of the run (or
/// cell) in progress and sends the answers on the instance's stdin.
///
/// It also tells a session whether its guest, blocked reading stdin, is
/// waiting for an answer (mid-cell) or for its next cell
/// ([`ToolChannel::awaiting_answer`]).
pub(crate) struct ToolChannel {
    /// Weak: the channel never keeps an instance's stdin open.
    stdin: Weak<MessageSender>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Bumped when a run (or cell) begins or ends: answers of another
    /// generation are not sent.
    generation: u64,
    /// Between `begin` and `end`: calls are taken and answered.
    open: bool,
    bridge: Option<Arc<ToolBridge>>,
    /// Calls taken in this generation, and answers sent.
    taken: u64,
    answered: u64,
    /// The guest's wait count when the last answer was sent (see
    /// [`MessageSender::send`]).
    last_sent: Option<u64>,
    /// Most bytes of answers left unread before calls are no longer taken.
    unread_limit: u64,
}

/// Most bytes of answers a guest may leave unread before its calls are no
/// longer taken (dropped unanswered, never reaching the bridge): the code's
/// `tools` API reads each answer before its next call, so only a guest that
/// forges calls and ignores their answers gets here, and the host's memory
/// stays bounded whatever it sends. Room for two of the largest answers.
fn unread_limit(bridge: Option<&ToolBridge>) -> u64 {
    let answer = bridge.map_or(0, |b| b.limits().max_result_bytes).saturating_add(FRAME_OVERHEAD);
    answer.saturating_mul(2)
}

impl ToolChannel {
    /// A channel answering on `stdin`.
    pub(crate) fn new(stdin: &Arc<MessageSender>) -> Arc<Self> {
        Arc::new(Self { stdin: Arc::downgrade(stdin), state: Mutex::new(State::default()) })
    }

    /// A run (or a session's cell) begins: its calls go to `bridge` (none:
    /// every call answers `not_granted`).
    pub(crate) fn begin(&self, bridge: Option<Arc<ToolBridge>>) {
        let mut state = self.state.lock();
        let unread_limit = unread_limit(bridge.as_deref());
        *state = State { generation: state.generation + 1, open: true, bridge, unread_limit, ..State::default() };
    }

    /// The run (or cell) ended: no call is taken and no answer sent from
    /// now on (until the next `begin`).
    pub(crate) fn end(&self) {
        let mut state = self.state.lock();
        *state = State { generation: state.generation + 1, ..State::default() };
    }

    /// The sink for the stdout pipe's tap.
    pub(crate) fn sink(self: &Arc<Self>) -> CallSink {
        let channel = self.clone();
        Arc::new(move |frame| channel.take(frame))
    }

    /// One call from the tap (on the guest's thread, before it waits for
    /// the answer).
    fn take(self: &Arc<Self>, frame: CallFrame) {
        let (generation, bridge) = {
            let mut state = self.state.lock();
            if !state.open {
                return;
            }
            if self.stdin.upgrade().is_some_and(|stdin| stdin.unread() > state.unread_limit) {
                tracing::debug!("a guest left its tool answers unread: a call is dropped");
                return;
            }
            state.taken += 1;
            (state.generation, state.bridge.clone())
        };
        let channel = self.clone();
        read_frame(frame).dispatch(bridge.as_ref(), move |result| channel.answer(generation, result));
    }

    fn answer(&self, generation: u64, result: ToolResult) {
        let mut state = self.state.lock();
        if state.generation != generation {
            return;
        }
        let Some(stdin) = self.stdin.upgrade() else { return };
        // Sent under the state's lock: `awaiting_answer` sees the send and
        // its wait count together.
        if let Some(waits) = stdin.send(&answer_message(result)) {
            state.answered += 1;
            state.last_sent = Some(waits);
        }
    }

    /// For a guest blocked reading stdin for the `blocked`-th time (its wait
    /// count): true if it waits for an answer (a call taken is not answered
    /// yet, or an answer was sent since it blocked, which it will read).
    /// False: it reads stdin for something else (a session's next cell).
    pub(crate) fn awaiting_answer(&self, blocked: u64) -> bool {
        let state = self.state.lock();
        state.taken > state.answered || state.last_sent.is_some_and(|sent| sent >= blocked)
    }
}

/// Ends a run's stdin at its deadline, for runs on the calling thread whose
/// stdin stays open for answers: a guest blocked reading stdin cannot be
/// interrupted by the epoch deadline, so it reads end-of-file instead (and
/// stops at its next epoch check, unless it exits first: the run timed out
/// either way, see [`Watchdog::stop`]). Stopped (and joined) when dropped.
pub(crate) struct Watchdog {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<bool>>,
}

impl Watchdog {
    /// Starts watching; `Err` if no thread could be started.
    pub(crate) fn start(deadline: Deadline, stdin: Arc<MessageSender>) -> std::io::Result<Self> {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread =
            std::thread::Builder::new().name("execbox-tools-watch".into()).stack_size(64 << 10).spawn(move || {
                let expired = match deadline.remaining() {
                    Some(left) => matches!(stopped.recv_timeout(left), Err(mpsc::RecvTimeoutError::Timeout)),
                    None => false,
                };
                if expired {
                    stdin.close();
                }
                expired
            })?;
        Ok(Self { stop: Some(stop), thread: Some(thread) })
    }

    /// Stops watching; true if the deadline passed first (stdin was ended:
    /// the run was cut off by its deadline, whatever the guest did next).
    pub(crate) fn stop(mut self) -> bool {
        self.end()
    }

    fn end(&mut self) -> bool {
        drop(self.stop.take());
        self.thread.take().is_some_and(|thread| thread.join().unwrap_or(false))
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.end();
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn frames_are_read_whole_or_by_their_head() {
        let whole = br#"{"tool_call":{"id":3,"name":"a.b","args":{"x":1}}}"#.to_vec();
        match read_frame(CallFrame::Whole(whole)) {
            Request::Call(call) => assert_eq!((call.id, call.name, call.args), (3, "a.b".into(), json!({"x": 1}))),
            _ => panic!("a call"),
        }
        let head = br#"{"tool_call":{"id":4,"name":"a.\",\"args\":b","args":{"x":"xxxx"#.to_vec();
        match read_frame(CallFrame::TooLarge { head, len: 1 << 20 }) {
            Request::TooLarge { id, name, len } => {
                assert_eq!((id, name.as_str(), len), (4, "a.\",\"args\":b", 1 << 20))
            }
            _ => panic!("too large"),
        }
        match read_frame(CallFrame::Whole(br#"{"tool_call":{"id":5,"args":{}}}"#.to_vec())) {
            Request::Malformed { id, .. } => assert_eq!(id, 5),
            _ => panic!("malformed"),
        }
        match read_frame(CallFrame::TooLarge { head: b"{\"args\":".to_vec(), len: 1 << 20 }) {
            Request::Malformed { id, .. } => assert_eq!(id, 0),
            _ => panic!("malformed"),
        }
        let bare = format!(r#"{{"id":6,"name":"a.b","args":{{"s":"{}"}}}}"#, "x".repeat(100));
        assert!(matches!(read_bare_call(bare.as_bytes(), 1000), Request::Call(_)));
        let len = bare.len() as u64;
        assert!(matches!(read_bare_call(bare.as_bytes(), 10), Request::TooLarge { id: 6, len: l, .. } if l == len));
        assert!(matches!(read_bare_call(b"[1]", 10), Request::Malformed { id: 0, .. }));
    }

    #[test]
    fn answers_start_with_a_nul_and_stop_when_the_run_ends() {
        let message = answer_message(ToolResult::value(1, json!([1]), false));
        assert_eq!(message[0], 0);
        let frame: ToCode = serde_json::from_slice(&message[1..]).unwrap();
        assert_eq!(frame, ToCode::ToolResult(ToolResult::value(1, json!([1]), false)));

        let (_stdin, sender) = crate::backends::wasm::stdio::MessageStdin::new(None);
        let sender = Arc::new(sender);
        let channel = ToolChannel::new(&sender);
        channel.begin(None);
        let sink = channel.sink();
        sink(CallFrame::Whole(br#"{"tool_call":{"id":1,"name":"a.b","args":{}}}"#.to_vec()));
        // Answered inline (not granted), sent before the guest blocked.
        assert!(!channel.awaiting_answer(1));
        assert!(channel.awaiting_answer(0), "sent while the guest was blocked the 0th time");
        channel.end();
        sink(CallFrame::Whole(br#"{"tool_call":{"id":2,"name":"a.b","args":{}}}"#.to_vec()));
        assert!(!channel.awaiting_answer(0), "not taken: the run is over");
    }

    #[test]
    fn a_guest_that_leaves_its_answers_unread_is_not_answered_past_a_bound() {
        let (_stdin, sender) = crate::backends::wasm::stdio::MessageStdin::new(None);
        let sender = Arc::new(sender);
        let channel = ToolChannel::new(&sender);
        channel.begin(None);
        let sink = channel.sink();
        let frame = br#"{"tool_call":{"id":1,"name":"a.b","args":{}}}"#;
        for _ in 0..100_000 {
            sink(CallFrame::Whole(frame.to_vec()));
        }
        let limit = unread_limit(None);
        assert!(sender.unread() > limit / 2 && sender.unread() < limit + 1024, "{} of {limit}", sender.unread());
    }
}
