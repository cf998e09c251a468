//! execbox's own `path_open` and `path_symlink`, in front of wasmtime-wasi's,
//! for what cap-std's confinement does not cover.
//!
//! - **Links that point out of a grant.** A guest cannot *follow* a symlink
//!   out of its preopen, but it could *leave* one in a read-write grant
//!   (`path_symlink("../secret.txt", "innocent")`), and host programs that
//!   later read the grant would follow it. So `path_symlink` is refused
//!   outright with `EPERM` (what a filesystem without symlinks answers), and
//!   so are `path_rename` and `path_link` of a symlink the host left in the
//!   grant: moving a relative link to another depth re-aims it
//!   (`sub/inner -> ../secret.txt` renamed to `moved` points out of the
//!   grant), and a hard link copies it under a new name. **Not covered:**
//!   renaming a *directory* that holds relative links the host put there
//!   moves them too; do not grant read-write a directory holding symlinks
//!   that host programs will follow.
//! - **Opens that block the host.** wasmtime-wasi opens files without
//!   `O_NONBLOCK`, on the calling host thread: opening a FIFO inside a grant
//!   waits for a writer that never comes, long past any deadline (epochs only
//!   interrupt wasm code). So `path_open` first stats the target (same
//!   directory, lookup flags and path; nothing written to guest memory) and
//!   refuses anything that is not a regular file, a directory or a symlink
//!   (FIFOs, sockets, character and block devices) with `ENXIO`, then
//!   forwards to wasmtime-wasi's `path_open`.
//!
//! - **Regular files that block.** Some filesystems have regular files whose
//!   reads wait indefinitely (`/proc/kmsg`, tracefs's `trace_pipe`, anything
//!   a FUSE server serves), and an open or read there holds the host thread
//!   past the deadline just the same. A grant on such a filesystem, or one
//!   that contains a mount of one (granting `/` contains `/proc`), is refused
//!   before the run ([`refuse_blocking_mounts`], from `/proc/self/mountinfo`).
//!
//! **Known window:** stat and open are two system calls. The guest itself
//! cannot race them (WASI p1 guests are single-threaded and a host call runs
//! to completion), but another process — or another run sharing the same
//! read-write grant — could swap a regular file for a FIFO in between. Only
//! grant directories where no such process works are covered fully. A
//! workspace closes it: runs in one workspace take turns (see
//! `workspace::RunTurn`), and what may run beside a run there (a program in
//! the workspace's container) cannot make a FIFO at all (execbox's seccomp
//! profile denies `mknod` of one, see `container/seccomp.rs`); a socket
//! file fails the open with `ENXIO`, and the mount's `nodev` refuses
//! devices.
//!
//! **Leases.** An open of a regular file also waits while another process
//! holds a lease on it (`fcntl(F_SETLEASE)`), up to `fs.lease-break-time`
//! (45 s by default). Code in execbox's containers cannot take one (the
//! seccomp profile denies `F_SETLEASE`); a process of the host's that
//! holds a lease on a file inside a grant can still hold a run that opens
//! it.

use std::future::Future;

use wasmtime::{AsContextMut, Caller, Extern, Linker};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p1::types::{Errno, Fd, Filetype, Lookupflags};
use wasmtime_wasi::p1::wasi_snapshot_preview1::{self as p1, WasiSnapshotPreview1};
use wasmtime_wasi::runtime::in_tokio;
use wiggle::{GuestMemory, GuestPtr};

use super::guest::{GuestState, Preopen};
use crate::error::InvalidRequest;

const MODULE: &str = "wasi_snapshot_preview1";

fn errno(e: Errno) -> i32 {
    i32::from(u16::from(e))
}

/// The guards in async form, for the async linker (`linker.rs`): the same
/// checks, awaited instead of blocked on.
pub(crate) fn add_async(linker: &mut Linker<GuestState>) -> wasmtime::Result<()> {
    linker.func_wrap(MODULE, "path_symlink", path_symlink)?;
    linker.func_wrap_async(MODULE, "path_rename", path_rename_async)?;
    linker.func_wrap_async(MODULE, "path_link", path_link_async)?;
    linker.func_wrap_async(MODULE, "path_open", path_open_async)?;
    Ok(())
}

/// `path_symlink`: refused, so no guest leaves a link behind.
pub(crate) fn path_symlink(
    _caller: Caller<'_, GuestState>,
    _old_path: i32,
    _old_path_len: i32,
    _fd: i32,
    _new_path: i32,
    _new_path_len: i32,
) -> wasmtime::Result<i32> {
    Ok(errno(Errno::Perm))
}

/// `path_rename`: refused (`EPERM`) when the source is a symlink; see the module docs.
pub(crate) fn path_rename(
    mut caller: Caller<'_, GuestState>,
    fd: i32,
    old_path: i32,
    old_path_len: i32,
    new_fd: i32,
    new_path: i32,
    new_path_len: i32,
) -> wasmtime::Result<i32> {
    let (wasi, mut memory, fuel) = parts(&mut caller)?;
    in_tokio(rename(wasi, &mut memory, fuel, (fd, old_path, old_path_len, new_fd, new_path, new_path_len)))
}

type RenameArgs = (i32, i32, i32, i32, i32, i32);

fn path_rename_async<'a>(
    mut caller: Caller<'a, GuestState>,
    args: RenameArgs,
) -> Box<dyn Future<Output = wasmtime::Result<i32>> + Send + 'a> {
    Box::new(async move {
        let (wasi, mut memory, fuel) = parts(&mut caller)?;
        rename(wasi, &mut memory, fuel, args).await
    })
}

async fn rename(
    wasi: &mut WasiP1Ctx,
    memory: &mut GuestMemory<'_>,
    fuel: usize,
    (fd, old_path, old_path_len, new_fd, new_path, new_path_len): RenameArgs,
) -> wasmtime::Result<i32> {
    if is_symlink(wasi, memory, fd, old_path, old_path_len).await {
        return Ok(errno(Errno::Perm));
    }
    wasi.set_hostcall_fuel(fuel);
    p1::path_rename(wasi, memory, fd, old_path, old_path_len, new_fd, new_path, new_path_len).await
}

/// `path_link`: refused (`EPERM`) when the source path names a symlink
/// (looked up without following it, whatever the guest's flags say).
#[allow(clippy::too_many_arguments)] // the WASI p1 signature
pub(crate) fn path_link(
    mut caller: Caller<'_, GuestState>,
    old_fd: i32,
    old_flags: i32,
    old_path: i32,
    old_path_len: i32,
    new_fd: i32,
    new_path: i32,
    new_path_len: i32,
) -> wasmtime::Result<i32> {
    let (wasi, mut memory, fuel) = parts(&mut caller)?;
    let args = (old_fd, old_flags, old_path, old_path_len, new_fd, new_path, new_path_len);
    in_tokio(link(wasi, &mut memory, fuel, args))
}

type LinkArgs = (i32, i32, i32, i32, i32, i32, i32);

fn path_link_async<'a>(
    mut caller: Caller<'a, GuestState>,
    args: LinkArgs,
) -> Box<dyn Future<Output = wasmtime::Result<i32>> + Send + 'a> {
    Box::new(async move {
        let (wasi, mut memory, fuel) = parts(&mut caller)?;
        link(wasi, &mut memory, fuel, args).await
    })
}

async fn link(
    wasi: &mut WasiP1Ctx,
    memory: &mut GuestMemory<'_>,
    fuel: usize,
    (old_fd, old_flags, old_path, old_path_len, new_fd, new_path, new_path_len): LinkArgs,
) -> wasmtime::Result<i32> {
    if is_symlink(wasi, memory, old_fd, old_path, old_path_len).await {
        return Ok(errno(Errno::Perm));
    }
    wasi.set_hostcall_fuel(fuel);
    p1::path_link(wasi, memory, old_fd, old_flags, old_path, old_path_len, new_fd, new_path, new_path_len).await
}

/// `path_open` for regular files, directories and symlinks only; see the
/// module docs.
#[allow(clippy::too_many_arguments)] // the WASI p1 signature
pub(crate) fn path_open(
    mut caller: Caller<'_, GuestState>,
    fd: i32,
    dirflags: i32,
    path: i32,
    path_len: i32,
    oflags: i32,
    fs_rights_base: i64,
    fs_rights_inheriting: i64,
    fdflags: i32,
    opened_fd: i32,
) -> wasmtime::Result<i32> {
    let (wasi, mut memory, fuel) = parts(&mut caller)?;
    let args = (fd, dirflags, path, path_len, oflags, fs_rights_base, fs_rights_inheriting, fdflags, opened_fd);
    in_tokio(open(wasi, &mut memory, fuel, args))
}

type OpenArgs = (i32, i32, i32, i32, i32, i64, i64, i32, i32);

fn path_open_async<'a>(
    mut caller: Caller<'a, GuestState>,
    args: OpenArgs,
) -> Box<dyn Future<Output = wasmtime::Result<i32>> + Send + 'a> {
    Box::new(async move {
        let (wasi, mut memory, fuel) = parts(&mut caller)?;
        open(wasi, &mut memory, fuel, args).await
    })
}

async fn open(
    wasi: &mut WasiP1Ctx,
    memory: &mut GuestMemory<'_>,
    fuel: usize,
    (fd, dirflags, path, path_len, oflags, fs_rights_base, fs_rights_inheriting, fdflags, opened_fd): OpenArgs,
) -> wasmtime::Result<i32> {
    let Ok(flags) = Lookupflags::try_from(dirflags) else { return Ok(errno(Errno::Inval)) };
    match filetype(wasi, memory, fd, flags, path, path_len).await {
        Ok(Filetype::RegularFile | Filetype::Directory | Filetype::SymbolicLink) => {}
        Ok(_) => return Ok(errno(Errno::Nxio)),
        // Missing, not permitted, outside the preopen...: the open below
        // fails the same way, or creates a regular file (`O_CREAT`).
        Err(e) if e.downcast_ref().is_some() => {}
        // wasmtime-wasi traps on a socket's file type: refuse it as such.
        Err(_) => return Ok(errno(Errno::Nxio)),
    }
    wasi.set_hostcall_fuel(fuel);
    p1::path_open(
        wasi,
        memory,
        fd,
        dirflags,
        path,
        path_len,
        oflags,
        fs_rights_base,
        fs_rights_inheriting,
        fdflags,
        opened_fd,
    )
    .await
}

/// The guest's WASI context and memory, hostcall fuel set, and the fuel,
/// to set again before the call a guard forwards.
fn parts<'c>(caller: &'c mut Caller<'_, GuestState>) -> wasmtime::Result<(&'c mut WasiP1Ctx, GuestMemory<'c>, usize)> {
    let Some(Extern::Memory(memory)) = caller.get_export("memory") else {
        wasmtime::bail!("missing required memory export");
    };
    let fuel = caller.as_context_mut().hostcall_fuel();
    let (bytes, state) = memory.data_and_store_mut(caller);
    let wasi: &mut WasiP1Ctx = &mut state.wasi;
    wasi.set_hostcall_fuel(fuel);
    Ok((wasi, GuestMemory::Unshared(bytes), fuel))
}

/// The type of `path` under `fd`, looked up with `flags` (nothing is
/// written to guest memory).
async fn filetype(
    wasi: &mut WasiP1Ctx,
    memory: &mut GuestMemory<'_>,
    fd: i32,
    flags: Lookupflags,
    path: i32,
    path_len: i32,
) -> Result<Filetype, wasmtime_wasi::p1::types::Error> {
    let target = GuestPtr::<str>::new((path as u32, path_len as u32));
    WasiSnapshotPreview1::path_filestat_get(wasi, memory, Fd::from(fd), flags, target).await.map(|stat| stat.filetype)
}

/// True when `path` under `fd`, not followed, is a symlink (a missing path
/// fails in the call itself).
async fn is_symlink(wasi: &mut WasiP1Ctx, memory: &mut GuestMemory<'_>, fd: i32, path: i32, path_len: i32) -> bool {
    matches!(filetype(wasi, memory, fd, Lookupflags::empty(), path, path_len).await, Ok(Filetype::SymbolicLink))
}

/// Filesystems with regular files whose reads or opens can wait forever.
/// Network filesystems (NFS, CIFS, 9p) can hang too and are not checked.
fn may_block(fstype: &str) -> bool {
    matches!(fstype, "proc" | "sysfs" | "debugfs" | "tracefs" | "securityfs" | "configfs" | "efivarfs" | "pstore")
        || fstype == "fuse"
        || fstype.starts_with("fuse.")
        || fstype == "fuseblk"
}

/// Refuses grants on, or containing a mount of, a filesystem whose files
/// can block the host (see the module docs).
pub(crate) fn refuse_blocking_mounts(preopens: &[Preopen]) -> Result<(), InvalidRequest> {
    if preopens.is_empty() {
        return Ok(());
    }
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        // No procfs here: none of its files can be granted either.
        tracing::debug!("no /proc/self/mountinfo: grants are not checked for blocking filesystems");
        return Ok(());
    };
    let mounts = parse_mountinfo(&mountinfo);
    for preopen in preopens {
        let bad = |reason: String| InvalidRequest::BadPath { path: preopen.host.display().to_string(), reason };
        let grant = std::fs::canonicalize(&preopen.host).map_err(|e| bad(e.to_string()))?;
        // The mount the grant is on: the last-listed with the longest point above it.
        let on = mounts
            .iter()
            .filter(|(point, _)| grant.starts_with(point))
            .max_by_key(|(point, _)| point.as_os_str().len());
        if let Some((point, fstype)) = on
            && may_block(fstype)
        {
            return Err(bad(format!(
                "it is on a {fstype} filesystem (mounted at {}), whose files can block a reader past any deadline",
                point.display()
            )));
        }
        if let Some((point, fstype)) =
            mounts.iter().find(|(point, fstype)| point != &grant && point.starts_with(&grant) && may_block(fstype))
        {
            return Err(bad(format!(
                "it contains a {fstype} filesystem at {}, whose files can block a reader past any deadline",
                point.display()
            )));
        }
    }
    Ok(())
}

/// (mount point, filesystem type) of each line of `/proc/self/mountinfo`,
/// in order (a later mount on the same point hides an earlier one).
fn parse_mountinfo(text: &str) -> Vec<(std::path::PathBuf, String)> {
    text.lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let point = before.split(' ').nth(4)?;
            let fstype = after.split(' ').next()?;
            Some((unescape(point).into(), fstype.to_string()))
        })
        .collect()
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(code) = field.get(i + 1..i + 4).and_then(|o| u8::from_str_radix(o, 8).ok())
        {
            out.push(code);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_is_parsed_with_escapes() {
        let text = "22 27 0:21 / /proc rw,relatime - proc proc rw\n\
                    40 27 0:50 / /mnt/my\\040disk rw - fuse.sshfs host:/ rw\n";
        let mounts = parse_mountinfo(text);
        assert_eq!(mounts[0], ("/proc".into(), "proc".to_string()));
        assert_eq!(mounts[1], ("/mnt/my disk".into(), "fuse.sshfs".to_string()));
        assert!(may_block("fuse.sshfs") && may_block("proc") && !may_block("tmpfs") && !may_block("ext4"));
    }
}
