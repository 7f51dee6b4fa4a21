"""Model tests for linzoo students: shared check functions, run over parameter tables of the seven mixers
(and hybrid students that keep softmax attention in some layers), in the style of the fla/transformers
model testers. Tiny configs run on CPU in seconds; the real-teacher tests at the end are marked `slow`
but run by default."""

import ast
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

import linzoo
from linzoo.convert import fresh_parameters
from linzoo.modeling import LinzooConfig, LinzooForCausalLM
from linzoo.modeling.linear_ops import torch_chunk, torch_recurrent

MODELING_DIR = Path(linzoo.modeling.__file__).parent
VOCAB = 100
TINY = dict(
    vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, chunk_size=8, kernel_backend="torch", initializer_range=0.1,
    pad_token_id=0, bos_token_id=None, eos_token_id=None,  # no eos: generations keep their full length
)
TOL = dict(atol=1e-5, rtol=1e-4)  # fp32 kernels compared with each other

# The table: every mixer, plus hybrids that keep the teacher's softmax attention in one layer.
MIXER_CASES = [pytest.param(m, (), id=m) for m in linzoo.MIXERS]
HYBRID_CASES = [pytest.param("gated_deltanet", (1,), id="hybrid-gated_deltanet-attn1"),
                pytest.param("xlstm", (0,), id="hybrid-xlstm-attn0")]
ALL_CASES = MIXER_CASES + HYBRID_CASES
# The window / sparse cache beside the state (modeling/memory.py): (mixer, attn_layers, config overrides).
MEMORY_CASES = [
    pytest.param("gated_deltanet", (), {"window_size": 4}, id="window4-gated_deltanet"),
    pytest.param("gla", (), {"window_size": 1}, id="window1-gla"),
    pytest.param("xlstm", (), {"window_size": 64}, id="window64-xlstm"),  # longer than every sequence here
    pytest.param("gated_deltanet", (), {"sparse_cache_size": 3}, id="sparse3-gated_deltanet"),
    pytest.param("kda", (), {"window_size": 5, "sparse_cache_size": 2}, id="window5-sparse2-kda"),
    pytest.param("deltanet", (1,), {"window_size": 3, "sparse_cache_size": 2}, id="hybrid-window3-sparse2-deltanet"),
]
# every case a saved model is reloaded in: (mixer, attn_layers, overrides)
CASE_IDS = {**{p.id: (*p.values, {}) for p in ALL_CASES}, **{p.id: p.values for p in MEMORY_CASES}}

# Parameters each mixer adds to a Llama attention layer (names inside `self_attn`); the rest is the teacher's.
TEACHER_PROJ = {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"}
_CONV = {"conv.weight"}
_DELTA = {"o_norm.weight", "b_proj.weight", "b_proj.bias"} | _CONV
NEW_PARAMS = {
    "linear_attn": {"o_norm.weight"},
    "retnet": {"o_norm.weight"},
    "gla": {"o_norm.weight", "gk_proj.0.weight", "gk_proj.1.weight", "gk_proj.1.bias"},
    "deltanet": _DELTA,
    "gated_deltanet": _DELTA | {"a_proj.weight", "A_log", "dt_bias"},
    "kda": _DELTA | {"f_proj.0.weight", "f_proj.1.weight", "A_log", "dt_bias"},
    "xlstm": {"o_norm.weight", "igate.weight", "igate.bias", "fgate.weight", "fgate.bias"},
    "mamba2": {"o_norm.weight", "a_proj.weight", "A_log", "dt_bias"} | _CONV,
}
# First factors of low-rank gates whose second factor starts at zero: no gradient at init, by design.
ZERO_GRAD_AT_INIT = {"gla": {"gk_proj.0.weight"}, "kda": {"f_proj.0.weight"}}


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ------------------------------------------------------------------------------------------------
# builders and shared checks
# ------------------------------------------------------------------------------------------------


def tiny_model(mixer, attn_layers=(), perturb=True, **overrides):
    """A tiny student. `perturb` moves the mixer's new parameters off their init, so gates depend on the input."""
    torch.manual_seed(0)
    model = LinzooForCausalLM(LinzooConfig(**{**TINY, **overrides}, mixer=mixer, attn_layers=list(attn_layers)))
    if perturb:
        with torch.no_grad():
            for layer in model.model.layers:
                for name, p in layer.self_attn.named_parameters():
                    if name not in TEACHER_PROJ:
                        p.add_(0.3 * torch.randn_like(p))
    return model.eval()


def tiny_llama(tie=False):
    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tie,
                         initializer_range=0.1, pad_token_id=0, bos_token_id=None, eos_token_id=None)
    teacher = LlamaForCausalLM(config).eval()
    teacher.config._name_or_path = "tiny/llama-teacher"
    return teacher


def cache_of(out):
    return out["cache"] if "cache" in out else out["past_key_values"]


def left_padded(*rows):
    """Batch of 1-row id tensors, left-padded with 0, and its attention mask."""
    T = max(r.shape[1] for r in rows)
    ids = torch.cat([F.pad(r, (T - r.shape[1], 0), value=0) for r in rows])
    mask = torch.cat([F.pad(torch.ones_like(r), (T - r.shape[1], 0), value=0) for r in rows])
    return ids, mask


def new_params(model):
    """{full name: param} of the mixers' new parameters in every linear layer."""
    out = {}
    for i, layer in enumerate(model.model.layers):
        if i in model.config.attn_layers:
            continue
        for name, p in layer.self_attn.named_parameters():
            if name not in TEACHER_PROJ:
                out[f"model.layers.{i}.self_attn.{name}"] = p
    return out


def check_forward_backward(model):
    model.train()
    B, T = 2, 21
    ids = torch.randint(1, VOCAB, (B, T))
    labels = ids.clone()
    labels[:, :3] = -100
    out = model(ids, labels=labels)
    assert out.logits.shape == (B, T, VOCAB)
    expected = F.cross_entropy(out.logits[:, :-1].reshape(-1, VOCAB).float(), labels[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, expected)
    out.loss.backward()
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None, f"{name} got no gradient"
            assert p.grad.isfinite().all(), f"{name} has a non-finite gradient"
    skip = ZERO_GRAD_AT_INIT.get(model.config.mixer, set())
    for name, p in new_params(model).items():
        if name.split("self_attn.")[1] not in skip:
            assert p.grad.abs().sum() > 0, f"new parameter {name} got an all-zero gradient"


def check_decoding(model):
    """Prefill, a 6-token block (chunked path with a state), then single tokens == one full forward."""
    ids = torch.randint(1, VOCAB, (2, 23))
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        out = model(ids[:, :9], use_cache=True)
        cache, pieces = cache_of(out), [out.logits]
        out = model(ids[:, 9:15], cache=cache, use_cache=True)
        pieces.append(out.logits)
        for t in range(15, 23):
            out = model(ids[:, t : t + 1], cache=cache_of(out), use_cache=True)
            pieces.append(out.logits)
    torch.testing.assert_close(torch.cat(pieces, 1), full, **TOL)


def check_left_padding(model):
    """A left-padded row's logits at its real positions equal the prompt run alone (prefill and decoding)."""
    long, short = torch.randint(1, VOCAB, (1, 13)), torch.randint(1, VOCAB, (1, 6))
    ids, mask = left_padded(long, short)
    nxt = torch.randint(1, VOCAB, (2, 3))
    with torch.no_grad():
        alone = [model(torch.cat([p, nxt[i : i + 1]], 1), use_cache=False).logits for i, p in enumerate((long, short))]
        out = model(ids, attention_mask=mask, use_cache=True)
        logits, cache = [out.logits], cache_of(out)
        for t in range(nxt.shape[1]):
            mask = torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], 1)
            out = model(nxt[:, t : t + 1], attention_mask=mask, cache=cache, use_cache=True)
            logits.append(out.logits)
        batched = torch.cat(logits, 1)
    torch.testing.assert_close(batched[0], alone[0][0], **TOL)
    torch.testing.assert_close(batched[1, 13 - 6 :], alone[1][0], **TOL)


def check_generate(model):
    prompts = [torch.randint(1, VOCAB, (1, n)) for n in (11, 5)]
    ids, mask = left_padded(*prompts)
    with torch.no_grad():
        batched = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
        no_cache = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, use_cache=False)
        for i, p in enumerate(prompts):
            alone = model.generate(p, max_new_tokens=6, do_sample=False)
            assert batched[i, ids.shape[1] :].tolist() == alone[0, p.shape[1] :].tolist(), f"prompt {i}"
        torch.manual_seed(3)
        sampled = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=True, top_k=20, temperature=0.9)
    assert torch.equal(no_cache, batched)
    assert sampled.shape == (2, ids.shape[1] + 5)
    assert torch.equal(sampled[:, : ids.shape[1]], ids) and 0 <= int(sampled.min()) and int(sampled.max()) < VOCAB


def check_packed(model):
    """One row of concatenated sequences with position_ids restarting at 0 == each sequence alone."""
    lengths = (7, 2, 12)  # the 2-token sequence is shorter than the short convolution
    seqs = [torch.randint(1, VOCAB, (1, n)) for n in lengths]
    packed = torch.cat(seqs, 1)
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    with torch.no_grad():
        # (the cache path: without a cache, sequences shorter than the conv fail; see test_short_inputs_without_cache)
        alone = torch.cat([model(s, use_cache=True).logits for s in seqs], 1)
        evaluated = model(packed, position_ids=position_ids, use_cache=False).logits
        model.train()  # the padding-free training path (no cache)
        trained = model(packed, position_ids=position_ids).logits
        model.eval()
    torch.testing.assert_close(evaluated, alone, **TOL)
    torch.testing.assert_close(trained, alone, **TOL)


# ------------------------------------------------------------------------------------------------
# 1. forward / backward, initial values
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mixer", linzoo.MIXERS)
def test_forward_backward(mixer):
    check_forward_backward(tiny_model(mixer))


@pytest.mark.parametrize("mixer", linzoo.MIXERS)
def test_forward_backward_at_init(mixer):
    check_forward_backward(tiny_model(mixer, perturb=False))


@pytest.mark.parametrize("mixer", linzoo.MIXERS)
def test_gradient_checkpointing_matches(mixer):
    ids = torch.randint(1, VOCAB, (2, 13))
    grads = []
    for checkpointing in (False, True):
        model = tiny_model(mixer).train()
        if checkpointing:
            enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            enable()
        model(ids, labels=ids).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], **TOL, msg=name)


@pytest.mark.parametrize("mixer", linzoo.MIXERS)
def test_new_parameters_names(mixer):
    model = tiny_model(mixer, perturb=False)
    for name in ("model.layers.0.self_attn.", "model.layers.1.self_attn."):
        assert {n[len(name):] for n in new_params(model) if n.startswith(name)} == NEW_PARAMS[mixer]


def _gates_near_one(attn, H):
    A = attn.A_log.exp()
    dt = F.softplus(attn.dt_bias)
    assert ((A >= 1 - 1e-5) & (A <= 16 + 1e-4)).all(), A
    assert ((dt >= 1e-3 * (1 - 1e-4)) & (dt <= 0.1 * (1 + 1e-4))).all(), dt


INIT_CHECKS = {  # the documented start of each mixer's new parameters (modeling/mixer_<name>.py)
    "linear_attn": {},
    "retnet": {"log_gamma": lambda a, H: (1 - 2.0 ** (-5.0 - torch.arange(H))).log()},
    "gla": {"gk_proj.1.weight": 0.0, "gk_proj.1.bias": 3.0},
    "deltanet": {"b_proj.weight": 0.0, "b_proj.bias": 0.0},
    "gated_deltanet": {"b_proj.weight": 0.0, "b_proj.bias": 0.0, "a_proj.weight": 0.0, "decay": _gates_near_one},
    "kda": {"b_proj.weight": 0.0, "b_proj.bias": 0.0, "f_proj.1.weight": 0.0, "decay": _gates_near_one},
    "xlstm": {"igate.weight": 0.0, "igate.bias": -10.0, "fgate.weight": 0.0,
              "fgate.bias": lambda a, H: torch.linspace(3.0, 6.0, H)},
    "mamba2": {"a_proj.weight": 0.0, "decay": _gates_near_one},
}


@pytest.mark.parametrize("mixer", linzoo.MIXERS)
def test_new_parameters_start_as_documented(mixer):
    """Gates near 1, identity short convs, unit output norms: a fresh student starts close to its teacher."""
    model = LinzooForCausalLM(LinzooConfig(**TINY, mixer=mixer))
    H = model.config.num_attention_heads
    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        tensors = {**dict(attn.named_parameters()), **dict(attn.named_buffers())}
        assert torch.equal(attn.o_norm.weight, torch.ones_like(attn.o_norm.weight))
        if attn.conv is not None:
            identity = torch.zeros_like(attn.conv.weight)
            identity[:, -1] = 1
            assert torch.equal(attn.conv.weight, identity), f"layer {i}: short conv is not the identity"
        for name, want in INIT_CHECKS[mixer].items():
            if name == "decay":
                want(attn, H)
                continue
            got = tensors[name]
            want = want(attn, H) if callable(want) else torch.full_like(got, want)
            torch.testing.assert_close(got, want.to(got.dtype),
                                       msg=f"layer {i} {mixer}: {name} is not initialised as documented")


# ------------------------------------------------------------------------------------------------
# 2. chunked == recurrent (kernels directly, and at the model level)
# ------------------------------------------------------------------------------------------------


def make_recurrence_inputs(B=2, T=21, H=3, K=8, V=6, gate=None, beta=None, delta=False, state=False, strong=False):
    x = lambda *s: torch.randn(*s, dtype=torch.float64)  # noqa: E731
    q, k, v = x(B, T, H, K), x(B, T, H, K), x(B, T, H, V)
    if delta:  # the delta rule is a contraction only for unit keys and 0 < beta < 2
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    shape = {"head": (B, T, H), "channel": (B, T, H, K)}.get(gate)
    g = None if shape is None else F.logsigmoid(x(*shape) + (-3.0 if strong else 2.0))
    if strong and g is not None:
        g = g * 20  # decays of e^-60 per step: must underflow cleanly, never overflow
    b = {None: None, "gate": torch.rand(B, T, H, dtype=torch.float64),
         "write": torch.exp(3 * x(B, T, H))}[beta]  # delta strength in (0, 1), or xLSTM's exp input gate
    s0 = x(B, H, K, V) if state else None
    return q, k, v, g, b, s0


RECURRENCE_CASES = [
    # gate,     beta,    delta, initial state, T, chunk
    (None, None, False, False, 21, 8),  # linear attention
    (None, None, False, True, 21, 8),
    ("head", None, False, False, 21, 8),  # retnet / simple gla
    ("head", None, False, True, 5, 8),  # shorter than one chunk
    ("channel", None, False, True, 21, 8),  # gla
    ("head", "write", False, True, 21, 8),  # mLSTM: decay and exp input gate
    (None, "gate", True, False, 21, 8),  # deltanet
    (None, "gate", True, True, 16, 8),  # T a multiple of the chunk
    ("head", "gate", True, True, 21, 8),  # gated deltanet
    ("channel", "gate", True, False, 21, 8),  # kda
    ("channel", "gate", True, True, 21, 5),
    ("channel", "gate", True, True, 21, 1),  # chunk of one token
    ("head", "gate", True, True, 1, 8),  # a single token
]


@pytest.mark.parametrize("gate, beta, delta, state, T, chunk", RECURRENCE_CASES)
def test_chunk_equals_recurrent(gate, beta, delta, state, T, chunk):
    # fp64 inputs: both forms compute in fp32 (the documented state dtype) and hand back fp64 outputs.
    q, k, v, g, b, s0 = make_recurrence_inputs(T=T, gate=gate, beta=beta, delta=delta, state=state)
    kw = dict(delta=delta, scale=8**-0.5, initial_state=s0)
    o_rec, s_rec = torch_recurrent(q, k, v, g, b, **kw)
    o_chk, s_chk = torch_chunk(q, k, v, g, b, chunk_size=chunk, **kw)
    assert o_chk.dtype == o_rec.dtype == torch.float64 and o_chk.shape == v.shape
    assert s_chk.shape == s_rec.shape == (2, 3, 8, 6)
    torch.testing.assert_close(o_chk, o_rec, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(s_chk, s_rec, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("gate", ["head", "channel"])
@pytest.mark.parametrize("delta", [False, True])
def test_chunk_strong_decay_is_finite(gate, delta):
    q, k, v, g, b, s0 = make_recurrence_inputs(gate=gate, beta="gate" if delta else None, delta=delta, state=True,
                                               strong=True)
    kw = dict(delta=delta, scale=8**-0.5, initial_state=s0)
    o_chk, s_chk = torch_chunk(q, k, v, g, b, chunk_size=8, **kw)
    assert o_chk.isfinite().all() and s_chk.isfinite().all()
    o_rec, s_rec = torch_recurrent(q, k, v, g, b, **kw)
    torch.testing.assert_close(o_chk, o_rec, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("gate", [None, "head", "channel"])
def test_recurrent_equals_quadratic_reference(gate):
    """Without the delta rule, o_t = scale * (sum_{s<=t} b_s sum_c q_tc k_sc e^(G_tc - G_sc) v_s + decayed state)."""
    q, k, v, g, b, s0 = make_recurrence_inputs(T=9, gate=gate, beta="write", state=True)
    scale = 0.3
    G = torch.zeros_like(q) if g is None else (g if g.dim() == 4 else g[..., None].expand_as(q)).cumsum(1)
    decay = (G[:, :, None] - G[:, None, :]).exp()  # [B, t, s, H, K]
    causal = torch.ones(9, 9, dtype=torch.bool).tril()[None, :, :, None]
    scores = torch.einsum("bthc,bshc,btshc->btsh", q, k, decay) * causal * b[:, None]
    want = scale * (torch.einsum("btsh,bshv->bthv", scores, v) + torch.einsum("bthc,bhcv->bthv", q * G.exp(), s0))
    got, _ = torch_recurrent(q, k, v, g, b, delta=False, scale=scale, initial_state=s0)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("mixer, attn_layers", ALL_CASES)
def test_model_chunk_size_does_not_change_logits(mixer, attn_layers):
    model = tiny_model(mixer, attn_layers)
    ids, mask = left_padded(torch.randint(1, VOCAB, (1, 21)), torch.randint(1, VOCAB, (1, 10)))
    logits = {}
    with torch.no_grad():
        for chunk in (3, 8, 64):  # 64 > T: one chunk
            model.config.chunk_size = chunk
            logits[chunk] = model(ids, attention_mask=mask, use_cache=False).logits
    torch.testing.assert_close(logits[3], logits[64], **TOL)
    torch.testing.assert_close(logits[8], logits[64], **TOL)


# ------------------------------------------------------------------------------------------------
# 3. decoding with the cache, left padding, generate  (7. and 8.: also hybrids, packed rows)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mixer, attn_layers", ALL_CASES)
def test_decoding_equals_full_forward(mixer, attn_layers):
    check_decoding(tiny_model(mixer, attn_layers))


@pytest.mark.parametrize("mixer, attn_layers", ALL_CASES)
def test_left_padding(mixer, attn_layers):
    check_left_padding(tiny_model(mixer, attn_layers))


@pytest.mark.parametrize("mixer, attn_layers", ALL_CASES)
def test_generate(mixer, attn_layers):
    check_generate(tiny_model(mixer, attn_layers))


@pytest.mark.parametrize("mixer, attn_layers", ALL_CASES)
def test_packed_sequences(mixer, attn_layers):
    check_packed(tiny_model(mixer, attn_layers))


@pytest.mark.parametrize("mixer, attn_layers", ALL_CASES)
@pytest.mark.parametrize("T", [1, 2, 3])
def test_short_inputs_without_cache(mixer, attn_layers, T):
    """Inputs shorter than the short convolution, as in training or use_cache=False, match the cached path."""
    model = tiny_model(mixer, attn_layers)
    ids = torch.randint(1, VOCAB, (2, T))
    with torch.no_grad():
        torch.testing.assert_close(model(ids, use_cache=False).logits, model(ids, use_cache=True).logits, **TOL)


def test_packed_sequences_with_padding_mask_raise():
    model = tiny_model("gla")
    ids = torch.randint(1, VOCAB, (1, 8))
    mask = torch.ones_like(ids)
    mask[0, 0] = 0
    with pytest.raises(ValueError, match="[Pp]acked"):
        model(ids, attention_mask=mask, position_ids=torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3]]), use_cache=False)


# ------------------------------------------------------------------------------------------------
# 3b. a sliding window and a sparse cache beside the linear state (modeling/memory.py)
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mixer, attn_layers, overrides", MEMORY_CASES)
def test_memory_decoding_padding_packing_generate(mixer, attn_layers, overrides):
    """The shared checks with a window / sparse cache: cached prefill + blocks + single tokens == full forward,
    left padding, packed rows, generate() with the cache == without and == each prompt alone."""
    model = tiny_model(mixer, attn_layers, **overrides)
    check_decoding(model)
    check_left_padding(model)
    check_packed(model)
    check_generate(model)


@pytest.mark.parametrize("mixer, attn_layers, overrides", MEMORY_CASES)
def test_memory_chunk_size_and_short_inputs(mixer, attn_layers, overrides):
    """Chunked forms of any chunk size (and the recurrent form of inputs up to 4 tokens) give the same logits."""
    model = tiny_model(mixer, attn_layers, **overrides)
    ids, mask = left_padded(torch.randint(1, VOCAB, (1, 21)), torch.randint(1, VOCAB, (1, 10)))
    logits = {}
    with torch.no_grad():
        for chunk in (1, 3, 64):
            model.config.chunk_size = chunk
            logits[chunk] = model(ids, attention_mask=mask, use_cache=False).logits
        short = torch.randint(1, VOCAB, (2, 3))
        torch.testing.assert_close(model(short, use_cache=False).logits, model(short, use_cache=True).logits, **TOL)
    torch.testing.assert_close(logits[1], logits[64], **TOL)
    torch.testing.assert_close(logits[3], logits[64], **TOL)


@pytest.mark.parametrize("overrides", [{"window_size": 4}, {"window_size": 5, "sparse_cache_size": 2}])
def test_memory_forward_backward(overrides):
    check_forward_backward(tiny_model("kda", **overrides))  # the null logit gets a gradient too


def _reference_memory_heads(mixer, x):
    """memory.py's head outputs, token by token from its docstring alone: absorb the token leaving the window into
    the state (one recurrent step), score it by ||v - S^T k|| right after, keep the G worst-recalled absorbed tokens,
    then softmax over window + cache + the null logit (b_h + log of the tokens only the state holds)."""
    W, G = mixer.memory.window, mixer.memory.sparse
    B, T, _ = x.shape
    H, Hkv, D = mixer.num_heads, mixer.num_kv_heads, mixer.head_dim
    q, k, v = mixer.features(*mixer.project(x))
    g, beta = mixer.gates(x)
    if mixer.qk_l2norm:
        q, k = F.normalize(q.float(), dim=-1), F.normalize(k.float(), dim=-1)
    theta = mixer.config.rope_theta
    angle = torch.arange(T)[:, None].float() / theta ** (torch.arange(0, D, 2).float() / D)  # [T, D/2]
    cos, sin = torch.cat([angle, angle], -1).cos(), torch.cat([angle, angle], -1).sin()

    def rotated(proj, heads):
        y = proj(x).view(B, T, heads, D).float()
        return y * cos[:, None] + torch.cat([-y[..., D // 2:], y[..., : D // 2]], -1) * sin[:, None]

    qs, ks = rotated(mixer.q_proj, H), rotated(mixer.k_proj, Hkv).repeat_interleave(H // Hkv, 2)
    vs = mixer.v_proj(x).view(B, T, Hkv, D).float().repeat_interleave(H // Hkv, 2)
    out = torch.zeros(B, T, H, D)
    for b in range(B):
        S = torch.zeros(1, H, D, v.shape[-1])
        cache = [[] for _ in range(H)]  # per head: (-error, index) of the cached tokens
        for t in range(T):
            j = t - W
            if j >= 0:
                step = lambda y: None if y is None else y[b : b + 1, j : j + 1]  # noqa: E731
                recalled, S = torch_recurrent(step(k), step(k), step(v), step(g), step(beta), delta=mixer.delta,
                                              scale=mixer.scale, initial_state=S)
                error = (v[b, j, :, :D] - recalled[0, 0, :, :D] / mixer.scale).norm(dim=-1)
                for h in range(H):
                    cache[h] = sorted(cache[h] + [(-error[h].item(), j)])[:G]
            lin = mixer.scale * torch.einsum("hkv,hk->hv", S[0], q[b, t].float())
            normed = mixer.o_norm(mixer.readout(lin[None, None]))[0, 0].float()
            for h in range(H):
                keys = list(range(max(0, t - W + 1), t + 1)) + [i for _, i in cache[h]]
                logits = [qs[b, t, h] @ ks[b, i, h] / D**0.5 for i in keys]
                only_state = max(0, j + 1) - len(cache[h])
                if only_state:
                    logits.append(mixer.memory.null_logit[h] + math.log(only_state))
                p = torch.stack(logits).softmax(0)
                out[b, t, h] = sum(p[n] * vs[b, i, h] for n, i in enumerate(keys))
                if only_state:
                    out[b, t, h] += p[-1] * normed[h]
    return out


@pytest.mark.parametrize("mixer, overrides", [
    ("gated_deltanet", {"window_size": 4}), ("gla", {"window_size": 1}), ("gated_deltanet", {"sparse_cache_size": 3}),
    ("kda", {"window_size": 3, "sparse_cache_size": 2}), ("deltanet", {"window_size": 30}),
])
def test_memory_equals_token_by_token_reference(mixer, overrides):
    from linzoo.modeling.memory import memory_forward

    model = tiny_model(mixer, **overrides)
    attn = model.model.layers[0].self_attn
    with torch.no_grad():
        attn.memory.null_logit.copy_(torch.randn(attn.num_heads))
        x = torch.randn(2, 19, 32)
        want = _reference_memory_heads(attn, x)
        got = memory_forward(attn, x, torch.ones(2, 19, dtype=torch.bool))
    torch.testing.assert_close(got.float(), want, **TOL)


def test_window_longer_than_the_input_is_the_teacher(llama_teacher):
    """With the window covering the input the linear part has weight 0: the student is its teacher, from the plain
    start and from the start fitted to the teacher (which leaves the softmax part alone)."""
    ids = torch.randint(1, VOCAB, (2, 15))
    with torch.no_grad():
        want = llama_teacher(ids).logits
        for calibration in (None, torch.randint(1, VOCAB, (2, 24))):
            student = linzoo.linearize(llama_teacher, "gated_deltanet", calibration=calibration, window_size=16).eval()
            torch.testing.assert_close(student(ids).logits, want, **TOL)
    assert student.model.layers[0].self_attn.memory.null_logit.abs().sum() > 0  # fitted to the teacher's scores


def test_memory_cache_is_bounded():
    """The cache holds W + G entries per layer whatever the context length."""
    model = tiny_model("gated_deltanet", window_size=4, sparse_cache_size=3)
    sizes = []
    with torch.no_grad():
        for T in (6, 30):
            cache = cache_of(model(torch.randint(1, VOCAB, (1, T)), use_cache=True))
            sizes.append([tuple(t.shape) for t in cache.layers[0].recurrent_states.values()])
    assert sizes[0] == sizes[1] and sizes[0][1][1] == 4 and sizes[0][2][1] == 3


@pytest.mark.parametrize("mixer", ["gla", "gated_deltanet"])
def test_memory_token_weights(mixer):
    """A window layer's token weights (the heads eval's view of it): with a unit output-norm gain they give the head
    outputs exactly from the values (gla: no short conv, so the linear and softmax parts share them); with the window
    covering the whole context they are the teacher's softmax; a sparse cache refuses in one sentence."""
    from linzoo.modeling.memory import memory_forward

    torch.manual_seed(1)
    x = torch.randn(2, 11, 32)
    attn = tiny_model(mixer, window_size=4).model.layers[0].self_attn
    w = attn.token_weights(x)  # [B, H, T, T]
    assert w.shape == (2, attn.num_heads, 11, 11) and torch.all(w.triu(1) == 0)
    if mixer == "gla":
        with torch.no_grad():
            attn.o_norm.weight.fill_(1.0)
            heads = memory_forward(attn, x, torch.ones(2, 11, dtype=torch.bool))
            raw = memory_forward(attn, x, torch.ones(2, 11, dtype=torch.bool), parts=True)[2]
        w = attn.token_weights(x)
        v = attn.v_proj(x).view(2, 11, attn.num_kv_heads, -1).repeat_interleave(attn.num_heads // attn.num_kv_heads, 2)
        gain = 1 / raw.float().pow(2).mean(-1, keepdim=True).add(attn.o_norm.eps).sqrt()  # RMSNorm's own factor
        assert torch.allclose(gain * raw.float().norm(dim=-1, keepdim=True),
                              attn.o_norm(raw).float().norm(dim=-1, keepdim=True), rtol=1e-4)
        torch.testing.assert_close(torch.einsum("bhts,bshd->bthd", w, v.float()), heads.float(), atol=2e-5, rtol=2e-4)
    whole = tiny_model(mixer, window_size=16).model.layers[0].self_attn  # window >= T: p_null = 0
    w = whole.token_weights(x)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, whole.num_heads, 11))
    with pytest.raises(NotImplementedError, match="sparse_cache_size"):
        tiny_model(mixer, window_size=4, sparse_cache_size=2).model.layers[0].self_attn.token_weights(x)


def test_sparse_cache_set_at_load(tmp_path):
    """A student saved without it gets a sparse cache at load (trust_remote_code), its null logit at its start, and
    no load report calling that logit MISSING (the README's inference option printed 30 such lines)."""
    from transformers import AutoModelForCausalLM

    tiny_model("gated_deltanet").save_pretrained(tmp_path)
    model, info = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True, sparse_cache_size=3,
                                                       output_loading_info=True)
    model.eval()
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert model.config.sparse_cache_size == 3
    assert torch.equal(model.model.layers[0].self_attn.memory.null_logit, torch.zeros(4))
    check_decoding(model)


# ------------------------------------------------------------------------------------------------
# 4. save_pretrained -> AutoModelForCausalLM.from_pretrained(trust_remote_code=True) in a fresh process
# ------------------------------------------------------------------------------------------------

REMOTE_CODE_FILES = {"configuration_linzoo.py", "modeling_linzoo.py", "mixers.py", "mixer_base.py", "kernels.py", "memory.py",
                     "linear_ops.py", *(f"mixer_{name}.py" for name in linzoo.MIXERS)}
OPTIONAL_KERNEL_PACKAGES = {"fla", "mlstm_kernels"}
FORBIDDEN_NAMES = {"subprocess", "urllib", "urllib3", "requests", "socket", "http", "httpx", "aiohttp"}

RELOAD_SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    sys.modules["linzoo"] = None  # the saved folder alone must suffice
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(1)
    root, results, ok = Path(sys.argv[1]), {}, True
    for name in sys.argv[2:]:
        data = torch.load(root / f"{name}.pt")
        model = AutoModelForCausalLM.from_pretrained(root / name, trust_remote_code=True).eval()
        with torch.no_grad():
            logits = model(data["ids"], attention_mask=data["mask"]).logits
        same = torch.equal(logits, data["logits"])
        ok &= same
        results[name] = {"module": type(model).__module__, "class": type(model).__name__, "identical": same,
                         "max_diff": (logits - data["logits"]).abs().max().item(), "mixer": model.config.mixer,
                         "attn_layers": list(model.config.attn_layers)}
    (root / "results.json").write_text(json.dumps(results))
    sys.exit(0 if ok else 1)
""")


@pytest.fixture(scope="module")
def saved_and_reloaded(tmp_path_factory):
    """Every case saved with save_pretrained, then all reloaded in ONE fresh interpreter (imports cost seconds)."""
    root = tmp_path_factory.mktemp("saved")
    ids, mask = left_padded(torch.randint(1, VOCAB, (1, 19)), torch.randint(1, VOCAB, (1, 7)))
    for name, (mixer, attn_layers, overrides) in CASE_IDS.items():
        model = tiny_model(mixer, attn_layers, **overrides)
        model.save_pretrained(root / name)
        with torch.no_grad():
            logits = model(ids, attention_mask=mask).logits
        torch.save({"ids": ids, "mask": mask, "logits": logits}, root / f"{name}.pt")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(root / "hf_modules")}
    proc = subprocess.run([sys.executable, "-c", RELOAD_SCRIPT, str(root), *CASE_IDS], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    results_file = root / "results.json"
    results = json.loads(results_file.read_text()) if results_file.is_file() else {}
    return root, proc, results


def test_fresh_process_reload_exits_cleanly(saved_and_reloaded):
    root, proc, results = saved_and_reloaded
    bad = {name: r["max_diff"] for name, r in results.items() if not r["identical"]}
    assert proc.returncode == 0, f"exit {proc.returncode}; logits differ for {bad}\n{proc.stderr[-3000:]}"


@pytest.mark.parametrize("case", list(CASE_IDS))
def test_save_and_load_in_fresh_process(case, saved_and_reloaded):
    root, proc, results = saved_and_reloaded
    assert case in results, f"the fresh process did not get to {case} (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    got = results[case]
    mixer, attn_layers, _ = CASE_IDS[case]
    assert got["identical"], f"reloaded logits differ by up to {got['max_diff']}"
    assert got["module"].startswith("transformers_modules.") and got["class"] == "LinzooForCausalLM", got
    assert (got["mixer"], got["attn_layers"]) == (mixer, list(attn_layers))


@pytest.mark.parametrize("mixer, attn_layers", ALL_CASES)
def test_save_and_load_in_process(mixer, attn_layers, tmp_path):
    model = tiny_model(mixer, attn_layers)
    model.save_pretrained(tmp_path)
    again = LinzooForCausalLM.from_pretrained(tmp_path).eval()
    for (name, want), (_, got) in zip(model.named_buffers(), again.named_buffers()):
        torch.testing.assert_close(got, want, msg=f"buffer {name} differs after from_pretrained")
    ids = torch.randint(1, VOCAB, (2, 11))
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)


@pytest.mark.parametrize("case", list(CASE_IDS))
def test_saved_folder_is_a_remote_code_bundle(case, saved_and_reloaded):
    folder = saved_and_reloaded[0] / case
    assert REMOTE_CODE_FILES <= {p.name for p in folder.glob("*.py")}
    for name in REMOTE_CODE_FILES:  # what ships is exactly the package's modeling code
        assert (folder / name).read_text() == (MODELING_DIR / name).read_text(), name
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"] == {"AutoConfig": "configuration_linzoo.LinzooConfig",
                                  "AutoModelForCausalLM": "modeling_linzoo.LinzooForCausalLM"}
    assert config["model_type"] == "linzoo" and config["mixer"] == CASE_IDS[case][0]
    assert (folder / "model.safetensors").is_file()


def _catches_import_error(try_node):
    names = set()
    for handler in try_node.handlers:
        if handler.type is None:
            return True
        for t in handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]:
            names.add(getattr(t, "id", getattr(t, "attr", "")))
    return bool(names & {"ImportError", "ModuleNotFoundError", "Exception"})


def remote_code_problems(source):
    """Imports other than torch/transformers/stdlib (fla, mlstm_kernels only under try/except ImportError),
    and any use of network or process modules."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    allowed = set(sys.stdlib_module_names) | {"torch", "transformers"}
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if isinstance(node, ast.ImportFrom) and node.level:
                continue  # the bundle's own files
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            roots = [m.split(".")[0] for m in modules]
            for root in roots:
                if root in FORBIDDEN_NAMES:
                    problems.append(f"line {node.lineno}: imports {root}")
                elif root in OPTIONAL_KERNEL_PACKAGES:
                    child, up = node, parents.get(node)
                    while up is not None and not (isinstance(up, ast.Try) and child in up.body):
                        child, up = up, parents.get(up)
                    if up is None or not _catches_import_error(up):
                        problems.append(f"line {node.lineno}: {root} imported outside try/except ImportError")
                elif root not in allowed:
                    problems.append(f"line {node.lineno}: imports {root}")
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            problems.append(f"line {node.lineno}: uses {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_NAMES | {"system", "popen", "urlopen"}:
            problems.append(f"line {node.lineno}: uses .{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in FORBIDDEN_NAMES:
            problems.append(f"line {node.lineno}: names {node.value!r}")
    return problems


@pytest.mark.parametrize("name", sorted(REMOTE_CODE_FILES))
def test_remote_code_imports_only_torch_transformers_stdlib(name):
    assert remote_code_problems((MODELING_DIR / name).read_text()) == []


def test_remote_code_checker_catches_violations():
    bad = "import requests\nimport fla\nfrom numpy import zeros\ndef f():\n    import subprocess\n    os.system('x')\n"
    good = ("try:\n    from fla.ops import chunk\nexcept ImportError:\n    chunk = None\n"
            "import torch\nfrom .x import y\n")
    assert len(remote_code_problems(bad)) == 5
    assert remote_code_problems(good) == []


# ------------------------------------------------------------------------------------------------
# 5. configuration errors
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, fragments", [
    ({"mixer": "mamba"}, ["mixer", "'mamba'", *map(repr, linzoo.MIXERS)]),
    ({"kernel_backend": "cuda"}, ["kernel_backend", "'auto'", "'fast'", "'torch'"]),
    ({"feature_map": "softmax"}, ["feature_map"]),
    ({"attn_layers": [2]}, ["attn_layers", "[2]"]),
    ({"attn_layers": [0, -1]}, ["attn_layers", "-1"]),
    ({"num_key_value_heads": 3}, ["num_key_value_heads"]),
    ({"hidden_size": 30}, ["hidden_size"]),
    ({"conv_size": 1}, ["conv_size"]),
    ({"chunk_size": 0}, ["chunk_size"]),
    ({"window_size": -1}, ["window_size", "-1"]),
    ({"sparse_cache_size": 1.5}, ["sparse_cache_size", "1.5"]),
])
def test_config_errors(kwargs, fragments):
    with pytest.raises(ValueError) as err:
        LinzooConfig(**{**TINY, **kwargs})
    for fragment in fragments:
        assert fragment in str(err.value), (fragment, str(err.value))


@pytest.mark.parametrize("mixer", linzoo.MIXERS)
def test_fast_backend_on_cpu_says_what_to_install(mixer):
    model = tiny_model(mixer, kernel_backend="fast")
    with pytest.raises(RuntimeError) as err:
        model(torch.randint(1, VOCAB, (1, 5)))
    message = str(err.value)
    assert "pip install" in message and "kernel_backend" in message
    assert ("mlstm-kernels" if mixer == "xlstm" else "flash-linear-attention") in message


def test_deltanet_float32_prefill_takes_the_torch_path_where_fla_refuses_it(monkeypatch):
    """fla's chunked delta rule asserts its inputs are not float32 (met on an H100: the fitted start runs the student
    in float32 and every DeltaNet row of the GPU zoo failed). A float32 prefill or training step of DeltaNet takes the
    torch path, with the torch path's numbers; bf16 prefills and float32 decoding steps still reach the kernels; other
    mixers' kernels take float32 as before."""
    from linzoo.modeling import kernels
    from linzoo.modeling.mixer_deltanet import DeltaNet

    calls = []

    def chunk(q, *args, **kw):  # fla's assert, then a stand-in result
        assert q.dtype != torch.float32, "ChunkDeltaRuleFunction does not support float32. Please use bfloat16."
        calls.append(("chunk", q.dtype))
        return torch.zeros_like(q), None

    def recurrent(q, *args, **kw):
        calls.append(("recurrent", q.dtype))
        return torch.zeros_like(q), None

    monkeypatch.setattr(kernels, "FAST_DEVICE_TYPES", ("cpu",))  # as if this CPU were the card
    monkeypatch.setattr(DeltaNet.fast_kernels, "_loaded", {"chunk": chunk, "recurrent": recurrent})
    config = LinzooConfig(**{**TINY, "kernel_backend": "auto"}, mixer="deltanet")
    layer = DeltaNet(config, 0)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 80, 2, 8) for _ in range(3))
    beta = torch.rand(1, 80, 2)
    o, _ = kernels.linear_core(config, layer, q, k, v, None, beta)
    want, _ = kernels.torch_core(config, q, k, v, None, beta, delta=True, scale=layer.scale, initial_state=None,
                                 output_final_state=False, qk_l2norm=layer.qk_l2norm)
    torch.testing.assert_close(o, want)
    assert not calls
    kernels.linear_core(config, layer, q.bfloat16(), k.bfloat16(), v.bfloat16(), None, beta)
    with torch.no_grad():
        kernels.linear_core(config, layer, q[:, :1], k[:, :1], v[:, :1], None, beta[:, :1])
    assert calls == [("chunk", torch.bfloat16), ("recurrent", torch.float32)]
    from linzoo.modeling.mixer_base import LinearMixer
    from linzoo.modeling.mixers import MIXER_CLASSES

    assert [n for n, cls in MIXER_CLASSES.items() if cls.fast_takes is not LinearMixer.fast_takes] == ["deltanet"]


def test_config_roundtrips_through_dict():
    config = LinzooConfig(**TINY, mixer="kda", attn_layers=[1], teacher="tiny/llama")
    again = LinzooConfig.from_dict(config.to_dict())
    for key in ("mixer", "attn_layers", "chunk_size", "use_short_conv", "teacher", "layer_types", "head_dim"):
        assert getattr(again, key) == getattr(config, key), key
    assert again.layer_types == ["linear_attention", "full_attention"]


# ------------------------------------------------------------------------------------------------
# 6. linearize: the teacher's tensors are copied exactly
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_teacher():
    return tiny_llama()


@pytest.mark.parametrize("mixer", linzoo.MIXERS)
def test_linearize_copies_every_teacher_tensor(mixer, llama_teacher):
    student = linzoo.linearize(llama_teacher, mixer)
    teacher_state = llama_teacher.state_dict()
    student_state = student.state_dict()
    kinds = set()
    for name, tensor in teacher_state.items():
        assert name in student_state, f"{name} has no place in the student"
        assert torch.equal(student_state[name], tensor), f"{name} was not copied exactly"
        kinds.add(name.split(".")[-2])
    assert {"embed_tokens", "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
            "input_layernorm", "post_attention_layernorm", "norm", "lm_head"} <= kinds
    assert student.config.mixer == mixer and student.config.teacher == "tiny/llama-teacher"
    assert set(fresh_parameters(student)) == set(new_params(student))
    assert all(torch.isfinite(p).all() for p in student.parameters())
    with torch.no_grad():
        assert student(torch.randint(1, VOCAB, (1, 9))).logits.isfinite().all()


def test_linearize_tied_teacher_gives_tied_student():
    teacher = tiny_llama(tie=True)
    student = linzoo.linearize(teacher, "gla")
    assert student.config.tie_word_embeddings
    assert student.lm_head.weight.data_ptr() == student.model.embed_tokens.weight.data_ptr()
    assert torch.equal(student.lm_head.weight, teacher.lm_head.weight)


def test_linearize_all_attention_layers_reproduces_the_teacher(llama_teacher):
    """A 'hybrid' that keeps softmax attention everywhere is the teacher: checks RoPE, GQA and masking."""
    student = linzoo.linearize(llama_teacher, "gated_deltanet", attn_layers=[0, 1])
    ids = torch.randint(1, VOCAB, (2, 15))
    with torch.no_grad():
        torch.testing.assert_close(student(ids).logits, llama_teacher(ids).logits, **TOL)
        prompts, mask = left_padded(torch.randint(1, VOCAB, (1, 9)), torch.randint(1, VOCAB, (1, 4)))
        kw = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0)
        assert torch.equal(student.generate(prompts, **kw), llama_teacher.generate(prompts, **kw))


def test_linearize_rejects_non_llama_teacher():
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64))
    with pytest.raises(ValueError, match="not supported"):
        linzoo.linearize(gpt2, "gla")


# ------------------------------------------------------------------------------------------------
# 9. the real teacher (SmolLM2-135M-Instruct) and loading errors
# ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_embedded_teacher_answers_paris(embedded_teacher):
    model, tokenizer = embedded_teacher
    assert model.config.model_type == "llama" and model.config.num_hidden_layers == 30
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer


@pytest.mark.slow
@pytest.mark.parametrize("mixer", linzoo.MIXERS)
def test_linearized_embedded_teacher_runs(embedded_teacher, mixer):
    teacher, tokenizer = embedded_teacher
    student = linzoo.linearize(teacher, mixer).eval()
    assert student.config.teacher == linzoo.loading.EMBEDDED_TEACHER and student.config.mixer == mixer
    assert torch.equal(student.model.layers[7].mlp.down_proj.weight, teacher.model.layers[7].mlp.down_proj.weight)
    inputs = tokenizer("The capital of France is a city on the river Seine.", return_tensors="pt")
    with torch.no_grad():
        logits = student(**inputs).logits
        assert logits.shape == (1, inputs["input_ids"].shape[1], teacher.config.vocab_size)
        assert logits.isfinite().all()
        out = student.generate(**inputs, max_new_tokens=4, do_sample=False, min_new_tokens=4)
    assert out.shape[1] == inputs["input_ids"].shape[1] + 4
    assert isinstance(tokenizer.decode(out[0, -4:]), str)


def test_load_teacher_with_missing_gguf_override(monkeypatch, tmp_path):
    missing = tmp_path / "nowhere" / "SmolLM2.gguf"
    monkeypatch.setenv("LINZOO_TEACHER_GGUF", str(missing))
    with pytest.raises(FileNotFoundError) as err:
        linzoo.load_teacher("embedded")
    assert "LINZOO_TEACHER_GGUF" in str(err.value) and str(missing) in str(err.value)


def test_load_missing_gguf_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        linzoo.load_model(str(tmp_path / "missing.gguf"))


def test_load_unknown_hub_model_offline(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read once at import
    with pytest.raises((FileNotFoundError, OSError)):
        linzoo.load_model("no/such-model-here")


# ------------------------------------------------------------------------------------------------
# fused ops (fla's RMSNorm, SwiGLU, short conv, cross-entropy on CUDA): the plumbing, on CPU
# ------------------------------------------------------------------------------------------------


def _fla_causal_conv1d(x, weight, activation=None, cu_seqlens=None):
    """fla's causal_conv1d as documented: y_t = sum_j weight[:, W-1-j] x_{t-j}, never across cu_seqlens bounds."""
    assert activation == "silu" and x.dim() == 3 and weight.shape == (x.shape[-1], 4)
    bounds = [0, x.shape[1]] if cu_seqlens is None else cu_seqlens.tolist()
    assert cu_seqlens is None or x.shape[0] == 1
    out = torch.zeros_like(x)
    for s, e in zip(bounds[:-1], bounds[1:]):
        seg = F.pad(x[:, s:e].transpose(1, 2), (weight.shape[1] - 1, 0))
        out[:, s:e] = F.conv1d(seg, weight[:, None], groups=x.shape[-1]).transpose(1, 2)
    return F.silu(out), None


class _FusedCE:  # fla.modules.FusedCrossEntropyLoss: [N, V] logits, [N] targets, mean over non-ignored or sum
    def __init__(self, ignore_index, reduction):
        self.ignore_index, self.reduction = ignore_index, reduction

    def __call__(self, logits, targets):
        return F.cross_entropy(logits.float(), targets, ignore_index=self.ignore_index, reduction=self.reduction)


@pytest.mark.parametrize("mixer", ["gated_deltanet", "linear_attn"])  # short conv + delta rule; neither
def test_fused_ops_plumbing(mixer, monkeypatch):
    """With `use_fused_ops` on, every RMSNorm, SwiGLU, short conv and the loss go through `kernels`' fla
    wrappers. Torch stand-ins with fla's documented semantics take the kernels' place: the model must give the
    torch path's logits, loss (mean, and summed over `num_items_in_batch`) and gradients, packed rows included.
    (That fla's kernels meet those semantics: experiments/kernels_cpu/fused_ops_interpreter_check.py runs them on CPU
    through Triton's interpreter; on the GPU, scripts/bench_speed.py's whole-model parity.)"""
    from linzoo.modeling import kernels, mixer_base, modeling_linzoo

    calls = {"norm": 0, "swiglu": 0, "conv": 0, "ce": 0}

    def count(name, fn):
        def wrapped(*a, **kw):
            calls[name] += 1
            return fn(*a, **kw)
        return wrapped

    def rms(x, w, b, eps):
        return (w * (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)

    monkeypatch.setattr(kernels.FUSED_OPS, "_loaded", {
        "rms_norm": count("norm", rms), "swiglu": count("swiglu", lambda g, u: F.silu(g) * u),
        "causal_conv1d": count("conv", _fla_causal_conv1d), "cross_entropy": count("ce", _FusedCE),
    })

    model = tiny_model(mixer).train()
    ids = torch.randint(1, VOCAB, (2, 21))
    labels = ids.clone()
    labels[0, :5] = -100
    lengths = (7, 2, 12)
    packed_pos = torch.cat([torch.arange(n) for n in lengths])[None]

    def run(**kw):
        model.zero_grad()
        out = model(ids, labels=labels, **kw)
        out.loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        packed = model(ids[:1], position_ids=packed_pos).logits
        return out.logits.detach(), out.loss.detach(), grads, packed.detach()

    ref = [run(), run(num_items_in_batch=torch.tensor(30))]
    monkeypatch.setattr(mixer_base, "use_fused_ops", lambda config, device: True)
    monkeypatch.setattr(modeling_linzoo, "use_fused_ops", lambda config, device: True)
    fused = [run(), run(num_items_in_batch=torch.tensor(30))]
    L = model.config.num_hidden_layers
    conv_per_forward = L if model.config.use_short_conv else 0
    # per run(): 2 forwards x (2 norms per layer + the final norm + o_norm per layer); 1 CE (the packed forward has no labels)
    assert calls == {"norm": 2 * 2 * (3 * L + 1), "swiglu": 2 * 2 * L, "conv": 2 * 2 * conv_per_forward, "ce": 2}
    for (lo, lf, gr, pk), (lo2, lf2, gr2, pk2) in zip(ref, fused):
        torch.testing.assert_close(lo2, lo, **TOL)
        torch.testing.assert_close(lf2, lf, **TOL)
        torch.testing.assert_close(pk2, pk, **TOL)
        assert gr.keys() == gr2.keys()
        for name in gr:
            torch.testing.assert_close(gr2[name], gr[name], **TOL, msg=name)
    assert not torch.allclose(ref[0][1], ref[1][1])  # the two reductions differ, so both were checked
    before = calls["conv"]
    check_decoding(model.eval())  # the cached window goes through the fused conv too (prefill and steps)
    check_left_padding(model)
    assert calls["conv"] > before or not model.config.use_short_conv


@pytest.mark.parametrize("mixer", linzoo.MIXERS)
def test_graphed_decoder_steps_equal_generate(mixer):
    """The CUDA-graph decoder's static-buffer step, run eagerly (graph=False), gives generate()'s greedy tokens
    from the first on, twice in a row (each call starts again just after the prompt)."""
    from linzoo.modeling.graph_decoding import GraphedDecoder

    model = tiny_model(mixer, initializer_range=0.5)  # large weights: varied greedy tokens
    prompt = torch.randint(1, VOCAB, (1, 9))
    with torch.no_grad():
        reference = model.generate(prompt, max_new_tokens=12, min_new_tokens=12, do_sample=False)[:, 9:]
    assert len(reference.unique()) > 2, "a near-constant reference would not tell a wrong step from a right one"
    decoder = GraphedDecoder(model, prompt, graph=False)
    assert torch.equal(decoder.generate(12), reference)
    assert torch.equal(decoder.generate(12), reference)


@pytest.mark.parametrize("overrides", [{"window_size": 4}, {"window_size": 3, "sparse_cache_size": 2}],
                         ids=["window4", "window3-sparse2"])
def test_graphed_decoder_steps_equal_generate_with_a_window(overrides):
    """The static-buffer step of a windowed student (its ring attended by `memory._window_step`; with a sparse cache,
    the blocked ranking) gives generate()'s greedy tokens, twice in a row."""
    from linzoo.modeling.graph_decoding import GraphedDecoder

    model = tiny_model("gated_deltanet", initializer_range=0.5, **overrides)
    prompt = torch.randint(1, VOCAB, (1, 9))
    with torch.no_grad():
        reference = model.generate(prompt, max_new_tokens=12, min_new_tokens=12, do_sample=False)[:, 9:]
    assert len(reference.unique()) > 2
    decoder = GraphedDecoder(model, prompt, graph=False)
    assert torch.equal(decoder.generate(12), reference) and torch.equal(decoder.generate(12), reference)


def test_graphed_decoder_refuses_cpu_graphs_and_hybrids():
    from linzoo.modeling.graph_decoding import GraphedDecoder

    with pytest.raises(ValueError, match="graph=False"):
        GraphedDecoder(tiny_model("gla"), torch.randint(1, VOCAB, (1, 4)))
    with pytest.raises(ValueError, match="hybrid"):
        GraphedDecoder(tiny_model("gla", attn_layers=[0]), torch.randint(1, VOCAB, (1, 4)), graph=False)


@pytest.mark.parametrize("mixer", ["gated_deltanet", "xlstm"])
def test_generate_with_graph_decoding_equals_generate(mixer, monkeypatch):
    """generate(custom_generate=model.graph_decoding) gives generate()'s own greedy sequences: a batch without
    eos, then with an eos that ends one row early (padded after it) and, later, the other (generation stops)."""
    from linzoo.modeling import graph_decoding as module

    plain, why = module._plain_greedy, []
    monkeypatch.setattr(module, "_plain_greedy", lambda *a: why.append(plain(*a)) or why[-1])
    model = tiny_model(mixer, initializer_range=0.5)
    prompt = torch.randint(1, VOCAB, (2, 7))
    kw = dict(max_new_tokens=20, do_sample=False)
    with torch.no_grad():
        reference = model.generate(prompt, **kw)
        assert torch.equal(model.generate(prompt, custom_generate=model.graph_decoding, **kw), reference)
        new = reference[:, 7:]
        # an eos both rows emit (generation stops when the later one does), else one that only row 0 emits early
        both = [t for t in new[0, 2:].tolist() if t in new[1].tolist()]
        for eos in ([both[0]] if both else []) + [int(new[0, 3])]:
            with_eos = model.generate(prompt, eos_token_id=eos, pad_token_id=0, **kw)
            graphed = model.generate(prompt, eos_token_id=eos, pad_token_id=0, custom_generate=model.graph_decoding,
                                     **kw)
            assert (with_eos[0, 7:] == 0).any()  # row 0 was padded after its eos
            assert torch.equal(graphed, with_eos)
    assert both, "no eos shared by the rows: the early stop went untested"
    assert why and set(why) == {None}, why  # every call above took the graph decoder's loop, none generate()'s


def test_graph_decoding_hands_other_modes_to_generate():
    """Sampling (and padding, hybrids, processors) runs generate()'s own loop: the same tokens for the same seed."""
    model = tiny_model("gla", initializer_range=0.5)
    prompt = torch.randint(1, VOCAB, (1, 5))
    kw = dict(max_new_tokens=8, do_sample=True, top_k=0, top_p=1.0, temperature=1.0)
    with torch.no_grad():
        torch.manual_seed(3)
        reference = model.generate(prompt, **kw)
        torch.manual_seed(3)
        assert torch.equal(model.generate(prompt, custom_generate=model.graph_decoding, **kw), reference)
    from linzoo.modeling.graph_decoding import _plain_greedy
    from transformers import GenerationConfig

    assert "sampling" in _plain_greedy(model, [], GenerationConfig(do_sample=True), None, {})
    assert "padding" in _plain_greedy(model, [], GenerationConfig(), None, {"attention_mask": torch.tensor([[0, 1]])})
    assert "hybrid" in _plain_greedy(tiny_model("gla", attn_layers=[0]), [], GenerationConfig(), None, {})
