"""Workers and task queues as an operator sees them, through the published Python SDK
(``durable-workflow==2.12.0``): the roster with stale detection, task-queue describe with
pollers, backlog and current leases, the "no live worker" diagnostic, and operator removal of a
worker (its leased workflow tasks are handed back at once).
"""
from __future__ import annotations

import asyncio
import os
import threading

import httpx
from durable_workflow import activity, workflow

from capstan_harness import CONTROL_HEADERS, make_client, run_async, unique, wait_result

RELEASE = threading.Event()


@activity.defn(name="fleet.slow")
def slow(label: str) -> str:
    RELEASE.wait(30)
    return label


@workflow.defn(name="fleet.job")
class JobWorkflow:
    def run(self, ctx, label):
        result = yield ctx.schedule_activity("fleet.slow", [label], start_to_close_timeout=60)
        return result


def test_workers_and_task_queues_are_visible_and_removable(server_url, worker_url, run_worker):
    queue = unique("fleet")
    idle_queue = unique("fleet-idle")
    RELEASE.clear()

    async def main():
        async with run_worker(worker_url, queue, workflows=[JobWorkflow], activities=[slow]) as worker, \
                make_client(server_url) as client, \
                httpx.AsyncClient(base_url=server_url, headers=CONTROL_HEADERS, timeout=30.0) as http:
            handle = await client.start_workflow(workflow_type="fleet.job", task_queue=queue, workflow_id=unique("job"), input=["x"])
            roster = await client.list_workers(task_queue=queue)
            described_queue = None
            for _ in range(100):
                described_queue = await client.describe_task_queue(queue)
                if any(l["task_kind"] == "activity" for l in described_queue.current_leases or []):
                    break
                await asyncio.sleep(0.1)
            worker_view = await client.describe_worker(worker.name)
            listed_queues = await client.list_task_queues()
            # A queue with work and nobody polling it says so.
            await client.start_workflow(workflow_type="fleet.job", task_queue=idle_queue, workflow_id=unique("orphan"), input=["y"])
            idle = (await http.get(f"/api/task-queues/{idle_queue}")).json()
            missing = await http.get("/api/workers/no-such-worker")
            RELEASE.set()
            result = await wait_result(handle, timeout=30, workers=[worker])
        return roster, described_queue, worker_view, listed_queues, idle, missing, result

    roster, described_queue, worker_view, listed_queues, idle, missing, result = run_async(main(), timeout=90)
    assert result == "x"
    assert roster.stale_after_seconds == 120
    (listed,) = [w for w in roster.workers if w.task_queue == queue]
    assert listed.status == "active" and listed.runtime == "python" and "fleet.job" in listed.supported_workflow_types
    assert worker_view.worker_id == listed.worker_id and worker_view.heartbeat_interval_seconds == 60
    # The slots and process metrics the SDK reports are kept and shown (not null).
    assert set(worker_view.task_slots) == {"workflow_available", "activity_available", "session_available"}, worker_view
    assert worker_view.process_metrics["process_id"] == os.getpid(), worker_view.process_metrics
    assert [p["worker_id"] for p in described_queue.pollers] == [listed.worker_id]
    assert described_queue.pollers[0]["task_slots"] == worker_view.task_slots
    assert described_queue.pollers[0]["process_metrics"]["process_id"] == os.getpid()
    (lease,) = described_queue.current_leases
    assert lease["task_kind"] == "activity" and lease["lease_owner"] == listed.worker_id and lease["type"] == "fleet.slow"
    assert described_queue.stats["activity_tasks"]["leased_count"] == 1
    assert queue in [q.name for q in listed_queues.task_queues]
    assert idle["stats"]["backlog"] == 1 and idle["pollers"] == []
    assert idle["diagnostics"][0]["reason"] == "no_live_worker", idle
    assert missing.status_code == 404 and missing.json()["reason"] == "worker_not_found"


def test_a_heartbeat_reports_slots_metrics_and_its_own_cadence(server_url, worker_url):
    """What a heartbeat carries is kept: free slots (shown clamped to the registered maximum),
    process metrics as reported, and a declared cadence, which the server answers with and
    judges staleness by. A field a heartbeat may not carry is refused by name."""
    from capstan_harness import RawWorker

    queue = unique("fleet-beat")

    async def main():
        async with make_client(worker_url) as client, RawWorker(queue) as raw:
            await raw.register(worker_url)
            ack = await client.heartbeat_worker(
                worker_id=raw.worker_id,
                task_slots={"workflow_available": 7, "activity_available": 2},
                process_metrics={"process_id": 4242, "memory_bytes": 1048576, "host": "box-1"},
                heartbeat_interval_seconds=300,
            )
            view = await client.describe_worker(raw.worker_id)
            refused = await raw.post(worker_url, "/worker/heartbeat", {"worker_id": raw.worker_id, "active_slots": 3})
            bad_slots = await raw.post(worker_url, "/worker/heartbeat",
                                       {"worker_id": raw.worker_id, "task_slots": {"gpu_available": 1}})
        return ack, view, refused, bad_slots

    ack, view, refused, bad_slots = run_async(main(), timeout=60)
    assert ack["heartbeat_interval_seconds"] == 300 and ack["stale_after_seconds"] == 600, ack
    assert view.heartbeat_interval_seconds == 300 and view.status == "active"
    assert view.process_metrics == {"process_id": 4242, "memory_bytes": 1048576, "host": "box-1"}
    assert view.task_slots["activity_available"] == 2
    assert refused.status_code == 422 and "active_slots" in refused.json()["errors"], refused.text
    assert bad_slots.status_code == 422 and "task_slots.gpu_available" in bad_slots.json()["errors"], bad_slots.text


def test_an_operator_removes_a_worker_and_its_workflow_lease_is_handed_back(server_url, worker_url):
    """A raw worker leases a workflow task and goes silent; DELETE /api/workers/{id} frees the
    task for another worker without waiting out the lease."""
    from capstan_harness import RawWorker

    queue = unique("fleet-remove")

    async def main():
        async with make_client(server_url) as client, RawWorker(queue) as stuck, RawWorker(queue) as other:
            await stuck.register(worker_url)
            await client.start_workflow(workflow_type="fleet.job", task_queue=queue, workflow_id=unique("held"), input=["z"])
            await stuck.next_workflow_task(worker_url, within=10)
            removed = await client.deregister_worker(stuck.worker_id)
            gone = await client.list_workers(task_queue=queue)
            await other.register(worker_url)
            task = await other.next_workflow_task(worker_url, within=5)
        return removed, gone, task

    removed, gone, task = run_async(main(), timeout=60)
    assert removed["deleted"] is True and removed["recovered_workflow_task_count"] == 1, removed
    assert gone.workers == []
    assert task["workflow_type"] == "fleet.job"


def test_build_id_rollouts_through_the_sdk(server_url, worker_url, run_worker):
    queue = unique("fleet-rollout")

    async def main():
        async with run_worker(worker_url, queue, workflows=[JobWorkflow], activities=[slow], build_id="v1") as worker, \
                make_client(server_url) as client:
            drained = await client.drain_task_queue_build_id(queue, "v1")
            again = await client.drain_task_queue_build_id(queue, "v1")
            rollout = await client.list_task_queue_build_ids(queue)
            draining = await client.list_workers(task_queue=queue, status="draining")
            resumed = await client.resume_task_queue_build_id(queue, "v1")
            unversioned = await client.drain_task_queue_build_id(queue, None)
            after = await client.list_task_queue_build_ids(queue)
            RELEASE.set()
            handle = await client.start_workflow(workflow_type="fleet.job", task_queue=queue, workflow_id=unique("after"), input=["v1 works"])
            result = await wait_result(handle, timeout=30, workers=[worker])
        return drained, again, rollout, draining, resumed, unversioned, after, result

    drained, again, rollout, draining, resumed, unversioned, after, result = run_async(main(), timeout=60)
    assert drained.drain_intent == "draining" and drained.drained_at and again.drained_at == drained.drained_at
    (cohort,) = [c for c in rollout.build_ids if c.build_id == "v1"]
    assert cohort.drain_intent == "draining" and cohort.draining_worker_count == 1 and cohort.total_worker_count == 1
    assert [w.build_id for w in draining.workers] == ["v1"]
    assert resumed.drain_intent == "active" and resumed.drained_at is None
    assert unversioned.build_id is None and unversioned.drain_intent == "draining"
    assert {c.build_id: c.drain_intent for c in after.build_ids} == {"v1": "active", None: "draining"}
    assert result == "v1 works", "a resumed cohort takes work; draining the unversioned one does not touch v1"


@workflow.defn(name="fleet.versioned")
class VersionedV1:
    def run(self, ctx):
        return "ran on v1"


@workflow.defn(name="fleet.versioned")
class VersionedV2:
    def run(self, ctx):
        return "ran on v2"


def test_a_run_started_on_a_build_replays_only_on_that_build(server_url, worker_url, run_worker):
    """Two builds of one workflow type share a queue; a run started with build_id="v1" is
    delivered only to the v1 worker, while both poll."""
    queue = unique("fleet-pin")

    async def main():
        async with run_worker(worker_url, queue, workflows=[VersionedV1], build_id="v1") as v1, \
                run_worker(worker_url, queue, workflows=[VersionedV2], build_id="v2") as v2, \
                make_client(server_url) as client:
            results = []
            for build in ["v1", "v2", "v1", "v2"]:
                handle = await client.start_workflow(
                    workflow_type="fleet.versioned", task_queue=queue, workflow_id=unique(f"pin-{build}"), build_id=build,
                )
                results.append((build, await wait_result(handle, timeout=30, workers=[v1, v2])))
                described = await client.describe_workflow(handle.workflow_id)
        return results, described

    results, described = run_async(main(), timeout=90)
    assert all(result == f"ran on {build}" for build, result in results), results
