"""A Redis Sentinel group on loopback for the failover tests: a primary, two replicas and
three sentinels, all real processes of Debian's ``redis-server``/``redis-sentinel``, on free
ports of 127.0.0.1 in one temporary directory.

Failover is fast (``down-after-milliseconds`` 2000, ``failover-timeout`` 3000, replicas
resynced all at once) and every data node has ``min-replicas-to-write 1`` with
``min-replicas-max-lag 3``: a primary cut off from its replicas (SIGSTOPped past a
failover, then SIGCONTed) refuses writes with NOREPLICAS once its replicas' last
acknowledgements are older than 3 s, instead of taking writes the group has already
moved away from (split brain). Nothing is persisted: a node restarted as a replica
takes a full copy from the current primary (diskless, no delay).

The drill's steps are methods: `kill_primary` (kill -9), `pause`/`resume` (SIGSTOP and
SIGCONT), `restart_as_replica`; `wait_failover` and `wait_settled` poll the sentinels and
the nodes until they agree, with generous deadlines (two loaded cores). `sentinel_events`
reads when each sentinel saw ``+sdown``/``+odown``/``+switch-master`` from its log.

Blocking calls (subprocess and a synchronous redis-py client): an async test runs them
with ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

from common.errors import RedisServerError
from common.redis.server import RedisServer, free_port

MASTER = "crawlq"
HOST = "127.0.0.1"
DOWN_AFTER_MS = 2000
FAILOVER_TIMEOUT_MS = 3000
MIN_REPLICAS_MAX_LAG_S = 3
#: Every wait's deadline: failovers take 2-4 s alone, much longer on two loaded cores.
WAIT_S = 45.0


def sentinel_binaries() -> tuple[str, str] | None:
    """(redis-server, redis-sentinel) of one installation (Debian's: the same program),
    or None where redis-sentinel is not installed."""
    sentinel = shutil.which("redis-sentinel") or "/usr/bin/redis-sentinel"
    if not os.access(sentinel, os.X_OK):
        return None
    server = Path(sentinel).with_name("redis-server")
    if not os.access(server, os.X_OK):
        return None
    return str(server), sentinel


def _client(port: int, timeout: float = 2.0) -> redis.Redis:
    return redis.Redis(host=HOST, port=port, socket_timeout=timeout,
                       socket_connect_timeout=timeout, decode_responses=True)


@dataclass
class Node:
    """One data node (redis-server): its name (``n0``, ``n1``, ``n2``) stays with its port."""

    name: str
    server: RedisServer
    paused: bool = False

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def alive(self) -> bool:
        proc = self.server.process
        return proc is not None and proc.poll() is None

    def replication(self) -> dict[str, str] | None:
        """INFO replication as strings, or None when the node does not answer."""
        if not self.alive or self.paused:
            return None
        try:
            with _client(self.port) as c:
                info = c.info("replication")
        except (redis.RedisError, OSError):
            return None
        return {k: str(v) for k, v in info.items()}

    def role(self) -> str | None:
        """``master`` or ``slave`` as the node says, None when it does not answer."""
        info = self.replication()
        return None if info is None else info.get("role")


@dataclass
class SentinelProcess:
    """One redis-sentinel and its config file (which it rewrites as it learns)."""

    port: int
    conf: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def master(self) -> str | None:
        """``host:port`` of the primary this sentinel names now (None: no answer)."""
        try:
            with _client(self.port) as c:
                addr = c.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)
        except (redis.RedisError, OSError):
            return None
        return f"{addr[0]}:{addr[1]}" if addr else None

    def master_state(self) -> dict[str, str]:
        with _client(self.port) as c:
            raw = c.execute_command("SENTINEL", "MASTER", MASTER)
        if isinstance(raw, dict):
            return {str(k): str(v) for k, v in raw.items()}
        return {str(k): str(v) for k, v in zip(raw[::2], raw[1::2], strict=True)}


@dataclass(frozen=True, slots=True)
class SentinelEvent:
    """A line of a sentinel's log: when (unix s), which sentinel, the event and its text."""

    at: float
    sentinel: int
    name: str
    text: str


# "1234:X 03 Dec 2026 09:10:00.123 # +switch-master crawlq 127.0.0.1 1 127.0.0.1 2"
_LOG_LINE = re.compile(r"^\d+:X (\d{2} \w{3} \d{4} \d{2}:\d{2}:\d{2}\.\d{3}) [.\-*#] (\S+) ?(.*)$")


@dataclass
class SentinelGroup:
    """The group (see the module docstring); a context manager that stops every process."""

    nodes: list[Node] = field(default_factory=list)
    sentinels: list[SentinelProcess] = field(default_factory=list)
    root: Path | None = None
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """The group as crawlq's Sentinel URL (database 0)."""
        hosts = ",".join(f"{HOST}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{MASTER}/0"

    # -- start and stop -----------------------------------------------------------------

    def start(self) -> SentinelGroup:
        binaries = sentinel_binaries()
        if binaries is None:
            raise RedisServerError("redis-sentinel is not installed "
                                   "(apt-get install redis-sentinel)")
        server_bin, sentinel_bin = binaries
        self._tmp = tempfile.TemporaryDirectory(prefix="crawlq-sentinel-")
        self.root = Path(self._tmp.name)
        primary = self._start_node("n0", server_bin, replica_of=None)
        self.nodes.append(primary)
        for name in ("n1", "n2"):
            self.nodes.append(self._start_node(name, server_bin, replica_of=primary))
        for i in range(3):
            self.sentinels.append(self._start_sentinel(i, sentinel_bin, primary))
        self.wait_settled(primary)
        return self

    def _start_node(self, name: str, binary: str, replica_of: Node | None,
                    port: int = 0) -> Node:
        assert self.root is not None
        data = self.root / name
        data.mkdir(exist_ok=True)
        args = ["--min-replicas-to-write", "1",
                "--min-replicas-max-lag", str(MIN_REPLICAS_MAX_LAG_S),
                "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0",
                "--repl-ping-replica-period", "1", "--maxmemory-policy", "noeviction"]
        if replica_of is not None:
            args += ["--replicaof", HOST, str(replica_of.port)]
        server = RedisServer(binary=binary, port=port, data_dir=data, extra_args=tuple(args))
        server.start()
        return Node(name, server)

    def _start_sentinel(self, i: int, binary: str, primary: Node) -> SentinelProcess:
        assert self.root is not None
        port = free_port()
        conf = self.root / f"sentinel-{i}.conf"
        log = self.root / f"sentinel-{i}.log"
        conf.write_text("\n".join([
            f"port {port}", f"bind {HOST}", "daemonize no", f"dir {self.root}",
            f"logfile {log}", "loglevel notice",
            f"sentinel monitor {MASTER} {HOST} {primary.port} 2",
            f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}",
            f"sentinel failover-timeout {MASTER} {FAILOVER_TIMEOUT_MS}",
            f"sentinel parallel-syncs {MASTER} 2", ""]))
        proc = subprocess.Popen([binary, str(conf)], stdin=subprocess.DEVNULL)
        sentinel = SentinelProcess(port, conf, log, proc)
        self._poll(lambda: _pings(port), f"sentinel {i} to answer on port {port}", within=15)
        return sentinel

    def stop(self) -> None:
        """Stop every process (paused ones are continued first) and remove the directory."""
        for s in self.sentinels:
            if s.process is not None and s.process.poll() is None:
                s.process.kill()
                s.process.wait()
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.server.stop()  # SIGCONT, SIGTERM, then SIGKILL
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> SentinelGroup:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what the group says -----------------------------------------------------------

    def node_at(self, address: str) -> Node:
        return next(n for n in self.nodes if n.address == address)

    def sentinel_masters(self) -> list[str | None]:
        """The primary each sentinel names (None: that sentinel did not answer)."""
        return [s.master() for s in self.sentinels]

    def agreed_master(self) -> Node | None:
        """The node every sentinel names, if they all name the same one."""
        named = set(self.sentinel_masters())
        if len(named) != 1 or None in named:
            return None
        address = named.pop()
        assert address is not None
        return self.node_at(address)

    def primary(self) -> Node:
        """The current primary as the sentinels agree on it (fails when they don't)."""
        node = self.agreed_master()
        if node is None:
            raise AssertionError(f"sentinels disagree: {self.sentinel_masters()}")
        return node

    def replicas_of(self, primary: Node) -> list[Node]:
        """The nodes replicating from `primary` with their link up."""
        out = []
        for node in self.nodes:
            info = node.replication() if node is not primary else None
            if info and info.get("role") == "slave" \
                    and info.get("master_port") == str(primary.port) \
                    and info.get("master_link_status") == "up":
                out.append(node)
        return out

    # -- waits ---------------------------------------------------------------------------

    def _poll(self, pred: object, what: str, within: float = WAIT_S) -> None:
        assert callable(pred)
        deadline = time.monotonic() + within
        while not pred():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {within:g}s waiting for {what}; "
                                     f"{self.describe()}")
            time.sleep(0.05)

    def describe(self) -> str:
        """Each node's role and each sentinel's primary, for a failure message."""
        roles = {n.name: ("paused" if n.paused else n.role() if n.alive else "dead")
                 for n in self.nodes}
        masters = [m and self.node_at(m).name for m in self.sentinel_masters()]
        links = {n.name: (n.replication() or {}).get("master_link_status")
                 for n in self.nodes if n.alive and not n.paused}
        seen = []
        for s in self.sentinels:
            try:
                state = s.master_state()
                seen.append(f"{state.get('num-other-sentinels')} others, flags "
                            f"{state.get('flags')}, replicas up {_replicas_listed(s)}")
            except (redis.RedisError, OSError) as exc:
                seen.append(repr(exc))
        return f"roles {roles}, links {links}, sentinels name {masters}, see {seen}"

    def wait_failover(self, old: Node, within: float = WAIT_S) -> Node:
        """Wait until every sentinel names a primary other than `old` and it says it is
        one; returns it."""
        found: list[Node] = []

        def moved() -> bool:
            node = self.agreed_master()
            if node is None or node is old or node.role() != "master":
                return False
            found.append(node)
            return True

        self._poll(moved, f"a failover away from {old.name}", within)
        return found[-1]

    def wait_settled(self, primary: Node | None = None, within: float = WAIT_S) -> Node:
        """Wait until the group is whole again: every sentinel names the same primary (this
        one, if given), knows the two other sentinels, every other running node replicates
        from it with its link up, and the sentinels list those replicas as up."""
        found: list[Node] = []
        why = ["not asked yet"]  # the last poll's reason, for a timeout's message

        def settled() -> bool:
            try:
                why[0] = whole()
            except (redis.RedisError, OSError) as exc:  # a sentinel slow to answer
                why[0] = f"asking: {exc!r}"
            return not why[0]

        def whole() -> str:
            node = self.agreed_master()
            if node is None or (primary is not None and node is not primary) \
                    or node.role() != "master":
                return f"primary {node and node.name}, role {node and node.role()}"
            others = [n for n in self.nodes if n is not node and n.alive and not n.paused]
            if len(self.replicas_of(node)) != len(others):
                return f"replicas {[n.name for n in self.replicas_of(node)]}"
            for i, s in enumerate(self.sentinels):
                state = s.master_state()
                if state.get("num-other-sentinels") != "2" \
                        or "s_down" in state.get("flags", "") \
                        or not _replicas_up(s, {n.address for n in others}):
                    return f"sentinel {i}: {state.get('num-other-sentinels')} others, " \
                           f"flags {state.get('flags')}, replicas up {_replicas_listed(s)}"
            found.append(node)
            return ""

        try:
            self._poll(settled, "the group to settle", within)
        except AssertionError as exc:
            events = self.sentinel_events("+tilt", "-tilt", "+sdown", "-sdown", "+odown",
                                          "+switch-master", "+convert-to-slave")
            raise AssertionError(f"{exc}; last not settled by: {why[0]}; sentinel events "
                                 f"{[(e.sentinel, e.name, e.text) for e in events[-12:]]}"
                                 ) from None
        return found[-1]

    # -- the drill's steps -------------------------------------------------------------

    def kill_primary(self) -> Node:
        """kill -9 the current primary; returns it."""
        node = self.primary()
        node.server.kill()
        return node

    def pause(self, node: Node) -> None:
        """SIGSTOP `node`: it answers nobody, its connections stay open."""
        assert node.server.process is not None
        node.server.process.send_signal(signal.SIGSTOP)
        node.paused = True

    def resume(self, node: Node) -> None:
        """SIGCONT a paused node."""
        assert node.server.process is not None
        node.server.process.send_signal(signal.SIGCONT)
        node.paused = False

    def restart_as_replica(self, node: Node, within: float = WAIT_S) -> None:
        """Start a killed node again on its port, as a replica of the current primary, and
        wait until its copy is in sync (its link up)."""
        assert not node.alive, f"{node.name} still runs"
        primary = self.primary()
        binary = node.server.binary
        assert self.root is not None
        fresh = self._start_node(node.name, binary, replica_of=primary, port=node.port)
        node.server = fresh.server
        self._poll(lambda: node in self.replicas_of(primary),
                   f"{node.name} to sync from {self.node_at(primary.address).name}", within)

    def sentinel_events(self, *names: str) -> list[SentinelEvent]:
        """The lines of every sentinel's log with one of these event names, in time order."""
        out = []
        for i, s in enumerate(self.sentinels):
            if not s.log.exists():
                continue
            for line in s.log.read_text(errors="replace").splitlines():
                m = _LOG_LINE.match(line)
                if m and m.group(2) in names:
                    at = dt.datetime.strptime(m.group(1), "%d %b %Y %H:%M:%S.%f")
                    out.append(SentinelEvent(_local_to_unix(at), i, m.group(2), m.group(3)))
        return sorted(out, key=lambda e: e.at)


def _local_to_unix(at: dt.datetime) -> float:
    """Sentinel logs local time: this machine's zone."""
    return time.mktime(at.timetuple()) + at.microsecond / 1e6


def _pings(port: int) -> bool:
    try:
        with _client(port, timeout=0.5) as c:
            return bool(c.ping())
    except (redis.RedisError, OSError):
        return False


def _replicas_up(s: SentinelProcess, addresses: set[str]) -> bool:
    """True if sentinel `s` lists every one of `addresses` as a replica, none of them down."""
    return addresses <= _replicas_listed(s)


def _replicas_listed(s: SentinelProcess) -> set[str]:
    """The replicas sentinel `s` lists and does not hold down, as ``ip:port``."""
    with _client(s.port) as c:
        raw = c.execute_command("SENTINEL", "REPLICAS", MASTER)
    seen = set()
    for entry in raw:
        doc = entry if isinstance(entry, dict) else dict(zip(entry[::2], entry[1::2],
                                                             strict=True))
        if "s_down" not in str(doc.get("flags", "")):
            seen.add(f"{doc.get('ip')}:{doc.get('port')}")
    return seen


@contextlib.contextmanager
def sentinel_group() -> Iterator[SentinelGroup]:
    """A started group, stopped on exit."""
    with SentinelGroup() as group:
        yield group
