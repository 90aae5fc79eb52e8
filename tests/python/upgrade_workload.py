"""The workload of the upgrade fixture (``test_upgrade.py``): the workflows and activities an
earlier Capstan ran to write ``fixtures/upgrade-*/capstan.db``, and its generator.

They live in a module of their own, imported under one name by the generator and the test:
the Python SDK fingerprints a ``wait_condition`` predicate by its module and qualified name, so
a workflow replayed from the fixture must come from the same module as the one that wrote it.

Regenerate (only to move the fixture to a newer "previous release"):
``python tests/python/upgrade_workload.py OLD_CAPSTAN_BINARY tests/python/fixtures/upgrade-<commit>``.
"""
from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
from pathlib import Path

from durable_workflow import ActivityRetryPolicy, NonRetryableError, activity, workflow

from capstan_harness import BackgroundWorker, CapstanServer, events_of, fetch_history, make_client, wait_for_history, wait_result

QUEUE = "upgrade"
IDLE_QUEUE = "upgrade-idle"  # no worker polled it before the upgrade
NO_RETRY = ActivityRetryPolicy(max_attempts=1)
FIVE_YEARS = 5 * 365 * 24 * 3600


@activity.defn(name="upgrade.echo")
async def echo(value: str) -> str:
    return f"echo:{value}"


@activity.defn(name="upgrade.refuse")
async def refuse(value: str) -> str:
    raise NonRetryableError(f"refused {value}")


@workflow.defn(name="upgrade.greet")
class Greet:
    def run(self, ctx, name):
        return (yield ctx.schedule_activity("upgrade.echo", [name]))


@workflow.defn(name="upgrade.failing")
class Failing:
    def run(self, ctx, name):
        return (yield ctx.schedule_activity("upgrade.refuse", [name], retry_policy=NO_RETRY))


@workflow.defn(name="upgrade.signalled")
class Signalled:
    def __init__(self) -> None:
        self.received: list[str] = []

    @workflow.signal("go")
    def go(self, value: str) -> None:
        self.received.append(value)

    def run(self, ctx, name):
        first = yield ctx.schedule_activity("upgrade.echo", [name])
        yield ctx.wait_condition(lambda: len(self.received) >= 1)
        second = yield ctx.schedule_activity("upgrade.echo", [self.received[0]])
        return [first, second]


@workflow.defn(name="upgrade.sleeper")
class Sleeper:
    def run(self, ctx, seconds):
        yield ctx.sleep(seconds)
        return "slept"


WORKFLOWS = [Greet, Failing, Signalled, Sleeper]
ACTIVITIES = [echo, refuse]
# workflow id -> (type, queue, input)
OLD_RUNS = {
    "old-greet": ("upgrade.greet", QUEUE, ["ada"]),
    "old-failing": ("upgrade.failing", QUEUE, ["bob"]),
    "old-signalled": ("upgrade.signalled", QUEUE, ["cy"]),
    "old-sleeper": ("upgrade.sleeper", QUEUE, [20]),
    "old-pending": ("upgrade.greet", IDLE_QUEUE, ["dee"]),
}


# ── the fixture's generator ──────────────────────────────────────────────


async def write_fixture(binary: Path, out: Path, work: Path) -> None:
    server = CapstanServer(work / "data", work / "server.log", binary=binary)
    server.start()
    try:
        async with make_client(server.url) as client:
            worker = BackgroundWorker(server.url, QUEUE, workflows=WORKFLOWS, activities=ACTIVITIES)
            await worker.start()
            handles = {}
            for workflow_id, (workflow_type, queue, args) in OLD_RUNS.items():
                # Runs that outlive the fixture: the SDK's default timeouts (10 min a run) would
                # close them before any test opened it.
                handles[workflow_id] = await client.start_workflow(
                    workflow_type=workflow_type, task_queue=queue, workflow_id=workflow_id, input=args,
                    execution_timeout_seconds=FIVE_YEARS, run_timeout_seconds=FIVE_YEARS)
            await wait_result(handles["old-greet"], timeout=30, workers=[worker])
            for workflow_id, ready in {
                "old-failing": lambda evs: bool(events_of(evs, "WorkflowFailed")),
                "old-signalled": lambda evs: bool(events_of(evs, "ConditionWaitOpened")),
                "old-sleeper": lambda evs: bool(events_of(evs, "TimerScheduled")),
            }.items():
                await wait_for_history(client, workflow_id, handles[workflow_id].run_id, ready, what=workflow_id)
            await worker.stop()
            histories = {
                workflow_id: {"run_id": h.run_id, "events": await fetch_history(client, workflow_id, h.run_id)}
                for workflow_id, h in handles.items()
            }
    finally:
        server.terminate()
    out.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(work / "data" / "capstan.db") as source, sqlite3.connect(out / "capstan.db") as target:
        source.backup(target)
    (out / "histories.json").write_text(json.dumps(histories, indent=1, sort_keys=True))


def main(argv: list[str]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as work:
        asyncio.run(write_fixture(Path(argv[1]).resolve(), Path(argv[2]), Path(work)))


if __name__ == "__main__":
    # Through the module's own name, not __main__: the predicates' fingerprints name it.
    import upgrade_workload

    upgrade_workload.main(sys.argv)
