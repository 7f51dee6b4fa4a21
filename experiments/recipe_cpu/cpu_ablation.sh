#!/usr/bin/env bash
# One row of the CPU recipe ablation (results/recipe/cpu/): the main job's linearize command (Gated DeltaNet from the
# embedded teacher, 128-token rows, batch 2, TOKENS tokens) with extra flags, then beside the teacher: held-out
# perplexity and KL on the same 2,048 tokens in 1,024-token blocks that the main job's quality report uses (and in
# 128-token blocks), and retrieval (`retrieval` of retrieval_start.py, beside it): greedy passkey NIAH at 256 and 512
# tokens (depths 0, 0.5, 1 x $SAMPLES prompts, default 10) and the teacher-forced log-probability of the key's tokens
# on the same prompts (chance -2.30), a continuous signal while exact match is 0. The teacher's numbers are computed
# once per $OUT. Appends one JSON line to $ROWS.
#   bash experiments/recipe_cpu/cpu_ablation.sh NAME [linearize flags...]      e.g. bash experiments/recipe_cpu/cpu_ablation.sh s1heavy --stage_fractions 0.4 0.1 0.5
set -euo pipefail
name=$1; shift
OUT=${OUT:-runs/cpu_ablation}; ROWS=${ROWS:-$OUT/rows.jsonl}
mkdir -p "$OUT"; rm -rf "${OUT:?}/$name"
start=$(date +%s)
linzoo linearize --teacher embedded --mixer gated_deltanet --dataset embedded --total_tokens "${TOKENS:-20000}" \
  --max_seq_length 128 --per_device_train_batch_size 2 --logging_steps 4 --save_steps 1000 \
  --output_dir "$OUT/$name" "$@" > "$OUT/$name.log" 2>&1
python - "$OUT/$name" "$name" "$(( $(date +%s) - start ))" "$*" "${SAMPLES:-10}" "$(dirname "$0")" >> "$ROWS" <<'PY'
import json, sys
from pathlib import Path
import linzoo
from linzoo.evals.common import load_texts
from linzoo.evals.quality import heldout_metrics
out, name, seconds, flags, samples = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
sys.path.insert(0, sys.argv[6])
from retrieval_start import retrieval
teacher, tok = linzoo.load_teacher("embedded")
model = linzoo.load_model(out)[0].eval()
texts = load_texts("embedded", split="test")
long = heldout_metrics(model, tok, texts, 2048, teacher.eval(), batch_size=4)
short = heldout_metrics(model, tok, texts, 8192, teacher, block_size=128, batch_size=8)
cached = Path(out).parent / f"teacher_retrieval_{samples}.json"
if not cached.is_file():
    cached.write_text(json.dumps(retrieval(teacher, tok, samples)))
student_retrieval, teacher_retrieval = retrieval(model, tok, samples), json.loads(cached.read_text())
record = json.load(open(f"{out}/linzoo_training.json"))
greedy = {l.split(")")[0][len("sample ("):]: l.split(" -> ", 1)[1].strip() for l in open(f"{out}.log")
          if l.startswith("sample (")}
print(json.dumps({
    "name": name, "flags": flags, "tokens": record["total_tokens"],
    "train_wall_s": seconds, "perplexity": round(long["perplexity"], 2), "teacher_perplexity": round(long["teacher_perplexity"], 2),
    "ratio": round(long["perplexity"] / long["teacher_perplexity"], 3), "kl": round(long["kl_to_teacher"], 3),
    "perplexity_128": round(short["perplexity"], 2), "teacher_perplexity_128": round(short["teacher_perplexity"], 2),
    "attn_layers": record.get("attn_layers"), **student_retrieval,
    **{f"teacher_{k}": v for k, v in teacher_retrieval.items()}, "samples": greedy}))
PY
tail -1 "$ROWS"
