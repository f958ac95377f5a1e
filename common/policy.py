"""A crawl's policy: what the whole fleet must agree on, stored once in Redis.

Today the policy holds the crawl's politeness defaults, ``per_host_delay`` and
``per_host_concurrency``; what its consumers read, ``accept_content_type``; who they say
they are, whether they obey robots.txt and how long they trust a copy of it,
``user_agent``, ``ignore_robots`` and ``robots_ttl``; which links they follow,
``max_depth`` and ``allow_domains``; how failed tasks are retried, ``retry_base``,
``retry_cap`` and ``max_retry_after``, and when one is dead, ``max_stalls`` (lease
expiries) and ``max_attempts`` (stamped on each task when it is enqueued); after how
long a URL already done may be enqueued again, ``recrawl_after`` (exact dedup only); and
how a host that pushes back is slowed for the whole fleet, ``backoff_on``,
``backoff_base``, ``backoff_cap`` and ``backoff_forgive`` (lib/backoff.lua); whether a
host's delay follows its response times, ``adaptive_delay`` up to ``max_delay``; and the
longest robots.txt Crawl-delay it obeys, ``max_crawl_delay``; and whether done URLs come
back by themselves on a revisit schedule, ``revisit`` (off, fixed or adaptive, exact
dedup only), between ``min_interval`` and ``max_interval``, learning by
``interval_grow`` and ``interval_shrink`` (common/lua/lib/revisits.lua); whether
recrawls send the validators each done URL keeps, ``conditional``; which links
are crawler traps, refused (``common.traps``): longer than ``trap_max_url_length``, with
more path segments than ``trap_max_segments``, one segment more often than
``trap_repeated_segments``, more query parameters than ``trap_max_params``, a page's links
to its own path that vary more than ``trap_page_facets`` non-numeric parameters (a faceted
search), or a new query past ``trap_path_variants`` for its path; whether session ids are
dropped from links (and tokens fresh per visit learned), ``trap_session_ids``; when a page
is a near duplicate of another variant of its URL, its links to that shape not followed,
``near_duplicate_distance`` (``consumer.judgement``); whether hosts are probed for soft
404s, ``soft_404``; whether a judged page's items are dropped, ``drop_judged_items``;
which requests are rendered in a browser, ``rendering`` (docs/rendering.md); and what else
a politeness limit is kept for, ``politeness_key`` (host, or domain: each registrable
domain's hosts share ``group_delay`` and ``group_concurrency``,
common/lua/lib/groups.lua; or ip: the hosts whose names resolve to one address do,
common.hostmodel.hostip); what a blocked answer looks like (``common.bans``): its
statuses through a proxy or a session, ``ban_status``, a selector it matches,
``ban_selector``, a text it holds, ``ban_text``; how many sessions a host's pool holds,
``session_pool``, and how many requests one serves, ``session_max_uses``; and how the
proxy pool treats the crawl's proxies
(``common.proxies``): its tiers, cheapest first, ``proxy_tiers``, how long a proxy a host
banned keeps away from it, ``proxy_ban_for``, how many bans move a host a tier up,
``proxy_tier_bans``, and how long a quiet spell takes it down, ``proxy_tier_quiet``; how
many failures in a row quarantine a proxy, ``proxy_max_failures``, and for how long at
first, ``proxy_quarantine``.
What stays a process's own setting (credentials, memory and time bounds, sinks) is
listed in docs/policy.md.

Each option is declared once, in `POLICY_OPTIONS`: its name (the flag's, in snake_case),
how its text parses (the flags' syntax: ``1s``, ``500ms``, ``2``, ``true``,
``a.example,b.example``), its default, its rule and its help; the `CrawlPolicy`
defaults, validation, ``crawlq crawl show`` and parsing of ``KEY=VALUE`` and TOML all
come from that table. One rule spans two options twice, ``retry_cap >= retry_base`` and
``backoff_cap >= backoff_base`` (`CAPPED`): checked on every change that sets either of a
pair, against the values the change lands on (`CrawlPolicy.replace`). A stored pair that
breaks it (two ``crawl set`` racing) still reads: the backoff, ``min(cap, base * 2^n)``,
is then the cap.

Storage (``common/keys.py``): the crawl-wide HASH ``policy`` (``version`` and one field
per option, its value as text in the flag's syntax) and the LIST ``policy:log`` (newest
first, capped at `LOG_LEN`: one JSON entry per change, ``{at, version, changes {key:
[old, new]}, by}``). Every change is validated here, then version, values and log entry
are written by one script (``policy_set.lua``). Then the politeness values are given to
every partition's ``conf`` with the version they come from (``policy_apply.lua``, which
also moves each scheduled host's turn to match), so the lease script reads them where
it always did. The policy is written first, each partition after (they live under other
hash tags); a partition's ``policy_version`` says which version it holds. Last, a
``policy`` message on the crawl's wake channel (``common.wake``) tells running consumers
to read it again (they also do at every heartbeat, in case the message was lost).

Each option's flag belongs to one command (`PolicyOption.seeded_by`): ``max_attempts``
and ``recrawl_after`` are the producer's, the others the consumer's. Who creates the
policy: ``crawlq crawl create``, else the first consumer (from its flags, before it waits
for the crawl), else the producer (from its flags), whichever comes first, the options
whose flags it lacks at their defaults; nobody overwrites it but ``crawlq crawl set``
(and `set_policy` callers: the API's ``Frontier.set_defaults``). A crawl an earlier
crawlq made has per-partition ``conf`` and no policy: the first `ensure_policy` or
`create_policy` adopts partition 0's values (logged ``by: migration``), so nothing
changes for a running crawl. A policy an earlier crawlq made lacks the options added
since: each `ensure_policy` adds those the caller seeds (its flags': `ensure_policy`'s
``seeds``), and keeps the others; one still missing reads as its default.

``recrawl_after`` needs exact dedup (bloom keeps no timestamps): a change that sets it
above 0 on a crawl whose settings say bloom is a PolicyError (one HGET of the crawl's
settings, only for such a change). A policy set before its crawl existed can't be
checked then: the producer refuses to run such a bloom crawl, and a consumer enqueues its
links without the window (with a WARNING).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import tomllib
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from math import ceil
from typing import Any

from common import codec
from common.bans import Blocked, check_selector, statuses
from common.codec import text as _text
from common.config import boolean, duration
from common.connection import RedisClient
from common.errors import ConfigError
from common.headers import DEFAULT_USER_AGENT
from common.hostmodel.hostgroup import NO_GROUP, host_group
from common.hostmodel.hostip import AddressBook
from common.keys import CrawlKeys, PartitionKeys
from common.proxies.rules import ProxyRules
from common.proxies.spec import tier_names
from common.queue import CrawlSettings, DedupMode, RetryPolicy, partition_keys
from common.scripts import register
from common.sessions import SessionRules
from common.task import DEFAULT_MAX_ATTEMPTS
from common.traps import TrapRules
from common.urls import canonical_domain
from common.wake import WakeChannel

#: Entries ``policy:log`` keeps (newest first).
LOG_LEN = 200
#: Hosts (of ``hosts``) one ``policy_apply.lua`` call refreshes.
APPLY_SLICE = 1000
#: Who a change is by, when it is not a person's command.
BY_MIGRATION = "migration"
#: The commands whose flags seed the policy (`PolicyOption.seeded_by`), and what an
#: option without a flag has there: it is set by ``crawlq crawl create/set`` alone.
CONSUMER = "crawlq-consumer"
PRODUCER = "crawlq-producer"
NOBODY = ""


class PolicyError(ConfigError):
    """A policy key or value is not valid; the message names the key, the value and the
    valid keys."""


class PolicyExistsError(ConfigError):
    """``create`` found a policy already there."""


class PolicyMovedError(ConfigError):
    """A change made against one version found another: someone changed the policy since
    (``version``: the one it holds now). Nothing was written."""

    def __init__(self, message: str, version: int) -> None:
        super().__init__(message)
        self.version = version


class NoPolicyError(ConfigError):
    """``set`` or ``show`` found no policy."""


def _non_negative(value: float) -> None:
    if value < 0:
        raise ConfigError(f"must be >= 0, got {value:g}")


def _positive(value: float) -> None:
    if not value > 0:
        raise ConfigError(f"must be > 0, got {value:g}")


def _whole(text: str) -> int:
    try:
        return int(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None


def _ms_seconds(text: str) -> float:
    """A duration in the flags' syntax, to the millisecond (what the frontier keeps)."""
    return round(duration(text) * 1000) / 1000


def _whole_ms_seconds(text: str) -> float:
    """A duration in the flags' syntax, cut to whole milliseconds as the retry flags
    always were (``1.5ms`` is 1 ms; ``round(..., 6)`` only drops float noise first)."""
    return int(round(duration(text) * 1000, 6)) / 1000


def _whole_seconds(text: str) -> int:
    """A duration in the flags' syntax in whole seconds, a fraction rounded up (``1.2s``
    is 2 s; ``round(..., 6)`` only drops float noise first)."""
    return ceil(round(duration(text), 6))


def _factor(text: str) -> float:
    """A factor >= 0, to the thousandth (what the frontier keeps)."""
    try:
        value = float(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return round(value, 3)


def _show_factor(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")


def _show_seconds(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".") + "s"


#: A media type as `accept_content_type` takes it: ``type/subtype`` or ``type/*``.
_MEDIA_TYPE = re.compile(r"^(?:[a-z0-9][a-z0-9!#$&^_.+-]*)/(?:\*|[a-z0-9][a-z0-9!#$&^_.+-]*)$")
ACCEPT_ALL = "*/*"


def media_types(text: str) -> tuple[str, ...]:
    """A comma-separated list of media types, lowercased; ``*/*`` (alone or in the list)
    or an empty text accepts everything: the empty tuple."""
    items = tuple(dict.fromkeys(i.strip().lower() for i in str(text).split(",") if i.strip()))
    if ACCEPT_ALL in items:
        return ()
    _media_types_ok(items)
    return items


def _media_types_ok(value: tuple[str, ...]) -> None:
    if not isinstance(value, tuple):
        raise ConfigError(f"must be a tuple of media types, got {value!r}")
    for item in value:
        if not isinstance(item, str) or not _MEDIA_TYPE.match(item):
            raise ConfigError(f"{item!r} is not a media type: type/subtype or type/* "
                              "(e.g. text/html,application/xhtml+xml; */* = everything)")


def _show_media_types(value: tuple[str, ...]) -> str:
    return ",".join(value) or ACCEPT_ALL


#: Longest `user_agent` taken (a header value; servers cap all headers at ~8 KiB).
MAX_USER_AGENT = 512
_PRINTABLE = re.compile(r"[\x20-\x7e]+")


def product_token(user_agent: str) -> str:
    """The token robots.txt groups are matched on: the first word of `user_agent`, up to '/'."""
    words = user_agent.split(None, 1)
    token = words[0].split("/", 1)[0] if words else ""
    if not token:
        raise ConfigError(f"user agent {user_agent!r} has no product token")
    return token


def _user_agent_ok(value: str) -> None:
    if (not isinstance(value, str) or len(value) > MAX_USER_AGENT
            or not _PRINTABLE.fullmatch(value) or value != value.strip()):
        raise ConfigError(f"must be 1-{MAX_USER_AGENT} printable ASCII characters without "
                          f"leading or trailing spaces (a User-Agent header), got {value!r}")
    product_token(value)


def _true_false(text: str) -> bool:
    """``true`` or ``false`` (or the environment's 1/0, yes/no, on/off); not empty."""
    if not str(text).strip():
        raise argparse.ArgumentTypeError("empty: use true or false")
    return boolean(text)


def _is_bool(value: bool) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"must be true or false, got {value!r}")


def _show_bool(value: bool) -> str:
    return "true" if value else "false"


def _whole_ok(value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"must be a whole number >= 0, got {value!r}")


def _at_least_one(value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"must be a whole number >= 1, got {value!r}")


#: The outcomes `backoff_on` may name: a status, any 5xx, a timeout, a refused connection.
PUSHBACK_OUTCOMES = ("429", "503", "5xx", "408", "timeout", "connect_error")
#: What `backoff_on` shows (and takes) for no outcome: push-back is never learned.
NO_OUTCOMES = "none"


def pushback_outcomes(text: str) -> tuple[str, ...]:
    """Comma-separated `PUSHBACK_OUTCOMES`, in the table's order; `NO_OUTCOMES` or
    nothing: the empty tuple."""
    items = {i.strip().lower() for i in str(text).split(",") if i.strip()}
    if items == {NO_OUTCOMES}:
        return ()
    unknown = sorted(items - set(PUSHBACK_OUTCOMES))
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown outcome {', '.join(unknown)}: use {','.join(PUSHBACK_OUTCOMES)} or "
            f"{NO_OUTCOMES}")
    return tuple(o for o in PUSHBACK_OUTCOMES if o in items)


def is_pushback(outcomes: Collection[str], reason: str, status: int | None) -> bool:
    """Whether a failed fetch (its `reason`, its `status` if a response came) is one of
    `outcomes` (`backoff_on`'s): a host pushing back."""
    if status is not None:
        return (str(status) in outcomes
                or (500 <= status <= 599 and "5xx" in outcomes))
    return reason in outcomes  # timeout, connect_error


def _pushback_outcomes_ok(value: tuple[str, ...]) -> None:
    if not isinstance(value, tuple) or not set(value) <= set(PUSHBACK_OUTCOMES):
        raise ConfigError(f"must be a tuple of {', '.join(PUSHBACK_OUTCOMES)}, got {value!r}")


def _show_outcomes(value: tuple[str, ...]) -> str:
    return ",".join(value) or NO_OUTCOMES


#: What `allow_domains` shows (and takes) for no list: a link must stay on its page's host.
PARENT_HOST = "@parent"


def domains(text: str) -> tuple[str, ...]:
    """Comma-separated domains in their canonical form (``Bücher.example`` ->
    ``xn--bcher-kva.example``), repeats dropped; `PARENT_HOST` or nothing: the empty tuple."""
    items = [i.strip() for i in str(text).split(",") if i.strip()]
    if items == [PARENT_HOST]:
        return ()
    return tuple(dict.fromkeys(canonical_domain(i) for i in items))


def _domains_ok(value: tuple[str, ...]) -> None:
    if not isinstance(value, tuple):
        raise ConfigError(f"must be a tuple of domains, got {value!r}")
    for item in value:
        if not isinstance(item, str) or canonical_domain(item) != item:
            raise ConfigError(f"{item!r} is not a domain in canonical form (e.g. "
                              "xn--bcher-kva.example for Bücher.example)")


def _show_domains(value: tuple[str, ...]) -> str:
    return ",".join(value) or PARENT_HOST


#: What a politeness limit is keyed by beyond the host (`politeness_key`): nothing more
#: (host), the host's registrable domain, its group (common.hostmodel.hostgroup), or the
#: address its name resolves to (ip, common.hostmodel.hostip).
POLITENESS_KEYS = ("host", "domain", "ip")


def _one_of(names: tuple[str, ...]
            ) -> tuple[Callable[[str], str], Callable[[str], None]]:
    """An option's parser of one of `names` (any case, spaces around) and its check."""
    def parse(text: str) -> str:
        name = str(text).strip().lower()
        if name not in names:
            raise argparse.ArgumentTypeError(f"must be one of {', '.join(names)}")
        return name

    def check(value: str) -> None:
        if value not in names:
            raise ConfigError(f"must be one of {', '.join(names)}, got {value!r}")
    return parse, check


politeness_key, _politeness_key_ok = _one_of(POLITENESS_KEYS)


#: How a crawl revisits the URLs it has done (`revisit`): never (off), after the first
#: interval every time (fixed), after an interval each visit stretches or shrinks
#: (adaptive), or after the interval that is best for the change rate its visits
#: estimate, within the budget of a fixed schedule (learned).
REVISIT_MODES = ("off", "fixed", "adaptive", "learned")


revisit_mode, _revisit_mode_ok = _one_of(REVISIT_MODES)


#: Which requests a crawl renders in a browser (`rendering`): those a request or its
#: spider's route asks for (off), every request enqueued (all), or every request, where
#: its (host, route) needs it (auto: common.queue.rendermodes).
RENDER_MODES = ("off", "all", "auto")


render_mode, _render_mode_ok = _one_of(RENDER_MODES)


def _below_one(value: float) -> None:
    if not 0 <= value < 1:
        raise ConfigError(f"must be >= 0 and < 1, got {value:g}")


#: What `near_duplicate_distance` shows (and takes) for no near-duplicate check.
OFF = "off"
#: ``max_depth`` without a limit, as the flags write it (held as -1).
NO_LIMIT = "none"


def depth(text: str) -> int:
    """A link depth limit: a whole number, or `NO_LIMIT`: -1 (follows go as deep as the
    site does; traps are bounded by the trap rules, not by depth)."""
    if str(text).strip().lower() == NO_LIMIT:
        return -1
    value = _whole(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"not a whole number >= 0 or {NO_LIMIT}: {text!r}")
    return value


def _depth_ok(value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise ConfigError(f"must be a whole number >= 0 or {NO_LIMIT}, got {value!r}")


def _show_depth(value: int) -> str:
    return NO_LIMIT if value < 0 else str(value)


def follows_from(depth: int, max_depth: int) -> bool:
    """Whether the links of a page at `depth` are followed under `max_depth` (-1: no
    limit): they would be at ``depth + 1``."""
    return max_depth < 0 or depth < max_depth


def near_duplicate_distance(text: str) -> int:
    """Bits (0-64) two page fingerprints may differ by and be near duplicates; `OFF`:
    -1 (never)."""
    if str(text).strip().lower() == OFF:
        return -1
    return _whole(text)


def _distance_ok(value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not -1 <= value <= 64:
        raise ConfigError(f"must be a whole number 0-64 or {OFF}, got {value!r}")


def _show_distance(value: int) -> str:
    return OFF if value < 0 else str(value)


#: What `ban_selector` and `ban_text` show (and take) for none.
OFF_TEXT = "none"


def ban_statuses(text: str) -> tuple[int, ...]:
    """Comma-separated HTTP statuses, sorted; `OFF_TEXT`: none."""
    items = [i.strip() for i in str(text).split(",") if i.strip()]
    if items == [OFF_TEXT]:
        return ()
    try:
        found = statuses(int(i) for i in items)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not HTTP statuses: {text!r} (e.g. 403,429; "
                                         f"{OFF_TEXT} = none)") from None
    return tuple(sorted(found))


def _ban_statuses_ok(value: tuple[int, ...]) -> None:
    try:
        ok = isinstance(value, tuple) and ban_statuses(_show_ban_statuses(value)) == value
    except (argparse.ArgumentTypeError, TypeError):
        ok = False
    if not ok:
        raise ConfigError(f"must be HTTP statuses 100-599, sorted, got {value!r}")


def _show_ban_statuses(value: tuple[int, ...]) -> str:
    return ",".join(map(str, value)) or OFF_TEXT


def _ban_selector(text: str) -> str:
    text = str(text).strip()
    return "" if text == OFF_TEXT else check_selector(text) if text else ""


def _ban_selector_ok(value: str) -> None:
    try:
        ok = isinstance(value, str) and _ban_selector(value or OFF_TEXT) == value
    except argparse.ArgumentTypeError:
        ok = False
    if not ok:
        raise ConfigError(f"must be a CSS selector or {OFF_TEXT}, got {value!r}")


def _ban_text(text: str) -> str:
    text = str(text).strip()
    return "" if text == OFF_TEXT else text


def _ban_text_ok(value: str) -> None:
    if not isinstance(value, str) or value != value.strip() or len(value) > 512:
        raise ConfigError(f"must be a text of at most 512 characters, got {value!r}")


def _show_off_text(value: str) -> str:
    return value or OFF_TEXT


def _tiers_ok(value: tuple[str, ...]) -> None:
    try:
        ok = isinstance(value, tuple) and tier_names(",".join(value)) == value
    except (argparse.ArgumentTypeError, TypeError):
        ok = False
    if not ok:
        raise ConfigError(f"must be tier names, cheapest first, got {value!r}")


@dataclass(frozen=True, slots=True)
class PolicyOption:
    """One policy option: ``name`` as the flag spells it, in snake_case; ``flag`` is
    ``seeded_by``'s (the command that creates the policy from it when there is none), or
    empty with ``seeded_by`` `NOBODY`: an option only ``crawlq crawl`` sets."""

    name: str
    flag: str
    parse: Callable[[str], Any]
    default: Any
    help: str
    check: Callable[[Any], None] = _non_negative
    show: Callable[[Any], str] = str
    toml_string: bool = False  # written as a TOML string ("1s"), else a number
    seeded_by: str = CONSUMER


POLICY_OPTIONS: tuple[PolicyOption, ...] = (
    PolicyOption("per_host_delay", "--per-host-delay", _ms_seconds, 1.0,
                 "least time between requests to one host across the whole fleet, unless "
                 "the host has its own (crawlq hosts set) or a longer robots.txt "
                 "Crawl-delay (e.g. 1s, 500ms)", show=_show_seconds, toml_string=True),
    PolicyOption("per_host_concurrency", "--per-host-concurrency", _whole, 2,
                 "most requests in flight to one host across the whole fleet, unless the "
                 "host has its own (0 = no limit)"),
    PolicyOption("accept_content_type", "--accept-content-type", media_types, (),
                 "media types whose bodies are read, comma-separated, type/* allowed "
                 "(*/* = all); any other response ends done, outcome filtered, its body "
                 "never read; no Content-Type is accepted",
                 check=_media_types_ok, show=_show_media_types, toml_string=True),
    PolicyOption("user_agent", "--user-agent", str.strip, DEFAULT_USER_AGENT,
                 "the User-Agent of every request, robots.txt's included; robots.txt "
                 "groups are matched on its product token (its first word up to /)",
                 check=_user_agent_ok, toml_string=True),
    PolicyOption("ignore_robots", "--ignore-robots", _true_false, False,
                 "true: neither fetch nor obey robots.txt (only for sites you own)",
                 check=_is_bool, show=_show_bool),
    PolicyOption("robots_ttl", "--robots-ttl", _ms_seconds, 86400.0,
                 "how long a fetched robots.txt is trusted before it is fetched again "
                 "(e.g. 1d, 6h; > 0)", check=_positive, show=_show_seconds, toml_string=True),
    PolicyOption("max_depth", "--max-depth", depth, -1,
                 "deepest link depth a handler's links are enqueued at (seeds are 0; "
                 f"{NO_LIMIT} = no limit: traps are bounded by the trap rules; 0 = the "
                 "seeds only); a link past it is dropped and counted (too_deep)",
                 check=_depth_ok, show=_show_depth),
    PolicyOption("allow_domains", "--allow-domains", domains, (),
                 "domains a handler's links may go to (and their subdomains), "
                 f"comma-separated; {PARENT_HOST} = the linking page's host",
                 check=_domains_ok, show=_show_domains, toml_string=True),
    PolicyOption("retry_base", "--retry-base", _whole_ms_seconds, 2.0,
                 "backoff before a failed task's first retry; doubles per attempt up to "
                 "retry_cap, with full jitter (e.g. 2s, 500ms; > 0)",
                 check=_positive, show=_show_seconds, toml_string=True),
    PolicyOption("retry_cap", "--retry-cap", _whole_ms_seconds, 600.0,
                 "longest backoff between attempts (>= retry_base)",
                 show=_show_seconds, toml_string=True),
    PolicyOption("max_retry_after", "--max-retry-after", _whole_ms_seconds, 3600.0,
                 "longest Retry-After honoured, by a task's retry and by its host's block",
                 show=_show_seconds, toml_string=True),
    PolicyOption("max_stalls", "--max-stalls", _whole, 2,
                 "lease expiries a task survives; one more and it is dead, reason stalled",
                 check=_whole_ok),
    PolicyOption("max_attempts", "--max-attempts", _whole, DEFAULT_MAX_ATTEMPTS,
                 "fetch attempts a task gets before it is dead (>= 1), stamped on each "
                 "task when it is enqueued", check=_at_least_one, seeded_by=PRODUCER),
    PolicyOption("recrawl_after", "--recrawl-after", _whole_seconds, 0,
                 "enqueue again a URL that is done and was last enqueued longer ago than "
                 "this, in whole seconds (e.g. 7d; 0s = never); exact dedup only",
                 check=_whole_ok, show=_show_seconds, toml_string=True, seeded_by=PRODUCER),
    PolicyOption("backoff_on", "", pushback_outcomes, ("429", "503"),
                 "the outcomes that count as a host pushing back, comma-separated, of "
                 f"{','.join(PUSHBACK_OUTCOMES)} ({NO_OUTCOMES} = never): each raises the "
                 "host's backoff level, blocks it and slows it for the whole fleet",
                 check=_pushback_outcomes_ok, show=_show_outcomes, toml_string=True,
                 seeded_by=NOBODY),
    PolicyOption("backoff_base", "", _whole_ms_seconds, 1.0,
                 "how long a host's first push-back blocks it (its Retry-After if longer); "
                 "doubles per push-back in a row, with 10% jitter (> 0)",
                 check=_positive, show=_show_seconds, toml_string=True, seeded_by=NOBODY),
    PolicyOption("backoff_cap", "", _whole_ms_seconds, 3600.0,
                 "longest block a host's backoff level gives (>= backoff_base)",
                 show=_show_seconds, toml_string=True, seeded_by=NOBODY),
    PolicyOption("backoff_forgive", "", _whole_ms_seconds, 300.0,
                 "how fast push-back is forgiven: the delay a host's push-back taught halves "
                 "this long after its block, and each such quiet spell takes a level off "
                 "(a response served resets it) (> 0)",
                 check=_positive, show=_show_seconds, toml_string=True, seeded_by=NOBODY),
    PolicyOption("adaptive_delay", "", _factor, 0.0,
                 "a host's delay follows its response times: their moving average x this "
                 "(e.g. 5), between the host's own delay and max_delay, the same for the "
                 "whole fleet (0 = off)", show=_show_factor, seeded_by=NOBODY),
    PolicyOption("max_delay", "", _ms_seconds, 30.0,
                 "longest delay adaptive_delay gives a host",
                 show=_show_seconds, toml_string=True, seeded_by=NOBODY),
    PolicyOption("max_crawl_delay", "", _ms_seconds, 300.0,
                 "longest robots.txt Crawl-delay (or Request-rate interval) obeyed: a longer "
                 "one is cut to this, logged and counted (0s = obey any)",
                 show=_show_seconds, toml_string=True, seeded_by=NOBODY),
    PolicyOption("revisit", "", revisit_mode, "off",
                 "bring every done URL back by itself, on a schedule kept in the frontier: "
                 "off, fixed (every recrawl_after), adaptive (an interval per URL, longer "
                 "while it does not change, shorter when it does) or learned (an interval "
                 "per URL from its estimated change rate, spending what fixed would); "
                 "exact dedup only",
                 check=_revisit_mode_ok, toml_string=True, seeded_by=NOBODY),
    PolicyOption("min_interval", "", _whole_seconds, 60,
                 "adaptive and learned: shortest interval between two visits of a URL "
                 "they learn (fixed revisits every recrawl_after, whatever this says)",
                 check=_whole_ok, show=_show_seconds, toml_string=True, seeded_by=NOBODY),
    PolicyOption("max_interval", "", _whole_seconds, 90 * 86400,
                 "adaptive and learned: longest interval between two visits of a URL "
                 "they learn (>= min_interval)",
                 check=_whole_ok, show=_show_seconds, toml_string=True, seeded_by=NOBODY),
    PolicyOption("interval_grow", "", _factor, 0.4,
                 "adaptive: a URL's interval x (1 + this) after a visit that found it "
                 "unchanged (a 304 or the same digest)", show=_show_factor, seeded_by=NOBODY),
    PolicyOption("interval_shrink", "", _factor, 0.2,
                 "adaptive: a URL's interval x (1 - this) after a visit that found it "
                 "changed (>= 0, < 1)", check=_below_one, show=_show_factor,
                 seeded_by=NOBODY),
    PolicyOption("conditional", "", _true_false, True,
                 "recrawls ask for a page only if it changed: with recrawl_after > 0 or "
                 "revisit on, each done URL keeps its ETag, Last-Modified and body digest, "
                 "with its host and entry for the producer to bring it back past the "
                 "window (~130 B in Redis), and its recrawl sends them (If-None-Match / "
                 "If-Modified-Since); a 304 or the same body ends done, not_modified or "
                 "unchanged, with no handler, so its links are not followed again. false: "
                 "no validators are sent, and a recrawl_after recrawl keeps none and "
                 "fetches and handles every page whole",
                 check=_is_bool, show=_show_bool, seeded_by=NOBODY),
    PolicyOption("trap_max_url_length", "", _whole, 1024,
                 "a link longer than this is a trap, refused (trap_length; 0 = no limit)",
                 check=_whole_ok, seeded_by=NOBODY),
    PolicyOption("trap_max_segments", "", _whole, 20,
                 "a link with more path segments than this is a trap, refused "
                 "(trap_segments; 0 = no limit)", check=_whole_ok, seeded_by=NOBODY),
    PolicyOption("trap_repeated_segments", "", _whole, 2,
                 "a link whose path holds one segment more times than this is a trap, "
                 "refused (trap_repeats; 2: /a/b/a/b/a/ is one; 0 = no limit)",
                 check=_whole_ok, seeded_by=NOBODY),
    PolicyOption("trap_max_params", "", _whole, 12,
                 "a link with more query parameters than this is a trap, refused "
                 "(trap_params; 0 = no limit)", check=_whole_ok, seeded_by=NOBODY),
    PolicyOption("trap_path_variants", "", _whole, 1000,
                 "distinct query strings the links to one path of a host may have, "
                 "fleet-wide; a new one past this is a trap, refused (trap_variants; 0 = "
                 "no limit)", check=_whole_ok, seeded_by=NOBODY),
    PolicyOption("trap_page_facets", "", _whole, 2,
                 "a page whose links to its own path vary more than this many query "
                 "parameters (words or numbers; not page, start, offset and the like) is a "
                 "faceted search: those links are traps, refused (trap_facets); links that "
                 "change only its pagination are followed (0 = no limit)", check=_whole_ok,
                 seeded_by=NOBODY),
    PolicyOption("trap_session_ids", "", _true_false, True,
                 "drop session ids (sid, jsessionid, phpsessid, ... with a token value) "
                 "from links, so a page under another session is the same URL",
                 check=_is_bool, show=_show_bool, seeded_by=NOBODY),
    PolicyOption("near_duplicate_distance", "", near_duplicate_distance, 0,
                 "a page whose URL is a variant (a query, or a date, counter or token in its "
                 "path) is a near duplicate of one of its host's of the same URL shape "
                 "whose words (numbers, month and day names masked) and links are at most "
                 "this many bits apart: 0 (the default) asks them to be the same; done, "
                 "outcome near_duplicate, its links to its shape not followed once reached "
                 "from a near duplicate (0-64; off = never)",
                 check=_distance_ok, show=_show_distance, seeded_by=NOBODY),
    PolicyOption("soft_404", "", _true_false, True,
                 "find each host's soft 404s by probing: once a link leads into a host (and "
                 "into a directory whose pages share a title), a request for a path that "
                 "cannot exist gives what the host answers a missing page with; a page that "
                 "matches it is done, outcome soft_404, its links not followed",
                 check=_is_bool, show=_show_bool, seeded_by=NOBODY),
    PolicyOption("drop_judged_items", "", _true_false, False,
                 "true: a page judged a near duplicate or a soft 404 has its items dropped "
                 "too; false: its items are written (a heuristic never drops an item unless "
                 "asked to), only its links are not followed",
                 check=_is_bool, show=_show_bool, seeded_by=NOBODY),
    PolicyOption("rendering", "", render_mode, "off",
                 "which requests are rendered in a browser, by the consumers started with "
                 "--browser: off (those a request or its spider's route asks for), all "
                 "(every request enqueued from then on) or auto (every request, but a "
                 "host's route whose pages give the same items and links over HTTP gets "
                 "them over HTTP, after three probes)",
                 check=_render_mode_ok, toml_string=True, seeded_by=NOBODY),
    PolicyOption("politeness_key", "", politeness_key, "host",
                 "what else a politeness limit is kept for: host (each host alone), "
                 "domain (also each registrable domain, its group: a.example.com and "
                 "b.example.com wait for each other too, by group_delay and "
                 "group_concurrency) or ip (also each server: the hosts whose names "
                 "resolve to one address, looked up at enqueue); one-partition crawls "
                 "only",
                 check=_politeness_key_ok, toml_string=True, seeded_by=NOBODY),
    PolicyOption("group_delay", "", _ms_seconds, 1.0,
                 "politeness_key domain or ip: least time between requests to the hosts of "
                 "one group across the whole fleet, unless the group has its own (crawlq "
                 "hosts group-set)", show=_show_seconds, toml_string=True, seeded_by=NOBODY),
    PolicyOption("group_concurrency", "", _whole, 2,
                 "politeness_key domain or ip: most requests in flight to the hosts of one "
                 "group across the whole fleet, unless the group has its own (0 = no "
                 "limit)",
                 check=_whole_ok, seeded_by=NOBODY),
    # The proxy pool (common.proxies, docs/proxies.md).
    PolicyOption("proxy_tiers", "", tier_names, ProxyRules().tiers,
                 "the proxy pool's tiers, cheapest first, comma-separated: a host starts on "
                 "the first and moves up one when it bans proxy_tier_bans proxies of its "
                 "tier (direct = no proxy: the consumers' own address; a tier no "
                 "consumer's --proxy has is skipped, one not named here comes last)",
                 check=_tiers_ok, show=",".join, toml_string=True, seeded_by=NOBODY),
    PolicyOption("proxy_ban_for", "", _whole_ms_seconds, ProxyRules().ban_ms / 1000,
                 "how long a proxy a host banned (a blocked answer through it) is not "
                 "used for that host; its other hosts keep it",
                 show=_show_seconds, toml_string=True, seeded_by=NOBODY),
    PolicyOption("proxy_tier_bans", "", _whole, ProxyRules().tier_bans,
                 "bans by one host at its tier that move it one tier up (>= 1; at once "
                 "when no proxy of its tier is left for it)",
                 check=_at_least_one, seeded_by=NOBODY),
    PolicyOption("proxy_tier_quiet", "", _whole_ms_seconds, ProxyRules().quiet_ms / 1000,
                 "a host moves one tier down after this long without a ban at its tier "
                 "(0s = never)", show=_show_seconds, toml_string=True, seeded_by=NOBODY),
    PolicyOption("proxy_max_failures", "", _whole, ProxyRules().max_failures,
                 "failures in a row (no connection through it, the proxy refusing or "
                 "dropping it) that quarantine a proxy for the whole fleet (>= 1)",
                 check=_at_least_one, seeded_by=NOBODY),
    PolicyOption("proxy_quarantine", "", _whole_ms_seconds, ProxyRules().quarantine_ms / 1000,
                 "a failing proxy's first quarantine; each one in a row lasts twice the "
                 "last, up to 32 times this; it is tried again when it ends (> 0)",
                 check=_positive, show=_show_seconds, toml_string=True, seeded_by=NOBODY),
    # What a blocked answer looks like (common.bans, docs/proxies.md).
    PolicyOption("ban_status", "", ban_statuses, (403,),
                 "statuses that are a block, not the page, of a request sent through the "
                 "proxy pool or with a session, comma-separated (none = never): retried on "
                 "another proxy or session, its proxy banned for the host; a request sent "
                 "direct without a session takes them as the page's answer",
                 check=_ban_statuses_ok, show=_show_ban_statuses, toml_string=True,
                 seeded_by=NOBODY),
    PolicyOption("ban_selector", "", _ban_selector, "",
                 "a CSS selector that a blocked 2xx HTML page matches (a captcha's form, "
                 "an access-denied shell), however it was sent: never taken as data "
                 f"({OFF_TEXT} = none)", check=_ban_selector_ok, show=_show_off_text,
                 toml_string=True, seeded_by=NOBODY),
    PolicyOption("ban_text", "", _ban_text, "",
                 "a text (case-insensitive) that a blocked 2xx page holds, however it was "
                 f"sent: never taken as data ({OFF_TEXT} = none)", check=_ban_text_ok,
                 show=_show_off_text, toml_string=True, seeded_by=NOBODY),
    # Sessions (common.sessions, docs/proxies.md).
    PolicyOption("session_pool", "", _whole, SessionRules().pool,
                 "sessions a host's pool holds: a request naming no session takes one of "
                 "its host's (its cookies, its proxy), retired on a block and after "
                 "session_max_uses requests (0 = no pool: such requests send no cookie)",
                 check=_whole_ok, seeded_by=NOBODY),
    PolicyOption("session_max_uses", "", _whole, SessionRules().max_uses,
                 "requests a pool session serves before it is retired (0 = no limit)",
                 check=_whole_ok, seeded_by=NOBODY),
)
OPTIONS: dict[str, PolicyOption] = {o.name: o for o in POLICY_OPTIONS}
#: The (base, cap) pairs whose cap may not be below its base.
CAPPED = (("retry_base", "retry_cap"), ("backoff_base", "backoff_cap"),
          ("min_interval", "max_interval"))
VALID_KEYS = ", ".join(OPTIONS)


def seeded_by(command: str) -> tuple[PolicyOption, ...]:
    """The options whose flag is `command`'s (`CONSUMER` or `PRODUCER`)."""
    return tuple(o for o in POLICY_OPTIONS if o.seeded_by == command)


@dataclass(frozen=True, slots=True)
class CrawlPolicy:
    """A crawl's policy values (defaults and rules from `POLICY_OPTIONS`)."""

    per_host_delay: float = OPTIONS["per_host_delay"].default
    per_host_concurrency: int = OPTIONS["per_host_concurrency"].default
    accept_content_type: tuple[str, ...] = OPTIONS["accept_content_type"].default
    user_agent: str = OPTIONS["user_agent"].default
    ignore_robots: bool = OPTIONS["ignore_robots"].default
    robots_ttl: float = OPTIONS["robots_ttl"].default
    max_depth: int = OPTIONS["max_depth"].default
    allow_domains: tuple[str, ...] = OPTIONS["allow_domains"].default
    retry_base: float = OPTIONS["retry_base"].default
    retry_cap: float = OPTIONS["retry_cap"].default
    max_retry_after: float = OPTIONS["max_retry_after"].default
    max_stalls: int = OPTIONS["max_stalls"].default
    max_attempts: int = OPTIONS["max_attempts"].default
    recrawl_after: int = OPTIONS["recrawl_after"].default
    backoff_on: tuple[str, ...] = OPTIONS["backoff_on"].default
    backoff_base: float = OPTIONS["backoff_base"].default
    backoff_cap: float = OPTIONS["backoff_cap"].default
    backoff_forgive: float = OPTIONS["backoff_forgive"].default
    adaptive_delay: float = OPTIONS["adaptive_delay"].default
    max_delay: float = OPTIONS["max_delay"].default
    max_crawl_delay: float = OPTIONS["max_crawl_delay"].default
    revisit: str = OPTIONS["revisit"].default
    min_interval: int = OPTIONS["min_interval"].default
    max_interval: int = OPTIONS["max_interval"].default
    interval_grow: float = OPTIONS["interval_grow"].default
    interval_shrink: float = OPTIONS["interval_shrink"].default
    conditional: bool = OPTIONS["conditional"].default
    trap_max_url_length: int = OPTIONS["trap_max_url_length"].default
    trap_max_segments: int = OPTIONS["trap_max_segments"].default
    trap_repeated_segments: int = OPTIONS["trap_repeated_segments"].default
    trap_max_params: int = OPTIONS["trap_max_params"].default
    trap_path_variants: int = OPTIONS["trap_path_variants"].default
    trap_page_facets: int = OPTIONS["trap_page_facets"].default
    trap_session_ids: bool = OPTIONS["trap_session_ids"].default
    near_duplicate_distance: int = OPTIONS["near_duplicate_distance"].default
    soft_404: bool = OPTIONS["soft_404"].default
    drop_judged_items: bool = OPTIONS["drop_judged_items"].default
    rendering: str = OPTIONS["rendering"].default
    politeness_key: str = OPTIONS["politeness_key"].default
    group_delay: float = OPTIONS["group_delay"].default
    group_concurrency: int = OPTIONS["group_concurrency"].default
    proxy_tiers: tuple[str, ...] = OPTIONS["proxy_tiers"].default
    proxy_ban_for: float = OPTIONS["proxy_ban_for"].default
    proxy_tier_bans: int = OPTIONS["proxy_tier_bans"].default
    proxy_tier_quiet: float = OPTIONS["proxy_tier_quiet"].default
    proxy_max_failures: int = OPTIONS["proxy_max_failures"].default
    proxy_quarantine: float = OPTIONS["proxy_quarantine"].default
    ban_status: tuple[int, ...] = OPTIONS["ban_status"].default
    ban_selector: str = OPTIONS["ban_selector"].default
    ban_text: str = OPTIONS["ban_text"].default
    session_pool: int = OPTIONS["session_pool"].default
    session_max_uses: int = OPTIONS["session_max_uses"].default

    def __post_init__(self) -> None:
        for opt in POLICY_OPTIONS:
            try:
                opt.check(getattr(self, opt.name))
            except ConfigError as exc:
                raise PolicyError(f"{opt.name}: {exc}; valid keys: {VALID_KEYS}") from None

    @property
    def delay_ms(self) -> int:
        return round(self.per_host_delay * 1000)

    def retry(self) -> RetryPolicy:
        """The queue's backoff and stall limit (values in whole ms, as parsed)."""
        return RetryPolicy(base_ms=round(self.retry_base * 1000),
                           cap_ms=round(self.retry_cap * 1000),
                           max_retry_after_ms=round(self.max_retry_after * 1000),
                           max_stalls=self.max_stalls,
                           backoff_base_ms=round(self.backoff_base * 1000),
                           backoff_cap_ms=round(self.backoff_cap * 1000),
                           backoff_forgive_ms=round(self.backoff_forgive * 1000))

    def group_conf(self) -> list[Any]:
        """What policy_apply.lua gives each partition's ``conf`` for politeness groups:
        the key ('' for host: no groups), their delay (ms) and concurrency."""
        key = "" if self.politeness_key == "host" else self.politeness_key
        return [key, round(self.group_delay * 1000), self.group_concurrency]

    def revisit_conf(self) -> list[int]:
        """What policy_apply.lua gives each partition's ``conf`` for the revisit schedule:
        mode (0 off, 1 fixed, 2 adaptive, 3 learned), first, min and max interval (s),
        grow and shrink (thousandths)."""
        return [REVISIT_MODES.index(self.revisit), self.recrawl_after, self.min_interval,
                self.max_interval, round(self.interval_grow * 1000),
                round(self.interval_shrink * 1000)]

    @property
    def keeps_history(self) -> bool:
        """Whether each done URL's fetch is kept for its recrawl (validators, digest):
        the crawl recrawls (recrawl_after or revisit) and `conditional` is on; revisits
        keep a history whatever `conditional` says (their schedule is in it)."""
        return self.revisit != "off" or (self.recrawl_after > 0 and self.conditional)

    def ban_rules(self) -> Blocked:
        """What a blocked answer looks like, by the crawl (common.bans)."""
        return Blocked(self.ban_status, (self.ban_selector,) if self.ban_selector else (),
                       (self.ban_text,) if self.ban_text else ())

    def session_rules(self) -> SessionRules:
        """The sessions' pool and usage count (common.sessions)."""
        return SessionRules(self.session_pool, self.session_max_uses)

    def proxy_rules(self) -> ProxyRules:
        """The proxy pool's rules (times in whole ms)."""
        return ProxyRules(self.proxy_tiers, round(self.proxy_ban_for * 1000),
                          self.proxy_tier_bans, round(self.proxy_tier_quiet * 1000),
                          self.proxy_max_failures, round(self.proxy_quarantine * 1000))

    def trap_rules(self) -> TrapRules:
        """The URL trap rules the link intake applies."""
        return TrapRules(self.trap_max_url_length, self.trap_max_segments,
                         self.trap_repeated_segments, self.trap_max_params,
                         self.trap_path_variants, self.trap_session_ids,
                         self.trap_page_facets)

    def texts(self) -> dict[str, str]:
        """Each value as text in the flags' syntax (what Redis stores)."""
        return {o.name: o.show(getattr(self, o.name)) for o in POLICY_OPTIONS}

    def replace(self, values: Mapping[str, Any]) -> CrawlPolicy:
        """This policy with some values changed (checked, with each `CAPPED` pair's cap
        >= its base when either is among them: PolicyError)."""
        for name, value in values.items():
            if name not in OPTIONS:
                raise PolicyError(f"unknown policy key {name!r} (value {value!r}); valid "
                                  f"keys: {VALID_KEYS}")
        policy = CrawlPolicy(**{**asdict(self), **values})
        for base, cap in CAPPED:
            if {base, cap} & values.keys() and getattr(policy, cap) < getattr(policy, base):
                texts = policy.texts()
                raise PolicyError(f"{cap}: must be >= {base} ({texts[base]}), got "
                                  f"{texts[cap]}; valid keys: {VALID_KEYS}")
        return policy


def parse_value(name: str, text: Any) -> Any:
    """One option's value from its text (or a TOML number or boolean); PolicyError names
    the key, the value and the valid keys."""
    opt = OPTIONS.get(name)
    if opt is None:
        raise PolicyError(f"unknown policy key {name!r} (value {text!r}); valid keys: "
                          f"{VALID_KEYS}")
    if isinstance(text, bool) and isinstance(opt.default, bool):
        text = _show_bool(text)  # TOML's true/false
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise PolicyError(f"{name}: bad value {text!r}; valid keys: {VALID_KEYS}")
    try:
        value = opt.parse(str(text))
        opt.check(value)
    except (argparse.ArgumentTypeError, ValueError) as exc:
        raise PolicyError(f"{name}: bad value {text!r} ({exc}); valid keys: "
                          f"{VALID_KEYS}") from None
    return value


def parse_assignments(items: Iterable[str]) -> dict[str, Any]:
    """``KEY=VALUE`` words as option values; every one is checked before any is used."""
    values: dict[str, Any] = {}
    for item in items:
        name, eq, text = item.partition("=")
        if not eq:
            raise PolicyError(f"not KEY=VALUE: {item!r}; valid keys: {VALID_KEYS}")
        values[name.strip()] = parse_value(name.strip(), text.strip())
    return values


def parse_toml(text: str, where: str = "TOML") -> dict[str, Any]:
    """Flat ``key = value`` TOML (what ``crawlq crawl show --toml`` writes) as values."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{where} is not valid TOML: {exc}") from None
    return {name: parse_value(name, value) for name, value in doc.items()}


#: A value TOML reads as a number or a boolean, written bare.
_TOML_BARE = re.compile(r"-?[0-9]+(\.[0-9]+)?|true|false")


def to_toml(policy: CrawlPolicy, crawl: str, version: int) -> str:
    """The policy as flat TOML that `parse_toml` (``crawl create --config``) reads back."""
    lines = [f"# crawl {crawl}, policy version {version} (crawlq crawl show --toml)"]
    for opt in POLICY_OPTIONS:
        value = getattr(policy, opt.name)
        # A JSON string of printable ASCII is a TOML basic string (a user agent may
        # hold quotes or backslashes).
        shown = opt.show(value)
        if opt.toml_string or not _TOML_BARE.fullmatch(shown):  # e.g. a distance "off"
            shown = json.dumps(shown)
        lines.append(f"{opt.name} = {shown}")
    return "\n".join(lines) + "\n"


def from_texts(stored: Mapping[str, str]) -> CrawlPolicy:
    """A policy from its stored fields (an option not stored takes its default)."""
    return CrawlPolicy(**{n: parse_value(n, t) for n, t in stored.items() if n in OPTIONS})


def flag_differences(crawl: str, stored: CrawlPolicy, wanted: CrawlPolicy, command: str,
                     *, given: Collection[str]) -> list[dict[str, str]]:
    """For each of `command`'s flags in `given` (the ones the user gave: a default asks
    for nothing) whose value (in `wanted`) differs from the crawl's: what its
    ``crawl_policy_differs`` WARNING says (the flag, both values, the advice)."""
    theirs, mine = stored.texts(), wanted.texts()
    return [{"crawl": crawl, "flag": o.flag, "flag_value": mine[o.name],
             "crawl_value": theirs[o.name],
             "advice": f"{o.flag} applies only when a {command.removeprefix('crawlq-')} "
                       f"creates the crawl's policy; the crawl's {o.name}={theirs[o.name]} "
                       f"holds. Change it with: crawlq crawl set --crawl {crawl} "
                       f"{o.name}={mine[o.name]}"}
            for o in seeded_by(command) if o.flag in given and theirs[o.name] != mine[o.name]]


@dataclass(frozen=True, slots=True)
class StoredPolicy:
    """A crawl's policy as Redis holds it, with its newest log entries."""

    version: int
    policy: CrawlPolicy
    log: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self, crawl: str) -> dict[str, Any]:
        return {"crawl": crawl, "version": self.version, "values": asdict(self.policy),
                "text": self.policy.texts(), "log": self.log}


async def read_policy(client: RedisClient, crawl: str, *, log_limit: int = 5
                      ) -> StoredPolicy | None:
    """The crawl's policy and its newest `log_limit` log entries, or None."""
    keys = CrawlKeys.build(crawl)
    if log_limit <= 0:  # LRANGE 0 -1 would read the whole log
        return await read_values(client, crawl)
    async with client.pipeline(transaction=False) as pipe:
        pipe.hgetall(keys.policy)
        pipe.lrange(keys.policy_log, 0, log_limit - 1)
        raw, log = await pipe.execute()
    fields = {_text(k): _text(v) for k, v in raw.items()}
    if "version" not in fields:
        return None
    entries = [codec.loads(e) for e in log]
    return StoredPolicy(int(fields.pop("version")), from_texts(fields), entries)


async def read_values(client: RedisClient, crawl: str) -> StoredPolicy | None:
    """The crawl's policy version and values, without its log (one HGETALL, what a
    running consumer re-reads), or None when it has none."""
    raw = await client.hgetall(CrawlKeys.build(crawl).policy)
    fields = {_text(k): _text(v) for k, v in raw.items()}
    if "version" not in fields:
        return None
    return StoredPolicy(int(fields.pop("version")), from_texts(fields))


async def announce(client: RedisClient, crawl: str) -> None:
    """Tell the crawl's running consumers its policy changed (a hint: never raises)."""
    await WakeChannel(client, CrawlKeys.build(crawl).wake).notify_policy()


async def partitions_of(client: RedisClient, crawl: str) -> list[PartitionKeys]:
    """The crawl's partitions, or none when the crawl has no settings yet."""
    raw = await client.hget(CrawlKeys.build(crawl).meta, "settings")
    if raw is None:
        return []
    settings = CrawlSettings.from_json(raw, crawl)
    return partition_keys(crawl, settings)


async def dedup_of(client: RedisClient, crawl: str) -> DedupMode | None:
    """The crawl's dedup mode, or None when the crawl has no settings yet."""
    raw = await client.hget(CrawlKeys.build(crawl).meta, "settings")
    return None if raw is None else CrawlSettings.from_json(raw, crawl).dedup


async def _recrawl_needs_exact(client: RedisClient, crawl: str, texts: Mapping[str, str]
                               ) -> None:
    """PolicyError when `texts` set a recrawl window or turn revisits on for a crawl that
    uses bloom dedup."""
    for name, off in (("recrawl_after", 0), ("revisit", "off")):
        text = texts.get(name)
        if text is None or parse_value(name, text) == off:
            continue
        if await dedup_of(client, crawl) is DedupMode.BLOOM:
            raise PolicyError(f"{name}: crawl {crawl} uses bloom dedup, which keeps no "
                              f"timestamps, so it can't enqueue a URL again (got {text}): a "
                              f"recrawl window or revisits need an exact-dedup crawl; valid "
                              f"keys: {VALID_KEYS}")


async def _fits_crawl(client: RedisClient, crawl: str, texts: Mapping[str, str]) -> None:
    """PolicyError when `texts` ask for what the crawl can't do: a recrawl window or
    revisits on bloom dedup, politeness groups on more than one partition."""
    await _recrawl_needs_exact(client, crawl, texts)
    text = texts.get("politeness_key")
    if text is None or parse_value("politeness_key", text) == "host":
        return
    partitions = len(await partitions_of(client, crawl))
    if partitions > 1:
        raise PolicyError(f"politeness_key: crawl {crawl} has {partitions} partitions, which "
                          f"hold hosts by their name, so one group's hosts may live in "
                          f"several and no lease call sees all of them (got {text}): "
                          f"politeness groups need a one-partition crawl; valid keys: "
                          f"{VALID_KEYS}")


async def legacy_conf(client: RedisClient, crawl: str) -> CrawlPolicy | None:
    """The politeness an earlier crawlq wrote into partition 0's ``conf`` (its consumers'
    flags), for a crawl without a policy; None when it holds none."""
    partitions = await partitions_of(client, crawl)
    if not partitions:
        return None
    delay, conc = await client.hmget(partitions[0].conf, "delay", "concurrency")
    if delay is None and conc is None:
        return None
    base = CrawlPolicy()
    return CrawlPolicy(
        per_host_delay=base.per_host_delay if delay is None else int(delay) / 1000,
        per_host_concurrency=base.per_host_concurrency if conc is None else int(conc))


async def _write(client: RedisClient, crawl: str, mode: str, texts: Mapping[str, str],
                 by: str, *, expected: int | None = None) -> tuple[int, int]:
    keys = CrawlKeys.build(crawl)
    script = register(client, "policy_set")
    pairs = [x for name, text in texts.items() for x in (name, text)]
    code, version = await script(keys=[keys.policy, keys.policy_log],
                                 args=[mode, by, LOG_LEN, "" if expected is None else expected,
                                       *pairs])
    return int(code), int(version)


async def assign_groups(client: RedisClient, pk: PartitionKeys, key: str) -> int:
    """Name the group of every host a partition knows in ``g:of`` for politeness_key
    `key` (the hosts enqueued before it was set; enqueue names the others), a slice of
    hosts a command; returns how many were named. Under ip each name is looked up again
    (the way to follow a changed address: switch the key to host and back), and a host
    whose name fails to resolve loses the group it had."""
    book = AddressBook() if key == "ip" else None
    named = 0
    async for hosts in _host_slices(client, pk):
        if book is None:
            groups = [host_group(h) for h in hosts]
        else:
            found = await asyncio.gather(*(book.address(h) for h in hosts))
            groups = [address or NO_GROUP for address, _ in found]
        pairs = [x for h, g in zip(hosts, groups, strict=True) if g != NO_GROUP
                 for x in (h, g)]
        if pairs:
            named += await client.hset(pk.group_of, items=pairs)
        ungrouped = [h for h, g in zip(hosts, groups, strict=True) if g == NO_GROUP]
        if book is not None and ungrouped:
            await client.hdel(pk.group_of, *ungrouped)
    return named


async def _host_slices(client: RedisClient, pk: PartitionKeys) -> AsyncIterator[list[str]]:
    """The hosts of a partition's ``hosts``, `APPLY_SLICE` at a time."""
    hosts: list[str] = []
    async for raw, _ in client.hscan_iter(pk.hosts, count=APPLY_SLICE):
        hosts.append(_text(raw))
        if len(hosts) >= APPLY_SLICE:
            yield hosts
            hosts = []
    if hosts:
        yield hosts


async def apply_policy(client: RedisClient, crawl: str, version: int, policy: CrawlPolicy,
                       partitions: Sequence[PartitionKeys] | None = None) -> None:
    """Give every partition (its ``conf``) the policy's politeness of `version`, and move
    each scheduled host's turn to match (``policy_apply.lua``, a slice of hosts a call)."""
    if partitions is None:
        partitions = await partitions_of(client, crawl)
    script = register(client, "policy_apply")
    for pk in partitions:
        if policy.politeness_key != "host":
            await assign_groups(client, pk, policy.politeness_key)
        cursor: Any = "0"
        while True:
            applied, cursor = await script(
                keys=[*pk.host_state, *pk.group_state],
                args=[version, policy.delay_ms, policy.per_host_concurrency, _text(cursor),
                      APPLY_SLICE, round(policy.adaptive_delay * 1000),
                      round(policy.max_delay * 1000), *policy.revisit_conf(),
                      *policy.group_conf(), int(policy.conditional)])
            if not int(applied) or _text(cursor) == "0":
                break


async def sync_partitions(client: RedisClient, crawl: str, stored: StoredPolicy) -> int:
    """Apply the policy to the partitions whose ``conf`` holds an older version (a crawl
    created after its policy, a writer stopped half-way); returns how many."""
    partitions = await partitions_of(client, crawl)
    if not partitions:
        return 0
    async with client.pipeline(transaction=False) as pipe:
        for pk in partitions:
            pipe.hget(pk.conf, "policy_version")
        held = await pipe.execute()
    behind = [pk for pk, v in zip(partitions, held, strict=True)
              if v is None or int(v) < stored.version]
    await apply_policy(client, crawl, stored.version, stored.policy, behind)
    return len(behind)


async def _adopt(client: RedisClient, crawl: str) -> bool:
    """Make a policy of what an earlier crawlq left in partition 0's ``conf``; whether
    there was anything to adopt."""
    found = await legacy_conf(client, crawl)
    if found is None:
        return False
    await _write(client, crawl, "create", found.texts(), BY_MIGRATION)
    return True


async def create_policy(client: RedisClient, crawl: str, values: Mapping[str, Any], *,
                        by: str) -> StoredPolicy:
    """Create the crawl's policy: the defaults with `values` over them. A crawl an
    earlier crawlq made adopts its partitions' values first (logged as a migration), then
    `values` are set. PolicyExistsError when the crawl has a policy already."""
    policy = CrawlPolicy().replace(values)  # validated before anything is written
    await _fits_crawl(client, crawl, policy.texts())
    existing = await read_policy(client, crawl, log_limit=0)
    if existing is not None:
        raise PolicyExistsError(
            f"crawl {crawl} already has a policy (version {existing.version}): change it "
            f"with `crawlq crawl set --crawl {crawl} KEY=VALUE`")
    if await _adopt(client, crawl):
        return await set_policy(client, crawl, values, by=by)
    code, _ = await _write(client, crawl, "create", policy.texts(), by)
    if code == 1:
        raise PolicyExistsError(f"crawl {crawl} got a policy while this one was created: "
                                f"see `crawlq crawl show --crawl {crawl}`")
    return await _finish(client, crawl)


async def set_policy(client: RedisClient, crawl: str, values: Mapping[str, Any], *,
                     by: str, create: bool = False,
                     expected_version: int | None = None) -> StoredPolicy:
    """Change some of the policy's values (all checked first: a bad one writes nothing);
    with `create`, a crawl without a policy gets one (the defaults under `values`).
    NoPolicyError when there is none (and not `create`). With `expected_version`, the
    change is made only if the policy is still at that version, in the same atomic call
    that writes it (PolicyMovedError, nothing written, otherwise)."""
    current = await read_policy(client, crawl, log_limit=0)
    # Every value checked before anything is written, retry_cap against what it lands on.
    (CrawlPolicy() if current is None else current.policy).replace(values)
    texts = {n: OPTIONS[n].show(v) for n, v in values.items()}
    await _fits_crawl(client, crawl, texts)
    if current is None:
        if await _adopt(client, crawl):
            pass
        elif create:
            texts = CrawlPolicy().replace(values).texts()
        else:
            raise NoPolicyError(f"crawl {crawl} has no policy: create it with `crawlq "
                                f"crawl create --crawl {crawl}`")
    if texts:
        code, version = await _write(client, crawl, "upsert" if create else "set", texts, by,
                                     expected=expected_version)
        if code == 2:
            raise NoPolicyError(f"crawl {crawl}'s policy was deleted while it was set")
        if code == 4:
            raise PolicyMovedError(f"crawl {crawl}'s policy is at version {version}, not "
                                   f"{expected_version}: it changed since; nothing was "
                                   "written", version)
    stored = await _finish(client, crawl)
    if texts:
        await announce(client, crawl)
    return stored


async def ensure_policy(client: RedisClient, crawl: str, wanted: CrawlPolicy, *,
                        by: str, seeds: Collection[str] | None = None
                        ) -> tuple[StoredPolicy, bool]:
    """The crawl's policy, created from `wanted` if it has none (adopted from an earlier
    crawlq's partitions if those hold values); never changes a value that exists, only
    adds the options an earlier crawlq's policy lacks, those of them named in `seeds`
    (the options the caller has flags for; None: all). Then every partition that holds an
    older version gets this one. Returns it, and whether this call created it from
    `wanted`. PolicyError when `wanted` would give a bloom crawl a recrawl window."""
    stored = await read_policy(client, crawl, log_limit=0)
    created = False
    if stored is None and not await _adopt(client, crawl):
        await _fits_crawl(client, crawl, wanted.texts())
        code, _ = await _write(client, crawl, "create", wanted.texts(), by)
        created = code == 0
    elif stored is not None:
        await _add_missing(client, crawl, wanted, by, seeds)
    return await _finish(client, crawl), created


async def _add_missing(client: RedisClient, crawl: str, wanted: CrawlPolicy, by: str,
                       seeds: Collection[str] | None) -> None:
    """Give the options a policy lacks (an earlier crawlq made it) `wanted`'s values,
    those in `seeds` (None: all)."""
    stored = {_text(k) for k in await client.hkeys(CrawlKeys.build(crawl).policy)}
    texts = wanted.texts()
    missing = {name: text for name, text in texts.items()
               if name not in stored and (seeds is None or name in seeds)}
    if missing and "version" in stored:
        await _fits_crawl(client, crawl, missing)
        code, _ = await _write(client, crawl, "set", missing, by)
        if code == 0:
            await announce(client, crawl)


async def _finish(client: RedisClient, crawl: str) -> StoredPolicy:
    stored = await read_policy(client, crawl)
    if stored is None:
        raise NoPolicyError(f"crawl {crawl}'s policy was deleted while it was written")
    await sync_partitions(client, crawl, stored)
    return stored
