#!/usr/bin/env bash
# Provides helm (the chart in charts/gpujob-operator is linted, rendered and dry-run
# installed by the test command) and prints the binary's path on stdout.
#
# Order: $GPUJOB_HELM if set (a helm 4 you already have); else a cached build under
# $GPUJOB_CACHE_DIR (default ~/.cache/gpujob-operator); else build it with Go from the
# module helm.sh/helm/v4 through the small module in scripts/helm (its go.mod names the
# version with a `tool` directive; go.sum is committed, so the build is the one that
# was reviewed), then cache it.
#
# The cache folder's name is the recipe: change anything below that changes the binary
# (the version, flags, the module's go.mod) and bump RECIPE, so an old build is never
# reused. A build is written to a temporary folder and renamed into place only when
# complete (marked by `.complete`), so a half-written cache is never used.
#
# Usage: helm.sh            locate, or build when missing
#        helm.sh --locate   locate only; exit 3 when nothing usable is there
set -euo pipefail
MODE="${1:-prepare}"

HELM_VERSION="v4.3.2"
# helm v4.3's go.mod says `go 1.26.0`: the Go on this machine builds it, and nothing is
# downloaded behind our back (GOTOOLCHAIN=go1.27.3 is the approved way to a newer Go,
# should a later helm need one).
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
RECIPE="helm-${HELM_VERSION}-gomod-cgo0-r1"

log() { echo "helm.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

if [[ -n "${GPUJOB_HELM:-}" ]]; then
  [[ -x "$GPUJOB_HELM" ]] || die "GPUJOB_HELM=$GPUJOB_HELM is not an executable"
  "$GPUJOB_HELM" version --short | grep -q '^v4\.' \
    || die "GPUJOB_HELM=$GPUJOB_HELM is $("$GPUJOB_HELM" version --short), not helm 4"
  echo "$GPUJOB_HELM"
  exit 0
fi

CACHE_ROOT="${GPUJOB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpujob-operator}"
DEST="$CACHE_ROOT/$RECIPE"
if [[ -f "$DEST/.complete" && -x "$DEST/helm" ]]; then
  echo "$DEST/helm"
  exit 0
fi
if [[ "$MODE" == "--locate" ]]; then
  log "no usable helm: GPUJOB_HELM is unset and $DEST is not complete; run $0 to build it"
  exit 3
fi

MODULE="$(cd "$(dirname "${BASH_SOURCE[0]}")/helm" && pwd)"
[[ -f "$MODULE/go.mod" && -f "$MODULE/go.sum" ]] || die "$MODULE/go.mod or go.sum missing"
grep -q "helm.sh/helm/v4 $HELM_VERSION" "$MODULE/go.mod" \
  || die "$MODULE/go.mod does not require helm.sh/helm/v4 $HELM_VERSION (bump both together)"
command -v go >/dev/null || die "no go on PATH: Go 1.26 or later builds helm (/usr/local/go/bin)"
go_version="$(go env GOVERSION)"
case "$go_version" in
  go1.2[6-9]* | go1.[3-9]*) ;;
  *) die "$(command -v go) is $go_version; helm $HELM_VERSION needs Go 1.26 or later (put /usr/local/go/bin first on PATH)" ;;
esac

mkdir -p "$CACHE_ROOT"
WORK="$(mktemp -d "$CACHE_ROOT/.build-$RECIPE.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
log "building helm $HELM_VERSION with $go_version in $WORK; cached afterwards in $DEST"
started=$SECONDS
mkdir -p "$WORK/out"
# The version helm reports (`helm version`): without it a module build calls itself v4.3.
pkg=helm.sh/helm/v4/internal/version
ldflags="-s -w -X $pkg.version=$HELM_VERSION -X $pkg.gitTreeState=clean"
# -mod=readonly: built in place, the module's go.mod and go.sum are never rewritten.
(
  cd "$MODULE"
  CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "$ldflags" -o "$WORK/out/helm" \
    helm.sh/helm/v4/cmd/helm >&2
) || die "building helm $HELM_VERSION failed"
"$WORK/out/helm" version --short | grep -q "^$HELM_VERSION" \
  || die "the build reports '$("$WORK/out/helm" version --short)', not $HELM_VERSION"
echo "$RECIPE" >"$WORK/out/.complete"
rm -rf "$DEST"
mv "$WORK/out" "$DEST"
log "built in $((SECONDS - started)) s; cached in $DEST"
echo "$DEST/helm"
