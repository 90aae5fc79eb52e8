"""A Python SDK worker in its own process, for test_zombies.py (which freezes it with SIGSTOP).

Configured by the environment: ZOMBIE_URL (the node), ZOMBIE_QUEUE, ZOMBIE_NAME (its worker
id), ZOMBIE_MARKS (a file each activity attempt appends a line to when it starts), ZOMBIE_STICKY
(set: the worker keeps runs in a sticky replay cache).
"""
from __future__ import annotations

import asyncio
import logging
import os

from durable_workflow import ActivityRetryPolicy, Client, Worker, activity, workflow

NAME = os.environ["ZOMBIE_NAME"]
MARKS = os.environ["ZOMBIE_MARKS"]


@activity.defn(name="zombie.work")
async def zombie_work() -> str:
    with open(MARKS, "a") as marks:
        marks.write(f"{NAME} started attempt {activity.context().info.attempt_number}\n")
    await asyncio.sleep(1.0)  # the test freezes the first worker here
    return f"done by {NAME}"


@workflow.defn(name="zombie.worker")
class ZombieWorkflow:
    def run(self, ctx):
        result = yield ctx.schedule_activity(
            "zombie.work", [], retry_policy=ActivityRetryPolicy(max_attempts=4, backoff_seconds=[1, 1, 1]),
        )
        return result


@activity.defn(name="zombie.step")
async def zombie_step(label: str, n: int) -> str:
    return f"{label}{n}"


@workflow.defn(name="zombie.handoff")
class ZombieHandoff:
    """activity -> wait for `go` -> activity -> wait for a second `go` -> result."""

    def __init__(self) -> None:
        self.received: list[str] = []

    @workflow.signal("go")
    def go(self, value: str) -> None:
        self.received.append(value)

    def run(self, ctx, label):
        first = yield ctx.schedule_activity("zombie.step", [label, 1])
        yield ctx.wait_condition(lambda: len(self.received) >= 1)
        second = yield ctx.schedule_activity("zombie.step", [label, 2])
        yield ctx.wait_condition(lambda: len(self.received) >= 2)
        return [first, second, *self.received]


async def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    client = Client(os.environ["ZOMBIE_URL"], namespace="default", timeout=30.0)
    sticky = {"sticky_cache_capacity": 16, "sticky_cache_ttl_seconds": 60} if os.environ.get("ZOMBIE_STICKY") else {}
    worker = Worker(client, task_queue=os.environ["ZOMBIE_QUEUE"], workflows=[ZombieWorkflow, ZombieHandoff],
                    activities=[zombie_work, zombie_step], worker_id=NAME, poll_timeout=5.0, **sticky)
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main())
