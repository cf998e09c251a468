#!/usr/bin/env bash
# Puts an execbox binary into the image deploy/kubernetes/serve.yaml runs,
# localhost/execbox-serve:dev, in this machine's docker (the test cluster's
# node runs its pods from there; no registry).
#
#   scripts/kube/serve-image.sh BINARY    prints the image's name
#
# BINARY is the `execbox` command built with `--features kubernetes` (e.g.
# target/debug/execbox after `cargo build -p execbox-cli --features
# kubernetes`). The image is localhost/execbox-python:3.11 (scripts/
# build-images.sh: Debian's libc and nothing to build with) with the binary
# at /usr/bin/execbox as its entrypoint, run as uid 65534. Made with
# docker create/cp/commit, so no builder has to resolve the base image from
# a registry. Skipped when the image already holds this binary (a label
# carries its sha256).
set -euo pipefail
binary=${1:?usage: serve-image.sh BINARY}
image=${EXECBOX_SERVE_IMAGE:-localhost/execbox-serve:dev}
base=localhost/execbox-python:3.11
log() { echo "serve image: $*" >&2; }

[ -x "$binary" ] || { log "$binary is not an executable"; exit 1; }
sum=$(sha256sum "$binary" | cut -c1-16)
if [ "$(docker image inspect -f '{{index .Config.Labels "execbox.binary"}}' "$image" 2>/dev/null)" = "$sum" ]; then
  echo "$image"
  exit 0
fi
docker image inspect "$base" >/dev/null 2>&1 || {
  log "no $base: run scripts/build-images.sh first"
  exit 1
}
container=$(docker create "$base" /bin/true)
trap 'docker rm -f "$container" >/dev/null 2>&1 || true' EXIT
docker cp "$binary" "$container:/usr/bin/execbox"
docker commit \
  -c 'ENTRYPOINT ["/usr/bin/execbox"]' -c 'CMD ["serve"]' -c 'USER 65534:65534' \
  -c 'ENV EXECBOX_LOG=warn' -c "LABEL execbox.binary=$sum" \
  "$container" "$image" >/dev/null
log "built $image from $binary ($(du -h "$binary" | cut -f1))"
echo "$image"
