"""Trainers: losses (known values), YAML/CLI parsing, few-step runs of every trainer on tiny models, resume, errors."""

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from trl import TrlParser

from linzoo.modeling.mixers import DEFAULT_MIXER, MIXERS
from linzoo.trainers.linearize_config import LinearizeConfig
from linzoo.trainers.linearize_trainer import AttentionTransferTrainer, KnowledgeDistillationTrainer

RECIPES = Path(__file__).parent.parent / "recipes"


# --- losses ---------------------------------------------------------------------------------

def test_attention_transfer_loss_known_values():
    t = [torch.randn(2, 5, 8) * 10, torch.randn(2, 5, 8) * 0.1]  # very different scales per layer
    loss = AttentionTransferTrainer.attention_transfer_loss
    assert loss(t, t).item() == 0.0
    assert loss([torch.zeros_like(x) for x in t], t).item() == pytest.approx(1.0)  # normalised per layer
    doubled = loss([2 * x for x in t], t).item()
    assert doubled == pytest.approx(1.0)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.float)
    noisy = [x.clone() for x in t]
    noisy[0][0, 3:] += 100.0  # error only on masked-out positions
    assert loss(noisy, t, mask).item() == pytest.approx(0.0, abs=1e-6)


def test_kd_loss_known_values():
    torch.manual_seed(0)
    V, D = 11, 6
    head = torch.nn.Linear(D, V, bias=False)
    h = torch.randn(2, 7, D)
    labels = torch.randint(0, V, (2, 7))
    labels[0, :2] = -100
    kd = KnowledgeDistillationTrainer.kd_loss
    loss, ce, kl = kd(h, h, head, head, labels, temperature=2.0, alpha=0.5, chunk_size=3)
    assert kl.item() == pytest.approx(0.0, abs=1e-6)  # identical teacher and student
    keep = labels != -100
    assert ce.item() == pytest.approx(F.cross_entropy(head(h[keep]), labels[keep]).item(), rel=1e-5)
    assert loss.item() == pytest.approx(0.5 * ce.item(), rel=1e-5)
    other = torch.nn.Linear(D, V, bias=False)
    l1, _, kl1 = kd(h, h, head, other, labels, temperature=1.0, alpha=1.0, chunk_size=1)
    l2, _, kl2 = kd(h, h, head, other, labels, temperature=1.0, alpha=1.0, chunk_size=1000)
    ref = F.kl_div(F.log_softmax(head(h[keep]), -1), F.log_softmax(other(h[keep]), -1), log_target=True,
                   reduction="batchmean")
    assert kl1.item() == pytest.approx(ref.item(), rel=1e-5) and l1.item() == pytest.approx(l2.item(), rel=1e-5)
    h.requires_grad_(True)
    kd(h, h.detach(), head, other, labels, chunk_size=2)[0].backward()
    assert torch.isfinite(h.grad).all() and h.grad.abs().sum() > 0


def test_kd_loss_of_a_batch_without_labels_is_a_zero_that_backward_takes():
    """Chats whose completions truncation cut off leave a batch with no label; its loss is 0 and backward runs
    (it used to raise "element 0 of tensors does not require grad" on the hybrid's instruct distillation)."""
    head = torch.nn.Linear(6, 11, bias=False)
    h = torch.randn(1, 5, 6, requires_grad=True)
    loss, ce, kl = KnowledgeDistillationTrainer.kd_loss(h, h.detach(), head, head, torch.full((1, 5), -100))
    assert loss.item() == ce.item() == kl.item() == 0.0
    loss.backward()
    assert h.grad is not None and h.grad.abs().sum() == 0


# --- configs and recipes --------------------------------------------------------------------

@pytest.mark.parametrize("recipe", sorted(str(p.relative_to(RECIPES)) for p in RECIPES.glob("*/linearize.yaml")))
def test_recipes_parse_and_flags_override(recipe, tmp_path):
    """One recipe per size; `--mixer` picks any registered mixer, and the output folder follows it."""
    args = ["--config", str(RECIPES / recipe), "--total_tokens", "1234", "--bf16", "false"]
    (cfg,) = TrlParser(LinearizeConfig).parse_args_and_config(args)
    assert cfg.mixer == DEFAULT_MIXER and sum(cfg.stage_fractions) == pytest.approx(1.0)
    assert sum(cfg.stage_tokens()) <= 1234
    for mixer in MIXERS:
        (cfg,) = TrlParser(LinearizeConfig).parse_args_and_config([*args, "--mixer", mixer])
        assert cfg.mixer == mixer and cfg.output_dir == f"runs/{Path(cfg.teacher).name}/{mixer}/base"
    (cfg,) = TrlParser(LinearizeConfig).parse_args_and_config([*args, "--output_dir", str(tmp_path)])
    assert cfg.output_dir == str(tmp_path)


def test_chat_configs_take_linzoo_defaults(tmp_path):
    """`ChatRunArguments` overrides TRL's defaults by coming first among the bases (dataclass fields follow the
    MRO): this pins the effective defaults of both chat commands, so a reordered base list cannot change them."""
    from linzoo.trainers.common import ChatRunArguments
    from linzoo.trainers.distill_instruct_config import InstructDistillConfig
    from linzoo.trainers.sft import LinzooSFTConfig

    for cls in (LinzooSFTConfig, InstructDistillConfig):
        cfg = cls(output_dir=str(tmp_path))
        for f in dataclasses.fields(ChatRunArguments):
            # TrainingArguments turns "none" into [] and mirrors activation_checkpointing into its deprecated alias
            if f.name not in ("report_to", "gradient_checkpointing"):
                assert getattr(cfg, f.name) == f.default, (cls.__name__, f.name)
        assert cfg.report_to in ([], "none", ["none"])
        assert cfg.max_length == cfg.max_seq_length


def test_config_errors(tmp_path):
    with pytest.raises(ValueError, match="valid values are: 'linear_attn'|linear_attn, retnet"):
        LinearizeConfig(output_dir=str(tmp_path), mixer="mamba")
    with pytest.raises(ValueError, match="stage_fractions"):
        LinearizeConfig(output_dir=str(tmp_path), stage_fractions=[1.0])
    with pytest.raises(ValueError, match="kd_alpha"):
        LinearizeConfig(output_dir=str(tmp_path), kd_alpha=2.0)
    with pytest.raises(ValueError, match="--calibration_tokens -1: give at least 0"):
        LinearizeConfig(output_dir=str(tmp_path), calibration_tokens=-1)


# --- few-step runs on tiny models -----------------------------------------------------------

def _linearize_argv(teacher, corpus, out, mixer="gated_deltanet", tokens=3000, extra=()):
    return ["--teacher", str(teacher), "--mixer", mixer, "--dataset", str(corpus / "text.txt"),
            "--total_tokens", str(tokens), "--max_seq_length", "32", "--per_device_train_batch_size", "2",
            "--output_dir", str(out), "--logging_steps", "1", "--save_steps", "2", "--dataloader_pin_memory", "false",
            *extra]


def _loads(folder):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    out = model(torch.tensor([[1, 2, 3]])).logits
    assert torch.isfinite(out).all()
    return model


@pytest.mark.parametrize("mixer, attn_layers", [("gated_deltanet", ()), ("xlstm", ()), ("gated_deltanet", ("1",))],
                         ids=["gated_deltanet", "xlstm", "hybrid-attn1"])
def test_linearize_three_stages_then_resume(tiny_teacher_dir, tiny_corpus, tmp_path, mixer, attn_layers, capsys):
    from linzoo.trainers import linearize

    out = tmp_path / "run"
    extra = ("--attn_layers", *attn_layers) if attn_layers else ()
    # A run killed after stage 3's last step, before the stage was marked done: its checkpoints remain (stage 2's
    # weights too: a stage's weights go only once the next one is done), its "done" marker does not. The rerun skips
    # stages 1-2 and resumes stage 3 from the checkpoint at its last step, so nothing trains (the Trainer alone would
    # train one step more, logging another loss and saving checkpoint-<last + 1>).
    real = linearize.write_json

    def killed(path, data):
        if path.parent.name == "stage3-kd":
            raise KeyboardInterrupt
        return real(path, data)

    linearize.write_json = killed
    try:
        with pytest.raises(KeyboardInterrupt):
            linearize.main(_linearize_argv(tiny_teacher_dir, tiny_corpus, out, mixer, extra=extra))
    finally:
        linearize.write_json = real
    stage3 = out / "stage3-kd"
    last = max(int(p.name.split("-")[1]) for p in stage3.glob("checkpoint-*"))
    # the fresh student was fitted to the teacher on the first training rows (--calibration_tokens, default 4096)
    assert "fitted the fresh student" in capsys.readouterr().out
    assert linearize.main(_linearize_argv(tiny_teacher_dir, tiny_corpus, out, mixer, extra=extra)) == 0
    log = capsys.readouterr().out
    assert "stage1-attention-transfer already finished" in log and "resuming stage3-kd from" in log
    assert f"checkpoint-{last} is the last step: nothing left to train" in log
    assert not list(out.rglob("*checkpoint-*"))  # a saved stage keeps no checkpoint (nor optimizer states)
    record = json.loads((out / "linzoo_training.json").read_text())
    assert record["stage"] == "base" and record["mixer"] == mixer and record["parent"]
    assert "o_norm.weight" in record["new_parameters"] and "q_proj.weight" not in record["new_parameters"]
    assert [s["stage"] for s in record["stages"]] == [s for s, _ in linearize.STAGES]
    assert sum(record["tokens"].values()) >= 3000 * 0.9
    model = _loads(out)
    assert model.config.mixer == mixer and model.config.attn_layers == [int(i) for i in attn_layers]
    assert record["calibration_tokens"] == 4096 and record["repeat_every"] == 0
    assert model.config.conv_activation == "silu_qk"
    assert not hasattr(model.config, "linzoo_stage")  # lineage lives in linzoo_training.json
    # held-out perplexity where training started (measured before the kill, read back from a finished stage's summary
    # by the rerun) and where it
    # ended, beside the teacher's, on the same tokens of the text's test split
    probe = record["heldout_probe"]
    stage1 = json.loads((out / "stage1-attention-transfer" / "stage_done.json").read_text())
    assert probe["start"] == stage1["heldout_start"]
    assert probe["start"]["heldout_tokens"] == probe["end"]["heldout_tokens"] > 0
    assert probe["start"]["teacher_perplexity"] == pytest.approx(probe["end"]["teacher_perplexity"])
    assert probe["end"]["perplexity"] != probe["start"]["perplexity"]
    assert f"start {probe['start']['perplexity']:.1f} (" in log and f"end {probe['end']['perplexity']:.1f} (" in log
    # the closing summary: one line per stage, its speed labelled (loop's steady speed, or wall time)
    summary = [line for line in log.splitlines() if line.startswith("  stage")]
    assert len(summary) == 3 and all(line.endswith(("(steady)", "(wall)")) for line in summary)


def test_stage_deadline_shares_the_time_left_by_tokens():
    from linzoo.trainers.deadline import stage_deadline

    tokens = [100, 200, 700]
    assert stage_deadline(1000.0, tokens, 0, now=0.0) == pytest.approx(100.0)  # 10 % of the 1000 s left
    assert stage_deadline(1000.0, tokens, 1, now=50.0) == pytest.approx(50.0 + 950.0 * 2 / 9)  # stage 1 left 50 s over
    assert stage_deadline(1000.0, tokens, 2, now=400.0) == pytest.approx(1000.0)  # the last stage: all that is left
    assert stage_deadline(1000.0, tokens, 1, now=2000.0) == 2000.0  # past the deadline: stop after the first step


def test_linearize_stops_each_stage_at_the_deadline_and_saves(tiny_teacher_dir, tiny_corpus, tmp_path, capsys):
    from linzoo.trainers import linearize

    out = tmp_path / "run"
    # 1 s is over before stage 1 starts (loading, packing, the fitted start): every stage stops after its first step
    argv = _linearize_argv(tiny_teacher_dir, tiny_corpus, out, extra=("--max_wall_seconds", "1"))
    assert linearize.main(argv) == 0
    record = json.loads((out / "linzoo_training.json").read_text())
    assert [s["stage"] for s in record["stages"]] == [s for s, _ in linearize.STAGES]
    for s in record["stages"]:
        assert s["stopped_at_deadline"] and s["steps"] == 1 < s["planned_steps"], s
        assert s["tokens"] == 2 * 32 and (out / s["stage"] / "stage_done.json").is_file()  # saved where it stopped
    assert "stopped at its deadline after 1 of" in capsys.readouterr().out
    _loads(out)
    # the same run with another deadline resumes (here: is already done) instead of being refused as another run
    assert linearize.main(_linearize_argv(tiny_teacher_dir, tiny_corpus, out, extra=("--max_wall_seconds", "5"))) == 0
    assert "already done" in capsys.readouterr().out
    with pytest.raises(ValueError, match="--max_wall_seconds -1: give at least 0"):
        LinearizeConfig(output_dir=str(tmp_path), max_wall_seconds=-1)


def test_gradient_accumulation_keeps_the_loss_scale(tiny_teacher_dir, tiny_corpus, tmp_path):
    """Batch 2 x 1 and batch 1 x 2 accumulation log the same loss for the same rows (learning rate 0): our losses are
    per-micro-batch means, so the Trainer must divide them by the accumulation steps (it did not, since the model's
    forward takes **kwargs; a 2M-token H200 run logged 4x losses with 4 accumulation steps)."""
    from linzoo.trainers import linearize

    first = {}
    for batch, accum in [(2, 1), (1, 2)]:
        out = tmp_path / f"b{batch}"
        argv = _linearize_argv(tiny_teacher_dir, tiny_corpus, out, tokens=128, extra=(
            "--stage_fractions", "1", "0", "0", "--stage_learning_rates", "0", "0", "0", "--warmup_steps", "0"))
        argv[argv.index("--per_device_train_batch_size") + 1] = str(batch)
        assert linearize.main([*argv, "--gradient_accumulation_steps", str(accum)]) == 0
        first[batch] = json.loads((out / "linzoo_training.json").read_text())["stages"][0]["first_loss"]
    assert first[1] == pytest.approx(first[2], rel=0.25), first


def test_stage1_trains_only_mixers(tiny_teacher_dir):
    from linzoo import linearize as build
    from linzoo.loading import load_teacher
    from linzoo.trainers.linearize import set_trainable

    teacher, _ = load_teacher(str(tiny_teacher_dir))
    student = build(teacher, "kda", attn_layers=[1])
    set_trainable(student, "mixers")
    trainable = {n for n, p in student.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith("model.layers.0.self_attn.") for n in trainable)
    set_trainable(student, "all")
    assert all(p.requires_grad for p in student.parameters())


@pytest.mark.parametrize("attn_layers", [(), (0,)], ids=["linear", "hybrid-attn0"])
def test_teacher_forced_mixers_are_the_mixers_on_the_teachers_inputs(tiny_teacher_dir, attn_layers):
    """Stage 1's hooks give exactly each mixer applied to its teacher layer input, through the student's own
    forward; gradients reach the mixers and nothing else; the forward the user gets is left unhooked."""
    from linzoo import linearize as build
    from linzoo.loading import load_teacher
    from linzoo.trainers.linearize import set_trainable
    from linzoo.capture import mixer_io
    from linzoo.trainers.linearize_trainer import teacher_forced_mixers

    teacher, _ = load_teacher(str(tiny_teacher_dir))
    student = build(teacher, "gated_deltanet", attn_layers=list(attn_layers)).train()
    set_trainable(student, "mixers")
    ids = torch.randint(3, 50, (2, 11))
    io = [(v.input, v.output) for v in mixer_io(teacher, ids).values()]
    layers = [i for i in range(2) if i not in attn_layers]
    inputs = {i: io[i][0] + 0.1 * torch.randn_like(io[i][0]) for i in layers}  # not what the student would compute
    outs = teacher_forced_mixers(student, student.model.layers, inputs, ids, None)
    for i, out in zip(layers, outs):
        torch.testing.assert_close(out, student.model.layers[i].self_attn(inputs[i]))
    sum(o.pow(2).sum() for o in outs).backward()
    grads = {n for n, p in student.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert grads and all(n.startswith(tuple(f"model.layers.{i}.self_attn." for i in layers)) for n in grads)
    with torch.no_grad():
        torch.testing.assert_close(student(ids).logits, student(ids).logits)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in student.modules())


def test_sft_and_distill_instruct_smoke(tiny_teacher_dir, tiny_corpus, tmp_path):
    from linzoo.trainers import distill_instruct, linearize, sft

    base = tmp_path / "base"
    linearize.main(_linearize_argv(tiny_teacher_dir, tiny_corpus, base, tokens=600))
    common = ["--dataset", str(tiny_corpus / "chat.jsonl"), "--total_tokens", "256", "--max_seq_length", "64",
              "--per_device_train_batch_size", "2", "--logging_steps", "1", "--dataloader_pin_memory", "false"]
    assert sft.main(["--model_name_or_path", str(base), "--output_dir", str(tmp_path / "instruct"), *common]) == 0
    assert json.loads((tmp_path / "instruct" / "linzoo_training.json").read_text())["stage"] == "instruct"
    _loads(tmp_path / "instruct")
    assert sft.main(["--model_name_or_path", str(base), "--output_dir", str(tmp_path / "lora"), "--use_peft", "true",
                     "--lora_r", "4", "--lora_target_modules", "all-linear", *common]) == 0
    _loads(tmp_path / "lora")
    out = tmp_path / "distilled"
    assert distill_instruct.main(["--model_name_or_path", str(tmp_path / "instruct"), "--teacher",
                                  str(tiny_teacher_dir), "--output_dir", str(out), *common]) == 0
    record = json.loads((out / "linzoo_training.json").read_text())
    assert record["stage"] == "instruct-distilled" and record["parent"] == str(tmp_path / "instruct")
    _loads(out)


@pytest.mark.parametrize("command", ["sft", "distill-instruct"])
def test_a_chat_run_with_no_answer_token_to_learn_from_is_refused(finished_run, tiny_teacher_dir, tmp_path, command,
                                                                  capsys):
    """--whole_chats false with every chat longer than --max_seq_length cut each one before its answer: SFT trained on
    zero answer tokens (train_loss 0), saved "the instruct student" and exited 0. Now the count comes first."""
    from linzoo import cli

    chats = tmp_path / "long.jsonl"
    with open(chats, "w") as f:
        for i in range(20):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"Remember the river {i}. " * 12},
                                             {"role": "assistant", "content": "The pass key is 0123456789."}]}) + "\n")
    teacher = ["--teacher", str(tiny_teacher_dir)] if command == "distill-instruct" else []
    argv = [command, "--model_name_or_path", str(finished_run[0]), *teacher, "--dataset", str(chats),
            "--total_tokens", "256", "--per_device_train_batch_size", "2", "--dataloader_pin_memory", "false",
            "--whole_chats", "false"]
    out = tmp_path / "cut"
    assert cli.main([*argv, "--max_seq_length", "32", "--output_dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (f"linzoo {command}: error: --max_seq_length 32 with --whole_chats false cuts the chats before their "
                   "answers: no answer token is left to learn from; raise --max_seq_length, or drop --whole_chats "
                   "false to train on the chats that fit whole"), err
    assert not (out / "linzoo_training.json").exists()
    assert cli.main([*argv, "--max_seq_length", "128", "--output_dir", str(tmp_path / "whole")]) == 0
    assert "answer tokens to learn from, in" in capsys.readouterr().out


# --- errors ---------------------------------------------------------------------------------

def test_clear_errors(tiny_teacher_dir, tiny_corpus, tmp_path, monkeypatch):
    from linzoo.trainers import linearize

    with pytest.raises(ValueError, match="longer than the teacher allows"):
        linearize.main(_linearize_argv(tiny_teacher_dir, tiny_corpus, tmp_path / "a", extra=("--max_seq_length", "4096")))
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="(?i)empty|no .*text|0 rows"):
        linearize.main(["--teacher", str(tiny_teacher_dir), "--dataset", str(tmp_path / "empty.txt"),
                        "--output_dir", str(tmp_path / "b"), "--max_seq_length", "32"])
    with pytest.raises(ValueError, match="Unknown mixer"):
        linearize.main(_linearize_argv(tiny_teacher_dir, tiny_corpus, tmp_path / "c", mixer="mamba"))

    from linzoo.loading import load_teacher
    from transformers import AutoTokenizer

    teacher, tokenizer = load_teacher(str(tiny_teacher_dir))
    big = AutoTokenizer.from_pretrained(tiny_teacher_dir)
    big.add_tokens([f"extra{i}" for i in range(50)])
    with pytest.raises(ValueError, match="do not belong together"):
        linearize.check_compatible(teacher, big, 32)

    def nan_loss(self, model, inputs):
        return model(input_ids=inputs["input_ids"]).logits.sum() * float("nan")

    monkeypatch.setattr(linearize.HiddenAlignmentTrainer, "stage_loss", nan_loss)
    with pytest.raises(FloatingPointError, match="Non-finite loss .* at step 1 of HiddenAlignmentTrainer"):
        linearize.main(_linearize_argv(tiny_teacher_dir, tiny_corpus, tmp_path / "d"))
    assert (tmp_path / "d" / "stage1-attention-transfer" / "stage_done.json").is_file()  # earlier work kept


def test_teacher_runs_in_the_students_mixed_precision(tiny_teacher_dir, tiny_corpus, tmp_path, monkeypatch):
    """With --bf16 the frozen teacher runs in bf16 like the student (accelerate autocasts only the student's
    forward; the teacher and the KD projections ran in fp32 before `mixed_precision`)."""
    from transformers.models.llama import modeling_llama

    from linzoo import integrity
    from linzoo.trainers import linearize

    attention = modeling_llama.LlamaAttention
    original, dtypes, probing = attention.forward, set(), []

    def recording(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if not probing:  # the loader's output probe runs the teacher as it loads it, in fp32
            dtypes.add(out[0].dtype)
        return out

    def probe(model, real=integrity.nonfinite_outputs):
        probing.append(1)
        try:
            return real(model)
        finally:
            probing.pop()

    monkeypatch.setattr(integrity, "nonfinite_outputs", probe)

    argv = _linearize_argv(tiny_teacher_dir, tiny_corpus, tmp_path / "bf16", tokens=256,
                           extra=("--stage_fractions", "0", "0", "1", "--bf16", "true", "--use_cpu", "true",
                                  "--calibration_tokens", "0",  # the fit before training runs the fp32 teacher
                                  "--heldout_probe_tokens", "0"))  # and so do the held-out probes around it
    try:
        attention.forward = recording
        assert linearize.main(argv) == 0
    finally:
        attention.forward = original
    assert dtypes == {torch.bfloat16}, dtypes


def test_linearize_is_reproducible_under_its_seed(tiny_teacher_dir, tiny_corpus, tmp_path):
    """--seed fixes everything random in a run, the new mixer parameters' initialisation included."""
    from safetensors.torch import load_file

    from linzoo.trainers import linearize

    def run(name, seed):
        out = tmp_path / name
        linearize.main(_linearize_argv(tiny_teacher_dir, tiny_corpus, out, tokens=600, extra=("--seed", str(seed))))
        return load_file(out / "model.safetensors")

    a, b, c = run("a", 1), run("b", 1), run("c", 2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if "a_proj" in k or "A_log" in k)


def test_training_steps_read_nothing_back_from_the_device(tiny_teacher_dir, tiny_corpus, tmp_path, monkeypatch):
    """Between logs a stage's step makes no host sync that Python asks for (.item(), bool(), int(), float(),
    .tolist() of a tensor): the finite-loss check and the loss terms stay on the device until a log, and an all-ones
    attention mask is dropped on the host. Counted over a whole run of 2 and of 8 steps of each stage with one log at
    the end: the counts must be equal. (Not counted: transformers' own mask builder, which checks the Llama teacher's
    positions for packed sequences in every forward.)"""
    import sys

    from linzoo.trainers import linearize

    counts = {}

    def counting(name):
        original = getattr(torch.Tensor, name)

        def wrapper(self, *args, **kwargs):
            if not sys._getframe(1).f_code.co_filename.endswith("masking_utils.py"):
                counts[name] = counts.get(name, 0) + 1
            return original(self, *args, **kwargs)
        return wrapper

    runs = []
    for steps in (2, 8):
        with monkeypatch.context() as m:
            for name in ("item", "__bool__", "__int__", "__float__", "tolist"):
                m.setattr(torch.Tensor, name, counting(name))
            counts.clear()
            out = tmp_path / f"steps{steps}"
            assert linearize.main(_linearize_argv(
                tiny_teacher_dir, tiny_corpus, out, tokens=3 * steps * 64,
                extra=("--calibration_tokens", "0", "--stage_fractions", "1", "1", "1", "--logging_steps", "100",
                       "--save_steps", "100"))) == 0
            runs.append(dict(counts))
    stages = json.loads((tmp_path / "steps8" / "linzoo_training.json").read_text())["stages"]
    assert [s["steps"] for s in stages] == [8, 8, 8]
    assert runs[0] == runs[1], runs


# --- run folders: the arguments they hold, kills, bounds ------------------------------------

def _record(folder):
    return json.loads((folder / "linzoo_training.json").read_text())


@pytest.fixture(scope="module")
def finished_run(tiny_teacher_dir, tiny_corpus, tmp_path_factory):
    """A finished tiny linearize run (read-only for the tests: copy it to change it) and its argv."""
    from linzoo.trainers import linearize

    out = tmp_path_factory.mktemp("finished") / "run"
    argv = _linearize_argv(tiny_teacher_dir, tiny_corpus, out, tokens=600)
    assert linearize.main(argv) == 0
    return out, argv


def _with(argv, flag, value):
    argv = list(argv)
    argv[argv.index(flag) + 1] = str(value)
    return argv


def test_a_rerun_with_other_arguments_is_refused(finished_run, tmp_path, monkeypatch, capsys):
    """Another --mixer, --total_tokens, --dataset or --teacher into a finished folder reused its stages and exited 0
    with a record (and card) of a model that was never trained. Now: one line naming each differing key (old -> new)
    and the flag to start over, before anything loads."""
    import shutil

    import linzoo
    from linzoo import cli
    from linzoo.trainers import linearize

    out, argv = finished_run
    (tmp_path / "other.txt").write_text("Other text. " * 200)
    (tmp_path / "other-teacher").mkdir()
    with monkeypatch.context() as m:
        m.setattr(linzoo, "load_teacher", lambda *a, **k: pytest.fail("loaded the teacher"))
        for flag, value, shown in [("--mixer", "gla", "mixer 'gated_deltanet' -> 'gla'"),
                                   ("--total_tokens", 999999, "total_tokens 600 -> 999999"),
                                   ("--dataset", tmp_path / "other.txt", f"-> '{tmp_path / 'other.txt'}'"),
                                   ("--teacher", tmp_path / "other-teacher", f"-> '{tmp_path / 'other-teacher'}'")]:
            assert cli.main(["linearize", *_with(argv, flag, value)]) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and err.startswith(f"linzoo linearize: error: {out} holds a linearize run"), err
            assert shown in err and "--overwrite_output_dir true" in err and flag.strip("-") in err
    # the same arguments are the same run (here: all stages done, re-saved); flags that change how a run is logged or
    # saved, not what it computes, may differ
    shutil.copytree(out, tmp_path / "copy")
    assert linearize.main(_with(_with(argv, "--output_dir", tmp_path / "copy"), "--logging_steps", 7)) == 0


def test_a_killed_run_is_held_to_its_arguments_and_overwrite_starts_over(tiny_teacher_dir, tiny_corpus, tmp_path,
                                                                         monkeypatch, capsys):
    """The arguments are recorded when a run starts, so a run stopped in stage 2 (Ctrl-C here) cannot be finished with
    another mixer; --overwrite_output_dir deletes what it left and starts over: weights, config and record all of the
    new run."""
    from linzoo.trainers import linearize

    out = tmp_path / "run"
    argv = _linearize_argv(tiny_teacher_dir, tiny_corpus, out, tokens=600)
    with monkeypatch.context() as m:
        m.setattr(linearize.HiddenAlignmentTrainer, "stage_loss", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            linearize.main(argv)
    assert (out / "stage1-attention-transfer" / "stage_done.json").is_file()
    with pytest.raises(ValueError, match="mixer 'gated_deltanet' -> 'gla'"):
        linearize.main(_with(argv, "--mixer", "gla"))
    capsys.readouterr()
    assert linearize.main([*_with(argv, "--mixer", "gla"), "--overwrite_output_dir", "true"]) == 0
    log = capsys.readouterr().out
    assert "deleted the earlier run" in log and "already finished" not in log
    assert json.loads((out / "config.json").read_text())["mixer"] == _record(out)["mixer"] == "gla"
    stage1 = json.loads((out / "stage1-attention-transfer" / "stage_done.json").read_text())
    assert stage1 == _record(out)["stages"][0]  # the stage was run again, not reused


def test_a_run_stopped_by_bad_input_leaves_its_folder_to_the_corrected_command(tiny_teacher_dir, tiny_corpus, tmp_path):
    """A mistyped --dataset (or any input refused before a stage writes anything) recorded its arguments in the folder
    and then refused the corrected command as "a run with other arguments"."""
    from linzoo.trainers import linearize

    out = tmp_path / "run"
    argv = _linearize_argv(tiny_teacher_dir, tiny_corpus, out, tokens=600)
    with pytest.raises(ValueError, match="missing.jsonl"):
        linearize.main(_with(argv, "--dataset", tmp_path / "missing.jsonl"))
    assert [p.name for p in out.iterdir() if not p.name.startswith(".")] == []
    assert linearize.main(argv) == 0 and _record(out)["mixer"] == "gated_deltanet"


def test_a_run_never_writes_into_the_model_it_reads(finished_run, tiny_corpus, tmp_path):
    """sft --output_dir = --model_name_or_path was refused as "another run", and the refusal's own advice,
    --overwrite_output_dir true, then deleted the student it was to tune."""
    import shutil

    from linzoo.trainers import sft

    base = shutil.copytree(finished_run[0], tmp_path / "base")
    before = sorted(p.name for p in base.iterdir())
    common = ["--dataset", str(tiny_corpus / "chat.jsonl"), "--total_tokens", "128", "--max_seq_length", "64",
              "--per_device_train_batch_size", "2", "--overwrite_output_dir", "true"]
    for out in (base, tmp_path):  # the model's own folder, and one that holds it
        with pytest.raises(ValueError, match=r"--output_dir .* the model it reads \(--model_name_or_path"):
            sft.main(["--model_name_or_path", str(base), "--output_dir", str(out), *common])
    assert sorted(p.name for p in base.iterdir()) == before


def test_sft_and_distill_instruct_refuse_a_folder_of_other_arguments(finished_run, tiny_teacher_dir, tiny_corpus,
                                                                     tmp_path):
    from linzoo.trainers import distill_instruct, sft

    base, _ = finished_run
    common = ["--dataset", str(tiny_corpus / "chat.jsonl"), "--total_tokens", "128", "--max_seq_length", "64",
              "--per_device_train_batch_size", "2", "--logging_steps", "1", "--dataloader_pin_memory", "false"]
    out = tmp_path / "instruct"
    assert sft.main(["--model_name_or_path", str(base), "--output_dir", str(out), *common]) == 0
    with pytest.raises(ValueError, match=r"holds a sft run .*total_tokens 128 -> 256"):
        sft.main(["--model_name_or_path", str(base), "--output_dir", str(out), *_with(common, "--total_tokens", 256)])
    with pytest.raises(ValueError, match=r"holds a sft run .*command 'sft' -> 'distill-instruct'"):
        distill_instruct.main(["--model_name_or_path", str(base), "--teacher", str(tiny_teacher_dir),
                               "--output_dir", str(out), *common])


def test_card_refuses_weights_and_record_that_disagree(tiny_student_dir, tmp_path):
    """A folder whose config.json (what the weights are) and linzoo_training.json (what the run says) name other mixers
    or teachers gets no card: it would describe a model that does not exist."""
    import shutil

    from linzoo.hub_cards.card import build_card

    folder = tmp_path / "student"
    shutil.copytree(tiny_student_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "linzoo_training.json").write_text(json.dumps(
        {"stage": "base", "mixer": config["mixer"], "teacher": config["teacher"], "tokens": {"stage3-kd": 999999}}))
    build_card(folder)  # agreeing: fine
    for key, value in [("mixer", "gla"), ("teacher", "someone/else")]:
        record = {"stage": "base", "mixer": config["mixer"], "teacher": config["teacher"], key: value}
        (folder / "linzoo_training.json").write_text(json.dumps(record))
        with pytest.raises(ValueError, match=f"{key} {config[key]!r} in config.json, {value!r} in linzoo_training"):
            build_card(folder)


# Crash safety: a kill at any point, a checkpoint's save included, and the rerun ends where an unkilled run ends.

def _killed_at(folder, kind, count, seed, log):
    """Makes this process record its events in `log` (a JSON file): each training step and each file written under
    `folder`, by kind ("step", "open", "torch.save", "safetensors": what wrote it). It SIGKILLs itself at event number
    `count` of `kind`, that file first cut to a seeded random length (a write the kill interrupted: a write is counted
    when it completes, so cut short it is the same as a kill during it)."""
    import builtins
    import io
    import random
    import signal

    from transformers import modeling_utils

    from linzoo.trainers.linearize_trainer import TeacherStudentTrainer

    folder, events, real_open = Path(folder).resolve(), [], builtins.open

    def tick(what, path=None):
        events.append(what)
        if what == kind and events.count(kind) == count:
            if path is not None:
                os.truncate(path, random.Random(seed).randrange(os.path.getsize(path) + 1))
            where = f"{what} {Path(path).relative_to(folder)}" if path else what
            log.write_text(json.dumps([*events[:-1], where]))
            os.kill(os.getpid(), signal.SIGKILL)

    def ours(path):
        return isinstance(path, (str, os.PathLike)) and Path(path).resolve().is_relative_to(folder)

    def saver(save, kind):
        def wrapped(obj, path, *args, **kwargs):
            result = save(obj, path, *args, **kwargs)
            if ours(path):
                tick(kind, path)
            return result
        return wrapped

    class Tracked:
        def __init__(self, file, path):
            self._file, self._path = file, path

        def __getattr__(self, name):
            return getattr(self._file, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.close()

        def close(self):
            if not self._file.closed:
                self._file.close()
                tick("open", self._path)

    def tracked_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        return Tracked(f, file) if set(mode) & set("wax+") and ours(file) else f

    def step(self, *args, **kwargs):
        tick("step")
        return real_step(self, *args, **kwargs)

    real_step = TeacherStudentTrainer.training_step
    builtins.open = io.open = tracked_open
    torch.save = saver(torch.save, "torch.save")
    modeling_utils.safe_save_file = saver(modeling_utils.safe_save_file, "safetensors")
    TeacherStudentTrainer.training_step = step
    return events


RUN_TIMEOUT = 300  # seconds for one run of the fault test (each takes a few)


def _killed_run(out, kind, count, log, teacher, corpus):
    """One run of the fault test, in its own process: killed at event `count` of `kind` (none: left to finish),
    its events written to `log` when it finishes."""
    from linzoo.trainers import linearize

    events = _killed_at(out, kind, count, count, log)
    linearize.main(_linearize_argv(teacher, corpus, out, tokens=384, extra=(
        "--save_steps", "1", "--logging_steps", "1", "--calibration_tokens", "64", "--disable_tqdm", "true")))
    log.write_text(json.dumps(events))


def test_kills_anywhere_then_rerun_end_as_an_unkilled_run(tiny_teacher_dir, tiny_corpus, tmp_path, monkeypatch):
    """20+ SIGKILLs at seeded points of a tiny 3-stage run that checkpoints every step (most points fall in a save:
    weights, optimizer, scheduler, RNG, trainer state, a stage's marker, the final model); after each kill the run is
    started again (killed again at a new point, or left to finish). Every finished run has the unkilled run's weights
    (bit for bit) and stage losses. Before, a kill during a checkpoint's save stranded the run: every rerun took the
    half-written checkpoint and failed. Each run is its own process: a kill leaves no state behind but the files."""
    import multiprocessing
    import random

    from safetensors.torch import load_file

    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")  # each run a fork: no thread pool to inherit, no warning
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # the forkserver imports this module for _killed_run

    context = multiprocessing.get_context("forkserver")  # a clean single-threaded parent for every run: a plain
    context.set_forkserver_preload(["torch", "transformers", "trl"])  # fork from pytest (threads of earlier tests
    # holding locks) once hung a child for good in a futex; the preload keeps each start cheap

    def run(out, kind=None, count=0):
        """(exit code, the run's events; the last one where it was killed)."""
        log = tmp_path / "events.json"
        log.unlink(missing_ok=True)
        process = context.Process(target=_killed_run, args=(out, kind, count, log, tiny_teacher_dir, tiny_corpus))
        process.start()
        process.join(RUN_TIMEOUT)
        if process.is_alive():
            process.kill()
            pytest.fail(f"a run of the fault test did not end in {RUN_TIMEOUT} s (killed at {kind} {count})")
        return process.exitcode, json.loads(log.read_text()) if log.is_file() else None  # None: it failed

    def result(out):
        losses = [(s["stage"], s["first_loss"], s["final_loss"]) for s in _record(out)["stages"]]
        return losses, load_file(out / "model.safetensors")

    kinds = ("step", "open", "torch.save", "safetensors")
    code, events = run(tmp_path / "plain")
    assert code == 0 and set(events) == set(kinds), (code, events)
    expected_losses, expected_weights = result(tmp_path / "plain")
    rng, killed = random.Random(0), []  # killed: where each chain's kills fell
    while sum(map(len, killed)) < 20:
        out, chain = tmp_path / f"chain{len(killed)}", []
        while True:
            kind = rng.choice(kinds)  # a point among the first half of the (unkilled) run's events of that kind
            code, log = run(out, kind, rng.randint(1, max(1, events.count(kind) // 2)))
            if code == 0:
                break
            assert code == -9, (code, chain)  # killed; anything else: the rerun failed
            chain.append(log[-1])
        killed.append(chain)
        losses, weights = result(out)
        assert losses == expected_losses, (chain, losses, expected_losses)
        assert weights.keys() == expected_weights.keys()
        assert all(torch.equal(weights[k], expected_weights[k]) for k in weights), chain
    assert {where.split()[0] for chain in killed for where in chain} == set(kinds), killed


def test_resume_takes_the_newest_complete_checkpoint_and_moves_the_rest_aside(tmp_path, capsys):
    """A checkpoint counts when its trainer_state.json (the Trainer's last write into it) reads back at its step;
    newer ones, half-written by a killed run, are moved aside (never deleted) with a line each."""
    from linzoo.trainers.common import last_complete_checkpoint

    def checkpoint(step, state):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "optimizer.pt").write_bytes(b"\0" * 10)
        if state is not None:
            (folder / "trainer_state.json").write_text(state)
        return folder

    checkpoint(2, json.dumps({"global_step": 2}))
    checkpoint(4, json.dumps({"global_step": 4}))
    checkpoint(6, json.dumps({"global_step": 6})[:9])  # killed while writing its state
    checkpoint(8, None)  # killed before
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-4")
    out = capsys.readouterr().out.splitlines()
    assert [line.split(" is incomplete")[0] for line in out] == [f"linzoo: {tmp_path}/checkpoint-{s}" for s in (8, 6)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint-2", "checkpoint-4", "incomplete-checkpoint-6", "incomplete-checkpoint-8"]
    assert (tmp_path / "incomplete-checkpoint-6" / "optimizer.pt").read_bytes() == b"\0" * 10
    checkpoint(6, None)  # killed at the same step again: a second folder beside the first
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-4")
    assert (tmp_path / "incomplete-checkpoint-6-2").is_dir()
    assert last_complete_checkpoint(tmp_path / "none") is None


def test_a_budget_far_beyond_the_data_needs_a_flag(tiny_teacher_dir, tiny_corpus, tmp_path, monkeypatch, capsys):
    """--total_tokens 10^12 on a few thousand tokens planned billions of steps without a word; now the epochs are
    printed and more than 20 are refused (before the fit to the teacher) unless --allow_many_epochs."""
    import linzoo
    from linzoo.trainers import linearize
    from linzoo.trainers.common import check_epochs

    monkeypatch.setattr(linzoo, "linearize", lambda *a, **k: pytest.fail("went on to build the student"))
    argv = _linearize_argv(tiny_teacher_dir, tiny_corpus, tmp_path / "run", tokens=10**12)
    with pytest.raises(ValueError, match=r"--total_tokens 1,000,000,000,000 is [\d,]+ passes over the data .*"
                                         r"--allow_many_epochs true"):
        linearize.main(argv)
    assert " epochs" in capsys.readouterr().out
    cfg = LinearizeConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, allow_many_epochs=True)
    check_epochs(cfg, steps=1000, rows=10)  # 200 epochs, allowed
    assert "= 200.00 epochs" in capsys.readouterr().out
    cfg.allow_many_epochs = False
    check_epochs(cfg, steps=100, rows=10)  # 20: the bound itself is allowed
    with pytest.raises(ValueError, match="passes over the data"):
        check_epochs(cfg, steps=101, rows=10)


@pytest.mark.parametrize("where", ["a file", "under a file", "read-only", "in use"])
def test_an_unusable_output_dir_fails_before_any_work(tiny_teacher_dir, tiny_corpus, tmp_path, monkeypatch, capsys,
                                                      where):
    """A file, a path under a file, a read-only folder, a folder another run holds: one line, exit 2, before the
    teacher loads (a read-only folder surfaced only at the first save, after the calibration)."""
    from filelock import FileLock

    import linzoo
    from linzoo import cli
    from linzoo.trainers.common import LOCK_FILE

    out = tmp_path / "out"
    if where == "a file":
        out.write_text("not a folder")
    elif where == "under a file":
        (tmp_path / "file").write_text("")
        out = tmp_path / "file" / "out"
    elif where == "read-only":
        out.mkdir()
        out.chmod(0o555)
        if os.access(out, os.W_OK):
            pytest.skip("root writes to read-only folders")
    else:
        out.mkdir()
        other = FileLock(out / LOCK_FILE)
        other.acquire()
    monkeypatch.setattr(linzoo, "load_teacher", lambda *a, **k: pytest.fail("loaded the teacher"))
    assert cli.main(["linearize", *_linearize_argv(tiny_teacher_dir, tiny_corpus, out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"linzoo linearize: error: --output_dir {out} "), err
    assert {"a file": "is a file", "under a file": "not writable (Not a directory)", "read-only": "not writable",
            "in use": "in use by another linzoo run"}[where] in err


def test_a_malformed_yaml_config_is_one_line(tmp_path, capsys):
    from linzoo import cli

    config = tmp_path / "recipe.yaml"
    config.write_text("mixer: gla\n  total_tokens: 5\n")
    for command in ("linearize", "sft", "distill-instruct"):
        assert cli.main([command, "--config", str(config), "--output_dir", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert err == (f"linzoo {command}: error: --config: not valid YAML at {config}, line 2, column 15: mapping "
                       "values are not allowed here\n"), err


def test_no_library_warning_ahead_of_our_own_words(tmp_path):
    """TRL defaulted checkpointing on under `gradient_checkpointing`, the alias TrainingArguments deprecates: every
    config printed a FutureWarning (and distill-instruct trl.experimental's import notice) ahead of anything linzoo
    said, errors included. Same default now, without a warning; the old flag, which the recipes use because the GPU
    image's transformers 5.17 has no `activation_checkpointing`, sets the new one without a warning."""
    import subprocess
    import sys
    import warnings

    from linzoo.trainers.distill_instruct_config import InstructDistillConfig
    from linzoo.trainers.sft import LinzooSFTConfig

    def checkpointing(cfg):  # transformers >= 5.2x: activation_checkpointing; 5.17 (pyproject's floor): only the old name
        return getattr(cfg, "activation_checkpointing", cfg.gradient_checkpointing)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for cls in (LinearizeConfig, LinzooSFTConfig, InstructDistillConfig):
            cfg = dataclasses.replace(cls(output_dir=str(tmp_path)), learning_rate=0.1)  # a stage's copy too
            assert checkpointing(cfg) is True and cfg.gradient_checkpointing is True
        for recipe in RECIPES.glob("*/linearize.yaml"):
            TrlParser(LinearizeConfig).parse_args_and_config(["--config", str(recipe), "--bf16", "false"])
        # the recipes' `gradient_checkpointing`, the one name transformers 5.17 (the GPU image's) also parses
        assert checkpointing(LinearizeConfig(output_dir=str(tmp_path), gradient_checkpointing=False)) is False
        assert all("gradient_checkpointing:" in r.read_text() for r in RECIPES.glob("*/linearize.yaml"))
    assert not [w for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))], caught
    # in a fresh process (the import notice comes once): the error line is all that is printed
    done = subprocess.run([sys.executable, "-m", "linzoo.cli", "distill-instruct", "--model_name_or_path", "x",
                           "--kd_alpha", "2", "--output_dir", str(tmp_path / "out")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONWARNINGS": "default"})
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "kd_alpha must lie" in done.stderr, done.stderr


@pytest.mark.parametrize("argv, flag", [(["--temperature", "0.5"], "--temperature"), (["--beta", "0.1"], "--beta"),
                                        (["--lmbda", "0.5", "--kd_alpha", "0.9"], "--kd_alpha"),
                                        (["--lmbda", "0.5", "--kd_temperature", "2"], "--kd_temperature")])
def test_distill_instruct_has_one_loss_vocabulary(argv, flag, tmp_path):
    """GKD's temperature/beta drive the on-policy loss only, kd_temperature/kd_alpha the off-policy one: a flag of
    the loss not in use is an error naming it, not a value silently ignored."""
    from linzoo.trainers.distill_instruct_config import InstructDistillConfig

    with pytest.raises(ValueError, match=rf"{flag} belong to the other loss"):
        InstructDistillConfig(output_dir=str(tmp_path), **{a.lstrip("-"): float(v) for a, v in zip(argv[::2], argv[1::2])})
    InstructDistillConfig(output_dir=str(tmp_path), lmbda=0.5, beta=0.1, temperature=0.5)  # each in its own loss
    InstructDistillConfig(output_dir=str(tmp_path), kd_alpha=0.9, kd_temperature=2.0)
