"""Gated DeltaNet (Yang et al., 2025): the delta rule with a data-dependent per-head decay."""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init

from .kernels import FastKernels
from .mixer_base import DeltaRuleMixer, init_decay


class GatedDeltaNet(DeltaRuleMixer):
    """S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, alpha_t = exp(-exp(A) softplus(a.x_t + dt_bias))."""

    name = "gated_deltanet"
    title = "Gated DeltaNet"
    recurrence = "S_t = α_t (I − β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ, per-head α_t = exp(−e^A softplus(a·x_t + dt))"
    new_parameters = "α (A_log, dt), β, short conv"
    fast_kernels = FastKernels("the gated_deltanet kernels",
                               chunk="fla.ops.gated_delta_rule.chunk_gated_delta_rule",
                               recurrent="fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule")
    fla_peer = ("GatedDeltaNetConfig", "GatedDeltaNetForCausalLM", dict(head_dim=64, expand_v=1))

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        self.a_proj = nn.Linear(config.hidden_size, self.num_heads, bias=False)
        self.A_log = nn.Parameter(torch.zeros(self.num_heads))
        self.dt_bias = nn.Parameter(torch.zeros(self.num_heads))

    def reset_new_parameters(self):
        super().reset_new_parameters()
        init.zeros_(self.a_proj.weight)
        init_decay(self.A_log, self.dt_bias)

    def gates(self, x):
        g = -self.A_log.float().exp() * F.softplus(self.a_proj(x).float() + self.dt_bias)
        return g, self.beta(x)

    def fast_call(self, fns, recurrent, q, k, v, g, beta, **common):
        return fns["recurrent" if recurrent else "chunk"](q, k, v, g=g, beta=beta, **common)
