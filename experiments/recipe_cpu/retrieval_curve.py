"""NIAH against training tokens for one recipe: rows of `retrieval_start.py` (0 tokens) and `cpu_ablation.sh`
(trained; both in this folder), the teacher beside them, as a PNG.

    python experiments/recipe_cpu/retrieval_curve.py results/recipe/cpu/retrieval.jsonl \\
        --names auto6_w64,s1_auto6_w64_5k,s1_auto6_w64,s1_auto6_w64_100k,s1_auto6_w64_400k \\
        --out results/recipe/cpu/retrieval_curve.png
"""

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", type=Path, help="a JSON-lines file of rows")
    parser.add_argument("--names", required=True, help="comma-separated row names, in token order")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = parser.parse_args(argv)
    rows = {r["name"]: r for r in map(json.loads, args.rows.read_text().splitlines())}
    names = args.names.split(",")
    missing = [n for n in names if n not in rows]
    if missing:
        raise SystemExit(f"retrieval_curve: no row named {', '.join(missing)} in {args.rows}")
    picked = [rows[n] for n in names]
    tokens = [r.get("tokens", r.get("trained_tokens", 0)) for r in picked]
    at = list(range(len(picked)))  # evenly spaced, labelled with the tokens: 0, 5k ... 400k stay readable
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for length, color in (("256", "tab:blue"), ("512", "tab:orange")):
        acc = [r["niah_by_length"][length] for r in picked]
        se = [r["niah_se"][length] for r in picked]
        ax.errorbar(at, acc, yerr=se, marker="o", color=color, capsize=3, label=f"student, {length} tokens")
        teacher = next((r["teacher_niah_by_length"][length] for r in picked if "teacher_niah_by_length" in r), None)
        if teacher is not None:
            ax.axhline(teacher, color=color, linestyle=":", label=f"teacher, {length} tokens")
    ratios = [r["perplexity"] / r["teacher_perplexity"] for r in picked]
    right = ax.twinx()  # what the retrieval costs or gains in held-out perplexity, on the same runs
    right.plot(at, ratios, marker="s", color="tab:gray", linestyle="--", label="perplexity ÷ teacher's")
    right.set_ylabel("perplexity ÷ teacher's", color="tab:gray")
    right.set_ylim(1.0, max(ratios) * 1.05)
    right.legend(fontsize=7, loc="center right")
    ax.set_xticks(at, [f"{t / 1000:g}k" if t else "0" for t in tokens])
    ax.set_xlabel("training tokens (stage 1; one tick per run)")
    ax.set_ylabel("passkey NIAH accuracy")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("Retrieval against training tokens", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
