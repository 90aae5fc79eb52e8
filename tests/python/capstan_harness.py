"""Helpers shared by the Capstan end-to-end tests that drive the published
Python SDK (``durable-workflow==2.12.0``) against a real ``capstan`` process.

Nothing here talks to the server through private routes: the server is a
black box started with ``capstan serve``, probed through ``GET /api/health``,
and exercised only through the SDK's ``Client`` / ``Worker`` plus plain
control-plane HTTP for history reads.

The fixtures that wrap these helpers live in ``conftest.py``.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
from durable_workflow import Client, TransportRetryPolicy, Worker, serializer

log = logging.getLogger("capstan.tests")

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BINARY = REPO_ROOT / "target" / "debug" / "capstan"

NAMESPACE = "default"
CONTROL_HEADERS = {
    "X-Durable-Workflow-Control-Plane-Version": "2",
    "X-Namespace": NAMESPACE,
}

# Every event type that closes a run. A run history must end with exactly one.
TERMINAL_EVENT_TYPES = frozenset({
    "WorkflowCompleted",
    "WorkflowFailed",
    "WorkflowCancelled",
    "WorkflowTerminated",
    "WorkflowTimedOut",
    "WorkflowContinuedAsNew",
})
# Events that resolve one scheduled activity execution (all retries included).
ACTIVITY_RESOLUTION_TYPES = frozenset({
    "ActivityCompleted",
    "ActivityFailed",
    "ActivityTimedOut",
    "ActivityCancelled",
})

STARTUP_TIMEOUT = float(os.environ.get("CAPSTAN_STARTUP_TIMEOUT", "60"))
SHUTDOWN_TIMEOUT = float(os.environ.get("CAPSTAN_SHUTDOWN_TIMEOUT", "20"))


# ── ids ──────────────────────────────────────────────────────────────────


def unique(prefix: str) -> str:
    """A workflow id / task queue name that no other test (or rerun) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


# ── the server process ───────────────────────────────────────────────────


def capstan_binary() -> Path:
    return Path(os.environ.get("CAPSTAN_BIN") or DEFAULT_BINARY)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _child_dies_with_parent() -> Callable[[], None] | None:
    """preexec_fn asking Linux to SIGKILL the server if the test process dies.

    Keeps a hung-and-killed pytest run from leaving ``capstan`` processes
    behind. Returns None where prctl is unavailable.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)

    return preexec


class CapstanStartupError(RuntimeError):
    pass


def process_state(pid: int) -> str:
    """The state letter of a process (Linux /proc): R, S, D, T (stopped), Z..."""
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]


class CapstanServer:
    """One ``capstan serve`` process bound to a fixed port and data dir.

    The same object can be killed and spawned again on the same port and data
    dir, which is what the crash-recovery test needs. Everything the process
    prints goes to ``log_path`` (appended across restarts, with a marker line
    per start).
    """

    # Every server made since the last reset (conftest resets it per test), so a failing test's
    # report carries the logs of servers it built itself, not only those fixtures gave it.
    made: list["CapstanServer"] = []

    def __init__(
        self,
        data_dir: Path,
        log_path: Path,
        *,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        binary: Path | None = None,
        database: str | None = None,
        name: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.log_path = Path(log_path)
        self.port = port or free_port()
        # A port the harness chose may be taken by another process (a client's ephemeral port)
        # before the server binds it: until the server first serves, it may choose again.
        self._chose_port = port is None
        self._served = False
        self.extra_args = list(extra_args)
        # ``--database`` URL (a shared PostgreSQL database in cluster mode);
        # None = the embedded SQLite database in ``data_dir``.
        self.database = database
        self.name = name or self.data_dir.name
        # Extra environment for the process (e.g. CAPSTAN_TEST_PAUSE_AT).
        self.env = dict(env or {})
        self.binary = Path(binary) if binary is not None else capstan_binary()
        # The CA that signed the server's certificate when it serves TLS (``--tls-cert``):
        # ``url`` is then https, and the readiness probe trusts this CA only.
        self.tls_ca: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.history: list[str] = []  # what happened to each process, for reports
        self._expected_exit = False
        self._paused = False
        CapstanServer.made.append(self)

    @property
    def url(self) -> str:
        """Server origin for ``Client`` (the SDK appends ``/api`` itself)."""
        scheme = "https" if self.tls_ca is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def trust(self) -> ssl.SSLContext | bool:
        """What a client must trust to reach this server (``verify`` for httpx)."""
        if self.tls_ca is None:
            return True
        return ssl.create_default_context(cafile=str(self.tls_ca))

    @property
    def health_url(self) -> str:
        return f"{self.url}/api/health"

    def command(self) -> list[str]:
        return [
            str(self.binary), "serve",
            "--listen", f"127.0.0.1:{self.port}",
            "--data-dir", str(self.data_dir),
            *(["--database", self.database] if self.database else []),
            *self.extra_args,
        ]

    # lifecycle -----------------------------------------------------------

    def spawn(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("capstan is already running")
        if not self.binary.exists():
            raise CapstanStartupError(
                f"capstan binary not found at {self.binary}; build it (cargo build) or set CAPSTAN_BIN"
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        cmd = self.command()
        env = dict(os.environ)
        env.setdefault("RUST_BACKTRACE", "1")
        env.setdefault("RUST_LOG", "info")
        env.update(self.env)
        self.starts += 1
        with open(self.log_path, "ab") as log_file:
            log_file.write(
                f"\n===== capstan start #{self.starts} at {time.strftime('%H:%M:%S')}: {' '.join(cmd)}\n".encode()
            )
            log_file.flush()
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_child_dies_with_parent(),
            )
        self._expected_exit = False
        self._paused = False
        self.history.append(f"start #{self.starts} pid={self.proc.pid}")

    def _check_alive(self) -> None:
        assert self.proc is not None
        code = self.proc.poll()
        if code is not None:
            raise CapstanStartupError(
                f"capstan exited with code {code} before becoming healthy\n"
                f"command: {' '.join(self.command())}\n--- log tail ---\n{self.log_tail()}"
            )

    def _ready_timeout_error(self, timeout: float, last: str) -> CapstanStartupError:
        return CapstanStartupError(
            f"capstan did not answer 200 on {self.health_url} within {timeout:.0f}s "
            f"(last probe: {last})\n--- log tail ---\n{self.log_tail()}"
        )

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT) -> dict[str, Any]:
        """Poll GET /api/health until it answers 200 (blocking)."""
        deadline = time.monotonic() + timeout
        last = "no probe yet"
        with httpx.Client(timeout=2.0, verify=self.trust()) as http:
            while True:
                self._check_alive()
                try:
                    resp = http.get(self.health_url)
                    if resp.status_code == 200:
                        return _json_or_text(resp)
                    last = f"HTTP {resp.status_code}: {resp.text[:200]}"
                except httpx.HTTPError as error:
                    last = f"{type(error).__name__}: {error}"
                if time.monotonic() >= deadline:
                    raise self._ready_timeout_error(timeout, last)
                time.sleep(0.05)

    async def wait_ready_async(self, timeout: float = STARTUP_TIMEOUT) -> dict[str, Any]:
        """Same as wait_ready but without blocking a running event loop."""
        deadline = time.monotonic() + timeout
        last = "no probe yet"
        async with httpx.AsyncClient(timeout=2.0, verify=self.trust()) as http:
            while True:
                self._check_alive()
                try:
                    resp = await http.get(self.health_url)
                    if resp.status_code == 200:
                        return _json_or_text(resp)
                    last = f"HTTP {resp.status_code}: {resp.text[:200]}"
                except httpx.HTTPError as error:
                    last = f"{type(error).__name__}: {error}"
                if time.monotonic() >= deadline:
                    raise self._ready_timeout_error(timeout, last)
                await asyncio.sleep(0.05)

    def start(self, timeout: float = STARTUP_TIMEOUT) -> None:
        for attempt in range(3):
            self.spawn()
            try:
                self.wait_ready(timeout)
                self._served = True
                return
            except CapstanStartupError as error:
                self.kill()
                taken = "Address already in use" in str(error)
                if not (taken and self._chose_port and not self._served and attempt < 2):
                    raise
                self.history.append(f"port {self.port} was taken before the server bound it")
                self.port = free_port()
            except BaseException:
                self.kill()
                raise

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def unexpected_exit_code(self) -> int | None:
        """Exit code if the process died on its own (not through kill/terminate)."""
        if self.proc is None or self._expected_exit:
            return None
        return self.proc.poll()

    def kill(self) -> None:
        """SIGKILL: a crash, no chance to flush or clean up."""
        if self.proc is None:
            return
        self._expected_exit = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=SHUTDOWN_TIMEOUT)
        self.history.append(f"pid={self.proc.pid} SIGKILLed (exit {self.proc.returncode})")

    @property
    def killed_by_test(self) -> bool:
        """The test SIGKILLed this process and did not start it again."""
        return self.proc is not None and self._expected_exit and self.proc.poll() is not None

    def pause(self) -> None:
        """SIGSTOP: the node freezes (its sockets and database sessions stay open)."""
        assert self.proc is not None and self.proc.poll() is None, "pause() needs a running process"
        self.proc.send_signal(signal.SIGSTOP)
        self._paused = True
        self.history.append(f"pid={self.proc.pid} SIGSTOPped")

    @property
    def stopped(self) -> bool:
        """The process is stopped (SIGSTOP from the test or from one of its own pause points)."""
        return self.running and process_state(self.proc.pid) == "T"

    async def wait_stopped(self, within: float, what: str = "a pause point") -> None:
        """Waits until the process stopped itself (an armed pause point)."""
        deadline = time.monotonic() + within
        while not self.stopped:
            self._check_alive()
            if time.monotonic() > deadline:
                raise AssertionError(f"node {self.name} did not reach {what} within {within}s\n{self.log_tail(40)}")
            await asyncio.sleep(0.02)
        self._paused = True
        self.history.append(f"pid={self.proc.pid} stopped itself")

    def resume(self) -> None:
        """SIGCONT after pause()."""
        assert self.proc is not None and self.proc.poll() is None, "resume() needs a running process"
        self.proc.send_signal(signal.SIGCONT)
        self._paused = False
        self.history.append(f"pid={self.proc.pid} SIGCONTinued")

    def terminate(self, timeout: float = SHUTDOWN_TIMEOUT) -> int | None:
        """SIGTERM and wait for a graceful exit.

        Returns the exit code. Raises if the process ignores SIGTERM for
        ``timeout`` seconds (it is then SIGKILLed so nothing leaks).
        """
        if self.proc is None:
            return None
        if self.proc.poll() is not None:
            code = self.proc.returncode
            if not self._expected_exit:
                self.history.append(f"pid={self.proc.pid} had already exited on its own with {code}")
            return code
        self._expected_exit = True
        if self._paused:
            self.resume()  # a stopped process would not act on SIGTERM
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=SHUTDOWN_TIMEOUT)
            self.history.append(f"pid={self.proc.pid} ignored SIGTERM for {timeout}s; SIGKILLed")
            raise RuntimeError(
                f"capstan did not exit within {timeout}s of SIGTERM (graceful shutdown hangs)\n"
                f"--- log tail ---\n{self.log_tail()}"
            ) from None
        self.history.append(f"pid={self.proc.pid} SIGTERM -> exit {code}")
        return code

    # logs ----------------------------------------------------------------

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no server log written)"

    def log_tail(self, lines: int = 200) -> str:
        text = self.log_text().splitlines()
        head = [] if len(text) <= lines else [f"... ({len(text) - lines} earlier lines in {self.log_path})"]
        return "\n".join(head + text[-lines:])


def _json_or_text(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError:
        return resp.text


# ── SDK clients and workers ──────────────────────────────────────────────


def make_client(
    base_url: str, *, patient: bool = False, timeout: float = 30.0, namespace: str = NAMESPACE, token: str | None = None,
    tls_context: ssl.SSLContext | None = None,
) -> Client:
    """A control-plane Client. ``patient`` rides out a server restart; ``tls_context`` is the
    SDK's own trust option for a server serving TLS."""
    retry = (
        TransportRetryPolicy(max_attempts=40, initial_backoff_seconds=0.1, max_backoff_seconds=1.0)
        if patient else None
    )
    return Client(base_url, namespace=namespace, timeout=timeout, retry_policy=retry, token=token, tls_context=tls_context)


class WorkerStartupError(RuntimeError):
    pass


class BackgroundWorker:
    """An SDK ``Worker`` running as an asyncio task next to the test code.

    Owns its own ``Client`` so stopping one worker never closes the client
    the test uses. ``start()`` returns once the worker has registered (or
    raises what made registration fail); ``stop()`` stops polling, drains,
    deregisters and closes the client, all bounded by timeouts.
    """

    def __init__(
        self,
        base_url: str,
        task_queue: str,
        *,
        workflows: Iterable[type] = (),
        activities: Iterable[Callable[..., Any]] = (),
        name: str | None = None,
        namespace: str = NAMESPACE,
        token: str | None = None,
        tls_context: ssl.SSLContext | None = None,
        **worker_options: Any,
    ) -> None:
        self.base_url = base_url
        self.namespace = namespace
        self.token = token
        self.tls_context = tls_context
        self.task_queue = task_queue
        self.workflows = list(workflows)
        self.activities = list(activities)
        self.name = name or unique("pyworker")
        options: dict[str, Any] = {"poll_timeout": 10.0, "shutdown_timeout": 10.0}
        options.update(worker_options)
        self.worker_options = options
        self.client: Client | None = None
        self.worker: Worker | None = None
        self.task: asyncio.Task[None] | None = None
        self.stop_error: BaseException | None = None

    async def start(self, ready_timeout: float = 20.0) -> BackgroundWorker:
        self.client = make_client(self.base_url, namespace=self.namespace, token=self.token, tls_context=self.tls_context)
        for attempt in range(3):
            try:
                self.worker = Worker(
                    self.client,
                    task_queue=self.task_queue,
                    workflows=self.workflows,
                    activities=self.activities,
                    worker_id=self.name,
                    **self.worker_options,
                )
                break
            except SystemError as error:
                # The SDK parses each workflow class's source here (its definition
                # fingerprint). CPython 3.11 keeps the AST constructor's recursion depth per
                # interpreter, not per thread, so a parse that races another thread's can fail
                # with "AST constructor recursion depth mismatch" (fixed in later CPythons);
                # parsing again is sound.
                if "recursion depth mismatch" not in str(error) or attempt == 2:
                    raise
        self.task = asyncio.create_task(self.worker.run(), name=f"worker {self.name}")
        # Worker.run() registers first (reads /api/cluster/info, then
        # POST /api/worker/register) and sets this event either way.
        # (Private SDK attribute; without it we just give run() a moment.)
        registered = getattr(self.worker, "_registration_done", None)
        if isinstance(registered, asyncio.Event):
            waiter = asyncio.ensure_future(registered.wait())
            done, _ = await asyncio.wait(
                {self.task, waiter}, timeout=ready_timeout, return_when=asyncio.FIRST_COMPLETED,
            )
            waiter.cancel()
            if not done:
                await self.stop()
                raise WorkerStartupError(f"worker {self.name} did not register within {ready_timeout}s")
        else:
            await asyncio.wait({self.task}, timeout=1.0)
        await asyncio.sleep(0.05)  # let a failed registration finish unwinding run()
        if self.task.done():
            error = self.task.exception() if not self.task.cancelled() else None
            await self._close_client()
            raise WorkerStartupError(f"worker {self.name} stopped during startup: {error!r}") from error
        return self

    @property
    def alive(self) -> bool:
        return self.task is not None and not self.task.done()

    def failure(self) -> BaseException | None:
        """Why the worker loop ended on its own, if it did."""
        if self.task is None or not self.task.done() or self.task.cancelled():
            return None
        return self.task.exception()

    async def stop(self, timeout: float = 20.0) -> None:
        if self.worker is not None and self.task is not None and not self.task.done():
            try:
                await asyncio.wait_for(self.worker.stop(), timeout=timeout)
            except BaseException as error:  # noqa: BLE001 - recorded and reported, never hides a test failure
                self.stop_error = error
                log.warning("worker %s did not stop cleanly: %r", self.name, error)
        if self.task is not None and not self.task.done():
            self.task.cancel()
        if self.task is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(self.task), timeout=5.0)
            if self.task.done() and not self.task.cancelled() and self.task.exception() is not None:
                self.stop_error = self.stop_error or self.task.exception()
        await self._close_client()

    async def _close_client(self) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.aclose()


@contextlib.asynccontextmanager
async def running_worker(
    base_url: str,
    task_queue: str,
    *,
    workflows: Iterable[type] = (),
    activities: Iterable[Callable[..., Any]] = (),
    **worker_options: Any,
) -> AsyncIterator[BackgroundWorker]:
    """``async with running_worker(url, queue, workflows=[...], activities=[...]) as w:``"""
    worker = BackgroundWorker(
        base_url, task_queue, workflows=workflows, activities=activities, **worker_options,
    )
    await worker.start()
    try:
        yield worker
    finally:
        await worker.stop()


def run_async(coro: Awaitable[Any], timeout: float) -> Any:
    """Run one test body on a fresh event loop with a hard deadline."""

    async def bounded() -> Any:
        return await asyncio.wait_for(coro, timeout=timeout)

    return asyncio.run(bounded())


async def wait_result(handle: Any, *, timeout: float, workers: Sequence[BackgroundWorker] = ()) -> Any:
    """``handle.result()`` with a deadline and a useful message when it expires."""
    try:
        return await handle.result(timeout=timeout, poll_interval=0.2)
    except TimeoutError as error:
        dead = [f"{w.name}: {w.failure()!r}" for w in workers if not w.alive]
        raise AssertionError(
            f"workflow {handle.workflow_id} (run {handle.run_id}) not terminal after {timeout}s: {error}; "
            f"dead workers: {dead or 'none'}"
        ) from error


# ── history ──────────────────────────────────────────────────────────────


async def fetch_history(client: Client, workflow_id: str, run_id: str, *, page_size: int = 1000) -> list[dict[str, Any]]:
    """Every event of a run through ``Client.get_history`` (all pages)."""
    events: list[dict[str, Any]] = []
    token: str | None = None
    seen: set[str] = set()
    for _ in range(1000):
        page = await client.get_history(workflow_id, run_id, page_size=page_size, next_page_token=token)
        assert isinstance(page, dict), f"history page is not an object: {page!r}"
        batch = page.get("events")
        assert isinstance(batch, list), f"history page has no 'events' list: {sorted(page)}"
        events.extend(batch)
        token = page.get("next_page_token")
        if not token:
            return events
        assert token not in seen, f"history pagination repeated token {token!r}"
        seen.add(token)
    raise AssertionError("history pagination did not terminate")


async def fetch_history_raw(
    base_url: str, workflow_id: str, run_id: str, *, page_size: int = 1000, namespace: str = NAMESPACE,
    headers: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Every event of a run through plain ``GET /api/workflows/{id}/runs/{run}/history``."""
    events: list[dict[str, Any]] = []
    token: str | None = None
    seen: set[str] = set()
    headers = {**CONTROL_HEADERS, "X-Namespace": namespace, **(headers or {})}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=15.0) as http:
        for _ in range(1000):
            params: dict[str, Any] = {"page_size": page_size}
            if token:
                params["next_page_token"] = token
            resp = await http.get(f"/api/workflows/{workflow_id}/runs/{run_id}/history", params=params)
            assert resp.status_code == 200, (
                f"GET history -> {resp.status_code}: {resp.text[:500]}"
            )
            page = resp.json()
            assert page.get("workflow_id") in (None, workflow_id), page.get("workflow_id")
            assert page.get("run_id") in (None, run_id), page.get("run_id")
            batch = page.get("events")
            assert isinstance(batch, list), f"history page has no 'events' list: {sorted(page)}"
            events.extend(batch)
            token = page.get("next_page_token")
            if not token:
                return events
            assert token not in seen, f"history pagination repeated token {token!r}"
            seen.add(token)
    raise AssertionError("history pagination did not terminate")


def event_type(event: dict[str, Any]) -> str | None:
    return event.get("event_type") or event.get("type")


def payload_of(event: dict[str, Any]) -> dict[str, Any]:
    payload = event.get("payload")
    return payload if isinstance(payload, dict) else {}


def events_of(events: Iterable[dict[str, Any]], *types: str) -> list[dict[str, Any]]:
    wanted = set(types)
    return [e for e in events if event_type(e) in wanted]


def type_sequence(events: Iterable[dict[str, Any]]) -> list[str | None]:
    return [event_type(e) for e in events]


def assert_in_order(events: Sequence[dict[str, Any]], expected: Sequence[str]) -> None:
    """``expected`` event types appear in this relative order (others may interleave)."""
    types = type_sequence(events)
    position = 0
    for wanted in expected:
        try:
            position = types.index(wanted, position) + 1
        except ValueError:
            raise AssertionError(
                f"expected {list(expected)} in order; {wanted!r} missing after position {position} in {types}"
            ) from None


def assert_history_invariants(
    events: Sequence[dict[str, Any]],
    *,
    terminal: str | None = "WorkflowCompleted",
    context: str = "",
) -> dict[str, Any]:
    """Checks every run history must satisfy; returns a small summary.

    * top-level ``sequence`` is 1, 2, 3, ... with no gap or repeat;
    * exactly one terminal workflow event, and it is the last event
      (``terminal`` names which one; None = the run must still be open);
    * per ``activity_execution_id`` at most one resolution event
      (ActivityCompleted / ActivityFailed / ActivityTimedOut / ActivityCancelled),
      and every resolved execution was scheduled;
    * per ``timer_id`` at most one TimerFired, and every fired timer was scheduled.
    """
    where = f" [{context}]" if context else ""
    types = type_sequence(events)
    sequences = [e.get("sequence") for e in events]
    assert sequences == list(range(1, len(events) + 1)), (
        f"event sequence numbers are not contiguous from 1{where}: {list(zip(sequences, types))}"
    )

    terminals = [e for e in events if event_type(e) in TERMINAL_EVENT_TYPES]
    if terminal is None:
        assert not terminals, f"open run has terminal events{where}: {types}"
    else:
        assert len(terminals) == 1, f"expected exactly one terminal event{where}, got {types}"
        assert event_type(terminals[0]) == terminal, f"terminal event is {event_type(terminals[0])}, want {terminal}{where}"
        assert event_type(events[-1]) == terminal, f"terminal event is not the last event{where}: {types}"

    scheduled = {payload_of(e).get("activity_execution_id") for e in events_of(events, "ActivityScheduled")}
    # A redriven run's copied completions (`reused_from_run_id`) were scheduled in the failed run.
    scheduled |= {payload_of(e).get("activity_execution_id") for e in events_of(events, "ActivityCompleted")
                  if payload_of(e).get("reused_from_run_id")}
    resolutions: dict[Any, list[str | None]] = defaultdict(list)
    for e in events_of(events, *ACTIVITY_RESOLUTION_TYPES):
        resolutions[payload_of(e).get("activity_execution_id")].append(event_type(e))
    for execution_id, kinds in resolutions.items():
        assert execution_id, f"activity resolution event without activity_execution_id{where}: {kinds}"
        assert len(kinds) == 1, f"activity {execution_id} resolved {len(kinds)} times{where}: {kinds}"
        assert execution_id in scheduled, f"activity {execution_id} resolved but never scheduled{where}"

    timers_scheduled = Counter(payload_of(e).get("timer_id") for e in events_of(events, "TimerScheduled"))
    timers_fired = Counter(payload_of(e).get("timer_id") for e in events_of(events, "TimerFired"))
    for timer_id, count in timers_fired.items():
        assert timer_id, f"TimerFired without timer_id{where}"
        assert count == 1, f"timer {timer_id} fired {count} times{where}"
        assert timer_id in timers_scheduled, f"timer {timer_id} fired but never scheduled{where}"

    return {
        "events": len(events),
        "activities_scheduled": len(scheduled),
        "activity_resolutions": {k: v[0] for k, v in resolutions.items()},
        "timers_scheduled": dict(timers_scheduled),
        "timers_fired": dict(timers_fired),
    }


async def wait_for_history(
    client: Client,
    workflow_id: str,
    run_id: str,
    predicate: Callable[[list[dict[str, Any]]], bool],
    *,
    what: str,
    timeout: float = 20.0,
) -> list[dict[str, Any]]:
    """Poll a run's history until ``predicate(events)`` holds."""
    deadline = time.monotonic() + timeout
    events: list[dict[str, Any]] = []
    while True:
        events = await fetch_history(client, workflow_id, run_id)
        if predicate(events):
            return events
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what} in {workflow_id}; history: {type_sequence(events)}"
            )
        await asyncio.sleep(0.1)


GENESIS_HASH = "0" * 64  # prev_hash of a run's first event


def assert_hash_chain(events: Sequence[dict[str, Any]], *, context: str = "") -> None:
    """The run's events form one unbroken hash chain.

    The first event's ``prev_hash`` is the genesis hash (64 zeros), every
    later ``prev_hash`` equals the previous event's ``hash``, and each
    ``hash`` is ``hex(SHA-256(prev_hash || canonical event))`` where the
    canonical event is the compact, key-sorted JSON of ``event_type``,
    ``payload``, ``recorded_at`` (epoch milliseconds), ``sequence``,
    ``workflow_command_id`` and ``workflow_task_id`` (crates/engine/src/history.rs).
    """
    where = f" [{context}]" if context else ""
    previous = GENESIS_HASH
    for event in events:
        seq = event.get("sequence")
        assert event.get("prev_hash") == previous, (
            f"hash chain broken at sequence {seq}{where}: prev_hash {event.get('prev_hash')!r}, "
            f"previous event's hash {previous!r}"
        )
        digest = event.get("hash")
        assert isinstance(digest, str) and len(digest) == 64, f"event {seq} has no 64-hex hash{where}: {digest!r}"
        recomputed = _event_hash(event)
        assert recomputed == digest, (
            f"event {seq} hash does not match its content{where}: stored {digest}, recomputed {recomputed}"
        )
        previous = digest


def _timestamp_ms(value: str) -> int:
    from datetime import datetime

    parsed = datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ")
    epoch = datetime(1970, 1, 1)
    delta = parsed - epoch
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def _event_hash(event: dict[str, Any]) -> str:
    import hashlib
    import json

    stamp = event.get("timestamp") or event.get("recorded_at")
    canonical = json.dumps(
        {
            "event_type": event_type(event),
            "payload": event.get("payload"),
            "recorded_at": _timestamp_ms(stamp),
            "sequence": event.get("sequence"),
            "workflow_command_id": event.get("workflow_command_id"),
            "workflow_task_id": event.get("workflow_task_id"),
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256((event["prev_hash"] + canonical).encode()).hexdigest()


# ── PostgreSQL: scratch databases for cluster mode ───────────────────────

POSTGRES_URL_ENV = "CAPSTAN_TEST_POSTGRES_URL"


class PostgresUnavailable(RuntimeError):
    pass


def postgres_admin_url() -> str:
    """The URL of the test PostgreSQL (any database on it; new ones are created next to it)."""
    url = os.environ.get(POSTGRES_URL_ENV, "").strip()
    if not url:
        raise PostgresUnavailable(
            f"{POSTGRES_URL_ENV} is not set: the PostgreSQL cluster tests need it. Start the private "
            f"PostgreSQL with scripts/postgres.sh and export the URL it prints, e.g. "
            f"{POSTGRES_URL_ENV}=postgres://postgres@127.0.0.1:54329/postgres"
        )
    return url


def psql(url: str, sql: str, *, timeout: float = 30.0) -> str:
    """Run one SQL statement with ``psql`` and return its unaligned, tuples-only output."""
    try:
        done = subprocess.run(
            ["psql", url, "-X", "-v", "ON_ERROR_STOP=1", "-At", "-c", sql],
            capture_output=True, text=True, timeout=timeout, check=False,
        )
    except FileNotFoundError as error:
        raise PostgresUnavailable("psql is not installed; the PostgreSQL tests need it") from error
    if done.returncode != 0:
        raise PostgresUnavailable(f"psql failed ({done.returncode}) running {sql!r} on {url}: {done.stderr.strip()}")
    return done.stdout.strip()


def with_database(url: str, database: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path=f"/{database}"))


class MariadbScratchDatabase:
    """A fresh database ``capstan_<random>`` on the test MariaDB (``CAPSTAN_TEST_MYSQL_URL``),
    dropped afterwards; made, read and dropped with Debian's ``mariadb`` client."""

    kind = "mariadb"
    # The database's clock in epoch milliseconds, as SQL.
    now_ms_sql = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)"

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.name = f"capstan_{uuid.uuid4().hex[:16]}"
        self.url = with_database(admin_url, self.name)
        self.created = False

    def client_args(self, database: str | None = None) -> list[str]:
        """``mariadb`` in batch mode (tab-separated rows, no headers, unbuffered) on ``database``."""
        parts = urllib.parse.urlsplit(self.admin_url)
        return ["mariadb", "--protocol=tcp", "-h", parts.hostname or "127.0.0.1", "-P", str(parts.port or 3306),
                "-u", parts.username or "root", *([f"-p{parts.password}"] if parts.password else []),
                "-N", "-B", "-n", *([database] if database else [])]

    def _client(self, sql: str, database: str | None = None) -> str:
        done = subprocess.run(
            [*self.client_args(database), "-e", sql], capture_output=True, text=True, timeout=30, check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"mariadb failed running {sql!r}: {done.stderr.strip()}")
        return done.stdout.strip()

    def create(self) -> MariadbScratchDatabase:
        self._client(f"CREATE DATABASE {self.name}")
        self.created = True
        return self

    def query(self, sql: str) -> list[list[str]]:
        """Rows of a read-only diagnostic query (columns split on tabs; NULL as '', as psql prints it)."""
        out = self._client(sql, self.name)
        return [["" if cell == "NULL" else cell for cell in line.split("\t")] for line in out.splitlines() if line]

    def session_args(self) -> list[str]:
        """A client reading statements from stdin, each answered as it arrives."""
        return self.client_args(self.name)

    def drop(self) -> None:
        if self.created:
            self._client(f"DROP DATABASE IF EXISTS {self.name}")
            self.created = False


class ScratchDatabase:
    """A fresh PostgreSQL database (``capstan_<random>``), dropped afterwards."""

    kind = "postgres"
    # The database's clock in epoch milliseconds, as SQL.
    now_ms_sql = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self.name = f"capstan_{uuid.uuid4().hex[:16]}"
        self.url = with_database(admin_url, self.name)
        self.created = False

    def create(self) -> ScratchDatabase:
        psql(self.admin_url, f"CREATE DATABASE {self.name}")
        self.created = True
        return self

    def query(self, sql: str) -> list[list[str]]:
        """Rows of a read-only diagnostic query (columns split on '|')."""
        out = psql(self.url, sql)
        return [line.split("|") for line in out.splitlines() if line]

    def session_args(self) -> list[str]:
        """A client reading statements from stdin, each answered as it arrives."""
        return ["psql", self.url, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1"]

    def drop(self) -> None:
        if self.created:
            psql(self.admin_url, f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")
            self.created = False


def start_all(servers: Sequence[CapstanServer], timeout: float = STARTUP_TIMEOUT) -> None:
    """Spawn every server, then wait until each is healthy (they boot in parallel)."""
    try:
        for server in servers:
            server.spawn()
        for server in servers:
            server.wait_ready(timeout)
    except BaseException:
        for server in servers:
            with contextlib.suppress(Exception):
                server.kill()
        raise


# ── the raw worker protocol (no SDK) ─────────────────────────────────────

WORKER_HEADERS = {
    "X-Durable-Workflow-Protocol-Version": "1.20",
    "X-Namespace": NAMESPACE,
}


def envelope(value: Any) -> dict[str, str]:
    """An Avro payload envelope, encoded the way the SDK encodes one."""
    return serializer.envelope(value)


def decode_envelope(value: Any) -> Any:
    return serializer.decode_envelope(value)


class RawWorker:
    """One worker identity speaking the worker plane over plain HTTP.

    Every call names the node it goes through, so a test can register on one
    node, poll on another and complete on a third.
    """

    def __init__(self, task_queue: str, *, worker_id: str | None = None, timeout: float = 10.0) -> None:
        self.task_queue = task_queue
        self.worker_id = worker_id or unique("raw-worker")
        self.http = httpx.AsyncClient(headers=WORKER_HEADERS, timeout=timeout)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> RawWorker:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def post(self, base_url: str, path: str, body: dict[str, Any], *, timeout: float | None = None) -> httpx.Response:
        kwargs: dict[str, Any] = {"json": body}
        if timeout is not None:
            kwargs["timeout"] = timeout
        return await self.http.post(f"{base_url}/api{path}", **kwargs)

    async def register(self, base_url: str) -> dict[str, Any]:
        resp = await self.post(base_url, "/worker/register", {
            "worker_id": self.worker_id,
            "task_queue": self.task_queue,
            "runtime": "python",
            "sdk_version": "capstan-tests/raw",
            "supported_workflow_types": [],
            "supported_activity_types": [],
            "capabilities": [],
            "capability_manifest": {},
        })
        assert resp.status_code in (200, 201), f"register via {base_url} -> {resp.status_code}: {resp.text[:500]}"
        body = resp.json()
        assert body.get("worker_id") == self.worker_id and body.get("registered") is True, body
        return body

    async def poll_workflow_task(self, base_url: str, *, timeout_seconds: int = 0) -> dict[str, Any] | None:
        """One long poll; the task, or None when the poll timed out empty."""
        resp = await self.post(base_url, "/worker/workflow-tasks/poll", {
            "worker_id": self.worker_id,
            "task_queue": self.task_queue,
            "poll_request_id": unique("raw-poll"),
            "timeout_seconds": timeout_seconds,
            "history_page_size": 500,
        }, timeout=timeout_seconds + 15.0)
        assert resp.status_code == 200, f"poll via {base_url} -> {resp.status_code}: {resp.text[:500]}"
        task = resp.json().get("task")
        assert task is None or isinstance(task, dict), resp.text[:500]
        return task

    async def next_workflow_task(self, base_url: str, *, within: float, what: str = "a workflow task") -> dict[str, Any]:
        """Poll until a task arrives (each poll is bounded by what is left of ``within``)."""
        deadline = time.monotonic() + within
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.worker_id} got no {what} via {base_url} within {within}s")
            task = await self.poll_workflow_task(base_url, timeout_seconds=max(1, min(int(left), 30)))
            if task is not None:
                return task

    async def complete_workflow_task(
        self,
        base_url: str,
        task: dict[str, Any],
        commands: list[dict[str, Any]],
        *,
        attempt: int | None = None,
        timeout: float | None = None,
    ) -> httpx.Response:
        return await self.post(base_url, f"/worker/workflow-tasks/{task['task_id']}/complete", {
            "lease_owner": self.worker_id,
            "workflow_task_attempt": attempt if attempt is not None else task["workflow_task_attempt"],
            "commands": commands,
        }, timeout=timeout)


    async def poll_activity_task(self, base_url: str, *, timeout_seconds: int = 0) -> dict[str, Any] | None:
        """One long poll for an activity task; the task, or None when it timed out empty."""
        resp = await self.post(base_url, "/worker/activity-tasks/poll", {
            "worker_id": self.worker_id,
            "task_queue": self.task_queue,
            "poll_request_id": unique("raw-poll"),
            "timeout_seconds": timeout_seconds,
        }, timeout=timeout_seconds + 15.0)
        assert resp.status_code == 200, f"activity poll via {base_url} -> {resp.status_code}: {resp.text[:500]}"
        return resp.json().get("task")

    async def next_activity_task(self, base_url: str, *, within: float, what: str = "an activity task") -> dict[str, Any]:
        deadline = time.monotonic() + within
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.worker_id} got no {what} via {base_url} within {within}s")
            task = await self.poll_activity_task(base_url, timeout_seconds=max(1, min(int(left), 30)))
            if task is not None:
                return task

    async def complete_activity_task(self, base_url: str, task: dict[str, Any], result: Any, *,
                                     timeout: float | None = None) -> httpx.Response:
        return await self.post(base_url, f"/worker/activity-tasks/{task['task_id']}/complete", {
            "activity_attempt_id": task["activity_attempt_id"],
            "lease_owner": self.worker_id,
            "result": envelope(result),
        }, timeout=timeout)


def complete_workflow_command(result: Any) -> dict[str, Any]:
    return {"type": "complete_workflow", "result": envelope(result)}


def start_timer_command(delay_seconds: int) -> dict[str, Any]:
    return {"type": "start_timer", "delay_seconds": delay_seconds}


class ControlPlane:
    """Plain control-plane calls against one node."""

    def __init__(self, base_url: str, *, timeout: float = 15.0) -> None:
        self.base_url = base_url
        self.http = httpx.AsyncClient(base_url=base_url, headers=CONTROL_HEADERS, timeout=timeout)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> ControlPlane:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start_workflow(self, workflow_type: str, workflow_id: str, task_queue: str, args: list[Any]) -> dict[str, Any]:
        resp = await self.http.post("/api/workflows", json={
            "workflow_type": workflow_type,
            "workflow_id": workflow_id,
            "task_queue": task_queue,
            "input": envelope(args),
        })
        assert resp.status_code == 201, f"start {workflow_id} via {self.base_url} -> {resp.status_code}: {resp.text[:500]}"
        body = resp.json()
        assert body.get("workflow_id") == workflow_id and body.get("run_id"), body
        return body

    async def describe(self, workflow_id: str) -> dict[str, Any]:
        resp = await self.http.get(f"/api/workflows/{workflow_id}")
        assert resp.status_code == 200, f"describe {workflow_id} via {self.base_url} -> {resp.status_code}: {resp.text[:500]}"
        return resp.json()

    async def history(self, workflow_id: str, run_id: str) -> list[dict[str, Any]]:
        return await fetch_history_raw(self.base_url, workflow_id, run_id)

    async def cluster_info(self) -> dict[str, Any]:
        resp = await self.http.get("/api/cluster/info", headers=WORKER_HEADERS)
        assert resp.status_code == 200, f"cluster info via {self.base_url} -> {resp.status_code}: {resp.text[:300]}"
        return resp.json()


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """A local S3-compatible server (moto in server mode); yields its endpoint URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(endpoint, timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto server did not start")
                time.sleep(0.2)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)
