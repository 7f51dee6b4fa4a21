"""Gated Linear Attention (Yang et al., 2024): a data-dependent decay per key channel."""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init

from .kernels import FastKernels
from .mixer_base import LinearMixer, decay_rate


class GLA(LinearMixer):
    """S_t = Diag(alpha_t) S_{t-1} + k_t v_t^T, alpha_t = sigmoid(W2 W1 x_t + b)^(1/16) per key channel."""

    name = "gla"
    title = "Gated Linear Attention"
    gated = True
    recurrence = "S_t = Diag(α_t) S_{t-1} + k_t v_tᵀ, per-channel α_t = σ(W₂W₁x_t + b)^(1/16)"
    new_parameters = "low-rank gate"
    start_knobs = ("half_life",)
    fast_kernels = FastKernels("the gla kernels", chunk="fla.ops.gla.chunk_gla",
                               recurrent="fla.ops.gla.fused_recurrent_gla")

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        r = config.gate_low_rank_dim
        self.gk_proj = nn.Sequential(
            nn.Linear(config.hidden_size, r, bias=False), nn.Linear(r, self.num_heads * self.head_dim, bias=True)
        )

    def reset_new_parameters(self):
        # Second factor starts at zero and the bias at 3: alpha = sigmoid(3)^(1/16) ~ 0.997, a slow decay.
        init.zeros_(self.gk_proj[1].weight)
        init.constant_(self.gk_proj[1].bias, 3.0)

    @torch.no_grad()
    def set_start_knobs(self, half_life):
        # logsigmoid(b) / normalizer = -rate on every channel of a head (the second factor stays zero).
        alpha = torch.exp(-self.config.gate_logit_normalizer * decay_rate(half_life))
        self.gk_proj[1].bias.copy_(torch.logit(alpha).repeat_interleave(self.head_dim))

    def gates(self, x):
        B, T, _ = x.shape
        g = F.logsigmoid(self.gk_proj(x).float()) / self.config.gate_logit_normalizer
        return g.view(B, T, self.num_heads, self.head_dim), None

    def fast_call(self, fns, recurrent, q, k, v, g, beta, **common):
        if recurrent:
            return fns["recurrent"](q, k, v, gk=g, **common)
        return fns["chunk"](q, k, v, g=g, **common)
