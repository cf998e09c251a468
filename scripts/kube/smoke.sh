#!/usr/bin/env bash
# Smoke check of the cluster scripts/kube/up.sh starts (it runs up.sh first,
# which is idempotent): runs pods in the locked shape execbox's kubernetes
# backend will use and checks what they can do.
#
#   scripts/kube/smoke.sh [RUNS]     RUNS: how many timed pods (default 5)
#
# 1. RUNS times: a pod in namespace execbox running `python3 -c 'print(1+1)'`
#    from localhost/execbox-python:3.11 (imagePullPolicy: Never; built by
#    scripts/build-images.sh): runAsNonRoot as uid/gid 65534,
#    readOnlyRootFilesystem, capabilities drop ALL, allowPrivilegeEscalation
#    false, seccompProfile RuntimeDefault, automountServiceAccountToken false,
#    enableServiceLinks false, limits memory 128Mi / cpu 500m,
#    activeDeadlineSeconds 60, an emptyDir (medium: Memory, sizeLimit 16Mi) at
#    /tmp, and an init container `netoff` that takes the pod off the network
#    (below). Waits for Succeeded, reads the logs ("2"), deletes the pod, and
#    prints create->Succeeded, create->logs and the median of each.
# 2. Network denied by construction (no NetworkPolicy plugin here; pods sit
#    on docker's bridge): `netoff` is the only container with a capability
#    (NET_ADMIN, as root, nothing else) and runs before the unprivileged main
#    container: for every interface but lo it removes the IPv4 address
#    (SIOCSIFADDR 0.0.0.0) and sets the link down (SIOCSIFFLAGS), which drops
#    its routes. A probe pod of that shape then checks that the docker bridge
#    gateway and another pod's IP are unreachable, that loopback works, and
#    that it cannot bring eth0 back up (not even after unshare(CLONE_NEWUSER)).
#    The same probe without `netoff` is run first as the control: there both
#    are reachable.
#
# Exits non-zero on any failure. Env: EXECBOX_KUBECTL, the kubectl to use
# (default: the 1.20 kubectl that scripts/kube/build.sh built); NETOFF=0 leaves
# `netoff` out of the timed pods (to measure what it costs).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"
runs=${1:-5}
image=localhost/execbox-python:3.11
ns=execbox

kubeconfig=$("$here/up.sh")
bin=$("$here/build.sh")
kubectl=("${EXECBOX_KUBECTL:-$bin/kubectl}" --kubeconfig "$kubeconfig" -n "$ns")
log() { echo "kube smoke: $*" >&2; }
fail() { log "FAIL: $*"; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

docker image inspect "$image" >/dev/null 2>&1 ||
  fail "$image is not in docker; build it with scripts/build-images.sh"

# Takes every interface but lo off the network: no IPv4 address, link down
# (which drops the routes through it). Needs only CAP_NET_ADMIN.
netoff_py='import fcntl, socket, struct
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _, name in socket.if_nameindex():
    if name == "lo":
        continue
    n = name.encode()
    try:  # SIOCSIFADDR 0.0.0.0 deletes the IPv4 addresses
        fcntl.ioctl(s, 0x8916, struct.pack("16sHH4s16s", n, socket.AF_INET, 0, bytes(4), b""))
    except OSError:
        pass  # none to remove
    flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH22s", n, 0, b""))[:18])[1]
    fcntl.ioctl(s, 0x8914, struct.pack("16sH22s", n, flags & ~1, b""))  # SIOCSIFFLAGS without IFF_UP
    print("netoff:", name, "down")'

# What the main container can reach. Prints one "key value" line per check.
probe_py='import ctypes, errno, fcntl, os, socket, struct, sys
gw, peer = sys.argv[1], sys.argv[2]
def connect(host, port):
    c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    c.settimeout(3)
    try:
        c.connect((host, port)); return "connected"
    except ConnectionRefusedError:
        return "refused"  # the host answered: reachable
    except OSError as e:
        return errno.errorcode.get(e.errno, "timeout")
    finally:
        c.close()
print("links", ",".join(n + ":" + open("/sys/class/net/" + n + "/operstate").read().strip() for _, n in socket.if_nameindex()))
print("routes", len(open("/proc/net/route").read().splitlines()) - 1)
print("gateway", connect(gw, 1))
print("peer", connect(peer, 8080))
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
print("loopback", connect("127.0.0.1", srv.getsockname()[1]))
def up(label):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH22s", b"eth0", 0, b""))[:18])[1]
        fcntl.ioctl(s, 0x8914, struct.pack("16sH22s", b"eth0", flags | 1, b""))
        print(label, "allowed")
    except OSError as e:
        print(label, errno.errorcode.get(e.errno, str(e)))
up("eth0_up")
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(0x10000000) == 0:  # CLONE_NEWUSER: all capabilities, in a namespace that owns nothing
    up("eth0_up_in_userns")
else:
    print("eth0_up_in_userns unshare:" + errno.errorcode.get(ctypes.get_errno(), "?"))'

# pod NAME MODE [ARGS...]: the locked pod's manifest. MODE: print (1+1),
# probe (runs probe_py ARGS), serve (an HTTP server on 8080, the peer);
# NETOFF=0 leaves the init container out.
pod() {
  local name=$1 mode=$2
  shift 2
  local cmd
  case $mode in
    print) cmd='["python3", "-c", "print(1+1)"]' ;;
    probe) cmd=$(printf '["python3", "-c", %s, "%s", "%s"]' "$(json "$probe_py")" "$1" "$2") ;;
    serve) cmd='["python3", "-m", "http.server", "8080", "--bind", "0.0.0.0", "--directory", "/tmp"]' ;;
  esac
  local limits='{"limits": {"memory": "128Mi", "cpu": "500m"}}'
  local init=''
  if [ "${NETOFF:-1}" = 1 ]; then
    init=$(printf '"initContainers": [{
      "name": "netoff", "image": "%s", "imagePullPolicy": "Never",
      "command": ["python3", "-c", %s],
      "securityContext": {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": false,
        "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
        "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]}},
      "resources": %s}],' "$image" "$(json "$netoff_py")" "$limits")
  fi
  cat <<EOF
{"apiVersion": "v1", "kind": "Pod",
 "metadata": {"name": "$name", "namespace": "$ns", "labels": {"app": "execbox-smoke"}},
 "spec": {
  "restartPolicy": "Never",
  "automountServiceAccountToken": false,
  "enableServiceLinks": false,
  "activeDeadlineSeconds": 60,
  "terminationGracePeriodSeconds": 0,
  "securityContext": {"runAsNonRoot": true, "runAsUser": 65534, "runAsGroup": 65534,
    "seccompProfile": {"type": "RuntimeDefault"}},
  $init
  "containers": [{
    "name": "main", "image": "$image", "imagePullPolicy": "Never",
    "command": $cmd,
    "securityContext": {"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
      "capabilities": {"drop": ["ALL"]}},
    "resources": $limits,
    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}],
  "volumes": [{"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}}]}}
EOF
}
# A JSON string of $1.
json() { printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/\t/\\t/g' | awk 'BEGIN { ORS = "" } NR > 1 { print "\\n" } { print }' | sed -e 's/^/"/' -e 's/$/"/'; }

phase() { "${kubectl[@]}" get pod "$1" -o 'jsonpath={.status.phase}' 2>/dev/null; }
wait_phase() { # pod phase... ; prints the phase reached
  local p i
  for ((i = 0; i < 600; i++)); do
    p=$(phase "$1")
    for want in "${@:2}"; do [ "$p" = "$want" ] && { echo "$p"; return 0; }; done
    case $p in Succeeded | Failed) echo "$p"; return 0 ;; esac
    sleep 0.1
  done
  echo "timeout($p)"
}
cleanup() { "${kubectl[@]}" delete pod -l app=execbox-smoke --wait=false >/dev/null 2>&1 || true; }
trap cleanup EXIT
cleanup
"${kubectl[@]}" wait --for=delete pod -l app=execbox-smoke --timeout=60s >/dev/null 2>&1 || true

# --- 1. timed runs ----------------------------------------------------------------
succeeded=()
logged=()
for ((i = 1; i <= runs; i++)); do
  name="smoke-$i-$$"
  t0=$(now)
  pod "$name" print | "${kubectl[@]}" create -f - >/dev/null
  p=$(wait_phase "$name" Succeeded)
  t1=$(now)
  if [ "$p" != Succeeded ]; then
    "${kubectl[@]}" describe pod "$name" >&2 || true
    fail "pod $name ended $p"
  fi
  out=$("${kubectl[@]}" logs "$name" -c main)
  t2=$(now)
  [ "$out" = 2 ] || fail "pod $name printed '$out', not 2"
  if [ "${NETOFF:-1}" = 1 ]; then
    "${kubectl[@]}" logs "$name" -c netoff | grep -q 'netoff: eth0 down' || fail "netoff did not take eth0 down in $name"
  fi
  "${kubectl[@]}" delete pod "$name" --wait=true >/dev/null
  succeeded+=("$(elapsed "$t0" "$t1")")
  logged+=("$(elapsed "$t0" "$t2")")
  log "run $i: create->Succeeded ${succeeded[-1]} s, create->logs ${logged[-1]} s, printed $out"
done
log "median of $runs: create->Succeeded $(printf '%s\n' "${succeeded[@]}" | median) s, create->logs $(printf '%s\n' "${logged[@]}" | median) s"

# --- 2. network denied by construction -------------------------------------------------
gateway=$(bridge_address)
gateway=${gateway%/*}
NETOFF=0 pod "peer-$$" serve | "${kubectl[@]}" create -f - >/dev/null
[ "$(wait_phase "peer-$$" Running)" = Running ] || fail "peer pod did not run"
peer_ip=$("${kubectl[@]}" get pod "peer-$$" -o 'jsonpath={.status.podIP}')
for variant in control netoff; do
  name="probe-$variant-$$"
  if [ "$variant" = control ]; then NETOFF=0; else NETOFF=1; fi
  NETOFF=$NETOFF pod "$name" probe "$gateway" "$peer_ip" | "${kubectl[@]}" create -f - >/dev/null
  p=$(wait_phase "$name" Succeeded)
  [ "$p" = Succeeded ] || { "${kubectl[@]}" logs "$name" -c main >&2 || true; fail "probe pod $name ended $p"; }
  out=$("${kubectl[@]}" logs "$name" -c main)
  log "$variant (gateway $gateway, peer pod $peer_ip):"
  sed 's/^/    /' <<<"$out" >&2
  get() { awk -v k="$1" '$1 == k { print $2 }' <<<"$out"; }
  [ "$(get loopback)" = connected ] || fail "$variant: loopback does not work"
  [ "$(get eth0_up)" = EPERM ] || fail "$variant: the main container could touch eth0 ($(get eth0_up))"
  if [ "$variant" = control ]; then
    [ "$(get peer)" = connected ] || fail "control: the peer pod is not reachable ($(get peer)); the check proves nothing"
    case $(get gateway) in connected | refused) ;; *) fail "control: the gateway is not reachable ($(get gateway))" ;; esac
  else
    [ "$(get peer)" = ENETUNREACH ] || fail "netoff: the peer pod answered ($(get peer))"
    [ "$(get gateway)" = ENETUNREACH ] || fail "netoff: the gateway answered ($(get gateway))"
    [ "$(get routes)" = 0 ] || fail "netoff: routes are left"
    case $(get eth0_up_in_userns) in allowed) fail "netoff: eth0 came back up from a user namespace" ;; esac
  fi
  "${kubectl[@]}" delete pod "$name" --wait=false >/dev/null
done
log "ok: network denied by construction (netoff), loopback works"
