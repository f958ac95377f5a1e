"""`CrawlPolicy`, a crawl's policy values, checked against the option table; parsing
``KEY=VALUE`` and TOML into it, writing it as TOML, and how a command's flags differ from
the crawl's stored values.
"""

from __future__ import annotations

import argparse
import json
import re
import tomllib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from common.errors import ConfigError
from common.policy.options import (
    CAPPED,
    OPTIONS,
    POLICY_OPTIONS,
    VALID_KEYS,
    seeded_by,
)
from common.policy.values import (
    REVISIT_MODES,
    PolicyError,
    show_bool,
)
from common.proxies.bans import Blocked
from common.proxies.rules import ProxyRules
from common.proxies.sessions import SessionRules
from common.queue import RetryPolicy
from common.traps.rules import TrapRules


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
        """What a blocked answer looks like, by the crawl (common.proxies.bans)."""
        return Blocked(self.ban_status, (self.ban_selector,) if self.ban_selector else (),
                       (self.ban_text,) if self.ban_text else ())

    def session_rules(self) -> SessionRules:
        """The sessions' pool and usage count (common.proxies.sessions)."""
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
        text = show_bool(text)  # TOML's true/false
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
