//! Code Mode in containers: how code in a container reaches its run's
//! [`ToolBridge`] — a Unix socket, bind-mounted.
//!
//! **Where.** For a run whose policy grants tools (and for every session)
//! the host makes a private directory `execbox-tools-<owner>-<random>`
//! (mode 0700: no other host user reaches what is inside) holding a Unix
//! socket (mode 0666, so the container's user may connect whatever its uid)
//! and the shell's `tool` command. Only those files are bind-mounted, both
//! read-only: the socket at `/run/execbox/tools.sock` (its path is also in
//! `$EXECBOX_TOOLS`), the command at `/usr/local/bin/tool` (shell runs). A
//! socket is a filesystem object: it works under `--network=none`, which
//! stays, as does every other locked flag. A run whose policy grants no
//! tools gets none of this: its `run` arguments are exactly what they were
//! before Code Mode. A session has its socket for its whole life (its
//! cells' grants differ); a cell without a grant has every call answered
//! `not_granted`, and nothing reaches the tools.
//!
//! **Wire** (any program may speak it; Python's `tools` module, the shell's
//! `tool` command and the Rust harness's `tools` module do):
//!
//! ```text
//! code → host  {"tool_call":{"id":7,"name":"ns.tool","args":{...}}}\n
//! host → code  {"tool_result":{"id":7,"ok":true,"value":...}}\n
//! host → code  {"tool_result":{"id":7,"ok":false,"error":{"tool","kind","message"}}}\n
//! ```
//!
//! One JSON frame per line ([`ToCodeHost`](crate::tools::frame::ToCodeHost)
//! and [`ToCode`]), UTF-8, `id` and `name` before `args`. Several calls may
//! be in flight on one connection (up to the run's `max_concurrent`);
//! answers come as calls finish, matched by `id`. The built-in names
//! `tools.list` and `tools.describe` (`{"name"}`) need no grant.
//!
//! **Bounds**, whatever the code sends: at most [`MAX_CONNECTIONS`] at once
//! (one more is closed at once); a frame is read whole up to the run's
//! `max_argument_bytes` and 64 KiB, a longer one is only counted and
//! refused `invalid_arguments` by its first KiB (which must name its id and
//! name); a line that is not a call frame is answered `protocol`; a
//! connection that leaves more than two of the largest answers unread is
//! closed. Every call goes through the bridge (grant, budget, timeouts,
//! ledger). When the run (or a session's cell) ends no call is taken (each
//! is answered `cancelled`) and no answer of the ended one is sent; when the
//! [`ToolSocket`] drops, the listener and every connection are closed (on
//! execbox's tool runtime: no thread per run) before the directory is
//! removed. A host that dies leaves the directory to the watcher and the
//! sweep, like every `execbox-*` temp dir (see `owners.rs`).

use parking_lot::Mutex;
use std::io::{self, Write as _};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::Notify;
use tokio::sync::mpsc::UnboundedSender;

use super::argv::{Mount, RunSpec};
use crate::backends::conventions::{TOOL_COMMAND, TOOLS_SOCKET};
use crate::error::InvalidRequest;
use crate::limits::records::{CALL_HEAD, CallFrame};
use crate::tools::bridge::{ToolBridge, tool_runtime};
use crate::tools::frame::{ToCode, ToolResult};
use crate::tools::wire::{FRAME_OVERHEAD, Request, frame_limit, read_frame};
use crate::tools::{ToolError, ToolErrorKind};

/// The variable naming the socket inside the container.
pub(super) const TOOLS_ENV: &str = "EXECBOX_TOOLS";

/// Where a shell run that may call tools finds the `tool` command.
pub(crate) const TOOL_COMMAND_PATH: &str = "/usr/local/bin/tool";

/// Most connections open at once per run (or session). Python's `tools`
/// module and a Rust program use one each; the shell's `tool` one per call.
pub(super) const MAX_CONNECTIONS: usize = 16;

/// Bytes read from a connection at a time.
const READ_CHUNK: usize = 64 << 10;

/// Longest a drop waits for the listener's and connections' tasks to be
/// gone (they are aborted: normally within microseconds; calls are no
/// longer taken or answered from the moment the run ends either way).
const STOP_WAIT: Duration = Duration::from_millis(250);

/// The host's end of a run's (or session's) tool socket; see the module docs.
pub(crate) struct ToolSocket {
    dir: Option<tempfile::TempDir>,
    shared: Arc<Shared>,
    task: Option<tokio::task::AbortHandle>,
    /// Disconnected once the listener's task and every connection's are gone
    /// (in a mutex only to be `Sync`: used once, in `drop`).
    stopped: Mutex<mpsc::Receiver<()>>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// The id the next call goes to the bridge under. Each connection
    /// numbers its own calls (the shell's `tool` command opens one per
    /// call, each starting at 1), and the bridge tracks ids per run: every
    /// call is handed over under an id of the socket's, and its answer goes
    /// back under the connection's own.
    next_id: AtomicU64,
}

#[derive(Default)]
struct State {
    /// Bumped when a run (or cell) begins or ends: answers of another
    /// generation are not sent.
    generation: u64,
    /// Between `begin` and `end`: calls are taken and answered.
    open: bool,
    bridge: Option<Arc<ToolBridge>>,
}

impl Shared {
    /// The generation and bridge calls go to now; `None` between runs.
    fn current(&self) -> Option<(u64, Option<Arc<ToolBridge>>)> {
        let state = self.state.lock();
        state.open.then(|| (state.generation, state.bridge.clone()))
    }

    fn is_current(&self, generation: u64) -> bool {
        let state = self.state.lock();
        state.open && state.generation == generation
    }

    /// Most bytes of one frame read whole now.
    fn frame_limit(&self) -> u64 {
        frame_limit(self.state.lock().bridge.as_deref())
    }

    /// Most calls of one connection in flight now (the run's
    /// `max_concurrent`; 1 between cells, whose calls are answered at once).
    fn max_concurrent(&self) -> u64 {
        self.state.lock().bridge.as_deref().map_or(1, |b| u64::from(b.limits().max_concurrent))
    }
}

/// Most bytes of answers a connection may leave unread before it is
/// closed: the code's `tools` API reads each answer before its next call,
/// so only code that writes calls and ignores their answers gets here.
/// Room for two of the largest answers (one answer alone, of any size, is
/// always queued).
pub(crate) fn unread_limit(bridge: Option<&ToolBridge>) -> u64 {
    bridge.map_or(0, |b| b.limits().max_result_bytes).saturating_add(FRAME_OVERHEAD).saturating_mul(2)
}

impl ToolSocket {
    /// Makes the directory, binds the socket and starts listening (on
    /// execbox's tool runtime). Calls are refused `cancelled` until
    /// [`ToolSocket::begin`].
    pub(crate) fn start() -> io::Result<Self> {
        let runtime = tool_runtime().ok_or_else(|| io::Error::other("execbox's tool runtime could not start"))?;
        let dir = crate::owner::temp_dir("tools")?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))?;
        let socket = dir.path().join("tools.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket)?;
        // Reachable only through the 0700 directory on the host; inside the
        // container by its user, whatever its uid.
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666))?;
        listener.set_nonblocking(true)?;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o755)
            .open(dir.path().join("tool"))?
            .write_all(TOOL_COMMAND.as_bytes())?;
        let shared = Arc::new(Shared::default());
        let (alive, stopped) = mpsc::channel();
        let task = runtime.spawn(serve(listener, shared.clone(), alive));
        Ok(Self { dir: Some(dir), shared, task: Some(task.abort_handle()), stopped: Mutex::new(stopped) })
    }

    /// The host directory holding the socket and the command.
    fn dir(&self) -> PathBuf {
        self.dir.as_ref().map(|d| d.path().to_path_buf()).unwrap_or_default()
    }

    /// The socket's path on the host (where the kubernetes backend's relay
    /// connects for its pod's connections).
    #[cfg(feature = "kubernetes")]
    pub(crate) fn path(&self) -> PathBuf {
        self.dir().join("tools.sock")
    }

    /// Gives `spec` the socket (read-only, at [`TOOLS_SOCKET`]), its
    /// variable ([`TOOLS_ENV`]) and, with `command`, the `tool` command (at
    /// [`TOOL_COMMAND_PATH`]). Refuses a granted directory mounted where
    /// one of them goes or above it (the engine would make their mount
    /// points inside the host's directory).
    pub fn attach(&self, spec: &mut RunSpec, command: bool) -> Result<(), InvalidRequest> {
        let dir = self.dir();
        let mut mounts = vec![Mount { host: dir.join("tools.sock"), guest: TOOLS_SOCKET.into(), writable: false }];
        if command {
            mounts.push(Mount { host: dir.join("tool"), guest: TOOL_COMMAND_PATH.into(), writable: false });
        }
        for ours in &mounts {
            if let Some(grant) = spec.mounts.iter().find(|m| Path::new(&ours.guest).starts_with(&m.guest)) {
                return Err(InvalidRequest::BadPath {
                    path: grant.guest.clone(),
                    reason: format!("covers {}, where a run that may call tools has its tool socket", ours.guest),
                });
            }
        }
        spec.mounts.extend(mounts);
        spec.env.push((TOOLS_ENV.into(), TOOLS_SOCKET.into()));
        Ok(())
    }

    /// A run (or a session's cell) begins: its calls go to `bridge` (none:
    /// every call answers `not_granted`).
    pub(crate) fn begin(&self, bridge: Option<Arc<ToolBridge>>) {
        let mut state = self.shared.state.lock();
        *state = State { generation: state.generation + 1, open: true, bridge };
    }

    /// The run (or cell) ended: calls are answered `cancelled`, and no
    /// answer of the ended run is sent.
    pub fn end(&self) {
        let mut state = self.shared.state.lock();
        *state = State { generation: state.generation + 1, ..State::default() };
    }
}

impl Drop for ToolSocket {
    /// Ends the run, closes the listener and every connection (waiting,
    /// briefly, for their tasks to be gone) and removes the directory.
    fn drop(&mut self) {
        self.end();
        if let Some(task) = self.task.take() {
            task.abort();
        }
        if let Err(mpsc::RecvTimeoutError::Timeout) = self.stopped.get_mut().recv_timeout(STOP_WAIT) {
            tracing::warn!("a tool socket's tasks were not gone within {STOP_WAIT:?}");
        }
        if let Some(dir) = self.dir.take() {
            let path = dir.path().to_path_buf();
            if let Err(e) = dir.close() {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove a tool socket's directory");
            }
        }
    }
}

/// Accepts connections until aborted; each runs as its own task (aborted
/// with this one). `alive` (and its clones) drop with the tasks.
async fn serve(listener: std::os::unix::net::UnixListener, shared: Arc<Shared>, alive: mpsc::Sender<()>) {
    let listener = match tokio::net::UnixListener::from_std(listener) {
        Ok(listener) => listener,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen on a tool socket: its calls get no answer");
            return;
        }
    };
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                // Connections that ended are not counted.
                Ok((stream, _)) if reaped(&mut connections) < MAX_CONNECTIONS => {
                    connections.spawn(connection(stream, shared.clone(), alive.clone()));
                }
                Ok(_) => tracing::debug!("a tool socket has {MAX_CONNECTIONS} connections: one more is closed"),
                Err(e) => {
                    // Out of descriptors, say: try again in a moment.
                    tracing::debug!(error = %e, "a tool socket cannot accept");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// How many connections run, once those that ended are joined.
fn reaped(connections: &mut tokio::task::JoinSet<()>) -> usize {
    while connections.try_join_next().is_some() {}
    connections.len()
}

/// What a connection's answers share.
struct Link {
    /// Bytes of answers queued and not yet written.
    queued: AtomicU64,
    /// Too many unread: the connection is closed.
    overflow: Notify,
    /// Calls of this connection handed to the bridge and not yet answered.
    in_flight: AtomicU64,
    /// A call of this connection was answered (or dropped).
    freed: Notify,
    /// The ids of this connection's calls in flight, with the run (or
    /// cell) they belong to: one it reuses within that run is refused
    /// (`protocol`), as the bridge refuses within one run; a later run may
    /// use it again, whether or not the ended run's call has let go yet.
    ids: Mutex<std::collections::HashSet<(u64, u64)>>,
}

impl Link {
    /// Waits until fewer than `max` calls of this connection are in flight:
    /// the connection is not read further meanwhile, so code that writes
    /// calls faster than they run fills its own socket buffer, not the
    /// host's memory.
    async fn room(&self, max: u64) {
        while self.in_flight.load(Ordering::SeqCst) >= max.max(1) {
            // notify_one keeps a permit: a call freed between the check
            // and this wait still wakes it.
            self.freed.notified().await;
        }
    }
}

/// One call of a connection in flight, until its answer is queued or the
/// call is dropped unanswered (its run ended): either way, dropped.
struct InFlight(Arc<Link>);

impl InFlight {
    fn new(link: &Arc<Link>) -> Self {
        link.in_flight.fetch_add(1, Ordering::SeqCst);
        Self(link.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.0.freed.notify_one();
    }
}

/// One connection: frames in (each handed to the bridge as it is read),
/// answers out, until the code closes it, leaves too many answers unread,
/// or the socket drops.
async fn connection(stream: tokio::net::UnixStream, shared: Arc<Shared>, _alive: mpsc::Sender<()>) {
    let (mut reader, mut writer) = stream.into_split();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let link = Arc::new(Link {
        queued: AtomicU64::new(0),
        overflow: Notify::new(),
        in_flight: AtomicU64::new(0),
        freed: Notify::new(),
        ids: Mutex::new(Default::default()),
    });
    let read = async {
        let mut framer = Framer::default();
        let mut chunk = vec![0u8; READ_CHUNK];
        let mut frames = Vec::new();
        loop {
            link.room(shared.max_concurrent()).await;
            let n = match reader.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            framer.feed(&chunk[..n], shared.frame_limit(), &mut frames);
            for frame in frames.drain(..) {
                take(&shared, &link, &tx, frame);
            }
        }
        // Answers still due go out; the writer ends with the last of them.
        drop(tx);
    };
    let write = async {
        while let Some(bytes) = rx.recv().await {
            if writer.write_all(&bytes).await.is_err() {
                break;
            }
            link.queued.fetch_sub(bytes.len() as u64, Ordering::SeqCst);
        }
    };
    tokio::select! {
        _ = async { tokio::join!(read, write) } => {}
        _ = link.overflow.notified() => tracing::debug!("code left its tool answers unread: its connection is closed"),
    }
}

/// Hands one frame to the bridge of the run (or cell) in progress; its
/// answer is queued on the connection if that run is still in progress.
fn take(shared: &Arc<Shared>, link: &Arc<Link>, tx: &UnboundedSender<Vec<u8>>, frame: CallFrame) {
    let request = read_frame(frame);
    let Some((generation, bridge)) = shared.current() else {
        let (id, name) = match &request {
            Request::Call(call) => (call.id, call.name.clone()),
            Request::TooLarge { id, name, .. } => (*id, name.clone()),
            Request::Malformed { id, .. } => (*id, String::new()),
        };
        let over = ToolError::new(name, ToolErrorKind::Cancelled, "the run (or the session's cell) is over");
        return queue(link, tx, ToolResult::error(id, over), 0);
    };
    let limit = unread_limit(bridge.as_deref());
    // The connection's own id, and the socket's the bridge sees.
    let (request, own) = match request {
        Request::Call(mut call) => {
            let own = call.id;
            if !link.ids.lock().insert((generation, own)) {
                let error = ToolError::new(
                    &call.name,
                    ToolErrorKind::Protocol,
                    format!("call id {own} is already in flight on this connection"),
                );
                return queue(link, tx, ToolResult::error(own, error), limit);
            }
            call.id = shared.next_id.fetch_add(1, Ordering::Relaxed);
            (Request::Call(call), Some(OwnId { link: link.clone(), generation, id: own }))
        }
        other => (other, None),
    };
    let (shared, link, tx) = (shared.clone(), link.clone(), tx.clone());
    let in_flight = InFlight::new(&link);
    request.dispatch(bridge.as_ref(), move |mut result| {
        if let Some(own) = &own {
            result.id = own.id;
        }
        drop(own);
        drop(in_flight);
        if shared.is_current(generation) {
            queue(&link, &tx, result, limit);
        }
    });
}

/// A call's id on its connection, in flight until this drops: when its
/// answer is queued, or when it is dropped unanswered (its run ended), so
/// the connection may use the id again.
struct OwnId {
    link: Arc<Link>,
    generation: u64,
    id: u64,
}

impl Drop for OwnId {
    fn drop(&mut self) {
        self.link.ids.lock().remove(&(self.generation, self.id));
    }
}

/// Queues `result` as one line, or closes the connection when it would
/// leave more than `limit` bytes unread.
fn queue(link: &Link, tx: &UnboundedSender<Vec<u8>>, result: ToolResult, limit: u64) {
    // A ToolResult always serializes (its value is JSON already).
    let mut line = serde_json::to_vec(&ToCode::ToolResult(result)).unwrap_or_default();
    line.push(b'\n');
    let len = line.len() as u64;
    let before = link.queued.fetch_add(len, Ordering::SeqCst);
    if before > 0 && before + len > limit {
        link.overflow.notify_one();
        return;
    }
    drop(tx.send(line));
}

/// Splits a connection's bytes into lines, each a call frame: kept whole up
/// to the limit, else only its first [`CALL_HEAD`] bytes and its length.
/// Blank lines are skipped.
#[derive(Default)]
struct Framer {
    line: Vec<u8>,
    /// Bytes of the line so far.
    len: u64,
    /// The line went past the limit (only its head is kept).
    long: bool,
}

impl Framer {
    fn feed(&mut self, mut bytes: &[u8], limit: u64, frames: &mut Vec<CallFrame>) {
        while !bytes.is_empty() {
            let (part, rest, ended) = match bytes.iter().position(|&b| b == b'\n') {
                Some(at) => (&bytes[..at], &bytes[at + 1..], true),
                None => (bytes, &[][..], false),
            };
            self.len += part.len() as u64;
            if !self.long && self.len > limit {
                self.long = true;
                self.line.truncate(CALL_HEAD);
                self.line.shrink_to_fit();
            }
            let keep = if self.long { CALL_HEAD.saturating_sub(self.line.len()).min(part.len()) } else { part.len() };
            self.line.extend_from_slice(&part[..keep]);
            if ended {
                let line = std::mem::take(&mut self.line);
                let len = std::mem::take(&mut self.len);
                if std::mem::take(&mut self.long) {
                    frames.push(CallFrame::TooLarge { head: line, len });
                } else if !line.iter().all(u8::is_ascii_whitespace) {
                    frames.push(CallFrame::Whole(line));
                }
            }
            bytes = rest;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read};
    use std::os::unix::net::UnixStream;
    use std::time::Instant;

    use serde_json::{Value, json};

    use super::*;
    use crate::limits::deadline::Deadline;
    use crate::tools::{ToolLimits, ToolRegistry, ToolSpec};

    #[test]
    fn lines_are_framed_whole_or_by_their_head() {
        let mut framer = Framer::default();
        let mut frames = Vec::new();
        framer.feed(b"{\"a\":1}\n\n  \n{\"b\"", 100, &mut frames);
        framer.feed(b":2}\n", 100, &mut frames);
        assert_eq!(frames, [CallFrame::Whole(b"{\"a\":1}".to_vec()), CallFrame::Whole(b"{\"b\":2}".to_vec())]);
        frames.clear();
        let long = vec![b'x'; 5000];
        framer.feed(&long, 100, &mut frames);
        framer.feed(&long, 100, &mut frames);
        assert!(frames.is_empty());
        assert!(framer.line.len() <= CALL_HEAD && framer.line.capacity() <= 4 * CALL_HEAD, "only the head is kept");
        framer.feed(b"\n{}\n", 100, &mut frames);
        assert_eq!(
            frames,
            [CallFrame::TooLarge { head: vec![b'x'; CALL_HEAD], len: 10_000 }, CallFrame::Whole(b"{}".to_vec())]
        );
    }

    fn socket_with(limits: ToolLimits) -> (ToolSocket, Arc<ToolBridge>) {
        let registry = ToolRegistry::builder()
            .tool(ToolSpec::new("math.add"), |args: Value| async move {
                Ok(json!(args["a"].as_i64().unwrap_or(0) + args["b"].as_i64().unwrap_or(0)))
            })
            .tool(ToolSpec::new("big.blob"), |_: Value| async { Ok(json!("x".repeat(200 << 10))) })
            .tool(ToolSpec::new("big.echo"), |args: Value| async move { Ok(args) })
            .tool(ToolSpec::new("math.slow"), |args: Value| async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok(args["n"].clone())
            })
            .build()
            .unwrap();
        let deadline = Deadline::start(Some(Duration::from_secs(30)));
        let bridge = ToolBridge::new(registry, vec!["math.*".into(), "big.*".into()], limits, deadline);
        let socket = ToolSocket::start().expect("a socket");
        socket.begin(Some(bridge.clone()));
        (socket, bridge)
    }

    fn connect(socket: &ToolSocket) -> (UnixStream, BufReader<UnixStream>) {
        let stream = UnixStream::connect(socket.dir().join("tools.sock")).expect("connects");
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let reader = BufReader::new(stream.try_clone().unwrap());
        (stream, reader)
    }

    fn answer(reader: &mut BufReader<UnixStream>) -> Value {
        let mut line = String::new();
        reader.read_line(&mut line).expect("an answer");
        serde_json::from_str::<Value>(&line).expect("JSON")["tool_result"].take()
    }

    #[test]
    fn calls_are_answered_on_their_connection_and_stop_when_the_run_ends() {
        let (socket, bridge) = socket_with(ToolLimits::default());
        let dir = socket.dir();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "only the host user reaches the socket");
        let (mut stream, mut reader) = connect(&socket);
        stream.write_all(b"{\"tool_call\":{\"id\":1,\"name\":\"math.add\",\"args\":{\"a\":2,\"b\":3}}}\n").unwrap();
        assert_eq!(answer(&mut reader), json!({"id": 1, "ok": true, "value": 5}));
        stream.write_all(b"{\"tool_call\":{\"id\":2,\"name\":\"tools.list\"}}\nnot json\n").unwrap();
        assert_eq!(answer(&mut reader)["value"], json!(["big.blob", "big.echo", "math.add", "math.slow"]));
        assert_eq!(answer(&mut reader)["error"]["kind"], "protocol");
        // A frame over the limit is refused by its head.
        let huge = format!(
            "{{\"tool_call\":{{\"id\":3,\"name\":\"math.add\",\"args\":{{\"s\":\"{}\"}}}}}}\n",
            "x".repeat(1 << 20)
        );
        stream.write_all(huge.as_bytes()).unwrap();
        let refused = answer(&mut reader);
        assert_eq!((refused["id"].clone(), refused["error"]["kind"].clone()), (json!(3), json!("invalid_arguments")));
        socket.end();
        stream.write_all(b"{\"tool_call\":{\"id\":4,\"name\":\"math.add\",\"args\":{}}}\n").unwrap();
        assert_eq!(answer(&mut reader)["error"]["kind"], "cancelled");
        let (ledger, _) = bridge.finish();
        assert_eq!(ledger.len(), 2, "{ledger:?}");
        drop(socket);
        assert!(!dir.exists(), "the directory goes with the socket");
        let mut rest = Vec::new();
        let started = Instant::now();
        assert_eq!(reader.read_to_end(&mut rest).unwrap_or(0), 0, "the connection is closed");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn connections_are_bounded_and_one_that_does_not_read_is_closed() {
        let (socket, _bridge) = socket_with(ToolLimits::default().max_calls(10_000).max_concurrent(10_000));
        let mut held: Vec<_> = (0..MAX_CONNECTIONS).map(|_| connect(&socket)).collect();
        // Each of those is served; one more is closed at once.
        let (mut extra, mut extra_reader) = connect(&socket);
        let _ = extra.write_all(b"{\"tool_call\":{\"id\":1,\"name\":\"tools.list\"}}\n");
        let mut line = String::new();
        assert_eq!(extra_reader.read_line(&mut line).unwrap_or(0), 0, "{line}");
        let (stream, reader) = &mut held[0];
        stream.write_all(b"{\"tool_call\":{\"id\":1,\"name\":\"tools.list\"}}\n").unwrap();
        assert_eq!(answer(reader)["id"], 1);
        // Calls whose answers are never read: the connection is closed
        // before the host holds more than two large answers.
        let (stream, reader) = &mut held[1];
        stream.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut closed = false;
        for id in 0..2000 {
            let call = format!("{{\"tool_call\":{{\"id\":{id},\"name\":\"big.blob\",\"args\":{{}}}}}}\n");
            if stream.write_all(call.as_bytes()).is_err() {
                closed = true;
                break;
            }
        }
        let mut sink = Vec::new();
        let read = reader.get_mut().read_to_end(&mut sink);
        assert!(closed || read.is_ok(), "the connection ends");
        assert!(sink.len() < 64 << 20, "{} bytes of answers", sink.len());
    }

    /// Each connection numbers its own calls (the shell's `tool` command
    /// opens one per call, each with id 1): calls of different connections
    /// in flight at once never collide; a connection that reuses an id of
    /// its own in flight is refused.
    #[test]
    fn connections_number_their_own_calls() {
        let (socket, bridge) = socket_with(ToolLimits::default());
        let mut links: Vec<_> = (0..4).map(|_| connect(&socket)).collect();
        for (n, (stream, _)) in links.iter_mut().enumerate() {
            let call = format!("{{\"tool_call\":{{\"id\":1,\"name\":\"math.slow\",\"args\":{{\"n\":{n}}}}}}}\n");
            stream.write_all(call.as_bytes()).unwrap();
        }
        for (n, (_, reader)) in links.iter_mut().enumerate() {
            assert_eq!(answer(reader), json!({"id": 1, "ok": true, "value": n}), "connection {n}");
        }
        let (stream, reader) = &mut links[0];
        // One write: both are read while the first (300 ms) is in flight.
        let slow = b"{\"tool_call\":{\"id\":5,\"name\":\"math.slow\",\"args\":{\"n\":5}}}\n";
        stream.write_all(&[&slow[..], &slow[..]].concat()).unwrap();
        let first = answer(reader);
        assert_eq!((first["id"].clone(), first["error"]["kind"].clone()), (json!(5), json!("protocol")), "{first}");
        assert_eq!(answer(reader), json!({"id": 5, "ok": true, "value": 5}));
        // Five calls ran (the refused reuse is not one).
        assert_eq!(bridge.finish().0.len(), 5);
    }

    /// A call the run ended before it answered does not hold its id: the
    /// connection (a session's lives across cells) may use it in the next.
    #[test]
    fn an_id_the_run_ended_is_free_again() {
        let (socket, _) = socket_with(ToolLimits::default());
        let (mut stream, mut reader) = connect(&socket);
        stream.write_all(b"{\"tool_call\":{\"id\":9,\"name\":\"math.slow\",\"args\":{\"n\":1}}}\n").unwrap();
        // In flight: its id is taken on this connection.
        stream.write_all(b"{\"tool_call\":{\"id\":9,\"name\":\"math.add\",\"args\":{}}}\n").unwrap();
        assert_eq!(answer(&mut reader)["error"]["kind"], "protocol");
        socket.end();
        let registry =
            ToolRegistry::builder().tool(ToolSpec::new("math.add"), |_: Value| async { Ok(json!(3)) }).build().unwrap();
        let deadline = Deadline::start(Some(Duration::from_secs(30)));
        socket.begin(Some(ToolBridge::new(registry, vec!["math.*".into()], ToolLimits::default(), deadline)));
        stream.write_all(b"{\"tool_call\":{\"id\":9,\"name\":\"math.add\",\"args\":{}}}\n").unwrap();
        assert_eq!(answer(&mut reader), json!({"id": 9, "ok": true, "value": 3}));
    }

    #[test]
    fn a_connection_that_sends_large_calls_and_reads_nothing_is_closed() {
        let (socket, _bridge) = socket_with(ToolLimits::default().max_calls(10_000));
        let (mut stream, _reader) = connect(&socket);
        stream.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
        let arg = "z".repeat(60_000);
        let started = Instant::now();
        // Distinct ids: a call reusing the id of one in flight is refused at once.
        let sent = (0..400)
            .take_while(|id| {
                let call =
                    format!("{{\"tool_call\":{{\"id\":{id},\"name\":\"big.echo\",\"args\":{{\"s\":\"{arg}\"}}}}}}\n");
                stream.write_all(call.as_bytes()).is_ok()
            })
            .count();
        assert!(sent < 400, "the host read all {sent} calls of a connection that reads nothing");
        assert!(started.elapsed() < Duration::from_secs(15), "closed, not left to a write timeout");
    }
}
