"""A full disk, for real: the server's data directory is a small tmpfs that a filler file fills.

While the disk is full, writes are refused with 503 `storage_unavailable` (the DW error shape)
and nothing refused is committed; reads keep working. Once space is freed, `/api/ready` (which
after a failed commit probes with a real write) reports ready and writes go through; after a
restart every acknowledged workflow is there and `capstan verify` finds every chain intact.
(A nearly full disk can still take the probe's small write, so readiness while full is not
asserted here; `crates/server/tests/http_api.rs` injects failing commits to test it.)

Mounting needs root (CI runs as root); elsewhere the test is skipped with that reason.
"""
from __future__ import annotations

import os
import subprocess
import time

import httpx
import pytest

from capstan_harness import CONTROL_HEADERS, CapstanServer, capstan_binary, envelope, unique


def fill(path, reserve_bytes: int) -> None:
    """Writes `path` until the filesystem is full, then gives `reserve_bytes` back."""
    chunk = b"\0" * (64 * 1024)
    with open(path, "wb") as filler:
        try:
            while True:
                filler.write(chunk)
                filler.flush()
        except OSError:
            pass
    size = os.path.getsize(path)
    os.truncate(path, max(0, size - reserve_bytes))


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_full_disk_refuses_writes_cleanly_and_recovers(tmp_path):
    mount = tmp_path / "small-disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], check=True)
    server = CapstanServer(mount / "data", tmp_path / "capstan.log")
    try:
        server.start()
        acknowledged: list[str] = []
        refused: list[tuple[str, dict]] = []
        big = envelope(["x" * 60_000])
        with httpx.Client(base_url=server.url, headers=CONTROL_HEADERS, timeout=30.0) as http:
            for _ in range(20):
                workflow_id = unique("before-full")
                assert http.post("/api/workflows", json={"workflow_id": workflow_id, "workflow_type": "t", "task_queue": "q", "input": big}).status_code == 201
                acknowledged.append(workflow_id)
            fill(mount / "filler", reserve_bytes=256 * 1024)
            for _ in range(400):
                workflow_id = unique("while-full")
                response = http.post("/api/workflows", json={"workflow_id": workflow_id, "workflow_type": "t", "task_queue": "q", "input": big})
                if response.status_code == 201:
                    acknowledged.append(workflow_id)
                    continue
                refused.append((workflow_id, response.json()))
                if len(refused) >= 3:
                    break
            assert refused, "the disk never filled up"
            for workflow_id, body in refused:
                assert body["reason"] == "storage_unavailable" and body["message"], body
            described_refused = [http.get(f"/api/workflows/{workflow_id}").status_code for workflow_id, _ in refused]
            listed = http.get("/api/workflows", params={"page_size": 5})

            os.remove(mount / "filler")
            deadline = time.monotonic() + 10
            while http.get("/api/ready").status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.2)
            ready_after = http.get("/api/ready")
            after = unique("after-full")
            started_after = http.post("/api/workflows", json={"workflow_id": after, "workflow_type": "t", "task_queue": "q", "input": big})
            acknowledged.append(after)

        assert described_refused == [404] * len(refused), "a refused start was committed"
        assert listed.status_code == 200, "reads keep working on a full disk"
        assert ready_after.status_code == 200, ready_after.text
        assert started_after.status_code == 201, started_after.text

        server.terminate()
        server.start()
        with httpx.Client(base_url=server.url, headers=CONTROL_HEADERS, timeout=30.0) as http:
            missing = [w for w in acknowledged if http.get(f"/api/workflows/{w}").status_code != 200]
        assert missing == [], f"acknowledged workflows lost: {missing}"
        server.terminate()
        verify = subprocess.run([str(capstan_binary()), "verify", "--data-dir", str(mount / "data")], capture_output=True, text=True, timeout=60)
        assert verify.returncode == 0, verify.stdout + verify.stderr
    finally:
        if server.running:
            server.terminate()
        subprocess.run(["umount", "-l", str(mount)], check=False)
