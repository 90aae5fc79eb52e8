"""Capstan quickstart: a Python worker, a workflow, and a result.

Capstan speaks the Durable Workflow v2 wire protocol, so the stock Python SDK
(``durable-workflow`` on PyPI) works against it unchanged. This script is the
smallest complete round trip:

1. it defines an activity (``compose_greeting``), which is ordinary code that
   may do I/O, and a workflow (``GreetingWorkflow``), which is deterministic
   code that only orchestrates;
2. it runs an SDK ``Worker`` that polls Capstan for workflow and activity
   tasks on the task queue ``quickstart``;
3. it starts one workflow through the SDK ``Client``, waits for the result,
   prints it, stops the worker and exits.

Run it
------

Start a server in one terminal (from the repository root)::

    cargo build
    ./target/debug/capstan serve --listen 127.0.0.1:8080 --data-dir ./capstan-data

Then, in another terminal::

    python -m venv .venv && . .venv/bin/activate
    pip install durable-workflow==2.12.0
    python examples/python_worker.py            # or: python examples/python_worker.py Ada

Expected output (the workflow id differs on every run)::

    started workflow greeting-3f2a9c1b7d4e (run 01J...)
    result: Hello, World!

Configuration
-------------

``DURABLE_WORKFLOW_SERVER_URL``
    Server origin, default ``http://127.0.0.1:8080``. Give the bare origin;
    the SDK adds ``/api`` itself.
``DURABLE_WORKFLOW_NAMESPACE``
    Namespace, default ``default`` (it always exists).
``DURABLE_WORKFLOW_AUTH_TOKEN``
    Bearer token, only when the server was started with authentication.

Things to notice
----------------

* Workflows are classes with a synchronous generator ``run(self, ctx, ...)``.
  Each ``yield`` hands a durable command to the server (here
  ``ctx.schedule_activity``) and resumes with its result. Never ``await``
  inside a workflow and never do I/O there: the workflow is replayed from
  its history whenever a worker picks it up again.
* Activities and workflows are registered under language-neutral names
  (``quickstart.greeting``); those names, not the Python class names, are
  what the server and other SDKs see.
* Because the run is durable you can stop this script (or the server) in the
  middle and start it again: the server keeps the history in ``--data-dir``
  and a worker finishes the workflow from where it stopped.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import uuid

import httpx
from durable_workflow import Client, Worker, activity, workflow

SERVER_URL = os.environ.get("DURABLE_WORKFLOW_SERVER_URL", "http://127.0.0.1:8080")
NAMESPACE = os.environ.get("DURABLE_WORKFLOW_NAMESPACE", "default")
AUTH_TOKEN = os.environ.get("DURABLE_WORKFLOW_AUTH_TOKEN") or None
TASK_QUEUE = "quickstart"


@activity.defn(name="quickstart.compose_greeting")
def compose_greeting(greeting: str, name: str) -> str:
    # Activities are where side effects belong (HTTP calls, database writes...).
    return f"{greeting}, {name}!"


@workflow.defn(name="quickstart.greeting")
class GreetingWorkflow:
    def run(self, ctx, name):
        message = yield ctx.schedule_activity(
            "quickstart.compose_greeting",
            ["Hello", name],
            start_to_close_timeout=30,
        )
        return message


async def main(name: str) -> int:
    async with Client(SERVER_URL, token=AUTH_TOKEN, namespace=NAMESPACE) as client:
        try:
            await client.health()
        except httpx.HTTPError as error:
            print(
                f"cannot reach a server at {SERVER_URL} ({type(error).__name__}). Start one with\n"
                "    ./target/debug/capstan serve --listen 127.0.0.1:8080 --data-dir ./capstan-data\n"
                "or point DURABLE_WORKFLOW_SERVER_URL at it.",
                file=sys.stderr,
            )
            return 1

        worker = Worker(
            client,
            task_queue=TASK_QUEUE,
            workflows=[GreetingWorkflow],
            activities=[compose_greeting],
        )
        worker_task = asyncio.create_task(worker.run())
        try:
            handle = await client.start_workflow(
                workflow_type="quickstart.greeting",
                task_queue=TASK_QUEUE,
                workflow_id=f"greeting-{uuid.uuid4().hex[:12]}",
                input=[name],
            )
            print(f"started workflow {handle.workflow_id} (run {handle.run_id})")

            # Wait for the result, but notice at once if the worker stops
            # (for example because the server refused to register it).
            result_task = asyncio.create_task(handle.result(timeout=60))
            done, _ = await asyncio.wait({result_task, worker_task}, return_when=asyncio.FIRST_COMPLETED)
            if result_task not in done:
                result_task.cancel()
                error = worker_task.exception() if not worker_task.cancelled() else None
                print(f"the worker stopped before the workflow finished: {error!r}", file=sys.stderr)
                return 1
            print(f"result: {result_task.result()}")
            return 0
        finally:
            await worker.stop()
            if not worker_task.done():
                worker_task.cancel()
            with contextlib.suppress(BaseException):
                await worker_task


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "World")))
