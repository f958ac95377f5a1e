"""Tests of common.urls.canonical: canonical URLs, rejections, fingerprints and partitions."""

from __future__ import annotations

import json
import string
from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import Any

import pytest
from ada_url import parse_url
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from shared_data import DATA, require
from yarl import URL

from common.errors import ConfigError
from common.urls import canonical as urls
from common.urls.canonical import (
    MAX_URL_BYTES,
    Rejection,
    RejectReason,
    _canonicalize_slow,
    canonical_domain,
    canonicalize,
    fingerprint,
    partition_of,
    task_id,
)

# --------------------------------------------------------------------------- strategies

_UNRESERVED = string.ascii_letters + string.digits + "-._~"
# pchar characters that are already canonical in a path segment (no "%", no "/").
_SEGMENT_CHARS = string.ascii_letters + string.digits + "-_~!$&'()*+,;=:@"
# No "'": WHATWG writes it as %27 in a query.
_QUERY_WORD_CHARS = string.ascii_letters + string.digits + "-._~!$()*,:@/?"

_label = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True)
# The last label is alphabetic: a host ending in a number must be an IPv4 address.
_tld = st.from_regex(r"[a-z]{2,6}", fullmatch=True)
_reg_host = st.builds(
    lambda labels, tld: ".".join([*labels, tld]),
    st.lists(_label, min_size=1, max_size=3),
    _tld,
)
_segment = st.text(_SEGMENT_CHARS, max_size=8).filter(lambda s: s not in {".", ".."})
_query_word = st.text(_QUERY_WORD_CHARS, max_size=6)


@st.composite
def _random_case(draw: st.DrawFn, text: str) -> str:
    flips = draw(st.lists(st.booleans(), min_size=len(text), max_size=len(text)))
    return "".join(c.upper() if flip else c for c, flip in zip(text, flips, strict=True))


@st.composite
def _hex_escape(draw: st.DrawFn, char: str) -> str:
    """A percent-escape of an ASCII char, hex digits in random case."""
    return "%" + draw(_random_case(f"{ord(char):02x}"))


@st.composite
def _noisy_segment(draw: st.DrawFn, segment: str) -> str:
    """The same segment with some unreserved characters percent-encoded."""
    out = []
    for char in segment:
        if char in _UNRESERVED and draw(st.booleans()):
            out.append(draw(_hex_escape(char)))
        else:
            out.append(char)
    return "".join(out)


@st.composite
def equivalent_spellings(draw: st.DrawFn) -> tuple[str, str]:
    """(noisy, clean): two spellings of one URL; ``clean`` is already canonical."""
    scheme = draw(st.sampled_from(["http", "https"]))
    host = draw(_reg_host)
    port = draw(st.one_of(st.none(), st.integers(1, 65535)))
    if port == {"http": 80, "https": 443}[scheme]:
        port = None
    segments = draw(st.lists(_segment, max_size=5))
    params = draw(st.lists(st.tuples(_query_word, _query_word), max_size=4))

    clean_path = "/" + "/".join(segments)
    clean_query = "&".join(f"{k}={v}" for k, v in params)
    clean = f"{scheme}://{host}" + (f":{port}" if port else "") + clean_path
    if clean_query:
        clean += "?" + clean_query

    noisy_segments: list[str] = []
    for segment in segments:
        if draw(st.booleans()):
            noisy_segments.append(draw(st.sampled_from([".", "%2e", "%2E"])))
        if draw(st.booleans()):
            noisy_segments += [draw(_segment.filter(bool)), ".."]
        noisy_segments.append(draw(_noisy_segment(segment)))
    keep_empty_path = draw(st.booleans())
    noisy_path = "/" + "/".join(noisy_segments) if noisy_segments or keep_empty_path else ""
    if draw(st.booleans()) and port is None:
        netloc_port = ":" + str({"http": 80, "https": 443}[scheme])
    else:
        netloc_port = f":{port}" if port else ""
    noisy_host = draw(_random_case(host)) + draw(st.sampled_from(["", "."]))
    noisy = f"{draw(_random_case(scheme))}://{noisy_host}{netloc_port}{noisy_path}"
    if clean_query:
        noisy += "?" + "&".join(
            f"{draw(_noisy_segment(k))}={draw(_noisy_segment(v))}" for k, v in params
        )
    elif draw(st.booleans()):
        noisy += "?"
    if draw(st.booleans()):
        noisy += "#" + draw(st.text(_SEGMENT_CHARS + "/?#", max_size=6))
    spaces = draw(st.sampled_from(["", " ", "  \t", "\n"]))
    return spaces + noisy + draw(st.sampled_from(["", " ", "\r\n"])), clean


@st.composite
def url_like(draw: st.DrawFn) -> str:
    """URLs built from parts, valid or not, clean or not (for idempotence, fast==slow)."""
    scheme = draw(_random_case(draw(st.sampled_from(["http", "https"]))))
    host = draw(
        st.one_of(
            _reg_host,
            _reg_host.flatmap(_random_case),
            st.sampled_from(["bücher.example", "BÜCHER.Example.", "☃.net", "xn--n3h.net"]),
            st.sampled_from(["a..b", "-x-.com", "a_b.com", "127.1", "1.2.3.4.5", "0x7f.1"]),
            st.ip_addresses(v=4).map(str),
            st.ip_addresses(v=6).map(lambda ip: f"[{ip.exploded.upper()}]"),
            st.ip_addresses(v=6).map(lambda ip: f"[{ip.compressed}]"),
        )
    )
    host += draw(st.sampled_from(["", "", "."]))
    port = draw(st.sampled_from(["", "", ":80", ":443", ":8080", ":", ":0", ":080"]))
    piece = st.one_of(
        _segment,
        st.sampled_from([".", "..", "%2e", "%2F", "%2f", "%7e", "%41", "%3b", "%25", "%"]),
        st.text(max_size=4),
    )
    path = "".join("/" + p for p in draw(st.lists(piece, max_size=5)))
    query = draw(
        st.one_of(
            st.just(""),
            st.just("?"),
            st.lists(
                st.tuples(_query_word, st.one_of(_query_word, st.text(max_size=3))), max_size=4
            ).map(lambda ps: "?" + "&".join(f"{k}={v}" for k, v in ps)),
        )
    )
    fragment = draw(st.sampled_from(["", "#", "#frag", "#a?b#c"]))
    return f"{scheme}://{host}{port}{path}{query}{fragment}"


# The shape the fast path takes (lowercase LDH host, no port, nothing to escape).
_fast_shaped = st.from_regex(
    r"\Ahttps?://[a-z0-9-]{1,10}(\.[a-z0-9-]{1,10}){0,3}(/[a-z0-9._~!$&'()*+,;=:@/-]{0,20})?"
    r"(\?[a-z0-9._~!$&'()*+,;=:@/?-]{0,20})?\Z",
)

# --------------------------------------------------------------------------- properties


@given(equivalent_spellings())
@example(("HTTP://Example.COM:80/a/./b#x", "http://example.com/a/b"))
def test_equivalent_spellings_have_one_canonical_form_and_fingerprint(
    pair: tuple[str, str],
) -> None:
    noisy, clean = pair
    assert canonicalize(clean) == clean
    assert canonicalize(noisy) == clean
    assert fingerprint(clean) == fingerprint(str(canonicalize(noisy)))


@given(st.one_of(url_like(), equivalent_spellings().map(lambda p: p[0])), st.booleans())
@settings(max_examples=500)
def test_canonicalize_is_idempotent(raw: str, sort_query: bool) -> None:
    once = canonicalize(raw, sort_query=sort_query)
    assume(isinstance(once, str))
    assert isinstance(once, str)
    assert canonicalize(once, sort_query=sort_query) == once
    # The canonical form is plain ASCII, in bounds, without fragment, and yarl
    # (hence aiohttp, given encoded=True) reads back exactly the same URL.
    assert once.isascii()
    assert len(once) <= MAX_URL_BYTES
    assert once.startswith(("http://", "https://"))
    assert "#" not in once
    assert str(URL(once, encoded=True)) == once


@given(st.one_of(url_like(), _fast_shaped, st.text(), equivalent_spellings().map(lambda p: p[0])))
@settings(max_examples=500)
@example("https://example.com/path/page-123?x=1")
@example("http://a.com/.well-known/x")
@example("http://a.com/x/..")
@example("http://a.com?b=1&a=2")
@example("http://a-.b1/")
@example("http://a.0x1f/")
@example("\u00a0http://a.com/")  # str.strip() strips it, WHATWG does not
@example("http://a.com/x\u2003")
@example("\x00http://a.com/\x1f")
@example(" http://a.com/x \r\n")
@example("http://xn--a.com/")
@example("http://a.com/?x='")
def test_fast_path_agrees_with_full_path(raw: str) -> None:
    assert canonicalize(raw) == _canonicalize_slow(raw)
    assert canonicalize(raw, sort_query=True) == _canonicalize_slow(raw, sort_query=True)


@given(st.text())
@settings(max_examples=500)
def test_canonicalize_never_raises_on_text(raw: str) -> None:
    result = canonicalize(raw)
    assert isinstance(result, str | Rejection)
    if isinstance(result, Rejection):
        assert isinstance(result.reason, RejectReason)


@given(st.text(alphabet=st.sampled_from(list("hHtTpPsS:/[]@%.?#&=\\ \x00ä1a-_")), max_size=40))
@settings(max_examples=500)
def test_canonicalize_never_raises_on_url_alphabet(raw: str) -> None:
    for prefix in ("", "http://", "https://["):
        result = canonicalize(prefix + raw)
        assert isinstance(result, str | Rejection)
        if isinstance(result, str):
            assert canonicalize(result) == result


def test_fast_path_serves_typical_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_full_path(url: str, sort_query: bool) -> str:
        raise AssertionError(f"full path used for {url!r}")

    monkeypatch.setattr(urls, "_canonicalize_full", no_full_path)
    url = "https://example.com/path/page-123?x=1"
    assert canonicalize(url) == url
    assert canonicalize(" http://example.com") == "http://example.com/"
    assert canonicalize("http://a.com/p?b=1&a=2", sort_query=True) == "http://a.com/p?a=2&b=1"


# --------------------------------------------------------------------------- examples


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("HTTP://Example.COM:80/a/./b#x", "http://example.com/a/b"),
        ("http://example.com", "http://example.com/"),
        ("  https://example.com/x  ", "https://example.com/x"),
        ("\thttps://example.com/x\r\n", "https://example.com/x"),
        ("http://bücher.example/", "http://xn--bcher-kva.example/"),
        ("http://BÜCHER.example/", "http://xn--bcher-kva.example/"),
        ("http://☃.net/", "http://xn--n3h.net/"),
        ("http://example.com./", "http://example.com/"),
        ("http://Example.COM.:8080", "http://example.com:8080/"),
        ("http://bücher.example./", "http://xn--bcher-kva.example/"),
        ("http://example.com/%7e", "http://example.com/~"),
        ("http://example.com/%7Euser/%41%62%2d%5f%2e", "http://example.com/~user/Ab-_."),
        ("http://example.com/a%2fb", "http://example.com/a%2Fb"),
        ("http://example.com/a%3bb%3D", "http://example.com/a%3Bb%3D"),
        ("http://example.com/?a=%26%3d&b=%2f", "http://example.com/?a=%26%3D&b=%2F"),
        ("http://example.com/%e4", "http://example.com/%E4"),
        ("http://example.com/a b?q=a b", "http://example.com/a%20b?q=a%20b"),
        ("http://example.com/?q=a+b", "http://example.com/?q=a+b"),
        ("http://example.com/ä?ü=ö", "http://example.com/%C3%A4?%C3%BC=%C3%B6"),
        ("http://example.com/50%", "http://example.com/50%25"),
        ("http://example.com/%zz", "http://example.com/%25zz"),
        ("http://example.com/{x}|^", "http://example.com/%7Bx%7D%7C%5E"),
        ("http://example.com/a/./b/../c", "http://example.com/a/c"),
        ("http://example.com/a/%2e%2E/c", "http://example.com/c"),
        ("http://example.com/../../a", "http://example.com/a"),
        ("http://example.com/a/b/..", "http://example.com/a/"),
        ("http://example.com/.well-known/x", "http://example.com/.well-known/x"),
        ("http://example.com/a//b", "http://example.com/a//b"),
        ("http://example.com/?", "http://example.com/"),
        ("http://example.com?#top", "http://example.com/"),
        ("http://example.com/p?x=1#frag?y", "http://example.com/p?x=1"),
        ("http://example.com:8080/", "http://example.com:8080/"),
        ("http://example.com:080/", "http://example.com/"),
        ("https://example.com:443/a", "https://example.com/a"),
        ("https://example.com:80/a", "https://example.com:80/a"),
        ("http://example.com:443/a", "http://example.com:443/a"),
        ("http://example.com:/a", "http://example.com/a"),
        ("http://[2001:DB8:0:0:0:0:0:1]/", "http://[2001:db8::1]/"),
        ("http://[::1]:8080/x", "http://[::1]:8080/x"),
        ("https://[::1]:443/", "https://[::1]/"),
        ("http://192.168.0.1:80/", "http://192.168.0.1/"),
        ("http://a_b.example.com/", "http://a_b.example.com/"),
        # WHATWG: a backslash is a slash in an http(s) URL, up to the query.
        ("http://foo.com/\\@", "http://foo.com//@"),
        ("http://a.com\\@evil.com/", "http://a.com/@evil.com/"),
        ("http:\\\\example.com\\a\\b?c\\d", "http://example.com/a/b?c%5Cd"),
        # WHATWG's query percent-encode set writes "'" as %27.
        ("http://a.com/?'", "http://a.com/?%27"),
        ("http://a.com/?%27", "http://a.com/?%27"),
        ("http://a.com/it's", "http://a.com/it's"),
        # WHATWG's IPv4 parser: short, decimal, octal and hex forms.
        ("http://127.1/", "http://127.0.0.1/"),
        ("http://0x7f.0.0.1/", "http://127.0.0.1/"),
        ("http://0177.0.0.1:8080/", "http://127.0.0.1:8080/"),
        ("http://2130706433/", "http://127.0.0.1/"),
        ("http://\uff11\uff12\uff17.0.0.1/", "http://127.0.0.1/"),  # full-width digits
        ("http://[::ffff:1.2.3.4]/", "http://[::ffff:102:304]/"),
        ("http://a.com/%2e%2E/x/.%2e/y", "http://a.com/y"),
        ("http://fa\u00df.de/", "http://xn--fa-hia.de/"),  # nontransitional: ß kept
        ("http://xn--bcher-kva.example/", "http://xn--bcher-kva.example/"),
        ("http://a.com/x?y'z|{}^`[]", "http://a.com/x?y%27z%7C%7B%7D%5E%60%5B%5D"),
        ("\x00 http://example.com/\x1f", "http://example.com/"),
    ],
)
def test_canonical_examples(raw: str, expected: str) -> None:
    assert canonicalize(raw) == expected
    assert _canonicalize_slow(raw) == expected
    assert canonicalize(expected) == expected


@pytest.mark.parametrize(
    ("raw", "sort_query", "expected"),
    [
        ("http://a.com/p?b=1&a=2&c=3", False, "http://a.com/p?b=1&a=2&c=3"),
        ("http://a.com/p?b=1&a=2&c=3", True, "http://a.com/p?a=2&b=1&c=3"),
        # Stable: repeated keys keep their relative order.
        ("http://a.com/p?b=2&a=1&b=1&a=0", True, "http://a.com/p?a=1&a=0&b=2&b=1"),
        ("HTTP://A.com/p?z=%7e&y", True, "http://a.com/p?y&z=~"),
        ("http://a.com/p&q", True, "http://a.com/p&q"),
        ("http://a.com/?", True, "http://a.com/"),
    ],
)
def test_sort_query(raw: str, sort_query: bool, expected: str) -> None:
    assert canonicalize(raw, sort_query=sort_query) == expected


_TEN_KB = "http://example.com/" + "a" * 10_000


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("", RejectReason.EMPTY),
        ("   \t  ", RejectReason.EMPTY),
        ("javascript:alert(1)", RejectReason.BAD_SCHEME),
        ("file:///etc/passwd", RejectReason.BAD_SCHEME),
        ("ftp://x.org/", RejectReason.BAD_SCHEME),
        ("mailto:a@b", RejectReason.BAD_SCHEME),
        ("data:text/html,hi", RejectReason.BAD_SCHEME),
        ("example.com/path", RejectReason.BAD_SCHEME),
        ("//example.com/path", RejectReason.BAD_SCHEME),
        ("http://user:secret@example.com/", RejectReason.USERINFO),
        ("http://secret@example.com/", RejectReason.USERINFO),
        ("https://user:secret@[::1]:8080/", RejectReason.USERINFO),
        ("http://ex\x00ample.com", RejectReason.CONTROL_CHARS),
        ("http://example.com/a\tb", RejectReason.CONTROL_CHARS),
        ("http://example.com/a\nb", RejectReason.CONTROL_CHARS),
        ("http://example.com/\x7f", RejectReason.CONTROL_CHARS),
        ("http://example.com/a\x85b", RejectReason.CONTROL_CHARS),
        (_TEN_KB, RejectReason.TOO_LONG),
        ("http://example.com/" + "ä" * 1100, RejectReason.TOO_LONG),  # < 2048 chars
        ("http://example.com/" + "ä" * 500, RejectReason.TOO_LONG),  # grows when escaped
        ("http:///path", RejectReason.NO_HOST),
        ("http://", RejectReason.NO_HOST),
        ("http:/example.com/", RejectReason.NO_HOST),
        ("http://:80/", RejectReason.NO_HOST),
        ("http://a.com:99999/", RejectReason.INVALID_PORT),
        ("http://a.com:0/", RejectReason.INVALID_PORT),
        ("http://a.com:8o/", RejectReason.INVALID_PORT),
        ("http://a.com:+80/", RejectReason.INVALID_PORT),
        ("http://a.com:8_0/", RejectReason.INVALID_PORT),
        ("http://a.com:\uff18\uff10/", RejectReason.INVALID_PORT),
        ("http://a..b/", RejectReason.INVALID_HOST),
        ("http://a.com../", RejectReason.INVALID_HOST),
        ("http://./", RejectReason.INVALID_HOST),
        ("http://a!b.com/", RejectReason.INVALID_HOST),
        ("http://ex%41mple.com/", RejectReason.INVALID_HOST),
        ("http://" + "a" * 64 + ".com/", RejectReason.INVALID_HOST),
        ("http://" + "a." * 127 + "com/", RejectReason.INVALID_HOST),
        ("http://1.2.3.256/", RejectReason.INVALID_HOST),
        ("http://1.2.3.4.5/", RejectReason.INVALID_HOST),
        ("http://a.0x1f/", RejectReason.INVALID_HOST),
        ("http://a<b/", RejectReason.INVALID_HOST),
        # An xn-- label must be the punycode of a valid IDN label (WHATWG stopped
        # checking in 2026; DNS can't resolve these).
        ("http://xn--/", RejectReason.INVALID_HOST),
        ("http://xn--a.com/", RejectReason.INVALID_HOST),
        ("http://a.b.c.xn--pokxncvks", RejectReason.INVALID_HOST),
        ("http://XN--pokxncvks.com/", RejectReason.INVALID_HOST),
        ("http://xn--cafe-yvc.fr/", RejectReason.INVALID_HOST),  # not the canonical ACE
        ("http://[v1.fe]/", RejectReason.INVALID_HOST),
        ("http://[fe80::1%25eth0]/", RejectReason.INVALID_HOST),
        ("http://[::1/", RejectReason.UNPARSEABLE),
        ("http://[::1]x/", RejectReason.INVALID_HOST),
        ("http://ex ample.com/", RejectReason.INVALID_HOST),
        # Stricter than WHATWG: no base URL, so "//" is required; userinfo even empty.
        ("http:example.com/", RejectReason.NO_HOST),
        ("http:\\\\\\example.com/", RejectReason.NO_HOST),
        ("http://@example.com/", RejectReason.USERINFO),
        ("http://:@example.com/", RejectReason.USERINFO),
        ("\u00a0http://example.com/", RejectReason.BAD_SCHEME),  # WHATWG strips C0 and space only
        ("http://example.com/\ud800", RejectReason.UNPARSEABLE),
    ],
)
def test_rejections(raw: str, reason: RejectReason) -> None:
    result = canonicalize(raw)
    assert isinstance(result, Rejection)
    assert result.reason is reason
    assert result.message
    assert _canonicalize_slow(raw) == result


@pytest.mark.parametrize(
    "raw",
    [
        "http://user:secret@example.com/",
        "https://admin:secret@example.com:8443/x?y=1",
        "http://secret@example.com/",
        "http://user:secret@exa mple..com:99999/",
        "http://user:secret@[::1/",
        "http://user:secret@a.com\\x/",
        "mailto:secret@example.com",
        "ftp://user:secret@example.com/",
    ],
)
def test_messages_never_contain_credentials(raw: str) -> None:
    result = canonicalize(raw)
    assert isinstance(result, Rejection)
    assert "secret" not in result.message


def test_reason_codes_are_stable_snake_case() -> None:
    assert {r.value for r in RejectReason} == {
        "empty",
        "too_long",
        "control_chars",
        "bad_scheme",
        "userinfo",
        "no_host",
        "invalid_host",
        "invalid_port",
        "unparseable",
    }
    assert f"{RejectReason.USERINFO}" == "userinfo"


def test_length_limit_is_inclusive() -> None:
    base = "http://example.com/"
    at_limit = base + "a" * (MAX_URL_BYTES - len(base))
    assert canonicalize(at_limit) == at_limit
    over = at_limit + "a"
    result = canonicalize(over)
    assert isinstance(result, Rejection)
    assert result.reason is RejectReason.TOO_LONG


def test_non_str_input_is_rejected_not_raised() -> None:
    result = canonicalize(b"http://example.com/")  # type: ignore[arg-type]
    assert isinstance(result, Rejection)
    assert result.reason is RejectReason.UNPARSEABLE


# --------------------------------------------------------------------------- WHATWG

_C0_AND_SPACE = "".join(map(chr, range(0x21)))
# The WPT URL data, in the repository (tests/data/README.md).
WPT_URLTESTDATA = DATA / "urltestdata.json"


def _is_http(text: str | None) -> bool:
    return text is not None and text.strip(_C0_AND_SPACE).lower().startswith(("http:", "https:"))


def _host_of(canonical: str) -> str:
    authority = canonical.split("/", 3)[2]
    if authority.startswith("["):
        return authority[: authority.index("]") + 1]
    return authority.partition(":")[0]


def whatwg_disagreements(cases: Iterable[dict[str, Any]]) -> list[str]:
    """Where crawlq contradicts WHATWG verdicts given in the WPT urltestdata format.

    A WHATWG failure of an http(s) input (or of any input with an http(s) base) must
    be rejected; an accepted URL must have WHATWG's host (less one trailing dot, which
    crawlq drops), read back unchanged by a WHATWG parser, and have the canonical form
    of every other input WHATWG serializes the same way (fragment aside). crawlq
    rejecting what WHATWG accepts is its stricter rules, listed in common/urls/canonical.py.
    """
    problems: list[str] = []
    forms: dict[str, set[str]] = defaultdict(set)
    for case in cases:
        raw = case["input"]
        got = canonicalize(raw)
        if case.get("failure"):
            if isinstance(got, str) and (_is_http(raw) or _is_http(case.get("base"))):
                problems.append(f"{raw!r}: WHATWG fails it, crawlq accepts it as {got}")
            continue
        if isinstance(got, Rejection):
            continue
        if case["protocol"] not in ("http:", "https:"):
            problems.append(f"{raw!r}: crawlq accepts a {case['protocol']} URL as {got}")
            continue
        if _host_of(got) != case["hostname"].removesuffix("."):
            problems.append(f"{raw!r}: host of {got} is not WHATWG's {case['hostname']!r}")
        whatwg = parse_url(got, attributes=("href",))["href"]
        if whatwg != got:
            problems.append(f"{raw!r}: WHATWG reads {got} as {whatwg}")
        forms[case["href"].partition("#")[0]].add(got)
    problems += [f"WHATWG's {href} has several canonical forms: {sorted(f)}"
                 for href, f in forms.items() if len(f) > 1]
    return problems


def whatwg_case(raw: str) -> dict[str, Any]:
    """WHATWG's verdict on ``raw`` (no base), from ada, in the urltestdata format."""
    try:
        parsed = parse_url(raw, attributes=("href", "hostname", "protocol"))
    except ValueError:
        return {"input": raw, "base": None, "failure": True}
    return {"input": raw, "base": None, **parsed}


def test_web_platform_tests_url_data() -> None:
    data = require(WPT_URLTESTDATA, "the WPT URL data (urltestdata.json)")
    cases = [c for c in json.loads(data.read_text("utf-8")) if isinstance(c, dict)]
    assert len(cases) > 800
    assert whatwg_disagreements(cases) == []
    # Not vacuous: many http(s) failures are there, and many inputs are accepted.
    failures = [c for c in cases if c.get("failure") and _is_http(c["input"])]
    accepted = [c for c in cases if isinstance(canonicalize(c["input"]), str)]
    assert len(failures) > 100
    assert len(accepted) > 100


# Inputs on which WHATWG and an RFC 3986 reading (or older crawlq) disagree.
WHATWG_EXAMPLES = [
    "http://foo.com/\\@", "http://a.com\\@evil.com/", "http:\\\\a.com\\b", "http:/\\a.com/",
    "http://a.com/?'", "http://a.com/?%27", "http://a.com/'", "http://a.com/%27",
    "http://127.1/", "http://0x7f.1/", "http://2130706433/", "http://0177.0.0.1/",
    "http://127.0.0.1./", "http://4294967296/", "http://1.2.3.4.5/", "http://1.2.3.08/",
    "http://a.0x1f/", "http://0x.0x.0/", "http://[::1]:80/", "http://[::ffff:1.2.3.4]/",
    "http://[1:0::]/", "http://[0:0:0:0:0:0:0:0:1]/", "http://[v1.x]/",
    "http://xn--/", "http://xn--a.com/", "http://a.b.c.xn--pokxncvks/", "http://xn--zca.de/",
    "http://Bücher.example/", "http://faß.de/", "http://a\u3002b.com/", "http://\u00ad/",
    "http://exa\u00admple.com/", "http://%41.com/", "http://a%2Eb/", "http://a b/",
    "http://a<b/", "http://a^b/", "http://a|b/", "http://a!b.com/", "http://a..b/",
    "http://f:00000000000000000000080/c", "http://f:0/", "http://f:65536/", "http://f:b/",
    "http://f: 21/", "http://f:\uff18\uff10/", "http://:@a.com/", "http://@a.com/",
    "http:a.com/", "http:/a.com/", "http:///a.com/", "https://?", "http://#",
    "http://a.com/%2e%2E/x/.%2e/y", "http://a.com/a/%2e./b", "http://a.com/a b?c d#e f",
    "http://a.com/ä?ä#ä", "http://a.com/%zz?%zz", "http://a.com/{}|^`?{}|^`",
    "\x00\x1f http://a.com/ \x00", "\u00a0http://a.com/", "http://a.com/\t",
]


@pytest.mark.parametrize("raw", WHATWG_EXAMPLES)
def test_whatwg_examples(raw: str) -> None:
    assert whatwg_disagreements([whatwg_case(raw)]) == []


@given(url_like())
@settings(max_examples=500)
def test_generated_urls_follow_whatwg(raw: str) -> None:
    assert whatwg_disagreements([whatwg_case(raw)]) == []


# Spellings the WHATWG parser serializes the same way, per part of a URL.
_HOST_SPELLINGS = {
    "example.com": ["example.com", "EXAMPLE.com", "Example.COM"],
    "xn--bcher-kva.example": ["bücher.example", "BÜCHER.example", "xn--bcher-kva.example",
                              "XN--BCHER-KVA.example", "bücher\u3002example"],
    "127.0.0.1": ["127.0.0.1", "127.1", "0x7f.1", "2130706433", "0177.0.0.1", "0X7F.0.0.1"],
    "[2001:db8::1]": ["[2001:db8::1]", "[2001:DB8:0:0:0:0:0:1]", "[2001:db8:0::1]"],
}
_PATH_SPELLINGS = {" ": [" ", "%20"], "ä": ["ä", "%C3%A4"], "{": ["{", "%7B"],
                   '"': ['"', "%22"], "`": ["`", "%60"], "^": ["^", "%5E"], "<": ["<", "%3C"]}
_QUERY_SPELLINGS = {"'": ["'", "%27"], " ": [" ", "%20"], "ä": ["ä", "%C3%A4"],
                    '"': ['"', "%22"], "<": ["<", "%3C"]}
_PATH_ALPHABET = "ab1-._~!$&'()*+,;=:@|[]" + "".join(_PATH_SPELLINGS)
_QUERY_ALPHABET = "ab1-._~!$&()*+,;=:@/?|[]{}^`\\" + "".join(_QUERY_SPELLINGS)


@st.composite
def whatwg_equal_spellings(draw: st.DrawFn) -> tuple[str, str]:
    """Two spellings of one URL that WHATWG parses to the same URL (fragment aside)."""
    scheme = draw(st.sampled_from(["http", "https"]))
    host = draw(st.sampled_from(sorted(_HOST_SPELLINGS)))
    # No dot-segments here (added below), no space at the end (WHATWG strips it there).
    segments = draw(st.lists(st.text(_PATH_ALPHABET, max_size=6).filter(
        lambda s: s.strip(".") != "" and not s.endswith(" ")), max_size=4))
    query = draw(st.one_of(st.none(), st.text(_QUERY_ALPHABET, min_size=1, max_size=8).filter(
        lambda s: not s.endswith(" "))))

    def spell(text: str, spellings: dict[str, list[str]]) -> str:
        return "".join(draw(st.sampled_from(spellings[c])) if c in spellings else c
                       for c in text)

    def one() -> str:
        url = draw(st.sampled_from(["", " ", "\x00"])) + draw(_random_case(scheme)) + ":"
        url += draw(st.sampled_from(["//", "\\\\", "/\\"]))
        url += draw(st.sampled_from(_HOST_SPELLINGS[host]))
        url += draw(st.sampled_from(["", ":", f":{'80' if scheme == 'http' else '443'}"]))
        for segment in segments:
            if draw(st.booleans()):
                url += draw(st.sampled_from(["/.", "/%2e", "/x/..", "/y/%2E%2e", "/z/.%2e"]))
            url += draw(st.sampled_from(["/", "\\"])) + spell(segment, _PATH_SPELLINGS)
        if not segments and draw(st.booleans()):
            url += "/"
        if query is not None:
            url += "?" + spell(query, _QUERY_SPELLINGS)
        if draw(st.booleans()):
            url += "#" + draw(st.text("ab #?'", max_size=4))
        return url

    return one(), one()


@given(whatwg_equal_spellings())
@settings(max_examples=500)
@example(("http://a.com/?'", "http://a.com/?%27"))
@example(("http://foo.com/\\@", "HTTP://FOO.COM//@"))
@example(("http://127.1/", "http://0x7f.0.0.1:80/"))
def test_urls_whatwg_calls_equal_have_one_canonical_form(pair: tuple[str, str]) -> None:
    a, b = (whatwg_case(x) for x in pair)
    assert a["href"].partition("#")[0] == b["href"].partition("#")[0]  # the premise
    assert whatwg_disagreements([a, b]) == []
    first, second = canonicalize(pair[0]), canonicalize(pair[1])
    assert isinstance(first, str)
    assert first == second
    assert fingerprint(first) == fingerprint(str(second))


# --------------------------------------------------------------------------- domains


@pytest.mark.parametrize(
    ("typed", "expected"),
    [
        ("example.com", "example.com"),
        ("Example.COM.", "example.com"),
        (" .example.com ", "example.com"),
        ("Bücher.example", "xn--bcher-kva.example"),
        ("BÜCHER.example.", "xn--bcher-kva.example"),
        ("xn--bcher-kva.example", "xn--bcher-kva.example"),
        ("bücher\u3002example", "xn--bcher-kva.example"),
        ("☃.net", "xn--n3h.net"),
        ("a_b.example", "a_b.example"),
        ("127.1", "127.0.0.1"),
    ],
)
def test_canonical_domain(typed: str, expected: str) -> None:
    assert canonical_domain(typed) == expected
    # The form canonical URLs carry, so comparing with their hosts works.
    canonical = canonicalize(f"https://{typed.strip().removeprefix('.')}/x")
    assert isinstance(canonical, str)
    assert _host_of(canonical) == expected


@pytest.mark.parametrize(
    ("typed", "message"),
    [
        ("", "without scheme, port, path or spaces"),
        ("   ", "without scheme, port, path or spaces"),
        ("https://example.com", "without scheme, port, path or spaces"),
        ("example.com/path", "without scheme, port, path or spaces"),
        ("example.com:8080", "without scheme, port, path or spaces"),
        ("user@example.com", "without scheme, port, path or spaces"),
        ("exa mple.com", "without scheme, port, path or spaces"),
        ("a..b", "empty label"),
        ("*.example.com", "invalid host"),
        ("xn--a.com", "not the punycode of a valid IDN label"),
        ("a" * 64 + ".com", "label over 63"),
        ("ex%41mple.com", "percent-encoded"),
    ],
)
def test_canonical_domain_rejects_with_a_clear_error(typed: str, message: str) -> None:
    with pytest.raises(ConfigError, match="invalid domain") as info:
        canonical_domain(typed)
    assert message in str(info.value)


# --------------------------------------------------------------------------- fingerprints


def test_fingerprint_is_blake2b_128_and_pinned() -> None:
    fp = fingerprint("http://example.com/")
    assert isinstance(fp, bytes)
    assert len(fp) == 16
    # Pinned: changing the hash would silently re-crawl every stored URL.
    assert task_id(fp) == "9aba6a18c5a5d94534a3b99c485d4547"
    assert partition_of(fp, 16) == 5
    assert partition_of(fp, 1000) == 133
    assert fingerprint("http://example.com/a") != fp


@given(st.text(max_size=100), st.integers(1, 10_000))
def test_partition_in_range_and_stable(url: str, partitions: int) -> None:
    fp = fingerprint(url)
    assert len(fp) == 16
    assert len(task_id(fp)) == 32
    assert bytes.fromhex(task_id(fp)) == fp
    p = partition_of(fp, partitions)
    assert 0 <= p < partitions
    assert p == partition_of(fingerprint(url), partitions)
    assert partition_of(fp, 1) == 0


def test_partitions_are_balanced() -> None:
    counts = Counter(
        partition_of(fingerprint(f"https://example.com/page-{i}"), 8) for i in range(8000)
    )
    assert set(counts) == set(range(8))
    assert all(850 <= n <= 1150 for n in counts.values()), counts


@pytest.mark.parametrize("partitions", [0, -1])
def test_partition_of_rejects_nonpositive(partitions: int) -> None:
    with pytest.raises(ValueError, match="partitions"):
        partition_of(fingerprint("http://example.com/"), partitions)
