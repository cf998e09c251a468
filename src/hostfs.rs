//! Host-side file work done for a request — staging inputs, the Rust binary
//! cache, saving output files — through cap-std
//! directory handles, one path component at a time, never through a link.
//!
//! Why: a container writes into host directories (the Rust compile's
//! target directory, read-write grants) and can plant symlinks there. A path-based `std::fs::write` of
//! `out/evil` follows `evil -> /etc/passwd` and writes a host file outside
//! every grant. Here a directory is opened once by its path
//! ([`open_ambient`]: the caller's own, trusted path) and everything below
//! it is opened relative to that handle with `O_NOFOLLOW` on every
//! component: a symlink anywhere below is refused, whatever it points to.
//!
//! Used by workspaces and the container backend (staging, the Rust binary
//! cache, saved outputs).
//!
//! What this cannot cover: bind-mount sources are paths the engine resolves
//! itself (following links), so a grant inside another read-write grant is
//! the caller's risk.

// Without the container backend, workspaces use part of it.
#![cfg_attr(not(feature = "container"), allow(dead_code))]

use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::path::{Component, Path};

use cap_fs_ext::{DirExt, FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, DirBuilder, DirBuilderExt, OpenOptions, OpenOptionsExt, Permissions, PermissionsExt};

use crate::file::ExecFile;

/// `O_NONBLOCK`: opening a FIFO never waits for a writer.
const NONBLOCK: i32 = rustix::fs::OFlags::NONBLOCK.bits() as i32;

/// Opens a directory by its host path: the one ambient step. The path is the
/// caller's (a temp dir execbox made, the configured cache, `--output-dir`),
/// so links in it are the caller's choice.
pub(crate) fn open_ambient(path: &Path) -> io::Result<Dir> {
    Dir::open_ambient_dir(path, cap_std::ambient_authority())
}

/// Opens the subdirectory `name` (one component) of `dir`; a symlink is
/// refused, with an error that says so.
pub(crate) fn open_dir(dir: &Dir, name: &OsStr) -> io::Result<Dir> {
    dir.open_dir_nofollow(name).map_err(|e| {
        // The kernel says ELOOP or ENOTDIR for a link: name it plainly.
        match dir.symlink_metadata(name) {
            Ok(meta) if meta.file_type().is_symlink() => symlink_refused(name),
            _ => e,
        }
    })
}

/// Creates (where missing) and opens each directory of `relative` under
/// `root`. New directories get exactly `exact_mode` if given (staging: the
/// container's user must read them whatever the umask), else `0o777` less
/// the umask. A component that exists as a symlink is refused.
pub(crate) fn create_dirs(root: &Dir, relative: &Path, exact_mode: Option<u32>) -> io::Result<Dir> {
    let mut dir = root.try_clone()?;
    for name in components(relative)? {
        match dir.create_dir_with(name, DirBuilder::new().mode(exact_mode.unwrap_or(0o777))) {
            Ok(()) => {
                if let Some(mode) = exact_mode {
                    set_mode(&dir, name, mode)?;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        dir = open_dir(&dir, name)?;
    }
    Ok(dir)
}

/// Creates the file `name` in `dir` with `bytes`, exactly `mode` (whatever
/// the umask). `name` must not exist: `O_EXCL` never follows a link.
pub(crate) fn write_new(dir: &Dir, name: &OsStr, bytes: &[u8], mode: u32) -> io::Result<()> {
    let mut file = dir.open_with(name, OpenOptions::new().write(true).create_new(true).mode(mode))?;
    file.write_all(bytes)?;
    file.set_permissions(Permissions::from_mode(mode))
}

/// Replaces the file `name` in `dir` with `bytes`: written to a fresh file
/// beside it, then renamed over it, so an existing inode (perhaps a hard
/// link) is never written into. An existing symlink or directory at `name`
/// is refused. New files get `0o666` less the umask, as any CLI's would.
pub(crate) fn replace(dir: &Dir, name: &OsStr, bytes: &[u8]) -> io::Result<()> {
    replace_with_mode(dir, name, bytes, None)
}

/// [`replace`], the new file given exactly `mode` (on its open handle,
/// before it is renamed into place) when one is given.
pub(crate) fn replace_with_mode(dir: &Dir, name: &OsStr, bytes: &[u8], mode: Option<u32>) -> io::Result<()> {
    match dir.symlink_metadata(name) {
        Ok(meta) if meta.file_type().is_symlink() => return Err(symlink_refused(name)),
        Ok(meta) if meta.is_dir() => {
            return Err(io::Error::new(io::ErrorKind::IsADirectory, format!("{} is a directory", show(name))));
        }
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let temp = format!(".execbox-save-{:016x}", crate::nonce::random_u64());
    let written = dir
        .open_with(&temp, OpenOptions::new().write(true).create_new(true).mode(0o666))
        .and_then(|mut file| {
            file.write_all(bytes)?;
            match mode {
                Some(mode) => file.set_permissions(Permissions::from_mode(mode)),
                None => Ok(()),
            }
        })
        .and_then(|()| dir.rename(&temp, dir, name));
    if written.is_err() {
        drop(dir.remove_file(&temp));
    }
    written
}

/// Copies the regular file `from_name` of `from` (at most `max` bytes) to
/// `to_name` in `to` with exactly `mode`: written to a fresh file, then
/// renamed into place, so no reader sees half a copy and no existing inode
/// is written into. The source is opened with `O_NOFOLLOW | O_NONBLOCK`,
/// then checked on the open handle: a symlink is refused, and a FIFO cannot
/// block the host.
pub(crate) fn copy_regular(
    from: &Dir,
    from_name: &OsStr,
    to: &Dir,
    to_name: &OsStr,
    mode: u32,
    max: u64,
) -> io::Result<()> {
    let mut options = OpenOptions::new();
    options.read(true).follow(FollowSymlinks::No).custom_flags(NONBLOCK);
    let source = from.open_with(from_name, &options).map_err(|e| explain(e, from_name))?;
    let meta = source.metadata()?;
    if !meta.is_file() || meta.len() > max {
        return Err(io::Error::other(format!("{} is not a regular file of at most {max} bytes", show(from_name))));
    }
    let temp = format!(".execbox-copy-{:016x}", crate::nonce::random_u64());
    let copied = (|| {
        let mut target = to.open_with(&temp, OpenOptions::new().write(true).create_new(true).mode(mode))?;
        let written = io::copy(&mut source.take(max.saturating_add(1)), &mut target)?;
        if written > max {
            return Err(io::Error::other(format!("{} grew past {max} bytes", show(from_name))));
        }
        target.set_permissions(Permissions::from_mode(mode))?;
        to.rename(&temp, to, to_name)
    })();
    if copied.is_err() {
        drop(to.remove_file(&temp));
    }
    copied
}

/// Reads the regular file `name` of `dir`, at most `max` bytes: opened
/// with `O_NOFOLLOW | O_NONBLOCK` and checked on the handle, as
/// [`copy_regular`] does.
pub(crate) fn read_regular(dir: &Dir, name: &OsStr, max: u64) -> io::Result<Vec<u8>> {
    let mut options = OpenOptions::new();
    options.read(true).follow(FollowSymlinks::No).custom_flags(NONBLOCK);
    let file = dir.open_with(name, &options).map_err(|e| explain(e, name))?;
    let meta = file.metadata()?;
    if !meta.is_file() || meta.len() > max {
        return Err(io::Error::other(format!("{} is not a regular file of at most {max} bytes", show(name))));
    }
    let mut bytes = Vec::new();
    file.take(max).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Sets the exact mode of `name` in `dir` (the umask may have narrowed it);
/// refuses a symlink.
pub(crate) fn set_mode(dir: &Dir, name: &OsStr, mode: u32) -> io::Result<()> {
    dir.set_permissions(name, Permissions::from_mode(mode))
}

/// A host directory that output files are saved into: created if missing
/// and opened **once**, before the run, so a program that swaps the path for
/// a symlink during the run (it may sit inside a read-write grant) cannot
/// redirect the save. Everything below the handle is written one component
/// at a time, never through a link: a symlink is refused with an error that
/// names it. Existing files are replaced (a new file renamed over the old
/// name), never written into.
#[derive(Debug)]
pub struct OutputDir {
    dir: Dir,
    path: std::path::PathBuf,
}

impl OutputDir {
    /// Creates `path` (and its parents) if missing and opens it.
    pub fn open(path: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(path)?;
        Ok(Self { dir: open_ambient(path)?, path: path.to_path_buf() })
    }

    /// The path it was opened by (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `files` under the directory, each at its relative name.
    pub fn save(&self, files: &[ExecFile]) -> Result<(), SaveError> {
        for file in files {
            self.write(&file.name, &file.content, None)?;
        }
        Ok(())
    }

    /// Whether the regular file at the relative path `name` already holds
    /// `content` with the permission bits of `mode` (then a write would
    /// change nothing; the file's other bits, set-id ones say, stay). Read
    /// as every file here is, never through a link and non-blocking; any
    /// doubt (no such file, a link, a FIFO, an error) answers `false`.
    pub fn holds(&self, name: &str, content: &[u8], mode: u32) -> bool {
        use cap_std::fs::PermissionsExt as _;
        let Ok(mut parts) = components(Path::new(name)) else { return false };
        let Some(leaf) = parts.pop() else { return false };
        let mut dir = match self.dir.try_clone() {
            Ok(dir) => dir,
            Err(_) => return false,
        };
        for part in parts {
            dir = match open_dir(&dir, part) {
                Ok(next) => next,
                Err(_) => return false,
            };
        }
        let same_mode = dir.symlink_metadata(leaf).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o777 == mode);
        same_mode && read_regular(&dir, leaf, content.len() as u64).is_ok_and(|held| held == content)
    }

    /// Writes `content` at the relative path `name` under the directory
    /// (its directories made), with `mode`'s permission bits if given
    /// (at most `0o777`).
    pub fn write(&self, name: &str, content: &[u8], mode: Option<u32>) -> Result<(), SaveError> {
        let fail = |source: io::Error| SaveError { name: name.to_string(), source };
        let file = ExecFile::new(name, Vec::new());
        let relative =
            file.relative_path().map_err(|e| fail(io::Error::new(io::ErrorKind::InvalidInput, e.to_string())))?;
        let mut parts = components(relative).map_err(fail)?;
        let Some(leaf) = parts.pop() else { return Ok(()) };
        let parent: std::path::PathBuf = parts.iter().collect();
        let dir = create_dirs(&self.dir, &parent, None).map_err(fail)?;
        replace_with_mode(&dir, leaf, content, mode.map(|m| m & 0o777)).map_err(fail)
    }
}

/// An output file that [`OutputDir::save`] could not write.
#[derive(Debug, thiserror::Error)]
#[error("cannot save the output file {name:?}: {source}")]
pub struct SaveError {
    /// The file's name, relative to the output directory.
    pub name: String,
    /// Why (a refused symlink says so).
    #[source]
    pub source: io::Error,
}

/// The normal components of a relative path (`.` dropped); anything else is refused.
fn components(relative: &Path) -> io::Result<Vec<&OsStr>> {
    relative
        .components()
        .filter(|c| *c != Component::CurDir)
        .map(|c| match c {
            Component::Normal(name) => Ok(name),
            _ => Err(io::Error::new(io::ErrorKind::InvalidInput, "paths must be relative, without `..`")),
        })
        .collect()
}

/// Names the symlink when a no-follow open hit one (`ELOOP`, or `ENOTDIR`
/// from `open_dir_nofollow`).
fn explain(e: io::Error, name: &OsStr) -> io::Error {
    match e.raw_os_error() {
        Some(code) if code == rustix::io::Errno::LOOP.raw_os_error() => symlink_refused(name),
        _ => e,
    }
}

fn symlink_refused(name: &OsStr) -> io::Error {
    io::Error::other(format!(
        "refusing to go through the symlink {} (it could point outside the directory)",
        show(name)
    ))
}

fn show(name: &OsStr) -> String {
    name.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_planted_symlink_is_refused_and_its_target_untouched() {
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("host-file");
        std::fs::write(&target, "precious").unwrap();
        let root = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(&target, root.path().join("evil")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("sub")).unwrap();
        let out = OutputDir::open(root.path()).unwrap();
        for name in ["evil", "sub/evil", "sub/new"] {
            let err = out.save(&[ExecFile::new(name, "overwritten")]).unwrap_err();
            assert!(err.to_string().contains("symlink"), "{name}: {err}");
        }
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "precious");
        assert!(!outside.path().join("evil").exists() && !outside.path().join("new").exists());
    }

    #[test]
    fn the_directory_opened_before_the_run_is_the_one_written() {
        let root = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let path = root.path().join("out");
        let out = OutputDir::open(&path).unwrap();
        // What a program with a read-write grant over `root` could do during the run.
        std::fs::rename(&path, root.path().join("moved")).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), &path).unwrap();
        out.save(&[ExecFile::new("f.txt", "x")]).unwrap();
        assert!(!elsewhere.path().join("f.txt").exists(), "the save followed the swapped-in link");
        assert!(root.path().join("moved/f.txt").exists());
    }

    #[test]
    fn trees_deeper_than_any_stack_are_removed_without_following_links() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), "x").unwrap();
        let root = tempfile::tempdir().unwrap();
        let tree = root.path().join("tree");
        std::fs::create_dir(&tree).unwrap();
        // 5,000 levels on a 128 KiB stack: std's recursive removal needs a
        // frame per level and overflows it (a program can nest 100,000 levels).
        let dir = open_ambient(&tree).unwrap();
        let mut level = dir.try_clone().unwrap();
        for i in 0..5_000 {
            level.create_dir("d").unwrap();
            if i % 500 == 0 {
                level.write("f", "x").unwrap();
                level.symlink_contents(outside.path(), "link").unwrap();
            }
            level = level.open_dir("d").unwrap();
        }
        drop((level, dir));
        let removed = std::thread::Builder::new()
            .stack_size(128 << 10)
            .spawn(move || crate::owner::remove_tree(&tree).map(|()| tree.exists()))
            .unwrap()
            .join()
            .unwrap();
        assert!(!removed.unwrap(), "the tree is gone");
        assert!(outside.path().join("keep").exists(), "nothing was followed out of the tree");
    }

    #[test]
    fn files_are_replaced_not_written_into() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("a.txt"), "old").unwrap();
        std::fs::hard_link(root.path().join("a.txt"), root.path().join("link")).unwrap();
        let out = OutputDir::open(root.path()).unwrap();
        out.save(&[ExecFile::new("a.txt", "new"), ExecFile::new("d/e/f.txt", "deep")]).unwrap();
        assert_eq!(std::fs::read_to_string(root.path().join("a.txt")).unwrap(), "new");
        assert_eq!(std::fs::read_to_string(root.path().join("link")).unwrap(), "old", "the other link is untouched");
        assert_eq!(std::fs::read_to_string(root.path().join("d/e/f.txt")).unwrap(), "deep");
        let leftovers: Vec<_> = std::fs::read_dir(root.path())
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with(".execbox-"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn copies_refuse_links_fifos_and_oversized_files() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("ok"), "12345").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", root.path().join("link")).unwrap();
        let fifo = std::ffi::CString::new(root.path().join("fifo").to_str().unwrap()).unwrap();
        // SAFETY: `fifo` is a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        let dir = open_ambient(root.path()).unwrap();
        let copy = |name: &str, max: u64| copy_regular(&dir, name.as_ref(), &dir, "copy".as_ref(), 0o600, max);
        copy("ok", 5).unwrap();
        assert_eq!(std::fs::read(root.path().join("copy")).unwrap(), b"12345");
        assert!(copy("ok", 4).is_err());
        assert!(copy("link", 100).is_err());
        assert!(copy("fifo", 100).is_err());
    }
}
