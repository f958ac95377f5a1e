"""A URL as logs, errors and reprs show it: its credentials left out."""

from __future__ import annotations


def redact_url(url: str) -> str:
    """`url` with any userinfo (`user:pass@`) replaced by `***@`; never raises.

    For logs, errors and reprs of Redis and proxy URLs.
    """
    sep = url.find("://")
    start = sep + 3 if sep >= 0 else 0
    end = len(url)
    for ch in "/?#":
        i = url.find(ch, start)
        if i != -1 and i < end:
            end = i
    at = url.rfind("@", start, end)
    if at == -1:
        return url
    return f"{url[:start]}***{url[at:]}"
