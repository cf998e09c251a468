//! WASI preview-1 command guest in Rust (built with Debian's rustc, see
//! build.sh): reads stdin and prints `{"lines":L,"words":W,"bytes":B}`.
//! With an argument `panic` it panics, which `panic=abort` turns into a trap.

use std::io::{self, Read, Write};

fn main() {
    if std::env::args().nth(1).as_deref() == Some("panic") {
        panic!("asked to panic");
    }
    let mut text = Vec::new();
    io::stdin().read_to_end(&mut text).expect("stdin");
    let text = String::from_utf8_lossy(&text);
    let lines = text.lines().count();
    let words = text.split_whitespace().count();
    let out = format!("{{\"lines\":{},\"words\":{},\"bytes\":{}}}\n", lines, words, text.len());
    io::stdout().write_all(out.as_bytes()).expect("stdout");
}
