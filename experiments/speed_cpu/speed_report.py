"""The README and the overview plot of a results/speed/cpu/<date>/ folder that speed_cpu.sh (beside it) filled: issue 31's
figures read off the runs' speed.json files (each a `linzoo eval speed` run with the teacher in it), against their
targets, then the int8 runs, every mixer at one length, and what int8 costs the main job's student.

    python experiments/speed_cpu/speed_report.py results/speed/cpu/2026-12-06
"""

import argparse
import json
from pathlib import Path

from linzoo.evals.speed import log_log_axes, table_rows

HYBRID, PURE = "gated_deltanet-hybrid", "gated_deltanet"
# (figure, run folder, length, what, target for the hybrid, target for the pure student); what: a ratio to the
# teacher ("prefill_s", ...) or a special figure
TARGETS = [
    ("prefill vs teacher at 512", "batch1", 512, "prefill_s", 1.0, 1.0),
    ("prefill vs teacher at 4k", "batch1", 4096, "prefill_s", 0.5, 0.5),
    ("prefill vs teacher at 16k", "batch1", 16384, "prefill_s", 0.25, 0.25),
    ("decode vs teacher at 512", "batch1", 512, "decode_ms_per_token", 1.0, 1.0),
    ("decode vs teacher at 8k", "batch1", 8192, "decode_ms_per_token", 0.5, 0.5),
    ("decode growth from 1k to 32k", None, None, "growth", None, 0.10),
    ("peak memory vs teacher at 32k", "32k", 32768, "peak_memory_bytes", 0.25, 0.1),
    ("decode at 512: share of its bandwidth roofline", "batch1", 512, "roofline_fraction", None, -0.5),
]


def load(folder: Path, name: str):
    path = folder / name / "speed.json"
    return json.loads(path.read_text()) if path.is_file() else None


def row(run, model_suffix, length, batch=1):
    if run is None:
        return None
    for r in run["rows"]:
        if r["model"].rstrip("/").endswith("/" + model_suffix) or r["model"] == model_suffix:
            if r["length"] == length and r["batch"] == batch:
                return r
    return None


def figure(runs, what, name, length, student):
    """(value, text) of one figure for `student`, or (None, why not)."""
    if what == "growth":
        one, far = row(runs["batch1"], student, 1024), row(runs["32k"], student, 32768)
        if one is None or far is None:
            return None, "not measured"
        growth = far["decode_ms_per_token"] / one["decode_ms_per_token"] - 1
        return growth, (f"{growth:+.0%} ({one['decode_ms_per_token']:.1f} -> {far['decode_ms_per_token']:.1f} ms/token;"
                        " two runs of one session)")
    r = row(runs[name], student, length)
    if r is None:
        skipped = runs[name] and [s for s in runs[name]["skipped"] if s["length"] == length]
        return None, "skipped (predicted too long)" if skipped else "not measured"
    if what == "roofline_fraction":
        return r["roofline_fraction"], f"{r['roofline_fraction']:.0%} ({r['roofline_ms_per_token']:.1f} of " \
                                       f"{r['decode_ms_per_token']:.1f} ms)"
    value = r["ratios"][what]
    return value, f"{value:.2f}x"


def verdict(value, target):
    if target is None:
        return "—"
    if value is None:
        return "not measured"
    met = value >= -target if target < 0 else value <= target
    return "met" if met else "**missed**"


def target_text(target):
    return "—" if target is None else (f">= {-target:.0%}" if target < 0 else f"<= {target:g}x" if target >= 0.2
                                       else f"<= {target:.0%}")


def overview_plot(runs, out: Path):
    """speed_cpu.png: prefill and decode against context (teacher, hybrid, pure; float32 solid, int8 dashed), and
    every mixer's ratios to the teacher at one length."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.4))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    for name, style in (("batch1", "-"), ("32k", "-"), ("int8", "--")):
        run = runs[name]
        if run is None:
            continue
        for i, model in enumerate(run["models"]):
            rows = sorted((r for r in run["rows"] if r["model"] == model and r["batch"] == 1), key=lambda r: r["length"])
            if name == "32k":  # joins the batch-1 line
                base = runs["batch1"] and [r for r in runs["batch1"]["rows"] if r["model"] == model and r["batch"] == 1]
                rows = sorted((base or []) + rows, key=lambda r: r["length"])
            label = ("teacher" if model == run["teacher"] else Path(model).name) + (" int8" if name == "int8" else "")
            for ax, key in zip(axes[:2], ("prefill_s", "decode_ms_per_token")):
                ax.plot([r["length"] for r in rows], [r[key] for r in rows], color=f"C{i}", linestyle=style, marker="o",
                        markersize=3, label=label if name != "32k" else None)
    for ax, label in zip(axes[:2], ("prefill (s), batch 1", "decode (ms / token), batch 1")):
        log_log_axes(ax, label)
    axes[0].legend(fontsize=7)
    mixers = runs["mixers"]
    if mixers is not None:
        rows = [r for r in mixers["rows"] if r["model"] != mixers["teacher"]]
        x = range(len(rows))
        axes[2].bar([i - 0.2 for i in x], [r["ratios"]["prefill_s"] for r in rows], width=0.4, label="prefill")
        axes[2].bar([i + 0.2 for i in x], [r["ratios"]["decode_ms_per_token"] for r in rows], width=0.4, label="decode")
        axes[2].axhline(1.0, color="k", linewidth=1, label="teacher")
        axes[2].set_xticks(list(x), [Path(r["model"]).name for r in rows], rotation=30, fontsize=8)
        axes[2].set_ylabel(f"x teacher at {rows[0]['length']} tokens, batch 1")
        axes[2].legend(fontsize=7)
    fig.suptitle(f"linzoo students against SmolLM2-135M-Instruct on {runs['batch1']['device_name']} "
                 f"({runs['batch1']['threads']} threads, float32; dashed: every model int8)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def quality_lines(folder: Path):
    out = []
    for name in ("fp32", "int8"):
        path = folder / f"quality-{name}" / "quality.json"
        if not path.is_file():
            continue
        q = json.loads(path.read_text())
        above = q["recovery_above_chance"]["average"]
        out.append(f"| {name} | {q['perplexity']:.2f} | {q['teacher_perplexity']:.2f} | {q['kl_to_teacher']:.3f} | "
                   f"{'—' if above is None else f'{above:.1f} %'} |")
    if not out:
        return []
    return ["## What int8 costs the main job's student", "",
            "`linzoo eval quality --model runs/main --teacher embedded --tasks lambada_openai,piqa --limit 30 "
            "--heldout_tokens 4096 --quantize {none,int8}` (the teacher in float32 both times):", "",
            "| student | held-out perplexity | teacher's | KL to the teacher | recovery above chance |",
            "|---|---|---|---|---|", *out, ""]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder")
    args = ap.parse_args(argv)
    folder = Path(args.folder)
    runs = {name: load(folder, name) for name in ("batch1", "batch8", "32k", "mixers", "int8")}
    if runs["batch1"] is None:
        ap.error(f"{folder}/batch1/speed.json is missing: run experiments/speed_cpu/speed_cpu.sh first")
    b1 = runs["batch1"]
    lines = [f"# Speed on a CPU: students against their teacher ({folder.name})", "",
             f"Made by `bash experiments/speed_cpu/speed_cpu.sh` (every run `linzoo eval speed`, the teacher "
             f"SmolLM2-135M-Instruct first in each) on {b1['device_name']}, {b1['threads']} threads, float32; memory bandwidth "
             f"{b1['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s; load average before/after the first run "
             f"{b1['load_average'][0]:.2f}/{b1['load_average'][1]:.2f}. Hybrid: softmax at layers 6 17 18 20 21 23 and a "
             "64-token window beside every other layer's Gated DeltaNet state (the main job's layout); pure: Gated "
             "DeltaNet in all 30 layers. Ratios below 1: the student is cheaper.", "",
             "## Issue 31's figures", "", "| figure | hybrid | pure Gated DeltaNet | target (hybrid / pure) |",
             "|---|---|---|---|"]
    for name, run, length, what, t_hybrid, t_pure in TARGETS:
        cells = []
        for student, target in ((HYBRID, t_hybrid), (PURE, t_pure)):
            if target is None:
                cells.append("—")
                continue
            value, text = figure(runs, what, run, length, student)
            cells.append(f"{text}: {verdict(value, target)}")
        lines.append(f"| {name} | {cells[0]} | {cells[1]} | {target_text(t_hybrid)} / {target_text(t_pure)} |")
    lines += ["", "![speed](speed_cpu.png)", ""]
    for name, title in (("batch1", "Batch 1, 256 to 16k tokens"), ("batch8", "Batch 8"), ("32k", "32k tokens"),
                        ("int8", "Every model int8 (`--quantize int8`: torch's dynamic quantization of the linear "
                                 "layers, the teacher's too)"), ("mixers", "Every mixer's pure student at one length")):
        run = runs[name]
        if run is None:
            continue
        lines += [f"## {title}", "", f"`{name}/speed.json`, `{name}/speed.png`; median of {run['repeats']} after a "
                  f"warm-up, {run['decode_tokens']} decoded tokens; load average {run['load_average'][0]:.2f} / "
                  f"{run['load_average'][1]:.2f}.", "",
                  "| context | batch | model | prefill | decode / token | peak memory | state / sequence | roofline |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += ["| " + " | ".join([*cells[:2], Path(cells[2]).name, *cells[3:]]) + " |" for cells in table_rows(run)]
        if run["skipped"]:
            lines += ["", "Skipped: " + ", ".join(f"{s['length']} x {s['batch']} (predicted {s['predicted_seconds']:.0f} s)"
                                                  for s in run["skipped"])]
        lines.append("")
    lines += quality_lines(folder)
    overview_plot(runs, folder / "speed_cpu.png")
    (folder / "README.md").write_text("\n".join(lines))
    print(f"{folder}/README.md, {folder}/speed_cpu.png")


if __name__ == "__main__":
    main()
