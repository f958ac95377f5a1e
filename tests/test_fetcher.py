"""The consumer's fetcher and SSRF guard, against real aiohttp servers on 127.0.0.1 only.

Every test runs with the event loop's `sock_connect` wrapped (`connect_log`): it records each
address a socket connects to and refuses anything outside 127.0.0.0/8, so no test can send
traffic off this machine even if the guard under test were broken.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import ipaddress
import logging
import math
import socket
import struct
import time
import traceback
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from yarl import URL

import common.http.fetcher as fetcher_mod
from common.errors import FetchError
from common.http.fetcher import Fetcher
from common.http.results import (
    MAX_RETRY_AFTER_S,
    FetchResult,
    FetchSettings,
    classify_status,
    parse_retry_after,
)
from common.http.ssrf import GuardedResolver, SsrfGuard, SsrfSocketError, literal_host_ip
from common.urls.redact import redact_url

LOOPBACK = (ipaddress.ip_network("127.0.0.1/32"),)
MIB = 1024 * 1024
PROXY_USER = "crawler"
PROXY_PASSWORD = "s3cr3t-Pr0xy-pw"  # planted: must never show up anywhere
GOOD_PROXY_AUTH = "Basic " + base64.b64encode(f"{PROXY_USER}:{PROXY_PASSWORD}".encode()).decode()


def gzip_bomb(mib: int) -> bytes:
    """A gzip stream of `mib` MiB of zeros, one full-flush block repeated (~1 KiB per MiB)."""
    zeros = bytes(MIB)
    comp = zlib.compressobj(9, zlib.DEFLATED, 31)
    first = comp.compress(zeros) + comp.flush(zlib.Z_FULL_FLUSH)
    block = comp.compress(zeros) + comp.flush(zlib.Z_FULL_FLUSH)
    assert first.endswith(block)
    header = first[: len(first) - len(block)]
    crc = 0
    for _ in range(mib):
        crc = zlib.crc32(zeros, crc)
    # b"\x03\x00" is an empty final fixed-Huffman block; then CRC32 and ISIZE (mod 2**32).
    return header + block * mib + b"\x03\x00" + struct.pack("<II", crc, (mib * MIB) & 0xFFFFFFFF)


def blob_bytes(n: int) -> bytes:
    """`n` bytes whose pattern (period 251) shows any chunk dropped, repeated or reordered."""
    return (bytes(range(251)) * (n // 251 + 1))[:n]


@dataclass
class Servers:
    main: str  # http://127.0.0.1:<port>
    other: str  # a second origin (other port)
    proxy: str  # forwarding proxy, host:port only
    proxy407: str  # always answers 407
    port: int
    seen: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def record(self, key: str, item: dict[str, Any]) -> None:
        self.seen.setdefault(key, []).append(item)


# --- the local servers ------------------------------------------------------------------------


def _main_app(state: Servers, stop: asyncio.Event, bomb: bytes) -> web.Application:
    routes = web.RouteTableDef()

    @routes.get("/page")
    async def page(request: web.Request) -> web.Response:
        return web.Response(
            text="hello world",
            content_type="text/html",
            headers={"ETag": '"abc"', "X-Custom": "1", "Last-Modified": formatdate(0, usegmt=True)},
        )

    @routes.get("/status/{code}")
    async def status(request: web.Request) -> web.Response:
        headers = {}
        if "ra" in request.query:
            headers["Retry-After"] = request.query["ra"]
        code = int(request.match_info["code"])
        return web.Response(status=code, text=f"status {code}", headers=headers)

    @routes.get("/hang")
    async def hang(request: web.Request) -> web.Response:
        await asyncio.wait_for(stop.wait(), 60)
        return web.Response(text="late")

    @routes.get("/drip")
    async def drip(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        try:
            while not stop.is_set():
                await resp.write(b"x")
                await asyncio.sleep(0.3)
        except (ConnectionError, RuntimeError):
            pass
        return resp

    @routes.get("/big")
    async def big(request: web.Request) -> web.StreamResponse:
        """1 GiB, generated chunk by chunk: never held in memory."""
        resp = web.StreamResponse()
        await resp.prepare(request)
        chunk = bytes(64 * 1024)
        try:
            for _ in range(16 * 1024):
                await resp.write(chunk)
        except (ConnectionError, RuntimeError):
            pass
        return resp

    @routes.get("/gz/{which}")
    async def gz(request: web.Request) -> web.StreamResponse:
        which = request.match_info["which"]
        data = bomb if which == "bomb" else gzip_bomb(int(which))
        resp = web.StreamResponse(headers={"Content-Encoding": "gzip"})
        await resp.prepare(request)  # chunked: no Content-Length to refuse early
        try:
            for i in range(0, len(data), 64 * 1024):
                await resp.write(data[i : i + 64 * 1024])
        except (ConnectionError, RuntimeError):
            pass
        return resp

    @routes.get("/gzcl/{which}")
    async def gzcl(request: web.Request) -> web.Response:
        """Like /gz, but in one piece with an honest Content-Length (the compressed size)."""
        which = request.match_info["which"]
        data = bomb if which == "bomb" else gzip_bomb(int(which))
        return web.Response(body=data, headers={"Content-Encoding": "gzip"})

    @routes.get("/blob/{n}")
    async def blob(request: web.Request) -> web.StreamResponse:
        """`blob_bytes(n)`, with a Content-Length, or chunked in 10 kB writes with ?chunked."""
        data = blob_bytes(int(request.match_info["n"]))
        if "chunked" not in request.query:
            return web.Response(body=data)
        resp = web.StreamResponse()
        await resp.prepare(request)
        for i in range(0, len(data), 10_000):
            await resp.write(data[i : i + 10_000])
        await resp.write_eof()
        return resp

    @routes.get("/bigcl")
    async def bigcl(request: web.Request) -> web.StreamResponse:
        """Announces 50 MiB, then sends nothing: the client must not wait for the body."""
        resp = web.StreamResponse()
        resp.content_length = 50 * MIB
        await resp.prepare(request)
        await asyncio.wait_for(stop.wait(), 60)
        return resp

    @routes.get("/redir/{n}")
    async def redir(request: web.Request) -> web.Response:
        n = int(request.match_info["n"])
        if n == 0:
            return web.Response(text="done")
        raise web.HTTPFound(f"/redir/{n - 1}")

    @routes.get("/slowredir/{n}")
    async def slowredir(request: web.Request) -> web.Response:
        """Each hop answers quickly enough for a per-request timeout; the chain does not."""
        await asyncio.sleep(0.6)
        raise web.HTTPFound(f"/slowredir/{int(request.match_info['n']) + 1}")

    @routes.get("/loop/{name}")
    async def loop(request: web.Request) -> web.Response:
        other = "b" if request.match_info["name"] == "a" else "a"
        raise web.HTTPMovedPermanently(f"/loop/{other}")

    @routes.get("/to")
    async def to(request: web.Request) -> web.Response:
        return web.Response(status=302, headers={"Location": request.query["url"]})

    @routes.get("/echo")
    async def echo(request: web.Request) -> web.Response:
        state.record("main", dict(request.headers))
        return web.Response(text="echo")

    @routes.get("/cond")
    async def cond(request: web.Request) -> web.Response:
        """A page whose ETag is "v1": a 304 to a request that shows it."""
        state.record("cond", dict(request.headers))
        if request.headers.get("If-None-Match") == '"v1"':
            return web.Response(status=304, headers={"ETag": '"v1"'})
        return web.Response(text="fresh", headers={"ETag": '"v1"'})

    @routes.get("/peer")
    async def peer(request: web.Request) -> web.Response:
        """Records the client's (address, port): one pair per connection the client opened."""
        assert request.transport is not None
        state.record("peer", {"peer": tuple(request.transport.get_extra_info("peername"))[:2]})
        return web.Response(text="peer")

    app = web.Application()
    app.add_routes(routes)
    return app


def _other_app(state: Servers) -> web.Application:
    async def echo(request: web.Request) -> web.Response:
        state.record("other", dict(request.headers))
        return web.Response(text="other")

    app = web.Application()
    app.router.add_get("/echo", echo)
    return app


def _proxy_app(state: Servers, client: Callable[[], aiohttp.ClientSession]) -> web.Application:
    """A minimal forward proxy: absolute-form GET, checks Proxy-Authorization, loopback only."""

    async def forward(request: web.Request) -> web.Response:
        state.record(
            "proxy", {"url": str(request.url), "auth": request.headers.get("Proxy-Authorization")}
        )
        if request.headers.get("Proxy-Authorization") != GOOD_PROXY_AUTH:
            return web.Response(status=407, headers={"Proxy-Authenticate": 'Basic realm="t"'})
        if request.url.host != "127.0.0.1":
            return web.Response(status=403, text="this test proxy only forwards to 127.0.0.1")
        async with client().get(request.url, allow_redirects=False) as upstream:
            body = await upstream.read()
            kept = {k: v for k, v in upstream.headers.items()
                    if k in ("Retry-After", "ETag", "Location")}
            return web.Response(status=upstream.status, body=body, headers=kept)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def _proxy407_app(state: Servers) -> web.Application:
    async def refuse(request: web.Request) -> web.Response:
        state.record("proxy407", {"url": str(request.url)})
        return web.Response(status=407, headers={"Proxy-Authenticate": 'Basic realm="t"'})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", refuse)
    return app


async def _serve(app: web.Application, runners: list[web.AppRunner]) -> int:
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    runners.append(runner)
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port: int = runner.addresses[0][1]
    return port


@pytest.fixture(scope="module")
async def servers() -> AsyncIterator[Servers]:
    stop = asyncio.Event()
    runners: list[web.AppRunner] = []
    upstream: list[aiohttp.ClientSession] = []
    state = Servers(main="", other="", proxy="", proxy407="", port=0)
    bomb = gzip_bomb(1024)  # ~1 MiB of gzip -> 1 GiB of zeros
    try:
        port = await _serve(_main_app(state, stop, bomb), runners)
        state.port = port
        state.main = f"http://127.0.0.1:{port}"
        state.other = f"http://127.0.0.1:{await _serve(_other_app(state), runners)}"
        upstream.append(aiohttp.ClientSession())
        state.proxy = f"127.0.0.1:{await _serve(_proxy_app(state, lambda: upstream[0]), runners)}"
        state.proxy407 = f"127.0.0.1:{await _serve(_proxy407_app(state), runners)}"
        yield state
    finally:
        stop.set()
        for session in upstream:
            await session.close()
        for runner in reversed(runners):
            await runner.cleanup()


@pytest.fixture(autouse=True)
async def connect_log(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every address a socket connects to during the test; non-loopback ones are refused."""
    loop = asyncio.get_running_loop()
    real = loop.sock_connect
    attempts: list[str] = []

    async def guarded(sock: socket.socket, address: Any) -> None:
        host = str(address[0]).split("%")[0]
        attempts.append(host)
        ip = ipaddress.ip_address(host)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if not ip.is_loopback:
            raise ConnectionRefusedError(f"test harness refused a connection to {host}")
        await real(sock, address)

    monkeypatch.setattr(loop, "sock_connect", guarded)
    return attempts


def settings(**overrides: Any) -> FetchSettings:
    base: dict[str, Any] = {"allow_networks": LOOPBACK, "total_timeout": 10.0}
    base.update(overrides)
    return FetchSettings(**base)


@pytest.fixture
async def fetcher() -> AsyncIterator[Fetcher]:
    async with Fetcher(settings()) as f:
        yield f


async def fetch_error(f: Fetcher, url: str, **kwargs: Any) -> FetchError:
    with pytest.raises(FetchError) as info:
        await f.fetch(url, **kwargs)
    return info.value


def redirect_via(servers: Servers, location: str) -> str:
    """A URL on the main server that answers 302 with `location` as the Location header."""
    return str(URL(f"{servers.main}/to").with_query(url=location))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


# --- plain responses ----------------------------------------------------------------------------


async def test_200_page_body_and_headers(servers: Servers, fetcher: Fetcher) -> None:
    result = await fetcher.fetch(f"{servers.main}/page#frag")
    assert isinstance(result, FetchResult)
    assert result.status == 200
    assert result.body == b"hello world"
    assert result.url == f"{servers.main}/page#frag"
    assert result.final_url == f"{servers.main}/page"
    assert result.redirects == ()
    assert result.http_version == "HTTP/1.1"
    assert result.headers["content-type"].startswith("text/html")
    assert result.headers["etag"] == '"abc"'
    assert result.headers["content-length"] == "11"
    assert "last-modified" in result.headers and "date" in result.headers
    assert "x-custom" not in result.headers  # only the bounded subset
    assert (b"X-Custom", b"1") in result.raw_headers  # but all raw headers, as received
    assert 0 < result.elapsed < 5


async def test_404_is_a_result_not_an_error(servers: Servers, fetcher: Fetcher) -> None:
    result = await fetcher.fetch(f"{servers.main}/status/404")
    assert result.status == 404
    assert result.body == b"status 404"


@pytest.mark.parametrize(
    ("code", "reason"),
    [(500, "http_5xx"), (503, "http_5xx"), (408, "http_408"), (429, "http_429")],
)
async def test_retryable_statuses(
    servers: Servers, fetcher: Fetcher, code: int, reason: str
) -> None:
    err = await fetch_error(fetcher, f"{servers.main}/status/{code}?ra=7")
    assert err.reason == reason
    assert err.retryable is True
    assert err.status == code
    assert err.retry_after == 7.0


async def test_retry_after_http_date(servers: Servers, fetcher: Fetcher) -> None:
    when = formatdate(time.time() + 120, usegmt=True)
    err = await fetch_error(fetcher, f"{servers.main}/status/503?ra={when}")
    assert err.reason == "http_5xx"
    assert err.retry_after is not None
    assert 115 <= err.retry_after <= 121


async def test_user_agent_sent(servers: Servers, fetcher: Fetcher) -> None:
    await fetcher.fetch(f"{servers.main}/echo")
    assert servers.seen["main"][-1]["User-Agent"] == FetchSettings().user_agent


async def test_on_sent_says_when_each_hops_headers_went_out(servers: Servers) -> None:
    """Politeness reads a request's real start from `on_sent` (after any connect), once
    per hop, with the crawl's User-Agent of the moment as on the plain pool; never for a
    request that never went out. It is awaited before the headers go out: a wait there
    holds the request, and an exception stops it with nothing sent."""
    agent = [FetchSettings().user_agent]

    def noting(into: list[float], at: Callable[[], float] = time.monotonic
               ) -> Callable[[], Awaitable[None]]:
        async def on_sent() -> None:
            into.append(at())
        return on_sent

    async with Fetcher(settings(), user_agent=lambda: agent[0]) as fetcher:
        calls: list[float] = []
        before = time.monotonic()
        result = await fetcher.fetch(f"{servers.main}/redir/2", on_sent=noting(calls))
        assert result.status == 200 and len(result.redirects) == 2
        assert len(calls) == 3 and before <= calls[0] <= calls[1] <= calls[2]
        agent[0] = "polite/2"
        await fetcher.fetch(f"{servers.main}/echo", on_sent=noting(calls, lambda: 0.0))
        assert servers.seen["main"][-1]["User-Agent"] == "polite/2" and calls[-1] == 0.0
        refused: list[float] = []
        err = await fetch_error(fetcher, f"http://127.0.0.1:{free_port()}/",
                                on_sent=noting(refused))
        assert err.reason == "connect_error" and refused == []

        seen = len(servers.seen["main"])

        async def stop() -> None:
            raise LookupError("not now")
        with pytest.raises(LookupError):
            await fetcher.fetch(f"{servers.main}/echo", on_sent=stop)
        assert len(servers.seen["main"]) == seen

        async def wait() -> None:
            await asyncio.sleep(0.3)
        started = time.monotonic()
        await fetcher.fetch(f"{servers.main}/echo", on_sent=wait)
        assert len(servers.seen["main"]) == seen + 1 and time.monotonic() - started >= 0.3


async def test_connection_refused_is_retryable(fetcher: Fetcher) -> None:
    err = await fetch_error(fetcher, f"http://127.0.0.1:{free_port()}/")
    assert err.reason == "connect_error"
    assert err.retryable is True


async def fetch_error_from_raw(fetcher: Fetcher, response: bytes) -> FetchError:
    """The FetchError of fetching from a local server that answers `response` verbatim."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:  # the client may hang up first: close our side whatever happens
            await reader.readuntil(b"\r\n\r\n")
            writer.write(response)
            await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        return await fetch_error(fetcher, f"http://127.0.0.1:{port}/")
    finally:
        server.close()
        await server.wait_closed()


async def test_malformed_response_is_http_error(fetcher: Fetcher) -> None:
    err = await fetch_error_from_raw(
        fetcher, b"HTTP/1.1 2OO KO\r\nContent-Length: banana\r\n\r\nxyz")
    assert err.reason == "http_error"
    assert err.retryable is True
    assert "\n" not in err.message


@pytest.mark.parametrize(
    "url", ["ftp://example.test/", "not a url", "http:///nohost", "file:///etc/passwd"]
)
async def test_bad_url_is_permanent(fetcher: Fetcher, url: str, connect_log: list[str]) -> None:
    err = await fetch_error(fetcher, url)
    assert err.reason == "bad_url"
    assert err.retryable is False
    assert connect_log == []


# --- status and Retry-After, pure functions ------------------------------------------------------


def test_parse_retry_after() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after("120") == 120.0
    assert parse_retry_after(" 0 ") == 0.0
    assert parse_retry_after(formatdate(now + 30, usegmt=True), now=now) == pytest.approx(30, abs=1)
    assert parse_retry_after(formatdate(now - 30, usegmt=True), now=now) == 0.0  # clamped
    assert parse_retry_after("Sun Nov  6 08:49:37 1994", now=784111777.0) == 0.0  # asctime
    for garbage in (None, "", "soon", "-5", "1.5", "\uff11\uff12", "Mon, 99 Foo 2024 99:99:99 GMT"):
        assert parse_retry_after(garbage) is None, garbage


def test_parse_retry_after_clamps_huge_values_at_a_year() -> None:
    now = 1_700_000_000.0
    for huge in ("9" * 309, "9" * 5000, str(10**20), "31 Dec 9999 23:59:59 GMT"):
        assert parse_retry_after(huge, now=now) == MAX_RETRY_AFTER_S == 365 * 86400, huge[:20]
    assert parse_retry_after("0" * 5000 + "7") == 7.0  # leading zeros are not digits of size
    assert parse_retry_after(str(int(MAX_RETRY_AFTER_S) - 1)) == MAX_RETRY_AFTER_S - 1


_DIGITS = st.text(alphabet="0123456789", min_size=1, max_size=400)
_DATE_PART = st.one_of(_DIGITS, st.integers().map(str), st.text(max_size=6),
                       st.sampled_from(["Jan", "dec", "Foo", "GMT", "UT", "-0000", "+2359",
                                        "-2400", "+9999", "Sun,", ",", "-", ":", "00:00",
                                        "23:59:60", "99:99:99", "0.0.0", "1-Jan-99"]))


@st.composite
def _odd_dates(draw: st.DrawFn) -> str:
    """RFC 5322 / RFC 850 / asctime shapes with any of their parts replaced."""
    parts = draw(st.lists(_DATE_PART, min_size=1, max_size=7))
    return draw(st.sampled_from([" ", ", ", "-", ":"])).join(parts)


@given(st.one_of(
    st.text(),
    _DIGITS,
    st.integers(min_value=0, max_value=10**400).map(str),
    st.text(alphabet=st.characters(categories=["Nd", "No", "Zs"]), min_size=1),
    _odd_dates(),
    st.floats(min_value=0, max_value=4e9).map(lambda t: formatdate(t, usegmt=True)),
), st.one_of(st.none(), st.floats(min_value=-1e12, max_value=1e12)))
@example("9" * 309, None)
@example("9" * 5000, None)
@example("1 Jan 2024 00:00:00 +99999999999999999999", None)
@example("1 Jan 1 00:00:00 +2359", 0.0)
@example("Mon, 01 Jan 99999 00:00:00 GMT", None)
@example("\u0661 Jan \u0662\u0660\u0662\u0664 00:00:00 GMT", None)
@hypothesis_settings(max_examples=1000)
def test_parse_retry_after_never_raises(value: str, now: float | None) -> None:
    got = parse_retry_after(value, now=now)
    assert got is None or (type(got) is float and math.isfinite(got)
                           and 0.0 <= got <= MAX_RETRY_AFTER_S), (value, got)


def test_classify_status() -> None:
    for ok in (100, 200, 204, 301, 304, 400, 403, 404, 410, 451, 499):
        assert classify_status(ok, {}) is None, ok
    for bad in (0, 99, 600, 999):
        err = classify_status(bad, {})
        assert err is not None, bad
        assert (err.reason, err.retryable, err.status) == ("bad_status", False, bad)
    err = classify_status(502, {"retry-after": "3"})
    assert err is not None
    assert (err.reason, err.retryable, err.status, err.retry_after) == ("http_5xx", True, 502, 3.0)
    err = classify_status(429, {})
    assert err is not None and err.reason == "http_429" and err.retry_after is None


# --- timeouts ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/hang", "/drip"])
async def test_total_timeout_cannot_be_dodged(servers: Servers, path: str) -> None:
    async with Fetcher(settings(total_timeout=1.5)) as f:
        started = time.monotonic()
        err = await fetch_error(f, f"{servers.main}{path}")
        elapsed = time.monotonic() - started
    assert err.reason == "timeout"
    assert err.retryable is True
    assert 1.3 <= elapsed < 2.5


async def test_total_timeout_covers_the_whole_redirect_chain(servers: Servers) -> None:
    # max_redirects is high so only the deadline can end this chain of 0.6 s hops.
    async with Fetcher(settings(total_timeout=1.5, max_redirects=50)) as f:
        started = time.monotonic()
        err = await fetch_error(f, f"{servers.main}/slowredir/0")
        elapsed = time.monotonic() - started
    assert err.reason == "timeout"
    assert 1.3 <= elapsed < 2.5


# --- body caps -----------------------------------------------------------------------------------


async def _peak_memory_of(coro: Any) -> tuple[Any, int]:
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        try:
            outcome: Any = await coro
        except FetchError as exc:
            outcome = exc
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return outcome, peak


async def test_streamed_1gb_body_stops_at_cap(servers: Servers) -> None:
    async with Fetcher(settings(max_body_bytes=MIB)) as f:
        started = time.monotonic()
        err, peak = await _peak_memory_of(f.fetch(f"{servers.main}/big"))
    assert isinstance(err, FetchError)
    assert err.reason == "body_too_large"
    assert err.retryable is False
    assert peak < 20 * MIB  # observed ~1.5 MiB for a 1 MiB cap
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("which", ["bomb", "4"])
async def test_gzip_bomb_stops_at_cap_on_decompressed_bytes(servers: Servers, which: str) -> None:
    """1 GiB behind ~1 MiB of gzip, and 4 MiB behind ~4 KiB: the cap counts decompressed bytes."""
    async with Fetcher(settings(max_body_bytes=MIB)) as f:
        started = time.monotonic()
        err, peak = await _peak_memory_of(f.fetch(f"{servers.main}/gz/{which}"))
    assert isinstance(err, FetchError), err
    assert err.reason == "body_too_large"
    assert peak < 20 * MIB  # observed ~1.5 MiB for a 1 MiB cap
    assert time.monotonic() - started < 5


async def test_gzip_under_cap_is_decompressed(servers: Servers) -> None:
    async with Fetcher(settings(max_body_bytes=2 * MIB)) as f:
        result = await f.fetch(f"{servers.main}/gz/1")
    assert result.body == bytes(MIB)


async def test_honest_oversize_content_length_refused_before_reading(servers: Servers) -> None:
    async with Fetcher(settings(max_body_bytes=MIB)) as f:
        started = time.monotonic()
        err = await fetch_error(f, f"{servers.main}/bigcl")
    assert err.reason == "body_too_large"
    assert "Content-Length" in err.message
    assert time.monotonic() - started < 1.0  # the server never sends the body


@pytest.mark.parametrize("which", ["bomb", "4"])
async def test_gzip_bomb_with_content_length_stops_at_cap(servers: Servers, which: str) -> None:
    """An honest Content-Length counts compressed bytes: under the cap, it proves nothing."""
    cap = 2 * MIB
    assert len(gzip_bomb(1024)) < cap  # so the early Content-Length refusal does not apply
    async with Fetcher(settings(max_body_bytes=cap)) as f:
        started = time.monotonic()
        err, peak = await _peak_memory_of(f.fetch(f"{servers.main}/gzcl/{which}"))
    assert isinstance(err, FetchError), err
    assert err.reason == "body_too_large"
    assert "Content-Length" not in err.message  # stopped while reading, not before
    assert peak < 20 * MIB
    assert time.monotonic() - started < 5


async def test_gzip_decompressing_to_exactly_the_cap_passes(servers: Servers) -> None:
    async with Fetcher(settings(max_body_bytes=MIB)) as f:
        result = await f.fetch(f"{servers.main}/gzcl/1")
        assert result.body == bytes(MIB)
        err = await fetch_error(f, f"{servers.main}/gz/2")
    assert err.reason == "body_too_large"


@pytest.mark.parametrize("query", ["", "?chunked"])
async def test_body_exactly_at_cap_passes_one_byte_more_does_not(
    servers: Servers, query: str
) -> None:
    cap = 200_000  # several 64 KiB reads
    async with Fetcher(settings(max_body_bytes=cap)) as f:
        result = await f.fetch(f"{servers.main}/blob/{cap}{query}")
        assert result.body == blob_bytes(cap)
        err = await fetch_error(f, f"{servers.main}/blob/{cap + 1}{query}")
        assert err.reason == "body_too_large"
        assert ("Content-Length" in err.message) is (query == "")
        small = await f.fetch(f"{servers.main}/blob/1000{query}")  # the pool still works
    assert small.body == blob_bytes(1000)


async def test_empty_body(servers: Servers, fetcher: Fetcher) -> None:
    result = await fetcher.fetch(f"{servers.main}/blob/0")
    assert result.status == 200
    assert result.body == b""
    result = await fetcher.fetch(f"{servers.main}/status/204")
    assert result.status == 204
    assert result.body == b""


async def test_deadline_message_and_what_is_left_of_it(servers: Servers) -> None:
    async with Fetcher(settings(total_timeout=1.5)) as f:
        err = await fetch_error(f, f"{servers.main}/hang")
        assert err.message == "no complete response within 1.5s"
        # A later hop gets only what is left, and none once the deadline has passed.
        assert f._time_left(time.monotonic() - 1.0).total == pytest.approx(0.5, abs=0.1)
        with pytest.raises(FetchError) as info:
            f._time_left(time.monotonic() - 1.5)
        assert info.value.reason == "timeout"
        assert info.value.message == err.message


async def test_sock_read_timeout_holds_on_redirect_hops(servers: Servers) -> None:
    """The per-hop timeouts keep sock_read: a silent server is given up on before the deadline."""
    async with Fetcher(settings(sock_read_timeout=0.5, total_timeout=5.0)) as f:
        for url in (f"{servers.main}/hang", redirect_via(servers, "/hang")):
            started = time.monotonic()
            err = await fetch_error(f, url)
            assert err.reason == "timeout"
            assert "no complete response" not in err.message  # not the total deadline
            assert time.monotonic() - started < 2.0


async def test_proxy_retry_gets_only_what_is_left_of_the_deadline(servers: Servers) -> None:
    """A proxy answering 429 after 1 s, then one that hangs: the fetch ends at 1.5 s, not 2.5."""

    async def slow_429(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            await asyncio.sleep(1.0)
            writer.write(b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(slow_429, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    # The main test server, used as a proxy, serves the absolute-form path /hang: it hangs.
    proxies = (f"http://127.0.0.1:{port}", servers.main)
    try:
        async with Fetcher(settings(proxies=proxies, total_timeout=1.5)) as f:
            started = time.monotonic()
            err = await fetch_error(f, f"{servers.main}/hang")
            elapsed = time.monotonic() - started
    finally:
        server.close()
        await server.wait_closed()
    assert err.reason == "timeout"
    assert 1.3 <= elapsed < 2.0


# --- redirects -----------------------------------------------------------------------------------


async def test_redirect_chain_of_three(servers: Servers, fetcher: Fetcher) -> None:
    result = await fetcher.fetch(f"{servers.main}/redir/3")
    assert result.status == 200
    assert result.body == b"done"
    assert result.url == f"{servers.main}/redir/3"
    assert result.final_url == f"{servers.main}/redir/0"
    assert result.redirects == tuple(f"{servers.main}/redir/{n}" for n in (2, 1, 0))


async def test_five_redirects_ok_six_too_many(servers: Servers, fetcher: Fetcher) -> None:
    result = await fetcher.fetch(f"{servers.main}/redir/5")
    assert len(result.redirects) == 5
    err = await fetch_error(fetcher, f"{servers.main}/redir/6")
    assert err.reason == "too_many_redirects"
    assert err.retryable is False


async def test_redirect_loop(servers: Servers, fetcher: Fetcher) -> None:
    err = await fetch_error(fetcher, f"{servers.main}/loop/a")
    assert err.reason == "redirect_loop"
    assert err.retryable is False


@pytest.mark.parametrize(
    "location",
    [
        "file:///etc/passwd", "javascript:alert(1)", "ftp://127.0.0.1/x", "http://[::1",
        "http://", "https://", "http:///x",  # no host: not the current URL again (a "loop")
        "http://127.1/", "http://2130706433/", "http://0177.0.0.1/",  # non-canonical IPv4
    ],
)
async def test_bad_redirect(
    servers: Servers, fetcher: Fetcher, location: str, connect_log: list[str]
) -> None:
    err = await fetch_error(fetcher, redirect_via(servers, location))
    assert err.reason == "bad_redirect", err
    assert err.retryable is False
    assert connect_log == ["127.0.0.1"]  # only the first hop


@pytest.mark.parametrize("status", [600, 999])
async def test_status_outside_100_599_is_bad_status_not_a_result(
    fetcher: Fetcher, status: int
) -> None:
    err = await fetch_error_from_raw(
        fetcher, b"HTTP/1.1 %d Odd\r\nContent-Length: 2\r\n\r\nhi" % status)
    assert (err.reason, err.retryable, err.status) == ("bad_status", False, status)


async def test_credentials_dropped_on_cross_origin_redirect(
    servers: Servers, fetcher: Fetcher
) -> None:
    secret = {"Authorization": "Bearer t0ken", "Cookie": "session=1", "X-Keep": "yes"}
    target = f"{servers.other}/echo"
    result = await fetcher.fetch(redirect_via(servers, target), headers=secret)
    assert result.body == b"other"
    got = servers.seen["other"][-1]
    assert "Authorization" not in got
    assert "Cookie" not in got
    assert got["X-Keep"] == "yes"
    assert got["User-Agent"] == FetchSettings().user_agent


async def test_credentials_kept_on_same_origin_redirect(servers: Servers, fetcher: Fetcher) -> None:
    secret = {"Authorization": "Bearer t0ken", "Cookie": "session=1"}
    result = await fetcher.fetch(redirect_via(servers, "/echo"), headers=secret)
    assert result.body == b"echo"
    got = servers.seen["main"][-1]
    assert got["Authorization"] == "Bearer t0ken"
    assert got["Cookie"] == "session=1"


# --- conditional requests (a revisit) ----------------------------------------------------------

VALIDATORS = {"If-None-Match": '"v1"', "If-Modified-Since": "Thu, 01 Jan 1970 00:00:00 GMT"}


async def test_conditional_headers_go_to_the_url_and_a_304_has_no_body(
        servers: Servers, fetcher: Fetcher) -> None:
    result = await fetcher.fetch(f"{servers.main}/cond", conditional=VALIDATORS)
    assert (result.status, result.body, result.headers["etag"]) == (304, b"", '"v1"')
    sent = servers.seen["cond"][-1]
    assert {k: sent.get(k) for k in VALIDATORS} == VALIDATORS
    fresh = await fetcher.fetch(f"{servers.main}/cond")
    assert (fresh.status, fresh.body) == (200, b"fresh")
    assert not {"If-None-Match", "If-Modified-Since"} & set(servers.seen["cond"][-1])


@pytest.mark.parametrize("target", ["/echo", "other"])
async def test_validators_never_follow_a_redirect_to_another_url(
        servers: Servers, fetcher: Fetcher, target: str) -> None:
    where = "main" if target == "/echo" else "other"
    location = "/echo" if target == "/echo" else f"{servers.other}/echo"
    result = await fetcher.fetch(redirect_via(servers, location), headers={"X-Task": "1"},
                                 conditional=VALIDATORS)
    assert result.status == 200 and result.redirects
    got = servers.seen[where][-1]
    assert not {"If-None-Match", "If-Modified-Since"} & set(got)
    assert got["X-Task"] == "1"  # the task's own headers still follow


async def test_the_crawls_and_the_tasks_own_validator_headers_win(servers: Servers) -> None:
    crawl = settings(headers=(("If-None-Match", '"crawl"'),))
    async with Fetcher(crawl) as f:
        await f.fetch(f"{servers.main}/echo", headers={"if-modified-since": "task"},
                      conditional=VALIDATORS)
    got = servers.seen["main"][-1]
    assert (got["If-None-Match"], got["If-Modified-Since"]) == ('"crawl"', "task")


# --- SSRF ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target",
    ["http://169.254.169.254/latest/meta-data", "http://10.0.0.1/", "http://[fd00::1]:8080/"],
)
async def test_redirect_to_private_address_blocked_before_connecting(
    servers: Servers, target: str, connect_log: list[str]
) -> None:
    # The test server is reachable through allow_networks; the redirect target is not.
    # A short connect timeout makes a wrongly attempted connection fail fast (as a timeout or
    # connect_error, not ssrf_blocked), and connect_log would show it.
    async with Fetcher(settings(connect_timeout=0.5, total_timeout=3.0)) as f:
        err = await fetch_error(f, redirect_via(servers, target))
    assert err.reason == "ssrf_blocked"
    assert err.retryable is False
    assert set(connect_log) == {"127.0.0.1"}  # only the first hop, to the test server


@pytest.mark.parametrize("host", ["127.0.0.1", "[::ffff:127.0.0.1]", "localhost", "[::1]"])
async def test_guard_without_allow_list_blocks_loopback(
    servers: Servers, host: str, connect_log: list[str]
) -> None:
    async with Fetcher(FetchSettings(total_timeout=3.0, connect_timeout=0.5)) as f:
        err = await fetch_error(f, f"http://{host}:{servers.port}/page")
    assert err.reason == "ssrf_blocked"
    assert err.retryable is False
    assert connect_log == []


@pytest.mark.parametrize(
    ("host", "reason"),
    [
        # aiohttp 3.14 refuses non-canonical numeric IPv4 hosts itself: the URL is bad.
        ("2130706433", "bad_url"), ("127.1", "bad_url"), ("0177.0.0.1", "bad_url"),
        ("0", "bad_url"),
        # hex goes to getaddrinfo, which maps it to 127.0.0.1: the resolver guard refuses it.
        ("0x7f000001", "ssrf_blocked"), ("[::]", "ssrf_blocked"), ("0.0.0.0", "ssrf_blocked"),
    ],
)
async def test_legacy_and_unspecified_ip_forms_never_connect(
    servers: Servers, host: str, reason: str, connect_log: list[str]
) -> None:
    async with Fetcher(FetchSettings(total_timeout=3.0, connect_timeout=0.5)) as f:
        err = await fetch_error(f, f"http://{host}:{servers.port}/page")
    assert err.reason == reason, err
    assert err.retryable is False
    assert connect_log == []


async def test_connector_guard_catches_what_the_literal_check_misses(
    servers: Servers, connect_log: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiohttp skips the resolver for IP literals; the socket factory still refuses them."""
    monkeypatch.setattr(fetcher_mod, "literal_host_ip", lambda host: None)
    async with Fetcher(FetchSettings(total_timeout=3.0, connect_timeout=0.5)) as f:
        err = await fetch_error(f, f"http://127.0.0.1:{servers.port}/page")
    assert err.reason == "ssrf_blocked"
    assert connect_log == []


async def test_allow_private_reaches_loopback(servers: Servers) -> None:
    async with Fetcher(FetchSettings(allow_private=True, total_timeout=3.0)) as f:
        result = await f.fetch(f"http://localhost:{servers.port}/page")
    assert result.body == b"hello world"


@pytest.mark.parametrize(
    ("address", "blocked"),
    [
        ("169.254.169.254", True),
        ("100.64.1.1", True),
        ("::ffff:10.0.0.1", True),
        ("::ffff:169.254.169.254", True),
        ("64:ff9b::a00:1", True),  # NAT64 of 10.0.0.1
        ("64:ff9b::808:808", False),  # NAT64 of 8.8.8.8
        ("2002:a00:1::", True),  # 6to4 of 10.0.0.1
        ("::10.0.0.1", True),  # IPv4-compatible
        ("0.0.0.0", True),
        ("::", True),
        ("224.0.0.1", True),
        ("ff02::1", True),
        ("fe80::1", True),
        ("fe80::1%1", True),
        ("fd12:3456::1", True),
        ("127.0.0.1", True),
        ("127.9.9.9", True),
        ("::1", True),
        ("10.1.2.3", True),
        ("172.16.0.1", True),
        ("192.168.1.1", True),
        ("255.255.255.255", True),
        ("240.0.0.1", True),
        ("198.18.0.1", True),
        ("not-an-ip", True),
        ("8.8.8.8", False),
        ("1.1.1.1", False),
        ("::ffff:8.8.8.8", False),
        ("2606:4700:4700::1111", False),
    ],
)
def test_ssrf_guard_table(address: str, blocked: bool) -> None:
    guard = SsrfGuard(allow_private=False, allow_networks=())
    if blocked:
        with pytest.raises(FetchError) as info:
            guard.check(address)
        assert info.value.reason == "ssrf_blocked"
        assert info.value.retryable is False
    else:
        guard.check(address)
    SsrfGuard(allow_private=True).check(address)  # the switch turns it all off


def test_ssrf_guard_allow_networks() -> None:
    guard = SsrfGuard(allow_networks=(ipaddress.ip_network("10.0.0.0/8"), *LOOPBACK))
    guard.check("10.9.9.9")
    guard.check("127.0.0.1")
    guard.check("::ffff:127.0.0.1")  # the same address, mapped
    with pytest.raises(FetchError):
        guard.check("127.0.0.2")
    with pytest.raises(FetchError):
        guard.check("169.254.169.254")


def test_socket_factory_refuses_before_creating_a_socket() -> None:
    guard = SsrfGuard(allow_networks=LOOPBACK)
    with pytest.raises(SsrfSocketError) as info:
        guard.socket_factory((socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.1", 80)))
    assert info.value.fetch_error.reason == "ssrf_blocked"
    assert isinstance(info.value, OSError)
    sock = guard.socket_factory((socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 80)))
    sock.close()


def test_literal_host_ip() -> None:
    assert literal_host_ip("127.0.0.1") == "127.0.0.1"
    assert literal_host_ip("::FFFF:7f00:1") == "::ffff:7f00:1"
    assert literal_host_ip("[::1]") == "::1"
    assert literal_host_ip("example.com") is None
    assert literal_host_ip("1example.com") is None
    assert literal_host_ip(None) is None


class _FakeResolver(aiohttp.abc.AbstractResolver):
    def __init__(self, hosts: list[str]) -> None:
        self.hosts = hosts
        self.closed = False

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[aiohttp.abc.ResolveResult]:
        return [
            {"hostname": host, "host": h, "port": port, "family": family, "proto": 0, "flags": 0}
            for h in self.hosts
        ]

    async def close(self) -> None:
        self.closed = True


async def test_guarded_resolver_filters_and_refuses() -> None:
    guard = SsrfGuard()
    mixed = GuardedResolver(guard, _FakeResolver(["10.0.0.1", "93.184.215.14", "::1"]))
    assert [r["host"] for r in await mixed.resolve("mixed.test", 80)] == ["93.184.215.14"]
    refused = GuardedResolver(guard, _FakeResolver(["169.254.169.254", "fe80::1"]))
    with pytest.raises(FetchError) as info:
        await refused.resolve("metadata.test", 80)
    assert info.value.reason == "ssrf_blocked"
    inner = _FakeResolver([])
    await GuardedResolver(guard, inner).close()
    assert inner.closed


# --- proxies -------------------------------------------------------------------------------------


def test_redact_url() -> None:
    assert redact_url("http://u:p@proxy:3128") == "http://***@proxy:3128"
    assert redact_url("http://u:p@proxy:3128/x?y=a@b") == "http://***@proxy:3128/x?y=a@b"
    assert redact_url("http://proxy:3128/a@b") == "http://proxy:3128/a@b"
    assert redact_url("u:p@proxy") == "***@proxy"
    assert redact_url("http://proxy") == "http://proxy"
    assert redact_url("") == ""


async def test_proxy_407_retried_on_next_proxy_and_secrets_hidden(
    servers: Servers, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    proxies = (
        f"http://{PROXY_USER}:{PROXY_PASSWORD}@{servers.proxy407}",
        f"http://{PROXY_USER}:{PROXY_PASSWORD}@{servers.proxy}",
    )
    s = settings(proxies=proxies)
    before407 = len(servers.seen.get("proxy407", []))
    before = len(servers.seen.get("proxy", []))
    async with Fetcher(s) as f:
        result = await f.fetch(f"{servers.main}/page")
        assert result.status == 200
        assert result.body == b"hello world"
        assert len(servers.seen["proxy407"]) == before407 + 1  # tried first, answered 407
        assert len(servers.seen["proxy"]) == before + 1  # then the next one
        assert servers.seen["proxy"][-1]["auth"] == GOOD_PROXY_AUTH
        assert servers.seen["proxy"][-1]["url"] == f"{servers.main}/page"
        # round robin: the next fetch starts at the second proxy and needs no retry
        await f.fetch(f"{servers.main}/page")
        assert len(servers.seen["proxy407"]) == before407 + 1
        assert len(servers.seen["proxy"]) == before + 2
        texts = [repr(s), str(s), repr(f)]
    assert "***@" in repr(s)
    for text in [*texts, caplog.text]:
        assert PROXY_PASSWORD not in text


async def test_proxy_429_retried_on_next_proxy(servers: Servers) -> None:
    good = f"http://{PROXY_USER}:{PROXY_PASSWORD}@{servers.proxy}"
    before = len(servers.seen.get("proxy", []))
    async with Fetcher(settings(proxies=(good, good, good))) as f:
        err = await fetch_error(f, f"{servers.main}/status/429?ra=5")
    assert err.reason == "http_429"
    assert err.retry_after == 5.0
    assert len(servers.seen["proxy"]) == before + 3  # once through each proxy


async def test_proxy_connect_errors_never_leak_the_password(
    servers: Servers, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    dead = [f"http://{PROXY_USER}:{PROXY_PASSWORD}@127.0.0.1:{free_port()}" for _ in range(2)]
    async with Fetcher(settings(proxies=tuple(dead), connect_timeout=1.0)) as f:
        err = await fetch_error(f, f"{servers.main}/page")
    assert err.reason == "connect_error"
    assert err.retryable is True
    rendered = "".join(traceback.format_exception(err))
    for text in (str(err), repr(err), err.message, rendered, caplog.text):
        assert PROXY_PASSWORD not in text


async def test_proxy_cannot_reach_blocked_literal(servers: Servers, connect_log: list[str]) -> None:
    proxies = (f"http://{PROXY_USER}:{PROXY_PASSWORD}@{servers.proxy}",)
    async with Fetcher(settings(proxies=proxies)) as f:
        err = await fetch_error(f, "http://169.254.169.254/latest/meta-data")
    assert err.reason == "ssrf_blocked"
    assert connect_log == []


async def test_proxy_never_asked_for_a_blocked_literal_a_redirect_names(
    servers: Servers, connect_log: list[str]
) -> None:
    """Through a proxy the connector only ever sees the proxy's address: the literal check
    on every redirect hop is what refuses the metadata address here."""
    proxies = (f"http://{PROXY_USER}:{PROXY_PASSWORD}@{servers.proxy}",)
    start = redirect_via(servers, "http://169.254.169.254/latest/meta-data")
    before = len(servers.seen.get("proxy", []))
    async with Fetcher(settings(proxies=proxies)) as f:
        err = await fetch_error(f, start)
    assert err.reason == "ssrf_blocked"
    assert [seen["url"] for seen in servers.seen["proxy"][before:]] == [start]


def test_settings_repr_redacts_and_validates() -> None:
    s = FetchSettings(proxies=(f"http://u:{PROXY_PASSWORD}@127.0.0.1:3128",))
    assert PROXY_PASSWORD not in repr(s)
    assert "http://***@127.0.0.1:3128" in repr(s)
    assert "max_redirects=5" in repr(s)
    for bad in ("socks5://u:p@127.0.0.1:1080", f"http://u:{PROXY_PASSWORD}/x@127.0.0.1:3128"):
        with pytest.raises(ValueError) as info:
            FetchSettings(proxies=(bad,))
        assert PROXY_PASSWORD not in str(info.value)
    with pytest.raises(ValueError):
        FetchSettings(total_timeout=0)


async def test_fetch_before_start_is_an_error() -> None:
    with pytest.raises(RuntimeError):
        await Fetcher(settings()).fetch("http://127.0.0.1/")


async def test_many_concurrent_fetches_share_one_pool(
    servers: Servers, connect_log: list[str]
) -> None:
    servers.seen.pop("peer", None)
    async with Fetcher(settings(limit_per_host=4)) as f:
        results = await asyncio.gather(*(f.fetch(f"{servers.main}/peer") for _ in range(200)))
    assert [r.body for r in results] == [b"peer"] * 200
    # 200 requests rode 4 connections (limit_per_host), each kept alive and reused: the
    # client connected 4 times and the server saw 4 distinct client ports, 200 requests.
    assert connect_log == ["127.0.0.1"] * 4
    peers = [item["peer"] for item in servers.seen["peer"]]
    assert len(peers) == 200
    assert len(set(peers)) == 4
