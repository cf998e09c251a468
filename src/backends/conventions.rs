//! Conventions shared by the backends: what a language means on every
//! backend that runs it (Python in a container and in wasm, sessions
//! included) and where execbox keeps its caches.

use std::path::PathBuf;

use crate::result::CapturedStream;

/// `$<env_var>` if set, else `$XDG_CACHE_HOME/execbox/<name>`, else
/// `~/.cache/execbox/<name>` (where the setup scripts put things).
pub(crate) fn cache_dir(env_var: &str, name: &str) -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(env_var) {
        return Some(dir.into());
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("execbox").join(name))
}

/// `load_input()`: the JSON in `/work/input.json`, or `None`; and
/// `exit_status(e)`: the status a `SystemExit` stands for, as CPython's own
/// exit would report it.
macro_rules! python_helpers {
    () => {
        "\
import sys
def load_input():
    try:
        f = open('/work/input.json', encoding='utf-8')
    except FileNotFoundError:
        return None
    # Imported only when there is input: importing json costs CPython-in-wasm ~100 ms.
    import json
    with f:
        return json.load(f)
def exit_status(e):
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1
"
    };
}

/// Reads the code (`$read_source`, which sets `source`), then binds `input`
/// from `/work/input.json` (or `None`). Stdin is read first: a warm
/// interpreter waits there, and its input file is written before the code
/// is sent.
macro_rules! python_prelude {
    ($read_source:expr) => {
        concat!(
            python_helpers!(),
            $read_source,
            "\
data = load_input()
sys.argv = ['<code>'] + sys.argv[1:]
"
        )
    };
}

/// Reads one framed message (`<len>\n<bytes>`) from fd 0: how a warm
/// CPython-in-wasm instance gets its code (and a session its cells) over the
/// host's message stdin. `None` at end of input; `SESSION` for the bare
/// header `S\n` (the host starts a session; the nonce follows). `os.read`
/// is bound when the function is defined, so a cell that replaces it does
/// not change how the next cell is read (a first line only: a cell can
/// reach anything in its interpreter, and the host's deadline on every
/// cell is what holds).
macro_rules! python_read_message {
    () => {
        "\
SESSION = object()
def read_message(_read=__import__('os').read):
    header = b''
    while not header.endswith(b'\\n'):
        if len(header) > 20:
            return None
        chunk = _read(0, 1)
        if not chunk:
            return None
        header += chunk
    if header == b'S\\n':
        return SESSION
    size = int(header)
    data = bytearray()
    while len(data) < size:
        chunk = _read(0, size - len(data))
        if not chunk:
            return None
        data += chunk
    return data.decode('utf-8')
"
    };
}

/// Runs the code as `__main__` with `input` bound; frames show it as `<code>`.
pub(crate) const PYTHON_BOOTSTRAP: &str = concat!(
    python_prelude!("source = sys.stdin.read()\n"),
    "exec(compile(source, '<code>', 'exec'), {'__name__': '__main__', '__builtins__': __builtins__, 'input': data})\n"
);

/// A session's loop, `_execbox_session(nonce, read_message)`: cells
/// arrive as framed messages; each runs in one long-lived `__main__`
/// namespace with `input` rebound from `/work/input.json`, its exceptions
/// printed as tracebacks of the cell (`<code>`, the caller's lines),
/// `SystemExit` only setting the cell's status. After each cell, once stdout
/// and stderr are flushed, a status record `\0execbox:<nonce>:R<len>:{"status": N}`
/// goes to fd 2 and then fd 1 (taken out of both streams by the host: a
/// container's two pipes are read apart, so each stream marks its own end of
/// the cell) and the loop blocks for the next cell. `sys.stdin` is empty
/// for cells. It calls the module's `load_input` and `exit_status`
/// (`python_helpers!`). A warm CPython-in-wasm instance defines it during
/// start-up (so opening a session compiles nothing); a container runs
/// [`PYTHON_SESSION_PROGRAM`].
macro_rules! python_session_def {
    () => {
        "\
def _execbox_session(nonce, read_message):
    import io, json, os, sys, traceback
    scope = {'__name__': '__main__', '__builtins__': __builtins__}
    marker = '\\0execbox:' + nonce + ':'
    while True:
        source = read_message()
        if source is None:
            os._exit(0)
        scope['input'] = load_input()
        sys.stdin = io.StringIO('')
        status = 0
        try:
            exec(compile(source, '<code>', 'exec'), scope)
        except SystemExit as e:
            status = exit_status(e)
        except BaseException as e:
            traceback.print_exception(type(e), e, e.__traceback__.tb_next)
            status = 1
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        record = json.dumps({'status': status})
        record = (marker + 'R%d:%s\\n' % (len(record), record)).encode()
        os.write(2, record)
        os.write(1, record)
"
    };
}

/// A container session's `python3 -c` program (`NONCE` replaced by the session's).
#[cfg(feature = "container")]
pub(crate) const PYTHON_SESSION_PROGRAM: &str = concat!(
    python_helpers!(),
    python_read_message!(),
    python_session_def!(),
    "_execbox_session('NONCE', read_message)\n"
);

/// The same for a warm CPython-in-wasm instance: `json` and `traceback` are
/// imported and the compiler is used once during start-up (the first
/// `compile()` costs ~56 M fuel, ~20 ms, in CPython-in-wasm), and the run ends with `os._exit` once stdout and
/// stderr are flushed, skipping interpreter finalization (~40 M fuel). Safe
/// there: a warm run has no writable directory whose files could lose
/// buffered writes.
#[cfg(feature = "wasm")]
pub(crate) const PYTHON_WARM_BOOTSTRAP: &str = concat!(
    "import json, os, traceback\nexec(compile('pass', '<warm-up>', 'exec'), {})\n",
    python_read_message!(),
    python_session_def!(),
    python_prelude!(
        "source = read_message()\nif source is None:\n    os._exit(0)\nif source is SESSION:\n    _execbox_session(read_message(), read_message)\n"
    ),
    "\
status = 0
try:
    exec(compile(source, '<code>', 'exec'), {'__name__': '__main__', '__builtins__': __builtins__, 'input': data})
except SystemExit as e:
    status = exit_status(e)
except BaseException:
    traceback.print_exc()
    status = 1
sys.stdout.flush()
sys.stderr.flush()
os._exit(status)
"
);

/// The whole stdout as one JSON value, if it is one and nothing was cut.
pub(crate) fn json_stdout(stdout: &CapturedStream) -> Option<serde_json::Value> {
    if stdout.truncated || stdout.bytes.is_empty() {
        return None;
    }
    let text = std::str::from_utf8(&stdout.bytes).ok()?.trim();
    // serde_json stops at 128 levels of nesting: a hostile stdout cannot
    // exhaust the stack here.
    serde_json::from_str(text).ok()
}
