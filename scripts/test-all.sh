#!/usr/bin/env bash
# Runs every Capstan test: engine unit/property tests, the store suite and the HTTP API tests on
# SQLite, PostgreSQL and MariaDB, the Rust SDK interop tests, the Python SDK suite (including the
# kill -9 crash test, the CLI and the web UI in headless Chromium) and the multi-node PostgreSQL
# cluster tests.
# Installs what the tests need first: a Python venv in .venv with the published DW SDK, and a
# private PostgreSQL and a private MariaDB (Debian's packages) started by scripts/postgres.sh and
# scripts/mariadb.sh, and Debian's Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r tests/python/requirements.txt

# The web UI tests drive Debian's Chromium headless.
if ! command -v chromium >/dev/null 2>&1; then
  echo "installing Chromium from Debian's packages…" >&2
  SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >&2
fi

CAPSTAN_TEST_POSTGRES_URL=$(./scripts/postgres.sh)
export CAPSTAN_TEST_POSTGRES_URL
CAPSTAN_TEST_MYSQL_URL=$(./scripts/mariadb.sh)
export CAPSTAN_TEST_MYSQL_URL

# House habits first: formatting (no build needed).
cargo fmt --all --check
# One build of everything (binaries and test targets), then the tests in one pass.
cargo build --workspace --all-targets
# Lints on the same code (check-mode metadata; shares the dependency builds).
cargo clippy --workspace --all-targets -- -D warnings
# The Rust SDK's shipped conformance runners, from the same lockfile and target dir.
cargo build -p durable-workflow --bins
export CAPSTAN_BIN="$PWD/target/debug/capstan"
cargo test --workspace --no-fail-fast
# The small concurrent pieces (wake-up hubs, keyed locks, the writer's hand-off) model-checked:
# capstan-sync's loom models over every interleaving up to 3 preemptions, built with --cfg loom
# in a target dir of its own so that the main build stays cached.
CARGO_TARGET_DIR="$PWD/target/loom" RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test -p capstan-sync --release --test loom
.venv/bin/python -m pytest tests/python -q
# The SDK suite once more, with sticky execution, worker sessions and the worker-plane
# authority routes, against a two-node cluster on PostgreSQL (workers on one node, clients on
# the other), external payload storage and Nexus calls included.
SDK_SUITE=(tests/python/test_sdk_e2e.py
  tests/python/test_sticky_execution.py tests/python/test_worker_sessions.py tests/python/test_worker_plane.py
  tests/python/test_standalone_activities.py tests/python/test_redrive.py tests/python/test_message_streams.py
  tests/python/test_workflow_streams.py tests/python/test_external_payloads.py tests/python/test_nexus.py
  tests/python/test_priority_fairness.py tests/python/test_hand_off.py)
CAPSTAN_TEST_BACKEND=postgres .venv/bin/python -m pytest "${SDK_SUITE[@]}" -q
# And against a two-node cluster on MariaDB.
CAPSTAN_TEST_BACKEND=mariadb .venv/bin/python -m pytest "${SDK_SUITE[@]}" -q
