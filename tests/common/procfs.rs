//! What `/proc` says about this process and others: threads, descriptors,
//! memory, children, owner tokens, temp dirs.

/// The fields of `/proc/<pid>/stat` after the command name: `[0]` is the
/// state, `[1]` the parent's pid (`stat(5)`'s fields 3 on); `None` when the
/// process is gone.
pub fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat.rsplit(')').next()?.split_whitespace().map(str::to_string).collect())
}

/// The state letter of `pid` (`R`, `S`, `Z`, ...), `None` when it is gone.
pub fn state(pid: u32) -> Option<String> {
    stat_fields(pid)?.into_iter().next()
}

/// True when `pid` exists and is neither a zombie nor dead.
pub fn alive(pid: u32) -> bool {
    state(pid).is_some_and(|s| s != "Z" && s != "X")
}

/// User and system CPU time of `pid` so far, in clock ticks (0 when gone).
pub fn cpu_ticks(pid: u32) -> u64 {
    let fields = stat_fields(pid).unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    ticks(11) + ticks(12)
}

/// `<pid>.<start time>`: the owner token a running execbox process puts on
/// its containers and temp dirs.
pub fn owner_token(pid: u32) -> String {
    let fields = stat_fields(pid).expect("a running process");
    format!("{pid}.{}", fields[19])
}

/// This process's owner token.
pub fn own_token() -> String {
    owner_token(std::process::id())
}

/// Entries of `dir` (0 when it cannot be read).
/// What each of this process's descriptors refers to (`pipe:[123]`,
/// `socket:[456]`, `anon_inode:[timerfd]`, a path), by number.
pub fn own_fd_targets() -> std::collections::BTreeMap<u32, String> {
    let mut targets = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir("/proc/self/fd").into_iter().flatten().flatten() {
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else { continue };
        if let Ok(target) = std::fs::read_link(entry.path()) {
            targets.insert(fd, target.display().to_string());
        }
    }
    targets
}

pub fn count_entries(dir: &str) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

/// Threads of this process named `name`.
pub fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name))
        .count()
}

/// VmRSS of `pid` in kB (0 when gone).
pub fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// This process's resident memory, in bytes.
pub fn own_rss_bytes() -> u64 {
    rss_kb(std::process::id()) << 10
}

/// Children of this process that are zombies (dead, not reaped).
pub fn zombie_children() -> Vec<u32> {
    let me = std::process::id().to_string();
    let mut zombies = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Some(fields) = stat_fields(pid) else { continue };
        if fields.first().map(String::as_str) == Some("Z") && fields.get(1) == Some(&me) {
            zombies.push(pid);
        }
    }
    zombies
}

/// Live (not zombie) children of `pid`, whichever thread spawned them, sorted.
pub fn live_children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    let mut children: Vec<u32> = tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|list| list.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<u32>>())
        .filter(|child| state(*child).is_some_and(|s| s != "Z"))
        .collect();
    children.sort();
    children
}

/// True when `pid`'s environment holds `variable` (`NAME=value`).
pub fn has_env(pid: u32, variable: &str) -> bool {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    environ.split(|&b| b == 0).any(|v| v == variable.as_bytes())
}

/// True when a thread of `pid` is blocked writing to a full pipe.
pub fn blocked_writing_a_pipe(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks
        .flatten()
        .any(|task| std::fs::read_to_string(task.path().join("wchan")).is_ok_and(|w| w.contains("pipe_write")))
}

/// Names in the temp dir that start with `prefix` and carry the owner
/// token `token` (`...-<token>-...`).
pub fn temp_dirs(prefix: &str, token: &str) -> Vec<String> {
    let infix = format!("-{token}-");
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.starts_with(prefix) && name.contains(&infix))
        .collect()
}
