"""What a card leaves out, the push leaves out; `linzoo card` refuses a folder that loading refuses.

On the tiny saved student (conftest's `tiny_student_dir`, copied before any change). The upload is `linzoo push`
against `HfApi` methods replaced by recorders: what `create_commit` was given is what would be sent.
"""

import json
import re
import shutil

import pytest
from huggingface_hub import HfApi, ModelCard

import linzoo
from linzoo import cli
from linzoo.evals import niah
from linzoo.evals.common import weights_sha256
from linzoo.evals.registry import all_evals
from linzoo.hub_cards import plan, push
from linzoo.integrity import CONFIG_DIGEST, LINEAGE_FILE, weights_record

REPO = "tester/linzoo-gated-deltanet-base"


def niah_of(folder, overall: float) -> dict:
    """Schema-valid NIAH results as `linzoo eval niah --model <folder>` writes them (naming its weights)."""
    return {"schema": niah.SCHEMA, "model": str(folder), "needle": "passkey", "prompt_format": "raw",
            "lengths": [512], "depths": [0.0, 1.0], "samples_per_cell": 2,
            "accuracy": {"512": {"0": overall, "1": overall}}, "mean_by_length": {"512": overall},
            "overall": overall, "seed": 0, "weights_sha256": weights_sha256(str(folder))}


@pytest.fixture
def sent(monkeypatch):
    """`sent(folder)`: {path in repo: local path or bytes} of the one commit `linzoo push` makes, and the dry run's
    printed plan, through recorders standing in for the Hub (the fresh-process load check stubbed: ~8 s)."""
    monkeypatch.setattr(plan, "check_loads", lambda folder: plan.Check("loads (stubbed in this test)", True))
    monkeypatch.setenv("HF_TOKEN", "hf_NotARealTokenButLooksLikeOne1234567")
    commits = []
    monkeypatch.setattr(HfApi, "repo_exists", lambda self, repo_id, **kw: False)
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: None)
    monkeypatch.setattr(HfApi, "create_commit", lambda self, repo_id, operations, **kw: commits.append(operations)
                        or type("Info", (), {"commit_url": "https://huggingface.co/x/commit/1", "pr_url": None})())

    def upload(folder, capsys):
        capsys.readouterr()
        assert push.main([str(folder), "--repo-id", REPO, "--dry-run"]) == 0
        dry_run = capsys.readouterr().out
        assert push.main([str(folder), "--repo-id", REPO]) == 0
        (operations,) = commits[-1:]
        return {op.path_in_repo: op.path_or_fileobj for op in operations}, dry_run

    return upload


def assert_card_and_upload_agree(folder, files: dict, dry_run: str):
    """Every figure of the folder is in the uploaded card iff it is uploaded; the card's numbers are those of the
    uploaded results files; the dry run lists exactly the files sent."""
    card = ModelCard(files["README.md"].decode())
    for figure in sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.png")):
        assert (f"]({figure})" in card.text) == (figure in files), figure
    uploaded = [spec.card_results(json.loads((folder / path).read_text())) for path in files
                for spec in all_evals() if path.rsplit("/", 1)[-1] == spec.result_file]
    key = lambda r: (r.dataset_type, r.metric_name, r.metric_value)  # noqa: E731
    assert sorted(map(key, card.data.eval_results or [])) == sorted(key(r) for rs in uploaded for r in rs)
    listed = re.findall(r"^ {4} *[\d,]+  (\S+)", dry_run.split("card front matter:")[0], re.MULTILINE)
    assert sorted(listed) == sorted(files)


def test_another_models_results_and_their_figures_are_neither_shown_nor_uploaded(tiny_student_dir, tiny_teacher_dir,
                                                                                 tmp_path, sent, capsys):
    """`eval niah --model <teacher> --out <student>/eval`: the card said 'not measured' and showed the teacher's
    heatmap beside it; the plan said it left eval/niah.json out and uploaded it. Older runs put the heatmap at the
    folder's top, where the card looks too."""
    folder = shutil.copytree(tiny_student_dir, tmp_path / "student")
    niah.save_niah(niah_of(tiny_teacher_dir, 0.125), folder / "eval")
    shutil.copy(folder / "eval" / "niah_heatmap.png", folder / "niah_heatmap.png")
    files, dry_run = sent(folder, capsys)
    card = files["README.md"].decode()
    section = card.split("### Needle in a haystack")[1].split("###")[0]
    assert "not measured" in section and "niah_heatmap.png" not in card and "0.125" not in card
    assert not {"eval/niah.json", "eval/niah_heatmap.png", "niah_heatmap.png"} & set(files)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)
    assert "not uploaded: eval/niah.json, eval/niah_heatmap.png, niah_heatmap.png\n" in dry_run
    assert (f"    eval/niah.json: it measured {str(tiny_teacher_dir)!r}, whose weights are not this folder's\n"
            in dry_run)
    assert "    eval/niah_heatmap.png: a figure of eval/niah.json, which is left out\n" in dry_run
    assert_card_and_upload_agree(folder, files, dry_run)

    # its own NIAH run again in eval/natural: shown and uploaded, with its heatmap; the teacher's still not
    niah.save_niah(niah_of(folder, 0.75), folder / "eval" / "natural")
    files, dry_run = sent(folder, capsys)
    assert {"eval/natural/niah.json", "eval/natural/niah_heatmap.png"} <= set(files)
    assert "(eval/natural/niah_heatmap.png)" in files["README.md"].decode()
    assert not {"eval/niah.json", "eval/niah_heatmap.png", "niah_heatmap.png"} & set(files)
    assert_card_and_upload_agree(folder, files, dry_run)


@pytest.mark.parametrize("config_digest", [True, False], ids=["config-digest-recorded", "config-digest-deleted"])
def test_card_refuses_a_config_that_disagrees_with_its_weights(tiny_student_dir, tmp_path, capsys, config_digest):
    """A 2-layer student whose config.json was edited to say 1 layer (as '24 layers' for 30): every load refuses it,
    so `linzoo card` does, in the loader's own words. With the config's sha256 in the lineage the digest names it;
    with that entry deleted, only the weights' shapes can."""
    folder = shutil.copytree(tiny_student_dir, tmp_path / "student")
    record = {"stage": "base", **weights_record(folder)}
    if not config_digest:
        del record[CONFIG_DIGEST]
    (folder / LINEAGE_FILE).write_text(json.dumps(record))
    config = json.loads((folder / "config.json").read_text())
    assert config["num_hidden_layers"] == 2
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    with pytest.raises(ValueError) as loading:
        linzoo.load_model(str(folder))
    why = "is not the file its run saved" if config_digest else "the config builds 1 layer, the weights hold 2"
    assert why in str(loading.value) and "\n" not in str(loading.value)

    capsys.readouterr()
    assert cli.main(["card", str(folder)]) == 2
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("linzoo")]
    assert said == [f"linzoo card: error: {loading.value}"]  # transformers' progress bars aside
    assert not (folder / "README.md").exists()
