"""`linzoo` command line: one entry point, subcommands implemented by each module's `main(argv)`."""

import importlib
import sys

# subcommand -> (module, help). Each module exposes `main(argv: list[str] | None)`.
COMMANDS = {
    "linearize": ("linzoo.trainers.linearize", "3-stage linearization: attention transfer, hidden-state alignment, KD"),
    "sft": ("linzoo.trainers.sft", "instruction tuning on chat data (TRL SFTTrainer)"),
    "distill-instruct": ("linzoo.trainers.distill_instruct", "instruction-aware distillation from an instruct teacher"),
    "eval niah": ("linzoo.evals.niah", "needle-in-a-haystack retrieval (JSON + heatmap)"),
    "eval quality": ("linzoo.evals.quality", "zero-shot tasks, perplexity, KL and teacher recovery (JSON + bars)"),
    "card": ("linzoo.hub_cards.card", "write a model card from measured results"),
    "push": ("linzoo.hub_cards.push", "upload one checkpoint to the Hub"),
    "push-zoo": ("linzoo.hub_cards.push_zoo", "upload the 7 x 3 zoo and its collection (dry-run by default)"),
    "space": ("linzoo.hub_cards.space", "run the NIAH Gradio Space locally"),
}


def usage():
    lines = ["usage: linzoo <command> [options]   (linzoo <command> --help for its options)", "", "commands:"]
    lines += [f"  {name:18s} {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    for words in (2, 1):
        name = " ".join(argv[:words])
        if len(argv) >= words and name in COMMANDS:
            module = importlib.import_module(COMMANDS[name][0])
            sys.argv = [f"linzoo {name}", *argv[words:]]
            result = module.main(argv[words:])
            return result if isinstance(result, int) else 0
    print(usage(), file=sys.stderr if argv and argv[0] not in ("-h", "--help") else sys.stdout)
    return 0 if argv[:1] in (["-h"], ["--help"]) else 2


if __name__ == "__main__":
    sys.exit(main())
