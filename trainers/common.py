"""Pieces shared by the linzoo trainers' configs and scripts."""

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..integrity import LINEAGE_FILE, weights_record


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
class ChatRunArguments:
    """Fields (and defaults over TRL's) shared by the chat-data commands `sft` and `distill-instruct`.
    List it before the TRL config among the bases so these defaults win."""

    dataset: str = field(default="embedded", metadata={"help": "Chats: 'embedded', local files, or a Hub dataset id."})
    max_seq_length: int = field(default=1024, metadata={"help": "Tokens per packed row."})
    total_tokens: int = field(default=5_000_000, metadata={"help": "Token budget (sets max_steps)."})
    packing: bool = field(default=True, metadata={"help": "Pack chats into rows (padding-free)."})
    packing_strategy: str = field(default="bfd", metadata={"help": "TRL packing strategy."})
    report_to: list[str] | str | None = field(default="none", metadata={"help": "Trackers (e.g. wandb) or 'none'."})
    logging_steps: float = field(default=10, metadata={"help": "Log every N steps."})
    save_steps: float = field(default=200, metadata={"help": "Checkpoint every N steps."})
    save_total_limit: int | None = field(default=2, metadata={"help": "Checkpoints kept."})

    def check_chat_run(self):
        if self.max_seq_length <= 0 or self.total_tokens <= 0:
            raise ValueError("max_seq_length and total_tokens must be positive.")
        self.max_length = self.max_seq_length
        default_bf16(self)


def default_bf16(cfg):
    """TRL defaults to bf16, which a CPU-only machine rejects: use it only where the GPU supports it."""
    if cfg.bf16 is None:
        cfg.bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported() and not cfg.fp16


def steps_for_tokens(tokens, cfg, seq_len):
    # Before the Trainer sets up the process group, the launcher's WORLD_SIZE already tells the process count.
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else int(os.environ.get("WORLD_SIZE", 1))
    per_step = cfg.per_device_train_batch_size * cfg.gradient_accumulation_steps * seq_len * world
    return max(1, math.ceil(tokens / per_step)), per_step


def to_prompt_completion(example):
    """Chat -> TRL prompt/completion: the last assistant turn is the completion (completion-only loss)."""
    messages = example["messages"]
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return {"prompt": messages[:last], "completion": [messages[last]]}


def save_with_lineage(model, tokenizer, out, stage, parent, record):
    """Save a loadable folder (weights, modeling files, tokenizer) and its lineage, `linzoo_training.json`:
    the stage (base / instruct / instruct-distilled), the parent it was trained from, and the run's record."""
    out = Path(out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / LINEAGE_FILE).write_text(json.dumps({"stage": stage, "parent": parent, **record, **weights_record(out)},
                                               indent=1))


def train_and_save(trainer, model, tokenizer, args, model_args, stage, record):
    """Train (resuming from the last checkpoint in output_dir), merge LoRA, save with lineage."""
    from transformers.trainer_utils import get_last_checkpoint

    out = args.output_dir
    resume = os.path.isdir(out) and get_last_checkpoint(out) is not None
    start = time.time()
    trainer.train(resume_from_checkpoint=True if resume else None)
    if model_args.use_peft:
        model = trainer.model.merge_and_unload()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    save_with_lineage(model, tokenizer, out, stage, model_args.model_name_or_path, {
        "dataset": args.dataset, "tokens": {stage: trainer.state.num_input_tokens_seen or args.total_tokens},
        "seconds": round(time.time() - start, 1), "first_loss": losses[0] if losses else None,
        "final_loss": losses[-1] if losses else None, "lora": bool(model_args.use_peft), **record,
    })
    print(f"linzoo: saved the {stage} student to {out}")
    return 0
