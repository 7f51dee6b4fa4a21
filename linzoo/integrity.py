"""Is a model folder whole, and are its weights the bytes its run saved? The run records their sha256 in its lineage
(`save_with_lineage` writes `weights_record` into linzoo_training.json); linzoo's loaders and `linzoo push` call
`verify_folder`.

Every top-level `*.json` file must also parse and every `*.safetensors` file open (its header parses and covers
the file), so a truncated file is named before transformers reads it. A folder without a recorded digest (an older
run, a teacher) is only opened.

Hashing 540 MB takes about as long as loading the model from it, so a file is hashed once per state: a match
leaves an empty marker in linzoo's cache named after the file's path, size, mtime, ctime and inode, and a later
load with the same stat skips the hash. Any write to the file changes its ctime, which no user can set back.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

LINEAGE_FILE = "linzoo_training.json"
DIGESTS = "weights_sha256"  # the lineage's {file name: sha256} of the weights


def file_sha256(path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()  # read in chunks, never the whole file at once


def weights_record(folder) -> dict:
    """The lineage entry for the weights saved in `folder`: {"weights_sha256": {file name: sha256}}."""
    return {DIGESTS: {p.name: file_sha256(p) for p in sorted(Path(folder).glob("*.safetensors"))}}


def read_json(path):
    """A JSON file's content; a ValueError naming the file when it does not parse."""
    try:
        return json.loads(Path(path).read_bytes())
    except ValueError as err:
        raise ValueError(f"{path} is not valid JSON ({err}): it is truncated or damaged; copy it again from where "
                         "it came") from None


def recorded_digests(folder) -> dict[str, str]:
    """The weights' digests recorded in the folder's lineage; {} without a lineage file or a digest in it."""
    path = Path(folder) / LINEAGE_FILE
    record = read_json(path) if path.is_file() else {}
    if not isinstance(record, dict):
        raise ValueError(f"{path} is not a linzoo lineage record (a JSON object): restore it, or delete it to load "
                         "the folder without its lineage")
    return record.get(DIGESTS) or {}


def verify_folder(folder) -> None:
    """A ValueError naming the file when a JSON file of `folder` does not parse, a safetensors file does not open,
    or its sha256 differs from the one in the lineage record (a FileNotFoundError when a recorded file is gone).
    Nothing for a Hub id."""
    from safetensors import SafetensorError, safe_open

    folder = Path(folder)
    if not folder.is_dir():
        return
    for path in sorted(folder.glob("*.json")):
        read_json(path)
    for path in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(path, framework="pt"):
                pass
        except SafetensorError as err:
            raise ValueError(f"{path} is not a readable safetensors file ({err}): it is truncated or damaged; "
                             "copy it again from where it came") from None
    for name, digest in recorded_digests(folder).items():
        path = folder / name
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: {LINEAGE_FILE} records its sha256; copy it again from "
                                    "where it came")
        marker = _verified_marker(path, digest)
        if marker is not None and marker.is_file():
            continue  # hashed before in this very state
        if file_sha256(path) != digest:
            raise ValueError(f"{path} is not the file its run saved: its sha256 differs from the one in "
                             f"{folder / LINEAGE_FILE}; copy it again from where it came, or, if you changed the "
                             f"weights on purpose, delete {DIGESTS!r} from that file")
        if marker is not None:
            marker.touch()


def _verified_marker(path: Path, digest: str) -> Path | None:
    """The marker of `path` in its present state matching `digest`; None where the cache cannot be written (then
    every load hashes)."""
    from .registry_files import cache_dir

    st = path.stat()
    state = f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}:{digest}"
    folder = cache_dir() / "verified"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return folder / hashlib.sha256(state.encode()).hexdigest()
