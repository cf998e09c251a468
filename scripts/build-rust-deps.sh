#!/usr/bin/env bash
# Builds the crates a Rust pipeline program may use (serde_json and its
# dependencies) into execbox's Rust cache, with the host's default rustc: the
# sandbox mounts that same toolchain read-only, so the rlibs match it.
# Idempotent: a build for the current rustc is reused.
#
#   EXECBOX_RUST_CACHE   cache root (default: $XDG_CACHE_HOME/execbox/rust or ~/.cache/execbox/rust)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${EXECBOX_RUST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/execbox/rust}"
release="$(rustc -vV | sed -n 's/^commit-hash: //p' | cut -c1-12)"
deps="$cache/deps-$release"
if [ -f "$deps/READY" ]; then
  echo "rust deps: ready in $deps"
  exit 0
fi
echo "rust deps: building serde_json for rustc $release into $deps"
target="$(mktemp -d /tmp/execbox-rust-deps.XXXXXX)"
trap 'rm -rf "$target"' EXIT
cargo build --quiet --release --locked --manifest-path "$here/rust-deps/Cargo.toml" --target-dir "$target"
rm -rf "$deps.tmp"
mkdir -p "$deps.tmp"
cp "$target"/release/deps/*.rlib "$deps.tmp/"
rustc -vV >"$deps.tmp/READY"
rm -rf "$deps"
mv "$deps.tmp" "$deps"
echo "rust deps: $(ls "$deps" | grep -c rlib) rlibs"
