#!/usr/bin/env bash
# Builds the guest modules in guests/prebuilt/ from their sources here.
#
#   guests/build.sh           rebuild guests/prebuilt/*.wasm
#   guests/build.sh --check   rebuild into a temp dir and fail if any differs
#                             from the committed file (CI runs this)
#
# Toolchains: scripts/install-guest-toolchain.sh (Debian clang + wasi-libc,
# Debian rustc 1.63 with wasm32-wasi). WAT guests (guests/wat/) need no build:
# execbox accepts WAT text and the tests load it as is.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
mode="${1:-build}"
out="$here/prebuilt"
if [ "$mode" = "--check" ]; then
  out="$(mktemp -d)"
  trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out"

CC="${CC:-clang}"
RUSTC_WASI="${RUSTC_WASI:-/usr/bin/rustc}"
cflags=(--target=wasm32-wasi -O2 -Wl,--strip-all)

# Relative source paths: rustc embeds them (panic locations), and the output
# must not depend on where the repository is checked out.
cd "$here"
"$CC" "${cflags[@]}" -o "$out/wasi_tool.wasm" c/wasi_tool.c
"$CC" "${cflags[@]}" -o "$out/tool_caller.wasm" c/tool_caller.c
"$CC" "${cflags[@]}" -mexec-model=reactor -o "$out/json_transform.wasm" c/json_transform.c
"$RUSTC_WASI" --target wasm32-wasi -O -C panic=abort -C strip=symbols \
  -o "$out/word_count.wasm" rust/word_count.rs

if [ "$mode" = "--check" ]; then
  status=0
  for f in "$out"/*.wasm; do
    name="$(basename "$f")"
    if ! cmp -s "$f" "$here/prebuilt/$name"; then
      echo "guests/prebuilt/$name differs from a fresh build: run guests/build.sh and commit" >&2
      status=1
    fi
  done
  [ $status -eq 0 ] && echo "guests: prebuilt modules match their sources"
  exit $status
fi
ls -l "$out"/*.wasm
