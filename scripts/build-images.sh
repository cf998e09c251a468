#!/usr/bin/env bash
# Builds execbox's container images offline, from Debian packages (idempotent).
#
# No registry can be pulled from here, so each image is a root filesystem
# assembled from `apt-get download` + `dpkg-deb -x` and loaded with
# `docker import`. An image is rebuilt only when its recipe (package list +
# this script) changed: the recipe hash is stored as a label.
#
#   localhost/execbox-python:3.11      python3 + dash + coreutils (Python, shell)
#   localhost/execbox-rust:bookworm    gcc + libc6-dev + dash + coreutils: links
#                                      and runs Rust programs; rustc itself is
#                                      bind-mounted read-only from the host.
set -euo pipefail

engine="${EXECBOX_ENGINE:-docker}"
here="$(cd "$(dirname "$0")" && pwd)"
script_hash="$(sha256sum "$here/build-images.sh" | cut -c1-16)"

# Never unpacked: package management and perl are not needed to run code.
skip_packages='^(dpkg|perl-base|perl|tar|debconf|debianutils|init-system-helpers|usrmerge|base-passwd|adduser|login|passwd)$'

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

package_closure() {
  apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
    --no-breaks --no-replaces --no-enhances "$@" |
    grep -E '^[a-z0-9]' | sort -u | grep -Ev "$skip_packages"
}

build_image() {
  local tag="$1"
  shift
  local recipe
  recipe="$(printf '%s %s' "$script_hash" "$*" | sha256sum | cut -c1-16)"
  local have
  have="$("$engine" image inspect -f '{{index .Config.Labels "execbox.recipe"}}' "$tag" 2>/dev/null || true)"
  if [ "$have" = "$recipe" ]; then
    echo "image $tag: up to date"
    return
  fi
  echo "image $tag: building from Debian packages: $*"
  local work
  work="$(mktemp -d /tmp/execbox-image.XXXXXX)"
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" RETURN
  mkdir -p "$work/debs" "$work/rootfs"
  local packages
  packages="$(package_closure "$@")"
  # apt-get download drops privileges to _apt, which must be able to write here.
  chmod 0777 "$work/debs"
  (cd "$work/debs" && apt-get download -qq $packages >/dev/null 2>&1) || {
    echo "image $tag: apt-get download failed; retrying after apt-get update" >&2
    $SUDO apt-get update -qq
    (cd "$work/debs" && apt-get download -qq $packages >/dev/null)
  }
  for deb in "$work"/debs/*.deb; do
    dpkg-deb -x "$deb" "$work/rootfs"
  done
  local root="$work/rootfs"
  mkdir -p "$root"/{etc,proc,sys,dev,work,opt/rust,opt/execbox,usr/bin,bin}
  install -d -m 1777 "$root/tmp"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
  [ -e "$root/bin/sh" ] || ln -s dash "$root/bin/sh"
  [ -e "$root/bin/dash" ] || ln -s /usr/bin/dash "$root/bin/dash"
  [ -e "$root/usr/bin/cc" ] || { [ -e "$root/usr/bin/gcc-12" ] && ln -s gcc-12 "$root/usr/bin/cc"; } || true
  tar -C "$root" -c . | "$engine" import \
    --change "LABEL execbox.recipe=$recipe" \
    --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PYTHONDONTWRITEBYTECODE=1' \
    --change 'WORKDIR /work' \
    - "$tag" >/dev/null
  echo "image $tag: built ($("$engine" image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}'))"
}

"$here/start-container-engine.sh"
build_image localhost/execbox-python:3.11 python3 dash coreutils
build_image localhost/execbox-rust:bookworm gcc libc6-dev zlib1g dash coreutils
