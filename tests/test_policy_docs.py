"""The "Crawl policy" page (docs/policy.md) describes `POLICY_OPTIONS` as declared: its
table has one row per option, in declaration order, each with the default `crawl show`
prints; "Who creates it" names every option's flag, "Migration" every key a policy an
earlier crawlq made may lack; and the policy module's docstring names every option. An
option added to the declaration without its row on that page (or a row left after it is
removed) fails here."""

from __future__ import annotations

import re

from support.docs import page
from support.docs import section as doc_section

import common.policy
from common.policy import POLICY_OPTIONS

#: A row of the policy table: | `key` | what it means | `default` |
ROW = re.compile(r"^\| `(?P<key>[^`]+)` \| (?P<value>.+) \| (?P<default>`[^`]*`) \|$")
#: The options every policy has held since policies exist (crawlq's first policy: the
#: politeness defaults and the content types): a policy may lack any other.
FIRST_KEYS = ("per_host_delay", "per_host_concurrency", "accept_content_type")


def section() -> str:
    """The text of docs/policy.md's "# Crawl policy", up to the next heading of its level."""
    return doc_section(page("policy.md"), "# Crawl policy")


def paragraph(title: str) -> str:
    """The paragraph of the section that starts with `title` in bold."""
    [found] = [p for p in section().split("\n\n") if p.startswith(f"**{title}")]
    return " ".join(found.split())


def table() -> list[tuple[str, str]]:
    """(key, default cell) of each row of the section's policy table, in order."""
    lines = section().splitlines()
    head = lines.index("| key | value (the flags' syntax) | default |")
    assert lines[head + 1] == "| --- | --- | --- |"
    rows = []
    for line in lines[head + 2:]:
        if not line.startswith("|"):
            break
        m = ROW.match(line)
        assert m, f"not a policy table row: {line!r}"
        rows.append((m["key"], m["default"]))
    return rows


def test_the_policy_table_is_the_declaration() -> None:
    rows = table()
    assert [key for key, _ in rows] == [o.name for o in POLICY_OPTIONS]
    assert dict(rows) == {o.name: f"`{o.show(o.default)}`" for o in POLICY_OPTIONS}


def test_who_creates_it_names_every_flag_and_migration_every_newer_key() -> None:
    who = paragraph("Who creates it")
    seeded = [o for o in POLICY_OPTIONS if o.flag]
    assert [o.flag for o in seeded if f"`{o.flag}`" not in who] == []
    # Each flag is named with its command: the consumer's before "else the producer's";
    # the keys without a flag are named as set by crawlq crawl alone.
    consumer, _, producer = who.partition("else the producer's")
    assert [o.flag for o in seeded
            if f"`{o.flag}`" not in (consumer if o.seeded_by == "crawlq-consumer"
                                     else producer)] == []
    alone = re.search(r"No flag seeds ([^:]*):", who)
    assert alone, "Who creates it names the keys only crawlq crawl sets"
    assert re.findall(r"`(\w+)`", alone[1]) == [o.name for o in POLICY_OPTIONS if not o.flag]
    listed = re.search(r"lacks the keys added since \(([^)]*)\)", paragraph("Migration"))
    assert listed, "Migration names the keys a policy an earlier crawlq made may lack"
    assert re.findall(r"`(\w+)`", listed[1]) == [
        o.name for o in POLICY_OPTIONS if o.name not in FIRST_KEYS]


def test_the_policy_module_says_what_the_policy_holds() -> None:
    doc = common.policy.__doc__ or ""
    intro = " ".join(doc[:doc.index("Each option is declared once")].split())
    assert [o.name for o in POLICY_OPTIONS if f"``{o.name}``" not in intro] == []
