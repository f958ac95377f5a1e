"""Lua scripts pull in the helper modules they use (``--- @include``), and Lua errors
name the file and line they come from.

- Each script's assembled source holds every module it includes (directly or through a
  module) once, after the modules that module includes, and no other; and the modules
  it holds are exactly those defining a name the script or those modules use.
- The line map gives, for every line of an assembled script, the file line it is.
- A missing module, a malformed include and a cycle are refused by name.
- A Lua error raised in a module and one raised in a script's body name their file and
  line, on Redis 6.2 and on 7 (their messages differ).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError
from redis_binaries import all_redis_servers

from common.errors import LuaIncludeError
from common.keys import PartitionKeys
from common.queue import CrawlQueue, CrawlSettings
from common.queue.calls import run
from common.redis import scripts
from common.redis.server import RedisServer

LUA = scripts.LUA
SCRIPTS = sorted(p.stem for p in LUA.glob("*.lua"))
MODULES = sorted(str(p.relative_to(LUA)) for p in (LUA / "lib").glob("*.lua"))
INCLUDE = re.compile(r'^--- @include "([^"]+)"$', re.M)
# Comments and strings, which name no helper the code uses.
NOT_CODE = re.compile(r"--[^\n]*|'(?:\\.|[^'\\])*'|\"(?:\\.|[^\"\\])*\"")
TOP_LEVEL = re.compile(r"^local (?:function )?(\w+(?:, \w+)*)", re.M)
# A name, but not a field (t.name, t:name); `..name` is a name.
NAME = re.compile(r"(?<![\w:])(?<![^.]\.)\b([A-Za-z_]\w*)")


def declared(path: str) -> list[str]:
    """The modules a file includes itself."""
    return [f"{m}.lua" for m in INCLUDE.findall((LUA / path).read_text())]


def closure(path: str) -> set[str]:
    """The modules a file includes, directly or through a module."""
    out: set[str] = set()
    todo = declared(path)
    while todo:
        if (module := todo.pop()) not in out:
            out.add(module)
            todo += declared(module)
    return out


def files_of(name: str) -> list[str]:
    """The files of a script's assembled source, in the order they come."""
    seen: list[str] = []
    for path, _ in scripts._assembled(name).lines:
        if not seen or seen[-1] != path:
            seen.append(path)
    return seen


def test_every_script_and_module_is_seen() -> None:
    assert len(SCRIPTS) >= 20 and "lease" in SCRIPTS and "lib" not in SCRIPTS
    assert {"lib/codes.lua", "lib/hosts.lua", "lib/leases.lua"} <= set(MODULES)
    assert not (LUA / "lib.lua").exists()


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_script_carries_each_module_it_includes_once_after_its_includes(name: str) -> None:
    files = files_of(name)
    assert files[-1] == f"{name}.lua" and files.count(f"{name}.lua") == 1
    assert sorted(files[:-1]) == sorted(closure(f"{name}.lua"))  # each once, no other
    for i, module in enumerate(files[:-1]):
        assert set(declared(module)) <= set(files[:i]), f"{module} before its includes"
    text = scripts.source(name)
    for module in MODULES:
        first = (LUA / module).read_text().split("\n", 1)[0]
        assert text.count(first) == (module in files), module


def test_a_script_without_host_state_does_not_carry_it() -> None:
    for name in ("renew", "checkpoint", "purge", "worker_beat"):
        assert "lib/hosts.lua" not in files_of(name)
        assert "local function ledger(" not in scripts.source(name)
    assert files_of("release_lock") == ["release_lock.lua"]
    assert "local function ledger(" in scripts.source("lease")


def _code(path: str) -> str:
    return NOT_CODE.sub(" ", (LUA / path).read_text())


def _defines(path: str) -> set[str]:
    return {n for m in TOP_LEVEL.findall(_code(path)) for n in m.split(", ")}


def _needs(path: str, owner: dict[str, str]) -> set[str]:
    """The modules defining a name `path`'s code uses."""
    own = _defines(path)
    return {owner[n] for n in NAME.findall(_code(path)) if n in owner and n not in own}


def test_the_names_checks_can_fail() -> None:
    """The tokenizer sees names, not fields, comments or strings."""
    code = NOT_CODE.sub(" ", "x = a.b .. c:d(e) -- f\nlocal s = 'g' .. \"h\"")
    assert set(NAME.findall(code)) == {"x", "a", "c", "e", "local", "s"}
    assert _defines("lib/memory.lua") == {"HASHTABLE_FIELD", "LEGACY_HASHTABLE_FIELD",
                                          "force_hashtable", "allow_at_maxmemory"}


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_script_carries_exactly_the_modules_whose_names_it_uses(name: str) -> None:
    """Every helper the code calls is defined (a missing one fails only when its line
    runs), and no module rides along unused."""
    owner = {n: module for module in MODULES for n in _defines(module)}
    assert len(owner) == sum(len(_defines(m)) for m in MODULES), "a name defined twice"
    needed: set[str] = set()
    todo = _needs(f"{name}.lua", owner)
    while todo:
        if (module := todo.pop()) not in needed:
            needed.add(module)
            todo |= _needs(module, owner)
    assert set(files_of(name)[:-1]) == needed


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_line_map_gives_each_lines_file_and_line(name: str) -> None:
    lines = scripts.source(name).removesuffix("\n").split("\n")
    assert len(lines) == len(scripts._assembled(name).lines)
    files = {path: (LUA / path).read_text().split("\n") for path in files_of(name)}
    for number, text in enumerate(lines, 1):
        path, line = scripts.where(name, number)
        assert files[path][line - 1] == text, (name, number)
    assert scripts.where(name, len(lines))[0] == f"{name}.lua"
    with pytest.raises(ValueError):
        scripts.where(name, len(lines) + 1)


# -- what the loader refuses ----------------------------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> Path:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def test_includes_resolve_in_a_directory_of_its_own(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "s.lua": '-- s\n--- @include "lib/b"\n--- @include "lib/a"\nreturn b()\n',
        "lib/a.lua": "local function a() return 1 end\n",
        "lib/b.lua": '--- @include "lib/a"\nlocal function b() return a() end\n'})
    got = scripts._assemble("s", root)
    assert [path for path, _ in got.lines] == [
        "lib/a.lua", "lib/b.lua", "lib/b.lua", "s.lua", "s.lua", "s.lua", "s.lua"]
    assert got.text.count("local function a()") == 1
    assert got.lines[-1] == ("s.lua", 4)


def test_an_unknown_include_is_refused_by_name(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"s.lua": '-- s\n--- @include "lib/nope"\nreturn 1\n'})
    with pytest.raises(LuaIncludeError, match=r"s\.lua includes lib/nope\.lua: no such file"):
        scripts._assemble("s", root)
    with pytest.raises(LuaIncludeError, match=r"Lua script gone\.lua: no such file"):
        scripts._assemble("gone", root)


def test_a_malformed_include_is_refused(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"s.lua": "-- s\n--- @include lib/a\nreturn 1\n",
                            "lib/a.lua": "local a = 1\n"})
    with pytest.raises(LuaIncludeError, match=r"s\.lua:2: not --- @include"):
        scripts._assemble("s", root)


def test_an_include_cycle_is_refused(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "s.lua": '--- @include "lib/a"\nreturn 1\n',
        "lib/a.lua": '--- @include "lib/b"\nlocal a = 1\n',
        "lib/b.lua": '--- @include "lib/a"\nlocal b = 1\n'})
    with pytest.raises(LuaIncludeError,
                       match=r"cycle: s\.lua -> lib/a\.lua -> lib/b\.lua -> lib/a\.lua"):
        scripts._assemble("s", root)
    _tree(tmp_path, {"lib/b.lua": '--- @include "lib/b"\nlocal b = 1\n'})
    with pytest.raises(LuaIncludeError, match=r"cycle: .*lib/b\.lua -> lib/b\.lua"):
        scripts._assemble("s", root)


# -- Lua errors name their file and line -------------------------------------------------


def line_of(path: str, text: str) -> int:
    """The one line of `path` that holds `text`."""
    found = [i for i, line in enumerate((LUA / path).read_text().split("\n"), 1)
             if text in line]
    assert len(found) == 1, (path, text, found)
    return found[0]


async def renew_error(client: aioredis.Redis, crawl: str, lease_ms: str) -> str:
    """The message of the error renew.lua raises on `lease_ms`."""
    pk = PartitionKeys.build(crawl, 0)
    renew = scripts.register(client, "renew")
    with pytest.raises(ResponseError) as caught:
        await renew(keys=[*pk.lease_state, pk.stats], args=["w", lease_ms])
    return str(caught.value)


async def check_error_locations(client: aioredis.Redis, crawl: str) -> None:
    # In a module: int_arg's error().
    message = await renew_error(client, crawl, "x")
    assert "crawlq: ARGV lease_ms must be an integer, got x" in message
    at = line_of("lib/codes.lua", "error('crawlq: ARGV ' .. name")
    assert message.endswith(f" (at lib/codes.lua:{at})"), message
    reported = int(re.findall(r"user_script: ?(\d+)", message)[-1])
    assert scripts.where("renew", reported) == ("lib/codes.lua", at)
    # In the script's body.
    message = await renew_error(client, crawl, "0")
    at = line_of("renew.lua", "error('crawlq: renew needs lease_ms >= 1")
    assert message.endswith(f" (at renew.lua:{at})"), message
    # A failed redis.call in a module (6.2 says "@user_script: N:" for these).
    pk = PartitionKeys.build(crawl, 0)
    await client.set(pk.leases, "not a zset")  # lease_states' ZMSCORE, through call_sliced
    with pytest.raises(ResponseError, match="WRONGTYPE") as caught:
        await scripts.Scripts(client).checkpoint(
            keys=[*pk.lease_state, pk.checkpoints, pk.stats],
            args=["w", "ab" * 16, "1", "{}"])
    await client.delete(pk.leases)
    at = line_of("lib/codes.lua", "local reply = redis.call(cmd, key, unpack(args))")
    assert str(caught.value).endswith(f" (at lib/codes.lua:{at})"), str(caught.value)
    # Pipelined (common.queue.calls.run, calls on several partitions): the failing call's script
    # is found by the SHA the message names.
    q = await CrawlQueue.open(client, crawl, CrawlSettings(partitions=1))
    keys = [*pk.lease_state, pk.stats]
    with pytest.raises(ResponseError) as caught:
        await run(q.client, [(q.scripts.renew, keys, ["w", "1000"]),
                             (q.scripts.renew, keys, ["w", "0"])])
    at = line_of("renew.lua", "error('crawlq: renew needs lease_ms >= 1")
    assert str(caught.value).endswith(f" (at renew.lua:{at})"), str(caught.value)


async def test_lua_errors_name_their_file_and_line(redis_client: aioredis.Redis,
                                                   crawl_name: str) -> None:
    await check_error_locations(redis_client, crawl_name)


OTHER_VERSIONS = [
    (label, path) for label, path in all_redis_servers()
    if RedisServer(binary=path).version()[:2] != RedisServer().version()[:2]]


@pytest.mark.integration
@pytest.mark.parametrize("binary", [p for _, p in OTHER_VERSIONS],
                         ids=[label for label, _ in OTHER_VERSIONS])
async def test_lua_errors_name_their_file_and_line_on_other_redis_versions(
        binary: str, crawl_name: str) -> None:
    with RedisServer(binary=binary) as server:
        client = aioredis.Redis.from_url(server.url)
        try:
            await check_error_locations(client, crawl_name)
        finally:
            await client.aclose()


async def test_a_script_that_succeeds_replies_unchanged(redis_client: aioredis.Redis,
                                                        crawl_name: str) -> None:
    pk = PartitionKeys.build(crawl_name, 0)
    renew = scripts.register(redis_client, "renew")
    reply = await renew(keys=[*pk.lease_state, pk.stats], args=["w", "1000"])
    assert len(reply) == 1 and reply[0] > 0
    pipe = redis_client.pipeline()
    await renew(keys=[*pk.lease_state, pk.stats], args=["w", "1000"], client=pipe)
    [piped] = await pipe.execute()
    assert len(piped) == 1 and piped[0] >= reply[0]
