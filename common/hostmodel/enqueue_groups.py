"""Naming an enqueue's politeness groups for the crawl's ``politeness_key``, which the
enqueuing process learns from the script (enqueue.lua answers a batch named for another
key with the key its partition holds, and the batch is named again): no policy read
before each batch, and a key changed while a process runs is followed at its next batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from common.hostmodel.hostgroup import NO_GROUP, host_group, host_name
from common.hostmodel.hostip import AddressBook

#: What an enqueue sends for a host whose name failed to resolve just now (politeness_key
#: ip): it stays ungrouped, and the script counts it (stats ``group_unresolved``).
UNRESOLVED = "?"


class Grouper:
    """The groups of an enqueue's hosts, as enqueue.lua takes them: the key they are
    named for (``ip``, or ``domain`` for any other: cheap, and the script ignores them
    under ``host``), then one word per host."""

    def __init__(self) -> None:
        self.key = "host"  # the crawl's key as a partition last said it
        self._book: AddressBook | None = None

    def learn(self, key: str) -> None:
        """Take the key a partition holds ('' or ``host``: no groups)."""
        self.key = key or "host"

    async def words(self, hosts: Sequence[str]) -> str:
        """``<key> <group of each host>``, space-separated (NO_GROUP for none)."""
        if self.key != "ip":
            return " ".join(["domain", *(host_group(h) for h in hosts)])
        if self._book is None:
            self._book = AddressBook()
        names = list({host_name(h): None for h in hosts})  # each name once, in order
        found = dict(zip(names, await asyncio.gather(*map(self._book.address, names)),
                         strict=True))
        words = ["ip"]
        for host in hosts:
            address, failed = found[host_name(host)]
            words.append(address or (UNRESOLVED if failed else NO_GROUP))
        return " ".join(words)
