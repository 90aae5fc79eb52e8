"""Shared pieces of the Python peer drivers (Temporal, DBOS): ports, processes, the
closed-loop driver and the report, with the same fields as ``capstan-bench --json``."""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Awaitable, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import procstats  # noqa: E402  (bench/python/procstats.py)

__all__ = ["procstats", "free_port", "wait_tcp", "terminate", "closed_loop", "report", "ok", "exit_cleanly_on_sigterm"]


def exit_cleanly_on_sigterm() -> None:
    """SIGTERM (e.g. from `timeout`) raises KeyboardInterrupt, so `finally` blocks stop servers."""

    def interrupt(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_tcp(port: int, proc: subprocess.Popen | None, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"process exited with {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError):
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        time.sleep(0.1)
    raise SystemExit(f"nothing listened on 127.0.0.1:{port} within {timeout:.0f}s")


def terminate(proc: subprocess.Popen | None, grace: float = 10.0) -> None:
    """SIGTERM the process (and its process group if it leads one), then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    group = os.getpgid(proc.pid) == proc.pid
    with contextlib.suppress(ProcessLookupError):
        (os.killpg if group else os.kill)(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            (os.killpg if group else os.kill)(proc.pid, signal.SIGKILL)
        proc.wait()


async def closed_loop(
    workflows: int, concurrency: int, one: Callable[[int], Awaitable[str]], expected: str,
    max_seconds: float | None = None,
) -> dict:
    """Runs ``one(i)`` for every workflow with ``concurrency`` in flight; ``one`` starts a
    workflow and returns its result. Times start→result and checks every result. With
    ``max_seconds``, no workflow is started after that time (those in flight finish)."""
    semaphore = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    problems: list[str] = []
    started = 0
    begin = time.perf_counter()
    cutoff = begin + max_seconds if max_seconds else None

    async def run(index: int) -> None:
        nonlocal started
        async with semaphore:
            if cutoff is not None and time.perf_counter() > cutoff:
                return
            started += 1
            began = time.perf_counter()
            try:
                result = await one(index)
            except Exception as error:  # noqa: BLE001 - every failure is a reported problem
                problems.append(f"workflow {index}: {type(error).__name__}: {error}")
                return
            if result != expected:
                problems.append(f"workflow {index}: unexpected result {str(result)[:60]!r}")
                return
            latencies.append((time.perf_counter() - began) * 1000.0)

    await asyncio.gather(*(run(i) for i in range(workflows)))
    elapsed = time.perf_counter() - begin
    latencies.sort()
    for problem in problems[:10]:
        print(problem, file=sys.stderr)
    return {
        "elapsed_s": elapsed,
        "started": started,
        "completed": len(latencies),
        "latency_ms": {p: procstats.percentile(latencies, q) for p, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))},
        "verification_problems": len(problems),
    }


def ok(outcome: dict) -> bool:
    """Every started workflow completed with the expected result."""
    return outcome["verification_problems"] == 0 and outcome["completed"] == outcome["started"] > 0


def report(*, workload: str, driver: str, server: str, workflows: int, concurrency: int, payload_bytes: int,
           outcome: dict, server_cpu: float | None, peak_rss: float | None, worker_cpu: float | None = None,
           extra: dict | None = None) -> dict:
    completed = outcome["completed"]
    per = max(completed, 1)
    activities = completed * (1 if workload == "w1" else 10)
    result = {
        "workload": workload,
        "driver": driver,
        "server": server,
        "workflows": workflows,
        "started": outcome.get("started", workflows),
        "completed": completed,
        "concurrency": concurrency,
        "payload_bytes": payload_bytes,
        "elapsed_s": outcome["elapsed_s"],
        "workflows_per_s": completed / outcome["elapsed_s"],
        "activities_per_s": activities / outcome["elapsed_s"],
        "latency_ms": outcome["latency_ms"],
        "server_cpu_s_per_workflow": server_cpu / per if server_cpu is not None else None,
        "server_peak_rss_mib": peak_rss,
        "worker_cpu_s_per_workflow": worker_cpu / per if worker_cpu is not None else None,
        "verification_problems": outcome["verification_problems"],
    }
    result.update(extra or {})
    return result
