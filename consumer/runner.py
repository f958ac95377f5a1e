"""The runner: one lease through robots.txt, the fetch and the handler to its completion.

A lease whose robots.txt is not known yet waits outside the fetch slots while it is
looked up; when this consumer fetched robots.txt itself, that request was the host's
turn, so the page takes its own, a delay after it (``Turns.turn_after``), and waits for
it outside the slots too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from common.errors import FetchError, RedisUnavailableError
from common.frontier.hosts import Frontier
from common.http.fetcher import Fetcher
from common.http.results import FetchResult
from common.observability.metrics import Metrics
from common.policy import is_pushback
from common.proxies.bans import NO_RULES, Blocked
from common.queue import Code, CrawlQueue, Failure, Lease
from common.reasons import CONNECT_ERROR, PROBE, ROBOTS_DISALLOWED, Outcome
from common.redis.errors import REDIS_ERRORS
from common.redis.resend import may_run_again
from common.tasks.items import unique_key_of
from common.tasks.request import Request
from common.tasks.task import Task
from common.traps import soft404
from common.traps.soft404 import Signature
from consumer.backoff import Backoff
from consumer.completion import Completion
from consumer.completion import CompletionKind as Kind
from consumer.config import ConsumerSettings
from consumer.fetch_choice import fetch_of
from consumer.flush import Flusher
from consumer.handlers import HandlerContext, LeaseLostError
from consumer.held import LeaseBook
from consumer.judgement import PROBE_META, page_facts, probe_signature
from consumer.leaser import AHEAD_MS, Leaser
from consumer.live import PolicyReader
from consumer.notices import HostNotices, RouteErrors
from consumer.proxied import NoProxy, PageFetch
from consumer.revisits import NOT_HANDLED, conditional_headers, noted, observe, outcome_of
from consumer.robots import ROBOTS_SCRIPTS, RobotsCache, RobotsVerdict
from consumer.routing import Router
from consumer.sinks import Record
from consumer.slots import Slots, Stage
from consumer.stopping import Stopping
from consumer.turns import Turns
from consumer.window import CpuWindow

if TYPE_CHECKING:
    from common.browser.fetcher import BrowserFetcher

log = logging.getLogger("consumer")

#: What a late request's turn runs: after a Redis error the task is handed back, and its
#: next lease takes its turn again (common/redis/resend.py: each may run twice). A robots.txt
#: lookup's (ROBOTS_SCRIPTS) the same, when they may.
LATE_TURN_SCRIPTS = ("late_turn", "release")
#: What hands a lease back from its fetch: no proxy may reach its host now (the pool's
#: report blocks the host), or Redis failed under the fetch's own calls, such as a late
#: request's turn before its headers went out (LATE_TURN_SCRIPTS): an outage, not the
#: task's fault. (A script's error is its internal_error: it would come back.)
HANDED_BACK = (NoProxy, RedisConnectionError, RedisTimeoutError)



class Runner:
    """Works leases for the fetch slots; each ends as one completion for the flusher."""

    def __init__(self, settings: ConsumerSettings, queue: CrawlQueue, *, fetcher: Fetcher,
                 robots: RobotsCache | None, router: Router | None, metrics: Metrics,
                 book: LeaseBook, slots: Slots, leaser: Leaser, flusher: Flusher,
                 policy: PolicyReader, window: CpuWindow, stopping: Stopping,
                 pages: PageFetch | None = None,
                 browser: BrowserFetcher | None = None) -> None:
        self.s = settings
        self.worker_id = settings.worker_id
        self.queue = queue
        self.frontier = Frontier(queue)
        self.fetcher = fetcher
        self.browser = browser  # renders the render requests (--browser)
        self.robots = robots
        self.router = router
        self.metrics = metrics
        self.book = book
        self.slots = slots
        self.leaser = leaser
        self.flusher = flusher
        self.policy = policy
        self.window = window
        self.turns = Turns(queue, self.worker_id, leaser.clock, book, metrics)
        self.stopping = stopping
        # A page's fetch: through the proxy pool if the consumer has one, judged for blocks.
        self.pages = pages or PageFetch(fetcher, None)
        self.route_errors = RouteErrors(router.files if router is not None else ())
        self.notices = HostNotices()

    async def work(self, lease: Lease) -> None:
        """Take a lease through robots.txt, the fetch and the handler to its completion,
        or hand it to a robots.txt lookup outside the fetch slots."""
        try:
            url = lease.task.url
            probe = lease.task.meta.get(PROBE_META)
            if self.router is not None and probe is None and not self.router.knows(lease.task):
                # Nothing here could parse it: fetched, it would be done unparsed.
                self.metrics.error("unknown_label")
                self._complete(Completion(lease, Kind.FAIL, failure=Failure(
                    lease, "unknown_label", self.router.unknown(lease.task)[:500],
                    permanent=True)))
                return
            if self.robots is not None and not self.policy.now.ignore_robots:
                try:
                    verdict = self.robots.cached(url)
                except FetchError as exc:  # a cached failure (robots_unavailable)
                    self._complete_error(lease, exc)
                    return
                if verdict is None:
                    self.slots.wait_for_robots(lease, self._robots_lookup(lease))
                    return
                if not verdict.allowed and probe is not None:
                    self._complete(Completion(lease, Kind.ACK, PROBE, probe=Signature(
                        str(probe), soft404.NONE)))
                    return
                if not verdict.allowed:
                    self.notices.refused(lease, ROBOTS_DISALLOWED)
                    self._complete(Completion(lease, Kind.ACK, ROBOTS_DISALLOWED, record=record_of(
                        lease, None, ROBOTS_DISALLOWED, self.worker_id)))
                    return
            if self.book.expired(lease):
                # e.g. the process was stopped: someone else may own it now.
                self.book.drop(lease, lost=True)
                return
            await self._fetch(lease)  # a late one takes its own turn as it goes (on_sent)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("task_crashed", extra={"id": lease.id})
            self._complete(Completion(lease, Kind.FAIL, failure=Failure(
                lease, "internal_error", f"{type(exc).__name__}: {exc}")))

    async def _robots_lookup(self, lease: Lease) -> None:
        """Fetch (or read the fleet's copy of) a lease's robots.txt while no slot waits.
        If this consumer fetched it, that request was the host's turn: record the host's
        Crawl-delay, and a page robots.txt allows takes its own turn a delay later and
        waits for it (handed back to the head of its host's queue if Redis fails
        meanwhile). Then queue the lease again: its slot finds the verdict cached."""
        assert self.robots is not None
        outage: Backoff | None = None
        try:
            while True:
                try:
                    verdict, fetched = await self.robots.lookup(
                        lease.task.url, on_sent=self.turns.on_sent(lease))
                    break
                except RedisUnavailableError:
                    outage = outage or Backoff()
                    await outage.sleep()
                except LeaseLostError:  # the turn's lease, this one's or a lookup's it joined
                    if not self.book.holds(lease):
                        raise
            if fetched:
                self.metrics.robots_turns_total.inc()
                delay = verdict.crawl_delay if isinstance(verdict, RobotsVerdict) else None
                if delay:
                    await self.frontier.set_robots_delay(lease.host, self._crawl_delay(
                        lease.host, delay))
        except Exception as exc:  # a FetchError such as ssrf_blocked is not cached
            self.slots.robots_done(lease)
            if self.book.holds(lease):
                if isinstance(exc, FetchError):
                    self._complete_error(lease, exc)
                elif isinstance(exc, REDIS_ERRORS) and may_run_again(exc, ROBOTS_SCRIPTS):
                    self._complete(Completion(lease, Kind.RELEASE))
                else:
                    log.exception("task_crashed", extra={"id": lease.id})
                    self._complete(Completion(lease, Kind.FAIL, failure=Failure(
                        lease, "internal_error", f"{type(exc).__name__}: {exc}")))
            else:
                self.slots.move(lease, Stage.DONE)
            self.leaser.wake()
            return
        # Its robots.txt took its turn: fetched next, it takes its own, a delay on (a
        # host without a delay is handed back: its next lease is its turn).
        may_fetch = fetched and isinstance(verdict, RobotsVerdict) and verdict.allowed
        turned = False
        if (may_fetch and lease.delay_ms > 0 and self.book.holds(lease)
                and not self.stopping.draining):
            self.slots.move(lease, Stage.TURN_WAIT)
            self.leaser.wake()  # the wait takes no room
            try:
                start = await self.turns.turn_after(lease)
            except REDIS_ERRORS as exc:  # handed back: its next lease is its turn
                log.warning("redis_error", extra={"during": "turn_after",
                                                  "error": str(exc)[:200]})
            else:
                turned = start is not None
                if start is not None:
                    await self._wait_for_turn(lease, start)
        self.slots.robots_done(lease)
        if not self.book.holds(lease):
            self.slots.move(lease, Stage.DONE)
            self.leaser.wake()
        elif may_fetch and not turned:
            self._complete(Completion(lease, Kind.RELEASE))
        elif not self.stopping.draining:
            self.slots.move(lease, Stage.QUEUED, front=True)
        else:
            self.slots.move(lease, Stage.DONE)

    async def _wait_for_turn(self, lease: Lease, start: float) -> None:
        """Wait for monotonic `start`, the time a page's own turn comes (Turns.turn_after):
        outside the room until AHEAD_MS before it, then in it, as a lease timed ahead
        (a fetch slot is free for it when its turn comes)."""
        await asyncio.sleep(max(0.0, start - AHEAD_MS / 1000 - time.monotonic()))
        if self.slots.stage(lease) is Stage.TURN_WAIT:
            self.slots.move(lease, Stage.SCHEDULED)
        await asyncio.sleep(max(0.0, start - time.monotonic()))

    def _crawl_delay(self, host: str, asked: float) -> float:
        """A robots.txt Crawl-delay as the crawl obeys it: cut to the policy's
        max_crawl_delay (logged and counted) when longer."""
        cap = self.policy.now.max_crawl_delay
        if cap <= 0 or asked <= cap:
            return asked
        self.metrics.robots_crawl_delay_capped_total.inc()
        log.warning("robots_crawl_delay_capped", extra={
            "host": host, "crawl_delay": asked, "max_crawl_delay": cap,
            "advice": "the crawl obeys at most max_crawl_delay; raise it (crawlq crawl set) "
                      "to obey the site, or block the host"})
        return cap

    async def _fetch(self, lease: Lease) -> None:
        self.slots.move(lease, Stage.FETCHING)
        started = time.monotonic()
        live = self.policy.now
        try:
            task = lease.task
            # A render request's fetch is the browser's (consumer.fetch_choice): through
            # the same proxy pick, session and block rules as an HTTP fetch.
            fetch = fetch_of(lease, self.fetcher, self.browser, self.router, self.turns,
                             modes=self.queue.render_modes)
            result = await self.pages.fetch(task.url, lease.host, crawl=live.bans,
                                            route=self._route_bans(task), task=task,
                                            via=fetch, headers=task.headers or None,
                                            crawl_credentials=True,
                                            accept=live.accept or None,
                                            on_sent=self.turns.on_sent(lease),
                                            conditional=conditional_headers(
                                                task.revisit if live.conditional else None),
                                            method=task.method, body=task.body)
        except LeaseLostError:  # while it took a late turn, before anything was sent
            self._complete(Completion(lease, Kind.DROP))
            return
        except HANDED_BACK as exc:  # unfetched, no attempt counted
            log.info("handed_back", extra={"id": lease.id, "why": str(exc)[:200]})
            self._complete(Completion(lease, Kind.RELEASE))
            return
        except FetchError as exc:
            self.metrics.response(exc.status)
            if PROBE_META in task.meta:  # no signature to learn: none is looked for
                self._complete(Completion(lease, Kind.ACK, PROBE, probe=Signature(
                    str(task.meta[PROBE_META]), soft404.NONE)))
                return
            # A status is the host's response, a page of its budget (a proxy's refusal
            # of CONNECT is not); a timeout or a refused connection is not.
            lease.responded = exc.status is not None and exc.reason != CONNECT_ERROR
            self._complete_error(lease, exc)
            return
        finally:
            self.metrics.fetch_duration_seconds.observe(time.monotonic() - started)
            if self.slots.stage(lease) is Stage.FETCHING:
                self.slots.move(lease, Stage.RESPONSE_IN)
            # A host with a delay is bound by it: its next turn is a delay away whatever
            # its slots do, so its slot comes back with the ack (no extra script work).
            if lease.concurrency > 0 and not lease.delay_ms and not self.stopping.draining:
                self.leaser.response_in(lease)
        lease.responded = True  # a page of its host's budget, whatever becomes of it
        if live.adaptive:
            lease.elapsed_ms = round(result.elapsed * 1000)
        self.metrics.response(result.status, len(result.body))
        # What a fetch observed (its digest, validators, freshness) is the URL's history
        # (a revisit schedule's, or a recrawl window's): without one, no body is hashed.
        observed = None
        if live.revisits or task.revisit is not None:
            lease.observed = observed = observe(task.revisit, result)
        if PROBE_META in task.meta:
            self._complete(Completion(lease, Kind.ACK, PROBE, probe=probe_signature(
                str(task.meta[PROBE_META]), task.url, result)))
            return
        if result.filtered:  # its Content-Type is not accepted: no body, no handler
            outcome = Outcome.FILTERED
            self._complete(Completion(lease, Kind.ACK, outcome,
                                      record=record_of(lease, result, outcome, self.worker_id)))
            return
        outcome = outcome_of(task.revisit, result, observed)
        record = noted(record_of(lease, result, outcome, self.worker_id), task.revisit, observed)
        urls: Sequence[str | Request] = ()
        page = None
        if self.router is not None and outcome not in NOT_HANDLED:
            # Counted before the handler's CPU work, and the loop goes round once: the
            # responses that came in together are all counted when the leaser runs next,
            # so a consumer whose CPU is behind gives its hosts' slots back (to the
            # fleet) instead of taking them all again.
            self.window.enter()
            try:
                await asyncio.sleep(0)
                # A bad Request fails its task here (its route's follow), never its flush.
                handled = await self.router(result, self._context(lease))
            except LeaseLostError:
                self._complete(Completion(lease, Kind.DROP))
                return
            except Exception as exc:
                self.metrics.error("handler_error")
                self._complete(Completion(lease, Kind.FAIL, failure=Failure(
                    lease, "handler_error", self.route_errors.failed(lease, exc)[:500])))
                return
            finally:
                self.window.leave()
            record.items = handled.items
            urls = handled.urls
            judge = self.flusher.judge
            page = None if judge is None else page_facts(
                lease.task, lease.host, result, urls, self.policy.now, seen=judge.seen)
            if len(urls) > self.s.max_links:
                self.flusher.intake.capped(len(urls) - self.s.max_links)
                urls = urls[:self.s.max_links]
        self._complete(Completion(lease, Kind.ACK, outcome, record=record, urls=urls,
                                  page=page))

    def _route_bans(self, task: Task) -> Blocked:
        return NO_RULES if self.router is None else self.router.blocked(task)

    def _context(self, lease: Lease) -> HandlerContext:
        async def save(value: Any) -> bool:
            return await self.queue.checkpoint(self.worker_id, lease, value) == Code.OK
        return HandlerContext(task=lease.task, worker=self.worker_id, _save=save,
                              max_links=self.s.max_links)

    def _complete_error(self, lease: Lease, exc: FetchError) -> None:
        self.metrics.error(exc.reason)
        self.notices.refused(lease, exc.reason, exc)
        pushback = is_pushback(self.policy.now.backoff_on, exc.reason, exc.status)
        if pushback:
            self.metrics.pushback(exc.reason)
        self._complete(Completion(lease, Kind.FAIL, failure=Failure(
            lease, exc.reason, exc.message[:500], retry_after=exc.retry_after,
            permanent=not exc.retryable, pushback=pushback)))

    def _complete(self, completion: Completion) -> None:
        """The lease's completion goes to the flusher: it leaves the slots' stages."""
        self.flusher.add(completion)
        lease = completion.lease
        if self.slots.stage(lease) is not Stage.DONE:
            self.slots.move(lease, Stage.DONE)


def record_of(lease: Lease, result: FetchResult | None, outcome: Outcome,
              worker: str) -> Record:
    """The sink's record of a lease's page (`result`) or of its failure (None)."""
    task = lease.task
    if result is None:
        return Record(task_id=task.id, url=task.url, final_url=task.url, status=None,
                      outcome=outcome, headers={}, raw_headers=(), body=None, bytes=0,
                      elapsed=0.0, attempt=task.attempt, fetched_at=time.time(),
                      worker=worker, depth=task.depth, meta=task.meta,
                      unique_key=unique_key_of(task), fence=lease.fence)
    return Record(task_id=task.id, url=task.url, final_url=result.final_url,
                  status=result.status, outcome=outcome, headers=result.headers,
                  raw_headers=result.raw_headers,
                  body=None if result.filtered else result.body,
                  bytes=len(result.body), elapsed=result.elapsed, attempt=task.attempt,
                  fetched_at=time.time(), worker=worker,
                  http_version=result.http_version, depth=task.depth, meta=task.meta,
                  unique_key=unique_key_of(task), fence=lease.fence)

