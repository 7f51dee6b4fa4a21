"""Mamba-2's state-space duality (Dao & Gu, 2024): a scalar per-head decay tied to an input-dependent step.

In Mamba-2's names C_t = q_t, B_t = k_t, x_t = v_t (the teacher's projections, through the short convolution
as Mamba-2's conv1d; its SiLU per config `conv_activation`), Δ_t = softplus(a·x_t + dt_bias) and decay exp(−e^A Δ_t) (`mixer_base.HeadDecay`).
Mamba-2's D skip and z-gated norm are left out: the per-head output norm plays the norm's part, as for the other
mixers.
"""

from .kernels import FastKernels
from .mixer_base import HeadDecay, LinearMixer


class Mamba2(LinearMixer, HeadDecay):
    """S_t = exp(-exp(A) dt_t) S_{t-1} + dt_t k_t v_t^T, dt_t = softplus(a.x_t + dt_bias) per head."""

    name = "mamba2"
    title = "Mamba-2 (SSD)"
    gated = True
    recurrence = "S_t = exp(−e^A Δ_t) S_{t-1} + Δ_t k_t v_tᵀ, per-head step Δ_t = softplus(a·x_t + dt)"
    new_parameters = "Δ (A_log, dt, its projection), short conv"
    # The step also scales the write, but with no delta rule a per-head scale is undone by the output norm: only the
    # decay is a knob.
    start_knobs = ("half_life",)
    # SSD with a scalar decay per head is GLA with that decay on every key channel, the step folded into v. Training
    # uses fla's GLA chunk kernel: fla 0.6's simple-GLA chunk backward with a data-dependent decay refuses Hopper
    # GPUs under Triton < 3.7.1 (fla #640) and its tilelang path does not cover it; decoding uses simple GLA's step.
    fast_kernels = FastKernels("the mamba2 kernels", chunk="fla.ops.gla.chunk_gla",
                               recurrent="fla.ops.simple_gla.fused_recurrent_simple_gla")
    short_conv = True

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        self.add_head_decay(config)  # Mamba-2's dt projection is `a_proj`

    def reset_new_parameters(self):
        self.reset_head_decay()

    def set_start_knobs(self, half_life):
        self.start_head_decay(half_life)

    def gates(self, x):
        return self.head_decay(x)  # (log-decay, step): the step scales the write

    def fast_call(self, fns, recurrent, q, k, v, g, beta, **common):
        v = v * beta.unsqueeze(-1)
        if recurrent:
            return fns["recurrent"](q, k, v, g=g, **common)
        return fns["chunk"](q, k, v, g=g.unsqueeze(-1).expand(k.shape).contiguous(), **common)
