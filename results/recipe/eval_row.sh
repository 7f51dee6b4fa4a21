#!/bin/bash
# The evals of a recipe experiment's row (natural_stage2/s12_cpu.sh, prose_layers/train.sh): natural NIAH on 48 prompts
# a length (16 a depth), classic NIAH (12 a length) and quality beside the zoo teacher's results:
#   bash eval_row.sh STUDENT_FOLDER TEACHER_QUALITY_JSON        (EVAL_DATA: the five zero-shot sets)
set -e
O=${1:?the student folder} TQ=${2:?the quality.json of the zoo teacher row}
linzoo eval niah --model $O --out $O/eval/natural --variant natural --lengths 256,512 \
  --depths 0,0.5,1 --samples_per_cell 16 --batch_size 8
linzoo eval niah --model $O --out $O/eval --lengths 256,512 --depths 0,0.5,1 --samples_per_cell 4 --batch_size 6
linzoo eval quality --model $O --out $O/eval --limit 30 --heldout_tokens 2048 --heldout_chat_tokens 1024 \
  --teacher embedded --teacher_results "$TQ"
