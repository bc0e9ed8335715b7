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
{{- include "herald.redisTlsEnv" . }}
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

{{/* TLS files: every Secret is mounted read-only under /etc/herald/tls, at paths that do
     not depend on the Secret's key names (docs/operations.md, "TLS"). */}}

{{/* The gateway's certificate Secret when gateway TLS is on, else empty. */}}
{{- define "herald.gatewayTlsSecret" -}}
{{- if .Values.gateway.tls.enabled -}}
{{- if not .Values.gateway.tls.existingSecret -}}
{{- fail "gateway.tls.enabled needs gateway.tls.existingSecret: a kubernetes.io/tls Secret with tls.crt and tls.key (cert-manager's, for instance). The chart does not create certificates." -}}
{{- end -}}
{{- .Values.gateway.tls.existingSecret -}}
{{- end -}}
{{- end -}}

{{/* The gateway's URL inside the cluster, for the probe and the helm test: with gateway TLS
     the name the certificate must carry. */}}
{{- define "herald.gatewayUrl" -}}
{{- if include "herald.gatewayTlsSecret" . -}}
{{- printf "https://%s-gateway.%s.svc:%v" (include "herald.fullname" .) .Release.Namespace .Values.gateway.service.port -}}
{{- else -}}
{{- printf "http://%s-gateway:%v" (include "herald.fullname" .) .Values.gateway.service.port -}}
{{- end -}}
{{- end -}}

{{/* The CA file the probe and the helm test trust for the gateway, when one is mounted. */}}
{{- define "herald.gatewayCaFile" -}}
{{- if and (include "herald.gatewayTlsSecret" .) .Values.gateway.tls.caKey -}}
/etc/herald/tls/gateway-ca/ca.crt
{{- end -}}
{{- end -}}

{{/* TLS environment of the processes that talk to Redis (gateway, worker, migrations). */}}
{{- define "herald.redisTlsEnv" -}}
{{- with .Values.redis.tls.caSecret }}
- name: HERALD_REDIS__TLS_CA_FILE
  value: /etc/herald/tls/redis-ca/ca.crt
{{- end }}
{{- with .Values.redis.tls.clientSecret }}
- name: HERALD_REDIS__TLS_CERT_FILE
  value: /etc/herald/tls/redis-client/tls.crt
- name: HERALD_REDIS__TLS_KEY_FILE
  value: /etc/herald/tls/redis-client/tls.key
{{- end }}
{{- end -}}

{{/* TLS volumes of one pod: call with (dict "ctx" . "component" "gateway"); components
     gateway, worker, migrations (Redis and MySQL) and probe (the gateway's CA). */}}
{{- define "herald.tlsVolumes" -}}
{{- $v := .ctx.Values -}}
{{- if eq .component "probe" -}}
{{- if include "herald.gatewayCaFile" .ctx }}
- name: tls-gateway-ca
  secret:
    secretName: {{ include "herald.gatewayTlsSecret" .ctx }}
    items:
      - {key: {{ $v.gateway.tls.caKey | quote }}, path: ca.crt}
{{- end }}
{{- else -}}
{{- if eq .component "gateway" }}
{{- with include "herald.gatewayTlsSecret" .ctx }}
- name: tls-gateway
  secret:
    secretName: {{ . }}
    items:
      - {key: tls.crt, path: tls.crt}
      - {key: tls.key, path: tls.key}
{{- end }}
{{- end }}
{{- with $v.redis.tls.caSecret }}
- name: tls-redis-ca
  secret:
    secretName: {{ . }}
    items:
      - {key: {{ $v.redis.tls.caKey | quote }}, path: ca.crt}
{{- end }}
{{- with $v.redis.tls.clientSecret }}
- name: tls-redis-client
  secret:
    secretName: {{ . }}
    items:
      - {key: tls.crt, path: tls.crt}
      - {key: tls.key, path: tls.key}
{{- end }}
{{- with $v.mysql.tls.caSecret }}
- name: tls-mysql-ca
  secret:
    secretName: {{ . }}
    items:
      - {key: {{ $v.mysql.tls.caKey | quote }}, path: ca.crt}
{{- end }}
{{- with $v.mysql.tls.clientSecret }}
- name: tls-mysql-client
  secret:
    secretName: {{ . }}
    items:
      - {key: tls.crt, path: tls.crt}
      - {key: tls.key, path: tls.key}
{{- end }}
{{- end -}}
{{- end -}}

{{/* The mounts of herald.tlsVolumes, all read-only; same arguments. */}}
{{- define "herald.tlsVolumeMounts" -}}
{{- $v := .ctx.Values -}}
{{- if eq .component "probe" -}}
{{- if include "herald.gatewayCaFile" .ctx }}
- {name: tls-gateway-ca, mountPath: /etc/herald/tls/gateway-ca, readOnly: true}
{{- end }}
{{- else -}}
{{- if and (eq .component "gateway") (include "herald.gatewayTlsSecret" .ctx) }}
- {name: tls-gateway, mountPath: /etc/herald/tls/gateway, readOnly: true}
{{- end }}
{{- if $v.redis.tls.caSecret }}
- {name: tls-redis-ca, mountPath: /etc/herald/tls/redis-ca, readOnly: true}
{{- end }}
{{- if $v.redis.tls.clientSecret }}
- {name: tls-redis-client, mountPath: /etc/herald/tls/redis-client, readOnly: true}
{{- end }}
{{- if $v.mysql.tls.caSecret }}
- {name: tls-mysql-ca, mountPath: /etc/herald/tls/mysql, readOnly: true}
{{- end }}
{{- if $v.mysql.tls.clientSecret }}
- {name: tls-mysql-client, mountPath: /etc/herald/tls/mysql-client, readOnly: true}
{{- end }}
{{- end -}}
{{- end -}}
