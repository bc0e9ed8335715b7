#!/usr/bin/env bash
# Makes sure MariaDB and Redis run on this machine (installing them from Debian's
# packages when missing; Node and Chromium for the TypeScript client, libfaketime for a
# test, too), and exports HD_MYSQL_ROOT_URL: a MySQL URL (without a
# database) that may create databases. Sourced by scripts/run.sh and scripts/test.sh.
set -euo pipefail

HD_STATE_DIR=${HD_STATE_DIR:-"$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/run"}
mkdir -p "$HD_STATE_DIR"

log() { printf '\033[1m[herald]\033[0m %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

apt_install() {
  log "installing $* from Debian's packages"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

ensure_redis() {
  if redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then return; fi
  command -v redis-server >/dev/null || apt_install redis-server redis-tools
  log "starting redis-server on 127.0.0.1:6379"
  as_root mkdir -p /var/lib/redis /var/log/redis
  as_root redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --dir /var/lib/redis \
    --logfile /var/log/redis/herald.log --maxmemory-policy noeviction
  for _ in $(seq 50); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && return; sleep 0.2; done
  log "redis did not start"; exit 1
}

# Node 20 or later, with npm, for the TypeScript client's tests (vitest 4 needs 20).
ensure_node() {
  command -v node >/dev/null && command -v npm >/dev/null || apt_install nodejs npm
  local major
  major=$(node -p 'process.versions.node.split(".")[0]')
  if [ "$major" -lt 20 ]; then
    log "Node $(node --version) is older than 20, which the TypeScript client's tests need"
    log "install Node 20 or later (Debian 13's nodejs, or NodeSource's on Debian 12)"
    exit 1
  fi
}

# Debian's Chromium for the demo's browser tests (playwright-core drives it; no browser
# builds are downloaded). CHROMIUM names another binary.
ensure_chromium() {
  [ -x "${CHROMIUM:-/usr/bin/chromium}" ] || apt_install chromium
}

# libfaketime, which a test preloads into one process to shift its wall clock (the
# clock-offset check of docs/reliability.md).
ensure_faketime() {
  [ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] || apt_install faketime
}

mysql_tcp_ok() { mariadb -h 127.0.0.1 -u "$1" ${2:+-p"$2"} -e 'SELECT 1' >/dev/null 2>&1; }

ensure_mariadb() {
  if [ -n "${HD_MYSQL_ROOT_URL:-}" ]; then return; fi
  if ! mysql_tcp_ok root && ! mariadb -u root -e 'SELECT 1' >/dev/null 2>&1; then
    command -v mariadbd >/dev/null || apt_install mariadb-server mariadb-client
    log "starting mariadbd"
    as_root mkdir -p /run/mysqld
    as_root chown mysql:mysql /run/mysqld 2>/dev/null || true
    as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql
    for _ in $(seq 100); do
      { mysql_tcp_ok root || mariadb -u root -e 'SELECT 1' >/dev/null 2>&1; } && break
      sleep 0.2
    done
  fi
  if mysql_tcp_ok root; then
    export HD_MYSQL_ROOT_URL="mysql://root@127.0.0.1:3306"
    return
  fi
  # A fresh Debian install lets root in only over the local socket: create a user
  # for Herald with a generated password, kept in run/ (not in git).
  local pwfile="$HD_STATE_DIR/mysql-password"
  [ -s "$pwfile" ] || head -c 18 /dev/urandom | base64 | tr -d '/+=' > "$pwfile"
  local pw; pw=$(cat "$pwfile")
  if ! mysql_tcp_ok herald "$pw"; then
    log "creating MariaDB user 'herald' (password in $pwfile)"
    as_root mariadb -u root <<SQL
CREATE USER IF NOT EXISTS 'herald'@'127.0.0.1' IDENTIFIED BY '$pw';
CREATE USER IF NOT EXISTS 'herald'@'localhost' IDENTIFIED BY '$pw';
GRANT ALL PRIVILEGES ON \`herald%\`.* TO 'herald'@'127.0.0.1';
GRANT ALL PRIVILEGES ON \`herald%\`.* TO 'herald'@'localhost';
SQL
  fi
  export HD_MYSQL_ROOT_URL="mysql://herald:${pw}@127.0.0.1:3306"
}
