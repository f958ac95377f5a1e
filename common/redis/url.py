"""Redis URLs: the forms crawlq takes, checked before anything connects.

- ``redis://[user:password@]host[:port][/db]``, ``rediss://`` (TLS), ``unix:///path``:
  one server (or any node of a Redis Cluster), as redis-py reads them.
- ``redis+sentinel://[user:password@]host:port[,host:port...]/<master name>[/<db>]``
  and its TLS twin ``rediss+sentinel://``: the primary that these Sentinels name,
  found again through them after a failover. The user and password are the data
  nodes' (ACL as for ``redis://``); Sentinels that ask for their own login take
  ``?sentinel_username=`` / ``?sentinel_password=``.

Each form takes redis-py's query options (``?socket_timeout=5``, ``?ssl_cert_reqs=none``).
Every mistake (scheme, host, port, master name, db, an unknown or malformed option) is
one `ConfigError` saying what is wrong, never a traceback from redis-py's parser.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from redis.asyncio.connection import URL_QUERY_ARGUMENT_PARSERS, parse_url

from common.errors import ConfigError

SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel")
#: Query options redis-py passes through as text (TLS files and settings, a name).
_TEXT_OPTIONS = frozenset({
    "ssl_cert_reqs", "ssl_ca_certs", "ssl_ca_path", "ssl_ca_data", "ssl_certfile",
    "ssl_keyfile", "ssl_password", "client_name", "lib_name", "lib_version",
})
_SENTINEL_OPTIONS = frozenset({"sentinel_username", "sentinel_password"})
FORMS = ("redis://[user:password@]host[:port][/db], rediss:// (TLS), unix:///path, or "
         "redis+sentinel://[user:password@]host:port[,host:port...]/<master name>[/<db>] "
         "(rediss+sentinel:// for TLS)")


@dataclass(frozen=True)
class SentinelUrl:
    """A ``redis+sentinel://`` URL, taken apart."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    #: Keyword arguments of the primary's connections (db, login, TLS, query options).
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: Keyword arguments of the connections to the Sentinels (login, TLS).
    sentinel_kwargs: dict[str, Any] = field(default_factory=dict)


def _port(text: str, where: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ConfigError(f"port {text!r} of {where} is not a number from 1 to 65535")
    return int(text)


def _options(query: str, allowed: frozenset[str]) -> None:
    """Refuse query options redis-py would not take (they fail at the first connect)."""
    for name in parse_qs(query, keep_blank_values=True):
        if name not in allowed:
            known = ", ".join(sorted(allowed))
            raise ConfigError(f"unknown option {name!r} in the Redis URL; known: {known}")


_PLAIN_OPTIONS = frozenset(URL_QUERY_ARGUMENT_PARSERS) | _TEXT_OPTIONS


def _plain(url: str) -> None:
    """Check a redis://, rediss:// or unix:// URL as redis-py will read it."""
    parts = urlsplit(url)
    if parts.scheme != "unix":
        netloc = parts.netloc.rpartition("@")[2]
        if not netloc:
            raise ConfigError("the Redis URL names no host (e.g. redis://localhost:6379/0)")
        if "," in netloc:
            raise ConfigError("several hosts in a Redis URL need redis+sentinel:// "
                              "(a Sentinel list)")
        host, _, port = netloc.rpartition(":") if not netloc.endswith("]") else (netloc, "", "")
        if port and host:
            _port(port, "the Redis URL")
        db = unquote(parts.path).strip("/")
        if db and not db.isdigit():
            raise ConfigError(f"database {db!r} of the Redis URL is not a number")
    _options(parts.query, _PLAIN_OPTIONS)
    try:
        parse_url(url)
    except ValueError as exc:
        raise ConfigError(f"{exc}") from None


def parse_sentinel(url: str) -> SentinelUrl:
    """A ``redis+sentinel://`` (or ``rediss+sentinel://``) URL taken apart."""
    parts = urlsplit(url)
    tls = parts.scheme == "rediss+sentinel"
    userinfo, _, hosts = parts.netloc.rpartition("@")
    if not hosts:
        raise ConfigError("the Redis URL names no Sentinel (e.g. "
                          "redis+sentinel://sentinel-1:26379,sentinel-2:26379/mymaster)")
    sentinels = []
    for item in hosts.split(","):
        host, sep, port = item.rpartition(":")
        if not sep or not host:
            raise ConfigError(f"Sentinel {item!r} of the Redis URL is not host:port")
        sentinels.append((host.strip("[]"), _port(port, f"Sentinel {item!r}")))
    path = [unquote(p) for p in parts.path.split("/")[1:]]
    if not path or not path[0]:
        raise ConfigError("the Redis URL names no master: redis+sentinel://host:port"
                          "[,host:port...]/<master name>[/<db>]")
    if len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise ConfigError(f"{parts.path!r} of the Redis URL is not /<master name>[/<db>]")
    _options(parts.query, _PLAIN_OPTIONS | _SENTINEL_OPTIONS)
    query = parse_qs(parts.query)
    sentinel_kwargs: dict[str, Any] = {"ssl": tls} if tls else {}
    for name in _SENTINEL_OPTIONS:
        if name in query:
            sentinel_kwargs[name.removeprefix("sentinel_")] = query.pop(name)[0]
    rest = "&".join(f"{k}={v}" for k, vs in query.items() for v in vs)
    db = path[1] if len(path) == 2 else "0"
    login = f"{userinfo}@" if userinfo else ""
    try:  # the data nodes' options, read as redis-py reads a redis:// URL
        kwargs: dict[str, Any] = dict(parse_url(f"redis://{login}sentinel/{db}?{rest}"))
    except ValueError as exc:
        raise ConfigError(f"{exc}") from None
    kwargs.pop("host", None)
    if tls:
        kwargs["ssl"] = True
    for name in ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        if tls and name in kwargs:
            sentinel_kwargs[name] = kwargs[name]
    return SentinelUrl(tuple(sentinels), path[0], kwargs, sentinel_kwargs)


def is_sentinel(url: str) -> bool:
    return url.split("://", 1)[0] in ("redis+sentinel", "rediss+sentinel")


def check_redis_url(url: str) -> None:
    """Raise `ConfigError` unless `url` is a Redis URL crawlq can use."""
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in SCHEMES:
        raise ConfigError(f"{'scheme ' + repr(scheme) if scheme else 'no scheme'} in the "
                          f"Redis URL; use {FORMS}")
    if is_sentinel(url):
        parse_sentinel(url)
    else:
        _plain(url)
