"""Request headers a crawl or a task adds: validation and the credential rule.

The consumer's ``--header`` (the crawl's headers) and the producer's ``--header`` (stored
on each task, key ``h``) go through `checked_headers`: a header is a ``Name: value`` pair
whose name is an RFC 9110 token and whose value is printable ASCII, within `MAX_HEADERS`
headers and `MAX_HEADERS_BYTES` bytes. Names the HTTP client or the crawler set
themselves (framing, hop-by-hop, ``Host``, ``Accept-Encoding``, ``User-Agent``,
``Proxy-Authorization``) are refused with what to use instead.

A header is a *credential* (`is_credential`) when its name, case-insensitively, contains
one of `CREDENTIAL_WORDS`: ``Authorization``, ``Cookie``, ``X-Api-Key``, ``X-Auth-Token``,
``X-Session-Id``, ... Credential values are never shown (`redacted_headers`), never sent
to robots.txt and dropped on a redirect to another origin. Messages name a header, never
echo its value.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from common.errors import CrawlqError

__all__ = ["CREDENTIAL_WORDS", "DEFAULT_USER_AGENT", "MAX_HEADERS", "MAX_HEADERS_BYTES",
           "checked_headers", "is_credential", "parse_header_lines", "redacted_headers"]

#: The crawler's own User-Agent (the policy's ``user_agent`` default): here, low in
#: common, so the policy needs no HTTP client to name it.
DEFAULT_USER_AGENT = "crawlq/0.1 (+https://github.com/crawlq/crawlq)"

MAX_HEADERS = 32
MAX_NAME_CHARS = 128
MAX_HEADERS_BYTES = 8192  # names and values together: servers commonly cap at 8 KiB
CREDENTIAL_WORDS = ("auth", "cookie", "token", "secret", "key", "session", "password",
                    "credential", "signature")
REDACTED = "***"

# Used with fullmatch: a "$" would let one trailing newline through.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_VALUE = re.compile(r"[\t\x20-\x7e]*")
# Set by aiohttp or the fetcher itself; a crawl must not change them.
_REFUSED = {
    "host": "the URL decides it",
    "content-length": "framing is the HTTP client's job",
    "transfer-encoding": "framing is the HTTP client's job",
    "connection": "a hop-by-hop header, managed by the HTTP client",
    "keep-alive": "a hop-by-hop header, managed by the HTTP client",
    "proxy-connection": "a hop-by-hop header, managed by the HTTP client",
    "te": "a hop-by-hop header, managed by the HTTP client",
    "trailer": "a hop-by-hop header, managed by the HTTP client",
    "upgrade": "a hop-by-hop header, managed by the HTTP client",
    "expect": "the fetcher sends a body whole, without a 100-continue handshake",
    "accept-encoding": "the fetcher decompresses and caps bodies itself",
    "user-agent": "use --user-agent (robots.txt rules are matched on it)",
    "proxy-authorization": "put proxy credentials in the --proxy URL",
}


def is_credential(name: str) -> bool:
    """Whether a header named `name` carries a credential (see the module docstring)."""
    lower = name.lower()
    return any(word in lower for word in CREDENTIAL_WORDS)


def redacted_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """`headers` with every credential value replaced by ``***``: what may be shown."""
    return {k: REDACTED if is_credential(k) else v for k, v in headers.items()}


def parse_header_lines(lines: Iterable[str], error: type[CrawlqError],
                       where: str) -> dict[str, str]:
    """``Name: value`` strings (``--header``) as a checked dict; `error` if one is bad."""
    pairs = []
    for i, line in enumerate(lines, 1):
        name, sep, value = line.partition(":")
        if not sep:  # nothing of it is echoed: it may be a bare secret
            raise error(f"{where}: header {i} is not 'Name: value' (no ':' in it)")
        pairs.append((name.strip(), value.strip()))
    return checked_headers(pairs, error, where)


def checked_headers(pairs: Iterable[tuple[object, object]], error: type[CrawlqError],
                    where: str) -> dict[str, str]:
    """The (name, value) pairs as a dict, or `error` saying which header is wrong and why
    (each message starts with `where`, e.g. the option it came from).

    Names are kept as written; one name given twice (in any case) is an error.
    """
    out: dict[str, str] = {}
    seen: set[str] = set()
    size = 0
    for i, (name, value) in enumerate(pairs, 1):
        if i > MAX_HEADERS:
            raise error(f"{where}: more than {MAX_HEADERS} headers")
        if not isinstance(name, str) or not isinstance(value, str):
            raise error(f"{where}: headers must map header names to string values")
        if not _TOKEN.fullmatch(name) or len(name) > MAX_NAME_CHARS:  # not echoed: a secret?
            raise error(f"{where}: header {i}: its name is not an HTTP token of at most "
                        f"{MAX_NAME_CHARS} characters (letters, digits, -, ...)")
        lower = name.lower()
        why = _REFUSED.get(lower)
        if why is not None:
            raise error(f"{where}: header {name!r} can't be set: {why}")
        if lower in seen:
            raise error(f"{where}: header {name!r} is given twice")
        if not _VALUE.fullmatch(value):
            raise error(f"{where}: header {name!r} has a value with a control or non-ASCII "
                        "character: use printable ASCII (percent-encode the rest)")
        seen.add(lower)
        size += len(name) + len(value)
        if size > MAX_HEADERS_BYTES:
            raise error(f"{where}: headers hold more than {MAX_HEADERS_BYTES} bytes")
        out[name] = value
    return out
