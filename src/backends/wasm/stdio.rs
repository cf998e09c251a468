//! [`CappedPipe`]: a guest's stdout or stderr, written through the shared
//! [`BoundedBuffer`] so the policy's cap holds as the guest writes.
//!
//! Unlike wasmtime-wasi's `MemoryOutputPipe`, a full pipe keeps accepting
//! (and counting) bytes: the guest never sees a write error, the way a pipe
//! drained to `/dev/null` behaves, and `total_bytes` stays exact.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

use crate::limits::BoundedBuffer;
use crate::result::CapturedStream;

/// Largest write the guest is told it may make at once.
const WRITE_WINDOW: usize = 64 * 1024;

/// One capped output stream; clones share the buffer.
#[derive(Clone)]
pub(super) struct CappedPipe(Arc<Mutex<BoundedBuffer>>);

impl CappedPipe {
    pub fn new(cap: Option<u64>) -> Self {
        Self(Arc::new(Mutex::new(BoundedBuffer::new(cap))))
    }

    /// Starts over with an empty buffer holding at most `cap` bytes (a warm
    /// instance learns its request's cap when the code arrives).
    pub fn reset(&self, cap: Option<u64>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = BoundedBuffer::new(cap);
    }

    fn write(&self, bytes: &[u8]) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).write(bytes);
    }

    /// What was kept and how much was written in all; call once, after the
    /// run (the buffer is moved out, not copied).
    pub fn take_captured(&self) -> CapturedStream {
        let mut buffer = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::replace(&mut *buffer, BoundedBuffer::new(Some(0))).into_captured()
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
/// warm interpreter reads its program from.
pub(super) struct CodeStdin(Arc<Mutex<CodeState>>, Arc<std::sync::atomic::AtomicBool>);

enum CodeState {
    Waiting(tokio::sync::oneshot::Receiver<Vec<u8>>),
    Data(Vec<u8>, usize),
    Done,
}

impl CodeStdin {
    /// The stdin, the sender that delivers its one message (dropping the
    /// sender ends the stream empty), and a flag set once the guest waits for it.
    pub fn new() -> (Self, tokio::sync::oneshot::Sender<Vec<u8>>, Arc<std::sync::atomic::AtomicBool>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let waiting = Arc::new(std::sync::atomic::AtomicBool::new(false));
        (Self(Arc::new(Mutex::new(CodeState::Waiting(rx))), waiting.clone()), tx, waiting)
    }
}

impl IsTerminal for CodeStdin {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl wasmtime_wasi::cli::StdinStream for CodeStdin {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncRead + Send + Sync> {
        Box::new(CodeStdin(self.0.clone(), self.1.clone()))
    }
}

impl tokio::io::AsyncRead for CodeStdin {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let mut state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            match &mut *state {
                CodeState::Waiting(rx) => match Pin::new(rx).poll(cx) {
                    Poll::Pending => {
                        self.1.store(true, std::sync::atomic::Ordering::SeqCst);
                        return Poll::Pending;
                    }
                    Poll::Ready(Ok(bytes)) => *state = CodeState::Data(bytes, 0),
                    Poll::Ready(Err(_)) => *state = CodeState::Done,
                },
                CodeState::Data(bytes, at) => {
                    let n = buf.remaining().min(bytes.len() - *at);
                    buf.put_slice(&bytes[*at..*at + n]);
                    *at += n;
                    if *at == bytes.len() {
                        *state = CodeState::Done;
                    }
                    return Poll::Ready(Ok(()));
                }
                CodeState::Done => return Poll::Ready(Ok(())),
            }
        }
    }
}
