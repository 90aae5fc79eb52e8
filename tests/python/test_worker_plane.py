"""The worker plane's authority routes through the published Python SDK: a worker that
requires query-task authority (`Worker(require_query_task_authority=True)`) starts against
Capstan and answers queries while checking its lease at
`GET /worker/query-tasks/{id}/status` (it drops a query whose authority it cannot confirm).
"""
from __future__ import annotations

import asyncio
import time

from durable_workflow import workflow

from capstan_harness import make_client, run_async, unique, wait_result


@workflow.defn(name="plane.counter")
class CounterWorkflow:
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


def test_a_worker_requiring_query_task_authority_answers_queries(server_url, worker_url, run_worker):
    queue = unique("plane-query")
    workflow_id = unique("plane-counter")

    async def main():
        async with make_client(server_url) as client:
            info = await client.get_cluster_info()
            assert info["worker_protocol"]["server_capabilities"]["query_task_authority"] is True
        async with run_worker(worker_url, queue, workflows=[CounterWorkflow], require_query_task_authority=True) as worker:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(workflow_type="plane.counter", task_queue=queue, workflow_id=workflow_id, input=[])
                await handle.signal("bump", [3])
                deadline = time.monotonic() + 20
                while True:
                    answer = await handle.query("count")
                    if answer["result"] == 3:
                        break
                    assert time.monotonic() < deadline, answer
                    await asyncio.sleep(0.2)
                await handle.signal("stop", [])
                assert await wait_result(handle, timeout=30, workers=[worker]) == 3

    run_async(main(), timeout=90)
