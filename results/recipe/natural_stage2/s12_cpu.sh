#!/bin/bash
# Stage 1 (20k tokens, the CPU zoo's base row) then stage 2 (20k tokens: hidden states after every layer, mixers only),
# seed SEED, then natural NIAH on 48 prompts a length, classic NIAH and quality beside the teacher's results:
#   SEED=42 OUT=runs/s12 TEACHER_QUALITY=runs/zoo/teacher/eval/quality.json bash s12_cpu.sh
set -e
: "${OUT:?where the student goes}" "${TEACHER_QUALITY:?the quality.json of the zoo teacher row}"
S=${SEED:-42} M=${MIXER:-gated_deltanet}; O=$OUT/$M-s$S
export OMP_NUM_THREADS=1
linzoo linearize --teacher embedded --mixer $M --total_tokens 40000 --dataset long \
  --max_seq_length 512 --per_device_train_batch_size 1 --attn_layers auto:10 --window_size 64 \
  --stage_fractions 0.5 0.5 0 --stage_trainable mixers mixers mixers --stage_learning_rates 1e-3 5e-4 1e-3 \
  --logging_steps 4 --save_steps 20 --disable_tqdm true --seed $S --output_dir $O
bash "$(dirname "$0")/../eval_row.sh" $O "$TEACHER_QUALITY"
