"""`linzoo distill-instruct`: instruction-aware distillation of a student from an instruct teacher.

    linzoo distill-instruct --model_name_or_path runs/gdn-135m-instruct --teacher embedded \
        --dataset embedded --output_dir runs/gdn-135m-instruct-distilled --total_tokens 5000000
    linzoo distill-instruct ... --lmbda 0.5 --beta 0.5        # on-policy, TRL's GKDTrainer

Off-policy (default): CE + KL(teacher || student) on the completions (the last assistant turn of each
chat), chunked over the vocabulary as in stage 3.
"""

from trl import ModelConfig, get_peft_config

from .common import (BUDGET_FLAGS, already_done, chat_splits, check_same_vocab, parse_config, refuse_unused,
                     run_arguments, run_folder, steps_for_tokens, train_and_save, with_checked_saves)
from .distill_instruct_config import InstructDistillConfig
from .linearize_trainer import KnowledgeDistillationTrainer


def main(argv=None):
    from ..loading import load_model, load_teacher

    args, model_args = parse_config((InstructDistillConfig, ModelConfig), argv)
    refuse_unused(args, BUDGET_FLAGS)
    if not model_args.model_name_or_path:
        raise ValueError("Pass the student to distill: --model_name_or_path <folder or Hub id>.")
    with run_folder(args, "distill-instruct", run_arguments(args, model_args),
                    {"model_name_or_path": model_args.model_name_or_path, "teacher": args.teacher}):
        if already_done(args.output_dir):
            return 0
        model, tokenizer = load_model(model_args.model_name_or_path)
        teacher, _ = load_teacher(args.teacher)
        check_same_vocab(model, teacher)
        args.max_steps, _ = steps_for_tokens(args.total_tokens, args, args.max_seq_length)
        data = chat_splits(args.dataset, tokenizer, args)
        if args.lmbda > 0:
            from trl.experimental.gkd import GKDTrainer  # after the config's import, which holds back trl.experimental's notice

            data = data.map(lambda ex: {"messages": ex["prompt"] + ex["completion"]}, remove_columns=["prompt", "completion"])
            trainer_cls = with_checked_saves(GKDTrainer)  # KnowledgeDistillationTrainer checks its saves itself
        else:
            trainer_cls = KnowledgeDistillationTrainer  # stage 3's loss; the collator's labels (-100 on prompts) pick the completions
        trainer = trainer_cls(model=model, teacher_model=teacher, args=args, train_dataset=data,
                              processing_class=tokenizer, peft_config=get_peft_config(model_args))
        return train_and_save(trainer, model, tokenizer, args, model_args, "instruct-distilled",
                              {"teacher": args.teacher, "on_policy_lmbda": args.lmbda})
