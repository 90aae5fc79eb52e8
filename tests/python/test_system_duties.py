"""The system duties through the published Python SDK (``durable-workflow==2.12.0``): retention
enforced for a namespace (a run closed longer ago than its retention is removed and its id is
free again), and the repair / activity-timeout / retention status and pass calls.
"""
from __future__ import annotations

import sqlite3
import time

import httpx
from durable_workflow import Client, workflow

from capstan_harness import CONTROL_HEADERS, run_async, unique, wait_result


@workflow.defn(name="duties.quick")
class QuickWorkflow:
    def run(self, ctx, label):
        return label


def completed_in_a_one_day_namespace(server, run_worker, namespace, queue, workflow_ids):
    """Creates `namespace` keeping closed runs one day, completes one quick workflow per id there
    on `queue`, and returns each id's run id."""

    async def setup():
        async with httpx.AsyncClient(base_url=server.url, headers=CONTROL_HEADERS, timeout=30.0) as http:
            created = await http.post("/api/namespaces", json={"name": namespace, "retention_days": 1})
            assert created.status_code == 201, created.text
        client = Client(server.url, namespace=namespace)
        run_ids = {}
        async with run_worker(server.url, queue, workflows=[QuickWorkflow], namespace=namespace) as worker:
            for workflow_id in workflow_ids:
                handle = await client.start_workflow(workflow_type="duties.quick", task_queue=queue, workflow_id=workflow_id, input=[workflow_id])
                assert await wait_result(handle, timeout=30, workers=[worker]) == workflow_id
                run_ids[workflow_id] = (await client.describe_workflow(workflow_id)).run_id
        await client.aclose()
        return run_ids

    return run_async(setup(), timeout=60)


def test_retention_removes_expired_workflows_and_the_status_calls_answer(server_factory, run_worker):
    server = server_factory.create()
    namespace = unique("keep1day")
    queue = unique("duties")
    old_id, fresh_id = unique("old"), unique("fresh")
    completed_in_a_one_day_namespace(server, run_worker, namespace, queue, (old_id, fresh_id))
    # Age one run past the retention (two days ago), as if time had passed.
    two_days_ago = int(time.time() * 1000) - 2 * 86_400_000
    with sqlite3.connect(server.data_dir / "capstan.db") as db:
        db.execute("UPDATE runs SET closed_at = ? WHERE workflow_id = ?", (two_days_ago, old_id))

    async def duties():
        client = Client(server.url, namespace=namespace)
        try:
            status = await client.retention_status()
            passed = await client.retention_pass()
            after = await client.retention_status()
            gone = await client.list_workflows()
            repair = await client.repair_status()
            repaired = await client.repair_pass()
            timeouts = await client.activity_timeout_status()
            timeouts_pass = await client.activity_timeout_pass()
            # The removed id is free again.
            async with run_worker(server.url, queue, workflows=[QuickWorkflow], namespace=namespace) as worker:
                again = await client.start_workflow(workflow_type="duties.quick", task_queue=queue, workflow_id=old_id, input=["again"])
                assert await wait_result(again, timeout=30, workers=[worker]) == "again"
        finally:
            await client.aclose()
        async with httpx.AsyncClient(base_url=server.url, headers={**CONTROL_HEADERS, "X-Namespace": namespace}, timeout=30.0) as http:
            metrics = (await http.get("/api/system/metrics")).json()
        return status, passed, after, gone, repair, repaired, timeouts, timeouts_pass, metrics

    status, passed, after, gone, repair, repaired, timeouts, timeouts_pass, metrics = run_async(duties(), timeout=60)
    assert status["retention_days"] == 1 and status["expired_workflow_ids"] == [old_id], status
    assert passed["pruned"] == 1 and passed["workflow_ids"] == [old_id], passed
    assert after["expired_workflow_ids"] == []
    assert [w.workflow_id for w in gone.executions] == [fresh_id]
    assert repair["expired_leases"] == 0 and repair["candidates"] == []
    assert repaired == {"namespace": namespace, "repaired": 0, "not_needed": 0, "refused": []}
    assert timeouts["overdue_count"] == 0 and "processed" in timeouts_pass
    assert metrics["runs"] == {"completed": 2}, metrics


def test_a_retention_pass_given_run_ids_removes_only_those(server_factory, run_worker):
    server = server_factory.create()
    namespace = unique("keep1day")
    first_id, second_id = unique("first"), unique("second")
    run_ids = completed_in_a_one_day_namespace(server, run_worker, namespace, unique("duties"), (first_id, second_id))
    # Both runs closed two days ago: both are past the namespace's retention.
    two_days_ago = int(time.time() * 1000) - 2 * 86_400_000
    with sqlite3.connect(server.data_dir / "capstan.db") as db:
        db.execute("UPDATE runs SET closed_at = ? WHERE workflow_id IN (?, ?)", (two_days_ago, first_id, second_id))

    async def passes():
        client = Client(server.url, namespace=namespace)
        try:
            scoped = await client.retention_pass(run_ids=[run_ids[second_id]])
            between = await client.retention_status()
            unknown = await client.retention_pass(run_ids=["no-such-run"])
            rest = await client.retention_pass()
        finally:
            await client.aclose()
        return scoped, between, unknown, rest

    scoped, between, unknown, rest = run_async(passes(), timeout=60)
    assert scoped["pruned"] == 1 and scoped["workflow_ids"] == [second_id], scoped
    assert between["expired_workflow_ids"] == [first_id], between
    assert unknown["pruned"] == 0 and unknown["workflow_ids"] == [], unknown
    assert rest["pruned"] == 1 and rest["workflow_ids"] == [first_id], rest


def test_the_retention_duty_drains_every_expired_instance_in_one_pass(server_factory):
    """More instances expired than one batch (or the 500 a pass once took): the pass at startup
    removes them all, a batch per transaction, without waiting for the next pass a minute on."""
    server = server_factory.create()
    namespace, queue = unique("keep1day"), unique("drain")
    expired = 640
    headers = {**CONTROL_HEADERS, "X-Namespace": namespace}

    async def fill():
        async with httpx.AsyncClient(base_url=server.url, headers=CONTROL_HEADERS, timeout=30.0) as http:
            created = await http.post("/api/namespaces", json={"name": namespace, "retention_days": 1})
            assert created.status_code == 201, created.text
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30.0) as http:
            for i in range(expired + 1):
                started = await http.post("/api/workflows", json={
                    "workflow_type": "duties.quick", "workflow_id": f"{queue}-{i}", "task_queue": queue,
                })
                assert started.status_code == 201, started.text
                ended = await http.post(f"/api/workflows/{queue}-{i}/terminate", json={"reason": "done"})
                assert ended.status_code == 200, ended.text

    run_async(fill(), timeout=120)
    # All but the last closed two days ago; the duty's first pass comes with the next start.
    two_days_ago = int(time.time() * 1000) - 2 * 86_400_000
    with sqlite3.connect(server.data_dir / "capstan.db") as db:
        db.execute("UPDATE runs SET closed_at = ? WHERE namespace = ? AND workflow_id != ?",
                   (two_days_ago, namespace, f"{queue}-{expired}"))
    server.terminate()
    server.start()
    deadline = time.monotonic() + 30
    while True:
        counts = httpx.get(f"{server.url}/api/workflow-counts", headers=headers).json()
        if counts.get("terminated", counts.get("failed")) == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    listed = httpx.get(f"{server.url}/api/workflows?page_size=10", headers=headers).json()
    assert [w["workflow_id"] for w in listed["workflows"]] == [f"{queue}-{expired}"], (counts, listed)
