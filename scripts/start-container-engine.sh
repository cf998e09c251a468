#!/usr/bin/env bash
# Makes a docker engine answer on this machine (idempotent, fast when one does).
#
# A new machine has only the docker CLI and no registry to pull from, so:
# install Debian's docker.io if dockerd is missing, start dockerd in the
# background, and wait until `docker info` answers. Images are built offline
# by scripts/build-images.sh. Set EXECBOX_ENGINE=podman to use podman instead
# (then this script only checks that podman answers).
set -euo pipefail

engine="${EXECBOX_ENGINE:-docker}"
log="${EXECBOX_DOCKERD_LOG:-/var/log/execbox-dockerd.log}"

if "$engine" info >/dev/null 2>&1; then
  echo "container engine: $engine answers"
  exit 0
fi
if [ "$engine" != docker ]; then
  echo "container engine: $engine does not answer; start it yourself" >&2
  exit 1
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

if ! command -v dockerd >/dev/null; then
  echo "container engine: installing docker.io from Debian"
  "$(dirname "$0")/apt-install.sh" docker.io
fi

if ! pgrep -x dockerd >/dev/null; then
  echo "container engine: starting dockerd (log: $log)"
  # setsid: the daemon must outlive this script and its process group.
  $SUDO setsid dockerd >"$log" 2>&1 </dev/null &
fi

for _ in $(seq 1 120); do
  if docker info >/dev/null 2>&1; then
    echo "container engine: docker answers ($(docker version --format '{{.Server.Version}}'))"
    exit 0
  fi
  sleep 0.5
done
echo "container engine: dockerd did not answer within 60 s; last log lines:" >&2
tail -n 20 "$log" >&2 || true
exit 1
