"""Storage faults, for real, on both databases.

SQLite: the server's data directory is a small tmpfs that a filler file fills. PostgreSQL: the
database lives in a tablespace on a small tmpfs that Capstan's own writes fill. PostgreSQL and
MariaDB: the database turns read-only under the server (what a failover to a demoted primary
looks like).

While writes fail they are refused with 503 `storage_unavailable` (the DW error shape) and
nothing refused is committed; reads keep working; the process stays up. Once the fault is gone
`/api/ready` (a probe write must commit) reports ready and writes go through without a restart;
after a restart every acknowledged workflow is there and `capstan verify` finds every chain
intact. (A nearly full disk can still take the probe's small write, so readiness while full is
not asserted; `crates/server/tests/http_api.rs` injects failing commits to test it, and the
read-only database asserts it here.)

Mounting needs root (CI runs as root); elsewhere those tests are skipped with that reason.
"""
from __future__ import annotations

import os
import subprocess
import time

from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from capstan_harness import (
    CONTROL_HEADERS,
    CapstanServer,
    MariadbScratchDatabase,
    ScratchDatabase,
    capstan_binary,
    envelope,
    postgres_admin_url,
    psql,
    unique,
    with_database,
)


def fill(path, reserve_bytes: int) -> None:
    """Writes `path` until the filesystem is full, then gives `reserve_bytes` back."""
    chunk = b"\0" * (64 * 1024)
    # Unbuffered: a buffered file keeps the bytes a full disk refused and fails again on close.
    with open(path, "wb", buffering=0) as filler:
        try:
            while True:
                filler.write(chunk)
        except OSError:
            pass
    size = os.path.getsize(path)
    os.truncate(path, max(0, size - reserve_bytes))


def start(http: httpx.Client, prefix: str, payload: dict) -> tuple[str, httpx.Response]:
    workflow_id = unique(prefix)
    response = http.post("/api/workflows", json={"workflow_id": workflow_id, "workflow_type": "t", "task_queue": "q", "input": payload})
    return workflow_id, response


def wait_for(check, seconds: float = 15.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return check()


def drop_connections(admin_url: str, database: str) -> None:
    psql(admin_url, f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{database}' AND pid <> pg_backend_pid()")


def assert_refused_cleanly(refused: list[tuple[str, httpx.Response]], described_refused: list[int]) -> None:
    """Every refusal was a retryable 503 in the DW shape, and none of them was committed."""
    assert len(refused) >= 3, "the fault never refused a write"
    for _, response in refused:
        body = response.json()
        assert response.status_code == 503 and body["reason"] == "storage_unavailable" and body["message"], response.text
    assert described_refused == [404] * len(refused), "a refused start was committed"


def assert_survives_a_kill(server: CapstanServer, acknowledged: list[str], *database: str) -> None:
    """The process lived through the fault; after a SIGKILL and restart every acknowledged
    workflow is there, and the offline verifier (on `database`: `--data-dir DIR` or
    `--database URL`) finds every chain intact."""
    assert server.proc is not None and server.proc.poll() is None, "the server died of the fault"
    server.kill()
    server.start()
    with httpx.Client(base_url=server.url, headers=CONTROL_HEADERS, timeout=30.0) as http:
        missing = [w for w in acknowledged if http.get(f"/api/workflows/{w}").status_code != 200]
    assert missing == [], f"acknowledged workflows lost: {missing}"
    server.terminate()
    verify = subprocess.run([str(capstan_binary()), "verify", *database], capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0, verify.stdout + verify.stderr


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

        assert_survives_a_kill(server, acknowledged, "--data-dir", str(mount / "data"))
    finally:
        if server.running:
            server.terminate()
        subprocess.run(["umount", "-l", str(mount)], check=False)


class ReadOnlyPostgres:
    """Every session of the database read-only, its connections dropped (a failover to a demoted
    primary)."""

    def __init__(self) -> None:
        self.admin = postgres_admin_url()
        self.database = ScratchDatabase(self.admin).create()
        self.url = self.database.url

    def set_read_only(self, on: bool) -> None:
        change = "SET default_transaction_read_only = on" if on else "RESET default_transaction_read_only"
        psql(self.admin, f"ALTER DATABASE {self.database.name} {change}")
        drop_connections(self.admin, self.database.name)

    def close(self) -> None:
        psql(self.admin, f"ALTER DATABASE {self.database.name} RESET default_transaction_read_only")
        self.database.drop()


class ReadOnlyMariadb:
    """The server read-only (`read_only`, which binds every user without the READ ONLY ADMIN
    privilege: Capstan connects as a user of its own) and the user's connections killed."""

    def __init__(self) -> None:
        admin = os.environ.get("CAPSTAN_TEST_MYSQL_URL", "").strip()
        assert admin, "CAPSTAN_TEST_MYSQL_URL is not set: start scripts/mariadb.sh and export the URL it prints"
        self.database = MariadbScratchDatabase(admin).create()
        self.user = self.database.name
        self.admin_sql(f"CREATE USER '{self.user}'@'%'")
        self.admin_sql(f"GRANT ALL PRIVILEGES ON {self.database.name}.* TO '{self.user}'@'%'")
        parts = urlsplit(self.database.url)
        self.url = urlunsplit(parts._replace(netloc=f"{self.user}@{parts.hostname}:{parts.port}"))

    def admin_sql(self, sql: str) -> str:
        done = subprocess.run([*self.database.client_args(), "-e", sql], capture_output=True, text=True, timeout=30,
                              check=False)
        assert done.returncode == 0, f"mariadb failed running {sql!r}: {done.stderr.strip()}"
        return done.stdout

    def set_read_only(self, on: bool) -> None:
        self.admin_sql(f"SET GLOBAL read_only = {'ON' if on else 'OFF'}")
        ids = self.admin_sql(f"SELECT id FROM information_schema.processlist WHERE user = '{self.user}'").split()
        for connection in ids:
            subprocess.run([*self.database.client_args(), "-e", f"KILL CONNECTION {connection}"],
                           capture_output=True, timeout=30, check=False)  # it may be gone already

    def close(self) -> None:
        self.admin_sql("SET GLOBAL read_only = OFF")
        self.admin_sql(f"DROP USER IF EXISTS '{self.user}'@'%'")
        self.database.drop()


@pytest.mark.parametrize("kind", [ReadOnlyPostgres, ReadOnlyMariadb], ids=["postgres", "mariadb"])
def test_a_read_only_database_is_not_ready_refuses_writes_and_recovers(tmp_path, kind):
    """The database refuses writes under a running server (read-only, as a demoted primary is;
    its connections drop, as at a failover)."""
    database = kind()
    server = CapstanServer(tmp_path / "data", tmp_path / "capstan.log", database=database.url)
    try:
        server.start()
        acknowledged: list[str] = []
        with httpx.Client(base_url=server.url, headers=CONTROL_HEADERS, timeout=30.0) as http:
            for _ in range(5):
                workflow_id, response = start(http, "before-read-only", envelope(["before"]))
                assert response.status_code == 201, response.text
                acknowledged.append(workflow_id)
            assert http.get("/api/ready").status_code == 200

            database.set_read_only(True)
            refused: list[tuple[str, httpx.Response]] = []
            for _ in range(50):
                workflow_id, response = start(http, "while-read-only", envelope(["during"]))
                if response.status_code == 201:
                    acknowledged.append(workflow_id)
                else:
                    refused.append((workflow_id, response))
                if len(refused) >= 3:
                    break
            ready_while = http.get("/api/ready")
            listed = http.get("/api/workflows", params={"page_size": 5})
            described = http.get(f"/api/workflows/{acknowledged[0]}")

            database.set_read_only(False)
            assert wait_for(lambda: http.get("/api/ready").status_code == 200), "not ready after the database took writes again"
            after, started_after = start(http, "after-read-only", envelope(["after"]))
            acknowledged.append(after)
            described_refused = [http.get(f"/api/workflows/{w}").status_code for w, _ in refused]

        assert_refused_cleanly(refused, described_refused)
        assert ready_while.status_code == 503 and ready_while.json()["status"] == "not_ready", ready_while.text
        assert listed.status_code == 200 and described.status_code == 200, "reads keep working on a read-only database"
        assert started_after.status_code == 201, started_after.text
        assert_survives_a_kill(server, acknowledged, "--database", database.url)
    finally:
        if server.running:
            server.terminate()
        database.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_full_postgres_tablespace_refuses_writes_cleanly_and_recovers(tmp_path):
    """PostgreSQL out of space for real: the database's tablespace is a 12 MiB tmpfs (its WAL is
    elsewhere, so the server itself stays up) that workflow starts fill until the table files
    cannot grow; then the tmpfs grows and everything resumes."""
    admin = postgres_admin_url()
    name = f"capstan_full_{unique('x').split('-')[1]}"
    # The PostgreSQL server runs as `postgres` and must reach the directory: not under pytest's
    # private temp dir.
    mount = f"/tmp/{name}"
    os.makedirs(mount)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m,mode=0700", "tmpfs", mount], check=True)
    subprocess.run(["chown", "postgres:postgres", mount], check=True)
    url = with_database(admin, name)
    server = CapstanServer(tmp_path / "data", tmp_path / "capstan.log", database=url)
    try:
        psql(admin, f"CREATE TABLESPACE {name} LOCATION '{mount}'")
        psql(admin, f"CREATE DATABASE {name} TABLESPACE {name}")
        server.start()
        acknowledged: list[str] = []
        refused: list[tuple[str, httpx.Response]] = []
        with httpx.Client(base_url=server.url, headers=CONTROL_HEADERS, timeout=30.0) as http:
            for _ in range(2000):
                # Incompressible input, so the table files grow as fast as the bytes sent.
                workflow_id, response = start(http, "filling", envelope([os.urandom(24_000).hex()]))
                if response.status_code == 201:
                    acknowledged.append(workflow_id)
                    continue
                refused.append((workflow_id, response))
                if len(refused) >= 3:
                    break
            listed = http.get("/api/workflows", params={"page_size": 5})
            described = http.get(f"/api/workflows/{acknowledged[0]}")

            subprocess.run(["mount", "-o", "remount,size=64m", mount], check=True)
            assert wait_for(lambda: http.get("/api/ready").status_code == 200), "not ready after space came back"
            after, started_after = start(http, "after-full", envelope(["after"]))
            acknowledged.append(after)
            described_refused = [http.get(f"/api/workflows/{w}").status_code for w, _ in refused]

        assert_refused_cleanly(refused, described_refused)
        assert "No space left on device" in server.log_path.read_text(errors="replace"), "the refusals were not the full disk"
        assert listed.status_code == 200 and described.status_code == 200, "reads keep working while full"
        assert started_after.status_code == 201, started_after.text
        assert_survives_a_kill(server, acknowledged, "--database", url)
    finally:
        if server.running:
            server.terminate()
        psql(admin, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        psql(admin, f"DROP TABLESPACE IF EXISTS {name}")
        subprocess.run(["umount", "-l", mount], check=False)
        os.rmdir(mount)
