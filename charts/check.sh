#!/usr/bin/env bash
# The Helm chart: `helm lint --strict` and `helm template` with the defaults and with
# every optional part on (tests/integration/install.rs then compares what it renders with deploy/
# and dry-runs it against the API server). Needs helm 4: $GPUJOB_HELM, or
# scripts/helm.sh provides it (built once from the Go module, cached).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
helm="${GPUJOB_HELM:-$(scripts/helm.sh)}"
chart=charts/gpujob-operator
home="$(mktemp -d)"
trap 'rm -rf "$home"' EXIT
# No machine-wide helm configuration, repositories or plugins are read.
export HELM_CONFIG_HOME="$home/config" HELM_CACHE_HOME="$home/cache" HELM_DATA_HOME="$home/data"

everything=(--set webhook.certManager.enabled=true --set monitoring.enabled=true
  --set metrics.secure=true --set monitoring.labels.release=kube-prometheus-stack
  --set priorityClassName=system-cluster-critical)
for values in "defaults" "everything"; do
  if [[ "$values" == defaults ]]; then set -- ; else set -- "${everything[@]}"; fi
  echo "== helm lint --strict ($values)"
  "$helm" lint --strict "$chart" --namespace gpujob-system "$@"
  echo "== helm template ($values)"
  objects="$("$helm" template gpujob-operator "$chart" --namespace gpujob-system "$@" | grep -c '^kind: ')"
  echo "  OK: $objects objects"
done
# The chart's version is the operator's (app.kubernetes.io/version on every object).
crate="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)"
for field in version appVersion; do
  got="$(sed -n "s/^$field: \"\{0,1\}\([^\"]*\)\"\{0,1\}$/\1/p" "$chart/Chart.yaml")"
  [[ "$got" == "$crate" ]] || { echo "$chart/Chart.yaml $field is $got, Cargo.toml says $crate" >&2; exit 1; }
done
echo "  OK: Chart.yaml version and appVersion are $crate, as Cargo.toml"
