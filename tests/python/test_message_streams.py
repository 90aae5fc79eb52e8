"""Message streams end to end: ``WorkflowHandle.append_message`` and ``ctx.message_stream(...)
.receive()`` (``durable-workflow==2.12.0``) against a real ``capstan serve``.

A message is ingested once per (instance, stream, message id): a retried append answers the
first receipt and position, the same id with another payload is refused. Positions count from 1;
the workflow consumes them in order in batches and reports its cursor; a continue-as-new hands
the next run a cursor checkpoint and only what was not consumed.
"""
from __future__ import annotations

import asyncio

import httpx
from durable_workflow import workflow

from capstan_harness import (
    CONTROL_HEADERS, assert_history_invariants, events_of, fetch_history_raw, make_client, payload_of, run_async,
    unique, wait_result,
)

RESERVED = "__durable_workflow_message_stream"


@workflow.defn(name="streams.collect")
class Collect:
    """Receives until `expected` messages arrived, in batches of at most three."""

    def run(self, ctx, expected):
        got = []
        stream = ctx.message_stream("inbox")
        while len(got) < expected:
            batch = yield from stream.receive(3)
            got.extend([message.position, message.message_id, message.arguments] for message in batch)
        return got


@workflow.defn(name="streams.relay")
class Relay:
    """Waits for a backlog, consumes two messages, continues as new with what it has; the next
    run consumes the rest."""

    def run(self, ctx, expected, got=None):
        got = list(got or [])
        stream = ctx.message_stream("inbox")
        if not got:
            yield ctx.start_timer(2)
            batch = yield from stream.receive(2)
            got.extend([message.position, message.arguments[0]] for message in batch)
            return (yield ctx.continue_as_new(expected, got))
        while len(got) < expected:
            batch = yield from stream.receive(10)
            got.extend([message.position, message.arguments[0]] for message in batch)
        return got


EVERYTHING = {"workflows": [Collect, Relay], "activities": []}


def reserved_deliveries(history):
    return [e for e in events_of(history, "SignalReceived") if payload_of(e)["signal_name"] == RESERVED]


def test_messages_are_ingested_once_and_received_in_order(server_url, worker_url, run_worker):
    queue = unique("streams")
    workflow_id = unique("streams-wf")

    async def main():
        async with run_worker(worker_url, queue, **EVERYTHING) as worker:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(workflow_type="streams.collect", task_queue=queue,
                                                     workflow_id=workflow_id, input=[5])
                first = await handle.append_message("inbox", "m-1", ["one"])
                second = await handle.append_message("inbox", "m-2", ["two"])
                retried = await handle.append_message("inbox", "m-2", ["two"])
                async with httpx.AsyncClient(base_url=f"{server_url}/api", headers=CONTROL_HEADERS) as http:
                    conflict = await http.post(f"/workflows/{workflow_id}/message-streams/inbox/messages",
                                               json={"message_id": "m-2"})
                    bad_id = await http.post(f"/workflows/{workflow_id}/message-streams/inbox/messages",
                                             json={"message_id": "has space"})
                    unknown = await http.post(f"/workflows/{unique('nobody')}/message-streams/inbox/messages",
                                              json={"message_id": "m-1"})
                    reserved = await http.post(f"/workflows/{workflow_id}/signal/{RESERVED}", json={})
                    # The message id is the idempotency key; a request_id is not taken beside it.
                    keyed = await http.post(f"/workflows/{workflow_id}/message-streams/inbox/messages",
                                            json={"message_id": "m-9", "request_id": "r-1"})
                for n, word in [(3, "three"), (4, "four"), (5, "five")]:
                    await handle.append_message("inbox", f"m-{n}", [word])
                result = await wait_result(handle, timeout=60, workers=[worker])
                history = await fetch_history_raw(server_url, workflow_id, handle.run_id)
                async with httpx.AsyncClient(base_url=f"{server_url}/api", headers=CONTROL_HEADERS) as http:
                    described = await http.get(f"/workflows/{workflow_id}/message-streams/inbox")
                    listed = await http.get(f"/workflows/{workflow_id}/message-streams")
                    closed = await http.post(f"/workflows/{workflow_id}/message-streams/inbox/messages",
                                             json={"message_id": "m-6"})
        return (first, second, retried, conflict, bad_id, unknown, reserved, keyed, result, history, described,
                listed, closed)

    (first, second, retried, conflict, bad_id, unknown, reserved, keyed, result, history, described, listed,
     closed) = run_async(main(), timeout=120)
    assert (first["position"], second["position"]) == (1, 2), (first, second)
    assert first["accepted"] is True and first["duplicate"] is False and first["outcome"] == "accepted"
    assert retried["position"] == 2 and retried["duplicate"] is True and retried["outcome"] == "duplicate", retried
    assert conflict.status_code == 409 and conflict.json()["reason"] == "message_identity_conflict", conflict.text
    assert bad_id.status_code == 422 and bad_id.json()["reason"] == "validation_failed", bad_id.text
    assert unknown.status_code == 404 and unknown.json()["reason"] == "instance_not_found", unknown.text
    assert reserved.status_code == 422 and reserved.json()["reason"] == "runtime_reserved_signal", reserved.text
    assert keyed.status_code == 422 and "request_id" in keyed.json()["errors"], keyed.text
    assert result == [[1, "m-1", ["one"]], [2, "m-2", ["two"]], [3, "m-3", ["three"]], [4, "m-4", ["four"]],
                      [5, "m-5", ["five"]]], result
    assert_history_invariants(history, terminal="WorkflowCompleted")
    assert len(reserved_deliveries(history)) == 5, "a retried append is not delivered again"
    advanced = [payload_of(e)["new_position"] for e in events_of(history, "MessageCursorAdvanced")]
    assert advanced == sorted(advanced) and advanced[-1] == 5, advanced
    assert described.status_code == 200, described.text
    stream = described.json()["stream"]
    assert (stream["last_position"], stream["cursor_position"], stream["pending_count"]) == (5, 5, 0), stream
    assert stream["duplicate_count"] == 2, stream
    assert [s["stream_name"] for s in listed.json()["streams"]] == ["inbox"]
    assert closed.status_code == 409 and closed.json()["reason"] == "run_not_active", closed.text


def test_a_continued_run_receives_only_what_its_predecessor_did_not_consume(server_url, worker_url, run_worker):
    queue = unique("streams-can")
    workflow_id = unique("streams-can")

    async def main():
        async with run_worker(worker_url, queue, **EVERYTHING) as worker:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(workflow_type="streams.relay", task_queue=queue,
                                                     workflow_id=workflow_id, input=[5])
                for n in range(1, 5):
                    await handle.append_message("inbox", f"m-{n}", [n * 10])
                await asyncio.sleep(4)
                await handle.append_message("inbox", "m-5", [50])
                latest = client.get_workflow_handle(workflow_id)
                result = await wait_result(latest, timeout=60, workers=[worker])
                described = await client.describe_workflow(workflow_id)
                first = await fetch_history_raw(server_url, workflow_id, handle.run_id)
                second = await fetch_history_raw(server_url, workflow_id, described.run_id)
        return handle, result, described, first, second

    handle, result, described, first, second = run_async(main(), timeout=120)
    assert result == [[1, 10], [2, 20], [3, 30], [4, 40], [5, 50]], result
    assert described.run_id != handle.run_id
    assert_history_invariants(first, terminal="WorkflowContinuedAsNew")
    assert_history_invariants(second, terminal="WorkflowCompleted")
    assert len(reserved_deliveries(first)) == 4
    # The successor: a cursor checkpoint first, then positions 3 and 4 again, then 5.
    assert len(reserved_deliveries(second)) == 4, [payload_of(e) for e in reserved_deliveries(second)]


def test_concurrent_retries_of_one_message_are_ingested_once(server_url, worker_url, run_worker):
    """Ten concurrent sends of one message id, split across both nodes on a cluster: one
    ingestion, one position, one delivery."""
    queue = unique("streams-race")
    workflow_id = unique("streams-race")

    async def main():
        async with run_worker(worker_url, queue, **EVERYTHING) as worker:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(workflow_type="streams.collect", task_queue=queue,
                                                     workflow_id=workflow_id, input=[2])
                nodes = [server_url, worker_url]
                async with httpx.AsyncClient(headers=CONTROL_HEADERS) as http:
                    sends = [http.post(f"{nodes[i % 2]}/api/workflows/{workflow_id}/message-streams/inbox/messages",
                                       json={"message_id": "once", "input": None}) for i in range(10)]
                    answers = await asyncio.gather(*sends)
                await handle.append_message("inbox", "after", ["x"])
                result = await wait_result(handle, timeout=60, workers=[worker])
                history = await fetch_history_raw(server_url, workflow_id, handle.run_id)
        return answers, result, history

    answers, result, history = run_async(main(), timeout=120)
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200] * 9 + [202], [(a.status_code, a.text) for a in answers]
    assert {a.json()["position"] for a in answers} == {1}
    assert result == [[1, "once", []], [2, "after", ["x"]]], result
    assert len(reserved_deliveries(history)) == 2
