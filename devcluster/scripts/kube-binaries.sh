#!/usr/bin/env bash
# Provides etcd, kube-apiserver and kube-controller-manager v1.20.2 in one folder
# (the envtest KUBEBUILDER_ASSETS layout) and prints that folder's path on stdout.
#
# Order: $KUBEBUILDER_ASSETS if set; else a cached build under $GPUJOB_CACHE_DIR
# (default ~/.cache/gpujob-operator); else build from Debian's `kubernetes` source
# package with Debian's Go, then cache. No registry ships these binaries, so this is
# the only way to get them from the registries reachable here.
#
# The cache folder's name is the recipe: change anything below that changes the
# binaries and bump RECIPE, so an old build is never reused. A build is written to a
# temporary folder and renamed into place only when complete (marked by
# `.complete`), so a half-written cache is never used.
#
# Usage: kube-binaries.sh            locate, or install and build what is missing
#        kube-binaries.sh --locate   locate only; exit 3 when nothing usable is there
set -euo pipefail
MODE="${1:-prepare}"

KUBE_SRC_VERSION="1.20.5+really1.20.2-1.1+deb12u1"
KUBE_UPSTREAM="1.20.2"
# r2: vendored modern-go/reflect2 1.0.1 replaced by Debian's 1.0.2 (1.0.1 faults
# under Go >= 1.18: kube-apiserver dies in UnsafeMapType.UnsafeIterate on the first
# custom-resource writes).
RECIPE="kube-${KUBE_UPSTREAM}-deb-${KUBE_SRC_VERSION//+/_}-reflect2-1.0.2-cgo0-r2"
PACKAGES=(etcd-server golang-go rsync make dpkg-dev golang-github-modern-go-reflect2-dev)
REFLECT2_SRC=/usr/share/gocode/src/github.com/modern-go/reflect2

log() { echo "kube-binaries: $*" >&2; }
die() { log "error: $*"; exit 1; }

if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
  for b in etcd kube-apiserver kube-controller-manager; do
    [[ -x "$KUBEBUILDER_ASSETS/$b" ]] || die "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS has no executable '$b'"
  done
  echo "$KUBEBUILDER_ASSETS"
  exit 0
fi

CACHE_ROOT="${GPUJOB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpujob-operator}"
DEST="$CACHE_ROOT/$RECIPE"

missing_packages() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}

ensure_packages() {
  local missing
  mapfile -t missing < <(missing_packages "$@")
  ((${#missing[@]} == 0)) && return 0
  if [[ $(id -u) -ne 0 ]]; then
    die "missing Debian packages; install them with: sudo apt-get update && sudo apt-get install -y ${missing[*]}"
  fi
  log "installing Debian packages: ${missing[*]}"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

if [[ "$MODE" == "--locate" ]]; then
  if [[ -f "$DEST/.complete" && -x "$DEST/etcd" ]]; then
    echo "$DEST"
    exit 0
  fi
  log "no usable binaries: KUBEBUILDER_ASSETS is unset and $DEST is not complete; run $0 to install and build them"
  exit 3
fi

# etcd comes from Debian in every case; the folder links to it.
ensure_packages etcd-server
[[ -x /usr/bin/etcd ]] || die "/usr/bin/etcd missing although etcd-server is installed"

if [[ -f "$DEST/.complete" ]]; then
  echo "$DEST"
  exit 0
fi

ensure_packages "${PACKAGES[@]}"
[[ -d "$REFLECT2_SRC" ]] || die "$REFLECT2_SRC missing (package golang-github-modern-go-reflect2-dev)"

mkdir -p "$CACHE_ROOT"
WORK="$(mktemp -d "$CACHE_ROOT/.build-$RECIPE.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
log "building kube-apiserver and kube-controller-manager $KUBE_UPSTREAM in $WORK (6-8 minutes on 2 cores; cached afterwards in $DEST)"

# apt-get source needs a deb-src entry for bookworm main.
if ! apt-get source --download-only --print-uris "kubernetes=$KUBE_SRC_VERSION" >/dev/null 2>&1; then
  [[ $(id -u) -eq 0 ]] || die "no deb-src entry for Debian bookworm main; add one (Types: deb-src, URIs: http://deb.debian.org/debian, Suites: bookworm, Components: main) and run apt-get update"
  log "adding a deb-src entry for bookworm main"
  cat >/etc/apt/sources.list.d/gpujob-operator-src.sources <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  apt-get update -qq >&2
fi

(
  cd "$WORK"
  apt-get source --download-only "kubernetes=$KUBE_SRC_VERSION" >&2 2>/dev/null \
    || die "apt-get source kubernetes=$KUBE_SRC_VERSION failed (is that version still in bookworm?)"
  orig=(kubernetes_*.orig.tar.gz)
  [[ -f "${orig[0]}" ]] || die "orig tarball not found after apt-get source"
  mkdir -p gopath/src/k8s.io
  tar -xzf "${orig[0]}" -C gopath/src/k8s.io
  mv "gopath/src/k8s.io/kubernetes-$KUBE_UPSTREAM" gopath/src/k8s.io/kubernetes
  vendored=gopath/src/k8s.io/kubernetes/vendor/github.com/modern-go/reflect2
  rm -rf "$vendored"
  cp -r "$REFLECT2_SRC" "$vendored"
  # GOPATH mode, as Debian's rules build it.
  cd gopath/src/k8s.io/kubernetes
  env GOPATH="$WORK/gopath" GO111MODULE=off GOFLAGS=-mod=vendor CGO_ENABLED=0 \
    GOCACHE="$WORK/gocache" HOME="$WORK" \
    make WHAT="cmd/kube-apiserver cmd/kube-controller-manager" >&2
  out=_output/bin
  [[ -x $out/kube-apiserver && -x $out/kube-controller-manager ]] || die "build finished without binaries"
  mkdir -p "$WORK/assets"
  cp "$out/kube-apiserver" "$out/kube-controller-manager" "$WORK/assets/"
  ln -s /usr/bin/etcd "$WORK/assets/etcd"
  echo "$RECIPE" >"$WORK/assets/.complete"
)
rm -rf "$DEST"
mv "$WORK/assets" "$DEST"
log "cached in $DEST"
echo "$DEST"
