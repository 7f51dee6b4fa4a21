#!/usr/bin/env bash
# What belongs to the lent GPU and nothing else: staging (the project installed fresh, the caches unpacked, offline),
# paths, and packing $OUT. The work itself is `linzoo zoo` (linzoo/zoo/: the plan, runs in sequence or side by
# side, the training deadline, resume, the report; linzoo/zoo/check.py: what it would fail on, checked first).
#
#     . .dev/stage.sh && bash scripts/device_jobs.sh PHASE [PHASE...]   (phases run in order, one LIMIT for all)
#
# zoo: builds the zoo file ZOO (ZOO_ARGS added, e.g. "--mixers gated_deltanet,deltanet"); without ZOO, the first build
#   of QUEUE (recipes/135m/gpu-queue.txt) that no complete zoo.json under RESULTS (results/gpu) records (`linzoo zoo
#   --next`). In the background under a lock, so that it outlives the call; the call follows its log until LIMIT and
#   packs the report, the state, the log and every row's card and results into $OUT (never weights). The same call
#   again goes on where it stopped: "zoo: the build has ended" ends it.
# export: the build's finished rows as the tensors training changed (`linzoo export-zoo`, EXPORT_ROWS, EXPORT_DTYPE),
#   in $OUT alone (run it in a call of its own after the zoo phase): in $DEV/exported, the next machine's zoo phase
#   rebuilds them (`linzoo import-zoo`) and goes on, e.g. the next step of a token ladder (--variants a,b).
# bench: scripts/bench_speed.py (training tokens/s beside fla's own layers, BENCH_ARGS) in the background the same way.
# parity: scripts/gpu_parity.py (the fast kernels against torch, PARITY_ARGS). profile: scripts/profile_train_step.py
#   (where a KD step's time goes, PROFILE_ARGS).
#
# The GPU image lacks fla, tilelang, lm-eval and more (linzoo/zoo/check.py's NEEDS names the wheels):
# `bash ../shared/device/prepare.sh` bundles them into .dev/b0..b3, one call each, and `.dev/stage.sh` installs them
# and exports TEACHER_GGUF. The embedded text cache (.dev/lzcache), the five eval sets (.dev/eval) and caches too big
# for one call (.dev/lzcache-*.tar.xz) travel in one more call; students, caches and the build stay in $WORK, so a
# later call on the same warm machine goes on from them. Results go to $OUT.
# DRY=1: the same on the CPU (TEACHER: a small model folder, default embedded; no GPU staging), as CI rehearses it
# (tests/test_device_jobs.py). DEV (default .dev) is the folder prepare.sh filled, WORK (default /tmp) the scratch.
set -uo pipefail
[ $# -gt 0 ] || { echo "usage: device_jobs.sh zoo|bench|parity|profile ..."; exit 2; }
R=$PWD
LIMIT=${LIMIT:-540}  # seconds for this call, from the script's start: under a 600 s per-call cap, with time to pack $OUT
WORK=${WORK:-/tmp} DEV=${DEV:-$R/.dev} TEACHER=${TEACHER:-embedded} DRY=${DRY:-}
left() { local l=$((LIMIT - SECONDS)); echo $((l > 10 ? l : 10)); }  # what remains of LIMIT, for each timeout
QUEUE=${QUEUE:-$R/recipes/135m/gpu-queue.txt} RESULTS=${RESULTS:-$R/results/gpu}

OUT=${OUT:-$WORK/linzoo-out}
mkdir -p "$OUT" "$WORK/work"

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

save_triton() {  # the compiled kernels, for the next lease (a cold cache cost 80-140 s a stage on 2026-12-06): as
  # triton-cache.tgz, or in 16 MB parts (.part00, ...; `cat` them together) in the files $OUT has left of its 8.
  # tar exits 1 when a file changed as it read it (jobs still compiling): the archive is kept then.
  [ -d "${TRITON_CACHE_DIR:-}" ] || return 0
  rm -f "$OUT"/triton-cache.tgz*
  tar czf "$WORK/triton.tgz" --warning=no-file-changed -C "$TRITON_CACHE_DIR" . ; [ $? -le 1 ] || return 0
  local size parts free
  size=$(stat -c %s "$WORK/triton.tgz") parts=$(( ($(stat -c %s "$WORK/triton.tgz") + 15999999) / 16000000 ))
  free=$((8 - $(find "$OUT" -maxdepth 1 -type f | wc -l)))
  if [ "$parts" -gt "$free" ]; then
    echo "triton cache: $size bytes, $parts parts of 16 MB, $free files left in \$OUT: not packed"
  elif [ "$parts" = 1 ]; then cp "$WORK/triton.tgz" "$OUT/triton-cache.tgz"
  else split -b 16000000 -d "$WORK/triton.tgz" "$OUT/triton-cache.tgz.part"; fi; }

lines() { [ -f "$1" ] && wc -l <"$1" || echo 0; }

zoo_folder() {  # Z: one folder per build (the zoo file and its --mixers): another build on the same warm machine
  # starts clean; --variants (a part of the build) builds in the same folder as the whole
  case $ZOO in /*) ;; *) ZOO=$R/$ZOO;; esac  # the commands run from $WORK/work
  Z=$WORK/zoo/$(basename "$ZOO" .yaml)$(echo "${ZOO_ARGS:-}" | sed -E 's/--variants[ =][^ ]+//' \
    | tr -cs 'A-Za-z0-9_\n' '-' | tr -d '\n'); }

follow() {  # LOCK LOG MARGIN FROM: prints LOG's lines after line FROM while LOCK is held, until MARGIN s before LIMIT
  local lock=$1 log=$2 margin=$3 last=$4 n
  while [ $((LIMIT - SECONDS)) -gt "$margin" ] && ! flock -n "$lock" true; do
    n=$(wc -l <"$log"); [ "$n" -gt "$last" ] && { sed -n "$((last + 1)),${n}p" "$log" | grep -av TileLang; last=$n; }
    sleep 5
  done
  n=$(wc -l <"$log"); [ "$n" -gt "$last" ] && sed -n "$((last + 1)),${n}p" "$log" | grep -av TileLang
  ! flock -n "$lock" true  # true: still running at the limit
}

in_background() {  # LOCK LOG COMMAND...: starts COMMAND under LOCK (so that it outlives this call) unless it is running
  local lock=$1 log=$2; shift 2
  flock -n "$lock" true || { echo "still running (from an earlier call)"; return 1; }
  setsid nohup flock -o "$lock" "$@" >>"$log" 2>&1 </dev/null &
  sleep 2
}

for PHASE in "$@"; do
echo "== $PHASE (${SECONDS}s of ${LIMIT}s)"
case $PHASE in
zoo)
  if [ -z "${ZOO:-}" ]; then  # the queue's next build, in words: a zoo file and its ZOO_ARGS
    next=$(python3 -m linzoo.cli zoo --next "$QUEUE" --results "$RESULTS") || { echo "$next"; exit 2; }
    read -r ZOO ZOO_ARGS <<<"$next"
    echo "zoo: the queue's next is $next"
  fi
  zoo_folder
  mkdir -p "$Z"
  if [ -f "$DEV/exported/zoo_export.json" ]; then  # students an earlier machine exported (the export phase), rebuilt here
    python3 -m linzoo.cli import-zoo "$DEV/exported" "$Z" --teacher "$TEACHER" || exit 2
  fi
  export EVAL_DATA=${EVAL_DATA:-$DEV/eval}  # the quality eval's five sets
  echo "zoo: building $ZOO ${ZOO_ARGS:-}(or going on) in $Z"
  from=$(lines "$Z.log")
  # shellcheck disable=SC2086  # ZOO_ARGS split into words on purpose
  in_background "$Z.lock" "$Z.log" python3 -m linzoo.cli zoo --config "$ZOO" --out "$Z" ${ZOO_ARGS:-}
  if follow "$Z.lock" "$Z.log" 25 "$from"; then echo "zoo: still building at the limit: call again"
  else echo "zoo: the build has ended (its last line above)"; fi
  cp "$Z/zoo.md" "$Z/zoo.json" "$Z/zoo.png" "$OUT/" 2>/dev/null
  tail -c 4000000 "$Z.log" >"$OUT/zoo.log"
  # the state, the short table, and every row's card, results and logs in one archive: files left for the kernels
  (cd "$Z" && shopt -s nullglob globstar && files=(zoo_state.json zoo-summary.md **/README.md **/eval/**/*.json
   **/eval/**/*.png **/linzoo_training.json **/*.log)
   [ ${#files[@]} -gt 0 ] && tar czf "$OUT/zoo_rows.tgz" "${files[@]}")
  save_triton ;;
export)  # the build's finished rows (EXPORT_ROWS, comma-separated; default all) as the tensors training changed, in
  # $OUT (zoo_export.json + <mixer>.<variant>.NN.safetensors, <= 16 MB each, EXPORT_DTYPE default bfloat16): bring
  # them back, put them in $DEV/exported for the next machine, and its zoo phase goes on from them (linzoo import-zoo).
  [ -n "${ZOO:-}" ] || { echo "export: name the build: ZOO (and ZOO_ARGS) as its zoo phase had them"; exit 2; }
  zoo_folder
  python3 -m linzoo.cli export-zoo "$Z" "$OUT" ${EXPORT_ROWS:+--rows "$EXPORT_ROWS"} --dtype "${EXPORT_DTYPE:-bfloat16}" \
    --max_file_mb 16 --teacher "$TEACHER" || exit 2
  n=$(find "$OUT" -maxdepth 1 -type f | wc -l)
  [ "$n" -le 8 ] || echo "export: $n files in \$OUT, more than 8: export fewer rows at a time (EXPORT_ROWS)" ;;
bench)  # resumable across calls like the zoo: call it again to wait for it; each call copies what it has so far
  B=$WORK/bench
  mkdir -p "$B"
  if [ -f "$B/done" ]; then echo "bench: finished already"
  elif [ -f "$B/bench_speed.log" ] && flock -n "$B.lock" true; then
    echo "bench: an earlier call's bench stopped before the end; not restarted (rm -rf $B to)"
  else
    echo "bench: starting"
    in_background "$B.lock" "$B/bench_speed.log" sh -c "python3 '$R/scripts/bench_speed.py' --iters 6 --new_tokens 48 \
      ${BENCH_ARGS:-} --out '$B/bench_speed.json' && touch '$B/done'"
  fi
  follow "$B.lock" "$B/bench_speed.log" 15 0 && echo "bench: still running at the limit"
  if [ -f "$B/done" ]; then echo "bench: done"; elif flock -n "$B.lock" true; then echo "bench: stopped before the end (its log: bench_speed.log)"; fi
  cp "$B/bench_speed.log" "$B/bench_speed.json" "$OUT/" 2>/dev/null
  save_triton ;;
parity)
  timeout "$(left)" python3 "$R/scripts/gpu_parity.py" --parallel --deadline $(($(left) - 30)) ${PARITY_ARGS:-} --out "$OUT/gpu_parity.json" 2>&1 | tee "$OUT/gpu_parity.log"
  save_triton ;;
profile)  # where a KD training step's time goes (gated_deltanet, the recipe's batch)
  timeout "$(left)" python3 "$R/scripts/profile_train_step.py" --mixer gated_deltanet ${PROFILE_ARGS:-} \
    --out "$OUT/profile_train_step.json" 2>&1 | tee -a "$OUT/profile_train_step.log" ;;
*) echo "unknown phase $PHASE (zoo, export, bench, parity, profile)"; exit 2 ;;
esac
done
ls -la "$OUT"
