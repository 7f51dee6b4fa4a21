#!/usr/bin/env bash
# The GPU runs behind results/gpu/, in phases sized to fit time-limited calls (see results/gpu/README.md):
#
#     . .dev/stage.sh && bash scripts/device_jobs.sh PHASE [PHASE...]   (phases run in order, one LIMIT for all)
#
# campaign: the whole lease's plan from one campaign file (CAMPAIGN, e.g. recipes/135m/campaign.runs; its line kinds
# in scripts/campaign.py): check (bundles, imports, paths, every flag) -> speed (alone on the card; sizes the runs to
# equal tokens that fit) -> train (all runs side by side, each stopping, saving and going on at the train phase's
# deadline: linearize --max_wall_seconds) -> eval (the teacher and every student) -> report ($OUT in the layout of
# results/gpu/<date>/, <= 8 files). The same call, repeated, goes on where the last one stopped (state in
# $WORK/campaign) and prints each phase's planned and used seconds; "campaign: done" ends it. README: "Firing the GPU
# campaign". DRY=1: the same on the CPU with tiny budgets (TEACHER: a small model folder, default embedded), so a lent
# GPU meets only the numbers; DEV (default .dev) is the folder prepare.sh filled, WORK (default /tmp) the scratch.
# zoo: the zoo file ZOO (recipes/135m/zoo-gpu.yaml) built by `linzoo zoo` in the background, its report packed.
# start: starts (or resumes) the training runs in the background and returns; parity: the fast-vs-torch check;
# wait: until the runs finish or LIMIT nears; eval: teacher + finished students; bench (background, resumable
# across calls like the runs: call it again to wait for it); profile.
# E.g. `start parity wait` then, in the next call of the same block, `wait eval`.
# A run holds a lock ($WORK/runs/<name>.lock) while it trains, so that it can outlive the call that started it:
# the next call finds it running and waits for it; if its process is gone, `start` resumes it from its last
# checkpoint (same stage, step).
#
# The GPU image lacks lm-eval, fla, tilelang and more: what the plan imports and which wheels carry it is
# scripts/campaign.py's NEEDS, which `campaign` checks first; `bash ../shared/device/prepare.sh` bundles them (the
# four bundles then fit the 64 MiB per call; .dev/corpus, .dev/lzcache and .dev/eval travel together in a fifth call).
# Runs offline (HF_HUB_OFFLINE): needs fla, mlstm-kernels and tilelang importable and TEACHER_GGUF set (what
# `.dev/stage.sh` does: it installs them from wheels carried with the checkout), the embedded text corpus in
# `.dev/lzcache/` and the five eval sets in `.dev/eval/`. Students and the Triton cache stay in $WORK, so that a
# later call on the same host continues from them. Results go to $OUT.
# LONG (default gated_deltanet; empty for none) and SHORT (six mixers; empty for none) pick the runs.
# CPU dry run of the plumbing: TRAIN_TOKENS, SHORT_TOKENS, TRAIN_ARGS, EVAL_ARGS, NIAH_ARGS, SPEED_ARGS (the speed
# phase's scripts), SPEED_EVAL_ARGS (`linzoo eval speed`) shrink the jobs (DRY=1 sets them); PARITY_ARGS (e.g.
# "--mixers xlstm") narrows the parity check; EVAL_JOBS (default 6) caps concurrent background eval jobs.
set -uo pipefail
[ $# -gt 0 ] || { echo "usage: device_jobs.sh campaign|zoo|start|wait|parity|eval|bench|profile ..."; exit 2; }
R=$PWD
LIMIT=${LIMIT:-540}  # seconds for this call, from the script's start: under a 600 s per-call cap, with time to pack $OUT
WORK=${WORK:-/tmp} DEV=${DEV:-$R/.dev} TEACHER=${TEACHER:-embedded} DRY=${DRY:-}
STOP_AT=  # a campaign phase's deadline (unix seconds), when one is running
left() {  # what remains of LIMIT (and of the running campaign phase), for each timeout
  local l=$((LIMIT - SECONDS)) now; now=$(date +%s)
  [ -n "$STOP_AT" ] && [ $((STOP_AT - now)) -lt "$l" ] && l=$((STOP_AT - now))
  echo $((l > 10 ? l : 10))
}
if [ -n "$DRY" ]; then  # the CPU rehearsal: every phase as on the GPU, tiny budgets (each can be overridden)
  TRAIN_TOKENS=${TRAIN_TOKENS:-768}
  TRAIN_ARGS=${TRAIN_ARGS:---max_seq_length 64 --per_device_train_batch_size 2 --bf16 false --logging_steps 1 --save_steps 2 --dataloader_pin_memory false}
  NIAH_ARGS=${NIAH_ARGS:---lengths 128,256 --depths 0,1 --samples_per_cell 1 --batch_size 4}
  EVAL_ARGS=${EVAL_ARGS:---limit 2 --heldout_tokens 256 --batch_size 4}
  SPEED_ARGS=${SPEED_ARGS:---device cpu --batch 2 --seq_len 32 --iters 1}
  SPEED_EVAL_ARGS=${SPEED_EVAL_ARGS:---device cpu --dtype float32 --lengths 32,64 --batch_sizes 1,2 --repeats 1
    --decode_tokens 2 --threads 1}
fi
SHORT=${SHORT-linear_attn retnet gla deltanet kda xlstm}  # 2M-token runs; SHORT= (empty): none
LONG=${LONG-gated_deltanet}  # TRAIN_TOKENS (20M) runs with the recipe's batch; LONG= (empty): none

# CAMPAIGN (e.g. recipes/135m/ablation.runs): instead of LONG/SHORT, its run lines "name mixer tokens [flags...]"
# (all side by side on the one card; results under each name): an ablation at equal budget.
CAMPAIGN=${CAMPAIGN:-}
plan() { python3 "$R/scripts/campaign.py" "$@"; }  # the campaign file's reader, checks, sizing and report
# The queue (issue 32): `campaign` without CAMPAIGN fires the first campaign of QUEUE that no complete
# results/gpu/<date>/ of this checkout (RESULTS) records; commit each campaign's results to move the queue on.
QUEUE=${QUEUE:-recipes/135m/gpu-queue.txt}
if [ -z "$CAMPAIGN" ] && [ "${1:-}" = campaign ]; then
  case $QUEUE in /*) ;; *) QUEUE=$R/$QUEUE;; esac
  CAMPAIGN=$(plan next "$QUEUE" --results "${RESULTS:-$R/results/gpu}") \
    || { echo "campaign: nothing to fire from $QUEUE"; exit 2; }
  echo "campaign: the queue's next is $CAMPAIGN"
fi
if [ -n "$CAMPAIGN" ]; then
  case $CAMPAIGN in /*) ;; *) CAMPAIGN=$R/$CAMPAIGN;; esac  # the jobs run from $WORK/work
  RUNS_LIST=$CAMPAIGN
  LONG= SHORT=
  RUNS=$(plan show "$CAMPAIGN" run | awk '{print $1}' | tr '\n' ' ') || exit 2
else
  RUNS="$LONG $SHORT"
fi
for m in $LONG; do case " $SHORT " in *" $m "*) echo "$m is in both LONG and SHORT: name it in one"; exit 2;; esac; done
EVAL_JOBS=${EVAL_JOBS:-6}
case $EVAL_JOBS in ''|*[!0-9]*|0) echo "EVAL_JOBS must be a whole number >= 1, got '$EVAL_JOBS'"; exit 2;; esac
OUT=${OUT:-$WORK/linzoo-out}
mkdir -p "$OUT" "$WORK/work" "$WORK/runs" "$WORK/eval"

# The project itself (no deps: installed beforehand, nothing is downloaded), fresh each call, in a folder of its own:
# a run started by an earlier call may still be training from (and later saving modeling files out of) the last one.
LZ=$WORK/lz.$(date +%s)
python3 -m pip install -q --no-deps --no-build-isolation --target "$LZ" "$R" >"$WORK/lz-pip.log" 2>&1 \
  || { tail -5 "$WORK/lz-pip.log"; exit 1; }
export PYTHONPATH=$LZ${PYTHONPATH:+:$PYTHONPATH}
if [ -z "$DRY" ]; then export LINZOO_TEACHER_GGUF=${TEACHER_GGUF:?run . .dev/stage.sh first}; fi
export LINZOO_DEBUG=1  # a failing job's log keeps its traceback
export LINZOO_CACHE=$WORK/lzcache HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
[ -d "$WORK/lzcache/data" ] || [ ! -d "$DEV/lzcache" ] || { mkdir -p "$WORK/lzcache" && cp -r "$DEV/lzcache/." "$WORK/lzcache/"; }
# Caches too big for one call uncompressed travel as $DEV/lzcache-*.tar.xz: the embedded chats (sft, distill-instruct,
# the held-out chats) are 102 MB, 19 MB as
#   tar --exclude='cache-*' -C ~/.cache/linzoo/data -cJf .dev/lzcache-chat.tar.xz embedded-chat-v2
for f in "$DEV"/lzcache-*.tar.xz; do
  [ -f "$f" ] && mkdir -p "$WORK/lzcache/data" && tar -xJf "$f" -C "$WORK/lzcache/data" --skip-old-files
done
# The long corpus (--dataset long) travels as its xz bundle in .dev/corpus (scripts/corpus_bundle.py export).
[ -d "$DEV/corpus" ] && export LINZOO_CORPUS_DIR=$DEV/corpus
cd "$WORK/work"  # outside the checkout: its linzoo/ folder would shadow the installed package
if [ -n "$DRY" ]; then echo "cpu (DRY=1 rehearsal, teacher $TEACHER)" | tee "$OUT/card.txt"
else nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$OUT/card.txt"; fi
[ "$TEACHER" = embedded ] && python3 -c "from linzoo.loading import resolve; print(resolve('embedded'))"  # convert the GGUF once

save_triton() {  # tar exits 1 when a file changed as it read it (jobs still compiling): the archive is kept then
  [ -d "${TRITON_CACHE_DIR:-}" ] || return 0
  tar czf "$WORK/triton.tgz" --warning=no-file-changed -C "$TRITON_CACHE_DIR" . ; [ $? -le 1 ] \
    && [ "$(stat -c %s "$WORK/triton.tgz")" -lt 16000000 ] && cp "$WORK/triton.tgz" "$OUT/triton-cache.tgz"; }

linearize() {  # name mixer tokens [extra flags...]: starts it in the background unless finished or already running
  # (then returns 1: nothing started)
  local m=$1 mixer=$2 tokens=$3; shift 3
  if [ -f "$WORK/runs/$m/linzoo_training.json" ]; then echo "$m: finished already"; return 1; fi
  if ! flock -n "$WORK/runs/$m.lock" true; then echo "$m: still running (from an earlier call)"; return 1; fi
  echo "$m: starting (or resuming)"
  # shellcheck disable=SC2086  # TRAIN_ARGS split into words on purpose
  setsid nohup flock -o "$WORK/runs/$m.lock" python3 -m linzoo.cli linearize --config "$R/recipes/135m/linearize.yaml" --mixer "$mixer" \
    --teacher "$TEACHER" --total_tokens "$tokens" --output_dir "$WORK/runs/$m" --disable_tqdm true --report_to none \
    --save_steps 100 --save_total_limit 1 "$@" ${TRAIN_ARGS:-} >"$WORK/runs/$m.$(date +%s).log" 2>&1 </dev/null &
  for _ in $(seq 100); do flock -n "$WORK/runs/$m.lock" true || return 0; sleep 0.1; done  # until it holds the lock
  echo "$m: WARNING its process did not take the lock within 10 s (died at start? see $WORK/runs/$m.*.log)"
}

start_runs() {  # Gated DeltaNet with the recipe's batch; the short runs with 2 x 4 accumulation (same tokens/step)
  if [ -n "${RUNS_LIST:-}" ]; then  # a campaign's run lines; within a campaign phase each run stops at its deadline
    local name mixer tokens flags wall lines tries
    lines=$(plan show "$RUNS_LIST" run) || return 2
    [ -n "${LINZOO_CORPUS_DIR:-}" ] && grep -q -- "--dataset long" <<<"$lines" && python3 -c \
      "from linzoo.data import load_text_dataset; load_text_dataset('long', split='train')"  # import the bundle once
    while read -r name mixer tokens flags; do
      wall=()
      [ -n "$STOP_AT" ] && wall=(--max_wall_seconds $((STOP_AT - $(date +%s) > 1 ? STOP_AT - $(date +%s) : 1)))
      # shellcheck disable=SC2086  # flags split into words on purpose
      linearize "$name" "$mixer" "${TRAIN_TOKENS:-$tokens}" --logging_steps 10 "${wall[@]}" $flags || continue
      # one at a time through data loading and packing (runs sharing a dataset would race for its cache files), at
      # most 120 s a run and never past the call's LIMIT (a run already running from an earlier call is not waited for)
      tries=$((2 * ($(left) - 20))); [ "$tries" -gt 240 ] && tries=240; [ "$tries" -lt 1 ] && tries=1
      for _ in $(seq "$tries"); do
        grep -qs -e "fitted the fresh student" -e "linzoo: stage1" -e Traceback "$WORK"/runs/$name.*.log && break
        flock -n "$WORK/runs/$name.lock" true && break; sleep 0.5
      done
    done <<<"$lines"
    return
  fi
  for m in $LONG; do linearize "$m" "$m" "${TRAIN_TOKENS:-20000000}" --logging_steps 10; done
  [ -z "$SHORT" ] && return
  # pack the short runs' shared 2M-token budget once, before six processes race for the same datasets cache file
  python3 -c "from linzoo import load_teacher; from linzoo.data import load_text_dataset, pack_dataset
pack_dataset(load_text_dataset('embedded', split='train'), load_teacher('$TEACHER')[1], 2048, max_tokens=${SHORT_TOKENS:-2000000})"
  for m in $SHORT; do
    linearize "$m" "$m" "${SHORT_TOKENS:-2000000}" --logging_steps 5 --per_device_train_batch_size 2 \
      --gradient_accumulation_steps 4
  done
}

busy_runs() { local m; for m in $RUNS; do [ -e "$WORK/runs/$m.lock" ] && ! flock -n "$WORK/runs/$m.lock" true && echo -n " $m"; done; }

wait_runs() {  # until no run holds its lock, or 20 s before LIMIT; prints each run's last log line now and then
  local n=0 busy=""
  while [ $((LIMIT - SECONDS)) -gt 20 ]; do
    busy=$(busy_runs)
    [ -z "$busy" ] && { echo "no run is training"; return 0; }
    if [ $((n++ % 12)) = 0 ]; then
      for m in $busy; do echo "[$SECONDS s] $m: $(ls -t "$WORK"/runs/$m.*.log | head -1 | xargs tail -c 300 | tr '\r' '\n' | grep -a . | tail -1)"; done
    fi
    sleep 5
  done
  echo "still training at the limit:$busy"
}

pack_runs() {  # all logs and the records of finished runs (never checkpoints) -> $OUT
  (cd "$WORK/runs" && shopt -s nullglob && logs=(*.log) records=(*/linzoo_training.json */stage*/stage_done.json */config.json)
   [ ${#logs[@]} -gt 0 ] && tar czf "$OUT/train_logs.tgz" "${logs[@]}"
   [ ${#records[@]} -gt 0 ] && tar czf "$OUT/train_records.tgz" "${records[@]}"
   for f in */linzoo_training.json; do echo "finished: $f"; done)
}

run_eval() {  # teacher + every finished student: the five tasks (recovery, KL), NIAH and speed (the campaign's eval
  # lines: their flags, and which run; without any, NIAH and quality). Speed first, alone on the card: every model in
  # one process, the teacher first. Then NIAH of every model at once; the teacher's quality first, so that each
  # student's reuses its task scores (--teacher_results) and only needs the teacher for the held-out KL.
  local models="teacher=$TEACHER" students=() pids=() qflags=(--data_dir "$DEV/eval" --batch_size 64) niah_flags=() \
    quality_flags=() speed_flags=() kinds="" kind flags
  if [ -n "$CAMPAIGN" ]; then
    while read -r kind flags; do  # shellcheck disable=SC2206  # split into words on purpose
      kinds="$kinds $kind "
      case $kind in niah) niah_flags=($flags);; quality) quality_flags=($flags);; speed) speed_flags=($flags);; esac
    done < <(plan show "$CAMPAIGN" eval)
  fi
  [ -n "$kinds" ] || kinds=" niah quality "
  for d in "$WORK"/runs/*/; do
    [ -f "$d/linzoo_training.json" ] && models="$models $(basename "$d")=$d" && students+=("${d%/}")
  done
  eval_job() {  # name kind [flags...] into $WORK/eval/name/kind; one that succeeded in an earlier call (.ok) is skipped
    local name=$1 kind=$2; shift 2
    [ -f "$WORK/eval/$name-$kind.ok" ] && return
    rm -f "$WORK/eval/$name-$kind.failed"
    timeout "$(left)" python3 -m linzoo.cli eval "$kind" --dtype bfloat16 --out "$WORK/eval/$name/$kind" \
      "$@" >"$WORK/eval/$name-$kind.log" 2>&1 </dev/null && touch "$WORK/eval/$name-$kind.ok" \
      || touch "$WORK/eval/$name-$kind.failed"
    echo "$name $kind: exit $?"; tail -1 "$WORK/eval/$name-$kind.log"
  }
  throttle() {  # at most EVAL_JOBS background eval jobs at once (+ the teacher's quality job, in the foreground)
    local n
    while [ "$(left)" -gt 20 ]; do  # 13 jobs at once ran an H200 out of memory
      n=0; for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && n=$((n + 1)); done
      [ "$n" -lt "$EVAL_JOBS" ] && return; sleep 2
    done
  }
  if [[ $kinds == *" speed "* ]]; then  # into $WORK/eval/all/speed
    # shellcheck disable=SC2086
    eval_job all speed --models "$TEACHER" "${students[@]}" "${speed_flags[@]}" ${SPEED_EVAL_ARGS:-}
  fi
  if [[ $kinds == *" niah "* ]]; then
    for pair in $models; do
      throttle
      # shellcheck disable=SC2086
      eval_job "${pair%%=*}" niah --model "${pair#*=}" --lengths 256,512,1024,2048,4096,8192 --batch_size 8 \
        "${niah_flags[@]}" ${NIAH_ARGS:-} &
      pids+=($!)
    done
  fi
  if [[ $kinds == *" quality "* ]]; then
    # shellcheck disable=SC2086
    eval_job teacher quality --model "$TEACHER" "${qflags[@]}" "${quality_flags[@]}" ${EVAL_ARGS:-}
    local reuse=()
    [ -f "$WORK/eval/teacher-quality.ok" ] && reuse=(--teacher_results "$WORK/eval/teacher/quality/quality.json")
    for pair in $models; do
      name=${pair%%=*}
      [ "$name" = teacher ] && continue
      throttle
      # shellcheck disable=SC2086
      eval_job "$name" quality --model "${pair#*=}" --teacher "$TEACHER" "${reuse[@]}" "${qflags[@]}" "${quality_flags[@]}" \
        ${EVAL_ARGS:-} &
      pids+=($!)
    done
  fi
  [ ${#pids[@]} -eq 0 ] || wait "${pids[@]}"  # not the training runs, which may still be this shell's children
}

# --- the campaign: its state (phase marks, the speed phase's results, the log) lives in $ST across the calls
ST=$WORK/campaign
planned() { awk -v p="$1" '$1 == p {print int($2)}' "$ST/plan"; }
phase_end() {  # until when phase $1 may run: its planned seconds from its start, never into the later phases' time
  local began total=0 later=0 seen="" p s
  began=$(cat "$ST/$1.began")
  while read -r p s; do s=${s%.*}; total=$((total + s)); [ -n "$seen" ] && later=$((later + s)); [ "$p" = "$1" ] && seen=1; done <"$ST/plan"
  local own=$((began + $(planned "$1"))) cap=$(($(cat "$ST/start") + total - later))
  echo $((own < cap ? own : cap))
}
begin() { [ -f "$ST/$1.began" ] || date +%s >"$ST/$1.began"; STOP_AT=$(phase_end "$1"); echo "campaign: $1 until $(date -d "@$STOP_AT" +%T) ($((STOP_AT - $(date +%s))) s)"; }
finish() {
  date +%s >"$ST/$1.ended"; STOP_AT=
  echo "campaign: $1 planned $(planned "$1") s, used $(($(cat "$ST/$1.ended") - $(cat "$ST/$1.began"))) s"
}

failures() {  # a run that ended without its student, an eval job that failed: one line each, with its log's last line
  local m f
  for m in $RUNS; do
    [ -f "$WORK/runs/$m/linzoo_training.json" ] || [ -n "$(busy_runs | grep -w "$m")" ] \
      || echo "run $m: $(ls -t "$WORK"/runs/$m.*.log 2>/dev/null | head -1 | xargs -r tail -n 1)"
  done
  for f in "$WORK"/eval/*.failed; do [ -f "$f" ] && echo "eval $(basename "$f" .failed): $(tail -n 1 "${f%.failed}.log")"; done
}

campaign_step() {  # the next phases of the plan, as far as this call goes; returns 1 when a later call must go on
  plan show "$CAMPAIGN" phase >"$ST/plan" || return 2
  [ "$(awk '{printf "%s ", $1}' "$ST/plan")" = "speed train eval " ] \
    || { echo "campaign: $CAMPAIGN plans no phases: it needs the lines phase speed|train|eval SECONDS"; return 2; }
  if [ ! -f "$ST/checked" ]; then  # before any GPU minute goes to a plan that cannot run
    plan check "$CAMPAIGN" --dev "$DEV" --teacher "$TEACHER" --train_args "${TRAIN_ARGS:-}" ${DRY:+--dry} || return 2
    touch "$ST/checked"
  fi
  # the plan's clock starts once its check passes: calls that stopped at the check spend none of the phases' time
  [ -f "$ST/start" ] || date +%s >"$ST/start"
  local script flags extra
  if [ ! -f "$ST/speed.ended" ]; then
    begin speed
    while read -r script flags; do
      extra=""
      [ -n "$DRY" ] && [ "$script" = bench_speed.py ] && extra="--new_tokens 2 --stages 2"
      # shellcheck disable=SC2086
      timeout "$(left)" python3 "$R/scripts/$script" --teacher "$TEACHER" $flags ${SPEED_ARGS:-} $extra \
        --out "$ST/speed/${script%.py}.json" </dev/null 2>&1 | tee "$ST/speed/${script%.py}.log" | grep -v TileLang
    done < <(plan show "$CAMPAIGN" speed)
    finish speed
  fi
  if [ ! -f "$ST/sized.runs" ]; then
    if [ -f "$ST/speed/bench_speed.json" ] && plan size "$CAMPAIGN" --bench "$ST/speed/bench_speed.json" \
        --seconds "$(planned train)" --train_args "${TRAIN_ARGS:-}" --out "$ST/sized.runs" >"$ST/size.txt"; then
      cat "$ST/size.txt"
    else
      echo "campaign: the speed phase measured no stage speeds: the runs get their lines' tokens, and the train" \
        "phase's deadline stops them" | tee "$ST/size.txt"
      plan show "$CAMPAIGN" run >"$ST/sized.runs"
    fi
  fi
  if [ ! -f "$ST/train.ended" ]; then
    begin train
    RUNS_LIST=$ST/sized.runs start_runs
    wait_runs
    [ -n "$(busy_runs)" ] && return 1
    finish train
  fi
  if [ ! -f "$ST/eval.ended" ]; then
    if [ ! -f "$ST/eval.began" ] && [ $((LIMIT - SECONDS)) -lt "$(planned eval)" ]; then
      echo "campaign: eval needs $(planned eval) s, this call has $((LIMIT - SECONDS)) s left"; return 1
    fi
    begin eval
    run_eval
    finish eval
  fi
}

for PHASE in "$@"; do
echo "== $PHASE (${SECONDS}s of ${LIMIT}s)"
case $PHASE in
campaign)
  [ -n "$CAMPAIGN" ] || { echo "campaign: set CAMPAIGN to a campaign file, e.g. recipes/135m/campaign.runs"; exit 2; }
  mkdir -p "$ST/speed"
  exec > >(tee -a "$ST/campaign.log") 2>&1  # every call's output, in the report
  campaign_step; rc=$?
  [ $rc = 2 ] && { echo "campaign: stopped: fix the above and call again"; exit 2; }
  failed=$(failures)
  [ -n "$failed" ] && { echo "campaign: FAILED (what the others measured is packed all the same):"; echo "$failed"; }
  if [ $rc != 0 ]; then echo "campaign: not finished: make the same call again"
  elif [ -n "$failed" ]; then echo "campaign: finished with the failures above; copy \$OUT into results/gpu/<date>/ (not complete: the queue fires it again)"
  else echo "campaign: done; copy \$OUT (not triton-cache.tgz) into results/gpu/<date>/"; fi
  save_triton
  plan report --campaign "$CAMPAIGN" --work "$WORK" --out "$OUT" --failed "$failed" || exit 2
  [ -z "$failed" ] || exit 1 ;;
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
  B=$WORK/bench
  if [ -f "$B/done" ]; then echo "bench: finished already"
  elif [ -f "$B/bench_speed.log" ] && flock -n "$B.lock" true; then
    echo "bench: an earlier call's bench stopped before the end; not restarted (rm -rf $B to)"
  elif flock -n "$B.lock" true; then
    echo "bench: starting"; mkdir -p "$B"
    setsid nohup flock -o "$B.lock" sh -c "python3 '$R/scripts/bench_speed.py' --iters 6 --new_tokens 48 \
      ${BENCH_ARGS:-} --out '$B/bench_speed.json' && touch '$B/done'" >"$B/bench_speed.log" 2>&1 </dev/null &
    sleep 2
  else echo "bench: still running (from an earlier call)"; fi
  last=0
  while [ $((LIMIT - SECONDS)) -gt 15 ] && ! flock -n "$B.lock" true; do
    n=$(wc -l <"$B/bench_speed.log"); [ "$n" -gt "$last" ] && { sed -n "$((last + 1)),${n}p" "$B/bench_speed.log" | grep -v TileLang; last=$n; }
    sleep 5
  done
  if [ -f "$B/done" ]; then echo "bench: done"
  elif flock -n "$B.lock" true; then echo "bench: stopped before the end (its log: bench_speed.log)"
  else echo "bench: still running at the limit"; fi
  cp "$B/bench_speed.log" "$B/bench_speed.json" "$OUT/" 2>/dev/null
  save_triton ;;
eval)
  run_eval
  tar czf "$OUT/eval.tgz" -C "$WORK/eval" . ;;
zoo)  # the zoo file $ZOO (e.g. recipes/135m/zoo-gpu.yaml) built by `linzoo zoo` itself (the plan, side by side,
  # resume, the report: linzoo/zoo.py), in the background under a lock so that it outlives the call; each call starts
  # it unless it is running, follows its log until LIMIT, and packs the report into $OUT (the same call again goes on).
  [ -n "${ZOO:-}" ] || { echo "zoo: set ZOO to a zoo file, e.g. recipes/135m/zoo-gpu.yaml"; exit 2; }
  case $ZOO in /*) ;; *) ZOO=$R/$ZOO;; esac
  Z=$WORK/zoo
  mkdir -p "$Z"
  export EVAL_DATA=${EVAL_DATA:-$DEV/eval}  # the quality eval's five sets
  if ! flock -n "$Z.lock" true; then echo "zoo: still building (from an earlier call)"
  else
    echo "zoo: building $ZOO (or going on) in $Z"
    # shellcheck disable=SC2086  # ZOO_ARGS split into words on purpose
    setsid nohup flock -o "$Z.lock" python3 -m linzoo.cli zoo --config "$ZOO" --out "$Z" ${ZOO_ARGS:-} \
      >>"$Z.log" 2>&1 </dev/null &
    sleep 2
  fi
  last=$(wc -l <"$Z.log")
  while [ $((LIMIT - SECONDS)) -gt 25 ] && ! flock -n "$Z.lock" true; do
    n=$(wc -l <"$Z.log"); [ "$n" -gt "$last" ] && { sed -n "$((last + 1)),${n}p" "$Z.log"; last=$n; }
    sleep 5
  done
  n=$(wc -l <"$Z.log"); [ "$n" -gt "$last" ] && sed -n "$((last + 1)),${n}p" "$Z.log"
  flock -n "$Z.lock" true && echo "zoo: the build has ended (its last line above)" || echo "zoo: still building at the limit: call again"
  # what comes back: the report, the state, the log, and every row's card and results (never weights)
  cp "$Z/zoo.md" "$Z/zoo.json" "$Z/zoo.png" "$Z/zoo_state.json" "$OUT/" 2>/dev/null
  tail -c 4000000 "$Z.log" >"$OUT/zoo.log"
  (cd "$Z" && shopt -s nullglob globstar && files=(**/README.md **/eval/**/*.json **/eval/**/*.png **/linzoo_training.json **/*.log)
   [ ${#files[@]} -gt 0 ] && tar czf "$OUT/zoo_rows.tgz" "${files[@]}")
  save_triton ;;
*) echo "unknown phase $PHASE"; exit 2 ;;
esac
done
ls -la "$OUT"
