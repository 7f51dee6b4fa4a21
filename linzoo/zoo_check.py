"""What a zoo's plan would fail on that can be seen before anything runs (`linzoo zoo --check`, and the first thing
every build does): a module the plan imports that is missing, a teacher that is not there, a training command or an
eval whose flags do not parse, the quality eval's data. On a lent GPU a minute found here is a minute not lost."""

from __future__ import annotations

import importlib
import os
import shlex
from pathlib import Path

from linzoo.zoo import Step, Zoo

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
    seen = set()
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
            if spec.name == "quality":
                errors += quality_data(cmd.argv)
    return errors


def check_plan(config: str, mixers: str | None, out: str) -> list[str]:
    """`check` of a zoo file's plan (`--mixers` as the command line gives them), in a process of its own: the
    trainers' argument classes ask CUDA about bf16, and the zoo's own process, which lives through the build, should
    not hold a CUDA context on the card its commands share."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_check_plan, (config, mixers, out))


def _check_plan(config: str, mixers: str | None, out: str) -> list[str]:
    from linzoo.zoo import choose_mixers, plan, read_zoo

    zoo = read_zoo(config)
    if mixers is not None:
        choose_mixers(zoo, mixers)
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
