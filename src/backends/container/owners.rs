//! Who owns a container, and cleaning up after owners that are gone.
//!
//! A container's life is bounded three ways, so that it never outlives its
//! deadline plus a grace whatever happens to the host process:
//!
//! 1. while the host lives, it kills the container at the deadline
//!    ([`super::process`]);
//! 2. whatever happens to the host, the container's first process kills its
//!    command at the deadline plus a grace ([`super::argv`]'s timer);
//! 3. records and files of a host that died are removed: at once by the
//!    host's **watcher** ([`start`]: a small `sh` that waits on a pipe only
//!    the host holds and, when the host is gone however it died, removes the
//!    host's containers and temp dirs), and at the latest by the next
//!    execbox process's **sweep** ([`start`] too: containers of dead owners
//!    in this PID namespace, and stopped ones of an earlier boot).
//!
//! Why not the engine's `--rm`: a removed container cannot be inspected,
//! and only the daemon's record tells an OOM kill (exit 137 + `OOMKilled`)
//! from any other `SIGKILL`.
//!
//! Every container carries [`OWNER_LABEL`] (the host's
//! [`owner::token`](crate::owner::token): pid and start time) and
//! [`SCOPE_LABEL`] (boot id and PID namespace): liveness can only be judged
//! for owners in the same PID namespace of the same boot, so the sweep never
//! touches another namespace's running containers (a shared daemon socket).

use parking_lot::Mutex;
use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Stdio};
use std::time::Duration;

use super::process;
use crate::owner;

/// Label naming the process that started a container.
pub(super) const OWNER_LABEL: &str = "execbox.owner";
/// Label naming the boot and PID namespace that owner lives in.
pub(super) const SCOPE_LABEL: &str = "execbox.scope";

/// The label naming what a container is for (see `RunSpec::role`).
pub(super) const ROLE_LABEL: &str = "execbox.role";

/// Most containers one sweep removes: a start-up never does unbounded work.
const MAX_SWEPT: usize = 1000;
/// Containers per `rm` command.
const RM_BATCH: usize = 100;
/// Largest `ps` listing read (about 10,000 containers).
const MAX_LISTING_BYTES: usize = 1 << 20;

/// `<boot id>.<PID namespace inode>` of this process.
pub(super) fn scope() -> &'static str {
    owner::namespace()
}

/// Once per process and engine, off the request path: starts the watcher
/// and the sweep of dead owners' containers. Failures are logged, never
/// raised: cleanup is a backstop, not a reason to refuse a run.
pub(super) fn start(engine: &Path) {
    static STARTED: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);
    let mut started = STARTED.lock();
    if !started.get_or_insert_with(HashSet::new).insert(engine.to_path_buf()) {
        return;
    }
    drop(started);
    match spawn_watcher(engine) {
        Ok(pipe) => WATCHERS.lock().push(pipe),
        Err(e) => tracing::warn!(engine = %engine.display(), error = %e, "cannot start the container watcher"),
    }
    let engine = engine.to_path_buf();
    let spawned = std::thread::Builder::new().name("execbox-sweep".into()).spawn(move || {
        let removed = sweep(&engine);
        tracing::debug!(removed, "swept containers of execbox processes that are gone");
    });
    match spawned {
        Ok(handle) => SWEEPS.lock().push(handle),
        Err(e) => tracing::warn!(error = %e, "cannot start the container sweep"),
    }
}

/// Sweeps started and not yet joined.
static SWEEPS: Mutex<Vec<std::thread::JoinHandle<()>>> = Mutex::new(Vec::new());

/// Waits for the sweeps started so far (each bounded by its engine
/// commands' timeouts): a short-lived process (one CLI run) must not exit
/// with a sweep half done.
pub(super) fn finish_sweeps() {
    let sweeps = std::mem::take(&mut *SWEEPS.lock());
    for sweep in sweeps {
        drop(sweep.join());
    }
}

/// The write ends of the watchers' pipes: held, never written, closed by the
/// kernel when this process ends (however it ends), which wakes the watchers.
static WATCHERS: Mutex<Vec<ChildStdin>> = Mutex::new(Vec::new());

/// The watcher: waits for EOF on stdin (this process is gone), then removes
/// the containers labelled with its owner token — twice, 2 s apart, to catch
/// a `run` the engine was still creating — and the owner's temp dirs.
/// `$1` engine, `$2` owner token, `$3` temp dir.
const WATCHER_SCRIPT: &str = r#"while read -r _; do :; done
for pass in 1 2; do
  ids=$("$1" ps -aq --filter "label=execbox.owner=$2")
  [ -n "$ids" ] && "$1" rm -f $ids >/dev/null 2>&1
  [ "$pass" = 2 ] || sleep 2
done
rm -rf "$3"/execbox-*-"$2"-*
"#;

fn spawn_watcher(engine: &Path) -> io::Result<ChildStdin> {
    let mut command = process::engine_command(Path::new("/bin/sh"));
    command
        .args(["-c", WATCHER_SCRIPT, "execbox-watcher"])
        .arg(engine)
        .arg(owner::token())
        .arg(std::env::temp_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = command.spawn()?;
    // The child is never waited for: it outlives this process by design.
    child.stdin.take().ok_or_else(|| io::Error::other("no stdin pipe"))
}

/// One container in an engine listing.
#[derive(Debug, PartialEq)]
struct Listed<'a> {
    id: &'a str,
    owner: &'a str,
    scope: &'a str,
    running: bool,
}

/// Whether the sweep removes `c`: its owner is judged gone. Same scope: the
/// owner's pid and start time no longer match a live process. An earlier
/// boot: every owner is gone, but only stopped containers are removed (a
/// running one belongs to a daemon this process does not share a kernel
/// with). Another PID namespace of this boot: left alone.
fn is_stale(c: &Listed<'_>, my_scope: &str, me: &str) -> bool {
    if c.owner.is_empty() || c.owner == me {
        return false;
    }
    if c.scope == my_scope {
        return !owner::is_alive(c.owner);
    }
    let boot = |scope: &str| scope.rsplit_once('.').map(|(boot, _)| boot.to_string()).unwrap_or_default();
    !c.running && !c.scope.is_empty() && boot(c.scope) != boot(my_scope)
}

/// Removes containers of dead owners (at most [`MAX_SWEPT`]); how many.
fn sweep(engine: &Path) -> usize {
    let format = format!(
        "--format={{{{.ID}}}}\t{{{{.Label \"{OWNER_LABEL}\"}}}}\t{{{{.Label \"{SCOPE_LABEL}\"}}}}\t{{{{.State}}}}"
    );
    let listing = process::bounded_output(
        process::engine_command(engine).args(["ps", "--all", "--no-trunc", "--filter=label=execbox=1", &format]),
        process::HOUSEKEEPING_TIMEOUT,
        MAX_LISTING_BYTES,
    );
    let Ok(listing) = listing.inspect_err(|e| tracing::debug!(error = %e, "cannot list containers to sweep")) else {
        return 0;
    };
    let text = String::from_utf8_lossy(&listing.stdout);
    let stale: Vec<&str> = text
        .lines()
        .filter_map(|line| {
            let mut f = line.split('\t');
            Some(Listed { id: f.next()?, owner: f.next()?, scope: f.next()?, running: f.next()? == "running" })
        })
        .filter(|c| is_stale(c, scope(), owner::token()))
        .map(|c| c.id)
        .take(MAX_SWEPT)
        .collect();
    for batch in stale.chunks(RM_BATCH) {
        remove(engine, batch, process::HOUSEKEEPING_TIMEOUT);
    }
    stale.len()
}

/// Kills and removes every container this process started on `engine`,
/// each engine command bounded by `limit`.
pub(super) fn remove_own(engine: &Path, limit: Duration) {
    let filter = format!("--filter=label={OWNER_LABEL}={}", owner::token());
    let listing = process::bounded_output(
        process::engine_command(engine).args(["ps", "--all", "--quiet", &filter]),
        limit,
        MAX_LISTING_BYTES,
    );
    if let Ok(listing) = listing {
        let text = String::from_utf8_lossy(&listing.stdout);
        let ids: Vec<&str> = text.split_whitespace().collect();
        for batch in ids.chunks(RM_BATCH) {
            remove(engine, batch, limit);
        }
    }
}

/// Removes this process's staging directories (`execbox-run-<owner>-*`,
/// `execbox-rustc-<owner>-*`), tool sockets (`execbox-tools-<owner>-*`) and
/// its copy of the seccomp profile (`execbox-seccomp-<owner>-*`), for a host
/// about to exit on a signal: its `TempDir` handles will never be dropped.
/// From then on no container backend of this process makes such a
/// directory, so none is left behind by a run that was still starting.
pub(super) fn remove_own_temp_dirs() {
    const KINDS: [&str; 4] = ["run", "rustc", "tools", "seccomp"];
    // None is made after this: a run starting on another thread cannot
    // leave one behind the sweep.
    owner::close_temp_dirs(&KINDS);
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    let prefixes = KINDS.map(|what| format!("execbox-{what}-{}-", owner::token()));
    for entry in entries.flatten() {
        let name = entry.file_name();
        let ours = name.to_str().is_some_and(|n| prefixes.iter().any(|p| n.starts_with(p.as_str())));
        // Never follow a link planted under an execbox-like name.
        if ours && entry.file_type().is_ok_and(|t| t.is_dir()) {
            drop(crate::owner::remove_tree(&entry.path()));
        }
    }
}

fn remove(engine: &Path, ids: &[&str], limit: Duration) {
    let mut command = process::engine_command(engine);
    command.args(["rm", "--force"]).args(ids);
    if let Err(e) = process::bounded_output(&mut command, limit, 64 << 10) {
        tracing::debug!(error = %e, "cannot remove containers");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_owners_known_to_be_gone_are_stale() {
        let mine = "boot-a.4026531836";
        let me = owner::token();
        let c = |owner: &'static str, scope: &'static str, running: bool| Listed { id: "x", owner, scope, running };
        assert!(is_stale(&c("999999999.1", mine, true), mine, me), "dead owner, same scope");
        assert!(!is_stale(&c(me, mine, true), mine, me), "this process");
        assert!(!is_stale(&c("", mine, false), mine, me), "no owner label: not execbox's to judge");
        assert!(!is_stale(&c("999999999.1", "boot-a.1234", false), mine, me), "another PID namespace");
        assert!(is_stale(&c("999999999.1", "boot-b.4026531836", false), mine, me), "a stopped one of an earlier boot");
        assert!(!is_stale(&c("999999999.1", "boot-b.4026531836", true), mine, me), "a running one elsewhere");
    }

    #[test]
    fn scope_names_boot_and_namespace() {
        let (boot, ns) = scope().rsplit_once('.').unwrap();
        assert_eq!(boot.len(), 36, "{boot}");
        assert!(!ns.is_empty() && ns.chars().all(|c| c.is_ascii_digit()), "{ns}");
    }
}
