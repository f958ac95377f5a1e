"""Options shared by every command: each has a CLI flag and a ``CRAWLQ_*`` env variable.

An option is declared once (:class:`Option`); :func:`add_options` turns declarations
into argparse arguments whose defaults come from the environment, so the precedence
is flag > environment > default. Settings are built once in ``main()`` and passed down:
nothing deeper reads ``os.environ``.

Which options the user gave (a flag, or its env variable set and not empty) is kept
apart from their values: ``CommonSettings.given`` holds their flags, so a command can
tell a value asked for from a default (the crawl policy's ``crawl_policy_differs``).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from common.errors import ConfigError
from common.names import CRAWL_NAME_RULE, validate_crawl_name
from common.redis.url import check_redis_url
from common.urls.redact import redact_url

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$", re.IGNORECASE)
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]i?b?|b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "ki": 1024, "kib": 1024,
               "m": 10**6, "mb": 10**6, "mi": 2**20, "mib": 2**20,
               "g": 10**9, "gb": 10**9, "gi": 2**30, "gib": 2**30}


def duration(text: str) -> float:
    """Seconds from ``1.5``, ``500ms``, ``30s``, ``5m``, ``2h``, ``7d``, ``1w``."""
    m = _DURATION.match(str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (try 30s, 5m, 2h, 7d)")
    return float(m.group(1)) * _DURATION_UNITS[(m.group(2) or "s").lower()]


def size(text: str) -> int:
    """Bytes from ``1048576``, ``10MiB``, ``512k``, ``1GB``."""
    m = _SIZE.match(str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 10MiB, 512KiB)")
    return int(float(m.group(1)) * _SIZE_UNITS[(m.group(2) or "").lower()])


def boolean(text: str) -> bool:
    value = str(text).strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off", ""}:
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {text!r} (use true or false)")


@dataclass(frozen=True, slots=True)
class Option:
    """One setting: ``--flag`` on the command line, ``env`` in the environment."""

    flag: str
    env: str
    default: Any
    help: str
    type: Callable[[str], Any] = str
    choices: Sequence[Any] | None = None
    flag_only_bool: bool = False  # a switch: --flag sets True
    append: bool = False  # repeatable flag; env holds a list split on env_separator
    env_separator: str = ","  # "\n" for values that may hold commas (headers)
    secret: bool = False  # never printed in --help defaults
    # A rule on the (converted) value, raising ConfigError; broken by a flag or by the
    # env variable, it is reported as one line, without argparse's usage text.
    check: Callable[[Any], Any] | None = None
    # Where the value goes in the command's settings: an attribute ("" = the flag's
    # dest), "group.attribute" for a nested settings object; `convert` shapes it.
    field: str = ""
    convert: Callable[[Any], Any] | None = None

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def target(self) -> str:
        """The settings attribute this option fills."""
        return self.field or self.dest


#: The parsed namespace's attribute holding the flags given (see `given_flags`).
GIVEN = "given_flags"


def given_flags(args: argparse.Namespace) -> frozenset[str]:
    """The flags (``--per-host-delay``) of the options given on the command line or by
    their env variable; every other option has its default."""
    return frozenset(getattr(args, GIVEN, ()))


def _mark_given(namespace: argparse.Namespace, flag: str) -> None:
    setattr(namespace, GIVEN, given_flags(namespace) | {flag})


def option_values(options: Sequence[Option], args: argparse.Namespace) -> dict[str, Any]:
    """The settings values of parsed options, keyed by their target attribute; the ones of
    a nested settings object ("group.attribute") under ``values[group]``."""
    values: dict[str, Any] = {}
    for opt in options:
        value = getattr(args, opt.dest)
        if opt.convert is not None:
            value = opt.convert(value)
        group, _, name = opt.target.rpartition(".")
        (values.setdefault(group, {}) if group else values)[name] = value
    return values


def defaults(options: Sequence[Option]) -> dict[str, Any]:
    """Each option's default as its settings field holds it (converted), keyed by its
    target attribute: what a settings dataclass takes its field defaults from."""
    return {opt.target: opt.convert(opt.default) if opt.convert else opt.default
            for opt in options}


def add_options(parser: argparse.ArgumentParser, options: Sequence[Option],
                env: Mapping[str, str] | None = None) -> None:
    """Add options to a parser, with defaults read from ``env`` (default os.environ).

    Each option given (its flag, or its env variable) is recorded: see `given_flags`."""
    env = os.environ if env is None else env
    from_env: set[str] = set()
    for opt in options:
        raw = env.get(opt.env)
        default = opt.default
        if raw is not None and raw != "":
            from_env.add(opt.flag)
            try:
                if opt.append:
                    default = [opt.type(x.strip()) for x in raw.split(opt.env_separator)
                               if x.strip()]
                elif opt.flag_only_bool:
                    default = boolean(raw)
                else:
                    default = opt.type(raw)
            except (argparse.ArgumentTypeError, ValueError) as exc:
                raise ConfigError(f"{opt.env}={raw!r} is invalid: {exc}") from None
            if opt.choices is not None and not opt.append and default not in opt.choices:
                raise ConfigError(f"{opt.env}={raw!r} is invalid: choose from "
                                  f"{', '.join(map(str, opt.choices))}")
            if opt.check is not None:
                try:
                    opt.check(default)
                except ConfigError as exc:
                    raise ConfigError(f"{opt.env}: {exc}") from None
        shown = "***" if opt.secret else default
        help_text = f"{opt.help} (env {opt.env}; default {shown})"
        if opt.flag_only_bool:
            parser.add_argument(opt.flag, dest=opt.dest, action=_Switch,
                                default=default, help=help_text)
        elif opt.append:
            parser.add_argument(opt.flag, dest=opt.dest, action=_Append, type=opt.type,
                                default=None, help=help_text)
            parser.set_defaults(**{f"{opt.dest}": list(default or [])})
        else:
            parser.add_argument(opt.flag, dest=opt.dest, type=opt.type, default=default,
                                choices=opt.choices, help=help_text, action=_Store,
                                check=opt.check)
    # Frozen: a parser's defaults are shared by every parse; actions add to a copy.
    parser.set_defaults(**{GIVEN: frozenset(parser.get_default(GIVEN) or ()) | from_env})


class _Store(argparse.Action):
    """Stores a flag's value once ``check`` (if any) accepts it; marks the flag given.

    argparse turns a ValueError of a ``type`` into a usage error, so the check runs
    here, where its ConfigError leaves ``parse_args`` as it is.
    """

    def __init__(self, *args: Any, check: Callable[[Any], Any] | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.check = check

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        if self.check is not None:
            try:
                self.check(values)
            except ConfigError as exc:
                raise ConfigError(f"{option_string}: {exc}") from None
        setattr(namespace, self.dest, values)
        _mark_given(namespace, self.option_strings[0])


class _Append(argparse.Action):
    """A repeatable flag: each value is added to the list (the env variable's first)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest, None) or ()), values])
        _mark_given(namespace, self.option_strings[0])


class _Switch(argparse.BooleanOptionalAction):
    """``--flag`` / ``--no-flag``; either marks the flag given."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        super().__call__(parser, namespace, values, option_string)
        _mark_given(namespace, self.option_strings[0])


REDIS_URL = Option("--redis-url", "REDIS_URL", "redis://localhost:6379/0",
                   "Redis URL: redis://, rediss:// (TLS), with user:password for an ACL "
                   "user; redis+sentinel://host:port[,host:port...]/<master name>[/<db>] "
                   "(rediss+sentinel:// for TLS) for a primary its Sentinels name",
                   secret=True, check=check_redis_url)
#: Options some commands share, declared here once (a command may point `field` elsewhere).
JSON = Option("--json", "CRAWLQ_JSON", False, "print one JSON document on stdout",
              flag_only_bool=True)
ALLOW_PRIVATE = Option("--allow-private", "CRAWLQ_ALLOW_PRIVATE", False,
                       "turn the SSRF guard off: let fetches (the producer's: of sitemaps) "
                       "reach loopback, private and link-local addresses", flag_only_bool=True)

#: A new crawl's policy values on the command line: the producer's and ``crawlq run``'s.
POLICY_SET = Option("--set", "CRAWLQ_SET", [], "a new crawl's policy value KEY=VALUE, as "
                    "`crawlq crawl set` takes it, repeatable (e.g. per_host_delay=0 for a "
                    "local site); a crawl with a policy keeps its own", append=True,
                    field="policy", convert=tuple)

#: One variable for the producer and the consumers: the spider the whole crawl runs.
SPIDER = Option("--spider", "CRAWLQ_SPIDER", "", "the crawl's spider (common.spider): "
                "module:obj, path/to/spider.py:obj or path/to/spider.py (its one Spider); "
                "the producer enqueues its start requests, a consumer parses each response "
                "with the route of its task's label; a label with no route is refused")

#: Each command's wait when --redis-wait is 0 (the consumer's: consumer/config.py).
PRODUCER_REDIS_WAIT_S = 30.0
CLI_REDIS_WAIT_S = 10.0
REDIS_WAIT = Option(
    "--redis-wait", "CRAWLQ_REDIS_WAIT", 0.0, "at start-up, how long Redis may go "
    "unanswered (each step: connect, the crawl, its policy, the scripts, ...) before the "
    "command gives up and exits 3 (0 = the command's default: a consumer 15m as a "
    "service, 30s with --exit-when-empty, so a batch job on a wrong URL fails instead of "
    f"hanging; the producer {PRODUCER_REDIS_WAIT_S:g}s; crawlq {CLI_REDIS_WAIT_S:g}s)",
    type=duration, check=lambda s: _at_least(s, 0, "seconds"), field="redis_wait_s")

COMMON_OPTIONS = (
    REDIS_URL,
    Option("--cluster", "CRAWLQ_CLUSTER", "auto", "Redis Cluster mode: auto asks the "
           "server", choices=("auto", "yes", "no")),
    Option("--crawl", "CRAWLQ_CRAWL", "default", "crawl name: the queue to work on; "
           f"{CRAWL_NAME_RULE}", check=validate_crawl_name),
    Option("--log-level", "CRAWLQ_LOG_LEVEL", "INFO", "log level",
           choices=("DEBUG", "INFO", "WARNING", "ERROR")),
    Option("--log-format", "CRAWLQ_LOG_FORMAT", "text", "log format",
           choices=("text", "json")),
    Option("--redis-wait-replicas", "CRAWLQ_REDIS_WAIT_REPLICAS", 0,
           "after each call that changes the queue, WAIT until this many replicas have "
           "it (0: don't wait); a promotion then loses no write they acknowledged, at "
           "the cost of a replication round trip per call (docs/failover.md)",
           type=int, check=lambda n: _at_least(n, 0, "replicas"), field="wait_replicas"),
    Option("--redis-wait-timeout", "CRAWLQ_REDIS_WAIT_TIMEOUT", 1.0,
           "how long such a WAIT may take; fewer replicas by then is logged, and the call "
           "stands", type=duration, check=lambda s: _at_least(s, 0.001, "seconds"),
           field="wait_timeout_s"),
    REDIS_WAIT,
)


def _at_least(value: float, least: float, what: str) -> None:
    if value < least:
        raise ConfigError(f"{value:g} {what}: must be at least {least:g}")


_COMMON = defaults(COMMON_OPTIONS)


@dataclass(frozen=True, slots=True)
class CommonSettings:
    """The settings every command shares (defaults: `COMMON_OPTIONS`')."""

    redis_url: str = _COMMON["redis_url"]
    crawl: str = _COMMON["crawl"]
    log_level: str = _COMMON["log_level"]
    log_format: str = _COMMON["log_format"]
    cluster: str = _COMMON["cluster"]
    wait_replicas: int = _COMMON["wait_replicas"]
    wait_timeout_s: float = _COMMON["wait_timeout_s"]
    redis_wait_s: float = _COMMON["redis_wait_s"]  # 0: the command's own default
    # The flags of the command's options the user gave (flag or env variable): a value
    # asked for, not a default (`given_flags`). Empty when not built from a command line.
    given: frozenset[str] = frozenset()

    def redis_wait_limit(self, default_s: float) -> float:
        """How long Redis may go unanswered at start-up: --redis-wait, or `default_s`."""
        return self.redis_wait_s or default_s

    @property
    def cluster_mode(self) -> bool | None:
        """True/False when set, None to ask the server."""
        return {"yes": True, "no": False}.get(self.cluster)

    def __repr__(self) -> str:
        return (f"CommonSettings(redis_url={redact_url(self.redis_url)!r}, "
                f"crawl={self.crawl!r}, log_level={self.log_level!r}, "
                f"log_format={self.log_format!r}, cluster={self.cluster!r})")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> CommonSettings:
        return cls(args.redis_url, args.crawl, args.log_level, args.log_format,
                   getattr(args, "cluster", _COMMON["cluster"]),
                   getattr(args, "redis_wait_replicas", _COMMON["wait_replicas"]),
                   getattr(args, "redis_wait_timeout", _COMMON["wait_timeout_s"]),
                   getattr(args, "redis_wait", _COMMON["redis_wait_s"]),
                   given_flags(args))
