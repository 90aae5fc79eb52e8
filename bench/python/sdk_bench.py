#!/usr/bin/env python3
"""W1 / W10 through the published Python SDK (``durable-workflow``) against Capstan.

``capstan-bench`` (bench/loadgen) speaks the wire protocol directly from Rust and
shows what the server can do; this script shows what a user of the Python SDK
gets: workflows are started with ``Client.start_workflow`` and awaited with
``WorkflowHandle.result`` (which polls describe + history), and they are run by
stock SDK ``Worker`` objects in separate worker processes.

Workloads (the same as capstan-bench):

* ``w1``:  a workflow calling one activity that echoes its string input
  (``--payload-bytes``, 1 KiB by default) and returning the activity's result.
* ``w10``: ten sequential echo activities, each fed the previous result.
* ``wN`` with ``--steps K``: K sequential echo activities (a history that grows
  with K, for measuring replay and history transfer per step).

``--sticky-cache N`` gives every SDK ``Worker`` ``sticky_cache_capacity=N``
(sticky execution; 0, the default, is off). The worker processes count the
bytes of every HTTP response body they receive from the server and the
workflow-task polls and history-page fetches they make; the report gives them
per activity step (``bytes_served_per_step``) next to the server's CPU per step.

Every result is checked against the input. The report is one JSON object with
the same fields as ``capstan-bench --json`` (``workflows_per_s``,
``latency_ms.p50/p90/p99``, ``server_cpu_s_per_workflow``,
``server_peak_rss_mib``, ...) plus the worker and client processes' CPU.

Usage (from the repository root)::

    python3 -m venv /tmp/sdkvenv && /tmp/sdkvenv/bin/pip install durable-workflow==2.12.0
    /tmp/sdkvenv/bin/python bench/python/sdk_bench.py --workload w1 --workflows 500 --concurrency 50

Without ``--server`` it spawns ``target/release/capstan serve`` on a free port
with a fresh data directory and measures that process. With ``--server`` the
server is not measured (CPU and RSS are reported as null).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import procstats  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ECHO = "bench.echo"


# ── Workflow and activity definitions (imported lazily so --help works without the SDK) ──

def definitions():
    from durable_workflow import activity, workflow

    @activity.defn(name=ECHO)
    async def echo(value: str) -> str:
        return value

    @workflow.defn(name="bench.w1")
    class W1:
        def run(self, ctx, value):
            result = yield ctx.schedule_activity(ECHO, [value], start_to_close_timeout=60)
            return result

    @workflow.defn(name="bench.w10")
    class W10:
        def run(self, ctx, value):
            for _ in range(10):
                value = yield ctx.schedule_activity(ECHO, [value], start_to_close_timeout=60)
            return value

    @workflow.defn(name="bench.wN")
    class WN:
        def run(self, ctx, value, steps):
            for _ in range(steps):
                value = yield ctx.schedule_activity(ECHO, [value], start_to_close_timeout=60)
            return value

    return [W1, W10, WN], [echo]


# ── What the worker receives: response body bytes and request counts, by kind ──

def _request_kind(path: str) -> str:
    if path.endswith("/worker/workflow-tasks/poll"):
        return "workflow_poll"
    if path.startswith("/api/worker/workflow-tasks/") and path.endswith("/history"):
        return "history_fetch"
    if path.endswith("/worker/activity-tasks/poll"):
        return "activity_poll"
    return "other"


def count_responses(client, stats: dict) -> None:
    """Wrap the transport of the SDK client's ``httpx.AsyncClient`` so every response body is counted.

    ``stats[kind] = [requests, body bytes]``; bytes are as received (before any decoding)."""
    import httpx

    class CountingStream(httpx.AsyncByteStream):
        def __init__(self, inner, entry: list) -> None:
            self.inner, self.entry = inner, entry

        async def __aiter__(self):
            async for chunk in self.inner:
                self.entry[1] += len(chunk)
                yield chunk

        async def aclose(self) -> None:
            await self.inner.aclose()

    class CountingTransport(httpx.AsyncBaseTransport):
        def __init__(self, inner) -> None:
            self.inner = inner

        async def handle_async_request(self, request):
            response = await self.inner.handle_async_request(request)
            entry = stats.setdefault(_request_kind(request.url.path), [0, 0])
            entry[0] += 1
            response.stream = CountingStream(response.stream, entry)
            return response

        async def aclose(self) -> None:
            await self.inner.aclose()

    http = client._http  # the SDK's one httpx.AsyncClient (Client.__init__)
    http._transport = CountingTransport(http._transport)
    http._mounts = {pattern: CountingTransport(t) if t is not None else None for pattern, t in http._mounts.items()}


# ── Worker process ──

async def worker_main(args: argparse.Namespace) -> int:
    from durable_workflow import Client, Worker

    workflows, activities = definitions()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stats: dict = {}
    async with Client(args.server, namespace="default") as client:
        count_responses(client, stats)
        workers = [
            Worker(
                client,
                task_queue=args.task_queue,
                workflows=workflows,
                activities=activities,
                worker_id=f"{args.task_queue}-w{os.getpid()}-{i}",
                poll_timeout=args.poll_timeout,
                max_concurrent_workflow_tasks=args.max_concurrent_tasks,
                max_concurrent_activity_tasks=args.max_concurrent_tasks,
                sticky_cache_capacity=args.sticky_cache,
                shutdown_timeout=5.0,
            )
            for i in range(args.workers)
        ]
        runs = [asyncio.create_task(worker.run()) for worker in workers]
        # Registration finished (the SDK sets this event after /worker/register).
        for worker in workers:
            done = getattr(worker, "_registration_done", None)
            if done is not None:
                await asyncio.wait_for(done.wait(), timeout=30)
        for entry in stats.values():  # count from READY on: registration is not part of the run
            entry[0] = entry[1] = 0
        print("READY", flush=True)
        stopper = asyncio.create_task(stop.wait())
        finished, _ = await asyncio.wait([stopper, *runs], return_when=asyncio.FIRST_COMPLETED)
        failed = [run for run in runs if run in finished and not run.cancelled() and run.exception()]
        for worker in workers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(worker.stop(), timeout=10)
        for run in runs:
            if not run.done():
                run.cancel()
            with contextlib.suppress(BaseException):
                await run
        sticky: dict = {}
        for worker in workers:
            for name, value in worker.sticky_cache_metrics().items():
                sticky[name] = sticky.get(name, 0) + value
        print("STATS " + json.dumps({"responses": stats, "sticky_cache": sticky}), flush=True)
        if failed:
            print(f"worker stopped with {failed[0].exception()!r}", file=sys.stderr)
            return 1
    return 0


# ── Server ──

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen | None, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode} before becoming healthy")
        with contextlib.suppress(Exception):
            with urllib.request.urlopen(f"{url}/api/health", timeout=2) as response:
                if response.status == 200:
                    return
        time.sleep(0.05)
    raise SystemExit(f"server at {url} did not become healthy within {timeout:.0f}s")


class SpawnedServer:
    def __init__(self, binary: str, extra_args: str | None) -> None:
        if not os.path.exists(binary):
            raise SystemExit(f"{binary} not found (build it: cargo build --release -p capstan)")
        self.data = tempfile.mkdtemp(prefix="capstan-sdk-bench-")
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        command = [binary, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", self.data]
        if extra_args:
            command += extra_args.split()
        env = dict(os.environ, CAPSTAN_LOG="warn")
        self.proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
        wait_healthy(self.url, self.proc)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.data, ignore_errors=True)


# ── Load driver ──

def start_workers(args: argparse.Namespace, url: str, queue: str) -> list[subprocess.Popen]:
    procs = []
    for _ in range(args.worker_processes):
        command = [
            sys.executable, os.path.abspath(__file__), "--worker-mode",
            "--server", url, "--task-queue", queue, "--workers", str(args.workers),
            "--max-concurrent-tasks", str(args.max_concurrent_tasks),
            "--poll-timeout", str(args.poll_timeout), "--sticky-cache", str(args.sticky_cache),
        ]
        procs.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True))
    for proc in procs:
        line = proc.stdout.readline() if proc.stdout else ""
        if line.strip() != "READY":
            for other in procs:
                other.kill()
            raise SystemExit(f"worker process failed to start (said {line!r}, exit {proc.poll()})")
    return procs


def stop_workers(procs: list[subprocess.Popen]) -> list[dict]:
    """Stop the worker processes; return the STATS each printed on the way out."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    reports = []
    for proc in procs:
        try:
            output, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        for line in (output or "").splitlines():
            if line.startswith("STATS "):
                reports.append(json.loads(line[len("STATS "):]))
    return reports


async def drive(args: argparse.Namespace, url: str, queue: str) -> dict:
    from durable_workflow import Client

    payload = "x" * args.payload_bytes
    workflow_type = f"bench.{args.workload}"
    extra_input = [args.steps] if args.workload == "wN" else []
    first_run: list[str] = []
    semaphore = asyncio.Semaphore(args.concurrency)
    latencies: list[float] = []
    problems: list[str] = []
    started = 0
    begin = time.perf_counter()
    cutoff = begin + args.max_seconds if args.max_seconds else None

    async with Client(url, namespace="default", timeout=120.0) as client:

        async def one(index: int) -> None:
            nonlocal started
            async with semaphore:
                if cutoff is not None and time.perf_counter() > cutoff:
                    return
                started += 1
                workflow_id = f"{queue}-{index}"
                began = time.perf_counter()
                try:
                    handle = await client.start_workflow(
                        workflow_type=workflow_type, task_queue=queue, workflow_id=workflow_id,
                        input=[payload, *extra_input],
                    )
                    result = await handle.result(poll_interval=args.result_poll_interval, timeout=args.result_timeout)
                except Exception as error:  # noqa: BLE001 - every failure is a reported problem
                    problems.append(f"{workflow_id}: {type(error).__name__}: {error}")
                    return
                if result != payload:
                    problems.append(f"{workflow_id}: unexpected result {str(result)[:60]!r}")
                    return
                latencies.append((time.perf_counter() - began) * 1000.0)
                if index == 0 and handle.run_id:
                    first_run.extend([workflow_id, handle.run_id])

        await asyncio.gather(*(one(i) for i in range(args.workflows)))
        elapsed = time.perf_counter() - begin
    latencies.sort()
    return {
        "elapsed_s": elapsed,
        "started": started,
        "completed": len(latencies),
        "latency_ms": {
            "p50": procstats.percentile(latencies, 0.5),
            "p90": procstats.percentile(latencies, 0.9),
            "p99": procstats.percentile(latencies, 0.99),
        },
        "problems": problems,
        "first_run": first_run,
    }


async def count_history(url: str, first_run: list[str]) -> int | None:
    """Events in one completed run's history (all pages); fetched after the measurement."""
    from durable_workflow import Client

    if len(first_run) != 2:
        return None
    with contextlib.suppress(Exception):
        events, token = 0, None
        async with Client(url, namespace="default") as client:
            for _ in range(1000):
                page = await client.get_history(*first_run, page_size=1000, next_page_token=token)
                events += len(page.get("events") or page.get("history_events") or [])
                token = page.get("next_page_token")
                if not token:
                    return events
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=["w1", "w10", "wN"], default="w1")
    parser.add_argument("--steps", type=int, help="wN: sequential echo activities per workflow")
    parser.add_argument("--sticky-cache", type=int, default=0, metavar="N",
                        help="sticky_cache_capacity of every SDK Worker (0 = sticky execution off)")
    parser.add_argument("--server", help="Server origin to drive; without it a capstan serve is spawned")
    parser.add_argument("--spawn", default=os.path.join(REPO_ROOT, "target/release/capstan"),
                        help="capstan binary to spawn when --server is absent")
    parser.add_argument("--server-args", help="extra `capstan serve` arguments for the spawned server")
    parser.add_argument("--workflows", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=50, help="workflows in flight at once")
    parser.add_argument("--payload-bytes", type=int, default=1024)
    parser.add_argument("--max-seconds", type=float, help="start no workflow after this many seconds")
    parser.add_argument("--worker-processes", type=int, default=1, help="separate worker processes")
    parser.add_argument("--workers", type=int, default=1, help="SDK Worker objects per worker process")
    parser.add_argument("--max-concurrent-tasks", type=int, default=10,
                        help="max_concurrent_workflow_tasks and max_concurrent_activity_tasks (SDK default 10)")
    parser.add_argument("--poll-timeout", type=float, default=35.0, help="Worker long-poll timeout (SDK default 35)")
    parser.add_argument("--result-poll-interval", type=float, default=0.5,
                        help="WorkflowHandle.result poll interval in seconds (default: the SDK's, 0.5)")
    parser.add_argument("--result-timeout", type=float, default=300.0)
    parser.add_argument("--json", action="store_true", help="print the report as one JSON line")
    parser.add_argument("--worker-mode", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--task-queue", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.workload == "wN" and (args.steps is None or args.steps < 1):
        parser.error("--workload wN needs --steps K (K >= 1)")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    if args.worker_mode:
        return asyncio.run(worker_main(args))

    def interrupt(signum, frame):  # noqa: ARG001 - SIGTERM (e.g. `timeout`) runs the `finally` cleanup
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    server = None
    if args.server:
        url = args.server.rstrip("/")
        wait_healthy(url, None)
    else:
        server = SpawnedServer(args.spawn, args.server_args)
        url = server.url
    sampler = procstats.RssSampler(server.proc.pid) if server else None
    queue = f"sdk-bench-{uuid.uuid4().hex[:8]}"
    workers: list[subprocess.Popen] = []
    worker_reports: list[dict] = []
    try:
        workers = start_workers(args, url, queue)
        server_cpu_before = procstats.cpu_seconds(server.proc.pid) if server else 0.0
        worker_cpu_before = sum(procstats.cpu_seconds(p.pid) for p in workers)
        client_cpu_before = time.process_time()
        outcome = asyncio.run(drive(args, url, queue))
        client_cpu = time.process_time() - client_cpu_before
        worker_cpu = sum(procstats.cpu_seconds(p.pid) for p in workers) - worker_cpu_before
        server_cpu = procstats.cpu_seconds(server.proc.pid) - server_cpu_before if server else None
        peak_rss = sampler.stop() if sampler else None
        history_events = asyncio.run(count_history(url, outcome["first_run"]))
    finally:
        worker_reports = stop_workers(workers)
        if server:
            server.close()

    completed = outcome["completed"]
    per_workflow = max(completed, 1)
    steps = {"w1": 1, "w10": 10}.get(args.workload, args.steps)
    activities = completed * steps
    per_step = max(activities, 1)
    responses: dict = {}
    sticky: dict = {}
    for worker_report in worker_reports:
        for kind, (requests, body_bytes) in worker_report["responses"].items():
            entry = responses.setdefault(kind, {"requests": 0, "bytes": 0})
            entry["requests"] += requests
            entry["bytes"] += body_bytes
        for name, value in worker_report["sticky_cache"].items():
            sticky[name] = sticky.get(name, 0) + value
    served = sum(entry["bytes"] for entry in responses.values())
    report = {
        "workload": args.workload,
        "driver": "python-sdk durable-workflow " + _sdk_version(),
        "server": f"spawned {args.spawn} {args.server_args or ''}".strip() if server else url,
        "workflows": args.workflows,
        "started": outcome["started"],
        "completed": completed,
        "concurrency": args.concurrency,
        "steps": steps,
        "sticky_cache_capacity": args.sticky_cache,
        "worker_processes": args.worker_processes,
        "workers": args.workers,
        "payload_bytes": args.payload_bytes,
        "result_poll_interval_s": args.result_poll_interval,
        "elapsed_s": outcome["elapsed_s"],
        "workflows_per_s": completed / outcome["elapsed_s"],
        "activities_per_s": activities / outcome["elapsed_s"],
        "latency_ms": outcome["latency_ms"],
        "server_cpu_s_per_workflow": server_cpu / per_workflow if server_cpu is not None else None,
        "server_peak_rss_mib": peak_rss,
        "worker_cpu_s_per_workflow": worker_cpu / per_workflow,
        "client_cpu_s_per_workflow": client_cpu / per_workflow,
        "server_cpu_ms_per_step": server_cpu * 1000.0 / per_step if server_cpu is not None else None,
        "worker_cpu_ms_per_step": worker_cpu * 1000.0 / per_step,
        "bytes_served_per_step": served / per_step if len(worker_reports) == len(workers) else None,
        "history_events_per_workflow": history_events,
        "worker_responses": responses,
        "sticky_cache": sticky,
        "verification_problems": len(outcome["problems"]),
    }
    for problem in outcome["problems"][:10]:
        print(problem, file=sys.stderr)
    print(json.dumps(report) if args.json else json.dumps(report, indent=2))
    return 0 if not outcome["problems"] and completed == outcome["started"] > 0 else 1


def _sdk_version() -> str:
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        return version("durable-workflow")
    return "?"


if __name__ == "__main__":
    sys.exit(main())
