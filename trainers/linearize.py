"""`linzoo linearize`: teacher -> linear student in three stages, one run.

    linzoo linearize --teacher embedded --mixer gated_deltanet --total_tokens 20000000 \
        --max_seq_length 2048 --per_device_train_batch_size 8 --bf16 true --output_dir runs/gdn-135m
    linzoo linearize --config recipes/135m/linearize.yaml --mixer gla   # YAML < flags

Stages (budget split by --stage_fractions, default 0.1/0.2/0.7): 1 attention transfer (only mixers
train), 2 hidden-state alignment, 3 knowledge distillation. Each stage checkpoints under
<output_dir>/stageN-*; a rerun of the same command skips finished stages and resumes the running one
from its last complete checkpoint (same stage, same step; one a kill cut short is moved aside). No
save holds a model with non-finite weights or non-finite logits on a fixed probe; a run that diverged goes on
from its last good save when rerun with a lower --stage_learning_rates (or clipping). What nothing resumes from is deleted: a stage's checkpoints once it is
saved, its weights once the next stage is, and all of them once the student is (each stage's
stage_done.json summary stays); a rerun of a finished run has nothing to do. The
arguments are recorded in <output_dir>/linzoo_run.json when a run starts: a rerun with others is refused
(`--overwrite_output_dir true` starts over). The final folder loads with
`AutoModelForCausalLM.from_pretrained(<output_dir>, trust_remote_code=True)`.
"""

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

import torch
from transformers import set_seed

from ..integrity import LINEAGE_FILE
from .common import (BUDGET_FLAGS, already_done, check_epochs, check_same_vocab, last_complete_checkpoint,
                     parse_config, refuse_unused, remove_checkpoints, run_arguments, run_folder, save_with_lineage,
                     steps_for_tokens, train_resumed, unusable_model, write_json)
from .deadline import WallClockDeadline, stage_deadline
from .linearize_config import LinearizeConfig
from .linearize_trainer import AttentionTransferTrainer, HiddenAlignmentTrainer, KnowledgeDistillationTrainer

DONE_FILE = "stage_done.json"  # a finished stage's summary, written after its weights
STAGES = (
    ("stage1-attention-transfer", AttentionTransferTrainer),
    ("stage2-hidden-alignment", HiddenAlignmentTrainer),
    ("stage3-kd", KnowledgeDistillationTrainer),
)


def check_compatible(teacher, tokenizer, max_seq_length):
    """Clear errors for what would otherwise fail deep inside training."""
    vocab = teacher.config.vocab_size
    if len(tokenizer) > vocab:
        raise ValueError(
            f"Tokenizer has {len(tokenizer)} tokens but the teacher's vocabulary is {vocab}: they do not belong "
            "together. Pass the teacher's own tokenizer (a folder holding both)."
        )
    limit = teacher.config.max_position_embeddings
    if max_seq_length > limit:
        raise ValueError(
            f"--max_seq_length {max_seq_length} is longer than the teacher allows ({limit} positions); "
            f"use --max_seq_length {limit} or less."
        )


def set_trainable(student, what):
    """`what` = "mixers": only the linear mixers train (a hybrid's softmax layers stay frozen); "all": everything."""
    for name, p in student.named_parameters():
        layer = name.split(".")[2] if name.startswith("model.layers.") else None
        in_mixer = layer is not None and ".self_attn." in name and int(layer) not in student.config.attn_layers
        p.requires_grad_(in_mixer or what == "all")


def finished_stage(out: Path, before: int = len(STAGES)) -> Path | None:
    """The folder of the last stage before `before` that finished (its stage_done.json), None if none did."""
    return next((out / name for name, _ in reversed(STAGES[:before]) if (out / name / DONE_FILE).is_file()), None)


def remove_stage_weights(stage_dir: Path):
    """Deletes what a finished stage saved but its summary (stage_done.json): once a later stage, or the whole run,
    is saved, nothing loads it."""
    for p in stage_dir.iterdir() if stage_dir.is_dir() else ():
        if p.name != DONE_FILE:
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


def run_stage(index, student, teacher, tokenizer, dataset, args, deadline=None, record=None):
    """Trains one stage and saves it; `record`: more of the run's numbers its stage_done.json keeps."""
    name, trainer_cls = STAGES[index]
    out = Path(args.output_dir)
    stage_dir = out / name
    steps, per_step = steps_for_tokens(args.stage_tokens()[index], args, args.max_seq_length)
    cfg = dataclasses.replace(
        args, output_dir=str(stage_dir), max_steps=steps, learning_rate=args.stage_learning_rates[index],
        run_name=f"{Path(args.output_dir).name}-{name}",
    )
    set_trainable(student, args.stage_trainable[index])
    kept_before = finished_stage(out, index)
    trainer = trainer_cls(model=student, args=cfg, train_dataset=dataset, processing_class=tokenizer,
                          teacher_model=teacher, stage=index + 1, kept_before=kept_before and str(kept_before))
    stop = WallClockDeadline(stage_deadline(deadline, args.stage_tokens(), index)) if deadline else None
    if stop:
        trainer.add_callback(stop)
    resume = last_complete_checkpoint(stage_dir)
    if resume:
        print(f"linzoo: resuming {name} from {resume}")
    print(f"linzoo: {name}: {steps} steps x {per_step} tokens = {steps * per_step:,} tokens")
    start = time.time()
    result = train_resumed(trainer, resume)
    seconds = time.time() - start
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    done_before = int(Path(resume).name.split("-")[-1]) if resume else 0  # steps of an earlier, killed run
    done = trainer.state.global_step  # = steps, unless the deadline stopped the stage early
    steady = sorted(trainer.throughput_log)
    summary = {
        "stage": name, "steps": done, "tokens": done * per_step, "learning_rate": cfg.learning_rate,
        "seconds": round(seconds, 1),
        "resumed_at_step": done_before if resume else None,
        # this run's tokens over its wall time (start-up, compilation and saving included) ...
        "tokens_per_second": round((done - done_before) * per_step / seconds, 1),
        # ... and the median over logging intervals after the first (the training loop's own speed)
        "tokens_per_second_steady": steady[len(steady) // 2] if steady else None,
        "first_loss": losses[0] if losses else None, "final_loss": losses[-1] if losses else result and result.training_loss,
        **(record or {}),
    }
    if stop and stop.stopped:
        summary.update(planned_steps=steps, stopped_at_deadline=True)
        print(f"linzoo: {name} stopped at its deadline after {done} of {steps} steps; saved")
    trainer.check_save(optimizer=False)
    trainer.save_model(str(stage_dir))
    if trainer.is_world_process_zero():
        write_json(stage_dir / DONE_FILE, summary)
        # superseded, now that this stage is saved: its checkpoints, and the earlier stages' weights
        remove_checkpoints(stage_dir)
        for earlier, _ in STAGES[:index]:
            remove_stage_weights(out / earlier)
    trainer.accelerator.wait_for_everyone()
    return summary


def calibration_ids(text, tokenizer, tokens=LinearizeConfig.calibration_tokens, length=512):
    """The first `tokens` tokens of the training text, packed into rows of `length` (whatever the training rows'
    length: decays are chosen on the context the student will be used at), as [rows, length] ids for
    `linearize(calibration=)`; None for 0 tokens. The defaults are `linzoo linearize`'s on a 512-position teacher."""
    if tokens <= 0:
        return None
    from ..data import pack_dataset

    rows = pack_dataset(text, tokenizer, min(length, tokens), max_tokens=tokens)
    return torch.tensor(rows["input_ids"])


AUTO_ATTN_SAMPLES = 8  # passkey prompts the teacher's heads are scored on for --attn_layers auto:K
TEACHER_HEADS = "eval/teacher/heads.json"  # where the run keeps that scoring, beside the student's own evals


def choose_attn_layers(teacher, tokenizer, k: int, out: Path) -> list[int]:
    """--attn_layers auto:K: score the teacher's heads on passkey prompts of up to 512 tokens (`linzoo eval heads`,
    no ablation), keep it in <out>/eval/teacher/, and return the K layers whose best head retrieves most."""
    from ..evals.heads import choose_layers, describe_top, save_heads, score_heads

    if k >= teacher.config.num_hidden_layers:
        raise ValueError(f"--attn_layers auto:{k} keeps every one of the teacher's {teacher.config.num_hidden_layers} "
                         "layers as softmax attention: pick fewer")
    length = min(512, teacher.config.max_position_embeddings)
    results = score_heads(teacher, tokenizer, [length], AUTO_ATTN_SAMPLES, ablation=False,
                          model_name=teacher.config._name_or_path)
    save_heads(results, (out / TEACHER_HEADS).parent)
    layers = choose_layers(results, k)
    print(f"linzoo: --attn_layers auto:{k} keeps softmax attention at layers {layers} (the teacher's best retrieval "
          f"heads: {describe_top(results)})")
    return layers


def attn_layers_choice(out: Path, args, layers) -> dict | None:
    """The record's account of why the hybrid keeps its softmax `layers`: auto:K's rule and the scores behind it."""
    if not args.auto_attn_layers or not (out / TEACHER_HEADS).is_file():
        return None
    scores = json.loads((out / TEACHER_HEADS).read_text())["layer_scores"]
    return {"rule": f"auto:{args.auto_attn_layers}", "by": "the teacher's retrieval-head score (linzoo eval heads)",
            "scores": {str(l): round(scores[l], 3) for l in layers}, "heads_file": TEACHER_HEADS}


def heldout_probe(student, teacher, tokenizer, args) -> dict | None:
    """Perplexity on `--heldout_probe_tokens` of the text's held-out split (the test split of linzoo.data's rule),
    beside the teacher's and with the KL to it (`evals.quality.heldout_metrics`); None when off. Measured where
    training starts (each stage's stage_done.json keeps it, for a run that resumes after a stage) and where it ends."""
    from ..evals.common import load_texts
    from ..evals.quality import heldout_metrics

    if not args.heldout_probe_tokens:
        return None
    was_training = student.training
    student.eval()
    with torch.no_grad():
        texts = load_texts(args.dataset, split="test")
        result = heldout_metrics(student, tokenizer, texts, args.heldout_probe_tokens, teacher, batch_size=2)
    student.train(was_training)
    return {k: result[k] for k in ("perplexity", "teacher_perplexity", "kl_to_teacher", "heldout_tokens")}


def kept_start(summaries: list[dict]) -> dict | None:
    """The start's held-out numbers as a finished stage's summary kept them, None where none did."""
    return next((s["heldout_start"] for s in summaries if s.get("heldout_start")), None)


def linearize_run(args: LinearizeConfig):
    reads = {"teacher": args.teacher, "init_student": args.init_student}
    with run_folder(args, "linearize", run_arguments(args), reads):
        return _linearize(args)


def _linearize(args: LinearizeConfig):
    from .. import linearize, load_teacher
    from ..convert import fresh_parameters
    from ..data import load_chat_dataset, load_text_dataset, pack_dataset, with_chats, with_repeats
    from ..loading import load_model
    from ..modeling import LinzooForCausalLM

    deadline = time.time() + args.max_wall_seconds if args.max_wall_seconds else None  # from the command's start
    out, writer = Path(args.output_dir), int(os.environ.get("RANK", 0)) == 0  # one writer under torchrun
    if already_done(out):
        if writer:
            for name, _ in STAGES:  # what a kill during the run's last cleanup left
                remove_stage_weights(out / name)
        student, tokenizer = load_model(str(out))
        return student, tokenizer, json.loads((out / LINEAGE_FILE).read_text())
    teacher, tokenizer = load_teacher(args.teacher)
    # auto:K's head scoring and the fitted start run where the training will: on the GPU they take seconds; on its
    # host's CPU, beside five other runs, the scoring alone took 6-8 minutes of a 9-minute train phase (H100, 2026-12-05)
    teacher.to(args.device)
    check_compatible(teacher, tokenizer, args.max_seq_length)
    text = with_repeats(load_text_dataset(args.dataset, split="train"), args.repeat_every, args.seed)
    if args.chat_fraction > 0:
        text = with_chats(text, load_chat_dataset(args.chat_dataset, split="train"), tokenizer, args.chat_fraction, args.seed)
    offset_rows = args.data_offset_tokens // args.max_seq_length
    dataset = pack_dataset(text, tokenizer, args.max_seq_length, max_tokens=args.data_offset_tokens + args.total_tokens)
    if offset_rows:
        if len(dataset) <= offset_rows:
            raise ValueError(f"--data_offset_tokens {args.data_offset_tokens:,}: the text ({args.dataset}) has only "
                             f"{len(dataset) * args.max_seq_length:,} tokens: lower it, or give more text")
        dataset = dataset.select(range(offset_rows, len(dataset)))
    check_epochs(args, sum(steps_for_tokens(n, args, args.max_seq_length)[0] for n in args.stage_tokens() if n),
                 len(dataset))
    summaries, student, last, start_probe = [], None, finished_stage(out), None
    for index, (name, _) in enumerate(STAGES):
        stage_dir = out / name
        if args.stage_tokens()[index] == 0:
            continue
        if (stage_dir / DONE_FILE).is_file():
            # only the last finished stage keeps its weights (`remove_stage_weights`): the run goes on from them
            print(f"linzoo: {name} already finished" + (f", loading {stage_dir}" if stage_dir == last else ""))
            if stage_dir == last:
                if not (stage_dir / "config.json").is_file():
                    raise ValueError(f"{stage_dir} finished, but its weights were removed (a later stage of this run "
                                     "was saved, and its files are gone since): pass --overwrite_output_dir true to "
                                     "start over")
                student = LinzooForCausalLM.from_pretrained(stage_dir, dtype=torch.float32)
                why = unusable_model(student)
                if why is not None:  # saved by a linzoo that checked only the weights
                    raise ValueError(f"{stage_dir} finished, but is no usable model ({why}): pass "
                                     "--overwrite_output_dir true to start over, with lower --stage_learning_rates")
                if writer:
                    remove_checkpoints(stage_dir)  # what a kill right after the stage's save left
            summaries.append(json.loads((stage_dir / DONE_FILE).read_text()))
            continue
        if student is None and args.init_student is not None:
            student = load_model(args.init_student)[0].float().to(args.device)
            print(f"linzoo: training {args.init_student} further ({student.config.mixer}, softmax layers "
                  f"{list(student.config.attn_layers) or 'none'})")
        if student is None:
            set_seed(args.seed)  # the new parameters' initialisation, like the Trainer's own randomness, follows --seed
            calibration = calibration_ids(text, tokenizer, args.calibration_tokens,
                                          min(512, teacher.config.max_position_embeddings))
            attn_layers = (choose_attn_layers(teacher, tokenizer, args.auto_attn_layers, out) if args.auto_attn_layers
                           else args.attn_layers)
            student = linearize(teacher, args.mixer, calibration=calibration, attn_layers=attn_layers,
                                kernel_backend=args.kernel_backend, window_size=args.window_size)
            check_same_vocab(student, teacher)
            if calibration is not None:
                report = student.calibration_report
                errors = [v["error"] for k, v in report.items() if isinstance(k, int)]
                print(f"linzoo: fitted the fresh student to the teacher on {calibration.numel():,} tokens in "
                      f"{report['seconds']} s (mean attention-output error on them {sum(errors) / max(len(errors), 1):.3f})")
        if start_probe is None:  # before any stage has finished, the student here is where training starts (a
            # stage resumed from a checkpoint loads it inside run_stage); after one, its summary kept the start's
            start_probe = kept_start(summaries) or heldout_probe(student, teacher, tokenizer, args)
        summaries.append(run_stage(index, student, teacher, tokenizer, dataset, args, deadline,
                                   {"heldout_start": start_probe} if start_probe else None))
    start_probe = start_probe or kept_start(summaries)  # every stage had finished before this call
    end_probe = heldout_probe(student, teacher, tokenizer, args) if start_probe else None
    if end_probe is not None:
        ratio = lambda p: p["perplexity"] / p["teacher_perplexity"]  # noqa: E731
        print(f"linzoo: held-out perplexity ({end_probe['heldout_tokens']:,} tokens of {args.dataset}'s test split): "
              f"start {start_probe['perplexity']:.1f} ({ratio(start_probe):.2f}x the teacher's), end "
              f"{end_probe['perplexity']:.1f} ({ratio(end_probe):.2f}x; teacher {end_probe['teacher_perplexity']:.1f})")
        if end_probe["perplexity"] > start_probe["perplexity"]:
            print(f"linzoo: warning: the trained student is worse on held-out text than where it started "
                  f"({end_probe['perplexity']:.1f} > {start_probe['perplexity']:.1f}): lower --stage_learning_rates, "
                  "or train more tokens")
    for p in student.parameters():
        p.requires_grad_(True)
    student.config.teacher = args.teacher if args.teacher != "embedded" else teacher.config._name_or_path
    record = {
        "teacher": student.config.teacher, "mixer": args.mixer, "dataset": args.dataset,
        "max_seq_length": args.max_seq_length, "total_tokens": args.total_tokens,
        "stage_fractions": args.stage_fractions, "stage_learning_rates": args.stage_learning_rates,
        "stage_trainable": args.stage_trainable, "kd_temperature": args.kd_temperature, "kd_alpha": args.kd_alpha,
        "calibration_tokens": args.calibration_tokens,
        "repeat_every": args.repeat_every, "chat_fraction": args.chat_fraction,
        "init_student": args.init_student, "data_offset_tokens": args.data_offset_tokens,
        "heldout_probe": None if end_probe is None else {"start": start_probe, "end": end_probe},
        "chat_dataset": args.chat_dataset if args.chat_fraction > 0 else None,
        "tokens": {s["stage"]: s["tokens"] for s in summaries}, "stages": summaries,
        "new_parameters": sorted({name.split(".self_attn.")[1] for name in fresh_parameters(student)}),
        "attn_layers": list(student.config.attn_layers), "attn_layers_choice": attn_layers_choice(out, args, student.config.attn_layers),
    }
    if writer:
        kept = finished_stage(out)
        save_with_lineage(student, tokenizer, out, "base", student.config.teacher, record,
                          "Lower --stage_learning_rates", kept and str(kept))
        for name, _ in STAGES:  # superseded by the saved student; their stage_done.json summaries stay
            remove_stage_weights(out / name)
    record["stage"] = "base"
    print(f"linzoo: saved the {args.mixer} student to {out}")
    return student, tokenizer, record


def main(argv=None):
    (args,) = parse_config(LinearizeConfig, argv)
    refuse_unused(args, {**BUDGET_FLAGS, "learning_rate": "each stage's is --stage_learning_rates (three numbers)"})
    student, tokenizer, record = linearize_run(args)
    for s in record["stages"]:
        steady = s.get("tokens_per_second_steady")  # the loop's own speed; else wall time (start-up included)
        speed = f"{steady} (steady)" if steady else f"{s.get('tokens_per_second')} (wall)"
        first, final = ("n/a" if v is None else f"{v:.4g}" for v in (s["first_loss"], s["final_loss"]))
        print(f"  {s['stage']:28s} tokens {s['tokens']:>10,}  loss {first} -> {final}"
              f"  tokens/s {speed}")
    # Greedy samples: a text continuation (what a base student was distilled on) and, where the tokenizer has one,
    # the chat template's answer to the same question (the teacher's own format).
    question = "What is the capital of France?"
    prompts = {"text": ("The capital of France is", "The capital of France is")}
    if tokenizer.chat_template:
        prompts["chat"] = (question, tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                                                   add_generation_prompt=True, tokenize=False))
    for kind, (shown, prompt) in prompts.items():
        inputs = tokenizer(prompt, return_tensors="pt").to(student.device)
        with torch.no_grad():
            out = student.eval().generate(**inputs, max_new_tokens=24, do_sample=False)
        text = tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        print(f"sample ({kind}): {shown!r} -> {text!r}")
    return 0


if __name__ == "__main__":
    main()
