"""End-to-end tests: the published Python SDK (``durable-workflow==2.12.0``)
drives a real ``capstan serve`` through its ``Worker`` and ``Client``.

Each test uses its own task queue and workflow ids, so the module shares one
server. Every test asserts real outcomes: the workflow result, the run status
as described by the server, and the recorded history.

With ``CAPSTAN_TEST_BACKEND=postgres`` the module shares a two-node cluster
instead: Workers poll one node (``worker_url``) and the Client talks to the
other (``server_url``), so every workflow crosses nodes.
"""
from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
from durable_workflow import (
    ActivityRetryPolicy,
    QueryFailed,
    SignalFailed,
    WorkflowAlreadyStarted,
    WorkflowCancelled,
    WorkflowFailed,
    WorkflowTerminated,
    activity,
    workflow,
)

from capstan_harness import (
    TERMINAL_EVENT_TYPES,
    assert_history_invariants,
    assert_in_order,
    event_type,
    events_of,
    fetch_history,
    fetch_history_raw,
    make_client,
    payload_of,
    run_async,
    type_sequence,
    unique,
    wait_for_history,
    wait_result,
)

# ── workflows and activities ─────────────────────────────────────────────


@activity.defn(name="e2e.greet")
def greet(name: str) -> str:
    return f"Hello, {name}!"


@workflow.defn(name="e2e.greeting")
class GreetingWorkflow:
    def run(self, ctx, name):
        greeting = yield ctx.schedule_activity("e2e.greet", [name])
        return greeting


@workflow.defn(name="e2e.nap")
class NapWorkflow:
    def run(self, ctx, seconds):
        yield ctx.sleep(seconds)
        return f"slept {seconds}s"


@workflow.defn(name="e2e.approval")
class ApprovalWorkflow:
    def __init__(self) -> None:
        self.approver: str | None = None

    @workflow.signal("approve")
    def approve(self, approver: str) -> None:
        self.approver = approver

    def run(self, ctx, request):
        yield ctx.wait_condition(lambda: self.approver is not None)
        return f"{request} approved by {self.approver}"


@workflow.defn(name="e2e.counter")
class CounterWorkflow:
    """Counts `bump` signals until `stop`; answers the `count` query from replayed state."""

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


@workflow.defn(name="e2e.countdown")
class CountdownWorkflow:
    """Greets `n`, then continues as new with `n - 1` until it reaches zero."""

    def run(self, ctx, n):
        greeting = yield ctx.schedule_activity("e2e.greet", [str(n)])
        if n <= 0:
            return greeting
        return ctx.continue_as_new(n - 1)


@workflow.defn(name="e2e.memo")
class MemoWorkflow:
    """Upserts its memo twice (the second upsert deletes a key), then finishes."""

    def run(self, ctx, order):
        yield ctx.upsert_memo({"stage": "charging", "order": order, "attempts": 1, "scratch": "x"})
        yield ctx.sleep(1)
        yield ctx.upsert_memo({"stage": "done", "scratch": None, "ratio": 0.5})
        return "ok"


# The deepest memo value the server decodes: the memo map is level 1, so 30 nested lists put
# the innermost value at level 32 (`avro::MAX_DEPTH`).
DEEPEST_MEMO_VALUE: object = "leaf"
for _ in range(30):
    DEEPEST_MEMO_VALUE = [DEEPEST_MEMO_VALUE]


@workflow.defn(name="e2e.deep_memo")
class DeepMemoWorkflow:
    """Upserts a memo value nested as deep as the server decodes, then finishes."""

    def run(self, ctx):
        yield ctx.upsert_memo({"tree": DEEPEST_MEMO_VALUE})
        return "ok"


@workflow.defn(name="e2e.cart")
class CartWorkflow:
    """Collects items through updates until `checkout`; the update returns the new total."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.checked_out = False

    @workflow.update("add_item")
    def add_item(self, item: str) -> int:
        if item == "forbidden":
            raise ValueError("forbidden items are not sold")
        self.items.append(item)
        return len(self.items)

    @workflow.signal("checkout")
    def checkout(self) -> None:
        self.checked_out = True

    def run(self, ctx):
        yield ctx.wait_condition(lambda: self.checked_out)
        return self.items


@workflow.defn(name="e2e.child-square")
class ChildSquareWorkflow:
    def run(self, ctx, n):
        if n < 0:
            raise ValueError(f"cannot square {n}")
        squared = yield ctx.schedule_activity("e2e.square", [n])
        return squared


@workflow.defn(name="e2e.parent")
class ParentWorkflow:
    """Squares each number in a child workflow; a failing child's error is caught."""

    def run(self, ctx, numbers):
        results = []
        for n in numbers:
            try:
                value = yield ctx.start_child_workflow("e2e.child-square", [n])
                results.append(value)
            except Exception as error:  # noqa: BLE001 - the child's failure arrives as an exception
                results.append(f"failed: {type(error).__name__}")
        return results


@activity.defn(name="e2e.local-greet")
async def local_greet(name: str) -> str:
    await activity.context().heartbeat({"phase": "greeting"})
    if name == "nobody":
        raise RuntimeError("no one to greet")
    return f"hello, {name}"


@workflow.defn(name="e2e.local-greeting")
class LocalGreetingWorkflow:
    """A local activity (run inside the workflow task) followed by a regular one."""

    def run(self, ctx, name):
        try:
            local = yield ctx.local_activity(
                "e2e.local-greet", [name], start_to_close_timeout=30,
                retry_policy={"max_attempts": 2, "backoff_seconds": [0]},
            )
        except Exception as failure:  # noqa: BLE001 - reported as the workflow's result
            local = f"failed: {failure}"
        remote = yield ctx.schedule_activity("e2e.greet", [name])
        return {"local": local, "remote": remote}


@workflow.defn(name="e2e.race")
class RaceWorkflow:
    """An activity races a timer; the loser is cancelled."""

    def run(self, ctx, seconds, deadline):
        selection = yield ctx.select({
            "work": ctx.schedule_activity("e2e.slow", [seconds]),
            "deadline": ctx.start_timer(deadline),
        })
        loser = "deadline" if selection.key == "work" else "work"
        yield selection.handles[loser].cancel()
        if selection.key == "work":
            return {"winner": "work", "value": selection.result()}
        return {"winner": "deadline"}


@workflow.defn(name="e2e.flaky-child")
class FlakyChildWorkflow:
    """Fails (without activity retries) until its flaky activity has failed enough times."""

    def run(self, ctx, key, failures_before_success, error):
        failed = None
        try:
            value = yield ctx.schedule_activity(
                "e2e.flaky", [key, failures_before_success], retry_policy=ActivityRetryPolicy(max_attempts=1),
            )
        except Exception as failure:  # noqa: BLE001 - raised below as the requested error type
            failed = str(failure)
        if failed is not None:
            # Outside the handler, so the SDK reports this type rather than the activity's.
            raise {"ValueError": ValueError, "KeyError": KeyError}[error](failed)
        return value


@workflow.defn(name="e2e.retrying-parent")
class RetryingParentWorkflow:
    """Calls a flaky child under a child retry policy; reports the child's result or failure."""

    def run(self, ctx, key, failures_before_success, error):
        try:
            value = yield ctx.start_child_workflow(
                "e2e.flaky-child", [key, failures_before_success, error],
                retry_policy={"max_attempts": 3, "backoff_seconds": [1, 1], "non_retryable_error_types": ["KeyError"]},
            )
            return {"child": value}
        except Exception as failure:  # noqa: BLE001 - the exhausted or non-retryable child failure
            return {"failed": type(failure).__name__, "message": str(failure)}


@workflow.defn(name="e2e.parent-terminating")
class TerminatingParentWorkflow:
    """Starts a child that waits forever, with parent-close policy terminate."""

    def run(self, ctx):
        value = yield ctx.start_child_workflow("e2e.approval", ["child-request"], parent_close_policy="terminate")
        return value


@workflow.defn(name="e2e.fan-out")
class FanOutWorkflow:
    """Two activities awaited together, then a nested group [activity, [activity, timer]]."""

    def run(self, ctx, base):
        first, second = yield [ctx.schedule_activity("e2e.square", [base]), ctx.schedule_activity("e2e.square", [base + 1])]
        third, (fourth, _) = yield [
            ctx.schedule_activity("e2e.square", [base + 2]),
            [ctx.schedule_activity("e2e.square", [base + 3]), ctx.sleep(1)],
        ]
        return [first, second, third, fourth]


# activity attempt bookkeeping, keyed by a per-test key passed as argument
FLAKY_ATTEMPTS: dict[str, list[int]] = {}


@activity.defn(name="e2e.flaky")
async def flaky(key: str, failures_before_success: int) -> str:
    attempts = FLAKY_ATTEMPTS.setdefault(key, [])
    attempts.append(activity.context().info.attempt_number)
    if len(attempts) <= failures_before_success:
        raise RuntimeError(f"transient failure #{len(attempts)} for {key}")
    return f"{key} ok after {len(attempts)} attempts"


@workflow.defn(name="e2e.retrying")
class RetryingWorkflow:
    def run(self, ctx, key, failures_before_success, max_attempts):
        result = yield ctx.schedule_activity(
            "e2e.flaky",
            [key, failures_before_success],
            retry_policy=ActivityRetryPolicy(max_attempts=max_attempts, backoff_seconds=[1] * (max_attempts - 1)),
        )
        return result


@activity.defn(name="e2e.square")
async def square(n: int) -> int:
    return n * n


@workflow.defn(name="e2e.squarer")
class SquarerWorkflow:
    def run(self, ctx, n):
        squared = yield ctx.schedule_activity("e2e.square", [n])
        return {"n": n, "square": squared}


NOT_TERMINAL = {"pending", "running", "waiting"}


async def _wait_until_waiting(client, handle) -> list[dict]:
    """Until the first workflow task has opened the condition wait."""
    return await wait_for_history(
        client, handle.workflow_id, handle.run_id,
        lambda events: bool(events_of(events, "ConditionWaitOpened")),
        what="ConditionWaitOpened",
    )


@activity.defn(name="e2e.slow")
def slow_activity(seconds: int) -> str:
    time.sleep(seconds)
    return "finished"


@workflow.defn(name="e2e.cooperative-activity")
class CooperativeActivityWorkflow:
    """Runs a quick activity, then waits on a slow one that a cancellation interrupts."""

    def run(self, ctx):
        greeting = yield ctx.schedule_activity("e2e.greet", ["Ada"])
        try:
            yield ctx.schedule_activity("e2e.slow", [20])
            return "not cancelled"
        except WorkflowCancelled:
            return {"greeting": greeting, "cleaned_up": True}


@workflow.defn(name="e2e.cooperative-waiting-activity")
class CooperativeWaitingActivityWorkflow:
    """Like e2e.cooperative-activity, but the slow activity's policy waits for its stop."""

    def run(self, ctx):
        greeting = yield ctx.schedule_activity("e2e.greet", ["Ada"])
        try:
            yield ctx.schedule_activity("e2e.slow", [20], cancellation_policy="wait_cancellation_completed")
            return "not cancelled"
        except WorkflowCancelled:
            return {"greeting": greeting, "cleaned_up": True}


@workflow.defn(name="e2e.cancellable-child")
class CancellableChildWorkflow:
    """Waits on a long timer; a delivered cancellation ends it after a short cleanup timer."""

    def run(self, ctx):
        try:
            yield ctx.start_timer(300)
            return "child not cancelled"
        except WorkflowCancelled:
            with ctx.cancellation_shield():
                yield ctx.start_timer(1)
            return "child cleaned up"


@workflow.defn(name="e2e.cancelling-parent")
class CancellingParentWorkflow:
    """Waits on a child whose cancellation policy it was given."""

    def run(self, ctx, policy):
        try:
            yield ctx.start_child_workflow("e2e.cancellable-child", [], cancellation_policy=policy)
            return "parent not cancelled"
        except WorkflowCancelled:
            return "parent cleaned up"


@workflow.defn(name="e2e.cooperative-cleanup")
class CooperativeCleanupWorkflow:
    """Waits on a long timer; a delivered cancellation runs a shielded cleanup timer."""

    def run(self, ctx, mode):
        try:
            yield ctx.start_timer(300)
            return "not cancelled"
        except WorkflowCancelled as cancelled:
            assert ctx.is_cancellation_requested and cancelled.request_id
            with ctx.cancellation_shield():
                yield ctx.start_timer(1)
            if mode == "reraise":
                raise
            return {"cleaned_up": cancelled.request_id}


# ── tests ────────────────────────────────────────────────────────────────


def test_workflow_returns_activity_result(server_url, worker_url, run_worker):
    queue = unique("e2e-greeting")
    workflow_id = unique("greeting")

    async def main():
        async with run_worker(worker_url, queue, workflows=[GreetingWorkflow], activities=[greet]) as worker:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(
                    workflow_type="e2e.greeting", task_queue=queue, workflow_id=workflow_id, input=["Capstan"],
                )
                assert handle.workflow_id == workflow_id
                assert handle.run_id, "start response carried no run_id"

                result = await wait_result(handle, timeout=30, workers=[worker])
                assert result == "Hello, Capstan!"

                described = await handle.describe()
                assert described.status == "completed"
                assert described.workflow_type == "e2e.greeting"
                assert described.run_id == handle.run_id
                assert described.task_queue == queue
                # output_envelope decoded by the SDK (Rust SDK requires it too)
                assert described.output == "Hello, Capstan!"

            # raw control-plane read: events / sequence / timestamp / payload
            events = await fetch_history_raw(server_url, workflow_id, handle.run_id)
            for event in events:
                assert {"sequence", "event_type", "timestamp", "payload"} <= set(event), event
            assert_history_invariants(events, terminal="WorkflowCompleted")
            assert_in_order(events, ["WorkflowStarted", "ActivityScheduled", "ActivityCompleted", "WorkflowCompleted"])

            started = payload_of(events_of(events, "WorkflowStarted")[0])
            assert started.get("workflow_type") == "e2e.greeting"
            assert started.get("workflow_instance_id") == workflow_id
            assert started.get("workflow_run_id") == handle.run_id

            (scheduled,) = events_of(events, "ActivityScheduled")
            (completed,) = events_of(events, "ActivityCompleted")
            assert payload_of(scheduled).get("activity_type") == "e2e.greet"
            execution_id = payload_of(scheduled).get("activity_execution_id")
            assert execution_id and payload_of(completed).get("activity_execution_id") == execution_id
            assert payload_of(scheduled).get("sequence") == 1
            assert payload_of(completed).get("sequence") == 1

            finished = payload_of(events[-1])
            assert finished.get("output"), "WorkflowCompleted carries no output"
            assert finished.get("payload_codec") == "avro"

    run_async(main(), timeout=60)


def test_durable_timer_fires(server_url, worker_url, run_worker):
    queue = unique("e2e-timer")
    workflow_id = unique("nap")

    async def main():
        async with run_worker(worker_url, queue, workflows=[NapWorkflow]) as worker:
            async with make_client(server_url) as client:
                began = time.monotonic()
                handle = await client.start_workflow(
                    workflow_type="e2e.nap", task_queue=queue, workflow_id=workflow_id, input=[2],
                )
                result = await wait_result(handle, timeout=30, workers=[worker])
                elapsed = time.monotonic() - began
                assert result == "slept 2s"
                assert elapsed >= 1.9, f"a 2 s durable timer resolved after {elapsed:.2f}s"
                assert (await handle.describe()).status == "completed"

                events = await fetch_history(client, workflow_id, handle.run_id)

        assert_history_invariants(events, terminal="WorkflowCompleted")
        assert_in_order(events, ["WorkflowStarted", "TimerScheduled", "TimerFired", "WorkflowCompleted"])
        (scheduled,) = events_of(events, "TimerScheduled")
        (fired,) = events_of(events, "TimerFired")
        timer_id = payload_of(scheduled).get("timer_id")
        assert timer_id, f"TimerScheduled has no timer_id: {scheduled}"
        assert payload_of(scheduled).get("delay_seconds") == 2
        assert payload_of(fired).get("timer_id") == timer_id
        assert payload_of(fired).get("sequence") == payload_of(scheduled).get("sequence") == 1
        assert payload_of(fired).get("timer_kind") is None, "a user timer must fire without timer_kind"

    run_async(main(), timeout=60)


def test_signal_wakes_waiting_workflow(server_url, worker_url, run_worker):
    queue = unique("e2e-signal")
    workflow_id = unique("approval")

    async def main():
        async with run_worker(worker_url, queue, workflows=[ApprovalWorkflow]) as worker:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(
                    workflow_type="e2e.approval", task_queue=queue, workflow_id=workflow_id, input=["expense-42"],
                )
                await _wait_until_waiting(client, handle)
                described = await handle.describe()
                assert described.status in NOT_TERMINAL, f"workflow closed before the signal: {described.status}"

                receipt = await handle.signal("approve", ["alice"])
                assert receipt.get("workflow_id") == workflow_id, receipt
                assert receipt.get("outcome") == "signal_received", receipt

                result = await wait_result(handle, timeout=30, workers=[worker])
                assert result == "expense-42 approved by alice"
                assert (await handle.describe()).status == "completed"

                events = await fetch_history(client, workflow_id, handle.run_id)

        assert_history_invariants(events, terminal="WorkflowCompleted")
        assert_in_order(events, ["ConditionWaitOpened", "SignalReceived", "ConditionWaitSatisfied", "WorkflowCompleted"])
        (received,) = events_of(events, "SignalReceived")
        assert payload_of(received).get("signal_name") == "approve"
        assert payload_of(received).get("arguments"), "SignalReceived carries no arguments"
        assert "sequence" not in payload_of(received), "SignalReceived must not consume a step sequence"

    run_async(main(), timeout=60)


def test_query_answers_from_replayed_state(server_url, worker_url, run_worker):
    queue = unique("e2e-query")
    workflow_id = unique("counter")

    async def main():
        async with run_worker(worker_url, queue, workflows=[CounterWorkflow]) as worker:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(workflow_type="e2e.counter", task_queue=queue, workflow_id=workflow_id, input=[])
                await _wait_until_waiting(client, handle)

                async def count():
                    # The 2.12.0 client returns the server's query body with `result` decoded.
                    answer = await handle.query("count")
                    assert answer["query_name"] == "count" and answer["workflow_id"] == workflow_id, answer
                    return answer["result"]

                assert await count() == 0
                await handle.signal("bump", [5])
                await handle.signal("bump", [2])
                # Signals are history once acknowledged; the query replays them.
                deadline = time.monotonic() + 20
                while (seen := await count()) != 7:
                    assert time.monotonic() < deadline, f"query kept answering {seen}"
                    await asyncio.sleep(0.2)
                with pytest.raises(QueryFailed):
                    await handle.query("no-such-query")
                before = await fetch_history(client, workflow_id, handle.run_id)
                await count()
                after = await fetch_history(client, workflow_id, handle.run_id)
                assert len(after) == len(before), "a query must not write history"
                await handle.signal("stop", [])
                assert await wait_result(handle, timeout=30, workers=[worker]) == 7
                # Queries still work on a closed run: they replay its committed history.
                assert await count() == 7

    run_async(main(), timeout=90)


def test_continue_as_new_chains_runs_of_one_instance(server_url, worker_url, run_worker):
    import httpx

    queue = unique("e2e-can")
    workflow_id = unique("countdown")

    async def main():
        async with run_worker(worker_url, queue, workflows=[CountdownWorkflow], activities=[greet]) as worker:
            async with make_client(server_url) as client:
                first = await client.start_workflow(workflow_type="e2e.countdown", task_queue=queue, workflow_id=workflow_id, input=[3])
                # A handle without a run id follows the instance to its current run.
                current = client.get_workflow_handle(workflow_id)
                assert await wait_result(current, timeout=60, workers=[worker]) == "Hello, 0!"
                async with httpx.AsyncClient(base_url=server_url, headers={"X-Durable-Workflow-Control-Plane-Version": "2"}) as http:
                    runs = (await http.get(f"/api/workflows/{workflow_id}/runs")).json()["runs"]
                    described = [(await http.get(f"/api/workflows/{workflow_id}/runs/{r['run_id']}")).json() for r in runs]
                histories = [await fetch_history(client, workflow_id, r["run_id"]) for r in runs]

        assert [r["run_number"] for r in runs] == [1, 2, 3, 4]
        assert runs[0]["run_id"] == first.run_id
        assert [d["closed_reason"] for d in described] == ["continued", "continued", "continued", "completed"]
        assert all(d["status"] == "completed" for d in described)
        assert [d["is_current_run"] for d in described] == [False, False, False, True]
        for earlier, later, history in zip(histories, histories[1:], histories[1:]):
            (continued,) = events_of(earlier, "WorkflowContinuedAsNew")
            assert payload_of(continued)["continued_to_run_id"] == events_of(history, "WorkflowStarted")[0]["payload"]["workflow_run_id"]
            assert event_type(earlier[-1]) == "WorkflowContinuedAsNew"
            assert event_type(later[0]) == "WorkflowStarted", "a continued run has no StartAccepted"
            # One hash chain for the instance: each run's first event links to the previous run's last.
            assert later[0]["prev_hash"] == earlier[-1]["hash"]
        assert event_type(histories[-1][-1]) == "WorkflowCompleted"

    run_async(main(), timeout=90)


def test_a_memo_nested_as_deep_as_allowed_is_merged(server_url, worker_url, run_worker):
    """The server decodes memo upserts, recursing per nesting level: the threads that run
    transitions (the SQLite writer, the runtime's workers on PostgreSQL) have the stack for the
    deepest value it accepts, even in the debug build the tests run."""
    queue = unique("e2e-deep-memo")
    workflow_id = unique("deep-memo")

    async def main():
        async with run_worker(worker_url, queue, workflows=[DeepMemoWorkflow]) as worker:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(workflow_type="e2e.deep_memo", task_queue=queue, workflow_id=workflow_id)
                assert await wait_result(handle, timeout=60, workers=[worker]) == "ok"
                described = await handle.describe()
        assert described.memo == {"tree": DEEPEST_MEMO_VALUE}, described.memo

    run_async(main(), timeout=90)


def test_memo_upserts_merge_and_replay(server_url, worker_url, run_worker):
    queue = unique("e2e-memo")
    workflow_id = unique("memo")

    async def main():
        async with run_worker(worker_url, queue, workflows=[MemoWorkflow]) as worker:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(
                    workflow_type="e2e.memo", task_queue=queue, workflow_id=workflow_id, input=["o-9"], memo={"origin": "api"},
                )
                # The sleep between the upserts makes the worker replay the first one.
                assert await wait_result(handle, timeout=60, workers=[worker]) == "ok"
                described = await handle.describe()
                events = await fetch_history(client, workflow_id, handle.run_id)

        assert described.memo == {"origin": "api", "stage": "done", "order": "o-9", "attempts": 1, "ratio": 0.5}, described.memo
        upserts = events_of(events, "MemoUpserted")
        assert len(upserts) == 2
        for event in upserts:
            payload = payload_of(event)
            assert set(payload["entries"]) == {"codec", "blob"} and set(payload["merged"]) == {"codec", "blob"}, payload
            assert isinstance(payload["sequence"], int)
        assert_history_invariants(events, terminal="WorkflowCompleted")

    run_async(main(), timeout=90)


def test_updates_return_handler_results_and_replay(server_url, worker_url, run_worker):
    from durable_workflow import UpdateFailed

    queue = unique("e2e-update")
    workflow_id = unique("cart")

    async def main():
        async with run_worker(worker_url, queue, workflows=[CartWorkflow]) as worker:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(workflow_type="e2e.cart", task_queue=queue, workflow_id=workflow_id, input=[])
                await _wait_until_waiting(client, handle)
                first = await handle.update("add_item", ["apple"], wait_for="completed")
                assert first["update_status"] == "completed" and first["result"] == 1, first
                second = await handle.update("add_item", ["pear"], request_id="add-pear")
                assert second["result"] == 2, second
                # The same request id and intent: the original update, not a second one.
                again = await handle.update("add_item", ["pear"], request_id="add-pear")
                assert again["update_id"] == second["update_id"] and again["result"] == 2, again
                with pytest.raises(UpdateFailed):
                    await handle.update("add_item", ["forbidden"])
                await handle.signal("checkout", [])
                assert await wait_result(handle, timeout=30, workers=[worker]) == ["apple", "pear"]
                events = await fetch_history(client, workflow_id, handle.run_id)

        assert len(events_of(events, "UpdateAccepted")) == 3
        assert len(events_of(events, "UpdateApplied")) == 2, "a failed update records no UpdateApplied"
        assert len(events_of(events, "UpdateCompleted")) == 3
        assert_history_invariants(events, terminal="WorkflowCompleted")

    run_async(main(), timeout=90)


def test_child_workflows_return_results_and_failures(server_url, worker_url, run_worker):
    import httpx

    queue = unique("e2e-child")
    workflow_id = unique("parent")

    async def main():
        async with run_worker(worker_url, queue, workflows=[ParentWorkflow, ChildSquareWorkflow], activities=[square]) as worker:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(workflow_type="e2e.parent", task_queue=queue, workflow_id=workflow_id, input=[[3, -1, 4]])
                result = await wait_result(handle, timeout=60, workers=[worker])
                events = await fetch_history(client, workflow_id, handle.run_id)
                async with httpx.AsyncClient(base_url=server_url, headers={"X-Durable-Workflow-Control-Plane-Version": "2"}) as http:
                    children = [payload_of(e)["child_workflow_instance_id"] for e in events_of(events, "ChildRunStarted")]
                    described = [(await http.get(f"/api/workflows/{child}")).json() for child in children]

        assert result == [9, "failed: ChildWorkflowFailed", 16], result
        assert len(children) == 3
        assert [d["status"] for d in described] == ["completed", "failed", "completed"]
        assert all(d["parent_workflow_id"] == workflow_id for d in described)
        assert len(events_of(events, "ChildRunCompleted")) == 2
        assert len(events_of(events, "ChildRunFailed")) == 1
        steps = [payload_of(e)["sequence"] for e in events_of(events, "ChildWorkflowScheduled")]
        assert steps == [1, 2, 3]
        assert_history_invariants(events, terminal="WorkflowCompleted")

    run_async(main(), timeout=90)


@pytest.mark.parametrize(
    ("failures", "error", "expected_runs"),
    [(2, "ValueError", 3), (5, "ValueError", 3), (5, "KeyError", 1)],
    ids=["succeeds-on-third-run", "attempts-exhausted", "non-retryable"],
)
def test_child_retry_policy_restarts_failed_child_runs(server_url, worker_url, run_worker, failures, error, expected_runs):
    """A child call with a retry policy: each retryable failure starts the child instance's next
    run (after the backoff) and the parent records another `ChildRunStarted` for the same call
    without waking; the parent sees only the final outcome: the result, or one ChildRunFailed
    when attempts run out or the error type is non-retryable."""
    import httpx

    queue = unique("e2e-child-retry")
    workflow_id = unique("retrying-parent")
    key = unique("child-retry-key")

    async def main():
        async with run_worker(worker_url, queue, workflows=[RetryingParentWorkflow, FlakyChildWorkflow], activities=[flaky]) as worker:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(
                    workflow_type="e2e.retrying-parent", task_queue=queue, workflow_id=workflow_id, input=[key, failures, error],
                )
                result = await wait_result(handle, timeout=60, workers=[worker])
                events = await fetch_history(client, workflow_id, handle.run_id)
                child_id = payload_of(events_of(events, "ChildRunStarted")[0])["child_workflow_instance_id"]
                async with httpx.AsyncClient(base_url=server_url, headers={"X-Durable-Workflow-Control-Plane-Version": "2"}) as http:
                    runs = (await http.get(f"/api/workflows/{child_id}/runs")).json()
                    last_run = (await http.get(f"/api/workflows/{child_id}")).json()["run_id"]
                    last_events = await fetch_history(client, child_id, last_run)
        return result, events, runs, last_events

    result, events, runs, last_events = run_async(main(), timeout=90)
    if failures < expected_runs:
        assert result == {"child": f"{key} ok after {failures + 1} attempts"}, result
    else:
        assert result["failed"] == "ChildWorkflowFailed", result
    assert_history_invariants(events, terminal="WorkflowCompleted")
    started = events_of(events, "ChildRunStarted")
    assert len(started) == expected_runs, type_sequence(events)
    assert len({payload_of(e)["child_call_id"] for e in started}) == 1
    assert [payload_of(e).get("retry_attempt") for e in started[1:]] == list(range(2, expected_runs + 1))
    for earlier, later in zip(started, started[1:]):
        assert payload_of(later)["retry_of_child_workflow_run_id"] == payload_of(earlier)["child_workflow_run_id"]
    assert len(events_of(events, "ChildRunCompleted", "ChildRunFailed")) == 1
    run_items = runs.get("runs", runs) if isinstance(runs, dict) else runs
    assert len(run_items) == expected_runs, runs
    if expected_runs > 1:
        started_payload = payload_of(events_of(last_events, "WorkflowStarted")[0])
        assert started_payload["retry_attempt"] == expected_runs
        assert "continued_from_run_id" not in started_payload


@pytest.mark.parametrize("name", ["Ada", "nobody"])
def test_local_activities_are_recorded_once_and_replay(server_url, worker_url, run_worker, name):
    """`ctx.local_activity` runs inside the workflow task; the completion carries
    `record_local_activity` and Capstan records the step as activity events marked
    `execution_mode: local` (attempts, heartbeats, retries, one terminal event) with no activity
    task. Later tasks replay it (the regular activity after it completes the run), and the
    published replayer accepts the history cold."""
    queue = unique("e2e-local")
    workflow_id = unique("local")

    async def main():
        async with run_worker(worker_url, queue, workflows=[LocalGreetingWorkflow], activities=[local_greet, greet]) as worker:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(
                    workflow_type="e2e.local-greeting", task_queue=queue, workflow_id=workflow_id, input=[name],
                )
                result = await wait_result(handle, timeout=30, workers=[worker])
                events = await fetch_history(client, workflow_id, handle.run_id)
        return result, events, handle.run_id

    result, events, run_id = run_async(main(), timeout=60)
    if name == "nobody":
        assert result == {"local": "failed: no one to greet", "remote": "Hello, nobody!"}, result
    else:
        assert result == {"local": "hello, Ada", "remote": "Hello, Ada!"}, result
    assert_history_invariants(events, terminal="WorkflowCompleted")
    local = [e for e in events if payload_of(e).get("sequence") == 1]
    assert all(payload_of(e)["execution_mode"] == "local" and payload_of(e)["local_activity"] is True for e in local)
    kinds = [event_type(e) for e in local]
    attempts = 2 if name == "nobody" else 1
    assert kinds.count("ActivityStarted") == attempts and kinds.count("ActivityHeartbeatRecorded") == attempts, kinds
    assert kinds[-1] == ("ActivityFailed" if name == "nobody" else "ActivityCompleted"), kinds
    assert kinds.count("ActivityRetryScheduled") == attempts - 1
    # One execution for the local step, one for the regular one; only the regular one had a task.
    assert len({payload_of(e)["activity_execution_id"] for e in events_of(events, "ActivityScheduled")}) == 2
    assert "task_id" not in payload_of(local[0])
    from durable_workflow.workflow import replay

    outcome = replay(LocalGreetingWorkflow, events, [name], workflow_id=workflow_id, run_id=run_id)
    assert [type(c).__name__ for c in outcome.commands] == ["CompleteWorkflow"], outcome.commands


@pytest.mark.parametrize(("seconds", "deadline", "winner"), [(0, 30, "work"), (4, 1, "deadline")])
def test_select_records_one_winner_and_cancels_the_loser(server_url, worker_url, run_worker, seconds, deadline, winner):
    """`ctx.select` races an activity and a timer: in the transaction of the first member's
    terminal event Capstan records one `SelectionResolved` naming it; the workflow cancels the
    loser (`cancel_selection_operation` → one `SelectionOperationCancelled`, its timer or
    activity ends) and the published replayer accepts the history cold."""
    queue = unique("e2e-race")
    workflow_id = unique("race")

    async def main():
        async with run_worker(worker_url, queue, workflows=[RaceWorkflow], activities=[slow_activity]) as worker:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(
                    workflow_type="e2e.race", task_queue=queue, workflow_id=workflow_id, input=[seconds, deadline],
                )
                result = await wait_result(handle, timeout=30, workers=[worker])
                events = await fetch_history(client, workflow_id, handle.run_id)
        return result, events, handle.run_id

    result, events, run_id = run_async(main(), timeout=60)
    assert result["winner"] == winner, result
    if winner == "work":
        assert result["value"] == "finished"
    assert_history_invariants(events, terminal="WorkflowCompleted")
    (resolved,) = events_of(events, "SelectionResolved")
    resolved = payload_of(resolved)
    assert resolved["member_key"] == winner and resolved["outcome"] == "completed", resolved
    expected_type = "ActivityCompleted" if winner == "work" else "TimerFired"
    index = next(i for i, e in enumerate(events) if event_type(e) == "SelectionResolved")
    assert event_type(events[index - 1]) == expected_type and events[index - 1]["id"] == resolved["resolution_event_id"]
    (cancelled,) = events_of(events, "SelectionOperationCancelled")
    assert payload_of(cancelled)["member_key"] == ("deadline" if winner == "work" else "work")
    from durable_workflow.workflow import replay

    outcome = replay(RaceWorkflow, events, [seconds, deadline], workflow_id=workflow_id, run_id=run_id)
    assert [type(c).__name__ for c in outcome.commands] == ["CompleteWorkflow"], outcome.commands


def test_parent_close_policy_terminates_the_child(server_url, worker_url, run_worker):
    import httpx

    queue = unique("e2e-pcp")
    workflow_id = unique("pcp-parent")

    async def main():
        async with run_worker(worker_url, queue, workflows=[TerminatingParentWorkflow, ApprovalWorkflow]):
            async with make_client(server_url) as client:
                handle = await client.start_workflow(workflow_type="e2e.parent-terminating", task_queue=queue, workflow_id=workflow_id, input=[])
                events = await wait_for_history(
                    client, workflow_id, handle.run_id, lambda evs: bool(events_of(evs, "ChildRunStarted")), what="ChildRunStarted",
                )
                child_id = payload_of(events_of(events, "ChildRunStarted")[0])["child_workflow_instance_id"]
                await handle.terminate(reason="stop the family")
                async with httpx.AsyncClient(base_url=server_url, headers={"X-Durable-Workflow-Control-Plane-Version": "2"}) as http:
                    child = (await http.get(f"/api/workflows/{child_id}")).json()
                    parent = (await http.get(f"/api/workflows/{workflow_id}")).json()

        assert parent["status"] == "terminated"
        assert child["status"] == "terminated", child
        assert child["closed_reason"] == "terminated"

    run_async(main(), timeout=90)


def test_history_export_passes_the_sdk_bundle_verifier(server_url, worker_url, run_worker):
    import httpx
    from durable_workflow.history_bundle_verify import verify_bundle

    queue = unique("e2e-export")
    workflow_id = unique("exported")

    async def main():
        async with run_worker(worker_url, queue, workflows=[GreetingWorkflow], activities=[greet]) as worker:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(workflow_type="e2e.greeting", task_queue=queue, workflow_id=workflow_id, input=["Zoë ☕"])
                assert await wait_result(handle, timeout=30, workers=[worker]) == "Hello, Zoë ☕!"
        async with httpx.AsyncClient(base_url=server_url, headers={"X-Durable-Workflow-Control-Plane-Version": "2"}) as http:
            return (await http.get(f"/api/workflows/{workflow_id}/runs/{handle.run_id}/history/export")).json()

    bundle = run_async(main(), timeout=60)
    report = verify_bundle(bundle)
    errors = [f for f in report.get("findings", []) if f.get("severity") == "error"]
    assert not errors, errors
    assert report["integrity"]["checksum_matches"] is True, report["integrity"]
    assert bundle["workflow"]["status"] == "completed"
    assert [e["type"] for e in bundle["history_events"]][-1] == "WorkflowCompleted"
    # Tampering is detected.
    bundle["history_events"][0]["payload"]["workflow_type"] = "forged"
    assert verify_bundle(bundle)["integrity"]["checksum_matches"] is False


def test_parallel_groups_replay_with_contiguous_steps(server_url, worker_url, run_worker):
    queue = unique("e2e-fanout")
    workflow_id = unique("fanout")

    async def main():
        async with run_worker(worker_url, queue, workflows=[FanOutWorkflow], activities=[square]) as worker:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(workflow_type="e2e.fan-out", task_queue=queue, workflow_id=workflow_id, input=[2])
                result = await wait_result(handle, timeout=60, workers=[worker])
                events = await fetch_history(client, workflow_id, handle.run_id)
        return result, events

    result, events = run_async(main(), timeout=90)
    assert result == [4, 9, 16, 25]
    scheduled = [payload_of(e)["sequence"] for e in events_of(events, "ActivityScheduled")]
    assert scheduled == [1, 2, 3, 4], f"each activity scheduled once, steps contiguous: {scheduled}"
    assert [payload_of(e)["sequence"] for e in events_of(events, "TimerScheduled")] == [5]
    assert len(events_of(events, "ActivityCompleted")) == 4
    assert_history_invariants(events, terminal="WorkflowCompleted")


def test_activity_retries_then_succeeds(server_url, worker_url, run_worker):
    queue = unique("e2e-retry")
    workflow_id = unique("retry")
    key = unique("flaky")

    async def main():
        async with run_worker(worker_url, queue, workflows=[RetryingWorkflow], activities=[flaky]) as worker:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(
                    workflow_type="e2e.retrying", task_queue=queue, workflow_id=workflow_id, input=[key, 2, 3],
                )
                result = await wait_result(handle, timeout=40, workers=[worker])
                assert result == f"{key} ok after 3 attempts"
                assert (await handle.describe()).status == "completed"
                events = await fetch_history(client, workflow_id, handle.run_id)

        assert FLAKY_ATTEMPTS[key] == [1, 2, 3], f"attempt numbers seen by the activity: {FLAKY_ATTEMPTS[key]}"

        assert_history_invariants(events, terminal="WorkflowCompleted")
        (scheduled,) = events_of(events, "ActivityScheduled")
        execution_id = payload_of(scheduled).get("activity_execution_id")
        assert execution_id

        def for_execution(kind: str) -> list[dict]:
            return [e for e in events_of(events, kind) if payload_of(e).get("activity_execution_id") == execution_id]

        assert len(for_execution("ActivityCompleted")) == 1, type_sequence(events)
        assert len(for_execution("ActivityRetryScheduled")) == 2, type_sequence(events)
        assert for_execution("ActivityFailed") == [], "a retried failure must not be recorded as ActivityFailed"
        started_attempts = [payload_of(e).get("attempt_number") for e in for_execution("ActivityStarted")]
        assert started_attempts == [1, 2, 3], f"ActivityStarted attempt numbers: {started_attempts}"
        assert_in_order(events, [
            "ActivityScheduled", "ActivityRetryScheduled", "ActivityRetryScheduled", "ActivityCompleted",
            "WorkflowCompleted",
        ])

    run_async(main(), timeout=70)


def test_activity_retries_exhausted_fails_workflow(server_url, worker_url, run_worker):
    queue = unique("e2e-retry-exhausted")
    workflow_id = unique("retry-exhausted")
    key = unique("hopeless")

    async def main():
        async with run_worker(worker_url, queue, workflows=[RetryingWorkflow], activities=[flaky]) as worker:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(
                    workflow_type="e2e.retrying", task_queue=queue, workflow_id=workflow_id,
                    input=[key, 99, 2],
                )
                with pytest.raises(WorkflowFailed) as failure:
                    await wait_result(handle, timeout=40, workers=[worker])
                assert "transient failure #2" in str(failure.value), str(failure.value)
                assert failure.value.exception_class == "builtins.RuntimeError", failure.value.exception_class
                assert (await handle.describe()).status == "failed"
                events = await fetch_history(client, workflow_id, handle.run_id)

        assert FLAKY_ATTEMPTS[key] == [1, 2]
        assert_history_invariants(events, terminal="WorkflowFailed")
        counts = Counter(type_sequence(events))
        assert counts["ActivityRetryScheduled"] == 1, type_sequence(events)
        assert counts["ActivityFailed"] == 1, type_sequence(events)
        assert counts["ActivityCompleted"] == 0, type_sequence(events)
        (failed,) = events_of(events, "ActivityFailed")
        assert payload_of(failed).get("exception_type") == "RuntimeError"
        assert "transient failure #2" in str(payload_of(failed).get("message"))

    run_async(main(), timeout=70)


def test_cancel_waiting_workflow(server_url, worker_url, run_worker):
    queue = unique("e2e-cancel")
    workflow_id = unique("cancel-me")

    async def main():
        async with run_worker(worker_url, queue, workflows=[ApprovalWorkflow]):
            async with make_client(server_url) as client:
                handle = await client.start_workflow(
                    workflow_type="e2e.approval", task_queue=queue, workflow_id=workflow_id, input=["trip-7"],
                )
                await _wait_until_waiting(client, handle)

                await handle.cancel(reason="customer changed their mind")

                with pytest.raises(WorkflowCancelled) as cancelled:
                    await handle.result(timeout=20, poll_interval=0.2)
                assert "customer changed their mind" in str(cancelled.value)
                assert (await handle.describe()).status == "cancelled"

                # a closed run refuses further signals (409 run_not_active)
                with pytest.raises(SignalFailed):
                    await handle.signal("approve", ["too-late"])

                events = await fetch_history(client, workflow_id, handle.run_id)

        assert_history_invariants(events, terminal="WorkflowCancelled")
        assert_in_order(events, ["ConditionWaitOpened", "CancelRequested", "WorkflowCancelled"])
        assert payload_of(events[-1]).get("reason") == "customer changed their mind"
        assert not events_of(events, "SignalReceived"), "the refused signal must not reach history"

    run_async(main(), timeout=60)


@pytest.mark.parametrize("mode", ["return", "reraise"])
def test_cooperative_cancellation_runs_workflow_cleanup(server_url, worker_url, run_worker, mode):
    """`request_cancellation` leaves the run open; a worker that registered
    `cooperative_cancellation` delivers it at the pending timer, the workflow's shielded
    cleanup runs (a second timer), and however the code ends, the run ends cancelled with one
    request and one delivery in history. A second request returns the first."""
    queue = unique("e2e-coop")
    workflow_id = unique("coop")

    async def main():
        async with run_worker(worker_url, queue, workflows=[CooperativeCleanupWorkflow],
                              capabilities=["cooperative_cancellation"]):
            async with make_client(server_url) as client:
                handle = await client.start_workflow(
                    workflow_type="e2e.cooperative-cleanup", task_queue=queue, workflow_id=workflow_id, input=[mode],
                )
                await wait_for_history(client, workflow_id, handle.run_id,
                                       lambda evs: bool(events_of(evs, "TimerScheduled")), what="TimerScheduled")
                first = await handle.request_cancellation(reason="stop", cleanup_timeout_seconds=60)
                again = await handle.request_cancellation(reason="again", cleanup_timeout_seconds=120)
                with pytest.raises(WorkflowCancelled) as cancelled:
                    await handle.result(timeout=30, poll_interval=0.2)
                described = await handle.describe()
                events = await fetch_history(client, workflow_id, handle.run_id)
        return first, again, cancelled.value, described, events

    first, again, cancelled, described, events = run_async(main(), timeout=90)
    assert first["accepted"] is True and first["duplicate"] is False and first["run_status"] != "cancelled", first
    assert again["duplicate"] is True and again["cancellation_request"]["request_id"] == first["cancellation_request"]["request_id"]
    assert described.status == "cancelled"
    assert "Cooperative cancellation completed" in str(cancelled)
    assert_history_invariants(events, terminal="WorkflowCancelled")
    assert_in_order(events, ["TimerScheduled", "CooperativeCancellationRequested", "CooperativeCancellationDelivered",
                             "TimerScheduled", "TimerFired", "WorkflowCancelled"])
    request_id = first["cancellation_request"]["request_id"]
    (requested,) = events_of(events, "CooperativeCancellationRequested")
    (delivered,) = events_of(events, "CooperativeCancellationDelivered")
    assert payload_of(requested)["workflow_command_id"] == request_id and payload_of(requested)["reason"] == "stop"
    assert payload_of(delivered)["sequence"] == 1 and payload_of(delivered)["call_kind"] == "timer"
    assert [payload_of(e)["sequence"] for e in events_of(events, "TimerCancelled")] == [1]
    assert not events_of(events, "WorkflowCompleted", "WorkflowFailed")
    assert payload_of(events[-1])["cancellation_cleanup"]["outcome"] == "completed"


def test_cooperative_cancellation_interrupts_a_running_activity(server_url, worker_url, run_worker):
    """A cooperative Python worker runs activities in their own processes and checks their
    claim (`/activity-tasks/{id}/status`); a cancellation delivered at the running activity
    records `ActivityCancelled` for it, and the run ends cancelled without waiting for it."""
    queue = unique("e2e-coop-act")
    workflow_id = unique("coop-act")

    async def main():
        async with run_worker(worker_url, queue, workflows=[CooperativeActivityWorkflow],
                              activities=[greet, slow_activity], capabilities=["cooperative_cancellation"]) as worker:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(
                    workflow_type="e2e.cooperative-activity", task_queue=queue, workflow_id=workflow_id, input=[],
                )
                await wait_for_history(client, workflow_id, handle.run_id,
                                       lambda evs: len(events_of(evs, "ActivityStarted")) >= 2, what="slow activity started")
                started = time.monotonic()
                await handle.request_cancellation(reason="stop", cleanup_timeout_seconds=60)
                with pytest.raises(WorkflowCancelled):
                    await handle.result(timeout=15, poll_interval=0.2)
                elapsed = time.monotonic() - started
                events = await fetch_history(client, workflow_id, handle.run_id)
                # The stopped attempt's worker acknowledges the stop receipt its /status carried.
                slow = payload_of([e for e in events_of(events, "ActivityStarted") if payload_of(e)["sequence"] == 2][0])
                deadline = time.monotonic() + 20
                while True:
                    status = await worker.client.activity_task_status(
                        task_id=slow["task_id"], activity_attempt_id=slow["activity_attempt_id"], lease_owner=worker.name,
                    )
                    if status["cancellation_acknowledgement"]["callback_state"] == "stopped":
                        break
                    assert time.monotonic() < deadline, status
                    await asyncio.sleep(0.2)
        return elapsed, events, status

    elapsed, events, status = run_async(main(), timeout=90)
    assert (status["can_continue"], status["cancel_requested"], status["reason"]) == (False, True, "activity_cancelled")
    receipt = status["cancellation_acknowledgement"]
    (cancelled,) = events_of(events, "ActivityCancelled")
    assert receipt["cancellation_history_event_id"] == cancelled["id"], (receipt, cancelled)
    assert receipt["history_event_id"] and receipt["received_after_deadline"] is False, receipt
    assert elapsed < 15, "the run waited for the interrupted activity"
    assert_history_invariants(events, terminal="WorkflowCancelled")
    assert [payload_of(e)["sequence"] for e in events_of(events, "ActivityCompleted")] == [1]
    assert [payload_of(e)["sequence"] for e in events_of(events, "ActivityCancelled")] == [2]
    (delivered,) = events_of(events, "CooperativeCancellationDelivered")
    assert (payload_of(delivered)["sequence"], payload_of(delivered)["call_kind"]) == (2, "activity")


def test_a_cancellation_waits_for_the_stop_of_a_wait_cancellation_completed_activity(server_url, worker_url, run_worker):
    """An activity scheduled with `wait_cancellation_completed`: the first delivery at it is
    deferred (its attempt is cancelled, the workflow claim released); the activity's worker
    stops the callback and acknowledges; only then is the cancellation delivered to workflow
    code, which cleans up, and the run ends cancelled."""
    queue = unique("e2e-coop-wait")
    workflow_id = unique("coop-wait")

    async def main():
        async with run_worker(worker_url, queue, workflows=[CooperativeWaitingActivityWorkflow],
                              activities=[greet, slow_activity], capabilities=["cooperative_cancellation"]):
            async with make_client(server_url) as client:
                handle = await client.start_workflow(
                    workflow_type="e2e.cooperative-waiting-activity", task_queue=queue, workflow_id=workflow_id, input=[],
                )
                await wait_for_history(client, workflow_id, handle.run_id,
                                       lambda evs: len(events_of(evs, "ActivityStarted")) >= 2, what="slow activity started")
                await handle.request_cancellation(reason="stop", cleanup_timeout_seconds=60)
                with pytest.raises(WorkflowCancelled):
                    await handle.result(timeout=30, poll_interval=0.2)
                return await fetch_history(client, workflow_id, handle.run_id)

    events = run_async(main(), timeout=90)
    assert_history_invariants(events, terminal="WorkflowCancelled")
    kinds = [e["event_type"] for e in events]
    order = [k for k in kinds if k in ("ActivityCancelled", "ActivityCancellationAcknowledged",
                                       "CooperativeCancellationDelivered", "WorkflowCancelled")]
    assert order == ["ActivityCancelled", "ActivityCancellationAcknowledged",
                     "CooperativeCancellationDelivered", "WorkflowCancelled"], kinds
    (scheduled,) = [e for e in events_of(events, "ActivityScheduled") if payload_of(e)["sequence"] == 2]
    assert payload_of(scheduled)["cancellation_policy"] == "wait_cancellation_completed"


@pytest.mark.parametrize("policy", ["try_cancel", "wait_cancellation_completed"])
def test_a_cancellation_delivered_at_a_child_call_asks_the_child_to_cancel(server_url, worker_url, run_worker, policy):
    """A cancellation delivered at a child call whose policy is try_cancel or
    wait_cancellation_completed asks the child to cancel too (`ChildCancellationRequested`; the
    child runs its own cleanup and ends cancelled). With wait_cancellation_completed the
    parent's delivery waits for the child's end (`ChildRunCancelled` before the delivery)."""
    queue = unique("e2e-coop-child")
    workflow_id = unique("coop-parent")

    async def main():
        async with run_worker(worker_url, queue, workflows=[CancellingParentWorkflow, CancellableChildWorkflow],
                              capabilities=["cooperative_cancellation"]):
            async with make_client(server_url) as client:
                handle = await client.start_workflow(
                    workflow_type="e2e.cancelling-parent", task_queue=queue, workflow_id=workflow_id, input=[policy],
                )
                await wait_for_history(client, workflow_id, handle.run_id,
                                       lambda evs: len(events_of(evs, "ChildRunStarted")) >= 1, what="child started")
                await handle.request_cancellation(reason="stop", cleanup_timeout_seconds=60)
                with pytest.raises(WorkflowCancelled):
                    await handle.result(timeout=30, poll_interval=0.2)
                parent = await fetch_history(client, workflow_id, handle.run_id)
                (started,) = events_of(parent, "ChildRunStarted")
                child_id = payload_of(started)["child_workflow_instance_id"]
                child = client.get_workflow_handle(child_id)
                with pytest.raises(WorkflowCancelled):
                    await child.result(timeout=30, poll_interval=0.2)
                child_events = await fetch_history(client, child_id, payload_of(started)["child_workflow_run_id"])
                return parent, child_events

    parent, child = run_async(main(), timeout=90)
    assert_history_invariants(parent, terminal="WorkflowCancelled")
    assert_history_invariants(child, terminal="WorkflowCancelled")
    kinds = [e["event_type"] for e in parent]
    (asked,) = events_of(parent, "ChildCancellationRequested")
    assert payload_of(asked)["cancellation_policy"] == policy
    assert [e["event_type"] for e in child].count("CooperativeCancellationRequested") == 1
    delivered = kinds.index("CooperativeCancellationDelivered")
    if policy == "wait_cancellation_completed":
        assert kinds.index("ChildRunCancelled") < kinds.index("ChildCancellationResolved") < delivered, kinds
    else:
        assert kinds.index("ChildCancellationRequested") < delivered, kinds


def test_terminate_waiting_workflow(server_url, worker_url, run_worker):
    queue = unique("e2e-terminate")
    workflow_id = unique("terminate-me")

    async def main():
        async with run_worker(worker_url, queue, workflows=[ApprovalWorkflow]):
            async with make_client(server_url) as client:
                handle = await client.start_workflow(
                    workflow_type="e2e.approval", task_queue=queue, workflow_id=workflow_id, input=["trip-8"],
                )
                await _wait_until_waiting(client, handle)

                await handle.terminate(reason="operator cleanup")

                with pytest.raises(WorkflowTerminated) as terminated:
                    await handle.result(timeout=20, poll_interval=0.2)
                assert "operator cleanup" in str(terminated.value)
                assert (await handle.describe()).status == "terminated"
                events = await fetch_history(client, workflow_id, handle.run_id)

        assert_history_invariants(events, terminal="WorkflowTerminated")
        assert_in_order(events, ["ConditionWaitOpened", "TerminateRequested", "WorkflowTerminated"])
        assert payload_of(events[-1]).get("reason") == "operator cleanup"

    run_async(main(), timeout=60)


def test_duplicate_start_is_rejected(server_url, worker_url, run_worker):
    queue = unique("e2e-duplicate")
    workflow_id = unique("only-once")

    async def main():
        async with run_worker(worker_url, queue, workflows=[ApprovalWorkflow]) as worker:
            async with make_client(server_url) as client:
                first = await client.start_workflow(
                    workflow_type="e2e.approval", task_queue=queue, workflow_id=workflow_id, input=["first"],
                )

                # default policy ("fail") while the first run is open
                with pytest.raises(WorkflowAlreadyStarted):
                    await client.start_workflow(
                        workflow_type="e2e.approval", task_queue=queue, workflow_id=workflow_id, input=["second"],
                    )

                # "use-existing" hands back the open run, untouched
                existing = await client.start_workflow(
                    workflow_type="e2e.approval", task_queue=queue, workflow_id=workflow_id, input=["third"],
                    duplicate_policy="use-existing",
                )
                assert existing.workflow_id == workflow_id
                assert existing.run_id == first.run_id

                await _wait_until_waiting(client, first)
                await first.signal("approve", ["bob"])
                assert await wait_result(first, timeout=30, workers=[worker]) == "first approved by bob"

                # an id stays taken after its run closed, under both policies
                for policy in (None, "use-existing"):
                    with pytest.raises(WorkflowAlreadyStarted):
                        await client.start_workflow(
                            workflow_type="e2e.approval", task_queue=queue, workflow_id=workflow_id,
                            input=["fourth"], duplicate_policy=policy,
                        )

                runs = await first.list_runs()
                assert [run.run_id for run in runs.runs] == [first.run_id], "a rejected start must not add a run"

    run_async(main(), timeout=60)


def test_fifty_concurrent_workflows(server_url, worker_url, run_worker):
    queue = unique("e2e-fanout")
    prefix = unique("square")
    count = 50

    async def main():
        async with run_worker(
            worker_url, queue, workflows=[SquarerWorkflow], activities=[square],
            max_concurrent_workflow_tasks=20, max_concurrent_activity_tasks=20,
        ) as worker:
            async with make_client(server_url) as client:
                handles = await asyncio.gather(*(
                    client.start_workflow(
                        workflow_type="e2e.squarer", task_queue=queue, workflow_id=f"{prefix}-{n}", input=[n],
                    )
                    for n in range(count)
                ))
                assert len({h.run_id for h in handles}) == count
                results = await asyncio.gather(*(wait_result(h, timeout=90, workers=[worker]) for h in handles))
                assert results == [{"n": n, "square": n * n} for n in range(count)]

                statuses = await asyncio.gather(*(h.describe() for h in handles))
                assert {s.status for s in statuses} == {"completed"}

                histories = await asyncio.gather(*(fetch_history(client, h.workflow_id, h.run_id) for h in handles))
                for handle, events in zip(handles, histories):
                    summary = assert_history_invariants(events, terminal="WorkflowCompleted", context=handle.workflow_id)
                    assert summary["activities_scheduled"] == 1
                    assert [event_type(e) for e in events if event_type(e) in TERMINAL_EVENT_TYPES] == [
                        "WorkflowCompleted"
                    ]

    run_async(main(), timeout=120)
