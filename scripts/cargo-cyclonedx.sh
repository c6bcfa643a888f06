#!/usr/bin/env bash
# Provides cargo-cyclonedx (scripts/sbom.sh writes and checks the operator's CycloneDX
# SBOM with it) and prints the binary's path on stdout.
#
# Order: $GPUJOB_CARGO_CYCLONEDX if set (a cargo-cyclonedx you already have, of the
# version below: another version writes another SBOM); else a cached build under
# $GPUJOB_CACHE_DIR (default ~/.cache/gpujob-operator); else `cargo install --locked` it
# from crates.io at the pinned version (its own Cargo.lock, so the build is the one
# that was published), then cache it.
#
# The cache folder's name is the version: bump VERSION and the next run installs anew,
# an old build is never reused. A build goes to a temporary folder (its target dir too,
# removed afterwards) and is renamed into place only when complete (marked by
# `.complete`), so a half-written cache is never used.
#
# Usage: cargo-cyclonedx.sh            locate, or install when missing
#        cargo-cyclonedx.sh --locate   locate only; exit 3 when nothing usable is there
set -euo pipefail
MODE="${1:-prepare}"

# The newest release (0.5.9 says rust-version 1.85; it builds with the Rust 1.95 here).
# A new version may change the SBOM's shape: bump it, run scripts/sbom.sh, review the diff.
VERSION="0.5.9"
RECIPE="cargo-cyclonedx-${VERSION}"

log() { echo "cargo-cyclonedx.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

# `cargo-cyclonedx cyclonedx --version` prints "cargo-cyclonedx-cyclonedx 0.5.9".
check_version() {
  local bin="$1" got
  got="$("$bin" cyclonedx --version 2>/dev/null)" || die "$bin cyclonedx --version failed"
  [[ "$got" == "cargo-cyclonedx-cyclonedx $VERSION" ]] || die "$bin is '$got', not cargo-cyclonedx $VERSION"
}

if [[ -n "${GPUJOB_CARGO_CYCLONEDX:-}" ]]; then
  [[ -x "$GPUJOB_CARGO_CYCLONEDX" ]] || die "GPUJOB_CARGO_CYCLONEDX=$GPUJOB_CARGO_CYCLONEDX is not an executable"
  check_version "$GPUJOB_CARGO_CYCLONEDX"
  echo "$GPUJOB_CARGO_CYCLONEDX"
  exit 0
fi

CACHE_ROOT="${GPUJOB_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/gpujob-operator}"
DEST="$CACHE_ROOT/$RECIPE"
if [[ -f "$DEST/.complete" && -x "$DEST/bin/cargo-cyclonedx" ]]; then
  echo "$DEST/bin/cargo-cyclonedx"
  exit 0
fi
if [[ "$MODE" == "--locate" ]]; then
  log "no usable cargo-cyclonedx: GPUJOB_CARGO_CYCLONEDX is unset and $DEST is not complete; run $0 to install it"
  exit 3
fi

command -v cargo >/dev/null || die "no cargo on PATH"
mkdir -p "$CACHE_ROOT"
WORK="$(mktemp -d "$CACHE_ROOT/.build-$RECIPE.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
log "installing cargo-cyclonedx $VERSION from crates.io into $WORK; cached afterwards in $DEST"
started=$SECONDS
# --target-dir: its own, thrown away with $WORK (not the workspace's CARGO_TARGET_DIR).
cargo install --locked --quiet --version "$VERSION" --root "$WORK/out" \
  --target-dir "$WORK/target" cargo-cyclonedx >&2 \
  || die "installing cargo-cyclonedx $VERSION failed"
check_version "$WORK/out/bin/cargo-cyclonedx"
rm -f "$WORK/out/.crates.toml" "$WORK/out/.crates2.json"
echo "$RECIPE" >"$WORK/out/.complete"
rm -rf "$DEST"
mv "$WORK/out" "$DEST"
log "installed in $((SECONDS - started)) s; cached in $DEST"
echo "$DEST/bin/cargo-cyclonedx"
