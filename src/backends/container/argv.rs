//! The locked-down `run` command line, built in one place so tests can assert
//! exactly what a policy turns into.
//!
//! Every container's first process is an in-container timer: coreutils
//! `timeout --signal=KILL` with the run's deadline plus a grace, so the
//! container stops by itself even if the host process that watches it dies.
//! The timer is an execute-only copy of the image's `timeout` (made by
//! `install -m 0111` into a small tmpfs before the program starts): the
//! kernel marks a process that runs an unreadable binary non-dumpable, so the
//! program — same uid, no capabilities — cannot `ptrace` it or write its
//! memory, and as the container's PID 1 it ignores the program's signals it
//! has no handler for (`SIGKILL`, `SIGSTOP`). Its own handlers only end the
//! program early; the deadline timer stays armed.
//!
//! The same first process sets the file-size limit (`ulimit -f`, soft and
//! hard: the program cannot raise it) after making the copy, which a small
//! limit would otherwise cut, and drops the `PWD` its shell exported.
//!
//! Every container runs under execbox's own seccomp profile
//! (`--security-opt=seccomp=<file>`, see `seccomp.rs`), never the engine's
//! default: this is the one place that flag is added.

use std::path::PathBuf;
use std::time::Duration;

use super::outputs;
use crate::error::ConfigError;

/// Caller-supplied extra `run` arguments that cannot weaken isolation. Each
/// must be one `--flag=value` token (or a bare flag listed with no value), so
/// nothing can smuggle a second flag in as a "value".
const ALLOWED_EXTRA_FLAGS: &[(&str, bool)] = &[
    // (flag, takes a value)
    ("--runtime", true), // e.g. runsc (gVisor): stronger, never weaker
    ("--label", true),
    ("--cpu-shares", true),
    ("--cpuset-cpus", true),
    ("--cpuset-mems", true),
    ("--hostname", true),
    // Not `--init`: it would put the in-container timer under tini, where
    // the program could kill it (only PID 1 ignores the program's SIGKILL).
];

/// Checks extra `run` arguments against the allow-list. Anything that could
/// loosen a locked flag (`--network`, `--privileged`, `-v`, `--cap-add`,
/// `--security-opt`, so neither another seccomp profile nor `unconfined`,
/// `--user`, `--env`, ...) is refused, not reordered: a
/// [`ConfigError`] naming `ContainerConfig::extra_run_args`, the argument
/// and why.
pub(super) fn check_extra_args(args: &[String]) -> Result<(), ConfigError> {
    for arg in args {
        let (flag, value) = match arg.split_once('=') {
            Some((flag, value)) => (flag, Some(value)),
            None => (arg.as_str(), None),
        };
        let refuse = |reason: &str| {
            ConfigError::invalid("ContainerConfig::extra_run_args", format!("{arg:?} refused: {reason}"))
        };
        match ALLOWED_EXTRA_FLAGS.iter().find(|(name, _)| *name == flag) {
            None => {
                let allowed: Vec<&str> = ALLOWED_EXTRA_FLAGS.iter().map(|(n, _)| *n).collect();
                return Err(refuse(&format!("only these flags may be added: {}", allowed.join(", "))));
            }
            Some((_, true)) if value.is_none_or(str::is_empty) => {
                return Err(refuse("give the value in the same argument: --flag=value"));
            }
            Some((_, false)) if value.is_some() => return Err(refuse("this flag takes no value")),
            Some(_) => {}
        }
    }
    Ok(())
}

/// A host path made visible inside the container (a `--mount=type=bind`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Mount {
    /// Host file or directory (must exist).
    pub host: PathBuf,
    /// Absolute path inside the container.
    pub guest: String,
    /// Read-write instead of read-only.
    pub writable: bool,
}

/// `/work/out` of a run: a tmpfs inside the container, capped in bytes and
/// in inodes by the kernel (see the module docs of `outputs.rs`: nothing of
/// it is on the host).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutputTmpfs {
    /// `size=` of the tmpfs ([`ContainerConfig::max_output_total_bytes`](super::ContainerConfig::max_output_total_bytes),
    /// at least a page).
    pub bytes: u64,
    /// `nr_inodes=` of the tmpfs: the most files, directories and links
    /// the code can create there (32,768, its root included).
    pub inodes: u64,
    /// One-shot runs: the command runs under a wrapper that, once it ends,
    /// kills what is left of it and writes a listing of `/work/out` to
    /// stdout after the record marker of this nonce (the host takes it out
    /// of stdout). `None` for sessions, whose files are listed by `exec`.
    pub listing_nonce: Option<String>,
}

/// Everything one `run` needs, as [`Container::plan`](super::Container::plan)
/// shows it for audits: [`RunSpec::argv`] turns it into the exact arguments
/// execbox passes to the engine CLI.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RunSpec {
    /// The container's name, unique per run: timeouts kill it by name on the daemon side.
    pub name: String,
    /// Image reference.
    pub image: String,
    /// `--memory` and `--memory-swap` (equal: no swap).
    pub memory_bytes: u64,
    /// `--cpus`.
    pub cpus: f64,
    /// `--pids-limit`.
    pub pids: u64,
    /// Size of the `/tmp` tmpfs.
    pub tmp_bytes: u64,
    /// `uid:gid` the code runs as.
    pub user: String,
    /// This process's copy of execbox's seccomp profile
    /// (`--security-opt=seccomp=`; see `seccomp.rs`).
    pub seccomp_profile: PathBuf,
    /// Largest file the code may write (`RLIMIT_FSIZE`, soft and hard, set
    /// by the container's first process in 512-byte blocks, rounded down),
    /// if limited.
    pub max_file_bytes: Option<u64>,
    /// A private `NAME=VALUE` file holding exactly the request's variables
    /// (values never appear in argv, and never reach the CLI's own environment).
    pub env_file: Option<PathBuf>,
    /// Variables execbox itself sets, as `--env=NAME=VALUE` after the env
    /// file (so they win over the request's): `EXECBOX_TOOLS` on a run that
    /// may call tools, nothing else.
    pub env: Vec<(String, String)>,
    /// Bind mounts.
    pub mounts: Vec<Mount>,
    /// `/work/out`, when the run collects output files.
    pub output_dir: Option<OutputTmpfs>,
    /// Working directory inside the container.
    pub workdir: String,
    /// Allow-listed extra arguments (see
    /// [`ContainerConfig::extra_run_args`](super::ContainerConfig::extra_run_args)).
    pub extra_args: Vec<String>,
    /// Command and arguments inside the container.
    pub command: Vec<String>,
    /// When the container kills its command by itself (the in-container
    /// timer, see the module docs): the run's deadline plus a grace, so the
    /// host's own kill normally comes first.
    pub stop_after: Duration,
    /// Set on a warm container (see
    /// [`ContainerConfig::warm_containers`](super::ContainerConfig::warm_containers)):
    /// the command runs under a wrapper that, once it ends, kills what is
    /// left of it, lists `/work/out` if collected, and writes an end record
    /// with this nonce and the exit code to both streams, so the host has
    /// the result without waiting for the engine to stop the container.
    pub end_nonce: Option<String>,
    /// What the container is for, as its `execbox.role` label: `run` (one
    /// run), `warm` (a pre-started one waiting for its run), `session`,
    /// `compile` (a Rust build) or `probe` (the availability check's seccomp
    /// probe), so an operator's `docker ps --filter` can tell them apart.
    pub role: &'static str,
}

/// Where the in-container timer's execute-only copy lives (a tmpfs).
const STOP_DIR: &str = "/opt/execbox/stop";

/// The container's first process: copy `timeout` execute-only, limit file
/// sizes, then run the command under the timer. `$1` is the file-size limit
/// (blocks or `unlimited`), `$2` the time limit, the rest the command.
/// Absolute paths: the request's environment (its `PATH` too) is already
/// set for this shell. Loader variables (`LD_*`) are refused up front
/// (`executor::validate_env`), so they cannot reach `install` or `timeout`.
const STOP_SCRIPT: &str = "/usr/bin/install -m 0111 /usr/bin/timeout /opt/execbox/stop/timeout && \
     ulimit -f \"$1\" && shift && unset PWD && \
     exec /opt/execbox/stop/timeout --signal=KILL \"$@\"";

/// Labels on every container: execbox's, and who started it (see
/// `owners.rs`), so a later process can clean up after a dead one.
fn locked_labels(role: &str) -> [String; 4] {
    [
        "--label=execbox=1".into(),
        format!("--label={}={role}", super::owners::ROLE_LABEL),
        format!("--label={}={}", super::owners::OWNER_LABEL, crate::owner::token()),
        format!("--label={}={}", super::owners::SCOPE_LABEL, super::owners::scope()),
    ]
}

/// `timeout`'s duration argument: seconds with millisecond precision, at
/// least 1 ms (`0` would mean "no limit" to coreutils).
fn stop_duration(limit: Duration) -> String {
    let ms = limit.as_millis().clamp(1, u128::from(u64::MAX));
    format!("{}.{:03}s", ms / 1000, ms % 1000)
}

impl RunSpec {
    /// The arguments after the engine program (`docker`/`podman`): every
    /// locked flag (see the [module docs](super)), the limits, labels,
    /// mounts, the in-container timer and the command.
    ///
    /// Extra arguments come first and the locked flags after them, so even a
    /// flag that slipped past the allow-list would be overridden by the
    /// locked value (for single-valued flags the last one wins).
    pub fn argv(&self) -> Vec<String> {
        run_argv(self)
    }
}

fn run_argv(spec: &RunSpec) -> Vec<String> {
    let mut argv: Vec<String> = vec!["run".into(), "--interactive".into(), format!("--name={}", spec.name)];
    argv.extend(spec.extra_args.iter().cloned());
    argv.extend([
        "--pull=never".to_string(),
        "--network=none".into(),
        "--read-only".into(),
        format!("--tmpfs=/tmp:rw,nosuid,nodev,noexec,size={},mode=1777", spec.tmp_bytes),
        format!("--memory={}", spec.memory_bytes),
        format!("--memory-swap={}", spec.memory_bytes),
        format!("--cpus={}", spec.cpus),
        format!("--pids-limit={}", spec.pids),
        format!("--user={}", spec.user),
        "--cap-drop=ALL".into(),
        "--security-opt=no-new-privileges".into(),
        format!("--security-opt=seccomp={}", spec.seccomp_profile.display()),
        "--ipc=none".into(),
        "--log-driver=none".into(),
        // The timer's copy: executable, tiny, nothing else lives there.
        format!("--tmpfs={STOP_DIR}:rw,nosuid,nodev,exec,size=256k,mode=1777"),
    ]);
    argv.extend(locked_labels(spec.role));
    for mount in &spec.mounts {
        let mode = if mount.writable { "" } else { ",readonly" };
        argv.push(format!("--mount=type=bind,src={},dst={}{mode}", mount.host.display(), mount.guest));
    }
    if let Some(out) = &spec.output_dir {
        argv.push(outputs::tmpfs_arg(out.bytes, out.inodes));
    }
    if let Some(file) = &spec.env_file {
        argv.push(format!("--env-file={}", file.display()));
    }
    for (name, value) in &spec.env {
        argv.push(format!("--env={name}={value}"));
    }
    argv.push(format!("--workdir={}", spec.workdir));
    argv.push(spec.image.clone());
    argv.extend(["/bin/sh".into(), "-c".into(), STOP_SCRIPT.into(), "execbox-stop".into()]);
    argv.push(spec.max_file_bytes.map_or("unlimited".into(), |bytes| (bytes / 512).to_string()));
    argv.push(stop_duration(spec.stop_after));
    let listing = spec.output_dir.as_ref().and_then(|out| Some((out, out.listing_nonce.as_ref()?)));
    if let Some(nonce) = &spec.end_nonce {
        let collect = if listing.is_some() { "1" } else { "0" };
        argv.extend(["/bin/sh".into(), "-c".into(), outputs::WARM_AFTER_SCRIPT.into(), "execbox-end".into()]);
        argv.extend([nonce.clone(), collect.into()]);
        argv.extend(outputs::script_args(listing.map_or(0, |(out, _)| out.bytes)));
    } else if let Some((out, nonce)) = listing {
        argv.extend(["/bin/sh".into(), "-c".into(), outputs::AFTER_SCRIPT.into(), "execbox-out".into(), nonce.clone()]);
        argv.extend(outputs::script_args(out.bytes));
    }
    argv.extend(spec.command.iter().cloned());
    argv
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_args_allow_list() {
        let ok = |a: &[&str]| check_extra_args(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert!(ok(&["--runtime=runsc", "--label=team=a"]).is_ok());
        for bad in ["--network=host", "--privileged", "-v=/:/host", "--cap-add=SYS_ADMIN", "--runtime", "--init"] {
            assert!(ok(&[bad]).is_err(), "{bad} must be refused");
        }
        // No other seccomp profile, and no way to turn execbox's off.
        for bad in ["--security-opt=seccomp=unconfined", "--security-opt=seccomp=/tmp/mine.json", "--security-opt"] {
            assert!(ok(&[bad]).is_err(), "{bad} must be refused");
        }
    }

    #[test]
    fn stop_durations_never_mean_no_limit() {
        assert_eq!(stop_duration(Duration::from_millis(3500)), "3.500s");
        assert_eq!(stop_duration(Duration::ZERO), "0.001s");
        assert_eq!(stop_duration(Duration::from_secs(300)), "300.000s");
    }
}
