#!/usr/bin/env bash
# The test command: everything CI checks, from a fresh machine.
#
# 1. installs what is missing (Debian packages, cargo-nextest, cargo-cyclonedx from
#    crates.io, cached; etcd, kube-apiserver,
#    kube-controller-manager, kube-scheduler, kwok, helm and Kueue are built once with
#    Go from the Go module proxy and cached; the Prometheus Operator's and cert-manager's CRDs
#    are fetched once from their Go modules and cached),
# 2. checks the alert rules with promtool, the Helm chart with helm lint and helm
#    template, deploy/, the chart and the Dockerfile with checkov (installed from PyPI
#    into the cache when missing), the operator's SBOM (sbom/, up to date and complete),
#    formatting and clippy,
# 3. starts one shared control plane (devcluster, Kubernetes v1.37) for the integration
#    tests,
# 4. runs every test with cargo-nextest, which prints the summary line,
# 5. stops the control plane, also on failure or Ctrl-C,
# 6. runs the compatibility subset the same way on the oldest Kubernetes the README
#    claims (v1.33; its binaries are built once and cached too).
#
# Caches live outside the clone, under $GPUJOB_CACHE_DIR (default
# ~/.cache/gpujob-operator): the Kubernetes binaries, helm, Kueue and, unless
# CARGO_TARGET_DIR is set, the cargo target dir.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

prepare_machine
# tests/integration/install.rs renders deploy/ with `kubectl kustomize`: the `labels:` field and
# components need the kustomize v5 built into kubectl 1.27 and later (Debian's
# kubernetes-client, 1.20, has v2). Say so here rather than as a failing test.
if ! kubectl version --client 2>/dev/null | grep -q '^Kustomize Version: v5'; then
  echo "$(command -v kubectl) lacks kustomize v5 (kubectl 1.27 or later renders deploy/); put a recent kubectl first on PATH (https://kubernetes.io/docs/tasks/tools/)" >&2
  exit 1
fi

prepare_helm
prepare_cargo_cyclonedx
prepare_third_party_crds
prepare_kueue

step "alert rules, their unit tests, runbook anchors, generated monitoring manifests"
alerts/check.sh

step "Helm chart: lint and render"
charts/check.sh

step "manifests, chart and Dockerfile: checkov, zero failed checks, every skip with its reason"
scripts/checkov.sh

step "SBOM of the operator binary: up to date, every crate of its cargo tree listed"
scripts/sbom.sh --check

step "format and lint"
# The core crate stays pure: nothing that talks to the API server, runs tasks or does
# TLS may enter its dependency tree (core/Cargo.toml says why).
impure="$(cargo tree -p gpujob-core -e normal --prefix none --locked |
  grep -E '^(kube-client|kube-runtime|tokio|hyper|rustls|tower|reqwest) ' || true)"
if [[ -n "$impure" ]]; then
  printf 'gpujob-core depends on crates it must not (client, runtime or TLS):\n%s\n' "$impure" >&2
  exit 1
fi
cargo fmt --all --check
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings

step "build"
cargo build -p devcluster --locked --bins
cargo nextest run --workspace --exclude gpujob-benches --features gpujob-operator/failpoints --locked --no-run

# One shared control plane at a time (devcluster), for the integration tests.
# A state folder of its own: a second run on the same machine (CI next to a
# developer's run, two clones) must not restart or stop this one's control plane,
# which is what `devcluster up` does to whatever else runs on the same folder.
up_pid="" state="" log="" crd=""
start_cluster() {
  state="$(mktemp -d "$cache/test-cluster-XXXXXX")"
  log="$state.log"
  # gpujob.dev/v1 alone: deploy/crd/crd.yaml serves v2 through the operator's conversion
  # webhook, which nothing runs on the shared control plane (its in-process operators
  # have none), and kubectl, the garbage collector and the namespace controller read
  # the preferred version, v2. tests/integration/conversion.rs starts a control plane of its own
  # with the webhook CRD; tests/integration/install.rs checks deploy/crd/crd.yaml itself.
  crd="$state.crd-v1-only.yaml"
  "$CARGO_TARGET_DIR/debug/gpujob-operator" crd --v1-only >"$crd"
  # 64 fake nodes of 8 GPUs (GpuNodes::for_tests): tests running at once never wait on
  # each other's GPUs. The Prometheus Operator's and cert-manager's CRDs: tests/integration/install.rs
  # dry-runs the install's ServiceMonitor, PrometheusRule, Certificate and Issuer too.
  "$CARGO_TARGET_DIR/debug/devcluster" up --state-dir "$state" --gpu-nodes 64 \
    --crd "$crd" --crd devcluster/testdata/widget-crd.yaml \
    --crd "$GPUJOB_THIRD_PARTY_CRDS" >"$log" 2>&1 &
  up_pid=$!
  wait_cluster "$state" "$log" "$up_pid"
  export DEVCLUSTER_DIR="$state"
  # The release the binaries claim is the one that answers.
  local want="$1" got
  got="$(kubectl --kubeconfig "$state/kubeconfig/admin.kubeconfig" version -o json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')"
  if [[ "$got" != "$want" ]]; then
    echo "the control plane answers as Kubernetes $got, not $want" >&2
    return 1
  fi
  echo "control plane: Kubernetes $got" >&2
}
# $1: the exit status so far; logs are kept when it is not 0.
stop_cluster() {
  local status="$1"
  [[ -n "$up_pid" ]] || return 0
  kill -TERM "$up_pid" 2>/dev/null || true
  wait "$up_pid" 2>/dev/null || true
  up_pid=""
  if [[ $status -eq 0 ]]; then
    rm -rf "$state" "$log" "$crd"
  else
    echo "control plane logs kept for inspection: $state/logs, $log, $state/audit.log" >&2
  fi
}
trap 'stop_cluster $?' EXIT

current="$(devcluster/scripts/kube-binaries.sh --version)"
step "shared control plane: Kubernetes $current"
start_cluster "$current"

step "tests"
cargo nextest run --workspace --exclude gpujob-benches --features gpujob-operator/failpoints --locked "$@"
stop_cluster 0

# The compatibility subset: the oldest release the README claims, with the binaries of
# that release (built once and cached like the current ones). It runs with the whole
# suite (no arguments) or when GPUJOB_COMPAT=1; KUBEBUILDER_ASSETS_COMPAT points it at
# binaries you already have.
if [[ $# -gt 0 && "${GPUJOB_COMPAT:-}" != 1 ]]; then
  echo "compatibility subset skipped: arguments were given (GPUJOB_COMPAT=1 runs it)" >&2
  exit 0
fi
export DEVCLUSTER_KUBE_RELEASE=compat
compat="$(devcluster/scripts/kube-binaries.sh --version)"
step "compatibility subset: Kubernetes $compat binaries"
KUBEBUILDER_ASSETS="${KUBEBUILDER_ASSETS_COMPAT:-$(KUBEBUILDER_ASSETS='' devcluster/scripts/kube-binaries.sh)}"
export KUBEBUILDER_ASSETS
echo "using $KUBEBUILDER_ASSETS" >&2
step "compatibility subset: shared control plane, Kubernetes $compat"
start_cluster "$compat"
step "compatibility subset: install dry run, CEL rules, conversion webhook, HA, failure rules, one lifecycle, the upgrade's gated Job"
cargo nextest run --workspace --exclude gpujob-benches --features gpujob-operator/failpoints --locked \
  -E 'test(/^(install|validation|conversion|ha|batch)::/) | test(=reconcile::seed_walkthrough_one_job_then_succeeded_then_collected) | test(=reconcile::a_job_an_earlier_release_created_suspended_gets_the_gate_then_runs)'
