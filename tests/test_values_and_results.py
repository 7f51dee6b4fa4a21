"""Issue 33, "nothing silently wrong": every bad value fails first (one validation pass before anything loads, leaving
no run record), eval data is checked with file and line, results name the weights they measured (cards and pushes use
only their folder's own), and a dry run refuses links that leave the folder. Tiny models only."""

import json
import os
import shutil

import pytest

from linzoo.evals import niah, quality
from linzoo.evals.common import weights_sha256
from linzoo.hub_cards import card, plan
from linzoo.trainers import linearize
from linzoo.trainers.common import RUN_FILE


def _argv(teacher, corpus, out, *extra):
    return ["--teacher", str(teacher), "--dataset", str(corpus / "text.txt"), "--total_tokens", "640",
            "--max_seq_length", "32", "--per_device_train_batch_size", "2", "--output_dir", str(out), *extra]


def _refused(argv, match, out):
    with pytest.raises(ValueError, match=match) as err:
        linearize.main(argv)
    assert "\n" not in str(err.value)
    assert not (out / RUN_FILE).exists()  # a failed validation leaves no run record
    return str(err.value)


@pytest.mark.parametrize("extra, match", [
    (("--attn_layers", "1", "1", "1"), r"--attn_layers 1 1 1: 1 given more than once"),
    (("--max_wall_seconds", "nan"), r"--max_wall_seconds nan: give a finite number"),
    (("--stage_learning_rates", "1e-3", "nan", "1e-4"), r"--stage_learning_rates .*finite"),
    (("--stage_learning_rates", "1e-3", "1e-4", "inf"), r"--stage_learning_rates .*finite"),
    (("--per_device_train_batch_size", "-2"), r"--per_device_train_batch_size -2: give at least 1"),
    (("--window_size", "1000000000"), r"--window_size 1000000000 is longer than the rows"),
    (("--kernel_backend", "fast"), r"--kernel_backend fast runs fla's CUDA kernels"),
    (("--kernel_backend", "quick"), r"invalid choice"),
])
def test_bad_values_fail_before_the_teacher_loads(extra, match, tmp_path, tiny_corpus, monkeypatch):
    import torch

    from linzoo import loading

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("a model loaded before the check"))
    _refused(_argv("embedded", tiny_corpus, tmp_path / "run", *extra), match, tmp_path / "run")


def test_yaml_values_keep_their_meaning(tmp_path, tiny_corpus, monkeypatch):
    """A YAML string is never split into characters (attn_layers "17" was layers [1, 7]; 17 crashed), numbers such as
    1e-3 (strings to YAML) are read as numbers, and a wrong type is one line, not 'unexpected TypeError'."""
    from linzoo.trainers.linearize_config import LinearizeConfig
    from linzoo.trainers.common import parse_config

    def parsed(yaml_text):
        path = tmp_path / "recipe.yaml"
        path.write_text(yaml_text)
        (cfg,) = parse_config(LinearizeConfig, ["--config", str(path), "--bf16", "false",
                                                 "--output_dir", str(tmp_path / "o")])
        return cfg

    assert parsed('attn_layers: "17"\n').attn_layers == [17]
    assert parsed("attn_layers: 17\n").attn_layers == [17]
    assert parsed("attn_layers: [3, 17]\n").attn_layers == [3, 17]
    assert parsed("stage_learning_rates: [1e-3, 1e-4, 3e-4]\n").stage_learning_rates == [1e-3, 1e-4, 3e-4]
    with pytest.raises(ValueError, match=r"--total_tokens.*'many'"):
        parsed("total_tokens: many\n")
    with pytest.raises(ValueError, match=r"^--total_tokens \[1, 2\]: give a whole number$"):
        parsed("total_tokens: [1, 2]\n")
    with pytest.raises(ValueError, match=r"^--chat_fraction \{'a': 1\}: give a number$"):
        parsed("chat_fraction: {a: 1}\n")
    with pytest.raises(ValueError, match=r"^--attn_layers 6 6: 6 given more than once"):
        parsed("attn_layers: [6, 6]\n")
    with pytest.raises(ValueError, match=r"^--max_wall_seconds nan: give a finite number$"):
        parsed("max_wall_seconds: .nan\n")


@pytest.mark.parametrize("argv, match", [
    (["--depths", "0.5,0.5"], r"--depths 0.5 given more than once"),
    (["--lengths", "128,128"], r"--lengths 128 given more than once"),
    (["--max_new_tokens", "0"], r"--max_new_tokens 0: give at least 1"),
    (["--samples_per_cell", "0"], r"--samples_per_cell 0: give at least 1"),
])
def test_niah_values_fail_first(argv, match, tmp_path, tiny_student_dir):
    with pytest.raises(ValueError, match=match):
        niah.main(["--model", str(tiny_student_dir), "--out", str(tmp_path / "n"), *argv])


@pytest.mark.parametrize("argv, match", [
    (["--heldout_tokens", "-5"], r"--heldout_tokens -5: give at least 0"),
    (["--limit", "0"], r"--limit 0: give at least 1"),
    (["--tasks", "piqa,piqa"], r"piqa given more than once"),
])
def test_quality_values_fail_first(argv, match, tmp_path, tiny_student_dir):
    with pytest.raises(ValueError, match=match):
        quality.main(["--model", str(tiny_student_dir), "--out", str(tmp_path / "q"), *argv])


def test_run_niah_never_reads_zero_new_tokens_as_the_default(tiny_student_dir):
    import linzoo

    model, tokenizer = linzoo.load_model(str(tiny_student_dir))
    with pytest.raises(ValueError, match="max_new_tokens 0: give at least 1"):
        niah.run_niah(model, tokenizer, [64], [0.0], samples_per_cell=1, max_new_tokens=0)


# ------------------------------------------------------------------------------------------ eval data


@pytest.mark.parametrize("row, match", [
    ({"query": "Q?", "choices": ["a", "b"], "gold": -1}, r"line 2: gold is -1, a hidden label: this split has no labels"),
    ({"query": "Q?", "choices": ["a", "b"], "gold": 2}, r"line 2: gold 2 is not an index of its 2 choices \(0-1\)"),
    ({"choices": ["a", "b"], "gold": 0}, r"line 2 lacks query: a piqa document has query, choices, gold"),
    ({"query": "Q?", "choices": "ab", "gold": 0}, r"line 2: choices must be a list of at least two texts"),
])
def test_eval_data_is_checked_with_file_and_line(row, match, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    good = {"query": "Q?", "choices": ["a", "b"], "gold": 0}
    (data / "piqa.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=match) as err:  # before any model loads: --model names nothing
        quality.main(["--model", "not-a-model-anywhere", "--tasks", "piqa", "--data_dir", str(data),
                      "--out", str(tmp_path / "q")])
    assert str(data / "piqa.jsonl") in str(err.value)


def test_the_shared_eval_sets_pass_the_check(eval_data_dir):
    from linzoo.evals.lm_eval_tasks.utils import read_rows

    for task in quality.TASKS:
        assert read_rows(eval_data_dir / f"{task}.jsonl")


# ------------------------------------------------------------------------------------------ results name their model


def _niah_of(model_spec) -> dict:
    return {"schema": niah.SCHEMA, "model": str(model_spec), "needle": "passkey", "prompt_format": "raw",
            "lengths": [512], "depths": [0.0], "samples_per_cell": 2, "accuracy": {"512": {"0": 1.0}},
            "mean_by_length": {"512": 1.0}, "overall": 1.0, "seed": 0}


def test_results_record_their_weights_and_cards_use_only_their_own(tiny_student_dir, tiny_teacher_dir, tmp_path,
                                                                      capsys):
    folder = shutil.copytree(tiny_student_dir, tmp_path / "student")
    # `eval niah --model <teacher> --out <student>/eval`: one word wrong; the card claimed NIAH 1.0
    path, _ = niah.save_niah(_niah_of(tiny_teacher_dir), folder / "eval")
    assert json.loads(path.read_text())["weights_sha256"] == weights_sha256(str(tiny_teacher_dir)) != weights_sha256(
        str(folder))
    assert card.read_results(folder)["niah"] is None
    assert card.main([str(folder)]) == 0
    out = capsys.readouterr().out
    assert "eval/niah.json left out: it measured" in out and "whose weights are not this folder's" in out
    assert not card.build_card(folder).data.eval_results
    check = plan.check_card(folder, card.build_card(folder))
    assert check.ok and "eval/niah.json left out" in check.detail

    niah.save_niah(_niah_of(folder), folder / "eval")  # the folder's own results count
    assert card.read_results(folder)["niah"]["overall"] == 1.0
    assert len(card.build_card(folder).data.eval_results) == 2

    (folder / "eval" / "niah.json").write_text(json.dumps({**_niah_of(folder), "weights_sha256": None}))
    assert card.read_results(folder)["niah"] is None  # no hash recorded: left out, not trusted


def test_cards_read_the_results_of_evals_run_again_in_eval_subfolders(tiny_student_dir, tiny_teacher_dir, tmp_path):
    """A zoo's instruct row has NIAH only in eval/short, eval/natural-short and eval/chat (`sub`): the card shows each,
    named by its variant, with its own heatmap, and its model-index holds each; eval/ itself says nothing of NIAH."""
    folder = shutil.copytree(tiny_student_dir, tmp_path / "student")
    se = {"overall_se": 0.1, "mean_by_length_se": {"512": 0.1}}
    natural = {**_niah_of(folder), **se, "variant": "natural", "overall": 0.25, "mean_by_length": {"512": 0.25}}
    niah.save_niah({**_niah_of(folder), **se, "variant": "passkey"}, folder / "eval" / "short")
    niah.save_niah(natural, folder / "eval" / "natural-short")
    niah.save_niah({**_niah_of(tiny_teacher_dir), **se, "variant": "chat"}, folder / "eval" / "chat")  # not its own
    (folder / "eval" / "natural-short" / "niah_heatmap.png").write_bytes(b"png")
    results, left_out = card.matching_results(folder)
    assert results["niah"] is None and results["niah/natural-short"]["overall"] == 0.25
    assert results["niah/short"]["overall"] == 1.0 and results["niah/chat"] is None
    assert left_out == ["eval/chat/niah.json left out: it measured " + repr(str(tiny_teacher_dir))
                        + ", whose weights are not this folder's"]
    built = card.build_card(folder)
    text = str(built)
    assert "### Needle in a haystack (natural variant)" in text and "(eval/natural-short/niah_heatmap.png)" in text
    assert text.count("### Needle in a haystack") == 2 and "| 512 | 0.25 |" in text and "| 512 | 1.00 |" in text
    assert {r.dataset_type for r in built.data.eval_results} == {"linzoo-niah-passkey", "linzoo-niah-natural"}
    check = plan.check_card(folder, built)
    assert check.ok and check.detail.startswith("4 numbers") and "niah.json missing" not in check.detail


def test_teacher_results_must_be_another_models(tiny_student_dir, tmp_path):
    own = tmp_path / "own"
    from linzoo.evals.common import write_json

    write_json({"schema": quality.SCHEMA, "model": str(tiny_student_dir), "tasks": {}}, own / "quality.json")
    with pytest.raises(ValueError, match=r"holds the results of --model .* itself .*: pass the teacher's quality.json"):
        quality.main(["--model", str(tiny_student_dir), "--teacher_results", str(own / "quality.json"),
                      "--out", str(tmp_path / "q")])
    copy = shutil.copytree(tiny_student_dir, tmp_path / "copy")  # the same weights under another name
    with pytest.raises(ValueError, match=r"itself \(the same weights\)"):
        quality.main(["--model", str(copy), "--teacher_results", str(own / "quality.json"), "--out", str(tmp_path / "q")])


def test_results_are_written_atomically(tmp_path, monkeypatch):
    from linzoo.evals import common

    path = common.write_json({"schema": "x", "value": 1}, tmp_path / "r.json")

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError):
        common.write_json({"schema": "x", "value": 2}, path)
    assert json.loads(path.read_text()) == {"schema": "x", "value": 1}  # the old file, whole
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left behind


def test_a_dry_run_refuses_links_that_leave_the_folder(tiny_student_dir, tmp_path):
    folder = shutil.copytree(tiny_student_dir, tmp_path / "student")
    secret = tmp_path / "token"
    secret.write_text("hf_secret")
    (folder / "notes.txt").symlink_to(secret)
    with pytest.raises(plan.ReleaseError, match=r"notes.txt is a link to .*token, outside .*: it would upload"):
        plan.upload_files(folder)
    (folder / "notes.txt").unlink()
    (folder / "notes.txt").symlink_to(folder / "config.json")  # a link inside the folder is fine
    assert "notes.txt" in [name for name, _ in plan.upload_files(folder)[0]]


def test_a_folder_with_non_finite_weights_never_loads_nor_cards(tiny_student_dir, tmp_path):
    """`card`, `eval` (load_for_eval) and the Space (load_model, safetensors only) refuse a NaN run's folder."""
    import torch
    from safetensors.torch import load_file, save_file

    import linzoo

    folder = shutil.copytree(tiny_student_dir, tmp_path / "nan")
    weights = load_file(folder / "model.safetensors")
    name = sorted(weights)[3]
    weights[name] = torch.full_like(weights[name], float("nan"))
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    for attempt in (lambda: linzoo.load_model(str(folder)), lambda: linzoo.load_model(str(folder), safetensors_only=True),
                    lambda: card.build_card(folder)):
        with pytest.raises(ValueError, match=rf"non-finite weights \({name} has NaN or inf\)"):
            attempt()


# ------------------------------------------------------------------------------------------ chats


def test_sft_reports_dropped_chats_and_reads_only_what_its_budget_needs(tmp_path, tiny_teacher_dir, capsys):
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from linzoo.data import load_chat_dataset
    from linzoo.trainers.common import chat_splits

    chats = tmp_path / "chats.jsonl"
    with open(chats, "w") as f:
        for i in range(60):
            turns = [{"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": f"Answer {i}."}]
            if i % 2:  # no roles: dropped, and said so
                turns = [{"content": t["content"]} for t in turns]
            f.write(json.dumps({"messages": turns}) + "\n")
    assert len(load_chat_dataset(str(chats))) + len(load_chat_dataset(str(chats), split="test")) == 30
    assert f"{chats}: dropped 30 of 60 chats" in capsys.readouterr().out
    tokenizer = AutoTokenizer.from_pretrained(tiny_teacher_dir)
    train = chat_splits(str(chats), tokenizer, SimpleNamespace(total_tokens=40, max_seq_length=64, seed=0))
    out = capsys.readouterr().out
    assert 1 <= len(train) < 10 and f"{len(train)} of " in out and "chats cover --total_tokens 40" in out
    assert set(train.column_names) == {"prompt", "completion"}
    assert len(chat_splits(str(chats), tokenizer, SimpleNamespace(total_tokens=10**6, max_seq_length=64, seed=0))) > 20


def test_whole_chats_keeps_only_chats_that_fit_the_row(tiny_teacher_dir, tmp_path, capsys):
    """A chat longer than --max_seq_length would lose its answer's end (or all of it) to the cut: by default only
    chats that fit whole train, and the line says how many were left out; none fitting is a one-line error."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from linzoo.trainers.common import chat_splits

    chats = tmp_path / "chats.jsonl"
    with open(chats, "w") as f:
        for i in range(40):
            answer = f"Answer {i}." + (" and so on" * 60 if i % 4 == 0 else "")
            f.write(json.dumps({"messages": [{"role": "user", "content": f"Question {i}?"},
                                             {"role": "assistant", "content": answer}]}) + "\n")
    tokenizer = AutoTokenizer.from_pretrained(tiny_teacher_dir)
    cfg = SimpleNamespace(total_tokens=10**6, max_seq_length=128, seed=0, whole_chats=True)
    train = chat_splits(str(chats), tokenizer, cfg)
    out = capsys.readouterr().out
    assert all("so on" not in row["completion"][0]["content"] for row in train)
    assert len(train) > 10 and "longer than --max_seq_length 128 left out" in out and "rows repeat" in out
    kept = chat_splits(str(chats), tokenizer, SimpleNamespace(**{**vars(cfg), "whole_chats": False}))
    assert any("so on" in row["completion"][0]["content"] for row in kept)
    with pytest.raises(ValueError, match="no chat of .* fits --max_seq_length 8 whole"):
        chat_splits(str(chats), tokenizer, SimpleNamespace(**{**vars(cfg), "max_seq_length": 8}))


def test_max_answer_tokens_keeps_only_short_answers(tiny_teacher_dir, tmp_path, capsys):
    """--max_answer_tokens: only chats whose answer (the completion) is that short train, counted apart from those too
    long for the row; the earlier answer turns do not count; no chat short enough is a one-line error."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from linzoo.trainers.common import chat_splits
    from linzoo.trainers.sft import LinzooSFTConfig

    chats = tmp_path / "chats.jsonl"
    with open(chats, "w") as f:
        for i in range(40):
            answer = f"Answer {i}." + (" and more" * 12 if i % 2 else "")
            f.write(json.dumps({"messages": [{"role": "user", "content": "Hi?"},
                                             {"role": "assistant", "content": "Hello there, ask me" + " more" * 12},
                                             {"role": "user", "content": f"Question {i}?"},
                                             {"role": "assistant", "content": answer}]}) + "\n")
    tokenizer = AutoTokenizer.from_pretrained(tiny_teacher_dir)
    cfg = SimpleNamespace(total_tokens=10**6, max_seq_length=256, seed=0, whole_chats=True, max_answer_tokens=8)
    train = chat_splits(str(chats), tokenizer, cfg)
    every = chat_splits(str(chats), tokenizer, SimpleNamespace(**{**vars(cfg), "max_answer_tokens": 0}))
    long = sum("more" in row["completion"][0]["content"] for row in every)
    assert long >= 10 and len(train) == len(every) - long
    assert all("more" not in row["completion"][0]["content"] for row in train)
    assert f"({long} with answers over --max_answer_tokens 8 left out)" in capsys.readouterr().out
    with pytest.raises(ValueError, match="no chat of .* has an answer of at most --max_answer_tokens 2 tokens"):
        chat_splits(str(chats), tokenizer, SimpleNamespace(**{**vars(cfg), "max_answer_tokens": 2}))
    with pytest.raises(ValueError, match="--max_answer_tokens -1: give a number of tokens >= 1, or 0"):
        LinzooSFTConfig(output_dir=str(tmp_path / "o"), max_answer_tokens=-1)


@pytest.mark.parametrize("recipe", ["135m/linearize.yaml", "360m/linearize.yaml", "1.7b/linearize.yaml", "sft.yaml",
                                    "distill_instruct.yaml"])
def test_every_recipe_parses_with_its_command(recipe, tmp_path):
    """Each YAML recipe through its command's own parser (unknown keys are errors): recipes/sft.yaml said
    warmup_ratio, which transformers 5 no longer has, and linearize's own warmup_ratio field was read by nothing."""
    from pathlib import Path

    from trl import ModelConfig

    from linzoo.trainers.common import parse_config
    from linzoo.trainers.distill_instruct_config import InstructDistillConfig
    from linzoo.trainers.linearize_config import LinearizeConfig
    from linzoo.trainers.sft import LinzooSFTConfig

    types = {"sft.yaml": (LinzooSFTConfig, ModelConfig), "distill_instruct.yaml": (InstructDistillConfig, ModelConfig)}
    path = Path(__file__).resolve().parents[1] / "recipes" / recipe
    parsed = parse_config(types.get(recipe, (LinearizeConfig,)), ["--config", str(path), "--bf16", "false",
                                                                 "--output_dir", str(tmp_path / "o")])
    assert parsed[0].total_tokens > 0


def test_an_eval_checks_free_space_before_it_starts(tiny_student_dir, tmp_path, monkeypatch):
    from collections import namedtuple

    from linzoo.evals import common

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(common.shutil, "disk_usage", lambda path: usage(10**9, 10**9, 2 * 10**6))
    with pytest.raises(ValueError, match=r"^the disk is full at .*: 2.0 MB free, an eval's results and figures need"):
        niah.main(["--model", str(tiny_student_dir), "--out", str(tmp_path / "n")])
