//! Request conventions shared by every backend that runs the same language
//! (Python in a container and in wasm), so a program behaves the same on both.

use crate::result::CapturedStream;

/// Runs the code read from stdin as `__main__`, with `input` bound to
/// `/work/input.json` (or `None`); frames show the code as `<code>`. Stdin is
/// read first: a warm interpreter waits there, and its input file is written
/// before the code is sent.
pub(crate) const PYTHON_BOOTSTRAP: &str = "\
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
source = sys.stdin.read()
data = load_input()
sys.argv = ['<code>'] + sys.argv[1:]
exec(compile(source, '<code>', 'exec'), {'__name__': '__main__', '__builtins__': __builtins__, 'input': data})
";

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
