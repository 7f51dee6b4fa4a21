"""`linzoo` on bad input, run as a user would (a subprocess): one line on stderr naming the fix, exit code 2,
no traceback unless --debug / LINZOO_DEBUG=1.

Every case must fail before a model loads or training starts (the quality cases pass the tiny test student, so
a check that comes too late shows up as its loading bar rather than a long run), and none may download or
convert a teacher: each run gets its own empty LINZOO_CACHE and offline Hub access, and must leave the cache
empty. The runs start together (most of each is importing torch and transformers), the tests read their results.
"""

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from linzoo import cli
from linzoo.evals.niah import NiahArguments

# name -> arguments, or (arguments, LINZOO_DEBUG); "{data}/…" and "{student}" are filled in by `runs`
RUNS = {
    "unknown mixer": ["linearize", "--mixer", "nope"],
    "missing model": ["eval", "niah", "--model", "/no/such"],
    "missing card folder": ["card", "/no/such", "--repo-id", "a/b"],
    "negative NIAH length": ["eval", "niah", "--lengths", "-5"],
    "push missing folder": ["push", "/no/such", "--repo-id", "a/b", "--dry-run"],
    **{f"quality {kind} data_dir": ["eval", "quality", "--model", "{student}", "--data_dir", f"{{data}}/{kind}",
                                    "--heldout_tokens", "0", "--limit", "1", "--device", "cpu"]
       for kind in ("empty", "incomplete")},
    "NIAH past the positions": ["eval", "niah", "--model", "{teacher}", "--lengths", "600", "--device", "cpu"],
    "NIAH --out a file": ["eval", "niah", "--model", "{student}", "--lengths", "128", "--out", "{data}/a-file"],
    "quality --out a file": ["eval", "quality", "--model", "{student}", "--tasks", "piqa", "--out", "{data}/a-file"],
    "truncated weights": ["eval", "niah", "--model", "{data}/truncated", "--lengths", "128", "--device", "cpu"],
    "push bad repo id": ["push", "{student}", "--repo-id", "not a valid id!!", "--dry-run"],
    "push path repo id": ["push", "{student}", "--repo-id", "../../etc/passwd", "--dry-run"],
    "bad flag value": ["linearize", "--total_tokens", "abc"],
    "bad PEFT value": ["sft", "--use_peft", "--lora_r", "abc"],
    "misspelt flag": ["eval", "niah", "--lenghts", "256"],
    "misspelt YAML key": ["linearize", "--config", "{data}/typo.yaml"],
    "bad YAML value": ["linearize", "--config", "{data}/bad-value.yaml"],
    "Space missing model": ["space", "--models", "/no/such,embedded"],
    "ignored learning rate": ["linearize", "--learning_rate", "5"],
    "unknown command": ["lineariz", "--mixer", "gla"],
    "Space port out of range": ["space", "--port", "99999"],
    "heads past the positions": ["eval", "heads", "--model", "{teacher}", "--lengths", "100000", "--device", "cpu"],
    "unknown eval": ["eval", "nia"],
    "misspelt push-zoo flag": ["push-zoo", "--orgg", "me"],
    "push underscore spelling": ["push", "/no/such", "--repo_id", "a/b", "--dry_run"],
    "ignored max_steps": ["sft", "--model_name_or_path", "{student}", "--max_steps", "1"],
    "unknown dtype": ["eval", "niah", "--dtype", "fp8"],
    "zero batch": ["eval", "quality", "--batch_size", "0"],
    "missing teacher results": ["eval", "quality", "--teacher_results", "/no/such.json"],
    **({} if torch.cuda.is_available() else {"CUDA without a GPU": ["eval", "heads", "--device", "cuda"],
                                             "GPU recipe on a CPU": ["linearize", "--config",
                                                                     "{repo}/recipes/135m/linearize.yaml"]}),
    "--debug": ["eval", "niah", "--lengths", "-5", "--debug"],
    "LINZOO_DEBUG=1": (["eval", "niah", "--lengths", "-5"], "1"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_student_dir, tiny_teacher_dir):
    """name -> (exit code, stderr lines) of `python -m linzoo.cli ...` for every entry of RUNS."""
    data = tmp_path_factory.mktemp("eval-data")
    (data / "empty").mkdir()
    (data / "incomplete").mkdir()
    (data / "incomplete" / "lambada_openai.jsonl").write_text(
        json.dumps({"context": "The pass key is", "continuation": "42"}) + "\n")
    (data / "a-file").write_text("not a folder")
    (data / "typo.yaml").write_text("mixr: gla\ntotal_tokens: 1000\n")
    (data / "bad-value.yaml").write_text("total_tokens: lots\n")
    truncated = shutil.copytree(tiny_student_dir, data / "truncated")
    with open(truncated / "model.safetensors", "r+b") as f:
        f.truncate(1000)
    started = {}
    for name, spec in RUNS.items():
        args, debug = spec if isinstance(spec, tuple) else (spec, None)
        cwd = tmp_path_factory.mktemp("run")
        env = {k: v for k, v in os.environ.items() if k != "LINZOO_DEBUG"}
        env.update(LINZOO_CACHE=str(cwd / "linzoo-cache"), HF_HUB_OFFLINE="1")
        if debug:
            env["LINZOO_DEBUG"] = debug
        args = [a.format(data=data, student=tiny_student_dir, teacher=tiny_teacher_dir,
                         repo=Path(__file__).resolve().parents[1]) for a in args]
        started[name] = (cwd, subprocess.Popen([sys.executable, "-m", "linzoo.cli", *args], cwd=cwd, env=env,
                                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = {}
    for name, (cwd, proc) in started.items():
        _, stderr = proc.communicate(timeout=600)
        cache = cwd / "linzoo-cache"
        assert not cache.exists() or not any(cache.rglob("*")), f"{name}: fetched or converted something first"
        results[name] = proc.returncode, stderr.splitlines()
    return results


def assert_one_line(result, prefix, *fix, exit_code=2):
    code, lines = result
    text = "\n".join(lines)
    assert "Traceback" not in text, text
    assert "Loading weights" not in text, f"a model loaded before the input was checked:\n{text}"
    assert len(lines) == 1, text
    assert lines[0].startswith(prefix), lines[0]
    for words in fix:
        assert words in lines[0], lines[0]
    assert code == exit_code, (code, lines)


# name -> the line's prefix, words that name the fix
EXPECTED = {
    "unknown mixer": ("linzoo linearize: error:", "nope", "gated_deltanet", "xlstm"),
    "missing model": ("linzoo eval niah: error:", "/no/such", "folder", "Hub id", "embedded"),
    "missing card folder": ("linzoo card: error:", "/no/such", "config.json"),
    "negative NIAH length": ("linzoo eval niah: error:", "--lengths", "positive", "512,1024"),
    "quality empty data_dir": ("linzoo eval quality: error:", "--data_dir", "lambada_openai.jsonl", "piqa.jsonl"),
    "quality incomplete data_dir": ("linzoo eval quality: error:", "--data_dir", "winogrande.jsonl", "piqa.jsonl"),
    "NIAH past the positions": ("linzoo eval niah: error: --lengths 600:", "512 positions", "up to 496"),
    "NIAH --out a file": ("linzoo eval niah: error: --out", "a-file is not a folder", "give a folder"),
    "quality --out a file": ("linzoo eval quality: error: --out", "a-file is not a folder", "give a folder"),
    "truncated weights": ("linzoo eval niah: error:", "truncated/model.safetensors", "copy it again"),
    "push bad repo id": ("linzoo push: error: 'not a valid id!!' is not a Hub repo id", "ORG/NAME"),
    "push path repo id": ("linzoo push: error: '../../etc/passwd' is not a Hub repo id", "ORG/NAME"),
    # argparse printed its whole usage (~150 lines for the trainers) before the error; transformers "Some specified
    # arguments are not used by the HfArgumentParser", TRL "... or set `fail_with_unknown_args=False`"
    "bad flag value": ("linzoo linearize: error: argument --total_tokens", "'abc'", "linzoo linearize --help"),
    "bad PEFT value": ("linzoo sft: error: argument --lora_r", "'abc'", "linzoo sft --help"),
    "misspelt flag": ("linzoo eval niah: error: unknown option --lenghts (did you mean --lengths?)",),
    "misspelt YAML key": ("linzoo linearize: error: unknown key in the --config file: mixr (did you mean mixer?)",),
    "bad YAML value": ("linzoo linearize: error: argument --total_tokens", "'lots'"),
    "Space missing model": ("linzoo space: error: --models: '/no/such'", "config.json"),  # it served, then failed
    # trained on, silently with the stage learning rates / the token budget's steps
    "ignored learning rate": ("linzoo linearize: error: --learning_rate 5.0 has no effect", "--stage_learning_rates"),
    # the 15-line command list, never saying the command was unknown
    "unknown command": ("linzoo: unknown command 'lineariz' (did you mean 'linearize'?)", "linzoo --help"),
    "unknown eval": ("linzoo: unknown command 'eval nia' (did you mean 'eval niah'?)",),
    "Space port out of range": ("linzoo space: error: --port 99999", "1-65535"),  # was OverflowError from bind()
    "heads past the positions": ("linzoo eval heads: error: --lengths 100000:", "512 positions"),  # was a 40 GB alloc
    # argparse's usage block, then "the following arguments are required: --org"
    "misspelt push-zoo flag": ("linzoo push-zoo: error: unknown option --orgg (did you mean --org?)",),
    # --repo_id / --dry_run are spelt as the trainers' flags are: the folder is what is wrong here
    "push underscore spelling": ("linzoo push: error: /no/such",),
    "ignored max_steps": ("linzoo sft: error: --max_steps 1 has no effect", "--total_tokens"),
    "unknown dtype": ("linzoo eval niah: error: --dtype 'fp8'", "float32, bfloat16"),  # was AttributeError from torch
    "zero batch": ("linzoo eval quality: error: --batch_size 0", "at least 1"),  # was "range() arg 3 must not be zero"
    "missing teacher results": ("linzoo eval quality: error: --teacher_results /no/such.json is not a file",),
    "CUDA without a GPU": ("linzoo eval heads: error: --device cuda", "--device cpu"),  # was torch's AssertionError
    "GPU recipe on a CPU": ("linzoo linearize: error: --bf16 true", "--bf16 false"),  # was "assign use_cpu"
}


@pytest.mark.parametrize("name", [name for name in EXPECTED if name in RUNS])
def test_bad_input_is_one_line_naming_the_fix(runs, name):
    assert_one_line(runs[name], *EXPECTED[name])


def test_push_missing_folder_is_one_line(runs):
    assert_one_line(runs["push missing folder"], "linzoo push: error:", "/no/such", "config.json")


@pytest.mark.parametrize("name", ["--debug", "LINZOO_DEBUG=1"])
def test_debug_shows_the_traceback(runs, name):
    code, lines = runs[name]
    assert code == 1 and lines[0].startswith("Traceback"), "\n".join(lines)
    assert lines[-1].startswith("ValueError: --lengths '-5'"), lines[-1]


@pytest.mark.parametrize("lengths,depths", [("-5", "0"), ("0", "0"), ("512,abc", "0"), ("", "0"), ("512", "1.5"),
                                            ("512", "-0.1"), ("512", "nan"), ("512", "")])
def test_niah_arguments_refuse_bad_grids(lengths, depths, tiny_student_dir):
    with pytest.raises(ValueError, match="--lengths .*positive|--depths .*\\[0, 1\\]"):
        NiahArguments(lengths=lengths, depths=depths)
    NiahArguments(model=str(tiny_student_dir), lengths="512, 1024,", depths="0, 0.5,1")  # spaces, a trailing comma


# In-process: what cli.py does with exceptions that no command raises on purpose.

def fake_command(monkeypatch, main, module_name):
    module = types.ModuleType(module_name)
    module.main = main
    monkeypatch.setitem(sys.modules, module_name, module)
    monkeypatch.setitem(cli.COMMANDS, "fake", (module_name, "a test command"))
    monkeypatch.delenv("LINZOO_DEBUG", raising=False)
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # cli.main sets sys.argv for the command


def test_unexpected_exception_is_one_line_with_the_debug_hint(monkeypatch, capsys):
    def main(argv):
        raise TypeError("unsupported operand")

    fake_command(monkeypatch, main, "linzoo.fake")
    assert cli.main(["fake"]) == 1
    assert capsys.readouterr().err == ("linzoo fake: unexpected TypeError: unsupported operand (re-run with --debug or "
                                       "LINZOO_DEBUG=1 for the traceback)\n")
    with pytest.raises(TypeError):
        cli.main(["fake", "--debug"])


def test_input_error_from_inside_a_library_gets_the_debug_hint(monkeypatch, capsys):
    def main(argv):  # the raising frame belongs to a module outside linzoo, as a check deep in transformers would
        exec(compile("raise ValueError('bad shape\\n  (2, 3)')", "library.py", "exec"), {"__name__": "somelib"})

    fake_command(monkeypatch, main, "somelib")
    assert cli.main(["fake"]) == 2
    assert capsys.readouterr().err == ("linzoo fake: error: bad shape (2, 3) (re-run with --debug or LINZOO_DEBUG=1 "
                                       "for the traceback)\n")


def test_help_and_argparse_errors_keep_their_behaviour(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    assert cli.main(["eval", "--help"]) == 0 and "eval niah" in capsys.readouterr().out  # was: exit 2, on stderr
    assert cli.main(["eval"]) == 2 and "eval quality" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        cli.main(["card", "--help"])
    assert exit_.value.code == 0 and "usage: linzoo card" in capsys.readouterr().out
    # the missing folder is argparse's error, now one line (no usage block) like every other; --debug is taken out
    # of the command's arguments (no "unknown option --debug") and lets the error through
    assert cli.main(["card"]) == 2
    assert capsys.readouterr().err == ("linzoo card: error: the following arguments are required: folder "
                                       "(`linzoo card --help` lists the options)\n")
    with pytest.raises(ValueError, match="required: folder"):
        cli.main(["card", "--debug"])
