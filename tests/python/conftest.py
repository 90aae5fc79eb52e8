"""Fixtures for the Python SDK end-to-end tests against a real ``capstan``.

* ``capstan_server`` (module scope): a fresh ``capstan serve`` on a free port
  with its own temp data dir, healthy before the first test of the module
  runs, SIGTERMed after the last one.
* ``server_url``: that server's origin, e.g. ``http://127.0.0.1:43121``
  (pass it to ``Client``; the SDK appends ``/api`` itself).
* ``server_factory``: per-test servers with extra flags (e.g. short leases)
  that the test may SIGKILL and restart on the same port and data dir.
* ``run_worker``: ``async with run_worker(url, queue, workflows=[...],
  activities=[...]) as worker:`` runs an SDK ``Worker`` as a background
  asyncio task and stops it cleanly afterwards.

The binary is ``target/debug/capstan`` unless ``CAPSTAN_BIN`` points
elsewhere. A missing binary fails the tests (they are never skipped).

When a test fails, the tail of every server log it used is attached to the
failure report; the full logs stay in pytest's temp directory.
"""
from __future__ import annotations

import faulthandler
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from capstan_harness import (  # noqa: E402
    CapstanServer,
    CapstanStartupError,
    running_worker,
)

# Last-resort guard: a test that is still running after this many seconds
# dumps every thread's stack and ends the pytest process (the server
# children die with it). Tests carry their own, much shorter, timeouts.
HARD_TEST_TIMEOUT = float(os.environ.get("CAPSTAN_TEST_HARD_TIMEOUT", "300"))


def _shutdown(server: CapstanServer) -> None:
    died_on_its_own = server.unexpected_exit_code()
    code = server.terminate()
    if died_on_its_own is not None:
        raise AssertionError(
            f"capstan exited on its own with code {died_on_its_own} during the tests\n"
            f"--- log tail ---\n{server.log_tail()}"
        )
    if code not in (0, None):
        warnings.warn(
            f"capstan exited with code {code} after SIGTERM (expected a graceful 0); log: {server.log_path}",
            stacklevel=1,
        )


def _start_or_fail(server: CapstanServer) -> None:
    problem: str | None = None
    try:
        server.start()
    except CapstanStartupError as error:
        problem = str(error)
    if problem is not None:
        pytest.fail(problem, pytrace=False)


@pytest.fixture(scope="module")
def capstan_server(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[CapstanServer]:
    base = tmp_path_factory.mktemp(f"capstan-{request.module.__name__.rsplit('.', 1)[-1]}")
    server = CapstanServer(base / "data", base / "capstan.log")
    _start_or_fail(server)
    try:
        yield server
    finally:
        _shutdown(server)


@pytest.fixture(scope="module")
def server_url(capstan_server: CapstanServer) -> str:
    return capstan_server.url


class ServerFactory:
    """Creates per-test servers; all of them are shut down at test teardown."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.servers: list[CapstanServer] = []

    def create(self, *extra_args: str, start: bool = True) -> CapstanServer:
        index = len(self.servers) + 1
        server = CapstanServer(
            self.base / f"data-{index}", self.base / f"capstan-{index}.log", extra_args=extra_args,
        )
        self.servers.append(server)
        if start:
            _start_or_fail(server)
        return server

    def shutdown_all(self) -> None:
        problems = []
        for server in self.servers:
            try:
                _shutdown(server)
            except Exception as error:  # noqa: BLE001 - collect, then report all
                problems.append(str(error))
        if problems:
            raise AssertionError("\n\n".join(problems))


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[ServerFactory]:
    factory = ServerFactory(tmp_path)
    try:
        yield factory
    finally:
        factory.shutdown_all()


@pytest.fixture
def run_worker():  # noqa: ANN201 - returns the async context manager factory
    return running_worker


@pytest.fixture(autouse=True)
def _hang_guard() -> Iterator[None]:
    faulthandler.dump_traceback_later(HARD_TEST_TIMEOUT, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def _servers_used_by(item: pytest.Item) -> list[CapstanServer]:
    found: list[CapstanServer] = []
    for value in getattr(item, "funcargs", {}).values():
        if isinstance(value, CapstanServer):
            found.append(value)
        elif isinstance(value, ServerFactory):
            found.extend(value.servers)
    unique_servers: list[CapstanServer] = []
    for server in found:
        if all(server is not seen for seen in unique_servers):
            unique_servers.append(server)
    return unique_servers


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # noqa: ANN201
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    for server in _servers_used_by(item):
        lifecycle = "; ".join(server.history) or "never started"
        report.sections.append((
            f"capstan log {server.log_path} ({lifecycle})",
            server.log_tail(300),
        ))
