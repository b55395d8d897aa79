{{/* The release's full name: the prefix of every object the chart creates. */}}
{{- define "spillway.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/*
Labels that select the operator's pods. The component tells them apart from
the drainer pods the operator creates, which are also app.kubernetes.io/name=spillway.
*/}}
{{- define "spillway.selectorLabels" -}}
app.kubernetes.io/name: spillway
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* Labels of every object the chart creates, besides those naming what it is. */}}
{{- define "spillway.releaseLabels" -}}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Labels of the operator's objects. */}}
{{- define "spillway.labels" -}}
{{ include "spillway.selectorLabels" . }}
{{ include "spillway.releaseLabels" . }}
{{- end -}}

{{/* Labels of the helm test hook's objects. */}}
{{- define "spillway.testLabels" -}}
app.kubernetes.io/name: spillway
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: test
{{ include "spillway.releaseLabels" . }}
{{- end -}}

{{- define "spillway.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "spillway.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "spillway.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Fleets run the operator's own image unless told otherwise. */}}
{{- define "spillway.drainerImage" -}}
{{- default (include "spillway.image" .) .Values.drainerImage -}}
{{- end -}}

{{/*
What the controller does to OutboxDrainers and their children, and to
OutboxReplays: a ClusterRole's rules, or each watched namespace's Role's.
*/}}
{{- define "spillway.operatorRules" -}}
- apiGroups: [""]
  resources: [pods, secrets]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [serviceaccounts, services]
  verbs: [create, get, list, patch, watch]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [create, get, list, patch, watch]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [create, delete, get, list, patch, watch]
- apiGroups: [spillway.io]
  resources: [outboxdrainers, outboxreplays]
  verbs: [get, list, watch]
- apiGroups: [spillway.io]
  resources: [outboxdrainers/finalizers]
  verbs: [update]
- apiGroups: [spillway.io]
  resources: [outboxdrainers/status]
  verbs: [get, update]
- apiGroups: [spillway.io]
  resources: [outboxreplays/status]
  verbs: [get, patch]
{{- end -}}
