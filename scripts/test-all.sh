#!/usr/bin/env bash
# Runs every Capstan test: engine unit/property tests, the store suite, HTTP API tests, the Rust
# SDK interop tests and the Python SDK suite (including the kill -9 crash test).
# Installs what the tests need first: a Python venv in .venv with the published DW SDK.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r tests/python/requirements.txt

# One build of everything (binaries and test targets), then the tests in one pass.
cargo build --workspace --all-targets
export CAPSTAN_BIN="$PWD/target/debug/capstan"
cargo test --workspace --no-fail-fast
.venv/bin/python -m pytest tests/python -q
