"""Students taken between machines (`linzoo export-zoo` / `import-zoo`, `scripts/device_jobs.sh export`): a token
ladder built on two machines, rehearsed on the CPU (DRY=1: each a fresh WORK folder, only $OUT's files crossing) ends
like the same ladder built at once; a linearize row with a parent trains it further (`--init_student`,
`--data_offset_tokens`); bad input is one line."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from test_device_jobs import fake_dev

ROOT = Path(__file__).resolve().parents[1]
RESULT_KEYS = ("accuracy", "mean_by_length", "overall", "key_logprob_by_length", "key_logprob", "weights_sha256")


def ladder(tmp_path, teacher, corpus) -> Path:
    """A zoo file of two steps of a token ladder: `first`, then `more` (its student trained further on the text after
    it), mixers only, so that what training changed is the mixers."""
    common = ["--dataset", str(corpus / "text.txt"), "--max_seq_length", "32", "--per_device_train_batch_size", "2",
              "--calibration_tokens", "0", "--dataloader_pin_memory", "false",
              "--stage_trainable", "mixers", "mixers", "mixers"]
    path = tmp_path / "ladder.yaml"
    path.write_text(yaml.safe_dump({
        "teacher": str(teacher), "mixers": ["gated_deltanet"], "jobs": 1,
        "variants": {"first": {"command": "linearize", "tokens": 384, "flags": common},
                     "more": {"command": "linearize", "parent": "first", "tokens": 256,
                              "flags": common + ["--stage_fractions", "0", "0", "1", "--data_offset_tokens", "384"]}},
        "evals": [{"eval": "niah", "flags": ["--lengths", "96", "--depths", "0", "--samples_per_cell", "1"]}],
        "estimate": {"tokens_per_second": {"linearize": 100}, "start_seconds": 5, "eval_seconds": {"niah": 5}}}))
    return path


def machine(tmp_path, name, teacher, dev, *phases, work=None, **env):
    """A call on a GPU machine, rehearsed: `device_jobs.sh PHASES` with DRY=1 in the machine's WORK (`work`, default
    `name`: a machine of its own) and a fresh $OUT; returns (stdout, $OUT)."""
    out = tmp_path / f"{name}-out"
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "device_jobs.sh"), *phases], cwd=ROOT, capture_output=True, text=True,
        timeout=600, env={**os.environ, "DRY": "1", "TEACHER": str(teacher), "DEV": str(dev),
                          "WORK": str(tmp_path / f"{work or name}-work"), "OUT": str(out), "OMP_NUM_THREADS": "1",
                          "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **env})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return proc.stdout, out


def results(folder: Path) -> dict:
    data = json.loads((folder / "eval" / "niah.json").read_text())
    return {k: data[k] for k in RESULT_KEYS}


def test_a_ladder_split_across_two_machines_ends_like_one_build(tiny_teacher_dir, tiny_corpus, tmp_path):
    plan = ladder(tmp_path, tiny_teacher_dir, tiny_corpus)
    dev = fake_dev(tmp_path)
    env = {"ZOO": str(plan)}
    log, _ = machine(tmp_path, "whole", tiny_teacher_dir, dev, "zoo", **env)
    assert "zoo: done: 3 steps" in log, log[-3000:]
    # machine 1: the ladder's first step, then its student exported as trained (float32: byte for byte)
    log, _ = machine(tmp_path, "one", tiny_teacher_dir, dev, "zoo", ZOO_ARGS="--variants first", **env)
    assert "zoo: done: 2 steps" in log, log[-3000:]
    log, out = machine(tmp_path, "one-export", tiny_teacher_dir, dev, "export", work="one",
                       ZOO_ARGS="--variants first", EXPORT_DTYPE="float32", **env)
    files = sorted(p.name for p in out.iterdir())
    assert files == ["card.txt", "gated_deltanet.first.00.safetensors", "zoo_export.json"], log[-3000:]
    assert all(p.stat().st_size <= 16 * 2**20 for p in out.iterdir())
    assert "export-zoo: gated_deltanet/first: " in log and "tensors changed from the teacher (float32)" in log
    # machine 2: a fresh one, the exported files in .dev/exported; the zoo goes on with the next step only
    dev2 = tmp_path / "dev2"
    shutil.copytree(dev, dev2)
    shutil.copytree(out, dev2 / "exported")
    log, _ = machine(tmp_path, "two", tiny_teacher_dir, dev2, "zoo", **env)
    assert "import-zoo: gated_deltanet/first: rebuilt in" in log and "(byte for byte)" in log, log[-3000:]
    assert "gated_deltanet/first: done earlier (skipped)" in log and "zoo: done: 3 steps" in log, log[-3000:]
    assert "gated_deltanet/more: train started" in log and "gated_deltanet/first: train started" not in log
    whole, split = (tmp_path / f"{n}-work" / "zoo" / "ladder" / "gated_deltanet" for n in ("whole", "two"))
    for row in ("first", "more"):
        assert (whole / row / "model.safetensors").read_bytes() == (split / row / "model.safetensors").read_bytes()
        assert results(whole / row) == results(split / row)
    lineage = json.loads((split / "more" / "linzoo_training.json").read_text())
    assert lineage["init_student"].endswith("gated_deltanet/first") and lineage["data_offset_tokens"] == 384


@pytest.fixture(scope="module")
def built(tiny_teacher_dir, tiny_corpus, tmp_path_factory):
    """A zoo folder holding the ladder's first step, built by `linzoo zoo` in this process's cwd."""
    from linzoo.zoo import run

    tmp = tmp_path_factory.mktemp("transfer")
    plan = ladder(tmp, tiny_teacher_dir, tiny_corpus)
    assert run.main(["--config", str(plan), "--out", str(tmp / "zoo"), "--variants", "first"]) == 0
    return plan, tmp / "zoo"


def test_a_bf16_export_is_recorded_and_evaluated_again(built, tiny_teacher_dir, tmp_path):
    """Exported in bf16 (half the bytes): the rebuilt row loads, its lineage says what was exported and records the
    new weights' hash, and the zoo evaluates it again (its old results were measured on other weights)."""
    import torch

    from linzoo.evals.common import weights_sha256
    from linzoo.loading import load_model
    from linzoo.zoo import run, transfer

    plan, zoo = built
    files = transfer.export_rows(zoo, tmp_path / "p", say=lambda _: None)
    assert [f.name for f in files] == ["gated_deltanet.first.00.safetensors", "zoo_export.json"]
    from safetensors.torch import load_file

    assert {t.dtype for t in load_file(files[0]).values()} == {torch.bfloat16}
    assert transfer.import_rows(tmp_path / "p", tmp_path / "zoo2", say=lambda _: None) == ["gated_deltanet/first"]
    row = tmp_path / "zoo2" / "gated_deltanet" / "first"
    lineage = json.loads((row / "linzoo_training.json").read_text())
    assert lineage["exported"]["dtype"] == "bfloat16" and lineage["exported"]["trained"] != lineage["weights_sha256"]
    student = load_model(str(row))[0]  # the loader checks the weights against the lineage
    original = load_model(str(zoo / "gated_deltanet" / "first"))[0]
    exported = set(load_file(files[0]))
    for (name, a), (_, b) in zip(original.state_dict().items(), student.state_dict().items()):
        assert torch.equal(a.to(torch.bfloat16).float() if name in exported else a, b), name  # the rest: the teacher's
    assert any(".self_attn." in n for n in exported) and not any(".mlp." in n for n in exported)
    assert weights_sha256(str(row)) != json.loads((row / "eval" / "niah.json").read_text())["weights_sha256"]
    assert run.main(["--config", str(plan), "--out", str(tmp_path / "zoo2"), "--variants", "first"]) == 0
    assert weights_sha256(str(row)) == json.loads((row / "eval" / "niah.json").read_text())["weights_sha256"]
    again = transfer.import_rows(tmp_path / "p", tmp_path / "zoo2", say=lambda _: None)  # a row already there stays
    assert again == []


@pytest.mark.parametrize("argv, words", [
    (["export-zoo", "{tmp}", "{tmp}/p"], "holds no zoo build (zoo_state.json is missing)"),
    (["export-zoo", "{zoo}", "{tmp}/p", "--rows", "gla/base"], "gla/base: no finished row of"),
    (["import-zoo", "{tmp}", "{tmp}/z"], "holds no exported build (zoo_export.json is missing)"),
    (["export-zoo", "{zoo}", "{tmp}/p", "--max_file_mb", "1"], "--max_file_mb 1: give at least 2"),
])
def test_bad_input_is_one_line(argv, words, built, tmp_path, capsys, monkeypatch):
    from linzoo import cli

    monkeypatch.delenv("LINZOO_DEBUG", raising=False)
    _, zoo = built
    argv = [w.format(tmp=tmp_path, zoo=zoo) for w in argv]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"linzoo {argv[0]}: error: ") and words in err and len(err.strip().splitlines()) == 1, err


def test_unpack_refuses_what_is_missing_or_another_build(built, tmp_path):
    from linzoo.zoo import transfer

    _, zoo = built
    transfer.export_rows(zoo, tmp_path / "p", say=lambda _: None)
    (tmp_path / "p" / "gated_deltanet.first.00.safetensors").rename(tmp_path / "elsewhere.safetensors")
    with pytest.raises(ValueError, match=r"gated_deltanet/first: gated_deltanet.first.00.safetensors missing from"):
        transfer.import_rows(tmp_path / "p", tmp_path / "z", say=lambda _: None)
    (tmp_path / "z2").mkdir()
    (tmp_path / "z2" / "zoo_state.json").write_text(json.dumps({"steps": {"gla/base": {}}}))
    with pytest.raises(ValueError, match="records steps the exported build has not"):
        transfer.import_rows(tmp_path / "p", tmp_path / "z2", say=lambda _: None)


def test_init_student_flags(built, tiny_teacher_dir, tmp_path):
    from linzoo.trainers.common import parse_config
    from linzoo.trainers.linearize_config import LinearizeConfig

    _, zoo = built
    student = str(zoo / "gated_deltanet" / "first")
    base = ["--teacher", str(tiny_teacher_dir), "--output_dir", str(tmp_path / "o"), "--init_student", student]
    with pytest.raises(ValueError, match="is a gated_deltanet student: pass --mixer gated_deltanet"):
        parse_config(LinearizeConfig, [*base, "--mixer", "gla"])
    with pytest.raises(ValueError, match="keeps its own layers and window; drop --attn_layers and --window_size"):
        parse_config(LinearizeConfig, [*base, "--mixer", "gated_deltanet", "--window_size", "8"])
    with pytest.raises(ValueError, match="not a linzoo student"):
        parse_config(LinearizeConfig, [*base[:-1], str(tiny_teacher_dir), "--mixer", "gated_deltanet"])


def test_variants_keep_their_ancestors(built):
    from linzoo.zoo import model
    from linzoo.zoo.plan import plan

    path, _ = built
    zoo = model.read_zoo(path)
    model.choose_variants(zoo, "more")
    assert list(zoo.variants) == ["first", "more"]
    steps = plan(zoo, Path("z"))
    more = next(s for s in steps if s.name == "gated_deltanet/more")
    assert more.train.argv[more.train.argv.index("--init_student") + 1] == str(Path("z/gated_deltanet/first"))
    model.choose_variants(zoo, "first")
    assert list(zoo.variants) == ["first"]
    with pytest.raises(ValueError, match="--variants base: name variants of"):
        model.choose_variants(zoo, "base")


def test_one_stage_trainable_word_sets_all_three(tmp_path):
    from linzoo.trainers.common import parse_config
    from linzoo.trainers.linearize_config import LinearizeConfig

    (args,) = parse_config(LinearizeConfig, ["--stage_trainable", "mixers", "--output_dir", str(tmp_path / "o")])
    assert args.stage_trainable == ["mixers"] * 3
    with pytest.raises(ValueError, match="stage_trainable must be one or three of 'mixers'/'all'"):
        parse_config(LinearizeConfig, ["--stage_trainable", "mixers", "all", "--output_dir", str(tmp_path / "o")])
