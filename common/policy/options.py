"""The policy's option table, `POLICY_OPTIONS`: each option declared once, with its flag,
parser, default, help, rule and the command that seeds it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from common.policy.values import (
    CONSUMER,
    NO_LIMIT,
    NO_OUTCOMES,
    NOBODY,
    OFF_TEXT,
    PARENT_HOST,
    PRODUCER,
    PUSHBACK_OUTCOMES,
    at_least_one,
    ban_selector,
    ban_selector_ok,
    ban_statuses,
    ban_statuses_ok,
    ban_text,
    ban_text_ok,
    below_one,
    depth,
    depth_ok,
    distance_ok,
    domains,
    domains_ok,
    factor,
    is_bool,
    media_types,
    media_types_ok,
    ms_seconds,
    near_duplicate_distance,
    non_negative,
    politeness_key,
    politeness_key_ok,
    positive,
    pushback_outcomes,
    pushback_outcomes_ok,
    render_mode,
    render_mode_ok,
    revisit_mode,
    revisit_mode_ok,
    show_ban_statuses,
    show_bool,
    show_depth,
    show_distance,
    show_domains,
    show_factor,
    show_media_types,
    show_off_text,
    show_outcomes,
    show_seconds,
    tiers_ok,
    true_false,
    user_agent_ok,
    whole,
    whole_ms_seconds,
    whole_ok,
    whole_seconds,
)
from common.proxies.rules import ProxyRules
from common.proxies.sessions import SessionRules
from common.proxies.spec import tier_names
from common.tasks.headers import DEFAULT_USER_AGENT
from common.tasks.task import DEFAULT_MAX_ATTEMPTS


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
    check: Callable[[Any], None] = non_negative
    show: Callable[[Any], str] = str
    toml_string: bool = False  # written as a TOML string ("1s"), else a number
    seeded_by: str = CONSUMER


POLICY_OPTIONS: tuple[PolicyOption, ...] = (
    PolicyOption("per_host_delay", "--per-host-delay", ms_seconds, 1.0,
                 "least time between requests to one host across the whole fleet, unless "
                 "the host has its own (crawlq hosts set) or a longer robots.txt "
                 "Crawl-delay (e.g. 1s, 500ms)", show=show_seconds, toml_string=True),
    PolicyOption("per_host_concurrency", "--per-host-concurrency", whole, 2,
                 "most requests in flight to one host across the whole fleet, unless the "
                 "host has its own (0 = no limit)"),
    PolicyOption("accept_content_type", "--accept-content-type", media_types, (),
                 "media types whose bodies are read, comma-separated, type/* allowed "
                 "(*/* = all); any other response ends done, outcome filtered, its body "
                 "never read; no Content-Type is accepted",
                 check=media_types_ok, show=show_media_types, toml_string=True),
    PolicyOption("user_agent", "--user-agent", str.strip, DEFAULT_USER_AGENT,
                 "the User-Agent of every request, robots.txt's included; robots.txt "
                 "groups are matched on its product token (its first word up to /)",
                 check=user_agent_ok, toml_string=True),
    PolicyOption("ignore_robots", "--ignore-robots", true_false, False,
                 "true: neither fetch nor obey robots.txt (only for sites you own)",
                 check=is_bool, show=show_bool),
    PolicyOption("robots_ttl", "--robots-ttl", ms_seconds, 86400.0,
                 "how long a fetched robots.txt is trusted before it is fetched again "
                 "(e.g. 1d, 6h; > 0)", check=positive, show=show_seconds, toml_string=True),
    PolicyOption("max_depth", "--max-depth", depth, -1,
                 "deepest link depth a handler's links are enqueued at (seeds are 0; "
                 f"{NO_LIMIT} = no limit: traps are bounded by the trap rules; 0 = the "
                 "seeds only); a link past it is dropped and counted (too_deep)",
                 check=depth_ok, show=show_depth),
    PolicyOption("allow_domains", "--allow-domains", domains, (),
                 "domains a handler's links may go to (and their subdomains), "
                 f"comma-separated; {PARENT_HOST} = the linking page's host",
                 check=domains_ok, show=show_domains, toml_string=True),
    PolicyOption("retry_base", "--retry-base", whole_ms_seconds, 2.0,
                 "backoff before a failed task's first retry; doubles per attempt up to "
                 "retry_cap, with full jitter (e.g. 2s, 500ms; > 0)",
                 check=positive, show=show_seconds, toml_string=True),
    PolicyOption("retry_cap", "--retry-cap", whole_ms_seconds, 600.0,
                 "longest backoff between attempts (>= retry_base)",
                 show=show_seconds, toml_string=True),
    PolicyOption("max_retry_after", "--max-retry-after", whole_ms_seconds, 3600.0,
                 "longest Retry-After honoured, by a task's retry and by its host's block",
                 show=show_seconds, toml_string=True),
    PolicyOption("max_stalls", "--max-stalls", whole, 2,
                 "lease expiries a task survives; one more and it is dead, reason stalled",
                 check=whole_ok),
    PolicyOption("max_attempts", "--max-attempts", whole, DEFAULT_MAX_ATTEMPTS,
                 "fetch attempts a task gets before it is dead (>= 1), stamped on each "
                 "task when it is enqueued", check=at_least_one, seeded_by=PRODUCER),
    PolicyOption("recrawl_after", "--recrawl-after", whole_seconds, 0,
                 "enqueue again a URL that is done and was last enqueued longer ago than "
                 "this, in whole seconds (e.g. 7d; 0s = never); exact dedup only",
                 check=whole_ok, show=show_seconds, toml_string=True, seeded_by=PRODUCER),
    PolicyOption("backoff_on", "", pushback_outcomes, ("429", "503"),
                 "the outcomes that count as a host pushing back, comma-separated, of "
                 f"{','.join(PUSHBACK_OUTCOMES)} ({NO_OUTCOMES} = never): each raises the "
                 "host's backoff level, blocks it and slows it for the whole fleet",
                 check=pushback_outcomes_ok, show=show_outcomes, toml_string=True,
                 seeded_by=NOBODY),
    PolicyOption("backoff_base", "", whole_ms_seconds, 1.0,
                 "how long a host's first push-back blocks it (its Retry-After if longer); "
                 "doubles per push-back in a row, with 10% jitter (> 0)",
                 check=positive, show=show_seconds, toml_string=True, seeded_by=NOBODY),
    PolicyOption("backoff_cap", "", whole_ms_seconds, 3600.0,
                 "longest block a host's backoff level gives (>= backoff_base)",
                 show=show_seconds, toml_string=True, seeded_by=NOBODY),
    PolicyOption("backoff_forgive", "", whole_ms_seconds, 300.0,
                 "how fast push-back is forgiven: the delay a host's push-back taught halves "
                 "this long after its block, and each such quiet spell takes a level off "
                 "(a response served resets it) (> 0)",
                 check=positive, show=show_seconds, toml_string=True, seeded_by=NOBODY),
    PolicyOption("adaptive_delay", "", factor, 0.0,
                 "a host's delay follows its response times: their moving average x this "
                 "(e.g. 5), between the host's own delay and max_delay, the same for the "
                 "whole fleet (0 = off)", show=show_factor, seeded_by=NOBODY),
    PolicyOption("max_delay", "", ms_seconds, 30.0,
                 "longest delay adaptive_delay gives a host",
                 show=show_seconds, toml_string=True, seeded_by=NOBODY),
    PolicyOption("max_crawl_delay", "", ms_seconds, 300.0,
                 "longest robots.txt Crawl-delay (or Request-rate interval) obeyed: a longer "
                 "one is cut to this, logged and counted (0s = obey any)",
                 show=show_seconds, toml_string=True, seeded_by=NOBODY),
    PolicyOption("revisit", "", revisit_mode, "off",
                 "bring every done URL back by itself, on a schedule kept in the frontier: "
                 "off, fixed (every recrawl_after), adaptive (an interval per URL, longer "
                 "while it does not change, shorter when it does) or learned (an interval "
                 "per URL from its estimated change rate, spending what fixed would); "
                 "exact dedup only",
                 check=revisit_mode_ok, toml_string=True, seeded_by=NOBODY),
    PolicyOption("min_interval", "", whole_seconds, 60,
                 "adaptive and learned: shortest interval between two visits of a URL "
                 "they learn (fixed revisits every recrawl_after, whatever this says)",
                 check=whole_ok, show=show_seconds, toml_string=True, seeded_by=NOBODY),
    PolicyOption("max_interval", "", whole_seconds, 90 * 86400,
                 "adaptive and learned: longest interval between two visits of a URL "
                 "they learn (>= min_interval)",
                 check=whole_ok, show=show_seconds, toml_string=True, seeded_by=NOBODY),
    PolicyOption("interval_grow", "", factor, 0.4,
                 "adaptive: a URL's interval x (1 + this) after a visit that found it "
                 "unchanged (a 304 or the same digest)", show=show_factor, seeded_by=NOBODY),
    PolicyOption("interval_shrink", "", factor, 0.2,
                 "adaptive: a URL's interval x (1 - this) after a visit that found it "
                 "changed (>= 0, < 1)", check=below_one, show=show_factor,
                 seeded_by=NOBODY),
    PolicyOption("conditional", "", true_false, True,
                 "recrawls ask for a page only if it changed: with recrawl_after > 0 or "
                 "revisit on, each done URL keeps its ETag, Last-Modified and body digest, "
                 "with its host and entry for the producer to bring it back past the "
                 "window (~130 B in Redis), and its recrawl sends them (If-None-Match / "
                 "If-Modified-Since); a 304 or the same body ends done, not_modified or "
                 "unchanged, with no handler, so its links are not followed again. false: "
                 "no validators are sent, and a recrawl_after recrawl keeps none and "
                 "fetches and handles every page whole",
                 check=is_bool, show=show_bool, seeded_by=NOBODY),
    PolicyOption("trap_max_url_length", "", whole, 1024,
                 "a link longer than this is a trap, refused (trap_length; 0 = no limit)",
                 check=whole_ok, seeded_by=NOBODY),
    PolicyOption("trap_max_segments", "", whole, 20,
                 "a link with more path segments than this is a trap, refused "
                 "(trap_segments; 0 = no limit)", check=whole_ok, seeded_by=NOBODY),
    PolicyOption("trap_repeated_segments", "", whole, 2,
                 "a link whose path holds one segment more times than this is a trap, "
                 "refused (trap_repeats; 2: /a/b/a/b/a/ is one; 0 = no limit)",
                 check=whole_ok, seeded_by=NOBODY),
    PolicyOption("trap_max_params", "", whole, 12,
                 "a link with more query parameters than this is a trap, refused "
                 "(trap_params; 0 = no limit)", check=whole_ok, seeded_by=NOBODY),
    PolicyOption("trap_path_variants", "", whole, 1000,
                 "distinct query strings the links to one path of a host may have, "
                 "fleet-wide; a new one past this is a trap, refused (trap_variants; 0 = "
                 "no limit)", check=whole_ok, seeded_by=NOBODY),
    PolicyOption("trap_page_facets", "", whole, 2,
                 "a page whose links to its own path vary more than this many query "
                 "parameters (words or numbers; not page, start, offset and the like) is a "
                 "faceted search: those links are traps, refused (trap_facets); links that "
                 "change only its pagination are followed (0 = no limit)", check=whole_ok,
                 seeded_by=NOBODY),
    PolicyOption("trap_session_ids", "", true_false, True,
                 "drop session ids (sid, jsessionid, phpsessid, ... with a token value) "
                 "from links, so a page under another session is the same URL",
                 check=is_bool, show=show_bool, seeded_by=NOBODY),
    PolicyOption("near_duplicate_distance", "", near_duplicate_distance, 0,
                 "a page whose URL is a variant (a query, or a date, counter or token in its "
                 "path) is a near duplicate of one of its host's of the same URL shape "
                 "whose words (numbers, month and day names masked) and links are at most "
                 "this many bits apart: 0 (the default) asks them to be the same; done, "
                 "outcome near_duplicate, its links to its counter's neighbours not "
                 "followed when it links both (the next empty month), to its shape not once "
                 "reached from a near duplicate (0-64; off = never)",
                 check=distance_ok, show=show_distance, seeded_by=NOBODY),
    PolicyOption("soft_404", "", true_false, True,
                 "find each host's soft 404s by probing: once a link leads into a host (and "
                 "into a directory whose pages share a title), a request for a path that "
                 "cannot exist gives what the host answers a missing page with; a page that "
                 "matches it is done, outcome soft_404, its links not followed",
                 check=is_bool, show=show_bool, seeded_by=NOBODY),
    PolicyOption("drop_judged_items", "", true_false, False,
                 "true: a page judged a near duplicate or a soft 404 has its items dropped "
                 "too; false: its items are written (a heuristic never drops an item unless "
                 "asked to), only its links are not followed",
                 check=is_bool, show=show_bool, seeded_by=NOBODY),
    PolicyOption("rendering", "", render_mode, "off",
                 "which requests are rendered in a browser, by the consumers started with "
                 "--browser: off (those a request or its spider's route asks for), all "
                 "(every request enqueued from then on) or auto (every request, but a "
                 "host's route whose pages give the same items and links over HTTP gets "
                 "them over HTTP, after three probes)",
                 check=render_mode_ok, toml_string=True, seeded_by=NOBODY),
    PolicyOption("politeness_key", "", politeness_key, "host",
                 "what else a politeness limit is kept for: host (each host alone), "
                 "domain (also each registrable domain, its group: a.example.com and "
                 "b.example.com wait for each other too, by group_delay and "
                 "group_concurrency) or ip (also each server: the hosts whose names "
                 "resolve to one address, looked up at enqueue); one-partition crawls "
                 "only",
                 check=politeness_key_ok, toml_string=True, seeded_by=NOBODY),
    PolicyOption("group_delay", "", ms_seconds, 1.0,
                 "politeness_key domain or ip: least time between requests to the hosts of "
                 "one group across the whole fleet, unless the group has its own (crawlq "
                 "hosts group-set)", show=show_seconds, toml_string=True, seeded_by=NOBODY),
    PolicyOption("group_concurrency", "", whole, 2,
                 "politeness_key domain or ip: most requests in flight to the hosts of one "
                 "group across the whole fleet, unless the group has its own (0 = no "
                 "limit)",
                 check=whole_ok, seeded_by=NOBODY),
    # The proxy pool (common.proxies, docs/proxies.md).
    PolicyOption("proxy_tiers", "", tier_names, ProxyRules().tiers,
                 "the proxy pool's tiers, cheapest first, comma-separated: a host starts on "
                 "the first and moves up one when it bans proxy_tier_bans proxies of its "
                 "tier (direct = no proxy: the consumers' own address; a tier no "
                 "consumer's --proxy has is skipped, one not named here comes last)",
                 check=tiers_ok, show=",".join, toml_string=True, seeded_by=NOBODY),
    PolicyOption("proxy_ban_for", "", whole_ms_seconds, ProxyRules().ban_ms / 1000,
                 "how long a proxy a host banned (a blocked answer through it) is not "
                 "used for that host; its other hosts keep it",
                 show=show_seconds, toml_string=True, seeded_by=NOBODY),
    PolicyOption("proxy_tier_bans", "", whole, ProxyRules().tier_bans,
                 "bans by one host at its tier that move it one tier up (>= 1; at once "
                 "when no proxy of its tier is left for it)",
                 check=at_least_one, seeded_by=NOBODY),
    PolicyOption("proxy_tier_quiet", "", whole_ms_seconds, ProxyRules().quiet_ms / 1000,
                 "a host moves one tier down after this long without a ban at its tier "
                 "(0s = never)", show=show_seconds, toml_string=True, seeded_by=NOBODY),
    PolicyOption("proxy_max_failures", "", whole, ProxyRules().max_failures,
                 "failures in a row (no connection through it, the proxy refusing or "
                 "dropping it) that quarantine a proxy for the whole fleet (>= 1)",
                 check=at_least_one, seeded_by=NOBODY),
    PolicyOption("proxy_quarantine", "", whole_ms_seconds, ProxyRules().quarantine_ms / 1000,
                 "a failing proxy's first quarantine; each one in a row lasts twice the "
                 "last, up to 32 times this; it is tried again when it ends (> 0)",
                 check=positive, show=show_seconds, toml_string=True, seeded_by=NOBODY),
    # What a blocked answer looks like (common.proxies.bans, docs/proxies.md).
    PolicyOption("ban_status", "", ban_statuses, (403,),
                 "statuses that are a block, not the page, of a request sent through the "
                 "proxy pool or with a session, comma-separated (none = never): retried on "
                 "another proxy or session, its proxy banned for the host; a request sent "
                 "direct without a session takes them as the page's answer",
                 check=ban_statuses_ok, show=show_ban_statuses, toml_string=True,
                 seeded_by=NOBODY),
    PolicyOption("ban_selector", "", ban_selector, "",
                 "a CSS selector that a blocked 2xx HTML page matches (a captcha's form, "
                 "an access-denied shell), however it was sent: never taken as data "
                 f"({OFF_TEXT} = none)", check=ban_selector_ok, show=show_off_text,
                 toml_string=True, seeded_by=NOBODY),
    PolicyOption("ban_text", "", ban_text, "",
                 "a text (case-insensitive) that a blocked 2xx page holds, however it was "
                 f"sent: never taken as data ({OFF_TEXT} = none)", check=ban_text_ok,
                 show=show_off_text, toml_string=True, seeded_by=NOBODY),
    # Sessions (common.proxies.sessions, docs/proxies.md).
    PolicyOption("session_pool", "", whole, SessionRules().pool,
                 "sessions a host's pool holds: a request naming no session takes one of "
                 "its host's (its cookies, its proxy), retired on a block and after "
                 "session_max_uses requests (0 = no pool: such requests send no cookie)",
                 check=whole_ok, seeded_by=NOBODY),
    PolicyOption("session_max_uses", "", whole, SessionRules().max_uses,
                 "requests a pool session serves before it is retired (0 = no limit)",
                 check=whole_ok, seeded_by=NOBODY),
)
OPTIONS: dict[str, PolicyOption] = {o.name: o for o in POLICY_OPTIONS}
#: The (base, cap) pairs whose cap may not be below its base.
CAPPED = (("retry_base", "retry_cap"), ("backoff_base", "backoff_cap"),
          ("min_interval", "max_interval"))
VALID_KEYS = ", ".join(OPTIONS)


def seeded_by(command: str) -> tuple[PolicyOption, ...]:
    """The options whose flag is `command`'s (`CONSUMER` or `PRODUCER`)."""
    return tuple(o for o in POLICY_OPTIONS if o.seeded_by == command)
