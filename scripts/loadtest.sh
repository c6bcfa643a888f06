#!/usr/bin/env bash
# The load test: thousands of GpuJobs against replicas of the real operator on a
# private control plane; prints a Markdown report (and writes it where --report says).
# Not part of the test command: figures are measured here, never asserted.
#
#   scripts/loadtest.sh                       # 2000 GpuJobs, 3 replicas, 1 shard, dev build
#   scripts/loadtest.sh --gpujobs 10000 --kill-leader-after 5000 --report loadtest/REPORT.md
#   scripts/loadtest.sh --replicas 3 --shards 6                 # sharded: ~2 shards per replica
#   scripts/loadtest.sh --replicas 3 --shards 6 --kill-leader-after 1000
#                        # kills the replica holding the most shards, reports how long they were unowned
#   LOADTEST_PROFILE=release scripts/loadtest.sh ...   # everything built with --release
#   scripts/loadtest.sh --gpujobs 10000 --trickle 20      # 20 more, one a second, in namespace trickle:
#                        # how long new work waits behind the burst for its first Job
#   LOADTEST_PROFILE=release scripts/loadtest.sh --gpujobs 10000 --replicas 2 --compare
#                        # the floor, a kube-runtime reference controller and the operator, each alone;
#                        # with --report DIR/R.md also DIR/R-converged.png and DIR/R-operator.png
#                        # (linked from it; without --report, in the replicas' log folder);
#                        # --takeover: then kill -9 of the operator's working replica, and how long
#                        # a survivor takes to look at every converged GpuJob (and what it writes)
#   GPUJOB_API_QPS=2000 GPUJOB_API_BURST=4000 GPUJOB_WORKERS=32 scripts/loadtest.sh ...
#                        # operator flags through their environment variables (the report lists them)
#
# GpuJobs are spread round-robin over --namespaces K (default 50) namespaces load-0..load-<K-1>;
# shards are by namespace, so K is what there is to split. --shards N is passed to every replica,
# with --shard-cuts balanced over the K namespaces. --sharded-watch off: kube-apiserver without
# ShardedListAndWatch, so every replica lists, watches and caches everything (default on).
#
# Same set-up as scripts/test.sh on a fresh machine. Stops by itself (--timeout-seconds,
# default 1800); the control plane and the replicas end with it.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

profile="${LOADTEST_PROFILE:-dev}"
prepare_machine cluster

step "build ($profile profile for the operator, the reference controller and the load generator)"
# The reference controller --compare measures is built like the operator: a dev build of
# one against a release build of the other would compare the builds. The load
# generator too: it shares the 2 cores with them, and --compare's floor is its writes.
if [[ "$profile" == "release" ]]; then
  cargo build --locked --release --bin gpujob-operator
  cargo build --locked --release -p gpujob-loadtest --bin gpujob-reference-controller --bin gpujob-loadtest
  out="$CARGO_TARGET_DIR/release"
else
  cargo build --locked --bin gpujob-operator
  cargo build --locked -p gpujob-loadtest --bin gpujob-reference-controller --bin gpujob-loadtest
  out="$CARGO_TARGET_DIR/debug"
fi

step "load test"
"$out/gpujob-loadtest" --operator-bin "$out/gpujob-operator" \
  --reference-bin "$out/gpujob-reference-controller" --profile "$profile" \
  --deploy deploy "$@"
