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
//! than the tap keeps (`frame_limit`) is refused `invalid_arguments`
//! without being read; one that is not a call frame is answered `protocol`
//! (see `crate::tools::wire`).
//! Answers stop when the run (or the session's cell) ends ([`ToolChannel::end`]).

use parking_lot::Mutex;
use std::sync::{Arc, Weak, mpsc};
use std::thread::JoinHandle;

use super::stdio::{CallSink, MessageSender};
use crate::limits::deadline::Deadline;
use crate::limits::records::CallFrame;
use crate::result::{ExecResult, Outcome};
use crate::tools::ToolBridge;
use crate::tools::frame::{ToCode, ToolResult};
use crate::tools::wire::{FRAME_OVERHEAD, read_frame};

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
