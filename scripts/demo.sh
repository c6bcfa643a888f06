#!/usr/bin/env bash
# The demo: a local control plane, the GpuJob CRD, the operator, and sample GpuJobs
# converging in a refreshing table. The cluster and the operator keep running after
# the script ends; `scripts/demo.sh stop` stops them.
#
# On a fresh machine it does its own set-up, like scripts/test.sh (Debian packages,
# Kubernetes binaries built once and cached in ~/.cache/gpujob-operator). The control
# plane has devcluster's default fake GPU nodes: 4 nodes of 8 GPUs, scheduled by the
# real kube-scheduler.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

state="$cache/demo-cluster"
bin="$CARGO_TARGET_DIR/debug"
replicas=3
# As deploy/operator/deployment.yaml runs them: GpuJobs split by namespace into 6
# shards, one Lease each, shared out over the replicas.
shards=6
ns=demo

stop() {
  local pid_file
  for pid_file in "$cache"/demo-replica-*.pid "$cache"/demo-prometheus.pid "$cache"/demo-forward.pid; do
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

prepare_machine cluster

step "build"
# The root package alone is what a bare `cargo build` at the root builds: the demo
# also runs devcluster's binary.
cargo build --locked --bins -p gpujob-operator -p devcluster
# The kubectl plugin (plugin/): `kubectl gpujob` once $bin is on PATH.
cargo build --locked -p kubectl-gpujob

step "local control plane (a demo already running is stopped first)"
stop
rm -f "$state/cluster.json"
# The conversion webhook as an install has it, with local stand-ins: every replica
# serves it (a certificate for 127.0.0.1 signed by a CA of the demo), and
# scripts/forward.py, in the place of the webhook Service, passes each call to the first
# replica that is up. The CRD serves v1 and v2 and calls it there, so kubectl reads
# gpujob.dev/v2 (the examples are v2) and a killed replica does not stop conversions.
webhook_dir="$cache/demo-webhook"
rm -rf "$webhook_dir"
mkdir -p "$webhook_dir"
openssl ecparam -name prime256v1 -genkey -noout -out "$webhook_dir/ca.key" 2>/dev/null
openssl req -x509 -new -key "$webhook_dir/ca.key" -sha256 -days 30 -subj "/CN=gpujob-demo-ca" \
  -out "$webhook_dir/ca.crt" 2>/dev/null
openssl ecparam -name prime256v1 -genkey -noout 2>/dev/null \
  | openssl pkcs8 -topk8 -nocrypt -out "$webhook_dir/tls.key"
openssl req -new -key "$webhook_dir/tls.key" -subj "/CN=127.0.0.1" -out "$webhook_dir/tls.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' >"$webhook_dir/tls.ext"
openssl x509 -req -in "$webhook_dir/tls.csr" -CA "$webhook_dir/ca.crt" -CAkey "$webhook_dir/ca.key" \
  -CAcreateserial -days 30 -sha256 -extfile "$webhook_dir/tls.ext" -out "$webhook_dir/tls.crt" 2>/dev/null
webhook_backends=()
for n in $(seq "$replicas"); do webhook_backends+=("127.0.0.1:$((19443 + n))"); done
setsid nohup python3 scripts/forward.py 127.0.0.1:19443 "${webhook_backends[@]}" \
  >"$cache/demo-forward.log" 2>&1 </dev/null &
echo $! >"$cache/demo-forward.pid"
"$bin/gpujob-operator" crd --webhook-url https://127.0.0.1:19443/convert \
  --ca-bundle-file "$webhook_dir/ca.crt" >"$cache/demo-crd.yaml"
# --dra: the fake nodes also publish DRA devices, for examples/dra.yaml.
setsid nohup "$bin/devcluster" up --state-dir "$state" --dra --crd "$cache/demo-crd.yaml" \
  >"$cache/demo-cluster.log" 2>&1 </dev/null &
wait_cluster "$state" "$cache/demo-cluster.log"
export KUBECONFIG="$state/kubeconfig/admin.kubeconfig"

step "operator RBAC (deploy/operator/rbac.yaml) and $replicas replicas sharing $shards shards, as its service account"
kubectl apply -f deploy/operator/namespace.yaml -f deploy/operator/rbac.yaml >&2
targets=()
for n in $(seq "$replicas"); do
  addr="127.0.0.1:$((18080 + n))"
  targets+=("\"$addr\"")
  KUBECONFIG="$state/kubeconfig/operator.kubeconfig" setsid nohup "$bin/gpujob-operator" run \
    --identity "demo-$n" --lease-namespace gpujob-system --shards "$shards" --retry-backoff-base 3s \
    --listen-address "$addr" --conversion-cert-dir "$webhook_dir" \
    --conversion-address "${webhook_backends[$((n - 1))]}" >"$cache/demo-replica-$n.log" 2>&1 </dev/null &
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

step "sample GpuJobs (examples/, gpujob.dev/v2)"
kubectl create namespace "$ns" >&2
# The replicas serve conversions once they are up: wait for the first answer.
for _ in $(seq 150); do
  kubectl get gpujobs.v2.gpujob.dev -A >/dev/null 2>&1 && break
  sleep 0.2
done
kubectl -n "$ns" apply -f examples/ >&2

step "preempting pretrain-preemptible's first attempt (an eviction, as a node drain does)"
# The Eviction API marks the pod DisruptionTarget, then deletes it; the GpuJob retries
# without counting (examples/preempted.yaml).
pod=""
for _ in $(seq 600); do
  pod="$(kubectl -n "$ns" get pods -l gpujob.dev/name=pretrain-preemptible,gpujob.dev/attempt=1 \
    --field-selector=status.phase=Running -o jsonpath='{.items[0].metadata.name}' 2>/dev/null || true)"
  [[ -n "$pod" ]] && break
  sleep 0.2
done
if [[ -n "$pod" ]]; then
  printf '{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"%s","namespace":"%s"}}' "$pod" "$ns" \
    | kubectl create --raw "/api/v1/namespaces/$ns/pods/$pod/eviction" -f - >/dev/null
  echo "evicted pod $pod" >&2
else
  echo "pretrain-preemptible's pod did not run within 120 s; not evicting it" >&2
fi

step "watching them converge"
total="$(grep -c '^kind: GpuJob' examples/*.yaml | awk -F: '{n += $2} END {print n}')"
# The shard of namespace $ns: the range of fnv1a64(namespace) it falls in, shard i of n
# being [i*2^64//n, (i+1)*2^64//n) (docs/ha-and-sharding.md, "Sharding").
shard="$(python3 -c 'import sys
h = 0xcbf29ce484222325
for b in sys.argv[1].encode():
    h = ((h ^ b) * 0x100000001b3) % 2**64
n = int(sys.argv[2])
print(next(i for i in range(n) if i * 2**64 // n <= h < (i + 1) * 2**64 // n))' "$ns" "$shards")"
deadline=$((SECONDS + 240))
while :; do
  table="$(echo "namespace $ns is shard $shard of $shards; who holds each shard:"
    kubectl -n gpujob-system get leases -l gpujob.dev/lease-role=shard \
      -o custom-columns='SHARD:.metadata.name,HOLDER:.spec.holderIdentity' --no-headers 2>&1 | sed 's/^/  /'
    echo; kubectl -n "$ns" get gpujobs -o wide 2>&1
    echo; kubectl -n "$ns" get pods -o custom-columns='POD:.metadata.name,PHASE:.status.phase,NODE:.spec.nodeName,GPUS:.spec.containers[0].resources.limits.nvidia\.com/gpu' 2>&1)"
  if [[ -t 1 ]]; then clear; fi
  printf '%s\n' "$table"
  phases="$(kubectl -n "$ns" get gpujobs -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}')"
  done_count="$(grep -cE '^(Succeeded|Failed)$' <<<"$phases" || true)"
  if [[ "$done_count" -eq "$total" || $SECONDS -ge $deadline ]]; then break; fi
  sleep 2
done

echo
kubectl -n "$ns" get gpujobs -o custom-columns='NAME:.metadata.name,PHASE:.status.phase,ATTEMPTS:.status.attempts,FAILURES:.status.failures,LAST-FAILURE:.status.lastFailure.reason,READY:.status.conditions[0].reason,MESSAGE:.status.conditions[0].message'
echo
# The DRA GpuJob: no H200 in the demo's nodes, so its attempt got the second alternative.
echo "finetune-dra (examples/dra.yaml, GPUs by DRA) got: $(kubectl -n "$ns" get gpujob finetune-dra \
  -o jsonpath='attempt {.status.devices.attempt}: {.status.devices.alternatives}' 2>/dev/null || true)"
echo
# Each attempt of the preempted GpuJob, through the kubectl plugin (plugin/): attempt 1
# disrupted and not counted, attempt 2 succeeded. Shown, never fatal to the demo.
echo "kubectl gpujob -n $ns attempts pretrain-preemptible"
PATH="$bin:$PATH" kubectl gpujob -n "$ns" attempts pretrain-preemptible || true
holder="$(kubectl -n gpujob-system get lease "gpujob-operator-shard-$shard" -o jsonpath='{.spec.holderIdentity}' 2>/dev/null || true)"
cat <<MSG

The cluster and $replicas operator replicas are still running.
  kubeconfig:    export KUBECONFIG=$KUBECONFIG
  try:           kubectl -n $ns get gj; kubectl -n $ns describe gj finetune-llm
  plugin:        export PATH=$bin:\$PATH   # kubectl gpujob, from plugin/
                 kubectl gpujob -n $ns attempts finetune-llm; kubectl gpujob -n $ns why sweep-lr-3e-3
  two nodes:     kubectl -n $ns get pods,svc,endpointslices -l gpujob.dev/name=pretrain-multinode -o wide
  DRA:           kubectl -n $ns get resourceclaimtemplates,resourceclaims -l gpujob.dev/name=finetune-dra
  who holds what: kubectl -n gpujob-system get leases -l gpujob.dev/lease-role=shard
  fail over:     kill -9 \$(cat $cache/demo-replica-${holder#demo-}.pid)   # ${holder:-?}, holder of $ns's shard $shard
                 kubectl -n gpujob-system get leases -w   # the others take its shards in ~15 s
  GPUs:          kubectl get nodes -o custom-columns='NODE:.metadata.name,GPUS:.status.allocatable.nvidia\.com/gpu,PRODUCT:.metadata.labels.nvidia\.com/gpu\.product'
  metrics:       http://127.0.0.1:18081/metrics … 1808$replicas/metrics (also /healthz, /readyz)
  prometheus:    ${prometheus_url:-not installed (Debian package prometheus)}
  replica logs:  $cache/demo-replica-N.log
  webhook:       every replica serves conversions; scripts/forward.py ($cache/demo-forward.log) stands in for the Service
  stop it all:   scripts/demo.sh stop
MSG
