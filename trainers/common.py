"""Pieces shared by the linzoo trainers' configs and scripts."""

import contextlib
import dataclasses
import errno
import json
import math
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..integrity import LINEAGE_FILE, unusable_model, weights_record, write_json  # noqa: F401 (the trainers' writer)
RUN_FILE = "linzoo_run.json"  # the command and arguments a run folder was started with (`run_folder`)
LOCK_FILE = ".linzoo.lock"  # held by the run writing the folder
MAX_EPOCHS = 20  # more passes over the data than this need --allow_many_epochs
# Fields that change how a run is logged, saved or resumed, or which kernels compute the same math, not what it
# computes: a rerun into the same folder may change them (and the output folder may move).
RESULT_NEUTRAL = {"output_dir", "run_name", "report_to", "project", "disable_tqdm", "push_to_hub", "local_rank",
                  "resume_from_checkpoint", "overwrite_output_dir", "allow_many_epochs", "kernel_backend", "debug",
                  "ddp_timeout", "skip_memory_metrics", "enable_jit_checkpoint", "do_train", "do_eval", "do_predict",
                  "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers",
                  "dataloader_prefetch_factor",
                  # a deadline bounds one call: a resumed run goes on under the new one (a stage that stopped at the
                  # old one is done, as it was saved); a zoo with train_seconds resumes its runs with the time left
                  "max_wall_seconds"}
# What the same command may change to go on from the last good save of a run that diverged (`_claim`): the step
# size, its schedule and clipping, and the kernels (a kernel's NaN is ruled out with --kernel_backend torch).
DIVERGENCE_FIXES = {"learning_rate", "stage_learning_rates", "max_grad_norm", "warmup_ratio", "warmup_steps",
                    "lr_scheduler_type", "lr_scheduler_kwargs", "weight_decay", "adam_beta1", "adam_beta2",
                    "adam_epsilon", "kernel_backend"}
RESULT_NEUTRAL_PREFIXES = ("logging_", "log_", "save_", "hub_", "trackio_")


@dataclass
class RunArguments:
    """Fields of all three commands: the run folder, the budget's bound over the data, and the activation checkpointing
    default. List it before the TRL config among the bases so these defaults win."""

    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Start over: delete what an earlier run left in --output_dir (stages, checkpoints, model). "
                          "Without it a rerun resumes that run, and only with the same arguments."},
    )
    allow_many_epochs: bool = field(
        default=False, metadata={"help": f"Allow a token budget of more than {MAX_EPOCHS} passes over the data."}
    )
    gradient_checkpointing: bool | None = field(
        default=None, metadata={"help": "Deprecated alias of --activation_checkpointing (on unless set false)."}
    )

    def check_run(self):
        # Checkpointing is on unless set false. transformers >= 5.2x calls it `activation_checkpointing` and warns
        # (FutureWarning, ahead of any error) on `gradient_checkpointing`; 5.17 knows only `gradient_checkpointing`.
        # Recipes say `gradient_checkpointing` (both versions parse it); where the new name exists the value moves to it.
        if not hasattr(self, "activation_checkpointing"):
            if self.gradient_checkpointing is None:
                self.gradient_checkpointing = True
            return
        if self.activation_checkpointing is None:
            self.activation_checkpointing = True if self.gradient_checkpointing is None else self.gradient_checkpointing
        self.gradient_checkpointing = None


@dataclass
class KDArguments:
    """The knowledge-distillation loss of stage 3 and of instruction-aware distillation."""

    kd_temperature: float = field(default=1.0, metadata={"help": "Softmax temperature of the KL term."})
    kd_alpha: float = field(
        default=0.5, metadata={"help": "loss = (1 - kd_alpha) * CE + kd_alpha * T^2 * KL(teacher || student)."}
    )
    kd_chunk_size: int = field(
        default=1024, metadata={"help": "Positions per chunk when forming vocabulary logits in the KD loss."}
    )

    def check_kd(self):
        if not 0.0 <= self.kd_alpha <= 1.0 or self.kd_temperature <= 0 or self.kd_chunk_size <= 0:
            raise ValueError("kd_alpha must lie in [0, 1]; kd_temperature and kd_chunk_size must be positive.")


@dataclass
class ChatRunArguments(RunArguments):
    """Fields (and defaults over TRL's) shared by the chat-data commands `sft` and `distill-instruct`.
    List it before the TRL config among the bases so these defaults win."""

    dataset: str = field(default="embedded", metadata={"help": "Chats: 'embedded', local files, or a Hub dataset id."})
    max_seq_length: int = field(default=1024, metadata={"help": "Tokens per packed row."})
    total_tokens: int = field(default=5_000_000, metadata={"help": "Token budget (sets max_steps)."})
    packing: bool = field(default=True, metadata={"help": "Pack chats into rows (padding-free)."})
    packing_strategy: str = field(default="bfd", metadata={"help": "TRL packing strategy."})
    whole_chats: bool = field(default=True, metadata={
        "help": "Train only on chats that fit --max_seq_length whole: a longer one is cut, and its completion loses "
                "its end and its end-of-turn token (or all of it), so the student never sees an answer stop."})
    max_answer_tokens: int = field(default=0, metadata={
        "help": "Train only on chats whose answer (the last assistant turn, the completion) is at most this many "
                "tokens; 0: any length. Short answers teach the student to answer and stop (its end-of-turn token "
                "comes early) rather than go on explaining."})
    report_to: list[str] | str | None = field(default="none", metadata={"help": "Trackers (e.g. wandb) or 'none'."})
    logging_steps: float = field(default=10, metadata={"help": "Log every N steps."})
    save_steps: float = field(default=200, metadata={"help": "Checkpoint every N steps."})
    save_total_limit: int | None = field(default=2, metadata={"help": "Checkpoints kept."})

    def check_chat_run(self):
        from ..arguments import check_fields

        check_fields(self)  # types, finite numbers, limits: before any other check, and before anything loads
        if self.max_seq_length <= 0 or self.total_tokens <= 0:
            raise ValueError("max_seq_length and total_tokens must be positive.")
        if self.max_answer_tokens < 0:
            raise ValueError(f"--max_answer_tokens {self.max_answer_tokens}: give a number of tokens >= 1, or 0 for "
                             "answers of any length")
        self.max_length = self.max_seq_length
        default_bf16(self)
        self.check_run()


def refuse_unused(cfg, unused: dict[str, str]):
    """A TrainingArguments field this command sets itself ({name: the flag that does it}), given another value than its
    default: one line naming the flag that counts, where the value was silently replaced. Called on the parsed
    command line (the commands' own `dataclasses.replace` of a stage's arguments sets these fields)."""
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    for name, instead in unused.items():
        if getattr(cfg, name) != defaults[name]:
            raise ValueError(f"--{name} {getattr(cfg, name)} has no effect here: {instead}")


BUDGET_FLAGS = {"max_steps": "the budget is --total_tokens (steps follow from it)",
                "num_train_epochs": "the budget is --total_tokens (epochs follow from it)"}


def default_bf16(cfg):
    """TRL defaults to bf16, which a CPU-only machine rejects: use it only where the GPU supports it. Set true (the GPU
    recipes do) where it is not supported, it gets a line naming the flag; transformers' own says 'assign use_cpu'."""
    supported = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if cfg.bf16 is None:
        cfg.bf16 = supported and not cfg.fp16
    elif cfg.bf16 and not supported and not getattr(cfg, "use_cpu", False):
        raise ValueError("--bf16 true (the GPU recipes' setting) needs a GPU with bf16, and none is visible here: "
                         "pass --bf16 false to train in fp32 on this machine")


def rows_per_step(cfg):
    # Before the Trainer sets up the process group, the launcher's WORLD_SIZE already tells the process count.
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else int(os.environ.get("WORLD_SIZE", 1))
    return cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps * world


def steps_for_tokens(tokens, cfg, seq_len):
    per_step = rows_per_step(cfg) * seq_len
    return max(1, math.ceil(tokens / per_step)), per_step


def check_epochs(cfg, steps, rows):
    """Prints how many passes over the data's `rows` the run's `steps` make. More than MAX_EPOCHS (a budget far beyond
    the data, more often a slip than a plan) only with --allow_many_epochs."""
    epochs = steps * rows_per_step(cfg) / max(rows, 1)
    print(f"linzoo: {steps:,} steps over {rows:,} rows of data = {epochs:,.2f} epochs")
    if epochs > MAX_EPOCHS and not cfg.allow_many_epochs:
        raise ValueError(
            f"--total_tokens {cfg.total_tokens:,} is {epochs:,.0f} passes over the data ({rows:,} rows of at most "
            f"{cfg.max_seq_length} tokens): lower --total_tokens, give more data, or pass --allow_many_epochs true "
            f"for more than {MAX_EPOCHS}."
        )


def parse_config(dataclass_types, argv):
    """TrlParser's `parse_args_and_config` (defaults < YAML --config < flags) with linzoo's one-line errors
    (`linzoo.arguments`); a YAML syntax error becomes a ValueError naming the file and the position."""
    import yaml

    from linzoo.arguments import parse_arguments

    try:
        return parse_arguments(dataclass_types, argv, config=True)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}" if mark else "the file"
        problem = getattr(err, "problem", None) or str(err)
        raise ValueError(f"--config: not valid YAML at {where}: {problem}") from None


def run_arguments(*configs):
    """What decides a run's result: its configs' fields but the RESULT_NEUTRAL ones, as JSON reads them back."""
    values = {}
    for cfg in configs:
        values |= cfg.to_dict() if hasattr(cfg, "to_dict") else dataclasses.asdict(cfg)
    kept = {k: v for k, v in values.items() if k not in RESULT_NEUTRAL and not k.startswith(RESULT_NEUTRAL_PREFIXES)}
    return json.loads(json.dumps(kept, default=str))


def parameter_bytes(model, trainable_only=False) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad or not trainable_only)


def _size(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


class DiskFullError(OSError):
    """A save refused before writing anything: the disk has no room for it. Its strerror is the whole line."""


def check_free_space(folder, need: int):
    """Refuses, before anything is written, a save of about `need` bytes into `folder` (made or not) where the disk has
    less free: a save the disk cuts off leaves half a file."""
    folder = Path(folder)
    free = shutil.disk_usage(next(p for p in (folder, *folder.parents) if p.exists())).free
    if free < need:
        raise DiskFullError(errno.ENOSPC, f"the disk is full at {folder}: {_size(free)} free, a save needs "
                                          f"~{_size(need)}; free space or pass another --output_dir")


def check_usable(model, where: str, fix: str, kept=None):
    """Refuses, before a save, a `model` that is no usable model (`linzoo.integrity.unusable_model`: non-finite
    weights, or finite weights whose logits on a fixed probe are not): a FloatingPointError naming `where` (the stage
    and step), what is wrong, the save that stays the last good one (`kept`, None: nothing was saved) and what to
    change (`fix`). Saves are what mark work done and what a rerun resumes from; the loss check
    (`TeacherStudentTrainer._check_finite`) reads each step's loss, computed before that step's update, so it never
    sees a stage's last update."""
    why = unusable_model(model)
    if why is None:
        return
    raise FloatingPointError(f"{why[0].upper()}{why[1:]} at {where}: not saved; {what_resumes(kept)}. {fix}.")


def what_resumes(kept: str | None) -> str:
    """What the same command, with its diverging flag fixed, goes on from (`_claim` lets such a rerun change it)."""
    if kept:
        return f"the last good checkpoint, {kept}, is kept: the same command with that fixed resumes from it"
    return "no good checkpoint was saved before it: the same command with that fixed starts over"


def lower_learning_rate(args, stage: int | None = None) -> str:
    """What to change when training made the weights non-finite: the learning rate it used (`stage`: linearize's)."""
    if stage is None:
        return f"Lower --learning_rate (it is {args.learning_rate:g})"
    return f"Lower --stage_learning_rates (stage {stage} is {args.learning_rate:g})"


def newest_checkpoint(folder) -> str | None:
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    found = [(int(m[1]), p) for p in (Path(folder).iterdir() if Path(folder).is_dir() else ())
             if (m := re.fullmatch(rf"{PREFIX_CHECKPOINT_DIR}-(\d+)", p.name))]
    return str(max(found)[1]) if found else None


class CheckedSaves:
    """Trainer mixin (first among the bases): each checkpoint is written only with finite weights and room for it on
    the disk (`check_save`), so what a rerun resumes from is always good. `stage` (linearize's 1-3) and `kept_before`
    (the save that stays the last good one until this Trainer's first checkpoint) go into the refusal."""

    stage: int | None = None
    kept_before: str | None = None

    def check_save(self, optimizer: bool):
        """Before saving the model into output_dir at the current step (`optimizer`: a checkpoint, with the optimizer's
        two states per trainable weight)."""
        out = Path(self.args.output_dir)
        where = f"{out.name} step {self.state.global_step} of {self.state.max_steps}"
        check_usable(self.model, where, lower_learning_rate(self.args, self.stage), self.last_good())
        states = 2 * parameter_bytes(self.model, trainable_only=True) if optimizer else 0
        check_free_space(out, parameter_bytes(self.model) + states)

    def last_good(self) -> str | None:
        """The save a rerun would resume from: this Trainer's newest checkpoint (each passed `check_save`), else
        `kept_before`."""
        return newest_checkpoint(self.args.output_dir) or self.kept_before

    def _save_checkpoint(self, *args, **kwargs):
        self.check_save(optimizer=True)
        return super()._save_checkpoint(*args, **kwargs)

    def _load_optimizer_and_scheduler(self, checkpoint):
        """A checkpoint's scheduler state carries the learning rate it was saved under; the run resumed from it (a
        diverged run resumed with a lower rate, `_claim`) trains at this run's rate, from the checkpoint's step."""
        super()._load_optimizer_and_scheduler(checkpoint)
        scheduler = self.lr_scheduler
        if not checkpoint or scheduler is None or not hasattr(scheduler, "lr_lambdas"):
            return
        if any(base != self.args.learning_rate for base in scheduler.base_lrs):
            print(f"linzoo: {Path(checkpoint).name} was saved at learning rate {scheduler.base_lrs[0]:g}; "
                  f"resuming at {self.args.learning_rate:g}")
            scheduler.base_lrs = [self.args.learning_rate] * len(scheduler.base_lrs)
            for group, factor in zip(self.optimizer.param_groups, scheduler.lr_lambdas):
                group["initial_lr"] = self.args.learning_rate
                group["lr"] = self.args.learning_rate * factor(scheduler.last_epoch)
            scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]  # what the next log reports


def with_checked_saves(trainer_cls):
    """`trainer_cls` (TRL's SFTTrainer, GKDTrainer) with `CheckedSaves`."""
    return type(trainer_cls.__name__, (CheckedSaves, trainer_cls), {})


def remove_checkpoints(folder):
    """Deletes the Trainer's checkpoints in `folder` (optimizer states included) and those a killed save left
    (incomplete-checkpoint-*): called once the model they lead to is saved, when nothing resumes from them."""
    for p in Path(folder).glob("*checkpoint-*"):
        if p.is_dir() and re.fullmatch(r"(incomplete-)?checkpoint-\d+(-\d+)?", p.name):
            shutil.rmtree(p)


def already_done(out) -> bool:
    """Whether `out` holds the finished model of its run (its lineage, the last file the run writes): a rerun of the
    same command (`run_folder` checked it is) has nothing to do. Removes what a kill left of the run's cleanup."""
    out = Path(out)
    if not (out / LINEAGE_FILE).is_file():
        return False
    print(f"linzoo: already done: {out} holds the finished model ({LINEAGE_FILE}); --overwrite_output_dir true "
          "starts over")
    if int(os.environ.get("RANK", 0)) == 0:
        remove_checkpoints(out)
    return True


def _claim(out: Path, command: str, arguments: dict, overwrite: bool):
    """Records this run in a new (or emptied, --overwrite_output_dir) folder; in one holding a run, checks that it is
    this one."""
    recorded = json.loads((out / RUN_FILE).read_text()) if (out / RUN_FILE).is_file() else None
    if any(not p.name.startswith(".") for p in out.iterdir()):  # hidden: the lock, a killed write's temporary file
        if recorded is None and not (out / "linzoo_training.json").is_file():
            raise ValueError(f"--output_dir {out} is not empty and holds no {RUN_FILE} (the arguments of the run that "
                             "wrote it): nothing tells whether its files belong to this run. Pick a new or empty folder.")
        if overwrite:
            for p in out.iterdir():
                if p.name != LOCK_FILE:
                    shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
            print(f"linzoo: --overwrite_output_dir: deleted the earlier run in {out}; starting over")
        elif recorded is None:
            raise ValueError(f"{out} holds a run made before linzoo recorded its arguments ({RUN_FILE}): pass "
                             "--overwrite_output_dir true to start over, or pick another --output_dir.")
        else:
            old, new, unset = recorded["arguments"], arguments, "(unset)"
            changed = [k for k in dict.fromkeys([*old, *new]) if old.get(k, unset) != new.get(k, unset)]
            differ = [f"{k} {old.get(k, unset)!r} -> {new.get(k, unset)!r}" for k in changed]
            if recorded["command"] != command:  # another command: not a list of its own fields
                differ = [f"command {recorded['command']!r} -> {command!r}"]
            if differ and recorded.get("diverged") and recorded["command"] == command \
                    and set(changed) <= DIVERGENCE_FIXES:
                print(f"linzoo: {out} holds a {command} run that diverged ({recorded['diverged']}); going on from its "
                      f"last good save (the start, where none was made) with {'; '.join(differ)}")
                write_json(out / RUN_FILE, {"command": command, "arguments": arguments,
                                            "changed_after_divergence": [*recorded.get("changed_after_divergence", []),
                                                                         *differ]})
                return False
            if differ:
                raise ValueError(
                    f"{out} holds a {recorded['command']} run with other arguments ({'; '.join(differ)}): rerun with "
                    "its arguments to resume it, pass --overwrite_output_dir true to start over (deletes its "
                    "contents), or pick another --output_dir."
                )
            return False
    write_json(out / RUN_FILE, {"command": command, "arguments": arguments})
    return True


def _mark_diverged(out: Path, err: FloatingPointError):
    """Notes in the run's record that it stopped on a divergence: the same command with a lower learning rate (any of
    DIVERGENCE_FIXES changed) may then go on from the run's last good save."""
    record = json.loads((out / RUN_FILE).read_text())
    write_json(out / RUN_FILE, {**record, "diverged": str(err).split(":", 1)[0]})


def _only_the_record(out: Path) -> bool:
    return [p.name for p in out.iterdir() if not p.name.startswith(".")] == [RUN_FILE]


def check_apart(out: Path, reads: dict[str, str | None]):
    """The run's folder is none of the model folders it reads, nor holds one: --overwrite_output_dir would delete it
    (and a plain rerun would mix the run's files into it)."""
    for flag, spec in reads.items():
        if not spec or not Path(spec).expanduser().exists():
            continue  # a Hub id, 'embedded'
        read = Path(spec).expanduser().resolve()
        if read == out.resolve() or out.resolve() in read.parents:
            raise ValueError(f"--output_dir {out} {'is' if read == out.resolve() else 'holds'} the model it reads "
                             f"(--{flag} {spec}): pick another --output_dir (e.g. a sibling folder)")


@contextlib.contextmanager
def run_folder(cfg, command, arguments, reads: dict[str, str | None] | None = None):
    """Holds `cfg.output_dir` for the run of `command` with `arguments` (`run_arguments`), before any work: a folder
    that cannot be written fails at once; one in use by another run, or holding a run with other arguments (whose
    stages and checkpoints would be reused), is refused, unless --overwrite_output_dir starts over. The arguments are
    recorded at the start, so a killed run is held to them too; a run that fails before writing anything else (bad
    input) takes its record back, so that the corrected command can use the folder. `reads` ({flag: model spec}) are
    the folders the run reads from, which it may not be (`check_apart`)."""
    from filelock import FileLock, Timeout

    if int(os.environ.get("RANK", 0)) != 0:  # one claimant under torchrun / accelerate launch
        yield
        return
    out = Path(cfg.output_dir)
    check_apart(out, reads or {})
    try:
        out.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out).close()
    except FileExistsError:
        raise ValueError(f"--output_dir {out} is a file: pass a folder (new, or one this command wrote).") from None
    except OSError as err:
        raise ValueError(f"--output_dir {out} is not writable ({err.strerror}): pick another folder.") from None
    lock = FileLock(out / LOCK_FILE, blocking=False)
    try:
        lock.acquire()
    except Timeout:
        raise ValueError(f"--output_dir {out} is in use by another linzoo run (it holds {out / LOCK_FILE}): wait for "
                         "it to finish, or pick another folder.") from None
    try:
        recorded = _claim(out, command, arguments, cfg.overwrite_output_dir)
        try:
            yield
        except BaseException as err:
            if recorded and _only_the_record(out):
                (out / RUN_FILE).unlink()
            elif isinstance(err, FloatingPointError) and (out / RUN_FILE).is_file():
                _mark_diverged(out, err)
            raise
    finally:
        lock.release()


def last_complete_checkpoint(folder):
    """The newest checkpoint-N in `folder` that the Trainer finished writing: its trainer_state.json, the last file
    the Trainer writes into it, reads back at step N. Newer ones (a run killed while saving them) are moved aside to
    incomplete-checkpoint-N, outside the Trainer's checkpoint-* names, with a line each; None when none is complete."""
    from transformers.trainer import TRAINER_STATE_NAME
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    folder = Path(folder)
    found = [(int(m[1]), p) for p in (folder.iterdir() if folder.is_dir() else ())
             if p.is_dir() and (m := re.fullmatch(rf"{PREFIX_CHECKPOINT_DIR}-(\d+)", p.name))]
    for step, path in sorted(found, reverse=True):
        try:
            if json.loads((path / TRAINER_STATE_NAME).read_text())["global_step"] == step:
                return str(path)
        except (OSError, ValueError, KeyError):
            pass
        if int(os.environ.get("RANK", 0)) == 0:
            aside, n = folder / f"incomplete-{path.name}", 1
            while aside.exists():  # an earlier kill at the same step
                aside, n = folder / f"incomplete-{path.name}-{n + 1}", n + 1
            path.rename(aside)
            print(f"linzoo: {path} is incomplete (the run stopped while saving it): not resumed, moved to {aside}")
    return None


def check_same_vocab(student, teacher):
    if student.config.vocab_size != teacher.config.vocab_size:
        recorded = getattr(student.config, "teacher", None)  # what the student was linearized from
        raise ValueError(
            f"Student vocabulary ({student.config.vocab_size}) differs from the teacher's ({teacher.config.vocab_size});"
            " distillation compares logits token by token, so both must share one tokenizer"
            + (f": the student was linearized from {recorded}, pass --teacher with it (or its local folder)."
               if recorded else ".")
        )


def chat_splits(spec, tokenizer=None, cfg=None):
    """The training chats of `spec` as TRL prompt/completion pairs. With the run's `tokenizer` and config: only as many
    chats (in a fixed shuffle, --seed) as --total_tokens needs, with a 10 % margin, so that TRL tokenizes those
    alone (a 640-token run tokenized a whole 20k-chat file); with `whole_chats` (the default) only chats whose
    template fits --max_seq_length. The embedded chats are long (median answer ~340 tokens; 6 % fit 256 tokens): cut
    to 256-token rows, most rows held a prompt alone, no label, and no answer ever ended. With `max_answer_tokens`
    only chats whose answer (the completion) is at most that many tokens."""
    from ..data import load_chat_dataset

    train = load_chat_dataset(spec, split="train")
    if tokenizer is not None and cfg is not None:
        whole = getattr(cfg, "whole_chats", False)
        answer_cap = getattr(cfg, "max_answer_tokens", 0)
        need, seen, picked, looked, long_answers = cfg.total_tokens * 1.1, 0, [], 0, 0
        order = train.shuffle(seed=cfg.seed)
        for batch in order.iter(batch_size=256):
            texts = [tokenizer.apply_chat_template(m, tokenize=False) for m in batch["messages"]]
            answer_lengths = [0] * len(texts)
            if answer_cap:  # the completion to_prompt_completion makes of each chat, in tokens
                answers = [to_prompt_completion({"messages": m})["completion"][0]["content"] for m in batch["messages"]]
                answer_lengths = [len(ids) for ids in tokenizer(answers, add_special_tokens=False)["input_ids"]]
            for ids, answer_length in zip(tokenizer(texts, add_special_tokens=False)["input_ids"], answer_lengths):
                looked += 1
                if answer_cap and answer_length > answer_cap:
                    long_answers += 1
                    continue
                if whole and len(ids) > cfg.max_seq_length:
                    continue
                picked.append(looked - 1)
                seen += min(len(ids), cfg.max_seq_length)
                if seen >= need:
                    break
            if seen >= need:
                break
        if answer_cap and not picked:
            raise ValueError(f"no chat of {spec} has an answer of at most --max_answer_tokens {answer_cap} tokens"
                             + (f" and fits --max_seq_length {cfg.max_seq_length} whole" if whole else "")
                             + ": raise them, or pass --max_answer_tokens 0 for answers of any length")
        if whole and not picked:
            raise ValueError(f"no chat of {spec} fits --max_seq_length {cfg.max_seq_length} whole: raise it, or pass "
                             "--whole_chats false to train on cut chats")
        if len(picked) < len(train):
            cut = looked - len(picked) - long_answers
            fit = f" ({cut:,} longer than --max_seq_length {cfg.max_seq_length} left out)" if whole else ""
            fit += (f" ({long_answers:,} with answers over --max_answer_tokens {answer_cap} left out)"
                    if answer_cap else "")
            short = "" if seen >= need else f"; they hold only {seen:,} tokens, so rows repeat"
            print(f"linzoo: {len(picked):,} of {len(train):,} chats cover --total_tokens {cfg.total_tokens:,}{fit}: "
                  f"training on those{short}")
            train = order.select(picked)
    return train.map(to_prompt_completion, remove_columns=["messages"])


def to_prompt_completion(example):
    """Chat -> TRL prompt/completion: the last assistant turn is the completion (completion-only loss)."""
    messages = example["messages"]
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return {"prompt": messages[:last], "completion": [messages[last]]}


def save_with_lineage(model, tokenizer, out, stage, parent, record, fix="Lower the learning rate", kept=None):
    """Save a loadable folder (weights, modeling files, tokenizer) and its lineage, `linzoo_training.json`:
    the stage (base / instruct / instruct-distilled), the parent it was trained from, and the run's record. The
    lineage comes last and whole (`write_json`): a folder holding it is a finished run. Refused before any write when
    the model is not usable (`fix`, `kept`: see `check_usable`) or the disk has no room for them."""
    out = Path(out)
    check_usable(model, f"the final save of the {stage} student", fix, kept)
    check_free_space(out, parameter_bytes(model))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    # the threads decide a CPU run's last bits (linzoo.zoo.run.job_env): the same command reproduces at the same count
    write_json(out / LINEAGE_FILE, {"stage": stage, "parent": parent, **record,
                                    "torch_threads": torch.get_num_threads(), **weights_record(out)})


def train_resumed(trainer, resume):
    """`trainer.train(resume_from_checkpoint=resume)`; but from a checkpoint at the last step (a run killed after it,
    before its end) the Trainer would train a step more (it checks for the end only after a step), so the checkpoint's
    weights and state are taken as they are and None returned."""
    from transformers.trainer import TRAINER_STATE_NAME, TrainerState

    if resume:
        state = TrainerState.load_from_json(os.path.join(resume, TRAINER_STATE_NAME))
        if state.global_step >= trainer.args.max_steps:
            print(f"linzoo: {resume} is the last step: nothing left to train")
            trainer._load_from_checkpoint(resume)
            trainer.state = state
            return None
    return trainer.train(resume_from_checkpoint=resume)


def check_supervised(trainer, args):
    """Counts, before training, the answer tokens the trainer learns from (its prepared rows' labels that are not -100,
    or those its collator makes of each row: the completions, as cut to --max_seq_length). None, or answers in fewer
    rows than one batch, is a one-line ValueError naming the flag that cut them; else a line says how many."""
    data = trainer.train_dataset
    column = next((c for c in ("labels", "completion_mask", "assistant_masks") if c in data.column_names), None)
    if column is not None:
        ignored = -100 if column == "labels" else 0
        counts = [sum(v != ignored for v in row) for row in data[column]]
    else:  # rows the collator makes at each step (on-policy distillation's chats): its labels, made ahead
        counts = []
        for start in range(0, len(data), 64):
            labels = trainer.data_collator([data[i] for i in range(start, min(start + 64, len(data)))])["labels"]
            counts += (labels != -100).sum(dim=1).tolist()
    tokens, rows = sum(counts), sum(n > 0 for n in counts)
    if rows >= args.per_device_train_batch_size:
        print(f"linzoo: {tokens:,} answer tokens to learn from, in {rows:,} of {len(counts):,} rows")
        return
    found = "no answer token" if tokens == 0 else f"answer tokens in {rows} rows, fewer than one batch " \
                                                  f"(--per_device_train_batch_size {args.per_device_train_batch_size})"
    if not getattr(args, "whole_chats", True):
        raise ValueError(f"--max_seq_length {args.max_seq_length} with --whole_chats false cuts the chats before their "
                         f"answers: {found} is left to learn from; raise --max_seq_length, or drop --whole_chats false "
                         "to train on the chats that fit whole")
    raise ValueError(f"the chats of --dataset {args.dataset} that fit --max_seq_length {args.max_seq_length} leave "
                     f"{found} to learn from: raise --max_seq_length or --total_tokens, or give chats with answers")


def train_and_save(trainer, model, tokenizer, args, model_args, stage, record):
    """Train (resuming from the last complete checkpoint in output_dir), merge LoRA, save with lineage."""
    out = args.output_dir
    check_supervised(trainer, args)
    check_epochs(args, args.max_steps, len(trainer.train_dataset))
    resume = last_complete_checkpoint(out)
    if resume:
        print(f"linzoo: resuming from {resume}")
    start = time.time()
    train_resumed(trainer, resume)
    if model_args.use_peft:
        model = trainer.model.merge_and_unload()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    if trainer.is_world_process_zero():
        save_with_lineage(model, tokenizer, out, stage, model_args.model_name_or_path, {
            "dataset": args.dataset, "tokens": {stage: trainer.state.num_input_tokens_seen or args.total_tokens},
            "seconds": round(time.time() - start, 1), "first_loss": losses[0] if losses else None,
            "final_loss": losses[-1] if losses else None, "lora": bool(model_args.use_peft), **record,
        }, lower_learning_rate(args), newest_checkpoint(out))
        remove_checkpoints(out)  # superseded by the saved model; a rerun finds it done (`already_done`)
    print(f"linzoo: saved the {stage} student to {out}")
    return 0
