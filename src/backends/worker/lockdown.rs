//! The worker's side of containment: once start-up is over, a seccomp filter
//! leaves it only what an engine needs to compute and answer.
//!
//! Allowed: `read` on fd 0 (requests), `write` on fds 1 and 2 (answers,
//! Rust's abort messages), memory management that never maps executable
//! memory, `futex`, clocks, `getrandom` (`Math.random`), signals to itself
//! (`abort`), and exit. Everything else — `open`, `socket`, `execve`,
//! `fork`/`clone`, `kill` of others, `ptrace`, `prlimit` — kills the worker
//! with `SIGSYS`. This is defence in depth: it matters only if a bug in the
//! engine is exploited, and then the exploit can do no more than the engine.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
};

/// The architecture the filter is built for; `None` where execbox has no
/// filter (then workers refuse to start: no silent fallback).
fn target_arch() -> Option<TargetArch> {
    match std::env::consts::ARCH {
        "x86_64" => Some(TargetArch::x86_64),
        "aarch64" => Some(TargetArch::aarch64),
        _ => None,
    }
}

/// Why a worker could not lock itself down (it then exits before any request).
#[derive(Debug, thiserror::Error)]
pub(crate) enum LockdownError {
    #[error("no seccomp filter for {}", std::env::consts::ARCH)]
    NoFilter,
    #[error("cannot build the seccomp filter")]
    Build(#[source] seccompiler::BackendError),
    #[error("cannot compile the seccomp filter")]
    Compile(#[source] seccompiler::BackendError),
    #[error("cannot set no_new_privs")]
    NoNewPrivs(#[source] std::io::Error),
    #[error("cannot install the seccomp filter")]
    Install(#[source] seccompiler::Error),
}

/// Installs the filter on this (single-threaded) process. Irreversible.
pub(crate) fn apply() -> Result<(), LockdownError> {
    let program = engine_filter()?;
    rustix::thread::set_no_new_privs(true).map_err(|e| LockdownError::NoNewPrivs(e.into()))?;
    seccompiler::apply_filter(&program).map_err(LockdownError::Install)
}

/// The filter of an engine worker (see the module docs).
fn engine_filter() -> Result<BpfProgram, LockdownError> {
    let arch = target_arch().ok_or(LockdownError::NoFilter)?;
    let cond = |arg: u8, op: SeccompCmpOp, value: u64| {
        SeccompCondition::new(arg, SeccompCmpArgLen::Qword, op, value).map_err(LockdownError::Build)
    };
    let rule = |conditions: Vec<SeccompCondition>| SeccompRule::new(conditions).map_err(LockdownError::Build);
    let prot_exec = libc::PROT_EXEC as u64;
    let no_exec = || rule(vec![cond(2, SeccompCmpOp::MaskedEq(prot_exec), 0)?]);
    let me = u64::from(std::process::id());

    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    let mut allow = |syscall: libc::c_long, conditions: Vec<SeccompRule>| {
        rules.insert(syscall, conditions);
    };
    allow(libc::SYS_read, vec![rule(vec![cond(0, SeccompCmpOp::Eq, 0)?])?]);
    allow(
        libc::SYS_write,
        vec![rule(vec![cond(0, SeccompCmpOp::Eq, 1)?])?, rule(vec![cond(0, SeccompCmpOp::Eq, 2)?])?],
    );
    allow(libc::SYS_mmap, vec![no_exec()?]);
    allow(libc::SYS_mprotect, vec![no_exec()?]);
    for syscall in [
        libc::SYS_munmap,
        libc::SYS_mremap,
        libc::SYS_brk,
        libc::SYS_madvise,
        libc::SYS_futex,
        libc::SYS_sched_yield,
        libc::SYS_clock_gettime,
        libc::SYS_clock_getres,
        libc::SYS_gettimeofday,
        libc::SYS_getrandom,
        libc::SYS_rt_sigreturn,
        libc::SYS_rt_sigprocmask,
        libc::SYS_rt_sigaction,
        libc::SYS_sigaltstack,
        libc::SYS_getpid,
        libc::SYS_gettid,
        libc::SYS_close,
        libc::SYS_restart_syscall,
        libc::SYS_exit,
        libc::SYS_exit_group,
    ] {
        allow(syscall, Vec::new());
    }
    // abort() raises SIGABRT on itself; no other process may be signalled.
    allow(libc::SYS_tgkill, vec![rule(vec![cond(0, SeccompCmpOp::Eq, me)?])?]);

    let filter = SeccompFilter::new(rules, SeccompAction::KillProcess, SeccompAction::Allow, arch)
        .map_err(LockdownError::Build)?;
    BpfProgram::try_from(filter).map_err(LockdownError::Compile)
}

/// Whether this machine can build the filter (for capability declarations).
pub(crate) fn supported() -> bool {
    target_arch().is_some()
}
