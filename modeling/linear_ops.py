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


def torch_recurrent(q, k, v, g=None, beta=None, *, delta, scale, initial_state=None, output_final_state=True):
    """Token-by-token recurrence. q, k: [B,T,H,K]; v: [B,T,H,V]. Returns (o [B,T,H,V], state [B,H,K,V] fp32)."""
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


def torch_chunk(q, k, v, g=None, beta=None, *, delta, scale, initial_state=None, output_final_state=True, chunk_size=64):
    """Chunked parallel form; same arguments and results as `torch_recurrent`."""
    dtype = v.dtype
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = chunk_size
    pad = (-T) % C
    g = _expand_gate(g, q)
    if beta is None:
        beta = q.new_ones(B, T, H)
    # Zero padding at the end writes nothing (k = 0) and decays nothing (g = 0).
    q, k, v, g = (F.pad(x.float(), (0, 0, 0, 0, 0, pad)) for x in (q, k, v, g))
    beta = F.pad(beta.float(), (0, 0, 0, pad))
    N = (T + pad) // C

    def chunks(x):  # [B, T, H, D] -> [B, H, N, C, D]
        return x.view(B, N, C, H, -1).permute(0, 3, 1, 2, 4)

    q, k, v, g = map(chunks, (q, k, v, g))
    beta = beta.view(B, N, C, H).permute(0, 3, 1, 2)
    q = q * scale
    G = g.cumsum(-2)  # cumulative log decay inside each chunk
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()

    def decayed_products(a, b, strict):
        """sum_c a_ic b_jc exp(G_ic - G_jc) for j <= i (j < i if strict), zero elsewhere."""
        mask = causal.tril(-1) if strict else causal
        if G.shape[-1] == 1:
            diff = (G[..., :, None, 0] - G[..., None, :, 0]).masked_fill(~mask, float("-inf"))
            return (a @ b.transpose(-1, -2)) * diff.exp()
        diff = (G[..., :, None, :] - G[..., None, :, :]).masked_fill(~mask[..., None], float("-inf"))
        return torch.einsum("...ic,...jc,...ijc->...ij", a, b, diff.exp())

    A = decayed_products(q, k, strict=False)
    if delta:
        # (I + M) U = diag(b) (V - (K * e^G) S0), M_jl = b_j sum_c k_jc k_lc e^(G_jc - G_lc), l < j.
        eye = torch.eye(C, device=q.device)
        L = eye + beta.unsqueeze(-1) * decayed_products(k, k, strict=True)
        rhs = torch.cat([v, k * G.exp()], dim=-1) * beta.unsqueeze(-1)
        solved = torch.linalg.solve_triangular(L, rhs, upper=False, unitriangular=True)
        U0, W = solved[..., :V], solved[..., V:]
    else:
        U0, W = v * beta.unsqueeze(-1), None

    S = q.new_zeros(B, H, K, V) if initial_state is None else initial_state.float().clone()
    o = torch.empty_like(v)
    G_last = G[..., -1:, :]  # [B, H, N, 1, K or 1]
    for n in range(N):
        U = U0[:, :, n] if W is None else U0[:, :, n] - W[:, :, n] @ S
        o[:, :, n] = (q[:, :, n] * G[:, :, n].exp()) @ S + A[:, :, n] @ U
        S = S * G_last[:, :, n].transpose(-1, -2).exp() + (k[:, :, n] * (G_last[:, :, n] - G[:, :, n]).exp()).transpose(-1, -2) @ U
    o = o.permute(0, 2, 3, 1, 4).reshape(B, N * C, H, V)[:, :T]
    return o.to(dtype), (S if output_final_state else None)
