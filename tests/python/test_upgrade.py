"""Upgrade and rollback safety, with a database an earlier Capstan wrote.

``fixtures/upgrade-8c771b3/capstan.db`` was written by ``capstan serve`` built from commit
8c771b3 (four schema migrations ago), running the workload below through the Python SDK and
stopped with SIGTERM: one workflow completed, one failed, one waiting for a signal, one
waiting on a durable timer that is overdue by the time it is opened again, and one whose first
workflow task no worker has taken yet. ``histories.json`` is what that server served for each.

* The current binary opens a copy, migrates it and, under new load, finishes every old run the
  way the old one would have: the old events are unchanged (sequence, type, hash), the timer
  fires once, the signal is taken, the pending task is run; ``capstan verify`` finds nothing.
* A database whose schema floor (``crates/store/src/schema_floor.rs``) is above what a binary
  knows is refused at start-up with a message that says what to do; one that is merely newer
  (additive migrations, as a rolling upgrade leaves it) is served.

The workload and the fixture's generator are in ``upgrade_workload.py``.
"""
from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import subprocess
from pathlib import Path

from capstan_harness import (
    BackgroundWorker,
    CapstanServer,
    assert_hash_chain,
    capstan_binary,
    fetch_history,
    free_port,
    make_client,
    run_async,
    type_sequence,
    unique,
    wait_result,
)
from upgrade_workload import ACTIVITIES, IDLE_QUEUE, QUEUE, WORKFLOWS

FIXTURE = Path(__file__).with_name("fixtures") / "upgrade-8c771b3"


def stable(events: list[dict]) -> list[tuple]:
    """What must never change about a recorded event across versions."""
    return [(e.get("sequence"), e.get("event_type"), e.get("event_hash") or e.get("hash")) for e in events]


def test_a_database_from_an_earlier_capstan_migrates_and_its_runs_go_on(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    shutil.copy(FIXTURE / "capstan.db", data_dir / "capstan.db")
    recorded = json.loads((FIXTURE / "histories.json").read_text())
    server = CapstanServer(data_dir, tmp_path / "server.log")
    server.start()

    async def main():
        async with make_client(server.url) as client:
            # The old runs as the old server left them.
            for workflow_id, old in recorded.items():
                events = await fetch_history(client, workflow_id, old["run_id"])
                assert stable(events[: len(old["events"])]) == stable(old["events"]), f"{workflow_id} changed"
                assert_hash_chain(events, context=workflow_id)
            worker = BackgroundWorker(server.url, QUEUE, workflows=WORKFLOWS, activities=ACTIVITIES)
            idle = BackgroundWorker(server.url, IDLE_QUEUE, workflows=WORKFLOWS, activities=ACTIVITIES)
            await worker.start()
            await idle.start()
            try:
                # New load while the old runs finish.
                fresh = await asyncio.gather(*(
                    client.start_workflow(workflow_type="upgrade.greet", task_queue=QUEUE,
                                          workflow_id=unique("new-greet"), input=[f"n{i}"])
                    for i in range(10)
                ))
                signalled = client.get_workflow_handle("old-signalled")
                await signalled.signal("go", ["after-upgrade"])
                handles = {wid: client.get_workflow_handle(wid) for wid in recorded}
                results = {wid: await wait_result(h, timeout=60, workers=[worker, idle])
                           for wid, h in handles.items() if wid != "old-failing"}
                assert results == {
                    "old-greet": "echo:ada",
                    "old-signalled": ["echo:cy", "echo:after-upgrade"],
                    "old-sleeper": "slept",
                    "old-pending": "echo:dee",
                }, results
                assert (await handles["old-failing"].describe()).status == "failed"
                assert [await wait_result(h, timeout=30, workers=[worker]) for h in fresh] == [
                    f"echo:n{i}" for i in range(10)
                ]
                for workflow_id, old in recorded.items():
                    events = await fetch_history(client, workflow_id, old["run_id"])
                    assert stable(events[: len(old["events"])]) == stable(old["events"]), f"{workflow_id} rewritten"
                    assert_hash_chain(events, context=workflow_id)
                    if workflow_id == "old-sleeper":
                        assert type_sequence(events).count("TimerFired") == 1, type_sequence(events)
            finally:
                await worker.stop()
                await idle.stop()

    try:
        run_async(main(), timeout=120)
    finally:
        server.terminate()
    verified = subprocess.run([str(capstan_binary()), "verify", "--data-dir", str(data_dir)],
                              capture_output=True, text=True, timeout=60)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def _serve_once(data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(capstan_binary()), "serve", "--listen", f"127.0.0.1:{free_port()}", "--data-dir", str(data_dir)],
        capture_output=True, text=True, timeout=20,
    )


def test_a_database_a_binary_cannot_run_against_is_refused_and_a_newer_additive_one_is_served(tmp_path):
    data_dir = tmp_path / "data"
    server = CapstanServer(data_dir, tmp_path / "server.log")
    server.start()
    server.terminate()
    database = data_dir / "capstan.db"
    with sqlite3.connect(database) as db:
        (known,) = db.execute("SELECT MAX(version) FROM schema_migrations").fetchone()
        (floor,) = db.execute("SELECT floor FROM schema_floor WHERE id = 1").fetchone()
        assert floor >= 1, floor
        # A newer binary added a migration older ones can run against: served.
        db.execute("INSERT INTO schema_migrations (version, applied_at) VALUES (?, 0)", (known + 1,))
    again = CapstanServer(data_dir, tmp_path / "again.log")
    again.start()
    again.terminate()
    assert "migrations this binary does not know" in again.log_text(), again.log_tail(20)

    with sqlite3.connect(database) as db:
        # ...and then one they cannot: refused, with what to do.
        db.execute("INSERT INTO schema_migrations (version, applied_at) VALUES (?, 0)", (known + 2,))
        db.execute("UPDATE schema_floor SET floor = ? WHERE id = 1", (known + 2,))
    refused = _serve_once(data_dir)
    assert refused.returncode != 0, refused.stderr
    message = refused.stderr + refused.stdout
    assert "written by a newer Capstan" in message and f"this binary knows {known}" in message, message
    assert "restore the backup taken before the upgrade" in message, message
    with sqlite3.connect(database) as db:
        assert db.execute("SELECT floor FROM schema_floor").fetchone() == (known + 2,), "the refusal wrote nothing"
