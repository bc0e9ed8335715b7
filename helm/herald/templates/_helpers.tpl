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

{{/* Labels of every resource's metadata (never of a pod template: they change with each
     chart version, and a pod template that changes restarts every pod). Call with the
     root context, or (dict "ctx" . "component" "gateway") for a component's. */}}
{{- define "herald.labels" -}}
{{- $ctx := .ctx | default . -}}
app.kubernetes.io/name: {{ include "herald.name" $ctx }}
app.kubernetes.io/instance: {{ $ctx.Release.Name }}
app.kubernetes.io/version: {{ $ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $ctx.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" $ctx.Chart.Name $ctx.Chart.Version | replace "+" "_" }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- with $ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The `annotations:` of a resource's metadata, on a line of its own: `extra` (a map),
     then commonAnnotations; nothing when both are empty. Call with (dict "ctx" .
     "extra" map), and "indent" when the metadata is not at 2. */}}
{{- define "herald.annotations" -}}
{{- $all := merge (deepCopy (.extra | default dict)) (deepCopy (.ctx.Values.commonAnnotations | default dict)) -}}
{{- $n := .indent | default 2 -}}
{{- with $all -}}
{{ "annotations:" | nindent $n }}
{{- toYaml . | nindent (add $n 2 | int) }}
{{- end -}}
{{- end -}}

{{/* Labels of a component's pods: its selector labels and the user's own (commonLabels,
     podLabels, <component>.podLabels), nothing that changes with the chart's version.
     Call with (dict "ctx" . "component" "gateway" "own" .Values.gateway.podLabels). */}}
{{- define "herald.podLabels" -}}
{{- include "herald.selector" . }}
{{- $user := merge (deepCopy (.own | default dict)) (deepCopy (.ctx.Values.podLabels | default dict)) (deepCopy (.ctx.Values.commonLabels | default dict)) }}
{{- with omit $user "app.kubernetes.io/name" "app.kubernetes.io/instance" "app.kubernetes.io/component" }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: call with (dict "ctx" . "component" "gateway"). */}}
{{- define "herald.selector" -}}
app.kubernetes.io/name: {{ include "herald.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The image: [registry/]repository:tag[@digest]; global.imageRegistry wins over
     image.registry (the convention of umbrella charts that mirror every image). */}}
{{- define "herald.image" -}}
{{- $registry := (.Values.global).imageRegistry | default .Values.image.registry -}}
{{- $repo := .Values.image.repository -}}
{{- with $registry }}{{ $repo = printf "%s/%s" (trimSuffix "/" .) $repo }}{{ end -}}
{{- $ref := printf "%s:%s" $repo (.Values.image.tag | default .Chart.AppVersion) -}}
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

{{/* Which processes read a HERALD_<key> setting (README.md's "used by" column; the chart
     test checks every key of that table against this): gateway, worker or both. */}}
{{- define "herald.readers" -}}
{{- $parts := splitList "__" . -}}
{{- $section := ternary (first $parts) "" (gt (len $parts) 1) -}}
{{- if or (has $section (list "GATEWAY" "AUTH")) (has . (list "SERVICE_SECRET" "LISTEN")) -}}
gateway
{{- else if and (eq $section "WORKER") (eq (last $parts) "PENDING_CAP") -}}
{{- /* The deprecated name of delivery.pending_cap, which both read. */ -}}
both
{{- else if or (has $section (list "WORKER" "OUTBOX" "PUSH")) (eq . "ADMIN_TOKEN") -}}
worker
{{- else -}}
both
{{- end -}}
{{- end -}}

{{/* The settings (ConfigMap data) one component reads: call with (dict "ctx" . "component"
     "gateway") or "worker" (which the migrations Job reads too). Sorted, so the checksum
     of a component changes only when one of its own settings does. */}}
{{- define "herald.configData" -}}
{{- $v := .ctx.Values -}}
{{- $data := dict "HERALD_REDIS_KEY_PREFIX" $v.redis.keyPrefix "HERALD_INGRESS__SHARDS" (toString $v.ingressShards) -}}
{{- $_ := set $data "HERALD_LOG" $v.log.level -}}
{{- $_ := set $data "HERALD_LOG_FORMAT" $v.log.format -}}
{{- /* Traces: set only when on, so the default render carries no otel setting. */ -}}
{{- with $v.otel -}}
{{- if .endpoint -}}
{{- $_ := set $data "HERALD_OTEL__ENDPOINT" .endpoint -}}
{{- $_ := set $data "HERALD_OTEL__SAMPLE_RATIO" (toString .sampleRatio) -}}
{{- if .serviceName -}}
{{- $_ := set $data "HERALD_OTEL__SERVICE_NAME" .serviceName -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if eq .component "gateway" -}}
{{- $_ := set $data "HERALD_GATEWAY__REQUIRE_NOEVICTION" (toString $v.redis.requireNoeviction) -}}
{{- $_ := set $data "HERALD_GATEWAY__DRAIN_MS" (toString (mul $v.gateway.drainSeconds 1000)) -}}
{{- $_ := set $data "HERALD_GATEWAY__TRUSTED_PROXIES" (join "," $v.gateway.trustedProxies) -}}
{{- else -}}
{{- /* Workers migrate at start only when the chart runs no migrations Job. */ -}}
{{- $_ := set $data "HERALD_WORKER__MIGRATE_ON_START" (toString (eq $v.migrations.mode "none")) -}}
{{- end -}}
{{- range $key, $value := $v.config -}}
{{- $readers := include "herald.readers" $key -}}
{{- if or (eq $readers "both") (eq $readers $.component) -}}
{{- $_ := set $data (printf "HERALD_%s" $key) (toString $value) -}}
{{- end -}}
{{- end -}}
{{- toYaml $data -}}
{{- end -}}

{{/* The chart Secret's keys one component reads, for its checksum: gateway (jwt-secret,
     mysql-url, redis-url), worker (and admin-token) or probe (jwt-secret). */}}
{{- define "herald.secretData" -}}
{{- $v := .ctx.Values -}}
{{- $data := dict "jwt-secret" $v.secrets.jwtSecret -}}
{{- if ne .component "probe" -}}
{{- $_ := set $data "mysql-url" $v.mysql.url -}}
{{- $_ := set $data "redis-url" $v.redis.url -}}
{{- end -}}
{{- if eq .component "worker" -}}
{{- $_ := set $data "admin-token" $v.secrets.adminToken -}}
{{- end -}}
{{- toYaml $data -}}
{{- end -}}

{{/* Annotations of a component's pods: the checksums of what it reads (so a change of a
     setting or credential restarts only the pods that read it), podAnnotations and the
     component's own. Call with (dict "ctx" . "component" "gateway" "own" map). */}}
{{- define "herald.podAnnotations" -}}
{{- $v := .ctx.Values -}}
{{- $all := dict -}}
{{- if has .component (list "gateway" "worker") -}}
{{- $_ := set $all "checksum/config" (include "herald.configData" . | sha256sum) -}}
{{- end -}}
{{- if and (not $v.secrets.existingSecret) (has .component (list "gateway" "worker" "probe")) -}}
{{- $_ := set $all "checksum/secret" (include "herald.secretData" . | sha256sum) -}}
{{- end -}}
{{- $all = merge (deepCopy (.own | default dict)) (deepCopy ($v.podAnnotations | default dict)) $all -}}
{{- $n := .indent | default 6 -}}
{{- with $all -}}
{{ "annotations:" | nindent $n }}
{{- toYaml . | nindent (add $n 2 | int) }}
{{- end -}}
{{- end -}}

{{/* The pull secrets: global.imagePullSecrets and imagePullSecrets. */}}
{{- define "herald.imagePullSecrets" -}}
{{- $all := concat ((.Values.global).imagePullSecrets | default list) (.Values.imagePullSecrets | default list) -}}
{{- with $all }}
imagePullSecrets:
{{- range . }}
  - name: {{ if kindIs "string" . }}{{ . }}{{ else }}{{ .name }}{{ end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Pod spec fields every Herald pod shares. */}}
{{- define "herald.podCommon" -}}
{{- $ctx := .ctx | default . -}}
{{- with $ctx -}}
serviceAccountName: {{ $.serviceAccountName | default (include "herald.serviceAccountName" .) }}
automountServiceAccountToken: {{ .Values.serviceAccount.automountServiceAccountToken }}
# Service links would inject variables such as HERALD_*_SERVICE_HOST that Herald
# reads as (unknown) settings.
enableServiceLinks: false
{{- include "herald.imagePullSecrets" . }}
{{- with .Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
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

{{/* With migrations.mode=argocd the migrations Job is an Argo CD Sync hook in wave -1, so
     what it reads (ConfigMaps, the Secret, the ServiceAccount) goes first, in wave -2. */}}
{{- define "herald.prerequisiteAnnotations" -}}
{{- if eq .Values.migrations.mode "argocd" -}}
argocd.argoproj.io/sync-wave: "-2"
{{- end -}}
{{- end -}}

{{/* The spec of the migrations Job (its name in `job` mode is this text's hash). */}}
{{- define "herald.migrationsSpec" -}}
{{- $m := .Values.migrations -}}
{{- $hook := eq $m.mode "hook" -}}
backoffLimit: {{ $m.backoffLimit }}
{{- with $m.activeDeadlineSeconds }}
activeDeadlineSeconds: {{ . }}
{{- end }}
{{- with $m.ttlSecondsAfterFinished }}
ttlSecondsAfterFinished: {{ . }}
{{- end }}
template:
  metadata:
    labels:
      {{- include "herald.podLabels" (dict "ctx" . "component" "migrations") | nindent 6 }}
    {{- include "herald.podAnnotations" (dict "ctx" . "component" "migrations" "own" $m.podAnnotations "indent" 4) }}
  spec:
    restartPolicy: Never
    {{- /* A Helm hook runs before the chart's ServiceAccount exists. */}}
    {{- $sa := ternary (ternary "default" (include "herald.serviceAccountName" .) .Values.serviceAccount.create) "" $hook }}
    {{- include "herald.podCommon" (dict "ctx" . "serviceAccountName" $sa) | nindent 4 }}
    containers:
      - name: migrate
        image: {{ include "herald.image" . }}
        imagePullPolicy: {{ .Values.image.pullPolicy }}
        command: ["/usr/local/bin/herald-worker", "migrate"]
        env:
          {{- include "herald.env" . | nindent 10 }}
          {{- with $m.extraEnv }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
        {{- /* A Helm hook runs before the ConfigMap exists. */}}
        {{- $envFrom := .Values.extraEnvFrom }}
        {{- if not $hook }}
        {{- $envFrom = prepend $envFrom (dict "configMapRef" (dict "name" (printf "%s-worker-config" (include "herald.fullname" .)))) }}
        {{- end }}
        {{- with $envFrom }}
        envFrom:
          {{- toYaml . | nindent 10 }}
        {{- end }}
        resources:
          {{- toYaml $m.resources | nindent 10 }}
        {{- with .Values.securityContext }}
        securityContext:
          {{- toYaml . | nindent 10 }}
        {{- end }}
        {{- $tlsMounts := include "herald.tlsVolumeMounts" (dict "ctx" $ "component" "migrations") | trim }}
        {{- with $tlsMounts }}
        volumeMounts:
          {{- . | nindent 10 }}
        {{- end }}
    {{- $tlsVolumes := include "herald.tlsVolumes" (dict "ctx" $ "component" "migrations") | trim }}
    {{- with $tlsVolumes }}
    volumes:
      {{- . | nindent 6 }}
    {{- end }}
{{- end -}}

{{/*
The probe's credentials: the two probe accounts' tokens from probe.tokensSecret (keys
`<prefix>token-a`, `<prefix>token-b`; the test's accounts are other accounts than the
probe's), acting in the probe tenant only; else the JWT secret. Call with (dict "ctx" .
"prefix" "" or "test-").
*/}}
{{- define "herald.probeCredentials" -}}
{{- $v := .ctx.Values -}}
{{- if $v.probe.tokensSecret }}
- name: PROBE_TOKEN_A
  valueFrom:
    secretKeyRef:
      name: {{ $v.probe.tokensSecret }}
      key: {{ .prefix }}token-a
- name: PROBE_TOKEN_B
  valueFrom:
    secretKeyRef:
      name: {{ $v.probe.tokensSecret }}
      key: {{ .prefix }}token-b
{{- else }}
- name: HERALD_JWT_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ include "herald.secretName" .ctx }}
      key: jwt-secret
{{- end }}
{{- end }}
