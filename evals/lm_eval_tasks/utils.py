"""The loader behind `custom_dataset: !function utils.<task>`: `<data_dir>/<task>.jsonl` (llm-foundry format, one
document a line) as the one "test" split the task YAMLs name. `data_dir` comes from lm-eval's task metadata
(`--metadata '{"data_dir": ...}'`, or `TaskManager(metadata=...)`), which lm-eval passes to the loader along with
keys of its own (hence `**_ignored`)."""

from __future__ import annotations

import json
from pathlib import Path


def _rows(path: str | Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _load(task: str, data_dir: str | None = None, **_ignored):
    import datasets

    if not data_dir:
        raise ValueError(f"linzoo_{task}_local reads <data_dir>/{task}.jsonl: pass --metadata "
                         f"'{{\"data_dir\": \"/folder/with/{task}.jsonl\"}}'")
    path = Path(data_dir) / f"{task}.jsonl"
    rows = _rows(path)
    if not rows:
        raise ValueError(f"linzoo_{task}_local: no documents in {path}")
    # from_list, not load_dataset("json"): no Arrow cache keyed on the file's path, and the same rows as json.loads
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


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
