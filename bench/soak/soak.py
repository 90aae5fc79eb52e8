#!/usr/bin/env python3
"""Soak: Capstan under steady load while its workers and the server itself are killed.

For ``--duration`` seconds (an hour by default) a driver starts W1 workflows (one echo
activity, 1 KiB) at ``--rate`` per second (open loop; half of what the Python SDK worker
sustains, by default), stock DW Python SDK workers in separate processes run them, one worker
process is SIGKILLed every ``--kill-worker-every`` seconds (and replaced), and the server is
SIGKILLed and restarted on the same database every ``--restart-server-every`` seconds. Then the
driver stops starting and waits for every started workflow to finish.

Checked: every started workflow completes with its input echoed back (none lost, none
failed). Measured, every ``--sample-every`` seconds: the server's RSS and open file
descriptors; per 5-minute window: start→close latency p50/p99 (server timestamps) of the
workflows started in it. The JSON report goes to ``--out`` and a summary to stdout.

With ``--database postgres://…`` the server is ``--nodes`` Capstan processes sharing that
PostgreSQL database: the driver spreads its requests over them, workers are spread over them,
and the restarts take the nodes in turn (the others keep serving meanwhile). RSS and
descriptors are then sampled per node and reported for the highest node.

Usage (from the repository root)::

    cargo build --release -p capstan
    python3 -m venv /tmp/soakvenv && /tmp/soakvenv/bin/pip install durable-workflow==2.12.0 httpx
    /tmp/soakvenv/bin/python bench/soak/soak.py                      # the hour
    /tmp/soakvenv/bin/python bench/soak/soak.py --duration 120 --kill-worker-every 20 --restart-server-every 60   # a short form
    /tmp/soakvenv/bin/python bench/soak/soak.py --database postgres://postgres@127.0.0.1:54329/soak --nodes 2   # a cluster
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUEUE = "soak"
ECHO = "soak.echo"
CONTROL = {"X-Durable-Workflow-Control-Plane-Version": "2"}


# ── The worker process ──

def worker_process(server: str) -> int:
    from durable_workflow import Client, TransportRetryPolicy, Worker, activity, workflow

    @activity.defn(name=ECHO)
    async def echo(value: str) -> str:
        return value

    @workflow.defn(name="soak.w1")
    class W1:
        def run(self, ctx, value):
            result = yield ctx.schedule_activity(ECHO, [value], start_to_close_timeout=30)
            return result

    async def main() -> None:
        # Patient transport: the server is killed under it every few minutes.
        retry = TransportRetryPolicy(max_attempts=1000, initial_backoff_seconds=0.2, max_backoff_seconds=2.0)
        async with Client(server, namespace="default", retry_policy=retry, timeout=60.0) as client:
            worker = Worker(client, task_queue=QUEUE, workflows=[W1], activities=[echo],
                            worker_id=f"soak-{os.getpid()}", poll_timeout=10.0,
                            max_concurrent_workflow_tasks=20, max_concurrent_activity_tasks=20)
            await worker.run()

    while True:
        # A run() that ends (its client gave up during a long outage) starts over, as a
        # supervised worker service would.
        with contextlib.suppress(Exception):
            asyncio.run(main())
        time.sleep(1)


# ── Server ──

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    def __init__(self, binary: str, data: str, port: int, log_path: str, database: str | None = None) -> None:
        self.binary, self.data, self.port, self.database = binary, data, port, database
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(log_path, "ab")
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        command = [self.binary, "serve", "--listen", f"127.0.0.1:{self.port}", "--data-dir", self.data,
                   "--workflow-task-lease-seconds", "10", "--activity-task-lease-seconds", "30"]
        if self.database:
            command += ["--database", self.database]
        self.proc = subprocess.Popen(command, env=dict(os.environ, CAPSTAN_LOG="warn"), stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                with urllib.request.urlopen(f"{self.url}/api/ready", timeout=2) as response:
                    if response.status == 200:
                        return
            time.sleep(0.05)
        raise SystemExit("the server did not become ready")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stats(self) -> dict:
        pid = self.proc.pid if self.proc else None
        if pid is None:
            return {}
        rss = None
        with contextlib.suppress(OSError):
            for line in open(f"/proc/{pid}/status"):
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) / 1024
        fds = None
        with contextlib.suppress(OSError):
            fds = len(os.listdir(f"/proc/{pid}/fd"))
        return {"rss_mib": rss, "open_fds": fds}


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def parse_time(text: str) -> float:
    from datetime import datetime
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


async def drive(args: argparse.Namespace, servers: list[Server]) -> dict:
    import httpx
    from durable_workflow import serializer

    value = "x" * 1024
    workers: list[subprocess.Popen] = []

    spawned = 0

    def spawn_worker() -> None:
        nonlocal spawned
        node = servers[spawned % len(servers)]
        spawned += 1
        workers.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", node.url],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    for _ in range(args.worker_processes):
        spawn_worker()

    started: dict[str, float] = {}         # workflow id → when the driver first tried
    pending: set[str] = set()
    outcomes: dict[str, dict] = {}
    samples: list[dict] = []
    events: list[dict] = []
    begin = time.monotonic()
    next_kill = begin + args.kill_worker_every
    next_restart = begin + args.restart_server_every
    next_sample = begin
    counter = 0
    restarts = 0
    clients = [httpx.AsyncClient(base_url=node.url, headers=CONTROL, timeout=10.0) for node in servers]
    async with contextlib.AsyncExitStack() as stack:
        for client in clients:
            await stack.enter_async_context(client)

        def http_client() -> httpx.AsyncClient:
            # Any node serves any request; a killed one is retried on another.
            return random.choice(clients)

        async def start_one(workflow_id: str) -> None:
            body = {"workflow_id": workflow_id, "workflow_type": "soak.w1", "task_queue": QUEUE,
                    "input": serializer.envelope([value]), "duplicate_policy": "use-existing"}
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    response = await http_client().post("/api/workflows", json=body)
                    if response.status_code in (200, 201):
                        pending.add(workflow_id)
                        return
                await asyncio.sleep(0.2)

        async def check(batch: list[str]) -> None:
            for workflow_id in batch:
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    described = (await http_client().get(f"/api/workflows/{workflow_id}")).json()
                    if described.get("is_terminal"):
                        pending.discard(workflow_id)
                        output = serializer.decode_envelope(described["output_envelope"]) if described.get("output_envelope") else None
                        outcomes[workflow_id] = {
                            "status": described["status"],
                            "echoed": output == value,
                            "latency_s": parse_time(described["closed_at"]) - parse_time(described["started_at"]),
                            "started_at": started[workflow_id] - begin,
                        }

        starters: set[asyncio.Task] = set()
        while True:
            now = time.monotonic()
            elapsed = now - begin
            if elapsed < args.duration:
                due = int(elapsed * args.rate) - counter
                for _ in range(max(0, due)):
                    workflow_id = f"soak-{int(begin)}-{counter}"
                    counter += 1
                    started[workflow_id] = time.monotonic()
                    task = asyncio.create_task(start_one(workflow_id))
                    starters.add(task)
                    task.add_done_callback(starters.discard)
                if now >= next_kill and workers:
                    victim = workers.pop(random.randrange(len(workers)))
                    victim.kill()
                    victim.wait()
                    spawn_worker()
                    events.append({"at_s": round(elapsed, 1), "event": "worker SIGKILLed and replaced"})
                    next_kill += args.kill_worker_every
                if now >= next_restart:
                    node = servers[restarts % len(servers)]
                    restarts += 1
                    node.kill()
                    node.start()
                    events.append({"at_s": round(elapsed, 1), "event": f"server SIGKILLed and restarted (node {servers.index(node)})"})
                    next_restart += args.restart_server_every
            for proc in list(workers):
                if proc.poll() is not None:
                    workers.remove(proc)
                    spawn_worker()
                    events.append({"at_s": round(elapsed, 1), "event": "worker exited on its own; replaced"})
            if now >= next_sample:
                nodes = [node.stats() for node in servers]
                highest = {key: max((n.get(key) or 0 for n in nodes), default=None) for key in ("rss_mib", "open_fds")}
                samples.append({"at_s": round(elapsed, 1), **highest, "nodes": nodes, "started": counter,
                                "pending": len(pending), "finished": len(outcomes)})
                next_sample += args.sample_every
            oldest = sorted(pending, key=lambda w: started[w])[:200]
            await check(oldest)
            if elapsed >= args.duration and not starters and not pending:
                break
            if elapsed >= args.duration + args.drain:
                break
            await asyncio.sleep(0.5)

    for proc in workers:
        proc.kill()
        proc.wait()
    window = 300
    windows = []
    for start in range(0, int(args.duration) + 1, window):
        latencies = [o["latency_s"] for o in outcomes.values() if start <= o["started_at"] < start + window and o["status"] == "completed"]
        if latencies:
            windows.append({"from_s": start, "workflows": len(latencies),
                            "p50_ms": round(1000 * percentile(latencies, 0.5)), "p99_ms": round(1000 * percentile(latencies, 0.99))})
    steady = [s for s in samples if s.get("rss_mib") is not None]
    return {
        "duration_s": args.duration,
        "rate_per_s": args.rate,
        "started": counter,
        "completed": sum(1 for o in outcomes.values() if o["status"] == "completed" and o["echoed"]),
        "not_completed": sorted(w for w in started if w not in outcomes or outcomes[w]["status"] != "completed")[:50],
        "wrong_results": sorted(w for w, o in outcomes.items() if o["status"] == "completed" and not o["echoed"])[:50],
        "worker_kills": sum(1 for e in events if e["event"].startswith("worker SIGKILLed")),
        "server_restarts": sum(1 for e in events if e["event"].startswith("server")),
        "rss_mib": {"first": steady[0]["rss_mib"] if steady else None, "last": steady[-1]["rss_mib"] if steady else None,
                     "max": max((s["rss_mib"] for s in steady), default=None),
                     "median": statistics.median(s["rss_mib"] for s in steady) if steady else None},
        "open_fds": {"first": steady[0]["open_fds"] if steady else None, "last": steady[-1]["open_fds"] if steady else None,
                     "max": max((s["open_fds"] or 0 for s in steady), default=None)},
        "latency_windows": windows,
        "samples": samples,
        "events": events,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--binary", default=os.path.join(REPO_ROOT, "target", "release", "capstan"))
    parser.add_argument("--duration", type=float, default=3600)
    parser.add_argument("--rate", type=float, default=30.0, help="workflow starts per second (W1)")
    parser.add_argument("--worker-processes", type=int, default=2)
    parser.add_argument("--kill-worker-every", type=float, default=60)
    parser.add_argument("--restart-server-every", type=float, default=600)
    parser.add_argument("--sample-every", type=float, default=10)
    parser.add_argument("--drain", type=float, default=300, help="seconds allowed after the load stops")
    parser.add_argument("--out", default="soak-report.json")
    parser.add_argument("--database", help="a PostgreSQL URL: the nodes share it (default: embedded SQLite)")
    parser.add_argument("--nodes", type=int, default=1, help="Capstan processes (more than one needs --database)")
    args = parser.parse_args()
    if args.worker:
        return worker_process(args.worker)
    if args.nodes > 1 and not args.database:
        parser.error("--nodes above 1 needs --database (nodes share a PostgreSQL database)")
    data = tempfile.mkdtemp(prefix="capstan-soak-")
    servers = [
        Server(args.binary, os.path.join(data, f"node-{i}"), free_port(), os.path.join(data, f"server-{i}.log"), args.database)
        for i in range(args.nodes)
    ]
    for node in servers:
        os.makedirs(node.data, exist_ok=True)
        node.start()
    try:
        report = asyncio.run(drive(args, servers))
        report["database"] = "postgresql" if args.database else "sqlite"
        report["nodes"] = args.nodes
    finally:
        for node in servers:
            node.kill()
    with open(args.out, "w") as out:
        json.dump(report, out, indent=2)
    summary = {k: v for k, v in report.items() if k not in ("samples", "events", "not_completed", "wrong_results")}
    print(json.dumps(summary, indent=2))
    print(f"not completed: {len(report['not_completed'])}, wrong results: {len(report['wrong_results'])}; data in {data}")
    return 0 if not report["not_completed"] and not report["wrong_results"] else 1


if __name__ == "__main__":
    sys.exit(main())
