"""A user's own dataset files (`.jsonl`/`.json`/`.parquet`/`.txt`, or a folder of them) read with 🤗 datasets.

What datasets and pyarrow cannot say in one line is checked here, naming the file: an empty file (datasets raises
a bare StopIteration for an empty .jsonl; inside a folder one is skipped with a warning), a line that is not JSON
(datasets' DatasetGenerationError names neither file nor line), and text that is not UTF-8. Undecodable text is an
error, not a warning with replacement characters: such a file is the wrong file or needs one `iconv`, and linzoo
never changes a user's data silently.
"""

from __future__ import annotations

import codecs
import json
import warnings
from pathlib import Path

import datasets

from .base import TEXT_FEATURES
from .text import chunk_text


def read_local(path: Path, kind: str, suffixes: tuple[str, ...]) -> list[datasets.Dataset]:
    """The file `path`, or every `suffixes` file below the folder `path` (sorted, hidden ones skipped), as datasets:
    one for the JSON files, one for the Parquet files, one of `.txt` chunks (`chunk_text`) in a `text` column."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in suffixes
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not files:
            raise ValueError(f"folder {path} holds no {'/'.join(suffixes)} files")
    elif path.suffix in suffixes:
        files = [path]
    else:
        raise ValueError(f"{path}: unsupported file type for {kind} data; use one of {'/'.join(suffixes)}")
    empty = [f for f in files if _is_empty(f)]
    if empty == files:
        column = "text" if kind == "text" else "messages"
        fill = {".txt": "UTF-8 text", ".parquet": f"rows with a `{column}` column"}.get(
            files[0].suffix, f"one JSON object a line with a `{column}` field")
        what = f"folder {path} holds only empty files: write {fill} in them" if path.is_dir() else \
            f"file {path} is empty: write {fill} in it"
        raise ValueError(f"{kind} dataset {what}, or pass another file")
    if empty:  # as an empty .txt always was: nothing in it to lose
        warnings.warn(f"linzoo: skipping {len(empty)} empty file(s) in {path}: {', '.join(f.name for f in empty[:5])}")
        files = [f for f in files if f not in empty]
    parts = []
    json_files = [f for f in files if f.suffix in (".json", ".jsonl")]
    parquet_files = [str(f) for f in files if f.suffix == ".parquet"]
    if json_files:
        parts.append(_read_json(json_files))
    if parquet_files:
        parts.append(datasets.Dataset.from_parquet(parquet_files))
    txt_docs = [c for f in files if f.suffix == ".txt" for c in chunk_text(f.read_text(encoding="utf-8"))]
    if txt_docs:
        parts.append(datasets.Dataset.from_dict({"text": txt_docs}, features=TEXT_FEATURES))
    return parts


def _is_empty(path: Path) -> bool:
    if path.suffix != ".parquet":
        return _scan_text(path)
    import pyarrow
    import pyarrow.parquet as pq

    try:
        return path.stat().st_size == 0 or pq.ParquetFile(path).metadata.num_rows == 0
    except pyarrow.ArrowInvalid as err:
        raise ValueError(f"{path} is not a Parquet file ({err}); pass a .parquet file or rename it") from None


def _scan_text(path: Path) -> bool:
    """Whether `path` holds nothing but whitespace; an error naming the first byte that is not UTF-8, or the first NUL
    byte (a binary file). Read in chunks: pyarrow's JSON reader lets bad UTF-8 through to fail later, nameless."""
    decoder, offset, empty = codecs.getincrementaldecoder("utf-8")(), 0, True

    def decode(chunk: bytes, final: bool = False):
        pending = len(decoder.getstate()[0])  # bytes of a character cut by the previous chunk
        try:
            decoder.decode(chunk, final)
        except UnicodeDecodeError as err:
            raise ValueError(f"{path} is not UTF-8 text: byte {offset - pending + err.start:,} "
                             f"(0x{err.object[err.start]:02x}) cannot be decoded; convert the file "
                             f"(e.g. `iconv -f latin1 -t utf-8`) or pass another file") from None

    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 24), b""):
            decode(chunk)
            if b"\x00" in chunk:
                raise ValueError(f"{path} holds NUL bytes (the first at byte {offset + chunk.index(0):,}): a binary "
                                 f"file, not text; pass a UTF-8 text file")
            empty = empty and not chunk.strip()
            offset += len(chunk)
        decode(b"", final=True)
    return empty


def _read_json(files: list[Path]) -> datasets.Dataset:
    try:
        return datasets.Dataset.from_json([str(f) for f in files])
    except datasets.exceptions.DatasetGenerationError as err:
        for f in files:
            _check_json(f)
        raise ValueError(f"could not read {', '.join(map(str, files))} as JSON: {err.__cause__ or err}") from err


def _check_json(path: Path) -> None:
    """Raise naming the first line of `path` that is not JSON (a .json file may hold one JSON value or JSON lines)."""
    text = path.read_text(encoding="utf-8")
    try:
        json.loads(text)
        return
    except json.JSONDecodeError:
        pass
    for number, line in enumerate(text.split("\n"), 1):
        try:
            line.strip() and json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: line {number} is not JSON ({err.msg}, column {err.colno}); a {path.suffix} "
                             f"dataset holds one JSON object a line: fix or delete that line") from None
