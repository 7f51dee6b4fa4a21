#!/usr/bin/env bash
# The GPU runs behind results/gpu/, in phases sized to fit time-limited calls (see results/gpu/README.md):
#
#     . .dev/stage.sh && bash scripts/device_jobs.sh PHASE [PHASE...]   (phases run in order, one LIMIT for all)
#
# start: starts (or resumes) the training runs in the background and returns; parity: the fast-vs-torch check;
# wait: until the runs finish or LIMIT nears; eval: teacher + finished students; bench (background, resumable
# across calls like the runs: call it again to wait for it); profile.
# E.g. `start parity wait` then, in the next call of the same block, `wait eval`.
# A run holds a lock (/tmp/runs/<mixer>.lock) while it trains, so that it can outlive the call that started it:
# the next call finds it running and waits for it; if its process is gone, `start` resumes it from its last
# checkpoint (same stage, step).
#
# The GPU image lacks lm-eval (the `eval` phase's scorer) and what it imports: build the bundles with
#     bash ../shared/device/prepare.sh lm_eval==0.4.13 sacrebleu==2.5.1 portalocker tabulate lxml chardet colorama more-itertools xlstm==2.0.6
# (the four bundles then fit the 64 MiB per call; .dev/corpus, .dev/lzcache and .dev/eval travel together in a fifth call).
# Runs offline (HF_HUB_OFFLINE): needs fla, mlstm-kernels and tilelang importable and TEACHER_GGUF set (what
# `.dev/stage.sh` does: it installs them from wheels carried with the checkout), the embedded text corpus in
# `.dev/lzcache/` and the five eval sets in `.dev/eval/`. Students and the Triton cache stay in /tmp, so that a
# later call on the same host continues from them. Results go to $OUT.
# LONG (default gated_deltanet; empty for none) and SHORT (six mixers; empty for none) pick the runs.
# CPU dry run of the plumbing: TRAIN_TOKENS, SHORT_TOKENS, TRAIN_ARGS, EVAL_ARGS, NIAH_ARGS shrink the jobs;
# PARITY_ARGS (e.g. "--mixers xlstm") narrows the parity check; EVAL_JOBS (default 6) caps concurrent background eval jobs.
set -uo pipefail
[ $# -gt 0 ] || { echo "usage: device_jobs.sh start|wait|parity|eval|bench|profile ..."; exit 2; }
R=$PWD
LIMIT=${LIMIT:-540}  # seconds for this call, from the script's start: under a 600 s per-call cap, with time to pack $OUT
left() { echo $((LIMIT - SECONDS > 10 ? LIMIT - SECONDS : 10)); }  # what remains of LIMIT, for each timeout
SHORT=${SHORT-linear_attn retnet gla deltanet kda xlstm}  # 2M-token runs; SHORT= (empty): none
LONG=${LONG-gated_deltanet}  # TRAIN_TOKENS (20M) runs with the recipe's batch; LONG= (empty): none

# RUNS_FILE (e.g. recipes/135m/ablation.runs): instead of LONG/SHORT, one run per line "name mixer tokens [flags...]"
# (all side by side on the one card; results under each name): an ablation at equal budget.
RUNS_FILE=${RUNS_FILE:-}
if [ -n "$RUNS_FILE" ]; then
  [ -f "$RUNS_FILE" ] || { echo "RUNS_FILE $RUNS_FILE does not exist"; exit 2; }
  LONG= SHORT=
  RUNS=$(grep -v '^[[:space:]]*#' "$RUNS_FILE" | awk 'NF {print $1}' | tr '\n' ' ')
else
  RUNS="$LONG $SHORT"
fi
for m in $LONG; do case " $SHORT " in *" $m "*) echo "$m is in both LONG and SHORT: name it in one"; exit 2;; esac; done
EVAL_JOBS=${EVAL_JOBS:-6}
case $EVAL_JOBS in ''|*[!0-9]*|0) echo "EVAL_JOBS must be a whole number >= 1, got '$EVAL_JOBS'"; exit 2;; esac
OUT=${OUT:-/tmp/linzoo-out}
mkdir -p "$OUT" /tmp/work /tmp/runs /tmp/eval

# The project itself (no deps: installed beforehand, nothing is downloaded), fresh each call, in a folder of its own:
# a run started by an earlier call may still be training from (and later saving modeling files out of) the last one.
LZ=/tmp/lz.$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation --target "$LZ" "$R" >/tmp/lz-pip.log 2>&1 \
  || { tail -5 /tmp/lz-pip.log; exit 1; }
export PYTHONPATH=$LZ${PYTHONPATH:+:$PYTHONPATH} LINZOO_TEACHER_GGUF=${TEACHER_GGUF:?run . .dev/stage.sh first}
export LINZOO_DEBUG=1  # a failing job's log keeps its traceback
export LINZOO_CACHE=/tmp/lzcache HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
[ -d /tmp/lzcache/data ] || { mkdir -p /tmp/lzcache && cp -r "$R/.dev/lzcache/." /tmp/lzcache/; }
# The long corpus (--dataset long) travels as its xz bundle in .dev/corpus (scripts/corpus_bundle.py export).
[ -d "$R/.dev/corpus" ] && export LINZOO_CORPUS_DIR=$R/.dev/corpus
cd /tmp/work  # outside the checkout: its linzoo/ folder would shadow the installed package
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$OUT/card.txt"
python3 -c "from linzoo.loading import resolve; print(resolve('embedded'))"  # convert the GGUF once

save_triton() { tar czf /tmp/triton.tgz -C "$TRITON_CACHE_DIR" . && [ "$(stat -c %s /tmp/triton.tgz)" -lt 16000000 ] \
  && cp /tmp/triton.tgz "$OUT/triton-cache.tgz"; }

linearize() {  # name mixer tokens [extra flags...]: starts it in the background unless finished or already running
  local m=$1 mixer=$2 tokens=$3; shift 3
  if [ -f "/tmp/runs/$m/linzoo_training.json" ]; then echo "$m: finished already"; return; fi
  if ! flock -n "/tmp/runs/$m.lock" true; then echo "$m: still running (from an earlier call)"; return; fi
  echo "$m: starting (or resuming)"
  setsid nohup flock -o "/tmp/runs/$m.lock" python3 -m linzoo.cli linearize --config "$R/recipes/135m/linearize.yaml" --mixer "$mixer" \
    --teacher embedded --total_tokens "$tokens" --output_dir "/tmp/runs/$m" --disable_tqdm true --report_to none \
    --save_steps 100 --save_total_limit 1 "$@" ${TRAIN_ARGS:-} >"/tmp/runs/$m.$(date +%s).log" 2>&1 </dev/null &
  for _ in $(seq 100); do flock -n "/tmp/runs/$m.lock" true || return 0; sleep 0.1; done  # until it holds the lock
  echo "$m: WARNING its process did not take the lock within 10 s (died at start? see /tmp/runs/$m.*.log)"
}

start_runs() {  # Gated DeltaNet with the recipe's batch; the short runs with 2 x 4 accumulation (same tokens/step)
  if [ -n "$RUNS_FILE" ]; then
    [ -n "${LINZOO_CORPUS_DIR:-}" ] && grep -q -- "--dataset long" "$RUNS_FILE" && python3 -c \
      "from linzoo.data import load_text_dataset; load_text_dataset('long', split='train')"  # import the bundle once
    local name mixer tokens flags
    while read -r name mixer tokens flags; do
      case "$name" in ''|'#'*) continue;; esac
      # shellcheck disable=SC2086  # flags split into words on purpose
      linearize "$name" "$mixer" "${TRAIN_TOKENS:-$tokens}" --logging_steps 10 $flags
      # one at a time through data loading and packing (runs sharing a dataset would race for its cache files)
      for _ in $(seq 240); do
        grep -qs -e "fitted the fresh student" -e "linzoo: stage1" -e Traceback /tmp/runs/$name.*.log && break
        flock -n "/tmp/runs/$name.lock" true && break; sleep 0.5
      done
    done < <(grep -v '^[[:space:]]*#' "$RUNS_FILE")
    return
  fi
  for m in $LONG; do linearize "$m" "$m" "${TRAIN_TOKENS:-20000000}" --logging_steps 10; done
  [ -z "$SHORT" ] && return
  # pack the short runs' shared 2M-token budget once, before six processes race for the same datasets cache file
  python3 -c "from linzoo import load_teacher; from linzoo.data import load_text_dataset, pack_dataset
pack_dataset(load_text_dataset('embedded', split='train'), load_teacher('embedded')[1], 2048, max_tokens=${SHORT_TOKENS:-2000000})"
  for m in $SHORT; do
    linearize "$m" "$m" "${SHORT_TOKENS:-2000000}" --logging_steps 5 --per_device_train_batch_size 2 \
      --gradient_accumulation_steps 4
  done
}

wait_runs() {  # until no run holds its lock, or 20 s before LIMIT; prints each run's last log line now and then
  local n=0 busy=""
  while [ $((LIMIT - SECONDS)) -gt 20 ]; do
    busy=""
    for m in $RUNS; do [ -e "/tmp/runs/$m.lock" ] && ! flock -n "/tmp/runs/$m.lock" true && busy="$busy $m"; done
    [ -z "$busy" ] && { echo "no run is training"; return 0; }
    if [ $((n++ % 12)) = 0 ]; then
      for m in $busy; do echo "[$SECONDS s] $m: $(ls -t /tmp/runs/$m.*.log | head -1 | xargs tail -c 300 | tr '\r' '\n' | grep . | tail -1)"; done
    fi
    sleep 5
  done
  echo "still training at the limit:$busy"
}

pack_runs() {  # all logs and the records of finished runs (never checkpoints) -> $OUT
  (cd /tmp/runs && shopt -s nullglob && logs=(*.log) records=(*/linzoo_training.json */stage*/stage_done.json */config.json)
   [ ${#logs[@]} -gt 0 ] && tar czf "$OUT/train_logs.tgz" "${logs[@]}"
   [ ${#records[@]} -gt 0 ] && tar czf "$OUT/train_records.tgz" "${records[@]}"
   for f in */linzoo_training.json; do echo "finished: $f"; done)
}

for PHASE in "$@"; do
echo "== $PHASE (${SECONDS}s of ${LIMIT}s)"
case $PHASE in
start) start_runs ;;
wait) wait_runs; pack_runs ;;
parity)
  timeout "$(left)" python3 "$R/scripts/gpu_parity.py" --parallel --deadline $(($(left) - 30)) ${PARITY_ARGS:-} --out "$OUT/gpu_parity.json" 2>&1 | tee "$OUT/gpu_parity.log"
  save_triton ;;
profile)  # where a KD training step's time goes (gated_deltanet, the recipe's batch)
  timeout "$(left)" python3 "$R/scripts/profile_train_step.py" --mixer gated_deltanet ${PROFILE_ARGS:-} \
    --out "$OUT/profile_train_step.json" 2>&1 | tee -a "$OUT/profile_train_step.log" ;;
bench)  # in the background, under a lock like the training runs: it outlives the call, and the next call's `bench`
  # waits for it; each call copies what it has so far (the JSON is rewritten after every mixer) to $OUT
  if [ -f /tmp/bench/done ]; then echo "bench: finished already"
  elif [ -f /tmp/bench/bench_speed.log ] && flock -n /tmp/bench.lock true; then
    echo "bench: an earlier call's bench stopped before the end; not restarted (rm -rf /tmp/bench to)"
  elif flock -n /tmp/bench.lock true; then
    echo "bench: starting"; mkdir -p /tmp/bench
    setsid nohup flock -o /tmp/bench.lock sh -c "python3 '$R/scripts/bench_speed.py' --iters 6 --new_tokens 48 \
      ${BENCH_ARGS:-} --out /tmp/bench/bench_speed.json && touch /tmp/bench/done" >/tmp/bench/bench_speed.log 2>&1 </dev/null &
    sleep 2
  else echo "bench: still running (from an earlier call)"; fi
  last=0
  while [ $((LIMIT - SECONDS)) -gt 15 ] && ! flock -n /tmp/bench.lock true; do
    n=$(wc -l </tmp/bench/bench_speed.log); [ "$n" -gt "$last" ] && { sed -n "$((last + 1)),${n}p" /tmp/bench/bench_speed.log | grep -v TileLang; last=$n; }
    sleep 5
  done
  if [ -f /tmp/bench/done ]; then echo "bench: done"
  elif flock -n /tmp/bench.lock true; then echo "bench: stopped before the end (its log: bench_speed.log)"
  else echo "bench: still running at the limit"; fi
  cp /tmp/bench/bench_speed.log /tmp/bench/bench_speed.json "$OUT/" 2>/dev/null
  save_triton ;;
eval)  # teacher + every finished student: full five tasks (recovery, KL) and NIAH 256-8k
  # NIAH of every model at once; the teacher's quality first, so that each student's reuses its task scores
  # (--teacher_results) and only needs the teacher for the held-out KL.
  models="teacher=embedded" pids=() qflags=(--data_dir "$R/.dev/eval" --batch_size 64)
  for d in /tmp/runs/*/; do [ -f "$d/linzoo_training.json" ] && models="$models $(basename "$d")=$d"; done
  eval_job() {  # name quality|niah spec [flags...]; a job that succeeded in an earlier call (its .ok marker) is skipped
    local name=$1 kind=$2 spec=$3; shift 3
    [ -f "/tmp/eval/$name-$kind.ok" ] && return
    timeout "$(left)" python3 -m linzoo.cli eval "$kind" --model "$spec" --dtype bfloat16 --out "/tmp/eval/$name/$kind" \
      "$@" >"/tmp/eval/$name-$kind.log" 2>&1 && touch "/tmp/eval/$name-$kind.ok"
    echo "$name $kind: exit $?"; tail -1 "/tmp/eval/$name-$kind.log"
  }
  throttle() {  # at most EVAL_JOBS background eval jobs at once (+ the teacher's quality job, in the foreground)
    local n
    while [ $((LIMIT - SECONDS)) -gt 20 ]; do  # 13 jobs at once ran an H200 out of memory
      n=0; for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && n=$((n + 1)); done
      [ "$n" -lt "$EVAL_JOBS" ] && return; sleep 2
    done
  }
  for pair in $models; do
    throttle
    eval_job "${pair%%=*}" niah "${pair#*=}" --lengths 256,512,1024,2048,4096,8192 --batch_size 8 ${NIAH_ARGS:-} &
    pids+=($!)
  done
  eval_job teacher quality embedded "${qflags[@]}" ${EVAL_ARGS:-}
  reuse=()
  [ -f /tmp/eval/teacher-quality.ok ] && reuse=(--teacher_results /tmp/eval/teacher/quality/quality.json)
  for pair in $models; do
    name=${pair%%=*}
    [ "$name" = teacher ] && continue
    throttle
    eval_job "$name" quality "${pair#*=}" --teacher embedded "${reuse[@]}" "${qflags[@]}" ${EVAL_ARGS:-} &
    pids+=($!)
  done
  wait "${pids[@]}"  # not the training runs, which may still be this shell's children
  tar czf "$OUT/eval.tgz" -C /tmp/eval . ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac
done
ls -la "$OUT"
