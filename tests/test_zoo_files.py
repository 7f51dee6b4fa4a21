"""Every zoo file of recipes/ is read and checked, and says only what differs: its rows, written with `defaults:`,
`like:` and `include:`, expand to the plans the files gave when each row was spelled out in full
(tests/data/zoo_plans.json, recorded before the rewrite), and all of them together spell at most 400 flag words."""

import json
from pathlib import Path

import pytest
import yaml

from linzoo.zoo import plan, read_zoo
from linzoo.zoo.model import _flag_groups
from linzoo.zoo.check import check_plan

ROOT = Path(__file__).resolve().parents[1]
ZOO_FILES = sorted(p for p in (ROOT / "recipes").rglob("*.yaml") if "variants" in (yaml.safe_load(p.read_text()) or {}))
PLANS = json.loads((Path(__file__).parent / "data" / "zoo_plans.json").read_text())


def test_every_zoo_file_has_its_recorded_plan():
    assert sorted(p.name for p in ZOO_FILES) == sorted(PLANS)


def _groups(argv: list[str]) -> list[list[str]]:
    return sorted(_flag_groups(argv[2 if argv[0] == "eval" else 1:]))


@pytest.mark.parametrize("path", ZOO_FILES, ids=[p.name for p in ZOO_FILES])
def test_a_zoo_file_expands_to_its_plan_row_by_row(path):
    """The product's zoo files (recipes/<size>/) give their commands word for word (a build resumes only a command
    line it recorded); an experiment's (recipes/<size>/experiments/, built and reported) the same flags with the same
    values, a `like:` row's own flags after its model's."""
    zoo, recorded = read_zoo(path), PLANS[path.name]
    steps = {s.name: {c.label: [c.argv, c.tokens] for c in s.commands} for s in plan(zoo, "OUT")}
    assert sorted(steps) == sorted(recorded["steps"])
    exact = path.parent.name != "experiments"
    for name, commands in recorded["steps"].items():
        assert steps[name].keys() == commands.keys(), name
        for label, (argv, tokens) in commands.items():
            got, got_tokens = steps[name][label]
            assert got_tokens == tokens and got[:2] == argv[:2], (name, label)
            assert (got == argv) if exact else (_groups(got) == _groups(argv)), (name, label, got, argv)
    assert json.loads(json.dumps(zoo.targets)) == recorded["targets"]
    assert [e.label for e in zoo.evals] == recorded["evals"]
    assert (zoo.mixers, zoo.jobs, zoo.estimate, zoo.train_seconds) == (
        recorded["mixers"], recorded["jobs"], recorded["estimate"], recorded["train_seconds"])


def _flag_words(node) -> int:
    """The words of every `flags:` list of a zoo file's rows: variants, their per_mixer rows and `defaults:`."""
    words = 0
    for v in (node.get("variants") or {}).values():
        words += len(v.get("flags") or []) + sum(len((o or {}).get("flags") or []) for o in (v.get("per_mixer") or {}).values())
    return words + sum(len(f or []) for k, f in (node.get("defaults") or {}).items() if k != "evals")


def test_the_zoo_files_say_only_what_differs():
    words = {p.name: _flag_words(yaml.safe_load(p.read_text())) for p in ZOO_FILES}
    assert sum(words.values()) <= 400, words


@pytest.mark.slow
@pytest.mark.parametrize("path", ZOO_FILES, ids=[p.name for p in ZOO_FILES])
def test_a_zoo_file_passes_its_check(path, tmp_path):
    """`linzoo zoo --check`: every command's flags through its own parser, the imports, the teacher, the eval data."""
    assert check_plan(str(path), None, str(tmp_path / "zoo")) == []
