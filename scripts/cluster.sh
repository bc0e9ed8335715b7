#!/usr/bin/env bash
# Starts and stops the processes of a local Herald (one worker, two gateways); sourced
# by scripts/run.sh, scripts/capacity.sh and scripts/node.sh. Ports, database and
# Redis prefix come from the environment so that a capacity run can sit beside a
# running scripts/run.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/services.sh

# The release binaries cargo builds (its target directory, `CARGO_TARGET_DIR` if set).
HD_BIN=${HD_BIN:-${CARGO_TARGET_DIR:-target}/release}
HD_DATABASE=${HD_DATABASE:-herald}
HD_GW1_PORT=${HD_GW1_PORT:-8080}
HD_GW2_PORT=${HD_GW2_PORT:-8081}
HD_GW1_ADMIN=${HD_GW1_ADMIN:-9090}
HD_WK1_ADMIN=${HD_WK1_ADMIN:-9091}
HD_GW2_ADMIN=${HD_GW2_ADMIN:-9092}
# A third gateway, started only by what needs one (capacity.sh's `sessions`).
HD_GW3_PORT=${HD_GW3_PORT:-8082}
HD_GW3_ADMIN=${HD_GW3_ADMIN:-9093}
HD_LOGS="$HD_STATE_DIR/logs"
HD_PIDS="$HD_STATE_DIR/pids"
mkdir -p "$HD_LOGS" "$HD_PIDS"

# Secrets are made once per machine and kept in the state folder, never in code.
cluster_env() {
  local secret_file="$HD_STATE_DIR/jwt-secret" admin_file="$HD_STATE_DIR/admin-token"
  [ -s "$secret_file" ] || head -c 32 /dev/urandom | base64 | tr -d '/+=' > "$secret_file"
  [ -s "$admin_file" ] || head -c 24 /dev/urandom | base64 | tr -d '/+=' > "$admin_file"
  export HERALD_JWT_SECRET=${HERALD_JWT_SECRET:-$(cat "$secret_file")}
  export HERALD_ADMIN_TOKEN=${HERALD_ADMIN_TOKEN:-$(cat "$admin_file")}
  export HERALD_MYSQL_URL=${HERALD_MYSQL_URL:-$HD_MYSQL_ROOT_URL/$HD_DATABASE}
  export HERALD_REDIS_URL=${HERALD_REDIS_URL:-redis://127.0.0.1:6379/0}
}

admin_port() {
  case "$1" in
    wk-1) echo "$HD_WK1_ADMIN" ;;
    gw-1) echo "$HD_GW1_ADMIN" ;;
    gw-2) echo "$HD_GW2_ADMIN" ;;
    gw-3) echo "$HD_GW3_ADMIN" ;;
    *) log "unknown node $1 (wk-1, gw-1, gw-2, gw-3)"; return 2 ;;
  esac
}

# start_node NAME: starts wk-1, gw-1, gw-2 or gw-3 in the background; its pid goes to
# $HD_PIDS/NAME.pid and its log to $HD_LOGS/NAME.log.
start_node() {
  local name=$1 admin
  admin=$(admin_port "$name")
  case "$name" in
    wk-1) HERALD_NODE_ID=wk-1 HERALD_ADMIN_LISTEN=127.0.0.1:$admin "$HD_BIN/herald-worker" >>"$HD_LOGS/$name.log" 2>&1 & ;;
    gw-1) HERALD_NODE_ID=gw-1 HERALD_LISTEN=127.0.0.1:$HD_GW1_PORT HERALD_ADMIN_LISTEN=127.0.0.1:$admin "$HD_BIN/herald-gateway" >>"$HD_LOGS/$name.log" 2>&1 & ;;
    gw-2) HERALD_NODE_ID=gw-2 HERALD_LISTEN=127.0.0.1:$HD_GW2_PORT HERALD_ADMIN_LISTEN=127.0.0.1:$admin "$HD_BIN/herald-gateway" >>"$HD_LOGS/$name.log" 2>&1 & ;;
    gw-3) HERALD_NODE_ID=gw-3 HERALD_LISTEN=127.0.0.1:$HD_GW3_PORT HERALD_ADMIN_LISTEN=127.0.0.1:$admin "$HD_BIN/herald-gateway" >>"$HD_LOGS/$name.log" 2>&1 & ;;
  esac
  echo $! > "$HD_PIDS/$name.pid"
}

node_pid() { cat "$HD_PIDS/$1.pid"; }

# wait_ready NAME: until the node's /readyz answers (20 s).
wait_ready() {
  local port
  port=$(admin_port "$1")
  for _ in $(seq 100); do
    curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  log "$1 is not ready; see $HD_LOGS/$1.log"
  return 1
}

# kill_node NAME [SIGNAL]: signals the node (KILL by default) and waits for it to go.
kill_node() {
  local pid
  pid=$(node_pid "$1")
  kill -"${2:-KILL}" "$pid" 2>/dev/null || true
  for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
  log "$1 ($pid) did not exit"
  return 1
}
