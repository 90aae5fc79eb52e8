"""A provider call declared as a consequential action, and the workflow that makes it; shared by
``test_ledger_worker_killed.py`` and the worker process it kills.

Run as a script (``python ledger_provider.py URL QUEUE``) it is a worker process whose provider
call records itself and then never returns, like a worker that dies mid-call.
"""
from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from durable_workflow import ActivityRetryPolicy, activity, workflow

HANGS_ENV = "CAPSTAN_PROVIDER_HANGS"


@activity.defn(name="ledger.provider_call")
def provider_call(calls_path: str, amount: int) -> dict:
    with open(calls_path, "a", encoding="utf-8") as calls:
        calls.write(f"{os.getpid()} {amount}\n")
    if os.environ.get(HANGS_ENV):
        time.sleep(3600)  # the process is killed while the provider is working
    return {"charged": amount, "by": "provider"}


@workflow.defn(name="ledger.provider_checkout")
class ProviderCheckout:
    def run(self, ctx, calls_path, amount):
        receipt = yield ctx.schedule_activity(
            "ledger.provider_call", [calls_path, amount], start_to_close_timeout=3,
            retry_policy=ActivityRetryPolicy(max_attempts=5, backoff_seconds=[1]),
        )
        return {"receipt": receipt}


def call_count(calls_path: str | Path) -> int:
    path = Path(calls_path)
    return len(path.read_text(encoding="utf-8").splitlines()) if path.exists() else 0


async def _serve(url: str, queue: str) -> None:
    from capstan_harness import running_worker

    async with running_worker(url, queue, workflows=[ProviderCheckout], activities=[provider_call]):
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(_serve(sys.argv[1], sys.argv[2]))
