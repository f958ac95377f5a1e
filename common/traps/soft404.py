"""Soft 404s: a 200 page where a missing page should be.

A host that answers any path with a 200 "not found" page (a catch-all, at its root or
under one directory) makes URLs without end, each such page linking more paths that
don't exist either. Its pages are found by probing (Bar-Yossef, Broder, Kumar and
Tomkins, "Sic transit gloria telae", WWW 2004; Google's soft-404 handling): ask the host
for a path that cannot exist (`probe_url`); what it answers is the directory's
**signature** (`Signature`): ``none`` when it answers as a missing page should (a 4xx),
a ``redirect`` to where it sent the probe, or the ``page`` it answered with 2xx (its
title and a sketch of its words). A page at or under that directory that matches it
(`matches`) is a soft 404, whatever its length: the same final URL as the probe's
redirect, or the same title and words (those of its own URL left out, as a catch-all
echoes the path it was asked for) as the probe's page.

The words are compared by a bottom-k sketch (Broder 1997): the `SKETCH` smallest 32-bit
hashes of a page's distinct words, ~1.4 KB stored a signature; two sketches estimate the
resemblance of two word sets (exactly for pages of fewer words), the words of both pages'
URLs left out of both, and a page is the signature's at `RESEMBLANCE` or more.
"""

from __future__ import annotations

import base64
import binascii
import heapq
import html
import json
import os
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import unquote

from common.traps import simhash
from common.urls.shape import url_words

__all__ = ["RESEMBLANCE", "SKETCH", "Signature", "matches", "norm_title", "probe_url",
           "resemblance", "sketch", "title_of", "unechoed", "url_hashes"]

#: Hashes a sketch keeps.
SKETCH = 256
#: The least resemblance of a page's words to a signature's for a soft 404.
RESEMBLANCE = 0.8
NONE, REDIRECT, PAGE = "none", "redirect", "page"
_TITLE = re.compile(rb"<title[^>]*>(.*?)</title", re.IGNORECASE | re.DOTALL)
_WORD = re.compile(r"[^\W_]+")
#: Where a page's title is looked for: the head of any real page.
_HEAD = 32768
_NAME = "abcdefghijklmnopqrstuvwxyz0123456789"


def title_of(body: bytes) -> str:
    """The text of an HTML body's first ``<title>`` (in its first 32 KB), or ''."""
    found = _TITLE.search(body, 0, _HEAD)
    if found is None:
        return ""
    return html.unescape(found.group(1).decode("utf-8", "replace"))


def norm_title(title: str, url: str) -> str:
    """`title`'s words, lowercased, without the words of `url` (a catch-all's title may
    name the path it was asked for)."""
    own = url_words(url)
    return " ".join(w for w in (m.lower() for m in _WORD.findall(title)) if w not in own)


def unechoed(text: str, url: str) -> str:
    """`text` without the path of `url` where it names it (a catch-all's "/old/x.html
    was not found", a listing's "Index of /files/a/b/")."""
    after = url.find("/", url.find("://") + 3)
    path = url[after:].partition("?")[0].partition("#")[0] if after >= 0 else "/"
    return text.replace(unquote(path), " ") if len(path) > 1 else text


def sketch(text: str) -> tuple[int, ...]:
    """The bottom-`SKETCH` 32-bit hashes of `text`'s distinct words, ascending."""
    return tuple(sorted({h >> 32 for h in simhash.word_hashes(text)})[:SKETCH])


def url_hashes(url: str) -> frozenset[int]:
    """The 32-bit hashes of `url`'s words (as `sketch` hashes a text's)."""
    return frozenset(h >> 32 for h in simhash.word_hashes(" ".join(url_words(url))))


def resemblance(a: Iterable[int], b: Iterable[int]) -> float:
    """The estimated resemblance (Jaccard) of the word sets two sketches stand for."""
    sa, sb = set(a), set(b)
    union = heapq.nsmallest(min(SKETCH, len(sa), len(sb)) or SKETCH, sa | sb)
    if not union:
        return 1.0
    return sum(1 for h in union if h in sa and h in sb) / len(union)


@dataclass(frozen=True, slots=True)
class Signature:
    """What a host answered a probe for a missing path under `directory`."""

    directory: str
    kind: str  # NONE, REDIRECT or PAGE
    title: str = ""  # PAGE: its normalized title (norm_title)
    target: str = ""  # REDIRECT: the final URL's path and query
    sketch: tuple[int, ...] = ()  # PAGE: its words' sketch
    url: frozenset[int] = frozenset()  # PAGE: its URL's words' hashes (url_hashes)

    def encode(self) -> bytes:
        """The signature as Redis keeps it (JSON, the hashes packed in base64)."""
        return json.dumps({"k": self.kind, "t": self.title, "r": self.target,
                           "s": _packed(self.sketch), "u": _packed(sorted(self.url))},
                          separators=(",", ":")).encode()

    @classmethod
    def decode(cls, directory: str, value: bytes | str) -> Signature | None:
        """A stored signature; None when it is not one."""
        try:
            d = json.loads(value)
            sig = cls(directory, str(d["k"]), str(d.get("t", "")), str(d.get("r", "")),
                      _unpacked(d.get("s", "")), frozenset(_unpacked(d.get("u", ""))))
        except (ValueError, TypeError, KeyError, struct.error, binascii.Error):
            return None
        return sig if sig.kind in (NONE, REDIRECT, PAGE) else None


def _packed(hashes: Iterable[int]) -> str:
    data = list(hashes)
    return base64.b64encode(struct.pack(f"<{len(data)}I", *data)).decode()


def _unpacked(text: str) -> tuple[int, ...]:
    data = base64.b64decode(text)
    return struct.unpack(f"<{len(data) // 4}I", data)


def _path_qs(url: str) -> str:
    after = url.find("/", url.find("://") + 3)
    return "/" if after < 0 else url[after:].partition("#")[0]


def matches(sig: Signature, *, final_url: str, redirected: bool, title: str,
            words: tuple[int, ...] | None, url: frozenset[int] = frozenset()) -> bool:
    """Whether a 2xx page (fetched at `final_url`, after a redirect or not) is `sig`'s
    soft 404: `title` normalized (`norm_title`), `words` its sketch (None: not taken,
    for a page whose title is not the signature's), `url` its URL's words' hashes; the
    words of either URL are left out of both (a catch-all echoes the path it was asked
    for, and a listing's links name the paths below it)."""
    if sig.kind == REDIRECT:
        return redirected and _path_qs(final_url) == sig.target
    if sig.kind != PAGE or title != sig.title or words is None:
        return False
    echoed = url | sig.url
    return resemblance((h for h in words if h not in echoed),
                       (h for h in sig.sketch if h not in echoed)) >= RESEMBLANCE


def applies(sig: Signature, url: str) -> bool:
    """Whether `sig` judges `url`: `url`'s path is at or under its directory."""
    return _path_qs(url).startswith(sig.directory)


def probe_url(origin: str, directory: str, like: str) -> str:
    """A URL under `directory` of `origin` (``scheme://authority``) that cannot exist,
    shaped as the path `like` ends (a name with its extension, or a directory)."""
    raw = os.urandom(16)  # a letter first, a digit in it: a name no page has
    name = _NAME[raw[0] % 26] + "".join(_NAME[b % len(_NAME)] for b in raw[1:15]) \
        + _NAME[26 + raw[15] % 10]
    last = like.rpartition("/")[2].partition("?")[0]
    ext = last[last.rfind("."):] if "." in last else ""
    tail = "/" if like.endswith("/") else ext if ext.isascii() and len(ext) <= 6 else ""
    return f"{origin}{directory}{name}{tail}"


def signature_of(directory: str, status: int, url: str, final_url: str, *, title: str,
                 text: str | None) -> Signature:
    """The signature of a probe for `url` answered `status` at `final_url` with a page
    of `title` (raw) and `text` (None: none read)."""
    if not 200 <= status <= 299:
        return Signature(directory, NONE)
    if final_url != url:
        return Signature(directory, REDIRECT, target=_path_qs(final_url))
    return Signature(directory, PAGE, norm_title(title, url),
                     sketch=sketch(unechoed(text or "", url)), url=url_hashes(url))
