"""Polls shed first, in the shape the Python SDK backs off on (docs/reliability.md, Overload).

A node that holds its most parked polls (``--max-parked-polls``) refuses more with
``429 long_poll_capacity_exhausted`` and a ``Retry-After``; the SDK's workers sleep the
advertised second and poll again, and their workflows still finish. (Refusals under write
pressure, and three times the sustainable load, are ``crates/capstan/tests/overload.rs``.)
"""
from __future__ import annotations

import asyncio
import re

import httpx
from durable_workflow import activity, workflow

from capstan_harness import WORKER_HEADERS, BackgroundWorker, make_client, run_async, unique, wait_result


@activity.defn(name="overload.echo")
async def echo(text: str) -> str:
    return f"echo {text}"


@workflow.defn(name="overload.echoing")
class Echoing:
    def run(self, ctx, text):
        result = yield ctx.schedule_activity("overload.echo", [text])
        return result


def test_polls_past_the_nodes_most_are_shed_and_the_sdk_worker_backs_off_and_finishes(server_factory):
    server = server_factory.create("--max-parked-polls", "1")
    queue = unique("overload-q")

    async def scenario():
        async with httpx.AsyncClient(base_url=f"{server.url}/api", headers=WORKER_HEADERS, timeout=30) as http:
            registered = await http.post("/worker/register", json={
                "worker_id": "holder", "task_queue": queue, "runtime": "python",
                "sdk_version": "capstan-tests/raw", "supported_workflow_types": ["overload.echoing"], "supported_activity_types": [],
            })
            assert registered.status_code in (200, 201), registered.text
            # One poll parked: the node's most.
            held = asyncio.create_task(http.post("/worker/workflow-tasks/poll", json={
                "worker_id": "holder", "task_queue": queue, "timeout_seconds": 3, "poll_request_id": "p-held",
            }))
            await asyncio.sleep(0.5)
            shed = await http.post("/worker/workflow-tasks/poll", json={
                "worker_id": "holder", "task_queue": queue, "timeout_seconds": 3, "poll_request_id": "p-shed",
            })
            assert shed.status_code == 429, shed.text
            assert shed.headers.get("retry-after") == "1"
            body = shed.json()
            for key, value in {"reason": "long_poll_capacity_exhausted", "poll_status": "long_poll_capacity_exhausted",
                               "task": None, "task_kind": "workflow_task", "task_queue": queue,
                               "retryable": True, "retry_after_seconds": 1, "poll_request_id": "p-shed"}.items():
                assert body.get(key) == value, (key, body)
            assert (await held).status_code == 200

        # An SDK worker polls workflow and activity tasks at once: one of its polls is shed at
        # every turn, and it still finishes the work.
        worker = await BackgroundWorker(server.url, queue, workflows=[Echoing], activities=[echo]).start()
        try:
            async with make_client(server.url) as client:
                handles = [await client.start_workflow(workflow_type="overload.echoing", task_queue=queue,
                                                       workflow_id=unique("overload-wf"), input=[str(i)])
                           for i in range(5)]
                results = await asyncio.gather(*(wait_result(h, timeout=90, workers=[worker]) for h in handles))
            assert results == [f"echo {i}" for i in range(5)]
            assert worker.alive, worker.failure()
        finally:
            await worker.stop()
        metrics = httpx.get(f"{server.url}/metrics", timeout=5).text
        refused = re.search(r'^capstan_admission_refused_total\{plane="poll"\} (\d+)', metrics, re.M)
        assert refused and int(refused.group(1)) >= 1, metrics[-1500:]

    run_async(scenario(), timeout=180)
