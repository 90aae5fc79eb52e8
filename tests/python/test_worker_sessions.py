"""Worker sessions end to end: SDK ``Worker``s (``durable-workflow==2.12.0``) against a real
``capstan serve``.

A workflow schedules its activities with ``worker_session=WorkerSessionOptions(...)`` requiring
a capability the session-capable workers register. Each activity heartbeats through the SDK and
then once more over plain HTTP (the SDK's activity context does not expose its session) to read
what the heartbeat and ``/status`` replies say about the session, and returns the worker it ran on.

The Python ``Worker.stop()`` closes every session it holds, and a closed session is over for good,
so the holder loss in the second test is a crash: a worker process SIGKILLed, then removed by the
operator (``DELETE /api/workers/{id}``).

Run as a script (``python test_worker_sessions.py URL QUEUE WORKER_ID``) this module is that
session-capable activity worker, until it is killed.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from durable_workflow import ServerError, Worker, WorkerSessionOptions, activity, workflow

from capstan_harness import (
    WORKER_HEADERS, assert_history_invariants, events_of, fetch_history_raw, make_client, payload_of,
    run_async, unique, wait_for_history, wait_result,
)

REQUIREMENT = "cache:session-e2e"  # the capability every session here requires
CAPABLE = {"capabilities": [REQUIREMENT]}
STEPS = 4


def session_options(session_id: str) -> WorkerSessionOptions:
    return WorkerSessionOptions(session_id, requirements=(REQUIREMENT,))


@activity.defn(name="session.step")
async def session_step(url: str, n: int) -> dict:
    ctx = activity.context()
    info = ctx.info
    await ctx.heartbeat({"step": n})  # a refused heartbeat would abandon the attempt
    claim = {"activity_attempt_id": info.activity_attempt_id, "lease_owner": info.worker_id}
    async with httpx.AsyncClient(base_url=f"{url}/api", headers=WORKER_HEADERS, timeout=10.0) as http:
        beat = await http.post(f"/worker/activity-tasks/{info.task_id}/heartbeat", json={**claim, "details": {"n": n}})
        status = await http.post(f"/worker/activity-tasks/{info.task_id}/status", json=claim)
    return {"n": n, "worker": info.worker_id, "heartbeat": [beat.status_code, beat.json()],
            "status": [status.status_code, status.json()]}


@workflow.defn(name="session.steps")
class SessionSteps:
    """STEPS sequential activities in one session; before step n in `pauses`, wait for a `go`."""

    def __init__(self) -> None:
        self.go = 0

    @workflow.signal("go")
    def on_go(self, _value: str) -> None:
        self.go += 1

    def run(self, ctx, url, session_id, pauses):
        options = session_options(session_id)
        results = []
        for n in range(STEPS):
            if n in pauses:
                needed = pauses.index(n) + 1
                yield ctx.wait_condition(lambda needed=needed: self.go >= needed)
            results.append((yield ctx.schedule_activity("session.step", [url, n], worker_session=options)))
        return results


def assert_steps(results: list, session_id: str, workers: list[str]) -> None:
    assert [r["n"] for r in results] == list(range(STEPS)), results
    assert [r["worker"] for r in results] == workers, [r["worker"] for r in results]
    for r in results:
        for kind in ("heartbeat", "status"):
            code, reply = r[kind]
            assert code == 200 and reply.get("can_continue") is True, (kind, r)
            seen = reply.get("worker_session") or {}
            assert seen.get("session_id") == session_id and seen.get("requirements") == [REQUIREMENT], (kind, r)
            assert (seen.get("status"), seen.get("lease_owner")) == ("active", r["worker"]), (kind, r)
            assert seen.get("lease_expires_at") and seen.get("ttl_expires_at"), (kind, r)


async def scheduled_sessions(workflow_id: str, run_id: str, url: str) -> list:
    events = await fetch_history_raw(url, workflow_id, run_id)
    assert_history_invariants(events, terminal="WorkflowCompleted")
    return [payload_of(e).get("worker_session") for e in events_of(events, "ActivityScheduled")]


def test_session_activities_run_on_one_holder(server_url, worker_url, run_worker):
    queue = unique("session-one-holder")
    session_id = unique("session")

    async def main():
        everything = {"workflows": [SessionSteps], "activities": [session_step]}
        async with run_worker(worker_url, queue, **everything, **CAPABLE) as a, \
                run_worker(worker_url, queue, **everything, **CAPABLE) as b, \
                run_worker(worker_url, queue, activities=[session_step]) as incapable:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(
                    workflow_type="session.steps", task_queue=queue, workflow_id=unique("session-wf"),
                    input=[worker_url, session_id, []],
                )
                results = await wait_result(handle, timeout=30, workers=[a, b, incapable])
                recorded = await scheduled_sessions(handle.workflow_id, handle.run_id, server_url)
        return {a.name, b.name}, incapable.name, results, recorded

    capable, incapable, results, recorded = run_async(main(), timeout=60)
    holder = results[0]["worker"]
    assert holder in capable, (holder, capable, incapable)
    assert_steps(results, session_id, [holder] * STEPS)
    # Recorded as the workflow sent it: nothing filled in (no queue, no live state).
    assert recorded == [session_options(session_id).to_wire()] * STEPS, recorded


def spawn_holder(url: str, queue: str, worker_id: str, log_path: Path) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, __file__, url, queue, worker_id], cwd=Path(__file__).parent,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )


def test_a_lost_holders_session_is_reacquired_by_another_worker(server_url, worker_url, run_worker, tmp_path):
    queue = unique("session-handoff")
    session_id = unique("session")
    holder_id = unique("session-holder")
    holder_log = tmp_path / "holder.log"

    async def waits(client, handle, count):
        await wait_for_history(client, handle.workflow_id, handle.run_id,
                               lambda evs: len(events_of(evs, "ConditionWaitOpened")) >= count,
                               what=f"{count} ConditionWaitOpened (holder log {holder_log})", timeout=30)

    async def main():
        holder = spawn_holder(worker_url, queue, holder_id, holder_log)
        try:
            async with make_client(server_url) as client, \
                    run_worker(worker_url, queue, workflows=[SessionSteps]) as flows:
                handle = await client.start_workflow(
                    workflow_type="session.steps", task_queue=queue, workflow_id=unique("session-wf"),
                    input=[worker_url, session_id, [1, 2]],
                )
                await waits(client, handle, 1)  # step 0 ran on the holder (the only activity worker)
                async with run_worker(worker_url, queue, activities=[session_step], **CAPABLE) as rival:
                    await handle.signal("go", ["one"])
                    await waits(client, handle, 2)  # step 1: still the holder's, with the rival polling
                    os.killpg(holder.pid, signal.SIGKILL)
                    holder.wait(timeout=10)
                    await client.deregister_worker(holder_id)
                    await handle.signal("go", ["two"])
                    results = await wait_result(handle, timeout=30, workers=[flows, rival])
                    renewed = await rival.client.renew_worker_session(rival.name, session_id, 60)
                    try:
                        stale = await client.renew_worker_session(holder_id, session_id, 60)
                    except ServerError as error:
                        stale = error
                recorded = await scheduled_sessions(handle.workflow_id, handle.run_id, server_url)
        finally:
            if holder.poll() is None:
                os.killpg(holder.pid, signal.SIGKILL)
        return rival.name, results, renewed, stale, recorded

    rival, results, renewed, stale, recorded = run_async(main(), timeout=75)
    assert_steps(results, session_id, [holder_id, holder_id, rival, rival])
    session = renewed["session"]
    assert renewed["outcome"] == "heartbeat_recorded" and session["lease_owner"] == rival, renewed
    assert session["status"] == "active" and session["fence"] == 2, renewed  # created by the holder, reacquired
    assert isinstance(stale, ServerError) and stale.status == 409, stale
    assert stale.reason() == "session_owner_mismatch", stale.body
    assert recorded == [session_options(session_id).to_wire()] * STEPS, recorded


def test_explicit_session_lifecycle_through_the_sdk_handle(server_url, worker_url, run_worker):
    queue = unique("session-lifecycle")
    session_id = unique("session")

    async def main():
        async with run_worker(worker_url, queue, activities=[session_step], **CAPABLE) as holder, \
                run_worker(worker_url, queue, activities=[session_step], **CAPABLE) as rival:
            handle = holder.worker.worker_session(session_options(session_id))
            created = await handle.create()
            reused = await handle.create()
            with pytest.raises(ServerError) as taken:
                await rival.worker.worker_session(session_options(session_id)).create()
            renewed = await handle.renew(lease_seconds=30)
            closed = await handle.close("done")
            with pytest.raises(ServerError) as after_close:
                await handle.create()
            with pytest.raises(ServerError) as unmet:
                await holder.worker.worker_session(
                    WorkerSessionOptions(unique("session"), requirements=("gpu:absent",))).create()
        return holder.name, created, reused, taken.value, renewed, closed, after_close.value, unmet.value

    holder, created, reused, taken, renewed, closed, after_close, unmet = run_async(main(), timeout=40)
    session = created["session"]
    assert (created["admitted"], created["outcome"]) == (True, "created"), created
    assert (session["session_id"], session["lease_owner"], session["status"]) == (session_id, holder, "active"), session
    assert (session["namespace"], session["requirements"], session["fence"]) == ("default", [REQUIREMENT], 1), session
    assert (reused["outcome"], reused["session"]["ttl_expires_at"]) == ("reused", session["ttl_expires_at"]), reused
    assert (taken.status, taken.reason()) == (409, "session_owned_by_another_worker"), taken.body
    assert renewed["outcome"] == "heartbeat_recorded", renewed
    assert renewed["session"]["ttl_expires_at"] == session["ttl_expires_at"], "a renewal never extends the TTL"
    assert renewed["session"]["lease_expires_at"] < session["lease_expires_at"], "30 s lease, down from 120 s"
    assert (closed["outcome"], closed["session"]["status"]) == ("closed", "closed"), closed
    assert (after_close.status, after_close.reason()) == (409, "session_closed"), after_close.body
    assert (unmet.status, unmet.reason()) == (409, "session_requirements_not_met"), unmet.body


async def _serve_as_holder(url: str, queue: str, worker_id: str) -> None:
    async with make_client(url) as client:
        worker = Worker(client, task_queue=queue, activities=[session_step], worker_id=worker_id,
                        poll_timeout=10.0, **CAPABLE)
        await worker.run()


if __name__ == "__main__":
    asyncio.run(_serve_as_holder(*sys.argv[1:4]))
