#!/usr/bin/env bash
# Interleaved A/B runs of `steady` between builds, for docs/benchmarks.md: each round
# runs every build once, one after another on this machine (whose speed drifts 20-30 %
# between runs of an hour), through scripts/capacity.sh, and prints one row per run:
# acknowledged rate, send-ack p50/p99, server CPU per message by process, the load-test's,
# and per acknowledged message the Redis commands (INFO commandstats) and MariaDB
# statements, row writes (handler writes, updates, deletes) and fsyncs (SHOW GLOBAL STATUS), and the context
# switches of the gateways and the worker (/proc/PID/status), over the load-test's run.
#
#   scripts/ab.sh NAME=BIN_DIR [NAME=BIN_DIR ...]
#   RATE=5000 ROUNDS=2 DURATION=20 CONVERSATIONS=1000 VIA=http scripts/ab.sh start=/tmp/a now=target/release
#
# Each BIN_DIR holds herald-gateway, herald-worker and herald-loadtest of one build.
# Every run lands in $OUT/NAME-ROUND (default OUT: a new temporary folder); the table in
# $OUT/table.md. Use a quiet machine: MariaDB and Redis are whole processes.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,16p' "$0"; exit 2; }
RATE=${RATE:-5000} ROUNDS=${ROUNDS:-2} DURATION=${DURATION:-20} CONVERSATIONS=${CONVERSATIONS:-1000} VIA=${VIA:-http}
OUT=${OUT:-$(mktemp -d -t herald-ab.XXXX)}
mkdir -p "$OUT"
REDIS_CLI=(redis-cli -u "${HERALD_REDIS_URL:-redis://127.0.0.1:6379/0}")
MARIADB=(mariadb -u root -N -B)

redis_calls() { "${REDIS_CLI[@]}" INFO commandstats | tr -d '\r' | sed -nE 's/^cmdstat_([a-z|]+):calls=([0-9]+).*/\1 \2/p'; }
mysql_status() {
  "${MARIADB[@]}" -e "SHOW GLOBAL STATUS WHERE Variable_name IN ('Questions','Innodb_data_fsyncs','Handler_write','Handler_update','Handler_delete')"
}
switches() { # total voluntary + involuntary context switches of the cluster's gateways and worker
  local total=0 f
  for f in run/capacity/pids/gw-1.pid run/capacity/pids/gw-2.pid run/capacity/pids/wk-1.pid; do
    [ -f "$f" ] || continue
    total=$((total + $(cat "/proc/$(cat "$f")"/task/*/status 2>/dev/null | awk '/ctxt_switches/ { s += $2 } END { print s + 0 }')))
  done
  echo "$total"
}

echo "| run | acknowledged/s | send-ack p50 / p99 ms | server us/msg (gateways, worker, MariaDB, Redis) | load-test us/msg | Redis calls/msg | MariaDB statements, fsyncs, row writes /msg | context switches/msg |" | tee "$OUT/table.md"
echo "|---|---|---|---|---|---|---|---|" | tee -a "$OUT/table.md"
for round in $(seq "$ROUNDS"); do
  for build in "$@"; do
    name=${build%%=*} bin=${build#*=}
    dir=$OUT/$name-$round
    mkdir -p "$dir"
    # The counters are read while the load-test process runs (its setup included).
    ( for _ in $(seq 3000); do pgrep -f "herald-loadtest steady" >/dev/null && break; sleep 0.2; done
      redis_calls >"$dir/redis-before.txt" || true; mysql_status >"$dir/mysql-before.txt" || true
      switches >"$dir/ctx-before.txt" || true
      while pgrep -f "herald-loadtest steady" >/dev/null; do switches >"$dir/ctx-after.txt" || true; sleep 0.2; done
      redis_calls >"$dir/redis-after.txt" || true; mysql_status >"$dir/mysql-after.txt" || true ) &
    watcher=$!
    HD_BIN=$bin OUT=$dir REPORT=$dir/report.md SCENARIOS=steady \
      STEADY_ARGS="--conversations $CONVERSATIONS --rate $RATE --duration $DURATION --via $VIA" \
      scripts/capacity.sh >"$dir/capacity.log" 2>&1 || echo "run $name-$round failed: see $dir/capacity.log"
    wait "$watcher" || true
    python3 - "$dir" "$name-$round" <<'PY' | tee -a "$OUT/table.md"
import json, sys, os
d, name = sys.argv[1], sys.argv[2]
s = json.load(open(f"{d}/steady.json"))
def kv(path):
    out = {}
    if not os.path.exists(path):
        return out
    for line in open(path):
        parts = line.split()
        if len(parts) == 2:
            out[parts[0]] = int(parts[1])
    return out
acked = s["acknowledged_sends"]
tot = {t["name"]: t["us_per_message"] for t in s["cpu"]["totals"]}
rb, ra = kv(f"{d}/redis-before.txt"), kv(f"{d}/redis-after.txt")
calls = sum(ra.get(k, 0) - rb.get(k, 0) for k in ra)
top = sorted(((ra[k] - rb.get(k, 0), k) for k in ra), reverse=True)[:4]
mb, ma = kv(f"{d}/mysql-before.txt"), kv(f"{d}/mysql-after.txt")
dm = {k: ma.get(k, 0) - mb.get(k, 0) for k in ma}
rows = dm.get("Handler_write", 0) + dm.get("Handler_update", 0) + dm.get("Handler_delete", 0)
def read(p):
    try:
        return int(open(p).read().strip() or 0)
    except OSError:
        return 0
ctx = read(f"{d}/ctx-after.txt") - read(f"{d}/ctx-before.txt")
a = s["send_ack_ms"]
print(f"| {name} | {s['sends_per_s']:.0f} | {a['p50']:.1f} / {a['p99']:.1f} | "
      f"{tot['server']:.0f} ({tot['gateways']:.0f}, {tot['workers']:.0f}, {tot['mariadb']:.0f}, {tot['redis']:.0f}) | "
      f"{tot['loadtest']:.0f} | {calls / acked:.2f} ({', '.join(f'{k} {c / acked:.2f}' for c, k in top)}) | "
      f"{dm.get('Questions', 0) / acked:.2f}, {dm.get('Innodb_data_fsyncs', 0) / acked:.3f}, {rows / acked:.2f} | "
      f"{ctx / acked:.1f} |")
PY
  done
done
echo "table: $OUT/table.md"
