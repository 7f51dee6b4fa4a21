"""Loaders for linzoo's local lm-eval-harness tasks (referenced by `custom_dataset: !function utils.<task>`).

Each task reads `<task>.jsonl` in the llm-foundry local format that `linzoo eval quality --data_dir` reads.
Where the file comes from, first match wins:

1. `data_files`: the path of one JSONL file, via lm-eval's metadata (only sensible for a single task):
   `--metadata '{"data_files": "/data/arc_easy.jsonl"}'`
2. `data_dir`: a folder holding `<task>.jsonl`, via metadata: `--metadata '{"data_dir": "/data/eval"}'`
3. the environment variable `LINZOO_EVAL_DATA` (a folder holding `<task>.jsonl`)
4. the sample shipped beside this file (only `arc_easy_sample.jsonl`: the first 50 arc_easy docs)

lm-eval calls the loader with the task's metadata (plus, from the CLI or `simple_evaluate`, the model_args
keys), so unknown keyword arguments are ignored.
"""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
SAMPLES = {"arc_easy": HERE / "arc_easy_sample.jsonl"}
ENV = "LINZOO_EVAL_DATA"


def resolve_data_file(task: str, data_files: str | None = None, data_dir: str | None = None) -> Path:
    """The JSONL file the task `task` reads (see the module docstring for the order)."""
    if data_files:
        path = Path(data_files).expanduser()
    elif data_dir or os.environ.get(ENV):
        path = Path(data_dir or os.environ[ENV]).expanduser() / f"{task}.jsonl"
    elif task in SAMPLES:
        path = SAMPLES[task]
    else:
        raise FileNotFoundError(
            f"linzoo_{task}_local needs data: pass --metadata '{{\"data_dir\": \"/folder/with/{task}.jsonl\"}}' "
            f"or set ${ENV} to that folder (no sample of {task} ships with linzoo)."
        )
    if not path.is_file():
        raise FileNotFoundError(f"linzoo_{task}_local: no such file {path}")
    return path


def _load(task: str, data_files: str | None = None, data_dir: str | None = None, **_ignored):
    import datasets

    path = resolve_data_file(task, data_files, data_dir)
    # A DatasetDict with one "test" split, which the YAMLs name as their test_split.
    return datasets.load_dataset("json", data_files={"test": str(path)})


def arc_easy(**kwargs):
    return _load("arc_easy", **kwargs)


def arc_challenge(**kwargs):
    return _load("arc_challenge", **kwargs)


def piqa(**kwargs):
    return _load("piqa", **kwargs)


def winogrande(**kwargs):
    return _load("winogrande", **kwargs)


def lambada_openai(**kwargs):
    return _load("lambada_openai", **kwargs)
