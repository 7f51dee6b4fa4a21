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
