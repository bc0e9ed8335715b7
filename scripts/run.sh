#!/usr/bin/env bash
# Runs a local Herald: MariaDB and Redis (installed and started if missing), the
# schema, one worker and two gateways. Ctrl-C stops them.
set -euo pipefail
source "$(dirname "$0")/cluster.sh"
ensure_mariadb
ensure_redis
cluster_env

log "building (release)"
cargo build --release --bins -q
bin=$HD_BIN
log "applying migrations"
$bin/herald-worker migrate

stop() {
  log "stopping"
  for n in gw-1 gw-2 wk-1; do kill "$(node_pid $n)" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop EXIT INT TERM
for n in wk-1 gw-1 gw-2; do start_node $n; done
for n in wk-1 gw-1 gw-2; do wait_ready $n || exit 1; done
secret_file="$HD_STATE_DIR/jwt-secret"
admin_file="$HD_STATE_DIR/admin-token"
logs=$HD_LOGS
cat >&2 <<INFO

Herald is running.
  gateways     http://127.0.0.1:8080  http://127.0.0.1:8081   (ops: :9090 :9092)
  worker ops   http://127.0.0.1:9091   (admin token in $admin_file)
  logs         $logs
  a token      TOKEN=\$($bin/herald-loadtest token --secret "\$(cat $secret_file)" --tenant acme --user alice --device phone)
  try          curl -H "Authorization: Bearer \$TOKEN" -d '{"kind":"group","members":["alice","bob"]}' http://127.0.0.1:8080/v1/conversations

Ctrl-C stops it.
INFO
# Until Ctrl-C, or until a node exits (scripts/node.sh may restart one meanwhile).
while sleep 1; do
  for n in wk-1 gw-1 gw-2; do
    kill -0 "$(node_pid $n)" 2>/dev/null || { sleep 3; kill -0 "$(node_pid $n)" 2>/dev/null || { log "$n exited; see $logs"; exit 1; }; }
  done
done
