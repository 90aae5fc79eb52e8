#!/usr/bin/env python3
"""W1 / W10 on DBOS (PyPI ``dbos``), a library rather than a server: optional peer.

DBOS runs workflows inside the application process and checkpoints every workflow
and step in its system database; here that is an on-disk SQLite file (DBOS's own
pragmas: rollback journal, SQLite's default synchronous=FULL). The "activity" is a
``@DBOS.step``. N workflows are kept in flight with ``DBOS.start_workflow_async``
+ ``handle.get_result()``, timed start→result, every result checked.

There is no server process to measure, so the CPU and RSS columns are those of
this whole process after launch (DBOS runtime, step execution and the load
driver), reported as ``server_*`` for the table; read them with that in mind.

``--database-url postgres://…`` puts the system database on PostgreSQL instead
(the ``dbos-pg`` row; the database must be empty, ``run.sh`` creates a fresh one
per run); the PostgreSQL server's own CPU is then measured by ``run.sh``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import procstats  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=["w1", "w10"], default="w1")
    parser.add_argument("--workflows", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--payload-bytes", type=int, default=1024)
    parser.add_argument("--max-seconds", type=float, help="start no workflow after this many seconds")
    parser.add_argument("--database-url", help="PostgreSQL system database (default: an SQLite file)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    common.exit_cleanly_on_sigterm()

    from dbos import DBOS

    data = tempfile.mkdtemp(prefix="capstan-compare-dbos-")
    DBOS(config={
        "name": "capstan-compare",
        "system_database_url": args.database_url or f"sqlite:///{os.path.join(data, 'dbos.sqlite')}",
        "log_level": "WARNING",
    })
    logging.getLogger("dbos").setLevel(logging.WARNING)

    @DBOS.step(name="bench.echo")
    async def echo(value: str) -> str:
        return value

    @DBOS.workflow(name="bench.w1")
    async def w1(value: str) -> str:
        return await echo(value)

    @DBOS.workflow(name="bench.w10")
    async def w10(value: str) -> str:
        for _ in range(10):
            value = await echo(value)
        return value

    workflow = w1 if args.workload == "w1" else w10
    payload = "x" * args.payload_bytes

    async def run() -> dict:
        DBOS.launch()

        async def one(index: int) -> str:
            handle = await DBOS.start_workflow_async(workflow, payload)
            return await handle.get_result()

        return await common.closed_loop(args.workflows, args.concurrency, one, payload, args.max_seconds)

    sampler = procstats.RssSampler(os.getpid())
    try:
        cpu_before = procstats.cpu_seconds(os.getpid())
        outcome = asyncio.run(run())
        cpu = procstats.cpu_seconds(os.getpid()) - cpu_before
        peak = sampler.stop()
    finally:
        DBOS.destroy()
        shutil.rmtree(data, ignore_errors=True)

    from importlib.metadata import version

    result = common.report(
        workload=args.workload,
        driver=f"dbos {version('dbos')} (in-process, @DBOS.step)",
        server="none: DBOS library in the driver process, "
        + ("PostgreSQL system database" if args.database_url else "SQLite system database"),
        workflows=args.workflows, concurrency=args.concurrency, payload_bytes=args.payload_bytes,
        outcome=outcome, server_cpu=cpu, peak_rss=peak,
        extra={"cpu_and_rss_are": "the whole driver process (DBOS runs in-process)"},
    )
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0 if common.ok(outcome) else 1


if __name__ == "__main__":
    sys.exit(main())
