#!/usr/bin/env bash
# Provides the kwok binary (sigs.k8s.io/kwok, the pod-lifecycle simulator devcluster
# runs as the kubelet of its fake GPU nodes) and prints the folder holding it on stdout.
#
# Order: $DEVCLUSTER_KWOK (a kwok binary of your own) if set; else a cached build under
# $GPUJOB_CACHE_DIR (default ~/.cache/gpujob-operator); else build it with Go from the Go
# module proxy through the small module in devcluster/kube/kwok (its go.sum is
# committed, so the build is the one that was reviewed), then cache it.
#
# Kept apart from kube-binaries.sh: kwok has its own version and its own cache folder,
# and `KUBEBUILDER_ASSETS` (the envtest layout) has no place for it.
#
# The cache folder's name is the recipe: change anything below that changes the binary
# (version, flags, the module's go.mod) and bump RECIPE, so an old build is never reused.
# A build is written to a temporary folder and renamed into place only when complete
# (marked by `.complete`), so a half-written cache is never used.
#
# Usage: kwok-binary.sh            locate, or build when missing
#        kwok-binary.sh --locate   locate only; exit 3 when nothing usable is there
# DEVCLUSTER_KUBE_MODULES names the folder holding the module (kwok/) when the script is
# not run from its place in the repository (devcluster runs it from its own source).
set -euo pipefail
MODE="${1:-prepare}"

KWOK_VERSION="v0.8.0"
# kwok v0.8.0's go.mod says `go 1.26.0`: the machine's Go 1.26 builds it, and nothing
# is downloaded behind our back (GOTOOLCHAIN=go1.27.3 would be the approved way to a
# newer Go, should a later kwok need it).
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
RECIPE="kwok-${KWOK_VERSION}-gomod-cgo0-r1"

log() { echo "kwok-binary: $*" >&2; }
die() { log "error: $*"; exit 1; }

if [[ -n "${DEVCLUSTER_KWOK:-}" ]]; then
  [[ -x "$DEVCLUSTER_KWOK" && ! -d "$DEVCLUSTER_KWOK" ]] || die "DEVCLUSTER_KWOK=$DEVCLUSTER_KWOK is not an executable kwok binary"
  dir="$(cd "$(dirname "$DEVCLUSTER_KWOK")" && pwd)"
  [[ "$(basename "$DEVCLUSTER_KWOK")" == kwok ]] || die "DEVCLUSTER_KWOK must name a file called kwok (got $DEVCLUSTER_KWOK)"
  echo "$dir"
  exit 0
fi

CACHE_ROOT="${GPUJOB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpujob-operator}"
DEST="$CACHE_ROOT/$RECIPE"

if [[ -f "$DEST/.complete" && -x "$DEST/kwok" ]]; then
  echo "$DEST"
  exit 0
fi
if [[ "$MODE" == "--locate" ]]; then
  log "no usable kwok: DEVCLUSTER_KWOK is unset and $DEST is not complete; run $0 to build it"
  exit 3
fi

if [[ -n "${DEVCLUSTER_KUBE_MODULES:-}" ]]; then
  MODULES="$DEVCLUSTER_KUBE_MODULES"
else
  MODULES="$(cd "$(dirname "${BASH_SOURCE[0]}")/../kube" && pwd)"
fi
[[ -f "$MODULES/kwok/go.mod" && -f "$MODULES/kwok/go.sum" ]] || die "$MODULES/kwok/go.mod or go.sum missing"
command -v go >/dev/null || die "no go on PATH: Go 1.26 or later builds kwok (https://go.dev/dl/, or /usr/local/go/bin)"
go_version="$(go env GOVERSION)"
case "$go_version" in
  go1.2[6-9]* | go1.[3-9]*) ;;
  *) die "$(command -v go) is $go_version; kwok $KWOK_VERSION needs Go 1.26 or later (put /usr/local/go/bin first on PATH)" ;;
esac

mkdir -p "$CACHE_ROOT"
WORK="$(mktemp -d "$CACHE_ROOT/.build-$RECIPE.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
log "building kwok $KWOK_VERSION with $go_version in $WORK; cached afterwards in $DEST (the README says how long a first build takes)"
started=$SECONDS
mkdir -p "$WORK/bin"
# -mod=readonly: built in place, the module's go.mod and go.sum are never rewritten.
# kwok's version is a constant in its source, so no -X flags are needed.
(
  cd "$MODULES/kwok"
  CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "-s -w" -o "$WORK/bin/kwok" \
    sigs.k8s.io/kwok/cmd/kwok >&2
) || die "building kwok $KWOK_VERSION failed"
[[ -x "$WORK/bin/kwok" ]] || die "build finished without kwok"
"$WORK/bin/kwok" --version 2>&1 | grep -q "${KWOK_VERSION#v}" \
  || die "kwok reports '$("$WORK/bin/kwok" --version 2>&1)', not $KWOK_VERSION"
echo "$RECIPE" >"$WORK/bin/.complete"
rm -rf "$DEST"
mv "$WORK/bin" "$DEST"
log "built in $((SECONDS - started)) s; cached in $DEST"
echo "$DEST"
