#!/usr/bin/env bash
# Builds localhost/execbox-rust-toolchain:current (idempotent): the image in
# which the kubernetes backend compiles Rust. A cluster's nodes are not the
# host, so the toolchain cannot be bind-mounted as the docker backend does:
# this image is localhost/execbox-rust:bookworm (gcc, libc6-dev) with the
# host's rustc (bin/rustc, its libraries, the x86_64 standard library and
# linker wrappers) at /opt/rust and the prebuilt serde_json rlibs
# (scripts/build-rust-deps.sh) at /opt/execbox/deps. Rebuilt only when
# rustc, the crates or this script changed (a recipe label).
#
#   EXECBOX_RUST_CACHE   the Rust cache root (as in build-rust-deps.sh)
#
# Prints nothing on stdout: scripts/kube/up.sh's stdout is the kubeconfig.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
engine="${EXECBOX_ENGINE:-docker}"
tag="${EXECBOX_RUST_TOOLCHAIN_IMAGE:-localhost/execbox-rust-toolchain:current}"
base=localhost/execbox-rust:bookworm
"$here/build-rust-deps.sh" >&2
cache="${EXECBOX_RUST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/execbox/rust}"
release="$(rustc -vV | sed -n 's/^commit-hash: //p' | cut -c1-12)"
deps="$cache/deps-$release"
sysroot="$(rustc --print sysroot)"
triple="$(rustc -vV | sed -n 's/^host: //p')"
base_id="$("$engine" image inspect -f '{{.Id}}' "$base")"
recipe="$( (sha256sum "$here/build-rust-toolchain-image.sh"; rustc -vV; ls "$deps"; echo "$base_id") | sha256sum | cut -c1-16)"
have="$("$engine" image inspect -f '{{index .Config.Labels "execbox.recipe"}}' "$tag" 2>/dev/null || true)"
if [ "$have" = "$recipe" ]; then
  echo "image $tag: up to date" >&2
  exit 0
fi
echo "image $tag: $base with rustc $release and $(ls "$deps" | grep -c rlib) rlibs" >&2
work="$(mktemp -d /tmp/execbox-toolchain.XXXXXX)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/rust/bin" "$work/rust/lib/rustlib/$triple"
# Hard links where the filesystems allow (the context is read, not kept).
link() { cp -al "$1" "$2" 2>/dev/null || cp -a "$1" "$2"; }
link "$sysroot/bin/rustc" "$work/rust/bin/"
for lib in "$sysroot"/lib/*.so*; do link "$lib" "$work/rust/lib/"; done
link "$sysroot/lib/rustlib/$triple/lib" "$work/rust/lib/rustlib/$triple/"
link "$sysroot/lib/rustlib/$triple/bin" "$work/rust/lib/rustlib/$triple/"
link "$deps" "$work/deps"
# A stable name for the harness's one crate (rustc reads the crate's own
# name from the rlib, not from the file's).
ln -s "$(cd "$deps" && ls libserde_json-*.rlib | head -1)" "$work/deps/libserde_json.rlib"
cat >"$work/Dockerfile" <<DOCKERFILE
FROM $base
COPY rust /opt/rust
COPY deps /opt/execbox/deps
LABEL execbox.recipe=$recipe
DOCKERFILE
DOCKER_BUILDKIT=0 "$engine" build -q -t "$tag" "$work" >&2
echo "image $tag: built ($("$engine" image inspect -f '{{.Size}}' "$tag" | awk '{printf "%d MB", $1/1e6}'))" >&2
