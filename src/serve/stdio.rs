//! The stdio transport's flow control: no request is read while answers
//! cannot be written, and a client that reads nothing is disconnected.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How long stdout may stay unwritable (the client reads nothing) before the
/// client is disconnected.
pub(super) const WRITE_STALL_LIMIT: Duration = Duration::from_secs(10);

/// Since when writes have been blocked (ms since `epoch`; 0: not blocked).
/// While they are, no request is read (backpressure: a client that stops
/// reading answers stops being read, so nothing queues without bound).
#[derive(Default)]
pub(super) struct Stall {
    since_ms: std::sync::atomic::AtomicU64,
    epoch: std::sync::OnceLock<std::time::Instant>,
    /// The reader waiting for writes to move.
    reader: parking_lot::Mutex<Option<std::task::Waker>>,
}

impl Stall {
    fn now_ms(&self) -> u64 {
        self.epoch.get_or_init(std::time::Instant::now).elapsed().as_millis() as u64 + 1
    }

    fn blocked(&self) {
        let now = self.now_ms();
        let _ = self.since_ms.compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst);
    }

    fn moved(&self) {
        if self.since_ms.swap(0, Ordering::SeqCst) != 0
            && let Some(waker) = self.reader.lock().take()
        {
            waker.wake();
        }
    }

    /// Records what a write or flush returned, and returns it.
    fn note<T>(&self, polled: std::task::Poll<T>) -> std::task::Poll<T> {
        match polled {
            std::task::Poll::Pending => self.blocked(),
            std::task::Poll::Ready(_) => self.moved(),
        }
        polled
    }

    fn is_blocked(&self) -> bool {
        self.since_ms.load(Ordering::SeqCst) != 0
    }

    pub(super) fn stalled_for(&self) -> Duration {
        match self.since_ms.load(Ordering::SeqCst) {
            0 => Duration::ZERO,
            since => Duration::from_millis(self.now_ms().saturating_sub(since)),
        }
    }
}

/// A reader that reads nothing while the writer is blocked (see [`Stall`]).
pub(super) struct Paced<R> {
    pub(super) inner: R,
    pub(super) stall: Arc<Stall>,
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Paced<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.stall.is_blocked() {
            *self.stall.reader.lock() = Some(cx.waker().clone());
            // Moved meanwhile: its wake-up may have missed the waker.
            if self.stall.is_blocked() {
                return std::task::Poll::Pending;
            }
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

/// A writer that records when it is blocked (see [`Stall`]).
pub(super) struct Watched<W> {
    pub(super) inner: W,
    pub(super) stall: Arc<Stall>,
}

impl<W: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Watched<W> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        self.stall.note(polled)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_flush(cx);
        self.stall.note(polled)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
