"""Gated DeltaNet (Yang et al., 2025): the delta rule with a data-dependent per-head decay."""

from .kernels import FastKernels
from .mixer_base import DeltaRuleMixer, HeadDecay


class GatedDeltaNet(DeltaRuleMixer, HeadDecay):
    """S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, alpha_t = exp(-exp(A) softplus(a.x_t + dt_bias))."""

    name = "gated_deltanet"
    title = "Gated DeltaNet"
    gated = True
    recurrence = "S_t = α_t (I − β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ, per-head α_t = exp(−e^A softplus(a·x_t + dt))"
    new_parameters = "α (A_log, dt), β, short conv"
    start_knobs = ("half_life", "strength")
    fast_kernels = FastKernels("the gated_deltanet kernels",
                               chunk="fla.ops.gated_delta_rule.chunk_gated_delta_rule",
                               recurrent="fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule")

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        self.add_head_decay(config)

    def reset_new_parameters(self):
        super().reset_new_parameters()
        self.reset_head_decay()

    def set_start_knobs(self, half_life, strength):
        self.start_head_decay(half_life)
        self.start_strength(strength)

    def gates(self, x):
        return self.head_decay(x)[0], self.beta(x)

