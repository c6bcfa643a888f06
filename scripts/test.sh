#!/usr/bin/env bash
# The test command: everything CI checks, from a fresh machine.
#
# 1. installs what is missing (Debian packages; kube-apiserver and
#    kube-controller-manager are built once from Debian's source and cached),
# 2. checks formatting and clippy,
# 3. starts one shared control plane (devcluster) for the integration tests,
# 4. runs every test with cargo-nextest, which prints the summary line,
# 5. stops the control plane, also on failure or Ctrl-C.
#
# Caches live outside the clone, under $GPUJOB_CACHE_DIR (default
# ~/.cache/gpujob-operator): the Kubernetes binaries and, unless CARGO_TARGET_DIR
# is set, the cargo target dir.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
cache="${GPUJOB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpujob-operator}"
mkdir -p "$cache"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$cache/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

step() { printf '\n==> %s\n' "$*" >&2; }

step "control-plane binaries"
KUBEBUILDER_ASSETS="$(devcluster/scripts/kube-binaries.sh)"
export KUBEBUILDER_ASSETS
echo "using $KUBEBUILDER_ASSETS" >&2
devcluster/scripts/tools.sh >&2

step "format and lint"
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings

step "build"
cargo build --workspace --locked --bins
cargo nextest run --workspace --locked --no-run

step "shared control plane"
state="$cache/test-cluster"
log="$cache/test-cluster.log"
"$CARGO_TARGET_DIR/debug/devcluster" up --state-dir "$state" \
  --crd devcluster/testdata/widget-crd.yaml >"$log" 2>&1 &
up_pid=$!
stop_cluster() {
  kill -TERM "$up_pid" 2>/dev/null || true
  wait "$up_pid" 2>/dev/null || true
}
trap stop_cluster EXIT
for _ in $(seq 600); do
  [[ -f "$state/cluster.json" ]] && break
  if ! kill -0 "$up_pid" 2>/dev/null; then
    echo "devcluster up failed; its output ($log):" >&2
    cat "$log" >&2
    exit 1
  fi
  sleep 0.2
done
[[ -f "$state/cluster.json" ]] || { echo "devcluster up not ready after 120 s; see $log" >&2; exit 1; }
grep -m1 'control plane ready' "$log" >&2 || true
export DEVCLUSTER_DIR="$state"

step "tests"
cargo nextest run --workspace --locked "$@"
