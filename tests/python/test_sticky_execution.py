"""Sticky execution end to end: SDK ``Worker``s with ``sticky_cache_capacity > 0``
(``durable-workflow==2.12.0``) against a real ``capstan serve``.

The SDK counts, per workflow task it loads, a cache ``hit`` (the task came with
``sticky_replay_mode: sticky_hit_expected`` and the cached history matched), a
``miss``, and a ``forced_cold_replay`` (a miss on a task marked
``sticky_hit_expected`` / ``forced_cold_replay``). It reports the counters with
every claim, and the run's describe shows the claim as ``sticky``. A completion
that closes the run carries no claim, so the claim is read while the run waits
for a signal.
"""
from __future__ import annotations

import time
from datetime import datetime

from durable_workflow import activity, workflow

from capstan_harness import (
    ControlPlane,
    assert_history_invariants,
    events_of,
    fetch_history,
    make_client,
    run_async,
    unique,
    wait_for_history,
    wait_result,
)

STEPS = 5
TTL_SECONDS = 60
SDK_BUILD_PREFIX = "durable-workflow-python/"


@activity.defn(name="sticky.step")
async def sticky_step(label: str, n: int) -> str:
    return f"{label}{n}"


class _Signals:
    def __init__(self) -> None:
        self.received: list[str] = []

    @workflow.signal("go")
    def go(self, value: str) -> None:
        self.received.append(value)


@workflow.defn(name="sticky.steps")
class StepsWorkflow(_Signals):
    """STEPS sequential activities, then waits for one `go` signal."""

    def run(self, ctx, label):
        parts = []
        for n in range(STEPS):
            part = yield ctx.schedule_activity("sticky.step", [label, n])
            parts.append(part)
        yield ctx.wait_condition(lambda: len(self.received) >= 1)
        return "-".join(parts) + "|" + self.received[0]


@workflow.defn(name="sticky.handoff")
class HandoffWorkflow(_Signals):
    """activity -> wait `go` -> activity -> wait `go` -> result (used by both later tests)."""

    def run(self, ctx, label):
        first = yield ctx.schedule_activity("sticky.step", [label, 1])
        yield ctx.wait_condition(lambda: len(self.received) >= 1)
        second = yield ctx.schedule_activity("sticky.step", [label, 2])
        yield ctx.wait_condition(lambda: len(self.received) >= 2)
        return [first, second, *self.received]


STICKY = {"sticky_cache_capacity": 16, "sticky_cache_ttl_seconds": TTL_SECONDS}


def _counters(metrics: dict) -> dict:
    return {k: metrics.get(k) for k in ("hit", "miss", "eviction", "forced_cold_replay")}


def _ms(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000


async def _sticky(control: ControlPlane, workflow_id: str) -> dict:
    described = await control.describe(workflow_id)
    sticky = described.get("sticky")
    assert isinstance(sticky, dict), f"describe of open run {workflow_id} has no sticky claim: {sticky!r}"
    return sticky


async def _waits(client, handle, count: int) -> None:
    await wait_for_history(client, handle.workflow_id, handle.run_id,
                           lambda evs: len(events_of(evs, "ConditionWaitOpened")) >= count,
                           what=f"{count} ConditionWaitOpened")


def test_sticky_worker_hits_its_cache(server_url, worker_url, run_worker):
    queue = unique("sticky-hits")
    workflow_id = unique("sticky-steps")

    async def main():
        async with ControlPlane(server_url) as control:
            info = await control.cluster_info()
            advertised = info["worker_protocol"]["server_capabilities"]["sticky_execution"]
            assert advertised.get("supported") is True, advertised
            # Before the feature, Worker.run() raised RuntimeError here (no advertised support).
            async with run_worker(worker_url, queue, workflows=[StepsWorkflow], activities=[sticky_step],
                                  **STICKY) as worker:
                async with make_client(server_url) as client:
                    handle = await client.start_workflow(
                        workflow_type="sticky.steps", task_queue=queue, workflow_id=workflow_id, input=["s"],
                    )
                    await _waits(client, handle, 1)
                    sticky = await _sticky(control, workflow_id)
                    await handle.signal("go", ["done"])
                    result = await wait_result(handle, timeout=30, workers=[worker])
                    after = (await control.describe(workflow_id)).get("sticky")
                    events = await fetch_history(client, workflow_id, handle.run_id)
                metrics = worker.worker.sticky_cache_metrics()
        return worker.name, sticky, result, after, events, metrics

    name, sticky, result, after, events, metrics = run_async(main(), timeout=60)
    assert result == "-".join(f"s{n}" for n in range(STEPS)) + "|done"
    assert_history_invariants(events, terminal="WorkflowCompleted")
    assert sticky["worker_id"] == name, sticky
    assert str(sticky["build_id"]).startswith(SDK_BUILD_PREFIX), sticky
    assert _ms(sticky["expires_at"]) - _ms(sticky["claimed_at"]) == TTL_SECONDS * 1000, sticky
    # First task: cold (unclaimed run). The STEPS tasks after each activity: warm hits.
    assert _counters(sticky["metrics"]) == {"hit": STEPS, "miss": 1, "eviction": 0, "forced_cold_replay": 0}, sticky
    # ...and the signal's task, which closed the run (no claim; the entry is dropped).
    assert _counters(metrics) == {"hit": STEPS + 1, "miss": 1, "eviction": 0, "forced_cold_replay": 0}, metrics
    assert metrics["entries"] == 0, metrics
    assert after is None, f"a closed run keeps a sticky claim: {after}"


def test_forced_cold_replay_after_owner_stops(server_url, worker_url, run_worker):
    queue = unique("sticky-handoff")
    workflow_id = unique("sticky-handoff")

    async def main():
        async with ControlPlane(server_url) as control, make_client(server_url) as client:
            async with run_worker(worker_url, queue, workflows=[HandoffWorkflow], activities=[sticky_step],
                                  **STICKY) as worker_a:
                handle = await client.start_workflow(
                    workflow_type="sticky.handoff", task_queue=queue, workflow_id=workflow_id, input=["h"],
                )
                await _waits(client, handle, 1)
                claim_a = await _sticky(control, workflow_id)
            # worker_a stopped and deregistered; its claim stays on the run but holds nothing.
            metrics_a = worker_a.worker.sticky_cache_metrics()
            async with run_worker(worker_url, queue, workflows=[HandoffWorkflow], activities=[sticky_step],
                                  **STICKY) as worker_b:
                signalled = time.monotonic()
                await handle.signal("go", ["one"])
                await _waits(client, handle, 2)
                handoff_seconds = time.monotonic() - signalled
                claim_b = await _sticky(control, workflow_id)
                await handle.signal("go", ["two"])
                result = await wait_result(handle, timeout=30, workers=[worker_b])
                metrics_b = worker_b.worker.sticky_cache_metrics()
        return worker_a.name, worker_b.name, claim_a, metrics_a, claim_b, handoff_seconds, result, metrics_b

    name_a, name_b, claim_a, metrics_a, claim_b, handoff_seconds, result, metrics_b = run_async(main(), timeout=60)
    assert result == ["h1", "h2", "one", "two"]
    assert claim_a["worker_id"] == name_a, claim_a
    assert _counters(metrics_a) == {"hit": 1, "miss": 1, "eviction": 0, "forced_cold_replay": 0}, metrics_a
    # B got the run's task as a forced cold replay (a miss), then hit on its own claim.
    assert claim_b["worker_id"] == name_b, claim_b
    assert _counters(claim_b["metrics"]) == {"hit": 1, "miss": 1, "eviction": 0, "forced_cold_replay": 1}, claim_b
    assert _counters(metrics_b) == {"hit": 2, "miss": 1, "eviction": 0, "forced_cold_replay": 1}, metrics_b
    # A deregistered owner must not hold the task for the 5 s sticky hold.
    assert handoff_seconds < 4.0, f"B took {handoff_seconds:.1f}s to run the task after the signal"


def test_sticky_claim_survives_server_restart(server_factory, run_worker):
    server = server_factory.create()
    queue = unique("sticky-restart")
    workflow_id = unique("sticky-restart")

    async def main():
        async with ControlPlane(server.url) as control, make_client(server.url, patient=True) as client:
            async with run_worker(server.url, queue, workflows=[HandoffWorkflow], activities=[sticky_step],
                                  **STICKY) as worker:
                handle = await client.start_workflow(
                    workflow_type="sticky.handoff", task_queue=queue, workflow_id=workflow_id, input=["r"],
                )
                await _waits(client, handle, 1)
                before = await _sticky(control, workflow_id)
                server.kill()
                server.spawn()
                await server.wait_ready_async()
                restored = await _sticky(control, workflow_id)
                await handle.signal("go", ["one"])
                await _waits(client, handle, 2)
                await handle.signal("go", ["two"])
                result = await wait_result(handle, timeout=40, workers=[worker])
                events = await fetch_history(client, workflow_id, handle.run_id)
                metrics = worker.worker.sticky_cache_metrics()
                alive = worker.alive
        return worker.name, before, restored, result, events, metrics, alive

    name, before, restored, result, events, metrics, alive = run_async(main(), timeout=90)
    assert alive, "the sticky worker's loop died across the server restart"
    assert result == ["r1", "r2", "one", "two"]
    assert_history_invariants(events, terminal="WorkflowCompleted")
    assert before["worker_id"] == name and restored == before, (before, restored)
    # The claim and the worker's registration survived the restart: every task after it was warm.
    assert _counters(metrics) == {"hit": 4, "miss": 1, "eviction": 0, "forced_cold_replay": 0}, metrics
