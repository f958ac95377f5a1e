"""What the Redis server is set to that decides whether a crawl survives it, and what it
costs.

Eviction (``maxmemory-policy``), persistence (AOF and its fsync, RDB snapshots),
replicas and ``hash-max-listpack-value`` (whether the done URLs' history records fit the
small hashes' compact encoding), read by ``crawlq check`` and at a consumer's start-up.
Any policy but ``noeviction`` lets Redis delete keys when it is full: a task's record, a
host's queue, a lease, with nothing counted anywhere. The policy and AOF come from
``INFO`` (allowed to the documented ACL user); ``appendfsync``, ``save``,
``min-replicas-to-write`` and ``hash-max-listpack-value`` only from ``CONFIG GET``, which
an ACL, a rename or a managed service may refuse: those read as ``unknown``, never as an
error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.asyncio import RedisCluster
from redis.exceptions import ResponseError

from common.codec import text as _text
from common.redis.connection import RedisClient

UNKNOWN = "unknown"
NOEVICTION = "noeviction"
EVICTION_ADVICE = ("set maxmemory-policy noeviction (redis.conf, or CONFIG SET "
                   "maxmemory-policy noeviction): any other policy deletes queue keys, "
                   "and so tasks, when Redis is full")
#: The ``hash-max-listpack-value`` the deployments set: a done URL's history record
#: (common/revisits/record.py: ~60 B + its path and query + its ETag) fits under it, so
#: its bucket stays a listpack. Under `LISTPACK_VALUE_MIN`, a record of a typical URL
#: turns its whole bucket into a hashtable.
LISTPACK_VALUE = 192
LISTPACK_VALUE_MIN = 128
#: What a done URL's history record costs (B, queue_bench's 71-B URLs and 15-B ETag;
#: bench/history_floor_bench.py's "crawlq now" rows: revisited, 188 and 132; a recrawl
#: window's, which keeps its entry too, 188 and 130) with Redis's default 64 and with 192.
HISTORY_COST_DEFAULT_B, HISTORY_COST_RAISED_B = 188, 132


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """One Redis node's settings as text; each is `UNKNOWN` where it could not be read."""

    node: str  # host:port
    eviction: str  # maxmemory-policy
    aof: str  # "on" / "off"
    appendfsync: str  # always / everysec / no
    rdb: str  # the save schedule, e.g. "3600 1 300 100", or "off"
    replicas: str  # replicas connected now
    min_replicas_to_write: str
    listpack_value: str = UNKNOWN  # hash-max-listpack-value

    @property
    def evicting(self) -> bool:
        """Known to evict: a policy other than noeviction (unknown is not known)."""
        return self.eviction not in (NOEVICTION, UNKNOWN)

    def listpack_warning(self) -> str | None:
        """What a `hash-max-listpack-value` known to be too low for the history records
        costs, and how to raise it; None when it is high enough or unknown."""
        if not self.listpack_value.isdigit() or int(self.listpack_value) >= LISTPACK_VALUE_MIN:
            return None
        return (f"Redis at {self.node} has hash-max-listpack-value {self.listpack_value}: "
                "a done URL's history record longer than that turns its bucket into a "
                f"hashtable (~{HISTORY_COST_DEFAULT_B} B a done URL instead of "
                f"~{HISTORY_COST_RAISED_B} B for a 71-B URL); set hash-max-listpack-value "
                f"{LISTPACK_VALUE} (redis.conf, or CONFIG SET hash-max-listpack-value "
                f"{LISTPACK_VALUE})")

    def text(self) -> str:
        """One line, e.g. ``eviction noeviction, AOF on (appendfsync everysec), ...``."""
        return (f"eviction {self.eviction}, AOF {self.aof} (appendfsync {self.appendfsync}), "
                f"RDB {self.rdb}, replicas {self.replicas} "
                f"(min-replicas-to-write {self.min_replicas_to_write}), "
                f"hash-max-listpack-value {self.listpack_value}")

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "maxmemory_policy": self.eviction, "aof": self.aof,
                "appendfsync": self.appendfsync, "rdb": self.rdb, "replicas": self.replicas,
                "min_replicas_to_write": self.min_replicas_to_write,
                "hash_max_listpack_value": self.listpack_value}


async def _info(client: Any, section: str) -> dict[str, Any] | None:
    try:
        info = await client.info(section)
    except ResponseError:  # refused by an ACL (NOPERM), renamed away (unknown command)
        return None
    return info if isinstance(info, dict) else None


async def _config(client: Any, name: str) -> str:
    try:
        got = await client.config_get(name)
    except ResponseError:  # CONFIG refused (ACL -@dangerous), renamed, or disabled
        return UNKNOWN
    for key, value in (got or {}).items():
        if _text(key) == name:
            return _text(value)
    return UNKNOWN


def _field(info: dict[str, Any] | None, name: str) -> str:
    if info is None or name not in info:
        return UNKNOWN
    return str(info[name])


async def _node_settings(client: Any, node: str) -> ServerSettings:
    memory = await _info(client, "memory")
    persistence = await _info(client, "persistence")
    replication = await _info(client, "replication")
    aof = _field(persistence, "aof_enabled")
    save = await _config(client, "save")
    return ServerSettings(
        node=node, eviction=_field(memory, "maxmemory_policy"),
        aof={"1": "on", "0": "off"}.get(aof, UNKNOWN),
        appendfsync=await _config(client, "appendfsync"),
        rdb="off" if save == "" else save,
        replicas=_field(replication, "connected_slaves"),
        min_replicas_to_write=await _config(client, "min-replicas-to-write"),
        # Redis 6.2 names it hash-max-ziplist-value (7 reads that name too)
        listpack_value=await _config(client, "hash-max-ziplist-value"))


async def server_settings(client: RedisClient) -> list[ServerSettings]:
    """The settings of the server, or of each primary of a Cluster."""
    if isinstance(client, RedisCluster):
        return [await _node_settings(_NodeClient(client, node), node.name)
                for node in client.get_primaries()]
    kwargs = client.connection_pool.connection_kwargs
    node = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
    return [await _node_settings(client, node)]


class _NodeClient:
    """`info` and `config_get` of one Cluster node."""

    def __init__(self, cluster: RedisCluster, node: Any) -> None:
        self.cluster = cluster
        self.node = node

    async def info(self, section: str) -> Any:
        return await self.cluster.info(section, target_nodes=self.node)

    async def config_get(self, name: str) -> Any:
        return await self.cluster.config_get(name, target_nodes=self.node)
