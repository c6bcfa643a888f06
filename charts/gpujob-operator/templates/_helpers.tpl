{{/*
Names. Every object is named after the release ("gpujob-operator" when the release name
holds it), so several releases never share a name, a selector or a Lease. The label
app.kubernetes.io/name is always gpujob-operator: the ServiceMonitor names the scrape
job after it (jobLabel), and every alert and the dashboard select job="gpujob-operator";
selectors add app.kubernetes.io/instance (the release), except the Deployment's, which
is immutable (see selectorLabels).

Names are cut to 63 characters, the limit of a Service's name and of a label value (the
operator writes its Lease name into one): a name that would be longer keeps its start
and ends in 8 characters of the SHA-256 of the whole base name, then its suffix
(`-webhook`, `-lease`, ...), so two long release names never meet in one cut name. A
name that fits is left as it is (names of existing installs do not change).
*/}}

{{/* The name every object's name starts from, uncut. */}}
{{- define "gpujob-operator.base" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name -}}
{{- end -}}
{{- end -}}

{{/* (list base suffix): base+suffix, or cut to 63 characters with a hash of base. */}}
{{- define "gpujob-operator.cut" -}}
{{- $base := index . 0 -}}
{{- $suffix := index . 1 -}}
{{- $name := printf "%s%s" $base $suffix -}}
{{- if le (len $name) 63 -}}
{{- $name -}}
{{- else -}}
{{- printf "%s-%s%s" (trunc (int (sub 54 (len $suffix))) $base | trimSuffix "-") (sha256sum $base | trunc 8) $suffix -}}
{{- end -}}
{{- end -}}

{{/*
The release's name for its objects. Refused, with the reason, when it cannot name a
Service (a DNS-1035 label: lowercase letters, digits and '-', starting with a letter;
Helm allows release names with dots or a leading digit), or when it is the name of
another release's Lease (see leaseName).
*/}}
{{- define "gpujob-operator.fullname" -}}
{{- $name := include "gpujob-operator.cut" (list (include "gpujob-operator.base" .) "") -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $name) -}}
{{- fail (printf "the objects would be named %q, which is no Service name (lowercase letters, digits and '-', starting with a letter): choose another release name or set fullnameOverride" $name) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{/* (list . suffix): the name of one of the release's objects, `<fullname><suffix>`, cut. */}}
{{- define "gpujob-operator.name" -}}
{{- $root := index . 0 -}}
{{- $_ := include "gpujob-operator.fullname" $root -}}
{{- include "gpujob-operator.cut" (list (include "gpujob-operator.base" $root) (index . 1)) -}}
{{- end -}}

{{/*
(list . suffix): the name of a cluster-scoped object of the release. In cluster mode it
is the install's only one (two would both act on every GpuJob), named as its namespaced
objects are, as deploy/ names it. In namespaced mode several releases run, under the
same release name in different namespaces too: the namespace is part of the name.
*/}}
{{- define "gpujob-operator.clusterName" -}}
{{- $root := index . 0 -}}
{{- if $root.Values.watchNamespace -}}
{{- $_ := include "gpujob-operator.fullname" $root -}}
{{- include "gpujob-operator.cut" (list (printf "%s-%s" (include "gpujob-operator.base" $root) (include "gpujob-operator.namespace" $root)) (index . 1)) -}}
{{- else -}}
{{- include "gpujob-operator.name" . -}}
{{- end -}}
{{- end -}}

{{/*
--lease-name: the Lease (with shards, the prefix of <lease>-shard-<i>, <lease>-shard-map
and <lease>-member-<pod>), in the release's namespace. leaseName if set; else the name a
running Deployment of this release uses (its --lease-name, or the operator's default,
gpujob-operator, without one: releases installed before the chart passed the flag keep
their Lease, since replicas under two Lease names would both act during the rollout);
else, on a first install, the release's fullname. `helm template` (and tools that render
with it, such as Argo CD) cannot look: there it is always the fullname (docs/install.md,
"Several installs"). Refused when it ends as another release's shard Lease would.
*/}}
{{- define "gpujob-operator.leaseName" -}}
{{- $lease := include "gpujob-operator.fullname" . -}}
{{- if .Values.leaseName -}}
{{- $lease = .Values.leaseName -}}
{{- else -}}
{{- $running := lookup "apps/v1" "Deployment" (include "gpujob-operator.namespace" .) $lease -}}
{{- if $running -}}
{{- $lease = "gpujob-operator" -}}
{{- range $running.spec.template.spec.containers -}}
{{- if eq .name "operator" -}}
{{- $args := .args | default list -}}
{{- range $i, $arg := $args -}}
{{- if hasPrefix "--lease-name=" $arg -}}
{{- $lease = trimPrefix "--lease-name=" $arg -}}
{{- else if and (eq $arg "--lease-name") (lt (add1 $i) (len $args)) -}}
{{- $lease = index $args (add1 $i) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if regexMatch "-shard-([0-9]+|map)$" $lease -}}
{{- fail (printf "the Lease name %q ends as a shard Lease of a release named %q would: choose another release name, fullnameOverride or leaseName" $lease (regexReplaceAll "-shard-([0-9]+|map)$" $lease "")) -}}
{{- end -}}
{{- $lease -}}
{{- end -}}

{{- define "gpujob-operator.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{- define "gpujob-operator.webhookSecret" -}}
{{- default (include "gpujob-operator.name" (list . "-webhook-tls")) .Values.webhook.secretName -}}
{{- end -}}

{{/*
The CRD's conversion caBundle (base64 of PEM). Without cert-manager it is the ca.crt of
the webhook's serving Secret whenever helm can read it (install, upgrade, a server dry
run): the Secret is then the one place the CA lives, and each upgrade writes what the
last rotation (scripts/webhook-cert.sh) put there. A value would not do: `helm upgrade
--reuse-values` after a rotation wrote the install's webhook.caBundle back, and the API
server then trusted a CA the replicas no longer served, failing every gpujob.dev/v2 read.
webhook.caBundle is the fallback where nothing can look (helm template, Argo CD) or the
Secret holds no ca.crt (made by hand, or by the script before it wrote one). With
cert-manager the CA injector writes the field: the chart writes only webhook.caBundle
(empty by default), as before.
*/}}
{{- define "gpujob-operator.caBundle" -}}
{{- $bundle := .Values.webhook.caBundle -}}
{{- if not .Values.webhook.certManager.enabled -}}
{{- $secret := lookup "v1" "Secret" (include "gpujob-operator.namespace" .) (include "gpujob-operator.webhookSecret" .) -}}
{{- with $secret.data -}}
{{- with index . "ca.crt" -}}
{{- $bundle = . -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $bundle -}}
{{- end -}}

{{/*
The Deployment's selector: immutable, so it stays what every release so far had.
Pods of two releases in one namespace both match it; the Deployment controller keeps
them apart by owner references (each counts only its own ReplicaSets' pods).
*/}}
{{- define "gpujob-operator.selectorLabels" -}}
app.kubernetes.io/name: gpujob-operator
{{- end -}}

{{/*
Every other selector (Services, PodDisruptionBudget, NetworkPolicy, ServiceMonitor):
the release's pods alone, not those of another release in the namespace.
*/}}
{{- define "gpujob-operator.instanceSelectorLabels" -}}
{{ include "gpujob-operator.selectorLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
The recommended labels, as deploy/ sets them, plus Helm's own (helm.sh/chart,
app.kubernetes.io/instance, managed-by Helm). Call with (list . "component").
*/}}
{{- define "gpujob-operator.labels" -}}
{{- $root := index . 0 -}}
{{- $component := index . 1 -}}
{{ include "gpujob-operator.selectorLabels" $root }}
app.kubernetes.io/component: {{ $component }}
app.kubernetes.io/part-of: gpujob-operator
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
helm.sh/chart: {{ printf "%s-%s" $root.Chart.Name $root.Chart.Version | replace "+" "_" }}
{{- with $root.Values.commonLabels }}
{{- range $k, $v := . }}
{{- if regexMatch "^(app\\.kubernetes\\.io|helm\\.sh)/" $k }}
{{- fail (printf "commonLabels: %s is one of the chart's own labels (app.kubernetes.io/*, helm.sh/*): set it another way or drop it" $k) }}
{{- end }}
{{- end }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The monitoring objects carry no version (as deploy/monitoring). */}}
{{- define "gpujob-operator.monitoringLabels" -}}
{{ include "gpujob-operator.selectorLabels" . }}
app.kubernetes.io/component: monitoring
app.kubernetes.io/part-of: gpujob-operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
The operator's service account: serviceAccount.name, or the release's fullname. With
serviceAccount.create=false the chart makes none and binds its roles to this one.
*/}}
{{/*
Cluster-wide, fail when another Helm release's cluster-wide controller binding exists:
two such installs would both write every namespace's GpuJobs, each on Leases of its own.
A binding is this release's own when its release name and namespace are this one's (an
upgrade that renames the objects is not refused); one of the same name but another
release is another's. Found by lookup, so it holds for helm install and upgrade against
a cluster (whoever installs cluster-wide may list ClusterRoleBindings), not for helm
template or Argo CD. A kustomize install (managed-by kustomize) or a namespaced release
beside this one is not found: docs/install.md, "Several installs", says what overlaps.
*/}}
{{- define "gpujob-operator.oneClusterWide" -}}
{{- $release := .Release.Name -}}
{{- $namespace := .Release.Namespace -}}
{{- $bindings := lookup "rbac.authorization.k8s.io/v1" "ClusterRoleBinding" "" "" -}}
{{- range ($bindings.items | default list) -}}
{{- $labels := .metadata.labels | default dict -}}
{{- $annotations := .metadata.annotations | default dict -}}
{{- $controller := and (eq (get $labels "app.kubernetes.io/part-of") "gpujob-operator") (eq (get $labels "app.kubernetes.io/component") "controller") (eq (get $labels "app.kubernetes.io/managed-by") "Helm") -}}
{{- /* The operator's own binding: named as its ClusterRole; secure metrics' are too, by suffix. */ -}}
{{- $operator := and (eq .roleRef.name .metadata.name) (not (regexMatch "-metrics-(auth|scraper)$" .metadata.name)) -}}
{{- $own := and (eq (get $labels "app.kubernetes.io/instance") $release) (eq (get $annotations "meta.helm.sh/release-namespace") $namespace) -}}
{{- if and $controller $operator (not $own) -}}
{{- $sa := first (.subjects | default (list dict)) | default dict -}}
{{- fail (printf "another gpujob-operator release acts on every namespace already: ClusterRoleBinding %s of release %q in namespace %q (service account %s/%s). Two would both write every GpuJob, each on Leases of its own: uninstall that one, or install this one for one namespace (watchNamespace)" .metadata.name (get $labels "app.kubernetes.io/instance") (get $annotations "meta.helm.sh/release-namespace") (get $sa "namespace") (get $sa "name")) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpujob-operator.serviceAccountName" -}}
{{- default (include "gpujob-operator.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* A probe's timings, in the order deploy/ writes them; unset ones are left out. */}}
{{- define "gpujob-operator.probeSettings" -}}
{{- range $k := list "initialDelaySeconds" "periodSeconds" "timeoutSeconds" "successThreshold" "failureThreshold" -}}
{{- if hasKey $ $k }}
{{ $k }}: {{ get $ $k }}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpujob-operator.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}
