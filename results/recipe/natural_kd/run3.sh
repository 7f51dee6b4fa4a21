#!/bin/bash
# The zoo's base recipe unchanged with two other training seeds; natural NIAH on the 24 prompts of run.sh
set -e
cd /work/main; . .venv/bin/activate; export OMP_NUM_THREADS=1
for s in 1 2; do
OUT=/work/exp/s3low/seed$s
linzoo linearize --teacher embedded --mixer gated_deltanet --total_tokens 20000 --dataset long --max_seq_length 512 \
  --per_device_train_batch_size 1 --attn_layers auto:10 --window_size 64 --stage_fractions 1 0 0 \
  --stage_trainable mixers mixers mixers --stage_learning_rates 1e-3 5e-4 1e-3 --logging_steps 4 --save_steps 20 \
  --seed $s --output_dir $OUT
linzoo eval niah --model $OUT --variant natural --lengths 256,512 --depths 0,0.5,1 --samples_per_cell 8 --batch_size 6 \
    --out /work/exp/s3low/eval-seed$s-natural
done
