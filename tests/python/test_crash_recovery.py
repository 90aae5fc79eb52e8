"""Real-process crash recovery: SIGKILL ``capstan`` while activities and
durable timers are in flight, restart it on the same port and data dir, and
check that every workflow still completes exactly once with the right result.

Short leases (5 s) make the server re-offer work that was leased to the
workers before the crash soon after the restart. The Python workers keep
running across the crash (the SDK retries connection errors); a worker whose
loop dies is replaced by a fresh one.
"""
from __future__ import annotations

import asyncio
import time
from collections import Counter

from durable_workflow import ActivityRetryPolicy, activity, workflow

from capstan_harness import (
    BackgroundWorker,
    assert_history_invariants,
    event_type,
    events_of,
    fetch_history,
    make_client,
    payload_of,
    run_async,
    type_sequence,
    unique,
    wait_result,
)

LEASE_SECONDS = 5
WORKFLOWS = 20
WORKERS = 2

# What the activity side has seen in this process (all workers share it).
INFLIGHT: set[tuple[int, str]] = set()
EXECUTIONS: Counter[tuple[int, str]] = Counter()

# Enough attempts that a result lost in the crash (the attempt then expires
# and is retried) can never exhaust the budget.
CRASH_RETRY = ActivityRetryPolicy(max_attempts=10, backoff_seconds=[1] * 9)


@activity.defn(name="crash.step")
async def crash_step(index: int, step: str, seconds: float) -> str:
    token = (index, step)
    EXECUTIONS[token] += 1
    INFLIGHT.add(token)
    try:
        await asyncio.sleep(seconds)
    finally:
        INFLIGHT.discard(token)
    return f"{step}{index}"


@workflow.defn(name="crash.pipeline")
class CrashPipeline:
    """quick activity -> durable timer -> slow activity."""

    def run(self, ctx, index, timer_seconds, slow_seconds):
        first = yield ctx.schedule_activity("crash.step", [index, "a", 0.2], retry_policy=CRASH_RETRY)
        yield ctx.sleep(timer_seconds)
        second = yield ctx.schedule_activity("crash.step", [index, "b", slow_seconds], retry_policy=CRASH_RETRY)
        return f"{first}+{second}"


def plan(index: int) -> tuple[int, float]:
    """(timer seconds, slow activity seconds), staggered so that at any moment
    some workflows sit in a timer while others run their slow activity."""
    return 1 + index % 3, 1.0 + (index % 3)


def expected_result(index: int) -> str:
    return f"a{index}+b{index}"


async def _pending_timers(client, handles) -> int:
    histories = await asyncio.gather(*(fetch_history(client, h.workflow_id, h.run_id) for h in handles))
    pending = 0
    for events in histories:
        fired = {payload_of(e).get("timer_id") for e in events_of(events, "TimerFired")}
        pending += sum(1 for e in events_of(events, "TimerScheduled") if payload_of(e).get("timer_id") not in fired)
    return pending


def test_sigkill_mid_flight_recovers_every_workflow(server_factory):
    server = server_factory.create(
        "--workflow-task-lease-seconds", str(LEASE_SECONDS),
        "--activity-task-lease-seconds", str(LEASE_SECONDS),
    )
    queue = unique("crash")
    prefix = unique("crash-wf")
    INFLIGHT.clear()
    EXECUTIONS.clear()

    async def main():
        workers: list[BackgroundWorker] = []
        replaced: list[str] = []

        async def add_worker() -> None:
            worker = BackgroundWorker(
                server.url, queue, workflows=[CrashPipeline], activities=[crash_step],
                max_concurrent_workflow_tasks=10, max_concurrent_activity_tasks=20,
            )
            await worker.start()
            workers.append(worker)

        try:
            for _ in range(WORKERS):
                await add_worker()

            async with make_client(server.url, patient=True) as client:
                handles = await asyncio.gather(*(
                    client.start_workflow(
                        workflow_type="crash.pipeline", task_queue=queue, workflow_id=f"{prefix}-{i}",
                        input=[i, *plan(i)],
                    )
                    for i in range(WORKFLOWS)
                ))
                run_ids = {h.workflow_id: h.run_id for h in handles}

                # Crash only once slow activities are running in the workers
                # *and* durable timers are still waiting in the server.
                deadline = time.monotonic() + 30
                pending_timers = 0
                while True:
                    slow_inflight = sum(1 for _, step in INFLIGHT if step == "b")
                    if slow_inflight >= 3:
                        pending_timers = await _pending_timers(client, handles)
                        if pending_timers >= 1:
                            break
                    assert time.monotonic() < deadline, (
                        f"never reached the crash point: {slow_inflight} slow activities in flight, "
                        f"{pending_timers} pending timers, executions so far {dict(EXECUTIONS)}"
                    )
                    await asyncio.sleep(0.05)

                inflight_at_crash = sorted(INFLIGHT)
                server.kill()
                print(f"SIGKILL with activities in flight {inflight_at_crash} and {pending_timers} pending timers")

                # Stay down long enough for in-flight activities to finish and
                # fail to report, and for pending timers to come due.
                await asyncio.sleep(1.5)
                server.spawn()
                await server.wait_ready_async()
                restarted_at = time.monotonic()

                async def watch_workers() -> None:
                    while True:
                        for worker in list(workers):
                            if worker.alive:
                                continue
                            replaced.append(f"{worker.name}: {worker.failure()!r}")
                            workers.remove(worker)
                            await worker.stop()
                            try:
                                await add_worker()
                            except Exception as error:  # noqa: BLE001 - keep watching; results will tell
                                replaced.append(f"replacement worker failed to start: {error!r}")
                        await asyncio.sleep(0.5)

                watchdog = asyncio.create_task(watch_workers())
                try:
                    results = await asyncio.gather(*(wait_result(h, timeout=90, workers=workers) for h in handles))
                finally:
                    watchdog.cancel()
                print(f"all {WORKFLOWS} workflows completed {time.monotonic() - restarted_at:.1f}s after restart")

                assert results == [expected_result(i) for i in range(WORKFLOWS)]

                described = await asyncio.gather(*(h.describe() for h in handles))
                assert {d.status for d in described} == {"completed"}, [(d.workflow_id, d.status) for d in described]
                assert all(d.run_id == run_ids[d.workflow_id] for d in described), "a crash must not start new runs"

                histories = await asyncio.gather(*(fetch_history(client, h.workflow_id, h.run_id) for h in handles))
        finally:
            for worker in workers:
                await worker.stop()

        for handle, events in zip(handles, histories):
            context = f"{handle.workflow_id} {type_sequence(events)}"
            summary = assert_history_invariants(events, terminal="WorkflowCompleted", context=context)
            assert summary["activities_scheduled"] == 2, context
            assert sorted(summary["activity_resolutions"].values()) == ["ActivityCompleted", "ActivityCompleted"], context
            assert len(summary["timers_scheduled"]) == 1, context
            assert summary["timers_fired"] == summary["timers_scheduled"], (
                f"every timer must fire exactly once: {context}"
            )
            # the second activity is scheduled only after the timer fired
            order = [event_type(e) for e in events if event_type(e) in ("TimerFired", "ActivityScheduled")]
            assert order == ["ActivityScheduled", "TimerFired", "ActivityScheduled"], context

        reruns = {f"{step}{index}": n for (index, step), n in EXECUTIONS.items() if n > 1}
        print(f"activities executed more than once (at-least-once redelivery): {reruns or 'none'}")
        if replaced:
            print(f"worker loops that died and were replaced: {replaced}")
        assert set(EXECUTIONS) == {(i, step) for i in range(WORKFLOWS) for step in ("a", "b")}

    run_async(main(), timeout=150)
