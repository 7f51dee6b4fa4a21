#!/usr/bin/env bash
# One zoo base row (recipes/135m/zoo-cpu.yaml's flags) on another training seed, then its classic and natural NIAH
# (the zoo's own eval flags for the natural variant: 48 prompts a length). Run from a checkout with linzoo installed:
#   OUT=runs/seeds/kd-s1  MIXER=linear_attn    TOKENS=40000 STAGES="0.5 0 0.5" SEED=1 bash results/recipe/seeds_cpu/run.sh
#   OUT=runs/seeds/kd-s2  MIXER=linear_attn    TOKENS=40000 STAGES="0.5 0 0.5" SEED=2 bash results/recipe/seeds_cpu/run.sh
#   OUT=runs/seeds/gdn-s1 MIXER=gated_deltanet TOKENS=20000 STAGES="1 0 0"     SEED=1 bash results/recipe/seeds_cpu/run.sh
set -euo pipefail
: "${OUT:?}" "${MIXER:?}" "${TOKENS:?}" "${STAGES:?}" "${SEED:?}"
linzoo linearize --teacher embedded --mixer "$MIXER" --total_tokens "$TOKENS" --dataset long --max_seq_length 512 \
  --per_device_train_batch_size 1 --attn_layers 5 7 8 9 15 16 17 18 20 21 22 23 --window_size 64 \
  --stage_fractions $STAGES --stage_trainable mixers mixers mixers --stage_learning_rates 1e-3 5e-4 1e-3 \
  --logging_steps 4 --save_steps 20 --seed "$SEED" --output_dir "$OUT"
linzoo eval niah --model "$OUT" --out "$OUT/eval" --lengths 256,512 --depths 0,0.5,1 --samples_per_cell 4 --batch_size 6
linzoo eval niah --model "$OUT" --out "$OUT/eval/natural" --variant natural --lengths 256,512 --depths 0,0.5,1 \
  --samples_per_cell 16 --batch_size 8
