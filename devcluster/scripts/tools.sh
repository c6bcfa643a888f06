#!/usr/bin/env bash
# Tools the tests and the demo run besides the control plane. Both: kubectl (Debian's
# kubernetes-client when the machine has none), openssl and python3 (the demo's
# stand-in for the webhook Service, scripts/forward.py). The tests (mode `test`, the
# default) also: PyYAML (charts/readme.py reads the chart's values; Debian's
# python3-yaml for Debian's python3, PyPI for a python3 of its own), Python's venv
# (scripts/checkov.sh installs checkov into one) and cargo-nextest.
#
# Usage: tools.sh [test|cluster]
set -euo pipefail
mode="${1:-test}"
case "$mode" in
  test | cluster) ;;
  *) echo "tools.sh: unknown mode '$mode' (test or cluster)" >&2; exit 2 ;;
esac

# The version the tests were last run with; a newer one may need a newer Rust.
NEXTEST_VERSION="0.9.151"

need=()
command -v kubectl >/dev/null || need+=(kubernetes-client)
command -v openssl >/dev/null || need+=(openssl)
command -v python3 >/dev/null || need+=(python3)
# Debian's python3 (or none yet): its packages serve it. Another one gets PyYAML from
# PyPI below, with no root needed.
debian_python=true
if command -v python3 >/dev/null \
  && [[ "$(python3 -c 'import sys; print(sys.prefix)')" != /usr ]]; then
  debian_python=false
fi
if [[ "$mode" == test ]] && $debian_python; then
  python3 -c 'import yaml' 2>/dev/null || need+=(python3-yaml)
  python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
fi
if ((${#need[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "missing tools; install them with: sudo apt-get update && sudo apt-get install -y ${need[*]}" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
[[ "$mode" == test ]] || exit 0

if ! python3 -c 'import yaml' 2>/dev/null; then
  echo "python3 ($(command -v python3)) has no PyYAML; installing it from PyPI" >&2
  python3 -m pip install --quiet 'PyYAML==6.0.4' \
    || { echo "tools.sh: cannot install PyYAML for $(command -v python3)" >&2; exit 1; }
fi
if ! cargo nextest --version >/dev/null 2>&1; then
  echo "installing cargo-nextest $NEXTEST_VERSION from crates.io" >&2
  cargo install --locked cargo-nextest --version "$NEXTEST_VERSION"
fi
