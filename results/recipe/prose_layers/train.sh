#!/bin/bash
# The CPU zoo's hybrid base recipe (stage 1 only, 20k tokens of 512-token long-document rows, a 64-token window) with
# softmax at LAYERS (space-separated), seed SEED, mixer MIXER; then natural NIAH on 48 prompts a length (the same
# prompts as ../natural_stage2/), classic NIAH (12 a length) and quality beside the zoo teacher's:
#   EVAL_DATA=../shared/data/eval LAYERS="7 8 15 17 18 20 21 23" SEED=42 OUT=runs/pl TEACHER_QUALITY=runs/zoo/teacher/eval/quality.json bash train.sh
set -e
: "${EVAL_DATA:?the five zero-shot sets (evals/LM_EVAL.md)}" "${OUT:?where the student goes}" "${TEACHER_QUALITY:?the quality.json of the zoo teacher row}" "${LAYERS:?softmax layers}"
S=${SEED:-42} M=${MIXER:-gated_deltanet}; O=$OUT/$M-$(echo $LAYERS | tr ' ' '_')-s$S
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# shellcheck disable=SC2086
linzoo linearize --teacher embedded --mixer $M --total_tokens 20000 --dataset long \
  --max_seq_length 512 --per_device_train_batch_size 1 --attn_layers $LAYERS --window_size 64 \
  --stage_fractions 1 0 0 --stage_trainable mixers mixers mixers --stage_learning_rates 1e-3 5e-4 1e-3 \
  --logging_steps 4 --save_steps 20 --disable_tqdm true --seed $S --output_dir $O
bash "$(dirname "$0")/../eval_row.sh" $O "$TEACHER_QUALITY"
