//! The availability probe: one pod of exactly a run's shape (through the
//! same launcher), whose program (`probe.py`) reports what it can see and
//! do. The backend is available only if every locked control holds there:
//! what a run's capabilities declare is what this cluster was seen to do.

use serde::Deserialize;

use crate::backend::Unavailable;

/// The probe's program.
pub(super) const SOURCE: &str = include_str!("probe.py");

/// What `probe.py` prints.
#[derive(Debug, Deserialize)]
struct Seen {
    uid: u32,
    cap_eff: String,
    no_new_privs: String,
    seccomp: String,
    links_up: Vec<String>,
    routes: i64,
    outside: String,
    token: bool,
    root_writable: bool,
    tmp_bytes: u64,
    shm_bytes: u64,
    kubernetes_env: Vec<String>,
    /// `io_uring_setup`'s errno: 1 (EPERM) under execbox's profile.
    io_uring_errno: i32,
    packages: Vec<String>,
}

/// The packages found, if every control held; else what did not.
/// `localhost_profile`: the Localhost seccomp profile the program runs
/// under (`KubernetesConfig::seccomp_profile`), which must be execbox's.
pub(super) fn judge(stdout: &str, tmp_bytes: u64, localhost_profile: Option<&str>) -> Result<Vec<String>, Unavailable> {
    let seen: Seen = serde_json::from_str(stdout.trim()).map_err(|e| {
        Unavailable::because(format!(
            "the probe pod's report cannot be read ({e}): {}",
            crate::text::cap_message(stdout.to_string())
        ))
    })?;
    // A tmpfs is sized in whole pages.
    let capped = |bytes: u64| bytes <= tmp_bytes.next_multiple_of(4096);
    let checks = [
        (seen.uid == 65534, format!("runs as uid {}, not 65534", seen.uid)),
        (seen.cap_eff.trim_start_matches('0').is_empty(), format!("holds capabilities {}", seen.cap_eff)),
        (seen.no_new_privs == "1", "can gain privileges (NoNewPrivs is not set)".into()),
        (seen.seccomp == "2", format!("has no seccomp filter (Seccomp: {})", seen.seccomp)),
        (
            seen.links_up.is_empty() && seen.routes == 0 && seen.outside == "ENETUNREACH",
            format!(
                "reaches the network (links up: {:?}, routes: {}, an outside address: {})",
                seen.links_up, seen.routes, seen.outside
            ),
        ),
        (!seen.token, "has a service account token mounted".into()),
        (!seen.root_writable, "can write its root filesystem".into()),
        (
            capped(seen.tmp_bytes) && capped(seen.shm_bytes),
            format!(
                "/tmp ({} bytes) or /dev/shm ({} bytes) is larger than asked ({tmp_bytes}): the kubelet needs \
                 the SizeMemoryBackedVolumes feature gate",
                seen.tmp_bytes, seen.shm_bytes
            ),
        ),
        (seen.kubernetes_env.is_empty(), format!("sees the cluster's variables {:?}", seen.kubernetes_env)),
        (
            localhost_profile.is_none() || seen.io_uring_errno == 1,
            format!(
                "is not under execbox's seccomp profile {}: io_uring_setup answered errno {} where the profile \
                 refuses it with EPERM (1)",
                localhost_profile.unwrap_or_default(),
                seen.io_uring_errno
            ),
        ),
    ];
    let failed: Vec<String> = checks.into_iter().filter(|(held, _)| !held).map(|(_, what)| what).collect();
    if failed.is_empty() {
        return Ok(seen.packages);
    }
    Err(Unavailable::new(
        format!("a pod of execbox's locked shape {}", failed.join("; ")),
        "run a cluster whose kubelet honours the pod's securityContext, seccomp profiles and memory emptyDir \
         sizes, with execbox's profile (src/backends/container/seccomp.json) on every node under the name \
         KubernetesConfig::seccomp_profile gives (scripts/kube/up.sh starts one)",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"uid": 65534, "cap_eff": "0000000000000000", "no_new_privs": "1", "seccomp": "2",
        "links_up": [], "routes": 0, "outside": "ENETUNREACH", "token": false, "root_writable": false,
        "tmp_bytes": 65536, "shm_bytes": 65536, "kubernetes_env": [], "io_uring_errno": 1, "packages": ["numpy"]}"#;

    #[test]
    fn a_locked_pod_passes_and_each_gap_is_named() {
        let profile = Some("execbox.json");
        assert_eq!(judge(GOOD, 65536, profile).expect("locked"), vec!["numpy".to_string()]);
        // io_uring reached the kernel: RuntimeDefault, not execbox's profile
        // (which only a backend told to use one requires).
        let runtime_default = GOOD.replace(r#""io_uring_errno": 1"#, r#""io_uring_errno": 14"#);
        assert!(judge(&runtime_default, 65536, None).is_ok());
        let why = judge(&runtime_default, 65536, profile).expect_err("not execbox's profile").reason;
        assert!(why.contains("execbox.json") && why.contains("errno 14"), "{why}");
        for (from, to, named) in [
            (r#""outside": "ENETUNREACH""#, r#""outside": "connected""#, "reaches the network"),
            (r#""routes": 0"#, r#""routes": 1"#, "reaches the network"),
            (r#""cap_eff": "0000000000000000""#, r#""cap_eff": "0000000000001000""#, "holds capabilities"),
            (r#""uid": 65534"#, r#""uid": 0"#, "uid 0"),
            (r#""seccomp": "2""#, r#""seccomp": "0""#, "no seccomp"),
            (r#""token": false"#, r#""token": true"#, "token"),
            (r#""tmp_bytes": 65536"#, r#""tmp_bytes": 999999999"#, "SizeMemoryBackedVolumes"),
            (r#""kubernetes_env": []"#, r#""kubernetes_env": ["KUBERNETES_SERVICE_HOST"]"#, "variables"),
        ] {
            let report = GOOD.replace(from, to);
            let why = judge(&report, 65536, profile).expect_err(named).reason;
            assert!(why.contains(named), "{why}");
        }
        assert!(judge("Traceback", 65536, profile).is_err());
    }
}
