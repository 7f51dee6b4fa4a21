"""Collect the GPU training runs of scripts/device_jobs.sh into one results JSON (and print a table).

    python experiments/gpu_training_h200/gpu_training_summary.py RUNS_DIR --card "$(cat card.txt)" --out results/gpu/training_H200.json

RUNS_DIR holds what `device_jobs.sh` packs (`train_records.tgz` and `train_logs.tgz`, unpacked):
`<mixer>/linzoo_training.json` of finished runs and the logs `<mixer>.<unix time>.log` of every attempt.
An unfinished run is reported from its logs (last stage reached, its last logged loss and tokens/s), marked
`"finished": false`.
"""

import argparse
import ast
import json
import re
from pathlib import Path


def from_logs(logs):
    """Stages and their logged losses / tokens/s from the Trainer's log lines, over all attempts in order."""
    stages, current = {}, None
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            m = re.match(r"linzoo: (stage\S+): (\d+) steps x (\d+) tokens", line)
            if m:
                current = stages.setdefault(m.group(1), {"stage": m.group(1), "steps": int(m.group(2)),
                                                          "tokens": int(m.group(2)) * int(m.group(3)), "logs": []})
            elif current is not None and line.startswith("{'loss'"):
                current["logs"].append({k: float(v) for k, v in ast.literal_eval(line).items()})
    out = []
    for s in stages.values():
        logs = s.pop("logs")
        rates = sorted(r["tokens_per_second"] for r in logs if "tokens_per_second" in r)
        out.append({**s, "first_loss": logs[0]["loss"] if logs else None, "last_logged_loss": logs[-1]["loss"] if logs else None,
                    "last_logged_epoch": logs[-1].get("epoch") if logs else None,
                    "tokens_per_second_logged_median": rates[len(rates) // 2] if rates else None})
    return out


def summarize(root):
    """{run name: {finished, total_tokens, stages, attempts}} of the runs under `root` (records, else their logs)."""
    root = Path(root)
    mixers = sorted({p.name.split(".")[0] for p in root.glob("*.log")} | {p.parent.name for p in root.glob("*/linzoo_training.json")})
    runs = {}
    for m in mixers:
        record = root / m / "linzoo_training.json"
        logs = sorted(root.glob(f"{m}.*.log"), key=lambda p: int(p.name.split(".")[1]))
        if record.is_file():
            r = json.loads(record.read_text())
            runs[m] = {"finished": True, "total_tokens": r["total_tokens"], "stages": r["stages"], "attempts": len(logs)}
        else:
            runs[m] = {"finished": False, "stages": from_logs(logs), "attempts": len(logs)}
    return runs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs_dir")
    ap.add_argument("--card", required=True, help="the GPU, e.g. the output of nvidia-smi --query-gpu=name,...")
    ap.add_argument("--out", required=True)
    ap.add_argument("--note", default="", help="how the runs were made (concurrency, known defects)")
    args = ap.parse_args()
    runs = summarize(args.runs_dir)
    result = {"card": args.card.strip(), "note": args.note, "runs": runs}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{'mixer':15s} {'stage':27s} {'tokens':>11s} {'tok/s':>7s} {'first loss':>10s} {'final loss':>10s}")
    for m, r in runs.items():
        for s in r["stages"]:
            rate = s.get("tokens_per_second_steady") or s.get("tokens_per_second_logged_median")
            final = s.get("final_loss", s.get("last_logged_loss"))
            done = "" if r["finished"] else f"  (unfinished, last log at epoch {s.get('last_logged_epoch')})"
            print(f"{m:15s} {s['stage']:27s} {s['tokens']:>11,} {rate or float('nan'):>7.0f} {s['first_loss'] or float('nan'):>10.3f} "
                  f"{final or float('nan'):>10.3f}{done}")


if __name__ == "__main__":
    main()
