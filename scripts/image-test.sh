#!/usr/bin/env bash
# Smoke-tests the container image without a container engine: builds it
# (scripts/image.sh), checks the OCI archive's digests and unpacks it into a fresh
# directory, then runs from that root file system alone, as the chart's user
# 10001:10001 (chroot --userspec as root, an unprivileged user namespace otherwise):
# `--version`, the preStop hook's `sleep`, the migrations, a worker and a gateway
# against the local MariaDB and Redis, each answering /readyz. Nothing of the host's
# file system is visible to them, so a library missing from the image fails here.
#
# usage: scripts/image-test.sh [BIN_DIR]   (default: the workspace's target/debug)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/services.sh
ensure_mariadb
ensure_redis
bin_dir=${1:-target/debug}
mysql_base=${IT_MYSQL_URL:-$HD_MYSQL_ROOT_URL}
redis_url=${IT_REDIS_URL:-redis://127.0.0.1:6379/0}

work=$(mktemp -d)
id=$(head -c 4 /dev/urandom | od -An -tx1 | tr -d ' \n')
db="herald_image_$id"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  mariadb_client -e "DROP DATABASE IF EXISTS $db" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
mariadb_client() {
  python3 - "$mysql_base" "$@" <<'PY'
import os, sys, urllib.parse
u = urllib.parse.urlparse(sys.argv[1])
args = ["mariadb", "-h", u.hostname, "-P", str(u.port or 3306), "-u", urllib.parse.unquote(u.username or "root")]
if u.password:
    args.append("-p" + urllib.parse.unquote(u.password))
os.execvp("mariadb", args + sys.argv[2:])
PY
}

log "building the image from $bin_dir"
scripts/image.sh "$bin_dir" "$work/build"
archive=$(ls "$work"/build/herald-*.oci.tar)
root="$work/root"
user=$(python3 scripts/oci-image.py unpack "$archive" "$root")
[ "$user" = "10001:10001" ] || { echo "the image runs as $user, not the chart's 10001:10001" >&2; exit 1; }

chroot_bin=$(command -v chroot)
unshare_bin=$(command -v unshare)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
env_of_image=(
  PATH=/usr/local/bin:/usr/bin:/bin
  HERALD_MYSQL_URL="$mysql_base/$db"
  HERALD_REDIS_URL="$redis_url"
  HERALD_REDIS_KEY_PREFIX="img$id"
  HERALD_JWT_SECRET=image-smoke-test-secret-0123456789
  HERALD_LOG=info
)
# The command line (in `cmd`) that runs a command of the image from its own root, as
# 10001:10001, with only the image's environment and the given settings. Each program
# execs the next, so a background job's pid is the image's process.
image_cmd() {
  local settings=()
  while [ "$#" -gt 0 ] && [[ "$1" == *=* ]]; do settings+=("$1"); shift; done
  if [ "$(id -u)" -eq 0 ]; then
    cmd=(env -i "${env_of_image[@]}" "${settings[@]}" "$chroot_bin" --userspec=10001:10001 "$root" "$@")
  else
    cmd=(env -i "${env_of_image[@]}" "${settings[@]}" "$unshare_bin" --user --map-user=10001 --map-group=10001 --root="$root" "$@")
  fi
}
in_image() {
  image_cmd "$@"
  "${cmd[@]}"
}

log "the image's binaries run from its root file system as 10001:10001"
for b in herald-gateway herald-worker; do
  in_image "/usr/local/bin/$b" --version | grep -q "^$b " || { echo "$b --version failed in the image" >&2; exit 1; }
done
in_image /usr/local/bin/herald-loadtest --help >/dev/null
in_image sleep 0 || { echo "the preStop hook's sleep does not run in the image" >&2; exit 1; }
in_image /usr/local/bin/herald-worker check-config >/dev/null

log "migrations, a worker and a gateway from the image answer /readyz"
in_image /usr/local/bin/herald-worker migrate > "$work/migrate.log" 2>&1 || { cat "$work/migrate.log" >&2; exit 1; }
wk_admin=$(free_port)
gw_listen=$(free_port)
gw_admin=$(free_port)
image_cmd HERALD_NODE_ID="img-wk-$id" HERALD_ADMIN_LISTEN="127.0.0.1:$wk_admin" /usr/local/bin/herald-worker run
"${cmd[@]}" > "$work/worker.log" 2>&1 &
pids+=($!)
image_cmd HERALD_NODE_ID="img-gw-$id" HERALD_LISTEN="127.0.0.1:$gw_listen" HERALD_ADMIN_LISTEN="127.0.0.1:$gw_admin" \
  /usr/local/bin/herald-gateway
"${cmd[@]}" > "$work/gateway.log" 2>&1 &
pids+=($!)
ready() { [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/readyz")" = 200 ]; }
for _ in $(seq 600); do
  ready "$wk_admin" && ready "$gw_admin" && break
  sleep 0.1
done
if ! ready "$wk_admin" || ! ready "$gw_admin"; then
  echo "the image's worker or gateway is not ready:" >&2
  tail -n 30 "$work/worker.log" "$work/gateway.log" >&2
  exit 1
fi
# They run as 10001 on the host too when started by root (chroot --userspec).
if [ "$(id -u)" -eq 0 ]; then
  for pid in "${pids[@]}"; do
    uid=$(awk '/^Uid:/ { print $2 }' "/proc/$pid/status")
    [ "$uid" = 10001 ] || { echo "process $pid runs as uid $uid, not 10001" >&2; exit 1; }
  done
fi
curl -sf "http://127.0.0.1:$gw_admin/healthz" >/dev/null || { echo "the gateway's /healthz does not answer" >&2; exit 1; }
log "image smoke test passed ($(du -sh "$root" | cut -f1) unpacked)"
