"""The judgement of the pages a consumer fetched, at each flush: near duplicates among the
variants of one URL, soft 404s by their host's probed signature, and the probes to make.

- **Near duplicates** (``near_duplicate_distance``, off by default): a page whose URL is
  a variant (``common.urls.shape``: a query, a date, a counter, a token in its path) gets a
  SimHash of its words and one of its links (but those to its own shape, with their
  tokens masked), compared with its host's newest pages *of its shape* only, both within
  the distance (``common.traps.book``). A near duplicate's links to pages of its shape are
  not followed (a calendar's next month, an empty listing's next page, another sort
  order); its other links are, and its items are written unless ``drop_judged_items``.
  A listing whose items differ links other pages, so its links' fingerprint differs:
  pagination is never a near duplicate of itself.
- **Soft 404s** (``soft_404``, on by default; ``common.traps.soft404``): a host's root is
  probed as soon as a page links into it: a request for a path that
  cannot exist, made a task of its own (``PROBE_META``) that the frontier serves like any
  (robots.txt and politeness obeyed) at a high priority. When two pages of one host
  whose paths differ have the same title (its words but their URLs'), or a page's title
  says it is missing (``MISSING``), their directory is probed too (a catch-all under
  ``/old/``, a listing that answers any path under it), one per ``PAGES_A_PROBE`` pages
  of the host. A page under a directory whose probe is out is held (not acked, its links
  not sent) until it answers, ``HOLD_S`` at most. Each directory once fleet-wide, at
  most ``MAX_PROBES`` a host. A page at or
  under a probed directory that matches its signature is a soft 404: done, outcome
  ``soft_404``, its links not followed, its items written unless ``drop_judged_items``;
  a seed (depth 0) is the operator's word and is never judged.

Each flush makes one call per partition for each (fingerprints, judgement), pipelined:
the probes' signatures and the session tokens the link intake learned go with it, the
hosts' state comes back with it (read again at most every ``STALE_S``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.http.results import FetchResult
from common.observability.metrics import Metrics
from common.policy import follows_from
from common.queue import NewTask
from common.reasons import NEAR_DUPLICATE, SOFT_404, Outcome
from common.tasks.request import Request
from common.tasks.task import Task
from common.traps import simhash, soft404
from common.traps.book import HostState, Learned, Page, TrapBook
from common.traps.soft404 import Signature
from common.urls.canonical import fingerprint
from common.urls.shape import (
    common_directory,
    counter_neighbours,
    directory,
    is_variant,
    masked,
    shape,
    shape_tag,
)
from consumer.completion import Completion, CompletionKind

if TYPE_CHECKING:
    from consumer.live import LivePolicy

log = logging.getLogger("consumer")

#: A title that says its page is missing (the words of "not found", "does not exist",
#: "404", ... in a few languages): its directory is probed at once, not only when a
#: second page shares its title. Only a probe comes of it, never a verdict.
MISSING = re.compile(
    r"\b(?:404|not found|page not found|doesn t exist|does not exist|cannot be found|"
    r"can t be found|no longer (?:available|exists)|nothing (?:found|here)|"
    r"nicht gefunden|introuvable|no encontrad[ao]|non trovat[ao]|niet gevonden|"
    r"nie znaleziono|не найден\w*)\b")
#: What varies between the variants of one page, masked in its text before it is
#: fingerprinted: numbers (a page's, a month's days; not a word's digits: python3), and
#: month and weekday names (a calendar's month, in English).
VARIANT_WORDS = re.compile(
    r"\b(?:\d+|jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|"
    r"aug(?:ust)?|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?|"
    r"mon(?:day)?|tue(?:s(?:day)?)?|wed(?:nesday)?|thu(?:rs(?:day)?)?|fri(?:day)?|"
    r"sat(?:urday)?|sun(?:day)?)\b", re.IGNORECASE)
#: The longest a page waits for its directory's probe before it is judged without it.
HOLD_S = 5.0
#: Pages of one host held at once, where holding them keeps no slot from the probe.
HELD_PER_HOST = 64
#: The meta key of a task linked from a near duplicate (its links are marked with it).
NEAR_META = "crawlq_nd"
#: A probe task's meta key: the directory it probes.
PROBE_META = "crawlq_probe"
#: A probe's priority: before its host's pages (it decides how they are judged).
PROBE_PRIORITY = 1_000_000
#: Seconds a host's state is trusted before it is read again.
STALE_S = 10.0
#: Hosts whose state is kept, and (host, title) pairs remembered for the title trigger.
HOSTS = 20_000
TITLES = 20_000
#: The newest paths remembered per (host, title).
TITLE_PATHS = 4
#: Pages of a host this consumer judged for each probe of one of its directories: a
#: small host is probed at its root alone.
PAGES_A_PROBE = 100


@dataclass(slots=True)
class PageFacts:
    """What a handled 2xx HTML page is judged by."""

    host: str
    url: str
    final_url: str
    redirected: bool
    depth: int
    title: str  # its title normalized (soft404.norm_title); '' when not judged for it
    shape: str  # its URL's shape: its links of that shape are a near duplicate's
    near: Page | None  # its fingerprint, when judged for near duplicates
    soft: bool  # judged for soft 404s
    echo: int | None  # its echo-free words' hash (`echo_free`), when its title was seen
    held_since: float | None = None  # monotonic time it was first held for a probe


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a flush's judgement asks of the flusher."""

    probes: list[NewTask]  # probe tasks claimed, to enqueue
    held: list[Completion]  # pages to judge again at a later flush


def link_features(urls: Iterable[str | Request], own: str) -> list[str]:
    """A page's links as near-duplicate features: those not of its shape `own`, with
    their tokens masked (a session id per visit is the same link)."""
    out = []
    for u in urls:
        url = u if isinstance(u, str) else u.url
        if shape(url) != own:
            out.append(masked(url))
    return out


def echo_free(text: str, url: str) -> int:
    """A hash of a page's words (`text`), its path where it names it left out (a
    catch-all echoes the path it was asked for). Compared within this process only: the
    interpreter's own hash of the set, no digest."""
    return hash(frozenset(soft404.unechoed(text, url).lower().split()))


def _links_home(c: Completion) -> bool:
    """Whether a page links into its own host (its root probe is then due)."""
    home = _origin(c.lease.task.url) + "/"
    return any((u if isinstance(u, str) else u.url).startswith(home) for u in c.urls)


def _origin(url: str) -> str:
    end = url.find("/", url.find("://") + 3)
    return url if end < 0 else url[:end]


def _path(url: str) -> str:
    end = url.find("/", url.find("://") + 3)
    return "/" if end < 0 else url[end:].partition("?")[0].partition("#")[0]


class Judge:
    """Judges a flush's pages with the fleet's state of their hosts, kept here between
    flushes; also the session tokens the link intake learns (`learn`, `tokens`)."""

    def __init__(self, book: TrapBook, policy: Callable[[], LivePolicy], metrics: Metrics,
                 worker: str) -> None:
        self.book = book
        self._policy = policy
        self.metrics = metrics
        self.worker = worker
        self.hosts: OrderedDict[str, HostState] = OrderedDict()
        #: (host, title) -> its newest pages: path, shape, hash of its words but its URL's
        self._titles: OrderedDict[tuple[str, str], list[tuple[str, str, int | None]]] = \
            OrderedDict()
        self._pages: dict[str, int] = {}  # host -> pages judged for soft 404s
        self._pending: list[Learned] = []  # sent with the next call

    def seen(self, host: str, title: str) -> bool:
        """Whether a page of `host` had `title` (normalized) here before: a page of it
        then takes its echo-free hash for the twin trigger."""
        return (host, title) in self._titles

    def tokens(self, host: str) -> Mapping[str, str]:
        """The session-token rules learned for `host` (``q:<name>``, ``p:<index>``), each
        with the value its links are deduplicated under."""
        state = self.hosts.get(host)
        return state.tokens if state is not None else {}

    def learn(self, host: str, rule: str, value: str) -> None:
        """A session-token rule the link intake learned, with its own value: applied here
        at once, sent to the fleet with the next flush (the first learner's value wins)."""
        state = self._state(host)
        if rule not in state.tokens:
            state.tokens[rule] = value
            self._pending.append(Learned(host, "t", f"{rule} {value}"))
            log.info("session_token_learned", extra={"host": host, "rule": rule})

    def _state(self, host: str) -> HostState:
        state = self.hosts.get(host)
        if state is None:
            state = self.hosts[host] = HostState()
            if len(self.hosts) > HOSTS:
                self.hosts.popitem(last=False)
        return state

    async def judge(self, live: Sequence[Completion], tally: Callable[[str, str], None], *,
                    holding: bool = True, op: str = "") -> Verdict:
        """Judge `live`'s pages, changing the outcome, links and items of those found to
        be near duplicates or soft 404s (each tallied for its host); store the probes'
        signatures. The verdict names the probe tasks this consumer claimed, to enqueue,
        and (`holding`) the pages to hold until their directory's probe answers."""
        now = self._policy()
        pages = [(c, c.page) for c in live
                 if c.kind is CompletionKind.ACK and isinstance(c.page, PageFacts)]
        learned, self._pending = self._pending, []
        for c in live:
            if c.probe is not None:
                learned.append(Learned(c.lease.host, "s",
                                       f"{c.probe.directory} {c.probe.encode().decode()}"))
        claims: dict[tuple[str, str], str] = {}  # (host, directory) -> a URL to shape it
        reads: set[str] = set()
        clock = time.monotonic()
        if now.soft_404:  # a host's root is probed before its linked pages are fetched
            for c in live:
                if c.kind is CompletionKind.ACK and c.probe is None and _links_home(c) \
                        and follows_from(c.lease.task.depth, now.max_depth):
                    state = self.hosts.get(c.lease.host)
                    if state is None or ("/" not in state.claimed
                                         and "/" not in state.signatures):
                        claims.setdefault((c.lease.host, "/"), c.lease.task.url)
        for c, f in pages:
            if f.soft:
                self._want(c, f, clock, claims, reads)
        learned += [Learned(host, "c", d) for host, d in claims]
        if not pages and not learned:
            return Verdict([], [])
        fps = [f.near for _, f in pages if f.near is not None]
        try:
            (states, won), near = await asyncio.gather(
                self.book.judgement(reads, learned, f"{self.worker} {os.urandom(6).hex()}"),
                self.book.near_duplicates(fps, op=op))
        except BaseException:  # the tokens go with the next call (the rest is the batch's)
            self._pending[:0] = [item for item in learned if item.kind == "t"]
            raise
        for host, fields in states.items():
            state = HostState.of(fields, clock)
            state.tokens = {**self.tokens(host), **state.tokens}  # the fleet's value wins
            self.hosts[host] = state
            self.hosts.move_to_end(host)
        for c in live:  # this consumer's probes judge its next pages at once
            if c.probe is not None:
                self._state(c.lease.host).signatures[c.probe.directory] = c.probe
        probes = self._probes(claims, [item for item in learned if item.kind == "c"], won)
        verdicts = iter(near)
        held: list[Completion] = []
        holds: dict[str, int] = {}
        for c, f in pages:
            duplicate = f.near is not None and next(verdicts)
            if f.soft and self._soft_404(c, f):
                self._judged(c, SOFT_404, (), now.drop_judged_items)
                tally(f.host, SOFT_404)
            elif holding and f.soft and c.urls and self._hold(c, f, clock, holds):
                held.append(c)  # its links wait for its directory's probe
            elif duplicate:
                self._near_duplicate(c, f, now.drop_judged_items)
                tally(f.host, NEAR_DUPLICATE)
        for c in live:  # a page reached from a near duplicate passes no mark on
            meta = c.lease.task.meta
            if c.child_meta is None and NEAR_META in meta:
                c.child_meta = {k: v for k, v in meta.items() if k != NEAR_META}
        return Verdict(probes, held)

    def _near_duplicate(self, c: Completion, f: PageFacts, drop_items: bool) -> None:
        """Page `f` is a near duplicate: its links to pages of its shape are not followed
        when it was itself reached from a near duplicate (a trap's second step: an empty
        calendar's third month); the first near duplicate of a chain has them followed,
        marked, as one of two sibling pages of a generator's template may be the only
        page linking the pages of its own (a class's member list in Doxygen's API), but
        for its counter's neighbours when it links both (`counter_neighbours`: the next
        empty month, the next empty page past a listing's last), that chain's second
        step. A spider's labelled request is followed whatever page links it."""
        urls = [u if isinstance(u, str) else u.url for u in c.urls]
        if NEAR_META in c.lease.task.meta:
            cut = {u for u in urls if shape(u) == f.shape}
        else:
            cut = counter_neighbours(f.final_url, urls)
            c.child_meta = {**c.lease.task.meta, NEAR_META: 1}
        self._judged(c, NEAR_DUPLICATE, [u for u in c.urls if _labelled(u) or (
            u if isinstance(u, str) else u.url) not in cut], drop_items)

    def _hold(self, c: Completion, f: PageFacts, clock: float, holds: dict[str, int]) -> bool:
        """Whether to hold page `f` (not acked, its links not followed yet) until the probe
        of a directory it is under answers, for at most `HOLD_S`: its links would be the
        catch-all's next pages. A host keeps a slot free for the probe: with a delay,
        its leases' slots come back with their acks."""
        state = self.hosts.get(f.host)
        path = _path(f.url)
        if state is None or not any(path.startswith(d) for d in state.claimed
                                    if d not in state.signatures):
            return False
        if f.held_since is None:
            f.held_since = clock
        lease = c.lease
        room = HELD_PER_HOST if lease.concurrency == 0 or not lease.delay_ms \
            else lease.concurrency - 1
        if clock - f.held_since > HOLD_S or holds.get(f.host, 0) >= room:
            return False
        holds[f.host] = holds.get(f.host, 0) + 1
        return True

    def _want(self, c: Completion, f: PageFacts, clock: float,
              claims: dict[tuple[str, str], str], reads: set[str]) -> None:
        """The reads and probe claims page `f` asks for: its host's state when not known
        or stale, its root's probe, and its directory's when another page of its host
        had its title under another path."""
        state = self.hosts.get(f.host)
        if state is None or clock - state.read_at > STALE_S \
                or not state.claimed <= state.signatures.keys():  # a probe is out
            reads.add(f.host)
        if state is None or ("/" not in state.claimed and "/" not in state.signatures):
            claims.setdefault((f.host, "/"), f.url)
        if MISSING.search(f.title):  # a page that says it is missing: its own directory
            self._claim(f, directory(f.url), state, claims)
        # Two pages of one title whose paths differ by more than a number (not a
        # listing's next page, not a product's sibling): a catch-all's pages, maybe;
        # surely when their words but their URLs' are the same.
        path, key = _path(f.url), (f.host, f.title)  # no title is one title too
        recent = self._titles.get(key)
        if recent is None:
            recent = self._titles[key] = []
            if len(self._titles) > TITLES:
                self._titles.popitem(last=False)
        others = [(common_directory(other, path), echo)
                  for other, form, echo in recent if form != f.shape]
        where = max((d for d, _ in others), key=len, default="/")
        echo = f.echo if recent else None
        twins = [d for d, e in others if e is not None and e == echo]
        if twins:  # their own catch-all, maybe under another one: probed whatever is above
            self._claim(f, max(twins, key=len), state, claims, under=True)
        if all(other != path for other, _, _ in recent):
            recent.append((path, f.shape, echo))
            del recent[:-TITLE_PATHS]
        seen = self._pages[f.host] = self._pages.get(f.host, 0) + 1
        if len(self._pages) > HOSTS:
            self._pages.clear()
        dirs = sum(1 for (host, d) in claims if host == f.host and d != "/")
        if state is not None:
            dirs += len(state.claimed - {"/"})
        if dirs < seen // PAGES_A_PROBE:
            self._claim(f, where, state, claims)

    @staticmethod
    def _claim(f: PageFacts, where: str, state: HostState | None,
               claims: dict[tuple[str, str], str], *, under: bool = False) -> None:
        """Claim the probe of `f`'s host's directory `where`, unless it is the root (the
        root's is claimed apart), claimed, probed, or (but `under`: twins no signature
        judged, a listing's catch-all below the root's "not found" page) under a
        directory whose probe found a catch-all (its signature judges it already)."""
        if where == "/" or (state is not None and (
                where in state.claimed or where in state.signatures
                or (not under and any(sig.kind != soft404.NONE
                                      and where.startswith(sig.directory)
                                      for sig in state.signatures.values())))):
            return
        claims.setdefault((f.host, where), f.url)

    def _soft_404(self, c: Completion, f: PageFacts) -> bool:
        """Whether page `f` matches a signature of its host that applies to it."""
        state = self.hosts.get(f.host)
        if state is None or f.depth < 1:
            return False
        words: tuple[int, ...] | None = None
        url: frozenset[int] = frozenset()
        for sig in state.signatures.values():
            if not soft404.applies(sig, f.url):
                continue
            if sig.kind == soft404.PAGE and sig.title == f.title and words is None:
                body = c.record.body if c.record is not None else None
                words = soft404.sketch(soft404.unechoed(simhash.page_text(body or b""),
                                                        f.url))
                url = soft404.url_hashes(f.url)  # only a page of a signature's title
            if soft404.matches(sig, final_url=f.final_url, redirected=f.redirected,
                               title=f.title, words=words, url=url):
                return True
        return False

    @staticmethod
    def _judged(c: Completion, outcome: Outcome, urls: Sequence[str | Request],
                drop_items: bool) -> None:
        c.outcome = outcome
        c.cut = len(c.urls) - len(urls)
        c.urls = urls
        if c.record is not None:
            c.record.outcome = outcome
            if drop_items:
                c.record.items = []

    def _probes(self, claims: dict[tuple[str, str], str], asked: Sequence[Learned],
                won: Sequence[bool]) -> list[NewTask]:
        """The probe tasks of the claims this consumer won."""
        tasks = []
        for item, mine in zip(asked, won, strict=True):
            state = self._state(item.host)
            state.claimed.add(item.value)
            if not mine:
                continue
            like = claims[(item.host, item.value)]
            url = soft404.probe_url(_origin(like), item.value, _path(like))
            tasks.append(NewTask(url, fingerprint(url), priority=PROBE_PRIORITY,
                                 max_attempts=1, meta={PROBE_META: item.value}))
            self.metrics.soft404_probes_total.inc()
            log.info("soft404_probe", extra={"host": item.host, "directory": item.value})
        return tasks


def _labelled(link: str | Request) -> bool:
    return not isinstance(link, str) and link.label is not None


def page_facts(task: Task, host: str, result: FetchResult, urls: Sequence[str | Request],
               live: LivePolicy, *, seen: Callable[[str, str], bool]) -> PageFacts | None:
    """What a handled 2xx HTML page is judged by, after its handler ran (the flush's
    one call per partition gives the verdict, where waiting for it here would cost a
    round trip a page): for soft 404s, its title, when it was reached by a link (a seed
    is the operator's word); for near duplicates, when its URL is a variant
    (``common.urls.shape``) and its request has no label (a labelled request is the
    spider's own word that the page is one it wants: a product page of one template
    differs from the next by a few words), the fingerprint of its text (from the tree
    the handler parsed, its scripts stripped) and of its links; for a title `seen`
    before on its host (``Judge.seen``), its echo-free words' hash. None when neither
    applies.

    Its text is taken once, from the parsed tree, and only the first ``MAX_TEXT``
    characters are masked and hashed: a 1.6 MB index page costs no more than a short one."""
    if not 200 <= result.status <= 299 or not result.body \
            or "html" not in result.headers.get("content-type", ""):
        return None
    soft = live.soft_404 and task.depth >= 1
    near = None
    form = shape(task.url)
    within = live.near_duplicate_distance
    words: str | None = None
    if within >= 0 and task.label is None and is_variant(task.url):
        words = simhash.page_text(result.take_tree())
        text = VARIANT_WORDS.sub("#", words[:simhash.MAX_TEXT])
        links = link_features(urls, form)
        fp = simhash.exact_text(text) if within == 0 else simhash.fingerprint(text)
        if fp is not None:
            near = Page.of(host, bytes.fromhex(task.id[:8]), fp, within,
                           shape=shape_tag(host, task.url),
                           links=simhash.exact_set(links) if within == 0
                           else simhash.set_fingerprint(links))
    if near is None and not soft:
        return None
    title = soft404.norm_title(soft404.title_of(result.body), task.url) if soft else ""
    echo = None
    if soft and seen(host, title):
        if words is None:
            words = simhash.page_text(result.take_tree())
        echo = echo_free(words, task.url)
    return PageFacts(host, task.url, result.final_url, bool(result.redirects), task.depth,
                     title, form, near, soft, echo)


def probe_signature(directory: str, url: str, result: FetchResult) -> Signature:
    """What a probe's answer says of its directory (`soft404.signature_of`)."""
    body, status = result.body, result.status
    html = "html" in result.headers.get("content-type", "")
    text = simhash.page_text(body) if html and body and 200 <= status <= 299 else None
    return soft404.signature_of(directory, status, url, result.final_url,
                                title=soft404.title_of(body) if text is not None else "",
                                text=text)
