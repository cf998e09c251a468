//! [`CappedPipe`]: a guest's stdout or stderr, written through the shared
//! [`BoundedBuffer`] so the policy's cap holds as the guest writes.
//!
//! Unlike wasmtime-wasi's `MemoryOutputPipe`, a full pipe keeps accepting
//! (and counting) bytes: the guest never sees a write error, the way a pipe
//! drained to `/dev/null` behaves, and `total_bytes` stays exact.
//!
//! A pipe may carry a [`ResultTap`] (QuickJS's stdout): the runner's result
//! records are taken out of the stream before the cap applies. With a
//! [`CallSink`], the tool calls the tap takes out are handed to it as soon
//! as each is whole, on the guest's thread, outside the pipe's lock.

use parking_lot::{Condvar, Mutex};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

use crate::limits::output::{BoundedBuffer, OutputTap, StreamKind};
use crate::limits::records::{CallFrame, Records, ResultTap};
use crate::result::CapturedStream;

/// Largest write the guest is told it may make at once.
const WRITE_WINDOW: usize = 64 * 1024;

/// Where the tool calls a pipe's tap takes out of the stream go (the
/// run's tool channel).
pub(crate) type CallSink = Arc<dyn Fn(CallFrame) + Send + Sync>;

/// One capped output stream; clones share the buffer.
#[derive(Clone)]
pub(crate) struct CappedPipe(Arc<Mutex<Sink>>);

struct Sink {
    text: BoundedBuffer,
    tap: Option<ResultTap>,
    /// What the tap found, once the stream was taken.
    records: Option<Records>,
    /// Gets the tool calls the tap takes out.
    calls: Option<CallSink>,
}

impl CappedPipe {
    pub fn new(cap: Option<u64>) -> Self {
        Self(Arc::new(Mutex::new(Sink { text: BoundedBuffer::new(cap), tap: None, records: None, calls: None })))
    }

    /// A pipe whose `tap` takes the runner's records out of the stream.
    pub fn tapped(cap: Option<u64>, tap: ResultTap) -> Self {
        Self(Arc::new(Mutex::new(Sink { text: BoundedBuffer::new(cap), tap: Some(tap), records: None, calls: None })))
    }

    /// Hands the tool calls the tap takes out (a tap made
    /// [`ResultTap::with_calls`]) to `calls`, from now on.
    pub fn set_calls(&self, calls: Option<CallSink>) {
        self.lock().calls = calls;
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Sink> {
        self.0.lock()
    }

    /// Also streams what is kept to `tap` (see [`OutputTap`]).
    pub fn with_tap(self, tap: Option<OutputTap>, kind: StreamKind) -> Self {
        {
            let sink = &mut *self.lock();
            sink.text = std::mem::replace(&mut sink.text, BoundedBuffer::new(Some(0))).tapped(tap, kind);
        }
        self
    }

    /// Starts over like [`CappedPipe::reset`], with `records` taking the
    /// runner's records out of the stream (a session cell's status).
    pub fn reset_with_records(&self, cap: Option<u64>, records: ResultTap, tap: Option<OutputTap>, kind: StreamKind) {
        let sink = &mut *self.lock();
        sink.text = BoundedBuffer::new(cap).tapped(tap, kind);
        sink.tap = Some(records);
        sink.records = None;
    }

    /// Starts over with an empty buffer holding at most `cap` bytes, kept
    /// chunks going to `tap` (a warm instance learns its request's cap and
    /// tap when the code arrives).
    pub fn reset(&self, cap: Option<u64>, tap: Option<OutputTap>, kind: StreamKind) {
        self.lock().text = BoundedBuffer::new(cap).tapped(tap, kind);
    }

    fn write(&self, bytes: &[u8]) {
        let (calls, sink_calls) = {
            let sink = &mut *self.lock();
            match &mut sink.tap {
                Some(tap) => {
                    tap.feed(bytes, &mut sink.text);
                    (tap.take_calls(), sink.calls.clone())
                }
                None => {
                    sink.text.write(bytes);
                    return;
                }
            }
        };
        // Outside the lock: answering a call may take other locks.
        if let Some(sink_calls) = sink_calls {
            for call in calls {
                sink_calls(call);
            }
        }
    }

    /// What was kept and how much was written in all; call once, after the
    /// run (the buffer is moved out, not copied).
    pub fn take_captured(&self) -> CapturedStream {
        let sink = &mut *self.lock();
        if let Some(mut tap) = sink.tap.take() {
            sink.records = Some(tap.finish(&mut sink.text));
        }
        std::mem::replace(&mut sink.text, BoundedBuffer::new(Some(0))).into_captured()
    }

    /// The tap's records, after [`CappedPipe::take_captured`].
    pub fn take_records(&self) -> Records {
        self.lock().records.take().unwrap_or_default()
    }
}

impl IsTerminal for CappedPipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CappedPipe {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl OutputStream for CappedPipe {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        CappedPipe::write(self, &bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_WINDOW)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CappedPipe {
    async fn ready(&mut self) {}
}

impl AsyncWrite for CappedPipe {
    fn poll_write(self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        CappedPipe::write(&self, buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Stdin that delivers framed messages (`<len>\n<bytes>`) as the host
/// sends them, blocking in between: what a warm interpreter reads its code
/// from, a session each cell, and code that calls tools their answers. Every time the guest blocks for more (it
/// has read everything sent), the wait counter goes up: the host learns that
/// a warm instance finished starting, or a session's cell finished.
///
/// The host waits for that without polling ([`MessageSender::wait_past`]):
/// the guest blocking, the stream closing and the guest's end
/// ([`MessageStdin::end_guard`]) each wake it.
pub(crate) struct MessageStdin(Arc<Channel>);

/// The host's end of a [`MessageStdin`]. Dropping it ends the stream (the
/// guest reads end-of-file).
pub(crate) struct MessageSender {
    /// `None` once closed.
    tx: Mutex<Option<tokio::sync::mpsc::UnboundedSender<Vec<u8>>>>,
    channel: Arc<Channel>,
}

struct Channel {
    inbox: Mutex<Inbox>,
    /// Times the guest blocked for more input.
    waits: AtomicU64,
    /// Bytes sent that the guest has not read yet.
    unread: AtomicU64,
    /// Notified (under `inbox`) when `waits` goes up, the stream closes or
    /// the guest ends.
    changed: Condvar,
    /// Also notified when the guest blocks (shared by a warm pool's instances).
    blocked: Option<Arc<WaitSignal>>,
}

struct Inbox {
    current: Bytes,
    /// Taken while a reader awaits the next message.
    rx: Option<tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>>,
    closed: bool,
    /// The guest's thread has ended (see [`MessageStdin::end_guard`]).
    guest_ended: bool,
}

impl MessageStdin {
    /// A stdin and its host end; `blocked`, if given, is notified too each
    /// time the guest blocks for input.
    pub(crate) fn new(blocked: Option<Arc<WaitSignal>>) -> (Self, MessageSender) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let channel = Arc::new(Channel {
            inbox: Mutex::new(Inbox { current: Bytes::new(), rx: Some(rx), closed: false, guest_ended: false }),
            waits: AtomicU64::new(0),
            unread: AtomicU64::new(0),
            changed: Condvar::new(),
            blocked,
        });
        (Self(channel.clone()), MessageSender { tx: Mutex::new(Some(tx)), channel })
    }

    /// For the guest's thread to hold while the guest runs: dropping it says
    /// the guest has ended (after the thread reported its result), which
    /// ends a [`MessageSender::wait_past`] at once.
    pub(crate) fn end_guard(&self) -> GuestEnd {
        GuestEnd(self.0.clone())
    }
}

/// Says, when dropped, that the guest of a [`MessageStdin`] has ended.
pub(crate) struct GuestEnd(Arc<Channel>);

impl Drop for GuestEnd {
    fn drop(&mut self) {
        self.0.inbox().guest_ended = true;
        self.0.changed.notify_all();
    }
}

/// A wake-up shared by several message stdins: notified whenever one of
/// their guests blocks for input (a warm pool learns that an instance
/// finished starting), so a waiter needs no polling.
#[derive(Default)]
pub(crate) struct WaitSignal {
    /// Counts notifications; waiters hold it while they check their condition.
    generation: Mutex<u64>,
    changed: Condvar,
}

impl WaitSignal {
    /// Wakes every waiter, to check its condition again.
    pub(crate) fn notify(&self) {
        *self.generation.lock() += 1;
        self.changed.notify_all();
    }

    /// Waits until `done()` (true) or until `limit` has passed (false);
    /// `done` is checked first and after each notification. Whatever makes
    /// `done` true must notify after it changed (the guest blocking does).
    pub(crate) fn wait_for(&self, limit: Duration, done: impl Fn() -> bool) -> bool {
        let until = Instant::now().checked_add(limit);
        let mut generation = self.generation.lock();
        loop {
            if done() {
                return true;
            }
            match until {
                Some(at) if Instant::now() >= at => return false,
                Some(at) => drop(self.changed.wait_until(&mut generation, at)),
                None => self.changed.wait(&mut generation),
            }
        }
    }
}

impl Channel {
    fn inbox(&self) -> parking_lot::MutexGuard<'_, Inbox> {
        self.inbox.lock()
    }
}

impl MessageSender {
    /// Sends one message, framed; returns the guest's wait count at that
    /// moment (the next wait, past it, means the guest read it all and
    /// blocks again), or `None` if the guest is gone.
    pub fn send(&self, message: &[u8]) -> Option<u64> {
        let mut framed = format!("{}\n", message.len()).into_bytes();
        framed.extend_from_slice(message);
        self.send_raw(framed)
    }

    /// Sends `bytes` as they are (e.g. the bare `S\n` that starts a
    /// session); returns what [`MessageSender::send`] does.
    pub fn send_raw(&self, framed: Vec<u8>) -> Option<u64> {
        // Under the inbox lock: a reader cannot count a wait in between.
        let _inbox = self.channel.inbox();
        let waits = self.channel.waits.load(Ordering::SeqCst);
        let len = framed.len() as u64;
        self.tx.lock().as_ref()?.send(framed).ok()?;
        self.channel.unread.fetch_add(len, Ordering::SeqCst);
        Some(waits)
    }

    /// Bytes sent that the guest has not read yet (a guest that calls tools
    /// and does not read their answers is not answered past a bound).
    pub fn unread(&self) -> u64 {
        self.channel.unread.load(Ordering::SeqCst)
    }

    /// Ends the stream now: the guest reads end-of-file, also if it is
    /// blocked reading (a killed session; a one-shot run's code is sent).
    /// Wakes a [`MessageSender::wait_past`] in progress, to look at its
    /// `give_up` again.
    pub fn close(&self) {
        drop(self.tx.lock().take());
        let _inbox = self.channel.inbox();
        self.channel.changed.notify_all();
    }

    /// Times the guest blocked for input so far.
    pub fn waits(&self) -> u64 {
        self.channel.waits.load(Ordering::SeqCst)
    }

    /// Waits until the guest has blocked more than `seen` times (true), or
    /// until the guest has ended, `until` passes or `give_up` says so
    /// (false). No polling: `give_up` is asked again each time the channel
    /// changes (the guest blocks, the stream is closed, the guest ends), so
    /// it may only turn true together with one of those (a killed session
    /// closes the stream).
    pub fn wait_past(&self, seen: u64, until: Option<Instant>, give_up: impl Fn() -> bool) -> bool {
        let mut inbox = self.channel.inbox();
        loop {
            if self.channel.waits.load(Ordering::SeqCst) > seen {
                return true;
            }
            if inbox.guest_ended || give_up() {
                return false;
            }
            match until {
                Some(at) if Instant::now() >= at => return false,
                Some(at) => drop(self.channel.changed.wait_until(&mut inbox, at)),
                None => self.channel.changed.wait(&mut inbox),
            }
        }
    }
}

impl IsTerminal for MessageStdin {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl wasmtime_wasi::cli::StdinStream for MessageStdin {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncRead + Send + Sync> {
        // Only the p2 stream below is used by WASI preview 1.
        Box::new(tokio::io::empty())
    }

    fn p2_stream(&self) -> Box<dyn wasmtime_wasi::p2::InputStream> {
        Box::new(MessageStdin(self.0.clone()))
    }
}

impl wasmtime_wasi::p2::InputStream for MessageStdin {
    fn read(&mut self, size: usize) -> StreamResult<Bytes> {
        let mut inbox = self.0.inbox();
        if !inbox.current.is_empty() {
            let take = size.min(inbox.current.len());
            self.0.unread.fetch_sub(take as u64, Ordering::SeqCst);
            return Ok(inbox.current.split_to(take));
        }
        if inbox.closed { Err(wasmtime_wasi::p2::StreamError::Closed) } else { Ok(Bytes::new()) }
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for MessageStdin {
    async fn ready(&mut self) {
        let mut rx = {
            let mut inbox = self.0.inbox();
            if !inbox.current.is_empty() || inbox.closed {
                return;
            }
            // A message already sent is taken without blocking (and is not
            // a wait): only a guest that read everything sent blocks.
            if let Some(rx) = inbox.rx.as_mut() {
                match rx.try_recv() {
                    Ok(message) => {
                        inbox.current = Bytes::from(message);
                        return;
                    }
                    Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => {
                        inbox.closed = true;
                        return;
                    }
                    Err(tokio::sync::mpsc::error::TryRecvError::Empty) => {}
                }
            }
            // Nothing left to read: the guest blocks (counted under the
            // lock `send` takes, so a send either precedes it or sees it).
            self.0.waits.fetch_add(1, Ordering::SeqCst);
            self.0.changed.notify_all();
            if let Some(blocked) = &self.0.blocked {
                blocked.notify();
            }
            match inbox.rx.take() {
                Some(rx) => rx,
                None => return,
            }
        };
        let next = rx.recv().await;
        let mut inbox = self.0.inbox();
        match next {
            Some(message) => inbox.current = Bytes::from(message),
            None => inbox.closed = true,
        }
        inbox.rx = Some(rx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    const LONG: Duration = Duration::from_secs(60);

    #[test]
    fn a_wait_for_the_guest_ends_when_the_guest_does() {
        let (stdin, sender) = MessageStdin::new(None);
        let end = stdin.end_guard();
        std::thread::scope(|s| {
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                drop(end);
            });
            // No deadline and nothing else to wake it: only the guest's end can.
            assert!(!sender.wait_past(0, None, || false));
        });
    }

    #[test]
    fn closing_wakes_a_wait_to_look_at_give_up_again() {
        let (_stdin, sender) = MessageStdin::new(None);
        let killed = AtomicBool::new(false);
        let started = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(50));
                killed.store(true, Ordering::SeqCst);
                sender.close();
            });
            assert!(!sender.wait_past(0, Some(Instant::now() + LONG), || killed.load(Ordering::SeqCst)));
        });
        assert!(started.elapsed() < LONG / 2, "woken, not timed out: {:?}", started.elapsed());
    }

    #[test]
    fn a_signal_wakes_its_waiter_and_a_wait_ends_at_its_limit() {
        let signal = WaitSignal::default();
        let done = AtomicBool::new(false);
        let started = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(50));
                done.store(true, Ordering::SeqCst);
                signal.notify();
            });
            assert!(signal.wait_for(LONG, || done.load(Ordering::SeqCst)));
        });
        assert!(started.elapsed() < LONG / 2, "woken, not timed out: {:?}", started.elapsed());
        assert!(!signal.wait_for(Duration::from_millis(20), || false));
    }
}
