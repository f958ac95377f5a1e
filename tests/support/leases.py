"""Lease records as the tests read them: a partition's ``leased`` HASH, id -> "<owner>
<attempt> <host> <priority> <entry>" (``common/keys.py``, ``lib/leases.lua``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from common.keys import HASHTABLE_FIELD, PartitionKeys
from common.queue import CrawlQueue
from common.redis.connection import RedisClient


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """One lease, its owner's marks split off."""

    owner: str  # "<token>:<worker>"
    fetched: bool  # "f": its response is in, its host's slot given back
    budget: bool  # "b": it holds a page of its host's budget
    attempt: int
    host: str
    priority: int
    entry: bytes

    @property
    def token(self) -> str:
        return self.owner.partition(":")[0]

    @property
    def worker(self) -> str:
        return self.owner.partition(":")[2]

    @classmethod
    def decode(cls, value: bytes) -> LeaseRecord:
        owner, attempt, host, priority, entry = value.split(b" ", 4)
        text = owner.decode()
        fetched = text.startswith("f")
        text = text.removeprefix("f")
        budget = text.startswith("b")
        text = text.removeprefix("b").removeprefix("g")  # g: it holds a slot of its group
        return cls(text, fetched, budget, int(attempt), host.decode(),
                   int(priority), entry)


async def lease_records(client: RedisClient, pk: PartitionKeys) -> dict[str, LeaseRecord]:
    """Every lease record of a partition, by task id."""
    values = cast(dict[bytes, bytes], await client.hgetall(pk.leased))
    return {k.decode(): LeaseRecord.decode(v) for k, v in values.items()
            if k != HASHTABLE_FIELD.encode()}


async def lease_record(client: RedisClient, pk: PartitionKeys, task_id: str
                       ) -> LeaseRecord | None:
    """One task's lease record (None: it is not leased)."""
    value = cast(bytes | None, await client.hget(pk.leased, task_id))
    return None if value is None else LeaseRecord.decode(value)


async def owned_by(queue: CrawlQueue, worker: str) -> set[str]:
    """Ids whose lease `worker` holds right now (read from every partition's lease records)."""
    held = set()
    for pk in queue.partitions:
        records = await lease_records(queue.client, pk)
        held |= {tid for tid, record in records.items() if record.worker == worker}
    return held
