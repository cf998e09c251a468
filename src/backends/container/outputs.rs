//! `/work/out`: where the code writes the files it returns, and how they come
//! back to the host.
//!
//! **Bounded by the kernel.** `/work/out` is a tmpfs inside the container
//! (never a host directory), capped in bytes
//! ([`ContainerConfig::max_output_total_bytes`](super::ContainerConfig::max_output_total_bytes))
//! and in entries ([`OUTPUT_INODES`]); a write past either fails with
//! `ENOSPC`, and a file past
//! [`max_output_file_bytes`](super::ContainerConfig::max_output_file_bytes)
//! with `EFBIG` (`RLIMIT_FSIZE`). Its pages count against the container's
//! memory cap, and it is gone with the container: nothing of it is ever on
//! the host's disk, and the host never empties or removes it.
//!
//! **Coming back.** A listing of `/work/out` is made *inside* the container
//! by [`COLLECT_SCRIPT`] (`sh` and coreutils' `stat` and `cat`, in every
//! execbox image) and read by the host through a bounded buffer:
//!
//! - one-shot runs: the container's command runs under [`AFTER_SCRIPT`],
//!   which, once the program ends, kills whatever of it is left
//!   (`kill -KILL -1`: every process of the container but the timer), writes
//!   a record marker to stdout and then the listing; the host takes
//!   everything after the marker out of stdout ([`ListingTap`]), before the
//!   stdout cap and tap. It all happens within the run's deadline: a run
//!   that times out returns no files. The wrapper's shell is one of the
//!   run's processes (`--pids-limit` is the policy's, unchanged).
//! - sessions: after a cell that collects files, the host runs the same
//!   listing with `exec` in the session's container, once nothing of the
//!   cell runs (the session loop empties `/work/out` itself before each
//!   cell). A listing that does not finish within the cell's deadline gives
//!   no files; it is left to finish, not killed (its orphans would stay as
//!   zombies of the container's first process), and the next cell waits for
//!   it.
//!
//! **Listing format** (bytes; `<n>` decimal): entries the host skips are
//! `L <n>\n<name>` (symlink), `D <n>\n<name>` (deeper than
//! [`MAX_OUTPUT_DEPTH`]), `X <n>\n<name>` (not a regular file), `R <n>\n<name>`
//! (not readable; a directory's name ends in `/`); regular files come in
//! batches, `F <k>\n`, then `k` times `<n>\n<name>`, then `k` sizes one a
//! line (`-<size>` for a file whose contents are not sent: the listing
//! carries at most the tmpfs's size, more can only be hard links or sparse
//! files), then the contents of the sent ones back to back; `S\n` says the
//! walk stopped at [`MAX_OUTPUT_ENTRIES`]; `E\n` ends it. Names are relative
//! to `/work/out`. The program can forge a listing (it can write the marker
//! itself: the nonce is on its parent's command line), but never more than
//! its own files: the host parses it with every cap, checks every name, and
//! reports a broken one. A one-shot run's listing is the first marker's:
//! whatever follows it, a second marker included, is listing bytes.

use std::path::{Component, Path};

use crate::file::ExecFile;
use crate::limits::output::BoundedBuffer;
use crate::limits::records::marker;
use crate::text;

/// Where the code writes files to return (when the request collects them).
pub(crate) const OUTPUT_DIR: &str = "/work/out";

/// Most entries of `/work/out` looked at (files, directories, links,
/// anything): the walk stops there and the result's message says so.
pub(super) const MAX_OUTPUT_ENTRIES: usize = 10_000;

/// Deepest directory of `/work/out` walked.
pub(super) const MAX_OUTPUT_DEPTH: usize = 16;

/// Inodes of the `/work/out` tmpfs (its root included): what the code can
/// create there at most, so what any listing or removal of it can cost.
/// Above [`MAX_OUTPUT_ENTRIES`] so that bound stays the one callers see.
pub(super) const OUTPUT_INODES: u64 = 32_768;

/// Longest name (relative to `/work/out`) the host takes from a listing.
const MAX_NAME_BYTES: usize = 4096;

/// Files per `F` batch of a listing (one `stat` and one `cat` each).
const MAX_BATCH: usize = 256;

/// Longest line of a listing but names and contents (a tag and a number).
const MAX_LINE: usize = 32;

/// Bytes of a listing kept beyond the files' contents (names and sizes).
const LISTING_SLACK: u64 = 16 << 20;

/// Limits on the files returned from `/work/out`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OutputLimits {
    pub max_files: usize,
    pub max_file_bytes: u64,
    pub max_total_bytes: u64,
}

impl OutputLimits {
    /// Size of the `/work/out` tmpfs: the total the host returns (at least
    /// a page: a tmpfs of size 0 would be unbounded).
    pub fn tmpfs_bytes(&self) -> u64 {
        self.max_total_bytes.max(4096)
    }

    /// Most bytes of a listing the host keeps.
    pub fn listing_cap(&self) -> u64 {
        self.tmpfs_bytes().saturating_add(LISTING_SLACK)
    }
}

/// The listing functions: `list` walks `/work/out` (at most `$max` entries,
/// `$deep` levels) and writes the listing to stdout, the contents of at most
/// `$budget` bytes of files (more can only be hard links or sparse files:
/// the tmpfs holds no more). Builtins only but for one `stat` and one `cat`
/// per batch of 256 files (no `cat` when they are all empty); absolute paths (the request's environment may set
/// `PATH`), and `dash` counts `${#name}` in bytes.
macro_rules! list_functions {
    () => {
        r#"c=0 stop= sent=0
entry() { printf '%s %d\n%s' "$1" "${#2}" "$2"; }
flush() {
  local f s n sizes kept=0 flags=
  printf 'F %d\n' $#
  for f; do f=${f#/work/out/}; printf '%d\n%s' "${#f}" "$f"; done
  sizes=$(/usr/bin/stat -c %s -- "$@") || sizes=
  n=0
  for s in $sizes; do n=$((n + 1)); done
  # Cannot happen while nothing else runs: say the listing is broken.
  if [ "$n" -ne $# ]; then printf '!\n'; stop=1; return; fi
  for s in $sizes; do
    if [ $((sent + s)) -le "$budget" ]; then sent=$((sent + s)); kept=$((kept + s)); flags="$flags 1"; printf '%s\n' "$s"
    else flags="$flags 0"; printf -- '-%s\n' "$s"
    fi
  done
  [ "$kept" -gt 0 ] || return 0
  case $flags in
    *0*) for s in $flags; do f=$1; shift; [ "$s" = 0 ] || set -- "$@" "$f"; done ;;
  esac
  /bin/cat -- "$@"
}
walk() {
  local d="$1" depth="$2" f
  set --
  for f in "$d"/* "$d"/.[!.]* "$d"/..?*; do
    [ -e "$f" ] || [ -L "$f" ] || continue
    if [ "$c" -ge "$max" ]; then stop=1; break; fi
    c=$((c + 1))
    if [ -L "$f" ]; then entry L "${f#/work/out/}"
    elif [ -f "$f" ] && [ -r "$f" ]; then
      set -- "$@" "$f"
      if [ $# -ge 256 ]; then flush "$@"; set --; fi
    elif [ -f "$f" ]; then entry R "${f#/work/out/}"
    elif [ -d "$f" ] && ! { [ -r "$f" ] && [ -x "$f" ]; }; then entry R "${f#/work/out/}/"
    elif [ -d "$f" ] && [ "$depth" -lt "$deep" ]; then walk "$f" $((depth + 1))
    elif [ -d "$f" ]; then entry D "${f#/work/out/}"
    else entry X "${f#/work/out/}"
    fi
    [ -z "$stop" ] || break
  done
  [ $# -eq 0 ] || flush "$@"
}
list() {
  walk /work/out 0
  [ -z "$stop" ] || printf 'S\n'
  printf 'E\n'
}
"#
    };
}

/// `sh -c COLLECT_SCRIPT execbox-out <max entries> <max depth> <byte
/// budget>`: the listing of `/work/out` on stdout (sessions, through `exec`).
pub(crate) const COLLECT_SCRIPT: &str = concat!("max=$1 deep=$2 budget=$3\n", list_functions!(), "list 2>/dev/null\n");

/// `sh -c AFTER_SCRIPT execbox-out <nonce> <max entries> <max depth> <byte
/// budget> <command...>`: runs the command, kills what is left of it, then
/// writes the record marker `\0execbox:<nonce>:O\n` and the listing to
/// stdout, and exits with the command's status (one-shot runs).
pub(super) const AFTER_SCRIPT: &str = concat!(
    "nonce=$1 max=$2 deep=$3 budget=$4\nshift 4\n\"$@\"\ns=$?\nkill -s KILL -1 2>/dev/null\n",
    "printf '\\000execbox:%s:O\\n' \"$nonce\"\n",
    list_functions!(),
    "list 2>/dev/null\nexit $s\n"
);

/// `sh -c WARM_AFTER_SCRIPT execbox-end <nonce> <collect: 0|1> <max
/// entries> <max depth> <byte budget> <command...>` (a warm container,
/// `warm.rs`): runs the command, kills what is left of it, writes the end
/// record `\0execbox:<nonce>:Z<ddd>\n` (`<ddd>`: the exit code) to stderr,
/// then (collecting) the marker and listing of [`AFTER_SCRIPT`] and the end
/// record to stdout, and exits with the command's status. The nonce is the
/// listing's too. The host reads each stream up to its end record.
pub(super) const WARM_AFTER_SCRIPT: &str = concat!(
    "nonce=$1 collect=$2 max=$3 deep=$4 budget=$5\nshift 5\n\"$@\"\ns=$?\nkill -s KILL -1 2>/dev/null\n",
    "printf '\\000execbox:%s:Z%03d\\n' \"$nonce\" \"$s\" >&2\n",
    list_functions!(),
    "if [ \"$collect\" = 1 ]; then printf '\\000execbox:%s:O\\n' \"$nonce\"; list 2>/dev/null; fi\n",
    "printf '\\000execbox:%s:Z%03d\\n' \"$nonce\" \"$s\"\nexit $s\n"
);

/// The arguments after `sh -c <script> execbox-out` (and the nonce, for
/// [`AFTER_SCRIPT`]): the walk's bounds and the listing's byte budget (the
/// tmpfs's size).
pub(crate) fn script_args(budget: u64) -> [String; 3] {
    [MAX_OUTPUT_ENTRIES.to_string(), MAX_OUTPUT_DEPTH.to_string(), budget.to_string()]
}

/// The `--tmpfs` argument of `/work/out`.
pub(super) fn tmpfs_arg(bytes: u64, inodes: u64) -> String {
    format!("--tmpfs={OUTPUT_DIR}:rw,nosuid,nodev,noexec,size={bytes},nr_inodes={inodes},mode=1777")
}

/// The bytes that open the listing in a one-shot run's stdout.
pub(super) fn listing_marker(nonce: &str) -> Vec<u8> {
    let mut bytes = marker(nonce);
    bytes.extend_from_slice(b"O\n");
    bytes
}

/// A listing as the host read it.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    pub bytes: Vec<u8>,
    /// More came than the cap kept.
    pub cut: bool,
}

/// Takes the listing out of a one-shot run's stdout: bytes before its
/// marker are ordinary output, everything after it (up to the cap) is the
/// listing.
pub(super) struct ListingTap {
    marker: Vec<u8>,
    /// Bytes of the marker matched so far.
    held: usize,
    listing: Option<Listing>,
    cap: u64,
}

impl ListingTap {
    pub fn new(marker: Vec<u8>, cap: u64) -> Self {
        debug_assert!(marker.first() == Some(&0) && !marker[1..].contains(&0));
        Self { marker, held: 0, listing: None, cap }
    }

    /// Feeds what the container wrote to stdout; ordinary output goes on to `text`.
    pub fn feed(&mut self, bytes: &[u8], text: &mut BoundedBuffer) {
        let mut i = 0;
        while i < bytes.len() {
            if let Some(listing) = self.listing.as_mut() {
                let room = usize::try_from(self.cap.saturating_sub(listing.bytes.len() as u64)).unwrap_or(usize::MAX);
                let rest = &bytes[i..];
                listing.bytes.extend_from_slice(&rest[..rest.len().min(room)]);
                listing.cut |= rest.len() > room;
                return;
            }
            if self.held == 0 {
                // The marker starts with the only NUL it holds.
                match bytes[i..].iter().position(|&b| b == 0) {
                    None => {
                        text.write(&bytes[i..]);
                        return;
                    }
                    Some(at) => {
                        text.write(&bytes[i..i + at]);
                        i += at + 1;
                        self.held = 1;
                    }
                }
            } else if bytes[i] == self.marker[self.held] {
                self.held += 1;
                i += 1;
            } else {
                // Not the marker after all: what was held is output; this
                // byte is looked at again (it may open a marker).
                text.write(&self.marker[..self.held]);
                self.held = 0;
            }
            if self.held == self.marker.len() {
                self.held = 0;
                self.listing = Some(Listing::default());
            }
        }
    }

    /// The listing, if its marker came; a partial marker at the end was output.
    pub fn finish(mut self, text: &mut BoundedBuffer) -> Option<Listing> {
        if self.held > 0 {
            text.write(&self.marker[..self.held]);
        }
        self.listing.take()
    }
}

/// The files a one-shot run returns when it collects them (none
/// otherwise), the note on what was left out added to `message`.
/// `ended_early`: why there is no listing when the run did not time out
/// (its container or pod ended before it listed `out/`).
pub(crate) fn returned_files(
    collects: bool,
    listing: Option<&Listing>,
    timed_out: bool,
    ended_early: &str,
    limits: OutputLimits,
    message: &mut Option<String>,
) -> Vec<ExecFile> {
    if !collects {
        return Vec::new();
    }
    let why_none =
        if timed_out { "they are listed when the program ends, and it ran out of time" } else { ended_early };
    let (files, note) = files_from_listing(listing, why_none, limits);
    if let Some(note) = note {
        text::add_note(message, note);
    }
    files
}

/// A file of the listing.
struct Found<'a> {
    name: String,
    size: u64,
    content: Content<'a>,
}

/// A listed file's contents.
enum Content<'a> {
    Sent(&'a [u8]),
    /// Past the listing's byte budget (hard links or sparse files).
    NotSent,
    /// The listing ended before them.
    Missing,
}

/// Reads a listing (see the module docs).
struct Parser<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Parser<'a> {
    /// A line of at most [`MAX_LINE`] bytes, without its `\n`.
    fn line(&mut self) -> Result<&'a str, End> {
        let rest = &self.bytes[self.at..];
        let Some(end) = rest.iter().take(MAX_LINE + 1).position(|&b| b == b'\n') else {
            return Err(if rest.len() > MAX_LINE { End::Malformed } else { End::Short });
        };
        self.at += end + 1;
        std::str::from_utf8(&rest[..end]).map_err(|_| End::Malformed)
    }

    /// The next `n` bytes.
    fn take(&mut self, n: usize) -> Result<&'a [u8], End> {
        let taken = self.bytes[self.at..].get(..n).ok_or(End::Short)?;
        self.at += n;
        Ok(taken)
    }

    /// `<n>\n<name>` (or `<tag> <n>\n<name>` with the tag already read):
    /// the name, of at most [`MAX_NAME_BYTES`].
    fn name_of_len(&mut self, len: &str) -> Result<&'a [u8], End> {
        let len = decimal(len).filter(|n| *n <= MAX_NAME_BYTES as u64).ok_or(End::Malformed)?;
        self.take(len as usize)
    }
}

/// A decimal number: digits only (no sign, no space), within `u64`.
fn decimal(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// How the parse of a listing ended.
#[derive(Clone, Copy)]
enum End {
    /// `E`: the listing is whole.
    Whole,
    /// The bytes ran out first.
    Short,
    /// Something that is not the format.
    Malformed,
}

/// The files of a listing, within `limits`: regular files only, in name
/// order; the second value notes what was left out, if anything (a bounded
/// list and a count). `listing` is `None` when the container wrote none
/// (`why` says why).
pub(crate) fn files_from_listing(
    listing: Option<&Listing>,
    why_none: &str,
    limits: OutputLimits,
) -> (Vec<ExecFile>, Option<String>) {
    let Some(listing) = listing else {
        return (Vec::new(), Some(format!("output files not collected: {why_none}")));
    };
    let mut parser = Parser { bytes: &listing.bytes, at: 0 };
    let mut found: Vec<Found<'_>> = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    let mut stopped = false;
    let end = loop {
        // A real walk stops at this many entries; a forged listing is held
        // to it too.
        if found.len() + skipped.len() >= MAX_OUTPUT_ENTRIES {
            stopped = true;
            break End::Whole;
        }
        let line = match parser.line() {
            Ok(line) => line,
            Err(end) => break end,
        };
        let (tag, arg) = line.split_once(' ').unwrap_or((line, ""));
        let reason = match tag {
            "E" if arg.is_empty() => break End::Whole,
            "S" if arg.is_empty() => {
                stopped = true;
                continue;
            }
            "L" => "symlink",
            "D" => "nested deeper than 16",
            "X" => "not a regular file",
            "R" => "not readable",
            "F" => match read_batch(&mut parser, arg, &mut found, &mut skipped) {
                Ok(()) => continue,
                Err(end) => break end,
            },
            _ => break End::Malformed,
        };
        match parser.name_of_len(arg) {
            Ok(name) => {
                let suffix = if tag == "D" { "/" } else { "" };
                skipped.push(format!("{}{suffix} ({reason})", String::from_utf8_lossy(name)));
            }
            Err(end) => break end,
        }
    };
    found.sort_by(|a, b| a.name.cmp(&b.name));
    let mut files = Vec::new();
    let mut total = 0u64;
    for file in found {
        let over = if files.len() >= limits.max_files {
            Some("over max_output_files")
        } else if file.size > limits.max_file_bytes {
            Some("over max_output_file_bytes")
        } else if total.saturating_add(file.size) > limits.max_total_bytes {
            Some("over max_output_total_bytes")
        } else {
            None
        };
        if let Some(reason) = over {
            skipped.push(format!("{} ({reason})", file.name));
            continue;
        }
        let content = match file.content {
            Content::Sent(content) => content,
            Content::NotSent => {
                skipped.push(format!("{} (over max_output_total_bytes: hard links or sparse files)", file.name));
                continue;
            }
            Content::Missing => {
                skipped.push(format!("{} (the listing of out/ ended before it)", file.name));
                continue;
            }
        };
        total = total.saturating_add(file.size);
        let mime_type = mime_guess::from_path(&file.name).first_raw().map(str::to_string);
        files.push(ExecFile { name: file.name, content: content.to_vec(), mime_type });
    }
    let mut notes = Vec::new();
    if !skipped.is_empty() {
        notes.push(format!("output files left out: {}", text::list_names(&skipped)));
    }
    if stopped {
        notes.push(format!("out/ holds more than {MAX_OUTPUT_ENTRIES} entries: only those were looked at"));
    }
    match end {
        End::Whole => {}
        End::Short if listing.cut => {
            notes.push(format!("the listing of out/ was cut at {} bytes", listing.bytes.len()))
        }
        End::Short => notes.push("the listing of out/ ended early".into()),
        End::Malformed => notes.push(
            "the listing of out/ was malformed (forged by the program, or out/ changed while it was listed)".into(),
        ),
    }
    (files, (!notes.is_empty()).then(|| notes.join("; ")))
}

/// Reads one `F <k>` batch into `found` (names the host refuses go to
/// `skipped`); `Err` says how the listing ended early.
fn read_batch<'a>(
    parser: &mut Parser<'a>,
    count: &str,
    found: &mut Vec<Found<'a>>,
    skipped: &mut Vec<String>,
) -> Result<(), End> {
    let count = decimal(count).filter(|k| (1..=MAX_BATCH as u64).contains(k)).ok_or(End::Malformed)? as usize;
    let mut names = Vec::with_capacity(count);
    for _ in 0..count {
        let line = parser.line()?;
        names.push(parser.name_of_len(line)?);
    }
    // (size, whether its contents follow)
    let mut sizes = Vec::with_capacity(count);
    for _ in 0..count {
        let line = parser.line()?;
        let (digits, sent) = match line.strip_prefix('-') {
            Some(digits) => (digits, false),
            None => (line, true),
        };
        sizes.push((decimal(digits).ok_or(End::Malformed)?, sent));
    }
    for (name, (size, sent)) in names.into_iter().zip(sizes) {
        let content = match sent {
            true => match usize::try_from(size).map_err(|_| End::Short).and_then(|n| parser.take(n)) {
                Ok(content) => Content::Sent(content),
                Err(_) => Content::Missing,
            },
            false => Content::NotSent,
        };
        let short = matches!(content, Content::Missing);
        match checked_name(name) {
            Ok(name) => found.push(Found { name, size, content }),
            Err(reason) => skipped.push(format!("{} ({reason})", String::from_utf8_lossy(name))),
        }
        if short {
            // The rest of the batch is not there either.
            return Err(End::Short);
        }
    }
    Ok(())
}

/// A listed name as an output file's name: UTF-8, relative, plain
/// components only, no deeper than the walk goes ([`MAX_OUTPUT_DEPTH`]
/// directories): a forged listing gets no more directories made on the
/// host (by `--output-dir`, by a client saving the files) than a real one.
fn checked_name(name: &[u8]) -> Result<String, &'static str> {
    let name = std::str::from_utf8(name).map_err(|_| "name is not UTF-8")?;
    let plain = !name.is_empty()
        && !name.contains('\0')
        && name.split('/').all(|part| !part.is_empty())
        && Path::new(name).components().all(|c| matches!(c, Component::Normal(_)));
    if !plain {
        return Err("not a name under out/");
    }
    if name.split('/').count() > MAX_OUTPUT_DEPTH + 1 {
        return Err("nested deeper than 16");
    }
    Ok(name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> OutputLimits {
        OutputLimits { max_files: 2, max_file_bytes: 10, max_total_bytes: 12 }
    }

    fn listing(bytes: &[u8]) -> Listing {
        Listing { bytes: bytes.to_vec(), cut: false }
    }

    #[test]
    fn a_listing_comes_back_in_name_order_within_the_caps() {
        let raw = b"L 4\nlinkD 5\na/b/cF 3\n5\nz.txt5\nb.txt7\nbig.bin2\n2\n11\nzzbbxxxxxxxxxxxS\nE\n";
        let (files, note) = files_from_listing(Some(&listing(raw)), "", limits());
        let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["b.txt", "z.txt"]);
        assert_eq!((files[0].content.as_slice(), files[1].content.as_slice()), (b"bb".as_slice(), b"zz".as_slice()));
        let note = note.unwrap();
        for part in ["link (symlink)", "a/b/c/ (nested deeper than 16)", "big.bin (over max_output_file_bytes)"] {
            assert!(note.contains(part), "{note}");
        }
        assert!(note.contains("more than 10000 entries"), "{note}");
    }

    #[test]
    fn forged_or_broken_listings_are_noted_and_never_escape_out() {
        let long_name = format!("F 1\n{}\n{}1\n\nxE\n", MAX_NAME_BYTES + 1, "a".repeat(MAX_NAME_BYTES + 1));
        let deep = format!("{}f", "a/".repeat(MAX_OUTPUT_DEPTH + 1));
        let deep_name = format!("F 1\n{}\n{deep}1\nxE\n", deep.len());
        for (raw, expect) in [
            (b"F 1\n9\n../passwd3\nabcE\n".as_slice(), "../passwd (not a name under out/)"),
            (b"F 1\n5\n/etc/3\nabcE\n".as_slice(), "/etc/ (not a name under out/)"),
            (b"F 1\n5\na/../3\nabcE\n".as_slice(), "not a name under out/"),
            // Deeper than the walk goes: what a forged listing would have the host create.
            (deep_name.as_bytes(), "nested deeper than 16"),
            (b"F 1\n4\na//b3\nabcE\n".as_slice(), "not a name under out/"),
            (b"F 1\n3\na\0b3\nabcE\n".as_slice(), "not a name under out/"),
            (b"F 1\n2\n\xff\xfe3\nabcE\n".as_slice(), "name is not UTF-8"),
            (b"F 1\n0\n3\nabcE\n".as_slice(), "not a name under out/"),
            (b"F 1\n1\n.3\nabcE\n".as_slice(), "not a name under out/"),
            // Sizes past the caps are refused before any content is taken.
            (b"F 1\n1\na99999999999999999999\nE\n".as_slice(), "malformed"),
            (b"F 1\n1\na-\nE\n".as_slice(), "malformed"),
            (b"F 1\n1\na+3\nabcE\n".as_slice(), "malformed"),
            (b"F 1\n1\na!\nE\n".as_slice(), "malformed"),
            (long_name.as_bytes(), "malformed"),
            (b"F 1\n1\na9\nabc".as_slice(), "a (the listing of out/ ended before it)"),
            (b"Q\n".as_slice(), "malformed"),
            (b"E extra\n".as_slice(), "malformed"),
            (b"F 1\n1\na".as_slice(), "ended early"),
            (b"F 1\n".as_slice(), "ended early"),
            (b"".as_slice(), "ended early"),
            (b"F 999999\n".as_slice(), "malformed"),
            (b"F 257\n".as_slice(), "malformed"),
            (b"F 0\nE\n".as_slice(), "malformed"),
            (b"F -1\nE\n".as_slice(), "malformed"),
            (b"L 99999\nx".as_slice(), "malformed"),
            (b"L 9\nx".as_slice(), "ended early"),
            (b"F 1\n+1\na1\nxE\n".as_slice(), "malformed"),
            (b"F 1\n1\na\xff\nxE\n".as_slice(), "malformed"),
            // A line longer than any the format has.
            (b"F 1\n0000000000000000000000000000000000001\naE\n".as_slice(), "malformed"),
            (b"F 1\n00000000000000000000".as_slice(), "ended early"),
        ] {
            let (files, note) = files_from_listing(Some(&listing(raw)), "", limits());
            assert!(files.is_empty(), "{files:?}");
            assert!(note.as_deref().unwrap_or_default().contains(expect), "{expect}: {note:?}");
        }
        let (_, note) = files_from_listing(None, "the run timed out", limits());
        assert_eq!(note.as_deref(), Some("output files not collected: the run timed out"));
    }

    #[test]
    fn a_forged_listing_gets_no_more_than_the_caps() {
        // More files than max_files, a file past max_file_bytes, a total past
        // max_total_bytes: the caps hold whatever the listing claims.
        let raw = b"F 4\n1\na1\nb1\nc1\nd9\n9\n9\n9\naaaaaaaaabbbbbbbbbcccccccccdddddddddE\n";
        let (files, note) = files_from_listing(Some(&listing(raw)), "", limits());
        assert_eq!(files.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["a"]);
        let note = note.unwrap();
        assert!(note.contains("b (over max_output_total_bytes)"), "{note}");
        let raw = b"F 1\n1\na11\naaaaaaaaaaaE\n";
        let (files, note) = files_from_listing(Some(&listing(raw)), "", limits());
        assert!(files.is_empty() && note.unwrap().contains("a (over max_output_file_bytes)"));
        // The same name twice (a forged listing): each is one more file
        // against the caps, never a way past them.
        let raw = b"F 2\n1\na1\na1\n1\nxyE\n";
        let (files, _) = files_from_listing(Some(&listing(raw)), "", limits());
        assert!(files.len() <= limits().max_files);
        // Files whose contents were not sent (hard links or sparse files
        // past the listing's budget) are left out, and said so.
        let raw = b"F 2\n1\na1\nb-5\n2\nxyE\n";
        let (files, note) = files_from_listing(Some(&listing(raw)), "", limits());
        assert_eq!(
            files.iter().map(|f| (f.name.as_str(), f.content.as_slice())).collect::<Vec<_>>(),
            [("b", b"xy".as_slice())]
        );
        assert!(note.unwrap().contains("a (over max_output_total_bytes: hard links or sparse files)"));
        // A cut listing says where it was cut; what came whole is kept.
        let cut = Listing { bytes: b"F 1\n1\na2\nxyF 1\n1\nb5\nab".to_vec(), cut: true };
        let (files, note) = files_from_listing(Some(&cut), "", limits());
        assert_eq!(files.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["a"]);
        assert!(note.unwrap().contains("was cut at 22 bytes"));
    }

    #[test]
    fn a_second_marker_is_listing_bytes_and_the_first_listing_rules() {
        // The program forged a listing (the nonce is on its parent's command
        // line); the real one follows it, marker and all: everything after
        // the first marker is the listing, parsed to its first `E`.
        let marker = listing_marker("n0nce");
        let mut stream = b"output\n".to_vec();
        stream.extend_from_slice(&marker);
        stream.extend_from_slice(b"F 1\n6\nforged2\nhiE\n");
        stream.extend_from_slice(&marker);
        stream.extend_from_slice(b"F 1\n4\nreal2\nokE\n");
        let mut text = BoundedBuffer::new(None);
        let mut tap = ListingTap::new(marker.clone(), 1 << 20);
        tap.feed(&stream, &mut text);
        let got = tap.finish(&mut text).expect("a listing");
        assert_eq!(text.into_captured().bytes, b"output\n");
        let (files, note) = files_from_listing(Some(&got), "", limits());
        assert_eq!(files.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["forged"]);
        assert_eq!(note, None);
        // A forged listing without its end: the real one is read as garbage
        // after it, and nothing escapes the caps.
        let mut stream = marker.clone();
        stream.extend_from_slice(b"F 1\n1\na1\nx");
        stream.extend_from_slice(&marker);
        stream.extend_from_slice(b"F 1\n4\nreal2\nokE\n");
        let mut text = BoundedBuffer::new(None);
        let mut tap = ListingTap::new(marker, 1 << 20);
        tap.feed(&stream, &mut text);
        let got = tap.finish(&mut text).expect("a listing");
        let (files, note) = files_from_listing(Some(&got), "", limits());
        assert_eq!(files.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(), ["a"]);
        assert!(note.unwrap().contains("malformed"));
    }

    #[test]
    fn the_scripts_carry_their_arguments_and_absolute_tools() {
        assert_eq!(script_args(4096), ["10000".to_string(), "16".into(), "4096".into()]);
        for script in [COLLECT_SCRIPT, AFTER_SCRIPT] {
            assert!(script.contains("/usr/bin/stat -c %s --") && script.contains("/bin/cat --"), "{script}");
            assert!(script.contains("list 2>/dev/null"), "{script}");
        }
        assert!(AFTER_SCRIPT.contains("kill -s KILL -1"));
        assert_eq!(
            tmpfs_arg(4096, OUTPUT_INODES),
            "--tmpfs=/work/out:rw,nosuid,nodev,noexec,size=4096,nr_inodes=32768,mode=1777"
        );
        let tiny = OutputLimits { max_files: 1, max_file_bytes: 0, max_total_bytes: 0 };
        assert_eq!(tiny.tmpfs_bytes(), 4096, "a tmpfs of size 0 would be unbounded");
    }

    #[test]
    fn the_tap_splits_output_from_the_listing_whatever_the_chunks() {
        let marker = listing_marker("n0nce");
        let mut stream = b"out\0put ".to_vec();
        stream.extend_from_slice(&marker[..4]);
        stream.extend_from_slice(b"x");
        stream.extend_from_slice(&marker);
        stream.extend_from_slice(b"E\n");
        for chunk in [1, 2, 3, 7, stream.len()] {
            let mut text = BoundedBuffer::new(None);
            let mut tap = ListingTap::new(marker.clone(), 1);
            for piece in stream.chunks(chunk) {
                tap.feed(piece, &mut text);
            }
            let got = tap.finish(&mut text).expect("a listing");
            let mut expected = b"out\0put ".to_vec();
            expected.extend_from_slice(&marker[..4]);
            expected.push(b'x');
            assert_eq!(text.into_captured().bytes, expected, "chunks of {chunk}");
            assert_eq!((got.bytes.as_slice(), got.cut), (b"E".as_slice(), true));
        }
    }
}
