"""`linzoo zoo` (linzoo/zoo/): the plan and its estimate, a real tiny build killed and resumed, the report's writers
on hand-made results, and a bad zoo file's one-line errors."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from linzoo import zoo
from linzoo.integrity import write_json
from linzoo.zoo import report as zoo_report

ESTIMATE = {"tokens_per_second": {"linearize": 60, "sft": 300, "distill-instruct": 150}, "start_seconds": 10,
            "eval_seconds": {"niah": 30}}


def _write(path, data):
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _three_variants(tmp_path, **changes):
    data = {"teacher": "embedded", "mixers": ["gated_deltanet", "mamba2"], "jobs": 1,
            "variants": {"base": {"command": "linearize", "tokens": 6000, "flags": ["--window_size", 64]},
                         "instruct": {"command": "sft", "parent": "base", "tokens": 3000},
                         "instruct-distilled": {"command": "distill-instruct", "parent": "instruct", "tokens": 1500}},
            "evals": [{"eval": "niah", "flags": ["--lengths", "256"]},
                      {"eval": "niah", "sub": "natural", "flags": ["--variant", "natural"]}],
            "estimate": ESTIMATE}
    return _write(tmp_path / "zoo.yaml", data | changes)


def test_dry_run_prints_the_plan_and_its_time(tmp_path, capsys):
    out = tmp_path / "runs"
    assert zoo.main(["--config", str(_three_variants(tmp_path)), "--out", str(out), "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert not out.exists()  # nothing ran, nothing was written
    steps = [line for line in lines if line.startswith("[")]
    assert [line.split()[-1] for line in steps] == [str(out / "teacher")] + [
        str(out / m / v) for m in ("gated_deltanet", "mamba2") for v in ("base", "instruct", "instruct-distilled")]
    # seconds: teacher 2 evals x 30; base 10 + 6000/60 + 60 + card 10 = 180; instruct 10 + 3000/300 + 70 = 90;
    # instruct-distilled 10 + 1500/150 + 70 = 90
    assert [line.split("est.")[1].split()[:2] for line in steps] == [["60", "s"]] + [["3", "min"], ["90", "s"],
                                                                                    ["90", "s"]] * 2
    assert "from gated_deltanet/base" in steps[2] and "from teacher" in steps[1]
    commands = [line.strip() for line in lines if line.startswith("     linzoo")]
    assert commands[0] == (f"linzoo linearize --teacher embedded --mixer gated_deltanet --total_tokens 6000 "
                           f"--window_size 64 --output_dir {out}/gated_deltanet/base")
    assert commands[2].startswith(f"linzoo distill-instruct --model_name_or_path {out}/gated_deltanet/instruct "
                                  "--teacher embedded --total_tokens 1500")
    assert ("eval niah/natural linzoo eval niah --model <folder> --out <folder>/eval/natural --variant natural"
            in [" ".join(line.split()) for line in lines])
    assert lines[-1] == "total: est. 13 min with 1 at a time (the zoo file's estimate)"  # 60 + 2 x 360 s
    # two at a time: the teacher and the first base together, then each mixer's chain beside the other's
    assert zoo.main(["--config", str(_three_variants(tmp_path)), "--out", str(out), "--dry-run", "--jobs", "2"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "total: est. 7 min with 2 at a time (the zoo file's estimate)"
    # a part of the zoo (what fits one GPU lease): one mixer's rows and the teacher
    assert zoo.main(["--config", str(_three_variants(tmp_path)), "--out", str(out), "--dry-run", "--mixers",
                     "mamba2"]) == 0
    part = [line.split()[-1] for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert part == [str(out / "teacher")] + [str(out / "mamba2" / v) for v in ("base", "instruct", "instruct-distilled")]
    with pytest.raises(ValueError, match=r"--mixers gla: name mixers of .* \(gated_deltanet, mamba2\)"):
        zoo.main(["--config", str(_three_variants(tmp_path)), "--out", str(out), "--dry-run", "--mixers", "gla"])
    # what this build measured replaces the zoo file's figures: linearize took 50 s for 6000 tokens
    config = zoo.read_zoo(tmp_path / "zoo.yaml")
    steps = zoo.plan(config, out)
    state = {"steps": {"gated_deltanet/base": {"train": {"label": "train", "rc": 0, "seconds": 50.0, "tokens": 6000,
                                                          "command": "linearize", "argv": []}}}}
    assert zoo.command_seconds(steps[4], steps[4].train, config, state) == pytest.approx(50.0)  # mamba2/base
    assert zoo.command_seconds(steps[5], steps[5].train, config, state) == pytest.approx(20.0)  # sft: the file's


def test_makespan_waits_and_shares():
    tasks = [("a", 10.0, []), ("b", 5.0, ["a"]), ("c", 7.0, [])]
    assert zoo.makespan(tasks, 1) == 22.0 and zoo.makespan(tasks, 2) == 15.0


# --- a real tiny build, killed and resumed ------------------------------------------------------------------


def _tiny_zoo(tmp_path, teacher, corpus):
    return _write(tmp_path / "tiny.yaml", {
        "teacher": str(teacher), "mixers": ["gated_deltanet"],
        "variants": {
            "base": {"command": "linearize", "tokens": 600, "flags": [
                "--dataset", str(corpus / "text.txt"), "--max_seq_length", "32", "--per_device_train_batch_size", "2",
                "--calibration_tokens", "0", "--logging_steps", "1", "--save_steps", "2",
                "--dataloader_pin_memory", "false"]},
            "instruct": {"command": "sft", "parent": "base", "tokens": 256, "flags": [
                "--dataset", str(corpus / "chat.jsonl"), "--max_seq_length", "64", "--per_device_train_batch_size", "2",
                "--logging_steps", "1", "--dataloader_pin_memory", "false"]}},
        "evals": [{"eval": "niah", "flags": ["--lengths", "192", "--depths", "0", "--samples_per_cell", "1",
                                             "--batch_size", "1"]}],
        "estimate": {"tokens_per_second": {"linearize": 100, "sft": 100}, "start_seconds": 5,
                     "eval_seconds": {"niah": 5}}})


def _running(words):
    """Whether a process whose command line holds `words` runs."""
    found = False
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            found |= words in cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            pass
    return found


def _files(out):
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and not p.name.startswith(".")
                  and p.suffix != ".log" and p.name != zoo.STATE_FILE)


def test_a_killed_build_resumes_to_the_zoo_of_an_unkilled_one(tiny_teacher_dir, tiny_corpus, tmp_path, capsys,
                                                               monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the commands' torch: tiny models, a shared machine
    config, out = _tiny_zoo(tmp_path, tiny_teacher_dir, tiny_corpus), tmp_path / "killed"
    base, instruct = out / "gated_deltanet" / "base", out / "gated_deltanet" / "instruct"
    engine = subprocess.Popen([sys.executable, "-m", "linzoo.cli", "zoo", "--config", str(config), "--out", str(out)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen = []
    try:
        for line in engine.stdout:  # killed while instruct trains: its folder holds the run's record, no model
            seen.append(line)
            if "gated_deltanet/instruct: train started" in line:
                deadline = time.time() + 120
                while not (instruct / "linzoo_run.json").is_file() and time.time() < deadline:
                    time.sleep(0.05)
                break
        os.kill(engine.pid, signal.SIGKILL)  # the engine alone, as the device tool's timeout or the OOM killer would
        engine.wait()
        deadline = time.time() + 20  # its command dies with it (no orphan trains on, holding the folder's lock)
        while _running(str(instruct)) and time.time() < deadline:
            time.sleep(0.1)
        assert not _running(str(instruct))
    finally:
        try:
            os.killpg(engine.pid, signal.SIGKILL)  # whatever is left of its process group
        except ProcessLookupError:
            pass
    log = "".join(seen)
    assert "[2/3] gated_deltanet/base: done in" in log and "est. left" in log, log
    killed = zoo.ZooState.read(out)["steps"]["gated_deltanet/instruct"]["train"]  # recorded as it started
    assert killed["rc"] is None and killed["argv"][0] == "sft" and "seconds" not in killed
    assert (base / "README.md").is_file() and not (instruct / "linzoo_training.json").exists()
    before = {p: p.read_bytes() for p in (base / "linzoo_training.json", base / "eval" / "niah.json")}
    assert "gated_deltanet/base" in (out / "zoo.md").read_text()  # a killed build still has its report

    assert zoo.main(["--config", str(config), "--out", str(out)]) == 0
    resumed = capsys.readouterr().out
    assert "[1/3] teacher: done earlier (skipped)" in resumed
    assert "[2/3] gated_deltanet/base: done earlier (skipped)" in resumed
    assert "[3/3] gated_deltanet/instruct: done in" in resumed and "zoo: done: 3 steps" in resumed
    assert "gated_deltanet/base: train started" not in resumed
    assert all(p.read_bytes() == data for p, data in before.items())  # untouched
    assert (out / "gated_deltanet" / "instruct.log").read_text().count("$ linzoo sft") == 2  # killed, then again

    fresh = tmp_path / "unkilled"  # two at a time: the teacher's evals beside the base's training
    assert zoo.main(["--config", str(config), "--out", str(fresh), "--jobs", "2"]) == 0
    assert "[3/3] gated_deltanet/instruct: done in" in capsys.readouterr().out
    assert _files(out) == _files(fresh)
    assert {"gated_deltanet/instruct/eval/niah.json", "gated_deltanet/instruct/README.md"} <= set(_files(out))
    rows = [json.loads((o / "zoo.json").read_text())["rows"] for o in (out, fresh)]
    assert [r["state"] for r in rows[0]] == ["done"] * 3
    assert [[r["step"], r["evals"]] for r in rows[0]] == [[r["step"], r["evals"]] for r in rows[1]]
    # a finished zoo, run again: every step skipped, nothing started
    assert zoo.main(["--config", str(config), "--out", str(out)]) == 0
    assert "started" not in capsys.readouterr().out

    # the zoo file changes the base's recipe: the base and the instruct row trained from it are named, not built over
    # (the trainer would refuse the folder; the instruct row would pass for done); --rebuild-changed moves both aside
    changed = yaml.safe_load(config.read_text())
    changed["variants"]["base"]["tokens"] = 640
    config.write_text(yaml.safe_dump(changed, sort_keys=False))
    assert zoo.main(["--config", str(config), "--out", str(out)]) == 2
    said = capsys.readouterr().out
    assert "zoo: gated_deltanet/base: its training command changed in the zoo file (--total_tokens 600 -> 640)" in said
    assert "zoo: gated_deltanet/instruct: its parent gated_deltanet/base is rebuilt" in said
    assert "zoo: 2 rows hold trainings this zoo file no longer describes: pass --rebuild-changed" in said
    assert "started" not in said and (base / "linzoo_training.json").read_bytes() == before[base / "linzoo_training.json"]
    assert zoo.main(["--config", str(config), "--out", str(out), "--rebuild-changed"]) == 0
    said = capsys.readouterr().out
    assert f"zoo: gated_deltanet/base: moved to {base}.replaced-1" in said
    assert "[3/3] gated_deltanet/instruct: done in" in said and "[1/3] teacher: done earlier (skipped)" in said
    assert (Path(f"{base}.replaced-1") / "linzoo_training.json").read_bytes() == before[base / "linzoo_training.json"]
    assert (Path(f"{instruct}.replaced-1") / "linzoo_training.json").is_file()  # kept, not deleted
    assert json.loads((base / "linzoo_training.json").read_text())["total_tokens"] == 640
    assert zoo.replaced_rows(zoo.plan(zoo.read_zoo(config), out), zoo.ZooState.read(out)) == []


def test_a_row_killed_mid_training_then_changed_in_the_zoo_file_is_replaced(tmp_path):
    """A row killed mid-training (its state holds the line recorded as it started, rc none; the killed build's test
    checks that the build writes it) whose command then changes is named with the change, rather than failing in the
    trainer, which refuses a folder of other arguments; the same line is resumed, not replaced."""
    config = _three_variants(tmp_path, mixers=["gated_deltanet"])
    steps = zoo.plan(zoo.read_zoo(config), tmp_path / "runs")
    base = steps[1]
    base.folder.mkdir(parents=True)
    (base.folder / "linzoo_run.json").write_text("{}")  # what a killed training leaves: its record, no model
    old = list(base.train.argv)
    old[old.index("--total_tokens") + 1] = "1"
    state = {"steps": {base.name: {"train": {"label": "train", "argv": old, "rc": None, "started": "2026-12-06"}}}}
    assert [(s.name, why) for s, why in zoo.replaced_rows(steps, state)] == [
        (base.name, f"its training command changed in the zoo file (--total_tokens 1 -> {base.train.tokens})")]
    state["steps"][base.name]["train"]["argv"] = base.train.argv  # the same line: resumed, not replaced
    assert zoo.replaced_rows(steps, state) == []


def test_a_row_trained_before_its_parent_was_trained_again_is_replaced(tmp_path):
    """A parent trained again (its folder removed by hand, then rebuilt) leaves its descendants trained from weights
    that are gone: they are named, though their own commands did not change."""
    config = _three_variants(tmp_path, mixers=["gated_deltanet"])
    steps = zoo.plan(zoo.read_zoo(config), tmp_path / "runs")
    for step in steps[1:]:
        step.folder.mkdir(parents=True)
        (step.folder / "linzoo_training.json").write_text("{}")

    def record(step, ended):
        return {"train": {"label": "train", "argv": step.train.argv, "rc": 0, "ended": ended}}

    base, instruct, distilled = steps[1:]
    state = {"steps": {base.name: record(base, "2026-12-06 10:00:00"), instruct.name: record(instruct, "2026-12-06 "
                                                                                               "11:00:00"),
                       distilled.name: record(distilled, "2026-12-06 12:00:00")}}
    assert zoo.replaced_rows(steps, state) == []
    state["steps"][base.name]["train"]["ended"] = "2026-12-06 11:30:00"  # the base trained again after instruct
    assert [(s.name, why) for s, why in zoo.replaced_rows(steps, state)] == [
        (instruct.name, f"its parent {base.name} was trained again after it (2026-12-06 11:30:00 > 2026-12-06 "
                        "11:00:00)"),
        (distilled.name, f"its parent {instruct.name} is rebuilt")]
    aside = zoo.move_aside(instruct, state, say=lambda line: None)
    assert aside == Path(f"{instruct.folder}.replaced-1") and (aside / "linzoo_training.json").is_file()
    assert not instruct.folder.exists() and instruct.name not in state["steps"]


def test_the_deadline_stops_what_runs_and_says_so(tiny_teacher_dir, tiny_corpus, tmp_path, capsys):
    config, out = _tiny_zoo(tmp_path, tiny_teacher_dir, tiny_corpus), tmp_path / "runs"
    began = time.time()
    assert zoo.main(["--config", str(config), "--out", str(out), "--max-seconds", "1"]) == 3
    assert time.time() - began < 30  # the teacher's eval was stopped, not waited for
    said = capsys.readouterr().out
    assert "teacher: eval niah started" in said
    assert "zoo: not finished: the deadline (--max-seconds) came with 3 steps left; run the same command again" in said
    state = zoo.ZooState.read(out)
    assert state["steps"] == {}  # a stopped command is no result, but its time is the build's
    assert [(r["step"], r["label"]) for r in state["stopped"]] == [("teacher", "eval niah")]
    assert 0 < state["stopped"][0]["seconds"] < 30
    assert "| teacher `" in (out / "zoo.md").read_text() and (out / "zoo.png").is_file()


# --- the report on hand-made results ----------------------------------------------------------------------


def _niah(model, by_length, se=0.1):
    return {"schema": "linzoo.niah/v1", "model": model, "mean_by_length": by_length,
            "mean_by_length_se": {k: se for k in by_length}, "overall": sum(by_length.values()) / len(by_length),
            "overall_se": se / 2}


def _quality(model, above, stderr, ppl, teacher_ppl):
    return {"schema": "linzoo.quality/v1", "model": model, "perplexity": ppl, "teacher_perplexity": teacher_ppl,
            "recovery_above_chance": {"average": above, "stderr": {"average": stderr}}}


def _instruct(model, accuracy, stop_rate):
    return {"schema": "linzoo.instruct/v1", "model": model, "accuracy": accuracy, "accuracy_se": 0.03,
            "stop_rate": stop_rate, "stop_rate_se": 0.02}


def test_report_writers_on_hand_made_results(tmp_path):
    """The table (an eval per variant, the targets of each variant checked against the teacher row), the JSON and
    the figure, from hand-made results files."""
    from linzoo.evals.registry import get_eval

    path = _three_variants(tmp_path, variants={"base": {"command": "linearize", "tokens": 100},
                                               "instruct": {"command": "sft", "parent": "base", "tokens": 100}},
                           evals=[{"eval": "niah"}, {"eval": "instruct", "variants": ["instruct"]},
                                  {"eval": "quality"}],  # the base rows skip the middle one
                           targets={"base": {"niah": {"of_teacher": 0.8, "at": [256, 512]},
                                             "quality": {"perplexity_ratio": 1.3}},
                                    "instruct": {"instruct": {"of_teacher": 0.7, "stop_rate": 0.9}}},
                           estimate=ESTIMATE | {"eval_seconds": {"niah": 30, "quality": 60, "instruct": 120}})
    config, out = zoo.read_zoo(path), tmp_path / "runs"
    steps = zoo.plan(config, out)
    assert [c.label for c in steps[0].evals] == ["eval niah", "eval instruct", "eval quality"]  # the teacher: all
    assert [c.label for c in steps[1].evals] == ["eval niah", "eval quality"]  # base: not the instruct eval
    assert [c.label for c in steps[2].evals] == ["eval niah", "eval instruct", "eval quality"]
    niah_file, quality_file, instruct_file = (get_eval(e).result_file for e in ("niah", "quality", "instruct"))
    # the teacher and one student measured; another student has NIAH only; the rest nothing
    made = {"teacher": (_niah("t", {"256": 1.0, "512": 1.0}, 0.0) | {"key_logprob": -0.5, "key_logprob_se": 0.1},
                        _quality("t", None, None, 15.0, None), _instruct("t", 1.0, 0.86)),
            "gated_deltanet/base": (_niah("s", {"256": 0.75, "512": 0.9}), _quality("s", 41.5, 3.6, 18.0, 15.0)),
            "gated_deltanet/instruct": (None, None, _instruct("s", 0.85, 0.79)),
            "mamba2/base": (_niah("m", {"256": 0.25, "512": 0.0}), None)}
    for s in steps:
        for data, name in zip(made.get(s.name, ()), (niah_file, quality_file, instruct_file)):
            if data:
                (s.folder / "eval").mkdir(parents=True, exist_ok=True)
                (s.folder / "eval" / name).write_text(json.dumps(data))
    state = {"steps": {"gated_deltanet/base": {"train": {"seconds": 300.0, "rc": 0},
                                               "card": {"seconds": 5.0, "rc": 0}}}}
    (steps[1].folder / "linzoo_training.json").write_text(json.dumps(  # a linearize record the deadline stopped
        {"tokens": {"stage1-attention-transfer": 6000}, "stages": [
            {"stage": "stage1-attention-transfer", "seconds": 30.0, "final_loss": 0.05, "stopped_at_deadline": True}]}))
    (steps[2].folder / "linzoo_training.json").parent.mkdir(parents=True, exist_ok=True)
    (steps[2].folder / "linzoo_training.json").write_text(json.dumps(  # sft's record
        {"tokens": {"instruct": 3000}, "seconds": 15.0, "final_loss": 1.25}))
    rows = zoo_report.write_report(config, steps, out, state, status_of=lambda s: "done" if s.name in made else "to do")
    md = (out / "zoo.md").read_text()
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert table[0] == ("| model | parent | state | time | trained: tokens (tok/s), last loss "
                        "| niah by length (256 / 512) | niah: key log-prob (nats) "
                        "| instruct: accuracy (× teacher) | instruct: EOS stop | quality: recovery above chance % "
                        "| quality: perplexity × teacher | quality: KL | targets |")
    assert table[1] == ("| teacher `embedded` |  | done | — | — | 1.00±0.00 / 1.00±0.00 | -0.5±0.1 | 1.00±0.03 (1.00) "
                        "| 0.86±0.02 | (the reference) | 1.00 (15.0) | — |  |")
    assert table[2] == ("| gated_deltanet/base | teacher | done | 5 min | 6,000 (200), 0.050, **stopped by the deadline** "
                        "| 0.75±0.10 / 0.90±0.10 | — | — | — | 41.5±3.6 "
                        "| 1.20 (18.0) | — | **missed** niah at 256 >= 0.8 x teacher (1.00): 0.75 |")
    assert table[3] == ("| gated_deltanet/instruct | gated_deltanet/base | done | — | 3,000 (200), 1.250 | — | — "
                        "| 0.85±0.03 (0.85) "
                        "| 0.79±0.02 | — | — | — | **missed** instruct EOS stop >= 0.9: 0.79 |")
    assert table[4].startswith("| mamba2/base | teacher | done | — | — | 0.25±0.10 / 0.00±0.10 | — | — | — | — | — | — "
                               "| **missed** niah at 256 >= 0.8 x teacher (1.00): 0.25; niah at 512 >= 0.8 x teacher "
                               "(1.00): 0.00 (1 not measured) |")
    assert "Targets (the zoo file's `targets`, per variant): base: niah of_teacher 0.8, at [256, 512]" in md
    assert (out / "zoo-summary.md").read_text().splitlines() == [  # the README's short table: done rows only
        "| row | niah (256 / 512) | instruction answers, EOS stop | quality: above chance, ppl × teacher |",
        "|---|---|---|---|",
        "| teacher | 1.00 / 1.00 | 1.00, 0.86 | —, 1.00x |",
        "| gated_deltanet/base | 0.75 / 0.90 | — | 42 %, 1.20x |",
        "| gated_deltanet/instruct | — | 0.85, 0.79 | — |",
        "| mamba2/base | 0.25 / 0.00 | — | — |"]
    saved = json.loads((out / "zoo.json").read_text())
    assert saved["rows"] == rows and saved["teacher"] == "embedded"
    assert rows[1]["evals"]["quality"]["recovery_above_chance"] == [41.5, 3.6]
    assert rows[1]["evals"]["quality"]["perplexity_ratio"] == pytest.approx(1.2)
    assert rows[1]["evals"]["niah"]["by_length"] == {"256": [0.75, 0.1], "512": [0.9, 0.1]}
    assert [t["held"] for t in rows[1]["targets"]] == [False, True, True]
    assert [t["held"] for t in rows[2]["targets"]] == [True, False]
    from PIL import Image

    with Image.open(out / "zoo.png") as image:
        assert image.size[0] > 500 and image.size[1] > 600  # three panels: NIAH, recovery, instruction answers
    zoo_report.figure(zoo_report.report_rows(config, steps[:1], {"steps": {}}), tmp_path / "empty.png")  # nothing to plot: fine
    (out / "zoo.md").unlink()  # `--report-only` writes it again from what the folder holds, running nothing
    assert zoo.main(["--config", str(path), "--out", str(out), "--report-only"]) == 0
    again = [line for line in (out / "zoo.md").read_text().splitlines() if line.startswith("| ")][2]
    assert again.split(" | ")[4:] == table[2].split(" | ")[4:]  # the numbers (no zoo_state.json here: no times)
    assert (tmp_path / "empty.png").is_file()


def test_speed_is_measured_beside_the_teacher_in_each_students_row(tmp_path, capsys):
    """`eval speed` takes the teacher and the row together (its ratios are of one process): no row of its own for
    the teacher; the table shows the state and decode time at the longest length, with their ratios."""
    path = _three_variants(tmp_path, evals=[{"eval": "niah"}, {"eval": "speed", "flags": ["--lengths", "256,1024"]}],
                           estimate=ESTIMATE | {"eval_seconds": {"niah": 30, "speed": 40}})
    config, out = zoo.read_zoo(path), tmp_path / "runs"
    steps = zoo.plan(config, out)
    assert [c.label for c in steps[0].evals] == ["eval niah"]  # the teacher's row
    speed = steps[1].evals[1]
    assert speed.argv == ["eval", "speed", "--models", "embedded", str(steps[1].folder), "--out",
                          str(steps[1].folder / "eval"), "--lengths", "256,1024"]
    assert zoo.main(["--config", str(path), "--out", str(out), "--dry-run"]) == 0
    assert "linzoo eval speed --models embedded <folder> --out <folder>/eval --lengths 256,1024" in capsys.readouterr().out

    def cell(model, length, state, decode, ratios):
        return {"model": model, "length": length, "batch": 1, "prefill_s": 1.0, "decode_ms_per_token": decode,
                "state_bytes_per_sequence": state, "ratios": {"prefill_s": ratios[0], "decode_ms_per_token": ratios[1],
                                                              "state_bytes_per_sequence": ratios[2]}}
    student = str(steps[1].folder)
    rows = [cell("embedded", 1024, 2**22, 50.0, (1, 1, 1)), cell(student, 256, 2**20, 40.0, (1.1, 0.9, 0.5)),
            cell(student, 1024, 2**20, 41.0, (0.8, 0.82, 0.25))]
    (steps[1].folder / "eval").mkdir(parents=True)
    (steps[1].folder / "eval" / "speed.json").write_text(json.dumps(
        {"schema": "linzoo.speed/v1", "models": ["embedded", student], "teacher": "embedded", "batch_sizes": [1],
         "rows": rows}))
    report = zoo_report.write_report(config, steps, out, {"steps": {}})
    assert report[1]["evals"]["speed"] == {"length": 1024, "batch": 1, "state_bytes": 2**20, "decode_ms_per_token": 41.0,
                                           "prefill_s_ratio": 0.8, "decode_ms_per_token_ratio": 0.82,
                                           "state_bytes_per_sequence_ratio": 0.25}
    table = [line for line in (out / "zoo.md").read_text().splitlines() if line.startswith("| ")]
    assert ("speed: state per sequence at 1024 tokens (× teacher) | speed: decode ms/token (× teacher) "
            "| speed: prefill × teacher |") in table[0]
    assert "| 1.0 MiB (0.25) | 41.0 (0.82) | 0.80 |" in table[2] and table[1].endswith("| — | — | — |  |")


def test_one_mixers_row_can_differ_by_its_tokens_and_flags(tmp_path, capsys):
    """`per_mixer`: one mixer's row of a variant trains on other tokens, its flags in place of the variant's same flag
    (one value each in the argv it prints and records), others added; its children are planned from it as usual."""
    base = {"command": "linearize", "tokens": 6000, "flags": ["--window_size", 64, "--stage_fractions", 1, 0, 0],
            "per_mixer": {"mamba2": {"tokens": 12000, "flags": ["--stage_fractions", 0.5, 0, 0.5, "--seed", 1]}}}
    path = _three_variants(tmp_path, variants={"base": base, "instruct": {"command": "sft", "parent": "base",
                                                                           "tokens": 3000}})
    out = tmp_path / "runs"
    steps = {s.name: s for s in zoo.plan(zoo.read_zoo(path), out)}
    assert steps["gated_deltanet/base"].train.argv[5:] == ["--total_tokens", "6000", "--window_size", "64",
                                                           "--stage_fractions", "1", "0", "0", "--output_dir",
                                                           str(out / "gated_deltanet" / "base")]
    assert steps["mamba2/base"].train.argv[5:] == ["--total_tokens", "12000", "--window_size", "64", "--stage_fractions",
                                                   "0.5", "0", "0.5", "--seed", "1", "--output_dir", str(out / "mamba2" / "base")]
    assert (steps["mamba2/base"].train.tokens, steps["gated_deltanet/base"].train.tokens) == (12000, 6000)
    assert zoo.merge_flags(["--a", "1", "--b", "2", "--a", "3"], ["--a", "4"]) == ["--a", "4", "--b", "2"]  # argparse:
    assert zoo.merge_flags(["--x-y", "1", "--z=2"], ["--x_y", "5", "--z=3"]) == ["--x_y", "5", "--z=3"]  # last wins
    assert steps["mamba2/instruct"].train.argv[:3] == ["sft", "--model_name_or_path", str(out / "mamba2" / "base")]
    # the plan prints it, and its time is the row's own tokens': 180 s, and 6000 more at 60 tok/s
    assert zoo.main(["--config", str(path), "--out", str(out), "--dry-run"]) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert [line[line.index("est.") + 1:][:2] for line in lines if line[2].endswith("/base")] == [["3", "min"],
                                                                                                   ["5", "min"]]



def test_a_build_read_from_another_folder_is_the_same_build(tmp_path, monkeypatch):
    """A build run as `--out runs/zoo` from its clone records command lines with that relative folder; read from
    elsewhere as `--out /abs/clone/runs/zoo` (scripts/zoo_results.py, `--report-only`), its rows are still done: each
    record keeps the folder as given and the cwd, and the comparison makes the zoo's folder absolute on both sides."""
    config = zoo.read_zoo(_three_variants(tmp_path))
    clone, elsewhere = tmp_path / "clone", tmp_path / "elsewhere"
    (clone / "runs" / "zoo").mkdir(parents=True)
    elsewhere.mkdir()
    monkeypatch.chdir(clone)
    step = zoo.plan(config, "runs/zoo")[2]  # gated_deltanet/instruct: its argv names its parent's folder too
    step.train.output.parent.mkdir(parents=True)
    step.train.output.write_text("{}")
    record = {"label": "train", "argv": step.train.argv, "rc": 0, "out": "runs/zoo", "cwd": str(clone)}
    state = zoo.ZooState(steps={step.name: {"train": record}})
    assert state.is_done(step, step.train)
    monkeypatch.chdir(elsewhere)
    there = zoo.plan(config, clone / "runs" / "zoo")[2]
    assert there.train.argv != record["argv"] and state.is_done(there, there.train)
    assert not zoo.replaced_rows(zoo.plan(config, clone / "runs" / "zoo"), state)
    # a record of another command line is not done; nor is one from before records kept their folder
    assert not zoo.ZooState({"steps": {step.name: {"train": record | {
        "argv": [w.replace("3000", "4000") for w in record["argv"]]}}}}).is_done(there, there.train)
    old = {k: v for k, v in record.items() if k not in ("out", "cwd")}
    assert not zoo.ZooState({"steps": {step.name: {"train": old}}}).is_done(there, there.train)

@pytest.mark.parametrize("per_mixer, words", [
    ({"gla": {"tokens": 10}}, "variants.base.per_mixer: 'gla': not a mixer of this variant (gated_deltanet, mamba2)"),
    ({"mamba2": {"lr": 1}}, "variants.base.per_mixer.mamba2.lr: unknown key"),
    ({"mamba2": {"flags": ["--output_dir", "x"]}}, "variants.base.per_mixer.mamba2.flags: --output_dir is the zoo's"),
    ([1], "variants.base.per_mixer: give a mapping of mixer -> {tokens, flags}"),
    ([], "variants.base.per_mixer: give a mapping of mixer -> {tokens, flags}"),
])
def test_a_bad_per_mixer_is_one_line_naming_the_key(tmp_path, per_mixer, words):
    path = _three_variants(tmp_path, variants={"base": {"command": "linearize", "tokens": 10, "per_mixer": per_mixer}})
    with pytest.raises(ValueError, match="^" + re.escape(str(path)) + ": ") as err:
        zoo.read_zoo(path)
    assert words in str(err.value) and "\n" not in str(err.value)
    # a child's mixers are its parent's unless it says: per_mixer is checked against those
    path = _three_variants(tmp_path, variants={
        "base": {"command": "linearize", "tokens": 10, "mixers": ["mamba2"]},
        "instruct": {"command": "sft", "parent": "base", "tokens": 10, "per_mixer": {"gated_deltanet": {"tokens": 5}}}})
    with pytest.raises(ValueError, match=r"variants.instruct.per_mixer: 'gated_deltanet': not a mixer of this variant "
                                         r"\(mamba2\)"):
        zoo.read_zoo(path)


# --- a bad zoo file: one line naming the key, before anything runs ----------------------------------------


@pytest.mark.parametrize("changes, words", [
    ({"mixers": ["gated_deltanet", "mamba"]}, "mixers: 'mamba': unknown mixer"),
    ({"variants": {"base": {"command": "linearize", "tokens": 10},
                   "instruct": {"command": "sft", "parent": "bse", "tokens": 10}}},
     "variants.instruct.parent: 'bse': unknown variant (variants: base, instruct)"),
    ({"variants": {"a": {"command": "sft", "parent": "b", "tokens": 10},
                   "b": {"command": "sft", "parent": "a", "tokens": 10}}},
     "variants.a.parent: 'b': its parents form a loop"),
    ({"variants": {"base": {"command": "linearise", "tokens": 10}}},
     "variants.base.command: 'linearise': unknown command"),
    ({"variants": {"base": {"command": "linearize", "tokens": 10, "lr": 1}}}, "variants.base.lr: unknown key"),
    ({"variants": {"base": {"command": "linearize", "tokens": 10, "flags": ["--output_dir", "x"]}}},
     "variants.base.flags: --output_dir is the zoo's to set"),
    ({"variants": {"base": {"command": "linearize"}}}, "variants.base.tokens: missing"),
    ({"evals": [{"eval": "niha"}]}, "evals[0].eval: 'niha': unknown eval"),
    ({"evals": [{"eval": "niah"}, {"eval": "niah"}]}, "evals[1]: niah is there twice"),
    ({"teachr": "embedded"}, "teachr: unknown key"),
    ({"estimate": {"tokens_per_second": {"linearize": 60}, "eval_seconds": {"niah": 30}}},
     "estimate.tokens_per_second.sft: missing"),
    ({"jobs": 0}, "jobs: give a positive whole number"),
    ({"evals": [{"eval": "niah", "variants": ["bse"]}]}, "evals[0].variants: give a list of the zoo's variants"),
    ({"targets": {"base": {"niah/natural": {"of_teacher": 0.8, "at": [256]}, "niah": {"at": [256]}}}},
     "targets.base.niah: give a measure (of_teacher, perplexity_ratio, stop_rate)"),
    ({"targets": {"base": {"quality": {"perplexity_ratio": 1.3}}}}, "targets.base.quality: unknown key"),
    ({"targets": {"bse": {}}}, "targets.bse: unknown key"),
])
def test_a_bad_zoo_file_is_one_line_naming_the_key(tmp_path, capsys, changes, words):
    from linzoo import cli

    path = _three_variants(tmp_path, **changes)
    with pytest.raises(ValueError, match="^" + re.escape(str(path)) + ": ") as err:
        zoo.read_zoo(path)
    assert words in str(err.value) and "\n" not in str(err.value)
    assert cli.main(["zoo", "--config", str(path), "--out", str(tmp_path / "runs")]) == 2
    assert capsys.readouterr().err == f"linzoo zoo: error: {err.value}\n"
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name", ["zoo-cpu.yaml", "zoo-gpu.yaml"])
def test_the_shipped_zoo_files_plan_every_mixer_and_their_commands_parse(name, tmp_path):
    """recipes/135m/zoo-*.yaml: every registered mixer as base, base-pure, instruct and instruct-distilled, the targets
    of issue 30, and each row's training command through its command's own parser (an unknown flag fails here)."""
    from trl import ModelConfig

    from linzoo.modeling.mixers import MIXERS
    from linzoo.trainers.common import parse_config
    from linzoo.trainers.distill_instruct_config import InstructDistillConfig
    from linzoo.trainers.linearize_config import LinearizeConfig
    from linzoo.trainers.sft import LinzooSFTConfig

    config = zoo.read_zoo(Path(__file__).resolve().parents[1] / "recipes" / "135m" / name)
    assert sorted(config.mixers) == sorted(MIXERS)
    assert list(config.variants) == ["base", "base-pure", "instruct", "instruct-distilled"]
    assert config.targets["base"]["niah/natural"] == {"of_teacher": 0.8, "at": [256, 512]}
    types = {"linearize": (LinearizeConfig,), "sft": (LinzooSFTConfig, ModelConfig),
             "distill-instruct": (InstructDistillConfig, ModelConfig)}
    steps = zoo.plan(config, tmp_path / "zoo")
    for step in steps[1:5]:  # one mixer's four rows: the flags are the same for every mixer
        argv = [w if w != str(tmp_path / "zoo" / step.mixer / "base") else str(tmp_path) for w in step.train.argv[1:]]
        parsed = parse_config(types[step.train.command], [*argv, "--bf16", "false"])
        assert parsed[0].total_tokens == config.variants[step.variant].tokens
    assert {c.label for s in steps[1:5] for c in s.evals} == {f"eval {e.label}" for e in config.evals}


def _row(mixer, variant, **evals):
    return {"step": f"{mixer}/{variant}", "mixer": mixer, "variant": variant, "evals": evals}


def test_the_papers_claims_read_off_hand_made_rows():
    """Each claim from the rows that measure it: a difference beyond two standard errors holds or fails, a smaller one
    or missing rows cannot tell; the NIAH claim falls back on the key's log-probability where every row is at 0."""
    q = lambda v, se=1.0: {"recovery_above_chance": [v, se]}  # noqa: E731
    n = lambda overall, lp=None: {"overall": [overall, 0.05], **({"key_logprob": [lp, 0.2]} if lp else {})}  # noqa: E731
    i = lambda acc: {"accuracy": [acc, 0.03]}  # noqa: E731
    rows = [{"step": "teacher", "mixer": None, "variant": None, "evals": {}}]
    for m, rec, lp in (("gla", 40, -5.0), ("gated_deltanet", 44, -2.0), ("kda", 42, -4.5), ("linear_attn", 20, -6.0),
                       ("deltanet", 24, -3.0)):
        rows.append(_row(m, "base-pure", quality=q(rec), niah=n(0.0, lp)))
    for m, base, inst, acc, dist_acc, chat, dist_chat in (("gla", 50, 40, 0.80, 0.82, 0.9, 0.4),
                                                           ("gated_deltanet", 52, 60, 0.85, 0.84, 0.9, 0.9)):
        rows.append(_row(m, "base", quality=q(base)))
        rows.append(_row(m, "instruct", quality=q(inst), instruct=i(acc), **{"niah/chat": n(chat)}))
        rows.append(_row(m, "instruct-distilled", instruct=i(dist_acc), **{"niah/chat": n(dist_chat)}))
    verdicts = {c["claim"].split(" (")[0]: (c["verdict"], c["numbers"]) for c in zoo_report.claims(rows)}
    gated, gdn, widen, distil = verdicts.values()
    assert gated[0] == "holds" and "gated (gla, gated_deltanet, kda) 42.0±0.6 % vs not gated" in gated[1]
    assert gdn[0] == "holds" and "key log-probability" in gdn[1] and "the best of the 4 other pure rows (deltanet) -3.00" in gdn[1]
    assert widen[0] == "holds" and "base 2.0±1.4 points over 2 mixers, instruct 20.0±1.4" in widen[1]
    assert distil[0] == "holds" and "gla niah/chat 0.90 -> 0.40" in distil[1] and "gla +0.02±0.04" in distil[1]
    assert [c["verdict"] for c in zoo_report.claims(rows[:1])] == ["cannot tell at this budget"] * 4


def test_side_by_side_commands_share_the_cores():
    """With jobs side by side each command gets its share of the cores as threads (a 2-core machine: one each);
    alone, or where the caller set OMP_NUM_THREADS, the environment is left as it is."""
    assert zoo.job_env(2, {"PATH": "/bin"}, cores=2) == {"PATH": "/bin", "OMP_NUM_THREADS": "1"}
    assert zoo.job_env(10, {}, cores=16)["OMP_NUM_THREADS"] == "1" and zoo.job_env(4, {}, cores=16)["OMP_NUM_THREADS"] == "4"
    assert zoo.job_env(1, {"PATH": "/bin"}, cores=2) == {"PATH": "/bin"}
    assert zoo.job_env(2, {"OMP_NUM_THREADS": "2"}, cores=2) == {"OMP_NUM_THREADS": "2"}


def test_a_zoo_files_threads_hold_on_any_machine(tmp_path):
    """`threads:` fixes every command's threads whatever the cores, jobs or caller's setting (a CPU build's last bits
    depend on them); a count below 1 is refused in the file's words."""
    assert zoo.job_env(2, {"OMP_NUM_THREADS": "4"}, cores=16, threads=1) == {"OMP_NUM_THREADS": "1"}
    assert zoo.job_env(1, {}, cores=2, threads=2) == {"OMP_NUM_THREADS": "2"}
    base = {"teacher": "embedded", "mixers": ["gla"], "variants": {"base": {"command": "linearize", "tokens": 100}},
            "estimate": {"tokens_per_second": {"linearize": 100}, "start_seconds": 5}}
    path = tmp_path / "z.yaml"
    path.write_text(yaml.safe_dump({**base, "threads": 1}))
    assert zoo.read_zoo(path).threads == 1
    path.write_text(yaml.safe_dump(base))
    assert zoo.read_zoo(path).threads is None
    path.write_text(yaml.safe_dump({**base, "threads": 0}))
    with pytest.raises(ValueError, match=r"z.yaml: threads: give a positive whole number, not 0"):
        zoo.read_zoo(path)


# --- the campaign runner's parts, now the zoo's: variants of some mixers, a training deadline, the check, the queue


def test_variants_of_some_mixers_and_the_training_deadline(tmp_path, capsys, monkeypatch):
    """A campaign's runs are variants of one mixer each (`mixers`); `train_seconds` gives each linearize its
    --max_wall_seconds from the build's first training start (kept in zoo_state.json), and a training that would
    start after it does not: the row is reported not trained, and nothing else runs."""
    variants = {"long": {"command": "linearize", "tokens": 6000, "mixers": ["gated_deltanet"]},
                "short": {"command": "linearize", "tokens": 600},
                "chat": {"command": "sft", "parent": "long", "tokens": 300}}
    path = _three_variants(tmp_path, variants=variants, evals=[], train_seconds=600,
                           estimate=ESTIMATE | {"eval_seconds": {}})
    config, out = zoo.read_zoo(path), tmp_path / "runs"
    steps = zoo.plan(config, out)
    assert [s.name for s in steps] == ["teacher", "gated_deltanet/long", "gated_deltanet/short", "gated_deltanet/chat",
                                       "mamba2/short"]
    build = zoo.Build(config, steps, out, jobs=1)
    flags = build.train_deadline(steps[1].train)
    assert flags[0] == "--max_wall_seconds" and 595 <= int(flags[1]) <= 600
    assert zoo.ZooState.read(out)["train_began"] == build.state["train_began"]  # on disk before anything ran
    assert build.train_deadline(steps[3].train) == []  # sft has no deadline flag: it runs to its end
    (key, began), = build.state["train_began"].items()  # per plan: another zoo file in the same --out has its own
    assert key == f"{path} --mixers gated_deltanet,mamba2"
    build.state["train_began"][key] = began - 550  # 50 s left: less than a training needs to start
    assert build.train_deadline(steps[2].train) is None
    steps[1].folder.mkdir(parents=True)  # a training the deadline stopped: the state records what it trained
    (steps[1].folder / "linzoo_training.json").write_text(json.dumps({"tokens": {"stage1": 1000, "stage2": 500}}))
    build.record(steps[1], steps[1].train, 0, 60.0)
    assert build.state["steps"]["gated_deltanet/long"]["train"]["tokens"] == 1500  # not the 6000 planned
    del build.state["steps"]["gated_deltanet/long"]
    (steps[1].folder / "linzoo_training.json").unlink()
    write_json(out / zoo.STATE_FILE, build.state)
    assert zoo.main(["--config", str(path), "--out", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "gated_deltanet/long: not trained: the zoo's train_seconds (600 s) are spent" in printed
    assert " started" not in printed and "zoo: FAILED: gated_deltanet/long, " in printed
    started = []  # under train_seconds the trainings start before any eval (the teacher's comes first in the plan)
    monkeypatch.setattr(zoo.Build, "start_next", lambda self, task, index: started.append(task.name) and False)
    zoo.Build(config, steps, tmp_path / "order", jobs=2).run()
    assert started[:4] == ["gated_deltanet/long:train", "gated_deltanet/short:train", "mamba2/short:train",
                           "teacher:eval"]
    monkeypatch.undo()
    bad = dict(variants, chat={"command": "sft", "parent": "short", "tokens": 300, "mixers": ["mamba2"]},
               short={"command": "linearize", "tokens": 600, "mixers": ["gated_deltanet"]})
    with pytest.raises(ValueError, match=r"variants.chat.mixers: mamba2: its parent short is not built for them"):
        zoo.read_zoo(_three_variants(tmp_path, variants=bad, evals=[], estimate=ESTIMATE | {"eval_seconds": {}}))
    with pytest.raises(ValueError, match=r"variants.long.mixers: give a list of the zoo's mixers"):
        zoo.read_zoo(_three_variants(tmp_path, variants=dict(variants, long={**variants["long"], "mixers": ["gla"]}),
                                     evals=[], estimate=ESTIMATE | {"eval_seconds": {}}))


def test_the_check_names_every_problem_before_anything_runs(tmp_path, capsys, monkeypatch):
    """`linzoo zoo --check`, and the start of every build: a training flag its command does not know, an eval flag,
    the quality eval's data, a teacher that is not there, one line each; the modules a plan needs on CUDA."""
    from linzoo.zoo import check as zoo_check

    empty = tmp_path / "no-sets"
    empty.mkdir()
    monkeypatch.setenv("EVAL_DATA", str(empty))
    variants = {"base": {"command": "linearize", "tokens": 600, "flags": ["--windw_size", "64"]},
                "instruct": {"command": "sft", "parent": "base", "tokens": 300}}
    path = _three_variants(tmp_path, teacher=str(tmp_path / "no-teacher"), mixers=["gated_deltanet"],
                           variants=variants, evals=[{"eval": "niah", "flags": ["--lenghts", "256"]},
                                                     {"eval": "niah", "sub": "x", "flags": ["--samples_per_cell", "x"]},
                                                     {"eval": "quality"}],
                           estimate=ESTIMATE | {"eval_seconds": {"niah": 30, "quality": 60}})
    config = zoo.read_zoo(path)
    problems = zoo_check.check(config, zoo.plan(config, tmp_path / "runs"), cuda=False)
    assert problems[0] == f"teacher {tmp_path / 'no-teacher'}: no such file or folder"
    assert problems[1].startswith("gated_deltanet/base: `linzoo linearize` would fail: unknown option --windw_size")
    assert problems[2] == "eval niah: unknown flags --lenghts 256 (`linzoo eval niah --help` lists them)"
    assert problems[3] == ("eval niah/x: argument --samples_per_cell/--samples-per-cell: invalid int value: 'x' "
                           "(`linzoo eval niah --help` lists the options)")
    assert problems[4] == (f"eval quality reads the five sets from {empty}, which lacks lambada_openai, winogrande, "
                           "arc_easy, arc_challenge, piqa.jsonl")
    assert len(problems) == 5
    assert zoo.main(["--config", str(path), "--out", str(tmp_path / "runs")]) == 2  # a build stops before it starts
    printed = capsys.readouterr().out
    assert "zoo: check: 5 problems: fix them, then run again" in printed and not (tmp_path / "runs").exists()
    good = _three_variants(tmp_path, mixers=["gated_deltanet", "xlstm"])
    assert zoo.main(["--config", str(good), "--out", str(tmp_path / "runs"), "--check"]) == 0
    assert capsys.readouterr().out.endswith("zoo: check: 0 problems: ready\n")
    config = zoo.read_zoo(good)
    steps = zoo.plan(config, tmp_path / "runs")
    assert zoo_check.needed_modules(config, steps, cuda=True) == ["fla", "tilelang", "gguf", "trl", "datasets",
                                                                  "mlstm_kernels"]
    assert zoo_check.needed_modules(config, steps, cuda=False) == ["gguf", "trl", "datasets"]


def test_the_queue_fires_the_first_build_not_done(tmp_path, capsys, monkeypatch):
    """A queue file lists builds (`ZOO_FILE [--mixers a,b]`); `--next` prints the first that no zoo.json under
    --results shows complete (same file, same mixers, a done row for every step of its plan): a partial report, or
    one of an older plan, keeps it at the head. The shipped queue, recipes/135m/gpu-queue.txt, reads."""
    whole = _three_variants(tmp_path)
    queue = tmp_path / "queue.txt"
    queue.write_text(f"# two parts of one zoo\n{whole.name} --mixers mamba2\n{whole.name}   # then all of it\n")
    results = tmp_path / "results"
    assert zoo.next_in_queue(queue, results) == (str(whole), ["--mixers", "mamba2"])

    def report(day, mixers, rows):
        (results / day).mkdir(parents=True, exist_ok=True)
        (results / day / "zoo.json").write_text(json.dumps({"schema": "linzoo.zoo/v1", "zoo_file": f"/elsewhere/{whole.name}",
                                                            "mixers": mixers, "rows": rows}))
    part = ["teacher"] + [f"mamba2/{v}" for v in ("base", "instruct", "instruct-distilled")]
    report("2026-12-10", ["mamba2"], [{"step": s, "state": "failed" if s.endswith("distilled") else "done"} for s in part])
    assert zoo.next_in_queue(queue, results) == (str(whole), ["--mixers", "mamba2"])  # partial: fired again
    report("2026-12-10", ["mamba2"], [{"step": s, "state": "done"} for s in part[:3]])  # an older plan's report
    assert zoo.next_in_queue(queue, results) == (str(whole), ["--mixers", "mamba2"])
    # a report from before zoo.json named its mixers: its rows'
    report("2026-12-10", None, [{"step": s, "state": "done", "mixer": s.split("/")[0] if "/" in s else None}
                                for s in part])
    assert zoo.main(["--next", str(queue), "--results", str(results)]) == 0
    assert capsys.readouterr().out == f"{whole}\n"
    steps = [s.name for s in zoo.plan(zoo.read_zoo(whole), "_")]
    report("2026-12-11", ["gated_deltanet", "mamba2"], [{"step": s, "state": "done"} for s in steps])
    assert zoo.main(["--next", str(queue), "--results", str(results)]) == 1
    assert "every build of" in capsys.readouterr().out
    queue.write_text(f"{whole.name} --mixers gla\n")
    with pytest.raises(ValueError, match=r"--mixers gla: name mixers of"):
        zoo.read_queue(queue)
    queue.write_text("no_such.yaml\n")
    with pytest.raises(ValueError, match=r"queue.txt:1: 'no_such.yaml' is not a zoo file"):
        zoo.read_queue(queue)
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    assert zoo.read_queue(Path("recipes/135m/gpu-queue.txt"))[:6] == [
        ("recipes/135m/experiments/la-gpu.yaml", []), ("recipes/135m/experiments/la-seed-gpu.yaml", []),
        ("recipes/135m/experiments/prose-layers-gpu.yaml", ["--mixers", "gated_deltanet,kda,deltanet"]),
        ("recipes/135m/experiments/prose-layers-gpu.yaml", ["--mixers", "gla,linear_attn,retnet"]),
        ("recipes/135m/speed-gpu.yaml", []), ("recipes/135m/zoo-gpu.yaml", ["--mixers", "gated_deltanet,deltanet"])]


def test_the_readme_zoo_table_is_the_committed_builds():
    """The README's zoo section is the short table (zoo-summary.md) of the latest committed CPU zoo build."""
    root = Path(__file__).resolve().parents[1]
    builds = sorted((root / "results" / "zoo" / "cpu").glob("*/zoo-summary.md"))
    assert builds, "no committed zoo build: results/zoo/cpu/<date>/zoo-summary.md"
    assert builds[-1].read_text() in (root / "README.md").read_text(), f"README's zoo table drifted: paste {builds[-1]}"


def test_zoo_results_counts_a_resumed_build_by_its_segments():
    """scripts/zoo_results.py's wall time: the commands' spans merged where they overlap or follow within the gap; a
    longer pause (a killed build resumed in a later session) starts a new segment and is not counted."""
    from zoo_results import segments

    def run(end, seconds):
        return {"rc": 0, "seconds": seconds, "ended": end}

    state = {"steps": {
        "teacher": {"eval niah": run("2026-12-07 02:00:00", 600)},                   # 01:50-02:00
        "a/base": {"train": run("2026-12-07 02:10:00", 900),                          # 01:55-02:10, overlapping
                   "eval niah": run("2026-12-07 02:15:00", 240)},                     # 02:11-02:15, within the gap
        "a/instruct": {"train": run("2026-12-07 06:00:00", 1800)}}}                   # 05:30-06:00: resumed later
    parts = segments(state, gap=120)
    assert [round(b - a) for a, b in parts] == [1500, 1800]
    assert len(segments(state, gap=4 * 3600)) == 1
    # a command the deadline stopped at 02:40 after 20 min, resumed at 05:30: its first run is part of the build
    state["stopped"] = [{"step": "a/instruct", "label": "train", "seconds": 1200, "ended": "2026-12-07 02:40:00"}]
    assert [round(b - a) for a, b in segments(state, gap=120)] == [1500, 1200, 1800]
    assert [round(b - a) for a, b in segments(state, gap=900)] == [3000, 1800]


def test_the_main_job_trains_the_zoo_files_gated_deltanet_base_row(tmp_path):
    """scripts/main_job.sh holds no training flag of its own: it runs the command `linzoo zoo --print-command` prints
    for the CPU zoo's gated_deltanet/base row, in its own folder ($OUT) and on $TOKENS where set."""
    root = Path(__file__).resolve().parents[1]
    script = (root / "scripts" / "main_job.sh").read_text()
    assert not any(ln.startswith("linzoo linearize") for ln in script.splitlines())
    assert not any(flag in script for flag in ("--stage_", "--window_size", "--attn_layers 5"))
    bash = script[:script.index('"${TRAIN[@]}"')]  # up to the training, which it echoes instead
    bash = bash[bash.index("ROW=$("):] + 'printf "%s\\n" "${TRAIN[@]}"\n'
    config = zoo.read_zoo(root / "recipes" / "135m" / "zoo-cpu.yaml")
    row = next(s for s in zoo.plan(config, "runs/zoo") if s.name == "gated_deltanet/base")
    for tokens in (None, "640"):
        env = {**os.environ, "OUT": str(tmp_path / "main"), **({"TOKENS": tokens} if tokens else {})}
        run = subprocess.run(["bash", "-euo", "pipefail", "-c", bash], cwd=root, env=env, capture_output=True,
                             text=True, check=True)
        expected = ["linzoo", *row.train.argv]
        expected[expected.index("--output_dir") + 1] = str(tmp_path / "main")
        expected[expected.index("--total_tokens") + 1] = tokens or str(row.train.tokens)
        assert run.stdout.splitlines() == expected
