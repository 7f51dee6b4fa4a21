"""The loader behind `custom_dataset: !function utils.<task>`: `<data_dir>/<task>.jsonl` (llm-foundry format, one
document a line) as the one "test" split the task YAMLs name. `data_dir` comes from lm-eval's task metadata
(`--metadata '{"data_dir": ...}'`, or `TaskManager(metadata=...)`), which lm-eval passes to the loader along with
keys of its own (hence `**_ignored`)."""

from __future__ import annotations

import json
from pathlib import Path


# Each task's fields: (the text fields, the list of options or None, whether `gold` indexes it).
FIELDS = {
    "arc_easy": (("query",), "choices"), "arc_challenge": (("query",), "choices"), "piqa": (("query",), "choices"),
    "winogrande": (("continuation",), "context_options"), "lambada_openai": (("context", "continuation"), None),
}


def read_rows(path: str | Path, task: str | None = None) -> list[dict]:
    """The documents of a task's JSONL file, each checked (its fields present, `gold` an index of its options): a
    one-line ValueError naming the file and the line. A hidden label (gold -1, as test splits ship) is refused: such
    a file cannot be scored."""
    task = task or Path(path).stem
    texts, options = FIELDS.get(task, ((), None))
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}, line {number}"
            try:
                row = json.loads(line)
            except ValueError as err:
                raise ValueError(f"{where} is not JSON ({err})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{where}: a document is a JSON object, got {type(row).__name__}")
            missing = [k for k in (*texts, *([options, "gold"] if options else [])) if k not in row]
            if missing:
                raise ValueError(f"{where} lacks {', '.join(missing)}: a {task} document has "
                                 f"{', '.join((*texts, *([options, 'gold'] if options else [])))}")
            bad = [k for k in texts if not isinstance(row[k], str)]
            if bad:
                raise ValueError(f"{where}: {', '.join(bad)} must be text")
            if options:
                choices, gold = row[options], row["gold"]
                if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) for c in choices):
                    raise ValueError(f"{where}: {options} must be a list of at least two texts")
                if gold == -1:
                    raise ValueError(f"{where}: gold is -1, a hidden label: this split has no labels; use a split "
                                     "that has them (validation or test with answers)")
                if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(choices):
                    raise ValueError(f"{where}: gold {gold!r} is not an index of its {len(choices)} {options} "
                                     f"(0-{len(choices) - 1})")
            rows.append(row)
    return rows


def _load(task: str, data_dir: str | None = None, **_ignored):
    import datasets

    if not data_dir:
        raise ValueError(f"linzoo_{task}_local reads <data_dir>/{task}.jsonl: pass --metadata "
                         f"'{{\"data_dir\": \"/folder/with/{task}.jsonl\"}}'")
    path = Path(data_dir) / f"{task}.jsonl"
    rows = read_rows(path, task)
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
