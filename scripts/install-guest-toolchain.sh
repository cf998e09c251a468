#!/usr/bin/env bash
# Installs what guests/build.sh needs, from Debian's packages (idempotent):
# clang + lld + wasi-libc for C guests, Debian's rustc with the wasm32-wasi
# standard library for Rust guests (/usr/bin/rustc; rustup's stays first on PATH).
set -euo pipefail
need=()
command -v clang >/dev/null || need+=(clang)
command -v wasm-ld >/dev/null || need+=(lld)
[ -f /usr/lib/wasm32-wasi/libc.a ] || need+=(wasi-libc)
compgen -G "/usr/lib/llvm-*/lib/clang/*/lib/wasi/libclang_rt.builtins-wasm32.a" >/dev/null || need+=(libclang-rt-14-dev-wasm32)
[ -x /usr/bin/rustc ] || need+=(rustc)
compgen -G "/usr/lib/rustlib/wasm32-wasi/lib/libstd-*.rlib" >/dev/null || need+=(libstd-rust-dev-wasm32)
if [ ${#need[@]} -eq 0 ]; then
  echo "guest toolchain: already installed"
  exit 0
fi
echo "guest toolchain: installing ${need[*]}"
"$(dirname "$0")/apt-install.sh" "${need[@]}"
