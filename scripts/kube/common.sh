# Shared by scripts/kube/{up,down,smoke}.sh (sourced, not run).
#
# Env:
#   EXECBOX_KUBE_RUN      the cluster's state dir (default /tmp/execbox-kube):
#                         pki/, etcd/, kubelet/ (the kubelet's root dir),
#                         logs/, pids/, *.kubeconfig, saved-sysctls
#   EXECBOX_KUBE_PORT     kube-apiserver's port on 127.0.0.1 (default 6443)
#   EXECBOX_KUBE_ETCD_PORT etcd's client port on 127.0.0.1 (default 23790; the
#                         peer port is this + 1)
#   EXECBOX_KUBE_KUBELET_PORT the kubelet's port on 127.0.0.1 (default 10250;
#                         its healthz port is 10248)

run=${EXECBOX_KUBE_RUN:-/tmp/execbox-kube}
api_port=${EXECBOX_KUBE_PORT:-6443}
etcd_port=${EXECBOX_KUBE_ETCD_PORT:-23790}
etcd_peer_port=$((etcd_port + 1))
kubelet_port=${EXECBOX_KUBE_KUBELET_PORT:-10250}
# The node's name. The kubelet refuses a loopback --node-ip, and the apiserver
# reaches the kubelet (exec, attach, logs) by the node's Hostname address
# first: "localhost" resolves to 127.0.0.1 on every machine, so no /etc/hosts
# entry is needed.
node=localhost
pause_image=localhost/execbox-kube-pause:3.4
components=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)
# What the kubelet changes at start (it sets the first six; the docker
# network plugin the next two; kube-proxy route_localnet, and the conntrack
# ones unless told not to, as up.sh does) and down.sh puts back.
sysctls=(kernel.panic kernel.panic_on_oops vm.overcommit_memory vm.panic_on_oom
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes
  net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables
  net.ipv4.conf.all.route_localnet net.netfilter.nf_conntrack_max
  net.netfilter.nf_conntrack_tcp_timeout_established net.netfilter.nf_conntrack_tcp_timeout_close_wait)
admin_kubeconfig="$run/admin.kubeconfig"
# Written by the kubelet outside its --root-dir whatever its flags say.
kubelet_fixed_paths=(/var/log/pods /var/log/containers /var/lib/kubelet /var/lib/kubelet/device-plugins)

if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/kube: the kubelet and its cleanup need root; run as root (or with sudo)" >&2
  exit 1
fi

# The pid of a component if it is running (checked against the binary, so a
# recycled pid is never taken for ours).
running_pid() { # $1: component
  local pidfile="$run/pids/$1.pid" pid exe
  [ -f "$pidfile" ] || return 1
  pid=$(cat "$pidfile")
  [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  [ "$(basename "${exe% (deleted)}")" = "$1" ] || return 1
  echo "$pid"
}

# docker's bridge address as ADDRESS/PREFIX (e.g. 172.17.0.1/16): where pods
# reach the host. Read off docker0 itself: `docker network inspect`'s
# Gateway is empty on some docker versions.
bridge_address() {
  local address
  address=$(ip -4 -o addr show dev docker0 scope global 2>/dev/null | awk '{ print $4; exit }')
  [ -n "$address" ] || { echo "scripts/kube: docker's bridge docker0 has no IPv4 address" >&2; return 1; }
  echo "$address"
}
