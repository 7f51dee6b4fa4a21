"""Kimi Delta Attention (Kimi Linear, 2025): the delta rule with a per-channel decay."""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init

from .kernels import FastKernels
from .mixer_base import DeltaRuleMixer, decay_rate, init_decay, inverse_softplus


class KDA(DeltaRuleMixer):
    """S_t = (I - beta_t k_t k_t^T) Diag(alpha_t) S_{t-1} + beta_t k_t v_t^T, per-channel alpha."""

    name = "kda"
    title = "Kimi Delta Attention"
    gated = True
    recurrence = "S_t = (I − β_t k_t k_tᵀ) Diag(α_t) S_{t-1} + β_t k_t v_tᵀ, per-channel α_t"
    new_parameters = "per-channel α, β, short conv"
    start_knobs = ("half_life", "strength")
    fast_kernels = FastKernels("the kda kernels", chunk="fla.ops.kda.chunk_kda",
                               recurrent="fla.ops.kda.fused_recurrent_kda")

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        r = config.gate_low_rank_dim
        HD = self.num_heads * self.head_dim
        self.f_proj = nn.Sequential(nn.Linear(config.hidden_size, r, bias=False), nn.Linear(r, HD, bias=False))
        self.A_log = nn.Parameter(torch.zeros(self.num_heads))
        self.dt_bias = nn.Parameter(torch.zeros(HD))

    def reset_new_parameters(self):
        super().reset_new_parameters()
        init.zeros_(self.f_proj[1].weight)
        init_decay(self.A_log, self.dt_bias)

    @torch.no_grad()
    def set_start_knobs(self, half_life, strength):
        # A = 1 and every channel of a head at that head's rate (f_proj's second factor stays zero).
        self.A_log.zero_()
        self.dt_bias.copy_(inverse_softplus(decay_rate(half_life)).repeat_interleave(self.head_dim))
        self.start_strength(strength)

    def gates(self, x):
        B, T, _ = x.shape
        f = (self.f_proj(x).float() + self.dt_bias).view(B, T, self.num_heads, self.head_dim)
        g = -self.A_log.float().exp()[:, None] * F.softplus(f)
        return g, self.beta(x)

