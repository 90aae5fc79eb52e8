"""The worker plane through the published Python SDK: a worker that requires query-task
authority (`Worker(require_query_task_authority=True)`) starts against Capstan and answers
queries while checking its lease at `GET /worker/query-tasks/{id}/status` (it drops a query
whose authority it cannot confirm); activities with non-default cancellation policies replay
(the SDK compares the recorded policy with the code's and fails the task on a mismatch).
"""
from __future__ import annotations

import asyncio
import time

from durable_workflow import activity, workflow

from capstan_harness import fetch_history, make_client, run_async, unique, wait_result


@workflow.defn(name="plane.counter")
class CounterWorkflow:
    def __init__(self) -> None:
        self.count = 0
        self.stopped = False

    @workflow.signal("bump")
    def bump(self, by: int) -> None:
        self.count += by

    @workflow.signal("stop")
    def stop(self) -> None:
        self.stopped = True

    @workflow.query("count")
    def current_count(self) -> int:
        return self.count

    def run(self, ctx):
        yield ctx.wait_condition(lambda: self.stopped)
        return self.count


def test_a_worker_requiring_query_task_authority_answers_queries(server_url, worker_url, run_worker):
    queue = unique("plane-query")
    workflow_id = unique("plane-counter")

    async def main():
        async with make_client(server_url) as client:
            info = await client.get_cluster_info()
            assert info["worker_protocol"]["server_capabilities"]["query_task_authority"] is True
        async with run_worker(worker_url, queue, workflows=[CounterWorkflow], require_query_task_authority=True) as worker:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(workflow_type="plane.counter", task_queue=queue, workflow_id=workflow_id, input=[])
                await handle.signal("bump", [3])
                deadline = time.monotonic() + 20
                while True:
                    answer = await handle.query("count")
                    if answer["result"] == 3:
                        break
                    assert time.monotonic() < deadline, answer
                    await asyncio.sleep(0.2)
                await handle.signal("stop", [])
                assert await wait_result(handle, timeout=30, workers=[worker]) == 3

    run_async(main(), timeout=90)


@activity.defn(name="plane.echo")
async def plane_echo(value: str) -> str:
    return value


@workflow.defn(name="plane.policies")
class PoliciesWorkflow:
    """Activities with each non-default cancellation policy, one after another: every later
    task replays the earlier steps, whose recorded policy the SDK compares with the code's."""

    def run(self, ctx, value):
        first = yield ctx.schedule_activity("plane.echo", [value], cancellation_policy="wait_cancellation_completed")
        second = yield ctx.schedule_activity(
            "plane.echo", [first], cancellation_policy="abandon", schedule_to_close_timeout=60,
        )
        third = yield ctx.schedule_activity("plane.echo", [second], cancellation_policy="try_cancel")
        return third


def test_activity_cancellation_policies_are_recorded_and_replay(server_url, worker_url, run_worker):
    queue = unique("plane-policies")
    workflow_id = unique("plane-policies")

    async def main():
        async with run_worker(worker_url, queue, workflows=[PoliciesWorkflow], activities=[plane_echo],
                              capabilities=["cooperative_cancellation"]) as worker:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(workflow_type="plane.policies", task_queue=queue,
                                                     workflow_id=workflow_id, input=["kept"])
                assert await wait_result(handle, timeout=30, workers=[worker]) == "kept"
                history = await fetch_history(client, workflow_id, handle.run_id)
                policies = [e["payload"].get("cancellation_policy") for e in history if e["event_type"] == "ActivityScheduled"]
                assert policies == ["wait_cancellation_completed", "abandon", "try_cancel"], policies

    run_async(main(), timeout=90)


@activity.defn(name="plane.outlast")
async def plane_outlast(seconds: float) -> str:
    """Runs well past the server's activity lease without a single heartbeat."""
    await asyncio.sleep(seconds)
    return "outlasted"


@workflow.defn(name="plane.outlast")
class OutlastWorkflow:
    def run(self, ctx, seconds):
        return (yield ctx.schedule_activity(
            "plane.outlast", [seconds], start_to_close_timeout=120, heartbeat_timeout=60,
            retry_policy={"max_attempts": 1},
        ))


def test_activity_lease_renewal_keeps_a_silent_attempt_alive(server_factory, run_worker):
    """With a 4 s activity lease, an attempt that runs 10 s without heartbeating survives only
    because the SDK renews its lease (`/renew-lease`, advertised as activity_lease_renewal):
    without renewals the lease expires, the only attempt fails as lease_expired and so does
    the workflow. The renewals record nothing in history. (The SDK renews when a third of its
    grant has passed; a 2 s lease left under a second for a renewal's round trip, which a busy
    two-core CI machine once missed.)"""
    server = server_factory.create("--activity-task-lease-seconds", "4")
    queue = unique("plane-renew")
    workflow_id = unique("plane-renew")

    async def main():
        async with make_client(server.url) as client:
            info = await client.get_cluster_info()
            assert info["worker_protocol"]["server_capabilities"]["activity_lease_renewal"] is True
        async with run_worker(server.url, queue, workflows=[OutlastWorkflow], activities=[plane_outlast]) as worker:
            async with make_client(server.url) as client:
                handle = await client.start_workflow(workflow_type="plane.outlast", task_queue=queue,
                                                     workflow_id=workflow_id, input=[10])
                assert await wait_result(handle, timeout=60, workers=[worker]) == "outlasted"
                history = await fetch_history(client, workflow_id, handle.run_id)
                kinds = [e["event_type"] for e in history]
                assert "ActivityHeartbeatRecorded" not in kinds, kinds
                assert kinds.count("ActivityStarted") == 1, kinds

    run_async(main(), timeout=90)
