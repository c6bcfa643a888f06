#!/usr/bin/env bash
# Provides Kueue (sigs.k8s.io/kueue: the job queueing controller GpuJobs with
# spec.queueName are admitted by) for tests/integration/kueue.rs, which runs it against
# devcluster: the binary, and Kueue's CRDs from the same module. Prints the folder
# holding `kueue` and `crds/` on stdout.
#
# Order: $GPUJOB_KUEUE_DIR if set (such a folder of your own); else a cached build
# under $GPUJOB_CACHE_DIR (default ~/.cache/gpujob-operator); else build it with Go
# from the Go module proxy through the small module in scripts/kueue (its go.mod names
# the version with a `tool` directive; go.sum is committed, so the build is the one that
# was reviewed), copy the CRDs out of the module, then cache both.
#
# The cache folder's name is the recipe: change anything below that changes the output
# (the version, flags, the module's go.mod) and bump RECIPE, so an old build is never
# reused. A build is written to a temporary folder and renamed into place only when
# complete (marked by `.complete`), so a half-written cache is never used.
#
# Usage: kueue.sh            locate, or build when missing
#        kueue.sh --locate   locate only; exit 3 when nothing usable is there
set -euo pipefail
MODE="${1:-prepare}"

KUEUE_VERSION="v0.17.0"
# Kueue v0.17's go.mod says `go 1.25.0`: the Go on this machine builds it, and nothing
# is downloaded behind our back.
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
RECIPE="kueue-${KUEUE_VERSION}-gomod-cgo0-r1"

log() { echo "kueue.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

usable() { [[ -x "$1/kueue" && -f "$1/crds/kueue.x-k8s.io_workloads.yaml" ]]; }

if [[ -n "${GPUJOB_KUEUE_DIR:-}" ]]; then
  usable "$GPUJOB_KUEUE_DIR" || die "GPUJOB_KUEUE_DIR=$GPUJOB_KUEUE_DIR holds no executable kueue and crds/"
  echo "$GPUJOB_KUEUE_DIR"
  exit 0
fi

CACHE_ROOT="${GPUJOB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpujob-operator}"
DEST="$CACHE_ROOT/$RECIPE"
if [[ -f "$DEST/.complete" ]] && usable "$DEST"; then
  echo "$DEST"
  exit 0
fi
if [[ "$MODE" == "--locate" ]]; then
  log "no usable Kueue: GPUJOB_KUEUE_DIR is unset and $DEST is not complete; run $0 to build it"
  exit 3
fi

MODULE="$(cd "$(dirname "${BASH_SOURCE[0]}")/kueue" && pwd)"
[[ -f "$MODULE/go.mod" && -f "$MODULE/go.sum" ]] || die "$MODULE/go.mod or go.sum missing"
grep -q "sigs.k8s.io/kueue $KUEUE_VERSION" "$MODULE/go.mod" \
  || die "$MODULE/go.mod does not require sigs.k8s.io/kueue $KUEUE_VERSION (bump both together)"
command -v go >/dev/null || die "no go on PATH: Go 1.25 or later builds Kueue (/usr/local/go/bin)"
go_version="$(go env GOVERSION)"
case "$go_version" in
  go1.2[5-9]* | go1.[3-9]*) ;;
  *) die "$(command -v go) is $go_version; Kueue $KUEUE_VERSION needs Go 1.25 or later (put /usr/local/go/bin first on PATH)" ;;
esac

mkdir -p "$CACHE_ROOT"
WORK="$(mktemp -d "$CACHE_ROOT/.build-$RECIPE.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
log "building Kueue $KUEUE_VERSION with $go_version in $WORK; cached afterwards in $DEST (about 5 minutes on 2 cores, once)"
started=$SECONDS
mkdir -p "$WORK/out/crds"
# -mod=readonly: built in place, the module's go.mod and go.sum are never rewritten.
(
  cd "$MODULE"
  CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "-s -w" -o "$WORK/out/kueue" \
    sigs.k8s.io/kueue/cmd/kueue >&2
  src="$(go list -mod=readonly -m -f '{{.Dir}}' sigs.k8s.io/kueue)"
  cp "$src"/config/components/crd/bases/*.yaml "$WORK/out/crds/"
) || die "building Kueue $KUEUE_VERSION failed"
chmod -R u+w "$WORK/out"
usable "$WORK/out" || die "the build left no kueue or no Workload CRD in $WORK/out"
echo "$RECIPE" >"$WORK/out/.complete"
rm -rf "$DEST"
mv "$WORK/out" "$DEST"
log "built in $((SECONDS - started)) s; cached in $DEST"
echo "$DEST"
