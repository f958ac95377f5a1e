"""The crawl policy's options as command flags, derived from `POLICY_OPTIONS`.

A policy option is declared once, as a row of the policy's table. The command named by
its ``seeded_by`` gets its flag from `policy_flag`: the row's flag, parser, rule,
default and help, ``CRAWLQ_<NAME>`` as its environment variable, and a note that the
value only seeds the crawl's policy. The command says no more than where the value goes
in its settings.
"""

from __future__ import annotations

from typing import Any

from common.config import Option
from common.policy.options import OPTIONS, PolicyOption


def env_of(option: PolicyOption) -> str:
    """The environment variable of a policy option's flag: ``CRAWLQ_<NAME>``."""
    return f"CRAWLQ_{option.name.upper()}"


def _note(command: str) -> str:
    return (f"a crawl policy value: used only when this {command.removeprefix('crawlq-')} "
            "creates the crawl's policy, else the crawl's holds (a WARNING if they differ; "
            "change it with crawlq crawl set)")


def policy_flag(name: str, command: str, *, field: str = "", repeatable: bool = False
                ) -> Option:
    """The flag of policy option `name` for `command`, its ``seeded_by``; `field` is
    where its value goes in the command's settings (`Option.field`). A `repeatable`
    flag takes its value's comma-separated items, each time adding to the list."""
    opt = OPTIONS[name]
    if opt.seeded_by != command or not opt.flag:
        raise ValueError(f"policy option {name} has no flag of {command}'s")
    help_text = f"{opt.help}{'; repeatable' if repeatable else ''}; {_note(command)}"
    help_text = help_text.replace("%", "%%")  # argparse formats help with %
    if repeatable:
        return Option(opt.flag, env_of(opt), [], help_text, append=True, field=field,
                      convert=lambda texts: _items(opt, texts))
    if isinstance(opt.default, bool):
        return Option(opt.flag, env_of(opt), opt.default, help_text, flag_only_bool=True,
                      field=field)
    return Option(opt.flag, env_of(opt), opt.default, help_text, type=opt.parse,
                  check=opt.check, field=field)


def _items(opt: PolicyOption, texts: list[str]) -> Any:
    """Every text's parsed items, repeats dropped, in order (the option's rule checked)."""
    value = tuple(dict.fromkeys(item for text in texts for item in opt.parse(text)))
    opt.check(value)
    return value
