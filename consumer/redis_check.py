"""A consumer's start-up look at its Redis: eviction, persistence, replicas (logged).

A Redis that evicts keys loses tasks without a word, so a consumer refuses one known to
evict (exit 2, ``redis_evicts``) unless ``--allow-evicting-redis``, where it warns and
``crawlq_redis_evicting`` says 1 for as long as it runs (an alert's input). A
policy it can't read (INFO refused) gets a warning and the consumer runs: refusing there
would stop a fleet on a managed Redis that hides its settings.
"""

from __future__ import annotations

import logging

from common.exitcodes import EXIT_USAGE
from common.observability.metrics import Metrics
from common.redis.connection import RedisClient
from common.redis.durability import EVICTION_ADVICE, UNKNOWN, server_settings

log = logging.getLogger("consumer")


async def check_redis(client: RedisClient, metrics: Metrics, *, allow_evicting: bool
                      ) -> int | None:
    """Log the server's settings and set ``crawlq_redis_evicting``; the exit code if the
    consumer must not run on it."""
    nodes = await server_settings(client)
    metrics.redis_evicting.set(1 if any(n.evicting for n in nodes)
                               else -1 if any(n.eviction == UNKNOWN for n in nodes) else 0)
    for node in nodes:
        log.info("redis_settings", extra=node.to_json())
        if warning := node.listpack_warning():
            log.warning("redis_listpack_value_low", extra={"node": node.node,
                                                           "advice": warning})
        if node.eviction == UNKNOWN:
            log.warning("redis_eviction_unknown", extra={
                "node": node.node, "advice": "INFO was refused: check with crawlq check "
                "that maxmemory-policy is noeviction; a Redis that evicts loses tasks"})
        elif node.evicting and allow_evicting:
            log.warning("redis_evicts", extra={
                "node": node.node, "maxmemory_policy": node.eviction,
                "advice": f"running anyway (--allow-evicting-redis); {EVICTION_ADVICE}"})
        elif node.evicting:
            log.error("redis_evicts", extra={
                "node": node.node, "maxmemory_policy": node.eviction,
                "exit_code": EXIT_USAGE,
                "advice": f"{EVICTION_ADVICE}; --allow-evicting-redis runs anyway"})
            return EXIT_USAGE
    return None
