"""Real faults between a client and its Redis, for the failover tests: a TCP relay on
127.0.0.1 that loses the reply of one chosen command (after Redis ran it), a replica of
a server, a primary that wants one, and a Sentinel watching a primary."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import redis
import redis.asyncio as aioredis

from common.redis.connection import connect
from common.redis.scripts import source
from common.redis.server import RedisServer, free_port

MASTER = "crawlq-test"


class ReplyCutter:
    """A relay to a Redis port. After `cut_after(marker)`, the first command sent through it
    whose bytes hold `marker` reaches Redis and runs, and its reply is dropped with the
    connection: what a client sees when a connection dies mid-reply."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = 0
        self.cuts = 0
        self._marker: bytes | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> ReplyCutter:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def cut_after(self, marker: bytes) -> None:
        self._marker = marker

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        armed = asyncio.Event()

        async def to_redis() -> None:
            while data := await reader.read(65536):
                up_writer.write(data)
                await up_writer.drain()
                if self._marker is not None and self._marker in data:
                    self._marker = None
                    armed.set()

        async def to_client() -> None:
            while data := await up_reader.read(65536):
                if armed.is_set():  # the marked command's reply: it ran; drop it
                    self.cuts += 1
                    return
                writer.write(data)
                await writer.drain()

        pumps = [asyncio.ensure_future(to_redis()), asyncio.ensure_future(to_client())]
        for pump in pumps:
            self._tasks.add(pump)
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
                self._tasks.discard(pump)
            for w in (writer, up_writer):
                w.close()
                with contextlib.suppress(OSError, ConnectionError):
                    await w.wait_closed()


@contextlib.asynccontextmanager
async def cutting(port: int) -> AsyncIterator[ReplyCutter]:
    """A `ReplyCutter` to the Redis on `port`, closed at the end."""
    relay = await ReplyCutter(port).start()
    try:
        yield relay
    finally:
        await relay.close()


def script_sha(name: str) -> bytes:
    """The SHA1 script `name` is called by (EVALSHA): what a relay looks for."""
    return hashlib.sha1(source(name).encode()).hexdigest().encode()


def replica_of(primary: RedisServer) -> RedisServer:
    """A redis-server replicating `primary`, started and in sync."""
    replica = RedisServer(extra_args=("--replicaof", "127.0.0.1", str(primary.port))).start()
    client = redis.Redis(port=replica.port, decode_responses=True)
    deadline = time.monotonic() + 20
    while client.info("replication").get("master_link_status") != "up":
        assert time.monotonic() < deadline, "the replica did not sync"
        time.sleep(0.05)
    client.close()
    return replica


class ReplicalessPrimary:
    """``async with``: a primary that takes writes only with a replica in sync
    (min-replicas-to-write 1) and has none until `add_replica()`. `setup` talks to it
    plainly; `client` is crawlq's, trying a refused call again (12 tries: a replica syncs
    within them). Its clients closed and its servers stopped at the end."""

    primary: RedisServer
    setup: aioredis.Redis
    client: aioredis.Redis

    def __init__(self) -> None:
        self.replica: RedisServer | None = None

    async def __aenter__(self) -> ReplicalessPrimary:
        self.primary = RedisServer(extra_args=("--min-replicas-to-write", "1")).start()
        self.setup = aioredis.Redis.from_url(self.primary.url)
        self.client = connect(self.primary.url, retries=12)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.aclose()
        await self.setup.aclose()
        for server in (self.replica, self.primary):
            if server is not None:
                server.stop()

    async def error_replies(self) -> int:
        """The errors it replied so far (a refusal is one)."""
        return int((await self.setup.info("stats"))["total_error_replies"])

    async def add_replica(self) -> None:
        """A replica started and in sync: writes go through again."""
        self.replica = await asyncio.to_thread(replica_of, self.primary)


def sentinel_binary() -> str | None:
    """redis-sentinel (Debian's), or None where it isn't installed."""
    return shutil.which("redis-sentinel") or (
        "/usr/bin/redis-sentinel" if Path("/usr/bin/redis-sentinel").exists() else None)


@contextlib.contextmanager
def sentinel(binary: str, primary: RedisServer) -> Iterator[int]:
    """One Sentinel (quorum 1) watching `primary` as `MASTER`; yields its port once it
    knows a replica of it."""
    workdir = Path(tempfile.mkdtemp(prefix="crawlq-sentinel-"))
    port = free_port()
    conf = workdir / "sentinel.conf"
    conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {workdir}\n"
                    f"logfile {workdir}/sentinel.log\n"
                    f"sentinel monitor {MASTER} 127.0.0.1 {primary.port} 1\n"
                    f"sentinel down-after-milliseconds {MASTER} 2000\n"
                    f"sentinel failover-timeout {MASTER} 10000\n")
    proc = subprocess.Popen([binary, str(conf)], stdin=subprocess.DEVNULL)
    try:
        client = redis.Redis(port=port, decode_responses=True, socket_timeout=2)
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, f"Sentinel on {port} knows no replica"
            with contextlib.suppress(redis.RedisError):
                if client.execute_command("SENTINEL", "REPLICAS", MASTER):
                    break
            time.sleep(0.1)
        client.close()
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


def force_failover(port: int) -> None:
    """Ask the Sentinel on `port` to promote a replica now (no down detection)."""
    client = redis.Redis(port=port, decode_responses=True, socket_timeout=2)
    deadline = time.monotonic() + 30
    while True:
        try:
            client.execute_command("SENTINEL", "FAILOVER", MASTER)
            break
        except redis.ResponseError:  # NOGOODSLAVE until it has heard from the replica
            assert time.monotonic() < deadline, "Sentinel would not fail over"
            time.sleep(0.2)
    client.close()


def primary_port(port: int) -> int:
    """The port of the primary the Sentinel on `port` names."""
    client = redis.Redis(port=port, decode_responses=True, socket_timeout=2)
    try:
        return int(client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)[1])
    finally:
        client.close()
