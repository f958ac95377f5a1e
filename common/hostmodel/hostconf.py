"""A host's settings as Redis keeps them: the ``hostconf`` HASH's value for the host,
``"delay,conc,budget,used,blocked,robots,reserved[,level,pace,pb_at,pb_done,fade,pushbacks,lat]"``
(ms and counts; an empty field is unset; a value written before ``reserved`` existed has
six fields, one of a host that never pushed back seven; the rest is its push-back state,
lib/backoff.lua, and its response time, lib/hosts.lua's note_elapsed). lib/hosts.lua's
``conf_decode`` / ``conf_encode`` are the scripts' side; this is Python's, the one place
that names the fields."""

from __future__ import annotations

from dataclasses import dataclass

from common.codec import text

FIELDS = ("delay", "conc", "budget", "used", "blocked", "robots", "reserved", "level", "pace",
          "pb_at", "pb_done", "fade", "pushbacks", "lat")


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
    level: int | None = None  # backoff level (push-backs in a row, less what was forgiven)
    pace: int | None = None  # the delay its push-back taught (ms, fading: pace_at)
    pb_at: int | None = None  # when its last push-back came (ms of Redis TIME)
    pb_done: int | None = None  # its done count then
    fade: int | None = None  # the pace's half-life (ms)
    pushbacks: int | None = None  # push-backs it gave
    lat: int | None = None  # its response time (ms, moving average; adaptive_delay on)

    def adaptive_ms(self, adapt: int, max_delay_ms: int) -> int:
        """The delay its response time gives under the crawl's adaptive_delay (`adapt`,
        in thousandths; 0: off): lib/hosts.lua's host_limits."""
        if adapt <= 0 or self.lat is None:
            return 0
        return min(max_delay_ms, int(self.lat * adapt / 1000 + 0.5))

    def pace_at(self, now_ms: int) -> int:
        """The delay its push-back taught, at `now_ms`: lib/hosts.lua's pace_now."""
        if not self.pace or self.pace <= 0:
            return 0
        quiet = now_ms - (self.blocked or 0)
        if quiet <= 0:
            return self.pace
        paced = self.pace * 2 ** (-quiet / max(self.fade or 1, 1))
        return 0 if paced < 1 else int(paced + 0.5)

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
