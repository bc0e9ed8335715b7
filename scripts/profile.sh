#!/usr/bin/env bash
# Profiles one process of a running Herald with `perf record -g` for a while and writes
# the top frames by self time (`perf report --no-children --sort symbol`) to a text file.
#
#   scripts/profile.sh TARGET [--pid PID] [--seconds N] [--top N] [--out DIR] [--label NAME]
#                             [--frequency HZ] [--call-graph fp|dwarf|lbr] [--keep-data]
#
#   TARGET      gateway, worker, mariadbd, redis: found by process name (herald-gateway,
#               herald-worker, mariadbd or mysqld, redis-server); when several run, say
#               which with --pid. Or a pid itself.
#   --pid       the process to profile (TARGET then only names the output)
#   --seconds   how long to record (default 10)
#   --top       frames written (default 25)
#   --out       directory of the output (default profiles); it gets
#               [LABEL-]TARGET.txt, and TARGET.perf.data with --keep-data
#   --frequency samples per second (default 499: light enough to run under load)
#   --call-graph how stacks are unwound (default fp, what `-g` does; Rust release builds
#               keep few frame pointers, so dwarf shows more callers at a larger cost)
#
# Examples:
#   scripts/profile.sh gateway --pid "$(cat run/capacity/pids/gw-1.pid)" --seconds 15
#   scripts/profile.sh mariadbd --out /some/dir
#   PROFILE=worker scripts/capacity.sh   # the suite profiles wk-1 in the middle of `steady`
#
# Needs perf (Debian: linux-perf). Profiling another user's process (mariadbd, redis) or
# seeing kernel frames needs root, or kernel.perf_event_paranoid <= 1 (-1 for
# everything); without root the script uses sudo when it can, and says what is missing
# when it cannot.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { printf 'profile.sh: %s\n' "$*" >&2; exit 2; }

target="" pid="" seconds=10 top=25 out=profiles label="" freq=499 call_graph=fp keep=""
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --pid) pid=${2:?--pid needs a value}; shift 2 ;;
    --seconds) seconds=${2:?--seconds needs a value}; shift 2 ;;
    --top) top=${2:?--top needs a value}; shift 2 ;;
    --out) out=${2:?--out needs a value}; shift 2 ;;
    --label) label=${2:?--label needs a value}; shift 2 ;;
    --frequency) freq=${2:?--frequency needs a value}; shift 2 ;;
    --call-graph) call_graph=${2:?--call-graph needs a value}; shift 2 ;;
    --keep-data) keep=1; shift ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) [ -z "$target" ] || die "one TARGET only (got $target and $1)"; target=$1; shift ;;
  esac
done
[ -n "$target" ] || { usage >&2; exit 2; }
for n in "$seconds" "$top" "$freq"; do
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -gt 0 ] || die "--seconds, --top and --frequency are positive whole numbers, not '$n'"
done
case "$call_graph" in fp|dwarf|lbr) ;; *) die "--call-graph is fp, dwarf or lbr, not '$call_graph'" ;; esac
command -v perf >/dev/null || die "perf is not installed (Debian: apt-get install linux-perf)"

# The process names each TARGET stands for.
case "$target" in
  gateway) names="herald-gateway" ;;
  worker) names="herald-worker" ;;
  mariadbd|mariadb|mysqld) target=mariadbd names="mariadbd mysqld" ;;
  redis|redis-server) target=redis names="redis-server" ;;
  *[!0-9]*) die "TARGET is gateway, worker, mariadbd, redis or a pid, not '$target'" ;;
  *) pid=${pid:-$target} target=pid-$target names="" ;;
esac
if [ -z "$pid" ]; then
  found=""
  for n in $names; do found="$found $(pgrep -x "$n" | tr '\n' ' ' || true)"; done
  read -r -a pids <<< "$found"
  case ${#pids[@]} in
    0) die "no $names process runs here" ;;
    1) pid=${pids[0]} ;;
    *) printf 'profile.sh: several %s processes; pick one with --pid:\n' "$names" >&2
       for p in "${pids[@]}"; do printf '  %s\n' "$(ps -o pid=,args= -p "$p")" >&2; done
       exit 2 ;;
  esac
fi
[[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || [ -d "/proc/$pid" ] || die "no process $pid"

# Root may profile anything; others need the paranoia setting down, or sudo.
run=()
paranoid=$(cat /proc/sys/kernel/perf_event_paranoid 2>/dev/null || echo 2)
owner=$(stat -c %u "/proc/$pid")
if [ "$(id -u)" -ne 0 ] && { [ "$paranoid" -gt 1 ] || [ "$owner" != "$(id -u)" ]; }; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    run=(sudo -n)
  elif [ "$owner" != "$(id -u)" ]; then
    die "process $pid belongs to another user: run as root, or with sudo (kernel.perf_event_paranoid is $paranoid)"
  else
    printf 'profile.sh: kernel.perf_event_paranoid is %s and sudo is not available: user-space frames only\n' "$paranoid" >&2
  fi
fi

mkdir -p "$out"
name=${label:+$label-}$target
work=$(mktemp -d -t herald-profile.XXXXXX)
trap 'rm -rf "$work"' EXIT
data=$work/perf.data
printf 'profile.sh: recording %s (pid %s) for %s s at %s Hz\n' "$target" "$pid" "$seconds" "$freq" >&2
"${run[@]}" perf record -F "$freq" --call-graph "$call_graph" -p "$pid" -o "$data" -- sleep "$seconds" \
  >/dev/null 2>"$work/record.log" || { cat "$work/record.log" >&2; die "perf record failed"; }
[ ${#run[@]} -eq 0 ] || "${run[@]}" chown "$(id -u):$(id -g)" "$data"

# The report runs niced: the scenario being profiled may still be going on.
txt="$out/$name.txt"
nice -n 19 perf report -i "$data" --no-children --sort symbol --stdio -g none > "$work/report" 2>/dev/null || true
frames=$(grep -cE '^ +[0-9.]+%' "$work/report" || true)
{
  printf '# %s (pid %s: %s), %s s at %s Hz, %s\n' "$target" "$pid" \
    "$(ps -o args= -p "$pid" 2>/dev/null | cut -c1-80 || echo gone)" "$seconds" "$freq" "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  printf '# top %s frames by self time: perf report --no-children --sort symbol\n' "$top"
  grep -E '^# (Samples|Event count)' "$work/report" || true
  grep -E '^ +[0-9.]+%' "$work/report" | sed -E 's/ +- +- *$//' | head -n "$top" || true
  [ "$frames" -gt 0 ] || printf '# no samples: the process was idle (or perf could not see it)\n'
} > "$txt"
[ "$frames" -gt 0 ] || printf 'profile.sh: no samples of %s: idle, or not visible to perf\n' "$pid" >&2
if [ -n "$keep" ]; then
  mv "$data" "$out/$name.perf.data"
  printf 'profile.sh: perf data kept in %s\n' "$out/$name.perf.data" >&2
fi
printf 'profile.sh: top %s frames of %s written to %s\n' "$top" "$target" "$txt" >&2
