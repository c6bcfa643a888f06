{{/*
Names. The namespaced objects and the operator's ClusterRole are named after the
release ("gpujob-operator" when the release name holds it). The selector label
app.kubernetes.io/name is always gpujob-operator: the ServiceMonitor names the scrape
job after it (jobLabel), and every alert and the dashboard select job="gpujob-operator".
*/}}
{{- define "gpujob-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gpujob-operator.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{- define "gpujob-operator.webhookSecret" -}}
{{- default (printf "%s-webhook-tls" (include "gpujob-operator.fullname" .)) .Values.webhook.secretName -}}
{{- end -}}

{{- define "gpujob-operator.selectorLabels" -}}
app.kubernetes.io/name: gpujob-operator
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
{{- end -}}

{{/* The monitoring objects carry no version (as deploy/monitoring). */}}
{{- define "gpujob-operator.monitoringLabels" -}}
{{ include "gpujob-operator.selectorLabels" . }}
app.kubernetes.io/component: monitoring
app.kubernetes.io/part-of: gpujob-operator
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "gpujob-operator.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}
