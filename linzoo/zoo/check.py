"""What a zoo's plan would fail on that can be seen before anything runs (`linzoo zoo --check`, and the first thing
every build does, and `--dry-run`): a module the plan imports that is missing, a teacher that is not there, a
training command or an eval whose flags do not parse or that its own checks refuse (those its `main` runs before any
model loads), the quality eval's data. On a lent GPU a minute found here is a minute not lost."""

from __future__ import annotations

import importlib
import os
import shlex
import tempfile
from pathlib import Path

from linzoo.integrity import write_json

from .model import TEACHER_FLAGS, Zoo, choose_mixers, choose_variants, read_zoo
from .plan import Step, plan

# What a plan imports beyond linzoo's own dependencies, and the wheels that carry it (a lent machine's image lacks
# them: `../shared/device/prepare.sh` bundles these). fla, tilelang and mlstm_kernels are imported on CUDA only.
NEEDS = {
    "fla": ("flash_linear_attention", "fla_core"),
    "tilelang": ("tilelang", "apache_tvm_ffi", "torch_c_dlpack_ext", "z3_solver"),  # a correct GDN backward on Hopper
    "gguf": ("gguf",),
    "trl": ("trl",),
    "datasets": ("datasets", "dill", "multiprocess"),
    "lm_eval": ("lm_eval", "sacrebleu", "portalocker", "tabulate", "lxml", "chardet", "colorama", "more_itertools"),
    "mlstm_kernels": ("mlstm_kernels",),
}
# a training command -> the dataclasses its command line fills (what `linzoo <command>` parses)
TRAIN_TYPES = {
    "linearize": ("linzoo.trainers.linearize_config", ("LinearizeConfig",)),
    "sft": ("linzoo.trainers.sft", ("LinzooSFTConfig", "trl:ModelConfig")),
    "distill-instruct": ("linzoo.trainers.distill_instruct_config", ("InstructDistillConfig", "trl:ModelConfig")),
}


def needed_modules(zoo: Zoo, steps: list[Step], cuda: bool) -> list[str]:
    """The modules of NEEDS the plan imports: lm_eval with the quality eval, gguf with a GGUF teacher, and on CUDA
    the packages of the rows' mixers' kernels (the registry's `fast_kernels`) with tilelang."""
    from linzoo.modeling.kernels import FUSED_OPS
    from linzoo.modeling.mixers import MIXER_CLASSES

    evals = {e.eval for e in zoo.evals}
    kernels = [FUSED_OPS, *(MIXER_CLASSES[m].fast_kernels for m in {s.mixer for s in steps if s.mixer})]
    packages = {path.split(".")[0] for k in kernels if k is not None for path in k.paths.values()}
    wanted = {"tilelang": cuda, "gguf": zoo.teacher == "embedded" or zoo.teacher.endswith(".gguf"), "trl": True,
              "datasets": True, "lm_eval": "quality" in evals} | {p: cuda for p in packages}
    return [m for m in NEEDS if wanted.get(m)]


def _dataclasses(command: str) -> tuple:
    module, names = TRAIN_TYPES[command]
    out = []
    for name in names:
        where, _, attr = name.rpartition(":")
        out.append(getattr(importlib.import_module(where or module), attr))
    return tuple(out)


def check(zoo: Zoo, steps: list[Step], cuda: bool | None = None) -> list[str]:
    """Every problem found, one line each (empty: ready)."""
    import torch
    from transformers import HfArgumentParser

    from linzoo.arguments import _one_line
    from linzoo.evals.registry import get_eval
    from linzoo.trainers.common import parse_config

    cuda = torch.cuda.is_available() if cuda is None else cuda
    errors = []
    for m in needed_modules(zoo, steps, cuda):
        try:
            importlib.import_module(m)
        except Exception as err:  # noqa: BLE001 - any failure to import is the finding
            errors.append(f"the plan imports {m}, which is not importable here ({type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''}): install {', '.join(NEEDS[m])}")
    teacher = zoo.teacher
    if teacher != "embedded" and (teacher.startswith((".", "/", "~")) or teacher.endswith(".gguf")) \
            and not Path(teacher).expanduser().exists():
        errors.append(f"teacher {teacher}: no such file or folder")
    for step in steps:  # each row's training command through its own parser: an unknown or bad flag
        if step.train is None:
            continue
        try:
            types = _dataclasses(step.train.command)
        except ImportError:  # a module the plan needs, listed above: its flags cannot be read here
            continue
        try:
            parse_config(types, step.train.argv[1:])
        except (ValueError, SystemExit) as err:
            errors.append(f"{step.name}: `linzoo {step.train.command}` would fail: {err}")
    seen, parsed = set(), {}
    for step in steps:  # each eval's flags (once per eval of the file): argparse's own check of names and values
        for cmd in step.evals:
            if cmd.label in seen:
                continue
            seen.add(cmd.label)
            spec = get_eval(cmd.argv[1])
            if spec.arguments is None:
                continue
            try:
                parser = _one_line(HfArgumentParser)(spec.arguments, prog=f"linzoo eval {spec.name}")
                _, unknown = parser.parse_known_args(cmd.argv[2:])
            except ValueError as err:  # a value argparse refuses ("invalid int value: 'x'")
                errors.append(f"{cmd.label}: {err}")
                continue
            if unknown:
                errors.append(f"{cmd.label}: unknown flags {shlex.join(unknown)} (`linzoo eval {spec.name} --help` "
                              "lists them)")
                continue
            data = quality_data(cmd.argv) if spec.name == "quality" else []
            errors += data
            parsed[cmd.label] = spec if not data else None  # the eval's own check of the data would say it again
    with tempfile.TemporaryDirectory(prefix="linzoo-check-") as tmp:
        errors += eval_refusals(zoo, steps, parsed, Path(tmp), cuda)
    return errors


def eval_refusals(zoo: Zoo, steps: list[Step], parsed: dict, tmp: Path, cuda: bool) -> list[str]:
    """What each eval command refuses when it starts (`linzoo.arguments.parse_arguments` on its dataclass: the
    eval's own checks of its values, which `main` runs before any model loads, such as niah's depths in [0, 1]),
    for the evals of `parsed` ({label: EvalSpec}, those whose flags argparse took). Checked on the teacher's row and
    on a student's (the zoo gives a student's run more flags), one line per eval.

    What the plan has yet to make stands in for itself: a row's folder not trained yet is a folder of the teacher's
    config.json in `tmp` (a student keeps its teacher's; the eval reads only config.json before it loads), and the
    teacher's results a student's run compares with (TEACHER_FLAGS), not measured yet, are left out. Without `cuda`
    a plan's `--device cuda` is checked as the CPU, as `needed_modules` leaves out what CUDA imports: a GPU's plan is
    read anywhere, and checked whole on its GPU."""
    from linzoo.arguments import parse_arguments
    from linzoo.loading import read_config

    try:
        teacher_config = read_config(zoo.teacher)
    except (OSError, ValueError):  # named by the teacher's row below (its own eval reads it)
        teacher_config = {}
    stand_ins = {}  # a row's folder not trained yet -> its stand-in
    for step in steps:
        if step.train is not None and not (step.folder / "config.json").is_file():
            stand_in = tmp / f"row{len(stand_ins):04d}"  # one width: no stand-in's name starts another's
            stand_in.mkdir()
            write_json(stand_in / "config.json", teacher_config)
            stand_ins[str(step.folder)] = str(stand_in)
    results_flags = set()  # the flags that give a student's run the teacher's results: their word before the file
    for flags in TEACHER_FLAGS.values():
        words = flags(zoo.teacher, "\0")
        results_flags.add(words[words.index("\0") - 1])
    refusals, checked = [], set()
    for step in steps:
        for cmd in step.evals:
            if parsed.get(cmd.label) is None or (cmd.label, step.train is None) in checked:
                continue
            checked.add((cmd.label, step.train is None))
            argv = []
            for word in cmd.argv[2:]:
                if argv[-1:] and argv[-1] in results_flags and not Path(word).is_file():
                    argv.pop()
                    continue
                if not cuda and (argv[-1:] == ["--device"] and word.startswith("cuda")
                                 or word.startswith("--device=cuda")):
                    word = "--device=cpu" if word.startswith("--") else "cpu"
                argv.append(stand_ins.get(word, word))
            try:
                parse_arguments(parsed[cmd.label].arguments, argv)
            except (OSError, ValueError) as err:
                why = " ".join(str(err).split())
                for real, stand_in in stand_ins.items():
                    why = why.replace(stand_in, real)
                if not any(line.startswith(f"{cmd.label}: ") or line.endswith(f": {why}") for line in refusals):
                    refusals.append(f"{cmd.label}: {why}")  # an eval's first; a teacher that is not there once
    return refusals


def check_plan(config: str, mixers: str | None, out: str, variants: str | None = None) -> list[str]:
    """`check` of a zoo file's plan (`--mixers` as the command line gives them), in a process of its own: the
    trainers' argument classes ask CUDA about bf16, and the zoo's own process, which lives through the build, should
    not hold a CUDA context on the card its commands share."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_check_plan, (config, mixers, out, variants))


def _check_plan(config: str, mixers: str | None, out: str, variants: str | None = None) -> list[str]:

    zoo = read_zoo(config)
    if mixers is not None:
        choose_mixers(zoo, mixers)
    if variants is not None:
        choose_variants(zoo, variants)
    return check(zoo, plan(zoo, out))


def quality_data(argv: list[str]) -> list[str]:
    """The quality eval reads its five sets from --data_dir or $EVAL_DATA, else from the Hub: a folder that lacks one,
    or neither while offline, fails after the training."""
    from linzoo.evals.quality import TASKS

    folder = argv[argv.index("--data_dir") + 1] if "--data_dir" in argv[:-1] else os.environ.get("EVAL_DATA")
    if folder:
        missing = [t for t in TASKS if not (Path(folder) / f"{t}.jsonl").is_file()]
        return [f"eval quality reads the five sets from {folder}, which lacks {', '.join(missing)}.jsonl"] if missing \
            else []
    if os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        return ["eval quality: no --data_dir and no $EVAL_DATA, and the Hub is offline: point EVAL_DATA at a folder "
                "of the five sets (<task>.jsonl)"]
    return []
