//! Who owns what execbox leaves on the host while a run is in flight, so a
//! later process can clean up after one that was killed.
//!
//! Every temporary directory is named `execbox-<what>-<owner>-<random>` and
//! every container carries the label `execbox.owner=<owner>`, where `<owner>`
//! is [`token`]: this process's pid and its start time (so a reused pid is
//! not mistaken for its predecessor). [`sweep_stale_temp_dirs`] removes the
//! directories of owners that are gone. The artifact store marks the
//! scopes a process owns the same way (see `artifacts::store`), with
//! [`namespace`] and [`host`] so that liveness is judged only where it can be.

#[cfg(any(feature = "wasm", feature = "container"))]
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// This process's owner token: `<pid>.<start time in clock ticks since boot>`.
pub(crate) fn token() -> &'static str {
    static TOKEN: OnceLock<String> = OnceLock::new();
    TOKEN.get_or_init(|| {
        let pid = std::process::id();
        format!("{pid}.{}", start_time(pid).unwrap_or(0))
    })
}

/// Whether the process that `token` names still runs (false for tokens
/// this module did not make, and for a zombie: killed, not yet reaped by
/// its parent, it never runs again).
pub(crate) fn is_alive(token: &str) -> bool {
    let Some((pid, start)) = token.split_once('.') else { return false };
    let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), start.parse::<u64>()) else { return false };
    stat(pid).is_some_and(|(state, now)| now == start && !matches!(state, 'Z' | 'X'))
}

/// `<boot id>.<PID namespace inode>` of this process: an owner token can
/// be judged alive or dead only by a process of the same namespace of the
/// same boot (another PID namespace numbers its processes apart).
#[cfg(any(feature = "container", feature = "artifacts"))]
pub(crate) fn namespace() -> &'static str {
    static NAMESPACE: OnceLock<String> = OnceLock::new();
    NAMESPACE.get_or_init(|| {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let pidns = std::fs::read_link("/proc/self/ns/pid").map(|p| p.display().to_string()).unwrap_or_default();
        let digits: String = pidns.chars().filter(char::is_ascii_digit).collect();
        format!("{}.{digits}", boot.trim())
    })
}

/// The boot id in a [`namespace`] (empty if it has none).
#[cfg(feature = "artifacts")]
pub(crate) fn boot_of(namespace: &str) -> &str {
    namespace.rsplit_once('.').map_or("", |(boot, _)| boot)
}

/// This machine's host name (of this process's UTS namespace; empty if
/// unknown): tells an earlier boot of this machine from another machine
/// sharing a directory.
#[cfg(feature = "artifacts")]
pub(crate) fn host() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default().trim().to_string())
}

/// Field 22 of `/proc/<pid>/stat`: when the process started.
fn start_time(pid: u32) -> Option<u64> {
    stat(pid).map(|(_, start)| start)
}

/// Fields 3 (its state: `Z` for a zombie) and 22 (when it started) of
/// `/proc/<pid>/stat`.
fn stat(pid: u32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: skip past its last `)`.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?.chars().next()?;
    Some((state, fields.nth(18)?.parse().ok()?))
}

/// A new directory `execbox-<what>-<owner>-<random>` in the system temp
/// dir, removed when the handle drops. Its mode is the default (`0o777` less
/// the umask): a container's unprivileged user reaches what is staged
/// below a run's.
#[cfg(any(feature = "wasm", feature = "container"))]
pub(crate) fn temp_dir(what: &str) -> std::io::Result<tempfile::TempDir> {
    make_temp_dir(what, None)
}

/// [`temp_dir`], but `0o700`: for what only this user's processes (the
/// engine CLI) read.
#[cfg(feature = "container")]
pub(crate) fn private_temp_dir(what: &str) -> std::io::Result<tempfile::TempDir> {
    make_temp_dir(what, Some(0o700))
}

/// `execbox-<what>-<owner>-<random>`, with `mode` if given, unless `what`
/// is closed (see [`close_temp_dirs`]).
#[cfg(any(feature = "wasm", feature = "container"))]
fn make_temp_dir(what: &str, mode: Option<u32>) -> std::io::Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    sweep_stale_temp_dirs();
    let closed = TEMP_DIRS_CLOSED.read();
    if closed.contains(&what) {
        return Err(std::io::Error::other("the host is shutting down"));
    }
    let prefix = format!("execbox-{what}-{}-", token());
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix);
    if let Some(mode) = mode {
        builder.permissions(std::fs::Permissions::from_mode(mode));
    }
    builder.tempdir()
}

/// The kinds of temporary directory this process makes no more (see
/// [`close_temp_dirs`]). A maker holds the read lock while it checks and
/// creates, so a directory is either made before a close or not at all.
#[cfg(any(feature = "wasm", feature = "container"))]
static TEMP_DIRS_CLOSED: parking_lot::RwLock<Vec<&'static str>> = parking_lot::RwLock::new(Vec::new());

/// For a host about to exit on a signal: no directory of the kinds `whats`
/// is made from now on (a maker gets an error), so a sweep of them that
/// follows removes every one this process made, even while a run on
/// another thread is still starting.
#[cfg(feature = "container")]
pub(crate) fn close_temp_dirs(whats: &[&'static str]) {
    TEMP_DIRS_CLOSED.write().extend_from_slice(whats);
}

/// Removes, once per process and in the background, the temporary
/// directories of execbox processes that are gone (killed before they could
/// clean up). Off the request path: a dead host may have left a tree that
/// takes long to remove (a program can nest 100,000 directories in its
/// output directory).
#[cfg(any(feature = "wasm", feature = "container"))]
pub(crate) fn sweep_stale_temp_dirs() {
    static SWEPT: OnceLock<()> = OnceLock::new();
    SWEPT.get_or_init(|| {
        let started =
            std::thread::Builder::new().name("execbox-sweep".into()).spawn(|| sweep_in(&std::env::temp_dir()));
        if let Err(e) = started {
            tracing::warn!(error = %e, "cannot start the stale temp dir sweep");
        }
    });
}

/// The sweep of one directory (tests point it elsewhere).
#[cfg(any(feature = "wasm", feature = "container"))]
pub(crate) fn sweep_in(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(owner) = name.to_str().and_then(owner_of) else { continue };
        if owner == token() || is_alive(owner) {
            continue;
        }
        // Never follow a link planted under an execbox-like name.
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            let path: PathBuf = entry.path();
            match remove_stale_tree(&path) {
                Ok(()) => tracing::debug!(path = %path.display(), "removed a stale execbox temp dir"),
                Err(e) => tracing::warn!(path = %path.display(), error = %e, "cannot remove a stale execbox temp dir"),
            }
        }
    }
}

/// Removes a directory tree without recursing per level (a deep tree left by
/// a program must not overflow this thread's stack).
#[cfg(any(feature = "wasm", feature = "container"))]
fn remove_stale_tree(path: &Path) -> std::io::Result<()> {
    #[cfg(feature = "container")]
    {
        remove_tree(path)
    }
    // Without containers, execbox's temp dirs hold only what it staged
    // itself (wasm guests see them read-only): shallow.
    #[cfg(not(feature = "container"))]
    {
        std::fs::remove_dir_all(path)
    }
}

/// Removes the directory `path` and everything below it, however deep,
/// without following a link, with a bounded stack and two directory handles
/// open at a time.
///
/// Why not `std::fs::remove_dir_all`: it recurses once per level, and a
/// program can nest directories in `/work/out` far deeper than any thread's
/// stack (measured: 100,000 levels in ~8 s overflowed the reaper's stack and
/// aborted the host). Here each pass over `path` removes what is not a
/// directory, lifts the directories inside each subdirectory up to `path`
/// (a rename: one level, no recursion), then removes the emptied
/// subdirectory; a chain of depth d takes d cheap passes.
#[cfg(feature = "container")]
pub(crate) fn remove_tree(path: &Path) -> std::io::Result<()> {
    empty_tree(path)?;
    std::fs::remove_dir(path)
}

/// Removes everything inside `path`, keeping `path` itself; as
/// [`remove_tree`], without recursion and without following links.
#[cfg(feature = "container")]
fn empty_tree(path: &Path) -> std::io::Result<()> {
    let root = cap_std::fs::Dir::open_ambient_dir(path, cap_std::ambient_authority())?;
    let lifted = format!(".execbox-lifted-{:016x}-", crate::nonce::random_u64());
    let mut count = 0u64;
    loop {
        let mut emptied = true;
        for entry in root.entries()? {
            emptied = false;
            let name = entry?.file_name();
            let Some(meta) = gone_is_none(root.symlink_metadata(&name))? else { continue };
            if !meta.is_dir() {
                gone_is_none(root.remove_file(&name))?;
                continue;
            }
            let Some(dir) = gone_is_none(cap_fs_ext::DirExt::open_dir_nofollow(&root, &name))? else { continue };
            for sub in dir.entries()? {
                let sub = sub?.file_name();
                match gone_is_none(dir.symlink_metadata(&sub))? {
                    Some(meta) if meta.is_dir() => {
                        count += 1;
                        gone_is_none(dir.rename(&sub, &root, format!("{lifted}{count}")))?;
                    }
                    Some(_) => drop(gone_is_none(dir.remove_file(&sub))?),
                    None => {}
                }
            }
            // Not empty only if something is still writing: the next pass retries.
            match root.remove_dir(&name) {
                Err(e) if e.raw_os_error() == Some(libc::ENOTEMPTY) => {}
                other => drop(gone_is_none(other)?),
            }
        }
        if emptied {
            break;
        }
    }
    Ok(())
}

/// `Ok(None)` for an entry that vanished meanwhile.
#[cfg(feature = "container")]
fn gone_is_none<T>(result: std::io::Result<T>) -> std::io::Result<Option<T>> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// The owner token in `execbox-<what>-<pid>.<start>-<random>`.
#[cfg(any(feature = "wasm", feature = "container"))]
fn owner_of(name: &str) -> Option<&str> {
    let rest = name.strip_prefix("execbox-")?;
    let mut parts = rest.splitn(3, '-');
    let (_what, owner, _random) = (parts.next()?, parts.next()?, parts.next()?);
    owner.contains('.').then_some(owner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_token_is_alive_and_a_dead_one_is_not() {
        assert!(is_alive(token()));
        assert!(!is_alive("999999999.1"));
        assert!(!is_alive("garbage"));
        // A killed child is a zombie until it is reaped: dead all the same.
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        let child_token = format!("{pid}.{}", start_time(pid).unwrap());
        assert!(is_alive(&child_token));
        child.kill().unwrap();
        // Nothing announces the zombie to a parent that does not reap: it is looked for.
        let zombie = (0..2000).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(5));
            stat(pid).is_some_and(|(state, _)| state == 'Z')
        });
        assert!(zombie, "the killed child is a zombie");
        assert!(!is_alive(&child_token));
        child.wait().unwrap();
        assert!(!is_alive(&child_token));
    }

    #[cfg(any(feature = "wasm", feature = "container"))]
    #[test]
    fn sweep_removes_only_dirs_of_dead_owners() {
        let root = tempfile::tempdir().unwrap();
        let dead = root.path().join("execbox-run-999999999.1-abc");
        let mine = root.path().join(format!("execbox-run-{}-abc", token()));
        let other = root.path().join("not-execbox-run-1.1-abc");
        for dir in [&dead, &mine, &other] {
            std::fs::create_dir(dir).unwrap();
            std::fs::write(dir.join("f"), b"x").unwrap();
        }
        sweep_in(root.path());
        assert!(!dead.exists());
        assert!(mine.exists());
        assert!(other.exists());
    }
}
