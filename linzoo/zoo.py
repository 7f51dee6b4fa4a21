"""`linzoo zoo`: one command builds the zoo (issue 30) — every mixer as each variant of a zoo file (base, instruct,
instruct-distilled, ...), each evaluated beside the teacher, with one report.

    linzoo zoo --config recipes/135m/zoo-cpu.yaml --dry-run              # the plan and its time estimate; runs nothing
    linzoo zoo --config recipes/135m/zoo-cpu.yaml --out runs/zoo         # build it (run again after a kill: resumes)
    linzoo zoo --config recipes/135m/zoo-gpu.yaml --jobs 4 --max-seconds 1500
    linzoo zoo --config recipes/135m/zoo-gpu.yaml --check               # what it would fail on, one line each
    linzoo zoo --next recipes/135m/gpu-queue.txt                        # the queue's first build not yet reported

The zoo file (YAML; an unknown key, mixer, command, eval or parent, or a key given twice in one mapping, which YAML
would keep the last of without a word, is a one-line error naming the key):

    teacher: embedded                     # what linearize and distill-instruct learn from, evaluated once
    mixers: all                           # every mixer of the registry, or a list of names
    jobs: 1                               # steps side by side (--jobs overrides)
    train_seconds: 540                    # optional: every training ends by then (from the build's first training)
    variants:                             # <out>/<mixer>/<variant>, in this order (parents first)
      base:     {command: linearize, tokens: 20000, flags: [--window_size, "64"]}
      instruct: {command: sft, parent: base, tokens: 20000, flags: [--dataset, embedded]}
      long:     {command: linearize, tokens: 90000, mixers: [MIXER, ...]}   # some mixers only (a variant with a
                                                                             # parent: the parent's, unless it says)
      base2:    {command: linearize, tokens: 20000, flags: [--stage_fractions, "1", "0", "0"],
                 per_mixer: {MIXER: {tokens: 40000, flags: [--stage_fractions, "0.5", "0", "0.5"]}}}
                                          # one mixer's row differs: its tokens, and its flags in place of the
                                          # variant's same flags (others added)
    evals:                                # on every row and once on the teacher: <folder>/eval[/<sub>]
      - {eval: niah, flags: [--lengths, "256,512"]}
      - {eval: niah, sub: natural, flags: [--variant, natural, --lengths, "256,512"]}
    estimate:                             # seconds before this build has measured them (then: its own timings)
      tokens_per_second: {linearize: 60, sft: 300}    # each command alone
      start_seconds: 30                   # each process: imports, loading the models and the data
      eval_seconds: {niah: 90, niah/natural: 90}      # a whole eval command, by `eval[/sub]` or eval name
      side_by_side: 1.7                   # optional: N jobs together run this many times one job's speed

A step is one row (`<mixer>/<variant>`, or the teacher): its training command, its evals, then `linzoo card`. Each
command is its own process, `python -m linzoo.cli ...`, its output appended to `<folder>.log`; the zoo sets what
ties a row into the zoo (--teacher, --mixer, --model_name_or_path: the parent's folder, --total_tokens: the budget,
--output_dir; an eval's --model and --out, and where an eval compares with the teacher's own results, those:
TEACHER_FLAGS), so the flags may not. A row trains once its parent is trained and is evaluated once the teacher is.
Resuming: a command whose output is there (a trained folder's lineage; an eval's results, measured on these
weights) is skipped unless zoo_state.json records another command line for it; anything else runs again, and the
trainers resume a killed run from its checkpoints (or refuse a folder of other arguments). A row whose folder holds
a training the zoo file no longer describes (its command changed, its parent's did, or its parent was trained again
after it) stops the build before anything runs, named with what changed; `--rebuild-changed` moves each such folder
to `<folder>.replaced-N` (nothing is deleted) and builds it again. A finished row is skipped only once its folder
passes its check (`integrity.verify_folder`: its weights and config.json are the bytes its run recorded the sha256
of, every JSON and safetensors file reads): one that fails it (or is gone) is moved aside the same way and built
again, with the rows built from it. `<out>/zoo_state.json`
keeps each command's line, exit code and seconds, which size the estimates of the steps left (a damaged one is
refused, named: moved aside, the build finds its finished rows by their folders). `--max-seconds`
stops every running command at that deadline (the next call resumes); `train_seconds` gives each training its own
(linearize's --max_wall_seconds: it stops, saves and is evaluated; a training that would start after it does not).
A build, and `--dry-run`, first check what it would fail on (linzoo/zoo_check.py). One build at a time holds
`<out>`: a build (or `--report-only`, which writes the report) takes `<out>/.zoo.lock` (an OS lock on the file,
which records the holder's pid, host and start: it ends with the process, however it ends), and another is refused,
named; `--dry-run` and `--check` write nothing there and take none. The report, `<out>/zoo.md`, `zoo.json` and
`zoo.png`, is written after every step. This is also the engine of the lent GPU's plans (scripts/device_jobs.sh
stages the machine, runs a build and packs its report).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from linzoo.integrity import LINEAGE_FILE, read_json, write_json

# command -> the flags the zoo sets for a row: (teacher, mixer, parent folder) -> flags
COMMANDS = {
    "linearize": lambda teacher, mixer, parent: ["--teacher", teacher, "--mixer", mixer],
    "sft": lambda teacher, mixer, parent: ["--model_name_or_path", parent],
    "distill-instruct": lambda teacher, mixer, parent: ["--model_name_or_path", parent, "--teacher", teacher],
}
# eval -> the flags that give a student's run the teacher's own results (scored once, in <out>/teacher/eval[/sub]):
# (teacher spec, teacher's results file) -> flags. The evals that score a student against its teacher.
TEACHER_FLAGS = {"quality": lambda teacher, results: ["--teacher", teacher, "--teacher_results", str(results)]}
# eval -> the flags that name a student's row where not `--model ROW`: (teacher spec, row) -> flags. These evals
# measure the teacher beside the row in the same process (their ratios are of one run), so the teacher's row has none.
MODEL_FLAGS = {"speed": lambda teacher, model: ["--models", teacher, model]}


def model_flags(eval_name: str, teacher: str, model: str) -> list[str]:
    """How a row's model is named to `linzoo eval <eval_name>`."""
    return MODEL_FLAGS[eval_name](teacher, model) if eval_name in MODEL_FLAGS else ["--model", model]
OWNED = {"--teacher", "--mixer", "--model_name_or_path", "--total_tokens", "--output_dir", "--model", "--models",
         "--out", "--teacher_results"}
TOP_KEYS = {"teacher", "mixers", "jobs", "variants", "evals", "estimate", "targets", "train_seconds"}
VARIANT_KEYS, EVAL_KEYS = {"command", "parent", "tokens", "flags", "mixers", "per_mixer"}, {"eval", "sub", "flags", "variants"}
PER_MIXER_KEYS = {"tokens", "flags"}
# command -> its flag that stops, saves and ends a run at a wall-clock deadline (the zoo's `train_seconds`); a
# training that would start with less than MIN_TRAIN_SECONDS left does not start
DEADLINE_FLAGS = {"linearize": "--max_wall_seconds"}
MIN_TRAIN_SECONDS = 60
ESTIMATE_KEYS = {"tokens_per_second", "start_seconds", "eval_seconds", "side_by_side"}
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
STATE_FILE, CARD_FILE = "zoo_state.json", "README.md"
LOCK_FILE = ".zoo.lock"  # <out>'s: held by the build (or --report-only) writing it


@dataclass
class Variant:
    name: str
    command: str
    parent: str | None
    tokens: int
    flags: list[str]
    mixers: list[str] | None = None  # the mixers that get it (None: every mixer of the zoo; unset: the parent's)
    per_mixer: dict[str, dict] = field(default_factory=dict)  # mixer -> {tokens, flags}: that mixer's row differs

    def tokens_for(self, mixer: str) -> int:
        return self.per_mixer.get(mixer, {}).get("tokens", self.tokens)

    def flags_for(self, mixer: str) -> list[str]:
        """The variant's flags with the mixer's own (`per_mixer`): a flag given there replaces the variant's value(s)
        of that flag, one not in the variant's is added."""
        return merge_flags(self.flags, self.per_mixer.get(mixer, {}).get("flags", []))


@dataclass
class EvalEntry:
    eval: str
    sub: str
    flags: list[str]
    variants: list[str] | None = None  # the rows that get it (None: every row); the teacher gets every eval but
    # those that measure it beside each student (MODEL_FLAGS)

    @property
    def label(self) -> str:
        return f"{self.eval}/{self.sub}" if self.sub else self.eval


@dataclass
class Zoo:
    path: str
    teacher: str
    mixers: list[str]
    jobs: int
    variants: dict[str, Variant]
    evals: list[EvalEntry]
    estimate: dict
    targets: dict = field(default_factory=dict)
    train_seconds: float | None = None  # every training ends by then, counted from the build's first training start


def _flags(value, where) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or any(isinstance(v, (dict, list)) or v is None for v in value):
        raise ValueError(f"{where}: give a list of command-line words, e.g. [--lengths, \"256,512\"]")
    words = [str(v).lower() if isinstance(v, bool) else str(v) for v in value]
    for w in words:
        if w.split("=")[0] in OWNED:
            raise ValueError(f"{where}: {w.split('=')[0]} is the zoo's to set (it ties each row into the zoo)")
    return words


def _flag_groups(words: list[str]) -> list[list[str]]:
    """[--a, 1, 2, --b, x] -> [[--a, 1, 2], [--b, x]] (words before the first flag form a group of their own)."""
    groups: list[list[str]] = []
    for w in words:
        if w.startswith("--") or not groups:
            groups.append([w])
        else:
            groups[-1].append(w)
    return groups


def merge_flags(base: list[str], extra: list[str]) -> list[str]:
    """`base` with each of `extra`'s flags (--name and its values, or --name=value) in place of base's same flag, and
    the ones base lacks appended: one value per flag in the argv a row records and prints."""
    name = lambda group: group[0].split("=")[0].replace("-", "_")  # noqa: E731  (--a-b is --a_b to our parsers)
    replace = {name(g): g for g in _flag_groups(extra)}
    merged = []
    for g in _flag_groups(base):  # the first of base's same flag takes extra's place; a repeat of it is dropped
        if name(g) not in replace:
            merged.append(g)
        elif replace[name(g)] is not None:
            merged.append(replace[name(g)])
            replace[name(g)] = None
    return [w for g in merged + [g for g in replace.values() if g is not None] for w in g]


def _mapping(value, where, keys) -> dict:
    """`value` as a mapping of `keys` only; `where` is "<file>: <key>" ("<file>:" at the top)."""
    if not isinstance(value, dict):
        raise ValueError(f"{where}: give a mapping (keys {', '.join(sorted(keys))})")
    unknown = [k for k in value if k not in keys]
    if unknown:
        raise ValueError(f"{where}{' ' if where.endswith(':') else '.'}{unknown[0]}: unknown key "
                         f"(known: {', '.join(sorted(keys))})")
    return value


def _number(value, where, integer=False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value) \
            or (integer and value != int(value)):
        raise ValueError(f"{where}: give a positive {'whole number' if integer else 'number'}, not {value!r}")
    return int(value) if integer else float(value)


def load_yaml_once(path: Path):
    """The data of the YAML file at `path`, as `yaml.safe_load` reads it, once every mapping in it is seen to give
    each key once: YAML's loaders keep the last of a key given twice without a word (a variant named twice would
    build one of the two). A ValueError naming the key's path and its lines; a yaml.YAMLError where it does not
    parse."""
    import yaml

    loader = yaml.SafeLoader(path.read_text())
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _keys_once(node, path, "", set())
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _keys_once(node, path: Path, where: str, walked: set):
    import yaml

    if id(node) in walked:  # an alias of a node walked where it was anchored
        return
    walked.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _keys_once(item, path, f"{where}[{i}]", walked)
    if not isinstance(node, yaml.MappingNode):
        return
    lines = {}
    for key, value in node.value:
        named = isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge"
        here = (f"{where}.{key.value}" if where else key.value) if named else where
        if named and (key.tag, key.value) in lines:
            what = ("the variant is named twice", "give each variant its own name") if where == "variants" else (
                "given twice in one mapping", "give each key once")
            raise ValueError(f"{path}: {here}: {what[0]} (lines {lines[key.tag, key.value]} and "
                             f"{key.start_mark.line + 1}): YAML would keep the last without a word; {what[1]}")
        if named:
            lines[key.tag, key.value] = key.start_mark.line + 1
        _keys_once(value, path, here, walked)


def read_zoo(path) -> Zoo:
    """The zoo file at `path`, checked whole before anything runs: a ValueError naming the first bad key."""
    import yaml

    from linzoo.evals.registry import EVAL_MODULES
    from linzoo.modeling.mixers import MIXERS

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"zoo file {path} does not exist")
    try:
        raw = load_yaml_once(path)
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML: {' '.join(str(err).split())}") from None
    raw = _mapping(raw, f"{path}:", TOP_KEYS)
    for key in ("teacher", "mixers", "variants", "estimate"):
        if key not in raw:
            raise ValueError(f"{path}: {key}: missing")
    at = lambda key: f"{path}: {key}"  # noqa: E731
    mixers = list(MIXERS) if raw["mixers"] == "all" else raw["mixers"]
    if not isinstance(mixers, list) or not mixers:
        raise ValueError(f"{at('mixers')}: give 'all' or a list of mixers ({', '.join(MIXERS)})")
    for m in mixers:
        if m not in MIXERS or mixers.count(m) > 1:
            why = "listed twice" if m in MIXERS else f"unknown mixer (known: {', '.join(MIXERS)})"
            raise ValueError(f"{at('mixers')}: {m!r}: {why}")
    variants = {}
    if not isinstance(raw["variants"], dict) or not raw["variants"]:
        raise ValueError(f"{at('variants')}: give a mapping of variant name -> {{command, parent, tokens, flags}}")
    for name, v in raw["variants"].items():
        where = at(f"variants.{name}")
        if not isinstance(name, str) or not NAME.fullmatch(name) or name == "teacher":
            raise ValueError(f"{where}: a variant's name is a folder name (letters, digits, _ and -), not 'teacher'")
        v = _mapping(v, where, VARIANT_KEYS)
        if v.get("command") not in COMMANDS:
            raise ValueError(f"{where}.command: {v.get('command')!r}: unknown command "
                             f"(known: {', '.join(COMMANDS)})")
        parent = v.get("parent")
        if (parent is None) != (v["command"] == "linearize"):
            why = ("linearize starts from the teacher: no parent" if parent
                   else f"{v['command']} trains a student further: name its parent variant")
            raise ValueError(f"{where}.parent: {why}")
        if "tokens" not in v:
            raise ValueError(f"{where}.tokens: missing (the budget, --total_tokens)")
        only = v.get("mixers")
        if only is not None and (not isinstance(only, list) or not only or any(m not in mixers for m in only)):
            raise ValueError(f"{where}.mixers: give a list of the zoo's mixers ({', '.join(mixers)}): the mixers "
                             "that get this variant")
        per_mixer = {}
        if v.get("per_mixer") is not None and not isinstance(v["per_mixer"], dict):
            raise ValueError(f"{where}.per_mixer: give a mapping of mixer -> {{tokens, flags}}: that mixer's row differs")
        for m, o in (v.get("per_mixer") or {}).items():  # its mixers are checked once a child has its parent's
            o = _mapping(o, f"{where}.per_mixer.{m}", PER_MIXER_KEYS)
            per_mixer[m] = {"flags": _flags(o.get("flags"), f"{where}.per_mixer.{m}.flags")}
            if "tokens" in o:
                per_mixer[m]["tokens"] = _number(o["tokens"], f"{where}.per_mixer.{m}.tokens", integer=True)
        variants[name] = Variant(name, v["command"], parent, _number(v["tokens"], f"{where}.tokens", integer=True),
                                 _flags(v.get("flags"), f"{where}.flags"), only, per_mixer)
    ordered = {}  # parents first (the order of the plan), a loop or an unknown parent named
    while len(ordered) < len(variants):
        ready = [v for v in variants.values() if v.name not in ordered and (v.parent is None or v.parent in ordered)]
        if not ready:
            bad = next(v for v in variants.values() if v.name not in ordered)
            why = "unknown variant" if bad.parent not in variants else "its parents form a loop"
            raise ValueError(f"{at(f'variants.{bad.name}.parent')}: {bad.parent!r}: {why} "
                             f"(variants: {', '.join(variants)})")
        ordered |= {v.name: v for v in ready}
    for v in ordered.values():  # parents first: a variant without `mixers` gets its parent's
        if v.mixers is None and v.parent:
            v.mixers = ordered[v.parent].mixers
        lacking = [m for m in mixers_of(v, mixers) if v.parent and m not in mixers_of(ordered[v.parent], mixers)]
        if lacking:
            raise ValueError(f"{at(f'variants.{v.name}.mixers')}: {', '.join(lacking)}: its parent {v.parent} is "
                             "not built for them (give the variant the parent's mixers or fewer)")
        for m in v.per_mixer:
            if m not in mixers_of(v, mixers):
                raise ValueError(f"{at(f'variants.{v.name}.per_mixer')}: {m!r}: not a mixer of this variant "
                                 f"({', '.join(mixers_of(v, mixers))})")
    evals = []
    for i, e in enumerate(raw.get("evals") or []):
        e = _mapping(e, at(f"evals[{i}]"), EVAL_KEYS)
        if e.get("eval") not in EVAL_MODULES:
            raise ValueError(f"{at(f'evals[{i}].eval')}: {e.get('eval')!r}: unknown eval "
                             f"(known: {', '.join(EVAL_MODULES)})")
        sub = str(e.get("sub") or "")
        if sub and not NAME.fullmatch(sub):
            raise ValueError(f"{at(f'evals[{i}].sub')}: {sub!r}: a sub-folder name (letters, digits, _ and -)")
        only = e.get("variants")
        if only is not None and (not isinstance(only, list) or not only or any(v not in ordered for v in only)):
            raise ValueError(f"{at(f'evals[{i}].variants')}: give a list of the zoo's variants "
                             f"({', '.join(ordered)}): the rows that get this eval")
        entry = EvalEntry(e["eval"], sub, _flags(e.get("flags"), at(f"evals[{i}].flags")), only)
        if any(x.label == entry.label for x in evals):
            raise ValueError(f"{at(f'evals[{i}]')}: {entry.label} is there twice: give one a sub (its sub-folder)")
        evals.append(entry)
    est = _mapping(raw["estimate"], at("estimate"), ESTIMATE_KEYS)
    rates = _mapping(est.get("tokens_per_second") or {}, at("estimate.tokens_per_second"), set(COMMANDS))
    seconds = _mapping(est.get("eval_seconds") or {}, at("estimate.eval_seconds"),
                       {x for e in evals for x in (e.label, e.eval)})
    estimate = {"tokens_per_second": {}, "eval_seconds": {}, "start_seconds": 0.0, "side_by_side": None}
    for key in ("start_seconds", "side_by_side"):
        if key in est:
            estimate[key] = _number(est[key], at(f"estimate.{key}"))
    for command in dict.fromkeys(v.command for v in ordered.values()):
        if command not in rates:
            raise ValueError(f"{at('estimate.tokens_per_second')}.{command}: missing (tokens/s of `linzoo {command}`)")
        estimate["tokens_per_second"][command] = _number(rates[command], at(f"estimate.tokens_per_second.{command}"))
    for e in evals:
        key = e.label if e.label in seconds else e.eval
        if key not in seconds:
            raise ValueError(f"{at('estimate.eval_seconds')}.{e.label}: missing (seconds of one such eval)")
        estimate["eval_seconds"][e.label] = _number(seconds[key], at(f"estimate.eval_seconds.{key}"))
    jobs = _number(raw.get("jobs", 1), at("jobs"), integer=True)
    teacher = raw["teacher"]
    if not isinstance(teacher, str) or not teacher:
        raise ValueError(f"{at('teacher')}: give a Hub id, a folder, a .gguf file or 'embedded'")
    targets = read_targets(raw.get("targets") or {}, at("targets"), ordered, evals)
    train_seconds = _number(raw["train_seconds"], at("train_seconds")) if "train_seconds" in raw else None
    if train_seconds is not None and train_seconds < MIN_TRAIN_SECONDS:
        raise ValueError(f"{at('train_seconds')}: {train_seconds:g}: a training needs at least {MIN_TRAIN_SECONDS} s "
                         "to start")
    return Zoo(str(path), teacher, mixers, jobs, ordered, evals, estimate, targets, train_seconds)


def mixers_of(variant: Variant, mixers: list[str]) -> list[str]:
    """The mixers of `mixers` (the zoo's, in its order) that get `variant`."""
    return [m for m in mixers if variant.mixers is None or m in variant.mixers]


# a target's measure -> what it checks (zoo_report.check_targets reads it off a row and the teacher row)
TARGET_MEASURES = {
    "of_teacher": "each listed length's accuracy (NIAH) or the accuracy (instruct): at least this share of the "
                  "teacher's",
    "perplexity_ratio": "held-out perplexity at most this many times the teacher's",
    "stop_rate": "the share of answers that stop (EOS) within the token budget, at least this",
}


def read_targets(raw, where, variants, evals) -> dict:
    """{variant: {eval label: {measure: value, "at": [lengths]}}}: what a row of that variant must measure; the
    report marks each row's misses. Measures: TARGET_MEASURES."""
    raw = _mapping(raw, where, set(variants))
    labels = {e.label for e in evals}
    out = {}
    for variant, checks in raw.items():
        checks = _mapping(checks, f"{where}.{variant}", labels)
        for label, t in checks.items():
            t = _mapping(t, f"{where}.{variant}.{label}", set(TARGET_MEASURES) | {"at"})
            for measure in TARGET_MEASURES:
                if measure in t:
                    _number(t[measure], f"{where}.{variant}.{label}.{measure}")
            if not set(t) & set(TARGET_MEASURES):
                raise ValueError(f"{where}.{variant}.{label}: give a measure ({', '.join(TARGET_MEASURES)})")
            if "at" in t and (not isinstance(t["at"], list) or not t["at"]):
                raise ValueError(f"{where}.{variant}.{label}.at: give a list of context lengths, e.g. [256, 512]")
            out.setdefault(variant, {})[label] = t
    return out


# ------------------------------------------------------------------------------------------------- plan


@dataclass
class Command:
    label: str  # "train", "eval <eval[/sub]>", "card"
    argv: list[str]  # after `linzoo`
    output: Path  # what it leaves when done: the lineage, the results file, the card
    tokens: int = 0
    command: str = ""  # a training command's name


@dataclass
class Step:
    name: str  # "teacher" or "<mixer>/<variant>"
    folder: Path
    mixer: str | None = None
    variant: str | None = None
    parent: str | None = None  # the step it trains on; None: the teacher
    train: Command | None = None
    evals: list[Command] = field(default_factory=list)
    card: Command | None = None
    out: Path | None = None  # the zoo's folder as given (the prefix of the paths in its commands)

    @property
    def log(self) -> Path:
        return Path(f"{self.folder}.log")

    @property
    def commands(self) -> list[Command]:
        return [c for c in (self.train, *self.evals, self.card) if c is not None]


def eval_commands(zoo: Zoo, model: str, folder: Path, teacher_eval: Path | None, variant: str | None = None
                  ) -> list[Command]:
    """The evals of one row (`teacher_eval`: where the teacher's results are; None: this is the teacher's row,
    which gets every eval; a student's row those whose `variants` list its variant, or that list none)."""
    from linzoo.evals.registry import get_eval

    out = []
    for e in zoo.evals:
        if variant is not None and e.variants is not None and variant not in e.variants:
            continue
        if teacher_eval is None and e.eval in MODEL_FLAGS:  # the teacher is measured in each student's run
            continue
        where = folder / "eval" / e.sub if e.sub else folder / "eval"
        result = get_eval(e.eval).result_file
        extra = []
        if teacher_eval is not None and e.eval in TEACHER_FLAGS:
            extra = TEACHER_FLAGS[e.eval](zoo.teacher, (teacher_eval / e.sub if e.sub else teacher_eval) / result)
        out.append(Command(f"eval {e.label}", ["eval", e.eval, *model_flags(e.eval, zoo.teacher, model), "--out",
                                               str(where), *extra, *e.flags],
                           where / result))
    return out


def plan(zoo: Zoo, out) -> list[Step]:
    """The teacher's evals, then every mixer's variants, parents first: the order steps start in."""
    out = Path(out)
    teacher = Step("teacher", out / "teacher", out=out)
    teacher.evals = eval_commands(zoo, zoo.teacher, teacher.folder, None)
    steps = [teacher]
    for mixer in zoo.mixers:
        for v in zoo.variants.values():
            if mixer not in mixers_of(v, zoo.mixers):
                continue
            folder = out / mixer / v.name
            parent = out / mixer / v.parent if v.parent else None
            tokens = v.tokens_for(mixer)
            argv = [v.command, *COMMANDS[v.command](zoo.teacher, mixer, str(parent)), "--total_tokens", str(tokens),
                    *v.flags_for(mixer), "--output_dir", str(folder)]
            step = Step(f"{mixer}/{v.name}", folder, mixer, v.name, f"{mixer}/{v.parent}" if v.parent else None,
                        Command("train", argv, folder / LINEAGE_FILE, tokens, v.command), out=out)
            step.evals = eval_commands(zoo, str(folder), folder, teacher.folder / "eval", v.name)
            # --overwrite: the folder is the zoo's own, and sft's Trainer leaves its own README.md there
            step.card = Command("card", ["card", str(folder), "--overwrite"], folder / CARD_FILE)
            steps.append(step)
    return steps


# ------------------------------------------------------------------------------------------ state, time


def read_state(out) -> dict:
    """<out>/zoo_state.json, or a new state where there is none. A damaged one (not JSON, cut short, or not the shape
    the build writes) is a one-line ValueError naming the file and the way out, before anything reads it wrongly."""
    path = Path(out) / STATE_FILE
    if not path.is_file():
        return {"schema": "linzoo.zoo_state/v1", "steps": {}}
    try:
        state = json.loads(path.read_bytes())
    except ValueError as err:  # a UnicodeDecodeError too
        why = f"not JSON: {' '.join(str(err).split())}"
    else:
        why = state_problem(state)
    if why:
        raise ValueError(f"{path} is damaged ({why}): move it aside (mv {shlex.quote(str(path))} "
                         f"{shlex.quote(f'{path}.damaged')}) and run again: the build then finds its finished rows "
                         "by their folders")
    return state


JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
              bool: "true or false", type(None): "null"}
# a command's record -> its keys and their types (Build.record, Build.note_start): a finished command's (rc not
# null) has the first five, one only started (rc null) the first two
RECORD_KEYS = {"argv": list, "rc": (int, type(None)), "tokens": (int, float), "seconds": (int, float), "ended": str,
               "label": str, "command": str, "started": str, "out": str, "cwd": str}


def state_problem(state) -> str | None:
    """What in a zoo_state.json's content differs from what the build writes and reads (None: nothing)."""
    if not isinstance(state, dict):
        return f"{JSON_TYPES.get(type(state), type(state).__name__)}, not an object of steps"
    if not isinstance(state.get("steps"), dict):
        return '"steps" is missing' if "steps" not in state else f'"steps" is {JSON_TYPES[type(state["steps"])]}'
    for step, records in state["steps"].items():
        if not isinstance(records, dict):
            return f"steps.{step} is {JSON_TYPES[type(records)]}, not an object of commands"
        for label, record in records.items():
            where = f"steps.{step}.{label}"
            if not isinstance(record, dict):
                return f"{where} is {JSON_TYPES[type(record)]}, not a command's record"
            needed = list(RECORD_KEYS)[:2 if record.get("rc") is None else 5]
            missing = [key for key in needed if key not in record]
            if missing:
                return f"{where} lacks {', '.join(missing)}"
            for key, kind in RECORD_KEYS.items():
                value = record.get(key)
                if key in record and (not isinstance(value, kind) or isinstance(value, bool)):
                    return f"{where}.{key} is {JSON_TYPES.get(type(value), type(value).__name__)}"
            if not all(isinstance(word, str) for word in record["argv"]):
                return f"{where}.argv holds other than words"
    stopped = state.get("stopped", [])
    if not isinstance(stopped, list) or not all(isinstance(s, dict) for s in stopped):
        return '"stopped" is not an array of objects'
    return None


def _where(out) -> dict:
    """What a record keeps to read its paths from another folder: the zoo's folder as given, and the cwd."""
    return {"out": str(out), "cwd": os.getcwd()}


def _absolute(argv: list[str], out: str, cwd: str) -> list[str]:
    """argv with the zoo's folder `out` (as its commands spell it) made absolute from `cwd`."""
    root = os.path.normpath(os.path.join(cwd, out))
    return [root + w[len(out):] if w == out or w.startswith(out.rstrip("/") + "/") else w for w in argv]


def same_command(record: dict, step: Step, cmd: Command) -> bool:
    """Whether a state record is `cmd`'s command line: the same words, or the same once the zoo's folder is made
    absolute on both sides (a build run as `--out runs/zoo` from its clone, read as `--out /abs/runs/zoo` elsewhere)."""
    if record["argv"] == cmd.argv:
        return True
    if not (record.get("out") and record.get("cwd") and step.out is not None):
        return False
    return _absolute(record["argv"], record["out"], record["cwd"]) == _absolute(cmd.argv, str(step.out), os.getcwd())


def is_done(step: Step, cmd: Command, state: dict) -> bool:
    """Whether `cmd` need not run: its output is there (an eval's, measured on the folder's present weights) and
    zoo_state.json records no other command line for it."""
    record = state["steps"].get(step.name, {}).get(cmd.label)
    if not cmd.output.is_file() or (record is not None and not same_command(record, step, cmd)):
        return False
    if cmd.label == "card":  # a README.md may be the Trainer's: the card is done where this build wrote it
        return record is not None and record["rc"] == 0
    if cmd.label.startswith("eval") and step.train is not None:
        from linzoo.evals.common import weights_sha256

        try:
            measured = json.loads(cmd.output.read_text()).get("weights_sha256")
        except (OSError, ValueError):
            return False
        return measured is not None and measured == weights_sha256(str(step.folder))
    return True


def replaced_rows(steps: list[Step], state: dict) -> list[tuple[Step, str]]:
    """The rows whose folder holds a training this zoo file no longer describes, parents first, with why: the zoo file
    changed the row's training command (zoo_state.json records another line for it, finished or killed mid-way), its
    parent is one of them, or its parent was trained again after it (its weights come from a parent that is gone).
    Rebuilding such a row needs its folder out of the way: the trainers refuse a folder of other arguments, and a stale
    descendant would pass for done."""
    found = {}
    for step in steps:
        if step.train is None or not step.folder.is_dir() or not any(step.folder.iterdir()):
            continue
        record = state["steps"].get(step.name, {}).get("train")
        parent_record = state["steps"].get(step.parent, {}).get("train") if step.parent else None
        if record is not None and not same_command(record, step, step.train):
            found[step.name] = (step, f"its training command changed in the zoo file "
                                      f"({argv_change(record['argv'], step.train.argv)})")
        elif step.parent in found:
            found[step.name] = (step, f"its parent {step.parent} is rebuilt")
        elif (record is not None and parent_record is not None and record.get("rc") == 0
              and parent_record.get("rc") == 0 and parent_record.get("ended", "") > record.get("ended", "")):
            found[step.name] = (step, f"its parent {step.parent} was trained again after it "
                                      f"({parent_record['ended']} > {record['ended']})")
    return list(found.values())


def argv_change(old: list[str], new: list[str]) -> str:
    """What differs between two command lines, word by word, each change with the flag it belongs to:
    "--dataset embedded -> long; --max_seq_length 256 -> 512"."""
    import difflib

    changes = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes():
        if op == "equal":
            continue
        first = (old[i1:i2] or new[j1:j2])[0]
        flag = old[i1 - 1] if i1 > 0 and old[i1 - 1].startswith("--") and not first.startswith("--") else ""
        was, now = " ".join(old[i1:i2]) or "(nothing)", " ".join(new[j1:j2]) or "(nothing)"
        changes.append(f"{flag} {was} -> {now}".strip())
    return "; ".join(changes)


def move_aside(step: Step, state: dict, say=print) -> Path | None:
    """Moves a row's folder (replaced, or failing its check) and its log to `<folder>.replaced-N` (the first N free)
    and forgets its commands in `state`: nothing is deleted. A row whose folder is gone: its commands are forgotten
    (None)."""
    if not step.folder.exists():
        state["steps"].pop(step.name, None)
        return None
    n = 1
    while Path(f"{step.folder}.replaced-{n}").exists():
        n += 1
    aside = Path(f"{step.folder}.replaced-{n}")
    step.folder.rename(aside)
    if step.log.is_file():
        step.log.rename(Path(f"{aside}.log"))
    state["steps"].pop(step.name, None)
    say(f"zoo: {step.name}: moved to {aside} (rebuilt from the zoo file)")
    return aside


def descendants(step: Step, steps: list[Step]) -> list[Step]:
    """The rows built from `step`'s weights: its children, theirs, and so on (in plan order, parents first)."""
    names, found = {step.name}, []
    for s in steps:
        if s.parent in names:
            names.add(s.name)
            found.append(s)
    return found


# the end of integrity.verify_folder's reasons: how to mend the file by hand (the zoo builds the row again instead)
MENDS = re.compile(r"; (copy it again|restore it)\b.*$")


def folder_problem(step: Step) -> str | None:
    """Why a finished row's folder is no longer the model its training saved (None: it is): it is gone, it lacks its
    lineage or weights, or `integrity.verify_folder` finds a file that does not read or whose sha256 is not the one
    the lineage records (the weights, config.json)."""
    from linzoo.integrity import verify_folder

    if not step.folder.is_dir():
        return "the folder is gone"
    if not step.train.output.is_file():
        return f"its {step.train.output.name} is gone"
    try:
        verify_folder(step.folder)
    except (OSError, ValueError) as err:
        return MENDS.sub("", " ".join(str(err).split()))
    return None if any(step.folder.glob("*.safetensors")) else "it holds no weights (*.safetensors)"


def broken_rows(steps: list[Step], state: dict) -> list[tuple[Step, str]]:
    """The finished rows (their training recorded as done with this command line, or its lineage there) whose folder
    fails its check (`folder_problem`), parents first, with why. Skipped as done, such a row would pass its broken
    weights on to its evals and children, or stop the build at its first eval with no way on. The rows built from
    one of them are not checked: they are built again with it."""
    found, rebuilt = [], set()
    for step in steps:
        if step.train is None or step.name in rebuilt:
            continue
        record = state["steps"].get(step.name, {}).get("train")
        finished = record is not None and record["rc"] == 0 and same_command(record, step, step.train)
        if not (finished or is_done(step, step.train, state)):
            continue
        why = folder_problem(step)
        if why:
            found.append((step, why))
            rebuilt |= {s.name for s in descendants(step, steps)}
    return found


def rebuild_broken(steps: list[Step], state: dict, say=print) -> list[Step]:
    """Each of `broken_rows`, said in a line, moved aside (`move_aside`: nothing is deleted) with the rows built from
    it, so that the build makes them again; the rows it found."""
    broken = broken_rows(steps, state)
    for step, why in broken:
        rows = descendants(step, steps)
        children = f" and the {len(rows)} row{'s' * (len(rows) != 1)} built from it" if rows else ""
        say(f"zoo: {step.name}: {step.folder} fails its check ({why}): rebuilding it{children}")
        for row in (step, *rows):
            move_aside(row, state, say)
    return [step for step, _ in broken]


def command_seconds(step: Step, cmd: Command, zoo: Zoo, state: dict) -> float:
    """What `cmd` should take: this build's own timings of its kind (training: the same command, the same mixer where
    measured), else the zoo file's figures (slowed down when jobs share a machine: `side_by_side`)."""
    done = [r | {"step": s} for s, records in state["steps"].items() for r in records.values()
            if r.get("rc") == 0 and r.get("seconds")]
    est = zoo.estimate
    alone = (zoo.jobs / est["side_by_side"]) if est["side_by_side"] and zoo.jobs > 1 else 1.0
    if cmd.label == "train":
        for same in ([r for r in done if r.get("command") == cmd.command and r["step"].split("/")[0] == step.mixer],
                     [r for r in done if r.get("command") == cmd.command]):
            if same:
                return cmd.tokens * sum(r["seconds"] for r in same) / sum(r["tokens"] for r in same)
        return (est["start_seconds"] + cmd.tokens / est["tokens_per_second"][cmd.command]) * alone
    same = [r["seconds"] for r in done if r.get("label") == cmd.label]
    if same:
        return sum(same) / len(same)
    return (est["eval_seconds"][cmd.label.split(" ", 1)[1]] if cmd.label != "card" else est["start_seconds"]) * alone


def makespan(tasks: list[tuple[str, float, list[str]]], jobs: int) -> float:
    """Seconds until the last of `tasks` ((name, seconds, names it waits for), in the order they start) ends, `jobs`
    at a time; a task waiting on a name not listed waits on nothing."""
    names = {t[0] for t in tasks}
    ends, running, now, pending = {}, [], 0.0, list(tasks)
    while pending or running:
        for t in list(pending):
            if len(running) >= jobs:
                break
            if all(d not in names or ends.get(d, math.inf) <= now for d in t[2]):
                pending.remove(t)
                running.append((now + t[1], t[0]))
        if not running:  # waiting on a task that cannot end: a loop (read_zoo refuses one)
            raise ValueError(f"tasks wait on each other: {[t[0] for t in pending]}")
        running.sort()
        now, name = running.pop(0)
        ends[name] = now
    return now


def duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 120:
        return f"{seconds} s"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min"


# ----------------------------------------------------------------------------------------------- build


def tasks_of(steps: list[Step]) -> list[dict]:
    """Each step as its tasks: training (waits on the parent's training) and evaluation with the card (waits on the
    step's training and the teacher's evals)."""
    tasks = []
    for s in steps:
        if s.train:
            tasks.append({"name": f"{s.name}:train", "step": s, "commands": [s.train],
                          "after": [f"{s.parent}:train"] if s.parent else []})
        tasks.append({"name": f"{s.name}:eval", "step": s, "commands": [c for c in (*s.evals, s.card) if c],
                      "after": [f"{s.name}:train", "teacher:eval"] if s.train else []})
    return tasks


def job_env(jobs: int, environ=None, cores: int | None = None) -> dict:
    """The environment of each command: with `jobs` side by side, each gets its share of the cores as its threads
    (OMP_NUM_THREADS, which torch reads), unless the caller set that itself. On a 2-core machine a training run beside
    an eval, both with torch's default of a thread per core, trained at 15 tokens/s against ~200 alone."""
    env = dict(os.environ if environ is None else environ)
    if jobs > 1 and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(max(1, (cores or os.cpu_count() or 1) // jobs))
    return env


def die_with_parent():
    """On Linux, what a command runs first: SIGTERM when the zoo's process dies (even by SIGKILL), so that no orphan
    trains on holding its folder's lock (PR_SET_PDEATHSIG; looked up here, not in the forked child)."""
    if sys.platform != "linux":
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    return lambda: prctl(1, signal.SIGTERM)


@contextlib.contextmanager
def holding(out):
    """Holds the zoo's folder `out` for this process: an OS lock (flock) on `<out>/.zoo.lock`, which the kernel lets
    go when the process ends, however it ends (SIGKILL too), and in the file who holds it: pid, host, since. Held by
    another process: a ValueError naming it and what to do. The file stays: the lock is on it, not its being there
    (removing it while another process has it open would let two hold it)."""
    import fcntl
    import socket

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file: give a folder for the zoo (created if missing)")
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by the commands (Python opens it CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(held_by(out, path)) from None
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                  "since": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv}) + "\n").encode())
        yield path
    finally:
        os.close(fd)  # lets go of the lock


def held_by(out: Path, path: Path) -> str:
    """The refusal of a second build on `out`, naming the process that holds its lock file `path`."""
    try:
        holder = json.loads(path.read_text())
        who, stop = f"pid {holder['pid']} on {holder['host']}, since {holder['since']}", f"kill {holder['pid']}"
    except (OSError, ValueError, TypeError, KeyError):  # it has just taken the lock, and not yet written its record
        who, stop = "its record not yet written", "kill it"
    return (f"{out} is in use by another `linzoo zoo` ({who}; it holds {path}): two builds would train over each "
            f"other's rows; wait for it to end, or stop it ({stop}: a later run resumes), then run again "
            "(--dry-run and --check need no lock)")


def hold(out, stack: contextlib.ExitStack):
    """Takes `out`'s lock (`holding`) for the rest of `stack`, and SIGTERM ends this process through its exits:
    the build stops its commands and writes the report, the lock goes with the process."""
    stack.enter_context(holding(out))
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    stack.callback(signal.signal, signal.SIGTERM, previous)


class Build:
    """Runs the plan: tasks start in plan order once what they wait on is done, `jobs` at a time; each command is a
    subprocess; progress lines, zoo_state.json and the report after each step."""

    def __init__(self, zoo: Zoo, steps: list[Step], out, jobs: int, max_seconds: float = 0, say=print):
        self.zoo, self.steps, self.out, self.jobs, self.say = zoo, steps, Path(out), jobs, say
        self.deadline = time.time() + max_seconds if max_seconds else None
        self.state = read_state(out)
        self.tasks = tasks_of(steps)
        self.status = {}  # task name -> "done" | "failed" | "blocked"
        self.ran = set()  # steps that ran a command in this call (their card is written again)
        self.running = {}  # task name -> (task, command index, Popen, started, log file)
        self.counted = set()  # steps whose end was announced
        self.die_with_parent = die_with_parent()

    def seconds_left(self) -> float:
        now, tasks = time.time(), []
        for t in self.tasks:
            if self.status.get(t["name"]) in ("done", "failed", "blocked"):
                continue
            first = self.running[t["name"]][1] if t["name"] in self.running else 0
            secs = sum(command_seconds(t["step"], c, self.zoo, self.state) for c in t["commands"][first:]
                       if not is_done(t["step"], c, self.state))
            if t["name"] in self.running:
                secs = max(0.0, secs - (now - self.running[t["name"]][3]))
            tasks.append((t["name"], secs, t["after"]))
        return makespan(tasks, self.jobs) if tasks else 0.0

    def save_state(self):
        self.out.mkdir(parents=True, exist_ok=True)
        write_json(self.out / STATE_FILE, self.state)

    def record(self, step: Step, cmd: Command, rc: int, seconds: float):
        tokens = cmd.tokens
        if cmd.label == "train" and rc == 0:  # what it trained (a deadline may stop it early)
            tokens = trained_tokens(cmd.output) or tokens
        self.state["steps"].setdefault(step.name, {})[cmd.label] = {
            "label": cmd.label, "argv": cmd.argv, "rc": rc, "seconds": round(seconds, 1), "tokens": tokens,
            "command": cmd.command, "ended": time.strftime("%Y-%m-%d %H:%M:%S"), **_where(self.out)}
        self.save_state()

    def note_start(self, step: Step, cmd: Command):
        """Records a training's command line as it starts (rc None until it ends), so that a row killed mid-training
        whose command then changes in the zoo file is named by `replaced_rows`, not left to the trainer's refusal."""
        record = self.state["steps"].setdefault(step.name, {}).get(cmd.label)
        if record is None or not same_command(record, step, cmd):
            self.state["steps"][step.name][cmd.label] = {
                "label": cmd.label, "argv": cmd.argv, "rc": None, "tokens": cmd.tokens, "command": cmd.command,
                "started": time.strftime("%Y-%m-%d %H:%M:%S"), **_where(self.out)}
            self.save_state()

    def train_deadline(self, cmd: Command) -> list[str] | None:
        """The flags that end a training command by the zoo's `train_seconds` (counted from the first training start
        of this plan: the zoo file and its mixers, kept in zoo_state.json across calls); [] without one; None when its
        time is up."""
        if self.zoo.train_seconds is None:
            return []
        plan_key = f"{self.zoo.path} --mixers {','.join(self.zoo.mixers)}"
        began = self.state.setdefault("train_began", {})
        if plan_key not in began:
            began[plan_key] = time.time()
            self.save_state()
        left = began[plan_key] + self.zoo.train_seconds - time.time()
        if left < MIN_TRAIN_SECONDS:
            return None
        flag = DEADLINE_FLAGS.get(cmd.command)
        return [flag, str(int(left))] if flag else []

    def start_next(self, task, index: int) -> bool | None:
        """Starts the task's first command from `index` that is not done; False when none is left, None when it is a
        training whose time (`train_seconds`) is up."""
        step = task["step"]
        for i in range(index, len(task["commands"])):
            cmd = task["commands"][i]
            if is_done(step, cmd, self.state) and not (cmd.label == "card" and step.name in self.ran):
                continue
            deadline = self.train_deadline(cmd) if cmd.label == "train" else []
            if deadline is None:
                return None
            self.ran.add(step.name)
            if cmd.label == "train":
                self.note_start(step, cmd)
            step.log.parent.mkdir(parents=True, exist_ok=True)
            log = open(step.log, "a")
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} $ linzoo {shlex.join(cmd.argv + deadline)}\n")
            log.flush()
            proc = subprocess.Popen([sys.executable, "-m", "linzoo.cli", *cmd.argv, *deadline], stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    preexec_fn=self.die_with_parent, env=job_env(self.jobs))
            self.running[task["name"]] = (task, i, proc, time.time(), log)
            self.say(f"  {step.name}: {cmd.label} started (log: {step.log})")
            return True
        return False

    def end_task(self, task, status: str, why: str = ""):
        self.status[task["name"]] = status
        step = task["step"]
        if step.name in self.counted or (status == "done" and not task["name"].endswith(":eval")):
            return
        self.counted.add(step.name)
        n = f"[{len(self.counted)}/{len(self.steps)}] {step.name}:"
        took = sum(r.get("seconds", 0) for r in self.state["steps"].get(step.name, {}).values())
        if status == "done" and step.name not in self.ran:
            self.say(f"{n} done earlier (skipped)")
        elif status == "done":
            self.say(f"{n} done in {took:.0f} s, est. left {duration(self.seconds_left())}")
        else:
            self.say(f"{n} {'FAILED: ' if status == 'failed' else ''}{why}")
        from linzoo.zoo_report import write_report

        write_report(self.zoo, self.steps, self.out, self.state, self.status_of)

    def status_of(self, step: Step) -> str:
        names = [f"{step.name}:train"] * bool(step.train) + [f"{step.name}:eval"]
        states = [self.status.get(n) for n in names]
        if all(s == "done" for s in states):
            return "done"
        if any(s in ("failed", "blocked") for s in states):
            return "failed" if "failed" in states else "not run"
        return "running" if any(n in self.running for n in names) else "to do"

    def stop_all(self):
        """Stops what runs (a deadline, an interrupt). A stopped command is no result, but the time it ran is part of
        the build's: zoo_state.json's "stopped" keeps it (scripts/zoo_results.py counts it)."""
        for task, _, proc, _, log in self.running.values():
            proc.terminate()
        stopped = []
        for task, i, proc, began, log in self.running.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
            # stamped once it has exited: the seconds it took to stop are the build's too
            stopped.append({"step": task["step"].name, "label": task["commands"][i].label,
                            "seconds": round(time.time() - began, 1), "ended": time.strftime("%Y-%m-%d %H:%M:%S")})
        self.running.clear()
        if stopped:
            self.state.setdefault("stopped", []).extend(stopped)
            self.save_state()

    def run(self) -> int:
        from linzoo.zoo_report import machine

        self.state["device"] = machine()  # what the report names (a build resumed elsewhere: the last machine)
        pending = list(self.tasks)
        try:
            while pending or self.running:
                if self.deadline and time.time() > self.deadline:
                    self.stop_all()
                    left = len(self.steps) - sum(self.status_of(s) == "done" for s in self.steps)
                    self.say(f"zoo: not finished: the deadline (--max-seconds) came with {left} steps left; run the "
                             "same command again (it resumes)")
                    return 3
                # under `train_seconds` the trainings start first: evals started before them would spend their time
                order = sorted(pending, key=lambda t: not t["name"].endswith(":train")) if self.zoo.train_seconds \
                    else list(pending)
                for task in order:
                    if len(self.running) >= self.jobs:
                        break
                    after = [self.status.get(a) for a in task["after"]]
                    if any(a in ("failed", "blocked") for a in after):
                        pending.remove(task)
                        bad = next(a for a in task["after"] if self.status.get(a) in ("failed", "blocked"))
                        what = "not evaluated" if task["name"].endswith(":eval") and task["step"].train else "not run"
                        self.end_task(task, "blocked", f"{what}: {bad.split(':')[0]} did not finish")
                    elif all(a == "done" for a in after):
                        pending.remove(task)
                        started = self.start_next(task, 0)
                        if started is None:
                            self.end_task(task, "blocked", f"not trained: the zoo's train_seconds "
                                                           f"({self.zoo.train_seconds:g} s) are spent")
                        elif not started:
                            self.end_task(task, "done")
                for name, (task, i, proc, started, log) in list(self.running.items()):
                    rc = proc.poll()
                    if rc is None:
                        continue
                    log.close()
                    del self.running[name]
                    cmd = task["commands"][i]
                    self.record(task["step"], cmd, rc, time.time() - started)
                    if rc != 0:
                        what = " ".join(cmd.argv[:2] if cmd.argv[0] == "eval" else cmd.argv[:1])
                        log = task["step"].log
                        self.end_task(task, "failed", f"`linzoo {what}` exited with {rc}: {last_line(log)} "
                                                      f"(log: {log})")
                    elif not self.start_next(task, i + 1):
                        self.end_task(task, "done")
                time.sleep(0.2)
        finally:
            self.stop_all()
            from linzoo.zoo_report import write_report

            write_report(self.zoo, self.steps, self.out, self.state, self.status_of)
        failed = [s.name for s in self.steps if self.status_of(s) != "done"]
        if failed:
            self.say(f"zoo: FAILED: {', '.join(failed)} did not finish (their logs: <folder>.log); the report: "
                     f"{self.out / 'zoo.md'}")
            return 1
        self.say(f"zoo: done: {len(self.steps)} steps; the report: {self.out / 'zoo.md'}")
        return 0


def trained_tokens(lineage: Path) -> int | None:
    """The tokens a finished training's record (linzoo_training.json) says it trained; None where it has none."""
    try:
        return sum((read_json(lineage).get("tokens") or {}).values()) or None
    except (OSError, ValueError, AttributeError):
        return None


def last_line(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines()[-40:] if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


# ------------------------------------------------------------------------------------------------- CLI


def read_queue(path) -> list[tuple[str, list[str]]]:
    """[(zoo file, its args)] of a queue file: `queue_builds` without the zoos."""
    return [(zoo_file, args) for zoo_file, args, _ in queue_builds(path)]


def queue_builds(path) -> list[tuple[str, list[str], Zoo]]:
    """A queue file (e.g. recipes/135m/gpu-queue.txt): one build a line, `ZOO_FILE [--mixers a,b]` (the zoo file's
    path from the queue's folder), in the order a lent GPU fires them; `#` starts a comment. Returned with each path
    joined to the queue's folder, and the zoo it builds. Each zoo file is read (a bad one is named now, not on the
    GPU)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"queue file {path} does not exist")
    entries = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            words = shlex.split(line, comments=True)
        except ValueError as err:
            raise ValueError(f"{path}:{number}: {err}") from None
        if not words:
            continue
        zoo_file, args = str(path.parent / words[0]), words[1:]
        if args and (len(args) != 2 or args[0] != "--mixers"):
            raise ValueError(f"{path}:{number}: {shlex.join(args)}: a line is a zoo file, then --mixers a,b or nothing")
        if not Path(zoo_file).is_file():
            raise ValueError(f"{path}:{number}: {words[0]!r} is not a zoo file (paths are from the queue's folder)")
        zoo = read_zoo(zoo_file)
        if args:
            choose_mixers(zoo, args[1])
        entries.append((zoo_file, args, zoo))
    return entries


def next_in_queue(queue, results) -> tuple[str, list[str]] | None:
    """The queue's first build that no report under `results` (any `zoo.json` below it, as results/gpu/<date>/ keep
    them) shows complete: the same zoo file's name and mixers, a done row for every step of its plan. None when all
    are."""
    reports = []
    for p in sorted(Path(results).rglob("zoo.json")) if Path(results).is_dir() else []:
        data = read_json(p)
        if isinstance(data, dict) and data.get("schema") == "linzoo.zoo/v1":
            reports.append(data)
    for zoo_file, args, zoo in queue_builds(queue):
        wanted = {s.name for s in plan(zoo, "_")}
        if not any(Path(r.get("zoo_file", "")).name == Path(zoo_file).name and set(report_mixers(r)) == set(zoo.mixers)
                   and wanted <= {row.get("step") for row in r.get("rows") or [] if row.get("state") == "done"}
                   for r in reports):
            return zoo_file, args
    return None


def report_mixers(report: dict) -> list[str]:
    """The mixers a zoo.json built: its `mixers`, or (a report written before it had them) its rows'."""
    return report.get("mixers") or list(dict.fromkeys(row["mixer"] for row in report.get("rows") or []
                                                      if row.get("mixer")))


def choose_mixers(zoo: Zoo, names: str):
    """`--mixers a,b`: the zoo's rows of these mixers only (the teacher's row stays)."""
    chosen = [m.strip() for m in names.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in zoo.mixers]
    if unknown or not chosen:
        raise ValueError(f"--mixers {names}: name mixers of {zoo.path} ({', '.join(zoo.mixers)})")
    zoo.mixers = [m for m in zoo.mixers if m in chosen]


def plan_lines(zoo: Zoo, steps: list[Step], out, jobs: int, state: dict) -> list[str]:
    measured = sum(r.get("rc") == 0 for rec in state["steps"].values() for r in rec.values())
    lines = [f"zoo plan: {zoo.path} -> {out}: {len(zoo.mixers)} mixers, {len(zoo.variants)} variants: "
             f"{len(steps) - 1} students, and the teacher `{zoo.teacher}` evaluated once; {jobs} at a time",
             "each row's evals (results in <folder>/eval[/sub]), then `linzoo card <folder>`:"]
    lines += [f"  eval {e.label:18s} linzoo eval {e.eval} "
              f"{' '.join(model_flags(e.eval, zoo.teacher, '<folder>'))} "
              f"--out <folder>/eval{'/' * bool(e.sub)}{e.sub} {shlex.join(e.flags)}" for e in zoo.evals]
    lines += [f"  ({e.label} measures the teacher beside each student, in the same process: the teacher's row has "
              "none)" for e in zoo.evals if e.eval in MODEL_FLAGS]
    for e in zoo.evals:
        if e.eval in TEACHER_FLAGS:
            flags = shlex.join(TEACHER_FLAGS[e.eval](zoo.teacher, f"{out}/teacher/eval/..."))
            lines.append(f"  ({e.label} of a student adds {flags}: scored against the teacher row's results)")
    tasks = []
    for n, s in enumerate(steps, 1):
        left = [c for c in s.commands if not is_done(s, c, state)]
        secs = {c.label: command_seconds(s, c, zoo, state) for c in left}
        status = "done" if not left else "to do" if len(left) == len(s.commands) else "partly done"
        lines.append(f"[{n:2d}] {s.name:30s} from {s.parent or ('teacher' if s.train else '-'):30s} "
                     f"est. {duration(sum(secs.values())):>10s}  {status}  -> {s.folder}")
        if s.train:
            lines.append(f"     linzoo {shlex.join(s.train.argv)}")
        for t in tasks_of([s]):
            tasks.append((t["name"], sum(secs.get(c.label, 0.0) for c in t["commands"]), t["after"]))
    how = f"this build's timings ({measured} commands) where measured, else " if measured else ""
    lines.append(f"total: est. {duration(makespan(tasks, jobs))} with {jobs} at a time ({how}the zoo file's estimate)")
    return lines


def main(argv: list[str] | None = None) -> int:
    from linzoo.arguments import ArgumentParser

    parser = ArgumentParser(prog="linzoo zoo", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="the zoo file (YAML): teacher, mixers, jobs, variants, evals, estimate")
    parser.add_argument("--next", metavar="QUEUE",
                        help="print the first build of this queue file (`ZOO_FILE [--mixers a,b]` a line) that no "
                             "zoo.json under --results shows complete; runs nothing (exit 1: none is left)")
    parser.add_argument("--results", default="results/gpu", help="where --next looks for reports (default: %(default)s)")
    parser.add_argument("--out", default="runs/zoo", help="the zoo's folder: <out>/<mixer>/<variant>, the report")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and its time estimate; run nothing")
    parser.add_argument("--report-only", action="store_true",
                        help="write the report (zoo.md, zoo.json, zoo.png) of what --out holds; run nothing")
    parser.add_argument("--jobs", type=int, help="steps side by side (default: the zoo file's jobs)")
    parser.add_argument("--mixers", help="build only these of the zoo file's mixers (comma-separated), with the "
                                         "teacher: a part of the zoo that fits one lease")
    parser.add_argument("--max-seconds", type=float, default=0.0,
                        help="stop every running command at this deadline (the next call resumes); 0: none")
    parser.add_argument("--rebuild-changed", action="store_true",
                        help="rows whose folder holds a training the zoo file no longer describes (its command "
                             "changed, or its parent's did): move each folder to <folder>.replaced-N and build it "
                             "again, with its descendants; without it such a build stops first and names them")
    parser.add_argument("--check", action="store_true",
                        help="what the plan would fail on that can be seen now (imports, the teacher, every command's "
                             "flags, the eval data), one line each; runs nothing (a build checks this first)")
    args = parser.parse_args(argv)
    if args.next:
        entry = next_in_queue(args.next, args.results)
        if entry is None:
            print(f"zoo: every build of {args.next} has a complete report under {args.results}")
            return 1
        print(shlex.join([entry[0], *entry[1]]))
        return 0
    if not args.config:
        raise ValueError("give --config ZOO_FILE (or --next QUEUE)")
    zoo = read_zoo(args.config)
    if args.jobs is not None:
        zoo.jobs = int(_number(args.jobs, "--jobs", integer=True))
    if args.mixers is not None:
        choose_mixers(zoo, args.mixers)
    if args.max_seconds < 0 or not math.isfinite(args.max_seconds):
        raise ValueError(f"--max-seconds {args.max_seconds}: give a number of seconds >= 0 (0: no deadline)")
    steps = plan(zoo, args.out)
    say = lambda line: print(line, flush=True)  # noqa: E731
    with contextlib.ExitStack() as held:
        writes = args.report_only or not (args.dry_run or args.check)
        locked = writes and (args.report_only or Path(args.out).is_dir())
        if locked:  # a build already there is named before anything else
            hold(args.out, held)
        state = read_state(args.out)
        if args.report_only:
            from linzoo.zoo_report import write_report

            rows = write_report(zoo, steps, args.out, state)
            print(f"zoo: the report of {sum(r['state'] == 'done' for r in rows)} of {len(rows)} steps done: "
                  f"{Path(args.out) / 'zoo.md'}")
            return 0
        say("\n".join(plan_lines(zoo, steps, args.out, zoo.jobs, state)))
        replaced = replaced_rows(steps, state)
        if args.dry_run:
            for step, why in replaced:
                say(f"zoo: {step.name}: {why}: built again with --rebuild-changed")
        from linzoo.zoo_check import check_plan

        problems = check_plan(args.config, args.mixers, args.out)
        for line in problems:
            say(f"zoo: check: {line}")
        if problems or args.check:
            say(f"zoo: check: {len(problems)} problems" + (": fix them, then run again" if problems else ": ready"))
            return 2 if problems else 0
        if args.dry_run:
            return 0
        if not locked:  # a new folder, made once the check passed (a build it stops leaves none)
            hold(args.out, held)
            state = read_state(args.out)
            replaced = replaced_rows(steps, state)
        for step, why in replaced:
            say(f"zoo: {step.name}: {why}")
            if args.rebuild_changed:
                move_aside(step, state, say=say)
        if replaced and not args.rebuild_changed:
            say(f"zoo: {len(replaced)} rows hold trainings this zoo file no longer describes: pass --rebuild-changed "
                "to move their folders to <folder>.replaced-N (nothing is deleted) and build them again, or run the "
                "zoo file that built them")
            return 2
        if rebuild_broken(steps, state, say=say) or replaced:
            write_json(Path(args.out) / STATE_FILE, state)
        return Build(zoo, steps, args.out, zoo.jobs, args.max_seconds, say=say).run()
