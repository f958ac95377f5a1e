"""SSRF guard for the consumer's HTTP client: refuse non-public addresses before connecting.

Three layers, all driven by one `SsrfGuard`:

- `GuardedResolver` wraps aiohttp's default resolver and drops every resolved address the
  guard refuses (DNS answers that mix public and private addresses keep only the public
  ones; answers with no public address raise `FetchError("ssrf_blocked")`). aiohttp caches
  the filtered answer, so the DNS cache never holds a refused address.
- `SsrfGuard.socket_factory` is passed to `aiohttp.TCPConnector(socket_factory=...)`. aiohttp
  (through aiohappyeyeballs) calls it with the exact address it is about to `connect()` to,
  so it sees every connection, including IP-literal hosts, for which aiohttp skips the
  resolver entirely (`TCPConnector._resolve_host` short-circuits on `is_ip_address`), and
  including connections to a proxy. It raises before the socket exists: a refused address
  is never connected to.
- The fetcher also checks IP-literal URL hosts itself before each hop (`literal_host_ip`),
  for a clean error and because, through a proxy, the proxy connects, not us.

With an HTTP proxy the proxy resolves names itself, so for names the guard can only check
the proxy's own address; IP-literal targets are still checked by the fetcher.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from common import reasons
from common.errors import FetchError

if TYPE_CHECKING:
    from aiohappyeyeballs import AddrInfoType

__all__ = [
    "GuardedResolver",
    "IPNetwork",
    "SsrfGuard",
    "SsrfSocketError",
    "literal_host_ip",
    "ssrf_error_from",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network

# Named IPv4 ranges; anything `not is_global` is refused as well (this list only names them).
_BLOCKED_V4: tuple[tuple[ipaddress.IPv4Network, str], ...] = (
    (_V4("255.255.255.255/32"), "broadcast"),
    (_V4("0.0.0.0/8"), "unspecified/this-network"),
    (_V4("10.0.0.0/8"), "private"),
    (_V4("100.64.0.0/10"), "carrier-grade NAT"),
    (_V4("127.0.0.0/8"), "loopback"),
    (_V4("169.254.0.0/16"), "link-local"),
    (_V4("172.16.0.0/12"), "private"),
    (_V4("192.0.0.0/24"), "IETF protocol assignments"),
    (_V4("192.168.0.0/16"), "private"),
    (_V4("198.18.0.0/15"), "benchmarking"),
    (_V4("224.0.0.0/4"), "multicast"),
    (_V4("240.0.0.0/4"), "reserved"),
)
_NAT64 = _V6("64:ff9b::/96")  # RFC 6052 well-known prefix: last 32 bits are the IPv4 target
_NAT64_LOCAL = _V6("64:ff9b:1::/48")  # RFC 8215 local-use NAT64: site-specific, refuse
_V4_COMPAT = _V6("::/96")  # deprecated IPv4-compatible ::a.b.c.d
_BLOCKED_V6: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (_V6("::/128"), "unspecified"),
    (_V6("::1/128"), "loopback"),
    (_V6("fc00::/7"), "unique-local (private)"),
    (_V6("fe80::/10"), "link-local"),
    (_V6("fec0::/10"), "site-local"),
    (_V6("ff00::/8"), "multicast"),
    (_NAT64_LOCAL, "local-use NAT64"),
)


def _embedded_v4(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, compatible, 6to4, NAT64), if any."""
    mapped = addr.ipv4_mapped
    if mapped is not None:
        return mapped
    if addr in _NAT64 or (addr in _V4_COMPAT and int(addr) > 0xFFFF):
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return addr.sixtofour


def _refusal(addr: IPAddress) -> str | None:
    """Why `addr` is not a public unicast address, or None if it is."""
    if isinstance(addr, ipaddress.IPv4Address):
        for net, name in _BLOCKED_V4:
            if addr in net:
                return name
        if not addr.is_global or addr.is_multicast:
            return "non-global"
        return None
    embedded = _embedded_v4(addr)
    if embedded is not None:
        if addr in _V4_COMPAT:
            return f"deprecated IPv4-compatible form of {embedded}"
        why = _refusal(embedded)
        return None if why is None else f"embeds {embedded} ({why})"
    for net6, name in _BLOCKED_V6:
        if addr in net6:
            return name
    if addr.is_reserved:  # ::/8 (incl. IPv4-translated ::ffff:0:a.b.c.d), 4000::/3, ...
        return "reserved"
    if not addr.is_global or addr.is_multicast:
        return "non-global"
    return None


class SsrfGuard:
    """Refuses loopback, private, link-local, CGNAT, multicast, reserved and unspecified addresses.

    IPv6 forms that carry an IPv4 address (IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible
    `::a.b.c.d`, 6to4 `2002::/16`, NAT64 `64:ff9b::/96`) are judged by that IPv4 address.
    `allow_private=True` turns the guard off; an address inside `allow_networks` (or whose
    embedded IPv4 address is) is always allowed.
    """

    __slots__ = ("_allow_networks", "allow_private")

    def __init__(
        self, allow_private: bool = False, allow_networks: Sequence[IPNetwork] = ()
    ) -> None:
        self.allow_private = allow_private
        self._allow_networks: tuple[IPNetwork, ...] = tuple(
            ipaddress.ip_network(n) if isinstance(n, str) else n for n in allow_networks
        )

    @property
    def allow_networks(self) -> tuple[IPNetwork, ...]:
        return self._allow_networks

    def _allowed(self, addr: IPAddress) -> bool:
        if not self._allow_networks:
            return False
        candidates: list[IPAddress] = [addr]
        if isinstance(addr, ipaddress.IPv6Address):
            embedded = _embedded_v4(addr)
            if embedded is not None:
                candidates.append(embedded)
        return any(
            a.version == n.version and a in n for a in candidates for n in self._allow_networks
        )

    def refusal(self, ip: str) -> str | None:
        """Why the guard refuses `ip` (a textual IPv4/IPv6 address), or None if it allows it."""
        if self.allow_private:
            return None
        try:
            addr = ipaddress.ip_address(ip)
        except ValueError:
            return "not an IP address"
        why = _refusal(addr)
        if why is None or self._allowed(addr):
            return None
        return why

    def check(self, ip: str) -> None:
        """Raise `FetchError("ssrf_blocked", retryable=False)` unless `ip` may be connected to."""
        why = self.refusal(ip)
        if why is not None:
            raise FetchError(reasons.SSRF_BLOCKED, f"address {ip} refused: {why}", retryable=False)

    def socket_factory(self, addr_info: AddrInfoType) -> socket.socket:
        """`TCPConnector(socket_factory=...)` hook: check the address about to be connected to."""
        family, type_, proto, _, address = addr_info
        if not self.allow_private:
            host = address[0]
            why = self.refusal(host)
            if why is not None:
                raise SsrfSocketError(FetchError(
                    reasons.SSRF_BLOCKED, f"address {host} refused: {why}", retryable=False
                ))
        return socket.socket(family=family, type=type_, proto=proto)


class SsrfSocketError(PermissionError):
    """Raised by `SsrfGuard.socket_factory`; an OSError so aiohttp wraps it as a connect error."""

    def __init__(self, error: FetchError) -> None:
        super().__init__(errno.EACCES, str(error))
        self.fetch_error = error


def ssrf_error_from(exc: BaseException) -> FetchError | None:
    """The `ssrf_blocked` FetchError behind an aiohttp connection error, if that is what it is."""
    seen: BaseException | None = exc
    for _ in range(4):  # ClientConnectorError -> os_error / __cause__, at most a few deep
        if seen is None:
            return None
        if isinstance(seen, SsrfSocketError):
            return seen.fetch_error
        if isinstance(seen, FetchError):
            return seen if seen.reason == reasons.SSRF_BLOCKED else None
        if isinstance(seen, aiohttp.ClientConnectorError):
            seen = seen.os_error
            continue
        if isinstance(seen, OSError) and "ssrf_blocked:" in str(seen):
            # aiohappyeyeballs folds several failed attempts into one plain OSError.
            return FetchError(reasons.SSRF_BLOCKED, str(seen), retryable=False)
        seen = seen.__cause__
    return None


def literal_host_ip(host: str | None) -> str | None:
    """`host` as a canonical IP string if it is an IP literal (brackets allowed), else None."""
    if not host:
        return None
    first = host[0]
    if not (first.isdigit() or first in ":[" or ":" in host):
        return None  # cheap reject for ordinary names
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


class GuardedResolver(AbstractResolver):
    """An aiohttp resolver that returns only the addresses the guard allows.

    Wraps `aiohttp.DefaultResolver` (ThreadedResolver unless aiodns is installed) unless
    another resolver is given. If every resolved address is refused, raises
    `FetchError("ssrf_blocked")`, which aiohttp lets propagate unwrapped (it is no OSError).
    """

    def __init__(self, guard: SsrfGuard, resolver: AbstractResolver | None = None) -> None:
        self._guard = guard
        self._resolver = resolver if resolver is not None else aiohttp.DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        infos = await self._resolver.resolve(host, port, family)
        guard = self._guard
        if guard.allow_private:
            return infos
        allowed: list[ResolveResult] = []
        refused: list[str] = []
        for info in infos:
            why = guard.refusal(info["host"])
            if why is None:
                allowed.append(info)
            else:
                refused.append(f"{info['host']} ({why})")
        if not allowed and refused:
            raise FetchError(
                reasons.SSRF_BLOCKED,
                f"{host} resolves only to refused addresses: {', '.join(refused[:4])}",
                retryable=False,
            )
        return allowed

    async def close(self) -> None:
        await self._resolver.close()
