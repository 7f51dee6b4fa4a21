"""Command-line parsing for linzoo's commands: transformers' `HfArgumentParser` on the commands' dataclasses, TRL's
`TrlParser` where a command also takes `--config FILE.yaml` (defaults < YAML < flags).

What linzoo adds is the errors: each is one ValueError line (the `linzoo` CLI prints it as `linzoo <command>: error:
...`), where argparse printed the whole usage (~150 lines for the trainers' TrainingArguments) and transformers
`Some specified arguments are not used by the HfArgumentParser`: a bad value names the flag and the value, an unknown
flag or YAML key names the closest known one.
"""

from __future__ import annotations

import argparse
import difflib


def _one_line(base):
    class Parser(base):
        def error(self, message):  # argparse: print the usage, exit 2
            raise ValueError(f"{message} (`{self.prog} --help` lists the options)")

    return Parser


def _unknown(parser, words: list[str], source: str) -> str:
    """'unknown option --mixr (did you mean --mixer?)' for what the parser left over."""
    known = [next(s for s in action.option_strings if s.startswith("--")) for action in parser._actions
             if any(s.startswith("--") for s in action.option_strings)]  # each option's first (canonical) spelling
    flags = [w.split("=")[0] for w in words if w.startswith("-")]
    if not flags:
        return f"unexpected argument {' '.join(words)!r}: every option is a --flag (`{parser.prog} --help`)"
    named = []
    for flag in flags:
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
        named.append(flag + (f" (did you mean {close[0]}?)" if close else ""))
    if source == "yaml":
        named = [n.replace("--", "", 1).replace("(did you mean --", "(did you mean ") for n in named]
        return f"unknown key{'s' if len(named) > 1 else ''} in the --config file: {', '.join(named)}"
    return f"unknown option{'s' if len(named) > 1 else ''} {', '.join(named)} (`{parser.prog} --help` lists them)"


def parse_arguments(dataclass_types, argv: list[str] | None, config: bool = False) -> tuple:
    """The dataclasses of `dataclass_types` filled from `argv` (and, with `config`, from the YAML file of
    `--config`), or a one-line ValueError."""
    if config:
        from trl import TrlParser

        if argv is not None:  # TrlParser takes the file from "--config FILE" only
            argv = [part for arg in argv for part in (arg.split("=", 1) if arg.startswith("--config=") else [arg])]

        parser = _one_line(TrlParser)(dataclass_types)
        parser.add_argument("--config", metavar="FILE.yaml", default=argparse.SUPPRESS,
                            help="defaults from a YAML file of these options (flags given beside it override it)")
        *parsed, from_yaml, from_flags = parser.parse_args_and_config(argv, return_remaining_strings=True,
                                                                      separate_remaining_strings=True)
        if from_yaml:
            raise ValueError(_unknown(parser, from_yaml, "yaml"))
    else:
        from transformers import HfArgumentParser

        parser = _one_line(HfArgumentParser)(dataclass_types)
        _, unknown = parser.parse_known_args(argv)  # before the dataclasses' own checks, which may read a model
        if unknown:
            raise ValueError(_unknown(parser, unknown, "flags"))
        *parsed, from_flags = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    if from_flags:
        raise ValueError(_unknown(parser, from_flags, "flags"))
    return tuple(parsed)


class ArgumentParser(_one_line(argparse.ArgumentParser)):
    """argparse for the commands that are not dataclasses (card, push, push-zoo, space), with the same one-line
    errors, "did you mean" for an unknown flag (before argparse's own "required" error hides it), and each
    --dashed-option also taken as --underscored_option, as the trainers' and evals' options are."""

    def parse_args(self, args=None, namespace=None):
        import sys

        known = {s for action in self._actions for s in action.option_strings}
        args, unknown = list(sys.argv[1:] if args is None else args), []
        for i, arg in enumerate(args):
            name, eq, value = arg.partition("=")
            if not name.startswith("--") or name in known:
                continue
            dashed = "--" + name[2:].replace("_", "-")
            if dashed in known:
                args[i] = dashed + eq + value
            elif not any(k.startswith(name) for k in known):  # argparse takes a unique prefix
                unknown.append(arg)
        if unknown:
            raise ValueError(_unknown(self, unknown, "flags"))
        return super().parse_args(args, namespace)


# Limits of the TrainingArguments fields our commands take as they are. The dataclasses we own say theirs in a class
# attribute LIMITS ({field: {"min", "max", "below", "unique"}}; HfArgumentParser hands a field's metadata to argparse,
# which takes no other keys), and "choices" in the field's metadata, which argparse checks on the command line.
TRAINER_LIMITS = {
    "per_device_train_batch_size": {"min": 1}, "per_device_eval_batch_size": {"min": 1},
    "gradient_accumulation_steps": {"min": 1}, "learning_rate": {"min": 0}, "weight_decay": {"min": 0},
    "warmup_steps": {"min": 0}, "max_grad_norm": {"min": 0},
    "adam_beta1": {"min": 0, "below": 1}, "adam_beta2": {"min": 0, "below": 1}, "adam_epsilon": {"min": 0},
    "logging_steps": {"min": 0}, "save_steps": {"min": 0}, "save_total_limit": {"min": 1}, "seed": {"min": 0},
    "dataloader_num_workers": {"min": 0}, "lmbda": {"min": 0, "max": 1}, "beta": {"min": 0, "max": 1},
    "temperature": {"min": 0}, "max_new_tokens": {"min": 1},
}


def _field_types(cls) -> dict:
    import typing

    try:
        return typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 (an annotation this Python cannot resolve: that field's type goes unchecked)
        return {}


def _cast(value, kind, flag):
    """`value` as `kind` (int, float, str or bool), or a one-line ValueError. YAML hands numbers such as 1e-3 over as
    strings, and whole numbers as ints where a float is meant: both are taken."""
    import math

    if kind is bool:
        if isinstance(value, bool):
            return value
        raise ValueError(f"{flag} {value!r}: give true or false")
    if kind is str:
        if isinstance(value, (dict, list, tuple)):
            raise ValueError(f"{flag} {value!r}: give one value, not a {type(value).__name__}")
        return str(value)
    try:
        number = float(value) if isinstance(value, str) else value
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            raise TypeError
    except (TypeError, ValueError):
        raise ValueError(f"{flag} {value!r}: give a {'whole ' if kind is int else ''}number") from None
    if not math.isfinite(number):
        raise ValueError(f"{flag} {value!r}: give a finite number")
    if kind is int:
        if number != int(number):
            raise ValueError(f"{flag} {value!r}: give a whole number")
        return int(number)
    return float(number)


def check_fields(cfg) -> None:
    """One validation pass over a parsed command's dataclass, before anything loads (each command's __post_init__
    calls it first). Every field whose value is not its default is checked against its annotation: whole numbers,
    finite numbers, true/false; a list field's YAML scalar becomes a one-element list (a YAML string is never split
    into characters) and its items are cast; then the field's limits (the class's LIMITS, or TRAINER_LIMITS for the
    TrainingArguments fields; "choices" in its metadata): min, max, below (exclusive), choices, and unique (a repeated item is refused: it would
    be counted twice). A bad value is a one-line ValueError naming the flag."""
    import dataclasses
    import typing

    hints = _field_types(type(cfg))
    own = {name: rule for c in reversed(type(cfg).__mro__) for name, rule in vars(c).get("LIMITS", {}).items()}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name, None)
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
        if value is None or (default is not dataclasses.MISSING and _same(value, default)):
            continue
        kind, flag = hints.get(f.name), f"--{f.name}"
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if typing.get_origin(kind) in (typing.Union, getattr(__import__("types"), "UnionType", None)):
            kind = args[0] if len(args) == 1 else None  # X | None: X; other unions go unchecked
            args = list(typing.get_args(kind))
        if typing.get_origin(kind) is list and len(args) == 1 and args[0] in (int, float, str):
            items = list(value) if isinstance(value, (list, tuple)) else [value]
            value = [_cast(v, args[0], flag) for v in items]
        elif kind in (int, float, str, bool):
            value = _cast(value, kind, flag)
        else:
            continue
        limits = {**TRAINER_LIMITS.get(f.name, {}), **own.get(f.name, {}),
                  **({"choices": f.metadata["choices"]} if "choices" in f.metadata else {})}
        for item in value if isinstance(value, list) else [value]:
            _check_limits(item, limits, flag)
        if limits.get("unique") and isinstance(value, list):
            repeated = sorted({str(v) for v in value if value.count(v) > 1})
            if repeated:
                raise ValueError(f"{flag} {' '.join(map(str, value))}: {', '.join(repeated)} given more than once; "
                                 "name each once")
        setattr(cfg, f.name, value)


def _same(value, default) -> bool:
    try:
        return bool(value == default)
    except Exception:  # noqa: BLE001 (values that do not compare: check them)
        return False


def _check_limits(value, limits: dict, flag: str) -> None:
    if "choices" in limits and value not in limits["choices"]:
        raise ValueError(f"{flag} {value!r}: pick one of {', '.join(map(str, limits['choices']))}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if "min" in limits and value < limits["min"]:
        raise ValueError(f"{flag} {value:g}: give at least {limits['min']:g}")
    if "max" in limits and value > limits["max"]:
        raise ValueError(f"{flag} {value:g}: give at most {limits['max']:g}")
    if "below" in limits and value >= limits["below"]:
        raise ValueError(f"{flag} {value:g}: give less than {limits['below']:g}")
