#!/bin/bash
# The zoo's base recipe unchanged with two other training seeds; natural NIAH on the 24 prompts of run.sh
set -e
# From a checkout with linzoo installed; OUT: where the runs go
export OMP_NUM_THREADS=1; OUT=${OUT:-runs/natural_kd}
for s in 1 2; do
linzoo linearize --teacher embedded --mixer gated_deltanet --total_tokens 20000 --dataset long --max_seq_length 512 \
  --per_device_train_batch_size 1 --attn_layers auto:10 --window_size 64 --stage_fractions 1 0 0 \
  --stage_trainable mixers mixers mixers --stage_learning_rates 1e-3 5e-4 1e-3 --logging_steps 4 --save_steps 20 \
  --seed $s --output_dir $OUT/seed$s
linzoo eval niah --model $OUT/seed$s --variant natural --lengths 256,512 --depths 0,0.5,1 --samples_per_cell 8 --batch_size 6 \
    --out $OUT/eval-seed$s-natural
done
