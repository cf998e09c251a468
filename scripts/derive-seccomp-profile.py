#!/usr/bin/env python3
"""Derives execbox's container seccomp profile from moby's default profile.

execbox passes its own profile to every container (`--security-opt
seccomp=...`), so the syscalls hostile code can reach do not depend on the
engine's version: Debian's docker 20.10 still allows io_uring, which newer
engines deny. The profile is moby's current default with the changes below,
each one a surface that Python, shell scripts and the Rust pipeline
(rustc, gcc, the compiled program) do not use:

1. io_uring_setup, io_uring_enter, io_uring_register: must be absent from
   every allow rule (moby dropped them in 2023, docker 25; this script
   fails if a newer default brings them back). The most exploited kernel
   surface of recent years.
2. ptrace, process_vm_readv, process_vm_writev: moby allows them to every
   container on kernels >= 4.8. Here they would let the program read and
   write the memory of the other processes of its container, all under
   the same uid (a session's loop, the wrapper that writes a warm
   container's end record, the listing of /work/out), and ptrace has its
   own history of kernel bugs.
3. Rules that only apply to a capability (`includes.caps`) are dropped:
   execbox containers run with --cap-drop=ALL and the extra-argument
   allow-list refuses --cap-add, so they never apply; dropping them makes
   the file say what is allowed without relying on the engine's reading
   of `includes.caps`. That keeps denied, among others: mount and the new
   mount API, unshare, setns, bpf, perf_event_open, kcmp, pidfd_getfd,
   process_madvise, open_by_handle_at, chroot, syslog, quotactl,
   sethostname. Rules that apply *without* CAP_SYS_ADMIN (`excludes.caps`:
   clone without namespace flags, clone3 answered ENOSYS so that libc falls
   back to clone, whose flags can be filtered) apply unconditionally.
4. No secondary architectures (`subArchitectures`): 32-bit x86 (int 0x80),
   x32 and 32-bit ARM system calls are not in the filter, so the engine's
   runtime refuses them; their compat code paths are a separate kernel
   surface, and x86's `socketcall` would pass the socket-family filter
   (moby blocked it and reverted, 2026-05, for 32-bit images).
5. socket(): only AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK (moby: every
   family but AF_ALG and AF_VSOCK). The other families (AF_PACKET, TIPC,
   RDS, CAN, KCM, XDP, ...) are rarely used protocol code, loaded on demand
   by an unprivileged socket() call, and a recurring source of kernel bugs;
   under --network=none the container has only loopback anyway.
   socketpair(): only AF_UNIX, for the same reason. `socketcall` (the
   multiplexer that s390x and 32-bit x86 still have) is removed: BPF cannot
   see its arguments, so it would bypass both filters.
6. modify_ldt: only 16-bit code (Wine, DOSEMU) needs it; glibc does not.
7. mknod, mknodat: allowed only for a regular file (type bits 0 or
   S_IFREG) or a socket, never a FIFO (devices need CAP_MKNOD anyway).
   Code in a container shares a workspace with wasm runs whose host
   thread stats a path and then opens it: a FIFO swapped in between would
   block that thread past any deadline (wasm/fs_guard.rs's window).
   Without FIFOs nothing in a workspace blocks an open: a socket file
   fails it with ENXIO, devices are refused by the mount's nodev.
8. fcntl(F_SETLEASE): denied (every other command allowed). A lease on a
   file makes another process's open of it wait for the lease's holder, up
   to fs.lease-break-time (45 s): a program could hold a wasm run's host
   thread in a shared workspace past its deadline. The rule allows the
   commands below 1024 and 1025-1039 (F_GETLEASE and the rest), comparing
   the whole 64-bit register, so a command with high bits set (which the
   kernel would cut to F_SETLEASE) is denied too.

Already denied by moby's default and kept so (the default action, EPERM):
userfaultfd, keyctl, add_key, request_key, kexec_load, pivot_root,
move_pages, migrate_pages, nfsservctl, uselib, vm86, ...

Usage:
  scripts/derive-seccomp-profile.py MOBY_DEFAULT_JSON SOURCE_NOTE > src/backends/container/seccomp.json

MOBY_DEFAULT_JSON is moby's `profiles/seccomp/default.json` (today
`vendor/github.com/moby/profiles/seccomp/default.json` in moby/moby, or
`seccomp/default.json` in moby/profiles); SOURCE_NOTE names where it came
from and lands in the profile's first rule's comment.
"""
import json
import sys

IO_URING = {"io_uring_setup", "io_uring_enter", "io_uring_register"}
CROSS_PROCESS = {"ptrace", "process_vm_readv", "process_vm_writev"}
MKNOD = {"mknod": 1, "mknodat": 2}  # the index of the mode argument
FCNTL = ["fcntl", "fcntl64"]
REMOVED_NAMES = CROSS_PROCESS | {"modify_ldt", "socketcall", "socket", "socketpair"} | set(MKNOD) | set(FCNTL)

AF_UNIX, AF_INET, AF_INET6, AF_NETLINK = 1, 2, 10, 16
S_IFMT, S_IFIFO, S_IFREG, S_IFSOCK = 0o170000, 0o010000, 0o100000, 0o140000
F_SETLEASE = 1024
ALL_BITS = (1 << 64) - 1
# fcntl commands allowed, as (op, value, valueTwo) on the command argument:
# below F_SETLEASE, F_SETLEASE + 1, then 1026-1027, 1028-1031, 1032-1039.
FCNTL_ALLOWED = [
    ("SCMP_CMP_LT", F_SETLEASE, None),
    ("SCMP_CMP_EQ", F_SETLEASE + 1, None),
    ("SCMP_CMP_MASKED_EQ", ALL_BITS ^ 1, F_SETLEASE + 2),
    ("SCMP_CMP_MASKED_EQ", ALL_BITS ^ 3, F_SETLEASE + 4),
    ("SCMP_CMP_MASKED_EQ", ALL_BITS ^ 7, F_SETLEASE + 8),
]


def fail(message):
    sys.exit(f"derive-seccomp-profile: {message}")


def derive(moby, note):
    profile = {
        "defaultAction": moby["defaultAction"],
        "defaultErrnoRet": moby.get("defaultErrnoRet", 1),
        "archMap": [
            {"architecture": arch["architecture"], "subArchitectures": None} for arch in moby["archMap"]
        ],
        "syscalls": [],
    }
    if profile["defaultAction"] != "SCMP_ACT_ERRNO" or profile["defaultErrnoRet"] != 1:
        fail("moby's default action is no longer EPERM: review the profile by hand")
    kept = []
    for rule in moby["syscalls"]:
        rule = dict(rule)
        includes = rule.get("includes") or {}
        excludes = rule.get("excludes") or {}
        if includes.get("caps"):
            continue  # (3) never applies without capabilities
        if includes.get("minKernel"):
            if set(rule["names"]) != CROSS_PROCESS:
                fail(f"an unexpected minKernel rule: {rule}")
            continue  # (2)
        if excludes.get("caps"):
            excludes = {k: v for k, v in excludes.items() if k != "caps"}
            if excludes:
                rule["excludes"] = excludes
            else:
                rule.pop("excludes")
        if rule["action"] == "SCMP_ACT_ALLOW":
            if IO_URING & set(rule["names"]):
                fail(f"moby allows io_uring again ({rule['names']}): keep it denied")
            names = [n for n in rule["names"] if n not in REMOVED_NAMES]
            if not names:
                continue
            rule["names"] = names
        kept.append(rule)
    allow_all = kept[0]
    if allow_all.get("args") or allow_all.get("includes") or allow_all["action"] != "SCMP_ACT_ALLOW":
        fail("moby's first rule is no longer the unconditional allow list")
    allow_all["comment"] = (
        f"execbox's container profile, derived by scripts/derive-seccomp-profile.py from {note}: "
        "see that script for every change"
    )
    family = lambda name, value, why: {
        "names": [name],
        "action": "SCMP_ACT_ALLOW",
        "args": [{"index": 0, "value": value, "op": "SCMP_CMP_EQ"}],
        "comment": why,
    }
    sockets = [
        family("socket", AF_UNIX, "AF_UNIX"),
        family("socket", AF_INET, "AF_INET (loopback only under --network=none)"),
        family("socket", AF_INET6, "AF_INET6 (loopback only under --network=none)"),
        family("socket", AF_NETLINK, "AF_NETLINK (libc's interface and address queries)"),
        family("socketpair", AF_UNIX, "AF_UNIX only"),
    ]
    node = lambda name, kind, why: {
        "names": [name],
        "action": "SCMP_ACT_ALLOW",
        "args": [{"index": MKNOD[name], "value": S_IFMT, "valueTwo": kind, "op": "SCMP_CMP_MASKED_EQ"}],
        "comment": why,
    }
    nodes = [
        node(name, kind, why)
        for name in MKNOD
        for kind, why in [(0, "a regular file (no type bits)"), (S_IFREG, "S_IFREG"), (S_IFSOCK, "S_IFSOCK")]
    ]
    def command(name, op, value, value_two):
        arg = {"index": 1, "value": value, "op": op}
        if value_two is not None:
            arg["valueTwo"] = value_two
        return {"names": [name], "action": "SCMP_ACT_ALLOW", "args": [arg], "comment": "every command but F_SETLEASE"}

    commands = [command(name, *allowed) for name in FCNTL for allowed in FCNTL_ALLOWED]
    profile["syscalls"] = [allow_all] + sockets + nodes + commands + kept[1:]
    allowed = {n for r in profile["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" for n in r["names"]}
    for name in IO_URING | CROSS_PROCESS | {"modify_ldt", "socketcall", "userfaultfd", "keyctl", "bpf", "unshare"}:
        if name in allowed:
            fail(f"{name} is still allowed")
    for rule in profile["syscalls"]:
        if set(MKNOD) & set(rule["names"]) and rule not in nodes:
            fail(f"another rule allows mknod: {rule}")
        if set(FCNTL) & set(rule["names"]) and rule not in commands:
            fail(f"another rule allows fcntl: {rule}")
    return profile


def main():
    if len(sys.argv) != 3:
        fail("usage: derive-seccomp-profile.py MOBY_DEFAULT_JSON SOURCE_NOTE")
    with open(sys.argv[1], encoding="utf-8") as f:
        moby = json.load(f)
    json.dump(derive(moby, sys.argv[2]), sys.stdout, indent="\t")
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
