"""Backups of Capstan on PostgreSQL and MariaDB, taken and restored with the database's own tools.

On a shared database Capstan keeps everything (external payload bytes aside) in that one
database, and every node of a cluster uses the same one, so one logical dump of it is a backup
of the whole cluster. The test takes the dump while the cluster runs (two nodes up, a worker
polling): `pg_dump --format=custom` on PostgreSQL, `mariadb-dump --single-transaction --routines
--triggers` on MariaDB. It restores the dump into a new, empty database (`pg_restore --no-owner`;
the `mariadb` client reading the SQL) and starts a node on that. Guaranteed (docs/backup.md,
"PostgreSQL and MariaDB"):

* every run listed before the dump is listed by the restored node with the same summary
  (status, timestamps, memo with 4-byte UTF-8 characters, history counters), the same
  description, and a history that is the same event for event, with its hash chain intact;
* `capstan verify --database URL` exits 0 on the restored database, and reports the same
  runs, events, ledger instances and checkpoints as it does for the original database;
* the runs that were open at the dump go on from the restored database with the same worker
  code: the one waiting for a signal completes once signalled through the restored node, and
  the one sleeping on a durable timer set before the dump is fired by the restored node and
  completes. Their new events follow the restored ones.

Each test runs twice (`cluster_factory`): on PostgreSQL (`CAPSTAN_TEST_POSTGRES_URL`) and on
MariaDB (`CAPSTAN_TEST_MYSQL_URL`). The database's client programs are required: a missing one
fails the test and names it (scripts/postgres.sh and scripts/mariadb.sh install them).
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
from pathlib import Path
from typing import Any

import httpx
import pytest
from durable_workflow import ActivityRetryPolicy, WorkflowFailed, activity, workflow

from capstan_harness import (
    CONTROL_HEADERS,
    assert_hash_chain,
    assert_history_invariants,
    capstan_binary,
    events_of,
    fetch_history_raw,
    make_client,
    payload_of,
    run_async,
    start_all,
    type_sequence,
    unique,
    wait_for_history,
    wait_result,
)

# The durable timer of the run left sleeping: long enough that it cannot fire between the
# snapshot and the dump, short enough that the restored node fires it soon.
NAP_SECONDS = 20
TOOL_TIMEOUT = 120.0
MEMO = {"note": "Kapstan ⚓ 🚢 déjà vu", "ticket": 44}


# ── workflows and activities ─────────────────────────────────────────────


@activity.defn(name="backup.greet")
def greet(name: str) -> str:
    return f"Hello, {name}!"


@activity.defn(name="backup.refuse")
def refuse(name: str) -> str:
    raise RuntimeError(f"{name} refused")


@workflow.defn(name="backup.greeting")
class GreetingWorkflow:
    def run(self, ctx, name):
        return (yield ctx.schedule_activity("backup.greet", [name]))


@workflow.defn(name="backup.refusal")
class RefusalWorkflow:
    """Fails: its one activity fails and is not retried."""

    def run(self, ctx, name):
        return (yield ctx.schedule_activity("backup.refuse", [name], retry_policy=ActivityRetryPolicy(max_attempts=1)))


@workflow.defn(name="backup.approval")
class ApprovalWorkflow:
    """Waits for an `approve` signal, then greets the approver through an activity."""

    def __init__(self) -> None:
        self.approver: str | None = None

    @workflow.signal("approve")
    def approve(self, approver: str) -> None:
        self.approver = approver

    def run(self, ctx, request):
        yield ctx.wait_condition(lambda: self.approver is not None)
        greeting = yield ctx.schedule_activity("backup.greet", [self.approver])
        return f"{request} approved: {greeting}"


@workflow.defn(name="backup.nap")
class NapWorkflow:
    def run(self, ctx, seconds):
        yield ctx.sleep(seconds)
        return f"slept {seconds}s"


WORKFLOWS = [GreetingWorkflow, RefusalWorkflow, ApprovalWorkflow, NapWorkflow]
ACTIVITIES = [greet, refuse]


# ── the databases' own client programs ──────────────────────────────────


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", Path(path).parent.name))


def postgres_program(name: str) -> str:
    """``name`` (pg_dump, pg_restore) from the newest ``/usr/lib/postgresql/<version>/bin``, the
    directory scripts/postgres.sh runs the server from (a pg_dump must not be older than the
    server it dumps), else from PATH. Fails the test when there is none."""
    candidates = sorted(
        (str(path) for path in Path("/usr/lib/postgresql").glob(f"*/bin/{name}") if os.access(path, os.X_OK)),
        key=_version_key,
    )
    found = candidates[-1] if candidates else shutil.which(name)
    if not found:
        pytest.fail(
            f"{name} not found in /usr/lib/postgresql/*/bin nor on PATH: install PostgreSQL's client "
            f"programs (Debian: postgresql-client; scripts/postgres.sh installs postgresql)",
            pytrace=False,
        )
    return found


def mariadb_program(*names: str) -> str:
    """The first of ``names`` found on PATH or next to the ``mariadbd`` scripts/mariadb.sh runs.
    Fails the test when there is none."""
    server = shutil.which("mariadbd", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"]))
    beside_server = str(Path(server).parent) if server else ""
    for name in names:
        found = shutil.which(name) or (beside_server and shutil.which(name, path=beside_server))
        if found:
            return found
    pytest.fail(
        f"none of {', '.join(names)} found on PATH or next to mariadbd ({server or 'not found either'}): install "
        f"MariaDB's client programs (Debian: mariadb-client; scripts/mariadb.sh installs mariadb-server)",
        pytrace=False,
    )


def mariadb_connection(url: str) -> tuple[list[str], dict[str, str], str]:
    """Connection options for MariaDB's clients from a ``mysql://`` URL, the environment that
    carries its password (``MYSQL_PWD``, kept off the command line), and the database name."""
    parts = urllib.parse.urlsplit(url)
    options = ["--protocol=tcp", "-h", parts.hostname or "127.0.0.1", "-P", str(parts.port or 3306),
               "-u", urllib.parse.unquote(parts.username or "root")]
    env = dict(os.environ)
    if parts.password:
        env["MYSQL_PWD"] = urllib.parse.unquote(parts.password)
    return options, env, parts.path.lstrip("/")


def run_tool(argv: list[str], *, what: str, stdin: Path | None = None, stdout: Path | None = None,
             env: dict[str, str] | None = None) -> None:
    """Runs one client program; a non-zero exit fails the test with its stderr."""
    with open(stdin, "rb") if stdin else open(os.devnull, "rb") as source, \
            open(stdout, "wb") if stdout else open(os.devnull, "wb") as sink:
        done = subprocess.run(argv, stdin=source, stdout=sink, stderr=subprocess.PIPE, env=env,
                              timeout=TOOL_TIMEOUT, check=False)
    assert done.returncode == 0, (
        f"{what} failed with exit {done.returncode}: {' '.join(argv)}\n{done.stderr.decode(errors='replace')}"
    )


def dump(kind: str, url: str, to: Path) -> None:
    """A logical dump of the whole database at ``url``, one consistent snapshot, into ``to``."""
    if kind == "postgres":
        run_tool([postgres_program("pg_dump"), "--format=custom", "--file", str(to), "--dbname", url],
                 what="pg_dump")
    else:
        options, env, database = mariadb_connection(url)
        run_tool([mariadb_program("mariadb-dump", "mysqldump"), *options, "--single-transaction", "--routines",
                  "--triggers", "--default-character-set=utf8mb4", database],
                 what="mariadb-dump", stdout=to, env=env)
    assert to.stat().st_size > 0, f"the dump {to} is empty"


def restore(kind: str, dump_file: Path, url: str) -> None:
    """Loads ``dump_file`` into the existing, empty database at ``url``."""
    if kind == "postgres":
        run_tool([postgres_program("pg_restore"), "--no-owner", "--exit-on-error", "--dbname", url, str(dump_file)],
                 what="pg_restore")
    else:
        options, env, database = mariadb_connection(url)
        run_tool([mariadb_program("mariadb", "mysql"), *options, "--default-character-set=utf8mb4", database],
                 what="mariadb (restoring the dump)", stdin=dump_file, env=env)


def capstan_verify(url: str) -> dict[str, Any]:
    """``capstan verify --database URL --json``: must exit 0; returns its report."""
    done = subprocess.run([str(capstan_binary()), "verify", "--database", url, "--json"],
                          capture_output=True, text=True, timeout=TOOL_TIMEOUT, check=False)
    assert done.returncode == 0, f"capstan verify exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    report = json.loads(done.stdout)
    assert report["problems"] == [], report
    return report


# ── what the control plane shows ─────────────────────────────────────────


async def cluster_state(base_url: str) -> dict[str, Any]:
    """Every run listed (all pages), each workflow's description and runs, and each run's
    history, as one node serves them."""
    listed: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=base_url, headers=CONTROL_HEADERS, timeout=15.0) as http:
        token = None
        while True:
            params: dict[str, Any] = {"page_size": 200}
            if token:
                params["next_page_token"] = token
            resp = await http.get("/api/workflows", params=params)
            assert resp.status_code == 200, f"GET /api/workflows -> {resp.status_code}: {resp.text[:300]}"
            page = resp.json()
            listed.extend(page["workflows"])
            token = page.get("next_page_token")
            if not token:
                break
        described: dict[str, Any] = {}
        runs: dict[str, Any] = {}
        for workflow_id in sorted({row["workflow_id"] for row in listed}):
            resp = await http.get(f"/api/workflows/{workflow_id}")
            assert resp.status_code == 200, f"describe {workflow_id} -> {resp.status_code}: {resp.text[:300]}"
            described[workflow_id] = resp.json()
            resp = await http.get(f"/api/workflows/{workflow_id}/runs")
            assert resp.status_code == 200, f"runs of {workflow_id} -> {resp.status_code}: {resp.text[:300]}"
            runs[workflow_id] = resp.json()
    histories = {
        (row["workflow_id"], row["run_id"]): await fetch_history_raw(base_url, row["workflow_id"], row["run_id"])
        for row in listed
    }
    return {"listed": listed, "described": described, "runs": runs, "histories": histories}


def assert_same_state(restored: dict[str, Any], original: dict[str, Any]) -> None:
    assert [r["workflow_id"] for r in restored["listed"]] == [r["workflow_id"] for r in original["listed"]]
    for before, after in zip(original["listed"], restored["listed"]):
        assert after == before, f"listed run differs after the restore:\nbefore {before}\nafter  {after}"
    for workflow_id, before in original["described"].items():
        after = restored["described"][workflow_id]
        assert after == before, f"{workflow_id} is described differently after the restore:\nbefore {before}\nafter  {after}"
    assert restored["runs"] == original["runs"]
    assert restored["histories"].keys() == original["histories"].keys()
    for key, before in original["histories"].items():
        after = restored["histories"][key]
        assert after == before, (
            f"history of {key} differs after the restore:\nbefore {type_sequence(before)}\nafter  {type_sequence(after)}"
        )
        assert_hash_chain(after, context=f"restored {key}")


# ── the test ─────────────────────────────────────────────────────────────


def test_a_dump_of_a_running_cluster_restores_every_run_and_its_open_runs_finish(cluster_factory, run_worker, tmp_path):
    """Dump taken while two nodes serve and a worker polls; restored into a new database; a
    node on it serves the same runs, statuses and histories, `capstan verify` passes, and the
    open runs (a signal wait, a durable timer) complete with the same worker code."""
    kind = cluster_factory.kind
    # Find the client programs first: a missing one fails before any server starts.
    if kind == "postgres":
        for program in ("pg_dump", "pg_restore"):
            postgres_program(program)
    else:
        for programs in (("mariadb-dump", "mysqldump"), ("mariadb", "mysql")):
            mariadb_program(*programs)

    a, b = cluster_factory.create(2)
    queue = unique("backup")
    ids = {name: unique(f"backup-{name}") for name in ("greet-a", "greet-b", "refused", "approval", "nap")}
    dump_file = tmp_path / ("capstan.pgdump" if kind == "postgres" else "capstan.sql")

    async def before_the_backup() -> tuple[dict[str, Any], dict[str, str]]:
        async with run_worker(a.url, queue, workflows=WORKFLOWS, activities=ACTIVITIES) as worker, \
                make_client(a.url) as on_a, make_client(b.url) as on_b:
            # Closed runs, started through both nodes of the cluster.
            greeted_a = await on_a.start_workflow(workflow_type="backup.greeting", task_queue=queue,
                                                  workflow_id=ids["greet-a"], input=["Ada"], memo=MEMO)
            greeted_b = await on_b.start_workflow(workflow_type="backup.greeting", task_queue=queue,
                                                  workflow_id=ids["greet-b"], input=["Grace"])
            refused = await on_b.start_workflow(workflow_type="backup.refusal", task_queue=queue,
                                                workflow_id=ids["refused"], input=["Linus"])
            assert await wait_result(greeted_a, timeout=30, workers=[worker]) == "Hello, Ada!"
            assert await wait_result(greeted_b, timeout=30, workers=[worker]) == "Hello, Grace!"
            with pytest.raises(WorkflowFailed):
                await wait_result(refused, timeout=30, workers=[worker])

            # Open runs: one waits for a signal, one sleeps on a durable timer.
            approval = await on_b.start_workflow(workflow_type="backup.approval", task_queue=queue,
                                                 workflow_id=ids["approval"], input=["expense-44"])
            nap = await on_a.start_workflow(workflow_type="backup.nap", task_queue=queue,
                                            workflow_id=ids["nap"], input=[NAP_SECONDS])
            napping_since = time.monotonic()
            await wait_for_history(on_b, ids["approval"], approval.run_id,
                                   lambda events: bool(events_of(events, "ConditionWaitOpened")), what="the signal wait")
            await wait_for_history(on_a, ids["nap"], nap.run_id,
                                   lambda events: bool(events_of(events, "TimerScheduled")), what="the timer")

            original = await cluster_state(b.url)
            statuses = {row["workflow_id"]: row["status"] for row in original["listed"]}
            assert set(statuses) == set(ids.values()), statuses
            assert [statuses[ids[n]] for n in ("greet-a", "greet-b", "refused")] == ["completed", "completed", "failed"]
            assert not any(row["is_terminal"] for row in original["listed"]
                           if row["workflow_id"] in (ids["approval"], ids["nap"])), original["listed"]

            # The backup, while both nodes serve and the worker polls.
            assert a.running and b.running and worker.alive
            await asyncio.to_thread(dump, kind, cluster_factory.clusters[0].database.url, dump_file)
            assert a.running and b.running and worker.alive
            assert time.monotonic() - napping_since < NAP_SECONDS, "the timer may have fired before the dump"
            # Nothing moved while the dump ran, so the dump holds exactly the state above.
            assert_same_state(await cluster_state(a.url), original)
            return original, {"approval": approval.run_id, "nap": nap.run_id}

    original, open_runs = run_async(before_the_backup(), timeout=120)
    for node in (a, b):
        assert node.terminate() == 0, f"node {node.name} did not stop cleanly"
    original_report = capstan_verify(cluster_factory.clusters[0].database.url)

    # The restore: a new, empty database, loaded with the database's own client, then verified
    # before any node has started on it.
    (restored_node,) = target = cluster_factory.create(1, start=False)
    restore(kind, dump_file, target.database.url)
    restored_report = capstan_verify(target.database.url)
    assert restored_report == original_report, (original_report, restored_report)
    assert restored_report["runs_checked"] >= len(ids) and restored_report["events_checked"] > 0, restored_report
    start_all(target)

    async def after_the_restore() -> None:
        assert_same_state(await cluster_state(restored_node.url), original)

        async with run_worker(restored_node.url, queue, workflows=WORKFLOWS, activities=ACTIVITIES) as worker, \
                make_client(restored_node.url) as client:
            approval = client.get_workflow_handle(ids["approval"], run_id=open_runs["approval"])
            receipt = await approval.signal("approve", ["Barbara"])
            assert receipt.get("outcome") == "signal_received", receipt
            assert await wait_result(approval, timeout=60, workers=[worker]) == "expense-44 approved: Hello, Barbara!"
            nap = client.get_workflow_handle(ids["nap"], run_id=open_runs["nap"])
            assert await wait_result(nap, timeout=NAP_SECONDS + 60, workers=[worker]) == f"slept {NAP_SECONDS}s"

        finished = await cluster_state(restored_node.url)
        statuses = {row["workflow_id"]: row["status"] for row in finished["listed"]}
        assert statuses == {**{row["workflow_id"]: row["status"] for row in original["listed"]},
                            ids["approval"]: "completed", ids["nap"]: "completed"}, statuses
        for name in ("approval", "nap"):
            key = (ids[name], open_runs[name])
            before, after = original["histories"][key], finished["histories"][key]
            assert after[:len(before)] == before, (
                f"{name}: the restored events are not the start of the finished history:\n"
                f"{type_sequence(before)}\n{type_sequence(after)}"
            )
            assert_history_invariants(after, terminal="WorkflowCompleted", context=name)
            assert_hash_chain(after, context=name)
        (signalled,) = events_of(finished["histories"][(ids["approval"], open_runs["approval"])], "SignalReceived")
        assert payload_of(signalled).get("signal_name") == "approve", signalled
        assert events_of(finished["histories"][(ids["nap"], open_runs["nap"])], "TimerFired")

    run_async(after_the_restore(), timeout=NAP_SECONDS + 120)
