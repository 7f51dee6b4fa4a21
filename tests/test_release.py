"""Release: model cards, `linzoo push` and `linzoo push-zoo` on a tiny gated_deltanet student.

Untested here: the real network upload. No honest local server speaking the Hub's commit protocol
(preupload, NDJSON commits, LFS) exists on this machine, so the upload tests replace `HfApi`'s
methods with recorders and check what would be sent (repos, commit operations, PR/branch flags,
Space variables, collection items). The Hub's own validation of the card's YAML (model-index,
base_model) and of the collection calls is therefore not exercised.
"""

import json
import re
import shutil
import socket
import zipfile
from types import SimpleNamespace

import pytest
from huggingface_hub import CommitOperationDelete, HfApi, ModelCard
from huggingface_hub.errors import HfHubHTTPError

from linzoo.evals import niah, quality
from linzoo.evals.common import weights_sha256
from linzoo.hub_cards import card, plan, push, push_zoo
from linzoo.modeling.mixers import MIXER_CLASSES

REPO = "tester/linzoo-gated-deltanet-base"
TEACHER = "HuggingFaceTB/SmolLM2-135M-Instruct"
FAKE_TOKEN = "hf_NotARealTokenButLooksLikeOne1234567"

# Fake but schema-valid results, written with the evals' own writers.
QUALITY = {
    "schema": quality.SCHEMA, "model": REPO, "teacher": "embedded", "limit": 200,
    "tasks": {"lambada_openai": {"acc": 0.305, "n": 200, "chance": 0.0}, "winogrande": {"acc": 0.52, "n": 200, "chance": 0.5},
              "arc_easy": {"acc": 0.455, "acc_norm": 0.41, "n": 200, "chance": 0.25},
              "arc_challenge": {"acc": 0.225, "acc_norm": 0.255, "n": 200, "chance": 0.25},
              "piqa": {"acc": 0.615, "acc_norm": 0.6, "n": 200, "chance": 0.5}},
    "teacher_tasks": {"lambada_openai": {"acc": 0.4, "n": 200}, "winogrande": {"acc": 0.53, "n": 200},
                      "arc_easy": {"acc": 0.5, "acc_norm": 0.45, "n": 200},
                      "arc_challenge": {"acc": 0.25, "acc_norm": 0.3, "n": 200},
                      "piqa": {"acc": 0.65, "acc_norm": 0.64, "n": 200}},
    "recovery": {"lambada_openai": 76.25, "winogrande": 98.11320754716981, "arc_easy": 91.11111111111111,
                 "arc_challenge": 85.0, "piqa": 93.75, "average": 88.84486373165619},
    "recovery_metric": {t: "acc_norm" if t in quality.NORMED else "acc" for t in quality.TASKS},
    "chance_recovery": {"lambada_openai": 0.0, "winogrande": 94.33962264150944, "arc_easy": 55.55555555555556,
                        "arc_challenge": 83.33333333333334, "piqa": 78.125, "average": 62.27070230607967},
    # (s - c) / (t - c) where the teacher is >= 3 standard errors (n = 200) above chance: not winogrande, arc_challenge
    "recovery_above_chance": {"lambada_openai": 76.25, "winogrande": None, "arc_easy": 80.0, "arc_challenge": None,
                              "piqa": 71.42857142857143, "average": 75.89285714285714,
                              "tasks": ["lambada_openai", "arc_easy", "piqa"], "min_teacher_se_above_chance": 3.0,
                              # e.g. lambada: hypot(sqrt(.305 * .695 / 200) / .4, .305 * sqrt(.4 * .6 / 200) / .4^2)
                              "stderr": {"lambada_openai": 10.4808, "winogrande": None, "arc_easy": 22.3691,
                                         "arc_challenge": None, "piqa": 30.2013, "average": 13.0057}},
    "perplexity": 23.456789, "teacher_perplexity": 18.25, "kl_to_teacher": 0.3125, "heldout_tokens": 4096,
}
NIAH = {
    "schema": niah.SCHEMA, "model": REPO, "needle": "passkey", "prompt_format": "raw", "lengths": [512, 1024],
    "depths": [0.0, 0.5, 1.0], "samples_per_cell": 2,
    "accuracy": {"512": {"0": 1.0, "0.5": 0.5, "1": 1.0}, "1024": {"0": 0.5, "0.5": 0.0, "1": 1.0}},
    "mean_by_length": {"512": 0.8333333333333334, "1024": 0.5}, "overall": 0.6666666666666666, "seed": 0,
}
# What the card's model-index must say, written out by hand: (dataset name, metric name) -> value.
EXPECTED_NUMBERS = {
    **{(t, m): s[m] for t, s in QUALITY["tasks"].items() for m in ("acc", "acc_norm") if m in s},
    **{(t, f"teacher recovery % ({QUALITY['recovery_metric'][t]})"): QUALITY["recovery"][t] for t in quality.TASKS},
    ("zero-shot average", "teacher recovery % over 5 tasks"): QUALITY["recovery"]["average"],
    **{(t, f"teacher recovery above chance % ({QUALITY['recovery_metric'][t]})"): QUALITY["recovery_above_chance"][t]
       for t in QUALITY["recovery_above_chance"]["tasks"]},
    ("zero-shot average", "teacher recovery above chance % over 3 tasks"): 75.89285714285714,
    ("held-out text (4096 tokens)", "perplexity"): 23.456789,
    ("held-out text (4096 tokens)", "kl_to_teacher"): 0.3125,
    ("needle in a haystack (passkey, raw prompt)", "overall accuracy"): 0.6666666666666666,
    ("needle in a haystack (passkey, raw prompt)", "accuracy at 512 tokens"): 0.8333333333333334,
    ("needle in a haystack (passkey, raw prompt)", "accuracy at 1024 tokens"): 0.5,
}


@pytest.fixture
def student(tiny_student_dir, tmp_path):
    """A private copy of the tiny student with eval/quality.json, eval/niah.json and the NIAH heatmap."""
    folder = shutil.copytree(tiny_student_dir, tmp_path / "gated_deltanet-base")
    quality.save_quality(measured_on(QUALITY, folder), folder / "eval")
    niah.save_niah(measured_on(NIAH, folder), folder / "eval")
    return folder


def measured_on(results: dict, folder) -> dict:
    """The results as an eval of `folder` writes them: naming its weights."""
    return {**results, "weights_sha256": weights_sha256(str(folder))}


@pytest.fixture
def no_network(monkeypatch):
    """Any socket connection from this process fails the test (the load check's subprocess runs offline)."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args[1:]}")

    monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.fixture
def fast_load_check(monkeypatch):
    """Stands in for the fresh-process load check where a test is about something else (it costs ~8 s a folder);
    test_dry_run_prints_the_plan and test_load_check_catches_broken_remote_code run the real one."""
    monkeypatch.setattr(plan, "check_loads", lambda folder: plan.Check("loads (stubbed in this test)", True))


def card_numbers(model_card) -> dict:
    return {(r.dataset_name, r.metric_name): r.metric_value for r in model_card.data.eval_results or []}


# ------------------------------------------------------------------------------------------ cards


def test_card_round_trips_through_modelcard_load(student):
    assert card.main([str(student), "--repo-id", REPO]) == 0
    loaded = ModelCard.load(student / "README.md")
    assert card_numbers(loaded) == EXPECTED_NUMBERS
    data = loaded.data
    assert (data.license, data.base_model, data.base_model_relation) == ("apache-2.0", TEACHER, "finetune")
    assert (data.pipeline_tag, data.library_name) == ("text-generation", "transformers")
    assert {"linzoo", "linear-attention", "gated_deltanet", "base"} <= set(data.tags)
    assert data.eval_results[0].dataset_type == "EleutherAI/lambada_openai"
    text = loaded.text
    assert MIXER_CLASSES["gated_deltanet"].recurrence in text and MIXER_CLASSES["gated_deltanet"].title in text
    assert "**base (this model)**" in text and f"{TEACHER} → **base" in text
    assert "| arc_challenge | acc_norm | 0.255 | 0.300 | 0.250 | (teacher near chance) | 85.0% |" in text
    assert "| piqa | acc_norm | 0.600 | 0.640 | 0.500 | 71.4% ± 30.2 | 93.8% |" in text
    assert "keeps 75.9% ± 13.0 of its teacher's skill above chance" in text
    assert "such a guess would\nrecover 62.3% of the teacher" in text
    assert "| **75.9% ± 13.0** | 88.8% |" in text and "0.667" in text
    assert "![NIAH accuracy by context length and needle depth](eval/niah_heatmap.png)" in text
    assert f'repo = "{REPO}"' in text and "trust_remote_code=True" in text and 'pip install "linzoo[gpu]"' in text
    assert "eprint        = {2504.14366}" in text and "What Matters in Linearizing Language Models?" in text
    assert "not measured" not in text.split("## Results")[1].split("## Usage")[0]


def test_the_cards_usage_snippet_runs_as_written(student):
    """The card's Python, its repo id pointed at the folder, in a fresh offline process that can answer no prompt:
    AutoTokenizer reads config.json, whose auto_map names our code, so without trust_remote_code it asked
    "Do you wish to run the custom code? [y/N]" and then built the config as a model of type ''."""
    import os
    import subprocess
    import sys

    assert card.main([str(student), "--repo-id", REPO]) == 0
    text = (student / "README.md").read_text().split("## Usage")[1]
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1).replace(f'"{REPO}"', repr(str(student)))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "warning"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         stdin=subprocess.DEVNULL, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "custom code" not in run.stdout + run.stderr and "model of type ``" not in run.stderr, run.stderr[-2000:]
    assert run.stdout.strip(), "the snippet printed no generated text"


def test_card_keeps_a_readme_it_did_not_write(student):
    """A hand-written README.md was replaced without a word; linzoo's own card is rewritten freely."""
    (student / "README.md").write_text("# my notes\n")
    with pytest.raises(ValueError, match="not a card linzoo wrote .* --overwrite"):
        card.main([str(student), "--repo-id", REPO])
    assert (student / "README.md").read_text() == "# my notes\n"
    assert card.main([str(student), "--repo-id", REPO, "--overwrite"]) == 0
    assert card.main([str(student), "--repo-id", REPO]) == 0  # its own card again
    assert "linzoo" in ModelCard.load(student / "README.md").data.tags
    with pytest.raises(plan.ReleaseError, match="not a Hub repo id"):
        card.main([str(student), "--repo-id", "a b/c"])


def test_the_fixtures_above_chance_recovery_is_what_quality_computes():
    computed = quality.above_chance_recovery(QUALITY["tasks"], QUALITY["teacher_tasks"], QUALITY["recovery_metric"])
    expected = QUALITY["recovery_above_chance"]
    assert computed.keys() == expected.keys() and computed["tasks"] == expected["tasks"]
    for key, value in expected.items():
        if key == "stderr":
            assert computed[key].keys() == value.keys()
            for task, se in value.items():
                assert computed[key][task] == (None if se is None else pytest.approx(se, abs=1e-4)), task
        elif key != "tasks":
            assert computed[key] == (None if value is None else pytest.approx(value)), key


def test_missing_results_read_not_measured(tiny_student_dir, tmp_path):
    folder = shutil.copytree(tiny_student_dir, tmp_path / "s")
    bare = card.build_card(folder)
    assert not bare.data.eval_results
    results = bare.text.split("## Results")[1].split("## Usage")[0]
    assert results.count("not measured") == 5 * 5 + 2 + 1 + 2 + 1  # task rows, average row, headline, ppl + KL, NIAH
    assert "such a guess would" not in results  # no chance recovery without results
    assert not re.search(r"\d\.\d", results)  # no number filled in anywhere

    niah.save_niah(measured_on(NIAH, folder), folder / "eval")  # NIAH measured, quality not
    build = card.build_card(folder)
    assert set(card_numbers(build)) == {k for k in EXPECTED_NUMBERS if k[0].startswith("needle")}
    table = build.text.split("| task | metric |")[1].split("**average**")[0]
    assert table.count("not measured") == 25 and "0.667" in build.text


def test_lineage_recipe_and_tokens_from_the_training_record(tiny_student_dir, tmp_path):
    folder = shutil.copytree(tiny_student_dir, tmp_path / "instruct")
    (folder / "linzoo_training.json").write_text(json.dumps({
        "stage": "instruct", "parent": "tester/linzoo-gated-deltanet-base", "recipe": {"learning_rate": 2e-5, "epochs": 1},
        "tokens": {"attention_transfer": 1000000, "hidden_alignment": 2000000, "kd": 7000000},
        "dataset": "HuggingFaceTB/smoltalk", "final_losses": {"sft": 1.2345}}))
    (folder / "trainer_state.json").write_text(json.dumps({
        "global_step": 40, "num_input_tokens_seen": 655360, "log_history": [{"loss": 1.5}, {"loss": 1.25}]}))
    built = card.build_card(folder)
    assert built.data.base_model == "tester/linzoo-gated-deltanet-base"
    assert built.data.datasets == ["HuggingFaceTB/smoltalk"] and "instruct" in built.data.tags
    text = built.text
    assert "base → **instruct (this model)** → instruct-distilled" in text
    assert "| trainer_state.json: tokens seen | 655,360 |" in text and "| last logged loss (step 40) | 1.2500 |" in text
    assert "| kd | 7,000,000 |" in text and "| learning_rate | 2e-05 |" in text and "| sft | 1.2345 |" in text
    assert "apply_chat_template" in text

    # The record `linzoo sft` writes today.
    (folder / "linzoo_training.json").write_text(json.dumps({
        "stage": "instruct", "parent": "runs/gdn", "dataset": "embedded", "tokens": {"sft": 5000},
        "seconds": 12.5, "first_loss": 2.0, "final_loss": 1.5, "lora": False}))
    (folder / "trainer_state.json").unlink()
    text = card.build_card(folder).text
    assert "| sft | 5,000 |" in text and "| instruct | 1.5000 |" in text and "| lora | False |" in text
    assert "final_loss" not in text

    # The record the linearize trainer writes today (per-stage summaries), and a parent that is a local path.
    (folder / "linzoo_training.json").write_text(json.dumps({
        "stage": "instruct", "parent": str(tiny_student_dir), "dataset": "embedded", "total_tokens": 100,
        "tokens": {"stage1-attention-transfer": 10, "stage3-kd": 90},
        "stages": [{"stage": "stage3-kd", "final_loss": 2.5}]}))
    built = card.build_card(folder)
    assert built.data.base_model is None and built.data.datasets is None
    assert "| stage3-kd | 90 |" in built.text and "| stage3-kd | 2.5000 |" in built.text
    assert "| total_tokens | 100 |" in built.text and "Training data: embedded" in built.text
    checks = {c.name: c for c in plan.plan_checkpoint(folder, REPO, load_check=False).checks}
    assert not checks["base_model is a Hub id"].ok and "--base-model" in checks["base_model is a Hub id"].detail
    fixed = plan.plan_checkpoint(folder, REPO, base_model="tester/linzoo-gated-deltanet-base", load_check=False)
    assert fixed.ok


# ------------------------------------------------------------------------------------------ push


def test_dry_run_prints_the_plan(student, no_network, capsys):
    assert push.main([str(student), "--repo-id", REPO, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("DRY RUN, nothing is sent") and f"model repo {REPO}" in out
    for path in ("config.json", "model.safetensors", "tokenizer.json", "modeling_linzoo.py", "eval/quality.json",
                 "eval/niah.json", "eval/niah_heatmap.png"):
        assert f"{(student / path).stat().st_size:>13,}  {path}\n" in out
    assert "README.md  (generated)" in out
    assert f"    base_model: {TEACHER}" in out and "    model-index:" in out
    assert "      value: 0.6666666666666666" in out
    assert "[ok] loads with trust_remote_code in a fresh Python: LinzooForCausalLM (gated_deltanet)" in out
    assert "[ok] weights are safetensors only" in out and "[ok] card numbers equal the results files: 23" in out
    assert "FAIL" not in out


def test_load_check_catches_broken_remote_code(tiny_student_dir, tmp_path):
    folder = shutil.copytree(tiny_student_dir, tmp_path / "broken")
    (folder / "mixers.py").write_text("raise ImportError('mixers went missing')\n")
    check = plan.check_loads(folder)
    assert not check.ok and "mixers went missing" in check.detail


def test_pickles_are_refused_and_checkpoints_stay_home(student, fast_load_check, capsys):
    (student / "stage1-attention-transfer").mkdir()
    (student / "stage1-attention-transfer" / "optimizer.pt").write_bytes(b"\x80\x04")
    (student / "linzoo_run.json").write_text('{"teacher": "/home/me/teacher"}')  # a local run's arguments
    assert push.main([str(student), "--repo-id", REPO, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "not uploaded: linzoo_run.json, stage1-attention-transfer/" in out
    assert "linzoo_run.json" not in [path for path, _ in plan.upload_files(student)[0]]

    (student / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(plan.ReleaseError, match="a check failed; nothing was uploaded"):
        push.main([str(student), "--repo-id", REPO, "--dry-run"])
    captured = capsys.readouterr()
    assert "[FAIL] weights are safetensors only: refusing pickle files ['pytorch_model.bin']" in captured.out


def test_dry_run_never_runs_a_folders_own_python(student, tmp_path, capsys):
    """A hostile modeling file is refused by reading it: the load check that would import it does not run."""
    marker = tmp_path / "remote code ran"
    with open(student / "modeling_linzoo.py", "a") as f:
        f.write(f"\nimport pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")
    (student / "tokenization_evil.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")
    with pytest.raises(plan.ReleaseError, match="a check failed; nothing was uploaded"):
        push.main([str(student), "--repo-id", REPO, "--dry-run"])
    out = capsys.readouterr().out
    assert not marker.exists(), "the folder's own code ran"
    assert "[FAIL] Python files are linzoo 0.1.0's own modeling files: differs from linzoo's own in" in out
    assert "modeling_linzoo.py; not linzoo's: tokenization_evil.py" in out
    assert "[FAIL] loads with trust_remote_code in a fresh Python: not run" in out


def test_an_auto_map_outside_the_folders_files_is_refused(student):
    config = json.loads((student / "config.json").read_text())
    config["auto_map"]["AutoModelForCausalLM"] = "someone/else--modeling_evil.EvilForCausalLM"
    (student / "config.json").write_text(json.dumps(config))
    check = plan.check_code(student)
    assert not check.ok and "config.json auto_map 'someone/else--modeling_evil.EvilForCausalLM'" in check.detail


@pytest.mark.parametrize("repo_id", ["not a valid id!!", "../../etc/passwd", "a/b/c", "org/name.git"])
@pytest.mark.parametrize("dry_run", [True, False])
def test_repo_ids_the_hub_refuses_are_refused_first(student, repo_id, dry_run, monkeypatch):
    monkeypatch.setattr(plan, "check_loads", lambda folder: pytest.fail("checked the folder before the repo id"))
    with pytest.raises(plan.ReleaseError, match=f"{re.escape(repr(repo_id))} is not a Hub repo id: .*ORG/NAME"):
        push.main([str(student), "--repo-id", repo_id] + (["--dry-run"] if dry_run else []))


def test_push_checks_the_recorded_weights(student, fast_load_check, capsys):
    from linzoo.integrity import weights_record

    (student / "linzoo_training.json").write_text(json.dumps({"stage": "base", **weights_record(student)}))
    assert push.main([str(student), "--repo-id", REPO, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "[ok] files intact, weights as recorded: sha256 as recorded in linzoo_training.json" in out
    weights = student / "model.safetensors"
    with open(weights, "r+b") as f:
        f.seek(weights.stat().st_size // 2)
        f.write(bytes(1024))
    with pytest.raises(plan.ReleaseError, match="a check failed"):
        push.main([str(student), "--repo-id", REPO, "--dry-run"])
    out = capsys.readouterr().out
    assert f"[FAIL] files intact, weights as recorded: {weights} is not the file its run saved" in out


def test_card_mismatch_is_caught(student):
    built = card.build_card(student, REPO)
    edited = ModelCard(str(built).replace("value: 0.305", "value: 0.35"))
    check = plan.check_card(student, edited)
    assert not check.ok and "differ" in check.detail
    assert plan.check_card(student, built).ok


def test_no_token_says_how_to_log_in(student, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setattr(HfApi, "repo_exists", lambda *a, **k: pytest.fail("no Hub call without a token"))
    with pytest.raises(plan.ReleaseError) as err:
        push.main([str(student), "--repo-id", REPO])
    assert "hf auth login" in str(err.value) and "HF_TOKEN" in str(err.value)
    with pytest.raises(plan.ReleaseError, match="hf auth login"):
        push_zoo.main([str(tmp_path), "--org", "tester", "--execute"])


def test_a_rejected_token_is_never_printed(student, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)

    def unauthorized(self, repo_id, **kwargs):
        response = SimpleNamespace(status_code=401, headers={}, request=None)
        raise HfHubHTTPError(f"401 Unauthorized for {repo_id}", response=response)

    monkeypatch.setattr(HfApi, "repo_exists", unauthorized)
    with pytest.raises(plan.ReleaseError) as err:
        push.main([str(student), "--repo-id", REPO])
    captured = capsys.readouterr()
    assert "401" in str(err.value) and "hf auth login" in str(err.value)
    assert FAKE_TOKEN not in captured.out + captured.err + str(err.value)


class HubRecorder:
    """Stands in for the HfApi methods the release uses; records every call."""

    def __init__(self, monkeypatch, existing=(), files=()):
        self.calls, self.existing, self.files = [], set(existing), list(files)
        for name in ("repo_exists", "create_repo", "create_branch", "list_repo_files", "create_commit",
                     "add_space_variable", "create_collection", "add_collection_item"):
            monkeypatch.setattr(HfApi, name, getattr(self, name))
        monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)

    def named(self, name):
        return [kwargs for call, kwargs in self.calls if call == name]

    def repo_exists(self, repo_id, **kw):
        self.calls.append(("repo_exists", {"repo_id": repo_id, **kw}))
        return repo_id in self.existing

    def create_repo(self, repo_id, **kw):
        self.calls.append(("create_repo", {"repo_id": repo_id, **kw}))

    def create_branch(self, repo_id, **kw):
        self.calls.append(("create_branch", {"repo_id": repo_id, **kw}))

    def list_repo_files(self, repo_id, **kw):
        return self.files

    def create_commit(self, repo_id, operations, **kw):
        self.calls.append(("create_commit", {"repo_id": repo_id, "operations": operations, **kw}))
        url = f"https://huggingface.co/{repo_id}/commit/1"
        pr_url = url.replace("commit/1", "discussions/1") if kw["create_pr"] else None
        return SimpleNamespace(commit_url=url, pr_url=pr_url)

    def add_space_variable(self, repo_id, key, value, **kw):
        self.calls.append(("add_space_variable", {"repo_id": repo_id, "key": key, "value": value}))

    def create_collection(self, title, **kw):
        self.calls.append(("create_collection", {"title": title, **kw}))
        return SimpleNamespace(slug=f"{kw['namespace']}/linzoo-0123", url="https://huggingface.co/collections/x")

    def add_collection_item(self, slug, item_id, item_type, **kw):
        self.calls.append(("add_collection_item", {"slug": slug, "item_id": item_id, "item_type": item_type}))


def test_existing_repo_is_not_overwritten_without_a_flag(student, monkeypatch, capsys):
    hub = HubRecorder(monkeypatch, existing={REPO})
    with pytest.raises(plan.ReleaseError) as err:
        push.main([str(student), "--repo-id", REPO])
    assert "already exists" in str(err.value) and "--overwrite" in str(err.value) and "--create-pr" in str(err.value)
    assert [c for c, _ in hub.calls] == ["repo_exists"]  # refused before any check or write


def test_upload_sends_exactly_the_plan(student, fast_load_check, monkeypatch, capsys):
    hub = HubRecorder(monkeypatch)
    assert push.main([str(student), "--repo-id", REPO, "--private", "--revision", "v1"]) == 0
    assert hub.named("create_repo") == [{"repo_id": REPO, "repo_type": "model", "private": True, "space_sdk": None}]
    assert hub.named("create_branch")[0]["branch"] == "v1"
    (commit,) = hub.named("create_commit")
    assert commit["revision"] == "v1" and commit["create_pr"] is False
    sent = {op.path_in_repo: op for op in commit["operations"]}
    expected, _ = plan.upload_files(student)
    assert set(sent) == {path for path, _ in expected} | {"README.md"}
    readme = ModelCard(sent["README.md"].path_or_fileobj.decode())
    assert card_numbers(readme) == EXPECTED_NUMBERS
    assert "uploaded" in capsys.readouterr().out


def test_overwrite_deletes_stale_files_and_create_pr_opens_a_pr(student, fast_load_check, monkeypatch, capsys):
    hub = HubRecorder(monkeypatch, existing={REPO}, files=["old.bin", "config.json", ".gitattributes"])
    assert push.main([str(student), "--repo-id", REPO, "--overwrite"]) == 0
    (commit,) = hub.named("create_commit")
    deleted = [op.path_in_repo for op in commit["operations"] if isinstance(op, CommitOperationDelete)]
    assert deleted == ["old.bin"]
    assert not hub.named("create_repo")

    hub = HubRecorder(monkeypatch, existing={REPO})
    assert push.main([str(student), "--repo-id", REPO, "--create-pr"]) == 0
    assert hub.named("create_commit")[0]["create_pr"] is True and "discussions/1" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ the zoo


@pytest.fixture
def zoo(student, tmp_path):
    """<root>/gated_deltanet/{base,instruct}; the instruct folder records its parent as a local path."""
    root = tmp_path / "zoo"
    base = shutil.copytree(student, root / "gated_deltanet" / "base")
    instruct = shutil.copytree(student, root / "gated_deltanet" / "instruct", ignore=shutil.ignore_patterns("eval"))
    record = json.loads((instruct / "linzoo_training.json").read_text()) if (instruct / "linzoo_training.json").is_file() else {}
    (instruct / "linzoo_training.json").write_text(json.dumps({**record, "stage": "instruct", "parent": str(base)}))
    return root


@pytest.fixture(scope="module")
def linzoo_wheel(tmp_path_factory):
    """linzoo's wheel, built once from this checkout (test_push_zoo_dry_run_lists_the_matrix builds its own)."""
    return plan.build_wheel(tmp_path_factory.mktemp("wheel"))


def test_push_zoo_dry_run_lists_the_matrix(zoo, fast_load_check, no_network, capsys):
    assert push_zoo.main([str(zoo), "--org", "tester"]) == 0
    out = capsys.readouterr().out
    total = len(MIXER_CLASSES) * len(push_zoo.RELEASED)  # the three stages and the pure student, every mixer
    assert out.startswith("DRY RUN") and f"2 of {total} checkpoints found" in out
    assert "model repo tester/linzoo-gated-deltanet-base " in out
    assert "model repo tester/linzoo-gated-deltanet-instruct " in out
    assert "    base_model: tester/linzoo-gated-deltanet-base" in out  # the parent folder mapped to its repo
    missing = out.split("missing (not uploaded): ")[1].splitlines()[0].split(", ")
    assert len(missing) == total - 2 and {"xlstm/instruct-distilled", "gated_deltanet/instruct-distilled",
                                          "gated_deltanet/base-pure"} <= set(missing)
    space = out.split("space repo tester/linzoo-niah")[1]
    assert "results/gated_deltanet/base/niah.json" in space and "results/gated_deltanet/base/niah_heatmap.png" in space
    assert f"    - tester/linzoo-gated-deltanet-instruct\n    - {TEACHER}" in space and "sdk_version: 6.31.0" in space
    assert "  requirements.txt  (generated)" in space and re.search(r"\d  linzoo-0\.1\.0-py3-none-any\.whl\n", space)
    assert ("[ok] requirements.txt installs linzoo from the uploaded wheel: "
            "https://huggingface.co/spaces/tester/linzoo-niah/resolve/main/linzoo-0.1.0-py3-none-any.whl") in space
    assert "[ok] python_version fits the wheel's Requires-Python: python_version 3.11, Requires-Python >=3.11" in space
    assert "collection 'linzoo: linearized SmolLM2 students' in tester: 3 items" in out


def test_space_repo_gets_app_py_and_the_logic_comes_in_the_wheel(linzoo_wheel):
    """app.py imports `linzoo.spaces.niah.niah_space`: the Space repo carries app.py alone of the folder's Python (no
    second copy of the logic beside it), and the wheel the Space installs carries both."""
    planned = plan.plan_space(push_zoo.SPACE_DIR, "tester/linzoo-niah", ["embedded"], {}, linzoo_wheel)
    assert [path for path, _ in planned.files if path.endswith(".py")] == ["app.py"]
    with zipfile.ZipFile(linzoo_wheel) as wheel:
        assert {"linzoo/spaces/niah/app.py", "linzoo/spaces/niah/niah_space.py"} <= set(wheel.namelist())


def test_space_gets_the_results_of_evals_run_again_in_eval_subfolders(linzoo_wheel, tmp_path):
    """A zoo's instruct row keeps NIAH in eval/short, eval/chat, ...: the Space's results/ gets them beside eval/'s
    own (its "Measured results" tab reads results/ recursively), and nothing that is not an eval's file."""
    eval_dir = tmp_path / "gdn-instruct" / "eval"
    for sub in ("", "chat", "natural-short"):
        (eval_dir / sub).mkdir(parents=True, exist_ok=True)
        (eval_dir / sub / ("instruct.json" if not sub else "niah.json")).write_text("{}")
    (eval_dir / "chat" / "niah_heatmap.png").write_bytes(b"png")
    (eval_dir / "chat" / "notes.txt").write_text("not an eval's file")
    planned = plan.plan_space(push_zoo.SPACE_DIR, "tester/linzoo-niah", ["embedded"],
                              {"gated_deltanet/instruct": eval_dir}, linzoo_wheel)
    assert sorted(path for path, _ in planned.files if path.startswith("results/")) == [
        "results/gated_deltanet/instruct/chat/niah.json", "results/gated_deltanet/instruct/chat/niah_heatmap.png",
        "results/gated_deltanet/instruct/instruct.json", "results/gated_deltanet/instruct/natural-short/niah.json"]


def test_space_plan_checks_its_install(linzoo_wheel, tmp_path):
    space_dir = shutil.copytree(push_zoo.SPACE_DIR, tmp_path / "niah")
    models = ["tester/linzoo-gated-deltanet-base", "embedded"]
    planned = plan.plan_space(space_dir, "tester/linzoo-niah", models, {}, linzoo_wheel, private=True)
    assert planned.ok and planned.variables == {"LINZOO_SPACE_MODELS": ",".join(models)}
    assert "private Space's build may be refused the download of its own wheel" in planned.notes[0]
    requirements = (space_dir / "requirements.txt").read_text()
    (space_dir / "requirements.txt").write_text(requirements.replace("./linzoo-", "linzoo-"))
    readme = (space_dir / "README.md").read_text()
    (space_dir / "README.md").write_text(readme.replace('python_version: "3.11"\n', ""))
    failed = {c.name: c.detail for c in plan.plan_space(space_dir, "t/s", models, {}, linzoo_wheel).checks
              if not c.ok}
    assert failed == {"requirements.txt installs linzoo from the uploaded wheel":
                      f"0 lines match ./linzoo-<version>-*.whl in {space_dir / 'requirements.txt'}, 1 expected",
                      "python_version fits the wheel's Requires-Python":
                      "python_version not set (the Hub default), Requires-Python >=3.11"}


def test_push_zoo_execute_uploads_and_collects(zoo, linzoo_wheel, fast_load_check, monkeypatch, capsys):
    hub = HubRecorder(monkeypatch)
    assert push_zoo.main([str(zoo), "--org", "tester", "--execute", "--wheel", str(linzoo_wheel)]) == 0
    repos = ["tester/linzoo-gated-deltanet-base", "tester/linzoo-gated-deltanet-instruct", "tester/linzoo-niah"]
    assert [c["repo_id"] for c in hub.named("create_repo")] == repos
    assert hub.named("create_repo")[2]["space_sdk"] == "gradio"
    assert hub.named("add_space_variable") == [{"repo_id": "tester/linzoo-niah", "key": "LINZOO_SPACE_MODELS",
                                                "value": ",".join(repos[:2] + [TEACHER])}]
    assert [(c["item_id"], c["item_type"]) for c in hub.named("add_collection_item")] == list(
        zip(repos, ["model", "model", "space"], strict=True))
    assert hub.named("create_collection")[0]["namespace"] == "tester"
    sent = {op.path_in_repo: op.path_or_fileobj for op in hub.named("create_commit")[2]["operations"]}
    assert sent[linzoo_wheel.name] == str(linzoo_wheel)
    url = f"https://huggingface.co/spaces/tester/linzoo-niah/resolve/main/{linzoo_wheel.name}"
    assert f"\nlinzoo @ {url}\n" in sent["requirements.txt"].decode()


def test_push_zoo_refuses_before_uploading_anything(zoo, linzoo_wheel, fast_load_check, monkeypatch, capsys):
    hub = HubRecorder(monkeypatch, existing={"tester/linzoo-gated-deltanet-instruct"})
    with pytest.raises(plan.ReleaseError, match="already exists"):
        push_zoo.main([str(zoo), "--org", "tester", "--execute", "--wheel", str(linzoo_wheel)])
    assert not hub.named("create_commit") and not hub.named("create_repo")


def test_push_zoo_refuses_a_folder_of_another_mixer_and_bad_paths(zoo, linzoo_wheel, fast_load_check, no_network,
                                                                   capsys, tmp_path):
    """A gated_deltanet student in zoo/linear_attn/base was planned as tester/linzoo-linear-attn-base; a missing
    --wheel or --space-dir ended in the libraries' own errors. --base-model, which the plan's advice names, exists."""
    shutil.move(zoo / "gated_deltanet", zoo / "linear_attn")
    with pytest.raises(plan.ReleaseError, match=r"linear_attn/base holds a gated_deltanet student, not linear_attn"):
        push_zoo.main([str(zoo), "--org", "tester", "--wheel", str(linzoo_wheel)])
    shutil.move(zoo / "linear_attn", zoo / "gated_deltanet")
    with pytest.raises(plan.ReleaseError, match="--wheel .* is not a file"):
        push_zoo.main([str(zoo), "--org", "tester", "--wheel", str(tmp_path / "no.whl")])
    with pytest.raises(plan.ReleaseError, match="--space-dir .* holds no Space"):
        push_zoo.main([str(zoo), "--org", "tester", "--wheel", str(linzoo_wheel), "--space-dir", str(tmp_path)])
    assert push_zoo.main([str(zoo), "--org", "tester", "--wheel", str(linzoo_wheel), "--base-model", "my/teacher"]) == 0
    base = capsys.readouterr().out.split("model repo tester/linzoo-gated-deltanet-base")[1]
    assert "    base_model: my/teacher" in base.split("model repo")[0]
