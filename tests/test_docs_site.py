"""The README and the docs site: the README opens with the two commands CI and a fresh
machine run, every page of docs/ is in mkdocs.yml's nav (a page left out is built but
reached by no menu), the README's relative links reach files that exist (mkdocs
checks the links between pages, not the README's), and the development page's map of
the code names every package."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from support.docs import DOCS, README, ROOT, page

#: The README's first two commands: the demo, then the test command (.ci/run runs it).
FIRST_COMMANDS = ["pip install -e '.[embedded]' && crawlq demo",
                  "pip install -e '.[dev,embedded]' && python -m pytest -q"]
_LINK = re.compile(r"\]\(([^)\s]+)\)")


class _MkdocsLoader(yaml.SafeLoader):
    """mkdocs.yml's own tags (``!relative``, ``!ENV``) read as plain values."""


_MkdocsLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def _nav_pages(nav: Any) -> list[str]:
    """Every page a nav (a list of ``{title: page or [sub-nav]}`` or pages) names."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for item in nav for page in _nav_pages(item)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    return []


def test_the_readme_starts_with_the_demo_and_the_test_command() -> None:
    text = README.read_text(encoding="utf-8")
    first = re.search(r"^```(\w*)\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
    assert first, "the README has no code block"
    assert first[1] == "bash"
    lines = first[2].splitlines()
    assert [line.split("  #", 1)[0].rstrip() for line in lines] == FIRST_COMMANDS


def test_every_docs_page_is_in_the_nav() -> None:
    config = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=_MkdocsLoader)
    assert config["docs_dir"] == "docs"
    nav = _nav_pages(config["nav"])
    pages = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert len(pages) > 5
    assert sorted(set(nav)) == pages
    assert len(nav) == len(set(nav)), "a page in the nav twice"


def test_the_readme_links_reach_files_and_every_page() -> None:
    text = README.read_text(encoding="utf-8")
    local = [link for link in _LINK.findall(text) if "://" not in link]
    missing = [link for link in local
               if not (ROOT / link.split("#", 1)[0]).is_file()]
    assert missing == []
    linked = {Path(link.split("#", 1)[0]).as_posix() for link in local}
    assert sorted(f"docs/{p.name}" for p in DOCS.glob("*.md")
                  if f"docs/{p.name}" not in linked) == []


def test_the_layout_map_names_every_package_and_each_module_atop_common() -> None:
    """docs/development.md's Layout: a line for each package, and `common/`'s few
    top-level modules each in the table that says why it stays there."""
    text = page("development.md")
    layout = text[text.index("## Layout"):text.index("## Commits")]
    named = set(re.findall(r"`([\w./-]+)`", layout))
    packages = {f"{init.parent.relative_to(ROOT).as_posix()}/"
                for top in ("common", "producer", "consumer", "console", "crawlq")
                for init in (ROOT / top).rglob("__init__.py")}
    assert {"common/", "common/queue/", "consumer/sinks/"} <= packages
    assert sorted(packages - named) == []
    modules = {p.name for p in (ROOT / "common").glob("*.py") if p.name != "__init__.py"}
    assert {"errors.py", "keys.py"} <= modules
    assert sorted(modules - named) == []
