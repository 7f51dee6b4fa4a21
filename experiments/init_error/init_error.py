"""How far a fresh student is from its teacher before any training: stage 1's per-layer error right after linearize.

    python experiments/init_error/init_error.py --out results/init          # all mixers, the embedded teacher, ~8 min on 2 CPU cores
    python experiments/init_error/init_error.py --mixers gated_deltanet --calibration_rows 2
    python experiments/init_error/init_error.py --mixers deltanet,gated_deltanet,mamba2 --conv_activation silu --out results/init/conv_silu

For every mixer it builds two students from the teacher and measures each layer's attention-output error
||mixer(x_l) - attn(x_l)||^2 / ||attn(x_l)||^2, x_l the teacher's own input to layer l (teacher-forced: stage 1's
loss, `AttentionTransferTrainer.attention_transfer_loss` on `linzoo.capture.mixer_io`), on held-out text (the embedded
test split, `--rows` x `--length` tokens):
  - "plain": each mixer's plain start, as every student began before the start fitted to the teacher existed, and
    as `linearize(teacher, mixer)` still builds without calibration tokens;
  - "fitted": `linearize(teacher, mixer, calibration=ids)`, ids from the embedded train split
    (`--calibration_rows` x `--length` tokens): the start `linzoo.calibrate` fits;
  - "statistics" (for comparison, mixers with knobs): the same student with its knobs from the teacher's attention
    maps on those ids as Taylor-Calibrate sets them (half-life = the head's mean attention distance, strength
    0.3 + 0.4 x concentration from its entropy), then the same output-norm fit.
Writes init_error.json (per layer, means, what the fit chose, seconds) and init_error.png, and prints Markdown tables.
"""

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

import linzoo
from linzoo.calibrate import fit_output_norm, normalised_heads
from linzoo.capture import mixer_io
from linzoo.data import load_text_dataset
from linzoo.modeling.mixers import MIXER_CLASSES
from linzoo.trainers.linearize_trainer import AttentionTransferTrainer


def text_ids(tokenizer, split, rows, length):
    """The first rows x length tokens of the embedded text split, documents joined by the eos token."""
    texts = load_text_dataset("embedded", split=split)["text"]
    ids = tokenizer((tokenizer.eos_token or "").join(texts), return_tensors="pt").input_ids[0]
    if ids.numel() < rows * length:
        raise ValueError(f"the {split} split has {ids.numel()} tokens, fewer than {rows} x {length}")
    return ids[: rows * length].view(rows, length)


@torch.no_grad()
def layer_errors(student, io):
    """Stage 1's loss per layer: each mixer fed its teacher's layer input."""
    loss = AttentionTransferTrainer.attention_transfer_loss
    errors = []
    for i, layer in enumerate(student.model.layers):
        x, y = io[i]
        errors.append(loss([layer.self_attn(x)], [y]).item())
    return errors


@torch.no_grad()
def perplexity(model, ids):
    """exp of the mean next-token cross-entropy over the held-out rows: what the untrained student is as a model."""
    return math.exp(model(input_ids=ids, labels=ids, use_cache=False).loss.item())


@torch.no_grad()
def attention_statistics(teacher, ids):
    """{layer: (mean attention distance [H], mean attention entropy [H])} over every query of ids (eager maps)."""
    stats, hooks = {}, []
    T = ids.shape[1]
    distance = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).clamp_min(0).float()

    def keep(i):
        def hook(module, args, kwargs, out):
            a = out[1].float()
            entropy = -(a * a.clamp_min(1e-12).log()).sum(-1)
            stats[i] = ((a * distance).sum(-1).mean((0, 2)), entropy.mean((0, 2)))
        return hook

    previous = teacher.config._attn_implementation
    teacher.set_attn_implementation("eager")
    for i, layer in enumerate(teacher.model.layers):
        hooks.append(layer.self_attn.register_forward_hook(keep(i), with_kwargs=True))
    try:
        teacher(input_ids=ids, use_cache=False, logits_to_keep=1)
    finally:
        for h in hooks:
            h.remove()
        teacher.set_attn_implementation(previous)
    return stats


@torch.no_grad()
def statistics_start(teacher, mixer, ids, conv_activation):
    """Taylor-Calibrate's rule for the knobs, then `linzoo.calibrate`'s output-norm fit; returns the student and the
    statistics."""
    torch.manual_seed(0)
    student = linzoo.linearize(teacher, mixer, conv_activation=conv_activation, kernel_backend="torch").eval()
    stats = attention_statistics(teacher, ids)
    io = mixer_io(teacher, ids)
    for i, layer in enumerate(student.model.layers):
        attn, (distance, entropy) = layer.self_attn, stats[i]
        concentration = 1 - (entropy - entropy.min()) / (entropy.max() - entropy.min()).clamp_min(1e-3)
        knobs = {"half_life": distance.clamp_min(0.5), "strength": 0.3 + 0.4 * concentration}
        attn.set_start_knobs(**{k: knobs[k] for k in attn.start_knobs})
        x, y = io[i].input, io[i].output
        w, _ = fit_output_norm(normalised_heads(attn, x), y.reshape(-1, y.shape[-1]), attn.o_proj.weight)
        attn.o_norm.weight.copy_(w)
    return student, stats


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(14, 5))
    for k, (mixer, r) in enumerate(results.items()):
        color = f"C{k}"
        layers = range(len(r["fitted"]))
        axes[0].plot(layers, r["plain"], "--", color=color, alpha=0.7)
        axes[0].plot(layers, r["fitted"], "-", color=color, label=mixer)
        if r["statistics"] is not None:
            axes[0].plot(layers, r["statistics"], ":", color=color, alpha=0.7)
        axes[1].plot(layers, r["fitted"], "-o", ms=3, color=color, label=mixer)
    axes[0].set_yscale("log")
    axes[0].set_title("dashed: plain start (before); solid: fitted (after); dotted: statistics start")
    axes[1].set_title("after: fitted to the teacher")
    axes[1].axhline(1.0, color="grey", lw=0.8, ls=":")
    for ax in axes:
        ax.set_xlabel("layer")
        ax.set_ylabel("||mixer - attention||² / ||attention||²  (teacher-forced)")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def markdown(results):
    lines = ["| mixer | plain start | statistics start | fitted start | plain / fitted | perplexity plain / fitted "
             "(teacher) | calibration wall s (CPU s) |",
             "|---|---|---|---|---|---|---|"]
    for mixer, r in results.items():
        stats = "same as fitted (no knobs)" if r["statistics_mean"] is None else f"{r['statistics_mean']:.3f}"
        lines.append(f"| `{mixer}` | {r['plain_mean']:.3f} | {stats} | **{r['fitted_mean']:.3f}** | "
                     f"{r['plain_mean'] / r['fitted_mean']:.0f}x | {r['perplexity']['plain']:,.0f} / "
                     f"{r['perplexity']['fitted']:.1f} ({r['perplexity']['teacher']:.2f}) | {r['calibration_seconds']} "
                     f"({r['calibration_cpu_seconds']}) |")
    lines.append("")
    lines.append("(mean over the 30 layers of the per-layer error; 0 is the teacher, 1 a zero output)")
    names = list(results)
    lines += ["", "| layer | " + " | ".join(f"{m} plain / fitted" for m in names) + " |",
              "|---" * (len(names) + 1) + "|"]
    for i in range(len(next(iter(results.values()))["fitted"])):
        cells = [f"{results[m]['plain'][i]:.3g} / {results[m]['fitted'][i]:.3f}" for m in names]
        lines.append(f"| {i} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teacher", default="embedded")
    parser.add_argument("--mixers", default=",".join(linzoo.MIXERS))
    parser.add_argument("--rows", type=int, default=8, help="held-out rows (embedded test split)")
    parser.add_argument("--length", type=int, default=512, help="tokens per row")
    parser.add_argument("--calibration_rows", type=int, default=8,
                        help="rows of the train split for the fit (8 x 512: the 4,096 tokens linzoo linearize uses)")
    parser.add_argument("--conv_activation", default="silu_qk",
                        help="the fitted (and statistics) students' conv_activation: linearize's silu_qk, or another")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--out", default="results/init")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    teacher, tokenizer = linzoo.load_teacher(args.teacher)
    teacher.eval()
    held_out = text_ids(tokenizer, "test", args.rows, args.length)
    calibration = text_ids(tokenizer, "train", args.calibration_rows, args.length)
    with torch.no_grad():
        io = [(v.input, v.output) for v in mixer_io(teacher, held_out).values()]
    teacher_ppl = perplexity(teacher, held_out)
    print(f"teacher perplexity {teacher_ppl:.2f}; held-out {tuple(held_out.shape)} tokens, calibration {tuple(calibration.shape)}, "
          f"{torch.get_num_threads()} threads")

    results = {}
    for mixer in args.mixers.split(","):
        torch.manual_seed(0)
        plain = linzoo.linearize(teacher, mixer, kernel_backend="torch").eval()
        plain_errors = layer_errors(plain, io)
        plain_ppl = perplexity(plain, held_out)
        del plain
        torch.manual_seed(0)
        start = time.perf_counter()
        fitted = linzoo.linearize(teacher, mixer, calibration=calibration, conv_activation=args.conv_activation,
                                  kernel_backend="torch").eval()
        seconds = time.perf_counter() - start
        fitted_errors = layer_errors(fitted, io)
        fitted_ppl = perplexity(fitted, held_out)
        report = fitted.calibration_report
        del fitted
        statistics_errors, stats = None, None
        if MIXER_CLASSES[mixer].start_knobs:
            student, stats = statistics_start(teacher, mixer, calibration, args.conv_activation)
            statistics_errors = layer_errors(student, io)
            del student
        mean = lambda errors: None if errors is None else sum(errors) / len(errors)  # noqa: E731
        L = len(fitted_errors)
        results[mixer] = {
            "plain": plain_errors, "fitted": fitted_errors, "statistics": statistics_errors,
            "plain_mean": mean(plain_errors), "fitted_mean": mean(fitted_errors),
            "statistics_mean": mean(statistics_errors),
            "perplexity": {"teacher": teacher_ppl, "plain": plain_ppl, "fitted": fitted_ppl},
            "fitted_error_on_calibration_tokens": [report[i]["error"] for i in range(L)],
            "fitted_knobs": {i: report[i]["knobs"] for i in range(L)},
            "o_proj_ridge": {i: report[i]["o_proj_ridge"] for i in range(L)},
            "attention_mean_distance": None if stats is None else {i: stats[i][0].tolist() for i in range(L)},
            "attention_entropy": None if stats is None else {i: stats[i][1].tolist() for i in range(L)},
            "calibration_seconds": report["seconds"], "calibration_cpu_seconds": report["cpu_seconds"],
            "linearize_seconds": round(seconds, 1),
        }
        r = results[mixer]
        print(f"{mixer:15s} mean over layers: plain {r['plain_mean']:.4f}  fitted {r['fitted_mean']:.4f}  "
              f"statistics {r['statistics_mean']}  perplexity plain {plain_ppl:.1f} fitted {fitted_ppl:.1f} "
              f"(teacher {teacher_ppl:.2f})  (linearize {r['linearize_seconds']} s, of which calibration "
              f"{r['calibration_seconds']} s wall, {r['calibration_cpu_seconds']} s CPU)")
        print("  plain :", " ".join(f"{e:.3g}" for e in plain_errors))
        print("  fitted:", " ".join(f"{e:.3f}" for e in fitted_errors), flush=True)
        setup = {"teacher": args.teacher, "held_out": "embedded test split, first rows x length tokens (eos-joined)",
                 "rows": args.rows, "length": args.length, "calibration": "embedded train split, same way",
                 "calibration_rows": args.calibration_rows, "conv_activation": args.conv_activation,
                 "threads": torch.get_num_threads(),
                 "command": "python experiments/init_error/init_error.py " + " ".join(sys.argv[1:]),
                 "torch": torch.__version__}
        (out / "init_error.json").write_text(json.dumps({"setup": setup, "mixers": results}, indent=1))
    plot(results, out / "init_error.png")
    print()
    print(markdown(results))


if __name__ == "__main__":
    main()
