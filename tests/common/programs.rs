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
