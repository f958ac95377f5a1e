"""A host's settings as Redis keeps them: the ``hostconf`` HASH's value for the host,
``"delay,conc,budget,used,blocked,robots,reserved"`` (ms and counts; an empty field is
unset; a value written before ``reserved`` existed has six fields). lib/hosts.lua's
``conf_decode`` / ``conf_encode`` are the scripts' side; this is Python's, the one place
that names the fields."""

from __future__ import annotations

from dataclasses import dataclass

from common.codec import text

FIELDS = ("delay", "conc", "budget", "used", "blocked", "robots", "reserved")


@dataclass(frozen=True, slots=True)
class HostConf:
    """One host's settings (None: unset, the crawl's default applies)."""

    delay: int | None = None  # ms between requests
    conc: int | None = None  # requests in flight (0: no limit)
    budget: int | None = None  # pages it may be fetched
    used: int | None = None  # pages of the budget fetched
    blocked: int | None = None  # no request before this (ms of Redis TIME)
    robots: int | None = None  # robots.txt's Crawl-delay (ms)
    reserved: int | None = None  # leases holding a page of the budget

    @classmethod
    def decode(cls, value: bytes | str | None) -> HostConf:
        """The settings of a hostconf value (None: a host without any)."""
        if not value:
            return cls()
        fields = (text(value).split(",") + [""] * len(FIELDS))[:len(FIELDS)]
        return cls(*(int(f) if f else None for f in fields))

    @property
    def budget_spent(self) -> bool:
        """Whether a budget is set and its pages used and held fill it."""
        return (self.budget is not None
                and (self.used or 0) + (self.reserved or 0) >= self.budget)
