"""Which files of a model folder are released, and why: one decision per file, which the card (the results and
figures it shows), `linzoo push`'s plan (what it prints) and the upload (what it sends) all read.

Top-level files go, but hidden ones, README.md (the card is generated anew) and the local run's arguments;
subfolders stay home, but eval/. There, and in eval/<sub>/ (a zoo's second run of an eval, e.g. eval/natural), an
eval's results file goes when it measured these very weights: its `weights_sha256` is theirs and it measured them
unquantized (another model's results, `--out` pointed at the wrong folder, weights changed since, and files from
before linzoo recorded the hash, stay). An eval's figures go with their results file and only with it; a figure at
the folder's top (where older runs drew it, and where the card still looks) is one of eval/<results file>. Anything
else in eval/ is no registered eval's file: nothing says which model it measured, so it stays too.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from linzoo.evals.common import EVAL_DIR, weights_sha256
from linzoo.evals.registry import all_evals

README = "README.md"


@dataclass(frozen=True)
class FileDecision:
    path: str  # in the folder and in the repo (a subfolder that stays home ends in "/")
    included: bool
    why: str
    eval: str | None = None  # the registered eval whose results file or figure it is
    sub: str | None = None  # where in eval/ that eval ran: "" for eval/ itself, else the sub-folder's name
    results: dict | None = None  # an included results file's content


def read_json(path: Path, schema: str | None = None) -> dict | None:
    """The file's JSON, None when it does not exist; a ValueError when it is not the expected schema."""
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    if schema and data.get("schema") != schema:
        raise ValueError(f"{path} has schema {data.get('schema')!r}, expected {schema!r}")
    return data


def decide_files(folder) -> list[FileDecision]:
    """Every top-level entry of `folder` and every file under its eval/, each included or left out, with why, sorted by
    path. A ValueError for a link leading out of the folder (a token file, a key): releasing it would publish that."""
    from linzoo.trainers.common import RUN_FILE

    folder = Path(folder)
    root, specs = folder.resolve(), all_evals()
    decided = _eval_files(folder, root, specs)
    by_path = {d.path: d for d in decided}
    for path in sorted(folder.iterdir()):
        name = path.name
        if name.startswith("."):
            decided.append(FileDecision(name, False, "hidden"))
        elif _inside(path, root) and path.is_dir():
            decided += [] if name == EVAL_DIR else [FileDecision(f"{name}/", False, "a subfolder (stage checkpoints, "
                                                                               "optimizer states) stays home")]
        elif name == README:
            decided.append(FileDecision(name, False, "the card is generated anew"))
        elif name == RUN_FILE:
            decided.append(FileDecision(name, False, "the command line of a local run (this machine's paths); the "
                                                     "card has the recipe"))
        elif spec := next((s for s in specs if name == s.result_file), None):
            decided.append(FileDecision(name, False, f"results are read from {EVAL_DIR}/ only", spec.name, ""))
        elif spec := next((s for s in specs if name in s.figures), None):
            decided.append(_figure(name, spec, "", by_path.get(results_path(spec, ""))))
        else:
            decided.append(FileDecision(name, True, "a file of the model"))
    return sorted(decided, key=lambda d: d.path)


def _eval_files(folder: Path, root: Path, specs) -> list[FileDecision]:
    """The decisions of the files under eval/: each results file by what it measured, each figure by its results
    file's decision."""
    top = folder / EVAL_DIR
    files = sorted(p for p in top.rglob("*") if _inside(p, root) and p.is_file()) if top.is_dir() else []
    ours, results, decided = weights_sha256(str(folder)), {}, []
    for path in files:  # results files first: a figure's decision is theirs
        parts = path.relative_to(top).parts
        spec = next((s for s in specs if parts[-1] == s.result_file), None)
        if spec is not None and len(parts) <= 2 and not any(part.startswith(".") for part in parts):
            where = path.relative_to(folder).as_posix()
            results[where] = _results(folder, where, spec, parts[0] if len(parts) == 2 else "", ours)
    for path in files:
        where, parts = path.relative_to(folder).as_posix(), path.relative_to(top).parts
        spec = next((s for s in specs if parts[-1] in s.figures), None)
        if where in results:
            decided.append(results[where])
        elif any(part.startswith(".") for part in parts):
            decided.append(FileDecision(where, False, "hidden"))
        elif len(parts) > 2:
            decided.append(FileDecision(where, False, f"deeper than {EVAL_DIR}/<sub>/, where no card reads"))
        elif spec is None:
            decided.append(FileDecision(where, False, "no registered eval's file: nothing says which model it "
                                                      "measured"))
        else:
            sub = parts[0] if len(parts) == 2 else ""
            decided.append(_figure(where, spec, sub, results.get(results_path(spec, sub))))
    return decided


def results_path(spec, sub: str) -> str:
    """Where in a model folder an eval's results file lies: eval/<file>, or eval/<sub>/<file>."""
    return f"{EVAL_DIR}/{sub}/{spec.result_file}" if sub else f"{EVAL_DIR}/{spec.result_file}"


def _results(folder: Path, where: str, spec, sub: str, ours: str | None) -> FileDecision:
    data = read_json(folder / where, spec.schema)
    if data.get("quantize", "none") != "none":
        return FileDecision(where, False, f"it measured the model quantized to {data['quantize']} (--quantize), not "
                                          "these weights as they are", spec.name, sub)
    theirs = data.get("weights_sha256")
    if theirs is None:
        return FileDecision(where, False, "it records no weights hash (made before linzoo recorded one): run the "
                                          "eval again", spec.name, sub)
    if theirs != ours:
        return FileDecision(where, False, f"it measured {data.get('model')!r}, whose weights are not this folder's",
                            spec.name, sub)
    return FileDecision(where, True, "it measured these weights (its weights_sha256 is theirs)", spec.name, sub, data)


def _figure(where: str, spec, sub: str, results: FileDecision | None) -> FileDecision:
    """A figure goes where its results file goes; without one, nothing says which model it shows."""
    if results is None:
        return FileDecision(where, False, f"a figure without {results_path(spec, sub)}, the results it was drawn "
                                          "from: nothing says which model it shows", spec.name, sub)
    return FileDecision(where, results.included, f"a figure of {results.path}"
                        + ("" if results.included else ", which is left out"), spec.name, sub)


def _inside(path: Path, root: Path) -> bool:
    """True, or a ValueError where `path` is a link whose target lies outside the folder `root`."""
    if path.is_symlink() and not path.resolve().is_relative_to(root):
        raise ValueError(f"{path} is a link to {path.resolve()}, outside {root}: it would upload that file; "
                               "copy what belongs to the model into the folder, or remove the link")
    return True


@contextmanager
def released_folder(folder, decided: list[FileDecision]):
    """A temporary folder holding links to the included files only, at their paths: the folder as the Hub will hold
    it, where the evals' card sections look for their figures."""
    with tempfile.TemporaryDirectory(prefix="linzoo-released-") as tmp:
        for d in decided:
            if d.included:
                (Path(tmp) / d.path).parent.mkdir(parents=True, exist_ok=True)
                os.symlink((Path(folder) / d.path).resolve(), Path(tmp) / d.path)
        yield Path(tmp)
