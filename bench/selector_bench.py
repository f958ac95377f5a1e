"""What a spider's selectors cost a page: parsel (lxml; the spider's ``response.css``)
next to selectolax (Lexbor; the consumer's link extraction), on the same pages, the same
extraction: every documented signature's id (``dt.sig``), its text, and the title.

    python3 bench/selector_bench.py [--pages 120] [--repeat 3] [--root DIR]

Pages are python3-doc's library reference (Debian's python3-doc, installed when missing).
Prints, per page: the parse alone, the parse with the queries, and the ratio; both
extract the same items, which the bench checks.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchlib import doc_root
from parsel import Selector
from selectolax.lexbor import LexborHTMLParser

Extract = Callable[[bytes], tuple[str, list[str]]]


def with_parsel(body: bytes) -> tuple[str, list[str]]:
    sel = Selector(text=body.decode("utf-8", errors="replace"), type="html")
    title = sel.css("h1::text").get() or ""
    return title, sel.css("dt.sig::attr(id)").getall()


def with_selectolax(body: bytes) -> tuple[str, list[str]]:
    tree = LexborHTMLParser(body)
    h1 = tree.css_first("h1")
    title = h1.text(deep=False) if h1 is not None else ""
    return title, [n.attributes.get("id") or "" for n in tree.css("dt.sig")
                   if n.attributes.get("id")]


def parse_parsel(body: bytes) -> tuple[str, list[str]]:
    Selector(text=body.decode("utf-8", errors="replace"), type="html")
    return "", []


def parse_selectolax(body: bytes) -> tuple[str, list[str]]:
    LexborHTMLParser(body)
    return "", []


def per_page_us(fn: Extract, bodies: list[bytes], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        for body in bodies:
            fn(body)
        best = min(best, time.process_time() - started)
    return best / len(bodies) * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pages", type=int, default=120)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--root", type=Path, default=None, help="an HTML tree (python3-doc's)")
    args = p.parse_args(argv)
    pages = sorted((doc_root(args.root) / "library").glob("*.html"))[:args.pages]
    bodies = [page.read_bytes() for page in pages]
    a = [with_parsel(b)[1] for b in bodies]
    b = [with_selectolax(b)[1] for b in bodies]
    assert a == b, "parsel and selectolax extracted different signatures"
    kb = sum(map(len, bodies)) / len(bodies) / 1024
    print(f"{len(bodies)} pages of {kb:.0f} KiB on average, {sum(map(len, a))} signatures")
    print(f"{'per page (CPU)':<22}{'parsel':>12}{'selectolax':>12}{'ratio':>8}")
    for what, slow, fast in (("parse", parse_parsel, parse_selectolax),
                             ("parse + extract", with_parsel, with_selectolax)):
        us_p, us_s = per_page_us(slow, bodies, args.repeat), per_page_us(fast, bodies,
                                                                          args.repeat)
        print(f"{what:<22}{us_p:>10.0f}us{us_s:>10.0f}us{us_p / us_s:>7.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
