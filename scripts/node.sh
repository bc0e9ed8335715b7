#!/usr/bin/env bash
# Controls one process of a local Herald started by scripts/run.sh or scripts/capacity.sh;
# the chaos scenario's actions call it.
#   scripts/node.sh kill gw-2        SIGKILL
#   scripts/node.sh stop gw-2        SIGTERM (drain) and wait
#   scripts/node.sh start gw-2       start again and wait until ready
#   scripts/node.sh restart wk-1     SIGKILL, then start
set -euo pipefail
source "$(dirname "$0")/cluster.sh"
ensure_mariadb
cluster_env
case "${1:-}" in
  kill) kill_node "$2" KILL ;;
  stop) kill_node "$2" TERM ;;
  start) start_node "$2"; wait_ready "$2" ;;
  restart) kill_node "$2" KILL; start_node "$2"; wait_ready "$2" ;;
  *) echo "usage: scripts/node.sh kill|stop|start|restart wk-1|gw-1|gw-2" >&2; exit 2 ;;
esac
