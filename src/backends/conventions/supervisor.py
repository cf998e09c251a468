# execbox's program supervisor: the one process a workspace's program
# container runs (under its in-container timer). It starts programs, relays
# their output and input, signals and kills them, all on the host's word:
# JSON lines on stdin, JSON lines on stdout. It is not a trust boundary (the
# container is): the host bounds what it believes of these lines.
#
# Each program runs under a shim: a forked copy of this process that is a
# child subreaper, so every process the program starts (a double-forked
# daemon too) stays in the shim's tree. When the program's first process
# ends, the shim kills the rest of its tree and exits with the program's
# status (128 + the signal when killed), so nothing a program started
# outlives it. The supervisor is a child subreaper too, and its only
# children are shims: a process that comes to it (its shim was killed, by
# the program itself maybe) is killed with its tree. The supervisor and the
# shims are not dumpable: a program (same uid) cannot ptrace them or reach
# their descriptors.
#
# End of stdin (the host is gone) kills every program and ends the container.
import base64, ctypes, fcntl, json, os, selectors, signal, struct, sys, termios, time

PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER = 4, 36
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
out = sys.stdout.buffer
MAX_PENDING = 4 << 20
# What a program's end may still have in its pipe, read before its exit is
# sent; past it the rest is dropped (a process that inherited the pipe may
# write on).
MAX_FINAL_DRAIN = 4 << 20


def send(**event):
    out.write(json.dumps(event, separators=(',', ':')).encode() + b'\n')
    out.flush()


def children(pid):
    """The pids whose parent is `pid` (every thread's children)."""
    found = []
    try:
        for task in os.listdir('/proc/%d/task' % pid):
            try:
                with open('/proc/%d/task/%s/children' % (pid, task)) as f:
                    found.extend(int(p) for p in f.read().split())
            except OSError:
                pass
    except OSError:
        pass
    return found


def zombie(pid):
    try:
        with open('/proc/%d/stat' % pid) as f:
            return f.read().rsplit(')', 1)[1].split()[0] == 'Z'
    except (OSError, IndexError):
        return True


def kill_tree(root, include_root):
    """SIGKILLs every descendant of `root` (and `root`), round after round
    until none but zombies is left: a process forking while it is killed
    loses. Zombies are dead already (a stopped parent has not reaped them)."""
    for _ in range(10000):
        stack, seen = [root], []
        while stack:
            pid = stack.pop()
            kids = children(pid)
            stack.extend(kids)
            seen.extend(kid for kid in kids if not zombie(kid))
        for pid in seen:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if os.getpid() == root:
            while True:
                try:
                    if os.waitpid(-1, os.WNOHANG)[0] == 0:
                        break
                except ChildProcessError:
                    break
        if not seen:
            break
        time.sleep(0.001)
    if include_root:
        try:
            os.kill(root, signal.SIGKILL)
        except OSError:
            pass


def status_code(status):
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def run_shim(m, fds, report_w):
    """In the forked shim: start the program, wait for it, end its tree."""
    try:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        stdin_fd, output_fd, tty = fds
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_IGN)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        main = os.fork()
        if main == 0:
            try:
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
                    signal.signal(sig, signal.SIG_DFL)
                os.setsid()
                os.dup2(stdin_fd, 0)
                os.dup2(output_fd, 1)
                os.dup2(output_fd, 2)
                if tty:
                    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
                os.closerange(3, report_w)
                os.closerange(report_w + 1, 65536)
                os.set_inheritable(report_w, False)
                try:
                    os.chdir(m['cwd'])
                except OSError as e:
                    os.write(report_w, ('cannot enter %s: %s' % (m['cwd'], e.strerror)).encode()[:4096])
                    os._exit(127)
                env = dict(os.environ)
                env.update(m['env'])
                os.execvpe(m['argv'][0], m['argv'], env)
            except BaseException as e:
                try:
                    os.write(report_w, ('%s: %s' % (m['argv'][0], e)).encode()[:4096])
                finally:
                    os._exit(127)
        os.write(report_w, struct.pack('<q', main))
        os.close(report_w)
        null = os.open('/dev/null', os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, 65536)
        code = 255
        while True:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            if pid == main:
                code = status_code(status)
                break
        kill_tree(os.getpid(), False)
        os._exit(code)
    except BaseException:
        os._exit(255)


class Program:
    def __init__(self, ident, shim, main, read_fd, write_fd, tty):
        self.id, self.shim, self.main, self.tty = ident, shim, main, tty
        self.read_fd, self.write_fd = read_fd, write_fd
        self.pending = b''
        self.eof_asked = False
        self.code = None  # the shim's status, once reaped


programs = {}
by_fd = {}
sel = selectors.DefaultSelector()


def start(m):
    """Starts program `m`; a start that fails here (no fork: the process
    cap is full) ends it at once, with the reason as its output."""
    opened = []
    try:
        start_program(m, opened)
    except Exception as e:
        for fd in opened:
            try:
                os.close(fd)
            except OSError:
                pass
        send(e='failed', id=m.get('id'), error=str(e)[:512])
        send(e='exit', id=m.get('id'), code=126)


def start_program(m, opened):
    ident = m['id']
    tty = bool(m.get('tty'))
    if tty:
        master, slave = os.openpty()
        opened += [master, slave]
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack('HHHH', 24, 80, 0, 0))
        write_fd = os.dup(master)
        opened.append(write_fd)
        read_fd, child_fds, close_after = master, (slave, slave, True), [slave]
    else:
        in_r, in_w = os.pipe()
        opened += [in_r, in_w]
        out_r, out_w = os.pipe()
        opened += [out_r, out_w]
        read_fd, write_fd, child_fds, close_after = out_r, in_w, (in_r, out_w, False), [in_r, out_w]
    report_r, report_w = os.pipe()
    opened += [report_r, report_w]
    shim = os.fork()
    if shim == 0:
        os.close(report_r)
        run_shim(m, child_fds, report_w)
    del opened[:]  # from here on, the shim owns the program's end
    os.close(report_w)
    for fd in close_after:
        os.close(fd)
    report = b''
    while True:
        chunk = os.read(report_r, 4096)
        if not chunk:
            break
        report += chunk
    os.close(report_r)
    main = struct.unpack('<q', report[:8])[0] if len(report) >= 8 else 0
    program = Program(ident, shim, main, read_fd, write_fd, tty)
    programs[ident] = program
    os.set_blocking(read_fd, False)
    os.set_blocking(write_fd, False)
    by_fd[read_fd] = program
    sel.register(read_fd, selectors.EVENT_READ, 'out')
    if len(report) > 8 or main == 0:
        send(e='failed', id=ident, error=report[8:].decode('utf-8', 'replace') or 'the program did not start')
    else:
        send(e='started', id=ident, pid=main)


def close_input(p):
    if p.write_fd is not None:
        try:
            sel.unregister(p.write_fd)
        except (KeyError, ValueError):
            pass
        os.close(p.write_fd)
        p.write_fd = None


def flush_input(p):
    while p.pending and p.write_fd is not None:
        try:
            n = os.write(p.write_fd, p.pending[:65536])
        except BlockingIOError:
            break
        except OSError:  # EPIPE: nothing reads its input any more
            send(e='input_dropped', id=p.id, bytes=len(p.pending), why='closed')
            p.pending = b''
            close_input(p)
            return
        p.pending = p.pending[n:]
    if p.write_fd is None:
        return
    if p.pending:
        try:
            sel.register(p.write_fd, selectors.EVENT_WRITE, 'in')
        except KeyError:
            pass
    else:
        try:
            sel.unregister(p.write_fd)
        except (KeyError, ValueError):
            pass
        if p.eof_asked:
            close_input(p)


def signal_program(p, sig):
    if p.main:
        try:
            os.killpg(p.main, sig)
        except OSError:
            try:
                os.kill(p.main, sig)
            except OSError:
                pass


def handle(m):
    op, p = m.get('op'), programs.get(m.get('id'))
    if op == 'start':
        start(m)
    elif p is None:
        return
    elif op == 'write':
        data = base64.b64decode(m['data'])
        if p.write_fd is None:
            send(e='input_dropped', id=p.id, bytes=len(data), why='closed')
        elif len(p.pending) + len(data) > MAX_PENDING:
            send(e='input_dropped', id=p.id, bytes=len(data), why='full')
        else:
            p.pending += data
            flush_input(p)
    elif op == 'eof':
        if p.tty:
            p.pending += b'\x04'
        else:
            p.eof_asked = True
        flush_input(p)
    elif op == 'signal':
        signal_program(p, int(m['sig']))
    elif op == 'kill':
        kill_tree(p.shim, True)


def finish(p):
    """Sends a reaped program's exit, once its output has all been sent."""
    close_input(p)
    send(e='exit', id=p.id, code=p.code)
    del programs[p.id]


def drain(p, final=False):
    """Sends what the program's pipe holds (one read, or, at its end, all of
    it up to MAX_FINAL_DRAIN); at end of file, its exit if it was reaped."""
    budget = MAX_FINAL_DRAIN
    while True:
        try:
            chunk = os.read(p.read_fd, 65536)
        except BlockingIOError:
            if not final:
                return
            chunk = b''
        except OSError:  # EIO: a pty whose last user is gone
            chunk = b''
        if not chunk or budget <= 0:
            sel.unregister(p.read_fd)
            del by_fd[p.read_fd]
            os.close(p.read_fd)
            p.read_fd = None
            if p.code is not None:
                finish(p)
            return
        budget -= len(chunk)
        send(e='out', id=p.id, data=base64.b64encode(chunk).decode())
        if not final:
            return


def kill_strays():
    """Kills, with its tree, every child that is not a program's shim: a
    process whose shim died came to the supervisor."""
    shims = {p.shim for p in programs.values()}
    for pid in children(os.getpid()):
        if pid not in shims and not zombie(pid):
            kill_tree(pid, True)


def reap():
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        kill_strays()
        for p in list(programs.values()):
            if p.shim == pid:
                p.code = status_code(status)
                # Its tree is gone: what is left in the pipe is all there is.
                if p.read_fd is not None:
                    drain(p, final=True)
                else:
                    finish(p)
    kill_strays()


def main():
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    os.set_blocking(0, False)
    sel.register(0, selectors.EVENT_READ, 'host')
    sel.register(wake_r, selectors.EVENT_READ, 'wake')
    buffered = bytearray()
    scanned = 0
    send(e='ready')
    while True:
        for key, _ in sel.select():
            if key.data == 'host':
                try:
                    chunk = os.read(0, 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    for p in list(programs.values()):
                        kill_tree(p.shim, True)
                    os._exit(0)
                buffered += chunk
                end = buffered.find(b'\n', scanned)
                while end >= 0:
                    line = bytes(buffered[:end])
                    del buffered[:end + 1]
                    try:
                        handle(json.loads(line))
                    except Exception as e:
                        send(e='error', error=str(e)[:512])
                    end = buffered.find(b'\n')
                scanned = len(buffered)
            elif key.data == 'wake':
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
                reap()
            elif key.data == 'out':
                p = by_fd.get(key.fd)
                if p is not None:
                    drain(p)
            elif key.data == 'in':
                for p in programs.values():
                    if p.write_fd == key.fd:
                        flush_input(p)
                        break


main()
