"""W1 / W10 for the Temporal Python SDK (``temporalio``): the same shapes as Capstan's.

Kept in a module of its own so the Temporal workflow sandbox imports nothing else.
"""
from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow

TIMEOUT = timedelta(seconds=60)


@activity.defn(name="bench.echo")
async def echo(value: str) -> str:
    return value


@workflow.defn(name="bench.w1")
class W1:
    @workflow.run
    async def run(self, value: str) -> str:
        return await workflow.execute_activity(echo, value, start_to_close_timeout=TIMEOUT)


@workflow.defn(name="bench.w10")
class W10:
    @workflow.run
    async def run(self, value: str) -> str:
        for _ in range(10):
            value = await workflow.execute_activity(echo, value, start_to_close_timeout=TIMEOUT)
        return value
