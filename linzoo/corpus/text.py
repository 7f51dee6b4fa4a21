"""Text helpers every corpus shares: chat normalisation, Gutenberg stripping, chunking, NIAH cleaning."""

from __future__ import annotations

import json
import re

CHUNK_CHARS = 4000

_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "assistant": "assistant",
          "system": "system"}


def turn(message) -> tuple[str, str] | None:
    """A ShareGPT (`from`/`value`) or OpenAI (`role`/`content`) message as (role, content), or None unless it is a
    dict with a known role and non-empty string content."""
    if not isinstance(message, dict):
        return None
    role = _ROLES.get(str(message.get("role") or message.get("from") or "").lower())
    content = message.get("content") if "content" in message else message.get("value")
    if role is None or not isinstance(content, str) or not content.strip():
        return None
    return role, content


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
        if (pair := turn(m)) is None:
            return None
        out.append({"role": pair[0], "content": pair[1]})
    system = out[:1] if out and out[0]["role"] == "system" else []
    turns = out[len(system):]
    while turns and turns[0]["role"] == "assistant":
        turns.pop(0)
    if turns and turns[-1]["role"] == "user":
        turns.pop()
    if len(turns) < 2 or len(turns) % 2 or any(t["role"] != ("user", "assistant")[i % 2] for i, t in enumerate(turns)):
        return None
    return system + turns


def iter_json_array(text: str):
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


# The NIAH haystack and needles (evals/niah.py): never trained on. A paragraph holding any of these is
# removed from every document, whatever its source.
NIAH_TEXT = re.compile(
    r"the grass is green\.?\s+the sky is blue|the sun is yellow\.?\s+here we go|here we go\.?\s+there and back again"
    r"|\bpass ?key is\b|\bwhat is the pass ?key\b|\bvalue for key \S+ is\b"
    r"|important info(rmation)? hidden inside a lot of irrelevant text",
    re.I,
)
_NIAH_WORDS = ("grass is green", "sun is yellow", "here we go", "pass key", "passkey", "value for key", "irrelevant text")
PARAGRAPH = re.compile(r"\n[ \t]*\n")
_NON_LATIN = re.compile(r"[^\x00-\u024f\u2000-\u206f\u20ac\u2190-\u21ff\u2200-\u22ff\u2500-\u257f]")


def has_niah_text(text: str) -> bool:
    """Whether `text` holds NIAH passkey text (`NIAH_TEXT`); a substring pre-check keeps it fast on large corpora."""
    lower = text.lower()
    return any(word in lower for word in _NIAH_WORDS) and NIAH_TEXT.search(text) is not None


def clean_document(text: str) -> str:
    """Normalise newlines, drop every paragraph that holds NIAH passkey text (`NIAH_TEXT`), trim
    trailing spaces and runs of blank lines. Returns "" when nothing is left."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    if has_niah_text(text):
        text = "\n\n".join(p for p in PARAGRAPH.split(text) if not has_niah_text(p))
    text = re.sub(r"[ \t]+\n", "\n", text)
    text = re.sub(r"\n{4,}", "\n\n\n", text)
    return text.strip()


def mostly_latin(text: str, threshold: float = 0.95) -> bool:
    """English-like: at least `threshold` of the characters are Latin script, punctuation or symbols
    (ShareGPT holds many Chinese/Korean/Japanese chats, which SmolLM2 barely reads)."""
    return bool(text) and len(_NON_LATIN.findall(text)) <= (1 - threshold) * len(text)
