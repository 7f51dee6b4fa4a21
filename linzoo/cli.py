"""`linzoo` command line: one entry point, subcommands implemented by each module's `main(argv)`.

An error ends in one line on stderr. A bad input (a ValueError, a missing or unreadable path, hub_cards'
ReleaseError): `linzoo <command>: error: <message>`, exit code 2 (argparse's code for a usage error). Anything
else: `linzoo <command>: unexpected <type>: <message> (re-run with --debug ...)`, exit code 1; but a write that found
the disk full is `linzoo <command>: error: the disk is full at <path>: ...`, exit code 1. `--debug` anywhere on
the command line, or LINZOO_DEBUG=1, lets the exception through with its traceback. SystemExit (argparse's own
errors, --help) and Ctrl-C pass untouched.
"""

import errno
import importlib
import os
import sys

from linzoo.evals.registry import EVAL_MODULES

# subcommand -> (module, help; None: the eval's own `EvalSpec.help`). Each module exposes
# `main(argv: list[str] | None)`, or `module:function` names the function.
COMMANDS = {
    "linearize": ("linzoo.trainers.linearize", "3-stage linearization: attention transfer, hidden-state alignment, KD"),
    "sft": ("linzoo.trainers.sft", "instruction tuning on chat data (TRL SFTTrainer)"),
    "distill-instruct": ("linzoo.trainers.distill_instruct", "instruction-aware distillation from an instruct teacher"),
    **{f"eval {name}": (module, None) for name, module in EVAL_MODULES.items()},
    "card": ("linzoo.hub_cards.card", "write a model card from measured results"),
    "push": ("linzoo.hub_cards.push", "upload one checkpoint to the Hub"),
    "push-zoo": ("linzoo.hub_cards.push_zoo", "upload the zoo (every mixer x base/instruct/instruct-distilled), its Space and collection (dry run by default)"),
    "space": ("linzoo.spaces.niah.app", "run the NIAH Gradio Space locally"),
    "export-zoo": ("linzoo.zoo.transfer:export_main", "write a zoo build's finished rows as the tensors training changed, for another machine"),
    "import-zoo": ("linzoo.zoo.transfer:import_main", "rebuild exported rows from the teacher in a zoo's folder (`linzoo zoo` goes on from them)"),
    "zoo": ("linzoo.zoo.run", "build the zoo: every mixer as base, instruct and instruct-distilled, each evaluated beside the teacher"),
}
DEBUG_FLAG = "--debug"  # exactly this word; `--debug=...` still reaches TrainingArguments' own --debug option
DEBUG_HINT = f"re-run with {DEBUG_FLAG} or LINZOO_DEBUG=1 for the traceback"


def usage():
    lines = ["usage: linzoo <command> [options]   (linzoo <command> --help for its options)", "", "commands:"]
    from linzoo.evals.registry import get_eval

    lines += [f"  {name:18s} {help_ or get_eval(name.split()[1]).help}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", f"{DEBUG_FLAG} anywhere on the command line (or LINZOO_DEBUG=1) shows the traceback of an error"]
    return "\n".join(lines)


def input_error_types() -> tuple[type[Exception], ...]:
    """What linzoo raises for a bad argument, path or file: the message is meant for the person at the terminal.
    Anything else is unexpected (a bug, a crash inside a library, out of memory) and gets the --debug hint."""
    types = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)
    release = sys.modules.get("linzoo.hub_cards.plan")  # not imported -> cannot have been raised
    return types + ((release.ReleaseError,) if release else ())


def raised_by_linzoo(err: BaseException) -> bool:
    """Whether the innermost frame is linzoo's own code, i.e. a check we wrote, not one deep in a library."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_globals.get("__name__", "").split(".")[0] == "linzoo"


# What torch's and safetensors' writers say when the disk fills mid-file (they raise RuntimeError and SafetensorError,
# not an OSError): torch's zip writer "[enforce fail at inline_container.cc] . unexpected pos N vs M" or
# "PytorchStreamWriter failed writing file ...", safetensors the Rust IoError "StorageFull, No space left on device".
DISK_FULL_WORDS = ("No space left on device", "StorageFull", "unexpected pos",
                   "PytorchStreamWriter failed writing file")


def output_dir(argv: list[str]) -> str:
    """The command line's --output_dir, or words for it (a --config file may have set it)."""
    for i, arg in enumerate(argv):
        if arg == "--output_dir" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--output_dir="):
            return arg.split("=", 1)[1]
    return "the output folder"


def disk_full_line(err: BaseException, argv: list[str]) -> str | None:
    """The one line for an error (or one it came from) that says the disk is full; None for any other. linzoo's own
    refusal before a save (`trainers.common.check_free_space`) says what it measured; a write that failed mid-file
    names its path, else the run's --output_dir, and the rerun that resumes."""
    trainers = sys.modules.get("linzoo.trainers.common")  # not imported -> cannot have been raised
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if trainers and isinstance(err, trainers.DiskFullError):
            return err.strerror
        enospc = isinstance(err, OSError) and err.errno == errno.ENOSPC
        if enospc or any(words in str(err) for words in DISK_FULL_WORDS):
            where = (err.filename if enospc else None) or output_dir(argv)
            return f"the disk is full at {where}: free space and run the same command again (it resumes)"
        err = err.__cause__ or err.__context__
    return None


def error_line(prog: str, err: Exception, bad_input: bool) -> str:
    message = " ".join(line.strip() for line in str(err).splitlines() if line.strip()) or type(err).__name__
    if not bad_input:
        return f"{prog}: unexpected {type(err).__name__}: {message} ({DEBUG_HINT})"
    if not raised_by_linzoo(err):  # e.g. a ValueError from transformers: maybe the input, maybe a bug
        return f"{prog}: error: {message} ({DEBUG_HINT})"
    return f"{prog}: error: {message}"


def run(name: str, argv: list[str], debug: bool) -> int:
    prog = f"linzoo {name}"
    sys.argv = [prog, *argv]
    try:
        module, _, function = COMMANDS[name][0].partition(":")
        result = getattr(importlib.import_module(module), function or "main")(argv)
    except Exception as err:  # SystemExit (argparse, --help) and KeyboardInterrupt pass through untouched
        if debug:
            raise
        full = disk_full_line(err, argv)
        if full:
            print(f"{prog}: error: {full}", file=sys.stderr)
            return 1
        if isinstance(err, FloatingPointError) and raised_by_linzoo(err):  # training diverged: the flags' fault
            print(f"{prog}: error: {error_line(prog, err, True).split(': error: ', 1)[1]}", file=sys.stderr)
            return 2
        bad_input = isinstance(err, input_error_types())
        print(error_line(prog, err, bad_input), file=sys.stderr)
        return 2 if bad_input else 1
    return result if isinstance(result, int) else 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = DEBUG_FLAG in argv or os.environ.get("LINZOO_DEBUG", "").lower() not in ("", "0", "false", "no")
    argv = [arg for arg in argv if arg != DEBUG_FLAG]
    for words in (2, 1):
        name = " ".join(argv[:words])
        if len(argv) >= words and name in COMMANDS:
            return run(name, argv[words:], debug)
    wants_help = bool(argv) and argv[-1] in ("-h", "--help")  # `linzoo --help`, `linzoo eval --help`
    if argv and not argv[0].startswith("-") and not (argv[0] == "eval" and (len(argv) == 1 or wants_help)):
        import difflib

        name = " ".join(argv[:2]) if argv[0] == "eval" else argv[0]
        close = difflib.get_close_matches(name, COMMANDS, n=1, cutoff=0.6)
        print(f"linzoo: unknown command {name!r}{f' (did you mean {close[0]!r}?)' if close else ''}: `linzoo --help` "
              "lists the commands", file=sys.stderr)
        return 2
    print(usage(), file=sys.stdout if wants_help else sys.stderr)
    return 0 if wants_help else 2


if __name__ == "__main__":
    sys.exit(main())
