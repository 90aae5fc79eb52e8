"""The Python SDK's ``priority``, ``fairness_key`` and ``fairness_weight`` start options take
effect on a real ``capstan serve``: a backlog is handed to a one-slot worker most urgent first,
and inside one priority two tenants weighted 3:1 share it 3:1.

Each workflow records itself when it runs; it finishes in its one workflow task, so the record
is the order the server dispatched the backlog in.
"""
from __future__ import annotations

import asyncio

from durable_workflow import workflow

from capstan_harness import make_client, run_async, unique, wait_result

RAN: list[str] = []


@workflow.defn(name="pf.record")
class RecordWorkflow:
    def run(self, ctx, name):
        RAN.append(name)
        return name


async def _backlog_then_drain(server_url, worker_url, run_worker, queue, starts):
    """Starts every ``(name, options)`` with no worker listening, then lets a one-slot worker
    drain the queue; the names in the order they ran."""
    RAN.clear()
    async with make_client(server_url) as client:
        handles = []
        for name, options in starts:
            handles.append(await client.start_workflow(
                workflow_type="pf.record", task_queue=queue, workflow_id=unique(name), input=[name], **options,
            ))
        described = await handles[-1].describe()
        assert described.status in ("pending", "running")
        async with run_worker(worker_url, queue, workflows=[RecordWorkflow], max_concurrent_workflow_tasks=1) as worker:
            for handle in handles:
                await wait_result(handle, timeout=60, workers=[worker])
    return list(RAN)


def test_a_backlog_runs_most_urgent_first(server_url, worker_url, run_worker):
    queue = unique("pf-priority")
    starts = [("low", {"priority": 9}), ("default", {}), ("urgent", {"priority": 1}), ("high", {"priority": 3})]
    ran = run_async(_backlog_then_drain(server_url, worker_url, run_worker, queue, starts), timeout=120)
    assert ran == ["urgent", "high", "default", "low"]


def test_two_tenants_weighted_three_to_one_share_a_backlog_three_to_one(server_url, worker_url, run_worker):
    queue = unique("pf-fair")
    # The light tenant's backlog arrived first; FIFO would run all of it first.
    starts = [(f"light-{i}", {"fairness_key": "Tenant-Light", "fairness_weight": 1}) for i in range(8)]
    starts += [(f"heavy-{i}", {"fairness_key": "tenant-heavy", "fairness_weight": 3}) for i in range(8)]
    ran = run_async(_backlog_then_drain(server_url, worker_url, run_worker, queue, starts), timeout=180)
    first_eight = ran[:8]
    assert sum(name.startswith("heavy") for name in first_eight) == 6, first_eight
    heavy = [name for name in ran if name.startswith("heavy")]
    assert heavy == [f"heavy-{i}" for i in range(8)], "a tenant's own work stays in order"


def test_out_of_range_options_are_refused(server_url):
    async def main():
        async with make_client(server_url) as client:
            for options in ({"priority": 10}, {"fairness_weight": 0}, {"fairness_key": "no spaces"}):
                try:
                    await client.start_workflow(
                        workflow_type="pf.record", task_queue="pf-refused", workflow_id=unique("refused"), input=["x"], **options,
                    )
                except Exception as error:  # noqa: BLE001 - the SDK's error for a 422
                    assert "must be" in str(error) or "422" in str(error), (options, error)
                else:
                    raise AssertionError(f"{options} was accepted")

    run_async(main(), timeout=30)
