#!/usr/bin/env bash
# Validates the observability artifacts: the alert rules (promtool check rules), their unit
# tests (promtool test rules), the runbook anchors the rules link to, the PromQL of every
# dashboard panel, and that deploy/monitoring/ is generated from the current files.
# Works from any directory. Installs Debian's `prometheus` package (promtool, and the
# server the tests run) when either is missing.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# The tests also run the server (tests/integration/support/prometheus.rs): both come
# with the package.
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  install=(apt-get install -y --no-install-recommends prometheus)
  if [[ "$(id -u)" -ne 0 ]]; then
    echo "promtool or prometheus is missing; install them as root with:" >&2
    echo "  apt-get update && ${install[*]}" >&2
    exit 1
  fi
  echo "promtool or prometheus is missing; installing Debian's prometheus package" >&2
  apt-get update
  DEBIAN_FRONTEND=noninteractive "${install[@]}"
fi

echo "== promtool check rules"
promtool check rules alerts/gpujob-operator.rules.yaml

echo "== promtool test rules"
promtool test rules alerts/tests/*.yaml

echo "== runbook anchors"
# Every runbook_url must point at a heading of docs/runbooks.md (GitHub anchor: the
# heading text lowercased; alert names have no spaces or punctuation).
headings="$(sed -n 's/^## \(.*\)$/\1/p' docs/runbooks.md | tr '[:upper:]' '[:lower:]')"
missing=0
while read -r anchor; do
  if ! grep -qxF "$anchor" <<<"$headings"; then
    echo "runbook anchor #$anchor has no '## ' heading in docs/runbooks.md" >&2
    missing=1
  fi
done < <(grep -o 'runbooks\.md#[a-z0-9-]*' alerts/gpujob-operator.rules.yaml | sed 's/.*#//' | sort -u)
alerts="$(sed -n 's/^ *- alert: *//p' alerts/gpujob-operator.rules.yaml | sort)"
urls="$(grep -c 'runbook_url: https://github.com/gpujob-dev/gpujob-operator/blob/main/docs/runbooks.md#' alerts/gpujob-operator.rules.yaml)"
if [[ "$urls" -ne "$(wc -l <<<"$alerts")" ]]; then
  echo "every alert needs a runbook_url ($urls for $(wc -l <<<"$alerts") alerts)" >&2
  missing=1
fi
for alert in $alerts; do
  if ! grep -q "alertname: $alert\$" alerts/tests/*.yaml; then
    echo "alert $alert has no promtool unit test" >&2
    missing=1
  fi
done
[[ "$missing" -eq 0 ]]
echo "  OK: $(wc -l <<<"$alerts") alerts, each with a runbook section and unit tests"

echo "== dashboard PromQL"
# Every panel target's expr, with the Grafana variables filled in, must parse: they are
# checked as recording rules.
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 - dashboards/gpujob-operator.json "$tmp/dashboard.rules.yaml" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
exprs = []
for p in d["panels"]:
    targets = [t for t in p.get("targets", []) if t.get("expr")]
    if not targets:
        sys.exit(f"panel {p.get('id')} {p.get('title')!r} has no target with an expr")
    exprs += [t["expr"] for t in targets]
exprs += [a["expr"] for a in d.get("annotations", {}).get("list", []) if a.get("expr")]
# Every selector names the cluster too (the `cluster` variable: one dashboard for many
# clusters behind one Prometheus, Thanos or Mimir).
import re
for e in exprs:
    for sel in re.findall(r"\{[^}]*\}", e):
        if 'job=~"$job"' in sel and 'cluster=~"$cluster"' not in sel:
            sys.exit(f"a selector without cluster=~\"$cluster\": {e}")
subst = {"$__rate_interval": "2m", "$job": "gpujob-operator", "$namespace": ".*", "$cluster": ".*"}
with open(sys.argv[2], "w") as f:
    f.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, e in enumerate(exprs):
        for k, v in subst.items():
            e = e.replace(k, v)
        f.write(f"      - record: dashboard:expr{i}\n        expr: {json.dumps(e)}\n")
print(f"  {len(d['panels'])} panels, {len(exprs)} expressions")
PY
promtool check rules "$tmp/dashboard.rules.yaml" >/dev/null
echo "  OK"

echo "== deploy/monitoring is generated from the current files"
python3 deploy/monitoring/generate.py --check
