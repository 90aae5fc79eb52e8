"""Redrive end to end: ``Client.redrive_workflow`` (``durable-workflow==2.12.0``) against a real
``capstan serve``, with an SDK ``Worker`` running the workflow before and after the fix.

A workflow runs two activities; the second fails (one attempt) while a switch is on, so the run
fails with the failed step recorded. After the "fix" (the switch off) the run is redriven: the
successor reuses the first step's result without running it again and runs the second step.
"""
from __future__ import annotations

from collections import Counter

import httpx
import pytest
from durable_workflow import ActivityRetryPolicy, WorkflowFailed, activity, workflow

from capstan_harness import (
    CONTROL_HEADERS, assert_history_invariants, events_of, fetch_history_raw, make_client, payload_of, run_async,
    type_sequence, unique, wait_result,
)

RUNS: Counter = Counter()
BROKEN: set[str] = set()


@activity.defn(name="redrive.first")
def first(key: str, n: int) -> int:
    RUNS[(key, "first")] += 1
    return n + 1


@activity.defn(name="redrive.second")
def second(key: str, n: int) -> int:
    RUNS[(key, "second")] += 1
    if key in BROKEN:
        raise RuntimeError("the downstream is broken")
    return n * 10


@workflow.defn(name="redrive.line")
class Line:
    def run(self, ctx, key, n):
        once = ActivityRetryPolicy(max_attempts=1)
        a = yield ctx.schedule_activity("redrive.first", [key, n], retry_policy=once)
        b = yield ctx.schedule_activity("redrive.second", [key, a], retry_policy=once)
        return [a, b]


@workflow.defn(name="redrive.own_failure")
class OwnFailure:
    def run(self, ctx, key):
        yield ctx.schedule_activity("redrive.first", [key, 0])
        raise ValueError("the workflow gave up by itself")


EVERYTHING = {"workflows": [Line, OwnFailure], "activities": [first, second]}


def test_a_failed_run_is_redriven_from_its_failed_step(server_url, worker_url, run_worker):
    queue = unique("redrive")
    key = unique("key")
    BROKEN.add(key)

    async def main():
        async with run_worker(worker_url, queue, **EVERYTHING) as worker:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(workflow_type="redrive.line", task_queue=queue,
                                                     workflow_id=unique("redrive-wf"), input=[key, 4])
                with pytest.raises(WorkflowFailed):
                    await wait_result(handle, timeout=30, workers=[worker])
                failed_history = await fetch_history_raw(server_url, handle.workflow_id, handle.run_id)
                BROKEN.discard(key)  # the fix
                redriven = await client.redrive_workflow(handle.workflow_id, handle.run_id, request_id="fix-1")
                successor = client.get_workflow_handle(handle.workflow_id, run_id=redriven.run_id)
                result = await wait_result(successor, timeout=30, workers=[worker])
                again = await client.redrive_workflow(handle.workflow_id, handle.run_id, request_id="fix-2")
                history = await fetch_history_raw(server_url, handle.workflow_id, redriven.run_id)
                described = await client.describe_workflow(handle.workflow_id)
            async with httpx.AsyncClient(base_url=f"{server_url}/api", headers=CONTROL_HEADERS) as http:
                completed = await http.post(f"/workflows/{handle.workflow_id}/runs/{redriven.run_id}/redrive", json={})
                stale = await http.post(f"/workflows/{handle.workflow_id}/runs/nope/redrive", json={})
        return handle, failed_history, redriven, result, again, history, described, completed, stale

    handle, failed_history, redriven, result, again, history, described, completed, stale = run_async(main(), timeout=90)
    [failure] = events_of(failed_history, "WorkflowFailed")
    assert payload_of(failure)["failed_step_sequence"] == 2, payload_of(failure)
    assert (redriven.outcome, redriven.command_status) == ("redriven", "accepted")
    assert redriven.run_id and redriven.run_id != handle.run_id
    assert redriven.raw["resume_step_sequence"] == 2 and redriven.raw["continued_from_run_id"] == handle.run_id
    assert result == [5, 50]
    assert RUNS[(key, "first")] == 1, "a completed step is not run again"
    assert RUNS[(key, "second")] == 2
    assert again.run_id == redriven.run_id, "one successor per failed run"
    assert_history_invariants(history, terminal="WorkflowCompleted")
    types = type_sequence(history)
    assert types[:3] == ["StartAccepted", "WorkflowStarted", "ActivityCompleted"], types
    accepted, started, reused = (payload_of(e) for e in history[:3])
    assert accepted["outcome"] == "redriven" and accepted["request_id"] == "fix-1"
    assert (started["recovery_kind"], started["resume_step_sequence"]) == ("redrive", 2)
    assert started["continued_from_run_id"] == handle.run_id
    assert reused["reused_from_run_id"] == handle.run_id and reused["sequence"] == 1
    [source_completion] = events_of(failed_history, "ActivityCompleted")
    assert reused["reused_activity_execution_id"] == payload_of(source_completion)["activity_execution_id"]
    assert reused["activity_execution_id"] != reused["reused_activity_execution_id"]
    scheduled = [payload_of(e)["sequence"] for e in events_of(history, "ActivityScheduled")]
    assert scheduled == [2], scheduled
    assert described.run_id == redriven.run_id
    assert completed.status_code == 409 and completed.json()["reason"] == "run_not_failed", completed.text
    assert stale.status_code == 404 and stale.json()["reason"] == "run_not_found", stale.text


def test_a_run_that_failed_by_itself_has_no_failed_step_to_redrive(server_url, worker_url, run_worker):
    queue = unique("redrive-own")

    async def main():
        async with run_worker(worker_url, queue, **EVERYTHING) as worker:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(workflow_type="redrive.own_failure", task_queue=queue,
                                                     workflow_id=unique("redrive-own"), input=[unique("key")])
                with pytest.raises(WorkflowFailed):
                    await wait_result(handle, timeout=30, workers=[worker])
        async with httpx.AsyncClient(base_url=f"{server_url}/api", headers=CONTROL_HEADERS) as http:
            return await http.post(f"/workflows/{handle.workflow_id}/runs/{handle.run_id}/redrive", json={})

    refused = run_async(main(), timeout=60)
    assert refused.status_code == 409 and refused.json()["reason"] == "unrecorded_failure_boundary", refused.text
    assert refused.json()["control_plane"]["operation"] == "redrive"
