#!/usr/bin/env bash
# Starts (once) a private MariaDB for the tests and prints its URL.
# Installs Debian's MariaDB packages when they are missing (needs root or sudo).
# Data lives in $CAPSTAN_MARIADB_DIR (default /tmp/capstan-test-mariadb), port
# $CAPSTAN_MARIADB_PORT (33069); the server listens on 127.0.0.1 only, user root without a password.
set -euo pipefail

DIR=${CAPSTAN_MARIADB_DIR:-/tmp/capstan-test-mariadb}
PORT=${CAPSTAN_MARIADB_PORT:-33069}
URL="mysql://root@127.0.0.1:${PORT}/capstan"

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

if ! command -v mariadbd >/dev/null 2>&1; then
  echo "installing MariaDB from Debian's packages…" >&2
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server >&2
fi

client() {
  mariadb --protocol=tcp -h 127.0.0.1 -P "$PORT" -u root "$@"
}

if client -e "SELECT 1" >/dev/null 2>&1; then
  client -e "CREATE DATABASE IF NOT EXISTS capstan CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
  echo "$URL"
  exit 0
fi

rm -rf "$DIR"
mkdir -p "$DIR/data"
# The server refuses to run as root unless told which user to be: run it as mysql then.
USER_FLAG=()
if [ "$(id -u)" = 0 ]; then
  chown -R mysql:mysql "$DIR"
  USER_FLAG=(--user=mysql)
fi
mariadb-install-db "${USER_FLAG[@]}" --datadir="$DIR/data" --auth-root-authentication-method=normal \
  --skip-test-db >"$DIR/install.log" 2>&1
# Durable like production (every COMMIT flushed), with room for the tests' many connections.
nohup mariadbd "${USER_FLAG[@]}" --datadir="$DIR/data" --socket="$DIR/mariadb.sock" --pid-file="$DIR/mariadb.pid" \
  --port="$PORT" --bind-address=127.0.0.1 --skip-name-resolve --max-connections=400 \
  --innodb-flush-log-at-trx-commit=1 --sync-binlog=1 --character-set-server=utf8mb4 \
  --collation-server=utf8mb4_bin --log-error="$DIR/server.log" >/dev/null 2>&1 &
for _ in $(seq 1 100); do
  if client -e "SELECT 1" >/dev/null 2>&1; then
    client -e "CREATE DATABASE IF NOT EXISTS capstan CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
    echo "$URL"
    exit 0
  fi
  sleep 0.2
done
echo "MariaDB did not start; see $DIR/server.log" >&2
tail -20 "$DIR/server.log" >&2 || true
exit 1
