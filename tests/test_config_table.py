"""One declaration per option: each command's settings are built from its option table,
and every settings field is filled by exactly one option whose default is the field's."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from common.config import COMMON_OPTIONS, CommonSettings, Option
from common.errors import ConfigError
from common.http.results import FetchSettings
from consumer.config import CONSUMER_OPTIONS, ConsumerSettings, build_parser, settings_from_args
from producer.cli import PRODUCER_OPTIONS, ProducerSettings
from producer.cli import build_parser as producer_parser
from producer.run import TaskTemplate


@dataclasses.dataclass(frozen=True)
class Table:
    options: tuple[Option, ...]
    settings: type[Any]
    nested: dict[str, type[Any]]  # "group" -> the nested settings class
    derived: frozenset[str]  # fields filled from other settings, or fixed


CONSUMER = Table(CONSUMER_OPTIONS, ConsumerSettings, {"fetch": FetchSettings},
                 # the fetcher's pool has no limits (the lease is the limit); the
                 # README's "more than 5 redirects" is fixed; its proxies are the URLs of
                 # the pool's (--proxy)
                 frozenset({"common", "fetch", "fetch.concurrency", "fetch.limit_per_host",
                            "fetch.max_redirects", "fetch.proxies"}))
PRODUCER = Table(PRODUCER_OPTIONS, ProducerSettings, {"template": TaskTemplate},
                 frozenset({"common", "template"}))
TABLES = pytest.mark.parametrize("table", [CONSUMER, PRODUCER], ids=["consumer", "producer"])


def fields(table: Table) -> dict[str, dataclasses.Field[Any]]:
    out = {f.name: f for f in dataclasses.fields(table.settings)}
    for group, cls in table.nested.items():
        out.update({f"{group}.{f.name}": f for f in dataclasses.fields(cls)})
    return out


@TABLES
def test_every_field_has_exactly_one_option(table: Table) -> None:
    targets = [opt.target for opt in table.options]
    assert sorted(t for t in set(targets) if targets.count(t) > 1) == []
    assert sorted(set(targets) - set(fields(table))) == [], "options filling no settings field"
    assert sorted(set(fields(table)) - set(targets) - table.derived) == [], \
        "fields no option fills"


@TABLES
def test_each_option_default_is_its_fields_default(table: Table) -> None:
    all_fields = fields(table)
    wrong = {}
    for opt in table.options:
        f = all_fields[opt.target]
        if f.default is not dataclasses.MISSING:
            expected = f.default
        elif f.default_factory is not dataclasses.MISSING:
            expected = f.default_factory()
            if expected != f.default_factory():
                continue  # a fresh value per run (the worker id): the next test
        else:
            continue
        default = opt.convert(opt.default) if opt.convert else opt.default
        if default != expected:
            wrong[opt.flag] = (default, expected)
    assert wrong == {}


def test_consumer_settings_built_from_no_flags_are_the_defaults(monkeypatch: Any) -> None:
    for opt in CONSUMER_OPTIONS:
        monkeypatch.delenv(opt.env, raising=False)
    built = settings_from_args(build_parser().parse_args([]))
    defaults = ConsumerSettings(worker_id=built.worker_id)
    assert dataclasses.replace(built, common=defaults.common) == defaults
    assert (built.fetch.concurrency, built.fetch.limit_per_host) == (0, 0)


def test_the_settings_know_which_options_were_given(monkeypatch: Any) -> None:
    """By flag (a store, a repeatable, a --no- switch) or env variable (not empty): given;
    a default is not. Each parse starts from the parser's own: nothing leaks between."""
    for opt in (*COMMON_OPTIONS, *CONSUMER_OPTIONS):
        monkeypatch.delenv(opt.env, raising=False)
    monkeypatch.setenv("CRAWLQ_PER_HOST_DELAY", "3s")
    monkeypatch.setenv("CRAWLQ_MAX_DEPTH", "")  # empty: as if unset
    parser = build_parser()
    built = settings_from_args(parser.parse_args([
        "--max-stalls", "2", "--allow-domains", "a.example", "--no-ignore-robots"]))
    assert built.common.given == {"--per-host-delay", "--max-stalls", "--allow-domains",
                                  "--ignore-robots"}
    assert built.max_stalls == ConsumerSettings().max_stalls  # given, at its default
    assert settings_from_args(parser.parse_args([])).common.given == {"--per-host-delay"}
    assert CommonSettings().given == frozenset()
    monkeypatch.setenv("CRAWLQ_RECRAWL_AFTER", "1h")
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    assert ProducerSettings.from_args(producer_parser().parse_args(
        ["a.txt", "--max-attempts", "3"])).common.given == {
        "--redis-url", "--recrawl-after", "--max-attempts"}


def test_redis_wait_zero_is_the_modes_default(monkeypatch: Any) -> None:
    for opt in CONSUMER_OPTIONS:
        monkeypatch.delenv(opt.env, raising=False)

    def limit(*args: str) -> float:
        return settings_from_args(build_parser().parse_args(list(args))).redis_wait_limit_s

    assert (limit(), limit("--exit-when-empty")) == (900.0, 30.0)
    assert limit("--exit-when-empty", "--redis-wait", "2s") == limit("--redis-wait", "2s") == 2
    monkeypatch.setenv("CRAWLQ_REDIS_WAIT", "1h")
    assert limit("--exit-when-empty") == 3600


def test_crawl_policy_flags_take_the_policys_syntax(monkeypatch: Any) -> None:
    """A crawl policy value is written the same as a flag, in its env variable and in
    ``crawlq crawl set``: comma-separated domains, a user agent with a product token."""
    for opt in CONSUMER_OPTIONS:
        monkeypatch.delenv(opt.env, raising=False)
    built = settings_from_args(build_parser().parse_args([
        "--allow-domains", "a.example,B.example", "--allow-domains", "c.example,a.example",
        "--user-agent", " bot/1 (+https://example.com) "]))
    assert built.allow_domains == ("a.example", "b.example", "c.example")
    assert built.fetch.user_agent == "bot/1 (+https://example.com)"
    monkeypatch.setenv("CRAWLQ_ALLOW_DOMAINS", "@parent")
    assert settings_from_args(build_parser().parse_args([])).allow_domains == ()
    with pytest.raises(ConfigError, match=r"--user-agent: user agent '/1\.0' has no product"):
        build_parser().parse_args(["--user-agent", "/1.0"])
    monkeypatch.setenv("CRAWLQ_USER_AGENT", "bot/1\tx")
    with pytest.raises(ConfigError, match="CRAWLQ_USER_AGENT: must be 1-512 printable"):
        build_parser()


def test_retry_flags_take_the_policys_rules(monkeypatch: Any) -> None:
    """--retry-base, --retry-cap, --max-retry-after and --max-stalls seed the crawl's policy:
    whole milliseconds (a fraction cut off, as the flags always took them), a base > 0, a
    cap >= the base; broken in a flag or its env variable, the line names it."""
    for opt in CONSUMER_OPTIONS:
        monkeypatch.delenv(opt.env, raising=False)
    built = settings_from_args(build_parser().parse_args([
        "--retry-base", "1.0019s", "--retry-cap", "1.005s", "--max-retry-after", "0",
        "--max-stalls", "0"]))
    assert (built.retry_base_s, built.retry_cap_s, built.max_retry_after_s,
            built.max_stalls) == (1.001, 1.005, 0.0, 0)
    with pytest.raises(ConfigError, match=r"^--retry-base: must be > 0, got 0$"):
        build_parser().parse_args(["--retry-base", "0.9ms"])
    for args, shown in ((["--retry-cap", "1s"], r"--retry-cap \(1s\) must be >= --retry-base "
                                                r"\(2s\)"),
                        (["--max-stalls", "-1"], "--max-stalls: must be a whole number >= 0")):
        with pytest.raises(ConfigError, match=shown):
            settings_from_args(build_parser().parse_args(args))
    monkeypatch.setenv("CRAWLQ_RETRY_BASE", "0s")
    with pytest.raises(ConfigError, match=r"^CRAWLQ_RETRY_BASE: must be > 0, got 0$"):
        build_parser()


def test_robots_ttl_takes_the_policys_rule(monkeypatch: Any) -> None:
    """--robots-ttl seeds the crawl's robots_ttl: to the millisecond, > 0."""
    for opt in CONSUMER_OPTIONS:
        monkeypatch.delenv(opt.env, raising=False)
    built = settings_from_args(build_parser().parse_args(["--robots-ttl", "1.0004s"]))
    assert built.robots_ttl_s == 1.0
    with pytest.raises(ConfigError, match=r"^--robots-ttl: must be > 0, got 0$"):
        build_parser().parse_args(["--robots-ttl", "0.2ms"])
    monkeypatch.setenv("CRAWLQ_ROBOTS_TTL", "0")
    with pytest.raises(ConfigError, match=r"^CRAWLQ_ROBOTS_TTL: must be > 0, got 0$"):
        build_parser()


def test_producer_settings_built_from_one_file_are_the_defaults(monkeypatch: Any) -> None:
    for opt in PRODUCER_OPTIONS:
        monkeypatch.delenv(opt.env, raising=False)
    built = ProducerSettings.from_args(producer_parser().parse_args(["seeds.txt"]))
    assert built == ProducerSettings(common=built.common, inputs=("seeds.txt",))


def test_producer_flags_reach_their_fields() -> None:
    built = ProducerSettings.from_args(producer_parser().parse_args([
        "a.txt", "--input", "b.txt", "--priority", "2", "--meta", "k=v",
        "--header", "Accept-Language: de", "--depth", "1", "--dedup", "exact",
        "--recrawl-after", "1.2s", "--enqueue-batch", "7", "--every", "1h"]))
    assert built.inputs == ("b.txt", "a.txt")
    assert built.template == TaskTemplate(priority=2, meta={"k": "v"}, depth=1,
                                          headers={"Accept-Language": "de"})
    assert (built.recrawl_after_s, built.batch_size, built.every_s) == (2, 7, 3600.0)
    assert built.dedup is not None and built.dedup.value == "exact"
