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
from collections.abc import Collection, Iterable
from hashlib import blake2b

from selectolax.lexbor import LexborHTMLParser

__all__ = ["MAX_TEXT", "MIN_WORDS", "distance", "exact_set", "exact_text", "fingerprint",
           "page_text",
           "set_fingerprint", "word_hashes"]

#: Characters of a page's text fingerprinted (the rest is left out): bounds the work of a
#: huge page; two pages that share their first 32 K characters are near-duplicates.
MAX_TEXT = 32768
#: Distinct words a text needs for a fingerprint: fewer (a page of links only, a
#: redirect's stub, a test page) can't tell one page from another, so no page is judged
#: a near duplicate by them.
MIN_WORDS = 16
#: Distinct words a text needs for an exact hash (`exact`): a page of a word or two
#: (a redirect's stub) is like any other.
EXACT_WORDS = 4
_WORD = re.compile(r"\w+")
_BITS = [bytes([1 << bit]) for bit in range(8)]
_IGNORED = ["script", "style", "noscript", "template"]
#: Each byte as itself, but the ASCII characters that are not word characters (not a
#: letter, a digit or ``_``) as a space: bytes from 0x80 are parts of other characters.
_ASCII_CUT = bytes(c if c >= 0x80 or c == ord("_") or chr(c).isalnum() else ord(" ")
                   for c in range(256))
#: Words whose hash is kept (~100 bytes each): a site's vocabulary, a few MB at most.
CACHED_WORDS = 1 << 15
_HASHED: dict[bytes, bytes] = {}


def page_text(page: bytes | LexborHTMLParser) -> str:
    """The visible text of an HTML page (scripts, styles and templates left out), from
    its body or its parsed tree (which loses its scripts, styles and templates: hand
    over one no one reads after, ``FetchResult.take_tree``)."""
    tree = LexborHTMLParser(page, encoding=True) if isinstance(page, bytes) else page
    tree.strip_tags(_IGNORED)
    root = tree.body or tree.root
    return "" if root is None else root.text(separator=" ")


def fingerprint(text: str) -> int | None:
    """The 64-bit SimHash of the distinct words of `text`'s first `MAX_TEXT`
    characters; None for fewer than `MIN_WORDS` of them."""
    words = _words(text[:MAX_TEXT].lower())
    if len(words) < MIN_WORDS:
        return None
    return _simhash(words)


def exact_text(text: str) -> int | None:
    """A 64-bit hash of the words of `text`'s first `MAX_TEXT` characters, lowercased, in
    order: the same for the same text only (whatever its spaces and punctuation); None
    for fewer than `EXACT_WORDS` distinct words."""
    words = text[:MAX_TEXT].lower().encode().translate(_ASCII_CUT).split()
    if len(set(words)) < EXACT_WORDS:
        return None
    return int.from_bytes(blake2b(b" ".join(words), digest_size=8).digest(), "little")


def exact_set(features: Iterable[str]) -> int:
    """A 64-bit hash of a set of features: the same for the same set only."""
    digest = blake2b(digest_size=8)
    for f in sorted(set(features)):
        digest.update(f.encode() + b"\x00")
    return int.from_bytes(digest.digest(), "little")


def set_fingerprint(features: Iterable[str]) -> int:
    """The 64-bit SimHash of a set of features (a page's links), however few: 0 for
    none."""
    return _simhash({f.encode() for f in features})


def _simhash(words: set[bytes]) -> int:
    n = len(words)
    if not n:
        return 0
    hashes = _hashes(words)
    masks = [_ones(bit, n) for bit in range(8)]
    out = 0
    for byte in range(8):  # the byte-th byte of every hash, then each of its bits
        column = int.from_bytes(hashes[byte::8], "little")
        for bit in range(8):
            if (column & masks[bit]).bit_count() * 2 > n:
                out |= 1 << (8 * byte + bit)
    return out


def word_hashes(text: str, leave_out: Collection[str] = ()) -> list[int]:
    """The 64-bit hashes of the distinct words of `text`'s first `MAX_TEXT` characters,
    lowercased, but those in `leave_out` (lowercase)."""
    words = _words(text[:MAX_TEXT].lower())
    words.difference_update(w.encode() for w in leave_out)
    hashes = _hashes(words)
    return [int.from_bytes(hashes[i:i + 8], "little") for i in range(0, len(hashes), 8)]


def _words(text: str) -> set[bytes]:
    """The distinct words (``\\w+``) of `text`, UTF-8 encoded. Most of a page is ASCII,
    whose word characters are letters, digits and ``_``: the text is cut at the other
    ASCII characters in bytes (~5x faster than the regex), and only the pieces that hold
    other characters go through the regex."""
    words = set(text.encode().translate(_ASCII_CUT).split())
    for piece in [w for w in words if not w.isascii()]:
        words.discard(piece)
        words.update(w.encode() for w in _WORD.findall(piece.decode()))
    return words


def _hashes(words: set[bytes]) -> bytes:
    """The 8-byte BLAKE2b of each word, concatenated; a site's pages share most of
    their words, so the hashes of the last `CACHED_WORDS` words are kept."""
    if len(_HASHED) > CACHED_WORDS:
        _HASHED.clear()
    out = []
    for word in words:
        h = _HASHED.get(word)
        if h is None:
            h = _HASHED[word] = blake2b(word, digest_size=8).digest()
        out.append(h)
    return b"".join(out)


def _ones(bit: int, n: int) -> int:
    """`n` bytes, each with only `bit` set, as an integer."""
    return int.from_bytes(_BITS[bit] * n, "little")


def distance(a: int, b: int) -> int:
    """The Hamming distance of two fingerprints."""
    return (a ^ b).bit_count()
