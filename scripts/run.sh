#!/usr/bin/env bash
# Runs a local Herald: MariaDB and Redis (installed and started if missing), the
# schema, one worker and two gateways. Ctrl-C stops them.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/services.sh
ensure_mariadb
ensure_redis

secret_file="$HD_STATE_DIR/jwt-secret"
admin_file="$HD_STATE_DIR/admin-token"
[ -s "$secret_file" ] || head -c 32 /dev/urandom | base64 | tr -d '/+=' > "$secret_file"
[ -s "$admin_file" ] || head -c 24 /dev/urandom | base64 | tr -d '/+=' > "$admin_file"
export HERALD_JWT_SECRET=${HERALD_JWT_SECRET:-$(cat "$secret_file")}
export HERALD_ADMIN_TOKEN=${HERALD_ADMIN_TOKEN:-$(cat "$admin_file")}
export HERALD_MYSQL_URL=${HERALD_MYSQL_URL:-$HD_MYSQL_ROOT_URL/herald}
export HERALD_REDIS_URL=${HERALD_REDIS_URL:-redis://127.0.0.1:6379/0}

log "building (release)"
cargo build --release --bins -q
bin=target/release
log "applying migrations"
$bin/herald-worker migrate

pids=()
stop() {
  log "stopping"
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap stop EXIT INT TERM
logs="$HD_STATE_DIR/logs"
mkdir -p "$logs"
HERALD_NODE_ID=wk-1 HERALD_ADMIN_LISTEN=127.0.0.1:9091 $bin/herald-worker >"$logs/wk-1.log" 2>&1 & pids+=($!)
HERALD_NODE_ID=gw-1 HERALD_LISTEN=127.0.0.1:8080 HERALD_ADMIN_LISTEN=127.0.0.1:9090 $bin/herald-gateway >"$logs/gw-1.log" 2>&1 & pids+=($!)
HERALD_NODE_ID=gw-2 HERALD_LISTEN=127.0.0.1:8081 HERALD_ADMIN_LISTEN=127.0.0.1:9092 $bin/herald-gateway >"$logs/gw-2.log" 2>&1 & pids+=($!)

for port in 9091 9090 9092; do
  for _ in $(seq 100); do
    curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
    sleep 0.2
  done
  curl -fs "http://127.0.0.1:$port/readyz" >/dev/null || { log "process with admin port $port is not ready; see $logs"; exit 1; }
done
cat >&2 <<INFO

Herald is running.
  gateways     http://127.0.0.1:8080  http://127.0.0.1:8081   (ops: :9090 :9092)
  worker ops   http://127.0.0.1:9091   (admin token in $admin_file)
  logs         $logs
  a token      TOKEN=\$($bin/herald-loadtest token --secret "\$(cat $secret_file)" --tenant acme --user alice --device phone)
  try          curl -H "Authorization: Bearer \$TOKEN" -d '{"kind":"group","members":["alice","bob"]}' http://127.0.0.1:8080/v1/conversations

Ctrl-C stops it.
INFO
wait -n "${pids[@]}"
log "a process exited; see $logs"
