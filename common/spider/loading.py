"""Finding a spider from the command line: ``module:obj``, ``path/to/spider.py:obj`` or
``path/to/spider.py`` (the one Spider defined in it)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from common.errors import ConfigError
from common.names import validate_crawl_name
from common.spider.spider import Spider

__all__ = ["crawl_of", "load_spider"]


def load_spider(spec: str, *, flag: str = "--spider") -> Spider:
    """The Spider `spec` names; ConfigError saying what is wrong otherwise."""
    where, _, attr = spec.partition(":")
    if where.endswith(".py") or "/" in where:
        module = _import_file(Path(where), spec, flag)
    elif not where:
        raise ConfigError(f"{flag} {spec!r} must be module:obj, path/to/spider.py:obj or "
                          "path/to/spider.py")
    else:
        if not attr:
            raise ConfigError(f"{flag} {spec!r}: name the spider (module:obj) or give a "
                              "file (path/to/spider.py)")
        try:
            module = importlib.import_module(where)
        except ImportError as exc:
            raise ConfigError(f"{flag} {spec!r}: cannot import {where!r}: {exc}") from None
    if attr:
        found = getattr(module, attr, None)
        if not isinstance(found, Spider):
            raise ConfigError(f"{flag} {spec!r}: {attr!r} in {where} is "
                              f"{'missing' if found is None else type(found).__name__}, "
                              "not a Spider")
        return found
    spiders = {name: value for name, value in vars(module).items()
               if isinstance(value, Spider)}
    if len(spiders) != 1:
        names = ", ".join(sorted(spiders)) or "none"
        raise ConfigError(f"{flag} {spec!r}: the file must define exactly one Spider to be "
                          f"named by its path alone (found: {names}); name it as "
                          f"{where}:obj")
    return next(iter(spiders.values()))


def _import_file(path: Path, spec: str, flag: str) -> ModuleType:
    """Import a spider file as a module of its own (again at each call: a producer on a
    schedule sees the file as it is now); its directory goes first on ``sys.path`` (as
    ``python path/to/spider.py`` would), so it can import its helpers."""
    path = path.resolve()
    if not path.is_file():
        raise ConfigError(f"{flag} {spec!r}: no such file {str(path)!r}")
    name = f"crawlq_spider_{path.stem}"  # loaded afresh each time: a run sees the file now
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"{flag} {spec!r}: {str(path)!r} is not a Python file")
    module = importlib.util.module_from_spec(module_spec)
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ConfigError(f"{flag} {spec!r}: importing {str(path)!r} failed: "
                          f"{type(exc).__name__}: {exc}") from None
    return module


def crawl_of(spider: Spider, crawl: str, *, given: bool) -> str:
    """The crawl a command given `spider` works on: `crawl` when ``--crawl`` was given
    (flag or ``CRAWLQ_CRAWL``), else the spider's name, so the producer and the consumers
    started with the same ``--spider`` meet on one crawl. ConfigError for a spider name
    that is no crawl name."""
    if given:
        return crawl
    try:
        validate_crawl_name(spider.name)
    except ConfigError as exc:
        raise ConfigError(f"the spider's name {spider.name!r} names its crawl but is no "
                          f"crawl name ({exc}): rename the spider or give --crawl") from None
    return spider.name
