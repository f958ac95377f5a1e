"""The frontier's host key: which queue, politeness state and partition a URL belongs to.

Politeness is per host key: the URL's host, plus its port when that is not the scheme's
default (two servers on one host name but different ports are two hosts). http and
https of one host share a key: they are one server to be polite to. This is the one
place that decides it (a later version may key by registrable domain or IP).
"""

from __future__ import annotations

import hashlib

from common.errors import MalformedTaskError

_DEFAULT_PORT = {"http": ":80", "https": ":443"}


def host_key(url: str) -> str:
    """The host key of an absolute http(s) URL, as canonical URLs carry it (lowercase,
    IDNA, IPv6 in brackets); MalformedTaskError if it has none."""
    scheme, sep, rest = url.partition("://")
    authority = rest
    for stop in "/?#":
        authority = authority.split(stop, 1)[0]
    authority = authority.rpartition("@")[2].lower()
    default = _DEFAULT_PORT.get(scheme.lower())
    if default and authority.endswith(default):
        authority = authority[: -len(default)]
    if not sep or default is None or not authority or authority.startswith(":") \
            or any(c.isspace() for c in authority):
        raise MalformedTaskError(f"not an http(s) URL with a host: {url[:200]!r}")
    return authority


def partition_of_host(host: str, partitions: int) -> int:
    """The partition (0 <= p < partitions) that holds a host: a stable hash of its key."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    if partitions == 1:
        return 0
    digest = hashlib.blake2b(host.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions
