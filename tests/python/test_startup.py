"""Start-up, with real processes: a ``--database`` value that names no database Capstan
speaks is refused before anything is created, a SQLite database is served by one process at
a time (the second is told which process owns it), and task queue limits from the config file
hold from the start.
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import httpx

from capstan_harness import CONTROL_HEADERS, CapstanServer, capstan_binary, free_port


def run_serve(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Runs ``capstan serve`` in ``tmp_path`` and waits for it to exit (a refusal is immediate)."""
    return subprocess.run(
        [str(capstan_binary()), "serve", "--listen", f"127.0.0.1:{free_port()}", *args],
        cwd=tmp_path,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_a_database_url_of_another_scheme_is_refused_and_creates_nothing(tmp_path: Path) -> None:
    for value in ["mysqll://capstan:secret@127.0.0.1:43943/capstan", "postgress://postgres@127.0.0.1/db", "sqlite://"]:
        done = run_serve(tmp_path, "--database", value)
        assert done.returncode == 2, (value, done.returncode, done.stderr)
        assert "accepted: a file path, sqlite://PATH, postgres://" in done.stderr, done.stderr
        assert "secret" not in done.stderr, "a password is never echoed"
        assert list(tmp_path.iterdir()) == [], f"{value!r} created {list(tmp_path.iterdir())}"
    # The environment twin is held to the same rule.
    done = run_serve(tmp_path, env={"CAPSTAN_DATABASE": "maria://u@h/db"})
    assert done.returncode == 2, done.stderr
    assert 'unknown scheme "maria"' in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_second_process_on_one_sqlite_database_is_refused_naming_the_owner(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first = CapstanServer(data_dir, tmp_path / "first.log")
    first.start()
    try:
        pid = first.proc.pid if first.proc else None
        # The same data dir, and the same file named by its sqlite:// URL.
        for args in (["--data-dir", str(data_dir)], ["--database", f"sqlite://{data_dir / 'capstan.db'}"]):
            done = run_serve(tmp_path, *args)
            assert done.returncode == 2, (args, done.returncode, done.stderr)
            assert "already served by another process" in done.stderr, done.stderr
            assert f"pid {pid} " in done.stderr, done.stderr
        # The first keeps serving, and its start line names the file it opened.
        assert httpx.get(first.health_url, timeout=5).status_code == 200
        log = re.sub(r"\x1b\[[0-9;]*m", "", first.log_text())
        assert f"database={(data_dir / 'capstan.db').resolve()}" in log, first.log_tail()
    finally:
        first.kill()
    # A killed owner leaves no stale lock: the next process takes the database.
    second = CapstanServer(data_dir, tmp_path / "second.log")
    second.start()
    try:
        assert httpx.get(second.health_url, timeout=5).status_code == 200
    finally:
        second.terminate()


def test_limits_from_the_configuration_hold_from_the_start(server_factory, tmp_path):
    """A queue's limits set by the config file are in force when the server starts, and the
    API shows them (an operator may change them live until the next start)."""
    config = tmp_path / "limits.toml"
    config.write_text(
        '[[task_queue_limits]]\ntask_queue = "configured"\nkind = "activity"\nmax_leased_tasks = 7\n'
        'fairness_key_limits = { max_leased_tasks = 2 }\nfairness_weights = { "Tenant-A" = 3 }\n'
    )
    server = server_factory.create("--config", str(config))
    shown = httpx.get(f"{server.url}/api/task-queues/configured/limits", headers=CONTROL_HEADERS, timeout=10).json()
    activity = shown["activity_task"]
    assert activity["max_leased_tasks"] == 7, shown
    assert activity["fairness_key_limits"]["max_leased_tasks"] == 2, shown
    assert activity["fairness_weights"] == {"tenant-a": 3}, shown
    assert shown["workflow_task"] is None
