#!/usr/bin/env bash
# results/speed/cpu/<date>/: `linzoo eval speed` on two threads, the teacher in every run (issue 31). ~75 min on two
# otherwise idle cores. Students: speed_students.py, beside it (plain start: time and memory depend on shapes only), the
# hybrid in the main job's layout (softmax at layers 6 17 18 20 21 23, a 64-token window in every other layer).
#   batch1/  teacher, hybrid, pure Gated DeltaNet: 256 -> 16k tokens, batch 1
#   batch8/  the same at batch 8: 256 -> 1k
#   32k/     the same at 32k, batch 1, one timed run after the warm-up (the teacher's prefill alone takes minutes)
#   mixers/  every mixer's pure student at 4k, batch 1
#   int8/    teacher, hybrid, pure with every linear layer int8 (--quantize int8, all alike): 512, 4k, 16k
#   quality-int8/, quality-fp32/  what int8 costs the main job's student (runs/main, when there): perplexity, KL, tasks
set -euo pipefail
D=${D:-results/speed/cpu/$(date +%F)}
S=${S:-/tmp/speed-students}
python "$(dirname "$0")/speed_students.py" --out "$S"
T="embedded $S/gated_deltanet-hybrid $S/gated_deltanet"
common=(--threads 2 --decode_tokens 16)
run() { local name=$1; shift; [ -f "$D/$name/speed.json" ] && { echo "== $name: there already"; return; }
        echo "== $name"; linzoo eval speed "${common[@]}" "$@" --out "$D/$name"; }
run batch1 --models $T --lengths 256,512,1024,2048,4096,8192,16384 --batch_sizes 1 --max_seconds_per_cell 900
run batch8 --models $T --lengths 256,512,1024 --batch_sizes 8
run 32k --models $T --lengths 32768 --batch_sizes 1 --repeats 1 --max_seconds_per_cell 3000
run mixers --models embedded $(python -c "import linzoo; print(' '.join('$S/' + m for m in linzoo.MIXERS))") \
  --lengths 4096 --batch_sizes 1
run int8 --models $T --lengths 512,4096,16384 --batch_sizes 1 --quantize int8 --max_seconds_per_cell 900
if [ -f runs/main/config.json ] && [ ! -f "$D/quality-int8/quality.json" ]; then
  EVAL_DATA=${EVAL_DATA:-../shared/data/eval}
  for q in none int8; do
    linzoo eval quality --model runs/main --teacher embedded --data_dir "$EVAL_DATA" --tasks lambada_openai,piqa \
      --limit 30 --heldout_tokens 4096 \
      --quantize $q --out "$D/quality-$([ $q = none ] && echo fp32 || echo int8)"
  done
fi
python "$(dirname "$0")/speed_report.py" "$D"
