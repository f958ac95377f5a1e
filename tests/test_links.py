"""Tests of consumer.links: link extraction with selectolax (Lexbor) and ada.

The reference is the slow, obvious way: lxml's full parse, ``urllib.parse.urljoin``
(RFC 3986), then the joined URL serialized by the WHATWG rules (ada), so that only the
parse and the join are compared, not the serialization (RFC 3986 leaves
``https://Example.COM`` alone, the WHATWG URL Standard writes ``https://example.com/``).
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urldefrag, urljoin

import lxml.html
import pytest
from ada_url import URL

from common.http.results import FetchResult
from consumer.handlers import HandlerContext, links
from consumer.links import extract_links

WS = "\t\n\f\r "
SKIPPED = ("javascript:", "mailto:", "data:", "tel:")
DOCS = Path("/usr/share/doc/python3-doc/html")


def reference(body: bytes, base_url: str) -> list[str]:
    """The links of a page the slow way: lxml, urljoin, then WHATWG serialization."""
    doc = lxml.html.document_fromstring(body)
    base = base_url
    for el in doc.iter("base"):
        if el.get("href") is not None:
            base = urljoin(base_url, el.get("href").strip(WS))
            break
    found: dict[str, None] = {}
    for el in doc.iter("a", "area"):
        href = (el.get("href") or "").strip(WS)
        if not href or href.startswith("#") or href.lower().startswith(SKIPPED):
            continue
        url = urldefrag(urljoin(base, href))[0]
        try:
            url = URL(url).href
        except ValueError:
            continue
        if url.startswith(("http://", "https://")):
            found[url] = None
    return list(found)


# Pages on which extract_links must agree with the reference, order included.
PAGES: dict[str, str] = {
    "base_absolute.html": """<!doctype html><html><head>
        <base href="https://cdn.example.org/static/v2/"></head><body>
        <a href="img/a.png">a</a> <a href="../b.html">b</a> <a href="/root">r</a>
        <a href="https://other.example/x">x</a></body></html>""",
    "base_relative.html": """<html><head><base href="../lib/"></head><body>
        <a href="mod.html">m</a><a href="./sub/p.html?x=1">p</a><a href="../up">u</a>
        </body></html>""",
    "relative.html": """<p><a href="../x">x</a><a href="./y">y</a><a href="z?q=1">z</a>
        <a href="../../../../too/high">h</a><a href="?only=query">q</a>
        <a href="/abs/path">abs</a><a href=".">dot</a><a href="..">dotdot</a>""",
    "entities.html": """<a href="search?a=1&amp;b=2&amp;c=&lt;3&gt;">s</a>
        <a href="p?x=1&#38;y=2">numeric</a><a href="caf&eacute;.html">named</a>""",
    "area_and_case.html": """<HTML><BODY><MAP NAME="m"><AREA HREF="area1.html" SHAPE="rect">
        <area href="area2.html"></MAP><A HREF="UPPER.html">U</A><a HrEf="Mixed.html">M</a>
        <img src="not-a-link.png"><link href="not-a-link.css" rel="stylesheet">
        <a>no href</a><a name="anchor">no href either</a></BODY></HTML>""",
    "whitespace.html": """<a href="  spaced.html  ">s</a><a href="\n\ttabbed.html\r\n">t</a>
        <a href=" https://example.net/w ">w</a><a href="	#frag-only-with-ws">f</a>""",
    "skipped.html": """<a href="javascript:void(0)">j</a><a href="JavaScript:alert(1)">J</a>
        <a href="  javascript:x">sj</a><a href="mailto:a@example.com">m</a>
        <a href="MAILTO:b@example.com">M</a><a href="data:text/html,hi">d</a>
        <a href="tel:+331234">t</a><a href="#top">frag</a><a href="#">empty frag</a>
        <a href="">empty</a><a href="ftp://files.example/f">ftp</a>
        <a href="news:comp.lang.python">news</a><a href="kept.html">kept</a>""",
    "protocol_relative.html": """<a href="//cdn.example/p">c</a>
        <a href="//cdn.example/p?q=1#f">c2</a>""",
    "non_ascii.html": """<meta charset="utf-8"><a href="/caf\u00e9/\u65e5\u672c.html">u</a>
        <a href="na\u00efve?q=\u00e9">q</a>""",
    "dedup_and_fragments.html": """<a href="a.html#one">1</a><a href="b.html">b</a>
        <a href="a.html#two">2</a><a href="a.html">3</a><a href="b.html">again</a>
        <a href="HTTPS://EXAMPLE.com:443/docs/guide/a.html#x">absolute twin</a>""",
    "base_in_body.html": """<a href="before.html">before</a><base href="https://late.example/d/">
        <a href="after.html">after</a><base href="https://ignored.example/">""",
    "base_without_href.html": """<base target="_blank"><base href="sub/"><a href="x">x</a>""",
    "malformed.html": """<a href=unquoted.html>u</a><a href='single.html'>s</a>
        <p><a href="in-p.html"
        >i</a></p><table><tr><a href="foster.html">f</a></table><a href="unclosed.html">""",
}

BASE = "https://example.com/docs/guide/"


def _base_url(name: str) -> str:
    return BASE + name


@pytest.mark.parametrize("name", sorted(PAGES))
def test_matches_full_parse(name: str) -> None:
    body = PAGES[name].encode()
    expected = reference(body, _base_url(name))
    assert expected, "a fixture page with no links tests nothing"
    assert extract_links(body, _base_url(name), 1000) == expected


def test_explicit_results() -> None:
    """What the fixtures give, spelled out, so a shared mistake in both can't pass."""
    got = {name: extract_links(PAGES[name].encode(), _base_url(name), 1000) for name in PAGES}
    assert got["base_absolute.html"] == [
        "https://cdn.example.org/static/v2/img/a.png", "https://cdn.example.org/static/b.html",
        "https://cdn.example.org/root", "https://other.example/x"]
    assert got["base_relative.html"] == [
        "https://example.com/docs/lib/mod.html", "https://example.com/docs/lib/sub/p.html?x=1",
        "https://example.com/docs/up"]
    assert got["entities.html"] == [
        "https://example.com/docs/guide/search?a=1&b=2&c=%3C3%3E",
        "https://example.com/docs/guide/p?x=1&y=2",
        "https://example.com/docs/guide/caf%C3%A9.html"]
    assert got["area_and_case.html"] == [
        BASE + "area1.html", BASE + "area2.html", BASE + "UPPER.html", BASE + "Mixed.html"]
    assert got["skipped.html"] == [BASE + "kept.html"]
    assert got["protocol_relative.html"] == ["https://cdn.example/p", "https://cdn.example/p?q=1"]
    assert got["non_ascii.html"] == [
        "https://example.com/caf%C3%A9/%E6%97%A5%E6%9C%AC.html",
        "https://example.com/docs/guide/na%C3%AFve?q=%C3%A9"]
    assert got["dedup_and_fragments.html"] == [BASE + "a.html", BASE + "b.html"]
    # The first <base href> in the document counts for every link, even those before it.
    assert got["base_in_body.html"] == [
        "https://late.example/d/before.html", "https://late.example/d/after.html"]
    assert got["base_without_href.html"] == [BASE + "sub/x"]
    assert all("#" not in url for urls in got.values() for url in urls)


# Where the WHATWG URL Standard (ada, browsers) and RFC 3986 (urljoin) legitimately
# differ: extract_links follows the browsers, so these are spelled out instead.
WHATWG_ONLY = [
    # A backslash is a slash in http(s) URLs for browsers; urljoin keeps it as a character.
    ('<a href="..\\sib\\x.html">b</a>', ["https://example.com/docs/sib/x.html"]),
    # Tabs and newlines inside a URL are removed; urljoin percent-encodes them (ada: %09).
    ('<a href="sp\tli\nt.html">t</a>', [BASE + "split.html"]),
    # "http:x" with an http(s) base is relative for browsers ("special" scheme, same as
    # the base's); for urljoin a differing scheme ("http" vs base "https") is absolute.
    ('<a href="https:same.html">s</a>', [BASE + "same.html"]),
    # Hosts: IDNA to punycode, invalid hosts rejected (urljoin accepts anything).
    ('<a href="http://B\u00fccher.example/">i</a><a href="http://exa mple.com/">bad</a>'
     '<a href="http://[::1/">bad v6</a><a href="https://example.com:99999/">bad port</a>',
     ["http://xn--bcher-kva.example/"]),
    # javascript: hidden by a tab is still javascript: once the tab is removed; it isn't
    # skipped by the prefix check but the http(s) filter drops it.
    ('<a href="java\tscript:alert(1)">j</a><a href="ok">ok</a>', [BASE + "ok"]),
]


@pytest.mark.parametrize(("html", "expected"), WHATWG_ONLY)
def test_whatwg_joins(html: str, expected: list[str]) -> None:
    assert extract_links(html.encode(), BASE, 100) == expected


def test_unparsable_base_href_is_ignored() -> None:
    body = b'<base href="http://[oops/"><a href="x.html">x</a>'
    assert extract_links(body, BASE, 10) == [BASE + "x.html"]


@pytest.mark.parametrize(("body", "encoding"), [
    ('<meta charset="iso-8859-1"><a href="caf\u00e9.html">x</a>', "latin-1"),
    ('<meta http-equiv="Content-Type" content="text/html; charset=windows-1252">'
     '<a href="caf\u00e9.html">x</a>', "cp1252"),
    ('<a href="caf\u00e9.html">x</a>', "utf-8"),  # no declaration: UTF-8
    ('\ufeff<a href="caf\u00e9.html">x</a>', "utf-8"),  # a byte order mark
    ('\ufeff<a href="caf\u00e9.html">x</a>', "utf-16"),
])
def test_encodings(body: str, encoding: str) -> None:
    """The parser reads the bytes' encoding; non-ASCII paths end up UTF-8 percent-encoded."""
    assert extract_links(body.encode(encoding), BASE, 10) == [BASE + "caf%C3%A9.html"]


def test_limit_stops_at_distinct_urls() -> None:
    body = "".join(f'<a href="/p/{i}">{i}</a><a href="/p/{i}#again">' for i in range(50_000))
    got = extract_links(body.encode(), BASE, 10_001)
    assert len(got) == 10_001
    assert got[0] == "https://example.com/p/0"
    assert got[-1] == "https://example.com/p/10000"
    assert len(extract_links(body.encode(), BASE, 50_000)) == 50_000
    assert extract_links(body.encode(), BASE, 1) == ["https://example.com/p/0"]
    assert extract_links(body.encode(), BASE, 0) == []


def test_empty_and_linkless_bodies() -> None:
    assert extract_links(b"", BASE, 10) == []
    assert extract_links(b"<p>no links", BASE, 10) == []
    assert extract_links(b"\x00\xff\xfe garbage <a href=x>", BASE, 10) == [BASE + "x"]


def _docs_pages() -> list[Path]:
    pages = sorted(DOCS.rglob("*.html"))
    picks = ["library/os.html", "library/functions.html", "genindex-all.html",
             "whatsnew/2.7.html", "tutorial/whatnow.html", "using/mac.html", "index.html"]
    chosen = [DOCS / p for p in picks if (DOCS / p).is_file()]
    return chosen + pages[:: max(1, len(pages) // 8)]


@pytest.mark.skipif(not DOCS.is_dir(), reason="Debian's python3-doc is not installed")
def test_python_docs_match_full_parse() -> None:
    """Real pages (~300 links each): the same links as the full parse, in the same order."""
    pages = _docs_pages()
    assert len(pages) >= 8
    for page in pages:
        url = "https://docs.python.org/3/" + os.path.relpath(page, DOCS)
        body = page.read_bytes()
        got = extract_links(body, url, 100_000)
        assert got, page
        assert got == reference(body, url), page


def _response(body: bytes, content_type: str) -> FetchResult:
    return FetchResult(url=BASE, final_url=BASE + "page.html", status=200,
                       headers={"content-type": content_type}, raw_headers=(), body=body,
                       elapsed=0.0, redirects=(), http_version="HTTP/1.1")


async def test_links_handler_takes_one_more_than_the_cap() -> None:
    async def save(_value: object) -> bool:
        return True

    ctx = HandlerContext(task=None, worker="w", _save=save, max_links=3)  # type: ignore[arg-type]
    body = "".join(f'<a href="l{i}">' for i in range(10)).encode()
    result = await links(_response(body, "text/html; charset=utf-8"), ctx)
    assert result.urls == [BASE + f"l{i}" for i in range(4)]
    assert (await links(_response(body, "application/json"), ctx)).urls == []
    assert (await links(_response(b"", "text/html"), ctx)).urls == []
    default = HandlerContext(task=None, worker="w", _save=save)  # type: ignore[arg-type]
    assert len((await links(_response(body, "text/html"), default)).urls) == 10
