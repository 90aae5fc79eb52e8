"""Workflow output streams end to end: ``ctx.append_workflow_stream`` / ``close_workflow_stream``
in workflow code and ``Client.iter_workflow_stream`` / ``append_workflow_stream`` /
``close_workflow_stream`` / ``describe_workflow_stream`` (``durable-workflow==2.12.0``) against a
real ``capstan serve``.

The workflow appends tokens in two commands (a signal in between), then closes its stream; a
client follows it with a long poll from offset 0 to the end. Replay never appends again: every
item has one offset, and a client's retried append with the same key is deduped.
"""
from __future__ import annotations

import asyncio

from durable_workflow import WorkflowStreamAppendItem, workflow

from capstan_harness import (
    assert_history_invariants, events_of, fetch_history_raw, make_client, run_async, unique, wait_result,
)


@workflow.defn(name="streams.producer")
class Producer:
    def __init__(self):
        self.go = False

    @workflow.signal("go")
    def on_go(self):
        self.go = True

    def run(self, ctx):
        yield ctx.append_workflow_stream("tokens", [WorkflowStreamAppendItem(payload="hello", item_type="token"),
                                                    WorkflowStreamAppendItem(payload="world", item_type="token")])
        yield ctx.wait_condition(lambda: self.go, key="go")
        yield ctx.append_workflow_stream("tokens", [WorkflowStreamAppendItem(payload="!", item_type="token")])
        yield ctx.close_workflow_stream("tokens", retention_seconds=120)
        return "streamed"


EVERYTHING = {"workflows": [Producer], "activities": []}


def test_a_workflow_streams_items_a_client_follows_to_the_end(server_url, worker_url, run_worker):
    queue = unique("wstreams")
    workflow_id = unique("wstreams-wf")

    async def main():
        async with run_worker(worker_url, queue, **EVERYTHING) as worker:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(workflow_type="streams.producer", task_queue=queue,
                                                     workflow_id=workflow_id, input=[])
                run_id = handle.run_id

                async def follow():
                    # A stream exists from its first append (before it, reads answer 404).
                    for _ in range(100):
                        try:
                            await client.describe_workflow_stream(workflow_id, run_id, "tokens")
                            break
                        except Exception:  # noqa: BLE001 - not opened yet
                            await asyncio.sleep(0.1)
                    return [item async for item in client.iter_workflow_stream(
                        workflow_id, run_id, "tokens", wait_seconds=5)]

                follower = asyncio.create_task(follow())
                await asyncio.sleep(1.5)
                await handle.signal("go")
                result = await wait_result(handle, timeout=60, workers=[worker])
                items = await asyncio.wait_for(follower, timeout=30)
                described = await client.describe_workflow_stream(workflow_id, run_id, "tokens")
                listed = await client.list_workflow_streams(workflow_id, run_id)
                history = await fetch_history_raw(server_url, workflow_id, run_id)
        return result, items, described, listed, history

    result, items, described, listed, history = run_async(main(), timeout=120)
    assert result == "streamed"
    assert [(i.offset, i.payload, i.item_type, i.origin) for i in items] == [
        (0, "hello", "token", "workflow_command"), (1, "world", "token", "workflow_command"),
        (2, "!", "token", "workflow_command")], items
    assert described.status == "closed" and described.last_offset == 2 and described.total_items == 3, described
    assert described.retention_seconds == 120
    assert [s.stream_name for s in listed] == ["tokens"]
    assert_history_invariants(history, terminal="WorkflowCompleted")
    assert len(events_of(history, "SideEffectRecorded")) == 3


def test_clients_append_with_dedupe_and_close_with_an_error(server_url, worker_url, run_worker):
    queue = unique("wstreams-client")
    workflow_id = unique("wstreams-client")

    async def main():
        async with run_worker(worker_url, queue, **EVERYTHING) as worker:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(workflow_type="streams.producer", task_queue=queue,
                                                     workflow_id=workflow_id, input=[])
                run_id = handle.run_id
                item = WorkflowStreamAppendItem(payload={"n": 1}, idempotency_key="client-1")
                first = await client.append_workflow_stream(workflow_id, run_id, "side", [item])
                again = await client.append_workflow_stream(workflow_id, run_id, "side", [item])
                closed = await client.close_workflow_stream(workflow_id, run_id, "side", error_reason="gave up")
                page = await client.subscribe_workflow_stream(workflow_id, run_id, "side")
                await handle.signal("go")
                await wait_result(handle, timeout=60, workers=[worker])
        return first, again, closed, page

    first, again, closed, page = run_async(main(), timeout=120)
    assert (first.accepted_count, first.deduplicated_count, list(first.accepted_offsets)) == (1, 0, [0]), first
    assert (again.accepted_count, again.deduplicated_count, list(again.accepted_offsets)) == (0, 1, [0]), again
    assert closed.status == "errored" and closed.error_reason == "gave up", closed
    assert page.terminal is True and [i.payload for i in page.items] == [{"n": 1}], page
