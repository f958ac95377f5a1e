"""Loads the Lua scripts of ``common/lua`` and registers them with a Redis client.

A script names the helper modules it uses (``common/lua/lib/*.lua``) in lines
``--- @include "lib/<module>"`` after its header, and a module the modules it uses the
same way (paths relative to ``common/lua``). `source` assembles a script: each module it
needs once, after the modules that module includes, then the script. `where` maps a line
of that source back to its file and line.

`register` wraps redis-py's ``register_script`` (EVALSHA, reloaded on NOSCRIPT, so a
``SCRIPT FLUSH`` or a Redis restart mid-run is harmless): the message of a Lua error of a
direct call ends with where it was raised, e.g. ``(at lib/codes.lua:46)``. A pipelined
call's error is raised by the pipeline's ``execute``, unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any
from weakref import WeakKeyDictionary

from redis.asyncio import RedisCluster
from redis.exceptions import ResponseError

from common.errors import LuaIncludeError
from common.redis.resend import resendable
from common.redis.retry import resending
from common.redis.wait import ReplicaWait, acknowledged, replica_wait

LUA = Path(__file__).parents[1] / "lua"

NAMES = (
    "enqueue", "enqueue_bloom", "lease", "renew", "ack", "fail", "release", "checkpoint",
    "reclaim", "promote", "requeue", "purge", "host_set", "is_empty", "revisit",
    "late_turn", "history_get", "lease_render",
)

#: The scripts that change nothing: never followed by a WAIT (common/redis/wait.py).
READS = frozenset({"is_empty"})

_INCLUDE = re.compile(r'--- @include "([\w/.-]+)"')
#: Where Redis says a script failed: "Error running script (call to f_<sha>):
#: @user_script:541: ..." (6.2), "user_script:541: ... script: <sha>, on @user_script:541."
#: (7); 6.2 writes "@user_script: 541" in a failed redis.call's message.
_LINE = re.compile(r"user_script: ?(\d+)")


@dataclass(frozen=True)
class Assembled:
    """A script's source with its includes, and where each of its lines comes from."""

    text: str
    lines: tuple[tuple[str, int], ...]  # (file relative to the lua directory, its line)


def _assemble(name: str, root: Path) -> Assembled:
    """Script `name` of directory `root` with every module it includes, each once, each
    after the modules it includes itself."""
    text: list[str] = []
    lines: list[tuple[str, int]] = []
    done: set[str] = set()

    def add(path: str, chain: tuple[str, ...]) -> None:
        if path in chain:
            raise LuaIncludeError(f"Lua include cycle: {' -> '.join((*chain, path))}")
        if path in done:
            return
        try:
            own = (root / path).read_text().removesuffix("\n").split("\n")
        except FileNotFoundError:
            what = f"{chain[-1]} includes {path}" if chain else f"Lua script {path}"
            raise LuaIncludeError(f"{what}: no such file in {root}") from None
        for number, line in enumerate(own, 1):
            if line.startswith("--- @include"):
                m = _INCLUDE.fullmatch(line.rstrip())
                if not m:
                    raise LuaIncludeError(f'{path}:{number}: not --- @include "<module>"')
                add(f"{m.group(1)}.lua", (*chain, path))
        done.add(path)
        text.extend(own)
        lines.extend((path, number) for number in range(1, len(own) + 1))

    add(f"{name}.lua", ())
    return Assembled("\n".join(text) + "\n", tuple(lines))


@cache
def _assembled(name: str) -> Assembled:
    return _assemble(name, LUA)


def source(name: str) -> str:
    """The full source of one script, its includes resolved."""
    return _assembled(name).text


def where(name: str, line: int) -> tuple[str, int]:
    """The file (relative to common/lua) and line a line of script `name`'s assembled
    source comes from."""
    lines = _assembled(name).lines
    if not 1 <= line <= len(lines):
        raise ValueError(f"{name}.lua assembled has {len(lines)} lines, not line {line}")
    return lines[line - 1]


def _locate(exc: ResponseError, name: str) -> None:
    """Add to a Lua error's message the file and line its ``user_script`` line is."""
    message = str(exc)
    m = _LINE.search(message)
    if m and 1 <= (line := int(m.group(1))) <= len(_assembled(name).lines):
        path, number = where(name, line)
        exc.args = (f"{message} (at {path}:{number})", *exc.args[1:])


def locate_in(exc: ResponseError, scripts: Iterable[LuaScript]) -> None:
    """`_locate` for an error a pipeline raised: the script is the one whose SHA the
    message names (Redis names the function it ran)."""
    message = str(exc)
    for script in scripts:
        if script.script.sha in message:
            _locate(exc, script.name)
            return


class LuaScript:
    """A script registered on a client, called like redis-py's: a Lua error raised by a
    direct call says which file and line it came from; a call whose outcome is unknown
    is sent again only if the script is `resendable` (common/redis/resend.py's table, which
    must name it: KeyError otherwise)."""

    __slots__ = ("client", "name", "resendable", "script")

    def __init__(self, name: str, script: Any, client: Any) -> None:
        self.name = name
        self.script = script
        self.client = client  # the one it was registered on
        self.resendable = resendable(name)

    async def __call__(self, keys: Sequence[Any] | None = None,
                       args: Sequence[Any] | None = None, client: Any = None) -> Any:
        try:
            with resending(self.resendable):
                wait = None if client is not None or self.name in READS else replica_wait(
                    self.client)
                if wait is None:
                    return await self.script(keys=keys, args=args, client=client)
                return await self._waited(keys, args, wait)
        except ResponseError as exc:
            _locate(exc, self.name)
            raise

    async def _waited(self, keys: Sequence[Any] | None, args: Sequence[Any] | None,
                      wait: ReplicaWait) -> Any:
        """The call, then WAIT on its connection (--redis-wait-replicas)."""
        async with self.client.pipeline(transaction=False) as pipe:
            await self.script(keys=keys, args=args, client=pipe)
            pipe.execute_command(*wait.command())
            reply, replicas = await pipe.execute()
        acknowledged(wait, int(replicas))
        return reply


#: The sources registered on each client, by name, for `load_registered`.
_REGISTERED: WeakKeyDictionary[Any, dict[str, str]] = WeakKeyDictionary()


def register(client: Any, name: str) -> LuaScript:
    """Script `name`, registered on `client`."""
    text = source(name)
    _REGISTERED.setdefault(client, {})[name] = text
    return LuaScript(name, client.register_script(text), client)


async def load_registered(client: Any) -> list[str]:
    """Load every script registered on `client` so far (SCRIPT LOAD, one round trip; on
    a Cluster, each to every primary): a consumer's start-up step, so its first calls
    meet no NOSCRIPT. The names loaded."""
    texts = dict(_REGISTERED.get(client, {}))
    if isinstance(client, RedisCluster):
        for text in texts.values():
            await client.script_load(text)
    elif texts:
        async with client.pipeline(transaction=False) as pipe:
            for text in texts.values():
                pipe.script_load(text)
            await pipe.execute()
    return sorted(texts)


class Scripts:
    """The registered scripts of one client, as attributes named after their files."""

    def __init__(self, client: Any) -> None:
        for name in NAMES:
            setattr(self, name, register(client, name))

    enqueue: LuaScript
    enqueue_bloom: LuaScript
    lease: LuaScript
    renew: LuaScript
    ack: LuaScript
    fail: LuaScript
    release: LuaScript
    checkpoint: LuaScript
    reclaim: LuaScript
    promote: LuaScript
    requeue: LuaScript
    purge: LuaScript
    host_set: LuaScript
    is_empty: LuaScript
    revisit: LuaScript
    late_turn: LuaScript
    history_get: LuaScript
    lease_render: LuaScript
