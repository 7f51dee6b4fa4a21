"""`linzoo sft`: instruction tuning of a student on chat data with TRL's SFTTrainer.

    linzoo sft --model_name_or_path runs/gdn-135m --dataset embedded --output_dir runs/gdn-135m-instruct \
        --max_seq_length 1024 --total_tokens 5000000
    linzoo sft --config recipes/135m/sft.yaml --use_peft true --lora_r 16          # LoRA via PEFT

Chats become prompt/completion pairs (the last assistant turn is the completion), so the loss covers the
completion only; rows are packed (best-fit decreasing) through TRL's padding-free path, and the sequence
boundaries reach the mixers as `position_ids` that restart at 0.
"""

from dataclasses import dataclass

from trl import ModelConfig, SFTConfig, SFTTrainer, get_peft_config

from .common import (BUDGET_FLAGS, ChatRunArguments, already_done, chat_splits, parse_config, refuse_unused,
                     run_arguments, run_folder, steps_for_tokens, train_and_save, with_checked_saves)


@dataclass
class LinzooSFTConfig(ChatRunArguments, SFTConfig):
    def __post_init__(self):
        self.check_chat_run()
        super().__post_init__()


def main(argv=None):
    from ..loading import load_model

    args, model_args = parse_config((LinzooSFTConfig, ModelConfig), argv)
    refuse_unused(args, BUDGET_FLAGS)
    if not model_args.model_name_or_path:
        raise ValueError("Pass the student to tune: --model_name_or_path <folder or Hub id>.")
    with run_folder(args, "sft", run_arguments(args, model_args),
                    {"model_name_or_path": model_args.model_name_or_path}):
        if already_done(args.output_dir):
            return 0
        model, tokenizer = load_model(model_args.model_name_or_path)
        args.max_steps, _ = steps_for_tokens(args.total_tokens, args, args.max_seq_length)
        trainer = with_checked_saves(SFTTrainer)(
            model=model, args=args, train_dataset=chat_splits(args.dataset, tokenizer, args),
            processing_class=tokenizer,
            peft_config=get_peft_config(model_args),
        )
        return train_and_save(trainer, model, tokenizer, args, model_args, "instruct", {})

