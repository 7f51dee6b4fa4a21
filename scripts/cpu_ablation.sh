#!/usr/bin/env bash
# One row of the CPU recipe ablation (results/recipe/cpu/): the main job's linearize command (Gated DeltaNet from the
# embedded teacher, 128-token rows, batch 2, TOKENS tokens) with extra flags, then held-out perplexity and KL beside
# the teacher on the same 2,048 tokens in 1,024-token blocks that the main job's quality report uses, and in
# 128-token blocks. Appends one JSON line to $ROWS and prints it.
#   bash scripts/cpu_ablation.sh NAME [linearize flags...]      e.g. bash scripts/cpu_ablation.sh s1heavy --stage_fractions 0.4 0.1 0.5
set -euo pipefail
name=$1; shift
OUT=${OUT:-runs/cpu_ablation}; ROWS=${ROWS:-$OUT/rows.jsonl}
mkdir -p "$OUT"; rm -rf "${OUT:?}/$name"
start=$(date +%s)
linzoo linearize --teacher embedded --mixer gated_deltanet --dataset embedded --total_tokens "${TOKENS:-20000}" \
  --max_seq_length 128 --per_device_train_batch_size 2 --logging_steps 4 --save_steps 1000 \
  --output_dir "$OUT/$name" "$@" > "$OUT/$name.log" 2>&1
python - "$OUT/$name" "$name" "$(( $(date +%s) - start ))" "$*" >> "$ROWS" <<'PY'
import json, sys
import linzoo
from linzoo.evals.niah import load_texts
from linzoo.evals.quality import heldout_metrics
out, name, seconds, flags = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
teacher, tok = linzoo.load_teacher("embedded")
model = linzoo.load_model(out)[0].eval()
texts = load_texts("embedded", split="test")
long = heldout_metrics(model, tok, texts, 2048, teacher.eval(), batch_size=4)
short = heldout_metrics(model, tok, texts, 8192, teacher, block_size=128, batch_size=8)
record = json.load(open(f"{out}/linzoo_training.json"))
samples = {l.split(")")[0][len("sample ("):]: l.split(" -> ", 1)[1].strip() for l in open(f"{out}.log")
           if l.startswith("sample (")}
print(json.dumps({
    "name": name, "flags": flags, "tokens": record["total_tokens"],
    "train_wall_s": seconds, "perplexity": round(long["perplexity"], 2), "teacher_perplexity": round(long["teacher_perplexity"], 2),
    "ratio": round(long["perplexity"] / long["teacher_perplexity"], 3), "kl": round(long["kl_to_teacher"], 3),
    "perplexity_128": round(short["perplexity"], 2), "teacher_perplexity_128": round(short["teacher_perplexity"], 2),
    "samples": samples}))
PY
tail -1 "$ROWS"
