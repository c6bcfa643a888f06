#!/usr/bin/env bash
# The test command: everything CI checks, from a fresh machine.
#
# 1. installs what is missing (Debian packages, cargo-nextest; etcd, kube-apiserver,
#    kube-controller-manager, kube-scheduler and helm are built once with Go from the
#    Go module proxy and cached),
# 2. checks the alert rules with promtool, the Helm chart with helm lint and helm
#    template, deploy/, the chart and the Dockerfile with checkov (installed from PyPI
#    into the cache when missing), formatting and clippy,
# 3. starts one shared control plane (devcluster) for the integration tests,
# 4. runs every test with cargo-nextest, which prints the summary line,
# 5. stops the control plane, also on failure or Ctrl-C.
#
# Caches live outside the clone, under $GPUJOB_CACHE_DIR (default
# ~/.cache/gpujob-operator): the Kubernetes binaries, helm and, unless
# CARGO_TARGET_DIR is set, the cargo target dir.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

prepare_machine
# tests/install.rs renders deploy/ with `kubectl kustomize`: the `labels:` field and
# components need the kustomize v5 built into kubectl 1.27 and later (Debian's
# kubernetes-client, 1.20, has v2). Say so here rather than as a failing test.
if ! kubectl version --client 2>/dev/null | grep -q '^Kustomize Version: v5'; then
  echo "$(command -v kubectl) lacks kustomize v5 (kubectl 1.27 or later renders deploy/); put a recent kubectl first on PATH (https://kubernetes.io/docs/tasks/tools/)" >&2
  exit 1
fi

prepare_helm

step "alert rules, their unit tests, runbook anchors, generated monitoring manifests"
alerts/check.sh

step "Helm chart: lint and render"
charts/check.sh

step "manifests, chart and Dockerfile: checkov, zero failed checks, every skip with its reason"
scripts/checkov.sh

step "format and lint"
cargo fmt --all --check
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings

step "build"
cargo build -p devcluster --locked --bins
cargo nextest run --workspace --exclude gpujob-benches --features gpujob-operator/failpoints --locked --no-run

step "shared control plane"
# A state folder of this run's own: a second run on the same machine (CI next to
# a developer's run, two clones) must not restart or stop this one's control plane,
# which is what `devcluster up` does to whatever else runs on the same folder.
state="$(mktemp -d "$cache/test-cluster-XXXXXX")"
log="$state.log"
# gpujob.dev/v1 alone: deploy/crd/crd.yaml serves v2 through the operator's conversion
# webhook, which nothing runs on the shared control plane (its in-process operators
# have none), and kubectl, the garbage collector and the namespace controller read
# the preferred version, v2. tests/conversion.rs starts a control plane of its own
# with the webhook CRD; tests/install.rs checks deploy/crd/crd.yaml itself.
crd="$state.crd-v1-only.yaml"
"$CARGO_TARGET_DIR/debug/gpujob-operator" crd --v1-only >"$crd"
# 64 fake nodes of 8 GPUs (GpuNodes::for_tests): tests running at once never wait on
# each other's GPUs.
"$CARGO_TARGET_DIR/debug/devcluster" up --state-dir "$state" --gpu-nodes 64 \
  --crd "$crd" --crd devcluster/testdata/widget-crd.yaml >"$log" 2>&1 &
up_pid=$!
stop_cluster() {
  local status=$?
  kill -TERM "$up_pid" 2>/dev/null || true
  wait "$up_pid" 2>/dev/null || true
  if [[ $status -eq 0 ]]; then
    rm -rf "$state" "$log" "$crd"
  else
    echo "control plane logs kept for inspection: $state/logs, $log, $state/audit.log" >&2
  fi
}
trap stop_cluster EXIT
wait_cluster "$state" "$log" "$up_pid"
export DEVCLUSTER_DIR="$state"

step "tests"
cargo nextest run --workspace --exclude gpujob-benches --features gpujob-operator/failpoints --locked "$@"
