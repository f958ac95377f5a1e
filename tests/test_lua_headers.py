"""Each Lua script's header lists its KEYS, ARGV and reply; the Python side must agree.

A recording client captures every script call (keys, args and, when not pipelined, the
reply) of a real run of the queue API, and:

- KEYS: Python passes exactly the keys the header lists, in that order, each named the
  way common/keys.py names it.
- ARGV, header against the script's own code: the fixed indices the header lists are the
  literal ``ARGV[n]`` the code reads (and ``argv_hosts(n)`` where the header puts H), the
  per-item tail starts where the code's loop starts, has as many values per item as the
  code reads, and every ``int_arg(ARGV[...], 'label')`` reads the entry the header names
  so.
- ARGV, header against what Python sends: the count (fixed entries, H and its hosts, a
  whole number of per-item groups), and each value's form by the name the header gives
  its position (an id is 32 hex digits, a token an integer, a *_ms an integer, ...), so a
  swap of two entries on either side fails.
- Reply: the length and codes the header's "Returns" gives, on real replies; lease.lua's
  layout against the one common/queue/lease_reply.py declares.
"""

from __future__ import annotations

import asyncio
import re
from collections import defaultdict
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from common.fleet.history import record
from common.fleet.locks import TokenLocks
from common.fleet.workers import WorkerRegistry
from common.frontier.groups import set_group
from common.frontier.hosts import Frontier
from common.keys import CrawlKeys
from common.policy import set_policy
from common.proxies import ProxyRules, ProxySpec, Report, ReportCalls, send_report
from common.proxies.sessions import SessionRules, SessionUpdate, send_updates
from common.queue import (
    CrawlSettings,
    DedupMode,
    Failure,
    LeasingQueue,
    NewTask,
    RetryPolicy,
    lease_reply,
)
from common.queue.rendermodes import RenderModes
from common.redis import scripts
from common.urls.canonical import fingerprint
from console.fsck import repair_hosts
from console.fsck.groups import repair_groups
from console.fsck.render import repair_render
from console.fsck.revisits import repair_schedule

LUA = Path(scripts.__file__).parents[1] / "lua"
FIXED = re.compile(r"^-- KEYS\[(\d+)\]\s+(\S+)")
RANGE = re.compile(r"^-- KEYS\[(\d+)\.\.(\d+)\]\s+(?:host|lease|group) state: ([^(]+)"
                   r"\(lib/(?:hosts|leases|groups)\.lua\)")
TAIL = re.compile(r"^-- KEYS\[(\d+)[^\]]*\.\.\]")
CYCLE = re.compile(r"^-- KEYS\[(\d+)\(i-1\)\+(\d+)\]\s+(\S+)")
OTHERS = ("worker_beat", "history_push", "release_lock", "refresh_lock", "robots_claim",
          "fsck_repair",
          "fsck_revisits",
          "policy_set", "policy_apply", "group_set", "fsck_groups",
          "proxy_report", "proxy_bans", "session_update", "fsck_render", "render_vote")
SOURCES = {scripts.source(name): name for name in (*scripts.NAMES, *OTHERS)}


def header(name: str) -> tuple[dict[int, str], int | None, dict[int, str]]:
    """The fixed KEYS of a script's header (index -> name), where its variable tail of
    keys starts (None: no tail), and a repeating group (position in group -> name)."""
    fixed: dict[int, str] = {}
    cycle: dict[int, str] = {}
    tail = None
    for line in (LUA / f"{name}.lua").read_text().splitlines():
        if m := CYCLE.match(line):
            cycle[int(m.group(2))] = m.group(3)
        elif m := RANGE.match(line):
            names = [n.strip() for n in m.group(3).split(",")]
            assert int(m.group(2)) - int(m.group(1)) + 1 == len(names), line
            fixed.update({int(m.group(1)) + i: n for i, n in enumerate(names)})
        elif m := FIXED.match(line):
            fixed[int(m.group(1))] = m.group(2)
        elif (m := TAIL.match(line)) and tail is None:
            tail = int(m.group(1))
    return fixed, tail, cycle


def key_name(key: str) -> str:
    """A key as the headers name it: the part after the hash tag, the per-host and
    per-item parts as placeholders."""
    name = key.split("}:", 1)[1]
    if name.startswith("lock:") or name.endswith(":lock"):
        return "lock"
    for prefix, shown in (("hq:", "hq:<h>"), ("hp:", "hp:<h>"), ("seen:", "seen"),
                          ("bloom:", "bloom:<L>"), ("worker:", "worker:<id>"),
                          ("op:", "op:<worker>"), ("ops:", "ops:<worker>"),
                          ("robots:", "robots"), ("rq:", "rq:<h>"), ("rop:", "rop:<worker>"),
                          ("rv:hist:", "rv:hist:<b>"), ("px:op:", "px:op:<worker>"),
                          ("se:", "se:<name>"), ("sp:", "sp:<host>")):
        if name.startswith(prefix):
            return shown
    return name


def test_key_name_reads_the_schema() -> None:
    assert key_name("crawlq:{c:0}:h:queued") == "h:queued"
    assert key_name("crawlq:{c:0}:hq:a.test:8080") == "hq:<h>"
    assert key_name("crawlq:{c}:history") == "history"
    assert key_name("crawlq:{c}:robots:https://a.test:lock") == "lock"


@dataclass
class Call:
    keys: list[str]
    args: list[str]
    reply: Any = None  # None: pipelined (its reply went to the pipeline)


def _str(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


async def recorded_calls(client: aioredis.Redis, crawl: str,
                         partitions: int = 2) -> dict[str, list[Call]]:
    """Every script call of `exercise`, by script name."""
    calls: dict[str, list[Call]] = defaultdict(list)
    real = client.register_script

    def recording(source: str) -> Any:
        script = real(source)
        name = SOURCES[source]

        async def call(keys: Any = None, args: Any = None, client: Any = None) -> Any:
            record = Call([_str(k) for k in keys or ()], [_str(a) for a in args or ()])
            calls[name].append(record)
            reply = await script(keys=keys, args=args, client=client)
            if client is None:
                record.reply = reply
            return reply
        return call

    client.register_script = recording  # type: ignore[method-assign]
    try:
        await exercise(client, crawl, partitions)
    finally:
        del client.register_script
    missing = {*scripts.NAMES, *OTHERS} - set(calls)
    assert not missing, f"scripts this test did not run: {missing}"
    return calls


async def test_headers_match_the_keys_passed(redis_client: aioredis.Redis,
                                             crawl_name: str) -> None:
    calls = {name: [c.keys for c in runs]
             for name, runs in (await recorded_calls(redis_client, crawl_name)).items()}
    wrong: list[str] = []
    for name, runs in calls.items():
        fixed, tail, cycle = header(name)
        assert fixed or cycle, f"{name}.lua lists no KEYS in its header"
        for keys in runs:
            if cycle:
                got_cycle = [key_name(k) for k in keys]
                want = [cycle[i % len(cycle) + 1] for i in range(len(keys))]
                if got_cycle != want or len(keys) % len(cycle):
                    wrong.append(f"{name}.lua: header {want}, Python passes {got_cycle}")
                continue
            for index, expected in fixed.items():
                got = key_name(keys[index - 1]) if index <= len(keys) else "(missing)"
                if got != expected:
                    wrong.append(f"{name}.lua KEYS[{index}]: header {expected!r}, "
                                 f"Python passes {got!r}")
            last = max(fixed)
            if tail is None and len(keys) != last:
                wrong.append(f"{name}.lua: header lists {last} keys, Python passes {len(keys)}")
            extra = [key_name(k) for k in keys[last:]]
            for i in range(0, len(extra) - 1, 2):
                if extra[i] == "hq:<h>" and extra[i + 1] != "hp:<h>":
                    wrong.append(f"{name}.lua: hq:<h> without its hp:<h> at {last + i + 1}")
    assert wrong == []


async def exercise(client: aioredis.Redis, crawl: str, partitions: int = 2) -> None:
    """Every script at least once, through the Python API."""
    def tasks(*urls: str, **kw: Any) -> list[NewTask]:
        return [NewTask(u, fingerprint(u), **kw) for u in urls]

    q = await LeasingQueue.open(client, crawl, CrawlSettings(partitions=partitions),
                              retry=RetryPolicy(base_ms=10))
    await q.enqueue(tasks("http://a.test/1", "http://a.test/2", "http://b.test/1",
                          "http://c.test/1", "http://d.test/1"))
    await q.enqueue(tasks("http://a.test/p", priority=3))
    front = Frontier(q)
    await front.set_defaults(delay_s=0, concurrency=0)  # policy_set, then policy_apply
    await front.set_host("b.test", concurrency=1)
    leases = await q.lease("w", 10, 60_000)
    assert len(leases) >= 4
    await q.ack("w", [(leases[0], "ok")])
    await q.fail("w", [Failure(leases[1], "http_429", "too slow", retry_after=0, pushback=True)])
    await q.fail("w", [Failure(leases[2], "gone", "no such page", permanent=True)])
    await q.late_turn("w", leases[3])
    await q.release("w", [leases[3]])
    await q.renew("w", leases[4:], 60_000)
    if len(leases) > 5:
        await q.checkpoint("w", leases[5], {"page": 1})
    short = await q.lease("w", 2, 1)
    await asyncio.sleep(0.01)
    await q.reclaim()
    await asyncio.sleep(0.05)  # the retry's backoff
    await q.promote()
    dead = await q.dead_ids()
    await q.dead_requeue(dead)
    await q.lease("w", 10, 60_000)
    del short
    # render tasks: the plain lease moves them to the render lane, lease_render leases them
    await q.enqueue(tasks("http://f.test/1", "http://f.test/2", render=True))
    q.woken()  # as the enqueue's wake-up would
    assert await q.lease("w", 10, 60_000) == []
    await q.lease_renders("w", 1, 60_000)  # a call on no hosts names them
    assert len((await q.lease_renders("w", 1, 60_000)).leases) == 1
    await q.is_empty()
    # a done URL of a crawl with revisits on, due: promote reads its history (history_get)
    rv = await LeasingQueue.open(client, crawl + "r", CrawlSettings())
    await set_policy(client, crawl + "r", {"revisit": "fixed", "recrawl_after": 100},
                     by="test", create=True)
    rv.configure(revisits=True)
    await rv.enqueue(tasks("http://r.test/1"))
    [done] = await rv.lease("w", 1, 60_000)
    await rv.ack("w", [(done, "ok")])
    await client.zadd(rv.partitions[0].rv_due, {done.task.id: 0})
    assert (await rv.promote())[0] == 1
    bloom = await LeasingQueue.open(client, crawl + "b", CrawlSettings(dedup=DedupMode.BLOOM))
    await bloom.enqueue(tasks("http://e.test/1"))
    [e] = await bloom.lease("w", 1, 60_000)
    await bloom.fail("w", [Failure(e, "gone", "x", permanent=True)])
    await bloom.dead_purge(await bloom.dead_ids())
    await WorkerRegistry(client, crawl, "w", ttl_s=60).beat(in_flight=0, done=0, failed=0,
                                                             state="running")
    await record(client, crawl, {"done": 1})
    locks = TokenLocks(client)
    lock = CrawlKeys.build(crawl).producer_lock
    await locks.refresh(lock, "token", 1000)
    await locks.release(lock, "token")
    robots = CrawlKeys.build(crawl).robots("http://a.test")
    claim = scripts.register(client, "robots_claim")
    await claim(keys=[robots, robots + ":lock"], args=["token", 1000])
    await client.set(robots, '{"status": 404, "body": "", "fetched_at": 0}', px=1000)
    await claim(keys=[robots, robots + ":lock"], args=["token", 1000])
    await repair_hosts(q, 0, [h for h in ("a.test", "b.test", "c.test", "d.test")
                              if q.partition_of(h) == 0])
    await repair_schedule(q, q.partitions[0], {"a" * 32: "a.test", "b" * 32: None})
    await set_group(q, "a.test", concurrency=1)
    await repair_groups(q, q.partitions[0], ["a.test"])
    report = Report()
    proxy = ProxySpec.of("http://u:p@proxy.test:8000")
    report.succeeded(proxy, 0.1)
    report.failed(proxy)
    report.banned(proxy, "a.test", exhausted=True)
    report.gone("b.test", 1000)
    await send_report(ReportCalls(client, crawl, q.partitions, q.partition_of, "w"), report,
                      ProxyRules())
    await send_updates(client, crawl, [
        SessionUpdate("member", "", 1, 0, cookies={"c:a.test\t/\tsid": "1\t-1\t"}),
        SessionUpdate("a.test@1", "a.test", 2, 1, proxy="abc", headers={"X-A": "1"})],
        SessionRules())
    await repair_render(q, q.partitions[q.partition_of("f.test")], ["f.test"])
    await RenderModes(client, crawl).vote("f.test", "list", True)


# -- ARGV and the reply --------------------------------------------------------------------

ARGV_ENTRY = re.compile(r"ARGV\[([^\]]+)\]\s+(.*?)(?=;?\s+ARGV\[|$)")
INDEX = re.compile(r"^(\d+)(\+H)?(\.\.)?(\d+\+H)?$")
HEX_ID = re.compile(r"^[0-9a-f]{32}$")
HOST = re.compile(r"^[a-z0-9.-]*[a-z][a-z0-9.-]*(:\d+)?$")
INT = re.compile(r"^-?\d+$")
#: Header names (as `_label` reads them) of integer ARGV entries and reply values.
INTEGERS = {"token", "lost code", "h", "m", "n", "k", "priority", "host index", "max_attempts",
            "max_stalls", "recrawl_after", "h1", "h2", "value", "pid", "in_flight", "done",
            "failed", "length kept", "the new ttl", "attempt"}


@dataclass
class Argv:
    """A script's ARGV layout, as its header gives it."""

    fixed: dict[int, str]        # ARGV[n] -> its description
    h_index: int | None          # where H (the number of hosts) is
    hosts_start: str | None      # "3" of ARGV[3..2+H]
    after_hosts: dict[int, str]  # ARGV[n+H] -> its description
    tail_start: str | None       # "5", "3+H"
    items: list[str]             # the names of one per-item group
    optional: list[str]          # names sent only with marks
    returns: str


def _entries(name: str) -> tuple[list[tuple[str, str]], str]:
    """The ARGV entries (index, description with its continuation lines) and the
    "Returns" text of a script's header."""
    entries: list[list[str]] = []
    returns: list[str] = []
    current: list[str] | None = None
    for line in (LUA / f"{name}.lua").read_text().splitlines():
        if not line.startswith("--"):
            break
        text = line[2:].strip()
        if text.startswith("ARGV["):
            current = None
            for m in ARGV_ENTRY.finditer(text):
                entries.append([m.group(1), m.group(2).strip()])
                current = entries[-1]
        elif text.startswith("Returns"):
            returns.append(text.removeprefix("Returns").strip())
            current = returns  # type: ignore[assignment]
        elif text.startswith("KEYS[") or not text or not line.startswith("--   "):
            current = None
        elif current is returns:
            returns.append(text)
        elif current is not None:
            current[1] += " " + text
    return [(i, d) for i, d in entries], " ".join(returns)


def _names(text: str) -> tuple[list[str], list[str]]:
    """The names of a comma-separated list, without parenthesized notes; names in
    "[, ...]" are optional."""
    while (stripped := re.sub(r"\([^()]*\)", "", text)) != text:
        text = stripped
    required, _, optional = text.split(". ")[0].partition("[")
    split = lambda t: [n.strip() for n in t.replace("]", "").split(",") if n.strip()]  # noqa: E731
    return split(required), split(optional)


def argv_header(name: str) -> Argv:
    entries, returns = _entries(name)
    layout = Argv({}, None, None, {}, None, [], [], returns)
    for index, text in entries:
        m = INDEX.match(index.replace(" ", ""))
        assert m, f"{name}.lua: ARGV[{index}] is not an index this test reads"
        start, plus_h, dots, end = m.groups()
        if dots and end:
            layout.hosts_start = start
        elif dots:
            layout.tail_start = start + (plus_h or "")
            if m2 := re.match(r"per item (\d+) values:\s*(.*)", text):
                layout.items, layout.optional = _names(m2.group(2))
                assert len(layout.items) == int(m2.group(1)), \
                    f"{name}.lua: 'per item {m2.group(1)} values' names {layout.items}"
            elif m2 := re.match(r"(?:per item|pairs):\s*(.*)", text):
                layout.items, layout.optional = _names(m2.group(1))
                if text.startswith("pairs"):
                    assert len(layout.items) == 2, f"{name}.lua: pairs of {layout.items}"
            elif m2 := re.search(r"\(with marks: (.*) pairs\)", text):
                *layout.items, last = _names(m2.group(1))[0]
                layout.optional = [last]
            else:
                layout.items = [text]
        elif plus_h:
            layout.after_hosts[int(start)] = text
        else:
            layout.fixed[int(start)] = text
            if text.startswith("H,"):
                layout.h_index = int(start)
    return layout


def _label(text: str) -> str:
    """An entry's name: its description up to the first comma, colon or note."""
    return re.split(r"[,:(]| - ", text, maxsplit=1)[0].strip().lower()


def value_problem(label: str, value: str, worker: str = "w") -> str | None:
    """Why `value` can't be what the header calls `label`, or None."""
    words = label.split()
    if label in ("id", "lost id") or label.endswith(" ids") or label == "ids":
        ok = bool(HEX_ID.match(value))
    elif label in INTEGERS or label.startswith("capacity") \
            or any(w.endswith("_ms") for w in words):
        ok = bool(INT.match(value))
    elif label == "setting":
        ok = value in ("delay", "concurrency", "budget", "robots_delay", "block")
    elif label == "marks":  # ack.lua's 2: and what each fetch observed (revisits)
        ok = value in ("0", "1", "2")
    elif label in ("permanent", "restart"):
        ok = value in ("0", "1")
    elif label == "jitter":
        ok = 0 <= float(value) <= 1
    elif label in ("reason", "outcome", "state"):
        ok = " " not in value and not INT.match(value) and bool(value)
    elif label in ("worker id",):
        ok = value == worker
    elif label == "worker id and operation id":  # ack, fail: lib/once.lua
        ok = re.fullmatch(rf"{re.escape(worker)} [0-9a-f]{{16}}", value) is not None
    elif label in ("host", "candidate hosts", "the host keys", "the hosts",
                   "the hosts of the tasks"):
        ok = bool(HOST.match(value))
    elif label == "entry":  # full or compact (common/tasks/task.py): its URL's path is there
        ok = "/" in value
    elif label in ("checkpoint json", "counters"):
        ok = value.startswith("{")
    else:
        return None
    return None if ok else f"{label!r} is {value!r}"


def args_problems(name: str, layout: Argv, args: list[str]) -> list[str]:
    """Where one call's ARGV disagrees with the header's layout."""
    where = f"{name}.lua ARGV"
    problems: list[str] = []

    def check(index: int, label: str) -> None:
        if index > len(args):
            problems.append(f"{where}[{index}] {label!r}: Python sends {len(args)} values")
        elif problem := value_problem(label, args[index - 1]):
            problems.append(f"{where}[{index}]: {problem}")

    for index, text in layout.fixed.items():
        # worker_beat's "id" is the worker's (the registry's member), not a task id
        check(index, "worker id" if (name, index) == ("worker_beat", 1) else _label(text))
    h = 0
    if layout.h_index is not None and layout.h_index <= len(args):
        h = int(args[layout.h_index - 1]) if INT.match(args[layout.h_index - 1]) else 0
        assert layout.hosts_start == str(layout.h_index + 1), f"{name}.lua: hosts after H"
        for i in range(layout.h_index + 1, layout.h_index + 1 + h):
            check(i, "the hosts")
    for index, text in layout.after_hosts.items():
        check(index + h, _label(text))
    if layout.tail_start is None:
        if len(args) != max(layout.fixed, default=0) + h:  # and H hosts, if it has H
            problems.append(f"{where}: header lists {max(layout.fixed, default=0)} values "
                            f"and {h} hosts, Python sends {len(args)}")
        return problems
    start = int(layout.tail_start.removesuffix("+H")) + (h if "+H" in layout.tail_start else 0)
    marks = [i for i, t in layout.fixed.items() if _label(t) == "marks"]
    # marks k: the first k optional values of each item (ack.lua's 2: seen field, observed)
    level = int(args[marks[0] - 1]) if marks and INT.match(args[marks[0] - 1]) else 0
    names = [*layout.items, *layout.optional[:level]]
    tail = args[start - 1:]
    if len(tail) % len(names):
        problems.append(f"{where}[{start}..]: {len(tail)} values, not whole groups of "
                        f"{names}")
    for i, value in enumerate(tail):
        label = _label(names[i % len(names)]) if len(names) > 1 else _label(names[0])
        if problem := value_problem(label, value):
            problems.append(f"{where}[{start + i}]: {problem}")
    return problems


def code_problems(name: str, layout: Argv) -> list[str]:
    """Where the header's ARGV disagrees with the script's own reads of ARGV."""
    code = "\n".join(line for line in (LUA / f"{name}.lua").read_text().splitlines()
                     if not line.lstrip().startswith("--"))
    where = f"{name}.lua"
    problems: list[str] = []
    literal = {int(n) for n in re.findall(r"ARGV\[(\d+)\]", code)}
    if m := re.search(r"argv_hosts\((\d+)\)", code):
        literal.add(int(m.group(1)))
        if layout.h_index != int(m.group(1)):
            problems.append(f"{where}: code reads H at ARGV[{m.group(1)}], header at "
                            f"ARGV[{layout.h_index}]")
    if literal != set(layout.fixed):
        problems.append(f"{where}: code reads ARGV{sorted(literal)}, header lists "
                        f"ARGV{sorted(layout.fixed)}")
    after = {int(n) for n in re.findall(r"ARGV\[(\d+) \+ nhosts\]", code)}
    if after != set(layout.after_hosts):
        problems.append(f"{where}: code reads ARGV[n+H] for n in {sorted(after)}, header "
                        f"lists {sorted(layout.after_hosts)}")
    # int_arg(ARGV[...], 'label'): the label names what the header has there.
    for index, label in re.findall(r"int_arg\(ARGV\[(\d+)\], '([^']+)'\)", code):
        text = layout.fixed.get(int(index), "")
        if not _same(label, text):
            problems.append(f"{where}: code reads {label!r} at ARGV[{index}], header has "
                            f"{text!r}")
    if layout.tail_start is None:
        if re.search(r"#ARGV", code):
            problems.append(f"{where}: code reads a tail of ARGV the header does not list")
        return problems
    # Where the tail starts and its width, from the loop over it.
    start = re.search(r"for i = (\d+)( \+ nhosts)?, #ARGV", code) \
        or re.search(r"local first = (\d+)( \+ nhosts)?\n", code)
    got_start = start and start.group(1) + ("+H" if start.group(2) else "")
    if got_start != layout.tail_start:
        problems.append(f"{where}: code's tail starts at ARGV[{got_start}], header's at "
                        f"ARGV[{layout.tail_start}]")
    # An item's values are read at ARGV[i + k] in the loop over the tail, or at
    # ARGV[base + k] where base is an item's first index (first + width * (i - 1)).
    var = "(?:i|base)" if re.search(r"\bbase = .*\b(?:first|\d+) \+ \w+ \* \(i - 1\)", code) \
        else "i"
    offsets = [int(k or 0) for k in re.findall(rf"ARGV\[{var}(?: \+ (\d+))?\]", code)]
    width = max(offsets, default=0) + 1
    if width - len(layout.items) not in range(len(layout.optional) + 1):
        problems.append(f"{where}: code reads {width} values per item, header names "
                        f"{layout.items}")
    if m := re.search(r"width = marks and (\d+) or (\d+)", code):
        if int(m.group(2)) != len(layout.items) or int(m.group(1)) - len(layout.items) \
                not in range(1, len(layout.optional) + 1):
            problems.append(f"{where}: code's width {m.group(0)!r}, header names "
                            f"{layout.items} [{layout.optional}]")
    elif layout.optional:
        problems.append(f"{where}: header has optional {layout.optional}, code no marks")
    for offset, label in re.findall(rf"int_arg\(ARGV\[{var}(?: \+ (\d+))?\], '([^']+)'\)",
                                    code):
        k = int(offset or 0)
        text = layout.items[k] if k < len(layout.items) else "(none)"
        if not _same(label, text):
            problems.append(f"{where}: code reads {label!r} at item offset {k}, header "
                            f"has {text!r}")
    return problems


def _same(label: str, text: str) -> bool:
    """Whether an int_arg label names the header entry `text` (each word of the label,
    less a plural s, is in it)."""
    text = text.lower()
    return all(w.removesuffix("s") in text for w in re.split(r"[ ]", label.lower()))


def test_argv_headers_match_the_scripts_code() -> None:
    problems = [p for name in (*scripts.NAMES, *OTHERS)
                for p in code_problems(name, argv_header(name))]
    assert problems == []


def test_argv_header_checks_can_fail() -> None:
    """The checks see a swapped, a missing and a miscounted entry (on a header changed
    here, in memory: the scripts stay as they are)."""
    fail = argv_header("fail")
    good = ["w 0123456789abcdef", "10", "20", "30", "40", "50", "60", "ab" * 16, "7", "3", "gone",
            "no such page", "-1", "0", "0.5", "0", "0", "1"]
    assert args_problems("fail", fail, good) == []
    items = fail.items
    swapped = Argv(**{**fail.__dict__, "items": [items[1], items[0], *items[2:]]})
    assert args_problems("fail", swapped, good) == [
        f"fail.lua ARGV[8]: 'token' is '{'ab' * 16}'", "fail.lua ARGV[9]: 'id' is '7'"]
    shorter = Argv(**{**fail.__dict__, "items": items[:-1]})
    assert "fail.lua: code reads 11 values per item" in " ".join(code_problems("fail", shorter))
    assert args_problems("fail", shorter, good) != []
    renamed = Argv(**{**fail.__dict__, "items": [*items[:8], "jitter", *items[9:]]})
    assert "code reads 'pushback' at item offset 8" in " ".join(
        code_problems("fail", renamed))
    renew = argv_header("renew")
    assert args_problems("renew", renew, ["w", "1000", "ab" * 16]) != []
    ack = argv_header("ack")  # an item's values read at ARGV[base + k]
    swapped = Argv(**{**ack.__dict__, "items": [*ack.items[:3], ack.items[4], ack.items[3],
                                                *ack.items[5:]]})
    assert "code reads 'sent_ms' at item offset 3" in " ".join(code_problems("ack", swapped))
    lease = argv_header("lease")
    assert args_problems("lease", lease,
                         ["w", "10", "x", "4", "", "0", "ab12", "0", "1", "a.test", "0"]) == [
        "lease.lua ARGV[3]: 'lease_ms' is 'x'"]


async def test_argv_headers_match_what_python_sends(redis_client: aioredis.Redis,
                                                    crawl_name: str) -> None:
    calls = await recorded_calls(redis_client, crawl_name)
    problems: list[str] = []
    for name, runs in calls.items():
        layout = argv_header(name)
        for call in runs:
            problems += args_problems(name, layout, call.args)
    assert sorted(set(problems)) == []


def _reply_names(returns: str) -> tuple[list[str], int | None]:
    """The names of a "Returns {...}" list and the width of its repeated group (None:
    no repeated group)."""
    body = returns[returns.index("{") + 1:returns.index("}")]
    names = [n.strip() for n in body.split(",")]
    if names[-1] != "...":
        return names, None
    names = names[:-1]
    for width in range(1, len(names) // 2 + 1):
        if names[-2 * width:-width] == names[-width:]:
            return names[:-width], width
    return names, len(names) - names.index("id")


def _codes(returns: str) -> set[int]:
    return {int(c) for c in re.findall(r"\b(\d) [A-Z]{2,}", returns)}


def reply_problems(name: str, layout: Argv, call: Call) -> list[str]:
    """Where one real reply disagrees with the header's "Returns"."""
    returns, reply = layout.returns, call.reply
    where = f"{name}.lua reply {reply!r}"
    items = 0
    if layout.tail_start is not None:
        h = int(call.args[layout.h_index - 1]) if layout.h_index else 0
        start = int(layout.tail_start.removesuffix("+H")) + (
            h if "+H" in layout.tail_start else 0)
        marks = [i for i, t in layout.fixed.items() if _label(t) == "marks"]
        level = int(call.args[marks[0] - 1]) if marks else 0
        width = len(layout.items) + len(layout.optional[:level])
        items = (len(call.args) - start + 1) // width
    if returns.startswith("a code"):
        return [] if int(reply) in _codes(returns) else [f"{where}: not one of the codes"]
    if m := re.search(r'"(\w+(?:,\w+)+)"', returns):
        if len(_str(reply).split(",")) != len(m.group(1).split(",")):
            return [f"{where}: not {m.group(1)!r}"]
        return []
    if not returns.startswith("{"):
        return [] if isinstance(reply, int) else [f"{where}: not a number"]
    if not isinstance(reply, list):
        return [f"{where}: not a list"]
    if re.match(r"\{code per (item|id)\}", returns):
        if len(reply) != items or not {int(c) for c in reply} <= _codes(returns):
            return [f"{where}: not one code of {_codes(returns)} per item ({items})"]
        return []
    names, width = _reply_names(returns)
    if re.search(r"\} per item", returns):
        if len(reply) != len(names) * items:
            return [f"{where}: not {names} per item ({items})"]
        return []
    if width is None:
        return [] if len(reply) == len(names) else [f"{where}: not {names}"]
    head = len(names) - width if name != "lease" else names.index("id")
    if len(reply) < head or (len(reply) - head) % width:
        return [f"{where}: not {names[:head]} then groups of {names[head:]}"]
    problems = []
    for group in range(head, len(reply), width):
        for k, label in enumerate(names[head:head + width]):
            if problem := value_problem(label.removesuffix("|false"), _str(reply[group + k])):
                problems.append(f"{where}: {problem}")
    return problems


async def test_replies_match_the_headers(redis_client: aioredis.Redis,
                                         crawl_name: str) -> None:
    """On one partition every call is direct, so every reply is seen."""
    calls = await recorded_calls(redis_client, crawl_name, partitions=1)
    problems: list[str] = []
    seen: set[str] = set()
    for name, runs in calls.items():
        layout = argv_header(name)
        assert layout.returns, f"{name}.lua has no Returns in its header"
        for call in runs:
            if call.reply is not None:
                seen.add(name)
                problems += reply_problems(name, layout, call)
    assert problems == []
    assert seen >= {"lease", "ack", "fail", "renew", "release", "enqueue", "purge"}


def test_lease_reply_layout_is_the_one_python_declares() -> None:
    """lease.lua's "Returns" names, in order, the fields of common/queue/lease_reply.py's
    LeaseReply (the head) and Granted (one leased task): the layout is declared once, in
    Python, and the script's header must say the same."""
    names, width = _reply_names(argv_header("lease").returns)
    names = [n.removesuffix("|false") for n in names]
    head, item = names[:names.index("id")], names[names.index("id"):]
    assert head == list(lease_reply.HEAD_NAMES)
    assert item == [f.name for f in fields(lease_reply.Granted)]
    assert (len(head), width) == (lease_reply.HEAD, lease_reply.WIDTH)
