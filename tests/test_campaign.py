"""The GPU campaign (`scripts/device_jobs.sh campaign`) rehearsed on the CPU: `DRY=1` runs every phase end to end
on a tiny teacher and writes the result layout a GPU call brings back, so that a lent GPU meets only the numbers;
and what a GPU would fail on (a wheel missing from the bundles, a flag, a path) fails here first, loudly."""

import hashlib
import json
import lzma
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from test_lm_eval import DOCS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import campaign  # noqa: E402


def fake_dev(root, text, drop=()):
    """A `.dev` folder as `../shared/device/prepare.sh` leaves it, small: one bundle whose MANIFEST lists the wheels
    the plan needs (empty files: only their names are checked) but `drop`, the five eval sets, a long-corpus bundle."""
    dev = root / "dev"
    b0 = dev / "b0"
    b0.mkdir(parents=True)
    wheels = [f"{w}-1.0-py3-none-any.whl" for ws in campaign.NEEDS.values() for w in ws if w not in drop]
    for f in wheels + ["TEACHER_SHA256"]:
        (b0 / f).write_text("")
    (b0 / "MANIFEST").write_text("\n".join(sorted(wheels)) + "\n")
    (dev / "eval").mkdir()
    for task, docs in DOCS.items():
        (dev / "eval" / f"{task}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs[:3]))
    from linzoo.corpus.bundle import BUNDLE_SCHEMA
    from linzoo.corpus.long import LONG_VERSION

    corpus = dev / "corpus" / f"long-v{LONG_VERSION}"
    corpus.mkdir(parents=True)
    words = text.read_text().split()  # the corpus drops the tiny text's pass-key paragraphs: its own text has none
    words = [w for w in words if not set(w.lower()) & set("0123456789") and w.lower() not in ("pass", "key")]
    docs = [{"split": "train" if i % 10 else "test", "source": "tiny", "text": " ".join(words[i:] + words[:i])}
            for i in range(40)]
    data = lzma.compress("".join(json.dumps(d) + "\n" for d in docs).encode())
    (corpus / "part-000.jsonl.xz").write_bytes(data)
    counts = {s: sum(d["split"] == s for d in docs) for s in ("train", "test")}
    (corpus / "manifest.json").write_text(json.dumps({
        "schema": BUNDLE_SCHEMA, "name": "long", "version": LONG_VERSION, "docs": counts, "build": {},
        "parts": [{"file": "part-000.jsonl.xz", "bytes": len(data), "docs": len(docs),
                   "sha256": hashlib.sha256(data).hexdigest()}]}))
    return dev


def tiny_campaign(path, text, train_seconds=60):
    """The campaign file's every line kind, on the tiny teacher: one run (each process costs seconds here), a hybrid
    on the long corpus; the quality eval's held-out text is the tiny text, so nothing needs the embedded corpus."""
    path.write_text(f"""# a tiny campaign
phase speed 120
phase train {train_seconds}
phase eval 240
side_by_side 1.7
startup 5
speed profile_train_step.py --mixer gated_deltanet
speed bench_speed.py --mixers gated_deltanet --skip_peers
eval niah --lengths 128,256 --samples_per_cell 1
eval quality --heldout {text}
hybrid_long gated_deltanet 6000000 --dataset long --attn_layers 1
""")
    return path


def dry_run(tmp_path, teacher, dev, plan, **env):
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "device_jobs.sh"), "campaign"], cwd=ROOT, capture_output=True, text=True,
        timeout=600, env={**os.environ, "DRY": "1", "CAMPAIGN": str(plan), "TEACHER": str(teacher), "DEV": str(dev),
                          "WORK": str(tmp_path / "work"), "OUT": str(tmp_path / "out"), "EVAL_JOBS": "3",
                          "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                          "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env})


def test_dry_campaign_end_to_end(tiny_teacher_dir, tiny_corpus, tmp_path):
    text = tiny_corpus / "text.txt"
    dev = fake_dev(tmp_path, text)
    plan = tiny_campaign(tmp_path / "tiny.runs", text, train_seconds=30)
    # far more tokens than 30 s of training take (within 20 epochs of the tiny text): the run stops at the
    # deadline, saves, and is evaluated
    proc = dry_run(tmp_path, tiny_teacher_dir, dev, plan, TRAIN_TOKENS="150000")  # ~70 s of work at 2k tokens/s
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "campaign check: ok: runs hybrid_long; evals niah, quality" in out
    for phase in ("speed", "train", "eval"):  # the time accounting, as each phase ends and in the report
        assert re.search(rf"campaign: {phase} planned \d+ s, used \d+ s", out), phase
        assert re.search(rf"campaign report: {phase}\s+planned\s+\d+ s\s+used\s+\d+ s\s+done", out), phase
    assert "size: " in out and "campaign: done" in out
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["README.md", "campaign.log", "card.txt", "details.tgz", "eval.json", "speed.json", "training.json"]
    assert all(p.stat().st_size <= 16 * 2**20 for p in (tmp_path / "out").iterdir())
    readme = (tmp_path / "out" / "README.md").read_text()
    for heading in ("## Time: planned vs used", "## Speed", "## Training", "## Evaluation"):
        assert heading in readme
    assert "| speed | 120 |" in readme and "Complete." in readme
    evals = json.loads((tmp_path / "out" / "eval.json").read_text())
    assert set(evals) == {"teacher", "hybrid_long"}
    assert all(set(e) == {"niah", "quality"} for e in evals.values()), evals.keys()
    assert evals["hybrid_long"]["quality"]["kl_to_teacher"] is not None
    runs = json.loads((tmp_path / "out" / "training.json").read_text())["runs"]
    assert set(runs) == {"hybrid_long"} and all(r["finished"] for r in runs.values())
    stages = [s for r in runs.values() for s in r["stages"]]  # which stages the deadline cuts depends on the
    assert any(s.get("stopped_at_deadline") for s in stages), runs  # machine: a fast one finishes stage 1's share
    assert sum(s["tokens"] for s in stages) < 150000, runs
    assert "| yes |" in readme
    assert json.loads((tmp_path / "out" / "speed.json").read_text())["bench_speed"]["rows"]["gated_deltanet"]["stages"]
    # the same call again finds the campaign done and packs the same layout
    again = dry_run(tmp_path, tiny_teacher_dir, dev, plan, TRAIN_TOKENS="40000")
    assert again.returncode == 0 and "campaign: done" in again.stdout
    assert "starting" not in again.stdout  # nothing retrained


def test_dry_speed_campaign_end_to_end(tiny_teacher_dir, tiny_corpus, tmp_path):
    """recipes/135m/speed.runs (issue 31), the queue's second, rehearsed as it stands but for the hybrid's softmax
    layers (the tiny teacher has two): the speed phase's benchmarks, both students built from the fitted start, and
    one `linzoo eval speed` of the teacher and both (its only eval), its table in the report."""
    text = tiny_corpus / "text.txt"
    real = (ROOT / "recipes" / "135m" / "speed.runs").read_text()
    plan = tmp_path / "speed.runs"
    plan.write_text(real.replace("--attn_layers 6 17 18 20 21 23", "--attn_layers 1"))
    assert plan.read_text() != real
    proc = dry_run(tmp_path, tiny_teacher_dir, fake_dev(tmp_path, text), plan)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "campaign check: ok: runs pure, main_hybrid; evals speed" in out and "campaign: done" in out
    runs = tmp_path / "work" / "runs"
    config = json.loads((runs / "main_hybrid" / "config.json").read_text())
    assert (config["attn_layers"], config["window_size"]) == ([1], 64)
    assert "pure" in json.loads((tmp_path / "out" / "training.json").read_text())["runs"]
    evals = json.loads((tmp_path / "out" / "eval.json").read_text())
    assert list(evals) == ["all"] and list(evals["all"]) == ["speed"]  # no NIAH, no quality
    speed = evals["all"]["speed"]
    assert speed["models"] == [str(tiny_teacher_dir), str(runs / "main_hybrid"), str(runs / "pure")]
    assert {(r["length"], r["batch"]) for r in speed["rows"]} == {(32, 1), (64, 1), (32, 2), (64, 2)}
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "## Inference against the teacher" in readme and f"| 64 | 2 | {runs / 'pure'} |" in readme


def test_a_call_spends_its_time_only_on_what_it_started(tiny_teacher_dir, tiny_corpus, tmp_path):
    """What the first lent GPU met (H100, 2026-12-05): (1) three calls stopped at the check, yet the plan's clock had
    started in the first, so the speed phase found its time spent and measured nothing; (2) a call that found its
    runs still training from an earlier call waited 120 s for each of them to pass its start, ran past its LIMIT
    into the tool's hard timeout, and brought nothing back."""
    import time

    text = tiny_corpus / "text.txt"
    plan = tiny_campaign(tmp_path / "tiny.runs", text)
    plan.write_text("\n".join(l for l in plan.read_text().splitlines() if not l.startswith("speed ")) + "\n")
    bad = dry_run(tmp_path, tiny_teacher_dir, fake_dev(tmp_path / "bad", text, drop=("lm_eval",)), plan)
    assert bad.returncode == 2 and "campaign: stopped" in bad.stdout, bad.stdout[-3000:]
    assert not (tmp_path / "work" / "campaign" / "start").exists()  # (1) the clock waits for a passing check
    runs = tmp_path / "work" / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(["flock", "-o", str(runs / "hybrid_long.lock"), "sleep", "300"])  # "an earlier call's"
    try:
        time.sleep(1)
        start = time.time()
        proc = dry_run(tmp_path, tiny_teacher_dir, fake_dev(tmp_path, text), plan, LIMIT="60")
        took = time.time() - start
    finally:
        holder.kill()
    out = proc.stdout + proc.stderr
    assert "hybrid_long: still running (from an earlier call)" in out and "still training at the limit" in out, out
    assert "campaign: not finished: make the same call again" in out
    assert took < 60 + 30, f"the call took {took:.0f} s with LIMIT=60"  # (2) packing the report is all it adds


def test_check_fails_loudly_on_a_missing_wheel(tiny_teacher_dir, tiny_corpus, tmp_path):
    text = tiny_corpus / "text.txt"
    dev = fake_dev(tmp_path, text, drop=("lm_eval",))
    plan = tiny_campaign(tmp_path / "tiny.runs", text)
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "campaign.py"), "check", str(plan), "--dev", str(dev),
                           "--dry", "--teacher", str(tiny_teacher_dir), "--train_args", "--bf16 false"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert ("campaign check: error: the plan imports lm_eval, but no bundle in" in proc.stderr
            and "carries lm_eval: run `bash ../shared/device/prepare.sh lm_eval`" in proc.stderr), proc.stderr


def test_check_names_every_problem_of_the_real_campaign_here(tmp_path):
    """recipes/135m/campaign.runs against an empty .dev: each missing piece named, and its flags all parse."""
    (tmp_path / "dev").mkdir()
    c = campaign.read_campaign(ROOT / "recipes" / "135m" / "campaign.runs")
    assert [r[0] for r in c["runs"]] == ["plain", "fitted", "fitted_long", "hybrid_teacher", "hybrid_cpu", "cpu_recipe"]
    errors = campaign.check(c, tmp_path / "dev", dry=True, teacher="embedded", extra=["--bf16", "false"])
    text = "\n".join(errors)
    assert "no bundles in" in text and "trains on the long corpus" in text
    assert "lacks lambada_openai" in text and "lzcache" in text
    assert not any(e.startswith("run ") and "long corpus" not in e for e in errors), errors  # flags parse


@pytest.mark.parametrize("line, message", [
    ("phase warmup 10", "cannot read"),
    ("plain gated_deltanet many --dataset embedded", "cannot read"),
    ("speed no_such_script.py", "cannot read"),
])
def test_campaign_file_errors(tmp_path, line, message):
    (tmp_path / "c.runs").write_text(line + "\n")
    with pytest.raises(ValueError, match=message):
        campaign.read_campaign(tmp_path / "c.runs")


def test_bad_run_flag_is_named(tmp_path):
    (tmp_path / "c.runs").write_text("plain gated_deltanet 1000 --stage_fractions 1 2\n")
    c = campaign.read_campaign(tmp_path / "c.runs")
    errors = campaign.check(c, tmp_path, dry=True, teacher="embedded", extra=["--bf16", "false"])
    assert any(e.startswith("run plain: stage_fractions must be three") for e in errors), errors


def test_size_fits_equal_tokens_into_the_train_phase(tmp_path):
    (tmp_path / "c.runs").write_text("side_by_side 2\nstartup 100\n"
                                     "a gated_deltanet 9000000\nb gated_deltanet 9000000 --stage_fractions 0.4 0.1 0.5\n")
    c = campaign.read_campaign(tmp_path / "c.runs")
    bench = {"rows": {"gated_deltanet": {"stages": {s: {"steady_tok_s": 10000.0, "wall_tok_s": 1.0}
                                                    for s in campaign.STAGES}}}}
    tokens, lines = campaign.size(c, bench, 1100, "gated_deltanet", ["--bf16", "false"])
    # two runs at 2x one run's aggregate: each at 10k tokens/s; (1100 - 100) s x 10k = 10M, over the lines' 9M
    assert tokens == 9000000
    tokens, _ = campaign.size(c, bench, 600, "gated_deltanet", ["--bf16", "false"])
    assert tokens == 5000000 // 16384 * 16384  # whole steps of the recipe's 8 x 2048


def test_the_queue_fires_the_first_campaign_not_done(tmp_path):
    """recipes/135m/gpu-queue.txt (issue 32): every campaign in it reads and its flags parse; `next` skips those a
    complete results/gpu/<date>/training.json records, keeps a partial one at the head; device_jobs.sh campaign
    without CAMPAIGN fires the head, and says so when nothing is left."""
    queue = ROOT / "recipes" / "135m" / "gpu-queue.txt"
    entries = campaign.read_queue(queue)
    assert entries[:2] == ["recipes/135m/campaign.runs", "recipes/135m/speed.runs"]
    (tmp_path / "dev").mkdir()
    for entry in entries:
        errors = campaign.check(campaign.read_campaign(ROOT / entry), tmp_path / "dev", dry=True, teacher="embedded",
                                extra=["--bf16", "false"])
        assert not any(e.startswith("run ") and "long corpus" not in e for e in errors), (entry, errors)
    results = tmp_path / "results"
    assert campaign.next_campaign(queue, results) == entries[0]
    for i, entry in enumerate(entries):
        day = results / f"2026-12-{10 + i}"
        day.mkdir(parents=True)
        (day / "training.json").write_text(json.dumps({"campaign": Path(entry).name, "complete": False}))
        assert campaign.next_campaign(queue, results) == entry  # a partial campaign stays at the head
        (day / "training.json").write_text(json.dumps({"campaign": Path(entry).name, "complete": True}))
        assert campaign.next_campaign(queue, results) == (entries[i + 1] if i + 1 < len(entries) else None)
    env = {**os.environ, "QUEUE": str(queue), "RESULTS": str(results), "WORK": str(tmp_path / "work")}
    proc = subprocess.run(["bash", "scripts/device_jobs.sh", "campaign"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "campaign: nothing to fire from" in proc.stdout, proc.stdout + proc.stderr
    assert "every campaign of" in proc.stderr
    bad = tmp_path / "q.txt"
    bad.write_text("recipes/135m/no_such.runs\n")
    with pytest.raises(ValueError, match=r"q.txt:1: 'recipes/135m/no_such.runs' is not a campaign file"):
        campaign.read_queue(bad)


def test_dry_zoo_on_the_lent_machine(tiny_teacher_dir, tiny_corpus, tmp_path):
    """`device_jobs.sh zoo`: `linzoo zoo` of a zoo file built in the background under a lock (so that it outlives the
    call), followed until the build ends, and its report, state, log and every row's card and results packed into
    $OUT within the device's limits; the same call again finds the zoo built and retrains nothing. The real zoo file,
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
    dev = fake_dev(tmp_path, text)
    packed = tmp_path / "packed" / "extra-cache-v1"  # a cache too big for one call travels as lzcache-*.tar.xz
    packed.mkdir(parents=True)
    (packed / "marker.txt").write_text("unpacked")
    subprocess.run(["tar", "-cJf", str(dev / "lzcache-extra.tar.xz"), "-C", str(packed.parent), packed.name], check=True)
    run = lambda: subprocess.run(  # noqa: E731
        ["bash", str(ROOT / "scripts" / "device_jobs.sh"), "zoo"], cwd=ROOT, capture_output=True, text=True,
        timeout=600, env={**os.environ, "DRY": "1", "ZOO": str(plan), "TEACHER": str(tiny_teacher_dir), "DEV": str(dev),
                          "WORK": str(tmp_path / "work"), "OUT": str(tmp_path / "out"), "OMP_NUM_THREADS": "1",
                          "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    proc = run()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "zoo: building" in out and "zoo: done: 3 steps" in out and "zoo: the build has ended" in out, out[-3000:]
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["card.txt", "zoo.json", "zoo.log", "zoo.md", "zoo.png", "zoo_rows.tgz", "zoo_state.json"]
    assert len(files) <= 8 and all(p.stat().st_size <= 16 * 2**20 for p in (tmp_path / "out").iterdir())
    with tarfile.open(tmp_path / "out" / "zoo_rows.tgz") as tar:
        names = set(tar.getnames())
    assert {"gated_deltanet/base/README.md", "gated_deltanet/instruct/eval/instruct.json",
            "teacher/eval/niah.json"} <= names and not any(n.endswith(".safetensors") for n in names)
    rows = json.loads((tmp_path / "out" / "zoo.json").read_text())["rows"]
    assert [r["state"] for r in rows] == ["done"] * 3
    assert (tmp_path / "work" / "lzcache" / "data" / "extra-cache-v1" / "marker.txt").read_text() == "unpacked"
    again = run()
    assert again.returncode == 0 and "done earlier (skipped)" in again.stdout and " started" not in again.stdout
    real = zoo.read_zoo(ROOT / "recipes" / "135m" / "zoo-gpu.yaml")
    steps = zoo.plan(real, tmp_path / "gpu")
    assert len(steps) == 1 + 4 * len(real.mixers) and real.jobs == 10
    assert all("--device" in c.argv and "cuda" in c.argv for s in steps for c in s.evals)
