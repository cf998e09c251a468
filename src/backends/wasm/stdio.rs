//! [`CappedPipe`]: a guest's stdout or stderr, written through the shared
//! [`BoundedBuffer`] so the policy's cap holds as the guest writes.
//!
//! Unlike wasmtime-wasi's `MemoryOutputPipe`, a full pipe keeps accepting
//! (and counting) bytes: the guest never sees a write error, the way a pipe
//! drained to `/dev/null` behaves, and `total_bytes` stays exact.

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
