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
    known = [s for action in parser._actions for s in action.option_strings if s.startswith("--")]
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
