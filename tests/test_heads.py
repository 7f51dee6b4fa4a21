"""The retrieval-heads eval: the score on a hand-built attention pattern with a known answer, every layer type's
`token_weights` against its real forward, the layer choice behind `--attn_layers auto:K`, and the command on a tiny
model end to end."""

import json

import pytest
import torch

import linzoo
from linzoo.evals import heads
from linzoo.modeling import LinzooConfig, LinzooForCausalLM


def _prompt(sources):
    return heads.KeyPrompt(torch.arange(12), query_positions=list(range(6, 6 + len(sources))),
                           key_tokens=[0] * len(sources), sources=sources)


def test_copy_hits_on_a_hand_built_pattern():
    """3 heads, 4 key tokens whose needle copies sit at 1, 2, 3 and {1, 4}: head 0 always looks at the right
    copy (4/4), head 1 at position 0 (0/4), head 2 right for the first and the last key token only (2/4)."""
    prompt = _prompt([[1], [2], [3], [1, 4]])
    weights = torch.full((3, 4, 12), 0.01)
    for i, target in enumerate((1, 2, 3, 4)):
        weights[0, i, target] = 0.9
        weights[1, i, 0] = 0.9
    weights[2, 0, 1] = weights[2, 1, 5] = weights[2, 2, 0] = weights[2, 3, 1] = 0.9
    assert heads.copy_hits(weights, prompt).tolist() == [4.0, 0.0, 2.0]


def test_score_heads_reports_the_known_answer(monkeypatch, tiny_teacher_dir):
    """With the weights forced to the pattern above in layer 1 (layer 0 attends to token 0), the scores are
    exactly 1, 0 and 0.5 in layer 1, 0 in layer 0, and the top head is L1H0."""
    model, tokenizer = linzoo.load_teacher(str(tiny_teacher_dir))

    def pattern(model, input_ids, rows):
        prompt = current["prompt"]
        layer0 = torch.zeros(4, len(rows), len(input_ids))
        layer0[..., 0] = 1.0
        layer1 = torch.zeros(4, len(rows), len(input_ids))
        for i, sources in enumerate(prompt.sources):
            layer1[0, i, sources[0] if sources else 0] = 1.0
            layer1[2, i, sources[0] if sources and i % 2 == 0 else 0] = 1.0
        return [layer0, layer1]

    current = {}
    real_key_prompt = heads.key_prompt

    def remembered(*args):
        current["prompt"] = real_key_prompt(*args)
        return current["prompt"]

    monkeypatch.setattr(heads, "layer_weights", pattern)
    monkeypatch.setattr(heads, "key_prompt", remembered)
    results = heads.score_heads(model, tokenizer, [96], samples=1, ablation=False, progress=False)  # one prompt
    assert all(current["prompt"].sources), "the byte-level tokenizer keeps every key token in the needle"
    assert results["scores"][0] == [0.0] * 4
    key_tokens = results["key_tokens"]
    even = sum(1 for i in range(key_tokens) if i % 2 == 0)
    assert results["scores"][1] == pytest.approx([1.0, 0.0, even / key_tokens, 0.0])
    assert results["top_heads"][0] == {"layer": 1, "head": 0, "score": 1.0}
    assert heads.choose_layers(results, 1) == [1]


def test_key_prompt_finds_the_key_in_the_needle(embedded_teacher):
    _, tokenizer = embedded_teacher
    prompt = heads.key_prompt(tokenizer, 256, 0.5, 7)
    assert len(prompt.key_tokens) == 5  # SmolLM2 writes each digit as its own token
    assert all(prompt.sources), "every key digit occurs in the needle"
    for sources, token in zip(prompt.sources, prompt.key_tokens):
        assert all(prompt.input_ids[j] == token for j in sources)
    assert prompt.query_positions[0] == len(tokenizer(tokenizer.decode(prompt.input_ids[:prompt.query_positions[0] + 1]))["input_ids"]) - 1


@pytest.mark.parametrize("mixer", linzoo.MIXERS)
def test_token_weights_reproduce_the_mixer(mixer):
    """sum_j w_tj v_j equals the mixer's own output before its output norm (and the softmax layer's, for the
    attention kept in a hybrid)."""
    torch.manual_seed(0)
    config = LinzooConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, kernel_backend="torch", mixer=mixer,
                          attn_layers=[1])
    model = LinzooForCausalLM(config).eval()
    for p in model.parameters():  # gates away from their identity start, so that decays and strengths matter
        p.data.add_(0.1 * torch.randn_like(p))
    x = torch.randn(1, 23, 32)
    linear, softmax = model.model.layers[0].self_attn, model.model.layers[1].self_attn
    with torch.no_grad():
        q, k, v = linear.features(*linear.project(x))
        g, beta = linear.gates(x)
        from linzoo.modeling.kernels import linear_core

        o, _ = linear_core(config, linear, q, k, v, g, beta)
        expected = linear.readout(o)  # [B, T, H, D]
        _, _, values = linear.project(x)
        got = torch.einsum("bhts,bshd->bthd", linear.token_weights(x), values.float())
        torch.testing.assert_close(got, expected.float(), atol=2e-5, rtol=2e-4)

        positions = torch.arange(23)[None]
        w = softmax.token_weights(x, position_ids=positions)
        assert torch.allclose(w.sum(-1), torch.ones(1, 4, 23)) and torch.all(w.triu(1) == 0)
        _, _, v = softmax.project(x, positions)
        o = torch.einsum("bhts,bhsd->bthd", w, v.repeat_interleave(2, dim=1))
        sdpa = softmax.o_proj.weight  # the module's output before o_proj: undo it through a forward with identity
        softmax.o_proj.weight = torch.nn.Parameter(torch.eye(sdpa.shape[0], sdpa.shape[1]))
        torch.testing.assert_close(o.reshape(1, 23, -1), softmax(x, position_ids=positions), atol=2e-5, rtol=2e-4)


def test_heads_command_end_to_end(tmp_path, tiny_student_dir):
    """`linzoo eval heads` on a saved student writes heads.json (the schema, one score per head) and heads.png."""
    from linzoo.cli import main

    assert main(["eval", "heads", "--model", str(tiny_student_dir), "--lengths", "96", "--samples", "2",
                 "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "heads.json").read_text())
    assert data["schema"] == heads.SCHEMA and len(data["scores"]) == 2 and len(data["scores"][0]) == 4
    assert all(0.0 <= s <= 1.0 for row in data["scores"] for s in row)
    assert len(data["ablation_logprob_drop"]) == 2
    assert (tmp_path / "heads.png").stat().st_size > 0
    assert heads.EVAL.read(tmp_path / "heads.json") == data
    section = heads.EVAL.card_section(data, tmp_path)
    assert "### Retrieval heads" in section and "L" in section


def test_linearize_auto_attn_layers_keeps_the_teachers_best_retrieval_layer(tiny_teacher_dir, tiny_corpus, tmp_path):
    """--attn_layers auto:1 scores the teacher's heads, keeps the layer `choose_layers` picks from them as softmax
    attention, records why, and the card says it."""
    from linzoo.hub_cards.card import build_card
    from linzoo.trainers import linearize

    out = tmp_path / "run"
    argv = ["--teacher", str(tiny_teacher_dir), "--dataset", str(tiny_corpus / "text.txt"), "--total_tokens", "600",
            "--max_seq_length", "32", "--per_device_train_batch_size", "2", "--output_dir", str(out),
            "--calibration_tokens", "0", "--attn_layers", "auto:1"]
    assert linearize.main(argv) == 0
    scored = json.loads((out / linearize.TEACHER_HEADS).read_text())
    record = json.loads((out / "linzoo_training.json").read_text())
    assert record["attn_layers"] == heads.choose_layers(scored, 1) and len(record["attn_layers"]) == 1
    assert json.loads((out / "config.json").read_text())["attn_layers"] == record["attn_layers"]
    choice = record["attn_layers_choice"]
    assert choice["rule"] == "auto:1" and list(choice["scores"]) == [str(record["attn_layers"][0])]
    assert "`auto:1`: the layers of the teacher's retrieval-head score" in str(build_card(out))


@pytest.mark.parametrize("bad", [["auto:0"], ["auto:x"], ["three"], ["auto:2", "3"]])
def test_attn_layers_flag_errors(bad):
    from linzoo.trainers.linearize_config import parse_attn_layers

    with pytest.raises(ValueError, match="--attn_layers"):
        parse_attn_layers(bad)
    assert parse_attn_layers(["3", "4"]) == ([3, 4], None) and parse_attn_layers(["auto:3"]) == ([], 3)


def test_prose_layers_composes_the_fitted_start_of_any_softmax_set():
    """experiments/prose_layers/prose_layers.py scores a softmax set by the fitted start `linzoo linearize` would
    build for it, made from one fitted all-mixer student: the fit is per layer on the teacher's activations, so the two
    must be the same model (and a set's layers must keep the teacher's attention)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import linzoo
    from prose_layers import Starts

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    teacher = LlamaForCausalLM(config).eval()
    calibration = torch.randint(0, 97, (2, 64))
    starts = Starts(teacher, None, "gated_deltanet", 8, calibration=calibration)
    ids = torch.randint(0, 97, (1, 40))
    for layers in ({1, 2}, {0}, set()):
        torch.manual_seed(0)
        direct = linzoo.linearize(teacher, "gated_deltanet", calibration=calibration, attn_layers=sorted(layers),
                                  window_size=8).eval()
        composed = starts.build(layers)
        assert composed.config.attn_layers == sorted(layers)
        with torch.inference_mode():
            torch.testing.assert_close(composed(ids).logits, direct(ids).logits, rtol=0, atol=1e-6)
    # the set's layers are the teacher's attention, the others the fitted mixers (not the plain start)
    composed = starts.build({1})
    plain = linzoo.linearize(teacher, "gated_deltanet", attn_layers=[1], window_size=8, conv_activation="silu_qk")
    with torch.inference_mode():
        assert not torch.allclose(composed(ids).logits, plain.eval()(ids).logits)
