"""Is a model folder whole, and are its weights and config.json the bytes its run saved? The run records their sha256
in its lineage (`save_with_lineage` writes `weights_record` into linzoo_training.json); linzoo's loaders and `linzoo
push` call `verify_folder`. A config.json that says another mixer, layer count or `attn_layers` than the one saved
would build another model around the same weights.

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
CONFIG_DIGEST = "config_sha256"  # the lineage's sha256 of config.json


def file_sha256(path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()  # read in chunks, never the whole file at once


def weights_record(folder) -> dict:
    """The lineage entry for the weights and config saved in `folder`: {"weights_sha256": {file name: sha256},
    "config_sha256": sha256}."""
    folder = Path(folder)
    return {DIGESTS: {p.name: file_sha256(p) for p in sorted(folder.glob("*.safetensors"))},
            CONFIG_DIGEST: file_sha256(folder / "config.json")}


def write_json(path, data, indent: int = 1) -> Path:
    """Whole or not at all: a process killed (or a write failing, the disk full) while writing leaves the old file (or
    none), never half of one. The JSON goes to a temporary file of its own beside `path`, on disk before it takes the
    name. Every record and results file of linzoo is written through this."""
    import os
    import tempfile

    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=indent)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_json(path):
    """A JSON file's content; a ValueError naming the file when it does not parse."""
    try:
        return json.loads(Path(path).read_bytes())
    except ValueError as err:
        raise ValueError(f"{path} is not valid JSON ({err}): it is truncated or damaged; copy it again from where "
                         "it came") from None


def _lineage(folder) -> dict:
    """The folder's lineage record; {} without a lineage file."""
    path = Path(folder) / LINEAGE_FILE
    record = read_json(path) if path.is_file() else {}
    if not isinstance(record, dict):
        raise ValueError(f"{path} is not a linzoo lineage record (a JSON object): restore it, or delete it to load "
                         "the folder without its lineage")
    return record


def recorded_digests(folder) -> dict[str, str]:
    """The weights' digests recorded in the folder's lineage; {} without a lineage file or a digest in it."""
    return _lineage(folder).get(DIGESTS) or {}


def verify_folder(folder) -> None:
    """A ValueError naming the file when a JSON file of `folder` does not parse, a safetensors file does not open,
    or its sha256 (or config.json's) differs from the one in the lineage record (a FileNotFoundError when a recorded
    file is gone). Nothing for a Hub id."""
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
    config_digest = _lineage(folder).get(CONFIG_DIGEST)
    if config_digest and file_sha256(folder / "config.json") != config_digest:  # a few kB: hashed at every load
        raise ValueError(f"{folder / 'config.json'} is not the file its run saved: its sha256 differs from the one in "
                         f"{folder / LINEAGE_FILE}; restore it, or, if you changed the config on purpose, delete "
                         f"{CONFIG_DIGEST!r} from that file")
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


def first_nonfinite(named_tensors) -> str | None:
    """The name of the first floating-point tensor of (name, tensor) pairs holding a NaN or an infinity; None when all
    are finite. One host sync for all of them (a device's tensors are checked where they are)."""
    import torch

    named = [(name, t) for name, t in named_tensors if t.is_floating_point()]
    if not named:
        return None
    device = named[0][1].device
    finite = torch.stack([torch.isfinite(t).all().to(device) for _, t in named])
    if bool(finite.all()):
        return None
    return named[int(finite.logical_not().nonzero()[0, 0])][0]


def unusable_error(where, why: str) -> ValueError:
    """The refusal of a model `unusable_model` finds `why` unusable."""
    return ValueError(f"{where} is no usable model ({why}): train it again from its last good checkpoint, with a "
                      "lower learning rate")


PROBE_TOKENS = 64  # the output probe's length: one chunk of the fla kernels, a window's worth of context


def probe_ids(vocab_size: int, device=None):
    """The output probe's input: a fixed [1, PROBE_TOKENS] row of token ids spread over the vocabulary (no tokenizer,
    no randomness: the same ids for every model of that vocabulary, in every process)."""
    import torch

    return (torch.arange(PROBE_TOKENS, device=device).view(1, -1) * 7919 + 13) % vocab_size


def nonfinite_outputs(model) -> str | None:
    """None when `model`'s logits on the fixed probe (`probe_ids`) are all finite; else what share is not ("62.5 %
    of its logits are NaN or inf"). Weights can be finite and still give no usable output (a learning rate of 1e30
    leaves weights near 1e30 whose products overflow): a model is judged by what it outputs. Runs without gradients
    and in eval mode, giving the model back in the mode it came in; one host sync."""
    import torch

    training = model.training
    device = next(model.parameters()).device
    try:
        model.eval()
        with torch.no_grad():
            logits = model(input_ids=probe_ids(model.config.vocab_size, device), use_cache=False).logits
    finally:
        model.train(training)
    bad = (~torch.isfinite(logits)).float().mean().item()
    return None if bad == 0 else f"{100 * bad:.3g} % of its logits on a fixed {PROBE_TOKENS}-token probe are NaN or inf"


def unusable_model(model) -> str | None:
    """Why `model` is no usable model (non-finite weights, else non-finite outputs on the probe); None when it is one.
    The one test that saves, loads, cards, evals and pushes apply."""
    name = first_nonfinite(model.state_dict().items())
    if name is not None:
        return f"non-finite weights ({name} has NaN or inf)"
    outputs = nonfinite_outputs(model)
    return outputs and f"non-finite outputs ({outputs})"
