"""A condition wait that times out is recorded as DW records it: the timeout timer's
`TimerFired`, then the wait's own `ConditionWaitTimedOut`. The published Python SDK resolves the
wait to False from it, live and on a cold replay by a fresh worker, on its own and as a member
of a durable selection.
"""
from __future__ import annotations

import asyncio

from durable_workflow import workflow
from durable_workflow.workflow import replay

from capstan_harness import (
    assert_history_invariants,
    event_type,
    events_of,
    fetch_history,
    make_client,
    payload_of,
    run_async,
    unique,
    wait_result,
)


@workflow.defn(name="cond.timeouts")
class TimingOut:
    def __init__(self) -> None:
        self.done = False

    @workflow.signal("done")
    def finish(self) -> None:
        self.done = True

    def run(self, ctx):
        first = yield ctx.wait_condition(lambda: self.done, key="first", timeout=1)
        yield ctx.sleep(2)  # the fresh worker takes over here and replays the timeout cold
        selection = yield ctx.select({
            "never": ctx.wait_condition(lambda: self.done, key="never", timeout=1),
            "later": ctx.start_timer(30),
        })
        return {"first": first, "winner": selection.key, "value": selection.result()}


def test_a_condition_timeout_is_its_own_event_and_replays(server_url, worker_url, run_worker):
    queue = unique("cond-timeout")
    workflow_id = unique("cond")

    async def main():
        async with make_client(server_url) as client:
            async with run_worker(worker_url, queue, workflows=[TimingOut]):
                handle = await client.start_workflow(workflow_type="cond.timeouts", task_queue=queue,
                                                     workflow_id=workflow_id, input=[])
                for _ in range(100):
                    kinds = [event_type(e) for e in await fetch_history(client, workflow_id, handle.run_id)]
                    if "TimerScheduled" in kinds[kinds.index("ConditionWaitTimedOut"):] if "ConditionWaitTimedOut" in kinds else False:
                        break
                    await asyncio.sleep(0.1)
            # A new worker (no cache) replays the first timeout cold, then meets the second.
            async with run_worker(worker_url, queue, workflows=[TimingOut]) as fresh:
                result = await wait_result(handle, timeout=45, workers=[fresh])
            events = await fetch_history(client, workflow_id, handle.run_id)
        return result, events, handle.run_id

    result, events, run_id = run_async(main(), timeout=90)
    assert result == {"first": False, "winner": "never", "value": False}, result
    assert_history_invariants(events, terminal="WorkflowCompleted")
    timed_out = events_of(events, "ConditionWaitTimedOut")
    assert len(timed_out) == 2, [event_type(e) for e in events]
    for event in timed_out:
        index = next(i for i, e in enumerate(events) if e["id"] == event["id"])
        fired = events[index - 1]
        assert event_type(fired) == "TimerFired" and payload_of(fired)["timer_kind"] == "condition_timeout"
        payload = payload_of(event)
        assert payload["condition_wait_id"] == payload_of(fired)["condition_wait_id"]
        assert payload["timer_id"] == payload_of(fired)["timer_id"] and payload["timeout_seconds"] == 1
        assert payload["sequence"] == payload_of(fired)["sequence"]
    assert [payload_of(e)["condition_key"] for e in timed_out] == ["first", "never"]
    outcome = replay(TimingOut, events, [], workflow_id=workflow_id, run_id=run_id)
    assert [type(c).__name__ for c in outcome.commands] == ["CompleteWorkflow"], outcome.commands
