#!/bin/bash
# The zoo's base recipe plus a low-LR end-to-end KD stage (a quarter of the tokens, every weight, 5e-5)
set -e
# From a checkout with linzoo installed; OUT: where the runs go, ZOO: the zoo build whose base row is compared
export OMP_NUM_THREADS=1; OUT=${OUT:-runs/natural_kd}; ZOO=${ZOO:-runs/zoo}
linzoo linearize --teacher embedded --mixer gated_deltanet --total_tokens 20000 --dataset long --max_seq_length 512 \
  --per_device_train_batch_size 1 --attn_layers auto:10 --window_size 64 --stage_fractions 0.75 0 0.25 \
  --stage_trainable mixers mixers all --stage_learning_rates 1e-3 5e-4 5e-5 --logging_steps 4 --save_steps 20 \
  --output_dir $OUT/student
for m in $OUT/student $ZOO/gated_deltanet/base embedded; do
  n=$(basename $m)
  linzoo eval niah --model $m --variant natural --lengths 256,512 --depths 0,0.5,1 --samples_per_cell 8 --batch_size 6 \
    --out $OUT/eval-$n-natural
done
linzoo eval niah --model $OUT/student --lengths 256,512 --depths 0,0.5,1 --samples_per_cell 4 --batch_size 6 --out $OUT/eval-student-classic
linzoo eval quality --model $OUT/student --teacher embedded --data_dir ../shared/data/eval --limit 30 --heldout_tokens 2048 --out $OUT/eval-student-quality
