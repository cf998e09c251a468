#!/usr/bin/env bash
# Builds execbox's container images offline, from Debian packages (idempotent).
#
# No registry can be pulled from here, so each image is a root filesystem
# assembled from `apt-get download` + `dpkg-deb -x` and loaded with
# `docker import`. An image is rebuilt only when its recipe (package list +
# this script) changed: the recipe hash is stored as a label.
#
#   localhost/execbox-python:3.11      python3 + bash + dash + coreutils (Python,
#                                      shell: scripts run on bash; /bin/sh is dash)
#   localhost/execbox-rust:bookworm    gcc + libc6-dev + dash + coreutils: links
#                                      and runs Rust programs; rustc itself is
#                                      bind-mounted read-only from the host.
#   localhost/execbox-python-data:3.11 python3 + numpy, pandas, matplotlib (Agg),
#                                      scipy: the packages are imported in the
#                                      image after the build and the ones that
#                                      import are recorded in the image's
#                                      `execbox.packages` label, which is what
#                                      the container backend declares.
set -euo pipefail

engine="${EXECBOX_ENGINE:-docker}"
here="$(cd "$(dirname "$0")" && pwd)"
script_hash="$(sha256sum "$here/build-images.sh" | cut -c1-16)"

# Never unpacked: package management and perl are not needed to run code.
skip_packages='^(dpkg|perl-base|perl|tar|debconf|debianutils|init-system-helpers|usrmerge|base-passwd|adduser|login|passwd)$'

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# The data image's closure comes from apt's own resolver (first alternative
# of each dependency, as `apt-get install` would pick), against an empty
# status file so nothing on this machine counts as installed. Build tools
# that scipy and pythran pull in are left out: nothing compiles at run time.
data_skip='^(gcc(-[0-9]+)?|g\+\+(-[0-9]+)?|cpp(-[0-9]+)?|libc6-dev|libc-dev-bin|linux-libc-dev|rpcsvc-proto|.*-dev|libboost.*|libclang.*|libllvm.*|python3-pythran|python3-beniget|python3-gast|binutils.*|libbinutils|libctf.*|libgprofng.*|libasan.*|liblsan.*|libtsan.*|libubsan.*|libhwasan.*|libitm.*|libcc1.*|libisl.*|libmpc.*|libmpfr.*|libjansson.*|perl.*|dpkg|tar|debconf|debianutils|init-system-helpers|usrmerge|base-passwd|adduser|login|passwd)$'
resolved_closure() {
  local status
  status="$(mktemp)"
  apt-get -s -o Dir::State::status="$status" --no-install-recommends install "$@" 2>/dev/null |
    awk '/^Inst / {print $2}' | sort -u | grep -Ev "$data_skip"
  rm -f "$status"
}

package_closure() {
  apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
    --no-breaks --no-replaces --no-enhances "$@" |
    grep -E '^[a-z0-9]' | sort -u | grep -Ev "$skip_packages"
}

build_image() {
  local tag="$1"
  shift
  local verify=""
  if [ "$1" = "--packages" ]; then
    verify="$2"
    shift 2
  fi
  local recipe
  recipe="$(printf '%s %s %s' "$script_hash" "$verify" "$*" | sha256sum | cut -c1-16)"
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
  trap "rm -rf '$work'" RETURN EXIT
  mkdir -p "$work/debs" "$work/rootfs"
  local packages
  if [ -n "$verify" ]; then
    packages="$(resolved_closure "$@")"
  else
    packages="$(package_closure "$@")"
  fi
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
  # Byte-compile what Python imports, as Debian's maintainer scripts
  # (py3compile), which never ran, would have: without it every interpreter
  # start compiles the modules it imports again (~30 ms of the standard
  # library's first imports, ~2 s for pandas). Tests are left out.
  if [ -x "$root/usr/bin/python3" ]; then
    local dirs=() dir
    for dir in "$root"/usr/lib/python3.[0-9]* "$root"/usr/lib/python3/dist-packages; do
      [ -d "$dir" ] && dirs+=("${dir#"$root"}")
    done
    $SUDO chroot "$root" /usr/bin/python3 -m compileall -q -x '/tests?/' "${dirs[@]}" >/dev/null
  fi
  local changes=(
    --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin'
    --change 'ENV LANG=C.UTF-8'
    --change 'ENV PYTHONDONTWRITEBYTECODE=1'
    --change 'WORKDIR /work'
  )
  if [ -z "$verify" ]; then
    tar -C "$root" -c . | "$engine" import --change "LABEL execbox.recipe=$recipe" "${changes[@]}" - "$tag" >/dev/null
  else
    data_image "$tag" "$recipe" "$verify" "$root" "${changes[@]}"
  fi
  echo "image $tag: built ($("$engine" image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}'))"
}

# The data image: matplotlib draws with Agg (no display) and keeps its
# config and font cache under /tmp (the only writable place in a run); the
# font cache is built once here, into /opt/execbox/mpl, and copied to /tmp
# by sitecustomize at interpreter start-up (a rebuild costs seconds per run).
# Then every declared package is imported in the image itself; those that
# import are the image's `execbox.packages` label. BLAS and OpenMP run one
# thread (a run has one CPU; and a session ends when a cell leaves threads
# running, which idle BLAS workers would look like).
data_image() {
  local tag="$1" recipe="$2" packages="$3" root="$4"
  shift 4
  # Alternatives (libblas.so.3, liblapack.so.3) are set by maintainer
  # scripts, which never ran: link them to the unpacked provider.
  local lib="$root/usr/lib/x86_64-linux-gnu" dir path
  for dir in openblas-pthread blas lapack; do
    for path in "$lib/$dir"/*.so.*; do
      [ -e "$path" ] || continue
      [ -e "$lib/$(basename "$path")" ] || ln -s "$dir/$(basename "$path")" "$lib/$(basename "$path")"
    done
  done
  local site
  site="$(ls -d "$root"/usr/lib/python3/dist-packages)"
  cat >"$site/sitecustomize.py" <<'PY'
import os, shutil
_cache = os.environ.get("MPLCONFIGDIR")
if _cache and not os.path.isdir(_cache) and os.path.isdir("/opt/execbox/mpl"):
    try:
        shutil.copytree("/opt/execbox/mpl", _cache)
    except OSError:
        pass
PY
  mkdir -p "$root/opt/execbox/mpl"
  local base="$tag-base"
  tar -C "$root" -c . | "$engine" import "$@" - "$base" >/dev/null
  local builder="execbox-image-build-$$"
  "$engine" rm -f "$builder" >/dev/null 2>&1 || true
  "$engine" run --name "$builder" --network=none -e MPLBACKEND=Agg -e MPLCONFIGDIR=/opt/execbox/mpl "$base" \
    /usr/bin/python3 -c 'import matplotlib.pyplot as plt; plt.figure(); plt.plot([1, 2]); plt.savefig("/tmp/warm.png")' >/dev/null
  local found=() name
  for name in ${packages//,/ }; do
    if "$engine" run --rm --network=none -e MPLBACKEND=Agg "$base" /usr/bin/python3 -c "import $name" >/dev/null 2>&1; then
      found+=("$name")
    else
      echo "image $tag: package $name does not import; not declared" >&2
    fi
  done
  local declared
  declared="$(IFS=,; echo "${found[*]}")"
  "$engine" commit \
    --change "LABEL execbox.recipe=$recipe" \
    --change "LABEL execbox.packages=$declared" \
    --change 'ENV MPLBACKEND=Agg' \
    --change 'ENV OPENBLAS_NUM_THREADS=1' \
    --change 'ENV OMP_NUM_THREADS=1' \
    --change 'ENV MPLCONFIGDIR=/tmp/matplotlib' \
    --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PYTHONDONTWRITEBYTECODE=1' \
    --change 'WORKDIR /work' \
    --change 'CMD ["/usr/bin/python3"]' \
    "$builder" "$tag" >/dev/null
  "$engine" rm -f "$builder" >/dev/null
  "$engine" rmi "$base" >/dev/null
  echo "image $tag: packages $declared"
}

"$here/start-container-engine.sh"
build_image localhost/execbox-python:3.11 python3 bash dash coreutils
build_image localhost/execbox-rust:bookworm gcc libc6-dev zlib1g dash coreutils
build_image localhost/execbox-python-data:3.11 --packages numpy,pandas,matplotlib,scipy \
  python3 python3-numpy python3-pandas python3-matplotlib python3-scipy bash dash coreutils
