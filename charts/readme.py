#!/usr/bin/env python3
"""The chart's README.md, made from values.yaml and values.schema.json.

Every value in values.yaml has a `# --` comment above it (lines before the `# --` are
notes for readers of values.yaml only). A documented map is one row, its default the
whole map; an undocumented map is looked into. A value without a description fails.
`python3 charts/readme.py` writes charts/gpujob-operator/README.md; `--check FILE`
writes FILE instead (charts/check.sh compares it with the committed README).
"""
import json, re, sys
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parent / "gpujob-operator"

INTRO = """\
# gpujob-operator

{description}

The same install as `deploy/` (kustomize): `tests/integration/install.rs` renders both with
their defaults and compares the objects. [docs/install.md](../../docs/install.md) explains the
choices (certificates, monitoring, namespaced mode, several installs, Argo CD, upgrading the
API). Kubernetes `{kube}`; chart and operator version {version}.

<!-- Made by charts/readme.py from values.yaml and values.schema.json: edit those, then run
     `python3 charts/readme.py`. charts/check.sh fails when this file is not current. -->

## Install

```sh
kubectl create namespace gpujob-system
kubectl label namespace gpujob-system pod-security.kubernetes.io/enforce=restricted
helm install gpujob-operator charts/gpujob-operator -n gpujob-system \\
  --set image.repository=registry.internal.example/platform/gpujob-operator \\
  --set image.digest=sha256:<the digest your registry printed on push> \\
  --set webhook.certManager.enabled=true          # where cert-manager runs; else scripts/webhook-cert.sh
helm upgrade gpujob-operator charts/gpujob-operator -n gpujob-system --reuse-values
# a newer chart: --reset-then-reuse-values (its new values' defaults, then yours)
helm uninstall gpujob-operator -n gpujob-system   # keeps the CRD, its roles and every GpuJob
```

`values.schema.json` checks every value's type and shape: helm refuses a wrong one, or an
unknown key, naming the field.

An external GPU quota service (docs/quota-api.md), its token from a Secret and its CA from a
ConfigMap, both mounted:

```sh
helm upgrade gpujob-operator charts/gpujob-operator -n gpujob-system --reuse-values \\
  --set quota.provider=http --set quota.url=https://quota.internal.example \\
  --set quota.tokenSecret.name=gpu-quota-token --set quota.caConfigMap.name=gpu-quota-ca
```

## Values

| Key | Type | Default | Description |
|-----|------|---------|-------------|
"""

KEY = re.compile(r"^(\s*)([A-Za-z_][A-Za-z0-9_.-]*):(\s|$)")


def described(lines):
    """(path, description) of every value with a `# --` comment, in file order, and the
    paths of values with none."""
    rows, missing, stack, comment = [], [], [], None
    skip_below = None  # indent under which lines belong to a documented value
    for line in lines:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if skip_below is not None:
            if stripped and indent <= skip_below:
                skip_below = None
            else:
                continue
        if not stripped:
            comment = None
            continue
        if stripped.startswith("#"):
            text = stripped[1:].strip()
            if stripped.startswith("# --"):
                comment = [stripped[4:].strip()]
            elif comment is not None:
                comment.append(text)
            continue
        m = KEY.match(line)
        if not m or stripped.startswith("-"):
            comment = None
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [m.group(2)])
        if comment is not None:
            rows.append((path, " ".join(comment).strip()))
            skip_below = indent
        else:
            rows.append((path, None))
        stack.append((indent, m.group(2)))
        comment = None
    return rows


def lookup(values, path):
    for part in path.split("."):
        values = values[part]
    return values


def schema_type(schema, path):
    node = schema
    for part in path.split("."):
        node = node.get("properties", {}).get(part)
        if node is None:
            return None
        while "$ref" in node:
            node = schema["definitions"][node["$ref"].rsplit("/", 1)[1]]
    if "type" in node:
        t = node["type"]
        return " or ".join(t) if isinstance(t, list) else t
    if "oneOf" in node:
        return " or ".join(o["type"] for o in node["oneOf"])
    return None


def default(value):
    if value == "" or value is None:
        return '`""`' if value == "" else "`null`"
    return "`" + json.dumps(value, separators=(", ", ": ")).replace("|", "\\|") + "`"


def main():
    values_text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(values_text)
    schema = json.loads((CHART / "values.schema.json").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    problems, table = [], []
    rows = described(values_text.splitlines())
    documented = {p for p, d in rows if d}
    for path, description in rows:
        value = lookup(values, path)
        if description is None:
            if isinstance(value, dict) and value:
                continue  # looked into: its values have rows of their own
            problems.append(f"values.yaml: {path} has no '# --' description")
            continue
        if not description:
            problems.append(f"values.yaml: {path} has an empty description")
        kind = schema_type(schema, path)
        if kind is None:
            problems.append(f"values.schema.json: no type for {path}")
        cell = description.replace("|", "\\|")
        table.append(f"| `{path}` | {kind} | {default(value)} | {cell} |")
    # A map left undocumented must have documented values under it.
    for path, description in rows:
        value = lookup(values, path)
        if description is None and isinstance(value, dict) and value:
            if not any(p.startswith(path + ".") for p in documented):
                problems.append(f"values.yaml: {path} has no description and none of its values has")
    if problems:
        print("\n".join(problems), file=sys.stderr)
        sys.exit(1)
    text = INTRO.format(description=" ".join(chart["description"].split()),
                        kube=chart.get("kubeVersion", "any"), version=chart["version"])
    text += "\n".join(table) + "\n"
    out = Path(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[1] == "--check" else CHART / "README.md"
    out.write_text(text)


if __name__ == "__main__":
    main()
