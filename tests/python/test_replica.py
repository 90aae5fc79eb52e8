"""Backups of an embedded (SQLite) server, with real processes (docs/backup.md).

- The continuous replica: a server replicating to a local S3-compatible server (moto) while
  SDK clients start workflows and SDK workers run them is killed with SIGKILL and its data
  directory deleted; ``capstan restore`` rebuilds it from the replica into a new directory.
  Every start acknowledged before the restored point is there, the recovery point is measured
  and bounded, ``capstan verify`` is clean, and the same workers finish the open runs on a
  server started on the restored directory.
- ``capstan backup`` of a running server under load, external payloads included: the backup
  verifies, restores, and the restored server serves what was acknowledged before it began.
"""
from __future__ import annotations

import asyncio
import datetime
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import boto3
import httpx
from durable_workflow import activity, workflow

from capstan_harness import (
    BackgroundWorker,
    CapstanServer,
    capstan_binary,
    make_client,
    moto_server,
    run_async,
    unique,
    wait_result,
)

INTERVAL_MS = 250
# A commit is in the replica one interval after it, plus the upload to a local server.
RECOVERY_POINT_BOUND_SECONDS = 2.0
LOAD_SECONDS = 6.0
STARTERS = 3
AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
BIG = 40_000


@activity.defn(name="replica.reserve")
async def reserve(index: int) -> str:
    return f"reserved-{index}"


@workflow.defn(name="replica.order")
class Order:
    """Reserves (an activity), then waits for ``ship``: open at the crash, finished after."""

    def __init__(self) -> None:
        self.shipped = False

    @workflow.signal("ship")
    def ship(self) -> None:
        self.shipped = True

    def run(self, ctx, index, blob=""):
        reserved = yield ctx.schedule_activity("replica.reserve", [index])
        yield ctx.wait_condition(lambda: self.shipped)
        return f"{reserved} shipped{len(blob)}"


def capstan(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(capstan_binary()), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


async def start_under_load(url: str, queue: str, prefix: str, acked: list[tuple[str, float]],
                           stop: asyncio.Event) -> None:
    """Starters starting workflows until ``stop`` (or the server goes away): each start the
    server acknowledged is recorded with the time it was acknowledged."""

    async def starter(index: int) -> None:
        async with make_client(url, timeout=5.0) as client:
            n = 0
            while not stop.is_set():
                workflow_id = f"{prefix}-{index}-{n}"
                n += 1
                try:
                    await client.start_workflow(workflow_type="replica.order", task_queue=queue,
                                                workflow_id=workflow_id, input=[n])
                except Exception:  # noqa: BLE001 - the server was killed under this start
                    return
                acked.append((workflow_id, time.time()))
                await asyncio.sleep(0.03)

    await asyncio.gather(*(starter(i) for i in range(STARTERS)))


async def finish_all(url: str, workflow_ids: list[str], workers: list[BackgroundWorker]) -> list[str]:
    async with make_client(url, patient=True) as client:
        handles = [client.get_workflow_handle(workflow_id) for workflow_id in workflow_ids]
        for handle in handles:
            await handle.signal("ship", [])
        return list(await asyncio.gather(*(wait_result(h, timeout=120, workers=workers) for h in handles)))


async def present(url: str, workflow_ids: list[str]) -> set[str]:
    found = set()
    async with make_client(url, patient=True) as client:
        for workflow_id in workflow_ids:
            try:
                await client.get_workflow_handle(workflow_id).describe()
            except Exception:  # noqa: BLE001 - not found
                continue
            found.add(workflow_id)
    return found


def test_a_destroyed_server_restores_from_its_s3_replica_and_its_workers_finish_the_open_runs(tmp_path, server_factory):
    with moto_server() as endpoint:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                     aws_access_key_id="testing", aws_secret_access_key="testing").create_bucket(Bucket="capstan-replica")
        replica = f"s3://capstan-replica/node-a?endpoint={endpoint}&region=us-east-1"
        server = CapstanServer(
            tmp_path / "data", tmp_path / "capstan.log", env=AWS,
            extra_args=["--replicate-to", replica, "--replica-interval-ms", str(INTERVAL_MS),
                        "--workflow-task-lease-seconds", "5", "--activity-task-lease-seconds", "5"],
        )
        server_factory.servers.append(server)
        server.start()
        queue = unique("replica-q")
        prefix = unique("replica-wf")
        acked: list[tuple[str, float]] = []

        async def under_load() -> tuple[float, list[BackgroundWorker]]:
            workers = [await BackgroundWorker(server.url, queue, workflows=[Order], activities=[reserve]).start()
                       for _ in range(2)]
            stop = asyncio.Event()
            load = asyncio.create_task(start_under_load(server.url, queue, prefix, acked, stop))
            await asyncio.sleep(LOAD_SECONDS)
            metrics = httpx.get(f"{server.url}/metrics", timeout=5).text
            shipped = re.search(r"^capstan_replica_segments_total (\d+)", metrics, re.M)
            assert shipped and int(shipped.group(1)) > 0, metrics[-2000:]
            lag = re.search(r"^capstan_replica_lag_seconds (\d+)", metrics, re.M)
            assert lag and int(lag.group(1)) <= 2, "the replica keeps up under this load"
            killed_at = time.time()
            server.kill()
            stop.set()
            await load
            return killed_at, workers

        async def scenario():
            killed_at, workers = await under_load()
            shutil.rmtree(server.data_dir)
            restored_dir = tmp_path / "restored"
            restored = await asyncio.to_thread(capstan, "restore", "--from", replica, "--data-dir", str(restored_dir), env=AWS)
            assert restored.returncode == 0, restored.stdout + restored.stderr
            through = re.search(r"through (\S+)", restored.stdout)
            assert through, restored.stdout
            restored_through = datetime.datetime.fromisoformat(through.group(1).replace("Z", "+00:00")).timestamp()
            assert "verified" in restored.stdout, restored.stdout

            # The same port: the workers, still running, find the restored server where they left.
            again = CapstanServer(restored_dir, tmp_path / "restored.log", port=server.port,
                                  extra_args=["--workflow-task-lease-seconds", "5", "--activity-task-lease-seconds", "5"])
            server_factory.servers.append(again)
            again.start()  # from the main thread: a server dies with the thread that spawned it
            ids = [workflow_id for workflow_id, _ in acked]
            found = await present(again.url, ids)
            lost = [(w, at) for w, at in acked if w not in found]
            # A start acknowledged before the point the replica had read is committed in it.
            early = [(w, at) for w, at in lost if at < restored_through]
            assert not early, f"acknowledged before the recovery point and lost: {early[:5]}"
            recovery_point = killed_at - restored_through
            print(f"\nreplica: {len(acked)} starts acknowledged in {LOAD_SECONDS}s under load; restored through "
                  f"{recovery_point * 1000:.0f} ms before the kill (interval {INTERVAL_MS} ms); "
                  f"{len(lost)} acknowledged after that point lost")
            assert recovery_point <= RECOVERY_POINT_BOUND_SECONDS, recovery_point
            assert len(found) >= 20, f"too little load to prove anything: {len(found)}"

            replaced = 0
            for index, worker in enumerate(workers):
                if not worker.alive:
                    workers[index] = await BackgroundWorker(again.url, queue, workflows=[Order], activities=[reserve]).start()
                    replaced += 1
            try:
                results = await finish_all(again.url, sorted(found), workers)
            finally:
                for worker in workers:
                    await worker.stop()
            assert all(result.endswith("shipped0") for result in results), results[:5]
            assert replaced == 0, "the workers rode out the crash and the restore"

        run_async(scenario(), timeout=300)


def test_an_online_backup_under_load_verifies_restores_and_keeps_its_external_payloads(tmp_path, server_factory):
    server = server_factory.create()
    queue = unique("backup-q")
    prefix = unique("backup-wf")
    acked: list[tuple[str, float]] = []
    backup_dir = tmp_path / "backup"

    async def scenario():
        async with make_client(server.url) as client:
            # Payloads above 1 KiB go to the server's own directory (DATA_DIR/external-payloads).
            await client.set_namespace_external_storage("default", driver="local", threshold_bytes=1024, config={})
            big = await client.start_workflow(workflow_type="replica.order", task_queue=queue,
                                              workflow_id=f"{prefix}-big", input=[0, "x" * BIG])
        stop = asyncio.Event()
        load = asyncio.create_task(start_under_load(server.url, queue, prefix, acked, stop))
        await asyncio.sleep(1.0)
        began = time.time()
        backup = await asyncio.to_thread(capstan, "backup", "--to", str(backup_dir), "--data-dir", str(server.data_dir))
        await asyncio.sleep(0.5)
        stop.set()
        await load
        assert backup.returncode == 0, backup.stdout + backup.stderr
        assert any(p.is_file() for p in (backup_dir / "external-payloads").rglob("*")), "the payloads are in the backup"

        verified = await asyncio.to_thread(capstan, "verify", "--data-dir", str(backup_dir))
        assert verified.returncode == 0, verified.stdout + verified.stderr
        restored_dir = tmp_path / "restored"
        restored = await asyncio.to_thread(capstan, "restore", "--from", str(backup_dir), "--data-dir", str(restored_dir))
        assert restored.returncode == 0, restored.stdout + restored.stderr
        again = CapstanServer(restored_dir, tmp_path / "restored.log")
        server_factory.servers.append(again)
        # Started from this (the main) thread: a server dies with the thread that spawned it.
        again.start()
        before = [w for w, at in acked if at < began]
        assert len(before) >= 10, "load before the backup"
        found = await present(again.url, [big.workflow_id, *before])
        missing = [w for w in [big.workflow_id, *before] if w not in found]
        assert not missing, f"acknowledged before the backup began and not in it: {missing[:5]}"
        workers = [await BackgroundWorker(again.url, queue, workflows=[Order], activities=[reserve]).start()]
        try:
            results = await finish_all(again.url, [big.workflow_id], workers)
        finally:
            await workers[0].stop()
        assert results == [f"reserved-0 shipped{BIG}"], results
        refused = await asyncio.to_thread(capstan, "restore", "--from", str(backup_dir), "--data-dir", str(restored_dir))
        assert refused.returncode == 2 and "already exists" in refused.stderr, refused.stderr

    run_async(scenario(), timeout=240)


def test_check_config_refuses_a_replica_it_could_not_make(tmp_path):
    for args, why in [
        (["--replicate-to", "ftp://host/backups"], "not a directory or an s3:// location"),
        (["--replicate-to", "s3://bucket/p?colour=red"], "unknown setting"),
        (["--replicate-to", str(tmp_path / "r"), "--database", "postgres://u@127.0.0.1:1/x"], "shared database"),
    ]:
        checked = capstan("serve", "--check-config", "--data-dir", str(tmp_path / "d"), *args)
        assert checked.returncode == 2 and why in checked.stderr, (args, checked.stderr)
    assert not (tmp_path / "r").exists(), "a check makes nothing"
    ok = capstan("serve", "--check-config", "--data-dir", str(tmp_path / "d"), "--replicate-to", str(tmp_path / "r"))
    assert ok.returncode == 0, ok.stderr
    assert not (tmp_path / "r").exists(), "a check makes nothing"
    missing = capstan("restore", "--from", str(tmp_path / "absent"), "--data-dir", str(tmp_path / "new"))
    assert missing.returncode == 2 and "no such directory" in missing.stderr, missing.stderr
    assert not (tmp_path / "absent").exists() and not (tmp_path / "new").exists(), "a refused restore leaves nothing"
