#!/usr/bin/env bash
# checkov on the install: the manifests as files and as kustomize renders them
# (deploy/), the Helm chart as it renders with every optional part on (with
# $GPUJOB_HELM, which scripts/test.sh sets), and the Dockerfile. Passes only with zero failed checks and a written
# reason for every skip (inline: `checkov.io/skipN: ID=reason` annotations in deploy/,
# `# checkov:skip=ID: reason` in the Dockerfile).
#
# checkov comes from PyPI at a pinned version, its dependencies at the versions of
# scripts/checkov-constraints.txt, installed once into a virtualenv in the cache
# ($GPUJOB_CACHE_DIR, default ~/.cache/gpujob-operator); CHECKOV overrides it. A
# virtualenv's scripts name its own path, so it is built in place and marked `.complete`
# last: one without the mark (an install that stopped) is built again. Bump `recipe`
# when the constraints change.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
cache="${GPUJOB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpujob-operator}"
version=3.3.30
recipe="checkov-$version-r2"
venv="$cache/$recipe"
checkov="${CHECKOV:-$venv/bin/checkov}"
if [[ -z "${CHECKOV:-}" && ! -e "$venv/.complete" ]]; then
  # Two test commands on one machine: one builds, the other waits for it.
  mkdir -p "$cache"
  exec 9>"$cache/$recipe.lock"
  flock 9
  if [[ ! -e "$venv/.complete" ]]; then
    echo "installing checkov $version from PyPI into $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
      -c scripts/checkov-constraints.txt "checkov==$version"
    touch "$venv/.complete"
  fi
  flock -u 9
fi

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
# --skip-download: no calls to the vendor's platform; the checks ship with the package.
"$checkov" --skip-download --soft-fail -o json -d deploy \
  --framework kubernetes kustomize >"$out/deploy.json"
"$checkov" --skip-download --soft-fail -o json -f Dockerfile \
  --framework dockerfile >"$out/dockerfile.json"
reports=("$out/deploy.json" "$out/dockerfile.json")
if [[ -n "${GPUJOB_HELM:-}" ]]; then
  mkdir "$out/chart"
  HELM_CONFIG_HOME="$out/helm" HELM_CACHE_HOME="$out/helm" HELM_DATA_HOME="$out/helm" \
    "$GPUJOB_HELM" template gpujob-operator charts/gpujob-operator --namespace gpujob-system \
    --set webhook.certManager.enabled=true --set monitoring.enabled=true --set metrics.secure=true \
    >"$out/chart/gpujob-operator.yaml"
  "$checkov" --skip-download --soft-fail -o json -d "$out/chart" \
    --framework kubernetes >"$out/chart.json"
  reports+=("$out/chart.json")
fi

python3 - "${reports[@]}" <<'PY'
import json, sys
bad = []
for path in sys.argv[1:]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    for report in data if isinstance(data, list) else [data]:
        kind = report.get("check_type", "?")
        s = report["summary"]
        print(f"checkov {kind}: {s['passed']} passed, {s['failed']} failed, {s['skipped']} skipped")
        if s["passed"] == 0:
            bad.append(f"{kind}: nothing was checked")
        for c in report["results"].get("failed_checks", []):
            bad.append(f"{kind}: {c['check_id']} {c['check_name']} ({c['resource']}, {c['file_path']})")
        for c in report["results"].get("skipped_checks", []):
            why = (c.get("check_result", {}).get("suppress_comment") or "").strip()
            if not why or why == "No comment provided":
                bad.append(f"{kind}: {c['check_id']} skipped without a reason ({c['resource']})")
if bad:
    print("checkov findings:\n  " + "\n  ".join(bad), file=sys.stderr)
    sys.exit(1)
PY
