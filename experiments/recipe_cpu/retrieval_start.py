"""Retrieval of the fitted start, no training: for each hybrid (softmax layers kept) x sliding window x sparse cache,
the student `linzoo.linearize` builds from the embedded SmolLM2-135M-Instruct (Gated DeltaNet, fitted on the first
4,096 training tokens in 512-token rows, as `linzoo linearize` does), measured as `cpu_ablation.sh` (beside it) measures a
trained row:
held-out perplexity and KL beside the teacher (2,048 tokens of the embedded test split, 1,024-token blocks), passkey
NIAH at 256 and 512 tokens (depths 0, 0.5, 1 x SAMPLES prompts, default 10) and the teacher-forced log-probability of
the key's tokens on the same prompts (chance -2.30), then the same in clean prose (`--variant natural`: `natural_*`
keys; its key log-prob is the whole five-digit key's, as `linzoo eval niah` reports it). One JSON line per
configuration on stdout; `teacher` as a NAME measures the teacher itself.

    python experiments/recipe_cpu/retrieval_start.py 'auto3_w64:17,18,23:64' 'pure::0' 'pure_s64::0:64' \
        >> results/recipe/cpu/retrieval.jsonl

Each argument is NAME:LAYERS:WINDOW[:SPARSE] (LAYERS comma-separated, empty for none; WINDOW 0 for none; SPARSE the
sparse cache's size, `sparse_cache_size`, 0 or left out for none)."""

import json
import os
import sys
import time

import torch

import linzoo
from linzoo.data import load_text_dataset
from linzoo.evals.common import load_texts
from linzoo.evals.heads import key_logprob, key_prompt
from linzoo.evals.niah import run_niah, sample_seed
from linzoo.evals.quality import heldout_metrics
from linzoo.trainers.linearize import calibration_ids

LENGTHS, DEPTHS = (256, 512), (0, 0.5, 1)


def retrieval(lm, tokenizer, samples: int) -> dict:
    """Passkey NIAH per length and depth (greedy, `samples` prompts per cell) and the mean teacher-forced key log-prob
    over the same prompts: what every row of the CPU retrieval ablation reports (also `cpu_ablation.sh` beside it)."""
    niah = run_niah(lm, tokenizer, list(LENGTHS), list(DEPTHS), samples_per_cell=samples, batch_size=6)
    prompts = [key_prompt(tokenizer, length, depth, sample_seed(0, length, depth, i))
               for length in LENGTHS for depth in DEPTHS for i in range(samples)]
    logprob = sum(key_logprob(lm, p)[0] for p in prompts) / len(prompts)
    return {"niah_by_length": niah["mean_by_length"], "niah_se": niah["mean_by_length_se"],
            "niah_cells": niah["accuracy"], "samples_per_cell": samples, "key_logprob": round(logprob, 3),
            "examples": [e["generated"][:40] for e in niah["examples"]], **natural(lm, tokenizer, samples)}


def natural(lm, tokenizer, samples: int) -> dict:
    """The needle in clean held-out prose: where the classic haystack's five repeated sentences are no competition,
    prose is (a student that finds the key in noise answered "a key that is used to unlock a door")."""
    niah = run_niah(lm, tokenizer, list(LENGTHS), list(DEPTHS), variant="natural", samples_per_cell=samples,
                    batch_size=6)
    return {"natural_niah_by_length": niah["mean_by_length"], "natural_niah_se": niah["mean_by_length_se"],
            "natural_key_logprob": round(niah["key_logprob"], 3),
            "natural_examples": [e["generated"][:40] for e in niah["examples"]]}


def main(specs):
    samples = int(os.environ.get("SAMPLES", 10))
    configs = []
    for spec in specs:
        try:
            name, layers, window, *sparse = spec.split(":")
            configs.append((name, [int(l) for l in layers.split(",") if l], int(window), int(*sparse or [0])))
        except (ValueError, TypeError):
            sys.exit(f"retrieval_start: {spec!r} is not NAME:LAYERS:WINDOW[:SPARSE] (e.g. auto3_w64:17,18,23:64, "
                     "pure::0 or pure_s64::0:64)")
    teacher, tok = linzoo.load_teacher("embedded")
    teacher.eval()
    calibration = calibration_ids(load_text_dataset("embedded", split="train"), tok)
    texts = load_texts("embedded", split="test")
    for name, layers, window, sparse in configs:
        start = time.time()
        torch.manual_seed(0)
        student = teacher if name == "teacher" else linzoo.linearize(
            teacher, "gated_deltanet", calibration=calibration, attn_layers=layers, window_size=window,
            sparse_cache_size=sparse).eval()
        quality = heldout_metrics(student, tok, texts, 2048, teacher, batch_size=4)
        print(json.dumps({
            "name": name, "attn_layers": layers, "window_size": window, "sparse_cache_size": sparse,
            "trained_tokens": 0,
            "perplexity": round(quality["perplexity"], 2),
            "teacher_perplexity": round(quality["teacher_perplexity"], 2),
            "ratio": round(quality["perplexity"] / quality["teacher_perplexity"], 3),
            "kl": round(quality["kl_to_teacher"], 3),
            **retrieval(student, tok, samples), "seconds": round(time.time() - start)}),
            flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
