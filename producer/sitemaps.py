"""Sitemap sources: robots.txt ``Sitemap:`` lines, sitemap indexes, gzipped sitemaps.

Every document is fetched through the consumer's :class:`common.http.fetcher.Fetcher`, so the
same SSRF guard, timeouts and body cap apply as for crawling. XML is parsed with a
streaming ``lxml.etree.iterparse`` (no DTDs, no entities, no network), each element is
freed as soon as its ``<loc>`` is read, and gzip is decompressed while parsing with a cap
on the decompressed size (the sitemap protocol's 50 MB), so a hostile sitemap cannot blow
memory up.

``--sitemap URL`` accepts a robots.txt URL (every ``Sitemap:`` line is followed), a
sitemap index (every child is followed, nested indexes up to :data:`MAX_DEPTH`) or a
plain ``<urlset>`` sitemap.
"""

from __future__ import annotations

import gzip
import io
import logging
from collections.abc import AsyncGenerator, Iterator
from typing import IO

from lxml import etree
from protego import Protego

from common.errors import FetchError, SourceError
from common.http.fetcher import Fetcher
from common.http.results import FetchSettings
from common.urls.redact import redact_url
from producer.sources import Chunk

__all__ = ["MAX_DEPTH", "MAX_SITEMAPS", "SitemapReader", "fetch_settings"]

log = logging.getLogger("producer.sitemaps")

MAX_DEPTH = 3
MAX_SITEMAPS = 50_000  # per --sitemap: the protocol's limit on an index's children
MAX_DECOMPRESSED = 50 * 1024 * 1024  # the protocol's limit on one sitemap, uncompressed
MAX_FETCHED = 50 * 1024 * 1024
CHUNK_LINES = 1000


def fetch_settings(allow_private: bool) -> FetchSettings:
    """How sitemaps are fetched: the consumer's guard and caps, with a sitemap-sized body cap."""
    return FetchSettings(
        allow_private=allow_private, max_body_bytes=MAX_FETCHED, total_timeout=120.0,
        sock_read_timeout=30.0, concurrency=4, limit_per_host=4,
    )


class _CappedReader(io.RawIOBase):
    """A read-only stream that refuses to give more than ``cap`` bytes."""

    def __init__(self, inner: IO[bytes] | gzip.GzipFile, cap: int, name: str) -> None:
        self._inner = inner
        self._left = cap
        self._cap = cap
        self._name = name

    def readable(self) -> bool:
        return True

    def readinto(self, buf: memoryview) -> int:  # type: ignore[override]
        data = self._inner.read(min(len(buf), self._left + 1))
        if len(data) > self._left:
            raise SourceError(f"sitemap {self._name} is over {self._cap} bytes uncompressed")
        self._left -= len(data)
        buf[:len(data)] = data
        return len(data)


def _local(tag: object) -> str:
    text = str(tag)
    return text.rpartition("}")[2] if "}" in text else text


def parse_sitemap(body: bytes, name: str, *, cap: int = MAX_DECOMPRESSED
                  ) -> Iterator[tuple[str, str]]:
    """Yield ``(kind, loc)`` for each ``<loc>``: kind is ``url`` or ``sitemap``.

    At most ``cap`` bytes are parsed (decompressed); raises SourceError past that, on
    XML that is not a sitemap, and on malformed XML.
    """
    stream: IO[bytes] | gzip.GzipFile = io.BytesIO(body)
    if body[:2] == b"\x1f\x8b":
        stream = gzip.GzipFile(fileobj=stream, mode="rb")
    reader = io.BufferedReader(_CappedReader(stream, cap, name))
    parser = etree.iterparse(
        reader, events=("start", "end"), resolve_entities=False, no_network=True,
        load_dtd=False, huge_tree=False, remove_comments=True, remove_pis=True,
    )
    root_kind: str | None = None
    try:
        for event, elem in parser:
            tag = _local(elem.tag)
            if root_kind is None:
                if tag not in ("urlset", "sitemapindex"):
                    raise SourceError(f"{name} is not a sitemap: its root element is <{tag}>, "
                                      "expected <urlset> or <sitemapindex>")
                root_kind = "url" if tag == "urlset" else "sitemap"
                continue
            if event != "end":
                continue
            if tag == "loc":
                # Only <url><loc> / <sitemap><loc>: not extensions' (<image:image><image:loc>).
                parent = elem.getparent()
                text = (elem.text or "").strip()
                if text and parent is not None and _local(parent.tag) in ("url", "sitemap"):
                    yield root_kind, text
            elif tag in ("url", "sitemap"):
                # Free what was parsed so far: memory stays flat on a 50 MB sitemap.
                elem.clear()
                parent = elem.getparent()
                if parent is not None:
                    while elem.getprevious() is not None:
                        del parent[0]
    except SourceError:
        raise
    except etree.XMLSyntaxError as exc:
        raise SourceError(f"sitemap {name} is not well-formed XML: {exc}") from None
    except (OSError, EOFError) as exc:
        raise SourceError(f"sitemap {name} could not be decompressed: {exc}") from None


def robots_sitemaps(body: bytes) -> list[str]:
    """The ``Sitemap:`` URLs of a robots.txt, as Protego (the consumer's robots.txt
    parser) reads them."""
    return list(Protego.parse(body.decode("utf-8-sig", "replace")).sitemaps)


class SitemapReader:
    """Reads the page URLs reachable from one ``--sitemap`` URL, in chunks."""

    def __init__(self, fetcher: Fetcher) -> None:
        self._fetcher = fetcher

    async def _get(self, url: str) -> bytes:
        try:
            result = await self._fetcher.fetch(url)
        except FetchError as exc:
            raise SourceError(f"sitemap {redact_url(url)} could not be fetched: "
                              f"{exc.reason}: {exc.message}") from None
        if result.status != 200:
            raise SourceError(f"sitemap {redact_url(url)} could not be fetched: "
                              f"HTTP {result.status}")
        return result.body

    async def chunks(self, start: str) -> AsyncGenerator[Chunk, None]:
        """Every page URL listed under ``start`` (robots.txt, index or sitemap)."""
        if start.split("?", 1)[0].rstrip("/").lower().endswith("/robots.txt"):
            body = await self._get(start)
            todo = [(u, 1) for u in robots_sitemaps(body)]
            if not todo:
                raise SourceError(f"{redact_url(start)} lists no Sitemap: lines")
        else:
            todo = [(start, 1)]
        seen: set[str] = set()
        todo.reverse()
        while todo:
            url, depth = todo.pop()
            if url in seen:
                continue
            seen.add(url)
            if len(seen) > MAX_SITEMAPS:
                raise SourceError(f"more than {MAX_SITEMAPS} sitemaps under "
                                  f"{redact_url(start)}; stopped there")
            body = await self._get(url)
            name = redact_url(url)
            batch: list[str] = []
            children: list[str] = []
            line = 1
            for kind, loc in parse_sitemap(body, name):
                if kind == "sitemap":
                    children.append(loc)
                    continue
                batch.append(loc)
                if len(batch) >= CHUNK_LINES:
                    yield Chunk(name, line, batch)
                    line += len(batch)
                    batch = []
            del body
            if batch:
                yield Chunk(name, line, batch)
            if children:
                if depth >= MAX_DEPTH:
                    raise SourceError(f"sitemap index {name} is nested more than "
                                      f"{MAX_DEPTH} deep; stopped there")
                log.debug("sitemap_index", extra={"sitemap": name, "children": len(children)})
                todo.extend((c, depth + 1) for c in reversed(children))
