"""Schedules through the published Python SDK (``durable-workflow==2.12.0``) with real time.

A one-second interval schedule fires N times; pausing stops it and resuming does not catch up;
trigger-now, backfill, update, history paging and delete behave as DW's client expects; an
overlap under ``skip`` is skipped; and a server killed with SIGKILL and restarted neither skips
nor doubles an occurrence (each (schedule, occurrence time) starts exactly one workflow).
"""
from __future__ import annotations

import asyncio
import datetime as dt
import time

import pytest
from durable_workflow import ScheduleAction, ScheduleSpec, workflow
from durable_workflow.errors import ScheduleAlreadyExists, ScheduleNotFound

from capstan_harness import make_client, run_async, unique, wait_result


@workflow.defn(name="sched.tick")
class TickWorkflow:
    def run(self, ctx, label):
        return {"tick": label}


@workflow.defn(name="sched.blocking")
class BlockingWorkflow:
    """Waits for a signal that never comes: keeps the schedule's previous run open."""

    def __init__(self) -> None:
        self.released = False

    @workflow.signal("release")
    def release(self) -> None:
        self.released = True

    def run(self, ctx):
        yield ctx.wait_condition(lambda: self.released)
        return None


async def wait_for(what, probe, timeout=30.0, interval=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await probe()
        if value:
            return value
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


async def all_history(client, schedule_id, limit=3):
    """Every audit event, walking the pages the way the SDK does."""
    events, cursor = [], None
    while True:
        page = await client.get_schedule_history(schedule_id, limit=limit, after_sequence=cursor)
        events.extend(page.events)
        if not page.has_more:
            return events
        cursor = page.next_cursor


def occurrences(events):
    return [e.payload["occurrence_time"] for e in events if e.event_type == "ScheduleTriggered"]


def test_an_interval_schedule_fires_pauses_resumes_and_is_managed_through_the_sdk(server_url, worker_url, run_worker):
    queue = unique("sched")
    schedule_id = unique("every-second")

    async def main():
        async with run_worker(worker_url, queue, workflows=[TickWorkflow]) as worker, make_client(server_url) as client:
            handle = await client.create_schedule(
                schedule_id=schedule_id,
                spec=ScheduleSpec(intervals=[{"every": "PT1S"}]),
                action=ScheduleAction(workflow_type="sched.tick", task_queue=queue, input=["scheduled"]),
                overlap_policy="allow_all",
                note="created by the test",
            )
            with pytest.raises(ScheduleAlreadyExists):
                await client.create_schedule(
                    schedule_id=schedule_id, spec=ScheduleSpec(intervals=[{"every": "PT1S"}]),
                    action=ScheduleAction(workflow_type="sched.tick", task_queue=queue),
                )
            fired = await wait_for("three fires", lambda: _fires_at_least(handle, 3))
            assert fired.status == "active" and fired.next_fire_at and fired.latest_workflow_instance_id
            listed = await client.list_schedules(status="active")
            assert schedule_id in [s.schedule_id for s in listed.schedules]

            await handle.pause(note="maintenance")
            paused = await handle.describe()
            assert paused.status == "paused" and paused.paused_at and paused.note == "maintenance"
            await asyncio.sleep(2.5)
            still = await handle.describe()
            assert still.fires_count == paused.fires_count, "a paused schedule does not fire"
            await handle.resume()
            resumed_count = paused.fires_count
            await wait_for("a fire after resuming", lambda: _fires_at_least(handle, resumed_count + 1))

            triggered = await handle.trigger()
            assert triggered.outcome == "triggered" and triggered.workflow_id, triggered
            started = client.get_workflow_handle(triggered.workflow_id)
            assert await wait_result(started, timeout=30, workers=[worker]) == {"tick": "scheduled"}

            await handle.update(note="updated", overlap_policy="skip", jitter_seconds=0)
            updated = await handle.describe()
            assert updated.note == "updated" and updated.overlap_policy == "skip"

            now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
            window_start = now - dt.timedelta(hours=3)
            backfill = await handle.backfill(
                start_time=window_start.isoformat(),
                end_time=(window_start + dt.timedelta(seconds=3)).isoformat(),
                overlap_policy="allow_all",
            )
            assert backfill.fires_attempted == 3, backfill
            assert [r["outcome"] for r in backfill.results] == ["started"] * 3, backfill.results

            await handle.delete()
            with pytest.raises(ScheduleNotFound):
                await handle.describe()
            history = await all_history(client, schedule_id)
        return history

    history = run_async(main(), timeout=120)
    types = [e.event_type for e in history]
    assert types[0] == "ScheduleCreated" and types[-1] == "ScheduleDeleted", types
    for expected in ("SchedulePaused", "ScheduleResumed", "ScheduleUpdated", "ScheduleTriggered"):
        assert expected in types, types
    assert [e.sequence for e in history] == list(range(1, len(history) + 1))
    backfilled = [e for e in history if e.event_type == "ScheduleTriggered" and e.payload.get("outcome") == "backfilled"]
    assert len(backfilled) == 3
    fired = occurrences(history)
    assert len(fired) == len(set(fired)), "no occurrence started twice"


async def _fires_at_least(handle, n):
    described = await handle.describe()
    return described if described.fires_count >= n else None


def test_skip_policy_skips_an_occurrence_while_the_previous_run_is_open(server_url, worker_url, run_worker):
    queue = unique("sched-skip")
    schedule_id = unique("skipper")

    async def main():
        async with run_worker(worker_url, queue, workflows=[BlockingWorkflow]), make_client(server_url) as client:
            handle = await client.create_schedule(
                schedule_id=schedule_id,
                spec=ScheduleSpec(intervals=[{"every": "PT1S"}]),
                action=ScheduleAction(workflow_type="sched.blocking", task_queue=queue),
            )
            described = await wait_for("a skipped occurrence", lambda: _skipped(handle))
            manual = await handle.trigger()
            await handle.delete()
            first = client.get_workflow_handle(described.latest_workflow_instance_id)
            await first.terminate(reason="test over")
        return described, manual

    described, manual = run_async(main(), timeout=60)
    assert described.fires_count == 1, "the first run is still open: nothing else started"
    assert described.info["last_skip_reason"] == "overlap_policy_skip"
    assert manual.outcome == "skipped" and manual.reason == "overlap_policy_skip", manual


async def _skipped(handle):
    described = await handle.describe()
    return described if described.info.get("skipped_trigger_count", 0) >= 2 else None


def test_a_restart_neither_skips_nor_doubles_an_occurrence(server_factory, run_worker):
    server = server_factory.create()
    queue = unique("sched-restart")
    schedule_id = unique("survivor")

    async def before_crash():
        async with make_client(server.url) as client:
            handle = await client.create_schedule(
                schedule_id=schedule_id,
                spec=ScheduleSpec(intervals=[{"every": "PT1S"}]),
                action=ScheduleAction(workflow_type="sched.tick", task_queue=queue, input=["restart"]),
                overlap_policy="allow_all",
            )
            await wait_for("three fires", lambda: _fires_at_least(handle, 3))

    async def after_restart():
        async with run_worker(server.url, queue, workflows=[TickWorkflow]), make_client(server.url, patient=True) as client:
            handle = client.get_schedule_handle(schedule_id)
            before = (await handle.describe()).fires_count
            await wait_for("fires after the restart", lambda: _fires_at_least(handle, before + 3))
            await handle.pause()
            history = await all_history(client, schedule_id, limit=50)
        return history

    run_async(before_crash(), timeout=60)
    server.kill()
    time.sleep(3)  # three occurrences pass while no server runs
    server.start()
    history = run_async(after_restart(), timeout=90)
    fired = [dt.datetime.fromisoformat(t.replace("Z", "+00:00")) for t in occurrences(history)]
    assert len(fired) == len(set(fired)), f"an occurrence started twice: {fired}"
    seconds = [int(t.timestamp()) for t in fired]
    assert seconds == list(range(seconds[0], seconds[0] + len(seconds))), f"an occurrence was skipped: {seconds}"
    assert len(seconds) >= 9


def test_three_nodes_on_one_database_fire_each_occurrence_once(cluster_factory, run_worker):
    """Every node runs the scheduler; the schedule's row lock lets exactly one fire each time,
    and a node's crash changes nothing."""
    a, b, c = cluster_factory.create(3)
    queue = unique("sched-cluster")
    schedule_id = unique("shared")

    async def main():
        async with run_worker(b.url, queue, workflows=[TickWorkflow]), make_client(a.url) as client:
            handle = await client.create_schedule(
                schedule_id=schedule_id,
                spec=ScheduleSpec(intervals=[{"every": "PT1S"}]),
                action=ScheduleAction(workflow_type="sched.tick", task_queue=queue, input=["cluster"]),
                overlap_policy="allow_all",
            )
            await wait_for("four fires", lambda: _fires_at_least(handle, 4))
            c.kill()
            before = (await handle.describe()).fires_count
            await wait_for("four more fires", lambda: _fires_at_least(handle, before + 4))
            await handle.pause()
            history = await all_history(client, schedule_id, limit=100)
        return history

    history = run_async(main(), timeout=90)
    seconds = [int(dt.datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()) for t in occurrences(history)]
    assert len(seconds) == len(set(seconds)), f"an occurrence started twice: {seconds}"
    assert seconds == list(range(seconds[0], seconds[0] + len(seconds))), f"an occurrence was skipped: {seconds}"
