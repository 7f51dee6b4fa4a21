#!/usr/bin/env bash
# The GPU runs behind results/gpu/, one phase per device call (see results/gpu/README.md):
#
#     . .dev/stage.sh && bash scripts/device_jobs.sh parity|bench|train|short|eval
#
# Needs what `.dev/stage.sh` provides (fla, mlstm-kernels, tilelang on PYTHONPATH; TEACHER_GGUF) and, carried
# in `.dev/`, the embedded text corpus (`.dev/lzcache/`) and the five eval sets (`.dev/eval/`). Everything a
# later phase needs (students, Triton cache) stays in /tmp on the warm machine. Results go to $OUT.
# CPU dry run of the plumbing: TRAIN_TOKENS, SHORT_TOKENS, TRAIN_ARGS, EVAL_ARGS, NIAH_ARGS shrink the jobs.
set -uo pipefail
PHASE=${1:?phase: parity | bench | train | short | eval}
R=$PWD
OUT=${OUT:-/tmp/linzoo-out}
mkdir -p "$OUT" /tmp/work /tmp/runs /tmp/eval

# The project itself (no deps: the image and the staged bundles hold them), fresh each call.
rm -rf /tmp/lz && python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/lz "$R" >/tmp/lz-pip.log 2>&1 \
  || { tail -5 /tmp/lz-pip.log; exit 1; }
export PYTHONPATH=/tmp/lz${PYTHONPATH:+:$PYTHONPATH} LINZOO_TEACHER_GGUF=${TEACHER_GGUF:?run . .dev/stage.sh first}
export LINZOO_CACHE=/tmp/lzcache HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
[ -d /tmp/lzcache/data ] || { mkdir -p /tmp/lzcache && cp -r "$R/.dev/lzcache/." /tmp/lzcache/; }
cd /tmp/work  # outside the checkout: its linzoo/ folder would shadow the installed package
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$OUT/card.txt"
python3 -c "from linzoo.loading import resolve; print(resolve('embedded'))"  # convert the GGUF once

save_triton() { tar czf /tmp/triton.tgz -C "$TRITON_CACHE_DIR" . && [ "$(stat -c %s /tmp/triton.tgz)" -lt 16000000 ] \
  && cp /tmp/triton.tgz "$OUT/triton-cache.tgz"; }

linearize() {  # mixer tokens log
  timeout 560 python3 -m linzoo.cli linearize --config "$R/recipes/135m/$1.yaml" --teacher embedded \
    --total_tokens "$2" --output_dir "/tmp/runs/$1" --disable_tqdm true --logging_steps 25 --report_to none \
    --save_steps 250 --save_total_limit 1 ${TRAIN_ARGS:-} >"$3" 2>&1
  echo "$1: exit $?"; tail -5 "$3"
}

pack_runs() {  # the records of finished runs (never checkpoints) -> $OUT/$1
  (cd /tmp/runs && tar czf "$OUT/$1" $(ls -d */linzoo_training.json */stage*/stage_done.json */config.json 2>/dev/null))
}

case $PHASE in
parity)
  timeout 560 python3 "$R/scripts/gpu_parity.py" --parallel --out "$OUT/gpu_parity.json" 2>&1 | tee "$OUT/gpu_parity.log"
  save_triton ;;
bench)
  timeout 560 python3 "$R/scripts/bench_speed.py" --iters 6 --new_tokens 48 --out "$OUT/bench_speed.json" 2>&1 \
    | tee "$OUT/bench_speed.log"
  save_triton ;;
train)  # calling it again resumes a run that hit the time limit (same stage, same step); a finished one is kept
  if [ -f /tmp/runs/gated_deltanet/linzoo_training.json ]; then echo "gated_deltanet: finished already"
  else linearize gated_deltanet "${TRAIN_TOKENS:-20000000}" "/tmp/runs/train_gated_deltanet.$(date +%s).log"; fi
  cat /tmp/runs/train_gated_deltanet.*.log >"$OUT/train_gated_deltanet.log"
  pack_runs train_records.tgz ;;
short)  # the six other mixers, three runs at a time sharing the GPU
  for wave in "linear_attn retnet gla" "deltanet kda xlstm"; do
    for m in $wave; do linearize "$m" "${SHORT_TOKENS:-2000000}" "/tmp/runs/$m.log" & done
    wait
  done
  tar czf "$OUT/short_logs.tgz" -C /tmp/runs $(cd /tmp/runs && ls *.log)
  pack_runs short_records.tgz ;;
eval)  # teacher + every student: full five tasks (recovery, KL) and NIAH 256-8k, all processes at once
  models="teacher=embedded"
  for d in /tmp/runs/*/; do [ -f "$d/model.safetensors" ] && models="$models $(basename "$d")=$d"; done
  for pair in $models; do
    name=${pair%%=*} spec=${pair#*=} teach="--teacher embedded"
    [ "$name" = teacher ] && teach=""
    (timeout 560 python3 -m linzoo.cli eval quality --model "$spec" $teach --data_dir "$R/.dev/eval" \
        --dtype bfloat16 --batch_size 64 --out "/tmp/eval/$name/quality" ${EVAL_ARGS:-} >"/tmp/eval/$name-quality.log" 2>&1
     echo "$name quality: exit $?"; tail -1 "/tmp/eval/$name-quality.log") &
    (timeout 560 python3 -m linzoo.cli eval niah --model "$spec" --lengths 256,512,1024,2048,4096,8192 \
        --dtype bfloat16 --batch_size 8 --out "/tmp/eval/$name/niah" ${NIAH_ARGS:-} >"/tmp/eval/$name-niah.log" 2>&1
     echo "$name niah: exit $?"; tail -1 "/tmp/eval/$name-niah.log") &
  done
  wait
  tar czf "$OUT/eval.tgz" -C /tmp/eval . ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac
ls -la "$OUT"
