"""One declaration per option: the consumer's settings are built from its option table,
and every settings field is filled by exactly one option whose default is the field's."""

from __future__ import annotations

import dataclasses
from typing import Any

from common.http.fetcher import FetchSettings
from consumer.config import CONSUMER_OPTIONS, ConsumerSettings, build_parser, settings_from_args

# Filled from other settings, not from an option of their own; or fixed (the README's
# "more than 5 redirects").
DERIVED = {"common", "fetch", "fetch.concurrency", "fetch.limit_per_host",
           "fetch.max_redirects"}


def fields() -> dict[str, dataclasses.Field[Any]]:
    out = {f.name: f for f in dataclasses.fields(ConsumerSettings)}
    out.update({f"fetch.{f.name}": f for f in dataclasses.fields(FetchSettings)})
    return out


def test_every_field_has_exactly_one_option() -> None:
    targets = [opt.target for opt in CONSUMER_OPTIONS]
    assert sorted(t for t in set(targets) if targets.count(t) > 1) == []
    assert sorted(set(targets) - set(fields())) == [], "options filling no settings field"
    assert sorted(set(fields()) - set(targets) - DERIVED) == [], "fields no option fills"


def test_each_option_default_is_its_fields_default() -> None:
    all_fields = fields()
    wrong = {}
    for opt in CONSUMER_OPTIONS:
        f = all_fields[opt.target]
        if f.default is dataclasses.MISSING:
            continue  # a factory (the worker id): checked by the next test
        default = opt.convert(opt.default) if opt.convert else opt.default
        if default != f.default:
            wrong[opt.flag] = (default, f.default)
    assert wrong == {}


def test_settings_built_from_no_flags_are_the_defaults(monkeypatch: Any) -> None:
    for opt in CONSUMER_OPTIONS:
        monkeypatch.delenv(opt.env, raising=False)
    built = settings_from_args(build_parser().parse_args([]))
    defaults = ConsumerSettings(worker_id=built.worker_id)
    assert dataclasses.replace(built, common=defaults.common) == dataclasses.replace(
        defaults, fetch=dataclasses.replace(defaults.fetch, concurrency=built.concurrency,
                                            limit_per_host=built.per_host_concurrency))
