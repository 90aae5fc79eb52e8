"""Partitions between a node and its database: a fault proxy (``fault_proxy.py``) sits between
node A and the database; node B reaches the database directly and is used to read the truth.

* the worst case, a COMMIT that reached the database whose answer was lost: A answers
  ``503 commit_outcome_unknown`` (``retryable: true``), never as if it knew, and the retry with
  the same idempotency key (a signal's ``request_id``, a workflow task's lease and attempt, a
  start's workflow id under ``use-existing``) finds the committed change instead of making a
  second one; the Python SDK's own transport retry gets there by itself;
* a workload through A while connections are cut, delayed and blackholed: every request is
  retried with its key until acknowledged, and afterwards every acknowledged change is there
  exactly once.

Every test runs on PostgreSQL (``CAPSTAN_TEST_POSTGRES_URL``) and on MariaDB
(``CAPSTAN_TEST_MYSQL_URL``); run with ``.venv/bin/python -m pytest tests/python/test_partitions.py``.
"""
from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from urllib.parse import urlsplit

import httpx
import pytest

from capstan_harness import (
    CONTROL_HEADERS,
    ControlPlane,
    RawWorker,
    assert_hash_chain,
    assert_history_invariants,
    complete_workflow_command,
    decode_envelope,
    envelope,
    events_of,
    make_client,
    payload_of,
    run_async,
    type_sequence,
    unique,
)
from fault_proxy import FaultProxy

# A database slowed by the partition makes writes stand in line for their connection, and the
# node refuses new work until it clears (admission; nothing done either way).
RETRYABLE = {"storage_unavailable", "commit_outcome_unknown", "server_overloaded"}


@pytest.fixture
def partitioned(cluster_factory):
    """(proxy, A, B, database): A reaches the database through the proxy, B directly."""
    cluster = cluster_factory.create(2, start=False)
    a, b = cluster
    target = urlsplit(cluster.database.url)
    proxy = FaultProxy(target.hostname or "127.0.0.1", target.port or 5432).start()
    a.database = proxy.url_for(cluster.database.url)
    try:
        a.start()
        b.start()
        yield proxy, a, b, cluster.database
    finally:
        proxy.heal()
        proxy.stop()


def assert_outcome_unknown(resp: httpx.Response) -> None:
    assert resp.status_code == 503, f"{resp.status_code}: {resp.text[:300]}"
    body = resp.json()
    assert body.get("reason") == "commit_outcome_unknown" and body.get("retryable") is True, body
    assert body.get("recorded") is not True, body


# ── a. a COMMIT whose answer was lost ───────────────────────────────────


def test_a_commit_whose_answer_is_lost_is_reported_unknown_and_found_on_retry(partitioned):
    proxy, a, b, database = partitioned
    queue = unique("part-commit")
    workflow_id = unique("part")

    async def main():
        async with ControlPlane(a.url) as on_a, ControlPlane(b.url) as on_b, RawWorker(queue) as worker:
            # A start through A: its answer is lost; the retry (use-existing) finds the run.
            start = {"workflow_type": "part.commit", "workflow_id": workflow_id, "task_queue": queue,
                     "input": envelope([1]), "duplicate_policy": "use-existing"}
            proxy.cut_after_commit()
            assert_outcome_unknown(await on_a.http.post("/api/workflows", json=start))
            retried = await on_a.http.post("/api/workflows", json=start)
            assert retried.status_code in (200, 201), retried.text
            run_id = retried.json()["run_id"]
            ((runs,),) = database.query(f"SELECT count(*) FROM runs WHERE workflow_id = '{workflow_id}'")
            assert int(runs) == 1, runs

            # A signal through A with a request id: answer lost, retry answered from the receipt.
            signal = {"input": envelope(["one"]), "request_id": unique("sig")}
            path = f"/api/workflows/{workflow_id}/signal/go"
            proxy.cut_after_commit()
            assert_outcome_unknown(await on_a.http.post(path, json=signal))
            committed = events_of(await on_b.history(workflow_id, run_id), "SignalReceived")
            assert len(committed) == 1, "the cut COMMIT reached the database"
            again = await on_a.http.post(path, json=signal)
            assert again.status_code in (200, 202), again.text
            assert again.json().get("signal_id") == payload_of(committed[0]).get("signal_id"), (again.text, committed)
            assert len(events_of(await on_b.history(workflow_id, run_id), "SignalReceived")) == 1

            # The Python SDK's transport retry gets past a lost answer by itself.
            async with make_client(a.url) as client:
                proxy.cut_after_commit()
                await client.get_workflow_handle(workflow_id).signal("go", ["two"])
                assert proxy.commits_cut == 3, proxy.commits_cut
            signals = events_of(await on_b.history(workflow_id, run_id), "SignalReceived")
            assert len(signals) == 2, type_sequence(await on_b.history(workflow_id, run_id))

            # A workflow task completion through A: answer lost, the retry answers the same.
            await worker.register(b.url)
            task = await worker.next_workflow_task(b.url, within=15)
            proxy.cut_after_commit()
            assert_outcome_unknown(await worker.complete_workflow_task(a.url, task, [complete_workflow_command("done")]))
            retried = await worker.complete_workflow_task(a.url, task, [complete_workflow_command("done")])
            assert retried.status_code == 200, retried.text
            assert retried.json().get("run_status") == "completed", retried.text
            events = await on_b.history(workflow_id, run_id)
            assert_history_invariants(events, terminal="WorkflowCompleted", context=type_sequence(events))
            assert_hash_chain(events)
            (completed,) = events_of(events, "WorkflowCompleted")
            assert decode_envelope({"codec": "avro", "blob": payload_of(completed)["output"]}) == "done"
            print(f"{proxy.commits_cut} COMMIT answers lost; each retry found its change, none made twice")

    run_async(main(), timeout=60)


# ── b. a workload through drops, delays and blackholes ───────────────────


class Stats:
    def __init__(self) -> None:
        self.acked = 0
        self.retries = 0
        self.answers: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()


async def until_acked(http: httpx.AsyncClient, path: str, body: dict, stats: Stats, ok: tuple[int, ...]) -> dict:
    """Sends ``body`` (with its idempotency key) until it is acknowledged."""
    deadline = time.monotonic() + 90
    while True:
        try:
            resp = await http.post(path, json=body)
        except httpx.HTTPError as error:
            stats.answers[type(error).__name__] += 1
        else:
            if resp.status_code in ok:
                stats.acked += 1
                return resp.json()
            reason = resp.json().get("reason") if resp.headers.get("content-type", "").startswith("application/json") else None
            stats.answers[f"{resp.status_code} {reason}"] += 1
            assert resp.status_code == 503 and reason in RETRYABLE, f"{path}: {resp.status_code} {resp.text[:300]}"
        assert time.monotonic() < deadline, f"{path} never acknowledged: {dict(stats.answers)}"
        stats.retries += 1
        await asyncio.sleep(0.1)


async def chaos(proxy: FaultProxy, stats: Stats, stop: asyncio.Event) -> None:
    rng = random.Random(19)
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        fault = rng.choice(["drop", "delay", "blackhole", "cut"])
        stats.faults[fault] += 1
        if fault == "drop":
            await loop.run_in_executor(None, proxy.drop_all)
        elif fault == "delay":
            await loop.run_in_executor(None, proxy.delay, 0.15)
        elif fault == "blackhole":
            await loop.run_in_executor(None, proxy.blackhole)
        else:
            await loop.run_in_executor(None, proxy.cut_after_commit, 1)
        await asyncio.sleep(rng.uniform(0.3, 1.0))
        await loop.run_in_executor(None, proxy.heal)
        await asyncio.sleep(rng.uniform(0.2, 0.6))


def test_acknowledged_changes_survive_drops_delays_and_blackholes(partitioned):
    proxy, a, b, database = partitioned
    queue = unique("part-load")
    prefix = unique("load")
    workflows, seconds = 8, 15.0
    stats = Stats()
    signalled: Counter[str] = Counter()

    async def one_workflow(http: httpx.AsyncClient, i: int, until: float) -> None:
        workflow_id = f"{prefix}-{i}"
        await until_acked(http, "/api/workflows", {
            "workflow_type": "part.load", "workflow_id": workflow_id, "task_queue": queue,
            "input": envelope([i]), "duplicate_policy": "use-existing",
        }, stats, (200, 201))
        while time.monotonic() < until:
            n = signalled[workflow_id]
            body = {"input": envelope([n]), "request_id": f"{workflow_id}-signal-{n}"}
            await until_acked(http, f"/api/workflows/{workflow_id}/signal/go", body, stats, (200, 202))
            signalled[workflow_id] += 1

    async def main():
        stop = asyncio.Event()
        began = time.monotonic()
        async with httpx.AsyncClient(base_url=a.url, headers=CONTROL_HEADERS, timeout=5.0) as http:
            breaker = asyncio.create_task(chaos(proxy, stats, stop))
            try:
                await asyncio.gather(*(one_workflow(http, i, began + seconds) for i in range(workflows)))
            finally:
                stop.set()
                await breaker
        proxy.heal()
        elapsed = time.monotonic() - began
        async with ControlPlane(b.url) as on_b:
            for i in range(workflows):
                workflow_id = f"{prefix}-{i}"
                ((runs,),) = database.query(f"SELECT count(*) FROM runs WHERE workflow_id = '{workflow_id}'")
                assert int(runs) == 1, f"{workflow_id}: {runs} runs"
                run_id = (await on_b.describe(workflow_id))["run_id"]
                events = await on_b.history(workflow_id, run_id)
                assert_hash_chain(events, context=workflow_id)
                received = [decode_envelope(payload_of(e)["arguments"])
                            for e in events_of(events, "SignalReceived")]
                assert received == [[n] for n in range(signalled[workflow_id])], f"{workflow_id}: {received}"
        total = sum(signalled.values())
        print(f"{workflows} starts and {total} signals acknowledged in {elapsed:.1f}s through "
              f"{sum(stats.faults.values())} faults {dict(stats.faults)}; {stats.retries} retries; answers before "
              f"an ack: {dict(stats.answers)}; connections cut {proxy.dropped}, COMMIT answers lost {proxy.commits_cut}; "
              f"every acknowledged change present exactly once, in order")
        assert stats.acked == workflows + total
        assert sum(stats.faults.values()) >= 8 and stats.retries > 0, (stats.faults, stats.retries)

    run_async(main(), timeout=150)
