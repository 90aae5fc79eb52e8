"""Prepared local activities end to end: SDK ``Worker``s (``durable-workflow==2.12.0``) that
register ``prepared_local_activities`` (with ``cooperative_cancellation``) against a real
``capstan serve``.

With the capability negotiated the SDK never sends ``record_local_activity``: every
``ctx.local_activity(...)`` goes through ``/worker/workflow-tasks/{task}/local-activities/…``.
The server records the call's events one report at a time (``prepare`` → ``ActivityScheduled`` +
``ActivityStarted``, ``heartbeat`` → ``ActivityHeartbeatRecorded``, ``outcome`` → the end) and
owns retries (a failed attempt releases the workflow task; the retry comes on a new one when
its backoff is due) and timeouts. The callbacks run in a spawned subprocess, so every activity
here is a module-level function.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from durable_workflow import Worker, WorkflowCancelled, activity, workflow

from capstan_harness import (
    ControlPlane,
    assert_history_invariants,
    events_of,
    fetch_history,
    make_client,
    payload_of,
    run_async,
    unique,
    wait_for_history,
    wait_result,
)

PREPARED = {"capabilities": ["cooperative_cancellation", "prepared_local_activities"]}
WITH_GROUPS = {"capabilities": [
    "cooperative_cancellation", "prepared_local_activities", "prepared_local_activity_groups",
]}
WITH_POLICIES = {"capabilities": [
    "cooperative_cancellation", "prepared_local_activities", "prepared_local_activity_cancellation_policies",
]}


@activity.defn(name="prepared.greet")
def greet(name: str) -> str:
    return f"hello {name}"


@activity.defn(name="prepared.flaky")
def flaky(marker_dir: str, failures: int) -> str:
    """Fails its first `failures` attempts (counted in files: attempts run in fresh processes)."""
    marker = Path(marker_dir)
    seen = len(list(marker.iterdir()))
    (marker / f"attempt-{seen + 1}").write_text(str(os.getpid()))
    if seen < failures:
        raise RuntimeError(f"attempt {seen + 1} fails on purpose")
    return f"succeeded on attempt {seen + 1}"


@activity.defn(name="prepared.beating")
async def beating(beats: int) -> int:
    for n in range(beats):
        await activity.context().heartbeat({"n": n})
    return beats


@activity.defn(name="prepared.slow")
def slow(seconds: float) -> str:
    time.sleep(seconds)
    return "finished"


@workflow.defn(name="prepared.cancellable")
class PreparedCancellable:
    """A long local call that a cooperative cancellation stops; `policy` is its cancellation policy."""

    def run(self, ctx, policy):
        try:
            yield ctx.local_activity("prepared.slow", [30], start_to_close_timeout=60, cancellation_policy=policy)
            return "not cancelled"
        except WorkflowCancelled:
            return "cleaned up"


@activity.defn(name="prepared.hang-once")
def hang_once(marker_dir: str) -> str:
    """The first attempt hangs (its worker is killed meanwhile); a later one answers."""
    marker = Path(marker_dir)
    seen = len(list(marker.iterdir()))
    (marker / f"attempt-{seen + 1}").write_text(str(os.getpid()))
    if seen == 0:
        time.sleep(60)
    return f"answered on attempt {seen + 1}"


@workflow.defn(name="prepared.recovering")
class PreparedRecovering:
    def run(self, ctx, marker_dir):
        return (yield ctx.local_activity(
            "prepared.hang-once", [marker_dir], start_to_close_timeout=120,
            retry_policy={"max_attempts": 3, "backoff_seconds": [1]},
        ))


@workflow.defn(name="prepared.group")
class PreparedGroup:
    """A parallel list of two local calls and a queued activity, admitted at once."""

    def run(self, ctx, name):
        results = yield [
            ctx.local_activity("prepared.greet", [name], start_to_close_timeout=30),
            ctx.local_activity("prepared.greet", [name + "!"], start_to_close_timeout=30),
            ctx.schedule_activity("prepared.greet", ["remote"], start_to_close_timeout=30),
        ]
        return list(results)


@workflow.defn(name="prepared.sequence")
class PreparedSequence:
    """A side effect (checkpointed before the first call), then two local calls and a remote-free end."""

    def run(self, ctx, name):
        stamp = yield ctx.side_effect(lambda: "stamped")
        first = yield ctx.local_activity("prepared.greet", [name], start_to_close_timeout=30)
        second = yield ctx.local_activity("prepared.greet", [first], start_to_close_timeout=30)
        return [stamp, first, second]


@workflow.defn(name="prepared.retrying")
class PreparedRetrying:
    def run(self, ctx, marker_dir, failures):
        return (yield ctx.local_activity(
            "prepared.flaky", [marker_dir, failures], start_to_close_timeout=30,
            retry_policy={"max_attempts": 5, "backoff_seconds": [1]},
        ))


@workflow.defn(name="prepared.beating")
class PreparedBeating:
    def run(self, ctx, beats):
        return (yield ctx.local_activity("prepared.beating", [beats], start_to_close_timeout=30, heartbeat_timeout=10))


def _step_events(events: list[dict], sequence: int) -> list[dict]:
    return [e for e in events if payload_of(e).get("sequence") == sequence and str(e.get("event_type")).startswith("Activity")]


def test_prepared_local_activities_record_each_step(server_url, worker_url, run_worker):
    queue = unique("prepared")
    workflow_id = unique("prepared-seq")

    async def main():
        async with ControlPlane(server_url) as control:
            info = await control.cluster_info()
            assert info["worker_protocol"]["server_capabilities"]["prepared_local_activities"] is True
        # Before the feature, Worker.run() raised prepared_local_activity_not_supported here.
        async with run_worker(worker_url, queue, workflows=[PreparedSequence], activities=[greet], **PREPARED) as w:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(
                    workflow_type="prepared.sequence", task_queue=queue, workflow_id=workflow_id, input=["ada"],
                )
                result = await wait_result(handle, timeout=60, workers=[w])
                events = await fetch_history(client, workflow_id, handle.run_id)
        return result, events

    result, events = run_async(main(), timeout=90)
    assert result == ["stamped", "hello ada", "hello hello ada"]
    assert_history_invariants(events, terminal="WorkflowCompleted")
    for sequence in (2, 3):
        step = _step_events(events, sequence)
        assert [e["event_type"] for e in step] == ["ActivityScheduled", "ActivityStarted", "ActivityCompleted"], step
        for event in step:
            payload = payload_of(event)
            assert payload["execution_mode"] == "local" and payload["local_activity"] is True, payload
            assert payload["activity_type"] == "prepared.greet"
        started, completed = step[1], step[2]
        assert payload_of(completed)["activity_attempt_id"] == payload_of(started)["activity_attempt_id"]
        assert payload_of(completed)["local_outcome"]["report_fingerprint"]
    # Nothing went through the inline path.
    assert not [e for e in events if payload_of(e).get("attempts")], events


def test_prepared_local_retry_is_owned_by_the_server(server_url, worker_url, run_worker, tmp_path):
    queue = unique("prepared-retry")
    workflow_id = unique("prepared-retry")
    markers = tmp_path / "attempts"
    markers.mkdir()

    async def main():
        async with run_worker(worker_url, queue, workflows=[PreparedRetrying], activities=[flaky], **PREPARED) as w:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(
                    workflow_type="prepared.retrying", task_queue=queue, workflow_id=workflow_id,
                    input=[str(markers), 2],
                )
                started = time.monotonic()
                result = await wait_result(handle, timeout=60, workers=[w])
                took = time.monotonic() - started
                events = await fetch_history(client, workflow_id, handle.run_id)
        return result, took, events

    result, took, events = run_async(main(), timeout=90)
    assert result == "succeeded on attempt 3"
    assert len(list(markers.iterdir())) == 3
    assert_history_invariants(events, terminal="WorkflowCompleted")
    step = _step_events(events, 1)
    assert [e["event_type"] for e in step] == [
        "ActivityScheduled",
        "ActivityStarted", "ActivityRetryScheduled",
        "ActivityStarted", "ActivityRetryScheduled",
        "ActivityStarted", "ActivityCompleted",
    ], [e["event_type"] for e in step]
    retries = events_of(step, "ActivityRetryScheduled")
    assert [payload_of(r)["retry_after_attempt"] for r in retries] == [1, 2]
    assert all(payload_of(r)["retry_backoff_seconds"] == 1 for r in retries)
    # Each retry came on a workflow task created for it, not before its backoff.
    assert took >= 2.0, took
    attempts = [payload_of(e)["attempt_number"] for e in events_of(step, "ActivityStarted")]
    assert attempts == [1, 2, 3]


def test_prepared_local_heartbeats_are_recorded(server_url, worker_url, run_worker):
    queue = unique("prepared-beat")
    workflow_id = unique("prepared-beat")

    async def main():
        async with run_worker(worker_url, queue, workflows=[PreparedBeating], activities=[beating], **PREPARED) as w:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(
                    workflow_type="prepared.beating", task_queue=queue, workflow_id=workflow_id, input=[3],
                )
                result = await wait_result(handle, timeout=60, workers=[w])
                events = await fetch_history(client, workflow_id, handle.run_id)
        return result, events

    result, events = run_async(main(), timeout=90)
    assert result == 3
    beats = events_of(_step_events(events, 1), "ActivityHeartbeatRecorded")
    assert [payload_of(b)["progress"]["details"]["n"] for b in beats] == [0, 1, 2], beats


@pytest.mark.parametrize("policy", ["try_cancel", "wait_cancellation_completed"])
def test_a_cancellation_stops_a_running_prepared_local_activity(server_url, worker_url, run_worker, policy):
    """The attempt's supervision finds the request: the server records `ActivityCancelled` and
    answers a stop with the request's context; the worker kills the callback process and
    acknowledges (`ActivityCancellationAcknowledged`), then delivers the cancellation at the
    local call — at once under `try_cancel`, after the acknowledgement under
    `wait_cancellation_completed` — and the run ends cancelled long before the callback would
    have finished."""
    queue = unique("prepared-cancel")
    workflow_id = unique("prepared-cancel")

    async def main():
        async with ControlPlane(server_url) as control:
            info = await control.cluster_info()
            advertised = info["worker_protocol"]["server_capabilities"]["prepared_local_activity_cancellation_policies"]
            assert advertised == ["try_cancel", "wait_cancellation_completed"], advertised
        async with run_worker(worker_url, queue, workflows=[PreparedCancellable], activities=[slow], **WITH_POLICIES):
            async with make_client(server_url) as client:
                handle = await client.start_workflow(
                    workflow_type="prepared.cancellable", task_queue=queue, workflow_id=workflow_id, input=[policy],
                )
                await wait_for_history(client, workflow_id, handle.run_id,
                                       lambda evs: len(events_of(evs, "ActivityStarted")) >= 1, what="local call started")
                started = time.monotonic()
                await handle.request_cancellation(reason="stop", cleanup_timeout_seconds=60)
                with pytest.raises(WorkflowCancelled):
                    await handle.result(timeout=25, poll_interval=0.2)
                elapsed = time.monotonic() - started
                events = await fetch_history(client, workflow_id, handle.run_id)
        return elapsed, events

    elapsed, events, = run_async(main(), timeout=90)
    assert elapsed < 20, "the run waited for the stopped callback to finish by itself"
    assert_history_invariants(events, terminal="WorkflowCancelled")
    step = _step_events(events, 1)
    kinds = [e["event_type"] for e in step]
    assert kinds[:3] == ["ActivityScheduled", "ActivityStarted", "ActivityCancelled"], kinds
    assert all(payload_of(e)["cancellation_policy"] == policy for e in step if e["event_type"] != "ActivityCancellationAcknowledged")
    (requested,) = events_of(events, "CooperativeCancellationRequested")
    (cancelled,) = events_of(events, "ActivityCancelled")
    (acknowledged,) = events_of(events, "ActivityCancellationAcknowledged")
    (delivered,) = events_of(events, "CooperativeCancellationDelivered")
    assert payload_of(requested)["cancellation"]["schema"] == "durable-workflow.cancellation-context/v1"
    assert cancelled["workflow_command_id"] == requested["workflow_command_id"]
    assert (payload_of(delivered)["sequence"], payload_of(delivered)["call_kind"]) == (1, "local_activity")
    order = [e["id"] for e in events]
    if policy == "wait_cancellation_completed":
        # Delivered only after the worker acknowledged the stop.
        assert order.index(acknowledged["id"]) < order.index(delivered["id"])
    assert not events_of(events, "ActivityCompleted")


def test_a_parallel_group_with_local_calls_is_admitted_at_once(server_url, worker_url, run_worker):
    """Without groups the SDK abandons such a workflow task forever (a parallel list with an
    unrecorded local call needs atomic admission); with `prepared_local_activity_groups` every
    leaf takes its step in one `checkpoint-group`, then each local member is prepared and run."""
    queue = unique("prepared-group")
    workflow_id = unique("prepared-group")

    async def main():
        async with ControlPlane(server_url) as control:
            info = await control.cluster_info()
            assert info["worker_protocol"]["server_capabilities"]["prepared_local_activity_groups"] is True
        async with run_worker(worker_url, queue, workflows=[PreparedGroup], activities=[greet], **WITH_GROUPS) as w:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(
                    workflow_type="prepared.group", task_queue=queue, workflow_id=workflow_id, input=["ada"],
                )
                result = await wait_result(handle, timeout=60, workers=[w])
                events = await fetch_history(client, workflow_id, handle.run_id)
        return result, events

    result, events = run_async(main(), timeout=90)
    assert result == ["hello ada", "hello ada!", "hello remote"]
    assert_history_invariants(events, terminal="WorkflowCompleted")
    scheduled = events_of(events, "ActivityScheduled")
    assert [payload_of(e)["sequence"] for e in scheduled] == [1, 2, 3]
    assert all(payload_of(e).get("parallel_group_path") for e in scheduled)
    local, remote = scheduled[:2], scheduled[2]
    assert all(payload_of(e)["local_group_admission"]["checkpoint_id"] for e in local)
    assert "execution_mode" not in payload_of(remote)
    for sequence in (1, 2):
        kinds = [e["event_type"] for e in _step_events(events, sequence)]
        assert kinds == ["ActivityScheduled", "ActivityStarted", "ActivityCompleted"], kinds


def spawn_worker(url: str, queue: str, worker_id: str, log_path: Path) -> subprocess.Popen:
    """This module as a prepared-capable worker process (its own process group, so a SIGKILL
    takes its callback processes with it)."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, __file__, url, queue, worker_id], cwd=Path(__file__).parent,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )


def test_an_attempt_whose_worker_was_killed_is_recovered_by_the_next_claim(server_factory, run_worker, tmp_path):
    """SIGKILL the worker while its local callback runs: its workflow task lease runs out, a
    second worker's replay finds the unfinished attempt and `recover`s it (the server records a
    retry, `local_recovery` naming both claims), and the retry runs on the second worker."""
    server = server_factory.create("--workflow-task-lease-seconds", "3")
    queue = unique("prepared-crash")
    workflow_id = unique("prepared-crash")
    markers = tmp_path / "attempts"
    markers.mkdir()
    victim_id = unique("prepared-victim")
    log = tmp_path / "victim.log"

    async def main():
        victim = spawn_worker(server.url, queue, victim_id, log)
        try:
            async with make_client(server.url) as client:
                handle = await client.start_workflow(
                    workflow_type="prepared.recovering", task_queue=queue, workflow_id=workflow_id,
                    input=[str(markers)],
                )
                await wait_for_history(client, workflow_id, handle.run_id,
                                       lambda evs: len(events_of(evs, "ActivityStarted")) >= 1,
                                       what=f"the first attempt started (victim log {log})", timeout=30)
                deadline = time.monotonic() + 30
                while not any(markers.iterdir()):  # its callback is running, not just admitted
                    assert time.monotonic() < deadline, f"the first callback never ran (victim log {log})"
                    await asyncio.sleep(0.05)
                os.killpg(victim.pid, signal.SIGKILL)
                victim.wait(timeout=10)
                async with run_worker(server.url, queue, workflows=[PreparedRecovering], activities=[hang_once],
                                      **PREPARED) as survivor:
                    result = await wait_result(handle, timeout=60, workers=[survivor])
                events = await fetch_history(client, workflow_id, handle.run_id)
        finally:
            if victim.poll() is None:
                os.killpg(victim.pid, signal.SIGKILL)
        return survivor.name, result, events

    survivor, result, events = run_async(main(), timeout=120)
    assert result == "answered on attempt 2"
    assert_history_invariants(events, terminal="WorkflowCompleted")
    kinds = [e["event_type"] for e in _step_events(events, 1)]
    assert kinds == ["ActivityScheduled", "ActivityStarted", "ActivityRetryScheduled", "ActivityStarted",
                     "ActivityCompleted"], kinds
    (retry,) = events_of(events, "ActivityRetryScheduled")
    recovery = payload_of(retry)["local_recovery"]
    assert (recovery["original_lease_owner"], recovery["lease_owner"]) == (victim_id, survivor), recovery
    assert recovery["callback_stop_state"] == "unknown"


async def _serve(url: str, queue: str, worker_id: str) -> None:
    async with make_client(url) as client:
        worker = Worker(client, task_queue=queue, workflows=[PreparedRecovering], activities=[hang_once],
                        worker_id=worker_id, poll_timeout=10.0, **PREPARED)
        await worker.run()


if __name__ == "__main__":
    asyncio.run(_serve(*sys.argv[1:4]))
