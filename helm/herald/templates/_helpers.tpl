{{- define "herald.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "herald.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "herald.labels" -}}
app.kubernetes.io/name: {{ include "herald.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: call with (dict "ctx" . "component" "gateway"). */}}
{{- define "herald.selector" -}}
app.kubernetes.io/name: {{ include "herald.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "herald.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "herald.secretName" -}}
{{- .Values.secrets.existingSecret | default (printf "%s-secrets" (include "herald.fullname" .)) -}}
{{- end -}}

{{/* The environment every Herald process shares. */}}
{{- define "herald.env" -}}
- name: HERALD_NODE_ID
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: HERALD_JWT_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ include "herald.secretName" . }}
      key: jwt-secret
- name: HERALD_ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "herald.secretName" . }}
      key: admin-token
- name: HERALD_MYSQL_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "herald.secretName" . }}
      key: mysql-url
{{- end -}}

{{/* Preferred spreading of one component's pods over nodes. */}}
{{- define "herald.antiAffinity" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "herald.selector" . | nindent 12 }}
{{- end -}}
