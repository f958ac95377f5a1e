"""A completion's kind (consumer/completion.py) and the flusher's steps (consumer/flush.py's
`STEPS`, each held to common/redis/resend.py's retry classes by tests/test_resend.py) name
the same queue calls: a kind added to one and not the other fails here."""

from __future__ import annotations

import json

from common.queue import CrawlQueue
from common.redis.resend import SCRIPTS
from consumer.completion import CompletionKind
from consumer.flush import STEPS

#: The kind that sends nothing: its lease is not this consumer's anymore.
SENDS_NOTHING = {CompletionKind.DROP}


def test_each_kind_that_sends_is_a_flush_step_of_its_own_script() -> None:
    for kind in set(CompletionKind) - SENDS_NOTHING:
        assert STEPS.get(kind) == (kind.value,), f"consumer/flush.py STEPS lacks {kind!r}"
        assert kind.value in SCRIPTS, f"{kind.value}.lua is in no retry class"
        assert callable(getattr(CrawlQueue, kind.value, None)), kind


def test_each_flush_step_that_ends_a_lease_is_a_kind() -> None:
    # A step that is one queue call of its own name (ack, fail, release; not enqueue,
    # which adds tasks) ends the leases a completion of that kind carries.
    ending = {step for step, scripts in STEPS.items()
              if scripts == (step,) and hasattr(CrawlQueue, step)}
    assert ending == {k.value for k in set(CompletionKind) - SENDS_NOTHING}


def test_a_kind_prints_and_serialises_as_its_old_string() -> None:
    assert [str(k) for k in CompletionKind] == ["ack", "fail", "release", "drop"]
    assert f"{CompletionKind.ACK}" == "ack"
    assert json.dumps({"kind": CompletionKind.FAIL}) == '{"kind": "fail"}'
    assert CompletionKind("release") is CompletionKind.RELEASE
