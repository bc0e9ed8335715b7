#!/usr/bin/env bash
# Runs the whole test suite: the Helm chart checks, unit tests, the end-to-end tests
# that start real gateway and worker processes against local MariaDB and Redis, the
# TypeScript client's unit, integration, browser and package tests (clients/typescript),
# and the container image's smoke test (scripts/image-test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/services.sh
ensure_mariadb
ensure_redis
ensure_node
ensure_chromium
ensure_faketime
# Every end-to-end test runs its own cluster (two gateways with 16 MariaDB connections
# each, a worker), two tests run at a time, and a finished test's processes drain for up
# to 10 s: together they can pass MariaDB's default limit of 151 connections, and a
# test then fails on "1040: Too many connections". The limit is raised for this server
# when it is lower (until MariaDB restarts).
raise_connections="SET GLOBAL max_connections = GREATEST(@@GLOBAL.max_connections, 600)"
mariadb -u root -e "$raise_connections" 2>/dev/null || as_root mariadb -u root -e "$raise_connections" 2>/dev/null \
  || log "could not raise MariaDB's max_connections; with 151 a test may fail on 'Too many connections'"
export IT_MYSQL_URL=${IT_MYSQL_URL:-$HD_MYSQL_ROOT_URL}
export IT_REDIS_URL=${IT_REDIS_URL:-redis://127.0.0.1:6379/0}
# The quick checks first, so the test runner's summary stays the last output: module
# layering, the Helm chart, then the dependencies (cargo-deny, when installed).
scripts/check-layering.py
scripts/chart-test.sh
scripts/deny.sh
log "building"
cargo build --workspace --bins
log "testing the TypeScript client"
# Its integration tests start the binaries just built (one worker, two gateways).
(
  cd clients/typescript
  npm ci --no-audit --no-fund --loglevel=error
  npm run --silent typecheck
  npm run --silent build
  npm test --silent
  HERALD_BIN_DIR="$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/debug"
  export HERALD_BIN_DIR
  npm run --silent test:integration
  # The demo page in headless Chromium against the same binaries.
  npm run --silent test:browser
  # The packed tarball (prepack builds it) in a scratch project: Node ESM and CommonJS,
  # and a page bundled with esbuild in the same Chromium, against the same binaries.
  npm run --silent test:package
)
log "smoke-testing the container image (its own root file system, user 10001)"
scripts/image-test.sh "$(cargo metadata --no-deps --format-version 1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/debug"
log "testing"
# Integration tests start several processes each; two at a time suit a 2-core machine.
cargo test --workspace --no-fail-fast -- --test-threads "${TEST_THREADS:-2}"
