"""What a crawl did not deliver, by reason, and what to change: ``crawlq run``'s summary,
``crawlq stats`` and the dashboard read it from the crawl's counters.

Generic over the codes, so an outcome, a link fate or a dead reason added elsewhere shows
up here without a change: a done task's outcome (``outcome:<code>`` counters) other than
the ones that deliver (`DELIVERED`) and crawlq's own probes (`OWN`), a link not followed
(``links:<fate>``, what the consumers add: ``common.observability.metrics.NOT_FOLLOWED``, trap rules
included) and a dead task's reason, each with a sample cause where one is given (a dead
letter's message: ``connect_error`` behind ``robots_unavailable``). A page a heuristic
judged (`JUDGED`) says whether its items were written. The advice of the codes a
newcomer meets is written here; any other code says its meaning (``common.reasons``) or
nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from common.queue import Stats
from common.reasons import REASONS

__all__ = ["DELIVERED", "JUDGED", "OWN", "Loss", "advice", "link_fates", "losses",
           "outcomes"]

#: Outcomes whose pages were handled (a route ran on them, their links followed) or are
#: a revisit's, which has nothing new to deliver.
DELIVERED = frozenset({"ok", "changed", "unchanged", "not_modified"})
#: Outcomes of crawlq's own requests (a host's soft-404 probe), not the spider's: never a
#: page not delivered, nor a page fetched for the spider.
OWN = frozenset({"probe"})
#: Outcomes of pages judged by a heuristic: a route ran, their links not followed are
#: counted as link fates of the same names, and their items are dropped only under the
#: policy's drop_judged_items (then the pages are not delivered either).
JUDGED = frozenset({"near_duplicate", "soft_404"})
_OUTCOME = "outcome:"
_LINKS = "links:"

_ADVICE = {
    # links not followed
    "too_deep": "past the crawl's max_depth: raise it (max_depth=none: no limit)",
    "out_of_scope": "to another host than their page's: allow_domains lets them in",
    "invalid": "not URLs crawlq can fetch (malformed, not http(s))",
    "capped": "past --max-links on one page",
    # done, not handled
    "http_4xx": "the site answered 4xx (a 404: a wrong or broken link); no route runs on it",
    "robots_disallowed": "robots.txt disallows them for the crawl's user_agent "
                         "(ignore_robots=true only for a site you own)",
    "filtered": "a Content-Type the crawl's accept_content_type refuses",
    # links not followed, and pages when their items were dropped too
    "near_duplicate": "of pages judged near duplicates of another of their URL's shape (a "
                      "calendar's next month, an empty listing): links to that shape not "
                      "followed; near_duplicate_distance=off judges none",
    "soft_404": "of pages that answered like their host's missing page (a soft 404): "
                "links not followed; soft_404=false judges none",
    "gone": "answered 404 or 410 at their recrawl: gone from the site",
    # dead
    "ssrf_blocked": "the SSRF guard refuses loopback and private addresses: "
                    "--allow-private for a local site",
    "handler_error": "a route raised (see the route errors): fix the spider, run again",
    "robots_unavailable": "robots.txt could not be had (its cause said): is the site up "
                          "at that address?",
    "connect_error": "the site could not be reached: is it up, is the URL right?",
    "timeout": "the site did not answer in time",
    "unknown_label": "a label the spider has no route for: add the route, then "
                     "crawlq dead requeue --reason unknown_label",
    "stalled": "the consumers holding them died or hung (crawlq dead ls)",
    "blocked": "the site answered with a block (a captcha, a ban status), not the page: "
               "slow down (per_host_delay) or crawl through proxies (docs/proxies.md)",
}


@dataclass(frozen=True, slots=True)
class Loss:
    """Pages or links of one code not delivered: ``kind`` is ``links`` (not followed),
    ``pages`` (done, not handled) or ``dead``; ``cause`` a sample dead letter's message."""

    kind: str
    code: str
    count: int
    cause: str = ""
    items_dropped: bool = False  # a judged page's items dropped (drop_judged_items)

    @property
    def advice(self) -> str:
        said = advice(self.code)
        if self.items_dropped:
            return f"{said}; their items dropped (drop_judged_items=false keeps them)"
        return said

    def text(self) -> str:
        """``links too_deep 15: past the crawl's max_depth: ...``, its cause in brackets."""
        cause = f" [{self.cause}]" if self.cause else ""
        said = self.advice
        return f"{self.kind} {self.code} {self.count:,}{cause}" + (f": {said}" if said else "")


def advice(code: str) -> str:
    """What to change for `code` (a link fate, an outcome or a dead reason); its meaning
    when no advice is written for it, or ""."""
    if code in _ADVICE:
        return _ADVICE[code]
    if code.startswith("trap_"):
        return "refused by a crawler-trap rule (the policy's trap_* values; crawlq traps " \
               "lists the hosts)"
    reason = REASONS.get(code)
    return reason.meaning if reason is not None else ""


def outcomes(counters: Mapping[str, int]) -> dict[str, int]:
    """Done tasks by outcome, from a crawl's counters."""
    return {k[len(_OUTCOME):]: v for k, v in sorted(counters.items())
            if k.startswith(_OUTCOME) and v}


def link_fates(counters: Mapping[str, int]) -> dict[str, int]:
    """Links not followed by fate, from a crawl's counters."""
    return {k[len(_LINKS):]: v for k, v in sorted(counters.items())
            if k.startswith(_LINKS) and v}


def losses(stats: Stats, causes: Mapping[str, str] | None = None, *,
           items_dropped: bool = False) -> list[Loss]:
    """Everything `stats` says was not delivered, most first within each kind: links not
    followed, pages done but not handled (and judged ones when `items_dropped`: the
    crawl's drop_judged_items), dead tasks (with `causes`: reason -> a sample message).
    crawlq's own probes are none of them."""
    causes = causes or {}
    found = [Loss("links", code, n) for code, n in link_fates(stats.counters).items()]
    found += [Loss("pages", code, n, items_dropped=code in JUDGED)
              for code, n in outcomes(stats.counters).items()
              if code not in DELIVERED | OWN and (items_dropped or code not in JUDGED)]
    found += [Loss("dead", code, n, causes.get(code, ""))
              for code, n in stats.dead_reasons.items() if n]
    kinds = {"links": 0, "pages": 1, "dead": 2}
    return sorted(found, key=lambda x: (kinds[x.kind], -x.count, x.code))
