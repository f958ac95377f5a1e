"""Which Lua scripts may run twice: one table for every script of ``common/lua``.

A call whose outcome is unknown (a timeout, or the connection dropped after it went
out: common/redis/retry.py) may have run, its reply lost. Whether it is sent again, by
the client's retry or by a loop that runs its step again (the consumer's flusher,
leaser, reaper, robots.txt lookups, a command's start-up), is this table's word:

- `again(why)`: running it twice is safe, and `why` says why (fenced by a token, an
  operation id whose kept reply answers the second call, dedup, values set, a read);
- `once(instead)`: a second run would count or report something twice; it is never
  sent again after an unknown outcome, and `instead` says what happens then.

Every script must be here (tests/test_resend.py lists ``common/lua`` and fails on one
that is not, saying what to add); registering one that is not raises `KeyError`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from common.redis.retry import did_not_run

__all__ = ["SCRIPTS", "Resend", "again", "may_run_again", "once", "resendable"]


@dataclass(frozen=True, slots=True)
class Resend:
    """Whether a script may run again after an unknown outcome (`safe`), and why (or, when
    it may not, what happens instead)."""

    safe: bool
    why: str


def again(why: str) -> Resend:
    """A script that may run twice: `why` says why a second run is harmless."""
    return Resend(True, why)


def once(instead: str) -> Resend:
    """A script that must not run twice: `instead` says what its callers do when its
    outcome is unknown."""
    return Resend(False, instead)


_FENCED = ("fenced: a call about a lease shows its token, and a second run finds the "
           "lease ended or its token changed")
_OP_ID = ("an operation id: a call sent again (same id) finds its first run in the "
          "worker's ops:<worker> and changes nothing more")

#: Every script of common/lua, by file name (without .lua).
SCRIPTS: dict[str, Resend] = {
    # The lease's life: fenced, and the calls that count it carry an operation id.
    "lease": again("an operation id: a call sent again gets the reply its first run kept "
                   "in op:<worker> (60 s) and leases nothing new"),
    "ack": again(f"{_OP_ID}; it answers the codes the first run kept, so a replayed ack "
                 "counts done once and never as a lost lease (stats: replayed)"),
    "lease_render": again("an operation id, as lease (its reply kept in rop:<worker>): a "
                          "call sent again gets the render leases its first run granted"),
    "fail": again(f"{_OP_ID}, as ack"),
    "renew": again(f"{_FENCED}: a lease still ours is extended to the same length again"),
    "release": again(f"{_FENCED}: the second run gives nothing back twice (answered "
                     "unknown)"),
    "checkpoint": again(f"{_FENCED}; it sets the checkpoint to the value given"),
    "late_turn": again(f"{_FENCED}; a second run moves the host's turn a delay later once "
                       "more: a request later, never sooner"),
    # Work coming in and coming back.
    "enqueue": again("dedup: a second run finds the URLs seen (counted duplicates); no "
                     "task is queued twice"),
    "enqueue_bloom": again("dedup, as enqueue"),
    "reclaim": again("each candidate is checked again against Redis TIME: a second run "
                     "finds it taken back"),
    "promote": again("as reclaim"),
    "revisit": again("as reclaim"),
    "requeue": again("by id of a dead task: a second run finds it no longer dead"),
    "purge": again("as requeue"),
    # Settings set to the values given.
    "host_set": again("it sets a host's settings to the values given"),
    "group_set": again("it sets a politeness group's settings to the values given"),
    "policy_apply": again("it writes one version's politeness into a partition: a second "
                          "run of a slice writes the same values under the same version"),
    "worker_beat": again("it sets the worker's heartbeat"),
    # Locks, compared by token.
    "refresh_lock": again("it compares the lock's token"),
    "release_lock": again("it compares the lock's token"),
    "robots_claim": again("it compares the lock's token: a call sent again finds the lock "
                          "its first run took ours"),
    # The crawler-trap state (common/traps/book.py).
    "traps": again(f"{_OP_ID}: no tally or path variant is added twice, and the verdicts "
                   "are read again as the first run left them"),
    "fingerprints": again(f"{_OP_ID}: no fingerprint is added twice, and the reply leaves "
                          "out the call's own, so no page is judged against the pages "
                          "after it"),
    "judgement": again("it sets signatures and tokens to the values given, and claims a "
                       "probe by its claimer's nonce: a call sent again finds its claims "
                       "its own, and reads the state again"),
    # The proxy pool and the sessions (common/proxies/, common/proxies/sessions.py).
    "proxy_report": again(f"{_OP_ID}: a call sent again gets the reply its first run kept; "
                          "a flush step run again (a new id) may count a proxy's success "
                          "or failure twice, never a ban"),
    "proxy_bans": again(f"{_OP_ID}, as proxy_report"),
    "session_update": again(f"{_OP_ID} kept in the session's record: its cookies are set "
                            "once; a flush step run again sets the same cookies"),
    # Reads, and writes that check before they write.
    "is_empty": again("it only reads"),
    "history_get": again("it only reads"),
    "history_push": again("a second snapshot within the minimum gap is skipped"),
    "migrate": again("a host or lease that has its layout-3 record already is left as it "
                     "is"),
    "compact_queues": again("compacting an entry twice leaves it as it is; a LIST rotated "
                            "further keeps every entry (FIFO order is not a promise)"),
    "compact_history": again("an id whose old record is gone (converted) is skipped"),
    # Not sent again.
    "policy_set": once("a second run would find its own change and report it as someone "
                       "else's (exists, moved); the caller gets the error: crawlq crawl set "
                       "says Redis failed (exit 3, run it again), a start-up step reads the "
                       "policy again and finds what the first run wrote"),
    "fsck_repair": once("its reply is crawlq fsck --repair's report, which a second run "
                        "would give as nothing to fix; fsck says Redis failed (exit 3) and "
                        "a run again checks before it repairs"),
    "fsck_orphans": once("as fsck_repair"),
    "fsck_groups": once("as fsck_repair"),
    "fsck_revisits": once("as fsck_repair"),
    "fsck_render": once("as fsck_repair"),
    "render_vote": once("a second run would count one probe twice, and two agreeing "
                        "votes for one page could decide http a probe early; the vote is "
                        "dropped instead (logged): the pair stays probed and a later page "
                        "of it votes (consumer.fetch_choice)"),
}


def resendable(name: str) -> bool:
    """Whether script `name` may run twice; KeyError for a script the table lacks."""
    try:
        return SCRIPTS[name].safe
    except KeyError:
        raise KeyError(f"{name}.lua is in no retry class: add it to SCRIPTS in "
                       f"common/redis/resend.py") from None


def may_run_again(exc: BaseException, scripts: Iterable[str]) -> bool:
    """Whether a loop may run a step that failed with `exc` again: always when it did not
    run; when it may have run, only if every script the step calls may run twice."""
    return did_not_run(exc) or all(resendable(name) for name in scripts)
