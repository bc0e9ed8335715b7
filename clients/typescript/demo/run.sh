#!/usr/bin/env bash
# Runs a local Herald (one worker, two gateways on :8080 and :8081, debug build) and
# the demo page on http://127.0.0.1:5173 with its dev-only token endpoint on (see
# tokens.ts). Open two tabs: each is a device. Ctrl-C stops everything.
set -euo pipefail
# Its own database and Redis prefix, apart from scripts/run.sh's.
HD_DATABASE=${HD_DATABASE:-herald_demo}
export HERALD_REDIS_KEY_PREFIX=${HERALD_REDIS_KEY_PREFIX:-demo}
source "$(dirname "$0")/../../../scripts/cluster.sh" # moves to the repository root
ensure_mariadb
ensure_redis
ensure_node
cluster_env
port=${DEMO_PORT:-5173}
# The page calls the HTTP API from its own origin.
export HERALD_GATEWAY__CORS_ORIGINS="http://127.0.0.1:$port,http://localhost:$port"

log "building"
cargo build --bins -q
HD_BIN="$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/debug"
log "applying migrations"
"$HD_BIN/herald-worker" migrate

stop() {
  for n in gw-1 gw-2 wk-1; do kill "$(node_pid $n)" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop EXIT INT TERM
for n in wk-1 gw-1 gw-2; do start_node $n; done
for n in wk-1 gw-1 gw-2; do wait_ready $n || exit 1; done

cd clients/typescript
[ -d node_modules ] || npm ci --no-audit --no-fund --loglevel=error
log "Herald is running (logs in $HD_LOGS); the demo: http://127.0.0.1:$port/?user=alice"
DEMO_TOKENS=1 DEMO_PORT=$port \
  DEMO_GATEWAYS="http://127.0.0.1:$HD_GW1_PORT,http://127.0.0.1:$HD_GW2_PORT" \
  npx vite --config demo/vite.config.ts --clearScreen false
