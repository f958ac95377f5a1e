"""A crawl's policy in Redis: reading it, creating, changing and adopting it (``policy_set.lua``),
then giving its politeness values to every partition (``policy_apply.lua``) and telling
running consumers (``common.fleet.wake``). See the package's docstring for the layout.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from common import codec
from common.codec import text as _text
from common.fleet.wake import WakeChannel
from common.hostmodel.hostgroup import NO_GROUP, host_group
from common.hostmodel.hostip import AddressBook
from common.keys import CrawlKeys, PartitionKeys
from common.policy.model import (
    CrawlPolicy,
    from_texts,
    parse_value,
)
from common.policy.options import (
    OPTIONS,
    VALID_KEYS,
)
from common.policy.values import (
    NoPolicyError,
    PolicyError,
    PolicyExistsError,
    PolicyMovedError,
)
from common.queue import CrawlSettings, DedupMode, partition_keys
from common.redis.connection import RedisClient
from common.redis.scripts import register

#: Entries ``policy:log`` keeps (newest first).
LOG_LEN = 200
#: Hosts (of ``hosts``) one ``policy_apply.lua`` call refreshes.
APPLY_SLICE = 1000
#: Who a change is by, when it is not a person's command.
BY_MIGRATION = "migration"


@dataclass(frozen=True, slots=True)
class StoredPolicy:
    """A crawl's policy as Redis holds it, with its newest log entries."""

    version: int
    policy: CrawlPolicy
    log: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self, crawl: str) -> dict[str, Any]:
        return {"crawl": crawl, "version": self.version, "values": asdict(self.policy),
                "text": self.policy.texts(), "log": self.log}


async def read_policy(client: RedisClient, crawl: str, *, log_limit: int = 5
                      ) -> StoredPolicy | None:
    """The crawl's policy and its newest `log_limit` log entries, or None."""
    keys = CrawlKeys.build(crawl)
    if log_limit <= 0:  # LRANGE 0 -1 would read the whole log
        return await read_values(client, crawl)
    async with client.pipeline(transaction=False) as pipe:
        pipe.hgetall(keys.policy)
        pipe.lrange(keys.policy_log, 0, log_limit - 1)
        raw, log = await pipe.execute()
    fields = {_text(k): _text(v) for k, v in raw.items()}
    if "version" not in fields:
        return None
    entries = [codec.loads(e) for e in log]
    return StoredPolicy(int(fields.pop("version")), from_texts(fields), entries)


async def read_values(client: RedisClient, crawl: str) -> StoredPolicy | None:
    """The crawl's policy version and values, without its log (one HGETALL, what a
    running consumer re-reads), or None when it has none."""
    raw = await client.hgetall(CrawlKeys.build(crawl).policy)
    fields = {_text(k): _text(v) for k, v in raw.items()}
    if "version" not in fields:
        return None
    return StoredPolicy(int(fields.pop("version")), from_texts(fields))


async def announce(client: RedisClient, crawl: str) -> None:
    """Tell the crawl's running consumers its policy changed (a hint: never raises)."""
    await WakeChannel(client, CrawlKeys.build(crawl).wake).notify_policy()


async def partitions_of(client: RedisClient, crawl: str) -> list[PartitionKeys]:
    """The crawl's partitions, or none when the crawl has no settings yet."""
    raw = await client.hget(CrawlKeys.build(crawl).meta, "settings")
    if raw is None:
        return []
    settings = CrawlSettings.from_json(raw, crawl)
    return partition_keys(crawl, settings)


async def dedup_of(client: RedisClient, crawl: str) -> DedupMode | None:
    """The crawl's dedup mode, or None when the crawl has no settings yet."""
    raw = await client.hget(CrawlKeys.build(crawl).meta, "settings")
    return None if raw is None else CrawlSettings.from_json(raw, crawl).dedup


async def _recrawl_needs_exact(client: RedisClient, crawl: str, texts: Mapping[str, str]
                               ) -> None:
    """PolicyError when `texts` set a recrawl window or turn revisits on for a crawl that
    uses bloom dedup."""
    for name, off in (("recrawl_after", 0), ("revisit", "off")):
        text = texts.get(name)
        if text is None or parse_value(name, text) == off:
            continue
        if await dedup_of(client, crawl) is DedupMode.BLOOM:
            raise PolicyError(f"{name}: crawl {crawl} uses bloom dedup, which keeps no "
                              f"timestamps, so it can't enqueue a URL again (got {text}): a "
                              f"recrawl window or revisits need an exact-dedup crawl; valid "
                              f"keys: {VALID_KEYS}")


async def _fits_crawl(client: RedisClient, crawl: str, texts: Mapping[str, str]) -> None:
    """PolicyError when `texts` ask for what the crawl can't do: a recrawl window or
    revisits on bloom dedup, politeness groups on more than one partition."""
    await _recrawl_needs_exact(client, crawl, texts)
    text = texts.get("politeness_key")
    if text is None or parse_value("politeness_key", text) == "host":
        return
    partitions = len(await partitions_of(client, crawl))
    if partitions > 1:
        raise PolicyError(f"politeness_key: crawl {crawl} has {partitions} partitions, which "
                          f"hold hosts by their name, so one group's hosts may live in "
                          f"several and no lease call sees all of them (got {text}): "
                          f"politeness groups need a one-partition crawl; valid keys: "
                          f"{VALID_KEYS}")


async def legacy_conf(client: RedisClient, crawl: str) -> CrawlPolicy | None:
    """The politeness an earlier crawlq wrote into partition 0's ``conf`` (its consumers'
    flags), for a crawl without a policy; None when it holds none."""
    partitions = await partitions_of(client, crawl)
    if not partitions:
        return None
    delay, conc = await client.hmget(partitions[0].conf, "delay", "concurrency")
    if delay is None and conc is None:
        return None
    base = CrawlPolicy()
    return CrawlPolicy(
        per_host_delay=base.per_host_delay if delay is None else int(delay) / 1000,
        per_host_concurrency=base.per_host_concurrency if conc is None else int(conc))


async def _write(client: RedisClient, crawl: str, mode: str, texts: Mapping[str, str],
                 by: str, *, expected: int | None = None) -> tuple[int, int]:
    keys = CrawlKeys.build(crawl)
    script = register(client, "policy_set")
    pairs = [x for name, text in texts.items() for x in (name, text)]
    code, version = await script(keys=[keys.policy, keys.policy_log],
                                 args=[mode, by, LOG_LEN, "" if expected is None else expected,
                                       *pairs])
    return int(code), int(version)


async def assign_groups(client: RedisClient, pk: PartitionKeys, key: str) -> int:
    """Name the group of every host a partition knows in ``g:of`` for politeness_key
    `key` (the hosts enqueued before it was set; enqueue names the others), a slice of
    hosts a command; returns how many were named. Under ip each name is looked up again
    (the way to follow a changed address: switch the key to host and back), and a host
    whose name fails to resolve loses the group it had."""
    book = AddressBook() if key == "ip" else None
    named = 0
    async for hosts in _host_slices(client, pk):
        if book is None:
            groups = [host_group(h) for h in hosts]
        else:
            found = await asyncio.gather(*(book.address(h) for h in hosts))
            groups = [address or NO_GROUP for address, _ in found]
        pairs = [x for h, g in zip(hosts, groups, strict=True) if g != NO_GROUP
                 for x in (h, g)]
        if pairs:
            named += await client.hset(pk.group_of, items=pairs)
        ungrouped = [h for h, g in zip(hosts, groups, strict=True) if g == NO_GROUP]
        if book is not None and ungrouped:
            await client.hdel(pk.group_of, *ungrouped)
    return named


async def _host_slices(client: RedisClient, pk: PartitionKeys) -> AsyncIterator[list[str]]:
    """The hosts of a partition's ``hosts``, `APPLY_SLICE` at a time."""
    hosts: list[str] = []
    async for raw, _ in client.hscan_iter(pk.hosts, count=APPLY_SLICE):
        hosts.append(_text(raw))
        if len(hosts) >= APPLY_SLICE:
            yield hosts
            hosts = []
    if hosts:
        yield hosts


async def apply_policy(client: RedisClient, crawl: str, version: int, policy: CrawlPolicy,
                       partitions: Sequence[PartitionKeys] | None = None) -> None:
    """Give every partition (its ``conf``) the policy's politeness of `version`, and move
    each scheduled host's turn to match (``policy_apply.lua``, a slice of hosts a call)."""
    if partitions is None:
        partitions = await partitions_of(client, crawl)
    script = register(client, "policy_apply")
    for pk in partitions:
        if policy.politeness_key != "host":
            await assign_groups(client, pk, policy.politeness_key)
        cursor: Any = "0"
        while True:
            applied, cursor = await script(
                keys=[*pk.host_state, *pk.group_state],
                args=[version, policy.delay_ms, policy.per_host_concurrency, _text(cursor),
                      APPLY_SLICE, round(policy.adaptive_delay * 1000),
                      round(policy.max_delay * 1000), *policy.revisit_conf(),
                      *policy.group_conf(), int(policy.conditional)])
            if not int(applied) or _text(cursor) == "0":
                break


async def sync_partitions(client: RedisClient, crawl: str, stored: StoredPolicy) -> int:
    """Apply the policy to the partitions whose ``conf`` holds an older version (a crawl
    created after its policy, a writer stopped half-way); returns how many."""
    partitions = await partitions_of(client, crawl)
    if not partitions:
        return 0
    async with client.pipeline(transaction=False) as pipe:
        for pk in partitions:
            pipe.hget(pk.conf, "policy_version")
        held = await pipe.execute()
    behind = [pk for pk, v in zip(partitions, held, strict=True)
              if v is None or int(v) < stored.version]
    await apply_policy(client, crawl, stored.version, stored.policy, behind)
    return len(behind)


async def _adopt(client: RedisClient, crawl: str) -> bool:
    """Make a policy of what an earlier crawlq left in partition 0's ``conf``; whether
    there was anything to adopt."""
    found = await legacy_conf(client, crawl)
    if found is None:
        return False
    await _write(client, crawl, "create", found.texts(), BY_MIGRATION)
    return True


async def create_policy(client: RedisClient, crawl: str, values: Mapping[str, Any], *,
                        by: str) -> StoredPolicy:
    """Create the crawl's policy: the defaults with `values` over them. A crawl an
    earlier crawlq made adopts its partitions' values first (logged as a migration), then
    `values` are set. PolicyExistsError when the crawl has a policy already."""
    policy = CrawlPolicy().replace(values)  # validated before anything is written
    await _fits_crawl(client, crawl, policy.texts())
    existing = await read_policy(client, crawl, log_limit=0)
    if existing is not None:
        raise PolicyExistsError(
            f"crawl {crawl} already has a policy (version {existing.version}): change it "
            f"with `crawlq crawl set --crawl {crawl} KEY=VALUE`")
    if await _adopt(client, crawl):
        return await set_policy(client, crawl, values, by=by)
    code, _ = await _write(client, crawl, "create", policy.texts(), by)
    if code == 1:
        raise PolicyExistsError(f"crawl {crawl} got a policy while this one was created: "
                                f"see `crawlq crawl show --crawl {crawl}`")
    return await _finish(client, crawl)


async def set_policy(client: RedisClient, crawl: str, values: Mapping[str, Any], *,
                     by: str, create: bool = False,
                     expected_version: int | None = None) -> StoredPolicy:
    """Change some of the policy's values (all checked first: a bad one writes nothing);
    with `create`, a crawl without a policy gets one (the defaults under `values`).
    NoPolicyError when there is none (and not `create`). With `expected_version`, the
    change is made only if the policy is still at that version, in the same atomic call
    that writes it (PolicyMovedError, nothing written, otherwise)."""
    current = await read_policy(client, crawl, log_limit=0)
    # Every value checked before anything is written, retry_cap against what it lands on.
    (CrawlPolicy() if current is None else current.policy).replace(values)
    texts = {n: OPTIONS[n].show(v) for n, v in values.items()}
    await _fits_crawl(client, crawl, texts)
    if current is None:
        if await _adopt(client, crawl):
            pass
        elif create:
            texts = CrawlPolicy().replace(values).texts()
        else:
            raise NoPolicyError(f"crawl {crawl} has no policy: create it with `crawlq "
                                f"crawl create --crawl {crawl}`")
    if texts:
        code, version = await _write(client, crawl, "upsert" if create else "set", texts, by,
                                     expected=expected_version)
        if code == 2:
            raise NoPolicyError(f"crawl {crawl}'s policy was deleted while it was set")
        if code == 4:
            raise PolicyMovedError(f"crawl {crawl}'s policy is at version {version}, not "
                                   f"{expected_version}: it changed since; nothing was "
                                   "written", version)
    stored = await _finish(client, crawl)
    if texts:
        await announce(client, crawl)
    return stored


async def ensure_policy(client: RedisClient, crawl: str, wanted: CrawlPolicy, *,
                        by: str, seeds: Collection[str] | None = None
                        ) -> tuple[StoredPolicy, bool]:
    """The crawl's policy, created from `wanted` if it has none (adopted from an earlier
    crawlq's partitions if those hold values); never changes a value that exists, only
    adds the options an earlier crawlq's policy lacks, those of them named in `seeds`
    (the options the caller has flags for; None: all). Then every partition that holds an
    older version gets this one. Returns it, and whether this call created it from
    `wanted`. PolicyError when `wanted` would give a bloom crawl a recrawl window."""
    stored = await read_policy(client, crawl, log_limit=0)
    created = False
    if stored is None and not await _adopt(client, crawl):
        await _fits_crawl(client, crawl, wanted.texts())
        code, _ = await _write(client, crawl, "create", wanted.texts(), by)
        created = code == 0
    elif stored is not None:
        await _add_missing(client, crawl, wanted, by, seeds)
    return await _finish(client, crawl), created


async def _add_missing(client: RedisClient, crawl: str, wanted: CrawlPolicy, by: str,
                       seeds: Collection[str] | None) -> None:
    """Give the options a policy lacks (an earlier crawlq made it) `wanted`'s values,
    those in `seeds` (None: all)."""
    stored = {_text(k) for k in await client.hkeys(CrawlKeys.build(crawl).policy)}
    texts = wanted.texts()
    missing = {name: text for name, text in texts.items()
               if name not in stored and (seeds is None or name in seeds)}
    if missing and "version" in stored:
        await _fits_crawl(client, crawl, missing)
        code, _ = await _write(client, crawl, "set", missing, by)
        if code == 0:
            await announce(client, crawl)


async def _finish(client: RedisClient, crawl: str) -> StoredPolicy:
    stored = await read_policy(client, crawl)
    if stored is None:
        raise NoPolicyError(f"crawl {crawl}'s policy was deleted while it was written")
    await sync_partitions(client, crawl, stored)
    return stored
