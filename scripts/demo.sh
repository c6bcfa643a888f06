#!/usr/bin/env bash
# The demo: a local control plane, the GpuJob CRD, the operator, and sample GpuJobs
# converging in a refreshing table. The cluster and the operator keep running after
# the script ends; `scripts/demo.sh stop` stops them.
#
# On a fresh machine it does its own set-up, like scripts/test.sh (Debian packages,
# Kubernetes binaries built once and cached in ~/.cache/gpujob-operator).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

state="$cache/demo-cluster"
bin="$CARGO_TARGET_DIR/debug"
replicas=3
ns=demo

stop() {
  local pid_file
  for pid_file in "$cache"/demo-replica-*.pid "$cache"/demo-prometheus.pid; do
    [[ -f "$pid_file" ]] || continue
    kill -TERM "$(cat "$pid_file")" 2>/dev/null || true
    rm -f "$pid_file"
  done
  if [[ -x "$bin/devcluster" ]]; then
    "$bin/devcluster" down --state-dir "$state" >&2 || true
  fi
}

if [[ "${1:-}" == "stop" ]]; then
  stop
  exit 0
fi

prepare_machine

step "build"
cargo build --locked --bins

step "local control plane (a demo already running is stopped first)"
stop
rm -f "$state/cluster.json"
# gpujob.dev/v1 alone: deploy/crd/crd.yaml also serves v2 through the conversion
# webhook at the in-cluster Service, which this out-of-cluster demo does not have
# (kubectl, which reads the preferred version v2, would fail). See tests/conversion.rs
# for the webhook on a local control plane.
"$bin/gpujob-operator" crd --v1-only >"$cache/demo-crd.yaml"
setsid nohup "$bin/devcluster" up --state-dir "$state" --crd "$cache/demo-crd.yaml" \
  >"$cache/demo-cluster.log" 2>&1 </dev/null &
wait_cluster "$state" "$cache/demo-cluster.log"
export KUBECONFIG="$state/kubeconfig/admin.kubeconfig"

step "operator RBAC (deploy/operator/rbac.yaml) and $replicas replicas, as its service account"
kubectl apply -f deploy/operator/namespace.yaml -f deploy/operator/rbac.yaml >&2
targets=()
for n in $(seq "$replicas"); do
  addr="127.0.0.1:$((18080 + n))"
  targets+=("\"$addr\"")
  KUBECONFIG="$state/kubeconfig/operator.kubeconfig" setsid nohup "$bin/gpujob-operator" run \
    --identity "demo-$n" --lease-namespace gpujob-system --retry-backoff-base 3s \
    --listen-address "$addr" >"$cache/demo-replica-$n.log" 2>&1 </dev/null &
  echo $! >"$cache/demo-replica-$n.pid"
  echo "demo-$n: metrics at http://$addr/metrics" >&2
done

# A Prometheus scraping the replicas, with the alert rules, where one is installed.
prometheus_url=""
if command -v prometheus >/dev/null; then
  mkdir -p "$cache/demo-prometheus"
  cat >"$cache/demo-prometheus/prometheus.yml" <<PROM
global: {scrape_interval: 5s, evaluation_interval: 5s}
rule_files: ["$repo/alerts/gpujob-operator.rules.yaml"]
scrape_configs:
  - job_name: gpujob-operator
    static_configs:
      - targets: [$(IFS=,; echo "${targets[*]}")]
        labels: {namespace: gpujob-system}
PROM
  setsid nohup prometheus --config.file="$cache/demo-prometheus/prometheus.yml" \
    --storage.tsdb.path="$cache/demo-prometheus/data" --web.listen-address=127.0.0.1:19090 \
    >"$cache/demo-prometheus.log" 2>&1 </dev/null &
  echo $! >"$cache/demo-prometheus.pid"
  prometheus_url="http://127.0.0.1:19090"
  echo "Prometheus at $prometheus_url (alerts: $prometheus_url/alerts)" >&2
fi

step "sample GpuJobs (examples/)"
kubectl create namespace "$ns" >&2
kubectl -n "$ns" apply -f examples/ >&2

step "watching them converge"
deadline=$((SECONDS + 180))
while :; do
  leader="$(kubectl -n gpujob-system get lease gpujob-operator -o jsonpath='{.spec.holderIdentity}' 2>/dev/null || true)"
  table="$(echo "leader: ${leader:-(electing)} of demo-1..demo-$replicas"; echo
    kubectl -n "$ns" get gpujobs -o wide 2>&1; echo; kubectl -n "$ns" get jobs 2>&1)"
  if [[ -t 1 ]]; then clear; fi
  printf '%s\n' "$table"
  phases="$(kubectl -n "$ns" get gpujobs -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}')"
  done_count="$(grep -cE '^(Succeeded|Failed)$' <<<"$phases" || true)"
  if [[ "$done_count" -eq 3 || $SECONDS -ge $deadline ]]; then break; fi
  sleep 2
done

echo
kubectl -n "$ns" get gpujobs -o custom-columns='NAME:.metadata.name,PHASE:.status.phase,ATTEMPTS:.status.attempts,READY:.status.conditions[0].reason,MESSAGE:.status.conditions[0].message'
leader="$(kubectl -n gpujob-system get lease gpujob-operator -o jsonpath='{.spec.holderIdentity}' 2>/dev/null || true)"
cat <<MSG

The cluster and $replicas operator replicas are still running.
  kubeconfig:    export KUBECONFIG=$KUBECONFIG
  try:           kubectl -n $ns get gj; kubectl -n $ns describe gj finetune-llm
  who leads:     kubectl -n gpujob-system get lease gpujob-operator -o jsonpath='{.spec.holderIdentity}'
  fail over:     kill -9 \$(cat $cache/demo-replica-${leader#demo-}.pid)   # the leader, ${leader:-?}
                 kubectl -n gpujob-system get lease gpujob-operator -w   # a standby takes over in ~15 s
  metrics:       http://127.0.0.1:18081/metrics … 1808$replicas/metrics (also /healthz, /readyz)
  prometheus:    ${prometheus_url:-not installed (Debian package prometheus)}
  replica logs:  $cache/demo-replica-N.log
  stop it all:   scripts/demo.sh stop
MSG
