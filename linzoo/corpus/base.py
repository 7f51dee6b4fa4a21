"""What every corpus shares: the splits and their held-out rule, the column features, the build cache, and the
shape of a long-corpus source."""

from __future__ import annotations

import hashlib
import math
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import datasets
from filelock import FileLock

from ..registry_files import archive_members, cache_dir

SPLITS = ("train", "test")
TEST_FRACTION, MIN_TEST = 0.02, 50
MESSAGES_FEATURES = datasets.Features(
    {"messages": [{"role": datasets.Value("string"), "content": datasets.Value("string")}]}
)
TEXT_FEATURES = datasets.Features({"text": datasets.Value("string")})


def held_out_mask(groups: list[str]) -> list[bool]:
    """Which rows are held out: the TEST_FRACTION of `groups` (at least MIN_TEST, at most a tenth) whose SHA-1 is
    smallest, equal groups on one side."""
    digests = [hashlib.sha1(g.encode("utf-8")).digest() for g in groups]
    n = len(digests)
    n_test = min(max(MIN_TEST, math.ceil(TEST_FRACTION * n)), n // 10)
    sizes = Counter(digests)
    chosen, total = set(), 0
    for d in sorted(sizes):
        if total >= n_test:
            break
        chosen.add(d)
        total += sizes[d]
    return [d in chosen for d in digests]


def cached_build(name: str, version: int, build: Callable[[Path], None]) -> Path:
    """The folder `cache_dir()/"data"/<name>-v<version>`, filled once by `build(folder)` (which saves a DatasetDict
    there): under a file lock, so concurrent processes build it once, and in a scratch folder renamed into place,
    so a build that died half-way is redone, never read. Bump `version` when a builder changes."""
    root = cache_dir() / "data"
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"{name}-v{version}"
    if not (target / "dataset_dict.json").exists():
        with FileLock(str(target) + ".lock"):
            if not (target / "dataset_dict.json").exists():
                tmp = root / f".{target.name}.building"
                shutil.rmtree(tmp, ignore_errors=True)  # a build that died half-way
                build(tmp)
                tmp.rename(target)
    return target


@dataclass(frozen=True)
class LongSource:
    """One source of the long corpus. `docs()` returns (origin, [(text, held_out)]): `origin` names the
    package (and version) actually read; `held_out` is True/False where the source inherits the embedded
    split, None where the long corpus's own content-hash rule decides."""

    name: str
    registry: str  # where it comes from, for the error when it cannot be fetched
    docs: Callable[[], tuple[str, list[tuple[str, bool | None]]]]


def utf8(body: bytes) -> str:
    return body.decode("utf-8", "replace")


def archive_docs(origin: str, archive: Path, pattern: str, decode: Callable[[bytes], str] = utf8):
    """A `LongSource.docs()` result whose documents are the members of `archive` matching `pattern`, decoded."""
    return origin, [(decode(body), None) for _, body in archive_members(archive, pattern)]
