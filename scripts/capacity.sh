#!/usr/bin/env bash
# The standard capacity suite: starts a local Herald (one worker, two gateways; release
# build; its own database, Redis prefix and ports, so it can run beside scripts/run.sh),
# runs the scenarios steady, fanout, storm, idle and chaos (soak and failover when asked),
# and writes docs/capacity-report.md with the numbers next to the targets of
# docs/architecture.md section 6
# (scenario reports, JSON and SVG charts in docs/capacity/).
#
#   scripts/capacity.sh            # the standard suite (about 6 minutes on 2 cores)
#   SCALE=quick scripts/capacity.sh  # a small, quick pass of the same scenarios
#   SCENARIOS="storm chaos" scripts/capacity.sh  # some of them (the report keeps the others' last run)
#   STORM_ARGS="--devices 1000 --backlog 50" SCENARIOS=storm scripts/capacity.sh  # other options
#   OUT=/tmp/cap REPORT=/tmp/cap/report.md scripts/capacity.sh
#   SCENARIOS=soak scripts/capacity.sh  # 10 minutes of steady load with device churn; fails
#                                       # when what Herald keeps grows (SOAK_ARGS for options)
#   SCENARIOS=failover scripts/capacity.sh  # 10 000 devices on gw-1, which is SIGKILLed under
#       # traffic and not restarted until the devices have moved to gw-2 and caught up
#       # (FAILOVER_ARGS for options); not in the default list, as it takes gw-1 down
#   SCENARIOS=sessions scripts/capacity.sh  # 50 000 sessions across three gateways (gw-3
#       # started for it), a third per load-test process, held 30 s, then one message into
#       # every group (SESSIONS_ARGS for options); not in the report: its runs are in
#       # $OUT/sessions-gw-1..3
#   SCENARIOS=typing scripts/capacity.sh  # what typing indicators and presence cost: groups
#       # of 50 online, 500 typing frames/s, then 20 reconnects/s (TYPING_ARGS for options);
#       # not in the default list: its figures are in docs/benchmarks.md, not the report's targets
#   HD_BIN=target/debug ...             # binaries already built (no release build)
#   PROFILE=gateway scripts/capacity.sh # perf profile of gw-1 in the middle of `steady`:
#                                       # its top frames in $OUT/profile/steady-gateway.txt
#   PROFILE=worker PROFILE_SCENARIO=fanout PROFILE_AT=10 PROFILE_SECONDS=15 SCENARIOS=fanout scripts/capacity.sh
#       PROFILE is gateway (gw-1), worker (wk-1), mariadbd or redis; PROFILE_SCENARIO steady
#       (default), fanout or chaos; the profile starts PROFILE_AT seconds after sending
#       starts and lasts PROFILE_SECONDS (default: the middle third of the send window);
#       PROFILE_TOP frames are kept (default 25). See scripts/profile.sh.
set -euo pipefail
export HD_DATABASE=${HD_DATABASE:-herald_capacity}
export HD_GW1_PORT=${HD_GW1_PORT:-8180} HD_GW2_PORT=${HD_GW2_PORT:-8181}
export HD_GW1_ADMIN=${HD_GW1_ADMIN:-9190} HD_WK1_ADMIN=${HD_WK1_ADMIN:-9191} HD_GW2_ADMIN=${HD_GW2_ADMIN:-9192}
export HD_GW3_PORT=${HD_GW3_PORT:-8182} HD_GW3_ADMIN=${HD_GW3_ADMIN:-9193}
export HD_STATE_DIR=${HD_STATE_DIR:-"$(cd "$(dirname "$0")/.." && pwd)/run/capacity"}
source "$(dirname "$0")/cluster.sh"
ensure_mariadb
ensure_redis
cluster_env
export HERALD_REDIS_KEY_PREFIX=${HERALD_REDIS_KEY_PREFIX:-cap}
# The suite measures the system, not the abuse limits (docs/reliability.md).
export HERALD_GATEWAY__SEND_RATE=${HERALD_GATEWAY__SEND_RATE:-1000000}
export HERALD_GATEWAY__SEND_BURST=${HERALD_GATEWAY__SEND_BURST:-1000000}
export HERALD_GATEWAY__TENANT_SEND_RATE=${HERALD_GATEWAY__TENANT_SEND_RATE:-1000000}
export HERALD_GATEWAY__TENANT_SEND_BURST=${HERALD_GATEWAY__TENANT_SEND_BURST:-1000000}
export HERALD_GATEWAY__ADMISSION_RATE=${HERALD_GATEWAY__ADMISSION_RATE:-20000}
export HERALD_GATEWAY__ADMISSION_BURST=${HERALD_GATEWAY__ADMISSION_BURST:-20000}
# Every simulated device connects from this one machine.
export HERALD_GATEWAY__MAX_CONNECTIONS_PER_IP=${HERALD_GATEWAY__MAX_CONNECTIONS_PER_IP:-1000000}
OUT=${OUT:-docs/capacity}
REPORT=${REPORT:-docs/capacity-report.md}
SCALE=${SCALE:-standard}
SCENARIOS=${SCENARIOS:-steady fanout storm idle chaos}
case " $SCENARIOS " in *" soak "*)
  # The soak checks that what Herald keeps is bounded by its windows, so they are scaled
  # down for every process to pass several times in 10 minutes: frames, SENT outbox rows,
  # devices unseen and the rows of expired devices, watermark writes, and the fan-out markers kept for the outbox's retry
  # window (5 s + 5 s + 10 s + 10 s + 15 s, which the watermark margin must cover). The
  # other scenarios of the same run get them too: run soak on its own.
  export HERALD_WORKER__MESSAGE_TTL_S=${HERALD_WORKER__MESSAGE_TTL_S:-30}
  export HERALD_OUTBOX__SENT_RETENTION_S=${HERALD_OUTBOX__SENT_RETENTION_S:-30}
  export HERALD_DELIVERY__DEVICE_TTL_S=${HERALD_DELIVERY__DEVICE_TTL_S:-120}
  export HERALD_WORKER__DEVICE_FORGET_S=${HERALD_WORKER__DEVICE_FORGET_S:-60}
  export HERALD_WORKER__JANITOR_INTERVAL_MS=${HERALD_WORKER__JANITOR_INTERVAL_MS:-5000}
  export HERALD_GATEWAY__WATERMARK_FLUSH_MS=${HERALD_GATEWAY__WATERMARK_FLUSH_MS:-30000}
  export HERALD_OUTBOX__BACKOFF_MS=${HERALD_OUTBOX__BACKOFF_MS:-5000,10000}
  export HERALD_OUTBOX__MAX_ATTEMPTS=${HERALD_OUTBOX__MAX_ATTEMPTS:-3}
  export HERALD_OUTBOX__SENDING_STALE_MS=${HERALD_OUTBOX__SENDING_STALE_MS:-15000}
  export HERALD_GATEWAY__WATERMARK_MARGIN_MS=${HERALD_GATEWAY__WATERMARK_MARGIN_MS:-60000}
  log "soak: windows scaled down (frames and SENT rows 30 s, devices 120 s and forgotten 60 s later, outbox retries 45 s)" ;;
esac

if [ "$HD_BIN" = "${CARGO_TARGET_DIR:-target}/release" ]; then
  log "building (release)"
  cargo build --release --bins -q
else
  log "using the binaries in $HD_BIN"
fi
log "fresh database $HD_DATABASE and Redis prefix $HERALD_REDIS_KEY_PREFIX"
mariadb -h 127.0.0.1 -u root -e "DROP DATABASE IF EXISTS $HD_DATABASE" 2>/dev/null \
  || mariadb -u root -e "DROP DATABASE IF EXISTS $HD_DATABASE"
redis-cli -h 127.0.0.1 -p 6379 --scan --pattern "$HERALD_REDIS_KEY_PREFIX:*" | xargs -r -n 500 redis-cli -h 127.0.0.1 -p 6379 del >/dev/null
"$HD_BIN/herald-worker" migrate

stop() {
  for n in gw-1 gw-2 gw-3 wk-1; do [ -f "$HD_PIDS/$n.pid" ] && kill "$(node_pid $n)" 2>/dev/null || true; done
}
trap stop EXIT INT TERM
for n in wk-1 gw-1 gw-2; do start_node $n; done
for n in wk-1 gw-1 gw-2; do wait_ready $n; done

if [ "$SCALE" = quick ]; then
  STEADY="--conversations 100 --rate 500 --duration 8"
  FANOUT="--receivers 400 --group 100 --rate 100 --duration 8"
  STORM="--devices 500 --backlog 50 --group 50 --realtime 20 --rate 50 --baseline 3"
  IDLE="--connections 2000 --hold 3"
  CHAOS="--conversations 100 --rate 300 --duration 24"
  FAILOVER="--devices 1000 --group 50 --rate 20 --baseline 3"
  SOAK="--conversations 100 --rate 100 --duration 300 --warmup 150"
  SESSIONS="--connections 6000 --hold 5 --connect-rate 2000"
  TYPING="--receivers 400 --group 20 --rate 100 --duration 5 --churn 5"
else
  STEADY="--conversations 200 --rate 5000 --duration 30"
  FANOUT="--receivers 4000 --group 200 --rate 0 --duration 30"
  STORM="--devices 5000 --backlog 200 --group 50 --realtime 100 --rate 200 --baseline 5"
  # The machine allows 20 000 open files per process: 18 000 sessions is its ceiling.
  IDLE="--connections 18000 --hold 10 --connect-rate 3000"
  CHAOS="--conversations 300 --rate 1000 --duration 40"
  # gw-2 takes gw-1's sessions: 10 000 of the 20 000 open files a process may have here.
  FAILOVER="--devices 10000 --group 50 --rate 20 --baseline 5"
  # Past the warm-up, devices gone are expired as fast as they go (120 s after they were
  # last seen), so what they held stops adding up.
  SOAK="--conversations 300 --rate 300 --duration 600 --warmup 150"
  # 50 000 sessions across the three gateways (a process may hold 20 000 open files here),
  # each third opened by its own load-test process.
  SESSIONS="--connections 50000 --hold 30 --connect-rate 3000"
  # Groups of 50 (typing reaches groups of at most 100): 500 frames/s is 24 500
  # indicators shown a second; then 20 reconnects/s, each two presence changes for 49
  # followers.
  TYPING="--receivers 2000 --group 50 --rate 500 --duration 20 --churn 20"
fi
# Any scenario's options can be replaced: STORM="--devices 1000 --backlog 50" scripts/capacity.sh
STEADY=${STEADY_ARGS:-$STEADY} FANOUT=${FANOUT_ARGS:-$FANOUT} STORM=${STORM_ARGS:-$STORM}
IDLE=${IDLE_ARGS:-$IDLE} CHAOS=${CHAOS_ARGS:-$CHAOS} SOAK=${SOAK_ARGS:-$SOAK}
FAILOVER=${FAILOVER_ARGS:-$FAILOVER} SESSIONS=${SESSIONS_ARGS:-$SESSIONS} TYPING=${TYPING_ARGS:-$TYPING}
gws="http://127.0.0.1:$HD_GW1_PORT,http://127.0.0.1:$HD_GW2_PORT"
# Every scenario reads each process's CPU (its admin /metrics; Redis's INFO) before and
# after its send window, for the CPU per message of its report.
measure=(--admin "wk-1=http://127.0.0.1:$HD_WK1_ADMIN" --admin "gw-1=http://127.0.0.1:$HD_GW1_ADMIN"
  --admin "gw-2=http://127.0.0.1:$HD_GW2_ADMIN" --redis-url "$HERALD_REDIS_URL")
lt() { "$HD_BIN/herald-loadtest" "$@" --gateways "$gws" --out "$OUT" "${measure[@]}"; }

# PROFILE: an --action for PROFILE_SCENARIO that runs scripts/profile.sh in the middle of
# its send window (the window's length is read from the scenario's --duration).
PROFILE=${PROFILE:-} PROFILE_SCENARIO=${PROFILE_SCENARIO:-steady}
profile=()
if [ -n "$PROFILE" ]; then
  case $PROFILE in
    gateway) profile_pid=(--pid "$(node_pid gw-1)") ;;
    worker) profile_pid=(--pid "$(node_pid wk-1)") ;;
    mariadbd|redis) profile_pid=() ;;
    *) log "PROFILE is gateway, worker, mariadbd or redis, not $PROFILE"; exit 2 ;;
  esac
  case $PROFILE_SCENARIO in steady|fanout|chaos) ;; *) log "PROFILE_SCENARIO is steady, fanout or chaos"; exit 2 ;; esac
  args_of() { case $1 in steady) echo "$STEADY" ;; fanout) echo "$FANOUT" ;; chaos) echo "$CHAOS" ;; esac; }
  window=$(sed -nE 's/.*--duration[ =]([0-9]+).*/\1/p' <<< "$(args_of "$PROFILE_SCENARIO")")
  window=${window:-20}
  PROFILE_AT=${PROFILE_AT:-$((window / 3))} PROFILE_SECONDS=${PROFILE_SECONDS:-$((window / 3 > 0 ? window / 3 : 1))}
  profile=(--action "$PROFILE_AT=scripts/profile.sh $PROFILE ${profile_pid[*]} --seconds $PROFILE_SECONDS --top ${PROFILE_TOP:-25} --out $OUT/profile --label $PROFILE_SCENARIO")
  log "profiling $PROFILE for $PROFILE_SECONDS s, $PROFILE_AT s into $PROFILE_SCENARIO's sending"
fi
# fresh_node NAME: drains the node and starts it again, before a scenario that measures
# its memory: a gateway that served the scenarios before holds their freed memory, which
# new sessions fill without raising its RSS (idle sessions read 2.2 KiB where a fresh
# gateway takes 7 - 8).
fresh_node() { kill_node "$1" TERM && start_node "$1" && wait_ready "$1"; }

# sessions_run ARGS: the `sessions` scenario (see the case below).
sessions_run() {
  local args=$1 total per rate pids=() n ok=0
  total=$(sed -nE 's/.*--connections[ =]([0-9]+).*/\1/p' <<< "$args")
  rate=$(sed -nE 's/.*--connect-rate[ =]([0-9.]+).*/\1/p' <<< "$args")
  [ -n "$total" ] || { log "sessions: --connections is required"; return 2; }
  per=$(( (total + 2) / 3 ))
  args=$(sed -E 's/--connections[ =][0-9]+//; s/--connect-rate[ =][0-9.]+//' <<< "$args")
  fresh_node gw-1 && fresh_node gw-2 || return 1
  if [ -f "$HD_PIDS/gw-3.pid" ] && kill -0 "$(node_pid gw-3)" 2>/dev/null; then fresh_node gw-3 || return 1
  else start_node gw-3 && wait_ready gw-3 || return 1; fi
  for n in 1 2 3; do
    local port_var=HD_GW${n}_PORT
    mkdir -p "$OUT/sessions-gw-$n"
    # shellcheck disable=SC2086
    "$HD_BIN/herald-loadtest" idle $args --connections "$per" --connect-rate "$(awk -v r="${rate:-3000}" 'BEGIN { print r / 3 }')" \
      --gateways "http://127.0.0.1:${!port_var}" --gateway-pid "$(node_pid gw-$n)" \
      --out "$OUT/sessions-gw-$n" > "$OUT/sessions-gw-$n/run.log" 2>&1 &
    pids+=($!)
    sleep 0.05 # each process names its users after the millisecond it started
  done
  for n in 1 2 3; do
    if wait "${pids[$((n - 1))]}"; then ok=$((ok + 1)); else log "sessions: the third on gw-$n failed (see $OUT/sessions-gw-$n/run.log)"; fi
  done
  python3 - "$OUT" <<'PY'
import json, sys
rows = [json.load(open(f"{sys.argv[1]}/sessions-gw-{n}/idle.json")) for n in (1, 2, 3)]
held = sum(r["extra"]["online_after_hold"] for r in rows)
kib = [round(r["extra"]["rss_kib_per_connection"], 1) for r in rows]
up = [round(r["extra"]["open_s"], 1) for r in rows]
lost = sum(r["extra"]["sessions_lost_during_hold"] for r in rows)
integrity = [(r["integrity"]["lost"], r["integrity"]["shown_twice"], r["integrity"]["out_of_order"]) for r in rows]
print(f"sessions: {held} online after the hold across 3 gateways (up in {up} s), "
      f"{lost} lost while idle, gateway RSS per session {kib} KiB, integrity {integrity}")
PY
  [ "$ok" = 3 ]
}

# extra_for SCENARIO: the scenario's extra options (the profiler's --action, if it is the one).
extra_for() { extra=(); if [ "$1" = "$PROFILE_SCENARIO" ]; then extra=("${profile[@]}"); fi; }
mkdir -p "$OUT"
failed=""
for s in $SCENARIOS; do
  rm -f "$OUT/$s.json"
  log "$s"
  case $s in
    steady) extra_for steady; lt steady $STEADY "${extra[@]}" ;;
    fanout) extra_for fanout; lt fanout $FANOUT "${extra[@]}" ;;
    storm) lt storm $STORM ;;
    typing) lt typing $TYPING ;;
    idle) fresh_node gw-1 && lt idle $IDLE --gateway-pid "$(node_pid gw-1)" ;;
    chaos)
      # gateway gw-2 and worker wk-1 killed and restarted under load
      extra_for chaos
      lt chaos $CHAOS "${extra[@]}" \
        --action "4=scripts/node.sh kill gw-2" \
        --action "8=scripts/node.sh start gw-2" \
        --action "12=scripts/node.sh kill wk-1" \
        --action "15=scripts/node.sh start wk-1" ;;
    failover)
      # gw-1 SIGKILLed and left down while its devices move to gw-2 and catch up; started
      # again afterwards for the scenarios that follow
      fo=0; lt failover $FAILOVER --kill "scripts/node.sh kill gw-1" || fo=$?
      scripts/node.sh start gw-1 && [ "$fo" = 0 ] ;;
    sessions)
      # --connections in total, a third on each of gw-1, gw-2 and gw-3 (all started
      # afresh for this), each third opened and held by its own `idle` process (so no process holds
      # more sockets than it may); one message into every group then checks that every
      # session still delivers. Each third's report is $OUT/sessions-gw-N/idle.*.
      sessions_run "$SESSIONS" ;;
    soak)
      # samples this cluster: its Redis prefix, its database and every process's /metrics
      lt soak --redis-prefix "$HERALD_REDIS_KEY_PREFIX" --mysql-url "$HERALD_MYSQL_URL" $SOAK ;;
    *) log "unknown scenario $s"; exit 2 ;;
  esac || failed="$failed $s"
done

machine="$(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -sr), $(date -u +%Y-%m-%d)"
# The report's scenarios (`typing` and `sessions` are not among them).
report_jsons=$(for s in steady fanout storm idle chaos failover soak sends; do [ -f "$OUT/$s.json" ] && echo "$s"; done || true)
if [ -n "$report_jsons" ]; then
  "$HD_BIN/herald-loadtest" report --dir "$OUT" --out "$REPORT" --machine "$machine"
  log "capacity report: $REPORT"
else
  log "no capacity report: no scenario of the report ran (typing's report is $OUT/typing.md, sessions' in $OUT/sessions-gw-*)"
fi
if [ -n "$failed" ]; then log "integrity check, bounded-state check or run FAILED in:$failed"; exit 1; fi
