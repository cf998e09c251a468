#!/usr/bin/env bash
# Builds a single-node Kubernetes (1.20, from Debian bookworm's `kubernetes`
# source package) for execbox's kubernetes backend tests, and caches it.
#
#   scripts/kube/build.sh      prints the bin dir on stdout (progress on stderr)
#
# The bin dir holds kube-apiserver, kube-controller-manager, kube-scheduler,
# kubelet, kube-proxy, kubectl (all 1.20, static, stripped), pause (the pod
# sandbox's static binary, from build/pause/linux/pause.c) and VERSION.
# kube-proxy carries Services (iptables mode): `execbox serve` replicas behind
# one, and their in-cluster clients reaching the API server.
#
# Cached under $EXECBOX_KUBE_CACHE (default
# ${XDG_CACHE_HOME:-$HOME/.cache}/execbox/kubernetes): bin/<debian version>-<hash
# of this script and patches/>. A second run only checks that the bin dir is
# complete (well under a second). Cold: installs golang-go and friends from the
# machine's own apt sources, downloads the source package with a deb-src line
# derived from those sources (kept in a private apt dir under the cache, never
# in /etc), unpacks it, patches it, builds (~10+ min on 2 cores), then deletes
# the unpacked tree and the Go build cache. Idempotent and safe to run twice at
# once (flock).
#
# Env:
#   EXECBOX_KUBE_CACHE          cache dir (see above)
#   EXECBOX_KUBE_KEEP_GOCACHE=1 keep the Go build cache (~2 GB) for rebuilds
#   EXECBOX_KUBE_KEEP_SRC=1     keep the unpacked, patched source tree
#
# Patches (patches/, applied in order, each must apply or the build stops):
#   - vendor/github.com/modern-go/reflect2 is replaced by Debian's
#     golang-github-modern-go-reflect2-dev (1.0.2): the vendored 1.0.1 faults
#     ("unexpected fault address") in kube-apiserver under Go 1.19 the first
#     time a custom object is created.
#   - 0001-oom-score-adj-0.patch: see the patch's header.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
scripts=$(dirname "$here")
cache=${EXECBOX_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/execbox/kubernetes}
binaries=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)

log() { echo "kube build: $*" >&2; }

# What the binaries depend on besides the source version: this script and the patches.
key=$(cat "$0" "$here"/patches/* | sha256sum | cut -c1-12)

complete() { # $1: bin dir
  [ -f "$1/VERSION" ] || return 1
  for b in "${binaries[@]}" pause; do [ -x "$1/$b" ] || return 1; done
}

# The source version is the one whose .dsc was downloaded into the cache.
src_version() {
  local dsc
  dsc=$(ls "$cache"/src/kubernetes_*.dsc 2>/dev/null | head -n1) || true
  [ -n "$dsc" ] || return 1
  sed -n 's/^Version: //p' "$dsc"
}

if v=$(src_version) && complete "$cache/bin/$v-$key"; then
  echo "$cache/bin/$v-$key"
  exit 0
fi

mkdir -p "$cache"
exec 9>"$cache/.build.lock"
if ! flock -n 9; then
  log "another build holds $cache/.build.lock; waiting"
  flock 9
fi
# Someone else may have finished the build while we waited.
if v=$(src_version) && complete "$cache/bin/$v-$key"; then
  echo "$cache/bin/$v-$key"
  exit 0
fi

# --- tools -----------------------------------------------------------------
need=()
for p in golang-go golang-github-modern-go-reflect2-dev dpkg-dev make gcc libc6-dev patch xz-utils rsync; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || need+=("$p")
done
if [ "${#need[@]}" -gt 0 ]; then
  log "installing ${need[*]}"
  "$scripts/apt-install.sh" "${need[@]}"
fi
reflect2=/usr/share/gocode/src/github.com/modern-go/reflect2
[ -f "$reflect2/reflect2.go" ] || { log "$reflect2 is missing"; exit 1; }

# --- source ----------------------------------------------------------------
# deb-src entries derived from the machine's own apt sources (one-line and
# deb822), keeping only this release's suites (third-party repositories have
# no kubernetes source and often no deb-src at all).
write_deb_src() { # $1: private apt dir
  local codename f
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
  [ -n "$codename" ] || { log "no VERSION_CODENAME in /etc/os-release"; return 1; }
  mkdir -p "$1/sources.list.d" "$1/lists/partial" "$1/cache"
  rm -f "$1"/sources.list.d/*
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk -v c="$codename" '
      /^[ \t]*deb[ \t]/ {
        line = $0; sub(/^[ \t]*deb/, "deb-src", line)
        n = split(line, w, /[ \t]+/); i = 2
        if (w[i] ~ /^\[/) { while (i < n && w[i] !~ /\]$/) i++; i++ }
        s = w[i + 1]
        if (s == c || index(s, c "-") == 1) print line
      }' "$f"
  done >"$1/sources.list"
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk -v c="$codename" '
      function flush() {
        if (para != "" && isdeb && enabled && suites != "") printf "%s\n", para
        para = ""; isdeb = 0; enabled = 1; suites = ""
      }
      BEGIN { enabled = 1 }
      /^[ \t]*$/ { flush(); next }
      /^#/ { next }
      /^Types:/ { if ($0 ~ /[ \t]deb([ \t]|$)/) isdeb = 1; para = para "Types: deb-src\n"; next }
      /^Enabled:/ { if ($2 == "no") enabled = 0 }
      /^Suites:/ {
        for (i = 2; i <= NF; i++) if ($i == c || index($i, c "-") == 1) suites = suites " " $i
        para = para "Suites:" suites "\n"; next
      }
      { para = para $0 "\n" }
      END { flush() }' "$f"
  done >"$1/sources.list.d/execbox-src.sources"
  if [ ! -s "$1/sources.list" ] && [ ! -s "$1/sources.list.d/execbox-src.sources" ]; then
    log "found no $codename entries in the machine's apt sources to derive a deb-src line from"
    return 1
  fi
}

if ! src_version >/dev/null; then
  apt_dir="$cache/apt"
  write_deb_src "$apt_dir"
  apt_opts=(
    -o "Dir::Etc::SourceList=$apt_dir/sources.list"
    -o "Dir::Etc::SourceParts=$apt_dir/sources.list.d"
    -o "Dir::State::Lists=$apt_dir/lists"
    -o "Dir::Cache=$apt_dir/cache"
    -o "APT::Sandbox::User=$(id -un)"
  )
  log "fetching the source index (private apt dir $apt_dir)"
  apt-get -qq "${apt_opts[@]}" update
  rm -rf "$cache/src.partial"
  mkdir -p "$cache/src.partial"
  log "downloading the kubernetes source package"
  (cd "$cache/src.partial" && apt-get -qq "${apt_opts[@]}" source --download-only kubernetes >&2)
  rm -rf "$cache/src" "$apt_dir/lists" "$apt_dir/cache" # the index is 10 MB; the .dsc is all we need now
  mv "$cache/src.partial" "$cache/src"
fi
version=$(src_version)
bindir="$cache/bin/$version-$key"
if complete "$bindir"; then echo "$bindir"; exit 0; fi

# v1.20.2 from 1.20.5+really1.20.2-1.1+deb12u1
upstream=${version%%-*}
upstream=${upstream##*really}
git_version="v$upstream"
major=${upstream%%.*}
minor=${upstream#*.}
minor=${minor%%.*}

# --- unpack and patch ------------------------------------------------------
# GOPATH mode (the tree predates a working module build): the tree must sit at
# $GOPATH/src/k8s.io/kubernetes for its vendor/ directory to be used.
work="$cache/work"
gopath="$work/gopath"
tree="$gopath/src/k8s.io/kubernetes"
rm -rf "$work"
mkdir -p "$(dirname "$tree")"
log "unpacking $version"
dpkg-source --no-check -x "$cache"/src/kubernetes_*.dsc "$tree" >/dev/null
rm -rf "$tree/vendor/github.com/modern-go/reflect2"
cp -r "$reflect2" "$tree/vendor/github.com/modern-go/reflect2"
for p in "$here"/patches/*.patch; do
  log "applying $(basename "$p")"
  patch -d "$tree" -p1 --forward --quiet <"$p"
done

# --- build -----------------------------------------------------------------
export GOPATH="$gopath" GO111MODULE=off CGO_ENABLED=0 GOPROXY=off GOFLAGS= GOCACHE="$cache/go-build"
export SOURCE_DATE_EPOCH
SOURCE_DATE_EPOCH=$(cd "$tree" && dpkg-parsechangelog -STimestamp)
build_date=$(date -u --date="@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
ldflags="-s -w"
for pkg in k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version k8s.io/kubernetes/vendor/k8s.io/component-base/version; do
  ldflags+=" -X $pkg.gitVersion=$git_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
done

start=$(date +%s)
log "generating the OpenAPI definitions (make gen_openapi)"
(cd "$tree" && make gen_openapi >"$work/gen_openapi.log" 2>&1) || {
  log "make gen_openapi failed; last lines of $work/gen_openapi.log:"; tail -n 30 "$work/gen_openapi.log" >&2; exit 1; }
out="$work/bin"
mkdir -p "$out"
log "building ${binaries[*]} ($git_version)"
pkgs=()
for b in "${binaries[@]}"; do pkgs+=("./cmd/$b"); done
(cd "$tree" && go build -trimpath -ldflags "$ldflags" -o "$out/" "${pkgs[@]}" >"$work/go-build.log" 2>&1) || {
  log "go build failed; last lines of $work/go-build.log:"; tail -n 30 "$work/go-build.log" >&2; exit 1; }
log "building pause"
gcc -Os -Wall -Werror -static -DVERSION="$git_version-execbox" -o "$out/pause" "$tree/build/pause/linux/pause.c"
strip "$out/pause"
printf 'source=kubernetes %s\ngitVersion=%s\nkey=%s\n' "$version" "$git_version" "$key" >"$out/VERSION"
log "built in $(($(date +%s) - start)) s"

mkdir -p "$cache/bin"
rm -rf "$bindir"
mv "$out" "$bindir"
# Older builds (another version or key) are of no use to this checkout.
for d in "$cache"/bin/*; do [ "$d" = "$bindir" ] || rm -rf "$d"; done

if [ "${EXECBOX_KUBE_KEEP_SRC:-}" != 1 ]; then rm -rf "$work"; fi
if [ "${EXECBOX_KUBE_KEEP_GOCACHE:-}" != 1 ]; then rm -rf "$cache/go-build"; fi
log "cache: $(du -sh "$cache" | cut -f1) in $cache"
echo "$bindir"
