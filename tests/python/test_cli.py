"""The `capstan` CLI against a real server, with the published Python SDK as the worker:
workflow start/list/describe/history/signal/query/cancel/terminate, worker and task-queue
listings, schedules, server health/info, `--output json` for scripts, the server's reason and
exit code 1 on errors, and shell completion.
"""
from __future__ import annotations

import asyncio
import json
import subprocess

from durable_workflow import workflow

from capstan_harness import capstan_binary, run_async, unique


@workflow.defn(name="cli.greeter")
class Greeter:
    def __init__(self) -> None:
        self.greeting = "hello"
        self.done = False

    @workflow.signal("finish")
    def finish(self, greeting: str) -> None:
        self.greeting = greeting
        self.done = True

    @workflow.query("greeting")
    def current(self) -> str:
        return self.greeting

    def run(self, ctx, name):
        yield ctx.wait_condition(lambda: self.done)
        return f"{self.greeting}, {name}"


def test_the_cli_drives_workflows_schedules_and_the_fleet(server_url, worker_url, run_worker):
    queue = unique("cli")
    workflow_id = unique("cli-wf")

    def cli(*args: str, output: str = "json") -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(capstan_binary()), *args, "--server", server_url, "--output", output],
            capture_output=True, text=True, timeout=60,
        )

    def ok(*args: str) -> dict:
        done = cli(*args)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return json.loads(done.stdout)

    async def main():
        async with run_worker(worker_url, queue, workflows=[Greeter]):
            started = await asyncio.to_thread(ok, "workflow", "start", "cli.greeter", "--task-queue", queue,
                                              "--workflow-id", workflow_id, "--input", '"Ada"')
            await asyncio.sleep(0.5)
            described = await asyncio.to_thread(ok, "workflow", "describe", workflow_id)
            answer = await asyncio.to_thread(ok, "workflow", "query", workflow_id, "greeting")
            signalled = await asyncio.to_thread(ok, "workflow", "signal", workflow_id, "finish", "--input", '["bonjour"]')
            for _ in range(100):
                final = await asyncio.to_thread(ok, "workflow", "describe", workflow_id)
                if final["status"] == "completed":
                    break
                await asyncio.sleep(0.1)
            history = await asyncio.to_thread(cli, "workflow", "history", workflow_id, output="table")
            audit = await asyncio.to_thread(cli, "workflow", "audit", workflow_id, output="table")
            listed = await asyncio.to_thread(ok, "workflow", "list", "--type", "cli.greeter")
            workers = await asyncio.to_thread(ok, "worker", "list", "--task-queue", queue)
            queues = await asyncio.to_thread(cli, "task-queue", "describe", queue, output="table")
            other = unique("cli-other")
            await asyncio.to_thread(ok, "workflow", "start", "cli.greeter", "--task-queue", queue, "--workflow-id", other, "--input", '"Bob"')
            terminated = await asyncio.to_thread(ok, "workflow", "terminate", other, "--reason", "test")
        return started, described, answer, signalled, final, history, audit, listed, workers, queues, terminated

    started, described, answer, signalled, final, history, audit, listed, workers, queues, terminated = run_async(main(), timeout=120)
    assert started["workflow_id"] == workflow_id and started["outcome"] == "started_new"
    assert described["input"] == ["Ada"], described["input"]
    assert answer["result"] == "hello"
    assert signalled["outcome"] == "signal_received"
    assert final["status"] == "completed" and final["output"] == "bonjour, Ada", final.get("output")
    assert history.returncode == 0 and "WorkflowStarted" in history.stdout and "WorkflowCompleted" in history.stdout
    # Who did what: without authentication every request is the anonymous principal; a timer or
    # other server-caused event would read "by server".
    started_line = next(line for line in history.stdout.splitlines() if "WorkflowStarted" in line)
    assert started_line.rstrip().endswith("by anonymous"), history.stdout
    assert described["started_by"] == {"type": "server", "id": "anonymous"}, described["started_by"]
    assert audit.returncode == 0 and "workflow.query" in audit.stdout and "by anonymous" in audit.stdout \
        and "greeting" in audit.stdout, audit.stdout
    assert workflow_id in [w["workflow_id"] for w in listed["workflows"]]
    assert [w["task_queue"] for w in workers["workers"]] == [queue]
    assert queues.returncode == 0 and queue in queues.stdout and "BACKLOG" in queues.stdout
    assert terminated["outcome"] in ("terminated", "terminate_requested", "closed"), terminated

    # Schedules.
    schedule_id = unique("cli-sched")
    created = ok("schedule", "create", schedule_id, "--type", "cli.greeter", "--task-queue", queue, "--cron", "0 3 * * *", "--paused")
    assert created["outcome"] == "created"
    assert ok("schedule", "describe", schedule_id)["status"] == "paused"
    assert ok("schedule", "resume", schedule_id)["outcome"] == "resumed"
    assert ok("schedule", "delete", schedule_id)["outcome"] == "deleted"
    assert [e["event_type"] for e in ok("schedule", "history", schedule_id)["events"]][-1] == "ScheduleDeleted"

    # Priority and fairness: a start's options, and the shares of a queue nothing polls.
    idle_queue = unique("cli-idle")
    ok("workflow", "start", "cli.greeter", "--task-queue", idle_queue, "--workflow-id", unique("cli-urgent"),
       "--input", '"Cy"', "--priority", "1", "--fairness-key", "Tenant-CLI", "--fairness-weight", "3")
    shares = cli("task-queue", "shares", idle_queue, output="table")
    assert shares.returncode == 0, shares.stderr
    row = next(line for line in shares.stdout.splitlines() if "tenant-cli" in line)
    assert row.split()[:5] == ["workflow", "1", "tenant-cli", "3", "1"], shares.stdout
    limited = ok("task-queue", "limit", idle_queue, "--kind", "workflow", "--max-leased", "2", "--rate", "5")
    assert (limited["workflow_task"]["max_leased_tasks"], limited["workflow_task"]["dispatch_rate_per_second"]) == (2, 5.0)
    limits = cli("task-queue", "limits", idle_queue, output="table")
    row = next(line for line in limits.stdout.splitlines() if line.startswith("workflow"))
    assert row.split()[:4] == ["workflow", "5.0", "5", "2"], limits.stdout
    keyed = ok(
        "task-queue", "limit", idle_queue, "--kind", "activity", "--key-max-leased", "2",
        "--key-limit", "Tenant-B:rate=4,max_leased=5", "--weight", "tenant-a=3",
    )["activity_task"]
    assert keyed["fairness_key_limits"]["max_leased_tasks"] == 2, keyed
    assert keyed["fairness_key_overrides"]["tenant-b"] == {"dispatch_rate_per_second": 4.0, "dispatch_burst": None, "max_leased_tasks": 5}, keyed
    assert keyed["fairness_weights"] == {"tenant-a": 3}, keyed
    bad = cli("task-queue", "limit", idle_queue, "--kind", "activity", "--key-limit", "tenant-b:speed=4")
    assert bad.returncode != 0 and "speed" in bad.stderr, bad.stderr
    assert ok("task-queue", "limit", idle_queue, "--kind", "activity", "--clear")["activity_task"] is None
    assert ok("task-queue", "limit", idle_queue, "--kind", "workflow", "--clear")["workflow_task"] is None
    refused = cli("workflow", "start", "cli.greeter", "--task-queue", idle_queue, "--priority", "12")
    assert refused.returncode == 1 and "422 validation_failed" in refused.stderr, refused.stderr

    # The server, errors and completion.
    assert ok("server", "health")["status"] == "serving"
    assert ok("server", "info")["worker_protocol"]["version"]
    missing = cli("workflow", "describe", unique("nope"))
    assert missing.returncode == 1 and "404 instance_not_found" in missing.stderr, missing.stderr
    completion = subprocess.run([str(capstan_binary()), "completion", "bash"], capture_output=True, text=True, timeout=30)
    assert completion.returncode == 0 and "capstan" in completion.stdout and "workflow" in completion.stdout
