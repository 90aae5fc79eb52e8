#!/usr/bin/env bash
# Starts (once) a private PostgreSQL for the tests and prints its URL.
# Installs Debian's PostgreSQL packages when they are missing (needs root or sudo).
# Data lives in $CAPSTAN_PG_DIR (default /tmp/capstan-test-pg), port $CAPSTAN_PG_PORT (54329).
set -euo pipefail

DIR=${CAPSTAN_PG_DIR:-/tmp/capstan-test-pg}
PORT=${CAPSTAN_PG_PORT:-54329}
URL="postgres://postgres@127.0.0.1:${PORT}/postgres"

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

pgbin() {
  ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

if [ -z "$(pgbin)" ]; then
  echo "installing PostgreSQL from Debian's packages…" >&2
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
fi
PGBIN=$(pgbin)

# Server programs refuse to run as root: run them as the postgres user then.
run_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

if [ -f "$DIR/data/postmaster.pid" ] && run_pg "$PGBIN/pg_ctl" -D "$DIR/data" status >/dev/null 2>&1; then
  echo "$URL"
  exit 0
fi

rm -rf "$DIR"
mkdir -p "$DIR"
if [ "$(id -u)" = 0 ]; then chown postgres:postgres "$DIR"; fi
run_pg "$PGBIN/initdb" -D "$DIR/data" -A trust -U postgres -E UTF8 >"$DIR/initdb.log" 2>&1
run_pg "$PGBIN/pg_ctl" -D "$DIR/data" -l "$DIR/server.log" -w \
  -o "-p $PORT -k $DIR -c listen_addresses=127.0.0.1 -c max_connections=400" start >&2
echo "$URL"
