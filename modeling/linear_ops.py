"""Pure-torch reference forms of the one recurrence behind every linzoo mixer.

Per head, with a state S of shape [K, V] (fp32):

    S_t = (I - b_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + b_t k_t v_t^T     (delta=True)
    S_t = Diag(exp(g_t)) S_{t-1} + b_t k_t v_t^T                         (delta=False)
    o_t = scale * S_t^T q_t

`g` is a log-decay (<= 0), per head [B, T, H] or per key channel [B, T, H, K], or absent (no decay);
`b` is the delta-rule strength (delta=True) or a write scale (xLSTM's input gate), or absent (1).
Every mixer (`mixer_<name>.py`) is a choice of g, b and delta.

`torch_chunk` is the chunked form for training/prefill (pairwise in-chunk decays are formed as
exp(G_i - G_j) for j <= i only, so nothing overflows; the delta rule's in-chunk triangular system is
solved in the WY/UT form); `torch_recurrent` is the step form for decoding. Both give the same numbers.
"""

import torch
import torch.nn.functional as F


def _expand_gate(g, like):
    """[B,T,H] -> [B,T,H,1]; [B,T,H,K] unchanged; None -> zeros [B,T,H,1]."""
    if g is None:
        return like.new_zeros(like.shape[:-1] + (1,))
    return g.unsqueeze(-1) if g.dim() == 3 else g


def _fp32(core):
    """The core in fp32 whatever autocast says around it (a bf16 training step's autocast made its matmuls bf16, and
    CPU has no bf16 triangular solve): it upcasts its inputs itself and returns the values' dtype. The window's softmax
    (`memory.py`) too: under autocast its scores came out bf16, where the masked logit (fp32's lowest) overflows."""
    import functools

    @functools.wraps(core)
    def run(q, *args, **kwargs):
        with torch.autocast(q.device.type, enabled=False):
            return core(q, *args, **kwargs)

    return run



@_fp32
def torch_recurrent(q, k, v, g=None, beta=None, *, delta, scale, initial_state=None, output_final_state=True):
    """Token-by-token recurrence. q, k: [B,T,H,K]; v: [B,T,H,V]. Returns (o [B,T,H,V], state [B,H,K,V] fp32)."""
    dtype = v.dtype
    T = q.shape[1]
    # A decoding step runs this for one token per layer: everything that needs no state is done for all steps first,
    # and each step is a few batched products ([B, H, 1, K] @ [B, H, K, V]); S is never written in place.
    q, k, v = q.float() * scale, k.float(), v.float()
    decay = _expand_gate(g, q).float().exp().unsqueeze(-1)  # [B, T, H, K or 1, 1]
    beta = None if beta is None else beta.float().unsqueeze(-1)
    S = q.new_zeros(q.shape[0], q.shape[2], q.shape[3], v.shape[-1]) if initial_state is None else initial_state.float()
    outs = []
    for t in range(T):
        S = S * decay[:, t]
        key = k[:, t].unsqueeze(-2)  # [B, H, 1, K]
        u = v[:, t]
        if delta:
            u = u - (key @ S).squeeze(-2)
        if beta is not None:
            u = u * beta[:, t]
        S = torch.addcmul(S, key.transpose(-1, -2), u.unsqueeze(-2))
        outs.append(q[:, t].unsqueeze(-2) @ S)
    o = torch.cat(outs, -2).transpose(1, 2)  # [B, T, H, V]
    return o.to(dtype), (S if output_final_state else None)


@_fp32
def torch_chunk(q, k, v, g=None, beta=None, *, delta, scale, initial_state=None, output_final_state=True, chunk_size=64):
    """Chunked parallel form; same arguments and results as `torch_recurrent`."""
    dtype = v.dtype
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = chunk_size
    pad = (-T) % C
    N = (T + pad) // C
    g = _expand_gate(g, q)

    def chunks(x):  # [B, T, H, D] -> [N, B H, C, D] fp32 and contiguous, so that chunk n is x[n] and batched
        # matmuls take it without a copy. Zero padding at the end writes nothing (k = 0) and decays nothing (g = 0).
        x = F.pad(x.float(), (0, 0, 0, 0, 0, pad)) if pad else x.float()
        return x.view(B, N, C, H, -1).permute(1, 0, 3, 2, 4).reshape(N, B * H, C, x.shape[-1])

    q, k, v, g = map(chunks, (q, k, v, g))
    G = g.cumsum(-2)  # cumulative log decay inside each chunk [N, BH, C, 1 or K]
    # In-place steps below only touch fresh tensors that nothing has saved for backward yet.
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    if G.shape[-1] == 1:  # decay[i, j] = exp(G_i - G_j) for j <= i, 0 above, shared by A and the delta rule's system
        decay = (G[..., :, None, 0] - G[..., None, :, 0]).masked_fill_(~causal, float("-inf")).exp_()
        A = (q @ k.transpose(-1, -2)).mul_(scale).mul_(decay)
        KK = (k @ k.transpose(-1, -2)).mul_(decay) if delta else None
    else:  # per key channel: decay[i, j, c] = exp(G_ic - G_jc)
        decay = (G[..., :, None, :] - G[..., None, :, :]).masked_fill_(~causal[..., None], float("-inf")).exp_()
        A = torch.einsum("...ic,...jc,...ijc->...ij", q * scale, k, decay)
        KK = torch.einsum("...ic,...jc,...ijc->...ij", k, k, decay) if delta else None
    eG = G.exp()
    b = None if beta is None else chunks(beta.unsqueeze(-1))  # [N, BH, C, 1]
    if delta:
        # (I + M) [U0, W] = diag(b) [V, K e^G], M_jl = b_j sum_c k_jc k_lc e^(G_jc - G_lc) for l < j. Unitriangular:
        # solve_triangular reads (and differentiates) only the strictly lower part of KK * b.
        solved = torch.linalg.solve_triangular(KK.mul_(b), torch.cat([v, k * eG], -1).mul_(b), upper=False,
                                               unitriangular=True)
        U0, W = solved[..., :V], solved[..., V:]
    else:
        U0, W = (v if b is None else v * b), None

    # Across chunks, only what needs the running state S stays in the loop (two small matmuls per chunk); the outputs
    # of every chunk are then two batched matmuls over the stacked states S_n and values U_n.
    G_last = G[..., -1:, :]  # [N, BH, 1, K or 1]
    keys_to_end = (k * (G_last - G).exp()).transpose(-1, -2)  # [N, BH, K, C]: each key decayed to its chunk's end
    decay_chunk = G_last.transpose(-1, -2).exp()  # [N, BH, K or 1, 1]
    S = q.new_zeros(B * H, K, V) if initial_state is None else initial_state.float().reshape(B * H, K, V)
    states, values = [], []
    for n in range(N):
        U = U0[n] if W is None else torch.baddbmm(U0[n], W[n], S, alpha=-1)  # U0 - W S
        states.append(S)
        values.append(U)
        S = torch.baddbmm(S * decay_chunk[n], keys_to_end[n], U)
    o = (A @ torch.stack(values)).view(N * B * H, C, V).baddbmm_(
        (q * (eG * scale)).reshape(N * B * H, C, K), torch.stack(states).view(N * B * H, K, V))
    o = o.view(N, B, H, C, V).permute(1, 0, 3, 2, 4).reshape(B, N * C, H, V)[:, :T]
    return o.to(dtype), (S.view(B, H, K, V) if output_final_state else None)
