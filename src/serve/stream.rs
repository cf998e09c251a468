//! Output while a call runs: stdout/stderr lines as MCP logging
//! notifications (when the client set a log level) and progress
//! notifications (when it sent a progress token).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rmcp::model::{LoggingLevel, LoggingMessageNotificationParam, ProgressNotificationParam, ProgressToken};
use rmcp::service::{Peer, RoleServer};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::limits::output::{OutputTap, StreamKind};

/// Chunks in flight between a run's threads and the notifier; past this,
/// chunks are dropped (and counted), never queued without bound.
const CHANNEL_CHUNKS: usize = 256;

/// Bytes in flight between a run's threads and the notifier, at most.
const CHANNEL_BYTES: usize = 1 << 20;

/// How long a finished run's remaining lines may take to go out; the rest
/// is dropped (and counted): a client that reads slowly cannot make calls
/// pile up notifiers.
const FINISH_LIMIT: Duration = Duration::from_secs(1);

/// A line longer than this is sent in pieces.
const MAX_LINE_BYTES: usize = 16 << 10;

/// Streams one run's output to the client as `notifications/message`.
pub struct LineStream {
    tap: OutputTap,
    dropped: Arc<AtomicU64>,
    queued: Arc<AtomicU64>,
    done: tokio::sync::oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl LineStream {
    /// Starts the notifier; the tap goes on the request.
    pub fn start(peer: Peer<RoleServer>, level: LoggingLevel) -> Self {
        let (tx, rx) = mpsc::channel::<(StreamKind, Vec<u8>)>(CHANNEL_CHUNKS);
        let dropped = Arc::new(AtomicU64::new(0));
        let queued = Arc::new(AtomicU64::new(0));
        let (counter, in_flight) = (dropped.clone(), queued.clone());
        let tap = OutputTap::new(move |kind, bytes| {
            let n = bytes.len() as u64;
            let room = in_flight.fetch_add(n, Ordering::SeqCst) + n <= CHANNEL_BYTES as u64;
            if !room || tx.try_send((kind, bytes.to_vec())).is_err() {
                in_flight.fetch_sub(n, Ordering::SeqCst);
                counter.fetch_add(n, Ordering::Relaxed);
            }
        });
        let (done, finished) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(notify_lines(peer, level, rx, finished, queued.clone()));
        Self { tap, dropped, queued, done, task }
    }

    /// The tap to put on the request.
    pub fn tap(&self) -> OutputTap {
        self.tap.clone()
    }

    /// After the run returned: sends what is still queued, then reports
    /// what was dropped. A backend that keeps a clone of the tap (an
    /// abandoned instance) cannot hold this up.
    pub async fn finish(self, peer: &Peer<RoleServer>, level: LoggingLevel) {
        let LineStream { tap, dropped, queued, done, task } = self;
        drop(tap);
        let _ = done.send(());
        let abort = task.abort_handle();
        if tokio::time::timeout(FINISH_LIMIT, task).await.is_err() {
            // Whatever is still queued is dropped with the task.
            abort.abort();
            dropped.fetch_add(queued.swap(0, Ordering::SeqCst), Ordering::Relaxed);
        }
        let dropped = dropped.load(Ordering::Relaxed);
        if dropped > 0 {
            let note = format!(
                "{dropped} bytes of output were not streamed (the client read too slowly); the result holds what the caps kept"
            );
            let _ = tokio::time::timeout(FINISH_LIMIT, send(peer, level, "execbox", json!({"note": note}))).await;
        }
    }
}

/// Splits chunks into lines per stream and sends each.
async fn notify_lines(
    peer: Peer<RoleServer>,
    level: LoggingLevel,
    mut rx: mpsc::Receiver<(StreamKind, Vec<u8>)>,
    mut finished: tokio::sync::oneshot::Receiver<()>,
    queued: Arc<AtomicU64>,
) {
    let mut pending: [Vec<u8>; 2] = [Vec::new(), Vec::new()];
    let mut running = true;
    loop {
        let chunk = if running {
            tokio::select! {
                chunk = rx.recv() => chunk,
                _ = &mut finished => {
                    running = false;
                    continue;
                }
            }
        } else {
            // The run is over: what is queued now is all there is.
            rx.try_recv().ok()
        };
        let Some((kind, bytes)) = chunk else { break };
        queued.fetch_sub(bytes.len() as u64, Ordering::SeqCst);
        let buf = &mut pending[kind as usize];
        buf.extend_from_slice(&bytes);
        while let Some(end) =
            buf.iter().position(|&b| b == b'\n').or_else(|| (buf.len() >= MAX_LINE_BYTES).then_some(MAX_LINE_BYTES))
        {
            let rest = buf.split_off((end + 1).min(buf.len()));
            let line = std::mem::replace(buf, rest);
            send_line(&peer, level, kind, &line).await;
        }
    }
    for (kind, buf) in [(StreamKind::Stdout, &pending[0]), (StreamKind::Stderr, &pending[1])] {
        if !buf.is_empty() {
            send_line(&peer, level, kind, buf).await;
        }
    }
}

async fn send_line(peer: &Peer<RoleServer>, level: LoggingLevel, kind: StreamKind, line: &[u8]) {
    let text = String::from_utf8_lossy(line);
    let text = text.strip_suffix('\n').unwrap_or(&text);
    let stream = match kind {
        StreamKind::Stdout => "stdout",
        StreamKind::Stderr => "stderr",
    };
    send(peer, level, stream, json!({"stream": stream, "text": text})).await;
}

async fn send(peer: &Peer<RoleServer>, level: LoggingLevel, logger: &str, data: serde_json::Value) {
    let message = LoggingMessageNotificationParam::new(level, data).with_logger(logger);
    if let Err(e) = peer.notify_logging_message(message).await {
        tracing::debug!(error = %e, "a logging notification was not sent");
    }
}

/// Sends `notifications/progress` every second while a run lasts.
pub fn start_progress(peer: Peer<RoleServer>, token: ProgressToken, timeout: Duration) -> JoinHandle<()> {
    tokio::spawn(async move {
        let start = Instant::now();
        let total = timeout.as_secs_f64() * 1e3;
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let elapsed = start.elapsed().as_secs_f64() * 1e3;
            let mut progress = ProgressNotificationParam::new(token.clone(), elapsed.min(total));
            progress.total = Some(total);
            progress.message = Some(format!("running for {:.0} ms of at most {total:.0} ms", elapsed));
            if peer.notify_progress(progress).await.is_err() {
                return;
            }
        }
    })
}
