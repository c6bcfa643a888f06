#!/usr/bin/env bash
# Tools the tests and the demo run besides the control plane: kubectl (Debian's
# kubernetes-client when the machine has none), openssl, PyYAML (charts/readme.py reads
# the chart's values), Python's venv (scripts/checkov.sh installs checkov into one) and
# cargo-nextest.
set -euo pipefail

need=()
command -v kubectl >/dev/null || need+=(kubernetes-client)
command -v openssl >/dev/null || need+=(openssl)
python3 -c 'import yaml' 2>/dev/null || need+=(python3-yaml)
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
if ((${#need[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "missing tools; install them with: sudo apt-get update && sudo apt-get install -y ${need[*]}" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "installing cargo-nextest from crates.io" >&2
  cargo install --locked cargo-nextest
fi
