#!/usr/bin/env bash
# The SBOM of the operator binary: sbom/gpujob-operator.cdx.json, CycloneDX 1.5 JSON,
# written by cargo-cyclonedx (scripts/cargo-cyclonedx.sh installs it into the cache
# when missing; GPUJOB_CARGO_CYCLONEDX names one you have, of the same version).
#
# Usage: scripts/sbom.sh           writes sbom/gpujob-operator.cdx.json
#        scripts/sbom.sh --check   writes it to a temporary file and fails when the
#                                  checked-in one differs (run by scripts/test.sh)
#
# What it describes: the binary `gpujob-operator` of the release build, as the
# Dockerfile builds it (`cargo build --release --locked -p gpujob-operator`, default
# features: `failpoints` is for tests and adds no dependency), for x86_64-unknown-linux-gnu
# (aarch64-unknown-linux-gnu, an arm64 image, has the same crates with one more edge,
# ring -> libc; the check fails when the crates differ): the package and its normal
# dependencies, proc-macros included (the code they generate is in the binary), no dev-
# or build-dependencies, none of the other workspace members (devcluster, the load test
# and the benches are not shipped; the kubectl plugin ships apart, as krew archives for
# four platforms, and is not described here).
#
# cargo-cyclonedx reads `cargo metadata`, whose features are unified over the whole
# workspace and its dev-dependencies (CycloneDX/cyclonedx-rust-cargo#760), so it lists
# a few crates the binary does not contain (e.g. `pem`, which only the tests' rcgen
# feature brings) and a few edges the build does not have (e.g. tokio -> bytes). This
# script keeps its components (licences, hashes from Cargo.lock, purls) but only those,
# and only the edges, that `cargo tree -p gpujob-operator -e normal` shows: cargo's own
# resolver, the one the release build uses. A crate of that tree that cargo-cyclonedx
# did not list is an error.
#
# Reproducible, so that it can be checked: no serialNumber and no metadata.timestamp
# (both optional in CycloneDX; they would change on every run), components and edges
# sorted, and the workspace's path in the bom-refs of its own packages
# (`path+file:///<checkout>#gpujob-operator@0.1.0`) written as /src, where the
# Dockerfile builds it.
#
# The check verifies, of the fresh SBOM and of the checked-in one: the top component
# is gpujob-operator at the workspace's version; every package of `cargo tree -p
# gpujob-operator -e normal --locked` (name and version) is a component, and nothing
# else is; the dependency edges are the tree's; every edge names a component. Then that
# the checked-in file is the fresh one, byte for byte.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

mode="write"
case "${1:-}" in
  "") ;;
  --check) mode="check" ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

sbom=sbom/gpujob-operator.cdx.json
target=x86_64-unknown-linux-gnu
also_target=aarch64-unknown-linux-gnu
# In the bom-refs of the workspace's own packages, in place of the checkout's path.
src_root=/src

tool="$(scripts/cargo-cyclonedx.sh)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# cargo-cyclonedx writes one file per binary of every workspace member, next to each
# Cargo.toml: run it on a copy of the checkout (its files as git sees them, uncommitted
# changes included), never in it.
mkdir "$work/src"
git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do [[ -e "$f" ]] && printf '%s\0' "$f"; done |
  tar --null -T - -cf - | tar -xf - -C "$work/src"
# SOURCE_DATE_EPOCH: cargo-cyclonedx then writes no serialNumber (and a fixed timestamp,
# removed below).
(cd "$work/src" && SOURCE_DATE_EPOCH=0 "$tool" cyclonedx --quiet \
  --format json --spec-version 1.5 --describe binaries --all --no-build-deps \
  --target "$target") >&2
raw="$work/src/gpujob-operator_bin.cdx.json"
[[ -f "$raw" ]] || { echo "cargo-cyclonedx wrote no $(basename "$raw")" >&2; exit 1; }
# `cargo metadata` (run by cargo-cyclonedx) rewrites a Cargo.lock that does not match the
# manifests; the SBOM must describe the checked-in lock file.
cmp -s Cargo.lock "$work/src/Cargo.lock" ||
  { echo "Cargo.lock is out of date (cargo metadata changed it): run cargo update -w and commit it" >&2; exit 1; }

for t in "$target" "$also_target"; do
  cargo tree -p gpujob-operator -e normal --locked --prefix depth --format '{p}' \
    --target "$t" >"$work/tree-$t.txt"
done

fresh="$work/gpujob-operator.cdx.json"
# $1: generate|validate, $2: what to call it in messages, $3: the SBOM to read,
# $4: the file to write (generate).
sbom_py() {
  python3 - "$1" "$2" "$3" "${4:-}" "$work/src" "$src_root" \
    "$work/tree-$target.txt" "$work/tree-$also_target.txt" "$target" "$also_target" <<'PY'
import json, re, sys, tomllib

mode, label, path, out, copy_root, src_root, tree_path, also_tree_path, target, also_target = sys.argv[1:]


def tree(path):
    """The packages (name, version) and edges of `cargo tree --prefix depth --format {p}`."""
    nodes, edges, stack = set(), set(), []
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"^(\d+)(\S+) v(\S+)", line)
            if not m:
                continue
            depth, key = int(m[1]), (m[2], m[3])
            nodes.add(key)
            del stack[depth:]
            if depth:
                edges.add((stack[depth - 1], key))
            stack.append(key)
    return nodes, edges


nodes, edges = tree(tree_path)
also_nodes, _ = tree(also_tree_path)
problems = []
# The crates, not the edges: on aarch64 ring also depends on libc.
if also_nodes != nodes:
    only = sorted(f"{n} {v}" for n, v in nodes ^ also_nodes)
    problems.append(
        f"the binary for {also_target} is not made of the crates of {target}, which the "
        f"SBOM describes (in one only: {', '.join(only)}): the images of the two "
        "architectures need an SBOM each now"
    )

try:
    with open(path, encoding="utf-8") as f:
        bom = json.load(f)
    top = bom["metadata"]["component"]
except (ValueError, KeyError) as e:
    sys.exit(f"{label}: not a CycloneDX JSON document with a top component ({e!r})")
key_of = {}
for c in [top] + bom.get("components", []):
    key_of[c["bom-ref"]] = (c["name"], c["version"])


def fmt(items, show=12):
    """At most `show` of the items, sorted; (name, version) or edges of them."""
    text = [" -> ".join(f"{n} {v}" for n, v in i) if isinstance(i[0], tuple) else f"{i[0]} {i[1]}"
            for i in sorted(items)]
    more = f" and {len(text) - show} more" if len(text) > show else ""
    return ", ".join(text[:show]) + more


if mode == "generate":
    missing = nodes - set(key_of.values())
    if missing:
        problems.append(f"cargo-cyclonedx did not list crates of the tree: {fmt(missing)}")
    bom.pop("serialNumber", None)
    bom["metadata"].pop("timestamp", None)
    bom["components"] = sorted(
        (c for c in bom["components"] if key_of[c["bom-ref"]] in nodes),
        key=lambda c: c["bom-ref"],
    )
    deps = []
    for d in bom.get("dependencies", []):
        if key_of.get(d["ref"]) not in nodes:
            continue
        on = [r for r in d.get("dependsOn", []) if (key_of[d["ref"]], key_of.get(r)) in edges]
        d = {k: v for k, v in d.items() if k != "dependsOn"}
        deps.append({**d, "dependsOn": sorted(on)} if on else d)  # leaves: none, as cargo-cyclonedx writes them
    bom["dependencies"] = sorted(deps, key=lambda d: d["ref"])
    # The checkout's path, in the bom-refs of the workspace's own packages.
    text = json.dumps(bom, indent=2, ensure_ascii=False) + "\n"
    text = text.replace(f'"path+file://{copy_root}', f'"path+file://{src_root}')
    if copy_root in text:
        problems.append(f"the SBOM still names the temporary checkout {copy_root}")
    if not problems:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text)
else:
    with open("Cargo.toml", "rb") as f:
        version = tomllib.load(f)["workspace"]["package"]["version"]
    if (top.get("name"), top.get("version")) != ("gpujob-operator", version):
        problems.append(
            f"the top component is {top.get('name')} {top.get('version')}, "
            f"not gpujob-operator {version} (the workspace's version)"
        )
    if top.get("type") != "application":
        problems.append(f"the top component's type is {top.get('type')}, not application")
    listed = [key_of[c["bom-ref"]] for c in bom.get("components", [])]
    have = set(listed) | {key_of[top["bom-ref"]]}
    if len(listed) != len(set(listed)) or len(key_of) != 1 + len(listed):
        problems.append("a component or bom-ref is listed twice")
    if nodes - have:
        problems.append(f"crates of the binary missing from the components: {fmt(nodes - have)}")
    if have - nodes:
        problems.append(f"components the binary does not contain: {fmt(have - nodes)}")
    have_edges, unknown = set(), set()
    for d in bom.get("dependencies", []):
        unknown |= {r for r in [d["ref"]] + d.get("dependsOn", []) if r not in key_of}
        if d["ref"] in key_of:
            have_edges |= {(key_of[d["ref"]], key_of[r]) for r in d.get("dependsOn", []) if r in key_of}
    if unknown:
        problems.append(f"the dependencies name refs that are no component: {', '.join(sorted(unknown)[:12])}")
    if edges - have_edges:
        problems.append(f"dependency edges missing: {fmt(edges - have_edges)}")
    if have_edges - edges:
        problems.append(f"dependency edges the build does not have: {fmt(have_edges - edges)}")
    if not problems:
        print(f"{label}: gpujob-operator {version}, {len(listed)} components, "
              f"{len(have_edges)} dependency edges, as cargo tree shows them", file=sys.stderr)

if problems:
    print(f"{label}:\n  " + "\n  ".join(problems), file=sys.stderr)
    sys.exit(1)
PY
}

sbom_py generate "cargo-cyclonedx's SBOM" "$raw" "$fresh"
sbom_py validate "the regenerated SBOM" "$fresh"

if [[ "$mode" == write ]]; then
  mkdir -p "$(dirname "$sbom")"
  cp "$fresh" "$sbom"
  echo "wrote $sbom" >&2
  exit 0
fi

status=0
if [[ ! -f "$sbom" ]]; then
  echo "$sbom is missing: run scripts/sbom.sh" >&2
  exit 1
fi
sbom_py validate "$sbom" "$sbom" || status=1
if ! diff -u "$sbom" "$fresh" >"$work/diff"; then
  head -n 40 "$work/diff" >&2
  echo "the SBOM is stale: run scripts/sbom.sh (and commit $sbom)" >&2
  status=1
fi
exit "$status"
