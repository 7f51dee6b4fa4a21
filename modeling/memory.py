"""Exact softmax attention beside the linear state: a sliding window (`window_size`) and a sparse cache of the
pairs the state recalls worst (`sparse_cache_size`), per linear layer, with a bounded cache.

Sources: LoLCATs (Zhang et al., 2024; HazyResearch/lolcats `linear_window_attention_sw.py`): softmax over the last W
tokens, linear attention over the tokens that left the window, one normaliser shared by both. LoLA (McDermott et
al., 2025, arXiv 2505.23666): a third memory, a small cache of the pairs the linear state recalls worst (self-recall
error ||v - S^T k||), attended with the same softmax.

Per head, for query t (positions count real tokens only, so left padding and packing change nothing):

    o_t = p_null * o_norm(S_{t-W}^T q_t)  +  sum_{j in window(t) u cache(t)} p_j v_j
    p = softmax over [q_t.k_j / sqrt(D) for those j]  and one null logit  b_h + log n_t

- the keys, values and queries of the softmax are the teacher's own (q_proj, k_proj, v_proj with RoPE): with the
  window covering the whole context a student's layer is the teacher's attention exactly;
- S_{t-W} is the linear state after the last token that left the window (LoLCATs' linear term over j <= t - W): the
  recurrence runs unchanged on inputs delayed by W tokens, so every form (chunked, recurrent, fla's kernels) keeps it;
- our mixers' states carry no normaliser (the delta rule has none), so the null logit stands in for LoLCATs'
  linear-attention mass: n_t is the number of tokens only the state holds, b_h a learned per-head logit, the mean
  score of such a token (`fit_null_logit` sets it from the teacher's own scores; 0 otherwise). With no token outside
  the window (t < W) the null weight is 0 and the head is the teacher's head;
- cache(t): the `sparse_cache_size` tokens with the largest recall error among those that left the window (ties: the
  earlier), each scored once, right after the state absorbs it (||v_j - S_j^T k_j||, the state's own readout, first
  D value columns). Fixed scores make "top-G so far" exact in every form: the full forward counts, per query, the
  absorbed tokens that beat each candidate; decoding keeps the G best and compares each newcomer.

Cost: one more run of the linear core for the recall scores (with a cache), and softmax scores over the window and
cache, linear in T: blocks of C queries score their C + W keys (`_banded_window`; the query heads of a kv head share
its keys); with a sparse cache each block of C = max(W, 64) queries also ranks the G entries kept so far with its own C
new candidates ([G + C, G + C]) and scores those G as well (`_sparse_window`); decoding keeps W + G keys per layer
whatever the context length. On CUDA a prefill or training row's window (no sparse cache) runs through FlexAttention
(`_flex_window`); everything else is the same torch code on CPU and CUDA, and the linear core uses fla's kernels.
Packed rows run sequence by sequence.
"""

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init

from .kernels import linear_core
from .linear_ops import _fp32

# The layer cache's states (transformers' LinearAttentionLayer holds several): 0 the linear state, then the window
# (delayed linear inputs and softmax keys/values of the last W tokens, a ring: see `memory_forward`), the sparse cache,
# and the counts: real tokens seen, real tokens absorbed by the state, and the ring's oldest row.
WINDOW, SPARSE, COUNTS = 1, 2, 3
NUMBER_OF_STATES = 4


def rope_inv_freq(head_dim, theta):
    """RoPE's inverse frequencies [head_dim / 2] (fp32, CPU), computed once per (head_dim, theta): a decoding step of a
    windowed layer asks for them every token."""
    return _inv_freq(int(head_dim), float(theta)).clone()


@functools.lru_cache(maxsize=None)
def _inv_freq(head_dim, theta):
    with torch.inference_mode(False):  # an ordinary tensor even when first asked for under inference_mode
        exponent = torch.arange(0, head_dim, 2, dtype=torch.float32, device="cpu") / head_dim
        return 1.0 / theta**exponent


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_angles(positions, inv_freq, dtype):
    """(cos, sin) [B, 1, T, D] of RoPE at positions [B, T] (Llama's), in `dtype`: computed once for q and k."""
    freqs = positions[:, None, :, None].float() * inv_freq.to(positions.device)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x, angles):
    """RoPE on x [B, heads, T, D] by `rope_angles`' (cos, sin)."""
    cos, sin = angles
    return x * cos + rotate_half(x) * sin


def rope(x, positions, inv_freq):
    """RoPE on x [B, heads, T, D] at positions [B, T] (Llama's)."""
    return apply_rope(x, rope_angles(positions, inv_freq, x.dtype))


class Memory(nn.Module):
    """The window / sparse cache of one linear layer: its sizes and the per-head null logit `b_h`."""

    def __init__(self, config, num_heads):
        super().__init__()
        self.window, self.sparse = config.window_size, config.sparse_cache_size
        self.rope_theta = config.rope_theta
        self.null_logit = nn.Parameter(torch.zeros(num_heads))

    def reset_new_parameters(self):
        init.zeros_(self.null_logit)  # an outside token scores like q.k = 0


def memory_state_shapes(mixer_class, config) -> dict:
    """Per-layer cache tensors of the window / sparse cache (without batch, fp32), beside `state_shapes`'s: the window
    [W, F] (each token's packed linear inputs k, v, g, beta and softmax keys/values, and its valid flag), the sparse
    cache [G, H, 2 D + 2] and the counts [3] (tokens seen, absorbed, the window ring's oldest row). F comes from one
    token through the mixer on the meta device."""
    W, G, H, Hkv, D = (config.window_size, config.sparse_cache_size, config.num_attention_heads,
                       config.num_key_value_heads, config.head_dim)
    with torch.device("meta"):
        mixer = mixer_class(config, 0)
        x = torch.zeros(1, 1, config.hidden_size)
        g, beta = mixer.gates(x)
        _, k, v = mixer.features(*mixer.project(x))
    F = sum(math.prod(t.shape[2:]) for t in (k, v, g, beta) if t is not None) + 2 * Hkv * D + 1
    shapes = {"window": (W, F)} if W else {}
    if G:
        shapes["sparse"] = (G, H, 2 * D + 2)
    return {**shapes, "counts": (3,)}


def _pack(parts):
    """[B, T, ...] tensors -> one fp32 [B, T, F] (the cache keeps one tensor per state) and the shapes to undo it."""
    B, T = parts[0].shape[:2]
    return torch.cat([p.reshape(B, T, -1).float() for p in parts], -1), [(p.shape[2:], p.dtype) for p in parts]


def _unpack(packed, layout, last=None):
    """`_pack`'s parts back from packed [B, T, F]; only the `last` ones when given (a decoding step reads the ring's
    softmax keys, values and flags, not its linear inputs)."""
    B, T = packed.shape[:2]
    sizes = [math.prod(shape) for shape, _ in layout]
    parts = list(zip(packed.split(sizes, -1), layout))
    return [x.reshape(B, T, *shape).to(dtype) for x, (shape, dtype) in parts[-last if last else 0:]]


def _state(cache, layer_idx, idx):
    if cache is None or not cache.layers[layer_idx].is_recurrent_states_initialized[idx]:
        return None
    return cache.layers[layer_idx].recurrent_states[idx]


# Queries per block of the banded window (no sparse cache): max(W // 4, WINDOW_CHUNK), evened out so that padding T up
# to whole blocks adds fewer rows than there are blocks. Each block scores W + C keys: O(T (W + C)), not O(T (W + T)).
# Smaller blocks score fewer keys per query but make more, smaller products: W / 4 was the fastest for W from 16 to
# 256 on one CPU thread (W = 64 at 4,096 tokens: 54 ms against 78 ms with C = W).
WINDOW_CHUNK = 8
# The logit of a masked score: exp(NEVER - total) is exactly 0 like exp(-inf), but a query with nothing to see (padding)
# keeps finite gradients (with -inf, logsumexp's backward gives 0 * nan = nan, into every parameter).
NEVER = torch.finfo(torch.float32).min


def _chunk_size(W):
    return max(W // 4, WINDOW_CHUNK)


@_fp32
def _banded_window(qs, ksE, vsE, validE, null, W):
    """The window's softmax without a sparse cache, block by block: query i sees E index e iff i < e <= W + i and
    validE[e], beside the null logit. qs [B, H, T, D]; ksE [B, W + T, Hkv, D], vsE [B, W + T, Hkv, Dv] (E: the W old
    window tokens then the T new ones), validE [B, W + T] bool, null [B, H, T] fp32. Each block of C queries scores the
    C + W keys E[start, start + C + W) only ([B, Hkv, n, R C, C + W], fp32); the R = H / Hkv query heads of a kv head
    share one block of keys (no repeat). Returns p_null [B, T, H, 1] and the softmax part [B, T, H, Dv], as the full
    [T, W + T] scores give them."""
    B, H, T, D = qs.shape
    Hkv, Dv = ksE.shape[2], vsE.shape[-1]
    R = H // Hkv
    n = -(-T // _chunk_size(W))  # blocks
    C = -(-T // n)  # queries per block
    pad = n * C - T

    def padded(t, dim):  # T up to whole blocks along `dim` (as it is when it already is: no copy)
        return F.pad(t, (0, 0) * (t.dim() - 1 - dim) + (0, pad)) if pad else t

    q = padded(qs.float(), 2).reshape(B, Hkv, R, n, C, D).transpose(2, 3).reshape(B, Hkv, n, R * C, D)
    span = lambda t: padded(t.float(), 1).transpose(1, 2).unfold(2, C + W, C)  # noqa: E731
    keys = span(ksE)  # [B, Hkv, n, D, C + W]: block j holds E[j C, j C + C + W)
    values = span(vsE).transpose(-1, -2)  # [B, Hkv, n, C + W, Dv]
    seen = padded(validE, 1).unfold(1, C + W, C)  # [B, n, C + W]
    r = torch.arange(C, device=qs.device)[:, None]
    s = torch.arange(C + W, device=qs.device)[None]
    mask = ((s > r) & (s <= W + r))[None, None, None] & seen[:, None, :, None, None, :]  # [B, 1, n, 1, C, C + W]
    # The softmax over the visible keys and the null logit, normalised after the values are summed: [B, Hkv, n, R, C]
    # sums instead of [.., C + W] passes. `top` (each row's largest logit, or 0 for a query with nothing to see) keeps
    # exp() in range; in every other row one term is exp(0) = 1, so `total` >= 1 and only the empty rows need a 1.
    scores = (q @ keys).mul_(D**-0.5).view(B, Hkv, n, R, C, C + W).masked_fill_(~mask, NEVER)
    null = padded(null, 2).reshape(B, Hkv, R, n, C).transpose(2, 3)  # [B, Hkv, n, R, C]
    seeing = mask.any(-1) | null.isfinite()
    top = torch.where(seeing, torch.maximum(scores.detach().amax(-1), null.detach()), 0.0)
    weights = (scores - top[..., None]).exp_()
    null_weight = (null - top).exp()
    total = weights.sum(-1) + null_weight
    total = torch.where(seeing, total, 1.0)
    p_null = null_weight / total
    soft = (weights.view(B, Hkv, n, R * C, C + W) @ values).view(B, Hkv, n, R, C, Dv) / total[..., None]
    p_null = p_null.transpose(2, 3).reshape(B, H, n * C)[:, :, :T].transpose(1, 2)[..., None]
    soft = soft.permute(0, 1, 3, 2, 4, 5).reshape(B, H, n * C, Dv)[:, :, :T].transpose(1, 2)
    return p_null, soft


@_fp32
def _window_step(qs, ks, vs, valid, null):
    """A decoding step's window (one query per sequence, no sparse cache): `_banded_window`'s results for the query
    that sees the ring's W rows (ks, vs [B, W, Hkv, D], valid [B, W, 1], the new token among them), in a dozen
    operations instead of the blocks' bookkeeping. qs [B, H, 1, D], null [B, H, 1]."""
    B, H, _, D = qs.shape
    Hkv = ks.shape[2]
    seen = valid[:, None, None, :, 0].bool()  # [B, 1, 1, W]
    scores = (qs.float().view(B, Hkv, H // Hkv, D) @ ks.float().permute(0, 2, 3, 1)).mul_(D**-0.5)  # [B, Hkv, R, W]
    scores = scores.masked_fill_(~seen, NEVER)
    null = null.view(B, Hkv, H // Hkv)
    seeing = seen.any(-1) | null.isfinite()
    top = torch.where(seeing, torch.maximum(scores.amax(-1), null), 0.0)
    weights = (scores - top[..., None]).exp_()
    null_weight = (null - top).exp()
    total = torch.where(seeing, weights.sum(-1) + null_weight, 1.0)
    soft = (weights @ vs.float().transpose(1, 2)) / total[..., None]  # [B, Hkv, R, D]
    return (null_weight / total).view(B, 1, H, 1), soft.view(B, 1, H, D)


# On CUDA the window runs through FlexAttention from this many new tokens (a decoding step keeps the banded form).
FLEX_MIN_TOKENS = 128


@functools.cache
def _flex_attention():
    """FlexAttention, compiled where it fuses (CUDA: one kernel for the sliding window); eager elsewhere."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=True) if torch.cuda.is_available() else flex_attention


@_fp32
def _flex_window(qs, ksE, vsE, validE, null, W):
    """`_banded_window`'s results through FlexAttention: the window as a block mask (query i sees E index e iff
    i < e <= W + i and validE[e]), the kv heads shared (enable_gqa), and the softmax's log-sum-exp merged with the
    null logit afterwards: p_null = e^(null - total), the softmax part scaled by e^(lse - total), total their
    logaddexp. A query with nothing to see (no key, no null) gets 0 for both, with finite gradients."""
    from torch.nn.attention import flex_attention as flex

    B, H, T, D = qs.shape

    def sliding(b, h, i, e):
        return (e > i) & (e <= W + i) & validE[b, e]

    block_mask = flex.create_block_mask(sliding, B, None, T, ksE.shape[1], device=qs.device)
    # torch >= 2.9 returns the log-sum-exp as an auxiliary output, earlier versions with return_lse
    lse_request = {"return_aux": flex.AuxRequest(lse=True)} if hasattr(flex, "AuxRequest") else {"return_lse": True}
    out, aux = _flex_attention()(qs.float(), ksE.float().transpose(1, 2), vsE.float().transpose(1, 2),
                                 block_mask=block_mask, enable_gqa=True, **lse_request)
    lse = getattr(aux, "lse", aux).float()  # [B, H, T]; -inf where nothing is visible
    seeing = lse.isfinite() | null.isfinite()
    total = torch.logaddexp(torch.where(seeing, lse, 0.0), torch.where(seeing, null, 0.0))
    p_null = torch.where(seeing, (null - total).exp(), 0.0)
    soft = out.float() * torch.where(seeing, (lse - total).exp(), 0.0)[..., None]
    return p_null.transpose(1, 2)[..., None], soft.transpose(1, 2)


_FLEX_FAILED = []  # why FlexAttention failed once in this process (then the banded form runs, with one warning)


def _window(mixer, qs, ksE, vsE, validE, null, W):
    """The window without a sparse cache: FlexAttention on CUDA for a prefill or a training row, else banded."""
    if qs.is_cuda and qs.shape[2] >= FLEX_MIN_TOKENS and mixer.config.kernel_backend != "torch" and not _FLEX_FAILED:
        try:
            return _flex_window(qs, ksE, vsE, validE, null, W)
        except Exception as err:  # noqa: BLE001 - a faster form of the same numbers: fall back, say so once
            import warnings

            _FLEX_FAILED.append(f"{type(err).__name__}: {err}"[:300])
            warnings.warn(f"linzoo: the window's FlexAttention failed ({_FLEX_FAILED[0]}); the banded torch form, "
                          "with the same numbers, runs instead", stacklevel=2)
    return _banded_window(qs, ksE, vsE, validE, null, W)


def _sparse_block_size(W):
    """Queries per block of the window with a sparse cache: each block ranks its own G + C candidates."""
    return max(W, 64)


@_fp32
def _sparse_window(qs, ksE, vsE, validE, null, error, sparse_old, W):
    """The window's softmax with a sparse cache, block by block of queries, without [T, T] scores or ranking.

    Query i sees E index e iff i < e <= W + i and validE[e] (the window), and the cached pairs: the G candidates with
    the largest recall error among those absorbed by query i (the cache's old entries, absorbed before this forward,
    and E[e] for e <= i; ties: the earlier), beside the null logit. The top G of a set is the top G of (the top G of
    its older part) and its newer part, so a block needs only the G entries kept after the previous block and its own
    C new candidates: a [G + C, G + C] ranking per block, and scores over G + C + W keys, linear in T.

    qs [B, H, T, D]; ksE, vsE [B, W + T, Hkv, D]; validE [B, W + T]; null [B, H, T]; error [B, T, H] (E[e]'s recall
    error, e < T); sparse_old [B, G, H, 2 D + 2] (keys, values, score, valid: the cache's entries). Returns p_null
    [B, T, H, 1], the softmax part [B, T, H, D] and the entries after the last query [B, G, H, 2 D + 2]."""
    B, H, T, D = qs.shape
    Hkv, G = ksE.shape[2], sparse_old.shape[1]
    R, dev = H // Hkv, qs.device
    ks_c, vs_c, score_c, valid_c = sparse_old.split([D, D, 1, 1], -1)
    # Every candidate per query head: the cache's entries, then E[:T] (E[e] absorbed by query e). A candidate's index
    # is also its order for ties.
    keys = torch.cat([ks_c, ksE[:, :T].float().repeat_interleave(R, 2)], 1).transpose(1, 2)  # [B, H, G + T, D]
    values = torch.cat([vs_c, vsE[:, :T].float().repeat_interleave(R, 2)], 1).transpose(1, 2)
    score = torch.cat([score_c[..., 0], error.float()], 1).transpose(1, 2)  # [B, H, G + T]
    ok = torch.cat([valid_c[..., 0].bool(), validE[:, :T, None].expand(B, T, H)], 1).transpose(1, 2)
    kept = torch.arange(G, device=dev).expand(B, H, G)  # the entries kept so far: candidate indices, in order
    kept_ok = ok[..., :G]
    C = _sparse_block_size(W)
    p_nulls, softs = [], []
    for s in range(0, T, C):
        e = min(s + C, T)
        c = e - s
        index = torch.cat([kept, torch.arange(G + s, G + e, device=dev).expand(B, H, c)], -1)  # [B, H, G + c]
        sc, can = score.gather(-1, index), torch.cat([kept_ok, ok[..., G + s : G + e]], -1)
        beats = (sc[..., :, None] > sc[..., None, :]) | (
            (sc[..., :, None] == sc[..., None, :]) & (index[..., :, None] < index[..., None, :]))
        absorbed_at = torch.cat([torch.full((G,), -1, device=dev), torch.arange(s, e, device=dev)])  # [G + c]
        taken = absorbed_at[None, :] <= torch.arange(s, e, device=dev)[:, None]  # [c, G + c]: by query i
        rank = torch.einsum("il,bhlm->bhim", taken.float(), (beats & can[..., :, None]).float())
        cached = (rank < G) & taken & can[..., None, :]  # [B, H, c, G + c]
        # Keys: the kept entries, then E[s, e + W) (this block's window span; its new candidates are E[s, e)).
        q = qs[:, :, s:e].float() * D**-0.5
        kk, vv = (t.gather(2, kept[..., None].expand(-1, -1, -1, D)) for t in (keys, values))  # [B, H, G, D]
        span_k = ksE[:, s : e + W].float().permute(0, 2, 3, 1)  # [B, Hkv, D, c + W]
        span_v = vsE[:, s : e + W].float().transpose(1, 2)  # [B, Hkv, c + W, D]
        r = torch.arange(c, device=dev)[:, None]
        t = torch.arange(c + W, device=dev)[None]
        window = ((t > r) & (t <= W + r))[None, None] & validE[:, None, None, s : e + W]  # [B, 1, c, c + W]
        mask = torch.cat([cached[..., :G], window | F.pad(cached[..., G:], (0, W))], -1)  # [B, H, c, G + c + W]
        scores = torch.cat([q @ kk.transpose(-1, -2), (q.reshape(B, Hkv, R * c, D) @ span_k).view(B, H, c, c + W)], -1)
        scores = scores.masked_fill(~mask, NEVER)
        n = null[..., s:e]
        total = torch.logaddexp(scores.logsumexp(-1), n)
        total = torch.where(mask.any(-1) | n.isfinite(), total, torch.zeros_like(total))  # nothing to see
        p_nulls.append((n - total).exp())
        weights = (scores - total[..., None]).exp()
        softs.append(weights[..., :G] @ vv + (weights[..., G:].reshape(B, Hkv, R * c, c + W) @ span_v).view(B, H, c, D))
        last = cached[:, :, -1]  # [B, H, G + c]: the cache after the block's last query; cached ones first, in order
        pick = (torch.arange(G + c, device=dev) + (~last).long() * (G + c)).argsort(-1)[..., :G]
        kept, kept_ok = index.gather(-1, pick), last.gather(-1, pick)
    p_null = torch.cat(p_nulls, -1).transpose(1, 2)[..., None]
    soft = torch.cat(softs, 2).transpose(1, 2)
    gather = lambda t: t.gather(2, kept[..., None].expand(-1, -1, -1, t.shape[-1]))  # noqa: E731
    entries = torch.cat([gather(keys), gather(values), score.gather(2, kept)[..., None], kept_ok[..., None].float()], -1)
    return p_null, soft, entries.transpose(1, 2)


def memory_forward(mixer, x, valid, cache=None, parts=False, replace_values=None):
    """The head outputs [B, T, H, D] (before o_proj) of `mixer` with its window / sparse cache; x [B, T, hidden]
    (padding already zeroed), valid [B, T] bool (False: padding). Reads and updates `cache` when given. With `parts`:
    (p_null [B, T, H, 1], the softmax part [B, T, H, D], the linear part before the output norm [B, T, H, D]).
    `replace_values` [B, T, F] replace every head's values, the linear and the softmax part's alike (no sparse cache):
    with unit vectors the parts read off each token's weight (`LinearMixer.token_weights`)."""
    mem, idx = mixer.memory, mixer.layer_idx
    B, T, _ = x.shape
    H, Hkv, D, W, G = mixer.num_heads, mixer.num_kv_heads, mixer.head_dim, mem.window, mem.sparse
    dev = x.device
    # The teacher's projections, once: the linear part takes them through the short convolution, the softmax as is.
    projected = mixer.q_proj(x), mixer.k_proj(x), mixer.v_proj(x)
    q, k, v = mixer.project(x, cache, projected=projected)
    if replace_values is not None:
        if G:
            raise NotImplementedError(
                "memory_forward(replace_values=) with a sparse cache: which pairs it keeps depends on the values")
        v = replace_values[:, :, None].expand(B, T, H, replace_values.shape[-1]).float()
    q, k, v = mixer.features(q, k, v)
    g, beta = mixer.gates(x)
    counts = _state(cache, idx, COUNTS)
    counts = x.new_zeros(B, 3, dtype=torch.float32) if counts is None else counts  # seen, absorbed, ring start
    positions = counts[:, :1].long() + valid.long().cumsum(1) - 1
    angles = rope_angles(positions, _inv_freq(D, float(mem.rope_theta)), projected[0].dtype)
    qs = apply_rope(projected[0].view(B, T, H, D).transpose(1, 2), angles)
    ks = apply_rope(projected[1].view(B, T, Hkv, D).transpose(1, 2), angles).transpose(1, 2)
    vs = projected[2].view(B, T, Hkv, D) if replace_values is None else (
        replace_values[:, :, None].expand(B, T, Hkv, -1))

    # E: the window's last W tokens (zeros, not valid, before any) then the new ones; E[:T] leave the window now.
    # The cache holds the window packed in one fp32 tensor [B, W, F], as a ring whose oldest row is COUNTS[:, 2]. A
    # decoding step (T = 1) reads that row (it leaves) and writes the new token over it, in place: its E is the leaving
    # row then the ring's W rows, whose order the softmax does not see. Longer inputs read the ring in order.
    new = [t for t in (k, v, g, beta, ks, vs, valid[..., None]) if t is not None]
    layout = [(t.shape[2:], t.dtype) for t in new]
    ring = _state(cache, idx, WINDOW)
    start = counts[:, 2].long()  # [B]
    stepped = ring is not None and T == 1
    if ring is None:
        E = [torch.cat([t.new_zeros(B, W, *t.shape[2:]), t], 1) for t in new]
    elif stepped:
        slot = start[:, None, None].expand(B, 1, ring.shape[-1])
        leaving_row = ring.gather(1, slot)
        ring.scatter_(1, slot, _pack(new)[0])
        leaving_parts, ring_parts = _unpack(leaving_row, layout), _unpack(ring, layout, last=3)
        # k, v, g, beta: only their leaving row is read. The softmax's keys, values and valid flags: the query sees the
        # ring's W rows (`_window_step`); the sparse cache's ranking reads all W + 1 rows.
        E = leaving_parts[:-3] + ([torch.cat(parts, 1) for parts in zip(leaving_parts[-3:], ring_parts[-3:])] if G
                                  else leaving_parts[-3:])
    else:
        rows = (torch.arange(W, device=dev) + start[:, None]) % W  # [B, W]: oldest first
        old = ring.gather(1, rows[..., None].expand(B, W, ring.shape[-1]))
        E = [torch.cat(parts, 1) for parts in zip(_unpack(old, layout), new)]
    kE, vE = E[0], E[1]
    gE = E[2] if g is not None else None
    betaE = E[2 + (g is not None)] if beta is not None else None
    ksE, vsE, validE = E[-3], E[-2], E[-1][..., 0]
    leaving = [None if t is None else t[:, :T] for t in (kE, vE, gE, betaE)]

    state = _state(cache, idx, 0)
    o, new_state = linear_core(mixer.config, mixer, q, *leaving, initial_state=state,
                               output_final_state=cache is not None)
    raw = mixer.readout(o)

    absorbed = counts[:, 1:2] + validE[:, :T].float().cumsum(1)  # [B, T]: real tokens out of the window at query i
    outside = absorbed - absorbed.clamp(max=G)  # real tokens only the state holds
    null = mem.null_logit.float()[None, :, None] + outside.clamp(min=0)[:, None, :].log()  # [B, H, T]
    if not G:
        p_null, soft = (_window_step(qs, *ring_parts[-3:], null) if stepped
                        else _window(mixer, qs, ksE, vsE, validE, null, W))
    else:
        sparse_old = _state(cache, idx, SPARSE)
        if sparse_old is None:
            sparse_old = x.new_zeros(B, G, H, 2 * D + 2, dtype=torch.float32)
        recalled, _ = linear_core(mixer.config, mixer, leaving[0], *leaving, initial_state=state)
        error = (leaving[1][..., :D].float() - recalled[..., :D].float() / mixer.scale).norm(dim=-1)  # [B, T, H]
        p_null, soft, entries = _sparse_window(qs, ksE, vsE, validE, null, error, sparse_old, W)
    if parts:
        return p_null, soft, raw
    heads = p_null * mixer.o_norm(raw).float() + soft

    if cache is not None:
        cache.update_recurrent_state(new_state, idx)
        if W and not stepped:  # (a step wrote its row in place)
            cache.update_recurrent_state(_pack([t[:, T:] for t in E])[0], idx, WINDOW)
        if G:
            cache.update_recurrent_state(entries, idx, SPARSE)
        seen = counts[:, :1] + valid.float().sum(1, keepdim=True)
        oldest = (counts[:, 2:] + 1) % W if stepped else torch.zeros_like(seen)
        cache.update_recurrent_state(torch.cat([seen, absorbed[:, -1:], oldest], 1), idx, COUNTS)
    return heads.to(x.dtype)


@torch.no_grad()
def fit_null_logit(mixer, x):
    """Sets b_h to the teacher's own mean log-mean-exp score of the tokens outside the window (over the queries of
    x [B, T, hidden] that have any): the null key then carries, on average, the attention mass the teacher gives them.
    The sparse cache is left out of the count (a fit for its tokens too would depend on the selection)."""
    B, T, _ = x.shape
    H, Hkv, D, W = mixer.num_heads, mixer.num_kv_heads, mixer.head_dim, mixer.memory.window
    positions = torch.arange(T, device=x.device)[None].expand(B, -1)
    inv_freq = rope_inv_freq(D, mixer.memory.rope_theta)
    q = rope(mixer.q_proj(x).view(B, T, H, D).transpose(1, 2), positions, inv_freq).float()
    k = rope(mixer.k_proj(x).view(B, T, Hkv, D).transpose(1, 2), positions, inv_freq).float()
    scores = (q @ k.repeat_interleave(H // Hkv, 1).transpose(-1, -2)) * D**-0.5  # [B, H, T, T]
    outside = torch.ones(T, T, dtype=torch.bool, device=x.device).tril(-W)
    count = outside.sum(-1)  # [T]
    rows = count > 0
    if not rows.any():
        return
    mean = scores.masked_fill(~outside, float("-inf"))[:, :, rows].logsumexp(-1) - count[rows].log()
    mixer.memory.null_logit.copy_(mean.mean((0, 2)))
