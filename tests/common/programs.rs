//! Hostile programs more than one binary runs.

/// A Python cell that makes the session loop's own reads of more than one
/// byte sleep for an hour: the loop then reads the next cell's header and
/// blocks in the middle of its body. (It rebinds the loop's `read`, bound
/// when the loop was defined, through the loop's frame: the first line of
/// defence does not hold against a cell, the host's deadline must.)
pub const STOP_READING: &str = "\
import sys, time
loop = sys._getframe(1).f_locals['read_message']
real = loop.__defaults__[0]
def stuck(fd, n):
    if n > 1:
        time.sleep(3600)
    return real(fd, n)
loop.__defaults__ = (stuck,)
print('armed')
";

/// Python that writes files into `/work/out` until something stops it, then
/// one huge file: what it prints says what stopped it (`files <n> <errno>`,
/// then `bytes <errno>`).
pub const FLOOD_WORK_OUT: &str = "\
import os
n = 0
try:
    while True:
        open('/work/out/f%07d' % n, 'w').close()
        n += 1
except OSError as e:
    print('files', n, e.errno)
try:
    with open('/work/out/big', 'wb') as f:
        while True:
            f.write(b'x' * (1 << 20))
except OSError as e:
    print('bytes', e.errno)
";

/// execbox's container seccomp profile, as the library passes it to the
/// engine (a container's `HostConfig.SecurityOpt` carries its text).
pub const SECCOMP_PROFILE: &str = include_str!("../../src/backends/container/seccomp.json");

/// Python that calls `io_uring_setup(1, NULL)` and prints the errno: `1`
/// (EPERM) under execbox's profile; `14` (EFAULT) where the kernel runs it
/// (docker 20.10's default profile).
pub const IO_URING_SETUP_ERRNO: &str = "\
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
assert libc.syscall(425, 1, None) == -1
print(ctypes.get_errno())
";

/// Python (x86_64) that makes every call execbox's seccomp profile denies,
/// each with arguments the kernel itself would refuse with another error
/// (or accept) if no filter stopped it, and prints a JSON object of each
/// call's errno name (`OK` when it succeeded). A clone that succeeded ends
/// its child at once.
pub const DENIED_SYSCALLS: &str = r#"
import ctypes, errno, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(number, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(number), *(ctypes.c_long(a) for a in args))
    if r == 0 and number == 56:
        os._exit(0)
    return "OK" if r != -1 else errno.errorcode[ctypes.get_errno()]
seen = {
    # unfiltered: EFAULT, EBADF, EINVAL
    "io_uring_setup": call(425, 1, 0),
    "io_uring_enter": call(426, -1, 0, 0, 0, 0, 0),
    "io_uring_register": call(427, -1, 0, 0, 0),
    # unfiltered: ESRCH, EINVAL (flags), EINVAL (flags)
    "ptrace": call(101, 2, -1, 0, 0),
    "process_vm_readv": call(310, 1, 0, 0, 0, 0, 1),
    "process_vm_writev": call(311, 1, 0, 0, 0, 0, 1),
    # unfiltered: EINVAL (an unknown flag beside UFFD_USER_MODE_ONLY)
    "userfaultfd": call(323, 1 | 2),
    # unfiltered: EOPNOTSUPP, EFAULT, EFAULT
    "keyctl": call(250, 9999),
    "add_key": call(248, 0, 0, 0, 0, 0),
    "request_key": call(249, 0, 0, 0, 0),
    "bpf": call(321, 9999, 0, 0),
    # unfiltered: EFAULT
    "perf_event_open": call(298, 0, 0, -1, -1, 0),
    # CLONE_NEWUSER: unfiltered it may succeed as any user
    "unshare": call(272, 0x10000000),
    "clone_newuser": call(56, 0x10000000 | 17, 0, 0, 0, 0),
    # unfiltered: EBADF, EFAULT, ESRCH, EBADF
    "setns": call(308, -1, 0),
    "mount": call(165, 0, 0, 0, 0, 0),
    "kcmp": call(312, 0x7FFFFFFF, 0x7FFFFFFF, 0, 0, 0),
    "pidfd_getfd": call(438, -1, 0, 0),
    # unfiltered: succeeds (reads the LDT), succeeds (turns off ASLR)
    "modify_ldt": call(154, 0, 0, 0),
    "personality_no_aslr": call(135, 0x0040000),
    # execbox: ENOSYS, so that libc falls back to clone; unfiltered: EFAULT
    "clone3": call(435, 0, 0),
}
for name, family in [("AF_TIPC", 30), ("AF_ALG", 38), ("AF_VSOCK", 40), ("AF_KCM", 41), ("family 9999", 9999)]:
    try:
        socket.socket(family, socket.SOCK_DGRAM).close()
        seen["socket " + name] = "OK"
    except OSError as e:
        seen["socket " + name] = errno.errorcode[e.errno]
try:
    socket.socketpair(socket.AF_INET)
    seen["socketpair AF_INET"] = "OK"
except OSError as e:
    seen["socketpair AF_INET"] = errno.errorcode[e.errno]
# unfiltered: EBADF; and a real lease (unfiltered: succeeds on a file of one's own)
seen["fcntl F_SETLEASE"] = call(72, -1, 1024, 1)
fd = os.open("/tmp/execbox-lease", os.O_CREAT | os.O_RDONLY, 0o600)
try:
    import fcntl
    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
    seen["lease"] = "OK"
except OSError as e:
    seen["lease"] = errno.errorcode[e.errno]
assert fcntl.fcntl(fd, fcntl.F_GETLEASE) == fcntl.F_UNLCK and fcntl.fcntl(fd, fcntl.F_GETFD) >= 0
os.close(fd)
# unfiltered: succeeds (/tmp is writable); a regular file and a socket still can be made
try:
    os.mkfifo("/tmp/execbox-fifo")
    seen["mkfifo"] = "OK"
except OSError as e:
    seen["mkfifo"] = errno.errorcode[e.errno]
os.mknod("/tmp/execbox-file")
with socket.socket(socket.AF_UNIX) as listener:
    listener.bind("/tmp/execbox-socket")
assert os.path.isfile("/tmp/execbox-file") and not os.path.isfile("/tmp/execbox-socket")
print(json.dumps(seen))
"#;
