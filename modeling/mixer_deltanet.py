"""DeltaNet (Schlag et al., 2021; Yang et al., 2024): the delta rule without decay."""

import torch

from .kernels import FastKernels
from .mixer_base import DeltaRuleMixer


class DeltaNet(DeltaRuleMixer):
    """S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, q and k L2-normalised, beta_t = sigmoid(w.x_t)."""

    name = "deltanet"
    title = "DeltaNet"
    recurrence = "S_t = (I − β_t k_t k_tᵀ) S_{t-1} + β_t k_t v_tᵀ: the delta rule erases before it writes"
    new_parameters = "β, short conv"
    start_knobs = ("strength",)
    fast_kernels = FastKernels("the deltanet kernels", chunk="fla.ops.delta_rule.chunk_delta_rule",
                               recurrent="fla.ops.delta_rule.fused_recurrent_delta_rule")

    def fast_takes(self, q):
        """fla's chunked delta rule refuses float32 ("ChunkDeltaRuleFunction does not support float32", an assert in
        fla.ops.delta_rule.chunk): a float32 prefill or training step (the fitted start on CUDA, `--dtype float32`
        evals) takes the torch path, which the kernels match; its recurrent decoding step takes float32."""
        return q.dtype != torch.float32 or self.fast_recurrent(q)

    def set_start_knobs(self, strength):
        self.start_strength(strength)

    def gates(self, x):
        return None, self.beta(x)

