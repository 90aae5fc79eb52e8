"""The DW platform conformance scenarios that can run here, without PHP.

Each test names the scenario it covers (``../shared/protocol/conformance-scenarios/``:
``signal-query``, ``workflow-update``, ``child-workflow`` and ``replay``) and asserts that
scenario's pass criteria against a real ``capstan serve`` with the published Python SDK
(``durable-workflow==2.12.0``) and plain HTTP. ``docs/conformance.md`` lists every scenario of
those four files: which pass here, which fail, and which cannot run here and why.

A scenario on which Capstan departs from the reference has a test marked
``xfail(strict=True, raises=ConformanceGap)``: it runs every time, fails only on the
``gap(...)`` check that names the departure (any other error is a real failure), and turns red
(XPASS) once the server is fixed, so the marker and the doc row can be updated together.

The replay scenarios run the SDK's own shard workflow
(``durable_workflow.replay_conformance.ReplayConformanceWorkflow``) live on Capstan, replay the
histories Capstan recorded with the SDK's replayer and verifier, and query the completed runs
through a fresh worker in a separate OS process. This file is that process's entry point too
(``python test_conformance.py replay-worker URL QUEUE WORKER_ID``).
"""
from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from durable_workflow import (
    Client,
    InvalidArgument,
    QueryFailed,
    ServerError,
    SignalFailed,
    UpdateFailed,
    UpdateRejected,
    Worker,
    WorkflowCancelled,
    activity,
    serializer,
    workflow,
)
from durable_workflow.errors import ChildWorkflowCancelled, ChildWorkflowFailed
from durable_workflow.history_bundle_verify import verify_bundle
# The SDK's own replay-conformance shard: its workflow and its golden fixtures (2.12.0).
from durable_workflow.replay_conformance import (
    ReplayConformanceDivergentWorkflow,
    ReplayConformanceWorkflow,
    _golden_case,
    _history,
)
from durable_workflow.replay_verify import verify_replay
from durable_workflow.workflow import query_state, replay

sys.path.insert(0, str(Path(__file__).resolve().parent))

from capstan_harness import (  # noqa: E402
    CONTROL_HEADERS,
    NAMESPACE,
    BackgroundWorker,
    assert_history_invariants,
    assert_in_order,
    decode_envelope,
    envelope,
    event_type,
    events_of,
    fetch_history,
    make_client,
    payload_of,
    run_async,
    type_sequence,
    unique,
    wait_for_history,
    wait_result,
)


class ConformanceGap(AssertionError):
    """Capstan departs from a scenario's pass criteria (see docs/conformance.md)."""


def gap(condition: bool, message: str) -> None:
    if not condition:
        raise ConformanceGap(message)


def assert_that(condition: bool, message: str) -> None:
    """An assertion phrased like `gap`, for scenarios that used to be known gaps."""
    assert condition, message


def known_gap(reason: str) -> pytest.MarkDecorator:
    return pytest.mark.xfail(strict=True, raises=ConformanceGap, reason=reason)


# ── workflows and activities ─────────────────────────────────────────────


@workflow.defn(name="conformance.signal-log")
class SignalLogWorkflow:
    """Appends every `append` signal to a log until `close`; `entries` answers from replayed state."""

    def __init__(self) -> None:
        self.entries: list[Any] = []
        self.closed = False

    @workflow.signal("append")
    def append(self, entry: Any) -> None:
        self.entries.append(entry)

    @workflow.signal("close")
    def close(self) -> None:
        self.closed = True

    @workflow.query("entries")
    def current_entries(self) -> list[Any]:
        return list(self.entries)

    def run(self, ctx):
        yield ctx.wait_condition(lambda: self.closed)
        return {"entries": self.entries, "count": len(self.entries)}


class ReplayGate:
    """Blocks the first pass through `replay_gate(key)` after `arm()` until `release` is set.

    Workflow code runs in a worker thread (the SDK replays in ``asyncio.to_thread``), so a
    blocked pass holds that workflow task mid-replay while the test keeps talking to the server.
    """

    def __init__(self) -> None:
        self.armed = False
        self.entered = threading.Event()
        self.release = threading.Event()
        self.lock = threading.Lock()

    def arm(self) -> None:
        with self.lock:
            self.armed = True

    def passthrough(self) -> None:
        with self.lock:
            hit, self.armed = self.armed, False
        if hit:
            self.entered.set()
            self.release.wait(30)


REPLAY_GATES: dict[str, ReplayGate] = {}


def replay_gate(key: str) -> None:
    gate = REPLAY_GATES.get(key)
    if gate is not None:
        gate.passthrough()


@activity.defn(name="conformance.greet")
def conformance_greet(name: str) -> str:
    return f"Hello, {name}!"


@workflow.defn(name="conformance.replay-probe")
class ReplayProbeWorkflow:
    """Greets, passes the replay gate, sleeps, then waits for one `note` signal."""

    def __init__(self) -> None:
        self.phase = "started"
        self.greeting: str | None = None
        self.notes: list[str] = []

    @workflow.signal("note")
    def note(self, text: str) -> None:
        self.notes.append(text)

    @workflow.query("state")
    def state(self) -> dict[str, Any]:
        return {"phase": self.phase, "greeting": self.greeting, "notes": list(self.notes)}

    def run(self, ctx, key):
        self.greeting = yield ctx.schedule_activity("conformance.greet", ["replay"])
        self.phase = "greeted"
        # Reached live when the activity result arrives, then again by every later replay while
        # the timer events are still ahead in the recorded history.
        replay_gate(key)
        yield ctx.sleep(2)
        self.phase = "waiting"
        yield ctx.wait_condition(lambda: len(self.notes) >= 1)
        self.phase = "done"
        return self.state()


@workflow.defn(name="conformance.gated-signal-log")
class GatedSignalLogWorkflow:
    """SignalLogWorkflow with the replay gate at the top of `run`, so a test can hold any of its
    workflow tasks leased (live or replaying) while signals arrive."""

    def __init__(self) -> None:
        self.entries: list[Any] = []
        self.closed = False

    @workflow.signal("append")
    def append(self, entry: Any) -> None:
        self.entries.append(entry)

    @workflow.signal("close")
    def close(self) -> None:
        self.closed = True

    def run(self, ctx, key):
        replay_gate(key)
        yield ctx.wait_condition(lambda: self.closed)
        return {"entries": self.entries, "count": len(self.entries)}


@workflow.defn(name="conformance.cart")
class CartWorkflow:
    """Collects items through updates until `checkout`."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.checked_out = False

    @workflow.update("add_item")
    def add_item(self, item: str) -> dict[str, Any]:
        if item == "forbidden":
            raise ValueError("forbidden items are not sold")
        self.items.append(item)
        return {"count": len(self.items), "items": list(self.items)}

    @workflow.update("echo")
    def echo(self, payload: Any) -> dict[str, Any]:
        return {"echo": payload, "items": len(self.items)}

    @workflow.signal("checkout")
    def checkout(self) -> None:
        self.checked_out = True

    @workflow.query("items")
    def current_items(self) -> list[str]:
        return list(self.items)

    def run(self, ctx):
        yield ctx.wait_condition(lambda: self.checked_out)
        return self.items


@workflow.defn(name="conformance.validated-cart")
class ValidatedUpdateWorkflow:
    """An update with a validator: pre-accept validation tasks decide before UpdateAccepted."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.checked_out = False

    @workflow.update("add_item")
    def add_item(self, item: str) -> int:
        self.items.append(item)
        return len(self.items)

    @add_item.validator  # type: ignore[attr-defined]
    def validate_add_item(self, item: str) -> None:
        if item == "forbidden":
            raise InvalidArgument("forbidden items are not sold", {"item": ["must not be forbidden"]})
        if item in self.items:  # the validator sees the replayed durable state
            raise ValueError(f"{item} already in cart")

    @workflow.signal("checkout")
    def checkout(self) -> None:
        self.checked_out = True

    @workflow.query("items")
    def current_items(self) -> list[str]:
        return list(self.items)

    def run(self, ctx):
        yield ctx.wait_condition(lambda: self.checked_out)
        return self.items


@workflow.defn(name="conformance.child")
class ChildWorkflow:
    """`upper` transforms its input, `fail` raises, `wait` waits for `release` first."""

    def __init__(self) -> None:
        self.released = False

    @workflow.signal("release")
    def release(self) -> None:
        self.released = True

    def run(self, ctx, mode, text):
        if mode == "fail":
            raise LookupError(f"no stock for {text}")
        if mode == "wait":
            yield ctx.wait_condition(lambda: self.released)
        return {"input": text, "value": text.upper()}


@workflow.defn(name="conformance.parent")
class ParentWorkflow:
    def run(self, ctx, mode, queue, text):
        if mode == "baseline":  # same task queue as the parent (none given)
            child = yield ctx.start_child_workflow("conformance.child", ["upper", text])
            return {"child": child, "aggregate": f"parent saw {child['value']}"}
        if mode == "fail":
            try:
                yield ctx.start_child_workflow("conformance.child", ["fail", text], task_queue=queue)
            except ChildWorkflowFailed as error:
                return {
                    "path": "child-failure-handler",
                    "type": type(error).__name__,
                    "message": str(error),
                    "exception_class": error.exception_class,
                }
            return {"path": "no-failure"}
        if mode in ("abandon", "request_cancel", "terminate"):
            child = yield ctx.start_child_workflow("conformance.child", ["wait", text], task_queue=queue, parent_close_policy=mode)
            return child
        if mode == "direct":
            try:
                child = yield ctx.start_child_workflow("conformance.child", ["wait", text], task_queue=queue)
            except ChildWorkflowCancelled as error:
                return {"path": "child-cancelled-handler", "type": type(error).__name__, "message": str(error)}
            return {"path": "child-completed", "child": child}
        if mode == "remote":  # child on another task queue, waited on across a parent worker restart
            child = yield ctx.start_child_workflow("conformance.child", ["wait", text], task_queue=queue)
            return {"child": child, "aggregate": f"{text}:{child['value']}"}
        if mode == "fan":
            children = yield [
                ctx.start_child_workflow("conformance.child", ["wait", f"{text}{i}"], task_queue=queue) for i in range(5)
            ]
            return [child["value"] for child in children]
        raise ValueError(f"unknown mode {mode!r}")


# What the SDK replay-conformance shard workflow (imported above) calls.
@activity.defn(name="python-replay.greet")
def replay_greet(name: str) -> str:
    return f"Hello, {name}!"


@activity.defn(name="python-replay.versioned-v3")
def replay_versioned_v3() -> str:
    return "v3_result"


@activity.defn(name="python-replay.reserve-inventory")
def replay_reserve_inventory(order_id: str) -> str:
    return "inventory-id-456"


@activity.defn(name="python-replay.release-inventory")
def replay_release_inventory(order_id: str, reservation_id: str, reason: str) -> str:
    return f"cancelled-{reservation_id}"


@workflow.defn(name="python-replay.charge-customer")
class ChargeCustomerWorkflow:
    def run(self, ctx, order_id, reservation_id):
        raise RuntimeError("payment declined")


REPLAY_WORKFLOWS = [ReplayConformanceWorkflow, ChargeCustomerWorkflow]
REPLAY_ACTIVITIES = [replay_greet, replay_versioned_v3, replay_reserve_inventory, replay_release_inventory]
# family (as in the SDK shard) -> the shard workflow's scenario argument
REPLAY_FAMILIES = {
    "activity": "single-activity",
    "signal-update": "signal-activity",
    "wait-condition": "wait-condition",
    "version-marker": "version-marker",
    "saga-compensation": "saga-compensation",
}


# ── helpers ──────────────────────────────────────────────────────────────


def control_http(base_url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=base_url, headers=CONTROL_HEADERS, timeout=30.0)


async def wait_for_open_waits(client: Client, handle: Any, count: int = 1) -> list[dict]:
    return await wait_for_history(
        client, handle.workflow_id, handle.run_id,
        lambda events: len(events_of(events, "ConditionWaitOpened")) >= count,
        what=f"{count} ConditionWaitOpened",
    )


async def sdk_query(handle: Any, name: str) -> Any:
    answer = await handle.query(name)
    assert answer["query_name"] == name and answer["workflow_id"] == handle.workflow_id, answer
    return answer["result"]


async def poll_query(handle: Any, name: str, done: Any, *, timeout: float = 20.0, each: Any = None) -> Any:
    """Query until ``done(value)``; ``each(value)`` checks every intermediate answer."""
    deadline = time.monotonic() + timeout
    while True:
        value = await sdk_query(handle, name)
        if each is not None:
            each(value)
        if done(value):
            return value
        assert time.monotonic() < deadline, f"query {name!r} kept answering {value!r}"
        await asyncio.sleep(0.1)


async def raw_query(http: httpx.AsyncClient, workflow_id: str, name: str, *, run_id: str | None = None, body: Any = None) -> httpx.Response:
    path = f"/api/workflows/{workflow_id}" + (f"/runs/{run_id}" if run_id else "") + f"/query/{name}"
    return await http.post(path, json={} if body is None else body)


def decoded_answer(resp: httpx.Response) -> Any:
    assert resp.status_code == 200, f"query -> {resp.status_code}: {resp.text[:500]}"
    body = resp.json()
    assert body["result_envelope"]["codec"] == "avro", body
    return decode_envelope(body["result_envelope"])


def assert_client_error(resp: httpx.Response, *reasons: str) -> dict:
    assert 400 <= resp.status_code < 500, f"expected a 4xx, got {resp.status_code}: {resp.text[:500]}"
    body = resp.json()
    assert body.get("reason") and body.get("message"), body
    if reasons:
        assert body["reason"] in reasons, body
    return body


def signal_arguments(event: dict) -> Any:
    return decode_envelope(payload_of(event)["arguments"])


async def settle(http: httpx.AsyncClient, workflow_id: str, *, timeout: float = 20.0) -> None:
    """Until the run has no ready or leased workflow task (every delivered receiver applied).

    Tests that are not about signals racing a leased workflow task send their completing signal
    only after this, so a failure points at the scenario they test; the race itself is
    test_signals_arriving_during_the_first_two_leases (docs/conformance.md, finding 1).
    """
    deadline = time.monotonic() + timeout
    while True:
        described = (await http.get(f"/api/workflows/{workflow_id}")).json()
        if not [t for t in described.get("open_tasks", []) if t["kind"] == "workflow"]:
            return
        assert time.monotonic() < deadline, f"workflow task still open: {described.get('open_tasks')}"
        await asyncio.sleep(0.05)


def assert_replays(workflow_cls: type, events: list[dict], start_input: list[Any], result: Any) -> None:
    """The recorded history replays with the published SDK to the recorded result."""
    commands = replay(workflow_cls, events, start_input).commands
    assert [type(c).__name__ for c in commands] == ["CompleteWorkflow"] and commands[0].result == result, commands


async def terminate_quietly(http: httpx.AsyncClient, workflow_id: str) -> None:
    try:
        await http.post(f"/api/workflows/{workflow_id}/terminate", json={"reason": "test cleanup"})
    except httpx.HTTPError:
        pass


# ── signal-query-runtime-scenarios ───────────────────────────────────────


def test_ordered_signal_delivery_from_two_clients(server_url, worker_url, run_worker):
    """signal-query: ordered_signal_delivery, python_worker_cli_and_sdk_baseline (SDK + raw HTTP
    clients instead of SDK + CLI). Six ordered signals, alternately from the SDK client and plain
    HTTP, the first ones before the first workflow task ran; every intermediate query answer is a
    prefix of the submitted order, the final one and the result are the order itself, and both
    clients identify the same run."""
    queue, workflow_id = unique("conf-order"), unique("ordered")
    submitted = [f"entry-{i}" for i in range(6)]

    async def main():
        async with run_worker(worker_url, queue, workflows=[SignalLogWorkflow]) as worker, \
                make_client(server_url) as client, control_http(server_url) as http:
            handle = await client.start_workflow(workflow_type="conformance.signal-log", task_queue=queue, workflow_id=workflow_id, input=[])

            def prefix(value):
                assert value == submitted[: len(value)], f"signals observed out of order: {value}"

            receipts = []
            for i, entry in enumerate(submitted):
                if i % 2 == 0:
                    receipts.append(await handle.signal("append", [entry]))
                else:
                    resp = await http.post(f"/api/workflows/{workflow_id}/signal/append", json={"input": envelope([entry]), "request_id": unique("raw-signal")})
                    assert resp.status_code == 202, resp.text
                    receipts.append(resp.json())
                if i == 2:
                    prefix(await sdk_query(handle, "entries"))
            assert {r["outcome"] for r in receipts} == {"signal_received"}, receipts
            assert {r["run_id"] for r in receipts} == {handle.run_id}, "both clients must name the same run"
            sequences = [r["command_sequence"] for r in receipts]
            assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences), sequences

            intermediate = await poll_query(handle, "entries", lambda v: len(v) == len(submitted), each=prefix)
            assert intermediate == submitted
            assert decoded_answer(await raw_query(http, workflow_id, "entries", run_id=handle.run_id)) == submitted

            await settle(http, workflow_id)
            await handle.signal("close")
            result = await wait_result(handle, timeout=30, workers=[worker])
            final_sdk = await sdk_query(handle, "entries")
            final_raw = decoded_answer(await raw_query(http, workflow_id, "entries"))
            events = await fetch_history(client, workflow_id, handle.run_id)
        return result, final_sdk, final_raw, events

    result, final_sdk, final_raw, events = run_async(main(), timeout=60)
    assert result == {"entries": submitted, "count": len(submitted)}
    assert final_sdk == final_raw == submitted
    appended = [signal_arguments(e) for e in events_of(events, "SignalReceived") if payload_of(e)["signal_name"] == "append"]
    assert appended == [[entry] for entry in submitted], appended
    assert_replays(SignalLogWorkflow, events, [], result)
    assert_history_invariants(events, terminal="WorkflowCompleted")


def test_signal_dedup_by_request_id(server_url, worker_url, run_worker):
    """signal-query: dedup_contract_observation. The same request_id + intent returns the
    original receipt (`retained: true`) from either client and records one transition; the same
    key with another intent is refused with `request_id_conflict`; queries never disagree."""
    queue, workflow_id, key = unique("conf-dedup"), unique("dedup"), unique("signal-key")

    async def main():
        async with run_worker(worker_url, queue, workflows=[SignalLogWorkflow]) as worker, \
                make_client(server_url) as client, control_http(server_url) as http:
            handle = await client.start_workflow(workflow_type="conformance.signal-log", task_queue=queue, workflow_id=workflow_id, input=[])
            await wait_for_open_waits(client, handle)  # (the lease race is its own test)
            first = await handle.signal("append", ["once"], request_id=key)
            assert first["outcome"] == "signal_received" and not first.get("retained"), first
            assert await poll_query(handle, "entries", lambda v: v == ["once"]) == ["once"]

            again = await handle.signal("append", ["once"], request_id=key)
            assert again["retained"] is True, again
            assert (again["signal_id"], again["command_id"], again["command_sequence"]) == (
                first["signal_id"], first["command_id"], first["command_sequence"],
            ), (first, again)
            assert await sdk_query(handle, "entries") == ["once"]

            # The same key and intent (same run target: the handle is run-pinned) from the other
            # client is the same command.
            raw = await http.post(f"/api/workflows/{workflow_id}/runs/{handle.run_id}/signal/append", json={"input": envelope(["once"]), "request_id": key})
            assert raw.status_code == 202 and raw.json()["retained"] is True, raw.text
            assert raw.json()["signal_id"] == first["signal_id"]

            with pytest.raises(SignalFailed) as conflict:
                await handle.signal("append", ["twice"], request_id=key)
            assert conflict.value.reason == "request_id_conflict" and conflict.value.status == 409, conflict.value.body
            assert conflict.value.body["retained_command_type"] == "signal", conflict.value.body
            assert await sdk_query(handle, "entries") == ["once"]

            await settle(http, workflow_id)
            await handle.signal("close")
            result = await wait_result(handle, timeout=30, workers=[worker])
            events = await fetch_history(client, workflow_id, handle.run_id)
        return result, events

    result, events = run_async(main(), timeout=60)
    assert result == {"entries": ["once"], "count": 1}
    appended = [e for e in events_of(events, "SignalReceived") if payload_of(e)["signal_name"] == "append"]
    assert len(appended) == 1 and signal_arguments(appended[0]) == ["once"], type_sequence(events)
    assert_replays(SignalLogWorkflow, events, [], result)
    assert_history_invariants(events, terminal="WorkflowCompleted")


def test_signal_and_query_while_the_worker_replays(server_url, worker_url, run_worker):
    """signal-query: signal_during_replay, query_during_replay. A workflow task that replays a
    non-empty history (activity and timer recorded) is held mid-replay; a query then answers
    the replay-safe snapshot of the committed history and writes nothing; a signal sent then is
    buffered (recorded while that task is leased) and delivered by the next task after it; the
    post-replay query equals the final live state."""
    queue, workflow_id = unique("conf-replaying"), unique("replaying")
    gate = REPLAY_GATES[workflow_id] = ReplayGate()

    async def main():
        async with run_worker(worker_url, queue, workflows=[ReplayProbeWorkflow], activities=[conformance_greet]) as worker, \
                make_client(server_url) as client:
            handle = await client.start_workflow(workflow_type="conformance.replay-probe", task_queue=queue, workflow_id=workflow_id, input=[workflow_id])
            await wait_for_history(client, workflow_id, handle.run_id, lambda evs: bool(events_of(evs, "TimerScheduled")), what="TimerScheduled")
            gate.arm()  # the next pass is the replay of the task the timer wakes
            try:
                entered = await asyncio.to_thread(gate.entered.wait, 20)
                assert entered, "no workflow task replayed past the gate"
                held = await fetch_history(client, workflow_id, handle.run_id)
                assert event_type(held[-1]) == "TimerFired", type_sequence(held)

                during = await sdk_query(handle, "state")
                after_query = await fetch_history(client, workflow_id, handle.run_id)
                receipt = await handle.signal("note", ["sent-during-replay"])
                assert receipt["outcome"] == "signal_received", receipt
            finally:
                gate.release.set()
            result = await wait_result(handle, timeout=30, workers=[worker])
            final_query = await sdk_query(handle, "state")
            events = await fetch_history(client, workflow_id, handle.run_id)
        return held, during, after_query, result, final_query, events

    try:
        held, during, after_query, result, final_query, events = run_async(main(), timeout=60)
    finally:
        REPLAY_GATES.pop(workflow_id, None)

    # The query answered from committed history and wrote nothing.
    assert during == {"phase": "waiting", "greeting": "Hello, replay!", "notes": []}, during
    assert len(after_query) == len(held), "a query must not write history"
    # Nothing was dropped; the live state after replay is the deterministic one.
    assert result == {"phase": "done", "greeting": "Hello, replay!", "notes": ["sent-during-replay"]}, result
    assert final_query == result
    # Buffered, then delivered by the task after the replaying one: the held task's wait opened
    # without it and the next task satisfied that wait with it. (Its SignalReceived sits before
    # the held task's ConditionWaitOpened if recorded on arrival, after it if recorded when the
    # lease ended; either way it follows the replayed TimerFired.)
    assert_in_order(events, ["TimerFired", "ConditionWaitOpened", "ConditionWaitSatisfied", "WorkflowCompleted"])
    assert_in_order(events, ["TimerFired", "SignalReceived", "ConditionWaitSatisfied"])
    assert len(events_of(events, "SignalReceived")) == 1 and len(events_of(events, "ConditionWaitOpened")) == 1, type_sequence(events)
    assert_replays(ReplayProbeWorkflow, events, [workflow_id], result)
    assert_history_invariants(events, terminal="WorkflowCompleted")


def test_signals_arriving_during_the_first_two_leases(server_url, worker_url, run_worker):
    """signal-query: signal_during_replay (several signals), ordered_signal_delivery (a burst
    that ends with the completing signal). `append a`, `append b` arrive while the run's first
    workflow task is leased (no wait is open yet), `close` while the task woken by them is
    leased. The run completes with both entries, and its history replays with the Python SDK.

    Regression test for docs/conformance.md finding 1: when `SignalReceived` was recorded on
    arrival, these landed before each leased task's `ConditionWaitOpened`; the Python 2.12.0
    replayer binds the first receiver after a wait to that wait, so `close` completed the
    workflow at wait 1 on replay and the recorded re-open was a NonDeterministicReplayError on
    every later task (the run never completed)."""
    queue, workflow_id = unique("conf-two-leases"), unique("two-leases")
    first = REPLAY_GATES[workflow_id] = ReplayGate()
    first.arm()

    async def main():
        async with run_worker(worker_url, queue, workflows=[GatedSignalLogWorkflow]), \
                make_client(server_url) as client, control_http(server_url) as http:
            handle = await client.start_workflow(workflow_type="conformance.gated-signal-log", task_queue=queue, workflow_id=workflow_id, input=[workflow_id])
            try:
                assert await asyncio.to_thread(first.entered.wait, 20), "the first workflow task never ran"
                await handle.signal("append", ["a"])
                await handle.signal("append", ["b"])
                second = REPLAY_GATES[workflow_id] = ReplayGate()
                second.arm()
                first.release.set()
                assert await asyncio.to_thread(second.entered.wait, 20), "no workflow task delivered the signals"
                await handle.signal("close")
                REPLAY_GATES.pop(workflow_id, None)
                second.release.set()
                deadline = time.monotonic() + 20
                while True:
                    described = (await http.get(f"/api/workflows/{workflow_id}")).json()
                    retried = [t for t in described["open_tasks"] if t["kind"] == "workflow" and t["fence"] > 1]
                    if described["status"] == "completed" or retried:
                        break
                    assert time.monotonic() < deadline, f"neither completed nor failed: {described}"
                    await asyncio.sleep(0.1)
                events = await fetch_history(client, workflow_id, handle.run_id)
                assert described["status"] == "completed", (
                    f"the run's workflow task fails on replay (re-offered with fence {retried and retried[0]['fence']}); "
                    f"history: {type_sequence(events)}"
                )
                result = await wait_result(handle, timeout=10)
                assert result == {"entries": ["a", "b"], "count": 2}
                assert_replays(GatedSignalLogWorkflow, events, [workflow_id], result)
                assert_history_invariants(events, terminal="WorkflowCompleted")
            finally:
                for gate in (first, REPLAY_GATES.get(workflow_id)):
                    if gate is not None:
                        gate.release.set()
                await terminate_quietly(http, workflow_id)

    try:
        run_async(main(), timeout=60)
    finally:
        REPLAY_GATES.pop(workflow_id, None)


def test_completed_run_signal_and_query(server_url, worker_url, run_worker):
    """signal-query: completed_run_signal_and_query. A cleanly completed run refuses signals
    with a stable 409 `run_not_active` and is not mutated; a fresh worker (the one that ran it is
    gone) answers the declared query with the final state through both the instance and the
    run-targeted query routes."""
    queue, workflow_id = unique("conf-completed"), unique("completed")

    async def main():
        async with make_client(server_url) as client, control_http(server_url) as http:
            first = await BackgroundWorker(worker_url, queue, workflows=[SignalLogWorkflow]).start()
            try:
                handle = await client.start_workflow(workflow_type="conformance.signal-log", task_queue=queue, workflow_id=workflow_id, input=[])
                for name, args in (("append", ["alpha"]), ("append", ["beta"]), ("close", [])):
                    await settle(http, workflow_id)
                    await handle.signal(name, args)
                result = await wait_result(handle, timeout=30, workers=[first])
            finally:
                await first.stop()
            closed = await fetch_history(client, workflow_id, handle.run_id)

            with pytest.raises(SignalFailed) as refused:
                await handle.signal("append", ["too-late"])
            assert refused.value.status == 409 and refused.value.reason == "run_not_active", refused.value.body
            raw = await http.post(f"/api/workflows/{workflow_id}/signal/append", json={"input": envelope(["too-late"])})
            body = assert_client_error(raw, "run_not_active")
            assert body["run_status"] == "completed" and body["control_plane"]["operation"] == "signal", body
            # No worker: a typed handler-unavailable error, not a terminal-state error.
            unavailable = assert_client_error(await raw_query(http, workflow_id, "entries"), "query_worker_unavailable")

            async with run_worker(worker_url, queue, workflows=[SignalLogWorkflow]):
                by_sdk = await sdk_query(handle, "entries")
                by_instance = decoded_answer(await raw_query(http, workflow_id, "entries"))
                by_run = decoded_answer(await raw_query(http, workflow_id, "entries", run_id=handle.run_id))
            described = (await http.get(f"/api/workflows/{workflow_id}")).json()
            after = await fetch_history(client, workflow_id, handle.run_id)
        return result, closed, unavailable, by_sdk, by_instance, by_run, described, after

    result, closed, unavailable, by_sdk, by_instance, by_run, described, after = run_async(main(), timeout=60)
    assert result == {"entries": ["alpha", "beta"], "count": 2}
    assert unavailable["control_plane"]["operation"] == "query", unavailable
    assert by_sdk == by_instance == by_run == ["alpha", "beta"]
    assert described["status"] == "completed" and described["closed_reason"] == "completed", described
    assert [e["hash"] for e in after] == [e["hash"] for e in closed], "terminal-run operations must not touch history"
    assert_replays(SignalLogWorkflow, after, [], result)
    assert_history_invariants(after, terminal="WorkflowCompleted")


def test_unknown_query_is_refused_and_known_handlers_still_answer(server_url, worker_url, run_worker):
    """signal-query: unknown_signal_and_query_errors (the query half). An unknown query is a
    stable 404 `rejected_unknown_query` naming the query (Python: `QueryFailed`), writes nothing,
    and the known handler answers afterwards."""
    queue, workflow_id = unique("conf-unknown-q"), unique("unknown-query")

    async def main():
        async with run_worker(worker_url, queue, workflows=[SignalLogWorkflow]) as worker, \
                make_client(server_url) as client, control_http(server_url) as http:
            handle = await client.start_workflow(workflow_type="conformance.signal-log", task_queue=queue, workflow_id=workflow_id, input=[])
            await handle.signal("append", ["a"])
            await settle(http, workflow_id)  # the signal has been applied by a workflow task
            before = await fetch_history(client, workflow_id, handle.run_id)
            with pytest.raises(QueryFailed) as refused:
                await handle.query("no-such-query")
            raw = await raw_query(http, workflow_id, "no-such-query")
            after = await fetch_history(client, workflow_id, handle.run_id)
            known = await sdk_query(handle, "entries")
            await settle(http, workflow_id)
            await handle.signal("close")
            result = await wait_result(handle, timeout=30, workers=[worker])
        return refused.value, raw, before, after, known, result

    refused, raw, before, after, known, result = run_async(main(), timeout=60)
    assert refused.reason == "rejected_unknown_query" and refused.status == 404, (refused.reason, refused.status)
    body = assert_client_error(raw, "rejected_unknown_query")
    assert raw.status_code == 404
    assert body["query_name"] == "no-such-query" and "no-such-query" in body["message"], body
    assert body["control_plane"]["operation"] == "query" and body["workflow_id"] == workflow_id, body
    assert len(after) == len(before)
    assert known == ["a"]
    assert result == {"entries": ["a"], "count": 1}


def test_unknown_signal_is_refused_when_the_worker_declared_its_signals(server_url, worker_url, run_worker):
    """signal-query: unknown_signal_and_query_errors (the signal half). The Python worker
    registers `workflow_command_contracts` declaring `append` and `close`; the reference answers
    a signal outside a non-empty declared list with `404 unknown_signal` (Python `SignalFailed`).
    Capstan refuses it the same way and records nothing."""
    queue, workflow_id = unique("conf-unknown-s"), unique("unknown-signal")

    async def main():
        async with run_worker(worker_url, queue, workflows=[SignalLogWorkflow]), \
                make_client(server_url) as client, control_http(server_url) as http:
            handle = await client.start_workflow(workflow_type="conformance.signal-log", task_queue=queue, workflow_id=workflow_id, input=[])
            try:
                await wait_for_open_waits(client, handle)
                try:
                    receipt = await handle.signal("no-such-signal", ["x"])
                except SignalFailed as error:
                    receipt = {"refused": error.reason, "status": error.status, "body": error.body}
                assert_that(
                    receipt.get("status") == 404 and receipt.get("refused") == "unknown_signal",
                    f"an undeclared signal was not refused with 404 unknown_signal: {receipt}",
                )
                events = await fetch_history(client, workflow_id, handle.run_id)
                assert not events_of(events, "SignalReceived"), type_sequence(events)
                assert await sdk_query(handle, "entries") == []
            finally:
                await terminate_quietly(http, workflow_id)

    run_async(main(), timeout=60)


MALFORMED_ENVELOPES = [
    ({"input": {"codec": "json", "blob": "W10="}}, "unsupported_payload_codec"),
    ({"input": 5}, "validation_failed"),
    ({"input": {"codec": "avro"}}, "validation_failed"),
    ({"input": {"codec": 7, "blob": "W10="}}, "validation_failed"),
]


def test_malformed_signal_and_query_envelopes_are_refused(server_url, worker_url, run_worker):
    """signal-query: malformed_signal_and_query_payloads (the envelope cases). A non-Avro codec, a
    non-envelope input, an envelope without a blob and a non-string codec are refused with a
    stable 422 on both the signal and the query route and are not recorded; a query whose Avro
    blob cannot be decoded is refused by the worker (4xx, never 5xx); valid signals and queries
    keep working afterwards."""
    queue, workflow_id = unique("conf-malformed"), unique("malformed")

    async def main():
        async with run_worker(worker_url, queue, workflows=[SignalLogWorkflow]) as worker, \
                make_client(server_url) as client, control_http(server_url) as http:
            handle = await client.start_workflow(workflow_type="conformance.signal-log", task_queue=queue, workflow_id=workflow_id, input=[])
            await handle.signal("append", ["before"])
            await settle(http, workflow_id)  # the signal has been applied by a workflow task
            before = await fetch_history(client, workflow_id, handle.run_id)
            refusals = []
            for body, reason in MALFORMED_ENVELOPES:
                sig = await http.post(f"/api/workflows/{workflow_id}/signal/append", json=body)
                refusals.append(("signal", body, assert_client_error(sig, reason), sig.status_code))
                qry = await raw_query(http, workflow_id, "entries", body=body)
                refusals.append(("query", body, assert_client_error(qry, reason), qry.status_code))
            for blob in ("!!!not-base64!!!", "AAAA"):  # not base64 / not an Avro single-object frame
                qry = await raw_query(http, workflow_id, "entries", body={"input": {"codec": "avro", "blob": blob}})
                refusals.append(("query", blob, assert_client_error(qry), qry.status_code))
            after = await fetch_history(client, workflow_id, handle.run_id)

            await handle.signal("append", ["after"])
            assert await poll_query(handle, "entries", lambda v: v == ["before", "after"]) == ["before", "after"]
            await settle(http, workflow_id)
            await handle.signal("close")
            result = await wait_result(handle, timeout=30, workers=[worker])
        return refusals, before, after, result

    refusals, before, after, result = run_async(main(), timeout=60)
    for surface, body, refusal, status in refusals:
        assert status in (409, 422), (surface, body, status, refusal)
        assert refusal["control_plane"]["operation"] == surface, refusal
    assert [e["hash"] for e in after] == [e["hash"] for e in before], "refused payloads must not reach history"
    assert result == {"entries": ["before", "after"], "count": 2}


def test_undecodable_avro_signal_payload_is_refused(server_url, worker_url, run_worker):
    """signal-query: malformed_signal_and_query_payloads (the blob case). A signal whose `avro`
    blob is not base64, or not an Avro single-object frame (`c3 01` + fingerprint), cannot be
    decoded by any handler: it is refused with a stable 4xx and not recorded, and the run keeps
    processing valid signals and queries.

    Regression test for docs/conformance.md finding 3: such a signal used to be accepted (202)
    and recorded, after which every replay of the run failed (`WorkflowPayloadDecodeError`)."""
    queue, workflow_id = unique("conf-bad-blob"), unique("bad-blob")

    async def main():
        async with run_worker(worker_url, queue, workflows=[SignalLogWorkflow]) as worker, \
                make_client(server_url) as client, control_http(server_url) as http:
            handle = await client.start_workflow(workflow_type="conformance.signal-log", task_queue=queue, workflow_id=workflow_id, input=[])
            try:
                await wait_for_open_waits(client, handle)
                for blob in ("!!!not-base64!!!", "AAAA"):
                    resp = await http.post(f"/api/workflows/{workflow_id}/signal/append", json={"input": {"codec": "avro", "blob": blob}})
                    body = assert_client_error(resp)
                    assert body["control_plane"]["operation"] == "signal", body
                events = await fetch_history(client, workflow_id, handle.run_id)
                assert not events_of(events, "SignalReceived"), type_sequence(events)
                await handle.signal("append", ["valid"])
                assert await poll_query(handle, "entries", lambda v: v == ["valid"]) == ["valid"]
                await handle.signal("close")
                assert await wait_result(handle, timeout=30, workers=[worker]) == {"entries": ["valid"], "count": 1}
            finally:
                await terminate_quietly(http, workflow_id)

    run_async(main(), timeout=60)


# ── workflow-update-runtime-scenarios ────────────────────────────────────


def test_update_wait_stages_accepted_waiting_completed(server_url, worker_url, run_worker):
    """workflow-update: accepted_update_control_plane_and_history,
    running_or_waiting_update_operator_visibility (API half), completed_update_result_round_trip.
    With no worker, `wait_for: accepted` returns a stable `accepted` status whose update id and
    name history records; `wait_for: completed` with a 1 s budget reports the same update still
    `accepted` with `wait_timed_out`; once a worker runs, the same request completes with the
    handler's typed result, and history's UpdateCompleted carries the same update id and blob."""
    queue, workflow_id, key = unique("conf-upd-stages"), unique("upd-stages"), unique("upd-key")

    async def main():
        async with make_client(server_url) as client:
            first = await BackgroundWorker(worker_url, queue, workflows=[CartWorkflow]).start()
            try:
                handle = await client.start_workflow(workflow_type="conformance.cart", task_queue=queue, workflow_id=workflow_id, input=[])
                await wait_for_open_waits(client, handle)
            finally:
                await first.stop()
            accepted = await handle.update("add_item", ["apple"], wait_for="accepted", request_id=key)
            at_accept = await fetch_history(client, workflow_id, handle.run_id)
            waiting = await handle.update("add_item", ["apple"], wait_for="completed", wait_timeout_seconds=1, request_id=key)
            async with run_worker(worker_url, queue, workflows=[CartWorkflow]) as worker:
                completed = await handle.update("add_item", ["apple"], wait_for="completed", request_id=key)
                await handle.signal("checkout")
                result = await wait_result(handle, timeout=30, workers=[worker])
            events = await fetch_history(client, workflow_id, handle.run_id)
        return handle, accepted, at_accept, waiting, completed, result, events

    handle, accepted, at_accept, waiting, completed, result, events = run_async(main(), timeout=60)
    update_id = accepted["update_id"]
    assert accepted["update_status"] == "accepted" and accepted["outcome"] == "update_accepted", accepted
    assert (accepted["workflow_id"], accepted["run_id"], accepted["update_name"]) == (workflow_id, handle.run_id, "add_item")
    assert accepted["control_plane"]["operation"] == "update" and accepted["request_id"] == key, accepted
    (recorded,) = events_of(at_accept, "UpdateAccepted")
    assert payload_of(recorded)["update_id"] == update_id and payload_of(recorded)["update_name"] == "add_item"
    assert not events_of(at_accept, "UpdateApplied", "UpdateCompleted"), type_sequence(at_accept)

    assert waiting["update_id"] == update_id and waiting["retained"] is True, waiting
    assert waiting["update_status"] == "accepted" and waiting["wait_timed_out"] is True, waiting

    assert completed["update_id"] == update_id and completed["update_status"] == "completed", completed
    assert completed["outcome"] == "update_completed", completed
    assert completed["result"] == {"count": 1, "items": ["apple"]}, completed
    assert completed["result_envelope"]["codec"] == "avro"
    assert decode_envelope(completed["result_envelope"]) == completed["result"]
    (applied,) = events_of(events, "UpdateApplied")
    (done,) = events_of(events, "UpdateCompleted")
    assert payload_of(applied)["update_id"] == payload_of(done)["update_id"] == update_id
    assert payload_of(done)["result"] == completed["result_envelope"]["blob"]
    assert len(events_of(events, "UpdateAccepted")) == 1
    assert result == ["apple"]
    assert_replays(CartWorkflow, events, [], result)
    assert_history_invariants(events, terminal="WorkflowCompleted")


def test_run_detail_shows_an_accepted_update(server_url, worker_url, run_worker):
    """workflow-update: accepted_update_control_plane_and_history ("run detail surfaces expose
    the accepted update"). With no worker, an update accepted with `wait_for: accepted` is named
    by the run detail (`GET /workflows/{id}/runs/{run}`), describe and the history export's
    `updates` list."""
    queue, workflow_id = unique("conf-upd-detail"), unique("upd-detail")

    async def main():
        async with make_client(server_url) as client, control_http(server_url) as http:
            first = await BackgroundWorker(worker_url, queue, workflows=[CartWorkflow]).start()
            try:
                handle = await client.start_workflow(workflow_type="conformance.cart", task_queue=queue, workflow_id=workflow_id, input=[])
                await wait_for_open_waits(client, handle)
            finally:
                await first.stop()
            try:
                accepted = await handle.update("add_item", ["apple"], wait_for="accepted")
                detail = (await http.get(f"/api/workflows/{workflow_id}/runs/{handle.run_id}")).json()
                described = (await http.get(f"/api/workflows/{workflow_id}")).json()
                export = (await http.get(f"/api/workflows/{workflow_id}/runs/{handle.run_id}/history/export")).json()
                update_id = accepted["update_id"]
                surfaces = {"run detail": json.dumps(detail), "describe": json.dumps(described), "export updates": json.dumps(export.get("updates"))}
                assert_that(
                    any(update_id in text for text in surfaces.values()),
                    f"accepted update {update_id} appears on no run-detail surface: run detail keys {sorted(detail)}, export updates {export.get('updates')}",
                )
            finally:
                await terminate_quietly(http, workflow_id)

    run_async(main(), timeout=60)


def test_failed_update_outcome(server_url, worker_url, run_worker):
    """workflow-update: failed_update_outcome. A handler that raises after acceptance gives a
    stable 422 `update_failed` (`update_status: failed`, `failure_message`; Python
    `UpdateFailed`); history ties the failure to the update id and name with the exception type
    and message and records no UpdateApplied; the workflow keeps accepting updates."""
    queue, workflow_id = unique("conf-upd-fail"), unique("upd-fail")

    async def main():
        async with run_worker(worker_url, queue, workflows=[CartWorkflow]) as worker, \
                make_client(server_url) as client, control_http(server_url) as http:
            handle = await client.start_workflow(workflow_type="conformance.cart", task_queue=queue, workflow_id=workflow_id, input=[])
            raw = await http.post(f"/api/workflows/{workflow_id}/update/add_item", json={"input": envelope(["forbidden"]), "wait_for": "completed"})
            with pytest.raises(UpdateFailed) as failed:
                await handle.update("add_item", ["forbidden"], wait_for="completed")
            healthy = await handle.update("add_item", ["pear"], wait_for="completed")
            await handle.signal("checkout")
            result = await wait_result(handle, timeout=30, workers=[worker])
            events = await fetch_history(client, workflow_id, handle.run_id)
        return raw, failed.value, healthy, result, events

    raw, failed, healthy, result, events = run_async(main(), timeout=60)
    body = assert_client_error(raw, "update_failed")
    assert raw.status_code == 422 and body["update_status"] == "failed", body
    assert "forbidden items are not sold" in body["failure_message"], body
    assert failed.reason == "update_failed" and "forbidden items are not sold" in str(failed), failed.body
    assert failed.update_id and failed.update_id != body["update_id"]
    failed_ids = {body["update_id"], failed.update_id}
    failures = [e for e in events_of(events, "UpdateCompleted") if payload_of(e)["update_id"] in failed_ids]
    assert len(failures) == 2, type_sequence(events)
    for event in failures:
        payload = payload_of(event)
        assert payload["update_name"] == "add_item" and payload["exception_type"] == "ValueError", payload
        assert "forbidden items are not sold" in payload["message"], payload
    assert not [e for e in events_of(events, "UpdateApplied") if payload_of(e)["update_id"] in failed_ids]
    assert healthy["result"] == {"count": 1, "items": ["pear"]}, healthy
    assert result == ["pear"]


def test_duplicate_update_request_idempotency(server_url, worker_url, run_worker):
    """workflow-update: duplicate_request_idempotency. The same request_id + intent returns the
    original outcome with `retained: true` (distinguishable from a transport retry) and runs the
    handler once; a different intent under that key is `request_id_conflict` (`UpdateFailed`
    with the retained command described)."""
    queue, workflow_id, key = unique("conf-upd-dup"), unique("upd-dup"), unique("upd-key")

    async def main():
        async with run_worker(worker_url, queue, workflows=[CartWorkflow]) as worker, make_client(server_url) as client:
            handle = await client.start_workflow(workflow_type="conformance.cart", task_queue=queue, workflow_id=workflow_id, input=[])
            first = await handle.update("add_item", ["apple"], wait_for="completed", request_id=key)
            again = await handle.update("add_item", ["apple"], wait_for="completed", request_id=key)
            with pytest.raises(UpdateFailed) as conflict:
                await handle.update("add_item", ["pear"], wait_for="completed", request_id=key)
            items = await sdk_query(handle, "items")
            await handle.signal("checkout")
            result = await wait_result(handle, timeout=30, workers=[worker])
            events = await fetch_history(client, workflow_id, handle.run_id)
        return first, again, conflict.value, items, result, events

    first, again, conflict, items, result, events = run_async(main(), timeout=60)
    assert first["retained"] is False and again["retained"] is True, (first, again)
    assert again["update_id"] == first["update_id"] and again["result"] == first["result"] == {"count": 1, "items": ["apple"]}
    assert conflict.reason == "request_id_conflict" and conflict.request_id == key, conflict.body
    assert conflict.status == 409 and conflict.details.get("retained_command_type") == "update", conflict.details
    assert items == ["apple"] and result == ["apple"]
    assert len(events_of(events, "UpdateAccepted")) == len(events_of(events, "UpdateApplied")) == 1, type_sequence(events)


def test_update_payload_envelope_round_trip(server_url, worker_url, run_worker):
    """workflow-update: payload_envelope_round_trip. A structured payload keeps its `avro`
    envelope byte for byte from the request into UpdateAccepted/UpdateApplied, and the structured
    result decodes with the public SDK serializer to the same value the SDK client returns."""
    queue, workflow_id = unique("conf-upd-payload"), unique("upd-payload")
    payload = {"nested": {"items": ["alpha", 3, True, None, 2.5]}, "codec": "avro", "text": "Zoë ☕", "big": 2**40}

    async def main():
        async with run_worker(worker_url, queue, workflows=[CartWorkflow]) as worker, \
                make_client(server_url) as client, control_http(server_url) as http:
            handle = await client.start_workflow(workflow_type="conformance.cart", task_queue=queue, workflow_id=workflow_id, input=[])
            request = envelope([payload])
            raw = await http.post(f"/api/workflows/{workflow_id}/update/echo", json={"input": request, "wait_for": "completed"})
            by_sdk = await handle.update("echo", [payload], wait_for="completed")
            await handle.signal("checkout")
            await wait_result(handle, timeout=30, workers=[worker])
            events = await fetch_history(client, workflow_id, handle.run_id)
        return request, raw, by_sdk, events

    request, raw, by_sdk, events = run_async(main(), timeout=60)
    assert raw.status_code == 200, raw.text
    body = raw.json()
    expected = {"echo": payload, "items": 0}
    assert body["result_envelope"]["codec"] == "avro" and serializer.decode_envelope(body["result_envelope"]) == expected
    assert by_sdk["result"] == expected
    raw_id = body["update_id"]
    for kind in ("UpdateAccepted", "UpdateApplied"):
        (event,) = [e for e in events_of(events, kind) if payload_of(e)["update_id"] == raw_id]
        assert payload_of(event)["arguments"] == request, (kind, payload_of(event)["arguments"], request)
    (done,) = [e for e in events_of(events, "UpdateCompleted") if payload_of(e)["update_id"] == raw_id]
    assert payload_of(done)["result"] == body["result_envelope"]["blob"] and payload_of(done)["payload_codec"] == "avro"


def test_invalid_update_input_is_refused(server_url, worker_url, run_worker):
    """workflow-update: invalid_input_refusal. A non-Avro codec and a non-envelope input are
    refused before acceptance (422, nothing recorded). An `avro` blob that is not a DW Value
    frame is refused the same way (422 `validation_failed`) by a server that checks frames, or
    else accepted and failed by the worker as a typed 422 `update_failed` naming the decode
    error; either way no handler is applied and the workflow stays healthy."""
    queue, workflow_id = unique("conf-upd-invalid"), unique("upd-invalid")

    async def main():
        async with run_worker(worker_url, queue, workflows=[CartWorkflow]) as worker, \
                make_client(server_url) as client, control_http(server_url) as http:
            handle = await client.start_workflow(workflow_type="conformance.cart", task_queue=queue, workflow_id=workflow_id, input=[])
            await wait_for_open_waits(client, handle)
            before = await fetch_history(client, workflow_id, handle.run_id)
            codec = await http.post(f"/api/workflows/{workflow_id}/update/add_item", json={"input": {"codec": "json", "blob": "WyJ4Il0="}})
            not_envelope = await http.post(f"/api/workflows/{workflow_id}/update/add_item", json={"input": ["x"]})
            after_refusals = await fetch_history(client, workflow_id, handle.run_id)
            undecodable = await http.post(f"/api/workflows/{workflow_id}/update/add_item", json={"input": {"codec": "avro", "blob": "!!!not-base64!!!"}, "wait_for": "completed"})
            healthy = await handle.update("add_item", ["plum"], wait_for="completed")
            items = await sdk_query(handle, "items")
            await handle.signal("checkout")
            result = await wait_result(handle, timeout=30, workers=[worker])
            events = await fetch_history(client, workflow_id, handle.run_id)
        return before, codec, not_envelope, after_refusals, undecodable, healthy, items, result, events

    before, codec, not_envelope, after_refusals, undecodable, healthy, items, result, events = run_async(main(), timeout=60)
    assert_client_error(codec, "unsupported_payload_codec")
    assert_client_error(not_envelope, "validation_failed")
    assert len(after_refusals) == len(before), "refused inputs must not be recorded"
    body = assert_client_error(undecodable, "validation_failed", "update_failed")
    assert undecodable.status_code == 422, body
    if body["reason"] == "update_failed":  # accepted, then failed by the worker's decoder
        assert body["update_status"] == "failed" and "decode" in body["failure_message"], body
    else:  # refused at the API: nothing recorded
        assert "input" in body["errors"], body
        assert len(events_of(events, "UpdateAccepted")) == 1, type_sequence(events)  # the healthy one
    assert len(events_of(events, "UpdateApplied")) == 1, type_sequence(events)
    assert healthy["result"] == {"count": 1, "items": ["plum"]} and items == ["plum"] and result == ["plum"]


def test_update_to_a_closed_run_is_refused(server_url, worker_url, run_worker):
    """workflow-update: terminal_workflow_update_behavior. An update to a completed run is a
    stable 409 `run_not_active` naming the run's status and closed reason (Python surfaces it as
    `ServerError`); nothing is recorded and no handler runs."""
    queue, workflow_id = unique("conf-upd-closed"), unique("upd-closed")

    async def main():
        async with run_worker(worker_url, queue, workflows=[CartWorkflow]) as worker, \
                make_client(server_url) as client, control_http(server_url) as http:
            handle = await client.start_workflow(workflow_type="conformance.cart", task_queue=queue, workflow_id=workflow_id, input=[])
            await handle.signal("checkout")
            assert await wait_result(handle, timeout=30, workers=[worker]) == []
            closed = await fetch_history(client, workflow_id, handle.run_id)
            with pytest.raises(ServerError) as refused:
                await handle.update("add_item", ["late"], wait_for="completed")
            raw = await http.post(f"/api/workflows/{workflow_id}/update/add_item", json={"input": envelope(["late"]), "wait_for": "accepted"})
            after = await fetch_history(client, workflow_id, handle.run_id)
        return refused.value, raw, closed, after

    refused, raw, closed, after = run_async(main(), timeout=60)
    assert refused.status == 409 and refused.body["reason"] == "run_not_active", refused.body
    body = assert_client_error(raw, "run_not_active")
    assert raw.status_code == 409
    assert body["run_status"] == "completed" and body["closed_reason"] == "completed", body
    assert body["control_plane"]["operation"] == "update", body
    assert [e["hash"] for e in after] == [e["hash"] for e in closed]
    assert not events_of(after, "UpdateAccepted", "UpdateApplied", "UpdateCompleted")


def test_unknown_update_fails_typed_and_invokes_no_handler(server_url, worker_url, run_worker):
    """workflow-update: unknown_update_refusal (typed error, no handler). An undeclared update
    name gives a typed error naming it (409 `update_rejected`, Python `UpdateRejected`), no
    handler runs (no UpdateApplied, state unchanged) and a known update works afterwards."""
    queue, workflow_id = unique("conf-upd-unknown"), unique("upd-unknown")

    async def main():
        async with run_worker(worker_url, queue, workflows=[CartWorkflow]) as worker, make_client(server_url) as client:
            handle = await client.start_workflow(workflow_type="conformance.cart", task_queue=queue, workflow_id=workflow_id, input=[])
            with pytest.raises(UpdateRejected) as failed:
                await handle.update("no_such_update", ["x"], wait_for="completed")
            items = await sdk_query(handle, "items")
            known = await handle.update("add_item", ["fig"], wait_for="completed")
            await handle.signal("checkout")
            result = await wait_result(handle, timeout=30, workers=[worker])
            events = await fetch_history(client, workflow_id, handle.run_id)
        return failed.value, items, known, result, events

    failed, items, known, result, events = run_async(main(), timeout=60)
    assert "no_such_update" in str(failed) and failed.body["update_name"] == "no_such_update", failed.body
    assert items == []
    assert not [e for e in events_of(events, "UpdateApplied") if payload_of(e)["update_name"] == "no_such_update"]
    assert known["result"] == {"count": 1, "items": ["fig"]} and result == ["fig"]


def test_unknown_update_is_rejected_before_acceptance(server_url, worker_url, run_worker):
    """workflow-update: unknown_update_refusal (the refusal). The worker declared its updates
    (`workflow_command_contracts.updates = [add_item, echo]`); the reference validates the name
    before recording anything: `409 update_rejected` (Python `UpdateRejected`), no
    UpdateAccepted."""
    queue, workflow_id = unique("conf-upd-rejected"), unique("upd-rejected")

    async def main():
        async with run_worker(worker_url, queue, workflows=[CartWorkflow]), \
                make_client(server_url) as client, control_http(server_url) as http:
            handle = await client.start_workflow(workflow_type="conformance.cart", task_queue=queue, workflow_id=workflow_id, input=[])
            try:
                outcome: Any
                try:
                    outcome = await handle.update("no_such_update", ["x"], wait_for="completed")
                except UpdateRejected as error:
                    outcome = error
                except UpdateFailed as error:
                    outcome = f"UpdateFailed({error.reason}): {error}"
                events = await fetch_history(client, workflow_id, handle.run_id)
                accepted = [e for e in events_of(events, "UpdateAccepted") if payload_of(e)["update_name"] == "no_such_update"]
                assert_that(isinstance(outcome, UpdateRejected) and not accepted, f"undeclared update not rejected: {outcome}; history {type_sequence(events)}")
            finally:
                await terminate_quietly(http, workflow_id)

    run_async(main(), timeout=60)


def test_declared_update_contracts_are_visible(server_url, worker_url, run_worker):
    """workflow-update: declared_update_contract_visibility. The reference lets WorkflowStarted
    carry `declared_updates` / `declared_update_contracts` (20-history-and-commands.md); the
    Python worker registered them (`workflow_command_contracts`) before the start, and Capstan
    records them on WorkflowStarted and shows them on describe."""
    queue, workflow_id = unique("conf-upd-declared"), unique("upd-declared")

    async def main():
        async with run_worker(worker_url, queue, workflows=[CartWorkflow]), \
                make_client(server_url) as client, control_http(server_url) as http:
            handle = await client.start_workflow(workflow_type="conformance.cart", task_queue=queue, workflow_id=workflow_id, input=[])
            try:
                events = await wait_for_open_waits(client, handle)
                started = payload_of(events_of(events, "WorkflowStarted")[0])
                described = (await http.get(f"/api/workflows/{workflow_id}")).json()
                assert started.get("declared_updates") == ["add_item", "echo"], sorted(started)
                assert described.get("declared_updates") == ["add_item", "echo"], sorted(described)
                assert await handle.update("add_item", ["kiwi"], wait_for="completed")
            finally:
                await terminate_quietly(http, workflow_id)

    run_async(main(), timeout=60)


def test_python_update_validators_run_before_acceptance(server_url, worker_url, run_worker):
    """workflow-update: python_client_worker_update_surface (the validator cells). Capstan
    advertises `update_validation_tasks`; the published Python worker registers a workflow with
    an update validator and takes validation tasks from its workflow poll. A valid update is
    accepted and applied; an invalid one is refused with 422 `update_validator_rejected`
    (`UpdateRejected`, with the validator's `validation_errors`) and only `UpdateRejected` is
    recorded; the same request id gets the same verdict without a second event; a rejection
    that depends on state proves the validator saw the replayed history."""
    queue, workflow_id = unique("conf-upd-validator"), unique("upd-validator")

    async def main():
        async with control_http(server_url) as http:
            info = (await http.get("/api/cluster/info")).json()
        async with run_worker(worker_url, queue, workflows=[ValidatedUpdateWorkflow]) as worker, \
                make_client(server_url) as client:
            handle = await client.start_workflow(workflow_type="conformance.validated-cart", task_queue=queue, workflow_id=workflow_id, input=[])
            await wait_for_open_waits(client, handle)
            applied = await handle.update("add_item", ["apple"], wait_for="completed")
            with pytest.raises(UpdateRejected) as invalid:
                await handle.update("add_item", ["forbidden"], request_id="validator-rej-1")
            with pytest.raises(UpdateRejected) as again:
                await handle.update("add_item", ["forbidden"], request_id="validator-rej-1")
            with pytest.raises(UpdateRejected) as duplicate:
                await handle.update("add_item", ["apple"])
            items = await sdk_query(handle, "items")
            await handle.signal("checkout")
            result = await wait_result(handle, timeout=30, workers=[worker])
            events = await fetch_history(client, workflow_id, handle.run_id)
        return info, applied, invalid.value, again.value, duplicate.value, items, result, events

    info, applied, invalid, again, duplicate, items, result, events = run_async(main(), timeout=90)
    assert info["worker_protocol"]["server_capabilities"]["update_validation_tasks"] is True
    assert applied["update_status"] == "completed" and applied["result"] == 1, applied
    assert invalid.validation_errors == {"item": ["must not be forbidden"]}, invalid.body
    assert invalid.body["reason"] == "update_validator_rejected" and invalid.body["update_status"] == "rejected", invalid.body
    assert again.body["update_id"] == invalid.body["update_id"] and again.body.get("retained") is True, again.body
    assert duplicate.validation_errors is None and "apple already in cart" in str(duplicate), duplicate.body
    assert items == ["apple"] and result == ["apple"]
    assert len(events_of(events, "UpdateAccepted")) == 1, type_sequence(events)
    assert len(events_of(events, "UpdateApplied")) == 1 and len(events_of(events, "UpdateCompleted")) == 1
    rejected = events_of(events, "UpdateRejected")
    assert [payload_of(e)["update_id"] for e in rejected] == [invalid.body["update_id"], duplicate.body["update_id"]], rejected
    assert payload_of(rejected[0])["validation_errors"] == {"item": ["must not be forbidden"]}


# ── child-workflow-runtime-scenarios ─────────────────────────────────────


async def child_of(client: Client, handle: Any, index: int = 0) -> tuple[str, str]:
    events = await wait_for_history(
        client, handle.workflow_id, handle.run_id,
        lambda evs: len(events_of(evs, "ChildRunStarted")) > index, what="ChildRunStarted",
    )
    started = payload_of(events_of(events, "ChildRunStarted")[index])
    return started["child_workflow_instance_id"], started["child_workflow_run_id"]


async def child_waiting(client: Client, child_id: str, child_run_id: str) -> None:
    await wait_for_history(client, child_id, child_run_id, lambda evs: bool(events_of(evs, "ConditionWaitOpened")), what="child wait")


def test_python_parent_python_child_baseline(server_url, worker_url, run_worker):
    """child-workflow: python_parent_python_child_baseline, child_workflow_namespace_contract
    (same-namespace half). The parent starts a child by workflow type with a string input on the
    shared task queue; the child run carries the parent's child_call_id and links; the parent
    returns the typed child result and its aggregate; the child stays in the parent's namespace
    and task queue."""
    queue, workflow_id = unique("conf-child"), unique("child-parent")

    async def main():
        async with run_worker(worker_url, queue, workflows=[ParentWorkflow, ChildWorkflow]) as worker, \
                make_client(server_url) as client, control_http(server_url) as http:
            handle = await client.start_workflow(workflow_type="conformance.parent", task_queue=queue, workflow_id=workflow_id, input=["baseline", None, "capstan"])
            result = await wait_result(handle, timeout=30, workers=[worker])
            parent_events = await fetch_history(client, workflow_id, handle.run_id)
            child_id = payload_of(events_of(parent_events, "ChildRunStarted")[0])["child_workflow_instance_id"]
            child = (await http.get(f"/api/workflows/{child_id}")).json()
            child_events = await fetch_history(client, child_id, child["run_id"])
        return handle, result, parent_events, child, child_events

    handle, result, parent_events, child, child_events = run_async(main(), timeout=60)
    assert result == {"child": {"input": "capstan", "value": "CAPSTAN"}, "aggregate": "parent saw CAPSTAN"}, result
    (scheduled,) = events_of(parent_events, "ChildWorkflowScheduled")
    (started,) = events_of(parent_events, "ChildRunStarted")
    (completed,) = events_of(parent_events, "ChildRunCompleted")
    call_id = payload_of(scheduled)["child_call_id"]
    assert call_id and payload_of(started)["child_call_id"] == call_id
    assert payload_of(scheduled)["child_workflow_type"] == "conformance.child"
    assert payload_of(completed)["sequence"] == payload_of(scheduled)["sequence"]
    assert payload_of(completed)["child_workflow_run_id"] == child["run_id"] == payload_of(scheduled)["child_workflow_run_id"]
    child_started_event = events_of(child_events, "WorkflowStarted")[0]
    child_started = payload_of(child_started_event)
    # The child's start carries the parent's call id as its command id (Capstan does not copy the
    # optional `child_call_id` / `workflow_link_id` fields onto the child's WorkflowStarted).
    link = child_started.get("child_call_id") or child_started.get("workflow_command_id") or child_started_event.get("workflow_command_id")
    assert link == call_id, child_started_event
    assert child_started["parent_sequence"] == payload_of(scheduled)["sequence"], child_started
    assert (child_started["parent_workflow_instance_id"], child_started["parent_workflow_run_id"]) == (workflow_id, handle.run_id)
    assert decode_envelope(child_started["input_envelope"]) == ["upper", "capstan"]
    assert (child["parent_workflow_id"], child["parent_run_id"]) == (workflow_id, handle.run_id), child
    assert child["namespace"] == NAMESPACE and child["task_queue"] == queue, child
    assert_history_invariants(parent_events, terminal="WorkflowCompleted")
    assert_history_invariants(child_events, terminal="WorkflowCompleted")


def test_child_failure_reaches_the_parent_typed(server_url, worker_url, run_worker):
    """child-workflow: child_failure_round_trip_matrix (the Python-to-Python cell). A failing
    child reaches the parent as `ChildWorkflowFailed` (not a timeout), with the original
    exception class and message, and the parent takes its failure-handling path."""
    queue, child_queue, workflow_id = unique("conf-child-fail"), unique("conf-child-fail-c"), unique("child-fail")

    async def main():
        async with run_worker(worker_url, queue, workflows=[ParentWorkflow]) as worker, \
                run_worker(worker_url, child_queue, workflows=[ChildWorkflow]), \
                make_client(server_url) as client, control_http(server_url) as http:
            handle = await client.start_workflow(workflow_type="conformance.parent", task_queue=queue, workflow_id=workflow_id, input=["fail", child_queue, "widget"])
            result = await wait_result(handle, timeout=30, workers=[worker])
            events = await fetch_history(client, workflow_id, handle.run_id)
            child_id = payload_of(events_of(events, "ChildRunStarted")[0])["child_workflow_instance_id"]
            child = (await http.get(f"/api/workflows/{child_id}")).json()
            child_events = await fetch_history(client, child_id, child["run_id"])
        return result, events, child, child_events

    result, events, child, child_events = run_async(main(), timeout=60)
    assert result == {
        "path": "child-failure-handler", "type": "ChildWorkflowFailed",
        "message": "no stock for widget", "exception_class": "builtins.LookupError",
    }, result
    (failed,) = events_of(events, "ChildRunFailed")
    assert payload_of(failed)["exception_type"] == "LookupError" and payload_of(failed)["message"] == "no stock for widget"
    assert child["status"] == "failed", child
    assert event_type(child_events[-1]) == "WorkflowFailed"


def test_parent_close_policies_request_cancel_and_abandon(server_url, worker_url, run_worker):
    """child-workflow: parent_cancellation_propagates_to_child (what passes). Cancelling a parent
    cancels its `request_cancel` child at once (same commit: no propagation delay), the child's
    history names the parent-close policy, its result is the typed `WorkflowCancelled` and its
    code never runs again; an `abandon` child keeps running and completes on its own.
    (`terminate` is test_sdk_e2e.py::test_parent_close_policy_terminates_the_child.)"""
    queue, child_queue = unique("conf-pcp"), unique("conf-pcp-c")

    async def main():
        async with run_worker(worker_url, queue, workflows=[ParentWorkflow]), \
                run_worker(worker_url, child_queue, workflows=[ChildWorkflow]) as child_worker, \
                make_client(server_url) as client, control_http(server_url) as http:
            parents = {
                mode: await client.start_workflow(workflow_type="conformance.parent", task_queue=queue, workflow_id=unique(f"pcp-{mode}"), input=[mode, child_queue, mode])
                for mode in ("request_cancel", "abandon")
            }
            children = {mode: await child_of(client, handle) for mode, handle in parents.items()}
            for child_id, child_run in children.values():
                await child_waiting(client, child_id, child_run)
            for handle in parents.values():
                await handle.cancel(reason="parent cancelled")
            cancelled_id, cancelled_run = children["request_cancel"]
            cancelled = (await http.get(f"/api/workflows/{cancelled_id}")).json()
            cancelled_events = await fetch_history(client, cancelled_id, cancelled_run)
            with pytest.raises(WorkflowCancelled):
                await client.get_workflow_handle(cancelled_id, run_id=cancelled_run).result(timeout=10, poll_interval=0.1)

            abandoned_id, abandoned_run = children["abandon"]
            still_running = (await http.get(f"/api/workflows/{abandoned_id}")).json()
            abandoned = client.get_workflow_handle(abandoned_id, run_id=abandoned_run)
            await abandoned.signal("release")
            abandoned_result = await wait_result(abandoned, timeout=30, workers=[child_worker])
            parent_states = {mode: (await handle.describe()).status for mode, handle in parents.items()}
        return cancelled, cancelled_events, still_running, abandoned_result, parent_states

    cancelled, cancelled_events, still_running, abandoned_result, parent_states = run_async(main(), timeout=60)
    assert parent_states == {"request_cancel": "cancelled", "abandon": "cancelled"}, parent_states
    assert cancelled["status"] == "cancelled" and cancelled["closed_reason"] == "cancelled", cancelled
    assert cancelled["open_tasks"] == [], cancelled
    assert type_sequence(cancelled_events)[-2:] == ["CancelRequested", "WorkflowCancelled"], type_sequence(cancelled_events)
    assert "parent-close policy" in payload_of(cancelled_events[-1])["reason"], payload_of(cancelled_events[-1])
    assert still_running["status"] in ("running", "waiting", "pending"), still_running
    assert abandoned_result == {"input": "abandon", "value": "ABANDON"}


def test_parent_history_records_the_applied_parent_close_policy(server_url, worker_url, run_worker):
    """child-workflow: parent_cancellation_propagates_to_child ("parent and child histories
    record the cancellation relationship"). The reference (30-p1-features.md §3) records
    `ParentClosePolicyApplied` (or `…Failed`) for each child a closing parent terminates or
    cancels; Capstan records it before the parent's terminal event."""
    queue, child_queue = unique("conf-pcp-applied"), unique("conf-pcp-applied-c")

    async def main():
        async with run_worker(worker_url, queue, workflows=[ParentWorkflow]), \
                run_worker(worker_url, child_queue, workflows=[ChildWorkflow]), \
                make_client(server_url) as client:
            handle = await client.start_workflow(workflow_type="conformance.parent", task_queue=queue, workflow_id=unique("pcp-applied"), input=["request_cancel", child_queue, "x"])
            child_id, _ = await child_of(client, handle)
            await handle.cancel(reason="parent cancelled")
            events = await fetch_history(client, handle.workflow_id, handle.run_id)
        applied = [e for e in events if event_type(e) in ("ParentClosePolicyApplied", "ParentClosePolicyFailed")]
        assert type_sequence(events)[-1] == "WorkflowCancelled", type_sequence(events)
        assert [payload_of(e)["policy"] for e in applied] == ["request_cancel"], applied
        # The published replayer takes the parent's history, the new event included.
        replay(ParentWorkflow, events, ["request_cancel", child_queue, "x"])
        assert_that(
            any(payload_of(e).get("child_instance_id") == child_id for e in applied),
            f"parent history has no ParentClosePolicyApplied for {child_id}: {type_sequence(events)}",
        )

    run_async(main(), timeout=60)


def test_direct_child_cancellation_is_observed_by_the_parent(server_url, worker_url, run_worker):
    """child-workflow: direct_child_cancellation_observed_by_parent. Cancelling the child run
    through the control plane closes it `cancelled`; the parent observes a typed
    `ChildWorkflowCancelled` (not a timeout) and its history resolves that child's step with
    ChildRunCancelled (same step sequence and child run as the call)."""
    queue, child_queue, workflow_id = unique("conf-direct"), unique("conf-direct-c"), unique("direct")

    async def main():
        async with run_worker(worker_url, queue, workflows=[ParentWorkflow]) as worker, \
                run_worker(worker_url, child_queue, workflows=[ChildWorkflow]), \
                make_client(server_url) as client, control_http(server_url) as http:
            handle = await client.start_workflow(workflow_type="conformance.parent", task_queue=queue, workflow_id=workflow_id, input=["direct", child_queue, "x"])
            child_id, child_run = await child_of(client, handle)
            await child_waiting(client, child_id, child_run)
            await client.get_workflow_handle(child_id).cancel(reason="operator stopped the child")
            result = await wait_result(handle, timeout=30, workers=[worker])
            child = (await http.get(f"/api/workflows/{child_id}")).json()
            events = await fetch_history(client, workflow_id, handle.run_id)
        return result, child, child_run, events

    result, child, child_run, events = run_async(main(), timeout=60)
    assert result == {"path": "child-cancelled-handler", "type": "ChildWorkflowCancelled", "message": "child workflow was cancelled"}, result
    assert child["status"] == "cancelled", child
    (scheduled,) = events_of(events, "ChildWorkflowScheduled")
    (resolved,) = events_of(events, "ChildRunCancelled")
    assert payload_of(resolved)["sequence"] == payload_of(scheduled)["sequence"]
    assert payload_of(resolved)["child_workflow_run_id"] == child_run == payload_of(scheduled)["child_workflow_run_id"]
    assert_in_order(events, ["ChildRunStarted", "ChildRunCancelled", "WorkflowCompleted"])


def test_worker_restart_replay_preserves_child_outcome(server_url, worker_url, run_worker):
    """child-workflow: worker_restart_replay_preserves_child_outcome (children on another task
    queue). The parent worker stops while its child runs on another queue; the child completes;
    a fresh parent worker replays, takes the recorded child outcome, schedules no second child
    and returns a result byte-for-byte equal to a run without the restart."""
    queue, child_queue = unique("conf-restart-p"), unique("conf-restart-c")

    async def run_parent(client: Client, workflow_id: str) -> Any:
        handle = await client.start_workflow(workflow_type="conformance.parent", task_queue=queue, workflow_id=workflow_id, input=["remote", child_queue, "alpha"])
        child_id, child_run = await child_of(client, handle)
        await child_waiting(client, child_id, child_run)
        return handle, client.get_workflow_handle(child_id, run_id=child_run)

    async def main():
        async with run_worker(worker_url, child_queue, workflows=[ChildWorkflow]), \
                make_client(server_url) as client, control_http(server_url) as http:
            first = await BackgroundWorker(worker_url, queue, workflows=[ParentWorkflow]).start()
            try:
                restarted, restarted_child = await run_parent(client, unique("restart"))
            finally:
                await first.stop()
            await restarted_child.signal("release")
            await wait_for_history(client, restarted.workflow_id, restarted.run_id, lambda evs: bool(events_of(evs, "ChildRunCompleted")), what="ChildRunCompleted")
            waiting_status = (await restarted.describe()).status
            async with run_worker(worker_url, queue, workflows=[ParentWorkflow]) as fresh:
                restarted_result = await wait_result(restarted, timeout=30, workers=[fresh])
                plain, plain_child = await run_parent(client, unique("no-restart"))
                await plain_child.signal("release")
                plain_result = await wait_result(plain, timeout=30, workers=[fresh])
            outputs = [(await http.get(f"/api/workflows/{h.workflow_id}")).json()["output_envelope"] for h in (restarted, plain)]
            child_queue_seen = (await http.get(f"/api/workflows/{restarted_child.workflow_id}")).json()["task_queue"]
            histories = [await fetch_history(client, h.workflow_id, h.run_id) for h in (restarted, plain)]
        return waiting_status, restarted_result, plain_result, outputs, child_queue_seen, histories

    waiting_status, restarted_result, plain_result, outputs, child_queue_seen, histories = run_async(main(), timeout=90)
    assert waiting_status not in ("completed", "failed"), "the parent cannot finish without a worker"
    assert restarted_result == plain_result == {"child": {"input": "alpha", "value": "ALPHA"}, "aggregate": "alpha:ALPHA"}
    assert outputs[0] == outputs[1], outputs
    assert child_queue_seen == child_queue
    restarted_events, plain_events = histories
    assert len(events_of(restarted_events, "ChildWorkflowScheduled")) == 1, type_sequence(restarted_events)
    assert type_sequence(restarted_events) == type_sequence(plain_events)
    assert_history_invariants(restarted_events, terminal="WorkflowCompleted")


async def run_fan_out(server_url: str, worker_url: str, release_order: list[int], inspect: Any) -> dict[str, Any]:
    """A parent awaits five children started as one parallel group on another queue; the
    children are released one at a time in ``release_order`` (each completion recorded before
    the next release); ``inspect(parent_events)`` runs once all five completed."""
    queue, child_queue, workflow_id = unique("conf-fan"), unique("conf-fan-c"), unique("fan")
    async with make_client(server_url) as client, control_http(server_url) as http:
        parent_worker = await BackgroundWorker(worker_url, queue, workflows=[ParentWorkflow]).start()
        child_worker = await BackgroundWorker(worker_url, child_queue, workflows=[ChildWorkflow]).start()
        handle = await client.start_workflow(workflow_type="conformance.parent", task_queue=queue, workflow_id=workflow_id, input=["fan", child_queue, "c"])
        finished = False
        try:
            children = [await child_of(client, handle, index) for index in range(5)]
            for child_id, child_run in children:
                await child_waiting(client, child_id, child_run)
            by_sequence = {}
            for event in events_of(await fetch_history(client, workflow_id, handle.run_id), "ChildRunStarted"):
                by_sequence[payload_of(event)["sequence"]] = (payload_of(event)["child_workflow_instance_id"], payload_of(event)["child_workflow_run_id"])
            for done, index in enumerate(release_order, start=1):
                child_id, child_run = by_sequence[index + 1]
                await client.get_workflow_handle(child_id, run_id=child_run).signal("release")
                await wait_for_history(
                    client, workflow_id, handle.run_id,
                    lambda evs, n=done: len(events_of(evs, "ChildRunCompleted")) >= n, what=f"{done} ChildRunCompleted",
                )
            events = await fetch_history(client, workflow_id, handle.run_id)
            inspect(events)
            result = await wait_result(handle, timeout=30, workers=[parent_worker])
            finished = True
            described = [(await http.get(f"/api/workflows/{child_id}")).json() for child_id, _ in children]
            events = await fetch_history(client, workflow_id, handle.run_id)
        finally:
            if not finished:
                await terminate_quietly(http, workflow_id)
            await parent_worker.stop()
            await child_worker.stop()
    return {"result": result, "events": events, "children": described}


def test_concurrent_child_fan_out(server_url, worker_url):
    """child-workflow: concurrent_child_fan_out. Five children started concurrently (one
    parallel group) all run before any finishes, carry distinct child_call_ids, and the parent
    aggregates their results. Children complete here in call order (see the next test)."""
    fan = run_async(run_fan_out(server_url, worker_url, [0, 1, 2, 3, 4], lambda events: None), timeout=60)
    assert fan["result"] == ["C0", "C1", "C2", "C3", "C4"], fan["result"]
    events = fan["events"]
    scheduled = events_of(events, "ChildWorkflowScheduled")
    assert len({payload_of(e)["child_call_id"] for e in scheduled}) == 5
    assert {payload_of(e)["parallel_group_size"] for e in scheduled} == {5}
    types = type_sequence(events)
    assert types.index("ChildRunCompleted") > max(i for i, t in enumerate(types) if t == "ChildRunStarted"), types
    started = max(child["started_at"] for child in fan["children"])
    closed = min(child["closed_at"] for child in fan["children"])
    assert started < closed, "every child was running before the first one finished"
    assert_history_invariants(events, terminal="WorkflowCompleted")


def test_concurrent_child_fan_out_completing_out_of_order(server_url, worker_url):
    """child-workflow: concurrent_child_fan_out, children finishing in reverse call order. Each
    ChildRunCompleted repeats its call's `child_call_id` and `parallel_group_*` fields (common to
    every child event in 20-history-and-commands.md), so the parent replays and aggregates in
    call order.

    Regression test for docs/conformance.md finding 2: without those fields the Python 2.12.0
    replayer raised NonDeterministicReplayError at the group as soon as a later member resolved
    first, and the parent's workflow task failed for ever."""

    def carries_group_fields(events):
        scheduled = {payload_of(e)["sequence"]: payload_of(e) for e in events_of(events, "ChildWorkflowScheduled")}
        missing = [
            (payload_of(e)["sequence"], key)
            for e in events_of(events, "ChildRunCompleted")
            for key in ("parallel_group_id", "parallel_group_index", "parallel_group_base_sequence", "parallel_group_size", "child_call_id")
            if payload_of(e).get(key) != scheduled[payload_of(e)["sequence"]].get(key)
        ]
        assert not missing, f"ChildRunCompleted events lack the child's group/call fields: {missing[:5]}"

    fan = run_async(run_fan_out(server_url, worker_url, [4, 3, 2, 1, 0], carries_group_fields), timeout=60)
    assert fan["result"] == ["C0", "C1", "C2", "C3", "C4"], fan["result"]
    completions = [payload_of(e)["sequence"] for e in events_of(fan["events"], "ChildRunCompleted")]
    assert completions == [5, 4, 3, 2, 1], completions
    assert_history_invariants(fan["events"], terminal="WorkflowCompleted")


# ── replay-runtime-scenarios ─────────────────────────────────────────────


@dataclass
class ReplayEvidence:
    """What the replay scenarios assert on: the SDK shard's five families run live on Capstan by
    worker A, queried through A, then (A gone) through worker B in a separate OS process."""

    handles: dict[str, Any] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)
    before: dict[str, dict] = field(default_factory=dict)  # query answers through worker A
    history_lengths_before: dict[str, int] = field(default_factory=dict)
    without_worker: dict = field(default_factory=dict)  # the query refused while no worker ran
    after: dict[str, dict] = field(default_factory=dict)  # query answers through worker B
    worker_b_pid: int = 0
    histories: dict[str, list] = field(default_factory=dict)
    bundles: dict[str, dict] = field(default_factory=dict)
    in_flight_result: Any = None
    in_flight_history: list = field(default_factory=list)


def spawn_replay_worker(worker_url: str, queue: str, log_path: Path) -> subprocess.Popen:
    from capstan_harness import _child_dies_with_parent

    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "replay-worker", worker_url, queue, unique("replay-b")],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_child_dies_with_parent(),
        )


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


async def collect_replay_evidence(server_url: str, worker_url: str, log_path: Path) -> ReplayEvidence:
    evidence = ReplayEvidence()
    queue = unique("conf-replay")
    async with make_client(server_url) as client, control_http(server_url) as http:
        worker_a = await BackgroundWorker(worker_url, queue, workflows=REPLAY_WORKFLOWS, activities=REPLAY_ACTIVITIES, name=unique("replay-a")).start()
        try:
            for family, scenario in REPLAY_FAMILIES.items():
                evidence.handles[family] = await client.start_workflow(
                    workflow_type="python-replay-conformance", task_queue=queue, workflow_id=unique(f"replay-{family}"), input=[scenario],
                )
            in_flight = await client.start_workflow(workflow_type="python-replay-conformance", task_queue=queue, workflow_id=unique("replay-in-flight"), input=["signal-activity"])
            await wait_for_open_waits(client, evidence.handles["signal-update"])
            await evidence.handles["signal-update"].signal("name-provided", ["Grace"])
            await wait_for_open_waits(client, evidence.handles["wait-condition"])
            await evidence.handles["wait-condition"].update("approve", [True], wait_for="completed")
            for family, handle in evidence.handles.items():
                evidence.results[family] = await wait_result(handle, timeout=30, workers=[worker_a])
            await wait_for_open_waits(client, in_flight)
            for family, handle in evidence.handles.items():
                resp = await raw_query(http, handle.workflow_id, "currentState")
                assert resp.status_code == 200, f"{family}: {resp.status_code} {resp.text[:300]}"
                evidence.before[family] = resp.json()
                evidence.history_lengths_before[family] = len(await fetch_history(client, handle.workflow_id, handle.run_id))
        finally:
            await worker_a.stop()

        refused = await raw_query(http, evidence.handles["activity"].workflow_id, "currentState")
        evidence.without_worker = {"status": refused.status_code, **refused.json()}
        # The in-flight run's signal arrives while no worker holds the run.
        await in_flight.signal("name-provided", ["Grace"])

        proc = spawn_replay_worker(worker_url, queue, log_path)
        evidence.worker_b_pid = proc.pid
        try:
            probe = evidence.handles["activity"]
            deadline = time.monotonic() + 30
            while (resp := await raw_query(http, probe.workflow_id, "currentState")).status_code != 200:
                assert proc.poll() is None, f"replay worker B exited with {proc.returncode}; log: {log_path.read_text()[-3000:]}"
                assert time.monotonic() < deadline, f"worker B never answered: {resp.status_code} {resp.text[:300]}"
                await asyncio.sleep(0.1)
            for family, handle in evidence.handles.items():  # the run-targeted route this time
                resp = await raw_query(http, handle.workflow_id, "currentState", run_id=handle.run_id)
                assert resp.status_code == 200, f"{family}: {resp.status_code} {resp.text[:300]}"
                evidence.after[family] = resp.json()
            evidence.in_flight_result = await wait_result(in_flight, timeout=30)
        finally:
            stop_process(proc)

        for family, handle in evidence.handles.items():
            evidence.histories[family] = await fetch_history(client, handle.workflow_id, handle.run_id)
            export = await http.get(f"/api/workflows/{handle.workflow_id}/runs/{handle.run_id}/history/export")
            assert export.status_code == 200, export.text[:300]
            evidence.bundles[family] = export.json()
        evidence.in_flight_history = await fetch_history(client, in_flight.workflow_id, in_flight.run_id)
    return evidence


@pytest.fixture(scope="module")
def replay_evidence(server_url: str, worker_url: str, tmp_path_factory: pytest.TempPathFactory) -> ReplayEvidence:
    log_path = tmp_path_factory.mktemp("replay-worker-b") / "worker-b.log"
    return run_async(collect_replay_evidence(server_url, worker_url, log_path), timeout=120)


def activity_types(events: list[dict]) -> list[str]:
    return [payload_of(e)["activity_type"] for e in events_of(events, "ActivityScheduled")]


def check_family_history(family: str, events: list[dict]) -> None:
    """What each family's recorded history must show (no extra or divergent decision)."""
    if family == "activity":
        assert activity_types(events) == ["python-replay.greet"]
    elif family == "signal-update":
        assert_in_order(events, ["ConditionWaitOpened", "SignalReceived", "ConditionWaitSatisfied", "ActivityScheduled", "ActivityCompleted", "WorkflowCompleted"])
        (received,) = events_of(events, "SignalReceived")
        assert payload_of(received)["signal_name"] == "name-provided" and signal_arguments(received) == ["Grace"]
        assert activity_types(events) == ["python-replay.greet"]
    elif family == "wait-condition":
        assert_in_order(events, ["ConditionWaitOpened", "UpdateAccepted", "UpdateApplied", "UpdateCompleted", "ConditionWaitSatisfied", "WorkflowCompleted"])
        assert len(events_of(events, "ConditionWaitOpened")) == 1, type_sequence(events)
        assert not events_of(events, "TimerScheduled", "ActivityScheduled"), type_sequence(events)
    elif family == "version-marker":
        (marker,) = events_of(events, "VersionMarkerRecorded")
        recorded = payload_of(marker)
        assert (recorded["change_id"], recorded["version"], recorded["min_supported"], recorded["max_supported"]) == ("python-replay-version", 2, -1, 2)
        assert activity_types(events) == ["python-replay.versioned-v3"]
    elif family == "saga-compensation":
        assert activity_types(events) == ["python-replay.reserve-inventory", "python-replay.release-inventory"]
        assert len(events_of(events, "ChildWorkflowScheduled")) == 1
        (failed,) = events_of(events, "ChildRunFailed")
        assert payload_of(failed)["message"] == "payment declined", payload_of(failed)
        assert_in_order(events, ["ActivityCompleted", "ChildRunFailed", "ActivityScheduled", "ActivityCompleted", "WorkflowCompleted"])
    assert_history_invariants(events, terminal="WorkflowCompleted")


def command_summary(commands: list[Any]) -> list[tuple[str, Any]]:
    return [(type(command).__name__, getattr(command, "result", getattr(command, "activity_type", None))) for command in commands]


@pytest.mark.parametrize("family", list(REPLAY_FAMILIES))
def test_python_completed_history_replay(replay_evidence: ReplayEvidence, family: str):
    """replay: python_completed_history_{activity,signal_update,wait_condition,version_marker,
    saga_compensation}_replay. The SDK shard's workflow ran on Capstan; the history Capstan
    recorded replays with the published SDK replayer to the shard's expected state, the
    documented verifier reports `replayed` against the recorded terminal decision, and the final
    command sequence equals the one the SDK's own golden history yields."""
    scenario = REPLAY_FAMILIES[family]
    expected = _golden_case(family)["expected_state"]
    events = replay_evidence.histories[family]
    assert replay_evidence.results[family] == expected
    assert query_state(ReplayConformanceWorkflow, events, [scenario], "currentState") == expected
    report = verify_replay(
        ReplayConformanceWorkflow, events, start_input=[scenario],
        expected={"command_type": "CompleteWorkflow", "result": expected}, case_id=f"capstan-{family}",
    )
    assert report.status == "replayed", report.to_dict()
    ours = command_summary(replay(ReplayConformanceWorkflow, events, [scenario]).commands)
    golden = command_summary(replay(ReplayConformanceWorkflow, _history(scenario), [scenario]).commands)
    assert ours == golden == [("CompleteWorkflow", expected)], (ours, golden)
    check_family_history(family, events)


RESTART_FAMILIES = {"completed-query": "activity", **{family: family for family in REPLAY_FAMILIES}}


@pytest.mark.parametrize("restart_family", list(RESTART_FAMILIES))
def test_python_worker_restart_state(replay_evidence: ReplayEvidence, restart_family: str):
    """replay: python_worker_restart_{completed_query,activity_state,signal_update_state,
    wait_condition_state,version_marker_state,saga_compensation_state}. After the worker that
    ran the workflows stopped (queries then get `query_worker_unavailable`), a fresh worker in
    another OS process replays the unchanged history and answers byte-for-byte what the first
    worker answered, which is the shard's expected state; nothing was re-run or added."""
    family = RESTART_FAMILIES[restart_family]
    expected = _golden_case(family)["expected_state"]
    before, after = replay_evidence.before[family], replay_evidence.after[family]
    assert replay_evidence.without_worker["status"] == 409, replay_evidence.without_worker
    assert replay_evidence.without_worker["reason"] == "query_worker_unavailable", replay_evidence.without_worker
    assert replay_evidence.worker_b_pid and replay_evidence.worker_b_pid != os.getpid()
    assert after["run_id"] == before["run_id"] == replay_evidence.handles[family].run_id
    assert after["result_envelope"] == before["result_envelope"], (before["result_envelope"], after["result_envelope"])
    assert decode_envelope(after["result_envelope"]) == expected
    events = replay_evidence.histories[family]
    assert len(events) == replay_evidence.history_lengths_before[family], "restart and queries must not write history"
    check_family_history(family, events)


def test_python_in_flight_signal_restart_timing(replay_evidence: ReplayEvidence):
    """replay: python_in_flight_signal_restart_timing. A run waiting for its signal loses its
    worker, the signal arrives while no worker runs, and a fresh worker process replays the
    reloaded history: the signal applies at the same point and the next decisions (the greet
    activity with the signalled name, then completion) equal the uninterrupted run's."""
    expected = _golden_case("signal-update")["expected_state"]
    assert replay_evidence.in_flight_result == expected

    def decisions(events: list[dict]) -> list[tuple]:
        kept = ("ConditionWaitOpened", "SignalReceived", "ConditionWaitSatisfied", "ActivityScheduled", "ActivityCompleted", "WorkflowCompleted")
        out = []
        for event in events_of(events, *kept):
            payload = payload_of(event)
            if event_type(event) == "SignalReceived":
                value = decode_envelope(payload["arguments"])
            elif event_type(event) == "ActivityCompleted":
                value = decode_envelope({"codec": payload.get("payload_codec") or "avro", "blob": payload["result"]})
            else:
                value = None
            out.append((event_type(event), payload.get("sequence"), payload.get("activity_type"), value))
        return out

    moved, original = replay_evidence.in_flight_history, replay_evidence.histories["signal-update"]
    assert decisions(moved) == decisions(original), (decisions(moved), decisions(original))
    (scheduled,) = events_of(moved, "ActivityScheduled")
    assert payload_of(scheduled)["activity_type"] == "python-replay.greet"
    # The reloaded history (up to the signal) replays to that same next decision.
    upto = type_sequence(moved).index("SignalReceived") + 1
    (command,) = replay(ReplayConformanceWorkflow, moved[:upto], ["signal-activity"]).commands
    assert (type(command).__name__, command.activity_type, list(command.arguments)) == ("ScheduleActivity", "python-replay.greet", ["Grace"])
    assert_history_invariants(moved, terminal="WorkflowCompleted")


def test_python_code_divergence_refusal(replay_evidence: ReplayEvidence):
    """replay: python_code_divergence_refusal. Capstan's recorded history replayed against the
    shard's divergent code is refused as non-deterministic, with the workflow sequence, the
    expected shape, the recorded event types and a message."""
    report = verify_replay(
        ReplayConformanceDivergentWorkflow, replay_evidence.histories["activity"], start_input=["single-activity"],
        workflow_type="python-replay-conformance", case_id="capstan-divergence",
    )
    assert (report.status, report.reason) == ("drifted", "shape_mismatch"), report.to_dict()
    divergence = report.divergence or {}
    assert divergence.get("workflow_sequence") == 1, divergence
    assert divergence.get("expected_shape") and divergence.get("message"), divergence
    assert divergence.get("recorded_event_types"), divergence


def bundle_events(bundle: dict, kind: str) -> list[dict]:
    return [e for e in bundle["history_events"] if (e.get("type") or e.get("event_type")) == kind]


def test_server_history_mutation_refusal(replay_evidence: ReplayEvidence):
    """replay: server_history_mutation_refusal. Capstan's export verifies; the same bundle with
    a changed activity result is refused by the SDK's bundle verifier (integrity rule and
    message) and its replay no longer reaches the recorded decision (replay diff reason)."""
    pristine = replay_evidence.bundles["activity"]
    assert verify_bundle(copy.deepcopy(pristine))["status"] == "ok"
    mutated = copy.deepcopy(pristine)
    (completed,) = bundle_events(mutated, "ActivityCompleted")
    completed["payload"]["result"] = serializer.envelope("Hello, Grace!")["blob"]
    report = verify_bundle(mutated)
    assert report["status"] == "failed", report
    rules = {f["rule"]: f for f in report["findings"] if f.get("severity") == "error"}
    assert "integrity.checksum_mismatch" in rules and rules["integrity.checksum_mismatch"]["message"], report["findings"]
    diff = verify_replay(
        ReplayConformanceWorkflow, mutated, start_input=["single-activity"],
        expected={"command_type": "CompleteWorkflow", "result": _golden_case("activity")["expected_state"]},
        case_id="capstan-mutated",
    )
    assert (diff.status, diff.reason) == ("drifted", "expectation_mismatch"), diff.to_dict()


def test_malformed_history_refusal(replay_evidence: ReplayEvidence):
    """replay: malformed_history_refusal. Capstan's export without its required
    `workflow.run_id` is refused by the SDK's bundle verifier with the rule and a message."""
    malformed = copy.deepcopy(replay_evidence.bundles["activity"])
    del malformed["workflow"]["run_id"]
    report = verify_bundle(malformed)
    assert report["status"] == "failed", report
    finding = next((f for f in report["findings"] if f.get("rule") == "workflow.run_id_missing"), None)
    assert finding and finding["message"], report["findings"]


# ── worker B: ``python test_conformance.py replay-worker URL QUEUE WORKER_ID`` ──


def replay_worker_main(url: str, queue: str, worker_id: str) -> None:
    async def main() -> None:
        client = Client(url, namespace=NAMESPACE, timeout=30.0)
        worker = Worker(
            client, task_queue=queue, workflows=REPLAY_WORKFLOWS, activities=REPLAY_ACTIVITIES,
            worker_id=worker_id, poll_timeout=5.0, shutdown_timeout=5.0,
        )
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        runner = asyncio.create_task(worker.run())
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({runner, stopper}, return_when=asyncio.FIRST_COMPLETED)
        if not runner.done():
            await asyncio.wait_for(worker.stop(), timeout=10)
        await runner
        stopper.cancel()
        await client.aclose()

    asyncio.run(main())


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "replay-worker":
        sys.exit("usage: test_conformance.py replay-worker URL QUEUE WORKER_ID")
    replay_worker_main(*sys.argv[2:])
