# Shared by scripts/test.sh and scripts/demo.sh (sourced, not run).
# Sets: repo, cache, CARGO_TARGET_DIR, KUBEBUILDER_ASSETS, DEVCLUSTER_KWOK; defines step,
# prepare_machine, prepare_helm, prepare_cargo_cyclonedx, prepare_third_party_crds and
# prepare_kueue.

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
cache="${GPUJOB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpujob-operator}"
mkdir -p "$cache"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$cache/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

step() { printf '\n==> %s\n' "$*" >&2; }

# Go is at /usr/local/go on the machines this targets, not always on PATH; the scripts
# that build the control plane, kwok, helm and Kueue from Go modules look for `go`.
if ! command -v go >/dev/null 2>&1 && [[ -x /usr/local/go/bin/go ]]; then
  export PATH="/usr/local/go/bin:$PATH"
fi

# Debian packages, the control-plane binaries and kwok (built once, cached) and the tools.
# With `cluster`, only what running a local cluster needs (the demo, the load test); the
# test command also takes the test tools.
prepare_machine() {
  step "control-plane binaries and tools"
  KUBEBUILDER_ASSETS="$(devcluster/scripts/kube-binaries.sh)"
  export KUBEBUILDER_ASSETS
  echo "using $KUBEBUILDER_ASSETS" >&2
  devcluster/scripts/tools.sh "${1:-test}" >&2
  # kwok plays the kubelet of devcluster's fake nodes; built once from its Go module too.
  DEVCLUSTER_KWOK="$(devcluster/scripts/kwok-binary.sh)/kwok"
  export DEVCLUSTER_KWOK
  echo "using $DEVCLUSTER_KWOK" >&2
}

# helm 4 (built once from the Go module helm.sh/helm/v4, cached), for the chart's
# lint, render and dry-run install; exported as GPUJOB_HELM, where tests/integration/install.rs
# finds it. The test command needs it, the demo does not.
prepare_helm() {
  step "helm"
  GPUJOB_HELM="$(scripts/helm.sh)"
  export GPUJOB_HELM
  echo "using $GPUJOB_HELM ($("$GPUJOB_HELM" version --short))" >&2
}

# cargo-cyclonedx (installed once from crates.io at a pinned version, cached), for the
# operator's SBOM (scripts/sbom.sh); exported as GPUJOB_CARGO_CYCLONEDX, where
# scripts/sbom.sh finds it. The test command needs it, the demo does not.
prepare_cargo_cyclonedx() {
  step "cargo-cyclonedx"
  GPUJOB_CARGO_CYCLONEDX="$(scripts/cargo-cyclonedx.sh)"
  export GPUJOB_CARGO_CYCLONEDX
  echo "using $GPUJOB_CARGO_CYCLONEDX ($("$GPUJOB_CARGO_CYCLONEDX" cyclonedx --version))" >&2
}

# The Prometheus Operator's and cert-manager's CRDs (ServiceMonitor, PrometheusRule,
# Certificate, Issuer; fetched once from their Go modules, cached), so that the test
# control plane dry-runs those objects of the install too; exported as
# GPUJOB_THIRD_PARTY_CRDS, where tests/integration/install.rs finds them.
prepare_third_party_crds() {
  step "the Prometheus Operator's and cert-manager's CRDs"
  GPUJOB_THIRD_PARTY_CRDS="$(scripts/third-party-crds.sh)"
  export GPUJOB_THIRD_PARTY_CRDS
  echo "using $GPUJOB_THIRD_PARTY_CRDS" >&2
}

# Kueue (built once from the Go module sigs.k8s.io/kueue, cached) and its CRDs, for the
# tests of GpuJobs queued through Kueue; exported as GPUJOB_KUEUE_DIR (the binary
# `kueue` and `crds/`), where tests/integration/kueue.rs finds them.
prepare_kueue() {
  step "Kueue"
  GPUJOB_KUEUE_DIR="$(scripts/kueue.sh)"
  export GPUJOB_KUEUE_DIR
  echo "using $GPUJOB_KUEUE_DIR" >&2
}

# Waits up to 120 s for devcluster's cluster.json in $1; fails with the log $2.
wait_cluster() {
  local state="$1" log="$2" pid="${3:-}"
  for _ in $(seq 600); do
    [[ -f "$state/cluster.json" ]] && { grep -m1 'control plane ready' "$log" >&2 || true; return 0; }
    if [[ -n "$pid" ]] && ! kill -0 "$pid" 2>/dev/null; then break; fi
    sleep 0.2
  done
  echo "devcluster up did not get ready; its output ($log):" >&2
  cat "$log" >&2
  return 1
}
