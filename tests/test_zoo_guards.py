"""The zoo guards its folder (linzoo/zoo/): one build at a time on an `--out`, a finished row skipped only once its
weights pass their check, a variant named twice, an eval's own refusal of its flags seen by
`--check` and `--dry-run`, a damaged zoo_state.json. Each error is one line and exit code 2; nothing trains here."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from linzoo import cli, zoo
from linzoo.integrity import write_json
from linzoo.zoo import check as zoo_check
from test_zoo import ESTIMATE, _three_variants


def _one_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("linzoo zoo: error: ") and err.count("\n") == 1, err
    return err


# --- one build at a time --------------------------------------------------------------------------------------


def test_a_second_build_on_one_folder_is_refused_naming_the_holder(tmp_path, capsys):
    """A build takes <out>/.zoo.lock before anything else where the folder is there: a second build (or a report)
    is refused in one line naming the holder; SIGTERM ends the holder through its exits, and the lock with it. (A
    zoo file its check refuses: no build would train here, in either process.)"""
    config = _three_variants(tmp_path, evals=[{"eval": "niah", "flags": ["--lenghts", "256"]}])
    out = tmp_path / "runs"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-m", "linzoo.cli", "zoo", "--config", str(config), "--out", str(out)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline, record = time.time() + 60, {}
        while record.get("pid") != holder.pid and time.time() < deadline:  # held and recorded (then: its check)
            time.sleep(0.1)
            try:
                record = json.loads((out / zoo.LOCK_FILE).read_text())
            except (OSError, ValueError):
                pass
        assert record.get("pid") == holder.pid and holder.poll() is None
        for mode in ([], ["--report-only"]):  # a report writes there too (the build writes it after every step)
            assert cli.main(["zoo", "--config", str(config), "--out", str(out), *mode]) == 2
            err = _one_error(capsys)
            assert f"{out} is in use by another `linzoo zoo` (pid {holder.pid} on {record['host']}, since " \
                   f"{record['since']}; it holds {out / zoo.LOCK_FILE})" in err
            assert f"wait for it to end, or stop it (kill {holder.pid}: a later run resumes), then run again" in err
        assert not (out / zoo.STATE_FILE).exists()
        holder.send_signal(signal.SIGTERM)
        assert holder.wait(30) == 143  # sys.exit(143): the check's process and the lock go with it
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait()
    with zoo.holding(out) as path:  # free again; this process's own record in it
        assert json.loads(path.read_text())["pid"] == os.getpid()
    with zoo.holding(out):  # let go on leaving: taken again
        pass


# --- a finished row is skipped only once its folder passes its check --------------------------------------------


def _finished(step, state):
    """A row as its training leaves it (weights, config.json, the lineage recording their sha256), recorded done."""
    import torch
    from safetensors.torch import save_file

    from linzoo.integrity import LINEAGE_FILE, weights_record

    step.folder.mkdir(parents=True)
    save_file({"weight": torch.arange(64, dtype=torch.float32)}, str(step.folder / "model.safetensors"))
    (step.folder / "config.json").write_text(json.dumps({"model_type": "linzoo"}))
    (step.folder / LINEAGE_FILE).write_text(json.dumps({"stage": step.variant, **weights_record(step.folder)}))
    state["steps"][step.name] = {"train": {"label": "train", "argv": step.train.argv, "rc": 0, "seconds": 1.0,
                                           "tokens": step.train.tokens, "command": step.train.command,
                                           "ended": "2026-12-08 10:00:00"}}


@pytest.fixture
def finished_zoo(tmp_path, monkeypatch):
    """Two mixers' base -> instruct -> instruct-distilled, every row finished; the build neither checks (its spawned
    check is another test's) nor runs a command: `built` holds the state its Build read."""
    monkeypatch.setenv("LINZOO_CACHE", str(tmp_path / "cache"))  # verify_folder's markers
    config, out = _three_variants(tmp_path), tmp_path / "runs"
    steps = zoo.plan(zoo.read_zoo(config), out)
    state = {"schema": "linzoo.zoo_state/v1", "steps": {}}
    for step in steps[1:]:
        _finished(step, state)
    out.mkdir(exist_ok=True)
    write_json(out / zoo.STATE_FILE, state)
    built = []
    monkeypatch.setattr(zoo_check, "check_plan", lambda *args: [])
    monkeypatch.setattr(zoo.Build, "run", lambda self: built.append(self.state) or 0)
    return config, out, {s.name: s for s in steps}, built


def test_a_corrupted_or_deleted_weights_file_rebuilds_its_row_and_the_rows_built_from_it(finished_zoo, capsys):
    config, out, steps, built = finished_zoo
    base, instruct = steps["gated_deltanet/base"], steps["mamba2/instruct"]
    weights = base.folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # a tensor's byte: the file still opens, its sha256 is not the one recorded
    weights.write_bytes(bytes(data))
    (instruct.folder / "model.safetensors").unlink()
    assert zoo.main(["--config", str(config), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert (f"zoo: gated_deltanet/base: {base.folder} fails its check ({weights} is not the file its run saved: its "
            f"sha256 differs from the one in {base.folder / 'linzoo_training.json'}): rebuilding it and the 2 rows "
            "built from it\n") in said
    assert (f"zoo: mamba2/instruct: {instruct.folder} fails its check ({instruct.folder / 'model.safetensors'} is "
            "missing: linzoo_training.json records its sha256): rebuilding it and the 1 row built from it\n") in said
    for name in ("gated_deltanet/base", "gated_deltanet/instruct", "gated_deltanet/instruct-distilled",
                 "mamba2/instruct", "mamba2/instruct-distilled"):  # moved aside, nothing deleted; built again
        assert f"zoo: {name}: moved to {steps[name].folder}.replaced-1" in said
        assert not steps[name].folder.exists() and name not in built[0]["steps"]
    assert (Path(f"{base.folder}.replaced-1") / "model.safetensors").read_bytes() == bytes(data)
    assert list(zoo.ZooState.read(out)["steps"]) == ["mamba2/base"]  # the one row that passes: done, skipped
    assert built[0].is_done(steps["mamba2/base"], steps["mamba2/base"].train)


def test_a_finished_row_whose_folder_is_gone_is_rebuilt_with_its_children(finished_zoo, capsys):
    import shutil

    config, out, steps, built = finished_zoo
    base = steps["mamba2/base"]
    shutil.rmtree(base.folder)
    assert zoo.main(["--config", str(config), "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert (f"zoo: mamba2/base: {base.folder} fails its check (the folder is gone): rebuilding it and the 2 rows "
            "built from it\n") in said
    assert "zoo: mamba2/base: moved" not in said and "zoo: mamba2/instruct: moved to" in said
    assert sorted(built[0]["steps"]) == ["gated_deltanet/base", "gated_deltanet/instruct",
                                         "gated_deltanet/instruct-distilled"]


# --- the zoo file ----------------------------------------------------------------------------------------------


ZOO_TEXT = """teacher: embedded
mixers: [gated_deltanet]
variants:
  base: {command: linearize, tokens: 6000}
  instruct: {command: sft, parent: base, tokens: 3000}
  base: {command: linearize, tokens: 9000}
evals:
  - {eval: niah, flags: [--lengths, "256"]}
estimate:
  tokens_per_second: {linearize: 60, sft: 300}
  eval_seconds: {niah: 30}
  eval_seconds: {niah: 40}
"""


def test_a_variant_named_twice_is_refused(tmp_path, capsys):
    path = tmp_path / "zoo.yaml"
    path.write_text(ZOO_TEXT)
    assert cli.main(["zoo", "--config", str(path), "--out", str(tmp_path / "runs"), "--dry-run"]) == 2
    assert _one_error(capsys) == (f"linzoo zoo: error: {path}: variants.base: the variant is named twice (lines 4 and "
                                  "6): YAML would keep the last without a word; give each variant its own name\n")
    path.write_text(ZOO_TEXT.replace("  base: {command: linearize, tokens: 9000}\n", ""))  # any mapping of the file
    with pytest.raises(ValueError, match=r"zoo.yaml: estimate.eval_seconds: given twice in one mapping \(lines 10 "
                                         r"and 11\): YAML would keep the last without a word; give each key once$"):
        zoo.read_zoo(path)
    path.write_text(ZOO_TEXT.replace("  base: {command: linearize, tokens: 9000}\n", "").replace(
        "  eval_seconds: {niah: 40}\n", ""))
    assert list(zoo.read_zoo(path).variants) == ["base", "instruct"]


def test_check_and_dry_run_refuse_what_the_eval_itself_refuses(tmp_path, capsys, monkeypatch):
    """A niah depth of 1.5 parses (a float list), and niah refuses it before loading a model: so do --check and
    --dry-run, with the eval's own words. The check runs in this process here (a build spawns it)."""
    config = _three_variants(tmp_path, evals=[{"eval": "niah", "flags": ["--depths", "0,1.5"]},
                                              {"eval": "speed", "flags": ["--lengths", "256"]}],
                             estimate=ESTIMATE | {"eval_seconds": {"niah": 30, "speed": 30}})
    monkeypatch.setattr(zoo_check, "check_plan", zoo_check._check_plan)
    refusal = ("zoo: check: eval niah: --depths '0,1.5': give needle depths in [0, 1], comma-separated, e.g. --depths "
               "0,0.5,1\n")
    for mode in ("--check", "--dry-run"):
        assert zoo.main(["--config", str(config), "--out", str(tmp_path / "runs"), mode]) == 2
        said = capsys.readouterr().out
        assert said.endswith(refusal + "zoo: check: 1 problems: fix them, then run again\n"), said
    assert not (tmp_path / "runs").exists()


# --- zoo_state.json --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, why", [
    ('{"schema": "linzoo.zoo_state/v1", "steps": {"teacher": {"eval ni', "not JSON: Unterminated string"),
    ("[]", "an array, not an object of steps"),
    ('{"steps": {"teacher": []}}', "steps.teacher is an array, not an object of commands"),
    ('{"steps": {"gated_deltanet/base": {"train": {"rc": 0, "seconds": 5, "tokens": 6000, "ended": "x"}}}}',
     "steps.gated_deltanet/base.train lacks argv"),
])
def test_a_damaged_state_file_is_one_line_naming_the_way_out(tmp_path, capsys, text, why):
    config, out = _three_variants(tmp_path), tmp_path / "runs"
    (out / "gated_deltanet" / "base").mkdir(parents=True)  # a row's folder: its record is read
    (out / "gated_deltanet" / "base" / "linzoo_training.json").write_text("{}")
    (out / zoo.STATE_FILE).write_text(text)
    for mode in (["--dry-run"], []):
        assert cli.main(["zoo", "--config", str(config), "--out", str(out), *mode]) == 2
        err = _one_error(capsys)
        path = out / zoo.STATE_FILE
        assert err.startswith(f"linzoo zoo: error: {path} is damaged ({why}")
        assert err.endswith(f"): move it aside (mv {path} {path}.damaged) and run again: the build then finds its "
                            "finished rows by their folders\n")
    assert (out / zoo.STATE_FILE).read_text() == text
