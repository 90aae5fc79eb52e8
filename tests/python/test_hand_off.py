"""The hand-off on a real ``capstan serve``: a task made ready while a poll waits on the node is
leased to that poll in the transaction that makes it (counted in
``capstan_task_hand_offs_total``), and a poll whose client hung up swallows nothing: the task
reaches the next poller at once, not after a lease.
"""
from __future__ import annotations

import asyncio
import json
import socket
import time
from urllib.parse import urlparse

import httpx

from capstan_harness import WORKER_HEADERS, RawWorker, make_client, run_async, unique


def hand_offs(base_url: str, kind: str) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("capstan_task_hand_offs_total{") and f'kind="{kind}"' in line and 'namespace="default"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def start(server_url: str, queue: str) -> str:
    workflow_id = unique("handoff")
    async with make_client(server_url) as client:
        await client.start_workflow(workflow_type="handoff.any", task_queue=queue, workflow_id=workflow_id, input=[])
    return workflow_id


def test_a_start_is_handed_to_the_poll_waiting_for_it(server_url):
    queue = unique("handoff-q")

    async def main():
        async with RawWorker(queue) as worker:
            await worker.register(server_url)
            before = hand_offs(server_url, "workflow")
            poll = asyncio.create_task(worker.poll_workflow_task(server_url, timeout_seconds=20))
            await asyncio.sleep(0.5)  # parked
            workflow_id = await start(server_url, queue)
            began = time.monotonic()
            task = await asyncio.wait_for(poll, timeout=10)
            assert task is not None and task["workflow_id"] == workflow_id, task
            assert time.monotonic() - began < 2.0
            assert hand_offs(server_url, "workflow") == before + 1

    run_async(main(), timeout=60)


def _abandoned_poll(base_url: str, worker_id: str, queue: str) -> socket.socket:
    """A long poll sent on a raw connection whose client will hang up before the answer."""
    url = urlparse(base_url)
    body = json.dumps({"worker_id": worker_id, "task_queue": queue, "timeout_seconds": 20}).encode()
    headers = "".join(f"{name}: {value}\r\n" for name, value in WORKER_HEADERS.items())
    request = (
        f"POST /api/worker/workflow-tasks/poll HTTP/1.1\r\nHost: {url.netloc}\r\n{headers}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    conn = socket.create_connection((url.hostname, url.port), timeout=10)
    conn.sendall(request)
    return conn


def test_a_poll_whose_client_hung_up_swallows_nothing(server_url):
    queue = unique("handoff-gone")

    async def main():
        async with RawWorker(queue) as worker:
            await worker.register(server_url)
            for _ in range(3):
                conn = _abandoned_poll(server_url, worker.worker_id, queue)
                await asyncio.sleep(0.5)  # parked
                conn.close()  # the client hangs up
                await asyncio.sleep(0.2)
                workflow_id = await start(server_url, queue)
                began = time.monotonic()
                task = await worker.next_workflow_task(server_url, within=10)
                assert task["workflow_id"] == workflow_id, task
                waited = time.monotonic() - began
                assert waited < 2.0, f"the task waited {waited:.1f}s: the gone poll held it"

    run_async(main(), timeout=90)

