#!/usr/bin/env bash
# The GPU runs behind results/gpu/, one phase per device call (see results/gpu/README.md):
#
#     . .dev/stage.sh && bash scripts/device_jobs.sh first|train|eval|bench|profile   (or parity alone)
#
# first: parity check, the 20M-token Gated DeltaNet run and the six short runs, all at once on the one GPU;
# train: resumes whatever of those the time limit cut (same stage, same step); eval: teacher + students.
#
# Needs what `.dev/stage.sh` provides (fla, mlstm-kernels, tilelang on PYTHONPATH; TEACHER_GGUF) and, carried
# in `.dev/`, the embedded text corpus (`.dev/lzcache/`) and the five eval sets (`.dev/eval/`). Everything a
# later phase needs (students, Triton cache) stays in /tmp on the warm machine. Results go to $OUT.
# CPU dry run of the plumbing: TRAIN_TOKENS, SHORT_TOKENS, TRAIN_ARGS, EVAL_ARGS, NIAH_ARGS shrink the jobs;
# PARITY_ARGS (e.g. "--mixers xlstm") narrows the parity check.
set -uo pipefail
PHASE=${1:?phase: first | train | eval | parity | bench | profile}
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

LIMIT=${LIMIT:-540}  # seconds for this call's jobs, counted from the script's start (a device call runs <= 600 s)
left() { echo $((LIMIT - SECONDS > 10 ? LIMIT - SECONDS : 10)); }  # what remains of LIMIT, for each timeout
SHORT=${SHORT-linear_attn retnet gla deltanet kda xlstm}  # SHORT= (empty): the Gated DeltaNet run alone

linearize() {  # mixer tokens [extra flags...]; rerun = resume; the log of every attempt is kept
  local m=$1 tokens=$2; shift 2
  if [ -f "/tmp/runs/$m/linzoo_training.json" ]; then echo "$m: finished already"; return; fi
  timeout "$(left)" python3 -m linzoo.cli linearize --config "$R/recipes/135m/$m.yaml" --teacher embedded \
    --total_tokens "$tokens" --output_dir "/tmp/runs/$m" --disable_tqdm true --report_to none \
    --save_steps 100 --save_total_limit 1 "$@" ${TRAIN_ARGS:-} >"/tmp/runs/$m.$(date +%s).log" 2>&1
  echo "$m: exit $?"
}

train_all() {  # Gated DeltaNet with the recipe's batch; the short runs with 2 x 4 accumulation (same tokens/step)
  linearize gated_deltanet "${TRAIN_TOKENS:-20000000}" --logging_steps 10 &
  [ -z "$SHORT" ] && { wait; return; }
  # pack the short runs' shared 2M-token budget once, before six processes race for the same datasets cache file
  python3 -c "from linzoo import load_teacher; from linzoo.data import load_text_dataset, pack_dataset
pack_dataset(load_text_dataset('embedded', split='train'), load_teacher('embedded')[1], 2048, max_tokens=${SHORT_TOKENS:-2000000})"
  for m in $SHORT; do
    linearize "$m" "${SHORT_TOKENS:-2000000}" --logging_steps 5 --per_device_train_batch_size 2 \
      --gradient_accumulation_steps 4 &
  done
  wait
}

pack_runs() {  # all logs and the records of finished runs (never checkpoints) -> $OUT
  (cd /tmp/runs && tar czf "$OUT/train_logs.tgz" *.log && tar czf "$OUT/train_records.tgz" \
    $(ls -d */linzoo_training.json */stage*/stage_done.json */config.json 2>/dev/null))
  for f in /tmp/runs/*/linzoo_training.json; do echo "finished: $f"; done
}

case $PHASE in
first)
  (timeout "$(left)" python3 "$R/scripts/gpu_parity.py" --parallel --deadline $(($(left) - 30)) ${PARITY_ARGS:-} --out "$OUT/gpu_parity.json" >"$OUT/gpu_parity.log" 2>&1
   echo "parity: exit $?") &
  train_all
  wait
  tail -12 "$OUT/gpu_parity.log"
  pack_runs; save_triton ;;
parity)
  timeout "$(left)" python3 "$R/scripts/gpu_parity.py" --parallel --deadline $(($(left) - 30)) ${PARITY_ARGS:-} --out "$OUT/gpu_parity.json" 2>&1 | tee "$OUT/gpu_parity.log"
  save_triton ;;
train)
  train_all; pack_runs ;;
profile)  # where a KD training step's time goes (gated_deltanet, the recipe's batch)
  for t in "" --fp32_teacher; do  # as the trainer runs now, and as it ran before the teacher got autocast
    timeout "$(left)" python3 "$R/scripts/profile_train_step.py" --mixer gated_deltanet $t \
      --out "$OUT/profile_train_step${t:+_fp32_teacher}.json" 2>&1 | tee -a "$OUT/profile_train_step.log"
  done ;;
bench)
  timeout "$(left)" python3 "$R/scripts/bench_speed.py" --iters 6 --new_tokens 48 --out "$OUT/bench_speed.json" 2>&1 \
    | tee "$OUT/bench_speed.log"
  save_triton ;;
eval)  # teacher + every finished student: full five tasks (recovery, KL) and NIAH 256-8k, all processes at once
  models="teacher=embedded"
  for d in /tmp/runs/*/; do [ -f "$d/linzoo_training.json" ] && models="$models $(basename "$d")=$d"; done
  for pair in $models; do
    name=${pair%%=*} spec=${pair#*=} teach="--teacher embedded"
    [ "$name" = teacher ] && teach=""
    (timeout "$(left)" python3 -m linzoo.cli eval quality --model "$spec" $teach --data_dir "$R/.dev/eval" \
        --dtype bfloat16 --batch_size 64 --out "/tmp/eval/$name/quality" ${EVAL_ARGS:-} >"/tmp/eval/$name-quality.log" 2>&1
     echo "$name quality: exit $?"; tail -1 "/tmp/eval/$name-quality.log") &
    (timeout "$(left)" python3 -m linzoo.cli eval niah --model "$spec" --lengths 256,512,1024,2048,4096,8192 \
        --dtype bfloat16 --batch_size 8 --out "/tmp/eval/$name/niah" ${NIAH_ARGS:-} >"/tmp/eval/$name-niah.log" 2>&1
     echo "$name niah: exit $?"; tail -1 "/tmp/eval/$name-niah.log") &
  done
  wait
  tar czf "$OUT/eval.tgz" -C /tmp/eval . ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac
ls -la "$OUT"
