"""The lent machine's part (`scripts/device_jobs.sh`) rehearsed on the CPU: `DRY=1` stages, builds a zoo file with
`linzoo zoo` in the background, follows it and packs $OUT as a GPU call brings it back, so that a lent GPU meets only
the numbers; the queue's next build is fired when no zoo file is named."""

import json
import os
import subprocess
import sys
from pathlib import Path

from test_lm_eval import DOCS

ROOT = Path(__file__).resolve().parents[1]


def fake_dev(root):
    """A `.dev` folder as the staging calls leave it, small: the five eval sets (three documents each)."""
    dev = root / "dev"
    (dev / "eval").mkdir(parents=True)
    for task, docs in DOCS.items():
        (dev / "eval" / f"{task}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs[:3]))
    return dev


def test_dry_zoo_on_the_lent_machine(tiny_teacher_dir, tiny_corpus, tmp_path):
    """`device_jobs.sh zoo` without ZOO: the queue's first build not done, built by `linzoo zoo` in the background
    under a lock (so that it outlives the call), followed until it ends, its report, state, log and every row's card
    and results packed into $OUT within the device's limits; the same build named by ZOO and ZOO_ARGS finds it built
    (each build has its own folder) and retrains nothing; with its report among the results, the queue has nothing left to fire. The real zoo file,
    recipes/135m/zoo-gpu.yaml, is read and planned here too."""
    import tarfile

    import yaml

    from linzoo import zoo

    text = tiny_corpus / "text.txt"
    plan = tmp_path / "tiny-zoo.yaml"
    plan.write_text(yaml.safe_dump({
        "teacher": str(tiny_teacher_dir), "mixers": ["gated_deltanet"], "jobs": 2,
        "variants": {
            "base": {"command": "linearize", "tokens": 400, "flags": [
                "--dataset", str(text), "--max_seq_length", "32", "--per_device_train_batch_size", "2",
                "--calibration_tokens", "0", "--dataloader_pin_memory", "false"]},
            "instruct": {"command": "sft", "parent": "base", "tokens": 256, "flags": [
                "--dataset", str(tiny_corpus / "chat.jsonl"), "--max_seq_length", "64",
                "--per_device_train_batch_size", "2", "--dataloader_pin_memory", "false"]}},
        "evals": [{"eval": "niah", "flags": ["--lengths", "192", "--depths", "0", "--samples_per_cell", "1"]},
                  {"eval": "instruct", "variants": ["instruct"], "flags": ["--max_new_tokens", "4"]}],
        "estimate": {"tokens_per_second": {"linearize": 100, "sft": 100}, "start_seconds": 5,
                     "eval_seconds": {"niah": 5, "instruct": 5}}}))
    dev = fake_dev(tmp_path)
    packed = tmp_path / "packed" / "extra-cache-v1"  # a cache too big for one call travels as lzcache-*.tar.xz
    packed.mkdir(parents=True)
    (packed / "marker.txt").write_text("unpacked")
    subprocess.run(["tar", "-cJf", str(dev / "lzcache-extra.tar.xz"), "-C", str(packed.parent), packed.name], check=True)
    queue, results = tmp_path / "queue.txt", tmp_path / "results"
    queue.write_text(f"{plan.name} --mixers gated_deltanet\n")
    run = lambda **env: subprocess.run(  # noqa: E731
        ["bash", str(ROOT / "scripts" / "device_jobs.sh"), "zoo"], cwd=ROOT, capture_output=True, text=True,
        timeout=600, env={**os.environ, "DRY": "1", "QUEUE": str(queue), "RESULTS": str(results),
                          "TEACHER": str(tiny_teacher_dir), "DEV": str(dev), "WORK": str(tmp_path / "work"),
                          "OUT": str(tmp_path / "out"), "OMP_NUM_THREADS": "1",
                          "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env})
    proc = run()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert f"zoo: the queue's next is {plan} --mixers gated_deltanet" in out, out[-3000:]
    assert "zoo: building" in out and "zoo: done: 3 steps" in out and "zoo: the build has ended" in out, out[-3000:]
    assert "zoo plan:" in out  # the build's own lines, from its first
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["card.txt", "zoo.json", "zoo.log", "zoo.md", "zoo.png", "zoo_rows.tgz"]
    assert len(files) <= 8 and all(p.stat().st_size <= 16 * 2**20 for p in (tmp_path / "out").iterdir())
    with tarfile.open(tmp_path / "out" / "zoo_rows.tgz") as tar:
        names = set(tar.getnames())
    assert {"zoo_state.json", "zoo-summary.md", "gated_deltanet/base/README.md", "teacher/eval/niah.json",
            "gated_deltanet/instruct/eval/instruct.json"} <= names and not any(n.endswith(".safetensors") for n in names)
    rows = json.loads((tmp_path / "out" / "zoo.json").read_text())["rows"]
    assert [r["state"] for r in rows] == ["done"] * 3
    assert (tmp_path / "work" / "lzcache" / "data" / "extra-cache-v1" / "marker.txt").read_text() == "unpacked"
    triton = tmp_path / "triton"  # a compiled-kernel cache over 16 MB comes back in parts, within the 8 files
    triton.mkdir()
    (triton / "kernels.bin").write_bytes(os.urandom(20_000_000))
    again = run(ZOO=str(plan), ZOO_ARGS="--mixers gated_deltanet", TRITON_CACHE_DIR=str(triton))  # the same build
    assert again.returncode == 0 and "done earlier (skipped)" in again.stdout and " started" not in again.stdout
    parts = sorted((tmp_path / "out").glob("triton-cache.tgz*"))
    assert [p.name for p in parts] == ["triton-cache.tgz.part00", "triton-cache.tgz.part01"]
    assert len(list((tmp_path / "out").iterdir())) == 8 and all(p.stat().st_size <= 16_000_000 for p in parts)
    joined = tmp_path / "joined.tgz"
    joined.write_bytes(b"".join(p.read_bytes() for p in parts))
    subprocess.run(["tar", "-xzf", str(joined), "-C", str(tmp_path / "packed")], check=True)
    assert (tmp_path / "packed" / "kernels.bin").read_bytes() == (triton / "kernels.bin").read_bytes()
    (results / "2026-12-06").mkdir(parents=True)
    (results / "2026-12-06" / "zoo.json").write_bytes((tmp_path / "out" / "zoo.json").read_bytes())
    empty = run()
    assert empty.returncode == 2 and f"zoo: every build of {queue} has a complete report" in empty.stdout
    real = zoo.read_zoo(ROOT / "recipes" / "135m" / "zoo-gpu.yaml")
    steps = zoo.plan(real, tmp_path / "gpu")
    assert len(steps) == 1 + 4 * len(real.mixers) and real.jobs == 10
    assert all("--device" in c.argv and "cuda" in c.argv for s in steps for c in s.evals)
