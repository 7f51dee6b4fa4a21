"""The CPU paths made faster (issue 31, item 2) against frozen copies of the forms they replaced: the same numbers
(fp32 tolerance), the same gradients, and cached step-by-step decoding == one uncached forward.

- `linear_ops.torch_chunk`: chunks laid out [N, B H, C, D], one decay matrix shared by A and the delta rule's system,
  the states and values of every chunk stacked so that the outputs are two batched matmuls after the loop;
- `linear_ops.torch_recurrent` (every decoding step): decays for all steps at once, batched products, no state clone;
- `kernels.torch_core`'s q/k L2 norm without F.normalize's Python layers;
- `mixer_base.ShortConv`: each tap added in place into the rows it reaches (no padded copies of x);
- `memory._banded_window`: the softmax normalised after the values are summed (no logsumexp passes), blocks of
  max(W / 4, 8) queries instead of max(W, 64), no padding copies when T fills whole blocks;
- `memory.memory_forward`: q/k/v projected once (the linear part and the softmax read them; they were projected
  twice), RoPE angles once for q and k, the cached window a ring: a decoding step writes its row over the leaving one
  in place instead of unpacking, shifting and packing all W rows (the counts state gains the ring's start).

The model-level tests run a tiny student with all the frozen forms patched in against the current code.
"""

import pytest
import torch
import torch.nn.functional as F

from linzoo.modeling import kernels, memory, mixer_base
from linzoo.modeling.kernels import _l2_normalize
from linzoo.modeling.linear_ops import _expand_gate, torch_chunk, torch_recurrent
from linzoo.modeling.memory import NEVER

TOL = dict(atol=1e-5, rtol=1e-5)  # a rewritten function against its frozen copy
FORMS_TOL = dict(atol=1e-5, rtol=1e-4)  # chunked against recurrent forms (tests/test_modeling.py's)


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


# ------------------------------------------------------------------------------------------------
# linear_ops.torch_chunk as it was (frozen copy)
# ------------------------------------------------------------------------------------------------


def reference_torch_chunk(q, k, v, g=None, beta=None, *, delta, scale, initial_state=None, output_final_state=True,
                          chunk_size=64):
    dtype = v.dtype
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = chunk_size
    pad = (-T) % C
    g = _expand_gate(g, q)
    if beta is None:
        beta = q.new_ones(B, T, H)
    q, k, v, g = (F.pad(x.float(), (0, 0, 0, 0, 0, pad)) for x in (q, k, v, g))
    beta = F.pad(beta.float(), (0, 0, 0, pad))
    N = (T + pad) // C

    def chunks(x):
        return x.view(B, N, C, H, -1).permute(0, 3, 1, 2, 4)

    q, k, v, g = map(chunks, (q, k, v, g))
    beta = beta.view(B, N, C, H).permute(0, 3, 1, 2)
    q = q * scale
    G = g.cumsum(-2)
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()

    def decayed_products(a, b, strict):
        mask = causal.tril(-1) if strict else causal
        if G.shape[-1] == 1:
            diff = (G[..., :, None, 0] - G[..., None, :, 0]).masked_fill(~mask, float("-inf"))
            return (a @ b.transpose(-1, -2)) * diff.exp()
        diff = (G[..., :, None, :] - G[..., None, :, :]).masked_fill(~mask[..., None], float("-inf"))
        return torch.einsum("...ic,...jc,...ijc->...ij", a, b, diff.exp())

    A = decayed_products(q, k, strict=False)
    if delta:
        eye = torch.eye(C, device=q.device)
        L = eye + beta.unsqueeze(-1) * decayed_products(k, k, strict=True)
        rhs = torch.cat([v, k * G.exp()], dim=-1) * beta.unsqueeze(-1)
        solved = torch.linalg.solve_triangular(L, rhs, upper=False, unitriangular=True)
        U0, W = solved[..., :V], solved[..., V:]
    else:
        U0, W = v * beta.unsqueeze(-1), None

    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.float().clone()
    o = torch.empty_like(v)
    G_last = G[..., -1:, :]
    for n in range(N):
        U = U0[:, :, n] if W is None else U0[:, :, n] - W[:, :, n] @ S
        o[:, :, n] = (q[:, :, n] * G[:, :, n].exp()) @ S + A[:, :, n] @ U
        decayed_keys = k[:, :, n] * (G_last[:, :, n] - G[:, :, n]).exp()
        S = S * G_last[:, :, n].transpose(-1, -2).exp() + decayed_keys.transpose(-1, -2) @ U
    o = o.permute(0, 2, 3, 1, 4).reshape(B, N * C, H, V)[:, :T]
    return o.to(dtype), (S if output_final_state else None)


CHUNK_CASES = [
    # gate,     beta,    delta, initial state, T, chunk
    pytest.param(None, None, False, False, 21, 8, id="linear_attn"),
    pytest.param("head", None, False, True, 21, 8, id="retnet-state"),
    pytest.param("head", "write", False, True, 21, 8, id="xlstm-write"),
    pytest.param("channel", None, False, True, 21, 8, id="gla-state"),
    pytest.param(None, "gate", True, False, 16, 8, id="deltanet-whole-chunks"),
    pytest.param("head", "gate", True, True, 21, 8, id="gated_deltanet-state"),
    pytest.param("head", "gate", True, False, 5, 8, id="gated_deltanet-under-one-chunk"),
    pytest.param("head", "gate", True, True, 150, 64, id="gated_deltanet-C64"),
    pytest.param("channel", "gate", True, True, 21, 5, id="kda-state"),
    pytest.param("channel", "gate", True, False, 7, 1, id="kda-chunk-of-one"),
]


def chunk_inputs(gate, beta, delta, state, T, B=2, H=3, K=8, V=6):
    torch.manual_seed(0)
    q, k, v = torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, H, V)
    if delta:  # the delta rule is a contraction for unit keys and 0 < beta < 2
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    shape = {"head": (B, T, H), "channel": (B, T, H, K)}.get(gate)
    g = None if shape is None else F.logsigmoid(torch.randn(*shape) + 2.0)
    b = {None: None, "gate": torch.rand(B, T, H), "write": torch.exp(torch.randn(B, T, H))}[beta]
    s0 = torch.randn(B, H, K, V) if state else None
    return [None if x is None else x.requires_grad_(True) for x in (q, k, v, g, b, s0)]


def _run_with_grads(fn, inputs, kw, weights):
    for x in inputs:
        if x is not None:
            x.grad = None
    q, k, v, g, b, s0 = inputs
    o, s = fn(q, k, v, g, b, initial_state=s0, **kw)
    ((o * weights[0]).sum() + (s * weights[1]).sum()).backward()
    return o.detach(), s.detach(), [None if x is None else x.grad for x in inputs]


def _assert_same(got, want):
    (o, s, grads), (o_ref, s_ref, grads_ref) = got, want
    assert o.shape == o_ref.shape and s.shape == s_ref.shape
    torch.testing.assert_close(o, o_ref, **TOL)
    torch.testing.assert_close(s, s_ref, **TOL)
    for name, a, b in zip(("q", "k", "v", "g", "beta", "initial_state"), grads, grads_ref):
        assert (a is None) == (b is None), name
        if a is not None:
            torch.testing.assert_close(a, b, **TOL, msg=name)


@pytest.mark.parametrize("gate, beta, delta, state, T, chunk", CHUNK_CASES)
def test_torch_chunk_equals_reference(gate, beta, delta, state, T, chunk):
    """Outputs, final state and the gradients of every input (the initial state included) as the frozen form's."""
    inputs = chunk_inputs(gate, beta, delta, state, T)
    kw = dict(delta=delta, scale=8**-0.5, chunk_size=chunk)
    weights = torch.randn(inputs[2].shape), torch.randn(2, 3, 8, 6)
    _assert_same(_run_with_grads(torch_chunk, inputs, kw, weights),
                 _run_with_grads(reference_torch_chunk, inputs, kw, weights))


def test_torch_chunk_leaves_the_initial_state_alone():
    """The cache's state tensor goes in as the first chunk's state (no copy): it must come out unchanged."""
    q, k, v, g, b, s0 = chunk_inputs("head", "gate", True, True, 21)
    s0 = s0.detach()
    before = s0.clone()
    with torch.no_grad():
        torch_chunk(q, k, v, g, b, delta=True, scale=8**-0.5, initial_state=s0, chunk_size=8)
    assert torch.equal(s0, before)


# ------------------------------------------------------------------------------------------------
# linear_ops.torch_recurrent as it was (frozen copy)
# ------------------------------------------------------------------------------------------------


def reference_torch_recurrent(q, k, v, g=None, beta=None, *, delta, scale, initial_state=None, output_final_state=True):
    dtype = v.dtype
    B, T, H, K = q.shape
    q, k, v = (x.float() for x in (q, k, v))
    g = _expand_gate(g, q).float()
    S = q.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state.float().clone()
    o = torch.empty_like(v)
    for t in range(T):
        S = S * g[:, t].exp().unsqueeze(-1)
        u = v[:, t]
        if delta:
            u = u - torch.einsum("bhkv,bhk->bhv", S, k[:, t])
        if beta is not None:
            u = u * beta[:, t].float().unsqueeze(-1)
        S = S + k[:, t].unsqueeze(-1) * u.unsqueeze(-2)
        o[:, t] = torch.einsum("bhkv,bhk->bhv", S, q[:, t]) * scale
    return o.to(dtype), (S if output_final_state else None)


RECURRENT_CASES = [
    # gate,     beta,    delta, initial state, T
    pytest.param(None, None, False, True, 1, id="linear_attn-step"),
    pytest.param("head", "write", False, True, 3, id="xlstm-3"),
    pytest.param("channel", None, False, False, 4, id="gla-4"),
    pytest.param("head", "gate", True, True, 1, id="gated_deltanet-step"),
    pytest.param("head", "gate", True, False, 4, id="gated_deltanet-4"),
    pytest.param("channel", "gate", True, True, 7, id="kda-7"),
]


@pytest.mark.parametrize("gate, beta, delta, state, T", RECURRENT_CASES)
def test_torch_recurrent_equals_reference(gate, beta, delta, state, T):
    inputs = chunk_inputs(gate, beta, delta, state, T)
    kw = dict(delta=delta, scale=8**-0.5)
    weights = torch.randn(inputs[2].shape), torch.randn(2, 3, 8, 6)
    _assert_same(_run_with_grads(torch_recurrent, inputs, kw, weights),
                 _run_with_grads(reference_torch_recurrent, inputs, kw, weights))


def test_torch_recurrent_leaves_the_initial_state_alone():
    q, k, v, g, b, s0 = (None if x is None else x.detach() for x in chunk_inputs("head", "gate", True, True, 3))
    before = s0.clone()
    torch_recurrent(q, k, v, g, b, delta=True, scale=8**-0.5, initial_state=s0)
    assert torch.equal(s0, before)


def test_l2_normalize_is_f_normalize():
    x = torch.randn(2, 5, 3, 8)
    x[0, 0, 0] = 0  # a zero row stays zero (the clamp)
    for t in (x, x.bfloat16(), x.double()):
        assert torch.equal(_l2_normalize(t), F.normalize(t.float(), dim=-1).to(t.dtype))


# ------------------------------------------------------------------------------------------------
# mixer_base.ShortConv.forward's torch path as it was (frozen copy)
# ------------------------------------------------------------------------------------------------


def reference_short_conv_forward(self, x, cache=None, layer_idx=None, seq_idx=None, cu_seqlens=None, fused=False):
    T = x.shape[1]
    if cache is not None:
        x = cache.update_conv_state(x.transpose(1, 2), layer_idx, conv_kernel_size=self.size).transpose(1, 2)
    weight = self.weight.to(x.dtype)
    out = x * weight[:, -1]
    for j in range(1, self.size):
        shifted = F.pad(x, (0, 0, j, 0))[:, : x.shape[1]]
        if seq_idx is not None:
            shifted = shifted * (F.pad(seq_idx, (j, 0), value=-1)[:, : x.shape[1]] == seq_idx).unsqueeze(-1)
        out = out + shifted * weight[:, -1 - j]
    return self.activate(out[:, -T:])


@pytest.mark.parametrize("T", [1, 3, 11])  # shorter than the kernel, and longer
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("silu_channels", [None, 4, 0])
def test_short_conv_equals_reference(T, packed, silu_channels):
    torch.manual_seed(0)
    conv = mixer_base.ShortConv(6, 4, silu_channels)
    with torch.no_grad():
        conv.weight.add_(torch.randn_like(conv.weight))
    x = torch.randn(2, T, 6, requires_grad=True)
    seq_idx = torch.tensor([[0] * (T // 2) + [1] * (T - T // 2)] * 2) if packed else None
    weight = torch.randn(2, T, 6)
    results = []
    for forward in (mixer_base.ShortConv.forward, reference_short_conv_forward):
        x.grad = conv.weight.grad = None
        out = forward(conv, x, seq_idx=seq_idx)
        (out * weight).sum().backward()
        results.append((out.detach(), x.grad, conv.weight.grad))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, **TOL)


# ------------------------------------------------------------------------------------------------
# memory._banded_window as it was (frozen copy: logsumexp over the scores and the null logit)
# ------------------------------------------------------------------------------------------------


def reference_banded_window(qs, ksE, vsE, validE, null, W):
    B, H, T, D = qs.shape
    Hkv, Dv = ksE.shape[2], vsE.shape[-1]
    R = H // Hkv
    n = -(-T // max(W, 64))  # its blocks: max(W, 64) queries
    C = -(-T // n)
    pad = n * C - T
    q = F.pad(qs.float(), (0, 0, 0, pad)).view(B, Hkv, R, n, C, D).transpose(2, 3).reshape(B, Hkv, n, R * C, D)
    span = lambda t: F.pad(t.float(), (0, 0, 0, 0, 0, pad)).transpose(1, 2).unfold(2, C + W, C)  # noqa: E731
    keys = span(ksE)
    values = span(vsE).transpose(-1, -2)
    seen = F.pad(validE, (0, pad)).unfold(1, C + W, C)
    r = torch.arange(C, device=qs.device)[:, None]
    s = torch.arange(C + W, device=qs.device)[None]
    mask = ((s > r) & (s <= W + r))[None, None, None] & seen[:, None, :, None, None, :]
    scores = ((q @ keys) * D**-0.5).view(B, Hkv, n, R, C, C + W).masked_fill(~mask, NEVER)
    null = F.pad(null, (0, pad)).view(B, Hkv, R, n, C).transpose(2, 3)
    total = torch.logaddexp(scores.logsumexp(-1), null)
    total = torch.where(mask.any(-1) | null.isfinite(), total, torch.zeros_like(total))
    p_null = (null - total).exp()
    soft = ((scores - total[..., None]).exp().view(B, Hkv, n, R * C, C + W) @ values).view(B, Hkv, n, R, C, Dv)
    p_null = p_null.transpose(2, 3).reshape(B, H, n * C)[:, :, :T].transpose(1, 2)[..., None]
    soft = soft.permute(0, 1, 3, 2, 4, 5).reshape(B, H, n * C, Dv)[:, :, :T].transpose(1, 2)
    return p_null, soft


@pytest.mark.parametrize("W, T, chunk", [(4, 13, 5), (3, 2, 64), (1, 9, 1), (6, 20, 64)])
def test_banded_window_equals_reference(W, T, chunk, monkeypatch):
    """Outputs and gradients, with rows that see nothing (padding before any token: null -inf) and rows that see only
    the null logit (every key masked, null finite); the blocks differ from the frozen form's."""
    monkeypatch.setattr(memory, "_chunk_size", lambda W: chunk)
    torch.manual_seed(0)
    B, H, Hkv, D = 2, 4, 2, 8
    qs = torch.randn(B, H, T, D, requires_grad=True)
    ksE = torch.randn(B, W + T, Hkv, D, requires_grad=True)
    vsE = torch.randn(B, W + T, Hkv, D, requires_grad=True)
    validE = torch.ones(B, W + T, dtype=torch.bool)
    validE[:, :W] = False  # nothing before the prompt
    validE[1, W : W + 3] = False  # left padding of row 1
    null_logit = torch.randn(H, requires_grad=True)
    outside = torch.arange(T).float()[None].expand(B, T) - 2  # tokens only the state holds: -2, -1, 0, 1, ...
    null = null_logit[None, :, None] + outside.clamp(min=0)[:, None, :].log()
    null = torch.cat([null[:1], null[1:].masked_fill(torch.arange(T) == 4, 0.5)])  # row 1, query 4: null finite
    validE[1, W + 2 : W + 5] = False  # ... and its keys masked
    weight_p, weight_s = torch.randn(B, T, H, 1), torch.randn(B, T, H, D)
    results = []
    for fn in (memory._banded_window, reference_banded_window):
        for t in (qs, ksE, vsE, null_logit):
            t.grad = None
        p_null, soft = fn(qs, ksE, vsE, validE, null, W)
        ((p_null * weight_p).sum() + (soft * weight_s).sum()).backward(retain_graph=True)
        results.append((p_null.detach(), soft.detach(), qs.grad, ksE.grad, vsE.grad, null_logit.grad))
    for name, a, b in zip(("p_null", "soft", "qs", "ksE", "vsE", "null_logit"), *results):
        assert a.isfinite().all(), name
        torch.testing.assert_close(a, b, **TOL, msg=name)


# ------------------------------------------------------------------------------------------------
# whole tiny students: the current code against every frozen form above patched in
# ------------------------------------------------------------------------------------------------

from test_modeling import VOCAB  # noqa: E402
from test_modeling import tiny_model as tiny_student  # noqa: E402

MODEL_CASES = [
    pytest.param("gated_deltanet", [], {}, id="gated_deltanet"),
    pytest.param("gated_deltanet", [1], {"window_size": 4}, id="hybrid-window4-gated_deltanet"),
    pytest.param("gated_deltanet", [], {"window_size": 3, "sparse_cache_size": 2}, id="window3-sparse2-gated_deltanet"),
    pytest.param("kda", [], {"window_size": 5}, id="window5-kda"),
    pytest.param("xlstm", [], {}, id="xlstm"),
    pytest.param("linear_attn", [], {"window_size": 2, "num_key_value_heads": 1}, id="window2-gqa4-linear_attn"),
]


def tiny_model(mixer, attn_layers, overrides):
    """test_modeling's tiny student (new parameters moved off init), with three layers."""
    return tiny_student(mixer, attn_layers, **{"num_hidden_layers": 3, **overrides})


@pytest.fixture
def previous_forms(monkeypatch):
    """A callable that patches the frozen forms in (kernels holds torch_chunk / torch_recurrent by name)."""
    def patch():
        monkeypatch.setattr(kernels, "torch_chunk", reference_torch_chunk)
        monkeypatch.setattr(kernels, "torch_recurrent", reference_torch_recurrent)
        monkeypatch.setattr(mixer_base.ShortConv, "forward", reference_short_conv_forward)
        monkeypatch.setattr(memory, "_banded_window", reference_banded_window)
    return patch


def cache_of(out):
    return out["cache"] if "cache" in out else out["past_key_values"]


@pytest.mark.parametrize("mixer, attn_layers, overrides", MODEL_CASES)
def test_model_logits_and_gradients_equal_previous_forms(mixer, attn_layers, overrides, previous_forms):
    """Left-padded batch, training loss: logits and every parameter's gradient as with the frozen forms."""
    model = tiny_model(mixer, attn_layers, overrides)
    torch.manual_seed(1)
    ids = torch.randint(1, VOCAB, (2, 21))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0

    def run():
        model.zero_grad(set_to_none=True)
        out = model(ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100), use_cache=False)
        out.loss.backward()
        return out.logits.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    logits, grads = run()
    previous_forms()
    logits_ref, grads_ref = run()
    torch.testing.assert_close(logits[mask.bool()], logits_ref[mask.bool()], **TOL)
    assert grads.keys() == grads_ref.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], grads_ref[name], **TOL, msg=name)


def left_padded(seed, length, pad):
    """Two rows of token ids, the second left-padded by `pad` (ids 0 there), and their attention mask."""
    torch.manual_seed(seed)
    ids = torch.randint(1, VOCAB, (2, length))
    mask = torch.ones_like(ids)
    mask[1, :pad] = 0
    return ids * mask, mask


@pytest.mark.parametrize("mixer, attn_layers, overrides", MODEL_CASES)
def test_model_cached_decoding_equals_full_forward(mixer, attn_layers, overrides, previous_forms):
    """Left-padded prompts: cached prefill, single tokens, a 4-token block (the window's ring read in order from where
    the steps left it), single tokens again == one uncached forward == the uncached forward with the frozen forms."""
    model = tiny_model(mixer, attn_layers, overrides)
    ids, mask = left_padded(seed=2, length=24, pad=6)
    with torch.no_grad():
        full = model(ids, attention_mask=mask, use_cache=False).logits
        out = model(ids[:, :10], attention_mask=mask[:, :10], use_cache=True)
        pieces = [out.logits]
        for start, end in [(10, 11), (11, 12), (12, 13), (13, 17)] + [(t, t + 1) for t in range(17, 24)]:
            out = model(ids[:, start:end], attention_mask=mask[:, :end], cache=cache_of(out), use_cache=True)
            pieces.append(out.logits)
        previous_forms()
        want = model(ids, attention_mask=mask, use_cache=False).logits
    real = mask.bool()
    torch.testing.assert_close(full[real], want[real], **TOL)
    torch.testing.assert_close(torch.cat(pieces, 1)[real], full[real], **FORMS_TOL)


def test_window_projects_once():
    """A window layer runs q_proj, k_proj and v_proj once per forward (the softmax reads the linear part's)."""
    model = tiny_model("gated_deltanet", [], {"window_size": 4})
    calls = []
    attn = model.model.layers[0].self_attn
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
        proj.register_forward_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        model(torch.randint(1, VOCAB, (1, 9)), use_cache=False)
    assert len(calls) == 3


@pytest.mark.parametrize("mixer, attn_layers, overrides", MODEL_CASES)
def test_prefill_in_pieces_equals_one_forward(mixer, attn_layers, overrides):
    """A prompt longer than `prefill_piece_size` is prefilled in pieces (left padding, a hybrid's softmax layers, the
    window's ring, the sparse cache): the kept logits, the cache and what decodes after it equal one forward's."""
    model = tiny_model(mixer, attn_layers, overrides)
    ids, mask = left_padded(seed=3, length=23, pad=7)
    runs = {}
    with torch.no_grad():
        for piece in (0, 5):
            model.config.prefill_piece_size = piece
            calls = []
            hook = model.model.register_forward_hook(lambda *_: calls.append(1))
            every = model(ids, attention_mask=mask, use_cache=True).logits
            last = model(ids, attention_mask=mask, use_cache=True, logits_to_keep=3)
            hook.remove()
            step = model(ids[:, :1] + 1, attention_mask=torch.cat([mask, mask[:, :1] * 0 + 1], 1),
                         cache=cache_of(last), use_cache=True).logits
            runs[piece] = every, last.logits, step, len(calls)
    (every, last, step, calls), (every_p, last_p, step_p, calls_p) = runs[0], runs[5]
    assert calls == 2 and calls_p == 2 * 5  # 23 tokens: pieces of 5, 5, 5, 5, 3
    real = mask.bool()
    torch.testing.assert_close(every_p[real], every[real], **FORMS_TOL)
    assert last_p.shape == (2, 3, VOCAB)
    torch.testing.assert_close(last_p, last, **FORMS_TOL)
    torch.testing.assert_close(step_p, step, **FORMS_TOL)


def test_no_pieces_where_they_would_change_the_result():
    """Training (gradients), labels, every layer's hidden states, or no cache: one forward."""
    model = tiny_model("gated_deltanet", [], {})
    model.config.prefill_piece_size = 4
    ids = torch.randint(1, VOCAB, (1, 9))
    calls = []
    model.model.register_forward_hook(lambda *_: calls.append(1))
    model(ids, use_cache=True)  # gradients on
    with torch.no_grad():
        model(ids, use_cache=False)
        model(ids, use_cache=True, labels=ids)
        model(ids, use_cache=True, output_hidden_states=True)
    assert len(calls) == 4


@pytest.mark.parametrize("overrides", [{"window_size": 4}, {"window_size": 3, "sparse_cache_size": 2}],
                         ids=["window4", "window3-sparse2"])
def test_window_trains_under_bf16_autocast(overrides):
    """A windowed hybrid's training step under bf16 autocast (what --bf16 does, on a GPU or a CPU): the window's
    softmax stays fp32 (its masked logit, fp32's lowest, overflowed a bf16 score: 'value cannot be converted to type
    c10::BFloat16 without overflow', the 2026-12-06 H100 campaign's hybrid_cpu run), the loss and every gradient
    finite and near the fp32 step's."""
    model = tiny_model("gated_deltanet", [1], overrides).train()
    ids = torch.randint(1, VOCAB, (2, 40))

    def step(autocast):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(ids, labels=ids, use_cache=False).loss
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    (loss, grads), (loss32, _) = step(True), step(False)
    assert loss.isfinite() and all(g.isfinite().all() for g in grads.values())
    assert abs(loss.item() - loss32.item()) < 0.05 * loss32.item()
