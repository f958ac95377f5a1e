"""A proxy of the pool as a consumer knows it: its URL, its tier, its id, how it is shown.

A ``--proxy`` value is ``[TIER=]URL``: ``residential=http://user:pass@gate.example:8000``
puts that proxy in tier ``residential``; a URL alone is in `DEFAULT_TIER`. The tier
``direct`` is no proxy at all (the consumer's own address): it is a tier of the pool only
when the crawl's ``proxy_tiers`` names it.

A proxy's id is the first 12 hex digits of the BLAKE2b of its scheme, user name, host and
port: the same proxy has the same id in every consumer that has it, whatever its
password, and nothing that leads back to the password is kept in Redis. Its shown form is
the URL with its user info redacted (``http://***@gate.example:8000``), the one form logs,
``crawlq proxies`` and the dashboard print.
"""

from __future__ import annotations

import argparse
import hashlib
import re
from dataclasses import dataclass

from yarl import URL

from common.urls.redact import redact_url

__all__ = ["DEFAULT_TIER", "DIRECT", "DIRECT_ID", "ProxySpec", "proxy_id", "proxy_spec",
           "tier_names"]

#: The tier of a ``--proxy`` URL that names none.
DEFAULT_TIER = "datacenter"
#: The tier (and the id) of no proxy: a request from the consumer's own address.
DIRECT_ID = "direct"
_TIER = re.compile(r"[a-z][a-z0-9_-]{0,31}")


def _tier_ok(name: str) -> str:
    if not _TIER.fullmatch(name):
        raise argparse.ArgumentTypeError(
            f"{name!r} is not a tier name (a-z, then a-z, 0-9, _ or -, at most 32)")
    return name


def tier_names(text: str) -> tuple[str, ...]:
    """Comma-separated tier names, cheapest first (repeats dropped); at least one."""
    names = tuple(dict.fromkeys(_tier_ok(n.strip().lower()) for n in str(text).split(",")
                                if n.strip()))
    if not names:
        raise argparse.ArgumentTypeError("name at least one tier (e.g. direct,datacenter)")
    return names


def proxy_id(url: str) -> str:
    """A proxy's id: 12 hex digits of a hash of its scheme, user, host and port."""
    try:
        parsed = URL(url)
        who = f"{parsed.scheme}://{parsed.raw_user or ''}@{parsed.raw_host}:{parsed.port}"
    except (ValueError, TypeError):  # refused by the fetcher's settings, never echoed
        who = ""
    return hashlib.blake2b(who.encode(), digest_size=6).hexdigest()


@dataclass(frozen=True, slots=True)
class ProxySpec:
    """One proxy of a consumer: its URL (None: direct), tier, id and shown form."""

    url: str | None
    tier: str
    id: str
    shown: str

    def __repr__(self) -> str:  # never the URL: it may hold a password
        return f"ProxySpec({self.shown!r}, tier={self.tier!r}, id={self.id!r})"

    @classmethod
    def of(cls, url: str, tier: str = DEFAULT_TIER) -> ProxySpec:
        return cls(url, tier, proxy_id(url), redact_url(url))


#: No proxy: the tier `direct`.
DIRECT = ProxySpec(None, DIRECT_ID, DIRECT_ID, DIRECT_ID)


def proxy_spec(text: str) -> ProxySpec:
    """A ``--proxy`` value, ``[TIER=]URL``, as a ProxySpec (argparse's error on a bad
    tier; the URL is checked by the fetcher's settings, never echoed)."""
    tier, eq, url = str(text).partition("=")
    if not eq or "://" in tier:
        return ProxySpec.of(str(text))
    tier = _tier_ok(tier.strip().lower())
    if tier == DIRECT_ID:
        raise argparse.ArgumentTypeError("tier direct is no proxy: name it in the crawl's "
                                         "proxy_tiers instead")
    return ProxySpec.of(url.strip(), tier)
