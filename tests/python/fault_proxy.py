"""A TCP proxy between Capstan nodes and their database (PostgreSQL or MariaDB) that a test can break.

Runs its own event loop in a thread, so blocking test code (starting a node) does not stall it.
Faults, applied to every connection through the proxy:

* ``delay(seconds)``: each chunk is held that long before it is passed on (both directions);
* ``blackhole()`` / ``heal()``: nothing is passed on, and nothing is lost (TCP would retransmit),
  until healed;
* ``drop_all()``: every open connection is cut at once, mid-transaction or not;
* ``cut_after_commit()``: the next ``COMMIT`` a node sends reaches the database, and the
  connection is cut before the answer comes back: the node cannot know whether it committed.
"""
from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

# How a node's COMMIT looks on the wire. tokio-postgres: a simple query, 'Q', int32 length
# (4 + len("COMMIT\0")), text. mysql_async: a packet of 3-byte length 7 and sequence id 0 holding
# COM_QUERY (0x03) and the text.
COMMIT_MESSAGES = (b"Q\x00\x00\x00\x0bCOMMIT\x00", b"\x07\x00\x00\x00\x03COMMIT")


class FaultProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fault-proxy", daemon=True)
        self.server: asyncio.AbstractServer | None = None
        self.pairs: set[tuple[Any, Any]] = set()
        self.delay_seconds = 0.0
        self.flowing = asyncio.Event()
        self.commits_to_cut = 0
        self.commits_cut = 0
        self.connections = 0
        self.dropped = 0

    # lifecycle -----------------------------------------------------------

    def start(self) -> FaultProxy:
        self.thread.start()
        self._call(self._listen())
        return self

    def stop(self) -> None:
        self._call(self._close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)

    def url_for(self, database_url: str) -> str:
        """``database_url`` with its host and port replaced by the proxy's."""
        scheme, rest = database_url.split("://", 1)
        credentials, _, location = rest.rpartition("@")
        _, _, path = location.partition("/")
        prefix = f"{credentials}@" if credentials else ""
        return f"{scheme}://{prefix}127.0.0.1:{self.port}/{path}"

    # faults ---------------------------------------------------------------

    def delay(self, seconds: float) -> None:
        self._call(self._set(delay_seconds=seconds))

    def blackhole(self) -> None:
        self._call(self._flow(False))

    def heal(self) -> None:
        self._call(self._set(delay_seconds=0.0, commits_to_cut=0))
        self._call(self._flow(True))

    def drop_all(self) -> int:
        return self._call(self._drop_all())

    def cut_after_commit(self, count: int = 1) -> None:
        self._call(self._set(commits_to_cut=count))

    def wait_commits_cut(self, count: int, within: float = 15.0) -> None:
        deadline = time.monotonic() + within
        while self.commits_cut < count:
            assert time.monotonic() < deadline, f"the proxy cut {self.commits_cut} commits, not {count}"
            time.sleep(0.02)

    # inside the loop -----------------------------------------------------------

    def _call(self, coro) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=10)

    async def _set(self, **values: Any) -> None:
        for name, value in values.items():
            setattr(self, name, value)

    async def _flow(self, flowing: bool) -> None:
        if flowing:
            self.flowing.set()
        else:
            self.flowing.clear()

    async def _listen(self) -> None:
        self.flowing.set()
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def _close(self) -> None:
        if self.server is not None:
            self.server.close()
        await self._drop_all()

    async def _drop_all(self) -> int:
        pairs = list(self.pairs)
        for client, upstream in pairs:
            for writer in (client, upstream):
                writer.transport.abort()
        self.pairs.clear()
        self.dropped += len(pairs)
        return len(pairs)

    async def _accept(self, client_reader, client_writer) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_writer.transport.abort()
            return
        self.connections += 1
        pair = (client_writer, upstream_writer)
        self.pairs.add(pair)
        cut = asyncio.Event()
        to_server = asyncio.ensure_future(self._pump(client_reader, upstream_writer, pair, cut, watch_commits=True))
        to_client = asyncio.ensure_future(self._pump(upstream_reader, client_writer, pair, cut, watch_commits=False))
        await asyncio.wait({to_server, to_client}, return_when=asyncio.FIRST_COMPLETED)
        for writer in pair:
            writer.transport.abort()
        for task in (to_server, to_client):
            task.cancel()
        self.pairs.discard(pair)

    async def _pump(self, reader, writer, pair, cut: asyncio.Event, *, watch_commits: bool) -> None:
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                return
            await self.flowing.wait()
            if self.delay_seconds:
                await asyncio.sleep(self.delay_seconds)
            if cut.is_set():
                return  # the answer to a cut COMMIT never reaches the node
            if watch_commits and self.commits_to_cut > 0 and any(commit in chunk for commit in COMMIT_MESSAGES):
                self.commits_to_cut -= 1
                self.commits_cut += 1
                cut.set()  # before the COMMIT leaves: its answer must not slip through
                writer.write(chunk)
                await writer.drain()
                # The answer is dropped on its way back (the other pump sees `cut`); then both
                # sides are cut. The database applies the COMMIT either way.
                await asyncio.sleep(0.3)
                return
            writer.write(chunk)
            await writer.drain()
