#!/usr/bin/env bash
# The README's main job: linearize the embedded SmolLM2-135M-Instruct into a Gated DeltaNet student on a
# CPU-sized budget, then a short NIAH + quality report. ~15 min on 2 CPU cores. Output: runs/main/.
# For a real run use the GPU command in the README (tens of millions of tokens).
set -euo pipefail
OUT=${OUT:-runs/main}
# Zero-shot sets: $EVAL_DATA, else a checkout's ../shared/data/eval, else the Hub datasets -- checked before training,
# so that a machine without them stops now rather than after the training.
EVAL_DATA=${EVAL_DATA:-$([ -d ../shared/data/eval ] && echo ../shared/data/eval || true)}
python -c "import sys; from linzoo.evals.quality import TASKS, load_task_docs
[load_task_docs(t, sys.argv[1] or None, 1) for t in TASKS]" "${EVAL_DATA:-}" >/dev/null 2>&1 || {
  echo "main_job: the five zero-shot sets are not reachable (EVAL_DATA='${EVAL_DATA:-}', Hub datasets tried if empty)." >&2
  echo "  Set EVAL_DATA to a folder holding lambada_openai, winogrande, arc_easy, arc_challenge and piqa .jsonl" >&2
  echo "  files (the format of evals/LM_EVAL.md), or run where the Hub is reachable." >&2
  exit 2; }
# The CPU recipe (results/recipe/cpu/: one change at a time at 20k tokens, held-out perplexity beside the teacher):
# on 2 cores stage 1 runs ~3x faster per token than stage 3, so it gets 40 % of the budget; only the mixers train
# (the teacher's other weights are already right, and full-model steps on 256-token batches only add noise), with a
# higher stage-3 learning rate than the GPU recipe's full-model 1e-4.
linzoo linearize --teacher embedded --mixer gated_deltanet --dataset embedded \
  --total_tokens "${TOKENS:-40000}" --max_seq_length 128 --per_device_train_batch_size 2 \
  --stage_fractions 0.4 0.1 0.5 --stage_trainable mixers mixers mixers --stage_learning_rates 1e-3 5e-4 1e-3 \
  --logging_steps 4 --save_steps 20 --output_dir "$OUT"
linzoo eval niah --model "$OUT" --teacher embedded --lengths 256,512 --depths 0,0.5,1 --samples_per_cell 2 \
  --batch_size 6 --out "$OUT/eval"
linzoo eval quality --model "$OUT" --teacher embedded ${EVAL_DATA:+--data_dir "$EVAL_DATA"} --limit 20 \
  --heldout_tokens 2048 --out "$OUT/eval"
python - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
q = json.load(open(f"{out}/eval/quality.json")); n = json.load(open(f"{out}/eval/niah.json"))
print("\n== report for", out)
for task, r in q["tasks"].items():  # the metric that recovery uses: acc_norm for arc and piqa, acc otherwise
    m = q["recovery_metric"][task]
    rec = q["recovery"][task]
    print(f"  {task:16s} {m:8s} {r[m]:.3f}  teacher {q['teacher_tasks'][task][m]:.3f}  chance {r['chance']:.3f}  "
          f"recovery {'n/a (teacher 0)' if rec is None else f'{rec:.1f} %'}")
above = q["recovery_above_chance"]
kept = "n/a" if above["average"] is None else f"{above['average']:.1f} %"
print(f"  recovery above chance {kept} (over {', '.join(above['tasks']) or 'no task: the teacher is near chance on all'})")
print(f"  recovery average {q['recovery']['average']:.1f} % (a uniform guess: {q['chance_recovery']['average']:.1f} %)"
      f"  perplexity {q['perplexity']:.1f} (teacher {q['teacher_perplexity']:.1f}, "
      f"{q['perplexity'] / q['teacher_perplexity']:.2f}x)  KL {q['kl_to_teacher']:.3f}")
print(f"  NIAH passkey accuracy by length {n['mean_by_length']}  overall {n['overall']}")
PY
