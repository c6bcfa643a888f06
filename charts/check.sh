#!/usr/bin/env bash
# The Helm chart: `helm lint --strict` and `helm template` with the defaults and with
# every optional part on (tests/integration/install.rs then compares what it renders with deploy/
# and dry-runs it against the API server); names of the longest release names; several
# releases side by side; and deploy/'s monitoring and secure-metrics components in either
# order. Needs helm 4: $GPUJOB_HELM, or scripts/helm.sh provides it (built once from the
# Go module, cached), kubectl with kustomize v5, and python3.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
helm="${GPUJOB_HELM:-$(scripts/helm.sh)}"
chart=charts/gpujob-operator
home="$(mktemp -d)"
trap 'rm -rf "$home"' EXIT
# No machine-wide helm configuration, repositories or plugins are read.
export HELM_CONFIG_HOME="$home/config" HELM_CACHE_HOME="$home/cache" HELM_DATA_HOME="$home/data"

everything=(--set webhook.certManager.enabled=true --set monitoring.enabled=true
  --set metrics.secure=true --set monitoring.labels.release=kube-prometheus-stack
  --set priorityClassName=system-cluster-critical)
for values in "defaults" "everything"; do
  if [[ "$values" == defaults ]]; then set -- ; else set -- "${everything[@]}"; fi
  echo "== helm lint --strict ($values)"
  "$helm" lint --strict "$chart" --namespace gpujob-system "$@"
  echo "== helm template ($values)"
  objects="$("$helm" template gpujob-operator "$chart" --namespace gpujob-system "$@" | grep -c '^kind: ')"
  echo "  OK: $objects objects"
done
# The chart's version is the operator's (app.kubernetes.io/version on every object).
crate="$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)"
for field in version appVersion; do
  got="$(sed -n "s/^$field: \"\{0,1\}\([^\"]*\)\"\{0,1\}$/\1/p" "$chart/Chart.yaml")"
  [[ "$got" == "$crate" ]] || { echo "$chart/Chart.yaml $field is $got, Cargo.toml says $crate" >&2; exit 1; }
done
echo "  OK: Chart.yaml version and appVersion are $crate, as Cargo.toml"

# The chart's README is made from values.yaml and the schema: every value described, current.
echo "== chart README"
python3 charts/readme.py --check "$home/README.md"
if ! cmp -s "$home/README.md" "$chart/README.md"; then
  diff "$chart/README.md" "$home/README.md" >&2 || true
  echo "$chart/README.md is not current: run python3 charts/readme.py to update it" >&2
  exit 1
fi
echo "  OK: every value has a description and $chart/README.md is current"

# Several installs side by side, and names of any length. A Python check of rendered
# objects, read as JSON lines: helm converts its own output (fromYaml, toJson in a chart
# of one template), so nothing but helm and python3 is needed.
tojson="$home/to-json"
mkdir -p "$tojson/templates" "$tojson/files"
printf 'apiVersion: v2\nname: to-json\nversion: 0.0.0\n' >"$tojson/Chart.yaml"
cat >"$tojson/templates/objects.yaml" <<'TPL'
{{- range splitList "\n---" (.Files.Get "files/objects.yaml") }}
{{- with fromYaml . }}
{{ toJson . }}
{{- end }}
{{- end }}
TPL
# render NAME RELEASE NAMESPACE [--set ...]: the chart's objects, as $home/NAME.json.
render() {
  local name="$1" release="$2" namespace="$3"
  shift 3
  "$helm" template "$release" "$chart" --namespace "$namespace" "$@" >"$tojson/files/objects.yaml"
  "$helm" template to-json "$tojson" | grep '^{' >"$home/$name.json"
}
all=(--set webhook.certManager.enabled=true --set monitoring.enabled=true --set metrics.secure=true)
long="$(printf 'x%.0s' {1..52})"                   # with one more character: 53, Helm's limit
long_ns="$(printf 'n%.0s' {1..63})"                # the longest namespace name
render defaults gpujob-operator gpujob-system
render long-cluster "${long}a" gpujob-system "${all[@]}"
render long-named "gpujob-operator-${long:16}b" "$long_ns" "${all[@]}" --set watchNamespace=team-a
# Two namespaced releases in one namespace (the second without the CRD: one per cluster).
render one-ns-a team-a platform "${all[@]}" --set watchNamespace=team-a
render one-ns-b team-b platform "${all[@]}" --set watchNamespace=team-b --set crds.install=false
# The same release name in two namespaces, namespaced, with secure metrics.
render two-ns-a gpujob-operator team-a-ops "${all[@]}" --set watchNamespace=team-a
render two-ns-b gpujob-operator team-b-ops "${all[@]}" --set watchNamespace=team-b --set crds.install=false
# Two 53-character names that differ only in their last character, in one namespace:
# every name cut before that character tells them apart by its hash alone.
render long-a "gpujob-operator-${long:16}a" platform "${all[@]}" --set watchNamespace=team-a
render long-b "gpujob-operator-${long:16}b" platform "${all[@]}" --set watchNamespace=team-b --set crds.install=false
# Two cluster-wide releases in one namespace: their names do not clash (running both is
# what docs/install.md, "Several installs", rules out: both would act on every GpuJob).
render cluster-a first gpujob-system --set webhook.certManager.enabled=true --set monitoring.enabled=true
render cluster-b second gpujob-system --set webhook.certManager.enabled=true --set monitoring.enabled=true --set crds.install=false
# A second release watching team-a: it shares the Role gpujob-operator there with the
# first, which is how Helm refuses it.
render same-watch-b other team-b-ops --set watchNamespace=team-a --set crds.install=false
# The values teams stack and extend with: each one rendered, checked below (values).
cat >"$home/extras.yaml" <<'YAML'
extraVolumes:
  - name: metrics-cert
    secret: {secretName: my-metrics-cert}
extraVolumeMounts:
  - {name: metrics-cert, mountPath: /etc/gpujob-operator/metrics-cert, readOnly: true}
extraObjects:
  - apiVersion: v1
    kind: ConfigMap
    metadata: {name: "{{ .Release.Name }}-extra", namespace: "{{ .Release.Namespace }}"}
    data: {a: b}
  - |
    apiVersion: v1
    kind: ConfigMap
    metadata:
      name: {{ .Release.Name }}-extra-text
livenessProbe: {initialDelaySeconds: 5, periodSeconds: 7, timeoutSeconds: 3, failureThreshold: 4}
readinessProbe: {periodSeconds: 9, successThreshold: 2}
updateStrategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 1, maxSurge: 0}}
networkPolicy:
  extraIngress:
    - from: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: audit}}}]
      ports: [{port: metrics, protocol: TCP}]
  extraEgress:
    - to: [{ipBlock: {cidr: 10.20.0.0/16}}]
      ports: [{port: 8443, protocol: TCP}]
YAML
render v-sa gpujob-operator gpujob-system --set serviceAccount.create=false --set serviceAccount.name=platform-gpujob
render v-rbac gpujob-operator gpujob-system "${all[@]}" --set rbac.create=false
render v-rbac-ns gpujob-operator gpujob-system "${all[@]}" --set rbac.create=false --set watchNamespace=team-a
render v-labels gpujob-operator gpujob-system "${all[@]}" --set commonLabels.team=ml --set commonLabels.cost-center=gpu
render v-extras gpujob-operator gpujob-system -f "$home/extras.yaml"
render v-podmonitor gpujob-operator gpujob-system "${all[@]}" --set monitoring.kind=PodMonitor
render v-quota gpujob-operator gpujob-system --set quota.provider=http \
  --set quota.url=https://quota.internal.example --set quota.tokenSecret.name=quota-token \
  --set quota.caConfigMap.name=quota-ca --set quota.caConfigMap.key=bundle.pem \
  --set quota.timeout=5s --set quota.cleanupTimeout=30m --set leaderElection.leaseDuration=30s \
  --set leaderElection.renewDeadline=20s --set leaderElection.retryPeriod=4s
echo "== recutInterval as --set gives it (0 arrives as a number)"
for v in 0 30s; do
  out="$("$helm" template gpujob-operator "$chart" --set "recutInterval=$v")"
  grep -q -- "- --recut-interval=$v\$" <<<"$out" || { echo "--set recutInterval=$v: no --recut-interval=$v in the Deployment" >&2; exit 1; }
  echo "  OK: --set recutInterval=$v renders --recut-interval=$v"
done
if "$helm" template gpujob-operator "$chart" | grep -q -- "--recut-interval"; then
  echo "recutInterval empty: a --recut-interval flag rendered all the same" >&2; exit 1
fi
echo "== values refused by the templates"
for refused in "quota.provider=http" "commonLabels.app\\.kubernetes\\.io/name=x"; do
  if out="$("$helm" template gpujob-operator "$chart" --set "$refused" 2>&1)"; then
    echo "helm template --set $refused renders: a mistake let through" >&2; exit 1
  fi
  grep -qE "quota.url|commonLabels" <<<"$out" || { echo "--set $refused: the error names no value: $out" >&2; exit 1; }
  echo "  OK: --set $refused is refused, naming the value"
done
# deploy/: the monitoring and secure-metrics components give the same objects in either
# order (secure-metrics first once left the ServiceMonitor on HTTP against an HTTPS port),
# also moved and renamed; and the ServiceMonitor then scrapes HTTPS with the scraper's
# token. kubectl kustomize takes relative paths only.
echo "== deploy/: components in either order"
overlay() {
  local dir="$home/overlay-$1" up
  shift
  mkdir -p "$dir"
  up="$(realpath --relative-to="$dir" "$root/deploy")"
  {
    printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n'
    printf '%b\n' "$*" | sed "s#{deploy}#$up#g"
  } >"$dir/kustomization.yaml"
  kubectl kustomize "$dir" >"$dir.yaml"
  cp "$dir.yaml" "$tojson/files/objects.yaml"
  "$helm" template to-json "$tojson" | grep '^{' >"$home/kustomize-$(basename "$dir").json"
}
overlay crd 'resources: [{deploy}/crd]'
moved='namespace: team-gpu\nnamePrefix: team-\ntransformers: [{deploy}/wiring]'
overlay plain-1 'resources: [{deploy}/operator]\ncomponents: [{deploy}/monitoring, {deploy}/secure-metrics]'
overlay plain-2 'resources: [{deploy}/operator]\ncomponents: [{deploy}/secure-metrics, {deploy}/monitoring]'
overlay moved-1 "resources: [{deploy}]\ncomponents: [{deploy}/cert-manager, {deploy}/monitoring, {deploy}/secure-metrics]\n$moved"
overlay moved-2 "resources: [{deploy}]\ncomponents: [{deploy}/secure-metrics, {deploy}/cert-manager, {deploy}/monitoring]\n$moved"
for pair in plain moved; do
  if ! cmp -s "$home/overlay-$pair-1.yaml" "$home/overlay-$pair-2.yaml"; then
    diff "$home/overlay-$pair-1.yaml" "$home/overlay-$pair-2.yaml" >&2 || true
    echo "deploy/ renders other objects with secure-metrics before monitoring ($pair)" >&2
    exit 1
  fi
done
echo "  OK: the same objects in either order, in place and moved"

python3 - "$home" <<'PY'
import json, re, sys
home = sys.argv[1]
def load(name):
    with open(f"{home}/{name}.json") as f:
        return [json.loads(line) for line in f]
problems, reported = [], 0
def problem(what): problems.append(what)
def report(ok):
    """OK when no problem was found since the last report."""
    global reported
    print(f"  OK: {ok}" if len(problems) == reported else f"  FAILED: {ok}")
    reported = len(problems)
LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")                # DNS-1123 label
SERVICE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")                  # DNS-1035 label
VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")  # label value
def key(o): return (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"])
def deployment(objs): return next(o for o in objs if o["kind"] == "Deployment")
def lease(objs):
    args = deployment(objs)["spec"]["template"]["spec"]["containers"][0]["args"]
    names = [a.split("=", 1)[1] for a in args if a.startswith("--lease-name=")]
    names += [value for flag, value in zip(args, args[1:]) if flag == "--lease-name"]
    return names[0] if len(names) == 1 else None
def names_valid(render):
    objs = load(render)
    for o in objs:
        kind, ns, name = key(o)
        if kind == "CustomResourceDefinition":
            continue                                  # <plural>.<group>, a DNS subdomain
        pattern = SERVICE if kind == "Service" else LABEL
        if len(name) > 63 or not pattern.match(name):
            problem(f"{render}: {kind} {name!r} ({len(name)} characters) is no valid name")
        for k, v in o["metadata"].get("labels", {}).items():
            if len(v) > 63 or not VALUE.match(v):
                problem(f"{render}: {kind} {name}: label {k}={v!r} is no label value")
        if kind == "Certificate":
            spec = o["spec"]
            for dns in spec.get("dnsNames", []):
                if any(len(part) > 63 for part in dns.split(".")):
                    problem(f"{render}: Certificate {name}: DNS name {dns} has a label over 63")
            if len(spec.get("commonName", "")) > 64:
                problem(f"{render}: Certificate {name}: commonName over 64 characters")
            if len(spec["secretName"]) > 63:
                problem(f"{render}: Certificate {name}: secretName {spec['secretName']} over 63")
    # The Lease names the operator makes of --lease-name: the name is a label value of
    # every one of them (gpujob.dev/lease-group), and the longest, <lease>-member-<pod>,
    # a DNS subdomain (a pod's name is at most 63 characters).
    name = lease(objs)
    if name is None or len(name) > 63 or not LABEL.match(name):
        problem(f"{render}: --lease-name {name!r} is no label value")
    elif len(f"{name}-member-{'p' * 63}") > 253:
        problem(f"{render}: member Leases of {name} would be over 253 characters")
    for v in deployment(objs)["spec"]["template"]["spec"]["volumes"]:
        secret = v.get("secret", {}).get("secretName", "")
        if len(secret) > 63:
            problem(f"{render}: the Deployment mounts Secret {secret}, over 63 characters")
    report(f"{render}: every name fits")
def selects(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())
def selectors(objs):
    """(what, selector, what it selects) of every selector of the install: pods, or (a
    ServiceMonitor's) metrics Services."""
    for o in objs:
        spec, what = o.get("spec", {}), f"{o['kind']} {o['metadata']['name']}"
        if o["kind"] == "Service":
            yield what, spec["selector"], "pods"
        elif o["kind"] == "PodDisruptionBudget":
            yield what, spec["selector"]["matchLabels"], "pods"
        elif o["kind"] == "NetworkPolicy":
            yield what, spec["podSelector"]["matchLabels"], "pods"
        elif o["kind"] == "ServiceMonitor":
            yield what, spec["selector"]["matchLabels"], "services"
def side_by_side(a, b):
    objs = {r: load(r) for r in (a, b)}
    shared = {key(o) for o in objs[a]} & {key(o) for o in objs[b]}
    for kind, ns, name in sorted(shared):
        problem(f"{a} and {b} both render {kind} {ns + '/' if ns else ''}{name}")
    ns = {r: deployment(objs[r])["metadata"]["namespace"] for r in objs}
    if ns[a] == ns[b] and lease(objs[a]) == lease(objs[b]):
        problem(f"{a} and {b} share the Lease {ns[a]}/{lease(objs[a])}")
    pods = {r: [deployment(objs[r])["spec"]["template"]["metadata"]["labels"]] for r in objs}
    services = {r: [s["metadata"]["labels"] for s in objs[r] if s["kind"] == "Service"
                    and any(p["name"] == "metrics" for p in s["spec"]["ports"])] for r in objs}
    for this, other in ((a, b), (b, a)):
        for what, selector, selected in selectors(objs[this]):
            of = pods if selected == "pods" else services
            if not any(selects(selector, labels) for labels in of[this]):
                problem(f"{this}: {what} does not select its own {selected}")
            if ns[a] == ns[b] and any(selects(selector, labels) for labels in of[other]):
                problem(f"{this}: {what} also selects the {selected} of {other}")
    report(f"{a} and {b} share no name, Lease or selected pod")
def scrapes_https(render):
    """The ServiceMonitor scrapes HTTPS with the token of this install's scraper."""
    objs = load(render)
    find = lambda kind, name: next((o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name), None)
    monitor = next(o for o in objs if o["kind"] == "ServiceMonitor")
    endpoint = monitor["spec"]["endpoints"][0]
    secret = find("Secret", endpoint.get("authorization", {}).get("credentials", {}).get("name"))
    if endpoint["scheme"] != "https" or "bearerTokenFile" in endpoint or secret is None:
        problem(f"{render}: the ServiceMonitor scrapes {endpoint['scheme']} with no scraper token: {endpoint}")
    elif find("ServiceAccount", secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]) is None:
        problem(f"{render}: the scraper token's Secret names no service account of the install")
    services = [o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == monitor["metadata"]["name"]]
    if [p.get("appProtocol") for s in services for p in s["spec"]["ports"]] != ["https"]:
        problem(f"{render}: the metrics Service does not say https")
    report(f"{render}: the ServiceMonitor scrapes HTTPS with the scraper's token")
# Argo CD keeps what Helm keeps only when told so: the CRD (deleting it deletes every
# GpuJob) and its roles, of the chart and of deploy/crd.
print("== kept by Argo CD too")
for render in ("defaults", "kustomize-overlay-crd"):
    kept = [o for o in load(render) if o["kind"] == "CustomResourceDefinition"
            or o["metadata"].get("annotations", {}).get("helm.sh/resource-policy") == "keep"]
    for o in kept:
        options = o["metadata"].get("annotations", {}).get("argocd.argoproj.io/sync-options", "")
        if not {"Delete=false", "Prune=false"} <= {x.strip() for x in options.split(",")}:
            problem(f"{render}: {o['kind']} {o['metadata']['name']} lacks argocd.argoproj.io/sync-options: Delete=false,Prune=false")
    if not kept:
        problem(f"{render}: no CRD")
    report(f"{render}: the CRD and its roles say Delete=false,Prune=false to Argo CD")
print("== secure metrics scraped over HTTPS (deploy/ with secure-metrics listed first, the chart)")
for render in ("kustomize-overlay-plain-2", "kustomize-overlay-moved-2", "long-cluster", "two-ns-b"):
    scrapes_https(render)
print("== names of 53-character releases (and the longest namespace), cluster-wide and namespaced")
for render in ("long-cluster", "long-named", "one-ns-a", "two-ns-a"):
    names_valid(render)
print("== several installs: in one namespace, under one name in two, cluster-wide")
for a, b in (("one-ns-a", "one-ns-b"), ("two-ns-a", "two-ns-b"), ("long-a", "long-b"),
             ("cluster-a", "cluster-b")):
    side_by_side(a, b)
# The Role in the watched namespace is the lock of that namespace.
def roles(render):
    return {key(o) for o in load(render)
            if o["kind"] in ("Role", "RoleBinding") and o["metadata"]["namespace"] == "team-a"}
if not roles("two-ns-a") & roles("same-watch-b"):
    problem("two releases watching team-a share no Role there: nothing refuses the second")
report("two releases watching one namespace share its Role there (Helm refuses the second)")
print("== values: each reaches its object")
def pod_spec(objs): return deployment(objs)["spec"]["template"]["spec"]
def container(objs): return pod_spec(objs)["containers"][0]
RBAC = ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")
objs = load("v-sa")
if [o for o in objs if o["kind"] == "ServiceAccount"]:
    problem("serviceAccount.create=false: a ServiceAccount is rendered")
if pod_spec(objs).get("serviceAccountName") != "platform-gpujob":
    problem(f"serviceAccount.name: the pods run as {pod_spec(objs).get('serviceAccountName')}")
for o in objs:
    for s in o.get("subjects", []):
        if s["kind"] == "ServiceAccount" and s["name"] != "platform-gpujob":
            problem(f"serviceAccount.name: {o['kind']} {o['metadata']['name']} binds {s['name']}")
if not [o for o in objs if o["kind"] == "ClusterRoleBinding"]:
    problem("serviceAccount.create=false: the operator's roles are not bound")
report("serviceAccount.create=false, .name: no ServiceAccount; the pods and bindings use the name")
for render in ("v-rbac", "v-rbac-ns"):
    objs = load(render)
    made = [f"{o['kind']} {o['metadata']['name']}" for o in objs if o["kind"] in RBAC]
    if made:
        problem(f"{render}: rbac.create=false renders {made}")
    if not [o for o in objs if o["kind"] == "ServiceAccount"]:
        problem(f"{render}: rbac.create=false drops the service accounts too")
    report(f"{render}: rbac.create=false renders no Role, ClusterRole or binding")
objs = load("v-labels")
for o in objs + [deployment(objs)["spec"]["template"]]:
    labels = o["metadata"].get("labels", {})
    if labels.get("team") != "ml" or labels.get("cost-center") != "gpu":
        problem(f"commonLabels: {o.get('kind', 'pod template')} {o['metadata'].get('name', '')} lacks them")
sels = [(w, s) for w, s, _ in selectors(objs)] + [("Deployment", deployment(objs)["spec"]["selector"]["matchLabels"])]
sels += [(f"{o['kind']}", o["spec"]["selector"]["matchLabels"]) for o in objs if o["kind"] == "PodMonitor"]
for what, selector in sels:
    if "team" in selector or "cost-center" in selector:
        problem(f"commonLabels: in the selector of {what}")
report(f"commonLabels on all {len(objs)} objects and the pods, in no selector")
objs = load("v-extras")
pod, c = pod_spec(objs), container(objs)
if {"name": "metrics-cert", "secret": {"secretName": "my-metrics-cert"}} not in pod["volumes"]:
    problem(f"extraVolumes: not in the pods' volumes {pod['volumes']}")
if not any(m["name"] == "metrics-cert" and m["mountPath"] == "/etc/gpujob-operator/metrics-cert" for m in c["volumeMounts"]):
    problem(f"extraVolumeMounts: not in the container's {c['volumeMounts']}")
names = {o["metadata"]["name"] for o in objs if o["kind"] == "ConfigMap"}
if not {"gpujob-operator-extra", "gpujob-operator-extra-text"} <= names:
    problem(f"extraObjects (a map and a string, through tpl): ConfigMaps rendered are {names}")
live, ready = c["livenessProbe"], c["readinessProbe"]
want_live = {"initialDelaySeconds": 5, "periodSeconds": 7, "timeoutSeconds": 3, "failureThreshold": 4}
if {k: live.get(k) for k in want_live} != want_live or live["httpGet"]["path"] != "/healthz":
    problem(f"livenessProbe: {live}")
if ready.get("periodSeconds") != 9 or ready.get("successThreshold") != 2 or ready["httpGet"]["path"] != "/readyz":
    problem(f"readinessProbe: {ready}")
strategy = deployment(objs)["spec"].get("strategy")
if strategy != {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}:
    problem(f"updateStrategy: the Deployment's strategy is {strategy}")
policy = next(o for o in objs if o["kind"] == "NetworkPolicy")["spec"]
if len(policy["ingress"]) != 3 or policy["ingress"][-1]["from"][0]["namespaceSelector"]["matchLabels"] != {"kubernetes.io/metadata.name": "audit"}:
    problem(f"networkPolicy.extraIngress: not appended: {policy['ingress']}")
if len(policy["egress"]) != 3 or policy["egress"][-1]["to"] != [{"ipBlock": {"cidr": "10.20.0.0/16"}}]:
    problem(f"networkPolicy.extraEgress: not appended: {policy['egress']}")
report("extraVolumes, extraVolumeMounts, extraObjects, probes, updateStrategy, networkPolicy extra rules")
objs = load("v-podmonitor")
monitors = [o for o in objs if o["kind"] in ("ServiceMonitor", "PodMonitor")]
if [o["kind"] for o in monitors] != ["PodMonitor"]:
    problem(f"monitoring.kind=PodMonitor renders {[o['kind'] for o in monitors]}")
else:
    spec = monitors[0]["spec"]
    endpoint = spec["podMetricsEndpoints"][0]
    token = endpoint.get("authorization", {}).get("credentials", {}).get("name")
    if endpoint.get("scheme") != "https" or endpoint.get("port") != "metrics" or token not in {
            o["metadata"]["name"] for o in objs if o["kind"] == "Secret"}:
        problem(f"PodMonitor: not the ServiceMonitor's secure endpoint: {endpoint}")
    if not selects(spec["selector"]["matchLabels"], deployment(objs)["spec"]["template"]["metadata"]["labels"]):
        problem("PodMonitor: does not select the operator's pods")
    if spec.get("jobLabel") != "app.kubernetes.io/name":
        problem("PodMonitor: the scrape job is not named gpujob-operator (jobLabel)")
    # The alerts group by (namespace, service); a ServiceMonitor's targets get the metrics
    # Service's name as service, so a PodMonitor's must be given the same.
    metrics_service = [o["metadata"]["name"] for o in objs if o["kind"] == "Service"
                       and any(p.get("name") == "metrics" for p in o["spec"]["ports"])]
    relabel = [r for r in endpoint.get("relabelings", []) if r.get("targetLabel") == "service"]
    if [r.get("replacement") for r in relabel] != metrics_service:
        problem(f"PodMonitor: targets not labelled service={metrics_service} as a ServiceMonitor's are: {relabel}")
report("monitoring.kind=PodMonitor: a PodMonitor of the pods, HTTPS with the scraper's token, no ServiceMonitor")
objs = load("v-quota")
args, c, pod = container(objs)["args"], container(objs), pod_spec(objs)
want = ["--quota-provider=http", "--quota-url=https://quota.internal.example",
        "--quota-token-file=/etc/gpujob-operator/quota-token/token",
        "--quota-ca-file=/etc/gpujob-operator/quota-ca/bundle.pem", "--quota-timeout=5s",
        "--cleanup-timeout=30m", "--lease-duration=30s", "--renew-deadline=20s", "--retry-period=4s"]
for flag in want:
    if flag not in args:
        problem(f"quota or leaderElection values: {flag} not in the operator's args {args}")
volumes = {v["name"]: v for v in pod["volumes"]}
for flag, source in (("--quota-token-file=", ("secret", "secretName", "quota-token")),
                     ("--quota-ca-file=", ("configMap", "name", "quota-ca"))):
    path = next((a[len(flag):] for a in args if a.startswith(flag)), "")
    mount = next((m for m in c["volumeMounts"] if path.startswith(m["mountPath"] + "/")), None)
    kind, field, name = source
    if mount is None or volumes.get(mount["name"], {}).get(kind, {}).get(field) != name:
        problem(f"{flag}{path}: no mount of the {kind} {name} there")
    elif volumes[mount["name"]][kind]["items"][0]["path"] != path.rsplit("/", 1)[1]:
        problem(f"{flag}{path}: the {kind} {name} is mounted under other file names")
# The operator's run accepts every flag the chart renders (src/cli.rs: --a-b is the field a_b).
cli = open("src/cli.rs").read()
for render in ("v-quota", "defaults", "v-extras"):
    for arg in container(load(render))["args"][1:]:
        field = arg.split("=", 1)[0].removeprefix("--").replace("-", "_")
        if not re.search(rf"\bpub {field}:", cli):
            problem(f"{render}: {arg.split('=', 1)[0]} is no flag of gpujob-operator run (src/cli.rs)")
report("quota and leaderElection values: the flags (known to src/cli.rs), the token Secret and CA ConfigMap mounted")
if problems:
    print("\n".join(problems), file=sys.stderr)
    sys.exit(1)
PY
