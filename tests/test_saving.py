"""Saving (issue 33): no non-finite weights are ever saved or marked done, results are written whole, a save the disk
has no room for is refused (and a full disk is one line), a finished run keeps only its model, and processes
converting one GGUF take turns."""

import errno
import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch

HUGE_LR = "1e39"  # finite (as --stage_learning_rates must be), but AdamW's first step in fp32 makes weights inf / NaN


def _argv(teacher, corpus, out, tokens, extra=()):
    return ["--teacher", str(teacher), "--dataset", str(corpus / "text.txt"), "--total_tokens", str(tokens),
            "--max_seq_length", "32", "--per_device_train_batch_size", "2", "--output_dir", str(out),
            "--logging_steps", "1", "--save_steps", "2", "--dataloader_pin_memory", "false", "--disable_tqdm", "true",
            "--calibration_tokens", "64", *extra]


def _files(folder):
    return sorted(str(p.relative_to(folder)) for p in Path(folder).rglob("*") if p.is_file() and p.name[0] != ".")


# --- non-finite weights ---------------------------------------------------------------------------------------------

def test_nonfinite_weights_of_the_last_stage_are_not_saved(tiny_teacher_dir, tiny_corpus, tmp_path):
    """Stage 3 of one step at a learning rate that overflows: its loss (computed before the update) is finite, so the
    loss check passed it, and the run saved the NaN student with its lineage and exited 0. Now the stage's save is
    refused in one line; stage 2, finite, stays the last good save."""
    from safetensors.torch import load_file

    from linzoo.trainers import linearize

    out = tmp_path / "run"
    argv = _argv(tiny_teacher_dir, tiny_corpus, out, 192, ("--stage_fractions", "1", "1", "1",
                                                           "--stage_learning_rates", "1e-3", "1e-4", HUGE_LR))
    with pytest.raises(FloatingPointError) as caught:
        linearize.main(argv)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("Non-finite weights (") and " has NaN or inf) at stage3-kd step 1 of 1: not saved; " in message
    assert message.endswith(f"the last good checkpoint, {out / 'stage2-hidden-alignment'}, is kept: the same command "
                            "with that fixed resumes from it. Lower --stage_learning_rates (stage 3 is 1e+39).")
    assert not (out / "model.safetensors").exists() and not (out / "linzoo_training.json").exists()
    assert not [f for f in _files(out / "stage3-kd")]  # no checkpoint, no model, no stage_done.json
    stage2 = load_file(out / "stage2-hidden-alignment" / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in stage2.values())
    assert (out / "stage2-hidden-alignment" / "stage_done.json").is_file()


def test_a_one_step_first_stage_of_nonfinite_weights_is_refused(tiny_teacher_dir, tiny_corpus, tmp_path, capsys):
    """A one-step stage 1 was marked done (stage_done.json) with NaN weights, and the run went on from them."""
    from linzoo import cli

    out = tmp_path / "run"
    argv = _argv(tiny_teacher_dir, tiny_corpus, out, 64, ("--stage_fractions", "1", "0", "0",
                                                          "--stage_learning_rates", HUGE_LR, "1e-4", "1e-4"))
    assert cli.main(["linearize", *argv]) == 2
    err = capsys.readouterr().err.splitlines()[-1]  # after the loaders' progress bars
    assert err.startswith("linzoo linearize: error: Non-finite weights (model.layers."), err
    assert ("at stage1-attention-transfer step 1 of 1: not saved; no good checkpoint was saved before it: the same "
            "command with that fixed starts over. Lower --stage_learning_rates (stage 1 is 1e+39).") in err
    assert _files(out) == ["linzoo_run.json"]


# --- finite weights, non-finite outputs; the corrected command goes on ----------------------------------------------

DIVERGING_LR = "1e30"  # one AdamW step leaves weights near 1e30: finite, but their products overflow


def test_finite_weights_whose_logits_are_not_are_not_saved_and_the_corrected_command_starts_over(
        tiny_teacher_dir, tiny_corpus, tmp_path, capsys):
    """A one-step stage 3 at 1e30 saved weights near 1e30 whose logits are all NaN, with its lineage, exit 0 (the
    weights' check passed them). Now the save is refused (exit 2, one line) and the same command with a lower rate,
    refused before as "other arguments", starts over in the same folder."""
    from linzoo import cli

    out = tmp_path / "run"
    argv = _argv(tiny_teacher_dir, tiny_corpus, out, 64, ("--stage_fractions", "0", "0", "1"))
    assert cli.main(["linearize", *argv, "--stage_learning_rates", "1e-3", "1e-4", DIVERGING_LR]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err == ("linzoo linearize: error: Non-finite outputs (100 % of its logits on a fixed 64-token probe are NaN "
                   "or inf) at stage3-kd step 1 of 1: not saved; no good checkpoint was saved before it: the same "
                   "command with that fixed starts over. Lower --stage_learning_rates (stage 3 is 1e+30)."), err
    assert _files(out) == ["linzoo_run.json"]
    assert cli.main(["linearize", *argv, "--stage_learning_rates", "1e-3", "1e-4", "1e-4"]) == 0
    assert "holds a linearize run that diverged (Non-finite outputs" in capsys.readouterr().out
    record = json.loads((out / "linzoo_training.json").read_text())
    assert [s["learning_rate"] for s in record["stages"]] == [1e-4]


def test_a_diverged_stage_is_not_done_and_the_corrected_command_goes_on_from_the_stage_before(
        tiny_teacher_dir, tiny_corpus, tmp_path, capsys):
    """Every stage at 1e30: stage 1 was kept as done (its loss is computed before its one update), the error named a
    checkpoint-0 that never existed, and the corrected command was refused. Now stage 1 is not done, and with stage 1
    at a sane rate and stage 2 diverging, the error names stage 1's folder, which the corrected command goes on from."""
    from linzoo import cli

    out = tmp_path / "run"
    argv = _argv(tiny_teacher_dir, tiny_corpus, out, 192, ("--stage_fractions", "1", "1", "1"))
    assert cli.main(["linearize", *argv, "--stage_learning_rates", *[DIVERGING_LR] * 3]) == 2
    assert "at stage1-attention-transfer step 1 of 1: not saved; no good checkpoint" in capsys.readouterr().err
    assert not (out / "stage1-attention-transfer" / "stage_done.json").exists()
    assert cli.main(["linearize", *argv, "--stage_learning_rates", "1e-3", DIVERGING_LR, "1e-4"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    stage1 = out / "stage1-attention-transfer"
    assert " at stage2-hidden-alignment step 1 of 1: not saved; the last good checkpoint, " \
           f"{stage1}, is kept: the same command with that fixed resumes from it." in err, err
    assert cli.main(["linearize", *argv, "--stage_learning_rates", "1e-3", "1e-4", "1e-4"]) == 0
    log = capsys.readouterr().out
    assert "stage1-attention-transfer already finished" in log and "that diverged" in log
    record = json.loads((out / "linzoo_training.json").read_text())
    assert [s["learning_rate"] for s in record["stages"]] == [1e-3, 1e-4, 1e-4]
    run = json.loads((out / "linzoo_run.json").read_text())
    assert run["changed_after_divergence"] == ["stage_learning_rates [1e+30, 1e+30, 1e+30] -> [0.001, 1e+30, 0.0001]",
                                               "stage_learning_rates [0.001, 1e+30, 0.0001] -> [0.001, 0.0001, 0.0001]"]
    # a finished run holds its arguments again: only a divergence lets the rate change
    assert cli.main(["linearize", *argv, "--stage_learning_rates", "1e-3", "1e-4", "1e-5"]) == 2
    assert "holds a linearize run with other arguments" in capsys.readouterr().err


def test_a_stage_resumed_after_a_nonfinite_loss_trains_at_the_corrected_rate(tiny_teacher_dir, tiny_corpus, tmp_path,
                                                                             monkeypatch, capsys):
    """A NaN loss at step 3 of 3 (checkpoint-2 saved): the error named checkpoint-2 only "if that step was saved", and
    a rerun at another rate, once allowed, would have taken the checkpoint's rate back with its scheduler's state."""
    from linzoo import cli
    from linzoo.trainers.linearize_trainer import KnowledgeDistillationTrainer

    real = KnowledgeDistillationTrainer.stage_loss

    def nan_at_step_3(self, model, inputs):
        loss = real(self, model, inputs)
        return loss * float("nan") if self.state.global_step == 2 else loss

    out = tmp_path / "run"
    argv = _argv(tiny_teacher_dir, tiny_corpus, out, 192, ("--stage_fractions", "0", "0", "1",
                                                           "--lr_scheduler_type", "constant"))
    with monkeypatch.context() as patch:
        patch.setattr(KnowledgeDistillationTrainer, "stage_loss", nan_at_step_3)
        assert cli.main(["linearize", *argv, "--stage_learning_rates", "1e-3", "1e-4", "1e-2"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("linzoo linearize: error: Non-finite loss (nan) at step 3 of KnowledgeDistillationTrainer: "
                          f"nothing was saved after it; the last good checkpoint, {out / 'stage3-kd' / 'checkpoint-2'}, "
                          "is kept: the same command with that fixed resumes from it. Lower --stage_learning_rates "
                          "(stage 3 is 0.01)"), err
    assert cli.main(["linearize", *argv, "--stage_learning_rates", "1e-3", "1e-4", "5e-3"]) == 0
    log = "".join(capsys.readouterr())
    assert "resuming stage3-kd from" in log and "checkpoint-2 was saved at learning rate 0.01; resuming at 0.005" in log
    assert "'learning_rate': '0.005'" in log  # step 3's log
    assert "'learning_rate': '0.01'" not in log


def test_a_model_is_judged_by_its_outputs_wherever_it_is_loaded(tiny_student_dir, tmp_path):
    """Weights scaled by 1e30 are finite; the logits they give are not. Loading (and so every eval, the Space and the
    card) refuses them."""
    import shutil

    from safetensors.torch import load_file, save_file

    import linzoo
    from linzoo.hub_cards import card

    folder = shutil.copytree(tiny_student_dir, tmp_path / "diverged")
    weights = {name: t * 1e30 for name, t in load_file(folder / "model.safetensors").items()}
    assert all(torch.isfinite(t).all() for t in weights.values())
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    lineage = folder / "linzoo_training.json"
    if lineage.is_file():  # the weights changed on purpose: their recorded sha256 goes
        record = json.loads(lineage.read_text())
        record.pop("weights_sha256", None)
        lineage.write_text(json.dumps(record))
    for attempt in (lambda: linzoo.load_model(str(folder)), lambda: card.build_card(folder)):
        with pytest.raises(ValueError, match=r"is no usable model \(non-finite outputs \(100 % of its logits on a "
                                             r"fixed 64-token probe are NaN or inf\)\)"):
            attempt()


# --- whole files, full disks --------------------------------------------------------------------------------------

def test_write_json_leaves_the_old_file_when_a_write_fails(tmp_path, monkeypatch):
    from linzoo.trainers import common

    path = tmp_path / "stage_done.json"
    common.write_json(path, {"steps": 1})

    def half(data, f, **kwargs):
        f.write('{"steps": ')
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(json, "dump", half)
    with pytest.raises(OSError, match="No space left"):
        common.write_json(path, {"steps": 2})
    assert json.loads(path.read_text()) == {"steps": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["stage_done.json"]  # no temporary file left


def test_a_save_without_room_on_the_disk_is_refused_before_writing(tiny_teacher_dir, tiny_corpus, tmp_path,
                                                                   monkeypatch, capsys):
    from linzoo import cli

    out = tmp_path / "run"
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=1000) if Path(p).is_relative_to(out)
                        else real(p))
    assert cli.main(["linearize", *_argv(tiny_teacher_dir, tiny_corpus, out, 192)]) == 1
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith(f"linzoo linearize: error: the disk is full at {out / 'stage1-attention-transfer'}: 0.0 MB "
                          "free, a save needs ~0.") and err.endswith(" MB; free space or pass another --output_dir"), err
    assert _files(out) == ["linzoo_run.json"]


@pytest.mark.parametrize("error, where", [
    (OSError(errno.ENOSPC, "No space left on device", "/data/run/model.safetensors"), "/data/run/model.safetensors"),
    (RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 1536 vs 1430"), "/data/run"),
    (RuntimeError("PytorchStreamWriter failed writing file data/3: file write failed"), "/data/run"),
    (RuntimeError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on '
                  'device" })'), "/data/run"),
], ids=["ENOSPC", "torch-pos", "torch-writer", "safetensors"])
def test_a_full_disk_is_one_line(error, where, monkeypatch, capsys):
    from linzoo import cli
    from linzoo.trainers import linearize

    def raising(err):
        def main(argv):
            raise err
        return main

    monkeypatch.setattr(linearize, "main", raising(error))
    assert cli.main(["linearize", "--output_dir", "/data/run"]) == 1
    assert capsys.readouterr().err == (f"linzoo linearize: error: the disk is full at {where}: free space and run the "
                                       "same command again (it resumes)\n")
    monkeypatch.setattr(linearize, "main", raising(RuntimeError("out of memory")))  # other errors: as they were
    assert cli.main(["linearize", "--output_dir", "/data/run"]) == 1
    assert capsys.readouterr().err.startswith("linzoo linearize: unexpected RuntimeError: out of memory (re-run")


# --- what a finished run keeps --------------------------------------------------------------------------------------

def test_a_finished_run_keeps_only_its_model_and_a_rerun_is_done(tiny_teacher_dir, tiny_corpus, tmp_path, capsys):
    """A finished 600-token run kept every stage's weights and checkpoints (optimizer states included): 2.5 GB for
    a 540 MB student. Now a stage's checkpoints go once it is saved, a stage's weights once the next stage is saved,
    and the rest once the student is; a run killed in stage 3 still resumes, and a finished one is done."""
    from linzoo.trainers import linearize
    from linzoo.trainers.linearize_trainer import KnowledgeDistillationTrainer

    out = tmp_path / "run"
    argv = _argv(tiny_teacher_dir, tiny_corpus, out, 600)  # stages of 1, 2 and 7 steps
    real, calls = KnowledgeDistillationTrainer.stage_loss, []

    def stopped_at_step_4(self, model, inputs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(self, model, inputs)

    KnowledgeDistillationTrainer.stage_loss = stopped_at_step_4
    try:
        with pytest.raises(KeyboardInterrupt):
            linearize.main(argv)
    finally:
        KnowledgeDistillationTrainer.stage_loss = real
    stage1, stage2, stage3 = (out / name for name, _ in linearize.STAGES)
    assert _files(stage1) == ["stage_done.json"]  # stage 2 is saved: stage 1's weights are not needed
    assert "model.safetensors" in _files(stage2) and not list(stage2.glob("*checkpoint-*"))
    assert (stage3 / "checkpoint-2").is_dir()
    (stage3 / "incomplete-checkpoint-3").mkdir()  # what a kill during a save leaves (`last_complete_checkpoint`)
    capsys.readouterr()
    assert linearize.main(argv) == 0
    log = capsys.readouterr().out
    assert "stage1-attention-transfer already finished\n" in log and f"loading {stage2}" in log
    assert f"resuming stage3-kd from {stage3 / 'checkpoint-2'}" in log
    assert [name for name in _files(out) if "/" in name] == [f"{s.name}/stage_done.json" for s in (stage1, stage2,
                                                                                                  stage3)]
    assert not [p for p in out.rglob("*") if "checkpoint" in p.name]
    assert {"model.safetensors", "config.json", "tokenizer.json", "linzoo_training.json"} <= set(_files(out))
    record = json.loads((out / "linzoo_training.json").read_text())
    assert [s["stage"] for s in record["stages"]] == [s.name for s in (stage1, stage2, stage3)]
    assert linearize.main(argv) == 0
    log = capsys.readouterr().out
    assert f"linzoo: already done: {out} holds the finished model" in log and "stage3-kd:" not in log


def test_a_finished_sft_run_keeps_no_checkpoint_and_a_rerun_is_done(tiny_teacher_dir, tiny_corpus, tmp_path,
                                                                    capsys):
    from linzoo.trainers import linearize, sft

    base = tmp_path / "base"
    assert linearize.main(_argv(tiny_teacher_dir, tiny_corpus, base, 192)) == 0
    out = tmp_path / "instruct"
    argv = ["--model_name_or_path", str(base), "--output_dir", str(out), "--dataset", str(tiny_corpus / "chat.jsonl"),
            "--total_tokens", "256", "--max_seq_length", "64", "--per_device_train_batch_size", "2",
            "--save_steps", "1", "--dataloader_pin_memory", "false", "--disable_tqdm", "true"]
    assert sft.main(argv) == 0
    assert (out / "linzoo_training.json").is_file() and not list(out.glob("*checkpoint-*"))
    capsys.readouterr()
    assert sft.main(argv) == 0
    assert f"linzoo: already done: {out}" in capsys.readouterr().out


# --- the teacher's conversion ---------------------------------------------------------------------------------------

def _convert_in_process(gguf, teacher, marks, barrier):
    """One process converting `gguf`, transformers' GGUF loading (the conversion's first steps) replaced by loading the
    tiny teacher, each conversion noted in the file `marks`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from linzoo import loading

    model, tokenizer = AutoModelForCausalLM.from_pretrained, AutoTokenizer.from_pretrained

    def load_model(path, gguf_file=None, **kwargs):
        with open(marks, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(1.0)  # both processes are past the check for a finished folder before either finishes
        return model(teacher, **kwargs)

    AutoModelForCausalLM.from_pretrained = load_model
    AutoTokenizer.from_pretrained = lambda path, gguf_file=None, **kwargs: tokenizer(teacher, **kwargs)
    barrier.wait()
    loading._converted_gguf(Path(gguf))


def test_two_processes_converting_one_gguf_take_turns(tiny_teacher_dir, tmp_path, monkeypatch):
    """Two processes converting `embedded` at once: both wrote the same temporary folder, one crashed in safetensors
    and left a 538 MB orphan. Now one converts while the other waits and finds it done; an orphan is removed."""
    import multiprocessing

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from linzoo import loading

    monkeypatch.setenv("LINZOO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # the children import this module for the target
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")  # its path, size and time name the converted folder; the loaders are stand-ins
    marks = tmp_path / "conversions.txt"
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    processes = [context.Process(target=_convert_in_process, args=(gguf, tiny_teacher_dir, marks, barrier))
                 for _ in range(2)]
    for p in processes:
        p.start()
    for p in processes:
        p.join(240)
    assert [p.exitcode for p in processes] == [0, 0]
    assert len(marks.read_text().split()) == 1  # converted once
    converted = tmp_path / "cache" / "converted"
    (folder,) = [p for p in converted.iterdir() if not p.name.startswith(".")]
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    orphan = converted / f"{folder.name}.tmp"  # an earlier linzoo's temporary folder, its process killed
    orphan.mkdir()
    (orphan / "model.safetensors").write_bytes(b"\0" * 1000)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("converted again"))
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda *a, **k: pytest.fail("converted again"))
    assert loading._converted_gguf(gguf) == folder
    assert [p.name for p in converted.iterdir() if not p.name.startswith(".")] == [folder.name]
