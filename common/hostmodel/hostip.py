"""A host's politeness group under ``politeness_key`` = ``ip``: the address its name
resolves to (the server), so the names of one server share a limit.

Names are resolved by the process that enqueues their URLs (the producer for seeds, a
consumer's flusher for links), through the system resolver (``loop.getaddrinfo``: what
aiohttp's default ThreadedResolver calls too, so a name groups by the address the fetch
would find), before the script that records the group: a host's group is known before
its first lease. One address is picked deterministically, so every process names the
same group for the same answer: the lowest IPv4 address, else the lowest IPv6 one.

Grouping is not fetching: the address is never handed to the HTTP client, which
resolves again and applies the SSRF guard (``common.http.ssrf``) to what it connects to.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from common.hostmodel.hostgroup import host_name

#: Names kept (LRU), how long an answer is kept, how long a failure is (the name is tried
#: again after), one lookup's time limit, and lookups at once (each takes a thread of the
#: event loop's default executor while it runs).
CACHE_NAMES = 65536
KEEP_S = 600.0
RETRY_FAILED_S = 60.0
TIMEOUT_S = 2.0
PARALLEL = 16


def literal_address(host: str) -> str | None:
    """The address of an IP-literal host key (``127.0.0.1:8080``, ``[::1]:80``), in
    compressed form; None for a name."""
    name = host_name(host).strip("[]")
    try:
        return ipaddress.ip_address(name).compressed
    except ValueError:
        return None


def pick_address(addresses: Iterable[str]) -> str | None:
    """The address a group is named by, from a name's answer: the lowest IPv4 address,
    else the lowest IPv6 one (None for none)."""
    parsed = {ipaddress.ip_address(a.partition("%")[0]) for a in addresses}
    v4 = sorted(a for a in parsed if isinstance(a, ipaddress.IPv4Address))
    v6 = sorted(a for a in parsed if isinstance(a, ipaddress.IPv6Address))
    best = v4 or v6
    return best[0].compressed if best else None


class AddressBook:
    """The address each host's name resolves to, looked up once in a while: answers kept
    `KEEP_S`, failures `RETRY_FAILED_S`, at most `CACHE_NAMES` names."""

    def __init__(self, *, timeout_s: float = TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._timeout_s = timeout_s
        self._clock = clock
        self._known: OrderedDict[str, tuple[str | None, float]] = OrderedDict()
        self._parallel = asyncio.Semaphore(PARALLEL)

    async def address(self, host: str) -> tuple[str | None, bool]:
        """The address a host key's group is named by, and whether a lookup failed just
        now (None and True; None and False for a failure still remembered)."""
        literal = literal_address(host)
        if literal is not None:
            return literal, False
        name = host_name(host)
        known = self._known.get(name)
        now = self._clock()
        if known is not None and known[1] > now:
            self._known.move_to_end(name)
            return known[0], False
        found = await self._resolve(name)
        self._known[name] = (found, now + (KEEP_S if found else RETRY_FAILED_S))
        self._known.move_to_end(name)
        while len(self._known) > CACHE_NAMES:
            self._known.popitem(last=False)
        return found, found is None

    async def _resolve(self, name: str) -> str | None:
        loop = asyncio.get_running_loop()
        async with self._parallel:
            try:
                infos = await asyncio.wait_for(
                    loop.getaddrinfo(name, None, type=socket.SOCK_STREAM), self._timeout_s)
            except (OSError, UnicodeError, TimeoutError):
                return None
        return pick_address(str(info[4][0]) for info in infos)
