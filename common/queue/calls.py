"""Sending script calls: one per partition per batch, pipelined, and their replies back
in the callers' order."""

from __future__ import annotations

import asyncio
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from common.keys import PartitionKeys
from common.queue.model import Lease
from common.redis.connection import RedisClient
from common.redis.retry import resending
from common.redis.scripts import locate_in
from common.redis.wait import acknowledged, replica_wait

T = TypeVar("T")
#: A script call: the script, its KEYS, its ARGV.
Call = tuple[Any, list[Any], list[Any]]


def new_op_id() -> str:
    """A call's operation id: 16 hex digits, the same for each send of one call, so a
    script's second run finds its first (lib/once.lua)."""
    return os.urandom(8).hex()


async def run(client: RedisClient, calls: list[Call]) -> list[Any]:
    """Run script calls: pipelined on one node, concurrently across a cluster.

    A cluster client sends each call to the shard of its partition's hash tag, so
    partitions on different shards are served in parallel.
    """
    if len(calls) == 1:
        script, keys, args = calls[0]
        return [await script(keys=keys, args=args)]
    if isinstance(client, aioredis.RedisCluster):
        return list(await asyncio.gather(
            *(script(keys=keys, args=args) for script, keys, args in calls)))
    wait = replica_wait(client)
    async with client.pipeline(transaction=False) as pipe:
        for script, keys, args in calls:
            await script(keys=keys, args=args, client=pipe)
        if wait is not None:  # --redis-wait-replicas: on the connection that wrote
            pipe.execute_command(*wait.command())
        try:
            with resending(all(script.resendable for script, _, _ in calls)):
                result: list[Any] = await pipe.execute()
            if wait is not None:
                acknowledged(wait, int(result.pop()))
        except ResponseError as exc:
            locate_in(exc, (script for script, _, _ in calls))
            raise
        return result


def host_args(pk: PartitionKeys, hosts: Sequence[str]) -> tuple[list[str], list[Any]]:
    """The per-host KEYS (hq, hp of each) and the ARGV head (count, hosts) of a script
    that takes hosts."""
    keys: list[str] = []
    for host in hosts:
        keys += [pk.host_queue(host), pk.host_prio(host)]
    return keys, [len(hosts), *hosts]


def lease_host_args(pk: PartitionKeys, hosts: Sequence[str]) -> tuple[list[str], list[Any]]:
    """`host_args` for lease.lua: each host's hq, hp and its render queue (rq)."""
    keys: list[str] = []
    for host in hosts:
        keys += [pk.host_queue(host), pk.host_prio(host), pk.render_queue(host)]
    return keys, [len(hosts), *hosts]


def by_partition(items: Iterable[T], lease_of: Callable[[T], Lease]) -> dict[int, list[T]]:
    """Items grouped by the partition of their lease, each group in the items' order."""
    groups: dict[int, list[T]] = defaultdict(list)
    for item in items:
        groups[lease_of(item).partition].append(item)
    return groups


def in_order(items: Sequence[T], groups: dict[int, list[T]], replies: list[Any],
             parse: Callable[[Any, int], Any]) -> list[Any]:
    """Map per-partition replies back to the callers' item order.

    An item passed twice gets one result per occurrence, in order (a group keeps
    its items' order, and the same item always lands in the same group).
    """
    if len(groups) == 1:  # one partition (the default): already in the callers' order
        (reply,) = replies
        return [parse(reply, i) for i in range(len(items))]
    by_item: dict[int, list[Any]] = defaultdict(list)
    for group, reply in zip(groups.values(), replies, strict=True):
        for i, item in enumerate(group):
            by_item[id(item)].append(parse(reply, i))
    return [by_item[id(item)].pop(0) for item in items]


def chunks(items: Sequence[T], size: int) -> Iterable[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]
