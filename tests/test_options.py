"""Every environment variable means one thing in every command that reads it: the same
flag and the same default (a ConfigMap shared by the producer and the consumers sets it
for both)."""

from __future__ import annotations

import argparse
import re
from collections import defaultdict

from common.policy import POLICY_OPTIONS
from console.cli import build_parser as crawlq_parser
from consumer.config import CONSUMER_OPTIONS
from consumer.config import build_parser as consumer_parser
from producer.cli import PRODUCER_OPTIONS
from producer.cli import build_parser as producer_parser

ENV = re.compile(r"\(env (CRAWLQ_\w+|REDIS_URL); default (.*)\)$", re.S)


def options(parser: argparse.ArgumentParser, command: str,
            found: dict[str, set[tuple[str, str]]], where: dict[str, set[str]]) -> None:
    """Collect (flag, default) per environment variable from a parser and its subparsers."""
    for action in parser._actions:  # argparse keeps no public list of its actions
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                options(sub, f"{command} {name}", found, where)
            continue
        match = ENV.search(action.help or "")
        if match and action.option_strings:
            flag = max(action.option_strings, key=len)
            found[match.group(1)].add((flag, match.group(2)))
            where[match.group(1)].add(command)


def every_option() -> tuple[dict[str, set[tuple[str, str]]], dict[str, set[str]]]:
    found: dict[str, set[tuple[str, str]]] = defaultdict(set)
    where: dict[str, set[str]] = defaultdict(set)
    for command, parser in (("crawlq", crawlq_parser()), ("crawlq-producer", producer_parser()),
                            ("crawlq-consumer", consumer_parser())):
        options(parser, command, found, where)
    return found, where


def test_every_variable_has_one_meaning_across_commands() -> None:
    found, where = every_option()
    assert len(found) > 40  # the scan reads every command's options
    clashes = {env: (sorted(meanings), sorted(where[env]))
               for env, meanings in found.items() if len(meanings) > 1}
    assert clashes == {}


def test_the_batch_sizes_have_their_own_variables() -> None:
    found, _ = every_option()
    assert found["CRAWLQ_LEASE_BATCH"] == {("--lease-batch", "0")}
    assert found["CRAWLQ_ENQUEUE_BATCH"] == {("--enqueue-batch", "1000")}
    assert "CRAWLQ_BATCH_SIZE" not in found


def test_a_crawl_policy_variable_is_read_by_its_seeding_command_alone() -> None:
    """A crawl policy value has one seed outside ``crawlq crawl``: the flag of the
    command named by its ``seeded_by`` (the consumer's, or the producer's for
    max_attempts and recrawl_after), used when that command creates the policy. No other
    command reads its variable, so a ConfigMap shared by the producer and the consumers
    can't look like it sets the crawl's value in the other one too."""
    _, where = every_option()
    env_of = {o.flag: o.env for o in (*CONSUMER_OPTIONS, *PRODUCER_OPTIONS)}
    seeded = [o for o in POLICY_OPTIONS if o.flag]  # the others: crawlq crawl alone
    assert {o.name: sorted(where[env_of[o.flag]]) for o in seeded} == {
        o.name: [o.seeded_by] for o in seeded}
    assert {o.name for o in POLICY_OPTIONS if o.seeded_by == "crawlq-producer"} == {
        "max_attempts", "recrawl_after"}
