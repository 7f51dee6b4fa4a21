"""Linear attention (Katharopoulos et al., 2020) with a feature map and no decay."""

import torch.nn.functional as F

from .kernels import FastKernels
from .mixer_base import LinearMixer

FEATURE_MAPS = {"elu": lambda x: F.elu(x) + 1, "relu": F.relu, "identity": lambda x: x}


class LinearAttention(LinearMixer):
    """S_t = S_{t-1} + phi(k_t) v_t^T, o_t = phi(q_t) S_t (the per-head RMSNorm replaces the normaliser)."""

    name = "linear_attn"
    title = "Linear attention"
    recurrence = "S_t = S_{t-1} + φ(k_t) v_tᵀ, φ = elu+1 (config `feature_map`)"
    new_parameters = "output norm"
    # No decay or strength: from a teacher only the output norm is fitted (no start_knobs).
    fast_kernels = FastKernels("the linear_attn kernels", chunk="fla.ops.simple_gla.chunk_simple_gla",
                               recurrent="fla.ops.simple_gla.fused_recurrent_simple_gla")

    def features(self, q, k, v):
        phi = FEATURE_MAPS[self.config.feature_map]
        return phi(q), phi(k), v
