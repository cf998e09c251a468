//! [`CappedPipe`]: a guest's stdout or stderr, written through the shared
//! [`BoundedBuffer`] so the policy's cap holds as the guest writes.
//!
//! Unlike wasmtime-wasi's `MemoryOutputPipe`, a full pipe keeps accepting
//! (and counting) bytes: the guest never sees a write error, the way a pipe
//! drained to `/dev/null` behaves, and `total_bytes` stays exact.
//!
//! A pipe may carry a [`ResultTap`] (QuickJS's stdout): the runner's result
//! records are taken out of the stream before the cap applies.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

use super::quickjs::{Records, ResultTap};
use crate::limits::{BoundedBuffer, OutputTap, StreamKind};
use crate::result::CapturedStream;

/// Largest write the guest is told it may make at once.
const WRITE_WINDOW: usize = 64 * 1024;

/// One capped output stream; clones share the buffer.
#[derive(Clone)]
pub(super) struct CappedPipe(Arc<Mutex<Sink>>);

struct Sink {
    text: BoundedBuffer,
    tap: Option<ResultTap>,
    /// What the tap found, once the stream was taken.
    records: Option<Records>,
}

impl CappedPipe {
    pub fn new(cap: Option<u64>) -> Self {
        Self(Arc::new(Mutex::new(Sink { text: BoundedBuffer::new(cap), tap: None, records: None })))
    }

    /// A pipe whose `tap` takes the runner's records out of the stream.
    pub fn tapped(cap: Option<u64>, tap: ResultTap) -> Self {
        Self(Arc::new(Mutex::new(Sink { text: BoundedBuffer::new(cap), tap: Some(tap), records: None })))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sink> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Also streams what is kept to `tap` (see [`OutputTap`]).
    pub fn with_tap(self, tap: Option<OutputTap>, kind: StreamKind) -> Self {
        {
            let sink = &mut *self.lock();
            sink.text = std::mem::replace(&mut sink.text, BoundedBuffer::new(Some(0))).tapped(tap, kind);
        }
        self
    }

    /// Starts over with an empty buffer holding at most `cap` bytes, kept
    /// chunks going to `tap` (a warm instance learns its request's cap and
    /// tap when the code arrives).
    pub fn reset(&self, cap: Option<u64>, tap: Option<OutputTap>, kind: StreamKind) {
        self.lock().text = BoundedBuffer::new(cap).tapped(tap, kind);
    }

    fn write(&self, bytes: &[u8]) {
        let sink = &mut *self.lock();
        match &mut sink.tap {
            Some(tap) => tap.feed(bytes, &mut sink.text),
            None => sink.text.write(bytes),
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

/// Stdin that blocks until the code arrives, then yields it and ends: what a
/// warm interpreter reads its program from. The flag turns true when the
/// guest first reads (start-up is over).
pub(super) struct CodeStdin(Arc<Mutex<CodeState>>, Arc<AtomicBool>);

enum CodeState {
    Waiting(tokio::sync::oneshot::Receiver<Vec<u8>>),
    /// A reader is awaiting the code.
    Receiving,
    Data(Bytes),
    Done,
}

impl CodeStdin {
    /// The stdin, the sender that delivers its one message (dropping the
    /// sender ends the stream empty), and the "guest is waiting" flag.
    pub fn new() -> (Self, tokio::sync::oneshot::Sender<Vec<u8>>, Arc<AtomicBool>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let waiting = Arc::new(AtomicBool::new(false));
        (Self(Arc::new(Mutex::new(CodeState::Waiting(rx))), waiting.clone()), tx, waiting)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, CodeState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl IsTerminal for CodeStdin {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl wasmtime_wasi::cli::StdinStream for CodeStdin {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncRead + Send + Sync> {
        // Only the p2 stream below is used by WASI preview 1.
        Box::new(tokio::io::empty())
    }

    fn p2_stream(&self) -> Box<dyn wasmtime_wasi::p2::InputStream> {
        Box::new(CodeStdin(self.0.clone(), self.1.clone()))
    }
}

impl wasmtime_wasi::p2::InputStream for CodeStdin {
    fn read(&mut self, size: usize) -> StreamResult<Bytes> {
        let mut state = self.state();
        if let CodeState::Waiting(rx) = &mut *state {
            self.1.store(true, Ordering::SeqCst);
            match rx.try_recv() {
                Ok(code) => *state = CodeState::Data(Bytes::from(code)),
                Err(tokio::sync::oneshot::error::TryRecvError::Empty) => return Ok(Bytes::new()),
                Err(tokio::sync::oneshot::error::TryRecvError::Closed) => *state = CodeState::Done,
            }
        }
        match &mut *state {
            CodeState::Data(bytes) => {
                let chunk = bytes.split_to(size.min(bytes.len()));
                if bytes.is_empty() {
                    *state = CodeState::Done;
                }
                Ok(chunk)
            }
            CodeState::Done => Err(wasmtime_wasi::p2::StreamError::Closed),
            CodeState::Waiting(_) | CodeState::Receiving => Ok(Bytes::new()),
        }
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CodeStdin {
    async fn ready(&mut self) {
        let rx = {
            let mut state = self.state();
            match std::mem::replace(&mut *state, CodeState::Receiving) {
                CodeState::Waiting(rx) => rx,
                other => {
                    *state = other;
                    return;
                }
            }
        };
        self.1.store(true, Ordering::SeqCst);
        let next = match rx.await {
            Ok(code) => CodeState::Data(Bytes::from(code)),
            Err(_) => CodeState::Done,
        };
        *self.state() = next;
    }
}
