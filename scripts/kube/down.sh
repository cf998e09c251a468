#!/usr/bin/env bash
# Stops the cluster scripts/kube/up.sh started and undoes what it and the
# kubelet changed on the machine (idempotent; fine to run when nothing is up):
#   - stops kube-proxy, the kubelet, kube-scheduler, kube-controller-manager,
#     kube-apiserver and etcd (by pid file, checked against the binary; then
#     any process still naming the run dir on its command line);
#   - removes every docker container named k8s_* (the pods' containers and
#     their pause sandboxes), the image localhost/execbox-kube-pause:3.4 and
#     localhost/execbox-serve:dev (scripts/kube/serve-image.sh);
#   - removes up.sh's client addresses from docker's bridge (label docker0:ex);
#   - unmounts everything under the run dir (the kubelet bind-mounts its root
#     dir onto itself; emptyDir medium: Memory volumes are tmpfs mounts);
#   - removes the kubepods cgroups;
#   - removes KUBE-* iptables/ip6tables chains and the rules jumping to them
#     (kube-proxy's Services, the kubelet's);
#   - puts back the sysctls up.sh saved before the kubelet changed them
#     and kube-proxy changed them (kernel.panic, kernel.panic_on_oops,
#     vm.overcommit_memory, net.ipv4.conf.all.route_localnet, ...);
#   - removes /var/log/pods, /var/log/containers, /var/lib/kubelet (its
#     device-plugins dir is hard-coded) where they did not exist before up.sh;
#   - removes the run dir ($EXECBOX_KUBE_RUN, default /tmp/execbox-kube).
#
# Env: EXECBOX_KUBE_KEEP_LOGS=1 keeps "$EXECBOX_KUBE_RUN/logs" (the rest goes).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"
log() { echo "kube down: $*" >&2; }

# --- processes (the kubelet first, so it does not restart containers) ------
stop() { # pids...
  local i pid alive state
  [ "$#" -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    alive=()
    for pid in "$@"; do
      state=$(awk '{ print $3 }' "/proc/$pid/stat" 2>/dev/null) || continue
      [ "$state" = Z ] || alive+=("$pid")
    done
    [ "${#alive[@]}" -gt 0 ] || return 0
    if [ "$i" -eq 60 ]; then # 6 s
      log "killing ${alive[*]}"
      kill -KILL "${alive[@]}" 2>/dev/null || true
    fi
    sleep 0.1
  done
  log "still running: ${alive[*]}"
}
for ((c = ${#components[@]} - 1; c >= 0; c--)); do
  name=${components[c]}
  if pid=$(running_pid "$name"); then
    log "stopping $name (pid $pid)"
    stop "$pid"
  fi
done
# Anything of ours whose pid file was lost: its command line names the run dir.
strays=()
for p in /proc/[0-9]*; do
  pid=${p#/proc/}
  [ "$pid" != $$ ] || continue
  if tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -qF -- "$run/"; then
    exe=$(readlink "$p/exe" 2>/dev/null) || continue
    case "$(basename "${exe% (deleted)}")" in
      etcd | kube-apiserver | kube-controller-manager | kube-scheduler | kubelet | kube-proxy) strays+=("$pid") ;;
    esac
  fi
done
if [ "${#strays[@]}" -gt 0 ]; then
  log "stopping stray processes ${strays[*]}"
  stop "${strays[@]}"
fi

# --- docker -----------------------------------------------------------------
if docker info >/dev/null 2>&1; then
  ids=$(docker ps -aq --filter 'name=^k8s_')
  if [ -n "$ids" ]; then
    log "removing $(echo "$ids" | wc -l) k8s_ containers"
    # shellcheck disable=SC2086
    docker rm -f -v $ids >/dev/null
  fi
  for image in "$pause_image" localhost/execbox-serve:dev; do
    if docker image inspect "$image" >/dev/null 2>&1; then
      docker rmi "$image" >/dev/null
    fi
  done
fi

# --- mounts under the run dir and the kubelet's fixed paths (deepest first) ---
mounts() {
  awk -v r="$run" '
    function unescape(s) { gsub(/\\040/, " ", s); return s }
    { m = unescape($5) }
    m == r || index(m, r "/") == 1 || m ~ "^/var/lib/kubelet(/|$)" { print m }' /proc/self/mountinfo |
    awk '{ print length($0) "\t" $0 }' | sort -rn | cut -f2-
}
for _ in 1 2 3; do
  list=$(mounts)
  [ -n "$list" ] || break
  while IFS= read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done <<<"$list"
done
if [ -n "$(mounts)" ]; then
  log "still mounted:"; mounts >&2
fi

# --- cgroups ------------------------------------------------------------------
for d in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods /sys/fs/cgroup/kubepods.slice; do
  [ -d "$d" ] || continue
  for _ in 1 2 3 4 5; do
    find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
    [ -d "$d" ] || break
    sleep 0.2
  done
  [ ! -d "$d" ] || log "could not remove cgroup $d (processes left in it?)"
done

# --- iptables -------------------------------------------------------------------
for ipt in iptables ip6tables; do
  command -v "$ipt-save" >/dev/null || continue
  for table in filter nat mangle raw; do
    dump=$("$ipt-save" -t "$table" 2>/dev/null) || continue
    chains=$(sed -n 's/^:\(KUBE-[^ ]*\) .*/\1/p' <<<"$dump")
    [ -n "$chains" ] || continue
    log "removing $ipt $table chains: $(echo $chains)"
    # Rules in other chains that jump to ours.
    # (None may jump to them: a table with KUBE-* chains only.)
    { grep -E '^-A ' <<<"$dump" | grep -vE '^-A KUBE-' | grep -E -- '-j KUBE-' || true; } | while IFS= read -r rule; do
      eval "$ipt -t $table -D ${rule#-A }" || true
    done
    for ch in $chains; do "$ipt" -t "$table" -F "$ch" 2>/dev/null || true; done
    for ch in $chains; do "$ipt" -t "$table" -X "$ch" 2>/dev/null || true; done
  done
done

# --- up.sh's client addresses on docker's bridge ---------------------------------
if ip link show docker0 >/dev/null 2>&1; then
  for a in $(ip -4 -o addr show dev docker0 label docker0:ex | awk '{ print $4 }'); do
    ip addr del "$a" dev docker0 2>/dev/null || true
  done
fi

# --- sysctls ----------------------------------------------------------------------
if [ -f "$run/saved-sysctls" ]; then
  while IFS='=' read -r key value; do
    [ -n "$key" ] || continue
    if [ "$(sysctl -n "$key" 2>/dev/null)" != "$value" ]; then
      log "sysctl $key=$value (was $(sysctl -n "$key"))"
      sysctl -q -w "$key=$value"
    fi
  done <"$run/saved-sysctls"
fi

# --- files ---------------------------------------------------------------------------
if [ -f "$run/preexisting" ]; then
  for p in "${kubelet_fixed_paths[@]}"; do
    grep -qxF "$p" "$run/preexisting" && continue
    [ -e "$p" ] && rm -rf "$p"
  done
elif [ -e "$run" ]; then
  log "no $run/preexisting: leaving ${kubelet_fixed_paths[*]} as they are"
fi
if [ -d "$run" ]; then
  if [ "${EXECBOX_KUBE_KEEP_LOGS:-}" = 1 ]; then
    find "$run" -mindepth 1 -maxdepth 1 ! -name logs -exec rm -rf {} +
    log "logs kept in $run/logs"
  else
    rm -rf "$run"
  fi
fi
log "down"
