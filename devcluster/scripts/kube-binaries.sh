#!/usr/bin/env bash
# Provides etcd, kube-apiserver, kube-controller-manager and kube-scheduler in one
# folder (the envtest KUBEBUILDER_ASSETS layout, plus the scheduler) and prints that
# folder's path on stdout.
#
# Order: $KUBEBUILDER_ASSETS if set; else a cached build under $GPUJOB_CACHE_DIR
# (default ~/.cache/gpujob-operator); else build them with Go from the Go module proxy,
# then cache:
#   - Kubernetes from the module k8s.io/kubernetes, through the small module in
#     devcluster/kube/kubernetes, or kubernetes-compat for the older release (each
#     go.mod pins every k8s.io/* staging module to the
#     matching v0.x release with a `replace`: k8s.io/kubernetes' own go.mod points them
#     at ./staging, which a dependency does not see);
#   - etcd from the module go.etcd.io/etcd/server/v3, through devcluster/kube/etcd.
# The go.sum files are committed, so the build is the one that was reviewed.
#
# The cache folder's name is the recipe: change anything below that changes the
# binaries (versions, flags, the modules' go.mod) and bump RECIPE, so an old build is
# never reused. A build is written to a temporary folder and renamed into place only
# when complete (marked by `.complete`), so a half-written cache is never used.
#
# Usage: kube-binaries.sh            locate, or build what is missing
#        kube-binaries.sh --locate   locate only; exit 3 when nothing usable is there
#        kube-binaries.sh --version  print the Kubernetes version it provides
# DEVCLUSTER_KUBE_MODULES names the folder holding the modules when the script is
# not run from its place in the repository (devcluster runs it from its own source).
# DEVCLUSTER_KUBE_RELEASE picks the release: `current` (default; every test, the demo
# and the load test) or `compat`, the oldest release the README claims, which the
# test command runs a compatibility subset on (module folder kubernetes-compat).
set -euo pipefail
MODE="${1:-prepare}"

case "${DEVCLUSTER_KUBE_RELEASE:-current}" in
  current) KUBE_VERSION="v1.37.2" KUBE_MODULE="kubernetes" ;;
  compat) KUBE_VERSION="v1.33.13" KUBE_MODULE="kubernetes-compat" ;;
  *) echo "kube-binaries: error: DEVCLUSTER_KUBE_RELEASE=${DEVCLUSTER_KUBE_RELEASE} is neither current nor compat" >&2; exit 1 ;;
esac
ETCD_VERSION="v3.6.16"
if [[ "$MODE" == "--version" ]]; then
  echo "$KUBE_VERSION"
  exit 0
fi
# Go 1.26 builds all of them (their go.mod files say `go 1.26.0`, compat's `go 1.24.0`). Should a newer release
# need Go 1.27, GOTOOLCHAIN=go1.27.3 is the approved way to it (the go command fetches
# that toolchain from the module proxy); until then nothing is downloaded behind our back.
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
RECIPE="kube-${KUBE_VERSION}-etcd-${ETCD_VERSION}-gomod-cgo0-r1"
BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler)

log() { echo "kube-binaries: $*" >&2; }
die() { log "error: $*"; exit 1; }

if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then
  for b in "${BINARIES[@]}"; do
    [[ -x "$KUBEBUILDER_ASSETS/$b" ]] || die "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS has no executable '$b' (devcluster needs ${BINARIES[*]})"
  done
  echo "$KUBEBUILDER_ASSETS"
  exit 0
fi

CACHE_ROOT="${GPUJOB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpujob-operator}"
DEST="$CACHE_ROOT/$RECIPE"

complete() {
  local b
  [[ -f "$DEST/.complete" ]] || return 1
  for b in "${BINARIES[@]}"; do [[ -x "$DEST/$b" ]] || return 1; done
}

if complete; then
  echo "$DEST"
  exit 0
fi
if [[ "$MODE" == "--locate" ]]; then
  log "no usable binaries: KUBEBUILDER_ASSETS is unset and $DEST is not complete; run $0 to build them"
  exit 3
fi

if [[ -n "${DEVCLUSTER_KUBE_MODULES:-}" ]]; then
  MODULES="$DEVCLUSTER_KUBE_MODULES"
else
  MODULES="$(cd "$(dirname "${BASH_SOURCE[0]}")/../kube" && pwd)"
fi
for m in "$KUBE_MODULE" etcd; do
  [[ -f "$MODULES/$m/go.mod" && -f "$MODULES/$m/go.sum" ]] || die "$MODULES/$m/go.mod or go.sum missing"
done
command -v go >/dev/null || die "no go on PATH: Go 1.26 or later builds the control plane (https://go.dev/dl/, or /usr/local/go/bin)"
go_version="$(go env GOVERSION)"
case "$go_version" in
  go1.2[6-9]* | go1.[3-9]*) ;;
  *) die "$(command -v go) is $go_version; the Kubernetes $KUBE_VERSION build needs Go 1.26 or later (put /usr/local/go/bin first on PATH)" ;;
esac

mkdir -p "$CACHE_ROOT"
WORK="$(mktemp -d "$CACHE_ROOT/.build-$RECIPE.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
log "building Kubernetes $KUBE_VERSION (kube-apiserver, kube-controller-manager, kube-scheduler) and etcd $ETCD_VERSION with $go_version in $WORK; cached afterwards in $DEST (docs/test-command-timings.md says how long a first build takes)"
started=$SECONDS

mkdir -p "$WORK/assets"
# The version the binaries report (/version, kubectl version): without these a module
# build calls itself v0.0.0-master.
pkg=k8s.io/component-base/version
minor="${KUBE_VERSION#v1.}"
minor="${minor%%.*}"
ldflags="-s -w -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
# -mod=readonly: built in place, the modules' go.mod and go.sum are never rewritten.
(
  cd "$MODULES/$KUBE_MODULE"
  CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "$ldflags" -o "$WORK/assets/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler >&2
) || die "building Kubernetes $KUBE_VERSION failed"
(
  cd "$MODULES/etcd"
  CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "-s -w" -o "$WORK/assets/etcd" \
    go.etcd.io/etcd/server/v3 >&2
) || die "building etcd $ETCD_VERSION failed"
for b in "${BINARIES[@]}"; do
  [[ -x "$WORK/assets/$b" ]] || die "build finished without $b"
done
"$WORK/assets/kube-apiserver" --version | grep -qx "Kubernetes $KUBE_VERSION" \
  || die "kube-apiserver reports '$("$WORK/assets/kube-apiserver" --version)', not Kubernetes $KUBE_VERSION"
echo "$RECIPE" >"$WORK/assets/.complete"
rm -rf "$DEST"
mv "$WORK/assets" "$DEST"
log "built in $((SECONDS - started)) s; cached in $DEST"
echo "$DEST"
