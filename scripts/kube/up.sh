#!/usr/bin/env bash
# Starts a single-node Kubernetes 1.20 on this machine (idempotent): etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler and a kubelet on
# docker (dockershim), all listening on 127.0.0.1 only.
#
#   scripts/kube/up.sh    prints the admin kubeconfig's path on its last line
#
# Builds the binaries first (scripts/kube/build.sh: seconds when cached),
# makes docker answer (scripts/start-container-engine.sh), builds the pod
# sandbox image localhost/execbox-kube-pause:3.4 from the built static pause
# binary, and waits until the node is Ready, the namespace `execbox` exists
# and the `default` service accounts of `default` and `execbox` exist. If
# everything is already up and healthy it says so and exits 0; a component
# that died is started again. Exports nothing: use the kubeconfig it prints
# ("$EXECBOX_KUBE_RUN/admin.kubeconfig", a cluster-admin client certificate).
#
# State, logs (logs/<component>.log) and pid files (pids/) live under
# $EXECBOX_KUBE_RUN (default /tmp/execbox-kube); see common.sh for the ports.
# scripts/kube/down.sh stops it all and undoes what the kubelet changed.
#
# kube-proxy (iptables mode) carries Services: ClusterIPs with ClientIP
# session affinity (execbox serve replicas), and the `kubernetes` Service
# that in-cluster clients use. Pods get docker's default bridge network, so
# the API server listens on all addresses (client certificates or tokens
# required, RBAC) and advertises docker's bridge gateway: the address pods
# reach the host at. Not started: CoreDNS, a network plugin or a registry;
# images must already be in docker (imagePullPolicy: Never).
#
# Env (besides common.sh's): EXECBOX_KUBE_POD_PIDS_LIMIT, the kubelet's
# podPidsLimit, the most processes one pod may have (default 1024).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=common.sh
. "$here/common.sh"
log() { echo "kube up: $*" >&2; }
t0=$(date +%s.%N)

bin=$("$here/build.sh")
"$(dirname "$here")/start-container-engine.sh" >&2
need=()
command -v etcd >/dev/null || need+=(etcd-server)
command -v openssl >/dev/null || need+=(openssl)
command -v curl >/dev/null || need+=(curl)
if [ "${#need[@]}" -gt 0 ]; then
  log "installing ${need[*]}"
  "$(dirname "$here")/apt-install.sh" "${need[@]}"
fi
kubectl=("$bin/kubectl" --kubeconfig "$admin_kubeconfig")
# Where pods reach the host (and so the API server): docker's bridge gateway.
bridge=$(bridge_address)
host_on_bridge=${bridge%/*}
pod_cidr=$(python3 -c 'import ipaddress, sys; print(ipaddress.ip_interface(sys.argv[1]).network)' "$bridge")

mkdir -p "$run"/{pki,logs,pids,kubelet,dockershim}
pki="$run/pki"

# --- what down.sh must put back, saved once per up/down cycle ----------------
if [ ! -f "$run/saved-sysctls" ]; then
  for s in "${sysctls[@]}"; do
    v=$(sysctl -n "$s" 2>/dev/null) && printf '%s=%s\n' "$s" "$v"
  done >"$run/saved-sysctls.tmp"
  mv "$run/saved-sysctls.tmp" "$run/saved-sysctls"
fi
if [ ! -f "$run/preexisting" ]; then
  # Paths the kubelet writes to outside its root dir whatever its flags say
  # (logs; the device plugin socket dir is hard-coded); down.sh removes the
  # ones that did not exist before.
  for p in "${kubelet_fixed_paths[@]}"; do
    [ -e "$p" ] && echo "$p"
  done >"$run/preexisting.tmp" || true
  mv "$run/preexisting.tmp" "$run/preexisting"
fi

# --- certificates (once per up/down cycle; ECDSA P-256: RSA keys cost ~2 s) ---
cert() { # name subject extendedKeyUsage [subjectAltName]
  local name=$1 subj=$2 eku=$3 san=${4:-}
  [ -f "$pki/$name.crt" ] && return
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$pki/$name.key" -subj "$subj" \
    -out "$pki/$name.csr" 2>/dev/null
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$eku"
    [ -z "$san" ] || echo "subjectAltName=$san"
  } >"$pki/$name.ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
    -CAcreateserial -days 3650 -sha256 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
  rm -f "$pki/$name.csr" "$pki/$name.ext"
}
if [ ! -f "$pki/ca.crt" ]; then
  log "making certificates in $pki"
  openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -keyout "$pki/ca.key" -days 3650 -sha256 \
    -subj "/CN=execbox-kube-ca" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "$pki/ca.crt" 2>/dev/null
fi
cert apiserver "/CN=kube-apiserver" serverAuth \
  "IP:127.0.0.1,IP:10.96.0.1,IP:$host_on_bridge,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
cert admin "/O=system:masters/CN=execbox-admin" clientAuth
cert controller-manager "/CN=system:kube-controller-manager" clientAuth
cert scheduler "/CN=system:kube-scheduler" clientAuth
cert kubelet "/O=system:nodes/CN=system:node:$node" clientAuth
cert kube-proxy "/CN=system:kube-proxy" clientAuth
if [ ! -f "$pki/sa.key" ]; then
  openssl ecparam -name prime256v1 -genkey -noout -out "$pki/sa.key" 2>/dev/null
  openssl ec -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
fi
chmod 600 "$pki"/*.key

kubeconfig() { # name (the cert's name; the file is $run/<name>.kubeconfig)
  cat >"$run/$1.kubeconfig.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: execbox
  cluster:
    server: https://127.0.0.1:$api_port
    certificate-authority-data: $(base64 -w0 "$pki/ca.crt")
users:
- name: $1
  user:
    client-certificate-data: $(base64 -w0 "$pki/$1.crt")
    client-key-data: $(base64 -w0 "$pki/$1.key")
contexts:
- name: execbox
  context:
    cluster: execbox
    user: $1
current-context: execbox
EOF
  chmod 600 "$run/$1.kubeconfig.tmp"
  mv "$run/$1.kubeconfig.tmp" "$run/$1.kubeconfig"
}
for k in admin controller-manager scheduler kubelet kube-proxy; do kubeconfig "$k"; done

# --- the pod sandbox image ----------------------------------------------------
pause_sum=$(sha256sum "$bin/pause" | cut -c1-16)
if [ "$(docker image inspect -f '{{index .Config.Labels "execbox.pause"}}' "$pause_image" 2>/dev/null)" != "$pause_sum" ]; then
  log "loading $pause_image into docker"
  tar -C "$bin" --owner=0 --group=0 -c pause |
    docker import -c 'ENTRYPOINT ["/pause"]' -c 'USER 65535:65535' \
      -c "LABEL execbox.pause=$pause_sum" - "$pause_image" >/dev/null
fi

# --- components -----------------------------------------------------------------
started=0
start() { # name command...
  local name=$1 pid
  shift
  if pid=$(running_pid "$name"); then return; fi
  log "starting $name (log $run/logs/$name.log)"
  echo "--- $(date -u +%FT%TZ) $*" >>"$run/logs/$name.log"
  # Not a process group leader (no job control here), so setsid does not
  # fork and $! is the component itself; it outlives this script.
  setsid "$@" >>"$run/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$run/pids/$name.pid"
  started=1
}
wait_for() { # what timeout-seconds component command...
  local what=$1 timeout=$2 comp=$3 i
  shift 3
  for ((i = 0; i < timeout * 5; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    if ! running_pid "$comp" >/dev/null; then
      log "$comp exited while waiting for $what; last lines of $run/logs/$comp.log:"
      tail -n 30 "$run/logs/$comp.log" >&2
      exit 1
    fi
    sleep 0.2
  done
  log "timed out after ${timeout}s waiting for $what; last lines of $run/logs/$comp.log:"
  tail -n 30 "$run/logs/$comp.log" >&2
  exit 1
}

start etcd etcd --name execbox --data-dir "$run/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
  --initial-cluster "execbox=http://127.0.0.1:$etcd_peer_port"
etcd_healthy() { curl -fsS "http://127.0.0.1:$etcd_port/health" | grep -q '"health":"true"'; }
wait_for "etcd" 30 etcd etcd_healthy

start kube-apiserver "$bin/kube-apiserver" \
  --etcd-servers="http://127.0.0.1:$etcd_port" \
  --bind-address=0.0.0.0 --advertise-address="$host_on_bridge" --secure-port="$api_port" --insecure-port=0 \
  --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
  --client-ca-file="$pki/ca.crt" \
  --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" \
  --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
  --kubelet-preferred-address-types=Hostname,InternalIP \
  --authorization-mode=Node,RBAC \
  --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-cluster-ip-range=10.96.0.0/24 \
  --profiling=false
api_ready() {
  curl -fsS --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
    "https://127.0.0.1:$api_port/readyz" | grep -qx ok
}
wait_for "kube-apiserver /readyz" 60 kube-apiserver api_ready

start kube-controller-manager "$bin/kube-controller-manager" \
  --kubeconfig="$run/controller-manager.kubeconfig" \
  --bind-address=127.0.0.1 --secure-port=0 --port=0 \
  --controllers='*,-nodeipam' --leader-elect=false --use-service-account-credentials=true \
  --node-monitor-period=2s \
  --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
  --cluster-signing-cert-file="$pki/ca.crt" --cluster-signing-key-file="$pki/ca.key" \
  --profiling=false
start kube-scheduler "$bin/kube-scheduler" \
  --kubeconfig="$run/scheduler.kubeconfig" \
  --bind-address=127.0.0.1 --secure-port=0 --port=0 --leader-elect=false --profiling=false

cat >"$run/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $kubelet_port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
cgroupDriver: cgroupfs
failSwapOn: false
# The node goes Ready on the first status check after the runtime is up: every
# 2 s rather than 10 s saves ~8 s of up.sh (a status is still only posted
# when it changes, or every 5 min).
nodeStatusUpdateFrequency: 2s
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $pki/ca.crt
authorization:
  mode: Webhook
podPidsLimit: ${EXECBOX_KUBE_POD_PIDS_LIMIT:-1024}
featureGates:
  # emptyDir medium: Memory gets a tmpfs of size sizeLimit (alpha in 1.20;
  # without it the tmpfs is unbounded and sizeLimit is only an eviction check).
  SizeMemoryBackedVolumes: true
# KUBE-MARK-MASQ/KUBE-MARK-DROP, which kube-proxy's rules jump to (down.sh
# removes every KUBE-* chain).
makeIPTablesUtilChains: true
# Never delete docker images (this machine's disk may be fuller than the
# kubelet's defaults allow) and never evict for disk.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
EOF
# execbox's own seccomp profile (the docker backend's), for pods that ask
# for Localhost "execbox.json" (KubernetesConfig::seccomp_profile); copied
# on every up, so a running node gets the repository's current one.
mkdir -p "$run/kubelet/seccomp"
cp "$(dirname "$here")/../src/backends/container/seccomp.json" "$run/kubelet/seccomp/execbox.json.tmp"
mv "$run/kubelet/seccomp/execbox.json.tmp" "$run/kubelet/seccomp/execbox.json"
start kubelet "$bin/kubelet" \
  --config="$run/kubelet-config.yaml" --kubeconfig="$run/kubelet.kubeconfig" \
  --seccomp-profile-root="$run/kubelet/seccomp" \
  --hostname-override="$node" --root-dir="$run/kubelet" --cert-dir="$run/kubelet/pki" \
  --container-runtime=docker \
  --container-runtime-endpoint="unix://$run/dockershim.sock" \
  --experimental-dockershim-root-directory="$run/dockershim" \
  --pod-infra-container-image="$pause_image" \
  --oom-score-adj=0

cat >"$run/kube-proxy-config.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $run/kube-proxy.kubeconfig
mode: iptables
hostnameOverride: $node
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# Traffic to a Service from outside the pods' network is masqueraded.
clusterCIDR: $pod_cidr
# Leave the machine's conntrack settings alone (0: do not set them).
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
start kube-proxy "$bin/kube-proxy" --config="$run/kube-proxy-config.yaml"

# Client addresses for tests of ClientIP session affinity: a Service keeps
# each client address on one replica, so a test reaches several replicas by
# connecting from several of these (the last 16 of docker's bridge subnet,
# on the bridge, labelled docker0:ex; down.sh removes them). Listed in
# "$run/client-addresses", comma-separated.
if [ ! -f "$run/client-addresses" ]; then
  addresses=$(python3 -c 'import ipaddress, sys; print(",".join(str(a) for a in list(ipaddress.ip_network(sys.argv[1]).hosts())[-16:]))' "$pod_cidr")
  for a in ${addresses//,/ }; do
    ip -4 addr show dev docker0 | grep -qF " $a/" || ip addr add "$a/32" dev docker0 label docker0:ex
  done
  echo "$addresses" >"$run/client-addresses"
fi

# Ready, and schedulable: the node lifecycle controller has removed its
# not-ready taint.
node_ready() {
  [ "$("${kubectl[@]}" get node "$node" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}/{.spec.taints}')" = True/ ]
}
wait_for "node $node Ready without taints" 90 kubelet node_ready
for c in kube-controller-manager kube-scheduler kube-proxy; do
  running_pid "$c" >/dev/null || { log "$c exited; last lines:"; tail -n 30 "$run/logs/$c.log" >&2; exit 1; }
done
"${kubectl[@]}" get namespace execbox >/dev/null 2>&1 || "${kubectl[@]}" create namespace execbox >/dev/null
sa_exists() { "${kubectl[@]}" -n default get serviceaccount default && "${kubectl[@]}" -n execbox get serviceaccount default; }
wait_for "the default service accounts" 60 kube-controller-manager sa_exists

if [ "$started" = 0 ]; then
  log "already up and healthy"
else
  log "up in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
fi
echo "$admin_kubeconfig"
