"""Every Lua script is classified: may it run twice after an unknown outcome, and why (or
what happens instead)? common/redis/resend.py's table, held to the scripts on disk, to the
docs, and to the loops that run a step again after a Redis error."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from common.redis.resend import SCRIPTS, may_run_again, resendable
from common.redis.retry import NotSentError
from common.redis.scripts import LUA
from consumer.flush import STEPS as FLUSH_STEPS
from consumer.housekeeping import HEARTBEAT_SCRIPTS, REAPER_SCRIPTS
from consumer.leaser import LEASE_SCRIPTS
from consumer.robots import ROBOTS_SCRIPTS
from consumer.runner import LATE_TURN_SCRIPTS

ROOT = Path(__file__).resolve().parents[1]

HOW_TO_CLASSIFY = """\
common/lua/{name}.lua is in no retry class. After a timeout or a dropped connection
crawlq can't tell whether a call ran, so each script says whether it may run again.
Add one line to SCRIPTS in common/redis/resend.py:

    "{name}": again("why a second run is harmless: fenced by the lease's token, an
               operation id, dedup, it sets the values given, it only reads ..."),
or
    "{name}": once("what its callers do when its outcome is unknown"),

and put it in the table of docs/failover.md ("Retries that know what they retry").
A script whose second run would count something twice (a tally, a counter, a list it
appends to) needs an operation id first: see traps.lua and lib/once.lua."""


def scripts_on_disk() -> list[str]:
    return sorted(p.stem for p in LUA.glob("*.lua"))


def test_every_script_in_common_lua_is_classified() -> None:
    assert len(scripts_on_disk()) >= 34
    missing = [name for name in scripts_on_disk() if name not in SCRIPTS]
    assert not missing, "\n\n".join(HOW_TO_CLASSIFY.format(name=n) for n in missing)


def test_the_table_names_no_script_that_is_not_there() -> None:
    gone = sorted(set(SCRIPTS) - set(scripts_on_disk()))
    assert not gone, f"common/redis/resend.py classifies scripts common/lua lacks: {gone}"


def test_each_class_says_why() -> None:
    for name, resend in SCRIPTS.items():
        assert len(resend.why) >= 10, f"{name}: say why it may run twice, or what instead"


def test_an_unclassified_script_is_refused_where_it_is_registered() -> None:
    with pytest.raises(KeyError, match="no retry class: add it to SCRIPTS"):
        resendable("no_such_script")


def test_the_docs_table_classifies_every_script_as_the_code_does() -> None:
    text = (ROOT / "docs" / "failover.md").read_text()
    classes: dict[str, str] = {}
    for row in re.findall(r"^\| (`[a-z_]+`(?:, `[a-z_]+`)*) \| (yes|no) \|", text, re.M):
        for name in re.findall(r"`([a-z_]+)`", row[0]):
            classes[name] = row[1]
    wrong = {name: (classes.get(name), "yes" if r.safe else "no")
             for name, r in SCRIPTS.items()
             if classes.get(name) != ("yes" if r.safe else "no")}
    assert not wrong, f"docs/failover.md's table (docs, code): {wrong}"


@pytest.mark.parametrize(("loop", "steps"), [
    ("consumer/flush.py: the flusher's steps", FLUSH_STEPS),
    ("consumer/leaser.py: the lease loop", {"lease": LEASE_SCRIPTS}),
    ("consumer/housekeeping.py: the heartbeat", {"heartbeat": HEARTBEAT_SCRIPTS}),
    ("consumer/housekeeping.py: the reaper", {"reap": REAPER_SCRIPTS}),
    ("consumer/robots.py: robots.txt lookups", {"robots": ROBOTS_SCRIPTS}),
    ("consumer/runner.py: a late request's turn", {"late_turn": LATE_TURN_SCRIPTS}),
])
def test_every_loop_that_runs_a_step_again_runs_only_scripts_that_may_run_twice(
        loop: str, steps: dict[str, tuple[str, ...]]) -> None:
    for step, scripts in steps.items():
        assert scripts, step
        for name in scripts:
            assert resendable(name), (
                f"{loop} runs step {step!r} again after a Redis error, but {name}.lua "
                f"may not run twice ({SCRIPTS[name].why}): give it an operation id, or "
                "stop running the step again")


def test_a_step_that_did_not_run_may_always_run_again() -> None:
    assert may_run_again(NotSentError("refused"), ["policy_set"])
    assert not may_run_again(RedisConnectionError("reset"), ["policy_set"])
    assert may_run_again(RedisConnectionError("reset"), ["ack", "traps"])
