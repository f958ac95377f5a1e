"""SimHash content fingerprints (Charikar 2002; Manku, Jain, Das Sarma 2007): pages
whose text is nearly the same get 64-bit fingerprints a few bits apart.

A page's features are the distinct words of its text (lowercased, scripts and styles
left out), each hashed to 64 bits (BLAKE2b: the same in every process, so the fleet
shares fingerprints); bit i of the fingerprint is set when more than half of the words
have bit i set. Two pages whose word sets have a cosine similarity c differ in each bit
with probability arccos(c) / pi, so a distance of at most 3 of 64 bits asks c >= ~0.99:
the same template and text but for a word or two in a hundred (a calendar's month, a
soft 404's path, a session id in the text), while two real pages of one template differ
by a paragraph, ten or more bits (300 pages of Python's documentation: 10 at the
least). Words, not word pairs: a page has ~5x fewer distinct ones to hash, and pairs
were not better apart on those pages (14 bits at the least).

No maintained SimHash package fits: PyPI's (``simhash``, ``simhash-py``, ``pysimhash``,
``floc-simhash``) are unmaintained or young, and loop over 64 bits per feature in Python
(~4 us a feature). This counts each bit over all features at once: the features' hashes
one byte column at a time in one integer, masked per bit and counted with
``int.bit_count`` (64 big-integer operations a page).
"""

from __future__ import annotations

import re
from hashlib import blake2b

from selectolax.lexbor import LexborHTMLParser

__all__ = ["MAX_TEXT", "MIN_WORDS", "distance", "fingerprint", "page_text"]

#: Characters of a page's text fingerprinted (the rest is left out): bounds the work of a
#: huge page; two pages that share their first 32 K characters are near-duplicates.
MAX_TEXT = 32768
#: Distinct words a text needs for a fingerprint: fewer (a page of links only, a
#: redirect's stub, a test page) can't tell one page from another, so no page is judged
#: a near duplicate by them.
MIN_WORDS = 16
_WORD = re.compile(r"\w+")
_BITS = [bytes([1 << bit]) for bit in range(8)]
_IGNORED = ["script", "style", "noscript", "template"]


def page_text(body: bytes) -> str:
    """The visible text of an HTML page (scripts, styles and templates left out)."""
    tree = LexborHTMLParser(body, encoding=True)
    tree.strip_tags(_IGNORED)
    root = tree.body or tree.root
    return "" if root is None else root.text(separator=" ")


def fingerprint(text: str) -> int | None:
    """The 64-bit SimHash of the distinct words of `text`'s first `MAX_TEXT`
    characters; None for fewer than `MIN_WORDS` of them."""
    words = set(_WORD.findall(text[:MAX_TEXT].lower()))
    n = len(words)
    if n < MIN_WORDS:
        return None
    hashes = b"".join(blake2b(w.encode(), digest_size=8).digest() for w in words)
    out = 0
    for byte in range(8):  # the byte-th byte of every hash, then each of its bits
        column = int.from_bytes(hashes[byte::8], "little")
        for bit in range(8):
            if (column & _ones(bit, n)).bit_count() * 2 > n:
                out |= 1 << (8 * byte + bit)
    return out


def _ones(bit: int, n: int) -> int:
    """`n` bytes, each with only `bit` set, as an integer."""
    return int.from_bytes(_BITS[bit] * n, "little")


def distance(a: int, b: int) -> int:
    """The Hamming distance of two fingerprints."""
    return (a ^ b).bit_count()
