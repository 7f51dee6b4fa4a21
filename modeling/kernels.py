"""One dispatch for the recurrence: fla / mlstm-kernels on CUDA when installed, the torch forms otherwise."""

import importlib.util

import torch
import torch.nn.functional as F

from .linear_ops import torch_chunk, torch_recurrent

HAS_FLA = importlib.util.find_spec("fla") is not None
HAS_MLSTM_KERNELS = importlib.util.find_spec("mlstm_kernels") is not None

FAST_INSTALL_HINT = (
    "pip install 'linzoo[gpu]' (flash-linear-attention, fla-core, mlstm-kernels); on Hopper GPUs with "
    "Triton < 3.7.1 also pip install tilelang (or 'linzoo[hopper]')"
)


def fast_available(kind):
    return HAS_MLSTM_KERNELS if kind == "xlstm" else HAS_FLA


def use_fast_path(config, kind, device):
    backend = config.kernel_backend
    if backend == "torch":
        return False
    ok = device.type == "cuda" and fast_available(kind)
    if backend == "fast" and not ok:
        raise RuntimeError(
            f"kernel_backend='fast' needs CUDA and the {kind!r} kernels ({FAST_INSTALL_HINT}); "
            f"device is {device.type}. Set config.kernel_backend='torch' or 'auto' to use the pure-torch path."
        )
    return ok


def use_fused_ops(config, device):
    """fla's fused RMSNorm, SwiGLU, short convolution and cross-entropy, wherever the fla kernels may run.

    Each computes what its torch form computes (in fp32 inside the kernel, as the torch forms upcast); they
    keep fewer activations for backward and make fewer passes over memory.
    """
    return config.kernel_backend != "torch" and device.type == "cuda" and HAS_FLA


def _torch_core(config, q, k, v, g, beta, *, delta, scale, initial_state, output_final_state, qk_l2norm):
    if qk_l2norm:
        q, k = F.normalize(q.float(), dim=-1).to(q.dtype), F.normalize(k.float(), dim=-1).to(k.dtype)
    # Decoding steps (few tokens) use the recurrent step; longer inputs use the chunked form.
    if q.shape[1] <= 4:
        return torch_recurrent(q, k, v, g, beta, delta=delta, scale=scale, initial_state=initial_state,
                               output_final_state=output_final_state)
    # Per-channel decays build a [C, C, K] pairwise tensor per chunk: chunks of 16 keep that ~16x cheaper
    # than 64 (measured 0.73 s vs 0.14 s fwd+bwd per 135M-shape layer at 2 x 128 tokens on 2 CPU cores).
    chunk = min(config.chunk_size, 16) if g is not None and g.dim() == 4 else config.chunk_size
    return torch_chunk(q, k, v, g, beta, delta=delta, scale=scale, initial_state=initial_state,
                       output_final_state=output_final_state, chunk_size=chunk)


def linear_core(config, kind, q, k, v, g, beta, *, delta, scale, initial_state=None, output_final_state=False,
                cu_seqlens=None, qk_l2norm=False):
    """q, k: [B,T,H,K]; v: [B,T,H,V]; returns (o [B,T,H,V], final state [B,H,K,V] fp32 or None).

    With `cu_seqlens` (packed sequences, B == 1) the state restarts at every boundary. `qk_l2norm` L2-normalises
    q and k first (inside the kernel on the fast path, as fla's own layers do).
    """
    if use_fast_path(config, kind, q.device):
        from .kernels_fast import fast_core

        return fast_core(kind, q, k, v, g, beta, scale=scale, initial_state=initial_state,
                         output_final_state=output_final_state, cu_seqlens=cu_seqlens, qk_l2norm=qk_l2norm)
    if cu_seqlens is None:
        return _torch_core(config, q, k, v, g, beta, delta=delta, scale=scale, initial_state=initial_state,
                           output_final_state=output_final_state, qk_l2norm=qk_l2norm)
    outs = []
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        part = lambda x: None if x is None else x[:, start:end]  # noqa: E731
        o, _ = _torch_core(config, part(q), part(k), part(v), part(g), part(beta), delta=delta, scale=scale,
                           initial_state=None, output_final_state=False, qk_l2norm=qk_l2norm)
        outs.append(o)
    return torch.cat(outs, 1), None
