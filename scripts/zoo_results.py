"""Pack a built zoo into a committed results folder: the report (`linzoo zoo --report-only`), the state, every card,
the zoo file it ran, the build's logs and the push plan (`linzoo push-zoo --dry-run`), then print the time the build
took, read off `zoo_state.json`: each command's seconds and end time, the commands a deadline stopped included.

    python scripts/zoo_results.py --zoo runs/zoo --config recipes/135m/zoo-cpu.yaml \
        --dest results/zoo/cpu/<date>-<name> --log build-1.log --log build-2.log

Wall time: the commands' spans (end minus seconds) merged where they overlap or follow within --gap seconds; a
longer pause (a killed build resumed later) starts a new segment, and the build's wall time is the segments' sum."""

import argparse
import json
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path


def runs(state: dict) -> list[dict]:
    """Every command's record with an end and seconds: the finished ones (`steps`) and those a deadline or an interrupt
    stopped (`stopped`: a resumed command's record times only its last run)."""
    done = [r for cmds in state["steps"].values() for r in cmds.values()]
    return [r for r in done + state.get("stopped", []) if r.get("ended") and r.get("seconds") is not None]


def segments(state: dict, gap: float) -> list[tuple[float, float]]:
    spans = sorted((end - r["seconds"], end) for r in runs(state)
                   for end in [datetime.strptime(r["ended"], "%Y-%m-%d %H:%M:%S").timestamp()])
    merged: list[list[float]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1] + gap:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--zoo", required=True, help="the built zoo's folder (linzoo zoo --out)")
    p.add_argument("--config", required=True, help="the zoo file it was built from")
    p.add_argument("--dest", required=True, help="the results folder to write")
    p.add_argument("--log", action="append", default=[], help="a build log (the engine's output), in order")
    p.add_argument("--org", default="linzoo", help="the organisation of the push plan")
    p.add_argument("--gap", type=float, default=600, help="a pause longer than this starts a new segment (s)")
    args = p.parse_args(argv)
    zoo, dest = Path(args.zoo), Path(args.dest)
    if not (zoo / "zoo_state.json").is_file():
        sys.exit(f"zoo_results: {zoo} holds no zoo_state.json: give the folder a `linzoo zoo --out` built")
    (dest / "cards").mkdir(parents=True, exist_ok=True)
    linzoo = [sys.executable, "-m", "linzoo.cli"]
    subprocess.run(linzoo + ["zoo", "--config", args.config, "--out", str(zoo), "--report-only"], check=True)
    for name in ("zoo.md", "zoo.json", "zoo.png", "zoo-summary.md", "zoo_state.json"):
        shutil.copy(zoo / name, dest / name)
    shutil.copy(args.config, dest / Path(args.config).name)
    with open(dest / "build.log", "w") as out:
        for log in args.log:  # progress bars' carriage-return frames dropped
            lines = Path(log).read_text(errors="replace").replace("\r", "\n").splitlines()
            out.writelines(line + "\n" for line in lines if "%|" not in line)
    for card in sorted(zoo.glob("*/*/README.md")):
        shutil.copy(card, dest / "cards" / f"{card.parent.parent.name}-{card.parent.name}.md")
    push = subprocess.run(linzoo + ["push-zoo", str(zoo), "--org", args.org], capture_output=True, text=True)
    (dest / "push-zoo-dry-run.txt").write_text(push.stdout + push.stderr)
    state = json.loads((zoo / "zoo_state.json").read_text())
    seconds = sum(r.get("seconds") or 0 for cmds in state["steps"].values() for r in cmds.values() if r.get("rc") == 0)
    stopped = sum(r["seconds"] for r in state.get("stopped", []))
    parts = segments(state, args.gap)
    wall = sum(b - a for a, b in parts)
    fmt = "%Y-%m-%d %H:%M"
    print(json.dumps({"steps": len(state["steps"]), "command_seconds": round(seconds),
                      "stopped_seconds": round(stopped),
                      "segments": [f"{datetime.fromtimestamp(a).strftime(fmt)} - {datetime.fromtimestamp(b).strftime(fmt)}"
                                   for a, b in parts],
                      "wall_seconds": round(wall), "wall_hours": round(wall / 3600, 2)}, indent=1))


if __name__ == "__main__":
    main()
