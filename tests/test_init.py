"""A fresh student's start: `linearize(..., calibration=ids)` fits every mixer to its teacher (`linzoo.calibrate`), the
value path through the short convolution is the teacher's, checkpoints from before `conv_activation` load as they
did, and the plain start (`reset_new_parameters`, no teacher) still stands. Tiny models on CPU.

The per-layer error is stage 1's loss, teacher-forced (`linzoo.capture.mixer_io` and the trainer's `attention_transfer_loss`), as
in experiments/init_error/init_error.py, which measures the same on the real teacher (results/init/).
"""

import json

import pytest
import torch
import torch.nn.functional as F
from test_modeling import INIT_CHECKS, TINY, VOCAB, _fla_causal_conv1d, tiny_llama  # noqa: F401 (autouse)

import linzoo
from linzoo.calibrate import CANDIDATES, RIDGES, choose_ridge, fit_output_norm, fit_output_projection, normalised_heads
from linzoo.convert import fresh_parameters
from linzoo.modeling import LinzooConfig, LinzooForCausalLM
from linzoo.modeling.mixer_base import ShortConv
from linzoo.modeling.mixers import MIXER_CLASSES
from linzoo.capture import mixer_io
from linzoo.trainers.linearize_trainer import AttentionTransferTrainer

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

CONV_MIXERS = [m for m in linzoo.MIXERS if MIXER_CLASSES[m].short_conv]


@pytest.fixture(scope="module")
def teacher():
    return tiny_llama()


def token_rows(seed, rows=2, length=48):
    return torch.randint(1, VOCAB, (rows, length), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def layer_errors(student, teacher, ids):
    io = [(v.input, v.output) for v in mixer_io(teacher, ids).values()]
    loss = AttentionTransferTrainer.attention_transfer_loss
    return [loss([layer.self_attn(io[i][0])], [io[i][1]]).item() for i, layer in enumerate(student.model.layers)
            if i not in student.config.attn_layers]


def plain_student(teacher, mixer, **options):
    """The start every student had before the fit, still linearize's without calibration tokens: SiLU on q, k and v
    after the short conv, each mixer's `reset_new_parameters`."""
    torch.manual_seed(0)
    student = linzoo.linearize(teacher, mixer, **options).eval()
    assert student.config.conv_activation == "silu" and not hasattr(student, "calibration_report")
    return student


# ------------------------------------------------------------------------------------------------
# the fitted start is closer to the teacher than the plain one
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mixer", linzoo.MIXERS)
def test_fitted_start_has_lower_layer_error_than_plain_start(mixer, teacher):
    held_out = token_rows(1)
    plain = layer_errors(plain_student(teacher, mixer), teacher, held_out)
    torch.manual_seed(0)
    fitted_student = linzoo.linearize(teacher, mixer, calibration=token_rows(0)).eval()
    fitted = layer_errors(fitted_student, teacher, held_out)
    assert sum(fitted) / len(fitted) < sum(plain) / len(plain), (plain, fitted)
    assert all(f < p for f, p in zip(fitted, plain)), (plain, fitted)
    assert all(f < 1 for f in fitted), fitted  # a zero output scores 1
    assert fitted_student.config.conv_activation == "silu_qk"


@pytest.mark.parametrize("mixer", linzoo.MIXERS)
def test_calibration_report_is_stage_one_loss_on_its_tokens(mixer, teacher):
    """The fit's reported error (from the least-squares algebra) is the stage-1 loss measured on the calibration
    tokens, and the knobs it chose are candidates, one per head."""
    ids = token_rows(0)
    student = linzoo.linearize(teacher, mixer, calibration=ids).eval()
    report = student.calibration_report
    measured = layer_errors(student, teacher, ids)
    for i, error in enumerate(measured):
        assert report[i]["error"] == pytest.approx(error, rel=1e-3, abs=1e-5)
        assert set(report[i]["knobs"]) == set(MIXER_CLASSES[mixer].start_knobs)
        for name, values in report[i]["knobs"].items():
            assert len(values) == TINY["num_attention_heads"] and set(values) <= set(CANDIDATES[name])
    assert report["seconds"] >= 0


@pytest.mark.slow
def test_fitted_start_beats_plain_start_on_the_real_teacher(embedded_teacher):
    """SmolLM2-135M-Instruct into Gated DeltaNet, fitted on 256 tokens of the embedded text, measured on the next 256:
    every layer closer to its teacher attention than the plain start (results/init/ has all mixers on more text)."""
    from linzoo.data import load_text_dataset

    model, tokenizer = embedded_teacher
    texts = load_text_dataset("embedded", split="test")["text"][:20]
    ids = tokenizer(tokenizer.eos_token.join(texts), return_tensors="pt").input_ids[0]
    calibration, held_out = ids[:256][None], ids[256:512][None]
    plain = layer_errors(plain_student(model, "gated_deltanet"), model, held_out)
    fitted = layer_errors(linzoo.linearize(model, "gated_deltanet", calibration=calibration).eval(), model, held_out)
    assert all(f < p for f, p in zip(fitted, plain)), (plain, fitted)
    assert sum(fitted) / len(fitted) < 0.8 < 5 < sum(plain) / len(plain), (plain, fitted)


def test_calibration_skips_kept_softmax_layers(teacher):
    student = linzoo.linearize(teacher, "gated_deltanet", attn_layers=[1], calibration=token_rows(0))
    assert set(student.calibration_report) == {0, "seconds", "cpu_seconds"}
    assert torch.equal(student.model.layers[1].self_attn.q_proj.weight, teacher.model.layers[1].self_attn.q_proj.weight)


def test_calibration_changes_only_new_parameters(teacher):
    """The fit moves the mixers' new parameters and (only where held-out rows say it helps) their o_proj; every other
    tensor copied from the teacher stays exact."""
    student = linzoo.linearize(teacher, "kda", calibration=token_rows(0, rows=4))
    state, fresh = student.state_dict(), set(fresh_parameters(student))
    report = student.calibration_report
    for name, tensor in teacher.state_dict().items():
        if name.endswith("self_attn.o_proj.weight"):
            refit = report[int(name.split(".")[2])]["o_proj_ridge"] is not None
            assert torch.equal(state[name], tensor) != refit, name
        else:
            assert torch.equal(state[name], tensor), name
    plain = plain_student(teacher, "kda").state_dict()
    assert any(not torch.equal(state[name], plain[name]) for name in fresh if name.endswith("o_norm.weight"))


def test_output_projection_refit_recovers_a_linear_map_and_is_kept_only_where_it_helps():
    torch.manual_seed(0)
    z, W_true, prior = torch.randn(400, 12), torch.randn(6, 12), torch.randn(6, 12)
    y = z @ W_true.T
    torch.testing.assert_close(fit_output_projection(z, y, prior, 1e-6).float(), W_true, atol=1e-3, rtol=1e-3)
    shrunk = fit_output_projection(z, y, prior, 1e3).float()  # a huge ridge stays at the prior
    assert (shrunk - prior).norm() < 0.05 * (W_true - prior).norm()
    assert choose_ridge(z, y, prior, rows=4) == min(r for r in RIDGES if r is not None)  # clean data: least shrinkage
    assert choose_ridge(z, z @ prior.T, prior, rows=4) is None  # the prior already exact: no refit
    noise = torch.randn(8, 6)  # 8 tokens, 12 inputs: any refit overfits
    assert choose_ridge(torch.randn(8, 12), noise, torch.zeros(6, 12), rows=2) is None


def test_fit_output_norm_solves_least_squares():
    torch.manual_seed(0)
    n, W = torch.randn(200, 3, 4), torch.randn(6, 12)
    w_true = torch.randn(4)
    y = (n * w_true).reshape(200, 12) @ W.T
    w, error = fit_output_norm(n, y, W)
    torch.testing.assert_close(w, w_true, atol=1e-4, rtol=1e-4)
    assert error == pytest.approx(0.0, abs=1e-6)
    noisy = y + torch.randn_like(y)
    w, error = fit_output_norm(n, noisy, W)
    direct = ((noisy - (n * w).reshape(200, 12) @ W.T).pow(2).sum() / noisy.pow(2).sum()).item()
    assert error == pytest.approx(direct, rel=1e-4)
    for step in (1e-2, -1e-2):  # a minimum: moving w raises the error
        moved = ((noisy - (n * (w + step)).reshape(200, 12) @ W.T).pow(2).sum() / noisy.pow(2).sum()).item()
        assert moved > direct


# ------------------------------------------------------------------------------------------------
# the knobs mean what they say
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mixer", [m for m in linzoo.MIXERS if MIXER_CLASSES[m].start_knobs])
def test_set_start_knobs_sets_half_life_and_strength(mixer):
    """With the input-dependent parts at zero, the gates give every head its decay (the state halves in
    `half_life` tokens) and its strength, whatever the input."""
    model = LinzooForCausalLM(LinzooConfig(**TINY, mixer=mixer))
    mixer_ = model.model.layers[0].self_attn
    H = mixer_.num_heads
    half_life, strength = torch.tensor([2.0, 8.0, 32.0, 2048.0]), torch.tensor([0.05, 0.2, 0.5, 0.9])
    knobs = {"half_life": half_life, "strength": strength}
    mixer_.set_start_knobs(**{k: knobs[k] for k in mixer_.start_knobs})
    x = torch.randn(2, 5, TINY["hidden_size"])
    with torch.no_grad():
        g, beta = mixer_.gates(x)
    if "half_life" in mixer_.start_knobs:
        decay = g.exp() if g.dim() == 3 else g.exp()[..., 0]
        if g.dim() == 4:  # per channel: every channel of a head alike
            torch.testing.assert_close(g, g[..., :1].expand_as(g))
        torch.testing.assert_close(decay, (0.5 ** (1 / half_life)).expand(2, 5, H), rtol=1e-5, atol=1e-6)
    if "strength" in mixer_.start_knobs:
        torch.testing.assert_close(beta, strength.expand(2, 5, H), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------
# the value path is the teacher's
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("activation, silu", [("silu", 12), ("silu_qk", 8), ("identity", 0)])
def test_short_conv_at_init_applies_silu_only_where_asked(activation, silu):
    conv = ShortConv(12, 4, {"silu": None, "silu_qk": 8, "identity": 0}[activation])
    x = torch.randn(2, 7, 12)
    out = conv(x)
    torch.testing.assert_close(out[..., :silu], F.silu(x[..., :silu]), rtol=0, atol=0)
    assert torch.equal(out[..., silu:], x[..., silu:])  # the identity, exactly


@pytest.mark.parametrize("mixer", CONV_MIXERS)
def test_linearized_value_path_is_the_teachers_v_proj(mixer, teacher):
    """Right after linearize, what reaches the recurrence as v is the teacher's v_proj(x) (q, k: SiLU of the
    teacher's projections); before the field, SiLU also bent v."""
    x = torch.randn(2, 9, TINY["hidden_size"])
    attn = teacher.model.layers[0].self_attn
    fitted = linzoo.linearize(teacher, mixer, calibration=token_rows(0))
    for student, v_is_teachers in ((fitted, True), (plain_student(teacher, mixer), False)):
        mixer_ = student.model.layers[0].self_attn
        seen = {}
        hook = mixer_.conv.register_forward_hook(lambda m, args, out: seen.__setitem__("out", out))
        with torch.no_grad():
            mixer_(x)
            q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        hook.remove()
        want = torch.cat([F.silu(q), F.silu(k), v if v_is_teachers else F.silu(v)], -1)
        torch.testing.assert_close(seen["out"], want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("activation", ["silu_qk", "identity"])
def test_fused_short_conv_with_partial_silu_equals_torch_path(activation, monkeypatch):
    """On CUDA the conv runs fla's causal_conv1d with activation=None and SiLU on q, k outside it; a torch stand-in
    with fla's semantics must give the torch path's logits (prefill, packed rows, decoding)."""
    from linzoo.modeling import kernels, mixer_base

    calls = []

    def conv1d(x, weight, activation=None, cu_seqlens=None):
        calls.append(activation)
        out, _ = _fla_causal_conv1d(x, weight, "silu", cu_seqlens)
        if activation is None:  # the stand-in applies SiLU; undo it by recomputing without
            bounds = [0, x.shape[1]] if cu_seqlens is None else cu_seqlens.tolist()
            out = torch.zeros_like(x)
            for s, e in zip(bounds[:-1], bounds[1:]):
                seg = F.pad(x[:, s:e].transpose(1, 2), (weight.shape[1] - 1, 0))
                out[:, s:e] = F.conv1d(seg, weight[:, None], groups=x.shape[-1]).transpose(1, 2)
        return out, None

    torch.manual_seed(0)
    model = LinzooForCausalLM(LinzooConfig(**TINY, mixer="gated_deltanet", conv_activation=activation)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ids = torch.randint(1, VOCAB, (2, 13))
    packed_pos = torch.cat([torch.arange(n) for n in (5, 8)])[None]
    with torch.no_grad():
        ref = model(ids).logits, model(ids[:1], position_ids=packed_pos, use_cache=False).logits
        monkeypatch.setattr(kernels.FUSED_OPS, "_loaded", {"causal_conv1d": conv1d})
        monkeypatch.setattr(mixer_base, "use_fused_ops", lambda config, device: True)
        monkeypatch.setattr(mixer_base, "fused_rms_norm",
                            lambda x, w, eps: w * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True)
                                                                          + eps)).to(x.dtype))
        fused = model(ids).logits, model(ids[:1], position_ids=packed_pos, use_cache=False).logits
    assert calls and set(calls) == {None}
    for a, b in zip(fused, ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


# ------------------------------------------------------------------------------------------------
# checkpoints from before the field, and the plain start
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mixer", CONV_MIXERS)
def test_checkpoint_without_conv_activation_loads_as_before(mixer, tmp_path):
    """A config.json without `conv_activation` (every checkpoint saved before it) builds SiLU on q, k and v: the
    same logits as before saving, and the old conv's own formula."""
    torch.manual_seed(0)
    model = LinzooForCausalLM(LinzooConfig(**TINY, mixer=mixer)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config.pop("conv_activation") == "silu"
    (tmp_path / "config.json").write_text(json.dumps(config))
    again = LinzooForCausalLM.from_pretrained(tmp_path).eval()
    assert again.config.conv_activation == "silu"
    ids = torch.randint(1, VOCAB, (2, 11))
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)
        conv = again.model.layers[0].self_attn.conv
        x = torch.randn(1, 6, conv.weight.shape[0])
        old = sum(F.pad(x, (0, 0, j, 0))[:, :6] * conv.weight[:, -1 - j] for j in range(conv.size))
        torch.testing.assert_close(conv(x), F.silu(old))


@pytest.mark.parametrize("mixer", linzoo.MIXERS)
def test_plain_start_without_a_teacher(mixer):
    """`reset_new_parameters` (the start of a model built from its config alone, no teacher) is untouched: after a
    teacher start and a moved conv it restores each mixer's documented start (tests/test_modeling.py INIT_CHECKS),
    and the model runs."""
    fresh = LinzooForCausalLM(LinzooConfig(**TINY, mixer=mixer))
    model = LinzooForCausalLM(LinzooConfig(**TINY, mixer=mixer))
    knobs = {"half_life": torch.full((4,), 3.0), "strength": torch.full((4,), 0.7)}
    with torch.no_grad():
        for layer in model.model.layers:
            attn = layer.self_attn
            attn.set_start_knobs(**{k: knobs[k] for k in attn.start_knobs})
            if attn.conv is not None:
                attn.conv.weight.mul_(3)
            for module in attn.modules():
                if hasattr(module, "reset_new_parameters"):
                    module.reset_new_parameters()
    for layer, fresh_layer in zip(model.model.layers, fresh.model.layers):
        attn, want = layer.self_attn, fresh_layer.self_attn
        tensors, wanted = {**dict(attn.named_parameters()), **dict(attn.named_buffers())}, dict(want.named_buffers())
        wanted.update(want.named_parameters())
        for name, check in INIT_CHECKS[mixer].items():
            if name == "decay":  # Mamba-style random draws: in their documented range
                check(attn, attn.num_heads)
            else:
                assert torch.equal(tensors[name], wanted[name]), name
        if attn.conv is not None:
            assert torch.equal(attn.conv.weight, want.conv.weight)
    with torch.no_grad():
        assert model(torch.randint(1, VOCAB, (1, 9))).logits.isfinite().all()


def test_normalised_heads_are_unit_rms(teacher):
    torch.manual_seed(0)
    student = linzoo.linearize(teacher, "gla")
    x = torch.randn(2, 6, TINY["hidden_size"], generator=torch.Generator().manual_seed(0))
    n = normalised_heads(student.model.layers[0].self_attn, x)
    assert n.shape == (12, TINY["num_attention_heads"], TINY["hidden_size"] // TINY["num_attention_heads"])
    torch.testing.assert_close(n.pow(2).mean(-1), torch.ones(12, 4), atol=1e-2, rtol=0)  # eps: not exactly 1
