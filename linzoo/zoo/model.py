"""The zoo file: its format, the dataclasses it reads into (`Zoo`, `Variant`, `EvalEntry`), reading and
validation. The first module of the zoo package: it imports none of the others.

A zoo file is YAML (an unknown key, mixer, command, eval or parent, or a key given twice in one mapping, which YAML
would keep the last of without a word, is a one-line error naming the key):

    teacher: embedded                     # what linearize and distill-instruct learn from, evaluated once
    mixers: all                           # every mixer of the registry, or a list of names
    jobs: 1                               # steps side by side (--jobs overrides)
    threads: 1                            # optional: each command's torch threads (default: the cores over jobs);
                                          # a CPU build gives the same numbers bit for bit only at the same threads
    train_seconds: 540                    # optional: every training ends by then (from the build's first training)
    variants:                             # <out>/<mixer>/<variant>, in this order (parents first)
      base:     {command: linearize, tokens: 20000, flags: [--window_size, "64"]}
      instruct: {command: sft, parent: base, tokens: 20000, flags: [--dataset, embedded]}
      more:     {command: linearize, parent: base, tokens: 40000, flags: [--stage_fractions, "0", "0", "1",
                 --data_offset_tokens, "20000"]}  # a linearize row with a parent trains its student further
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
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path



# command -> the flags the zoo sets for a row: (teacher, mixer, parent folder) -> flags
COMMANDS = {
    # a linearize row with a parent trains the parent's student further (a token ladder: 10M -> 30M -> 100M)
    "linearize": lambda teacher, mixer, parent: ["--teacher", teacher, "--mixer", mixer] + (
        ["--init_student", parent] if parent else []),
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


OWNED = {"--teacher", "--mixer", "--model_name_or_path", "--init_student", "--total_tokens", "--output_dir", "--model",
         "--models", "--out", "--teacher_results"}


TOP_KEYS = {"teacher", "mixers", "jobs", "threads", "variants", "evals", "estimate", "targets", "train_seconds",
            "defaults", "include"}
INCLUDE_KEYS = {"file", "variants"}


VARIANT_KEYS, EVAL_KEYS = ({"command", "parent", "tokens", "flags", "mixers", "per_mixer", "like"},
                           {"eval", "sub", "flags", "variants"})


PER_MIXER_KEYS = {"tokens", "flags"}


# command -> its flag that stops, saves and ends a run at a wall-clock deadline (the zoo's `train_seconds`); a
# training that would start with less than MIN_TRAIN_SECONDS left does not start
DEADLINE_FLAGS = {"linearize": "--max_wall_seconds"}


MIN_TRAIN_SECONDS = 60


ESTIMATE_KEYS = {"tokens_per_second", "start_seconds", "eval_seconds", "side_by_side"}


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


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
    threads: int | None = None  # each command's torch threads; None: the machine's cores over `jobs`


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


def _read_raw(path: Path) -> dict:
    """The zoo file at `path` as YAML reads it (a mapping of TOP_KEYS), before `_expanded`."""
    import yaml

    if not path.is_file():
        raise FileNotFoundError(f"zoo file {path} does not exist")
    try:
        raw = load_yaml_once(path)
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML: {' '.join(str(err).split())}") from None
    return _mapping(raw, f"{path}:", TOP_KEYS)


def _expanded(path: Path, seen: tuple = ()) -> tuple[dict, dict, dict]:
    """(the zoo file at `path` with `include:`, `like:` and `defaults:` written out, every variant it may be `like`,
    their targets):
    what it says only where it differs, resolved into the plain format `read_zoo` checks.

    - `include: FILE` (or a list; or `{file: FILE, variants: [NAME, ...]}`, the path from this file's folder): FILE's
      variants (all, or those named: `[]` none, its variants then serve only as models for `like:`) become rows of
      this file, before its own, with their targets. A name given twice is an error.
    - `like: NAME` on a variant: NAME's variant (of this file, above it, or of an included one) with this one's keys
      in place of its own; `flags` and `per_mixer` merge as a `per_mixer` row does (`merge_flags`: each flag of
      this variant in place of the model's same flag, the others appended; `per_mixer: {MIXER: null}` drops the
      model's row of that mixer, and a model's rows of mixers this file does not build are dropped). It takes NAME's
      targets (an included variant's too) unless `targets:` gives its own. A variant of this file may take the name
      of an included model that is not a row: it is the model from there on.
    - `defaults: {COMMAND: [flags], evals: [flags]}`: the flags under each of this file's own variants of that
      command that have no `like:` (theirs replace the same flag; the others follow), and under each of its evals.
    """
    if path.resolve() in seen:
        raise ValueError(f"{path}: include: the files include each other ({' -> '.join(str(p) for p in seen)})")
    raw, at = dict(_read_raw(path)), lambda key: f"{path}: {key}"  # noqa: E731
    defaults = _mapping(raw.pop("defaults", None) or {}, at("defaults"), {*COMMANDS, "evals"})
    defaults = {k: _flags(v, at(f"defaults.{k}")) for k, v in defaults.items()}
    models, variants, targets, model_targets = {}, {}, {}, {}
    includes = raw.pop("include", None) or []
    for i, inc in enumerate(includes if isinstance(includes, list) else [includes]):
        where = at(f"include[{i}]")
        inc = {"file": inc} if isinstance(inc, str) else _mapping(inc, where, INCLUDE_KEYS)
        if not isinstance(inc.get("file"), str):
            raise ValueError(f"{where}: give a zoo file's path (from this file's folder), or {{file, variants}}")
        other, other_models, other_targets = _expanded(path.parent / inc["file"], (*seen, path.resolve()))
        rows = list(other["variants"]) if inc.get("variants") is None else inc["variants"]
        if not isinstance(rows, list) or any(n not in other["variants"] for n in rows):
            raise ValueError(f"{where}.variants: give a list of {inc['file']}'s variants "
                             f"({', '.join(other['variants'])})")
        for name, v in other_models.items():
            if name in models:
                raise ValueError(f"{where}: {name}: a variant of two included files: include one of them")
            models[name] = v
        model_targets |= other_targets
        variants |= {n: other["variants"][n] for n in rows}
        targets |= {n: t for n, t in (other.get("targets") or {}).items() if n in rows}
    own = raw.get("variants")
    if not isinstance(own, dict) or (not own and not variants):
        raise ValueError(f"{at('variants')}: give a mapping of variant name -> {{command, parent, tokens, flags}}")
    own_targets = raw.get("targets") or {}
    if not isinstance(own_targets, dict):
        raise ValueError(f"{at('targets')}: give a mapping of variant -> {{eval: {{measure: value}}}}")
    for name, v in own.items():
        where = at(f"variants.{name}")
        if name in variants:
            raise ValueError(f"{where}: an included file has a row of this name: name it otherwise")
        v = dict(_mapping(v, where, VARIANT_KEYS))
        like = v.pop("like", None)
        if like is not None:
            if like not in models:
                raise ValueError(f"{where}.like: {like!r}: no such variant above it or in an included file "
                                 f"(known: {', '.join(models) or 'none'})")
            model, zoo_mixers = models[like], raw.get("mixers")
            per_mixer = {m: o for m, o in (model.get("per_mixer") or {}).items()  # a model of another zoo's mixers
                         if not isinstance(zoo_mixers, list) or m in zoo_mixers}
            for m, o in (v.get("per_mixer") or {}).items():  # a mixer's row: its own keys over the model's
                if o is None:  # `MIXER: null`: that mixer's row is the variant's, as the others'
                    per_mixer.pop(m, None)
                    continue
                o = _mapping(o, f"{where}.per_mixer.{m}", PER_MIXER_KEYS)
                base = per_mixer.get(m) or {}
                per_mixer[m] = {**base, **o, "flags": merge_flags(_flags(base.get("flags"), where),
                                                                  _flags(o.get("flags"), f"{where}.per_mixer.{m}"))}
            v = {**model, **v, "flags": merge_flags(_flags(model.get("flags"), where),
                                                    _flags(v.get("flags"), f"{where}.flags"))}
            v["per_mixer"] = per_mixer
            if name not in own_targets and like in model_targets:
                targets[name] = model_targets[like]
        elif v.get("command") in defaults:
            v["flags"] = merge_flags(defaults[v["command"]], _flags(v.get("flags"), f"{where}.flags"))
        models[name] = variants[name] = v
        model_targets.pop(name, None)
        if name in own_targets or name in targets:
            model_targets[name] = own_targets.get(name, targets.get(name))
    raw["variants"], raw["targets"] = variants, targets | own_targets
    if "evals" in defaults:
        raw["evals"] = [{**e, "flags": merge_flags(defaults["evals"], _flags(e.get("flags"), at(f"evals[{i}].flags")))}
                        if isinstance(e, dict) else e for i, e in enumerate(raw.get("evals") or [])]
    return raw, models, model_targets


def read_zoo(path) -> Zoo:
    """The zoo file at `path`, checked whole before anything runs: a ValueError naming the first bad key."""
    from linzoo.evals.registry import EVAL_MODULES
    from linzoo.modeling.mixers import MIXERS

    path = Path(path)
    raw, _, _ = _expanded(path)
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
        if parent is None and v["command"] != "linearize":
            raise ValueError(f"{where}.parent: {v['command']} trains a student further: name its parent variant")
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
    threads = _number(raw["threads"], at("threads"), integer=True) if "threads" in raw else None
    return Zoo(str(path), teacher, mixers, jobs, ordered, evals, estimate, targets, train_seconds, threads)


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


def choose_mixers(zoo: Zoo, names: str):
    """`--mixers a,b`: the zoo's rows of these mixers only (the teacher's row stays)."""
    chosen = [m.strip() for m in names.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in zoo.mixers]
    if unknown or not chosen:
        raise ValueError(f"--mixers {names}: name mixers of {zoo.path} ({', '.join(zoo.mixers)})")
    zoo.mixers = [m for m in zoo.mixers if m in chosen]


def choose_variants(zoo: Zoo, names: str):
    """`--variants a,b`: the zoo's rows of these variants only, with the variants they are trained from (the teacher's
    row stays): a part of a build that fits one machine's time, the rest built later from what it carried."""
    chosen = [v.strip() for v in names.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in zoo.variants]
    if unknown or not chosen:
        raise ValueError(f"--variants {names}: name variants of {zoo.path} ({', '.join(zoo.variants)})")
    keep = set()
    for name in chosen:
        while name is not None and name not in keep:
            keep.add(name)
            name = zoo.variants[name].parent
    zoo.variants = {k: v for k, v in zoo.variants.items() if k in keep}
