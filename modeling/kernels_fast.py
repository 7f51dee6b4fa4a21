"""CUDA kernels for the recurrence: fla 0.6 for six mixers, mlstm-kernels for xLSTM.

Imported only when `kernels.use_fast_path` says so. Each entry computes exactly what
`linear_ops.torch_chunk` computes (same inputs, same state layout [B, H, K, V] in fp32):
chunk kernels for training/prefill, fused-recurrent kernels for short no-grad decoding steps.
"""

import torch
import torch.nn.functional as F

try:
    from fla.ops.delta_rule import chunk_delta_rule, fused_recurrent_delta_rule
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    from fla.ops.gla import chunk_gla, fused_recurrent_gla
    from fla.ops.kda import chunk_kda, fused_recurrent_kda
    from fla.ops.retention import chunk_retention, fused_recurrent_retention
    from fla.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla
    from fla.modules import FusedCrossEntropyLoss
    from fla.modules.activations import swiglu
    from fla.modules.causal_conv1d import causal_conv1d
    from fla.modules.norm.layernorm import rms_norm
except ImportError:
    chunk_delta_rule = None
try:
    from mlstm_kernels.torch.chunkwise.triton_xl_chunk import mlstm_chunkwise__xl_chunk
    from mlstm_kernels.torch.recurrent.triton_step import mlstm_recurrent_step__triton
except ImportError:
    mlstm_chunkwise__xl_chunk = None

# Below this many new tokens and without autograd, decode with the fused-recurrent kernels (as fla's layers do).
RECURRENT_MAX_LEN = 64


def _fla(kind, q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, qk_l2norm):
    recurrent = q.shape[1] <= RECURRENT_MAX_LEN and not torch.is_grad_enabled()
    common = dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                  cu_seqlens=cu_seqlens)
    if qk_l2norm:
        if kind not in ("deltanet", "gated_deltanet", "kda"):  # the kernels that take the flag
            raise ValueError(f"qk_l2norm is not supported by the {kind!r} kernels")
        common["use_qk_l2norm_in_kernel"] = True
    if initial_state is not None:
        common["initial_state"] = initial_state.float()
    if beta is not None:
        beta = beta.to(q.dtype)
    if kind == "linear_attn":
        fn = fused_recurrent_simple_gla if recurrent else chunk_simple_gla
        return fn(q, k, v, **common)
    if kind == "retnet":  # fla's fixed decays 1 - 2^(-5-h) are ours (mixers.RetNet)
        fn = fused_recurrent_retention if recurrent else chunk_retention
        return fn(q, k, v, **common)
    if kind == "gla":
        if recurrent:
            return fused_recurrent_gla(q, k, v, gk=g, **common)
        return chunk_gla(q, k, v, g=g, **common)
    if kind == "deltanet":
        fn = fused_recurrent_delta_rule if recurrent else chunk_delta_rule
        return fn(q, k, v, beta=beta, **common)
    if kind == "gated_deltanet":
        fn = fused_recurrent_gated_delta_rule if recurrent else chunk_gated_delta_rule
        return fn(q, k, v, g=g, beta=beta, **common)
    if kind == "kda":
        fn = fused_recurrent_kda if recurrent else chunk_kda
        return fn(q, k, v, g=g, beta=beta, **common)
    raise ValueError(f"no fla kernel for mixer {kind!r}")


def _mlstm_length(T):
    """xl_chunk wants T % 16 == 0, a power of two below 128, else a multiple of its 128 chunk."""
    if T >= 128:
        return -(-T // 128) * 128
    return max(16, 1 << (T - 1).bit_length())


def _mlstm(q, k, v, log_f, i_gate, scale, initial_state, output_final_state):
    """q, k: [B,T,H,K]; v: [B,T,H,V+1] (last column the normaliser's ones); state raw [B,H,K,V+1]."""
    B, T, H, K = q.shape
    V = v.shape[-1] - 1
    v = v[..., :V]
    # The kernels take the forget pre-activation and apply logsigmoid themselves.
    f_pre = log_f - torch.log(-torch.expm1(log_f))
    if initial_state is None:
        c0 = n0 = m0 = None
    else:
        c0, n0 = initial_state[..., :V].float().contiguous(), initial_state[..., V].float().contiguous()
        m0 = initial_state.new_zeros(B, H, 1, dtype=torch.float32)
    out_dtype = v.dtype
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v, log_f, i_gate)):
        # Training on bf16 weights without autocast (e.g. LoRA on a model loaded in bf16): the chunkwise kernels'
        # bf16 backward loses the forget-gate gradient (H200, 135M shape: 1.2e-1 relative error vs 1.0e-2 for the
        # torch path in bf16; 6.9e-3 on fp32 inputs; results/gpu/gpu_parity_H200.json, xlstm), so they get fp32.
        # Under autocast the kernels cast to fp32 themselves (custom_fwd); inference keeps bf16.
        q, k, v = q.float(), k.float(), v.float()
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    i_gate, f_pre = i_gate.transpose(1, 2).float(), f_pre.transpose(1, 2).float()
    if T == 1 and not torch.is_grad_enabled() and initial_state is not None:
        h, (c, n, m) = mlstm_recurrent_step__triton(q[:, :, 0], k[:, :, 0], v[:, :, 0], i_gate, f_pre, c0, n0, m0, eps=0.0)
        h = h.unsqueeze(2)
    else:
        pad = _mlstm_length(T) - T
        if pad:  # padding writes nothing (k = v = 0, input gate e^-30) and keeps the state (forget gate ~1)
            q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
            i_gate, f_pre = F.pad(i_gate, (0, pad), value=-30.0), F.pad(f_pre, (0, pad), value=30.0)
        h, (c, n, m) = mlstm_chunkwise__xl_chunk(
            q.contiguous(), k.contiguous(), v.contiguous(), i_gate.contiguous(), f_pre.contiguous(),
            c_initial=c0, n_initial=n0, m_initial=m0, return_last_states=True, eps=0.0,
        )
        h = h[:, :, :T]
    state = torch.cat([c, n.unsqueeze(-1)], -1) * m.float().exp().unsqueeze(-1) if output_final_state else None
    # The kernels return the normalised output; ours carries (numerator, denominator) for `MLSTM.readout`.
    h = h.transpose(1, 2).to(out_dtype)
    return torch.cat([h, torch.ones_like(h[..., :1])], -1), state


def fast_core(kind, q, k, v, g, beta, *, scale, initial_state=None, output_final_state=False, cu_seqlens=None,
              qk_l2norm=False):
    if kind == "xlstm":
        if qk_l2norm:
            raise ValueError("qk_l2norm is not supported by the xlstm kernels")
        if mlstm_chunkwise__xl_chunk is None:
            raise ImportError("mlstm-kernels is not installed: pip install mlstm-kernels")
        # scale: the kernels always use K^-0.5, as MLSTM does.
        i_gate = beta.log()
        if cu_seqlens is None:
            return _mlstm(q, k, v, g, i_gate, scale, initial_state, output_final_state)
        outs = []
        bounds = cu_seqlens.tolist()
        for s, e in zip(bounds[:-1], bounds[1:]):
            outs.append(_mlstm(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], i_gate[:, s:e], scale, None, False)[0])
        return torch.cat(outs, 1), None
    if chunk_delta_rule is None:
        raise ImportError("flash-linear-attention is not installed: pip install flash-linear-attention fla-core")
    return _fla(kind, q, k, v, g, beta, scale, initial_state, output_final_state, cu_seqlens, qk_l2norm)


# fla's fused forms of the model's other ops (`kernels.use_fused_ops` picks them): same math, computed in fp32
# inside one kernel, fewer activations kept for backward.


def fused_rms_norm(x, weight, eps):
    return rms_norm(x, weight, None, eps=eps)


def fused_swiglu(gate, up):
    """silu(gate) * up."""
    return swiglu(gate, up)


def fused_short_conv(x, weight, cu_seqlens=None):
    """silu(causal depthwise conv) of x [B, T, C] with weight [C, W] (weight[:, -1] on the current token)."""
    return causal_conv1d(x, weight, activation="silu", cu_seqlens=cu_seqlens)[0]


def fused_cross_entropy(logits, targets, ignore_index, reduction):
    """Cross-entropy of [N, V] logits in their own dtype (fp32 inside the kernel): no fp32 copy of the logits."""
    return FusedCrossEntropyLoss(ignore_index=ignore_index, reduction=reduction)(logits, targets)
