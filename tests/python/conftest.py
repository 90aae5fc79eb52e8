"""Fixtures for the Python SDK end-to-end tests against a real ``capstan``.

* ``capstan_nodes`` (module scope): the servers the module's tests share,
  healthy before the first test of the module runs, SIGTERMed after the
  last one. Which servers depends on ``CAPSTAN_TEST_BACKEND``:

  - unset / ``sqlite``: one ``capstan serve`` on a free port with its own
    temp data dir (embedded SQLite);
  - ``postgres``: a fresh database ``capstan_<random>`` on the PostgreSQL at
    ``CAPSTAN_TEST_POSTGRES_URL`` (required; the run fails without it) and
    TWO nodes sharing it. The database is dropped afterwards.
  - ``mariadb``: the same on the MariaDB at ``CAPSTAN_TEST_MYSQL_URL``.
* ``capstan_server`` / ``server_url``: the node the tests' ``Client`` talks
  to, e.g. ``http://127.0.0.1:43121`` (pass it to ``Client``; the SDK
  appends ``/api`` itself).
* ``worker_url``: the node SDK ``Worker``s poll. The same node as
  ``server_url`` with SQLite; the *other* node with PostgreSQL, so every
  workflow crosses nodes.
* ``server_factory``: per-test servers with extra flags (e.g. short leases)
  that the test may SIGKILL and restart on the same port and data dir.
* ``cluster_factory``: per-test clusters, each on its own fresh database; every
  test that uses it runs twice, on PostgreSQL and on MariaDB (whatever
  ``CAPSTAN_TEST_BACKEND`` says). ``cluster.database.kind`` says which.
* ``run_worker``: ``async with run_worker(url, queue, workflows=[...],
  activities=[...]) as worker:`` runs an SDK ``Worker`` as a background
  asyncio task and stops it cleanly afterwards.

The binary is ``target/debug/capstan`` unless ``CAPSTAN_BIN`` points
elsewhere. A missing binary or a missing PostgreSQL fails the tests (they
are never skipped).

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
    PostgresUnavailable,
    MariadbScratchDatabase,
    ScratchDatabase,
    postgres_admin_url,
    running_worker,
    start_all,
)

# Last-resort guard: a test that is still running after this many seconds
# dumps every thread's stack and ends the pytest process (the server
# children die with it). Tests carry their own, much shorter, timeouts.
HARD_TEST_TIMEOUT = float(os.environ.get("CAPSTAN_TEST_HARD_TIMEOUT", "300"))

BACKEND_ENV = "CAPSTAN_TEST_BACKEND"


def backend() -> str:
    """``sqlite`` (default), ``postgres`` or ``mariadb``, from ``CAPSTAN_TEST_BACKEND``."""
    value = os.environ.get(BACKEND_ENV, "").strip().lower() or "sqlite"
    if value not in ("sqlite", "postgres", "mariadb"):
        pytest.fail(f"{BACKEND_ENV}={value!r}: expected 'sqlite', 'postgres' or 'mariadb'", pytrace=False)
    return value


def _shared_database_or_fail(kind: str | None = None) -> ScratchDatabase | MariadbScratchDatabase:
    """A fresh database for a cluster: on ``kind`` (``postgres`` or ``mariadb``), else on the
    backend ``CAPSTAN_TEST_BACKEND`` names."""
    if (kind or backend()) == "postgres":
        return _create_database_or_fail()
    url = os.environ.get("CAPSTAN_TEST_MYSQL_URL", "").strip()
    if not url:
        pytest.fail("CAPSTAN_TEST_MYSQL_URL is not set: start scripts/mariadb.sh and export the URL it prints",
                    pytrace=False)
    return MariadbScratchDatabase(url).create()


def _postgres_or_fail() -> str:
    problem: str | None = None
    try:
        return postgres_admin_url()
    except PostgresUnavailable as error:
        problem = str(error)
    pytest.fail(problem, pytrace=False)


def _create_database_or_fail() -> ScratchDatabase:
    admin_url = _postgres_or_fail()
    problem: str | None = None
    try:
        return ScratchDatabase(admin_url).create()
    except PostgresUnavailable as error:
        problem = f"cannot create a scratch database: {error}"
    pytest.fail(problem, pytrace=False)


def _shutdown(server: CapstanServer) -> None:
    if server.killed_by_test:
        return  # SIGKILLed on purpose and left down
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


def _start_all_or_fail(servers: list[CapstanServer]) -> None:
    problem: str | None = None
    try:
        start_all(servers)
    except CapstanStartupError as error:
        problem = str(error)
    if problem is not None:
        pytest.fail(problem, pytrace=False)


def _shutdown_cluster(servers: list[CapstanServer], database: ScratchDatabase | MariadbScratchDatabase | None) -> None:
    problems = []
    for server in servers:
        try:
            _shutdown(server)
        except Exception as error:  # noqa: BLE001 - collect, then report all
            problems.append(f"node {server.name}: {error}")
    if database is not None:
        try:
            database.drop()
        except Exception as error:  # noqa: BLE001
            problems.append(f"could not drop {database.name}: {error}")
    if problems:
        raise AssertionError("\n\n".join(problems))


class Cluster(list):
    """The nodes of one cluster (a list of CapstanServer) and their database."""

    def __init__(self, servers: list[CapstanServer], database: ScratchDatabase | MariadbScratchDatabase | None) -> None:
        super().__init__(servers)
        self.database = database


@pytest.fixture(scope="module")
def capstan_nodes(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp(f"capstan-{request.module.__name__.rsplit('.', 1)[-1]}")
    if backend() in ("postgres", "mariadb"):
        database = _shared_database_or_fail()
        nodes = Cluster([
            CapstanServer(base / f"data-{label}", base / f"capstan-{label}.log", database=database.url, name=label)
            for label in ("worker-node", "client-node")
        ], database)
    else:
        nodes = Cluster([CapstanServer(base / "data", base / "capstan.log", name="sqlite")], None)
    try:
        _start_all_or_fail(nodes)
        yield nodes
    finally:
        _shutdown_cluster(nodes, nodes.database)


@pytest.fixture(scope="module")
def capstan_server(capstan_nodes: Cluster) -> CapstanServer:
    """The node the tests' Client talks to."""
    return capstan_nodes[-1]


@pytest.fixture(scope="module")
def server_url(capstan_server: CapstanServer) -> str:
    return capstan_server.url


@pytest.fixture(scope="module")
def worker_url(capstan_nodes: Cluster) -> str:
    """The node SDK Workers poll (== server_url unless the backend is postgres)."""
    return capstan_nodes[0].url


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


class ClusterFactory:
    """Creates per-test clusters on PostgreSQL or MariaDB (``kind``); at teardown every node is
    shut down and every scratch database dropped."""

    def __init__(self, base: Path, kind: str) -> None:
        self.base = base
        self.kind = kind
        self.clusters: list[Cluster] = []

    @property
    def servers(self) -> list[CapstanServer]:
        return [server for cluster in self.clusters for server in cluster]

    def create(self, nodes: int = 2, *extra_args: str, start: bool = True) -> Cluster:
        """``nodes`` servers on one fresh database, named A, B, C, ..."""
        database = _shared_database_or_fail(self.kind)
        index = len(self.clusters) + 1
        cluster = Cluster([
            CapstanServer(
                self.base / f"c{index}-data-{label}", self.base / f"c{index}-node-{label}.log",
                database=database.url, extra_args=extra_args, name=label,
            )
            for label in "ABCDEFGH"[:nodes]
        ], database)
        self.clusters.append(cluster)
        if start:
            _start_all_or_fail(cluster)
        return cluster

    def shutdown_all(self) -> None:
        problems = []
        for cluster in self.clusters:
            try:
                _shutdown_cluster(cluster, cluster.database)
            except Exception as error:  # noqa: BLE001 - collect, then report all
                problems.append(str(error))
        if problems:
            raise AssertionError("\n\n".join(problems))


@pytest.fixture(params=["postgres", "mariadb"])
def cluster_factory(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ClusterFactory]:
    """Every cluster test runs on both shared databases."""
    factory = ClusterFactory(tmp_path, request.param)
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
    CapstanServer.made.clear()
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def _servers_used_by(item: pytest.Item) -> list[CapstanServer]:
    found: list[CapstanServer] = []
    for value in getattr(item, "funcargs", {}).values():
        if isinstance(value, CapstanServer):
            found.append(value)
        elif isinstance(value, (ServerFactory, ClusterFactory)):
            found.extend(value.servers)
        elif isinstance(value, list):
            found.extend(v for v in value if isinstance(v, CapstanServer))
    found.extend(CapstanServer.made)
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
            f"capstan node {server.name} log {server.log_path} ({lifecycle})",
            server.log_tail(300),
        ))
