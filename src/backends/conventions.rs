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
        include_str!("conventions/helpers.py")
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
        include_str!("conventions/read_message.py")
    };
}

/// Code Mode for Python, whatever carries the calls (CPython-in-wasm's
/// stdio, a container's Unix socket): `_execbox_take_tools(source, connect)`
/// takes any `tools` module of an earlier cell out of `sys.modules`, and
/// when `source` starts with the tools header `\0tools:{"nonce", "names"}\n`
/// takes the header off and installs the `tools` package for the granted
/// `names` (`sys.modules['tools']` and a submodule `tools.<namespace>` per
/// namespace), with `sys.stdin` emptied. `connect(header)` gives the
/// carrier's `exchange(id, frame)`: it sends one call frame (`{"tool_call":
/// {"id", "name", "args"}}`, UTF-8 JSON, id and name before the arguments)
/// and returns that call's `tool_result` object, or `None` when no answer
/// can come (the run is over). See `python_stdio_def!` and
/// `python_socket_def!` for the two carriers.
///
/// A session keeps one `tools` module object and one `ToolError` class for
/// all its cells (a cell's namespaces replace the last ones), so a module
/// bound in the globals stays current; in a cell without a grant its calls
/// are answered `not_granted`. Call ids come from one counter per process.
#[cfg(any(feature = "wasm", feature = "container"))]
macro_rules! python_tools_def {
    () => {
        include_str!("conventions/tools.py")
    };
}

/// The CPython-in-wasm carrier of `python_tools_def!`:
/// `_execbox_stdio(read_message)` is a `connect` whose calls are records
/// `\0execbox:<nonce>:T<len>:<frame>\n` on fd 1 (the host's stdout tap takes
/// them out) and whose answers are read from fd 0 (framed messages, a NUL
/// then `{"tool_result": ...}`) until the one with the call's id; see
/// `src/backends/wasm/tool_channel.rs`. `os.write` and the message reader
/// are bound when the functions are defined, so code that replaces them
/// does not change how calls travel.
#[cfg(feature = "wasm")]
macro_rules! python_stdio_def {
    () => {
        include_str!("conventions/stdio_carrier.py")
    };
}

/// Where a container that carries the tool bridge sees its Unix socket.
#[cfg(feature = "container")]
macro_rules! tools_socket {
    () => {
        "/run/execbox/tools.sock"
    };
}

/// Where a container that carries the tool bridge sees its Unix socket
/// (see `backends/container/tool_socket.rs`).
#[cfg(feature = "container")]
pub(crate) const TOOLS_SOCKET: &str = tools_socket!();

/// The container carrier of `python_tools_def!`: `_execbox_socket(path)` is
/// a `connect` whose calls are lines on the Unix socket `path` (each frame
/// and `\n`) and whose answers are lines back (`{"tool_result": ...}\n`),
/// read until the one with the call's id. One connection per process
/// (reopened after a fork or a broken one), opened at the first call and
/// shared by every cell and thread; calls take turns on it (a lock), so a
/// process has one call in flight at a time. The `socket` module is bound
/// when a run's (or cell's) tools are installed, before its code runs.
#[cfg(feature = "container")]
macro_rules! python_socket_def {
    () => {
        include_str!("conventions/socket_carrier.py")
    };
}

/// [`PYTHON_BOOTSTRAP`]'s text (warm containers start with it too).
macro_rules! python_stdin_main {
    () => {
        concat!(
            python_prelude!("source = sys.stdin.read()\n"),
            "exec(compile(source, '<code>', 'exec'), {'__name__': '__main__', '__builtins__': __builtins__, 'input': data})\n"
        )
    };
}

/// Runs the code as `__main__` with `input` bound; frames show it as `<code>`.
pub(crate) const PYTHON_BOOTSTRAP: &str = python_stdin_main!();

/// The line a warm container's Python writes to stdout once it has imported
/// its packages and waits for its code (see `container/warm.rs`).
#[cfg(feature = "container")]
pub(crate) const WARM_CONTAINER_READY: &[u8] = b"\0execbox:warm\n";

/// The line the host writes to a warm container it is about to take, and
/// the line its Python answers: a container that does not answer at once
/// (paused, frozen, stuck) is not handed to a run (see `container/warm.rs`).
#[cfg(feature = "container")]
pub(crate) const WARM_CONTAINER_PROBE: &[u8] = b"?\n";
/// See [`WARM_CONTAINER_PROBE`].
#[cfg(feature = "container")]
pub(crate) const WARM_CONTAINER_HERE: &[u8] = b"\0execbox:here\n";

/// The first line of a warm container's bootstrap, put before
/// [`PYTHON_BOOTSTRAP`]'s own first line (so a traceback names the same
/// bootstrap lines as a cold run's): imports the packages `argv[1]` names
/// (comma-separated, taken out of `sys.argv`; one that fails to import is
/// left for the code to import, and fail, itself), writes
/// [`WARM_CONTAINER_READY`] to stdout, then waits for the host's
/// [`WARM_CONTAINER_PROBE`] line and answers [`WARM_CONTAINER_HERE`]
/// before it reads the code.
#[cfg(feature = "container")]
macro_rules! python_warm_head {
    () => {
        r#"import sys;exec('def _execbox_warm(names, out=sys.stdout.buffer):\n import importlib\n for name in filter(None, names.split(",")):\n  try:\n   importlib.import_module(name)\n  except Exception:\n   pass\n out.write(b"\\0execbox:warm\\n")\n out.flush()\n sys.stdin.buffer.readline()\n out.write(b"\\0execbox:here\\n")\n out.flush()');_execbox_warm(sys.argv.pop(1));del _execbox_warm;"#
    };
}

/// [`PYTHON_BOOTSTRAP`] for a warm container whose run collects output
/// files: the packages imported first (see `python_warm_head!`), then the
/// code read from stdin and run exactly as in a cold run, interpreter
/// finalization included (it closes the files the code left open).
#[cfg(feature = "container")]
pub(crate) const PYTHON_WARM_CONTAINER_BOOTSTRAP: &str = concat!(python_warm_head!(), python_stdin_main!());

/// [`PYTHON_WARM_CONTAINER_BOOTSTRAP`] for a run that collects no files:
/// once the code has ended, Python's exit is done by hand and the
/// interpreter's teardown skipped (~10 ms bare, ~100–250 ms with pandas
/// loaded): non-daemon threads are waited for and `atexit` handlers run as
/// at any exit, an uncaught exception goes to `sys.excepthook` and a
/// `SystemExit` is turned into the same exit status and message, the
/// standard streams are flushed, then `os._exit`. What is skipped can only
/// change files inside the container, which is removed unread, or print
/// from a `__del__` during teardown. The `try:` shares its line with the
/// `exec` of a cold run, so tracebacks are the same.
#[cfg(feature = "container")]
pub(crate) const PYTHON_WARM_CONTAINER_FAST_EXIT_BOOTSTRAP: &str = concat!(
    python_warm_head!(),
    python_prelude!("source = sys.stdin.read()\n"),
    "try: exec(compile(source, '<code>', 'exec'), {'__name__': '__main__', '__builtins__': __builtins__, 'input': data})\n",
    r#"except SystemExit as _execbox_e:
    _execbox_code = _execbox_e.code
    if _execbox_code is None:
        _execbox_status = 0
    elif isinstance(_execbox_code, int):
        # As CPython: the value as a C long (past its range, -1), then the
        # kernel's low byte. int.__index__ reads a subclass's value as is.
        _execbox_code = int.__index__(_execbox_code)
        _execbox_status = _execbox_code & 0xFF if -2**63 <= _execbox_code < 2**63 else 0xFF
    else:
        try:
            sys.stderr.write(str(_execbox_code) + '\n')
        except Exception:
            pass
        _execbox_status = 1
except KeyboardInterrupt:
    sys.excepthook(*sys.exc_info())
    _execbox_status = 130
except BaseException:
    sys.excepthook(*sys.exc_info())
    _execbox_status = 1
else:
    _execbox_status = 0
__import__('threading')._shutdown()
__import__('atexit')._run_exitfuncs()
# As CPython's finalization: a standard stream that cannot be flushed is
# reported and makes the status 120.
for _execbox_f in (sys.stdout, sys.stderr):
    try:
        if _execbox_f is not None and not _execbox_f.closed:
            _execbox_f.flush()
    except Exception as _execbox_e:
        _execbox_status = 120
        if _execbox_f is sys.stdout:
            try:
                sys.stderr.write('Exception ignored in: %r\n%s: %s\n' % (_execbox_f, type(_execbox_e).__name__, _execbox_e))
                sys.stderr.flush()
            except Exception:
                pass
for _execbox_f in (sys.__stdout__, sys.__stderr__):
    try:
        _execbox_f.flush()
    except Exception:
        pass
__import__('os')._exit(_execbox_status)
"#
);

/// [`PYTHON_BOOTSTRAP`] for a container run that may call tools: the code
/// on stdin comes after the tools header (`\0tools:{"nonce": "", "names":
/// [...]}\n`, see `python_tools_def!`), and the calls go to the run's
/// socket ([`TOOLS_SOCKET`]).
#[cfg(feature = "container")]
pub(crate) const PYTHON_SOCKET_TOOLS_BOOTSTRAP: &str = concat!(
    python_tools_def!(),
    python_socket_def!(),
    python_prelude!(concat!(
        "source = _execbox_take_tools(sys.stdin.read(), _execbox_socket('",
        tools_socket!(),
        "'))\n"
    )),
    "exec(compile(source, '<code>', 'exec'), {'__name__': '__main__', '__builtins__': __builtins__, 'input': data})\n"
);

/// The `tool` command of a container's shell run that may call tools
/// (mounted read-only at `/usr/local/bin/tool`): `tool NAMESPACE.TOOL
/// [ARGS_JSON | -]` calls one tool through the run's socket with the Python
/// `tools` module's own code; it prints the value as one line of JSON and
/// exits 0, or prints the `ToolError` as JSON (`{"tool", "kind",
/// "message"}`) on stderr and exits 1 (2 for a usage error). `-` reads the
/// arguments from stdin; none means `{}`.
#[cfg(feature = "container")]
pub(crate) const TOOL_COMMAND: &str = concat!(
    "#!/usr/bin/python3 -I\n",
    python_tools_def!(),
    python_socket_def!(),
    "\
def _execbox_tool(argv):
    import json, sys
    if len(argv) not in (2, 3) or argv[1] in ('-h', '--help'):
        print('usage: tool NAMESPACE.TOOL [ARGS_JSON | -]  (ARGS_JSON: an object, {} if none; -: read from stdin)',
              file=sys.stderr)
        return 2
    name, text = argv[1], argv[2] if len(argv) == 3 else '{}'
    if text == '-':
        text = sys.stdin.read()
    _execbox_tools([], _execbox_socket('",
    tools_socket!(),
    "')({}))
    tools = sys.modules['tools']
    try:
        try:
            args = json.loads(text)
        except ValueError as e:
            raise tools.ToolError(name, 'invalid_arguments', 'the arguments are not JSON: %s' % e) from None
        value = tools.call(name, args)
    except tools.ToolError as e:
        print(json.dumps({'tool': e.tool, 'kind': e.kind, 'message': e.message}, ensure_ascii=False), file=sys.stderr)
        return 1
    print(json.dumps(value, ensure_ascii=False))
    return 0
raise SystemExit(_execbox_tool(__import__('sys').argv))
"
);

/// [`PYTHON_BOOTSTRAP`] for a fresh CPython-in-wasm instance whose run
/// calls tools: the code arrives as one framed message on fd 0, after the
/// tools header (see `python_tools_def!`), and fd 0 stays open for the
/// calls' answers.
#[cfg(feature = "wasm")]
pub(crate) const PYTHON_TOOLS_BOOTSTRAP: &str = concat!(
    python_read_message!(),
    python_tools_def!(),
    python_stdio_def!(),
    python_prelude!(
        "source = read_message()\nif source is None:\n    sys.exit(0)\nsource = _execbox_take_tools(source, _execbox_stdio(read_message))\n"
    ),
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
/// [`PYTHON_SESSION_PROGRAM`]. `$on_cell` is code run on each cell's
/// `source` as it arrives (CPython-in-wasm: the cell's tools).
macro_rules! python_session_def {
    ($on_cell:expr) => {
        concat!(
            "\
def _execbox_session(nonce, read_message):
    import io, json, os, sys, traceback
    scope = {'__name__': '__main__', '__builtins__': __builtins__}
    marker = '\\0execbox:' + nonce + ':'
    while True:
        source = read_message()
        if source is None:
            os._exit(0)
",
            $on_cell,
            // No line continuation here: it would eat this line's indentation.
            "        scope['input'] = load_input()
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
        )
    };
}

/// `_execbox_empty(top)`: removes everything below `top` (a container
/// session's `/work/out` tmpfs, before each cell), without recursion and
/// without following links, making the cell's own unreadable directories
/// readable first; what it cannot remove stays (a cell can only confuse its
/// own session). The tmpfs's inode cap bounds its work.
#[cfg(feature = "container")]
macro_rules! python_empty_def {
    () => {
        include_str!("conventions/empty_dir.py")
    };
}

/// A container session's `python3 -c` program (`NONCE` replaced by the
/// session's): each cell starts with an empty `/work/out`. A cell that may
/// call tools arrives after the tools header
/// (`\0tools:{"nonce": "", "names": [...]}\n`); its calls go to the
/// session's socket ([`TOOLS_SOCKET`]).
#[cfg(feature = "container")]
pub(crate) const PYTHON_SESSION_PROGRAM: &str = concat!(
    python_helpers!(),
    python_read_message!(),
    python_tools_def!(),
    python_socket_def!(),
    python_empty_def!(),
    python_session_def!(concat!(
        "        _execbox_empty('/work/out')\n",
        "        source = _execbox_take_tools(source, _execbox_socket('",
        tools_socket!(),
        "'))\n"
    )),
    "_execbox_session('NONCE', read_message)\n"
);

/// A container's shell session (`python3 -c`, `NONCE` replaced by the
/// session's): the same framed cells and status records as
/// [`PYTHON_SESSION_PROGRAM`], each cell sourced (`.`) by one long-lived
/// `bash` (so variables, functions, `cd` and `set` persist), with stdin
/// `/dev/null`; each cell starts with an empty `/work/out`. A cell that ends
/// the shell (`exit`) gets that status, and the next cell a new shell. A
/// cell calls tools with the `tool` command.
#[cfg(feature = "container")]
pub(crate) const SHELL_SESSION_PROGRAM: &str = concat!(
    python_read_message!(),
    python_empty_def!(),
    include_str!("conventions/shell_session.py"),
    "_execbox_shell_session('NONCE', read_message)\n"
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
    python_tools_def!(),
    python_stdio_def!(),
    // A late tool answer (a NUL, then its frame) is never taken for a cell.
    python_session_def!(
        "        if source.startswith('\\0{\"tool_result\"'):\n            continue\n        source = _execbox_take_tools(source, _execbox_stdio(read_message))\n"
    ),
    python_prelude!(
        "source = read_message()\nif source is None:\n    os._exit(0)\nif source is SESSION:\n    _execbox_session(read_message(), read_message)\nif source.startswith('\\0'):\n    source = _execbox_take_tools(source, _execbox_stdio(read_message))\n"
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

#[cfg(test)]
mod tests {
    /// The host's `python3` with `args`, `stdin` written to it; its stdout
    /// discarded.
    #[cfg(feature = "container")]
    fn host_python(args: &[&str], stdin: &[u8]) -> std::process::Output {
        use std::io::Write as _;
        use std::process::{Command, Stdio};
        let mut python = Command::new("python3")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3 on the host");
        python.stdin.take().unwrap().write_all(stdin).unwrap();
        python.wait_with_output().unwrap()
    }

    /// The warm container's fast exit ends with the status a cold run's
    /// interpreter ends with, for exits CPython treats specially (the
    /// host's `python3` runs both).
    #[test]
    #[cfg(feature = "container")]
    fn the_fast_exit_gives_a_cold_runs_status() {
        let status = |bootstrap: &str, stdin: &str| {
            // A warm bootstrap takes its (here: no) packages as argv[1].
            let args: &[&str] =
                if bootstrap == super::PYTHON_BOOTSTRAP { &["-c", bootstrap] } else { &["-c", bootstrap, ""] };
            let out = host_python(args, stdin.as_bytes());
            // A signal's death is 128 + the signal in a container's status.
            use std::os::unix::process::ExitStatusExt as _;
            let code = out.status.code().or(out.status.signal().map(|signal| 128 + signal));
            (code, String::from_utf8_lossy(&out.stderr).lines().next().map(str::to_string))
        };
        for code in [
            "import sys; sys.exit(2**70)",
            "import sys; sys.exit(-2**70)",
            "import sys; sys.exit(2**40 + 3)",
            "import sys; sys.exit(-1)",
            "import sys\nclass I(int):\n    def __and__(self, other): raise ValueError\nsys.exit(I(3))",
            "import os; print('x'); os.close(1)",
            "import sys; sys.exit('bye')",
            "raise KeyboardInterrupt",
        ] {
            let cold = status(super::PYTHON_BOOTSTRAP, code);
            let warm = status(super::PYTHON_WARM_CONTAINER_FAST_EXIT_BOOTSTRAP, &format!("?\n{code}"));
            assert_eq!(warm, cold, "{code}");
        }
    }

    /// Every program execbox assembles from the `conventions/*.py` files
    /// parses as Python (the host's `python3`, which CI's scripts need too).
    #[test]
    #[cfg(all(feature = "wasm", feature = "container"))]
    fn every_assembled_python_program_parses() {
        let programs = [
            ("PYTHON_BOOTSTRAP", super::PYTHON_BOOTSTRAP),
            ("PYTHON_WARM_CONTAINER_BOOTSTRAP", super::PYTHON_WARM_CONTAINER_BOOTSTRAP),
            ("PYTHON_WARM_CONTAINER_FAST_EXIT_BOOTSTRAP", super::PYTHON_WARM_CONTAINER_FAST_EXIT_BOOTSTRAP),
            ("PYTHON_SOCKET_TOOLS_BOOTSTRAP", super::PYTHON_SOCKET_TOOLS_BOOTSTRAP),
            ("TOOL_COMMAND", super::TOOL_COMMAND),
            ("PYTHON_TOOLS_BOOTSTRAP", super::PYTHON_TOOLS_BOOTSTRAP),
            ("PYTHON_SESSION_PROGRAM", super::PYTHON_SESSION_PROGRAM),
            ("SHELL_SESSION_PROGRAM", super::SHELL_SESSION_PROGRAM),
            ("PYTHON_WARM_BOOTSTRAP", super::PYTHON_WARM_BOOTSTRAP),
        ];
        for (name, text) in programs {
            let out = host_python(&["-I", "-c", "import ast, sys; ast.parse(sys.stdin.read())"], text.as_bytes());
            assert!(out.status.success(), "{name} is not Python: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
}
