#!/bin/bash
# usage: train.sh OUT K [extra linearize flags...]
set -e
OUT=$1; K=$2; shift 2
linzoo linearize --teacher embedded --mixer gated_deltanet --dataset embedded \
  --total_tokens 20000 --max_seq_length 256 --per_device_train_batch_size 1 \
  --attn_layers auto:$K --window_size 64 --stage_fractions 1 0 0 --stage_trainable mixers mixers mixers \
  --stage_learning_rates 1e-3 5e-4 1e-3 --logging_steps 4 --save_steps 20 --output_dir "$OUT" "$@"
for v in ${VARS:-natural passkey}; do
linzoo eval niah --model "$OUT" --variant $v --lengths 256,512 --depths 0,0.5,1 --samples_per_cell 4 --batch_size 6 --out "$OUT/eval/$v"
done
[ -n "$NOQ" ] || linzoo eval quality --model "$OUT" --teacher embedded --data_dir ../shared/data/eval --limit 20 --heldout_tokens 2048 --out "$OUT/eval"
