"""How a crawl whose policy says rendering=auto fetches each (host, route) pair's pages
(docs/rendering.md#render-only-where-needed): rendered while it is probed, then over HTTP
where HTTP gave its route the same items and links, else rendered; an operator may set
either for good. The decisions are the fleet's: the crawl's ``render:modes`` HASH
(common/keys.py), written by ``render_vote.lua`` (a probe's verdict) and `set_mode` (an
operator); each process reads them whole at most every `MAX_AGE_S`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from common.codec import text as _text
from common.errors import ConfigError
from common.keys import CrawlKeys
from common.redis.connection import RedisClient
from common.redis.scripts import register

__all__ = ["MODES", "PROBES", "RenderModes", "pair_field"]

#: How long a process trusts its copy of the crawl's decisions.
MAX_AGE_S = 2.0
#: Probes of a pair that must agree (HTTP gave the same) before its pages go over HTTP.
PROBES = 3
#: What ``crawlq render set`` takes: HTTP, rendered, or back to the probes' (auto).
MODES = ("http", "render", "auto")
_SHOWN = {"h": "http", "r": "render", "H": "http (set)", "R": "render (set)"}


def pair_field(host: str, label: str | None) -> str:
    """A pair's field in ``render:modes``: its host key and its route label."""
    return f"{host} {label or ''}"


@dataclass(frozen=True, slots=True)
class Pair:
    """One (host, route) pair's decision, as ``crawlq render`` shows it."""

    host: str
    label: str
    mode: str  # http, render, probing, or http (set) / render (set)
    probes: int  # probes so far (while probing)
    same: int  # of them, the ones where HTTP gave the same


class RenderModes:
    """A process's copy of a crawl's render decisions, and the calls that change them."""

    def __init__(self, client: RedisClient, crawl: str) -> None:
        self.client = client
        self.key = CrawlKeys.build(crawl).render_modes
        self._modes: dict[str, str] = {}
        self._read_at = 0.0
        self._vote = register(client, "render_vote")

    async def refresh(self, max_age: float = MAX_AGE_S) -> None:
        """Read the decisions again if the copy is older than `max_age` seconds."""
        if time.monotonic() - self._read_at < max_age:
            return
        raw = await self.client.hgetall(self.key)
        self._modes = {_text(k): _text(v) for k, v in raw.items()}
        self._read_at = time.monotonic()

    def mode(self, host: str, label: str | None) -> str:
        """``http``, ``render`` or ``probe`` for a pair, by the copy."""
        got = self._modes.get(pair_field(host, label), "")
        if got in ("h", "H"):
            return "http"
        if got in ("r", "R"):
            return "render"
        return "probe"

    async def vote(self, host: str, label: str | None, same: bool) -> str:
        """Count one probe of a pair (render_vote.lua); its mode after."""
        field = pair_field(host, label)
        [mode] = await self._vote(keys=[self.key], args=[field, int(same), PROBES])
        mode = _text(mode)
        self._modes[field] = mode
        return self.mode(host, label)

    async def set_mode(self, host: str, label: str | None, mode: str) -> None:
        """An operator's decision for a pair: http or render for good, or auto (the
        probes decide again)."""
        if mode not in MODES:
            raise ConfigError(f"render mode must be one of {', '.join(MODES)}, got {mode!r}")
        field = pair_field(host, label)
        if mode == "auto":
            await self.client.hdel(self.key, field)
        else:
            await self.client.hset(self.key, field, "H" if mode == "http" else "R")
        self._read_at = 0.0

    async def pairs(self) -> list[Pair]:
        """Every pair with a decision or probes, by host and label."""
        await self.refresh(0)
        out = []
        for field, mode in sorted(self._modes.items()):
            host, _, label = field.partition(" ")
            probes = same = 0
            if mode.startswith("p"):
                seen, _, agreed = mode[1:].partition(",")
                probes, same = int(seen or 0), int(agreed or 0)
            out.append(Pair(host, label, _SHOWN.get(mode, "probing"), probes, same))
        return out
