{{- define "herald.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "herald.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
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
{{- $ref := printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- with .Values.image.digest }}{{ $ref = printf "%s@%s" $ref . }}{{ end -}}
{{- $ref -}}
{{- end -}}

{{- define "herald.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "herald.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{/* The Secret the pods read: the existing one, or the chart's (which needs a JWT secret). */}}
{{- define "herald.secretName" -}}
{{- if .Values.secrets.existingSecret -}}
{{- .Values.secrets.existingSecret -}}
{{- else -}}
{{- if not .Values.secrets.jwtSecret -}}
{{- fail "secrets.jwtSecret is required (at least 16 bytes, e.g. `openssl rand -hex 32`), or set secrets.existingSecret to a Secret with keys jwt-secret, mysql-url and redis-url. The chart does not generate one: a generated secret would change on every render and log every user out." -}}
{{- end -}}
{{- if lt (len .Values.secrets.jwtSecret) 16 -}}
{{- fail "secrets.jwtSecret must be at least 16 bytes" -}}
{{- end -}}
{{- printf "%s-secrets" (include "herald.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Pod annotations: what rolls the pods when configuration or the chart's Secret changes. */}}
{{- define "herald.podAnnotations" -}}
checksum/config: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
{{- if not .Values.secrets.existingSecret }}
checksum/secret: {{ include (print .Template.BasePath "/secret.yaml") . | sha256sum }}
{{- end }}
{{- with .Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Pod spec fields every Herald pod shares. */}}
{{- define "herald.podCommon" -}}
serviceAccountName: {{ include "herald.serviceAccountName" . }}
automountServiceAccountToken: {{ .Values.serviceAccount.automountServiceAccountToken }}
# Service links would inject variables such as HERALD_*_SERVICE_HOST that Herald
# reads as (unknown) settings.
enableServiceLinks: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
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
- name: HERALD_MYSQL_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "herald.secretName" . }}
      key: mysql-url
- name: HERALD_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "herald.secretName" . }}
      key: redis-url
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Topology spread of one component: call with (dict "ctx" . "component" "gateway" "own" list). */}}
{{- define "herald.topologySpread" -}}
{{- if .own -}}
topologySpreadConstraints:
  {{- toYaml .own | nindent 2 }}
{{- else if .ctx.Values.topologySpread.enabled -}}
topologySpreadConstraints:
{{- range .ctx.Values.topologySpread.topologyKeys }}
  - maxSkew: {{ $.ctx.Values.topologySpread.maxSkew }}
    topologyKey: {{ . }}
    whenUnsatisfiable: {{ $.ctx.Values.topologySpread.whenUnsatisfiable }}
    labelSelector:
      matchLabels:
        {{- include "herald.selector" (dict "ctx" $.ctx "component" $.component) | nindent 8 }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* A PodDisruptionBudget's budget: maxUnavailable when set, else minAvailable. */}}
{{- define "herald.pdbBudget" -}}
{{- if ne (toString .maxUnavailable) "" -}}
maxUnavailable: {{ .maxUnavailable }}
{{- else -}}
minAvailable: {{ .minAvailable }}
{{- end -}}
{{- end -}}
