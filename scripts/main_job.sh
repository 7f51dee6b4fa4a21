#!/usr/bin/env bash
# The README's main job: linearize the embedded SmolLM2-135M-Instruct into a Gated DeltaNet student on a
# CPU-sized budget, then a short NIAH + quality report (~8 min on 2 idle CPU cores, set-up included). Output: runs/main/.
# For a real run use the GPU command of docs/training.md (tens of millions of tokens).
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
# The student is the CPU zoo's gated_deltanet/base row, trained as the zoo trains it (the zoo file holds the recipe:
# softmax kept at the twelve layers that retrieval in prose needs most, a 64-token window beside every Gated DeltaNet
# state, the fitted start, stage 1 on 512-token rows of whole documents), in $OUT, on $TOKENS tokens where set.
ROW=$(linzoo zoo --config recipes/135m/zoo-cpu.yaml --print-command gated_deltanet/base)
eval "TRAIN=($ROW)"
for i in "${!TRAIN[@]}"; do
  case "${TRAIN[$i]}" in
    --output_dir) TRAIN[i+1]=$OUT ;;
    --total_tokens) TRAIN[i+1]=${TOKENS:-${TRAIN[i+1]}} ;;
  esac
done
"${TRAIN[@]}"
linzoo eval niah --model "$OUT" --teacher embedded --lengths 256,512 --depths 0,0.5,1 --samples_per_cell 4 \
  --batch_size 6 --out "$OUT/eval"
# The natural variant beside the classic one: the needle in clean prose (held-out text), where the classic haystack
# repeats five noise sentences -- a student can find a passkey in noise and miss it in prose.
linzoo eval niah --model "$OUT" --teacher embedded --variant natural --lengths 256,512 --depths 0,0.5,1 \
  --samples_per_cell 4 --batch_size 6 --out "$OUT/eval/natural"
linzoo eval quality --model "$OUT" --teacher embedded ${EVAL_DATA:+--data_dir "$EVAL_DATA"} --limit 20 \
  --heldout_tokens 2048 --out "$OUT/eval"
# Is the student cheaper than its teacher? One 2k-token prefill and 16 decoded tokens each (~40 s): the CPU figure of
# issue 31; the GPU's, 1k-32k tokens at batch 1 and 8, is recipes/135m/speed-gpu.yaml.
linzoo eval speed --models embedded "$OUT" --lengths 2048 --batch_sizes 1 --repeats 1 --decode_tokens 16 \
  --out "$OUT/eval/speed"
python - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
q = json.load(open(f"{out}/eval/quality.json"))
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
def by_length(r):
    return ", ".join(f"{l}: {a:.2f}±{r['mean_by_length_se'][l]:.2f}" for l, a in r["mean_by_length"].items())
for name, folder in (("classic", "eval"), ("natural", "eval/natural")):  # noise haystack, then clean prose
    n, t = (json.load(open(f"{out}/{folder}/{sub}niah.json")) for sub in ("", "teacher/"))
    print(f"  NIAH {name:7s} by length {by_length(n)}  (teacher {by_length(t)})")
speed = json.load(open(f"{out}/eval/speed/speed.json"))
rows = {r["model"]: r for r in speed["rows"]}  # one length, one batch: a row per model
student, teacher = rows[speed["models"][1]], rows[speed["teacher"]]
print(f"  speed at {student['length']} tokens: prefill {student['prefill_s']:.1f} s (teacher {teacher['prefill_s']:.1f} s, "
      f"{student['ratios']['prefill_s']:.2f}x), decode {student['decode_ms_per_token']:.0f} ms/token (teacher "
      f"{teacher['decode_ms_per_token']:.0f}, {student['ratios']['decode_ms_per_token']:.2f}x)")
record, config = json.load(open(f"{out}/linzoo_training.json")), json.load(open(f"{out}/config.json"))
choice = record.get("attn_layers_choice")
why = (f"{choice['rule']}: {choice['by']}, best head per layer " + ", ".join(f"L{l} {s}" for l, s in choice["scores"].items())
       if choice else "as given by --attn_layers")
print(f"  softmax attention kept at layers {record['attn_layers'] or 'none'}" + (f" ({why})" if record["attn_layers"] else ""))
if config.get("window_size"):
    print(f"  every other layer: {config['mixer']} state + exact softmax over the last {config['window_size']} tokens")
# One chat answer, as a user of the instruct teacher would ask it (a base student was distilled on text, not chats).
import torch
from linzoo import load_model
question = "What is the capital of France?"
for who, spec in (("student", out), ("teacher", "embedded")):
    model, tok = load_model(spec)
    ids = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)
    with torch.no_grad():
        reply = model.generate(**ids, max_new_tokens=32, do_sample=False)[0, ids["input_ids"].shape[1]:]
    print(f"  chat {who}: {question!r} -> {tok.decode(reply, skip_special_tokens=True)!r}")
PY
