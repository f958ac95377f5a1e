"""A policy option's value: how its text parses (the flags' syntax: ``1s``, ``500ms``,
``2``, ``true``, ``a.example,b.example``), the rule it keeps and how it shows; the
policy's errors; the commands that seed options.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Collection
from math import ceil

from common.config import boolean, duration
from common.errors import ConfigError
from common.proxies.bans import check_selector, statuses
from common.proxies.spec import tier_names
from common.urls.canonical import canonical_domain

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


def non_negative(value: float) -> None:
    if value < 0:
        raise ConfigError(f"must be >= 0, got {value:g}")


def positive(value: float) -> None:
    if not value > 0:
        raise ConfigError(f"must be > 0, got {value:g}")


def whole(text: str) -> int:
    try:
        return int(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None


def ms_seconds(text: str) -> float:
    """A duration in the flags' syntax, to the millisecond (what the frontier keeps)."""
    return round(duration(text) * 1000) / 1000


def whole_ms_seconds(text: str) -> float:
    """A duration in the flags' syntax, cut to whole milliseconds as the retry flags
    always were (``1.5ms`` is 1 ms; ``round(..., 6)`` only drops float noise first)."""
    return int(round(duration(text) * 1000, 6)) / 1000


def whole_seconds(text: str) -> int:
    """A duration in the flags' syntax in whole seconds, a fraction rounded up (``1.2s``
    is 2 s; ``round(..., 6)`` only drops float noise first)."""
    return ceil(round(duration(text), 6))


def factor(text: str) -> float:
    """A factor >= 0, to the thousandth (what the frontier keeps)."""
    try:
        value = float(str(text).strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return round(value, 3)


def show_factor(value: float) -> str:
    return f"{value:.3f}".rstrip("0").rstrip(".")


def show_seconds(value: float) -> str:
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
    media_types_ok(items)
    return items


def media_types_ok(value: tuple[str, ...]) -> None:
    if not isinstance(value, tuple):
        raise ConfigError(f"must be a tuple of media types, got {value!r}")
    for item in value:
        if not isinstance(item, str) or not _MEDIA_TYPE.match(item):
            raise ConfigError(f"{item!r} is not a media type: type/subtype or type/* "
                              "(e.g. text/html,application/xhtml+xml; */* = everything)")


def show_media_types(value: tuple[str, ...]) -> str:
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


def user_agent_ok(value: str) -> None:
    if (not isinstance(value, str) or len(value) > MAX_USER_AGENT
            or not _PRINTABLE.fullmatch(value) or value != value.strip()):
        raise ConfigError(f"must be 1-{MAX_USER_AGENT} printable ASCII characters without "
                          f"leading or trailing spaces (a User-Agent header), got {value!r}")
    product_token(value)


def true_false(text: str) -> bool:
    """``true`` or ``false`` (or the environment's 1/0, yes/no, on/off); not empty."""
    if not str(text).strip():
        raise argparse.ArgumentTypeError("empty: use true or false")
    return boolean(text)


def is_bool(value: bool) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"must be true or false, got {value!r}")


def show_bool(value: bool) -> str:
    return "true" if value else "false"


def whole_ok(value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"must be a whole number >= 0, got {value!r}")


def at_least_one(value: int) -> None:
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


def pushback_outcomes_ok(value: tuple[str, ...]) -> None:
    if not isinstance(value, tuple) or not set(value) <= set(PUSHBACK_OUTCOMES):
        raise ConfigError(f"must be a tuple of {', '.join(PUSHBACK_OUTCOMES)}, got {value!r}")


def show_outcomes(value: tuple[str, ...]) -> str:
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


def domains_ok(value: tuple[str, ...]) -> None:
    if not isinstance(value, tuple):
        raise ConfigError(f"must be a tuple of domains, got {value!r}")
    for item in value:
        if not isinstance(item, str) or canonical_domain(item) != item:
            raise ConfigError(f"{item!r} is not a domain in canonical form (e.g. "
                              "xn--bcher-kva.example for Bücher.example)")


def show_domains(value: tuple[str, ...]) -> str:
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


politeness_key, politeness_key_ok = _one_of(POLITENESS_KEYS)


#: How a crawl revisits the URLs it has done (`revisit`): never (off), after the first
#: interval every time (fixed), after an interval each visit stretches or shrinks
#: (adaptive), or after the interval that is best for the change rate its visits
#: estimate, within the budget of a fixed schedule (learned).
REVISIT_MODES = ("off", "fixed", "adaptive", "learned")


revisit_mode, revisit_mode_ok = _one_of(REVISIT_MODES)


#: Which requests a crawl renders in a browser (`rendering`): those a request or its
#: spider's route asks for (off), every request enqueued (all), or every request, where
#: its (host, route) needs it (auto: common.queue.rendermodes).
RENDER_MODES = ("off", "all", "auto")


render_mode, render_mode_ok = _one_of(RENDER_MODES)


def below_one(value: float) -> None:
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
    value = whole(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"not a whole number >= 0 or {NO_LIMIT}: {text!r}")
    return value


def depth_ok(value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise ConfigError(f"must be a whole number >= 0 or {NO_LIMIT}, got {value!r}")


def show_depth(value: int) -> str:
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
    return whole(text)


def distance_ok(value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not -1 <= value <= 64:
        raise ConfigError(f"must be a whole number 0-64 or {OFF}, got {value!r}")


def show_distance(value: int) -> str:
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


def ban_statuses_ok(value: tuple[int, ...]) -> None:
    try:
        ok = isinstance(value, tuple) and ban_statuses(show_ban_statuses(value)) == value
    except (argparse.ArgumentTypeError, TypeError):
        ok = False
    if not ok:
        raise ConfigError(f"must be HTTP statuses 100-599, sorted, got {value!r}")


def show_ban_statuses(value: tuple[int, ...]) -> str:
    return ",".join(map(str, value)) or OFF_TEXT


def ban_selector(text: str) -> str:
    text = str(text).strip()
    return "" if text == OFF_TEXT else check_selector(text) if text else ""


def ban_selector_ok(value: str) -> None:
    try:
        ok = isinstance(value, str) and ban_selector(value or OFF_TEXT) == value
    except argparse.ArgumentTypeError:
        ok = False
    if not ok:
        raise ConfigError(f"must be a CSS selector or {OFF_TEXT}, got {value!r}")


def ban_text(text: str) -> str:
    text = str(text).strip()
    return "" if text == OFF_TEXT else text


def ban_text_ok(value: str) -> None:
    if not isinstance(value, str) or value != value.strip() or len(value) > 512:
        raise ConfigError(f"must be a text of at most 512 characters, got {value!r}")


def show_off_text(value: str) -> str:
    return value or OFF_TEXT


def tiers_ok(value: tuple[str, ...]) -> None:
    try:
        ok = isinstance(value, tuple) and tier_names(",".join(value)) == value
    except (argparse.ArgumentTypeError, TypeError):
        ok = False
    if not ok:
        raise ConfigError(f"must be tier names, cheapest first, got {value!r}")
