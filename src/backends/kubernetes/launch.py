# execbox's launcher: the first process (pid 1) of a Kubernetes run's main
# container (src/backends/kubernetes/). It starts the program, frames what
# the program writes as records on its own stdout (the pod's log), kills
# whatever of the program is left when it ends or at the deadline, lists
# /work/out, and ends with the program's status.
#
# A warm pod's launcher waits for its run on stdin first (see receive()).
# Meanwhile it has started Python already (see preload()), with a package
# pool's packages imported, waiting for its code: a run the host marks
# "preloaded" (Python without environment values or arguments) is handed
# to it; any other run (shell, or with its own environment) gets a fresh
# program, and the waiting Python is killed first.
#
# Records, one a line: "<tag> <base64>", at most 8 KiB of bytes each:
#   o / e   program stdout / stderr, until the run's cap (the rest counted)
#   l       bytes of the /work/out listing (src/backends/container/outputs.rs)
#   t       the deadline passed: everything was killed
#   x       "<status> <stdout total> <stderr total> <OOM kills, -1: unknown>"
#           in ASCII: the end
#   k / K   Code Mode: "<connection> <bytes>" the program wrote to its tool
#           socket / "<connection>": it wrote no more (see Relay)
#   q       Code Mode: the program wrote the run's most to its tool socket,
#           which is closed
# The program cannot write records itself: this process is not dumpable,
# so its stdout (/proc/1/fd/1) cannot be opened by the program's uid, and
# pid 1 of a PID namespace gets no signal it does not handle (it handles
# none: SIGINT is put back to the default below).
import base64, ctypes, json, os, select, signal, socket, sys, time

JOB = "/run/execbox/job"
CHUNK = 8192
# Python handles SIGINT, and pid 1 gets the signals it handles: back to the
# default, which pid 1 of a PID namespace never gets from inside it.
signal.signal(signal.SIGINT, signal.SIG_DFL)
spec = json.load(open(JOB + "/spec.json"))
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0


def emit(tag, data=b""):
    view = memoryview(tag + b" " + base64.b64encode(data) + b"\n")
    while view:
        view = view[os.write(1, view):]


def kill_rest():
    # pid 1 signalling -1 reaches every other process of the container.
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass
    reap()


def reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def start(argv, stdin, out_w, err_w, env, cwd):
    """Starts `argv`; `stdin` is a path, or a descriptor of this process."""
    pid = os.fork()
    if pid:
        return pid
    try:
        os.setsid()
        # Python ignores these; a program starts with the defaults.
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        fd = stdin if isinstance(stdin, int) else os.open(stdin, os.O_RDONLY)
        os.dup2(fd, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, 1 << 16)
        os.chdir(cwd)
        os.execve(argv[0], argv, env)
    except BaseException as e:
        os.write(2, ("execbox: cannot start the program: %s\n" % e).encode())
    os._exit(127)


def timed_out():
    emit(b"t")
    kill_rest()
    sys.exit(124)


def forward(stream, chunk):
    """Sends `chunk` of `stream` ([tag, cap, sent]) as far as its cap."""
    room = stream[1] - stream[2]
    if room > 0:
        emit(stream[0], chunk[:room])
    stream[2] += len(chunk)


class Relay:
    """Code Mode (the spec's "tools"): the program's connections to its
    tool socket, carried to the host, which hands them to the run's tool
    socket there (src/backends/kubernetes/relay.rs). What a connection
    writes goes up as records in the log ("k <n> <bytes>", and "K <n>" when
    it writes no more or is closed); what the host answers comes down on
    stdin as frames "<n> <length>\n<bytes>" (length 0: the host closed the
    connection), or "<n> +<count>\n": the host's socket took `count` more
    bytes of connection n. Bounded whatever the program does: at most
    MAX_TOOL_CONNECTIONS at once (one more is closed at once); a
    connection is read only while the host's socket has taken all but
    TOOL_WINDOW bytes of it (so a program whose calls are not taken is
    held by its own socket, as on the host); at most `max_bytes` written
    in all (then every connection is closed and no more are taken); a
    connection leaving more than `max_unread` bytes of answers unread is
    closed."""

    def __init__(self, tools):
        self.left = tools["max_bytes"]
        self.max_unread = tools["max_unread"]
        self.path = tools["socket"]
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(MAX_TOOL_CONNECTIONS)
        self.listener.setblocking(False)
        self.conns = {}  # descriptor -> Connection
        self.by_number = {}
        self.numbered = 0
        self.inbox = bytearray()
        self.stdin = True

    def readers(self):
        fds = [c.fd for c in self.conns.values() if c.reading and c.unacked < TOOL_WINDOW]
        if self.listener:
            fds.append(self.listener.fileno())
        return fds + ([0] if self.stdin else [])

    def writers(self):
        return [c.fd for c in self.conns.values() if c.pending]

    def owns(self, fd):
        return fd == 0 or fd in self.conns or bool(self.listener and fd == self.listener.fileno())

    def readable(self, fd):
        if fd == 0:
            return self.answers()
        if fd not in self.conns:
            return self.accept()
        conn = self.conns[fd]
        try:
            data = conn.sock.recv(CHUNK - 32)
        except BlockingIOError:
            # A descriptor closed and reused within one select's answers.
            return
        except OSError:
            data = b""
        if not data:
            conn.reading = False
            if not conn.sent:
                # The host never heard of it: nothing to wait for.
                return self.close(conn)
            emit(b"K", b"%d" % conn.number)
            if conn.closing and not conn.pending:
                self.close(conn)
        elif len(data) > self.left:
            self.exhausted()
        else:
            self.left -= len(data)
            conn.unacked += len(data)
            conn.sent = True
            emit(b"k", b"%d " % conn.number + data)

    def writable(self, fd):
        conn = self.conns.get(fd)
        if not conn:
            return
        try:
            del conn.pending[: conn.sock.send(conn.pending)]
        except BlockingIOError:
            return
        except OSError:
            return self.close(conn)
        if conn.closing and not conn.pending:
            self.close(conn)

    def accept(self):
        try:
            sock, _ = self.listener.accept()
        except OSError:
            return
        if len(self.conns) >= MAX_TOOL_CONNECTIONS:
            return sock.close()
        sock.setblocking(False)
        self.numbered += 1
        conn = Connection(sock, self.numbered)
        self.conns[conn.fd] = conn
        self.by_number[conn.number] = conn

    def answers(self):
        chunk = os.read(0, 1 << 16)
        if not chunk:
            self.stdin = False
            return
        self.inbox += chunk
        while True:
            end = self.inbox.find(b"\n", 0, 48)
            if end < 0:
                if len(self.inbox) >= 48:
                    # Not the host's framing: nothing more is read.
                    self.stdin = False
                return
            try:
                number, length = self.inbox[:end].split()
                if length.startswith(b"+"):
                    del self.inbox[: end + 1]
                    self.acked(int(number), int(length[1:]))
                    continue
                number, length = int(number), int(length)
            except ValueError:
                self.stdin = False
                return
            if len(self.inbox) < end + 1 + length:
                return
            data = bytes(self.inbox[end + 1 : end + 1 + length])
            del self.inbox[: end + 1 + length]
            self.deliver(number, data)

    def acked(self, number, count):
        conn = self.by_number.get(number)
        if conn:
            conn.unacked -= count

    def deliver(self, number, data):
        conn = self.by_number.get(number)
        if not conn:
            return
        if not data:
            conn.closing = True
            if not conn.pending:
                self.close(conn)
            return
        conn.pending += data
        if len(conn.pending) > self.max_unread:
            self.close(conn)

    def close(self, conn):
        del self.conns[conn.fd]
        del self.by_number[conn.number]
        if conn.reading and conn.sent:
            emit(b"K", b"%d" % conn.number)
        conn.sock.close()

    def exhausted(self):
        """The program wrote `max_bytes` to its tool socket: no more (the
        host is told, for the result's message)."""
        self.left = 0
        emit(b"q")
        for conn in list(self.conns.values()):
            self.close(conn)
        self.stop_listening()

    def stop_listening(self):
        if self.listener:
            self.listener.close()
            self.listener = None
            # The program (same uid) may have removed or replaced it.
            try:
                os.unlink(self.path)
            except OSError:
                pass

    def stop(self):
        for conn in list(self.conns.values()):
            conn.reading = False
            self.close(conn)
        self.stop_listening()


class Connection:
    def __init__(self, sock, number):
        self.sock, self.fd, self.number = sock, sock.fileno(), number
        self.pending = bytearray()
        # Bytes sent up that the host's socket has not taken yet.
        self.unacked = 0
        # Any were sent up (the host has a connection for it).
        self.sent = False
        # The program may still write (it has not shut its side).
        self.reading = True
        # The host closed it: it closes once its answers are written.
        self.closing = False


# The host's tool socket takes as many connections of a run at once.
MAX_TOOL_CONNECTIONS = 16
# Bytes of a connection sent up and not yet taken by the host's socket.
TOOL_WINDOW = 1 << 20


def pump(streams, child, stop_at, relay=None):
    """Reads `streams` ({fd: [tag, cap, sent]}) to their ends, carrying
    `relay`'s tool calls meanwhile; `child`'s end (a pidfd) kills the rest
    of the program. Returns the status."""
    status = None
    pidfd = os.pidfd_open(child)
    while streams or status is None:
        left = stop_at - time.time()
        if left <= 0:
            timed_out()
        watch = list(streams) + ([pidfd] if status is None else [])
        tools = relay.readers() if relay else []
        writers = relay.writers() if relay else []
        ready, out, _ = select.select(watch + tools, writers, [], min(left, 3600))  # a far deadline overflows select
        for fd in out:
            relay.writable(fd)
        for fd in ready:
            if relay and fd not in watch:
                if relay.owns(fd):
                    relay.readable(fd)
                continue
            if fd == pidfd:
                _, raw = os.waitpid(child, 0)
                status = os.waitstatus_to_exitcode(raw)
                status = 128 - status if status < 0 else status
                os.close(pidfd)
                kill_rest()
                continue
            chunk = os.read(fd, CHUNK)
            if not chunk:
                del streams[fd]
                os.close(fd)
                continue
            forward(streams[fd], chunk)
    return status


def read_exactly(fd, size, stop_at=None):
    """`size` bytes of `fd`; short at its end or at `stop_at`."""
    got = b""
    while len(got) < size:
        if stop_at is not None and not select.select([fd], [], [], max(0, stop_at - time.time()))[0]:
            break
        chunk = os.read(fd, size - len(got))
        if not chunk:
            break
        got += chunk
    return got


# What the warm bootstrap (src/backends/conventions.rs) writes once its
# packages are imported, and once it has the host's go-ahead line.
WARM_READY = b"\0execbox:warm\n"
WARM_HERE = b"\0execbox:here\n"


def preload(argv, env):
    """Starts a package pool's program before its run: `argv` is Python's
    warm bootstrap, which imports the packages, says WARM_READY and waits.
    What it writes to stderr meanwhile is kept for the run (a cold run's
    imports would have written it too). Returns (pid, stdin, stdout,
    stderr, the stderr so far); a program that does not get ready ends
    the pod."""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    child = start(argv, in_r, out_w, err_w, env, "/work")
    for fd in (in_r, out_w, err_w):
        os.close(fd)
    said, early = b"", b""
    while len(said) < len(WARM_READY):
        ready, _, _ = select.select([out_r, err_r], [], [])
        if err_r in ready:
            chunk = os.read(err_r, CHUNK)
            # Bounded: only the run's cap of it is ever sent.
            early = (early + chunk)[: 1 << 20]
            if not chunk:
                sys.exit(125)
        if out_r in ready:
            chunk = os.read(out_r, len(WARM_READY) - len(said))
            if not chunk:
                sys.exit(125)
            said += chunk
    if said != WARM_READY:
        sys.exit(125)
    return child, in_w, out_r, err_r, early


def receive(program=None):
    """A warm pod's run, from stdin (the host attaches once it claimed the
    pod): `<length>\\n` then that many bytes of JSON {"spec", "code",
    "files": [[name, base64], ...]}. The files go under /work (this pod's
    own tmpfs). Sets the run's spec; returns its code. A preloaded
    `program` that ends while the pod waits ends the pod: it can no longer
    take a run."""
    global spec
    if program:
        watched = os.pidfd_open(program)
        if watched in select.select([0, watched], [], [])[0]:
            sys.exit(125)
        os.close(watched)
    header = b""
    while not header.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte or len(header) > 20:
            sys.exit(125)
        header += byte
    left = int(header)
    parts = []
    while left:
        chunk = os.read(0, min(left, 1 << 16))
        if not chunk:
            sys.exit(125)
        parts.append(chunk)
        left -= len(chunk)
    job = json.loads(b"".join(parts))
    spec = job["spec"]
    for name, data in job["files"]:
        path = os.path.normpath(os.path.join("/work", name))
        reserved = spec.get("listing") and (path == "/work/out" or path.startswith("/work/out/"))
        if not path.startswith("/work/") or reserved:
            sys.exit(125)
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
    return base64.b64decode(job["code"])


def unlinked(code):
    """A path to `code` in a file of /tmp that no other name reaches."""
    path = "/tmp/.execbox-code"
    with open(path, "wb") as f:
        f.write(code)
    fd = os.open(path, os.O_RDONLY)
    os.unlink(path)
    return "/dev/fd/%d" % fd


def oom_kills():
    """How many times the kernel's OOM killer struck in this container's
    memory cgroup (v2, else v1); -1 when neither can be read."""
    for path, sep in (("/sys/fs/cgroup/memory.events", " "), ("/sys/fs/cgroup/memory/memory.oom_control", " ")):
        try:
            for line in open(path):
                key, _, value = line.partition(sep)
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
    return -1


def discard(preloaded):
    """Kills a preloaded program that will not run (and what it started)."""
    child, code_w, out_r, err_r, _ = preloaded
    try:
        os.killpg(child, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(child, 0)
    for fd in (code_w, out_r, err_r):
        os.close(fd)


def main():
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    preloaded = None
    # receive() replaces the pod's spec with the run's.
    warm = spec.get("warm")
    if warm:
        if spec.get("preload"):
            preloaded = preload(spec["preload"], env)
        code = receive(preloaded[0] if preloaded else None)
        if preloaded and not spec.get("preloaded"):
            discard(preloaded)
            preloaded = None
    # Its socket is there before the program starts.
    relay = Relay(spec["tools"]) if spec.get("tools") else None
    if preloaded:
        # The run has no environment values or arguments (the host said
        # so): the waiting program started exactly as its own would.
        child, code_w, out_r, err_r, early = preloaded
        # The go-ahead line, then the code, which the program reads to its
        # end. A program that died meanwhile (killed at the memory cap)
        # gives its status below.
        view = memoryview(b"?\n" + code)
        try:
            while view:
                view = view[os.write(code_w, view):]
        except BrokenPipeError:
            pass
        os.close(code_w)
        if read_exactly(out_r, len(WARM_HERE), spec["stop_at"]) != WARM_HERE and time.time() >= spec["stop_at"]:
            timed_out()
    else:
        code = unlinked(code) if warm else JOB + "/code"
        env.update(spec["env"])
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        child = start(spec["argv"], code, out_w, err_w, env, "/work")
        os.close(out_w)
        os.close(err_w)
        early = b""
    stop_at = spec["stop_at"]
    out = [b"o", spec["stdout_cap"], 0]
    err = [b"e", spec["stderr_cap"], 0]
    if early:
        forward(err, early)
    status = pump({out_r: out, err_r: err}, child, stop_at, relay)
    if relay:
        relay.stop()
    listing = spec.get("listing")
    if listing:
        list_r, list_w = os.pipe()
        lister = start(listing["argv"], "/dev/null", list_w, os.open("/dev/null", os.O_WRONLY), env, "/")
        os.close(list_w)
        pump({list_r: [b"l", listing["cap"], 0]}, lister, stop_at)
    emit(b"x", ("%d %d %d %d" % (status, out[2], err[2], oom_kills())).encode())
    sys.exit(status & 255)


main()
