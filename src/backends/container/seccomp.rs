//! execbox's own seccomp profile, which every container it starts runs
//! under (`--security-opt=seccomp=<file>`, added in one place: `argv.rs`),
//! and the check that the engine really applies it.
//!
//! **Why its own.** A container started without one gets the engine's
//! default profile, and that depends on the engine's version: Debian's
//! docker 20.10 still allows `io_uring_setup`, `io_uring_enter` and
//! `io_uring_register` (moby's default denies them since docker 25; measured here:
//! `io_uring_setup` reached the kernel of an execbox container on 6.18 with
//! `kernel.io_uring_disabled = 0`). A sandbox for hostile code must not
//! inherit its system call surface from whatever engine the user has.
//!
//! **What it is.** `seccomp.json`, in docker's profile format (podman reads
//! the same), is moby's default profile — moby/profiles `seccomp/v0.2.3`
//! (commit `836ae4d37ef2`), as vendored by moby/moby at `b985e2313a86`
//! (docker v29.7.2+) — with what hostile code does not need taken out, by
//! `scripts/derive-seccomp-profile.py`, which argues each change:
//!
//! - `io_uring_*`: absent from every allow rule, so denied (`EPERM`);
//! - `ptrace`, `process_vm_readv`, `process_vm_writev`: denied (moby allows
//!   them on kernels >= 4.8): the program would otherwise read and write
//!   the memory of the other processes of its container, all under its uid;
//! - every rule that only applies to a capability is dropped (execbox
//!   containers have none), so `mount` and the new mount API, `unshare`,
//!   `setns`, `bpf`, `perf_event_open`, `kcmp`, `pidfd_getfd`, ... stay
//!   denied without relying on the engine's reading of `includes.caps`;
//!   `clone` with namespace flags is denied and `clone3` answers `ENOSYS`
//!   (so libc falls back to `clone`, whose flags a filter can see);
//! - no 32-bit (x86 `int 0x80`, x32, arm) system calls: the runtime kills a
//!   process that makes one (`SIGSYS`);
//! - `socket` only for `AF_UNIX`, `AF_INET`, `AF_INET6`, `AF_NETLINK`,
//!   `socketpair` only for `AF_UNIX`, no `socketcall`;
//! - `modify_ldt`: denied;
//! - `mknod`/`mknodat` of a FIFO: denied (regular files and sockets only;
//!   devices need a capability). Containers share workspaces with wasm runs,
//!   whose host thread stats a path and then opens it: a FIFO swapped in
//!   between would hold that thread past its deadline (`wasm/fs_guard.rs`);
//! - `fcntl(F_SETLEASE)`: denied (every other command allowed, compared on
//!   the whole register). A lease makes another process's open of the file
//!   wait for its holder, up to `fs.lease-break-time` (45 s): the same
//!   wasm run's thread would wait past its deadline.
//!
//! `userfaultfd`, `keyctl`, `add_key` and `request_key` are denied by moby's
//! default already and stay so.
//!
//! **The file.** The docker CLI reads the profile client-side and sends its
//! text to the daemon; podman reads the path. Either way it is a file, one
//! per process: `execbox-seccomp-<owner>-<random>/profile.json` in the
//! temp dir (the directory `0700`, the file `0600`, written through a
//! directory handle, never through a link), written on first use and again
//! if something removed it, and removed when the process's last container
//! backend is dropped ([`Hold`]). Like every `execbox-*-<owner>-*`
//! directory it is also removed by
//! [`Container::shutdown`](super::Container::shutdown), by the process's
//! watcher when the process ends, or by a later process's sweep.
//!
//! **The check.** An engine may ignore a profile (a runtime without
//! seccomp, gVisor's `runsc` without `--oci-seccomp`): the availability
//! check starts one container exactly as a run's, whose program ([`PROBE`])
//! reads its seccomp mode and makes seven calls with arguments the kernel
//! itself would refuse with another error (`EFAULT`, `EBADF`, `EINVAL`,
//! `ESRCH`, `EAFNOSUPPORT`, `ENOENT`): only a filter answers them all
//! `EPERM`. Four of them (`ptrace`, `socket` of an unknown family,
//! `mknodat` of a FIFO and `fcntl(F_SETLEASE)`) are allowed by the engines'
//! own defaults, so the answer proves execbox's profile (or a stricter
//! one), not some default. [`judge`] reads the verdict; the
//! backend reports itself unavailable, with the reason, unless every call
//! was denied. A positive verdict is kept for the process's life per
//! engine, probe image and extra `run` arguments (see [`ProbeKey`]),
//! until an engine failure forgets it: one container start once per
//! process (measured in docs/backends.md), never on a run that finds it
//! kept.

use parking_lot::Mutex;
use std::collections::HashSet;
use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};

use crate::backend::Unavailable;
use crate::hostfs;

/// The profile's text, in docker's format (see the module docs).
pub(super) const PROFILE: &str = include_str!("seccomp.json");

/// The profile's file name inside its directory.
const FILE_NAME: &str = "profile.json";

/// This process's copy of the profile: the directory that owns it, and its path.
struct Staged {
    /// Removes the directory when dropped (the last backend went, or the
    /// file was found gone and is written again).
    _dir: tempfile::TempDir,
    path: PathBuf,
}

/// The copy, and how many backends hold it ([`Hold`]).
struct Copy {
    holders: usize,
    staged: Option<Staged>,
}

static COPY: Mutex<Copy> = Mutex::new(Copy { holders: 0, staged: None });

/// A backend's hold on this process's copy of the profile: when the last
/// hold drops (the last container backend of the process is gone, after
/// every container it started), the copy is removed, so nothing of a
/// backend outlives it.
pub(super) struct Hold(());

impl Hold {
    /// A hold; the copy itself is written on first use ([`profile_path`]).
    pub fn new() -> Self {
        COPY.lock().holders += 1;
        Hold(())
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut copy = COPY.lock();
        copy.holders = copy.holders.saturating_sub(1);
        if copy.holders == 0 {
            copy.staged = None;
        }
    }
}

/// The path of this process's copy of the profile, written now if there is
/// none or it was removed (see the module docs). An error (which says it
/// could not write the profile) means no container can start under the
/// profile: then none starts. Called with no [`Hold`] (a test), the copy
/// stays until the process's watcher or a later sweep removes it.
pub(super) fn profile_path() -> io::Result<PathBuf> {
    let mut copy = COPY.lock();
    if let Some(current) = copy.staged.as_ref()
        && is_intact(&current.path)
    {
        return Ok(current.path.clone());
    }
    let context = |e: io::Error| io::Error::new(e.kind(), format!("cannot write execbox's seccomp profile: {e}"));
    let dir = crate::owner::private_temp_dir("seccomp").map_err(context)?;
    let handle = hostfs::open_ambient(dir.path()).map_err(context)?;
    hostfs::write_new(&handle, OsStr::new(FILE_NAME), PROFILE.as_bytes(), 0o600).map_err(context)?;
    let path = dir.path().join(FILE_NAME);
    copy.staged = Some(Staged { _dir: dir, path: path.clone() });
    Ok(path)
}

/// Whether the copy at `path` is still there: a regular file (not a link)
/// of the profile's length. Nobody else can write in its `0700` directory;
/// this catches a temp cleaner, or [`Container::shutdown`](super::Container::shutdown)
/// of another backend of this process, having removed it.
fn is_intact(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|meta| meta.is_file() && meta.len() == PROFILE.len() as u64)
}

/// The probe's program (Python, run by the image's `/usr/bin/python3`):
/// prints one line, `execbox-seccomp-probe: mode=M name=RESULT ...`, where
/// a result is an errno name, `OK`, or `SKIPPED` (an architecture whose
/// `ptrace` number it does not know). Each call's arguments make the kernel
/// refuse it with an error other than `EPERM` if no filter stops it first:
/// `io_uring_setup(1, NULL)` → `EFAULT` (or `EPERM` when the host disables
/// io_uring: the other two still tell), `io_uring_enter(-1, ...)` →
/// `EBADF`, `io_uring_register(-1, ...)` → `EBADF` or `EINVAL`,
/// `ptrace(PTRACE_PEEKDATA, -1)` → `ESRCH`, `socket(9999, ...)` →
/// `EAFNOSUPPORT` (a family number past the kernel's table: nothing is
/// loaded). io_uring's numbers are the same on every architecture.
pub(super) const PROBE: &str = r#"import ctypes, errno, platform, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def name(code):
    return errno.errorcode.get(code, str(code))
def call(number, *args):
    ctypes.set_errno(0)
    if libc.syscall(ctypes.c_long(number), *(ctypes.c_long(a) for a in args)) != -1:
        return "OK"
    return name(ctypes.get_errno())
seen = {"mode": "none"}
with open("/proc/self/status") as status:
    for line in status:
        if line.startswith("Seccomp:"):
            seen["mode"] = line.split()[1]
seen["io_uring_setup"] = call(425, 1, 0)
seen["io_uring_enter"] = call(426, -1, 0, 0, 0, 0, 0)
seen["io_uring_register"] = call(427, -1, 0, 0, 0)
ptrace = {"x86_64": 101, "aarch64": 117}.get(platform.machine())
seen["ptrace"] = call(ptrace, 2, -1, 0, 0) if ptrace else "SKIPPED"
mknodat = {"x86_64": 259, "aarch64": 33}.get(platform.machine())
path = ctypes.create_string_buffer(b"/execbox-no-such-dir/fifo")
fifo = 0o010600
seen["mknodat"] = call(mknodat, -100, ctypes.addressof(path), fifo, 0) if mknodat else "SKIPPED"
fcntl = {"x86_64": 72, "aarch64": 25}.get(platform.machine())
seen["fcntl"] = call(fcntl, -1, 1024, 1) if fcntl else "SKIPPED"
try:
    socket.socket(9999, socket.SOCK_DGRAM).close()
    seen["socket"] = "OK"
except OSError as e:
    seen["socket"] = name(e.errno)
print("execbox-seccomp-probe:", " ".join(k + "=" + v for k, v in seen.items()), flush=True)
"#;

/// The line [`PROBE`] prints starts with this.
const MARKER: &str = "execbox-seccomp-probe:";

/// The calls [`PROBE`] makes, each of which execbox's profile denies with `EPERM`.
const DENIED: &[&str] =
    &["io_uring_setup", "io_uring_enter", "io_uring_register", "ptrace", "socket", "mknodat", "fcntl"];

/// Reads [`PROBE`]'s stdout: `Ok` when the container ran in seccomp
/// filter mode (2) and every call was denied with `EPERM` (`ptrace`,
/// `mknodat` and `fcntl` may be `SKIPPED` on an architecture the probe does
/// not know); otherwise what was seen instead, every difference named.
pub(super) fn judge(stdout: &str) -> Result<(), String> {
    let line = stdout
        .lines()
        .rev()
        .find_map(|line| line.strip_prefix(MARKER))
        .ok_or_else(|| "the probe printed no verdict".to_string())?;
    let seen = |key: &str| {
        line.split_whitespace().find_map(|pair| pair.strip_prefix(key).and_then(|rest| rest.strip_prefix('=')))
    };
    let mut wrong = Vec::new();
    match seen("mode") {
        Some("2") => {}
        mode => wrong.push(format!("seccomp mode {} (2 is a filter)", mode.unwrap_or("unknown"))),
    }
    for call in DENIED {
        match seen(call) {
            Some("EPERM") => {}
            Some("SKIPPED") if matches!(*call, "ptrace" | "mknodat" | "fcntl") => {}
            Some("OK") => wrong.push(format!("{call} succeeded")),
            Some(errno) => wrong.push(format!("{call} reached the kernel ({errno})")),
            None => wrong.push(format!("{call} was not tried")),
        }
    }
    if wrong.is_empty() { Ok(()) } else { Err(wrong.join(", ")) }
}

/// What a verdict depends on: the engine, the image the probe runs in, and
/// the extra `run` arguments but labels (a `--runtime` decides whether
/// seccomp is applied at all).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct ProbeKey {
    engine: PathBuf,
    image: String,
    extra_args: Vec<String>,
}

impl ProbeKey {
    /// The key of a backend on `engine` probing in `image` with `extra_args`.
    pub fn new(engine: &Path, image: &str, extra_args: &[String]) -> Self {
        Self {
            engine: engine.to_path_buf(),
            image: image.to_string(),
            extra_args: extra_args.iter().filter(|arg| !arg.starts_with("--label=")).cloned().collect(),
        }
    }
}

/// Positive verdicts of this process. Held while a probe runs, so that
/// backends checking at once share one probe (each probe is bounded by its
/// deadline plus the kill grace).
static VERIFIED: Mutex<Option<HashSet<ProbeKey>>> = Mutex::new(None);

/// `Ok` if `key` was verified in this process, else the verdict of `probe`
/// (kept if positive).
pub(super) fn verified(key: &ProbeKey, probe: impl FnOnce() -> Result<(), Unavailable>) -> Result<(), Unavailable> {
    let mut verified = VERIFIED.lock();
    let set = verified.get_or_insert_with(HashSet::new);
    if set.contains(key) {
        return Ok(());
    }
    probe()?;
    set.insert(key.clone());
    Ok(())
}

/// Drops `key`'s verdict: its engine failed or stopped answering, and may
/// come back as another engine.
pub(super) fn forget(key: &ProbeKey) {
    if let Some(set) = VERIFIED.lock().as_mut() {
        set.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn profile() -> Value {
        serde_json::from_str(PROFILE).expect("the profile is JSON")
    }

    /// Every name some rule allows (whatever its arguments or conditions).
    fn allowed() -> HashSet<String> {
        let profile = profile();
        let mut names = HashSet::new();
        for rule in profile["syscalls"].as_array().unwrap() {
            if rule["action"] == "SCMP_ACT_ALLOW" {
                names.extend(rule["names"].as_array().unwrap().iter().map(|n| n.as_str().unwrap().to_string()));
            }
        }
        names
    }

    #[test]
    fn the_profile_denies_by_default_with_eperm() {
        let profile = profile();
        assert_eq!(profile["defaultAction"], "SCMP_ACT_ERRNO");
        assert_eq!(profile["defaultErrnoRet"], 1);
    }

    #[test]
    fn what_hostile_code_does_not_need_is_allowed_by_no_rule() {
        let allowed = allowed();
        for name in [
            "io_uring_setup",
            "io_uring_enter",
            "io_uring_register",
            "ptrace",
            "process_vm_readv",
            "process_vm_writev",
            "userfaultfd",
            "keyctl",
            "add_key",
            "request_key",
            "bpf",
            "perf_event_open",
            "kcmp",
            "pidfd_getfd",
            "process_madvise",
            "unshare",
            "setns",
            "mount",
            "umount2",
            "pivot_root",
            "fsopen",
            "fsmount",
            "move_mount",
            "open_tree",
            "mount_setattr",
            "open_by_handle_at",
            "chroot",
            "modify_ldt",
            "socketcall",
            "kexec_load",
            "init_module",
        ] {
            assert!(!allowed.contains(name), "{name} is allowed");
        }
        // What every program needs is still there.
        for name in ["read", "write", "openat", "mmap", "execve", "fork", "vfork", "wait4", "futex", "clone"] {
            assert!(allowed.contains(name), "{name} is denied");
        }
    }

    #[test]
    fn no_rule_depends_on_capabilities_or_the_kernel_version() {
        for rule in profile()["syscalls"].as_array().unwrap() {
            for side in ["includes", "excludes"] {
                let conditions = &rule[side];
                assert!(conditions.get("caps").is_none(), "{rule}");
                assert!(conditions.get("minKernel").is_none(), "{rule}");
            }
        }
    }

    #[test]
    fn sockets_clone_and_clone3_are_filtered_by_argument() {
        let profile = profile();
        let rules = profile["syscalls"].as_array().unwrap();
        let with = |name: &str| -> Vec<&Value> {
            rules.iter().filter(|r| r["names"].as_array().unwrap().iter().any(|n| n == name)).collect()
        };
        let families: Vec<u64> = with("socket")
            .iter()
            .map(|r| {
                let args = r["args"].as_array().expect("socket rules filter the family");
                assert_eq!(
                    (args.len(), &args[0]["index"], &args[0]["op"]),
                    (1, &Value::from(0), &Value::from("SCMP_CMP_EQ"))
                );
                args[0]["value"].as_u64().unwrap()
            })
            .collect();
        assert_eq!(families, [1, 2, 10, 16], "AF_UNIX, AF_INET, AF_INET6, AF_NETLINK");
        let pairs = with("socketpair");
        assert_eq!((pairs.len(), &pairs[0]["args"][0]["value"]), (1, &Value::from(1)), "socketpair: AF_UNIX");
        // clone: never with a namespace flag (CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET).
        for rule in with("clone") {
            assert_eq!(rule["args"][0]["op"], "SCMP_CMP_MASKED_EQ", "{rule}");
            assert_eq!(rule["args"][0]["value"], 0x7E02_0000u64, "{rule}");
        }
        let clone3 = with("clone3");
        assert_eq!(clone3.len(), 1);
        assert_eq!((&clone3[0]["action"], &clone3[0]["errnoRet"]), (&Value::from("SCMP_ACT_ERRNO"), &Value::from(38)));
    }

    #[test]
    fn mknod_makes_regular_files_and_sockets_never_a_fifo() {
        let profile = profile();
        for (name, mode_index) in [("mknod", 1), ("mknodat", 2)] {
            let mut kinds: Vec<u64> = profile["syscalls"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["names"].as_array().unwrap().iter().any(|n| n == name))
                .map(|rule| {
                    assert_eq!(rule["action"], "SCMP_ACT_ALLOW", "{rule}");
                    let args = rule["args"].as_array().expect("mknod rules filter the mode");
                    assert_eq!(args.len(), 1, "{rule}");
                    assert_eq!(
                        (&args[0]["index"], &args[0]["op"], &args[0]["value"]),
                        (&Value::from(mode_index), &Value::from("SCMP_CMP_MASKED_EQ"), &Value::from(0o170000)),
                        "{rule}"
                    );
                    args[0]["valueTwo"].as_u64().unwrap()
                })
                .collect();
            kinds.sort_unstable();
            assert_eq!(kinds, [0, 0o100000, 0o140000], "{name}: untyped, S_IFREG, S_IFSOCK; S_IFIFO is 0o010000");
        }
    }

    #[test]
    fn fcntl_allows_every_command_but_f_setlease() {
        let profile = profile();
        let allows = |name: &str, command: u64| {
            profile["syscalls"].as_array().unwrap().iter().any(|rule| {
                let names = rule["names"].as_array().unwrap();
                if rule["action"] != "SCMP_ACT_ALLOW" || !names.iter().any(|n| n == name) {
                    return false;
                }
                let Some(args) = rule["args"].as_array() else { return true };
                args.iter().all(|arg| {
                    assert_eq!(arg["index"], 1, "{rule}");
                    let value = arg["value"].as_u64().unwrap();
                    match arg["op"].as_str().unwrap() {
                        "SCMP_CMP_LT" => command < value,
                        "SCMP_CMP_EQ" => command == value,
                        "SCMP_CMP_MASKED_EQ" => command & value == arg["valueTwo"].as_u64().unwrap(),
                        op => panic!("{op} in {rule}"),
                    }
                })
            })
        };
        for name in ["fcntl", "fcntl64"] {
            for command in (0..1024).chain(1025..1040) {
                assert!(allows(name, command), "{name} {command}");
            }
            // F_SETLEASE, and with high bits the kernel would cut off.
            for command in [1024, 1040, (1 << 32) | 1024, (1 << 32) | 5, u64::MAX] {
                assert!(!allows(name, command), "{name} {command:#x}");
            }
        }
    }

    #[test]
    fn no_secondary_architectures() {
        for arch in profile()["archMap"].as_array().unwrap() {
            assert!(arch["subArchitectures"].is_null(), "{arch}");
        }
    }

    #[test]
    fn a_probe_passes_only_when_every_call_was_denied_under_a_filter() {
        let all = "execbox-seccomp-probe: mode=2 io_uring_setup=EPERM io_uring_enter=EPERM \
                   io_uring_register=EPERM ptrace=EPERM socket=EPERM mknodat=EPERM fcntl=EPERM";
        assert_eq!(judge(&format!("noise\n{all}\n")), Ok(()));
        assert_eq!(judge(&all.replace("ptrace=EPERM", "ptrace=SKIPPED")), Ok(()));
        assert_eq!(judge(&all.replace("mknodat=EPERM", "mknodat=SKIPPED")), Ok(()));
        assert_eq!(judge(&all.replace("fcntl=EPERM", "fcntl=SKIPPED")), Ok(()));
        // Docker 20.10's default profile, as measured here.
        let engine_default = "execbox-seccomp-probe: mode=2 io_uring_setup=EFAULT io_uring_enter=EBADF \
                              io_uring_register=EINVAL ptrace=ESRCH socket=EAFNOSUPPORT \
                              mknodat=ENOENT fcntl=EBADF";
        let why = judge(engine_default).unwrap_err();
        for call in DENIED {
            assert!(why.contains(&format!("{call} reached the kernel")), "{why}");
        }
        assert_eq!(judge(&all.replace("mode=2", "mode=0")).unwrap_err(), "seccomp mode 0 (2 is a filter)");
        assert_eq!(judge(&all.replace("socket=EPERM", "socket=OK")).unwrap_err(), "socket succeeded");
        assert_eq!(judge(&all.replace("io_uring_setup=EPERM ", "")).unwrap_err(), "io_uring_setup was not tried");
        assert_eq!(judge("Traceback ...").unwrap_err(), "the probe printed no verdict");
    }

    #[test]
    fn a_positive_verdict_is_kept_until_forgotten_and_a_negative_one_never() {
        let key = ProbeKey::new(Path::new("/nonexistent/verdict-test-engine"), "img", &[]);
        let probes = std::cell::Cell::new(0);
        let failing = || {
            probes.set(probes.get() + 1);
            Err(Unavailable::because("no"))
        };
        let passing = || {
            probes.set(probes.get() + 1);
            Ok(())
        };
        assert!(verified(&key, failing).is_err());
        assert!(verified(&key, passing).is_ok());
        assert!(verified(&key, failing).is_ok(), "kept: not probed again");
        assert_eq!(probes.get(), 2);
        forget(&key);
        assert!(verified(&key, failing).is_err());
        assert_eq!(probes.get(), 3);
    }

    #[test]
    fn labels_do_not_change_what_a_verdict_depends_on() {
        let key = |extra: &[&str]| {
            let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
            ProbeKey::new(Path::new("docker"), "img", &extra)
        };
        assert_eq!(key(&["--label=a=1"]), key(&[]));
        assert_ne!(key(&["--runtime=runsc"]), key(&[]));
    }

    #[test]
    fn the_profile_file_is_private_comes_back_when_removed_and_goes_with_the_last_hold() {
        use std::os::unix::fs::PermissionsExt;
        let hold = Hold::new();
        let path = profile_path().unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), PROFILE);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        let dir_name = path.parent().unwrap().file_name().unwrap().to_string_lossy().into_owned();
        assert!(dir_name.starts_with(&format!("execbox-seccomp-{}-", crate::owner::token())), "{dir_name}");
        assert_eq!(profile_path().unwrap(), path, "one copy per process");
        std::fs::remove_file(&path).unwrap();
        let again = profile_path().unwrap();
        assert_eq!(std::fs::read_to_string(&again).unwrap(), PROFILE);
        assert!(!path.parent().unwrap().exists(), "the old copy's directory went");
        drop(hold);
        // Other tests of this process may hold a copy too: it goes only
        // when no hold is left.
        if COPY.lock().holders == 0 {
            assert!(!again.parent().unwrap().exists(), "the last hold removed the copy");
        }
    }
}
