"""Bundles: a built corpus as xz-compressed JSON lines, so it travels to a machine without the registries.

A bundle is a folder of part-000.jsonl.xz, part-001.jsonl.xz, ... (one JSON object a line, each part at most
`max_part_bytes`) beside a manifest.json that lists every part's sha256 and size (`linzoo.corpus.long` writes and
reads the long corpus's). Each part is a sequence of independent xz streams of ~`block_chars` characters, so its size
is known as it is written.
"""

from __future__ import annotations

import hashlib
import json
import lzma
from pathlib import Path
from typing import Iterable, Iterator

BUNDLE_SCHEMA = "linzoo.corpus-bundle/v1"
BUNDLE_PART_BYTES = 50_000_000


def write_parts(rows: Iterable[dict], out: Path, max_part_bytes: int = BUNDLE_PART_BYTES,
                block_chars: int = 16_000_000) -> list[dict]:
    """Write `rows` in order as JSON lines into `out`/part-NNN.jsonl.xz; each part's file, bytes, docs and sha256."""
    parts, part, size, block, block_len = [], None, 0, [], 0

    def close_part():
        nonlocal part
        if part is not None:
            part["handle"].close()
            path = out / part["file"]
            parts.append({"file": part["file"], "bytes": path.stat().st_size, "docs": part["docs"],
                          "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
            part = None

    def flush():
        nonlocal part, size, block, block_len
        if not block:
            return
        data = lzma.compress("".join(block).encode("utf-8"), preset=9)
        if part is not None and size + len(data) > max_part_bytes:
            close_part()
        if part is None:
            name = f"part-{len(parts):03d}.jsonl.xz"
            part, size = {"file": name, "handle": open(out / name, "wb"), "docs": 0}, 0
        if len(data) > max_part_bytes:
            raise ValueError(f"one {block_chars:,}-character block compresses to {len(data):,} bytes, over "
                             f"max_part_bytes={max_part_bytes:,}: use a smaller block_chars")
        part["handle"].write(data)
        part["docs"] += len(block)
        size += len(data)
        block, block_len = [], 0

    for row in rows:
        line = json.dumps(row, ensure_ascii=False)
        block.append(line + "\n")
        block_len += len(line) + 1
        if block_len >= block_chars:
            flush()
    flush()
    close_part()
    return parts


def read_parts(where: Path, parts: list[dict], what: str) -> Iterator[dict]:
    """The rows of the `parts` a manifest in `where` lists, in order, each part checked against its sha256 first."""
    for part in parts:
        path = where / part["file"]
        if not path.is_file():
            raise FileNotFoundError(f"{what} bundle part {path} is missing (the manifest lists "
                                    f"{len(parts)} parts): carry every part-*.jsonl.xz")
        if hashlib.sha256(path.read_bytes()).hexdigest() != part["sha256"]:
            raise ValueError(f"{what} bundle part {path} does not match its sha256 in the manifest: copy it again")
        with lzma.open(path, "rt", encoding="utf-8") as fh:
            for line in fh:
                yield json.loads(line)
