"""Pausing a run end to end: the published Python SDK's worker (``durable-workflow==2.12.0``)
runs a workflow of three activities that waits for a signal after the first; the run is paused
from the ``capstan`` CLI there. The signal is accepted into history while it is paused, but the
worker gets nothing of the run; once resumed it finishes as if nothing had happened, each step
run exactly once.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
from collections import Counter

from durable_workflow import activity, workflow

from capstan_harness import (
    assert_history_invariants, capstan_binary, events_of, fetch_history_raw, make_client, run_async, unique,
    wait_result,
)

RUNS: Counter = Counter()


@activity.defn(name="pause.step")
def step(key: str, n: int) -> int:
    RUNS[(key, n)] += 1
    return n * 10


@workflow.defn(name="pause.steps")
class Steps:
    def __init__(self) -> None:
        self.notes: list[str] = []

    @workflow.signal("note")
    def note(self, text: str) -> None:
        self.notes.append(text)

    def run(self, ctx, key):
        results = [(yield ctx.schedule_activity("pause.step", [key, 1]))]
        # Waits for a note: it comes while the run is paused.
        yield ctx.wait_condition(lambda: len(self.notes) > 0)
        for n in (2, 3):
            results.append((yield ctx.schedule_activity("pause.step", [key, n])))
        return [results, self.notes]


def test_a_paused_workflow_waits_and_then_finishes_on_the_sdk_worker(server_url, worker_url, run_worker):
    queue = unique("pause")
    key = unique("key")

    def cli(*args: str) -> dict:
        done = subprocess.run([str(capstan_binary()), *args, "--server", server_url, "--output", "json"],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return json.loads(done.stdout)

    async def completed_steps(handle) -> int:
        history = await fetch_history_raw(server_url, handle.workflow_id, handle.run_id)
        return len(events_of(history, "ActivityCompleted"))

    async def main():
        async with run_worker(worker_url, queue, workflows=[Steps], activities=[step]) as worker:
            async with make_client(server_url) as client:
                handle = await client.start_workflow(workflow_type="pause.steps", task_queue=queue,
                                                     workflow_id=unique("pause-wf"), input=[key])
                for _ in range(200):
                    if await completed_steps(handle) >= 1:
                        break
                    await asyncio.sleep(0.05)
                await asyncio.sleep(0.3)
                paused = await asyncio.to_thread(cli, "workflow", "pause", handle.workflow_id, "--reason", "maintenance")
                at_pause = await completed_steps(handle)
                await client.signal_workflow(handle.workflow_id, "note", args=["while paused"])
                await asyncio.sleep(2.0)
                still = await completed_steps(handle)
                held_history = await fetch_history_raw(server_url, handle.workflow_id, handle.run_id)
                described = await asyncio.to_thread(cli, "workflow", "describe", handle.workflow_id)
                listed = await asyncio.to_thread(cli, "workflow", "list", "--status", "paused")
                resumed = await asyncio.to_thread(cli, "workflow", "resume", handle.workflow_id)
                result = await wait_result(handle, timeout=30, workers=[worker])
                history = await fetch_history_raw(server_url, handle.workflow_id, handle.run_id)
        return paused, at_pause, still, held_history, described, listed, resumed, result, history, handle

    paused, at_pause, still, held_history, described, listed, resumed, result, history, handle = run_async(main(), timeout=90)
    assert paused["outcome"] == "paused", paused
    assert (at_pause, still) == (1, 1), (at_pause, still)
    assert [e["event_type"] for e in held_history][-1] == "SignalReceived", held_history[-1]
    assert described["status"] in ("running", "waiting") and described["paused"] is True, described
    assert described["pause"]["reason"] == "maintenance", described["pause"]
    assert handle.workflow_id in [w["workflow_id"] for w in listed["workflows"]], listed
    assert resumed["outcome"] == "resumed", resumed
    assert result == [[10, 20, 30], ["while paused"]], result
    assert [RUNS[(key, n)] for n in (1, 2, 3)] == [1, 1, 1], RUNS
    assert_history_invariants(history, terminal="WorkflowCompleted")


def test_the_cli_runs_a_batch_over_a_query_and_follows_it(server_url):
    queue = unique("cli-batch")

    def cli(*args: str, output: str = "json") -> subprocess.CompletedProcess:
        return subprocess.run([str(capstan_binary()), *args, "--server", server_url, "--output", output],
                              capture_output=True, text=True, timeout=120)

    def ok(*args: str) -> dict:
        done = cli(*args)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return json.loads(done.stdout)

    for i in range(30):
        ok("workflow", "start", "cli.batched", "--task-queue", queue, "--workflow-id", f"{queue}-{i}")
    counted = ok("batch", "start", "terminate", "--task-queue", queue, "--status", "running", "--dry-run")
    assert counted["matched"] == 30, counted
    followed = cli("batch", "start", "terminate", "--task-queue", queue, "--status", "running",
                   "--reason", "cleanup", "--rate", "20", "--follow", output="table")
    assert followed.returncode == 0, (followed.stdout, followed.stderr)
    assert "completed" in followed.stdout and "terminate" in followed.stdout, followed.stdout
    [latest] = ok("batch", "list", "--limit", "1")["batch_operations"]
    assert (latest["state"], latest["matched"], latest["done"]) == ("completed", 30, 30), latest
    described = ok("batch", "describe", latest["batch_id"])
    assert described["request"]["reason"] == "cleanup", described
    listed = ok("workflow", "list", "--status", "failed")
    assert sum(1 for w in listed["workflows"] if w["task_queue"] == queue) == 30, listed
    refused = cli("batch", "describe", "no-such-batch")
    assert refused.returncode == 1 and "batch_operation_not_found" in refused.stderr, refused.stderr
