//! Code Mode in pods: the program's connections to its tool socket, carried
//! between the pod and the run's [`ToolSocket`](crate::backends::container)
//! on the host, so a pod's calls meet exactly the docker backend's wire,
//! bounds and bridge (grants, budgets, cancellation, the ledger).
//!
//! The pod's launcher (`launch.py`, `Relay`) listens at
//! `/run/execbox/tools.sock` in the pod. What a connection writes comes up
//! in the pod's log as records ([`FromPod`], read by `records.rs`); for
//! each connection this relay opens one of its own to the host's socket
//! and writes the bytes there. The socket's answers go down the pod's
//! attached stdin as frames `<connection> <length>\n<bytes>` (length 0:
//! the host's end closed), with `<connection> +<count>\n` each time the
//! host's socket has taken `count` more bytes of the connection. Nothing
//! here reads frames: the host's socket does, with every bound it has
//! (connections, frame size, calls in flight, unread answers), and the
//! launcher bounds the pod's side.
//!
//! Backpressure, both ways: the launcher reads a connection only while
//! the host's socket has taken all but 1 MiB of what it sent (so code
//! whose calls the socket does not take is held by its own socket, as on
//! the docker backend, and this relay holds at most that much a
//! connection); answers pass through a small queue to the one writer of
//! stdin, and a pod that stops reading stops this relay reading the
//! host's socket, whose connection is then closed for answers left
//! unread. A run's calls are at most [`MAX_TOOL_BYTES`](super::records::MAX_TOOL_BYTES).

use std::collections::HashMap;
use std::path::PathBuf;

use tokio::io::{AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::UnixStream;
use tokio::sync::mpsc;

/// A Code Mode record of the pod's log.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum FromPod {
    /// Bytes the program wrote on its connection `n` (`k`).
    Data(u32, Vec<u8>),
    /// Connection `n` writes no more (`K`): it shut its side or was closed.
    Shut(u32),
}

/// What goes down the pod's stdin for one connection.
enum ToPod {
    /// Bytes of answers; none: the host's end closed.
    Answer(u32, Vec<u8>),
    /// The host's socket took this many more bytes of the connection.
    Taken(u32, usize),
}

/// Answer chunks queued for stdin at most (each up to [`CHUNK`] bytes).
const QUEUED: usize = 8;

/// Bytes read from the host's socket at a time.
const CHUNK: usize = 64 << 10;

/// Most connections a run opens in all (16 at once): the shell's `tool`
/// command opens one a call, so a run's call budget is the usual bound;
/// past this one, a connection is closed as it comes.
const MAX_CONNECTIONS_A_RUN: usize = 1 << 16;

/// Carries `from_pod`'s connections to the host's tool socket at `socket`
/// and their answers to `stdin`. Ends once `from_pod` has closed and every
/// connection has written what came for it (or when stdin fails); every
/// connection is closed when this future is dropped.
pub(super) async fn carry(
    socket: PathBuf,
    mut from_pod: mpsc::UnboundedReceiver<FromPod>,
    mut stdin: impl AsyncWrite + Unpin,
) {
    let (answers, mut to_stdin) = mpsc::channel::<ToPod>(QUEUED);
    let mut connections: HashMap<u32, mpsc::UnboundedSender<Option<Vec<u8>>>> = HashMap::new();
    let mut tasks = tokio::task::JoinSet::new();
    // Each connection holds a clone until it has written all its calls.
    let (written, mut all_written) = mpsc::channel::<()>(1);
    // Connections that ended: bytes of theirs still in the log go nowhere,
    // never to a new connection. (The launcher numbers connections in the
    // order it accepts them, but they write in any order.)
    let mut ended = std::collections::HashSet::new();
    let route = async {
        while let Some(message) = from_pod.recv().await {
            let (number, bytes) = match message {
                FromPod::Data(number, bytes) => (number, Some(bytes)),
                FromPod::Shut(number) => (number, None),
            };
            connections.retain(|number, calls| !(calls.is_closed() && ended.insert(*number)));
            while tasks.try_join_next().is_some() {}
            if bytes.is_some() && !connections.contains_key(&number) && !ended.contains(&number) {
                if ended.len() + connections.len() >= MAX_CONNECTIONS_A_RUN {
                    // Closed at once: the launcher closes the program's end.
                    ended.insert(number);
                    let _ = answers.send(ToPod::Answer(number, Vec::new())).await;
                    continue;
                }
                let (calls, pending) = mpsc::unbounded_channel();
                tasks.spawn(connection(socket.clone(), number, pending, answers.clone(), written.clone()));
                connections.insert(number, calls);
            } else if bytes.is_none() && !connections.contains_key(&number) && !ended.contains(&number) {
                // Shut before a byte of it came: the launcher's end closes.
                let _ = answers.send(ToPod::Answer(number, Vec::new())).await;
            }
            if let Some(calls) = connections.get(&number) {
                let _ = calls.send(bytes);
            }
        }
        // The log is read: each connection writes what it has, then ends.
        connections.clear();
        drop(written);
        while all_written.recv().await.is_some() {}
    };
    let write = async {
        while let Some(message) = to_stdin.recv().await {
            let (header, bytes) = match message {
                ToPod::Answer(number, bytes) => (format!("{number} {}\n", bytes.len()), bytes),
                ToPod::Taken(number, count) => (format!("{number} +{count}\n"), Vec::new()),
            };
            if stdin.write_all(header.as_bytes()).await.is_err()
                || stdin.write_all(&bytes).await.is_err()
                || stdin.flush().await.is_err()
            {
                break;
            }
        }
    };
    // The route ends with the log and the last call written; the writer
    // only with stdin (the connections hold its queue's senders).
    tokio::select! {
        _ = route => {}
        _ = write => {}
    }
}

/// One of the pod's connections: `calls` (`None`: the program shut its
/// side) to the host's socket, its answers to `answers`; an empty answer
/// says the host's end closed.
async fn connection(
    socket: PathBuf,
    number: u32,
    mut calls: mpsc::UnboundedReceiver<Option<Vec<u8>>>,
    answers: mpsc::Sender<ToPod>,
    written: mpsc::Sender<()>,
) {
    let stream = match UnixStream::connect(&socket).await {
        Ok(stream) => stream,
        Err(e) => {
            tracing::debug!(error = %e, "cannot reach the run's tool socket");
            let _ = answers.send(ToPod::Answer(number, Vec::new())).await;
            return;
        }
    };
    let (mut reader, mut writer) = stream.into_split();
    let up = async {
        while let Some(Some(bytes)) = calls.recv().await {
            if writer.write_all(&bytes).await.is_err() || answers.send(ToPod::Taken(number, bytes.len())).await.is_err()
            {
                break;
            }
        }
        let _ = writer.shutdown().await;
        drop(written);
        // The answers still due come down; the connection ends with them.
        std::future::pending::<()>().await
    };
    let down = async {
        let mut buf = vec![0; CHUNK];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if answers.send(ToPod::Answer(number, buf[..n].to_vec())).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = answers.send(ToPod::Answer(number, Vec::new())).await;
    };
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::AsyncBufReadExt as _;

    /// An echoing "tool socket": answers every line with `got <line>`,
    /// closing after `quit`.
    async fn echo(listener: tokio::net::UnixListener) {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            tokio::spawn(async move {
                let (reader, mut writer) = stream.into_split();
                let mut lines = tokio::io::BufReader::new(reader).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if line == "quit" {
                        return;
                    }
                    let _ = writer.write_all(format!("got {line}\n").as_bytes()).await;
                }
            });
        }
    }

    type Pod = tokio::io::BufReader<tokio::io::DuplexStream>;

    /// Reads stdin frames until `n` closes, returning what came for `n`;
    /// every byte the test sent of it was said taken.
    async fn answers_of(reader: &mut Pod, n: u32, sent: usize) -> Vec<u8> {
        let mut got = Vec::new();
        let mut taken = 0;
        loop {
            let mut header = String::new();
            reader.read_line(&mut header).await.expect("a header");
            let (number, len) = header.trim_end().split_once(' ').expect("two parts");
            let number: u32 = number.parse().expect("a number");
            if let Some(count) = len.strip_prefix('+') {
                if number == n {
                    taken += count.parse::<usize>().expect("a count");
                }
                continue;
            }
            let len: u64 = len.parse().expect("a length");
            let mut bytes = vec![0; len as usize];
            reader.read_exact(&mut bytes).await.expect("the bytes");
            if number == n && len == 0 {
                assert_eq!(taken, sent, "connection {n}: bytes taken");
                return got;
            }
            if number == n {
                got.extend(bytes);
            }
        }
    }

    #[tokio::test]
    async fn connections_are_carried_both_ways_and_closed_by_either_end() {
        let dir = tempfile::tempdir().expect("a dir");
        let path = dir.path().join("tools.sock");
        tokio::spawn(echo(tokio::net::UnixListener::bind(&path).expect("bind")));
        let (tx, rx) = mpsc::unbounded_channel();
        let (stdin, pod) = tokio::io::duplex(1 << 16);
        let mut pod = tokio::io::BufReader::new(pod);
        let relay = tokio::spawn(carry(path, rx, stdin));
        // A call split across records, and a half-close: its answer still comes.
        tx.send(FromPod::Data(1, b"hel".to_vec())).expect("send");
        tx.send(FromPod::Data(1, b"lo\n".to_vec())).expect("send");
        tx.send(FromPod::Shut(1)).expect("send");
        assert_eq!(answers_of(&mut pod, 1, 6).await, b"got hello\n");
        // The host's end closing is said with an empty frame.
        tx.send(FromPod::Data(2, b"quit\n".to_vec())).expect("send");
        assert_eq!(answers_of(&mut pod, 2, 5).await, b"");
        // Connections write in any order: 6 before 5.
        tx.send(FromPod::Data(6, b"six\n".to_vec())).expect("send");
        tx.send(FromPod::Shut(6)).expect("send");
        assert_eq!(answers_of(&mut pod, 6, 4).await, b"got six\n");
        tx.send(FromPod::Data(5, b"five\n".to_vec())).expect("send");
        tx.send(FromPod::Shut(5)).expect("send");
        assert_eq!(answers_of(&mut pod, 5, 5).await, b"got five\n");
        // Bytes of an ended connection open nothing; a shut unknown one reaches nothing.
        tx.send(FromPod::Data(1, b"late\n".to_vec())).expect("send");
        tx.send(FromPod::Shut(9)).expect("send");
        tx.send(FromPod::Data(3, b"again\n".to_vec())).expect("send");
        tx.send(FromPod::Shut(3)).expect("send");
        assert_eq!(answers_of(&mut pod, 3, 6).await, b"got again\n");
        tx.send(FromPod::Data(4, b"four\n".to_vec())).expect("send");
        tx.send(FromPod::Shut(4)).expect("send");
        assert_eq!(answers_of(&mut pod, 4, 5).await, b"got four\n");
        drop(tx);
        relay.abort();
    }

    /// Once the log is read, what came for each connection is written to
    /// the host's socket before the relay ends (a call the program wrote
    /// just before it exited still runs, as a container's does).
    #[tokio::test]
    async fn the_last_calls_reach_the_host_before_the_relay_ends() {
        let dir = tempfile::tempdir().expect("a dir");
        let path = dir.path().join("tools.sock");
        let listener = tokio::net::UnixListener::bind(&path).expect("bind");
        let (tx, rx) = mpsc::unbounded_channel();
        let relay = tokio::spawn(carry(path, rx, tokio::io::sink()));
        tx.send(FromPod::Data(1, b"last call\n".to_vec())).expect("send");
        drop(tx);
        tokio::time::timeout(Duration::from_secs(5), relay).await.expect("the relay ends").expect("joins");
        let (mut stream, _) = listener.accept().await.expect("the connection");
        let mut got = Vec::new();
        stream.read_to_end(&mut got).await.expect("read");
        assert_eq!(got, b"last call\n");
    }

    /// A host socket that is gone closes the pod's connection, nothing more.
    #[tokio::test]
    async fn a_missing_socket_closes_the_connection() {
        let (tx, rx) = mpsc::unbounded_channel();
        let (stdin, pod) = tokio::io::duplex(1 << 16);
        let mut pod = tokio::io::BufReader::new(pod);
        let relay = tokio::spawn(carry(PathBuf::from("/nonexistent/tools.sock"), rx, stdin));
        tx.send(FromPod::Data(1, b"{}\n".to_vec())).expect("send");
        assert_eq!(answers_of(&mut pod, 1, 0).await, b"");
        relay.abort();
    }
}
