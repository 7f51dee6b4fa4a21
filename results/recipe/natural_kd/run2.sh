#!/bin/bash
# The zoo's base recipe, a third of its rows chats (--chat_fraction 0.3), plus a low-LR end-to-end KD stage
set -e
# From a checkout with linzoo installed; OUT: where the runs go
export OMP_NUM_THREADS=1; OUT=${OUT:-runs/natural_kd}
linzoo linearize --teacher embedded --mixer gated_deltanet --total_tokens 20000 --dataset long --max_seq_length 512 \
  --per_device_train_batch_size 1 --attn_layers auto:10 --window_size 64 --stage_fractions 0.75 0 0.25 --chat_fraction 0.3 \
  --stage_trainable mixers mixers all --stage_learning_rates 1e-3 5e-4 5e-5 --logging_steps 4 --save_steps 20 \
  --output_dir $OUT/chat
linzoo eval niah --model $OUT/chat --variant natural --lengths 256,512 --depths 0,0.5,1 --samples_per_cell 8 --batch_size 6 \
    --out $OUT/eval-chat-natural
