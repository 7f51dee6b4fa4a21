"""Kernel dispatch: each mixer's CUDA kernels (fla / mlstm-kernels) when they import, the torch forms otherwise.

The fast path is chosen from what actually imported, per mixer (as transformers' qwen3_next does), never from
whether a package merely exists: a partial fla (a missing op) or a broken Triton makes `kernel_backend="auto"`
fall back to torch with one warning naming what is missing; `kernel_backend="fast"` raises with that reason.
Nothing here imports a kernel package before a CUDA tensor asks for it.
"""

import importlib
import warnings

import torch

from .linear_ops import torch_chunk, torch_recurrent

FAST_INSTALL_HINT = (
    "pip install 'linzoo[gpu]' (flash-linear-attention, fla-core, mlstm-kernels); on Hopper GPUs with "
    "Triton < 3.7.1 also pip install tilelang (or 'linzoo[hopper]')"
)
FAST_DEVICE_TYPES = ("cuda",)  # where the kernels run


class FastKernels:
    """Named functions from kernel packages, imported on first use: `FastKernels("what", name="pkg.module.attr")`.

    `load()` returns {name: function}, or None when any of them fails to import (ImportError, or whatever a broken
    Triton raises at import) — then `reason` says what is missing and one warning is emitted.
    """

    def __init__(self, what, **paths):
        self.what, self.paths = what, paths
        self._loaded, self.reason = ..., None  # `...`: not tried yet

    def load(self):
        if self._loaded is ...:
            try:
                self._loaded = {}
                for name, path in self.paths.items():
                    module, _, attr = path.rpartition(".")
                    self._loaded[name] = getattr(importlib.import_module(module), attr)
            except Exception as err:  # noqa: BLE001 - any import-time failure means "use the torch path"
                self._loaded = None
                self.reason = f"{path} did not import ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
                warnings.warn(f"linzoo: {self.what} fall back to the pure-torch path: {self.reason}. "
                              f"For the CUDA kernels: {FAST_INSTALL_HINT}.", stacklevel=3)
        return self._loaded


# fla's fused forms of the model's other ops: same math, in fp32 inside one kernel, fewer activations for backward.
FUSED_OPS = FastKernels(
    "the fused RMSNorm / SwiGLU / short convolution / cross-entropy",
    rms_norm="fla.modules.norm.layernorm.rms_norm",
    swiglu="fla.modules.activations.swiglu",
    causal_conv1d="fla.modules.causal_conv1d.causal_conv1d",
    cross_entropy="fla.modules.FusedCrossEntropyLoss",
)


def use_fast_path(config, mixer, device):
    """Whether `mixer` (a LinearMixer class or instance) runs its CUDA kernels on `device`."""
    backend = config.kernel_backend
    if backend == "torch":
        return False
    on_device = device.type in FAST_DEVICE_TYPES
    loaded = mixer.fast_kernels.load() if on_device else None
    if backend == "fast" and loaded is None:
        why = mixer.fast_kernels.reason if on_device else f"device is {device.type}"
        raise RuntimeError(
            f"kernel_backend='fast' needs CUDA and the {mixer.name!r} kernels ({FAST_INSTALL_HINT}); {why}. "
            "Set config.kernel_backend='torch' or 'auto' to use the pure-torch path."
        )
    return loaded is not None


def use_fused_ops(config, device):
    """fla's fused RMSNorm, SwiGLU, short convolution and cross-entropy, wherever they imported (CUDA only)."""
    return config.kernel_backend != "torch" and device.type in FAST_DEVICE_TYPES and FUSED_OPS.load() is not None


def fused_rms_norm(x, weight, eps):
    return FUSED_OPS.load()["rms_norm"](x, weight, None, eps=eps)


def fused_swiglu(gate, up):
    """silu(gate) * up."""
    return FUSED_OPS.load()["swiglu"](gate, up)


def fused_short_conv(x, weight, cu_seqlens=None, activation="silu"):
    """activation(causal depthwise conv) of x [B, T, C] with weight [C, W] (weight[:, -1] on the current token);
    `activation` "silu" or None."""
    return FUSED_OPS.load()["causal_conv1d"](x, weight, activation=activation, cu_seqlens=cu_seqlens)[0]


def fused_cross_entropy(logits, targets, ignore_index, reduction):
    """Cross-entropy of [N, V] logits in their own dtype (fp32 inside the kernel): no fp32 copy of the logits."""
    return FUSED_OPS.load()["cross_entropy"](ignore_index=ignore_index, reduction=reduction)(logits, targets)


def _l2_normalize(x):
    """F.normalize(x.float(), dim=-1).to(x.dtype), without its Python layers (this runs per layer and decoding step)."""
    x32 = x.float()
    return (x32 / torch.linalg.vector_norm(x32, dim=-1, keepdim=True).clamp_min(1e-12)).to(x.dtype)


def torch_core(config, q, k, v, g, beta, *, delta, scale, initial_state, output_final_state, qk_l2norm):
    if qk_l2norm:
        q, k = _l2_normalize(q), _l2_normalize(k)
    # Decoding steps (few tokens) use the recurrent step; longer inputs use the chunked form.
    if q.shape[1] <= 4:
        return torch_recurrent(q, k, v, g, beta, delta=delta, scale=scale, initial_state=initial_state,
                               output_final_state=output_final_state)
    # Per-channel decays build a [C, C, K] pairwise tensor per chunk: chunks of 16 keep that ~16x cheaper
    # than 64 (measured 0.73 s vs 0.14 s fwd+bwd per 135M-shape layer at 2 x 128 tokens on 2 CPU cores).
    chunk = min(config.chunk_size, 16) if g is not None and g.dim() == 4 else config.chunk_size
    return torch_chunk(q, k, v, g, beta, delta=delta, scale=scale, initial_state=initial_state,
                       output_final_state=output_final_state, chunk_size=chunk)


def linear_core(config, mixer, q, k, v, g, beta, *, initial_state=None, output_final_state=False, cu_seqlens=None):
    """The recurrence of `mixer` (its delta rule, scale and q/k L2 norm). q, k: [B,T,H,K]; v: [B,T,H,V];
    returns (o [B,T,H,V], final state [B,H,K,V] fp32 or None).

    With `cu_seqlens` (packed sequences, B == 1) the state restarts at every boundary.
    """
    if use_fast_path(config, mixer, q.device) and mixer.fast_takes(q):
        return mixer.fast_core(q, k, v, g, beta, initial_state=initial_state, output_final_state=output_final_state,
                               cu_seqlens=cu_seqlens)
    kw = dict(delta=mixer.delta, scale=mixer.scale, qk_l2norm=mixer.qk_l2norm)
    if cu_seqlens is None:
        return torch_core(config, q, k, v, g, beta, initial_state=initial_state,
                          output_final_state=output_final_state, **kw)
    outs = []
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        part = lambda x: None if x is None else x[:, start:end]  # noqa: E731
        o, _ = torch_core(config, part(q), part(k), part(v), part(g), part(beta), initial_state=None,
                          output_final_state=False, **kw)
        outs.append(o)
    return torch.cat(outs, 1), None
