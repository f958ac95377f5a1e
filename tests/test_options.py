"""Every environment variable means one thing in every command that reads it: the same
flag and the same default (a ConfigMap shared by the producer and the consumers sets it
for both)."""

from __future__ import annotations

import argparse
import ast
import re
from collections import Counter, defaultdict
from pathlib import Path

from common.policy import POLICY_OPTIONS
from common.policy.command_flags import env_of
from console.cli import build_parser as crawlq_parser
from consumer.config import CONSUMER_OPTIONS
from consumer.config import build_parser as consumer_parser
from producer.cli import PRODUCER_OPTIONS
from producer.cli import build_parser as producer_parser

ROOT = Path(__file__).resolve().parents[1]
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


#: Where an Option is built from another table's row (its words are not literals).
DERIVES = ROOT / "common" / "policy" / "command_flags.py"


def calls(name: str) -> list[ast.Call]:
    """Every call of `name` (``Option``, ``PolicyOption``, ``policy_flag``) that
    declares an option: in the source tree, but for `DERIVES`."""
    found = []
    for package in ("common", "consumer", "producer", "console"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path != DERIVES:
                found += [node for node in ast.walk(ast.parse(path.read_text()))
                          if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                          and node.func.id == name]
    return found


def literal(call: ast.Call, index: int) -> str:
    """A call's positional argument `index`, a string written in the source."""
    arg = call.args[index]
    assert isinstance(arg, ast.Constant) and isinstance(arg.value, str), ast.unparse(call)
    return arg.value


def test_every_option_is_declared_once() -> None:
    """One declaration per option: an environment variable is declared by one Option
    call in the whole tree (two commands that share an option share its declaration), a
    policy option by one row of POLICY_OPTIONS, and no policy option is declared again
    as an Option: its command's flag is derived from the row (``policy_flag``)."""
    options = calls("Option")
    envs = Counter(literal(call, 1) for call in options)
    assert len(envs) > 40  # the scan reads every command's option tables
    assert sorted(env for env, n in envs.items() if n > 1) == []
    rows = Counter(literal(call, 0) for call in calls("PolicyOption"))
    assert sorted(name for name, n in rows.items() if n > 1) == []
    assert sorted(rows) == sorted(o.name for o in POLICY_OPTIONS)
    flagged = [o for o in POLICY_OPTIONS if o.flag]
    by_hand = ({o.flag for o in flagged} & {literal(call, 0) for call in options}
               | {env_of(o) for o in flagged} & set(envs))
    assert sorted(by_hand) == []
    assert Counter(literal(call, 0) for call in calls("policy_flag")) == Counter(
        o.name for o in flagged)


def test_a_policy_flag_is_its_row() -> None:
    """Each flag of a policy option, in the table of the command that seeds it, has the
    row's flag, default, parser and rule, its help starts with the row's and says it
    is a crawl policy value; ``CRAWLQ_<NAME>`` is its environment variable."""
    tables = {"crawlq-consumer": CONSUMER_OPTIONS, "crawlq-producer": PRODUCER_OPTIONS}
    flags = {(command, o.flag): o for command, table in tables.items() for o in table}
    for row in (o for o in POLICY_OPTIONS if o.flag):
        flag = flags[row.seeded_by, row.flag]
        default = flag.convert(flag.default) if flag.convert else flag.default
        assert (flag.env, default) == (env_of(row), row.default), row.name
        assert flag.help.startswith(row.help.replace("%", "%%")), row.name
        assert "a crawl policy value" in flag.help, row.name
        if not (flag.append or flag.flag_only_bool):
            assert (flag.type, flag.check) == (row.parse, row.check), row.name
