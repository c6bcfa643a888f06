#!/usr/bin/env bash
# Provides the CustomResourceDefinitions of the other projects whose kinds the install
# renders, so that the test control plane checks those objects too (tests/integration/install.rs
# dry-runs every rendered object; without these CRDs the API server does not serve the
# kinds): the Prometheus Operator's ServiceMonitor and PrometheusRule
# (monitoring.coreos.com), cert-manager's Certificate and Issuer (cert-manager.io).
# Prints the path of one YAML file holding the four CRDs on stdout.
#
# Order: $GPUJOB_THIRD_PARTY_CRDS if set (such a file of your own); else a cached copy
# under $GPUJOB_CACHE_DIR (default ~/.cache/gpujob-operator); else fetch the two
# projects' Go modules with `go mod download` through the Go module proxy, check each
# module's hash against the one pinned below (the files are the ones that were
# reviewed), copy the four files out and cache them.
#
# Where the files are in each module: the Prometheus Operator ships its CRDs as plain
# YAML under example/prometheus-operator-crd/; cert-manager under deploy/crds/ (plain
# controller-gen output in the pinned version; checked below to hold no template).
# cert-manager's own admission webhook is not run:
# what it adds beyond the CRD's OpenAPI schema (e.g. that an Issuer names exactly one
# kind of issuer) is not checked by the dry run.
#
# The cache folder's name is the recipe: change a version, a file or the output and
# bump RECIPE, so an old copy is never reused. A copy is written to a temporary folder
# and renamed into place only when complete (marked by `.complete`).
#
# Usage: third-party-crds.sh            locate, or fetch when missing
#        third-party-crds.sh --locate   locate only; exit 3 when nothing usable is there
set -euo pipefail
MODE="${1:-prepare}"

PROMETHEUS_OPERATOR_MODULE="github.com/prometheus-operator/prometheus-operator"
PROMETHEUS_OPERATOR_VERSION="v0.85.0"
PROMETHEUS_OPERATOR_SUM="h1:M5xLCLEoaW2IJfnuCwFzzpL+jSVQu3KGT84Pye+fW8s="
CERT_MANAGER_MODULE="github.com/cert-manager/cert-manager"
CERT_MANAGER_VERSION="v1.21.2"
CERT_MANAGER_SUM="h1:UWgoYM+KLNtRlqmoWOKjKBOBUPVHeepQ6/ac3ERJW68="
# Nothing here builds Go code; downloading modules needs no newer toolchain.
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
RECIPE="crds-prometheus-operator-${PROMETHEUS_OPERATOR_VERSION}-cert-manager-${CERT_MANAGER_VERSION}-r1"
OUT=crds.yaml

log() { echo "third-party-crds: $*" >&2; }
die() { log "error: $*"; exit 1; }

if [[ -n "${GPUJOB_THIRD_PARTY_CRDS:-}" ]]; then
  [[ -f "$GPUJOB_THIRD_PARTY_CRDS" ]] || die "GPUJOB_THIRD_PARTY_CRDS=$GPUJOB_THIRD_PARTY_CRDS is not a file"
  echo "$GPUJOB_THIRD_PARTY_CRDS"
  exit 0
fi

CACHE_ROOT="${GPUJOB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpujob-operator}"
DEST="$CACHE_ROOT/$RECIPE"
if [[ -f "$DEST/.complete" && -f "$DEST/$OUT" ]]; then
  echo "$DEST/$OUT"
  exit 0
fi
if [[ "$MODE" == "--locate" ]]; then
  log "no CRDs: GPUJOB_THIRD_PARTY_CRDS is unset and $DEST is not complete; run $0 to fetch them"
  exit 3
fi

command -v go >/dev/null || die "no go on PATH: Go fetches the modules (/usr/local/go/bin)"
command -v python3 >/dev/null || die "no python3 on PATH (it reads go mod download's JSON)"
mkdir -p "$CACHE_ROOT"
WORK="$(mktemp -d "$CACHE_ROOT/.fetch-$RECIPE.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/out" "$WORK/empty"

# The folder of module $1 at version $2, after checking its hash is $3.
module_dir() {
  local json
  # From an empty folder: no go.mod of ours applies, and nothing is rewritten.
  json="$(cd "$WORK/empty" && GOFLAGS=-mod=mod go mod download -json "$1@$2")" \
    || die "go mod download $1@$2 failed: $json"
  python3 -c '
import json, sys
what, want = sys.argv[1], sys.argv[2]
d = json.load(sys.stdin)
err, got = d.get("Error"), d.get("Sum")
if err:
    sys.exit(f"{what}: {err}")
if got != want:
    sys.exit(f"{what}: the module hash is {got}, pinned {want}")
print(d["Dir"])
' "$1@$2" "$3" <<<"$json"
}

log "fetching $PROMETHEUS_OPERATOR_MODULE@$PROMETHEUS_OPERATOR_VERSION and $CERT_MANAGER_MODULE@$CERT_MANAGER_VERSION"
prom="$(module_dir "$PROMETHEUS_OPERATOR_MODULE" "$PROMETHEUS_OPERATOR_VERSION" "$PROMETHEUS_OPERATOR_SUM")" \
  || die "no $PROMETHEUS_OPERATOR_MODULE@$PROMETHEUS_OPERATOR_VERSION"
cm="$(module_dir "$CERT_MANAGER_MODULE" "$CERT_MANAGER_VERSION" "$CERT_MANAGER_SUM")" \
  || die "no $CERT_MANAGER_MODULE@$CERT_MANAGER_VERSION"

files=(
  "$prom/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml"
  "$prom/example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml"
  "$cm/deploy/crds/cert-manager.io_certificates.yaml"
  "$cm/deploy/crds/cert-manager.io_issuers.yaml"
)
names=(servicemonitors.monitoring.coreos.com prometheusrules.monitoring.coreos.com
  certificates.cert-manager.io issuers.cert-manager.io)
{
  echo "# CRDs of $PROMETHEUS_OPERATOR_MODULE $PROMETHEUS_OPERATOR_VERSION and"
  echo "# $CERT_MANAGER_MODULE $CERT_MANAGER_VERSION, as their modules ship them"
  echo "# (written by scripts/third-party-crds.sh)."
  for i in "${!files[@]}"; do
    f="${files[$i]}"
    [[ -f "$f" ]] || die "$f is missing"
    # One plain CRD per file, no Helm template left in it.
    ! grep -q '{{' "$f" || die "$f holds a template"
    [[ "$(grep -c '^kind: CustomResourceDefinition$' "$f")" == 1 ]] || die "$f is not one CRD"
    grep -q "^  name: ${names[$i]}$" "$f" || die "$f is not the CRD ${names[$i]}"
    # Each file its own document (its own leading `---`, if any, dropped).
    echo "---"
    sed '1{/^---$/d}' "$f"
  done
} >"$WORK/out/$OUT"
echo "$RECIPE" >"$WORK/out/.complete"
rm -rf "$DEST"
mv "$WORK/out" "$DEST"
log "cached in $DEST"
echo "$DEST/$OUT"
