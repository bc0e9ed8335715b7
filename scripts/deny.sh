#!/usr/bin/env bash
# Checks the dependencies with cargo-deny (deny.toml): licenses, duplicate crates and
# sources always, known vulnerabilities when the RustSec advisory database can be
# fetched (a git repository, not a package registry: where it cannot be reached the
# advisories are skipped with a notice).
#
# cargo-deny is run when installed and not installed by default: `cargo install --locked
# cargo-deny` took 4 minutes on a 2-core machine, a fifth of a test run. Set
# INSTALL_CARGO_DENY=1 to have this script install it (docs/operations.md, "Dependency
# checks").
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/services.sh

if ! command -v cargo-deny >/dev/null; then
  if [ "${INSTALL_CARGO_DENY:-0}" != 1 ]; then
    log "cargo-deny is not installed: dependency checks skipped (INSTALL_CARGO_DENY=1 installs it)"
    exit 0
  fi
  log "installing cargo-deny (crates.io; about 4 minutes on 2 cores)"
  cargo install --locked cargo-deny
fi
log "cargo deny: licenses, duplicate crates, sources"
cargo deny --locked check --hide-inclusion-graph licenses bans sources
if timeout 120 cargo deny fetch db >/dev/null 2>&1; then
  log "cargo deny: advisories"
  cargo deny --locked check --hide-inclusion-graph advisories
else
  log "cargo deny: the advisory database cannot be fetched here; advisories skipped"
fi
