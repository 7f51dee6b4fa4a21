#!/bin/bash
# Natural NIAH with 48 prompts a length (16 a cell) on rows of a built CPU zoo, the teacher first:
#   ZOO=runs/zoo OUT=runs/rows48 bash rows48.sh      (linzoo installed; one thread, as it ran beside the zoo build)
set -e
: "${ZOO:?the built zoo folder}" "${OUT:?where the results go}"
export OMP_NUM_THREADS=1
for m in teacher:embedded gdn-base:$ZOO/gated_deltanet/base gdn-instruct:$ZOO/gated_deltanet/instruct \
         gla-base:$ZOO/gla/base gla-instruct:$ZOO/gla/instruct gdn-distilled:$ZOO/gated_deltanet/instruct-distilled \
         la-base:$ZOO/linear_attn/base la-instruct:$ZOO/linear_attn/instruct; do
  n=${m%%:*}
  [ -f "$OUT/$n/niah.json" ] && continue
  linzoo eval niah --model "${m#*:}" --out "$OUT/$n" --variant natural --lengths 256,512 --depths 0,0.5,1 \
    --samples_per_cell 16 --batch_size 8
done
