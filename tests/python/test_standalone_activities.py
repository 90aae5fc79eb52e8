"""Standalone activities end to end: ``Client.start_activity`` and its handle
(``durable-workflow==2.12.0``) against a real ``capstan serve``, run by an SDK ``Worker``.

A standalone activity is recorded on a host run of its own (``dw.standalone_activity``): its
start schedules the activity and makes no workflow task; the activity's end closes the run.
"""
from __future__ import annotations

import asyncio

import httpx
import pytest
from durable_workflow import InvalidArgument, WorkflowCancelled, WorkflowFailed, activity

from capstan_harness import (
    CONTROL_HEADERS, assert_history_invariants, events_of, fetch_history_raw, make_client, payload_of,
    run_async, type_sequence, unique,
)

HOST_TYPE = "dw.standalone_activity"


@activity.defn(name="standalone.add")
async def add(a: int, b: int) -> dict:
    return {"sum": a + b, "attempt": activity.context().info.attempt_number}


@activity.defn(name="standalone.flaky")
async def flaky(fail_attempts: int) -> str:
    attempt = activity.context().info.attempt_number
    if attempt <= fail_attempts:
        raise RuntimeError(f"attempt {attempt} fails")
    return f"ok on attempt {attempt}"


@activity.defn(name="standalone.linger")
async def linger() -> str:
    ctx = activity.context()
    for _ in range(200):
        await ctx.heartbeat({"alive": True})  # raises once the server says the run is cancelled
        await asyncio.sleep(0.1)
    return "not cancelled"


EVERYTHING = {"activities": [add, flaky, linger]}


async def wait_activity_status(client, activity_id: str, status: str, timeout: float = 20.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        desc = await client.describe_activity(activity_id)
        if desc.status == status or asyncio.get_running_loop().time() > deadline:
            return desc
        await asyncio.sleep(0.1)


def test_a_started_activity_runs_on_a_worker_and_its_result_is_returned(server_url, worker_url, run_worker):
    queue = unique("standalone")
    activity_id = unique("sa-add")

    async def main():
        async with run_worker(worker_url, queue, **EVERYTHING):
            async with make_client(server_url) as client:
                handle = await client.start_activity(
                    activity_type="standalone.add", task_queue=queue, activity_id=activity_id, input=[2, 3],
                    activity_class="AddActivity", business_key="order-7", start_to_close_timeout_seconds=30,
                )
                result = await handle.result(timeout=30, poll_interval=0.2)
                desc = await handle.describe()
                history = await fetch_history_raw(server_url, activity_id, handle.workflow_run_id)
        return handle, result, desc, history

    handle, result, desc, history = run_async(main(), timeout=60)
    assert handle.activity_id == activity_id and handle.workflow_type == HOST_TYPE
    assert handle.activity_execution_id and handle.workflow_run_id
    assert result == {"sum": 5, "attempt": 1}
    assert (desc.status, desc.activity_status, desc.closed_reason) == ("completed", "completed", "completed")
    assert (desc.activity_type, desc.activity_class, desc.business_key) == ("standalone.add", "AddActivity", "order-7")
    assert desc.attempt_count == 1 and desc.task_queue == queue and desc.closed_at
    assert desc.activity_execution_id == handle.activity_execution_id
    # DW's order: the host run's start, its one activity, and the activity's end closing the run.
    assert_history_invariants(history, terminal="WorkflowCompleted")
    assert type_sequence(history) == [
        "StartAccepted", "WorkflowStarted", "ActivityScheduled", "ActivityStarted", "ActivityCompleted",
        "WorkflowCompleted",
    ], type_sequence(history)
    assert not [e for e in history if e.get("workflow_task_id")], "a host run has no workflow task"


def test_a_failing_activity_fails_its_run_after_one_attempt_by_default(server_url, worker_url, run_worker):
    queue = unique("standalone-fail")

    async def main():
        async with run_worker(worker_url, queue, **EVERYTHING):
            async with make_client(server_url) as client:
                once = await client.start_activity(activity_type="standalone.flaky", task_queue=queue, input=[1])
                with pytest.raises(WorkflowFailed):
                    await once.result(timeout=30, poll_interval=0.2)
                failed = await once.describe()
                retried = await client.start_activity(
                    activity_type="standalone.flaky", task_queue=queue, input=[1],
                    retry_policy={"max_attempts": 2, "backoff_seconds": [0]},
                )
                second = await retried.result(timeout=30, poll_interval=0.2)
                succeeded = await retried.describe()
                history = await fetch_history_raw(server_url, once.activity_id, once.workflow_run_id)
        return failed, second, succeeded, history

    failed, second, succeeded, history = run_async(main(), timeout=60)
    assert (failed.status, failed.activity_status, failed.closed_reason, failed.attempt_count) == (
        "failed", "failed", "failed", 1)
    assert failed.activity_id  # the server chose one
    assert second == "ok on attempt 2" and succeeded.attempt_count == 2
    assert_history_invariants(history, terminal="WorkflowFailed")
    [terminal] = events_of(history, "WorkflowFailed")
    details = payload_of(terminal)
    assert details["source_kind"] == "activity_execution", details
    assert details["source_id"] == failed.activity_execution_id, details
    assert "attempt 1 fails" in details["message"], details


def test_an_activity_id_is_taken_while_open_and_reusable_once_closed(server_url, worker_url, run_worker):
    queue = unique("standalone-reuse")
    activity_id = unique("sa-reuse")

    async def main():
        async with make_client(server_url) as client:
            first = await client.start_activity(activity_type="standalone.add", task_queue=queue,
                                                activity_id=activity_id, input=[1, 1])
            with pytest.raises(InvalidArgument) as taken:
                await client.start_activity(activity_type="standalone.add", task_queue=queue,
                                            activity_id=activity_id, input=[1, 1])
            async with run_worker(worker_url, queue, **EVERYTHING):
                assert await first.result(timeout=30, poll_interval=0.2) == {"sum": 2, "attempt": 1}
                again = await client.start_activity(activity_type="standalone.add", task_queue=queue,
                                                    activity_id=activity_id, input=[2, 2])
                assert await again.result(timeout=30, poll_interval=0.2) == {"sum": 4, "attempt": 1}
            async with httpx.AsyncClient(base_url=f"{server_url}/api", headers=CONTROL_HEADERS) as http:
                workflow_id = unique("plain-wf")
                started = await http.post("/workflows", json={"workflow_type": "x", "workflow_id": workflow_id,
                                                              "task_queue": queue})
                assert started.status_code == 201, started.text
                over_workflow = await http.post("/activities", json={"activity_type": "a", "task_queue": queue,
                                                                     "activity_id": workflow_id})
                not_activity = await http.get(f"/activities/{workflow_id}")
                unknown_field = await http.post("/activities", json={"activity_type": "a", "task_queue": queue,
                                                                     "priority": 3})
        return first, again, taken.value, over_workflow, not_activity, unknown_field

    first, again, taken, over_workflow, not_activity, unknown_field = run_async(main(), timeout=60)
    assert "activity_id" in str(taken.errors or taken), taken
    assert again.workflow_run_id != first.workflow_run_id
    assert over_workflow.status_code == 422 and "activity_id" in over_workflow.json()["errors"], over_workflow.text
    assert not_activity.status_code == 404 and not_activity.json()["reason"] == "activity_not_found"
    assert unknown_field.status_code == 422 and "priority" in unknown_field.json()["errors"], unknown_field.text


def test_cancel_closes_the_run_and_the_running_attempt_learns_it(server_url, worker_url, run_worker):
    queue = unique("standalone-cancel")

    async def main():
        async with run_worker(worker_url, queue, **EVERYTHING):
            async with make_client(server_url) as client:
                handle = await client.start_activity(activity_type="standalone.linger", task_queue=queue,
                                                     heartbeat_timeout_seconds=10)
                running = await wait_activity_status(client, handle.activity_id, "running")
                await wait_for_attempt(client, handle.activity_id)
                await handle.cancel(reason="no longer needed")
                with pytest.raises(WorkflowCancelled):
                    await handle.result(timeout=30, poll_interval=0.2)
                desc = await handle.describe()
        return running, desc

    running, desc = run_async(main(), timeout=60)
    assert running.status == "running"
    assert (desc.status, desc.activity_status, desc.closed_reason) == ("cancelled", "cancelled", "cancelled")
    assert desc.attempt_count == 1


async def wait_for_attempt(client, activity_id: str, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while (await client.describe_activity(activity_id)).activity_status != "running":
        assert asyncio.get_running_loop().time() < deadline, "the attempt never started"
        await asyncio.sleep(0.1)


def test_an_unclaimed_activity_times_out_its_run(server_url):
    async def main():
        async with make_client(server_url) as client:
            handle = await client.start_activity(activity_type="standalone.add", task_queue=unique("nobody"),
                                                 schedule_to_start_timeout_seconds=1)
            with pytest.raises(WorkflowFailed):
                await handle.result(timeout=20, poll_interval=0.2)
            return await handle.describe()

    desc = run_async(main(), timeout=40)
    assert (desc.status, desc.closed_reason, desc.attempt_count) == ("failed", "timed_out", 0)
    assert desc.schedule_to_start_deadline_at


def test_list_pages_through_activities_by_status(server_url, worker_url, run_worker):
    queue = unique("standalone-list")

    async def main():
        async with make_client(server_url) as client:
            open_ids = [(await client.start_activity(activity_type="standalone.add", task_queue=unique("idle"),
                                                     input=[0, 0])).activity_id for _ in range(3)]
            async with run_worker(worker_url, queue, **EVERYTHING):
                done = await client.start_activity(activity_type="standalone.add", task_queue=queue, input=[1, 2])
                await done.result(timeout=30, poll_interval=0.2)
            pages, token = [], None
            while True:
                page = await client.list_activities(status="running", page_size=1, next_page_token=token)
                pages.append(page)
                token = page.next_page_token
                if token is None:
                    break
            completed = await client.list_activities(status="completed", page_size=200)
        return open_ids, done, pages, completed

    open_ids, done, pages, completed = run_async(main(), timeout=60)
    listed = [a.activity_id for page in pages for a in page.activities]
    assert all(page.activity_count == 1 for page in pages[:-1]), [p.activity_count for p in pages]
    assert set(open_ids) <= set(listed) and len(listed) == len(set(listed)), (open_ids, listed)
    assert done.activity_id not in listed
    assert all(a.workflow_type == HOST_TYPE and a.status == "running" for page in pages for a in page.activities)
    assert done.activity_id in [a.activity_id for a in completed.activities]
