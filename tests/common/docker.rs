//! Containers as docker sees them: listings, and its event stream (a
//! container's start or removal is waited for on its event, not polled).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `docker ps --quiet` with `args` (filters, `--all`): the ids it lists.
pub fn ps(args: &[&str]) -> Vec<String> {
    let out = Command::new("docker").args(["ps", "--quiet"]).args(args).output().expect("docker ps");
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

/// The filter of the containers a test labelled `execbox.test=<label>`.
pub fn test_label(label: &str) -> String {
    format!("label=execbox.test={label}")
}

/// The filter of the containers of the execbox process whose owner token is `token`.
pub fn owned_by(token: &str) -> String {
    format!("label=execbox.owner={token}")
}

/// The containers of the execbox process whose owner token is `token`:
/// running ones, with `all` stopped ones too.
pub fn owned(token: &str, all: bool) -> Vec<String> {
    let filter = owned_by(token);
    let mut args = vec!["--filter", filter.as_str()];
    if all {
        args.push("--all");
    }
    ps(&args)
}

/// Docker's events (`docker events`) that pass `filters`, each as
/// `<action> <container id>`, from a second before it was made on: what
/// happened between a listing and the subscription is not missed.
pub struct Events {
    child: Child,
    lines: Receiver<String>,
}

impl Events {
    /// Events that pass every filter (`--filter` values such as
    /// `event=destroy` or a label filter).
    pub fn new(filters: &[&str]) -> Self {
        let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().saturating_sub(Duration::from_secs(1));
        let mut command = Command::new("docker");
        command.args(["events", "--format", "{{.Action}} {{.Actor.ID}}"]);
        command.arg(format!("--since={}.{:09}", since.as_secs(), since.subsec_nanos()));
        for filter in filters {
            command.args(["--filter", filter]);
        }
        let mut child = command.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("docker events");
        let stdout = child.stdout.take().unwrap();
        let (send, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    return;
                }
            }
        });
        Self { child, lines }
    }

    /// The next event, waiting at most until `until`.
    pub fn next_before(&self, until: Instant) -> Option<String> {
        self.lines.recv_timeout(until.saturating_duration_since(Instant::now())).ok()
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until no container (running or not) passes every one of
/// `filters`, at most `limit`: each one listed now is waited for on its
/// `destroy` event. Whether none is left.
pub fn wait_gone(filters: &[&str], limit: Duration) -> bool {
    wait_for_each(filters, limit, "destroy", &["--all"])
}

/// Waits until no running container passes every one of `filters`, at most
/// `limit`: each one running now is waited for on its `die` event. Whether
/// none runs.
pub fn wait_stopped(filters: &[&str], limit: Duration) -> bool {
    wait_for_each(filters, limit, "die", &[])
}

/// Waits for `event` of each container `ps` lists (with `which`) under
/// `filters`; whether the listing is empty at the end.
fn wait_for_each(filters: &[&str], limit: Duration, event: &str, which: &[&str]) -> bool {
    let until = Instant::now() + limit;
    let event = format!("event={event}");
    // Subscribed before the listing: an event between the two is not missed.
    let events = Events::new(&[filters, &[event.as_str()]].concat());
    let listing = |extra: &[&str]| {
        let mut args: Vec<&str> = which.iter().chain(extra).copied().collect();
        for filter in filters {
            args.extend(["--filter", filter]);
        }
        ps(&args)
    };
    let mut left: std::collections::HashSet<String> = listing(&["--no-trunc"]).into_iter().collect();
    while !left.is_empty() {
        let Some(line) = events.next_before(until) else { break };
        if let Some((_, id)) = line.split_once(' ') {
            left.remove(id);
        }
    }
    listing(&[]).is_empty()
}

/// The seccomp profile the engine recorded for the container `id` (the
/// `seccomp=` entry of its `HostConfig.SecurityOpt`, whose text the docker
/// CLI sends), parsed; `None` for the engine's default or a container gone.
pub fn seccomp_profile_of(id: &str) -> Option<serde_json::Value> {
    let out = Command::new("docker")
        .args(["inspect", "--type=container", "--format={{json .HostConfig.SecurityOpt}}", id])
        .output()
        .expect("docker inspect");
    let options: Vec<String> = serde_json::from_slice(&out.stdout).ok()?;
    let text = options.iter().find_map(|o| o.strip_prefix("seccomp="))?;
    serde_json::from_str(text).ok()
}
