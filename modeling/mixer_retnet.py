"""RetNet's multi-scale retention (Sun et al., 2023): fixed per-head decays."""

import torch
from transformers import initialization as init

from .kernels import FastKernels
from .mixer_base import LinearMixer


class RetNet(LinearMixer):
    """S_t = gamma_h S_{t-1} + k_t v_t^T with fixed per-head decays gamma_h = 1 - 2^(-5 - h)."""

    name = "retnet"
    title = "RetNet"
    recurrence = "S_t = γ_h S_{t-1} + k_t v_tᵀ, γ_h = 1 − 2^(−5−h) fixed per head"
    new_parameters = "output norm"
    # Its decays are fixed by the head index (a buffer, not a parameter): from a teacher only the output norm is
    # fitted (no start_knobs).
    # fla's retention kernels use the same fixed decays 1 - 2^(-5-h).
    fast_kernels = FastKernels("the retnet kernels", chunk="fla.ops.retention.chunk_retention",
                               recurrent="fla.ops.retention.fused_recurrent_retention")

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        self.register_buffer("log_gamma", torch.empty(self.num_heads), persistent=False)
        self.reset_new_parameters()

    def reset_new_parameters(self):
        # A non-persistent buffer: recomputed here, also after from_pretrained builds the model on `meta`.
        init.copy_(self.log_gamma, (1 - 2.0 ** (-5.0 - torch.arange(self.num_heads, dtype=torch.float32))).log())

    def gates(self, x):
        B, T, _ = x.shape
        return self.log_gamma.to(x.device).expand(B, T, self.num_heads), None
