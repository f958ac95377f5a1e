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
are crawler traps, refused (``common.traps.rules``): longer than ``trap_max_url_length``, with
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
common.hostmodel.hostip); what a blocked answer looks like (``common.proxies.bans``): its
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
``policy`` message on the crawl's wake channel (``common.fleet.wake``) tells running
consumers to read it again (they also do at every heartbeat, in case the message was lost).

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

One module per job: ``values`` (how an option's text parses, its rule and how it shows;
the policy's errors), ``options`` (the option table), ``model`` (`CrawlPolicy`, parsing
``KEY=VALUE`` and TOML), ``store`` (the policy in Redis and its partitions' copies),
``command_flags`` (the options as the commands' flags).
"""

from __future__ import annotations

from common.policy.model import (
    CrawlPolicy,
    flag_differences,
    parse_assignments,
    parse_toml,
    parse_value,
    to_toml,
)
from common.policy.options import (
    OPTIONS,
    POLICY_OPTIONS,
    VALID_KEYS,
    PolicyOption,
    seeded_by,
)
from common.policy.store import (
    LOG_LEN,
    StoredPolicy,
    apply_policy,
    create_policy,
    ensure_policy,
    legacy_conf,
    read_policy,
    read_values,
    set_policy,
    sync_partitions,
)
from common.policy.values import (
    CONSUMER,
    NOBODY,
    PRODUCER,
    PUSHBACK_OUTCOMES,
    NoPolicyError,
    PolicyError,
    PolicyExistsError,
    PolicyMovedError,
    follows_from,
    is_pushback,
    product_token,
    pushback_outcomes,
)

__all__ = ["CONSUMER", "LOG_LEN", "NOBODY", "OPTIONS", "POLICY_OPTIONS", "PRODUCER",
           "PUSHBACK_OUTCOMES", "VALID_KEYS", "CrawlPolicy", "NoPolicyError", "PolicyError",
           "PolicyExistsError", "PolicyMovedError", "PolicyOption", "StoredPolicy",
           "apply_policy", "create_policy", "ensure_policy", "flag_differences",
           "follows_from", "is_pushback", "legacy_conf", "parse_assignments", "parse_toml",
           "parse_value", "product_token", "pushback_outcomes", "read_policy", "read_values",
           "seeded_by", "set_policy", "sync_partitions", "to_toml"]
