"""The banded window of modeling/memory.py (blocks of queries score only their C + W keys, GQA without repeated keys;
with a sparse cache each block also ranks the kept entries with its own candidates) against a frozen copy of the full
[T, W + T] form (with its [T, T] ranking) it replaced (`reference_memory_forward`):
outputs, `parts`, `replace_values`, gradients, and cached decoding, over mixers, window sizes, lengths that are not a
multiple of the block, T < W, left padding and GQA. Block sizes are patched small so that tiny inputs span blocks."""

import pytest
import torch

from linzoo.modeling import memory, mixer_base
from linzoo.modeling.kernels import linear_core
from linzoo.modeling.memory import COUNTS, SPARSE, WINDOW, _pack, _state, _unpack, memory_forward, rope, rope_inv_freq

from test_modeling import VOCAB, tiny_model  # a tiny student with its new parameters moved off init

TOL = dict(atol=1e-5, rtol=1e-4)


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def cache_of(out):
    return out["cache"] if "cache" in out else out["past_key_values"]


# ------------------------------------------------------------------------------------------------
# memory_forward as it was before the banded window (frozen copy; its helpers are memory.py's own)
# ------------------------------------------------------------------------------------------------


def reference_memory_forward(mixer, x, valid, cache=None, parts=False, replace_values=None):
    """The head outputs [B, T, H, D] (before o_proj) of `mixer` with its window / sparse cache; x [B, T, hidden]
    (padding already zeroed), valid [B, T] bool (False: padding). Reads and updates `cache` when given. With `parts`:
    (p_null [B, T, H, 1], the softmax part [B, T, H, D], the linear part before the output norm [B, T, H, D]).
    `replace_values` [B, T, F] replace every head's values, the linear and the softmax part's alike (no sparse cache):
    with unit vectors the parts read off each token's weight (`LinearMixer.token_weights`)."""
    mem, idx = mixer.memory, mixer.layer_idx
    B, T, _ = x.shape
    H, Hkv, D, W, G = mixer.num_heads, mixer.num_kv_heads, mixer.head_dim, mem.window, mem.sparse
    dev = x.device
    q, k, v = mixer.project(x, cache)
    if replace_values is not None:
        if G:
            raise NotImplementedError(
                "memory_forward(replace_values=) with a sparse cache: which pairs it keeps depends on the values")
        v = replace_values[:, :, None].expand(B, T, H, replace_values.shape[-1]).float()
    q, k, v = mixer.features(q, k, v)
    g, beta = mixer.gates(x)
    counts = _state(cache, idx, COUNTS)
    counts = x.new_zeros(B, 2, dtype=torch.float32) if counts is None else counts  # real tokens seen, absorbed
    positions = counts[:, :1].long() + valid.long().cumsum(1) - 1
    inv_freq = rope_inv_freq(D, mem.rope_theta)
    qs = rope(mixer.q_proj(x).view(B, T, H, D).transpose(1, 2), positions, inv_freq)
    ks = rope(mixer.k_proj(x).view(B, T, Hkv, D).transpose(1, 2), positions, inv_freq).transpose(1, 2)
    vs = mixer.v_proj(x).view(B, T, Hkv, D) if replace_values is None else (
        replace_values[:, :, None].expand(B, T, Hkv, -1))

    # E: the window's last W tokens (zeros, not valid, before any) then the new ones; E[:T] leave the window now.
    new, layout = _pack([t for t in (k, v, g, beta, ks, vs, valid[..., None]) if t is not None])
    old = _state(cache, idx, WINDOW)
    E = torch.cat([new.new_zeros(B, W, new.shape[-1]) if old is None else old, new], 1)
    unpacked = _unpack(E, layout)
    kE, vE = unpacked[0], unpacked[1]
    gE = unpacked[2] if g is not None else None
    betaE = unpacked[2 + (g is not None)] if beta is not None else None
    ksE, vsE, validE = unpacked[-3], unpacked[-2], unpacked[-1][..., 0].bool()
    leaving = [None if t is None else t[:, :T] for t in (kE, vE, gE, betaE)]

    state = _state(cache, idx, 0)
    o, new_state = linear_core(mixer.config, mixer, q, *leaving, initial_state=state,
                               output_final_state=cache is not None)
    raw = mixer.readout(o)

    # Candidates: the sparse cache's G entries (per head), then E. Column c of the scores is candidate c.
    sparse_old = _state(cache, idx, SPARSE)
    if G:
        recalled, _ = linear_core(mixer.config, mixer, leaving[0], *leaving, initial_state=state)
        error = (leaving[1][..., :D].float() - recalled[..., :D].float() / mixer.scale).norm(dim=-1)  # [B, T, H]
        if sparse_old is None:
            sparse_old = x.new_zeros(B, G, H, 2 * D + 2, dtype=torch.float32)
        ks_c, vs_c, score_c, valid_c = sparse_old.split([D, D, 1, 1], -1)
        keys = torch.cat([ks_c.transpose(1, 2), ksE.float().transpose(1, 2).repeat_interleave(H // Hkv, 1)], 2)
        values = torch.cat([vs_c.transpose(1, 2), vsE.float().transpose(1, 2).repeat_interleave(H // Hkv, 1)], 2)
    else:
        keys = ksE.float().transpose(1, 2).repeat_interleave(H // Hkv, 1)
        values = vsE.float().transpose(1, 2).repeat_interleave(H // Hkv, 1)
    scores = (qs.float() @ keys.transpose(-1, -2)) * D**-0.5  # [B, H, T, G + W + T]

    i = torch.arange(T, device=dev)[:, None]
    e = torch.arange(W + T, device=dev)[None]
    mask = ((e > i) & (e <= W + i))[None, None] & validE[:, None, None, :]  # the window: [B, 1, T, W + T]
    absorbed = counts[:, 1:] + validE[:, :T].float().cumsum(1)  # [B, T]: real tokens out of the window at query i
    if G:
        # Candidates for the cache: its old entries (absorbed earlier) and E[:T] (absorbed at query e).
        cand_score = torch.cat([score_c[..., 0].transpose(1, 2), error.transpose(1, 2)], -1)  # [B, H, G + T]
        cand_valid = torch.cat([valid_c[..., 0].transpose(1, 2).bool(), validE[:, None, :T].expand(B, H, T)], -1)
        at = torch.cat([torch.full((G,), -1, device=dev), torch.arange(T, device=dev)])
        order = torch.arange(G + T, device=dev)
        beats = (cand_score[..., :, None] > cand_score[..., None, :]) | (
            (cand_score[..., :, None] == cand_score[..., None, :]) & (order[:, None] < order[None, :]))
        taken = (at[None, :] <= i).float()  # [T, G + T]: absorbed by query i
        rank = torch.einsum("il,bhlc->bhic", taken, (beats & cand_valid[..., :, None]).float())
        cached = (rank < G) & (at[None, :] <= i)[None, None] & cand_valid[:, :, None, :]  # [B, H, T, G + T]
        later = cached.new_zeros(B, H, T, W)  # E[T:] are never absorbed by these queries
        mask = torch.cat([cached[..., :G], mask | torch.cat([cached[..., G:], later], -1)], -1)
    outside = absorbed - absorbed.clamp(max=G)  # real tokens only the state holds
    null = mem.null_logit.float()[None, :, None] + outside.clamp(min=0)[:, None, :].log()  # [B, H, T]
    scores = scores.masked_fill(~mask, float("-inf"))
    total = torch.logaddexp(scores.logsumexp(-1), null)
    total = torch.where(total.isfinite(), total, torch.zeros_like(total))  # a padded query with nothing to see
    p_null = (null - total).exp().transpose(1, 2)[..., None]  # [B, T, H, 1]
    soft = ((scores - total[..., None]).exp() @ values).transpose(1, 2)
    if parts:
        return p_null, soft, raw
    heads = p_null * mixer.o_norm(raw).float() + soft

    if cache is not None:
        cache.update_recurrent_state(new_state, idx)
        if W:
            cache.update_recurrent_state(E[:, T:], idx, WINDOW)
        if G:
            last = cached[:, :, -1]  # [B, H, G + T]: the cache after the last query
            pick = (order + (~last).long() * (G + T)).argsort(-1)[..., :G]  # cached ones first, in order
            gather = lambda t: t.gather(2, pick[..., None].expand(-1, -1, -1, t.shape[-1]))  # noqa: E731
            entries = torch.cat([gather(keys[:, :, : G + T]), gather(values[:, :, : G + T]),
                                 cand_score.gather(2, pick)[..., None], last.gather(2, pick)[..., None].float()], -1)
            cache.update_recurrent_state(entries.transpose(1, 2), idx, SPARSE)
        seen = counts[:, :1] + valid.float().sum(1, keepdim=True)
        cache.update_recurrent_state(torch.cat([seen, absorbed[:, -1:]], 1), idx, COUNTS)
    return heads.to(x.dtype)


# ------------------------------------------------------------------------------------------------
# cases
# ------------------------------------------------------------------------------------------------

# (mixer, overrides, T, left padding per row)
CASES = [
    pytest.param("gated_deltanet", {"window_size": 4}, 19, (0, 5), id="gdn-W4-T19-pad"),
    pytest.param("gla", {"window_size": 1, "num_key_value_heads": 1}, 13, (3, 0), id="gla-W1-T13-gqa4-pad"),
    pytest.param("linear_attn", {"window_size": 8}, 5, (0, 2), id="linear_attn-W8-T5-pad"),  # T < W
    pytest.param("gated_deltanet", {"window_size": 6, "num_key_value_heads": 4}, 30, (0, 0), id="gdn-W6-T30-mha"),
    pytest.param("linear_attn", {"window_size": 3, "num_key_value_heads": 1}, 23, (7, 0), id="linear_attn-W3-T23-gqa4"),
    pytest.param("gla", {"window_size": 16}, 40, (0, 9), id="gla-W16-T40-pad"),
    # the sparse cache, ranked block by block (`_sparse_window`, the same block sizes): no [T, T] ranking
    pytest.param("kda", {"window_size": 3, "sparse_cache_size": 2}, 17, (0, 4), id="kda-W3-G2-T17-sparse"),
    pytest.param("gated_deltanet", {"window_size": 3, "sparse_cache_size": 2}, 19, (0, 5), id="gdn-W3-G2-T19-sparse"),
    pytest.param("gla", {"window_size": 2, "sparse_cache_size": 4, "num_key_value_heads": 1}, 23, (6, 0),
                 id="gla-W2-G4-T23-gqa4-sparse"),
    pytest.param("linear_attn", {"window_size": 8, "sparse_cache_size": 3}, 6, (0, 2), id="linear_attn-W8-G3-T6-sparse"),
]
CHUNKS = [1, 3, 5, 64]  # queries per block: below W, above it, not dividing T, one block


def _layer_and_inputs(mixer, overrides, T, pads):
    attn = tiny_model(mixer, **overrides).model.layers[0].self_attn
    with torch.no_grad():
        attn.memory.null_logit.copy_(torch.randn(attn.num_heads))
    torch.manual_seed(1)
    valid = torch.ones(len(pads), T, dtype=torch.bool)
    for b, p in enumerate(pads):
        valid[b, :p] = False
    x = torch.randn(len(pads), T, 32) * valid[..., None]  # padding zeroed, as LinearMixer.forward does
    return attn, x, valid


@pytest.fixture(params=CHUNKS, ids=[f"C{c}" for c in CHUNKS])
def chunk(request, monkeypatch):
    """Queries per block, of the window (`_banded_window`) and of the sparse cache's ranking (`_sparse_window`)."""
    monkeypatch.setattr(memory, "_chunk_size", lambda W: request.param)
    monkeypatch.setattr(memory, "_sparse_block_size", lambda W: request.param)
    return request.param


@pytest.mark.parametrize("mixer, overrides, T, pads", CASES)
def test_banded_forward_and_parts_equal_reference(mixer, overrides, T, pads, chunk):
    attn, x, valid = _layer_and_inputs(mixer, overrides, T, pads)
    with torch.no_grad():
        torch.testing.assert_close(memory_forward(attn, x, valid), reference_memory_forward(attn, x, valid), **TOL)
        got, want = memory_forward(attn, x, valid, parts=True), reference_memory_forward(attn, x, valid, parts=True)
    for name, a, b in zip(("p_null", "soft", "raw"), got, want):
        assert a.shape == b.shape, name
        torch.testing.assert_close(a, b, **TOL, msg=name)


@pytest.mark.parametrize("mixer, overrides, T, pads", CASES)
def test_banded_gradients_equal_reference(mixer, overrides, T, pads, chunk):
    """Gradients of a loss on the real positions, w.r.t. the input and every parameter of the layer. The reference
    gives nan gradients for a padded query that sees nothing (-inf logits through logsumexp), so it runs each row
    alone without its padding (positions count real tokens only: the same outputs); the banded form runs the padded
    batch and must stay finite."""
    attn, x, valid = _layer_and_inputs(mixer, overrides, T, pads)
    weight = torch.randn(*x.shape[:2], attn.num_heads, attn.head_dim) * valid[..., None, None]

    def grads_of(run):
        attn.zero_grad(set_to_none=True)
        xg = x.clone().requires_grad_(True)
        run(xg).backward()
        params = {n: p.grad for n, p in attn.named_parameters() if p.grad is not None}
        return {"x": xg.grad * valid[..., None], **params}

    got = grads_of(lambda xg: (memory_forward(attn, xg, valid).float() * weight).sum())
    want = grads_of(lambda xg: sum(
        (reference_memory_forward(attn, xg[b : b + 1, p:], valid[b : b + 1, p:]).float() * weight[b : b + 1, p:]).sum()
        for b, p in enumerate(pads)))
    assert got.keys() == want.keys() and "memory.null_logit" in got
    for name in want:
        assert got[name].isfinite().all() and want[name].isfinite().all(), name
        torch.testing.assert_close(got[name], want[name], **TOL, msg=name)


@pytest.mark.parametrize("mixer, overrides, T, pads", [c for c in CASES if "sparse_cache_size" not in c.values[1]])
def test_banded_replace_values_equals_reference(mixer, overrides, T, pads, chunk):
    """The token-weights path (unit vectors for values, Dv = T): the same parts as the full form."""
    attn, x, valid = _layer_and_inputs(mixer, overrides, T, pads)
    units = torch.eye(T).expand(x.shape[0], T, T)
    with torch.no_grad():
        got = memory_forward(attn, x, valid, parts=True, replace_values=units)
        want = reference_memory_forward(attn, x, valid, parts=True, replace_values=units)
    for name, a, b in zip(("p_null", "soft", "raw"), got, want):
        torch.testing.assert_close(a, b, **TOL, msg=name)


@pytest.mark.parametrize("mixer, overrides", [
    pytest.param("gated_deltanet", {"window_size": 4}, id="gdn-W4"),
    pytest.param("gla", {"window_size": 2, "num_key_value_heads": 1}, id="gla-W2-gqa4"),
    pytest.param("linear_attn", {"window_size": 7}, id="linear_attn-W7"),
    pytest.param("gated_deltanet", {"window_size": 3, "sparse_cache_size": 2}, id="gdn-W3-G2-sparse"),
    pytest.param("gla", {"window_size": 2, "sparse_cache_size": 4, "num_key_value_heads": 1}, id="gla-W2-G4-gqa4-sparse"),
])
def test_banded_cached_decoding_equals_full_forward(mixer, overrides, chunk, monkeypatch):
    """Left-padded prompts, cached prefill, a block, then single tokens == one uncached forward (the banded form) ==
    the reference's uncached forward; with a sparse cache, the entries kept after the prefill are the reference's
    (the valid ones, in order)."""
    model = tiny_model(mixer, **overrides)
    torch.manual_seed(2)
    ids = torch.randint(1, VOCAB, (2, 22))
    mask = torch.ones_like(ids)
    mask[1, :6] = 0
    ids = ids * mask
    with torch.no_grad():
        full = model(ids, attention_mask=mask, use_cache=False).logits
        prefill = lambda: model(ids[:, :9], attention_mask=mask[:, :9], use_cache=True)  # noqa: E731
        out = prefill()
        entries = _state(cache_of(out), 0, SPARSE)
        entries = None if entries is None else entries.clone()  # the steps below update the cache in place
        pieces = [out.logits]
        out = model(ids[:, 9:14], attention_mask=mask[:, :14], cache=cache_of(out), use_cache=True)
        pieces.append(out.logits)
        for t in range(14, 22):
            out = model(ids[:, t : t + 1], attention_mask=mask[:, : t + 1], cache=cache_of(out),
                        use_cache=True)
            pieces.append(out.logits)
        monkeypatch.setattr(mixer_base, "memory_forward", reference_memory_forward)
        want = model(ids, attention_mask=mask, use_cache=False).logits
        if entries is not None:
            want_entries = _state(cache_of(prefill()), 0, SPARSE)
            kept = entries[..., -1].bool()  # [B, G, H]
            assert torch.equal(kept, want_entries[..., -1].bool())
            torch.testing.assert_close(entries[kept], want_entries[kept], **TOL)
    real = mask.bool()
    torch.testing.assert_close(full[real], want[real], **TOL)
    torch.testing.assert_close(torch.cat(pieces, 1)[real], full[real], **TOL)
