"""The mutation drill (issue 13): every guarantee, broken on purpose, must fail its tests.

``tests/mutants/`` holds one small patch per guarantee; `MUTANTS` names each patch's
guarantee and the tests that guard it. The drill copies the tree (the files git tracks
or would track, as they are on disk) to a temporary directory, runs all those tests there
once unpatched (they must pass, or a kill means nothing), then for each mutant applies its
patch to a fresh copy (``git apply``) and runs only its tests, with ``PYTHONPATH`` the
copy, stopping at the first failure. One line per mutant: killed by <test>, or SURVIVED.
Mutants run ``--jobs`` at a time (default: one per core): most guarding tests wait on
sockets and timers, not the CPU, and each run is its own process on its own copy.

It exits 1 when a mutant survives, a patch no longer applies (a refactor must carry its
mutant along), a patch has no table entry or an entry no patch, or the baseline fails.

    python3 tests/mutation_drill.py          # every mutant (~145 s on 2 cores)
    python3 tests/mutation_drill.py 03 07    # those whose names start so
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUTANTS_DIR = Path(__file__).resolve().parent / "mutants"
#: One mutant's tests may not take longer than this (the drill reports it as broken).
MUTANT_TIMEOUT_S = 300.0
#: Mutants judged at once: one per core.
JOBS = os.cpu_count() or 1

_G = "tests/test_guarantees.py::"
_Q = "tests/test_queue.py::"
_F = "tests/test_fetcher.py::"
_FR = "tests/test_frontier.py::"
_PB = "tests/test_pushback.py::"
_RS = "tests/test_revisit_schedule.py::"
_SP = "tests/test_spider_process.py::"
_RQ = "tests/test_requests.py::"
_PG = "tests/test_postgres_sink.py::"
_T = "tests/test_traps.py::"
_FO = "tests/test_failover.py::"
_GR = "tests/test_groups.py::"
_FH = "tests/test_first_hour.py::"
_RK = "tests/test_recrawl_known.py::"
_PX = "tests/test_proxies.py::"
_RL = "tests/test_render_lane.py::"
_BF = "tests/test_browser_fetcher.py::"
_BP = "tests/test_browser_pool.py::"
_RF = "tests/test_rendering_fleet.py::"


@dataclass(frozen=True)
class Mutant:
    """A patch in tests/mutants/ (`name`.patch), what it breaks, and the tests that guard it."""

    name: str
    guarantee: str
    tests: tuple[str, ...]


MUTANTS: tuple[Mutant, ...] = (
    Mutant("146-render-task-leased-without-a-browser", "a consumer without a browser never "
           "leases a render request (lease.lua moves it to the render lane)",
           (_RL + "test_a_consumer_without_a_browser_never_leases_a_render_task",)),
    Mutant("147-subrequest-fetched-by-the-browser-itself", "every request a rendered page "
           "makes goes through the SSRF guard: a script's fetch of a loopback canary, a "
           "private or the metadata address connects to none of them",
           (_BF + "test_a_script_reaches_no_canary_no_private_and_no_metadata_address",)),
    Mutant("148-browser-killed-pages-task-lost", "a page whose browser died is retried, "
           "not lost: the crawl ends with every item",
           (_BP + "test_a_browser_killed_mid_page_fails_that_render_and_the_next_gets_a_new_one",
            _RF + "test_a_browser_killed_mid_page_and_a_rendering_consumer_killed_lose_"
            "nothing")),
    Mutant("149-late-turn-outage-crashes-the-task", "a Redis outage as a late request "
           "takes its turn hands the task back: no attempt counted, no internal_error",
           ("tests/test_redis_faults.py::test_a_late_turn_in_an_outage_hands_its_task_back",)),
    Mutant("150-counter-neighbours-of-a-near-duplicate-followed", "a first near "
           "duplicate that links both its counter's neighbours (an empty month) has "
           "those two links cut",
           (_T + "test_a_near_duplicate_stops_its_calendar_but_never_a_listing_of_other_"
                 "items",)),
    Mutant("151-followed-request-not-frozen", "a request is checked once where it enters "
           "and frozen there: what its route does to its dicts afterwards changes (or "
           "breaks) nothing that is enqueued",
           ("tests/test_spider.py::test_follow_checks_once_and_freezes_what_it_took",
            "tests/test_requests.py::test_a_checked_request_is_frozen")),
    Mutant("01-ack-before-sink-write", "a task is acked only after its result reached the sink",
           (_G + "test_a_task_is_not_done_while_its_result_is_not_in_the_sink",)),
    Mutant("02-heartbeat-slower-than-lease", "the heartbeat renews leases before they expire",
           (_G + "test_a_fetch_longer_than_several_leases_keeps_its_lease",)),
    Mutant("03-lease-deadline-from-worker-clock", "lease deadlines come from Redis TIME",
           (_G + "test_a_lease_deadline_is_redis_time_whatever_the_worker_clock",)),
    Mutant("04-ack-ignores-fencing-token", "a stale token can't ack (fencing)",
           (_Q + "test_stale_token_is_refused_everywhere",)),
    Mutant("05-lost-lease-result-written", "results of lost or expired leases are dropped",
           (_G + "test_results_of_lost_or_expired_leases_are_not_written",)),
    Mutant("06-reclaim-before-expiry", "reclaim takes only leases past their deadline",
           (_G + "test_reclaim_checks_each_deadline_on_redis_time_itself",
            _Q + "test_reclaim_only_after_expiry")),
    Mutant("07-dedup-skipped", "a seen URL is not enqueued again",
           (_Q + "test_exact_dedup_within_and_across_batches",)),
    Mutant("08-ssrf-skipped-on-redirects", "the SSRF guard checks every redirect hop",
           (_F + "test_proxy_never_asked_for_a_blocked_literal_a_redirect_names",
            _F + "test_redirect_to_private_address_blocked_before_connecting")),
    Mutant("09-body-cap-on-compressed-bytes", "the body cap counts decompressed bytes",
           (_F + "test_gzip_bomb_stops_at_cap_on_decompressed_bytes[4]",
            _F + "test_gzip_decompressing_to_exactly_the_cap_passes")),
    Mutant("10-host-concurrency-ignored", "a host never has more leases than its concurrency",
           (_FR + "test_concurrency_caps_leases_per_host_until_one_ends",)),
    Mutant("11-host-delay-not-moved", "a lease moves its host's next turn by its delay",
           (_FR + "test_a_host_with_a_delay_gives_one_task_per_turn_and_says_when_the_next_is",)),
    Mutant("12-politeness-from-consumer-flags", "requests are timed by the lease's delay, "
           "not by the consumer's flags",
           (_FR + "test_each_lease_says_its_hosts_delay_whatever_the_consumers_flags",)),
    Mutant("13-slot-given-back-twice", "a host's slot comes back once: at the response "
           "or at the lease's end",
           (_FR + "test_a_hosts_slot_comes_back_once_when_the_response_is_in",)),
    Mutant("14-fair-share-ignores-held-slots", "a worker takes no more than its share of a "
           "host's slots while another is hungry, counting the slots it holds",
           (_FR + "test_a_hosts_slots_are_shared_with_a_worker_whose_lease_came_back_empty",)),
    Mutant("15-policy-change-waits-for-the-idle-poll", "a policy change reaches running "
           "consumers within a second, and moves their next turns at once",
           (_FR + "test_a_policy_change_reaches_three_running_consumers_within_a_second",)),
    Mutant("16-pool-limited-by-consumer-flag", "nothing a consumer was started with narrows "
           "what the crawl's policy allows a host",
           (_PB + "test_a_default_consumer_serves_the_policys_concurrency",)),
    Mutant("17-push-back-in-a-block-escalates", "one push-back incident raises a host's "
           "backoff once: replies to requests sent before its block raise nothing",
           (_PB + "test_a_push_back_sent_before_the_block_raises_nothing",)),
    Mutant("18-delay-gives-many-to-a-limited-host", "a host with a delay gives one task a "
           "lease call, whatever its concurrency",
           ("tests/test_guards.py::"
            "test_a_host_with_a_delay_gives_one_task_a_call_whatever_its_concurrency",)),
    Mutant("19-slot-back-only-at-the-ack", "a host's slot comes back when the response is "
           "in, before the task's handler, sink write and ack",
           ("tests/test_guards.py::"
            "test_a_hosts_slot_comes_back_when_the_response_is_in_not_at_the_ack",)),
    Mutant("20-max-links-ignored", "a handler's links past --max-links are dropped and "
           "counted capped",
           ("tests/test_guards.py::test_links_past_max_links_are_dropped_and_counted_capped",)),
    Mutant("21-no-response-spends-a-page", "a timeout or a refused connection spends no "
           "page of its host's budget",
           ("tests/test_guards.py::"
            "test_a_timeout_or_a_refused_connection_spends_no_page_of_the_budget",)),
    Mutant("22-lease-reply-policy-version-ignored", "a lease reply naming a newer policy "
           "version makes the consumer read it, with no message and no heartbeat",
           ("tests/test_guards.py::"
            "test_a_lease_reply_naming_a_newer_policy_is_followed_with_no_message",)),
    Mutant("23-fsck-counts-responses-in-as-in-flight", "fsck counts in flight only the "
           "leases whose response is not in",
           ("tests/test_guards.py::"
            "test_fsck_does_not_count_a_lease_whose_response_is_in_as_in_flight",)),
    Mutant("24-host-concurrency-override-ignored", "a host's own concurrency overrides the "
           "crawl's, higher or lower",
           ("tests/test_guards.py::"
            "test_a_hosts_own_concurrency_overrides_the_crawls_higher_and_lower",)),
    Mutant("25-stale-cancel-ends-a-fetch-slot", "a fetch slot survives a drop after a library "
           "swallowed an earlier cancel: held leases are always fetched",
           ("tests/test_guards.py::"
            "test_a_fetch_slot_survives_a_drop_after_a_library_swallowed_a_cancel",)),
    Mutant("26-validators-follow-a-redirect", "a revisit's validators go to its own URL "
           "only, never to a redirect target",
           (_F + "test_validators_never_follow_a_redirect_to_another_url",)),
    Mutant("27-not-modified-page-handled", "an unchanged page is never given to the "
           "handler: no links are extracted again (a 304 never reaches a route: 2xx only)",
           ("tests/test_revisits.py::"
            "test_the_same_body_is_unchanged_and_its_links_are_not_extracted_again",
            "tests/test_revisits.py::"
            "test_a_304_is_not_modified_never_given_a_body_nor_handled")),
    Mutant("28-done-url-not-scheduled", "with revisits on, a done URL comes back by itself "
           "when its next visit is due",
           (_RS + "test_the_schedule_brings_a_done_url_back_with_no_producer_run_and_no_link",)),
    Mutant("29-history-of-another-url", "a revisit carries its own URL's validators, never "
           "another's",
           (_RS + "test_a_revisit_carries_its_own_urls_validators_never_anothers",)),
    Mutant("30-lease-ahead-started-early", "a turn leased ahead starts at its turn, not "
           "when the lease reply came",
           (_FR + "test_a_turn_within_ahead_is_leased_timed_to_it_and_counted_from_it",)),
    Mutant("31-push-back-keeps-the-first-retry-after", "two push-backs of one host in one "
           "fail call block it for the longer Retry-After",
           (_PB + "test_two_push_backs_of_one_host_in_one_call_keep_the_longer_retry_after",)),
    Mutant("32-push-back-of-another-task", "a push-back blocks its own host only, not "
           "another host failed in the same call",
           (_PB + "test_a_push_back_blocks_only_its_own_host_of_a_call",)),
    Mutant("33-max-age-past-max-interval", "a declared max-age raises an adaptive interval, "
           "never past max_interval",
           (_RS + "test_max_age_never_raises_an_adaptive_interval_past_max_interval",)),
    Mutant("34-adaptive-delay-below-the-hosts-own", "adaptive_delay never takes a host "
           "below its own delay",
           (_PB + "test_adaptive_delay_never_goes_below_the_hosts_own_delay",)),
    Mutant("35-opt-in-push-back-outcomes-ignored", "5xx, 408, a timeout and a refused "
           "connection count as push-back when backoff_on names them",
           (_PB + "test_backoff_on_counts_an_opt_in_outcome_only_when_named",
            _PB + "test_a_timeout_named_in_backoff_on_blocks_its_host")),
    Mutant("36-zero-max-crawl-delay-caps-to-zero", "max_crawl_delay 0 obeys any robots.txt "
           "Crawl-delay, cutting and logging none",
           (_PB + "test_a_max_crawl_delay_of_0_obeys_any_crawl_delay",)),
    Mutant("43-post-bodies-deduped-as-one", "two bodies sent to one URL are two tasks (a "
           "request's unique key holds its body's digest); one body twice is one",
           (_RQ + "test_two_post_bodies_to_one_url_are_two_tasks_and_one_body_twice_is_one",)),
    Mutant("44-bad-request-accepted-at-enqueue", "a bad request (method, body, data, label) "
           "is refused at enqueue with its reason, nothing enqueued",
           (_RQ + "test_a_bad_request_is_refused_at_enqueue_and_nothing_is_enqueued",)),
    Mutant("45-child-label-and-data-dropped", "a handler's child Request keeps its label "
           "and data through Redis to another consumer's handler",
           (_RQ + "test_a_childs_label_and_data_reach_its_handler_in_another_consumer_"
            "process",)),
    Mutant("46-followed-data-dropped", "a followed link's label and data reach its spider "
           "route on another consumer process",
           (_SP + "test_a_childs_label_and_data_reach_its_route_on_another_consumer_process",)),
    Mutant("47-unknown-label-fetched", "a task whose label has no route ends dead "
           "(unknown_label) at its first lease, never fetched, never done unparsed",
           (_SP + "test_a_task_whose_label_has_no_route_ends_dead_with_its_reason_unfetched",)),
    Mutant("48-charset-ignored", "a spider's selectors read the page as its charset says",
           ("tests/test_spider.py::test_the_body_is_decoded_by_its_charset_and_json_parsed",
            "tests/test_spider.py::test_css_and_xpath_select_text_attributes_and_elements")),
    Mutant("49-pg-ack-before-commit", "a task is acked only once the PostgreSQL transaction "
           "holding its rows committed",
           (_PG + "test_a_refused_write_acks_nothing_until_the_database_takes_it",
            _PG + "test_a_database_down_mid_crawl_loses_nothing")),
    Mutant("50-pg-stale-write-replaces-row", "a stale lease's late write never replaces a "
           "row its successor wrote",
           (_PG + "test_an_older_fence_never_replaces_a_newer_row",
            _PG + "test_a_stale_consumers_late_write_does_not_replace_its_successors_row")),
    Mutant("51-pg-batch-keeps-the-first-of-a-key", "a batch holding one key twice writes "
           "the item of the newest fence",
           (_PG + "test_a_batch_with_duplicate_keys_writes_one_row_a_key_the_newest_fence_"
                  "winning",)),
    Mutant("52-repeated-segment-let-through", "a link whose path holds one segment more "
           "often than trap_repeated_segments is refused, however far apart the copies",
           (_T + "test_each_rule_refuses_its_trap_and_lets_a_plain_url_through",
            _T + "test_refused_links_are_counted_by_reason_and_per_host")),
    Mutant("53-near-duplicate-links-followed", "a near duplicate's links to pages of its "
           "shape are not followed (an empty calendar's next month)",
           (_T + "test_a_near_duplicate_stops_its_calendar_but_never_a_listing_of_other_"
                 "items",)),
    Mutant("54-page-its-own-near-duplicate", "a page is never a near duplicate of its own "
           "URL's earlier fetch (a retry, a revisit)",
           (_T + "test_a_page_is_never_its_own_near_duplicate_and_fingerprints_are_bounded",)),
    Mutant("40-lease-sent-again-after-an-unknown-outcome", "a lease call sent again after "
           "its reply was lost gets the leases the first one granted, never a second set",
           (_FO + "test_a_lease_sent_again_after_its_reply_was_lost_gets_the_same_leases",
            _FO + "test_a_lease_that_got_no_answer_gives_its_leases_to_the_next_call")),
    Mutant("41-token-counter-not-past-the-epoch", "a fencing token granted after a "
           "promotion is greater than every token the old primary granted",
           (_FO + "test_tokens_after_a_promotion_pass_the_ones_the_replica_never_saw",)),
    Mutant("42-did-not-run-error-final", "a call Redis refused without running it "
           "(READONLY, LOADING, ...) is tried again until a primary answers",
           (_FO + "test_a_write_a_replica_refused_is_tried_again_until_it_is_promoted",
            _FO + "test_a_primary_without_its_replicas_refuses_and_is_tried_again")),
    Mutant("56-estimator-ignores-changes", "revisit=learned's estimator counts the changes "
           "its visits find: a URL changing at every visit is revisited more often",
           (_RS + "test_learned_intervals_follow_the_estimated_change_rate_within_the_"
            "bounds",)),
    Mutant("55-group-limit-ignored-by-the-lease", "a host of a politeness group is served "
           "only when its group's turn has come and its group has a free slot",
           (_GR + "test_a_groups_concurrency_holds_across_its_hosts_and_comes_back_at_each_end",
            _GR + "test_three_consumers_keep_a_groups_concurrency_and_delay_across_50_names")),
    Mutant("57-labelled-page-judged-a-near-duplicate", "a labelled request's page is "
           "never a near duplicate: its items are written",
           (_T + "test_a_labelled_request_is_never_a_near_duplicate",)),
    Mutant("58-robots-txt-sent-at-a-passed-turn", "robots.txt, looked up first and sent "
           "late under its page's lease, takes a turn of its own",
           (_FR + "test_a_late_robots_txt_and_the_pages_that_waited_for_it_keep_the_delay",)),
    Mutant("60-late-turn-ignores-a-later-turn", "a late request's turn comes a delay after "
           "the latest turn leased, not at once",
           (_FR + "test_a_late_robots_txt_and_the_pages_that_waited_for_it_keep_the_delay",)),
    Mutant("77-page-after-robots-txt-takes-no-turn", "a page whose robots.txt went under "
           "its lease takes its own turn a delay after that request",
           (_FR + "test_three_consumers_keep_each_hosts_delay_and_concurrency_robots_included",
            _FR + "test_a_late_robots_txt_and_the_pages_that_waited_for_it_keep_the_delay")),
    Mutant("78-turn-timed-from-a-clock-ahead-of-redis", "a turn leased ahead starts by "
           "Redis' clock, whose estimate here trails Redis' time: never before its turn",
           (_FR + "test_a_turn_within_ahead_is_leased_timed_to_it_and_counted_from_it",
            _FR + "test_three_consumers_keep_each_hosts_delay_and_concurrency_robots_included")),
    Mutant("72-stopping-flush-retried-for-ever", "a consumer told to stop while Redis is "
           "unreachable gives its last flush up and exits 3",
           ("tests/test_consumer.py::test_a_consumer_stopping_while_redis_is_gone_gives_up_"
            "its_last_flush",)),
    Mutant("70-late-on-the-wire-sent-anyway", "a request late as its headers go out "
           "(it waited for a connection, or for robots.txt) takes a turn of its own",
           (_FR + "test_a_request_late_on_the_wire_takes_a_turn_of_its_own",
            _FR + "test_a_late_robots_txt_and_the_pages_that_waited_for_it_keep_the_delay",
            _FR + "test_a_polite_request_counts_from_when_its_headers_went_out")),
    Mutant("71-last-modified-ignored", "revisit=learned dates a change by its "
           "Last-Modified: a page changing far faster than its visits is left to "
           "max_interval", (_RS + "test_learned_dates_changes_by_last_modified",)),
    Mutant("67-partitions-left-where-crc16-puts-them", "a new crawl's partitions spread "
           "over equal ranges of the Cluster's slots",
           (_Q + "test_a_new_crawl_spreads_its_partitions_over_the_slots_an_older_one_keeps_"
                 "its_keys",)),
    Mutant("68-compact-http-entry-expanded-as-https", "a compact entry leases as the "
           "entry it was: an http URL of its host's queue stays http",
           (_Q + "test_every_entry_form_round_trips_through_the_queues",)),
    Mutant("65-recrawl-window-sends-no-validators", "a recrawl by recrawl_after alone is "
           "conditional: it sends its URL's kept validators, and a 304 ends not_modified",
           ("tests/test_revisits.py::test_a_recrawl_window_alone_asks_with_the_validators_"
            "and_a_304_ends_not_modified",
            _RS + "test_a_recrawl_windows_history_is_kept_unscheduled_and_joins_the_schedule_"
            "later")),
    Mutant("63-ip-groups-named-by-domain", "under politeness_key ip a host's group is its "
           "name's address, named before its first lease, though the enqueuing process "
           "did not know the key",
           (_GR + "test_three_consumers_keep_an_ip_groups_concurrency_and_delay_across_50_hosts",
            _GR + "test_by_ip_a_hosts_group_is_its_names_address_named_before_its_first_lease")),
    Mutant("64-ip-group-renamed-by-a-later-answer", "under politeness_key ip a host keeps "
           "the group it was first named, so its leases give their slots back to it",
           (_GR + "test_by_ip_a_host_keeps_the_first_group_it_was_named",)),
    Mutant("61-facet-pagination-refused", "a faceted page's links that change only its "
           "pagination (its next pages) are followed: trap_page_facets refuses filters, "
           "not pagination",
           (_T + "test_a_faceted_pages_filter_links_are_refused_and_its_pages_followed",
            _T + "test_a_faceted_page_is_judged_by_numbers_too_but_never_by_its_pagination")),
    Mutant("73-history-etag-dropped-in-encode", "a done URL's history record keeps the "
           "validators its fetch observed (the binary record, lib/revisits.lua)",
           (_RS + "test_a_history_record_is_compact_and_gives_back_what_it_was_told",
            "tests/test_revisits.py::test_a_recrawl_window_alone_asks_with_the_validators_"
            "and_a_304_ends_not_modified")),
    Mutant("74-history-bucket-not-the-seen-marks", "a URL's history record is in the "
           "rv:hist bucket of its seen mark, where its recrawl's enqueue reads it",
           ("tests/test_revisits.py::test_a_recrawl_window_alone_asks_with_the_validators_"
            "and_a_304_ends_not_modified",
            _RS + "test_a_recrawl_windows_history_is_kept_unscheduled_and_joins_the_schedule_"
            "later")),
    Mutant("75-converted-history-loses-its-entry", "a layout-3 crawl's history converts "
           "with each URL's entry: its revisits still come back",
           ("tests/test_migrate_compact.py::test_a_layout_3_crawls_history_converts_and_its_"
            "visits_ask_with_it",)),
    Mutant("85-known-urls-not-brought-back", "a link-following crawl re-seeded past its "
           "recrawl window reaches every page it knew: the producer brings back every known "
           "URL past the window, not only what the seeds' changed pages link to",
           (_RK + "test_a_recrawl_past_its_window_reaches_every_page_it_knew",)),
    Mutant("86-recrawl-window-record-keeps-no-entry", "a recrawl window's history record "
           "keeps its URL's host and request, which the producer brings it back with",
           (_RK + "test_a_recrawl_past_its_window_reaches_every_page_it_knew",
            _RK + "test_known_urls_come_back_with_their_request_from_big_buckets")),
    Mutant("87-gone-page-keeps-its-history", "a recrawl answered 404 or 410 ends gone and "
           "its history record is deleted, so it is not brought back again",
           ("tests/test_revisits.py::test_a_recrawl_answered_404_or_410_ends_gone_and_its_"
            "history_is_deleted",
            _RK + "test_a_recrawl_past_its_window_reaches_every_page_it_knew")),
    Mutant("88-twins-unprobed-under-a-catch-all", "echo-free twins get their directory "
           "probed under a directory whose catch-all signature does not judge them",
           (_T + "test_a_listings_catch_all_under_the_roots_is_probed_and_judged",)),
    Mutant("62-facet-remembered-as-a-trap", "a link refused as a facet is one on its page "
           "only: the same URL linked from another page is followed",
           (_T + "test_a_faceted_pages_filter_links_are_refused_and_its_pages_followed",)),
    Mutant("79-soft-404-signature-ignored", "a page that matches its directory's probed "
           "soft-404 signature is a soft 404: its links are not followed",
           (_T + "test_a_crawl_finds_every_real_page_and_follows_no_soft_404",
            _T + "test_a_page_that_says_it_is_missing_waits_for_its_directorys_probe")),
    Mutant("80-near-duplicate-across-shapes", "a page is compared only with pages of its "
           "URL's shape, never with a sibling of another path",
           (_T + "test_a_page_is_never_its_own_near_duplicate_and_fingerprints_are_bounded",)),
    Mutant("81-judged-items-dropped-by-default", "a heuristic never drops an item with "
           "the defaults: a soft 404's or near duplicate's items are written",
           (_T + "test_a_crawl_finds_every_real_page_and_follows_no_soft_404",
            _T + "test_a_labelled_request_is_never_a_near_duplicate")),
    Mutant("82-page-not-held-for-its-probe", "a page under a directory whose probe is out "
           "waits for its answer: a catch-all's next level is never fetched",
           (_T + "test_a_page_that_says_it_is_missing_waits_for_its_directorys_probe",)),
    Mutant("84-first-near-duplicate-of-a-chain-cut", "the first near duplicate of a chain "
           "has its links followed: a generator's sibling page may be the only one "
           "linking its own",
           (_T + "test_a_near_duplicate_stops_its_calendar_but_never_a_listing_of_other_"
                 "items",)),
    Mutant("83-session-token-learned-from-a-few-links", "a session token is learned only "
           "from most of a page's links: an id a few links share is no token",
           (_T + "test_tokens_fresh_per_visit_are_learned_from_a_page_and_left_out_of_"
                 "the_key",)),
    # Issue 45: the guarantees no test guarded, each killed every run (not by timing).
    Mutant("93-label-without-route-parsed-by-the-handler", "with --handler beside "
           "--spider, a task whose label has no route ends dead unknown_label, unparsed",
           (_SP + "test_a_label_with_no_route_ends_dead_also_beside_a_handler",)),
    Mutant("94-every-script-sent-again", "a script that may not run twice (common/redis/resend.py) "
           "is not sent again after its reply was lost",
           (_FO + "test_a_script_not_safe_to_run_twice_is_not_sent_again",)),
    Mutant("95-sixteen-character-session-id-kept", "a session id of 16 characters in a "
           "query is dropped from the link",
           (_T + "test_session_ids_are_dropped_but_a_short_sid_stays",)),
    Mutant("96-labelled-page-judged-on-a-retry", "a labelled request's page is never a "
           "near duplicate, on a retry either",
           (_T + "test_a_labelled_request_is_no_near_duplicate_on_its_retry_either",)),
    Mutant("97-compact-http-entry-loses-its-query", "an http URL put back in its host's "
           "queue compact (release, reclaim, promote, requeue) keeps its query",
           (_Q + "test_every_entry_form_round_trips_through_the_queues",)),
    Mutant("98-token-counter-from-redis-time-in-ms", "a fencing token starts past Redis "
           "TIME in microseconds, so a promoted replica's pass the old primary's",
           (_FO + "test_a_token_starts_past_redis_time_in_microseconds",
            _FO + "test_tokens_after_a_promotion_pass_the_ones_the_replica_never_saw")),
    Mutant("91-banned-proxy-used-again-for-its-host", "a proxy a host banned is not used "
           "for that host again (by this consumer at once, by the fleet from its record), "
           "while other hosts keep it",
           (_PX + "test_picks_skip_what_a_host_banned_and_what_is_quarantined_tier_by_tier",
            _PX + "test_a_proxy_a_host_bans_is_not_used_for_it_by_the_fleet_but_for_the_"
                  "others")),
    Mutant("92-captcha-page-delivered-as-data", "a page the crawl's or its route's ban "
           "rules match (a 200 captcha) is never taken as data: retried, its proxy banned "
           "for the host, dead blocked after its attempts",
           ("tests/test_bans.py::test_a_captcha_through_one_proxy_bans_it_for_the_host_and_"
            "every_page_is_data",
            "tests/test_bans.py::test_a_captcha_page_sent_direct_is_retried_then_dead_blocked_"
            "never_data",
            "tests/test_bans.py::test_a_routes_own_rule_keeps_a_captcha_out_of_its_items")),
    Mutant("99-session-cookies-lost-between-consumers", "a session's cookies reach Redis "
           "with the flush, before its requests' links: any consumer continues a login",
           ("tests/test_sessions.py::test_a_session_a_consumer_logged_in_with_is_continued_"
            "by_another",
            "tests/test_sessions.py::test_three_consumers_one_killed_mid_crawl_get_every_"
            "members_page_logged_in_once")),
    # Issue 44: a spider's first hour.
    Mutant("100-items-of-two-types-in-one-table", "a route's items go to the table of its "
           "item_type, keyed there: a product and a review never share a table or a key",
           (_PG + "test_items_of_two_types_go_to_two_tables_each_keyed_in_one_transaction",
            _SP + "test_two_item_types_into_postgres_with_a_consumer_killed_lose_and_double_"
                  "no_row")),
    Mutant("101-run-out-holds-an-earlier-runs-items", "crawlq run's --out holds exactly "
           "this run's crawl's items, whatever ran before in its --output",
           (_FH + "test_two_spiders_in_turn_on_a_redis_of_their_own_each_out_holds_its_own",)),
    Mutant("102-follows-cut-at-depth-3-by-default", "a crawl follows links as deep as the "
           "site goes unless its policy sets max_depth",
           ("tests/test_intake.py::test_no_depth_limit_by_default_and_none_is_no_limit",
            _FH + "test_a_follow_every_link_spider_with_the_defaults_gets_every_product")),
    Mutant("103-links-not-followed-left-uncounted", "a link not followed (too_deep, "
           "out_of_scope, a trap rule's) is counted where crawlq stats reads",
           ("tests/test_undelivered.py::test_links_past_max_depth_are_counted_in_stats_and_"
            "the_dashboard",)),
    Mutant("104-route-error-without-its-place", "a route's error names the spider file and "
           "line it was raised at, in its dead letter and crawlq run's summary",
           (_FH + "test_a_route_that_raises_is_named_with_its_file_and_line_without_a_"
                  "traceback",)),
    Mutant("105-judged-pages-links-left-uncounted", "the links of a page judged a soft 404 "
           "or a near duplicate that are not followed are counted where crawlq stats reads",
           (_T + "test_a_crawl_finds_every_real_page_and_follows_no_soft_404",
            _T + "test_a_near_duplicate_stops_its_calendar_but_never_a_listing_of_other_"
                 "items")),
)


@dataclass(frozen=True)
class Outcome:
    """What became of one mutant: `verdict` is killed, survived or broken (the drill can't
    judge it: no patch, no entry, a patch that does not apply, a failed baseline)."""

    name: str
    verdict: str
    detail: str
    seconds: float = 0.0

    def line(self) -> str:
        if self.verdict == "killed":
            text = f"killed by {self.detail}"
        elif self.verdict == "survived":
            text = f"SURVIVED {self.detail}"
        else:
            text = f"BROKEN: {self.detail}"
        return f"{self.name:<40} {text} ({self.seconds:.1f}s)"


def copy_tree(root: Path, dest: Path) -> None:
    """Copy the files git tracks, or would track, under `root` as they are on disk."""
    listed = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, check=True).stdout
    for name in sorted({n for n in listed.decode().split("\0") if n}):
        src = root / name
        if src.is_file():  # a tracked file deleted on disk is not copied
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


def apply_patch(tree: Path, patch: Path) -> str | None:
    """Apply `patch` inside `tree`; None, or why it does not apply."""
    # Ceiling: git must not find a repository above the temporary tree and apply there.
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.parent)}
    done = subprocess.run(["git", "apply", str(patch)], cwd=tree, env=env, check=False,
                          capture_output=True, text=True)
    if done.returncode == 0:
        return None
    return " ".join(done.stderr.split())[:300] or f"git apply exited {done.returncode}"


_FAILED = re.compile(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", re.MULTILINE)


def run_tests(tree: Path, tests: Sequence[str], timeout_s: float
              ) -> tuple[int, list[str], str]:
    """Run `tests` in `tree` (stop at the first failure): exit code, failed test ids and
    the output's tail. Exit code -1: timed out."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    # Plugins no guarding test uses are left out: hypothesis' alone takes ~1.5 s to load,
    # paid by every run.
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-rfE", "-p", "no:cacheprovider",
           "-p", "no:randomly", "-p", "no:hypothesispytest", "-p", "no:benchmark", "-n", "0",
           *tests]
    try:
        done = subprocess.run(cmd, cwd=tree, env=env, check=False, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return -1, [], f"timed out after {timeout_s:g}s"
    out = done.stdout + done.stderr
    return done.returncode, _FAILED.findall(out), "\n".join(out.splitlines()[-15:])


def judge(name: str, tree: Path, patch: Path, tests: Sequence[str], timeout_s: float
          ) -> Outcome:
    """Apply one mutant to `tree` (a fresh copy) and run its tests there."""
    started = time.monotonic()
    why = apply_patch(tree, patch)
    if why is not None:
        return Outcome(name, "broken", f"patch does not apply: {why}")
    code, failed, tail = run_tests(tree, tests, timeout_s)
    took = time.monotonic() - started
    if code == 0:
        return Outcome(name, "survived", f"(ran {', '.join(tests)})", took)
    if code == 1 and failed:
        return Outcome(name, "killed", failed[0], took)
    return Outcome(name, "broken", f"pytest exited {code}:\n{tail}", took)


def drill(root: Path, mutants_dir: Path, table: Sequence[Mutant], *, only: Sequence[str] = (),
          timeout_s: float = MUTANT_TIMEOUT_S, jobs: int = JOBS,
          say: Callable[[str], None] = lambda line: None) -> list[Outcome]:
    """Judge the mutants of `table` (those whose names start with one of `only`, if given)
    on copies of `root`, `jobs` at a time; their patches are `mutants_dir`/<name>.patch.
    `say` gets one line per outcome as it is known; the outcomes come back in table order."""
    outcomes: list[Outcome] = []
    jobs = max(1, jobs)

    def decided(outcome: Outcome) -> None:
        outcomes.append(outcome)
        say(outcome.line())

    patches = {p.stem for p in mutants_dir.glob("*.patch")}
    for stray in sorted(patches - {m.name for m in table}):
        decided(Outcome(stray, "broken", "a patch with no entry in the drill's table"))
    chosen = [m for m in table if not only or m.name.startswith(tuple(only))]
    for m in chosen:
        if m.name not in patches:
            decided(Outcome(m.name, "broken", f"no {m.name}.patch in {mutants_dir}"))
    runnable = [m for m in chosen if m.name in patches]
    with tempfile.TemporaryDirectory(prefix="crawlq-drill-") as tmp:
        pristine = Path(tmp) / "tree"
        copy_tree(root, pristine)
        baseline = Path(tmp) / "baseline"
        shutil.copytree(pristine, baseline)
        tests = list(dict.fromkeys(t for m in runnable for t in m.tests))
        started = time.monotonic()
        # The baseline's tests run in `jobs` shares at once, like the mutants after it.
        shares = [tests[i::jobs] for i in range(jobs) if tests[i::jobs]]
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            runs = list(pool.map(lambda share: run_tests(baseline, share, timeout_s), shares))
        took = time.monotonic() - started
        broken = [(failed, tail) for code, failed, tail in runs if code != 0]
        if broken:
            failed, tail = broken[0]
            decided(Outcome("baseline", "broken", "the guarding tests fail on the unpatched "
                            f"tree: {', '.join(failed) or tail}", took))
            return outcomes

        say(f"{'baseline':<40} {len(tests)} guarding tests pass unpatched ({took:.1f}s)")

        def one(m: Mutant) -> Outcome:
            work = Path(tmp) / m.name
            shutil.copytree(pristine, work)
            try:
                outcome = judge(m.name, work, mutants_dir / f"{m.name}.patch", m.tests,
                                timeout_s)
            finally:
                shutil.rmtree(work, ignore_errors=True)
            say(outcome.line())
            return outcome

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            outcomes.extend(pool.map(one, runnable))
    return outcomes


def exit_code(outcomes: Sequence[Outcome]) -> int:
    """0 when every mutant was killed, else 1."""
    return 0 if outcomes and all(o.verdict == "killed" for o in outcomes) else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The mutation drill: every guarantee, "
                                                 "broken on purpose, must fail its tests.")
    parser.add_argument("only", nargs="*", help="run only mutants whose names start so")
    parser.add_argument("--jobs", type=int, default=JOBS,
                        help=f"mutants judged at once (default: {JOBS}, one per core)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    outcomes = drill(ROOT, MUTANTS_DIR, MUTANTS, only=args.only, jobs=args.jobs,
                     say=lambda line: print(line, flush=True))
    killed = sum(o.verdict == "killed" for o in outcomes)
    print(f"mutation drill: {killed} of {len(outcomes)} mutants killed "
          f"in {time.monotonic() - started:.0f}s")
    return exit_code(outcomes)


if __name__ == "__main__":
    sys.exit(main())
