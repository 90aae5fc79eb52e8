"""A batch over 10,000 runs outlives the process stepping it (``docs/batch-operations.md``).

A signal batch is the witness: a run acted on twice would hold two ``SignalReceived`` events.

* SQLite: the server is SIGKILLed in the middle of the batch and started again on its data
  dir; the batch goes on from its last saved page.
* PostgreSQL: two nodes share the database; one is SIGKILLed in the middle of the batch, and
  the other takes the batch over (at once, or when the dead node's hold on a step runs out).

Afterwards every run holds the batch's signal exactly once, read from the database itself,
and the batch's tallies say so: 10,000 matched, 10,000 done.
"""
from __future__ import annotations

import asyncio
import sqlite3
import time

import httpx
import pytest

from capstan_harness import CONTROL_HEADERS, envelope, psql, unique

RUNS = 10_000
SIGNAL = "batch-crash-signal"
# Starts are refused with 503 when the queue's backlog is old (overload admission); this test
# parks 10,000 runs with no worker on purpose.
SERVER_ARGS = ("--overload-queue-delay-ms", "0")


async def start_runs(urls: list[str], queue: str) -> None:
    """RUNS workflows on ``queue``, spread over ``urls``, a few dozen requests at a time."""
    clients = [httpx.AsyncClient(base_url=url, headers=CONTROL_HEADERS, timeout=60) for url in urls]
    gate = asyncio.Semaphore(32)

    async def start(i: int) -> None:
        async with gate:
            resp = await clients[i % len(clients)].post("/api/workflows", json={
                "workflow_type": "batch.crash",
                "workflow_id": f"{queue}-{i:05d}",
                "task_queue": queue,
                "input": envelope([i]),
            })
            assert resp.status_code == 201, resp.text[:300]

    try:
        await asyncio.gather(*(start(i) for i in range(RUNS)))
    finally:
        for client in clients:
            await client.aclose()


def control(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers=CONTROL_HEADERS, timeout=30)


def start_batch(url: str, queue: str) -> str:
    with control(url) as http:
        resp = http.post("/api/batch-operations", json={
            "action": "signal", "task_queue": queue, "signal_name": SIGNAL,
            "input": envelope(["go"]), "request_id": f"{queue}-batch",
        })
        assert resp.status_code == 201, resp.text
        return resp.json()["batch_id"]


def batch_of(url: str, batch_id: str) -> dict:
    with control(url) as http:
        resp = http.get(f"/api/batch-operations/{batch_id}")
        assert resp.status_code == 200, resp.text
        return resp.json()


def wait_until_partway(url: str, batch_id: str) -> dict:
    """The batch once it has visited some pages, but not all."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        batch = batch_of(url, batch_id)
        assert batch["state"] == "running", f"the batch ended before the kill: {batch}"
        if batch["matched"] >= 1_000:
            return batch
        time.sleep(0.05)
    raise AssertionError(f"the batch did not get going: {batch_of(url, batch_id)}")


def wait_finished(url: str, batch_id: str, within: float) -> dict:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        batch = batch_of(url, batch_id)
        if batch["state"] != "running":
            return batch
        time.sleep(0.2)
    raise AssertionError(f"the batch did not finish within {within} s: {batch_of(url, batch_id)}")


SIGNALS_PER_RUN = (
    "SELECT COUNT(*), COUNT(DISTINCT h.run_id) FROM history_events h JOIN runs r ON r.run_id = h.run_id "
    f"WHERE h.event_type = 'SignalReceived' AND r.task_queue = '{{queue}}' AND h.payload LIKE '%{SIGNAL}%'"
)


def assert_each_run_signalled_once(batch: dict, signals: int, runs_signalled: int) -> None:
    assert batch["state"] == "completed", batch
    assert (batch["matched"], batch["done"], batch["failed"], batch["skipped"]) == (RUNS, RUNS, 0, 0), batch
    assert (signals, runs_signalled) == (RUNS, RUNS), f"{signals} signals over {runs_signalled} runs"


def test_a_batch_survives_a_server_kill_on_sqlite(server_factory):
    server = server_factory.create(*SERVER_ARGS)
    queue = unique("batch-kill")
    asyncio.run(start_runs([server.url], queue))
    batch_id = start_batch(server.url, queue)
    partway = wait_until_partway(server.url, batch_id)
    server.kill()
    server.start()
    batch = wait_finished(server.url, batch_id, within=150)
    assert batch["matched"] > partway["matched"], (partway, batch)
    with sqlite3.connect(f"file:{server.data_dir / 'capstan.db'}?mode=ro", uri=True) as db:
        signals, runs = db.execute(SIGNALS_PER_RUN.format(queue=queue)).fetchone()
    assert_each_run_signalled_once(batch, signals, runs)


@pytest.mark.parametrize("cluster_factory", ["postgres"], indirect=True)
def test_a_batch_survives_a_node_kill_on_postgres(cluster_factory):
    a, b = cluster_factory.create(2, *SERVER_ARGS)
    queue = unique("batch-node-kill")
    asyncio.run(start_runs([a.url, b.url], queue))
    batch_id = start_batch(a.url, queue)
    wait_until_partway(b.url, batch_id)
    a.kill()
    # The survivor finishes it, taking over a step the dead node held once its hold (30 s) ends.
    batch = wait_finished(b.url, batch_id, within=150)
    database = cluster_factory.clusters[0].database
    signals, runs = (int(n) for n in psql(database.url, SIGNALS_PER_RUN.format(queue=queue)).split("|"))
    assert_each_run_signalled_once(batch, signals, runs)
