"""The seven token mixers. Each is the teacher's q/k/v/o projections plus a few new parameters that pick
the decay `g`, the strength `beta` and the delta rule of the shared recurrence in `linear_ops`.

New parameters are initialised so a fresh student starts close to the teacher: gates start near 1
(slow decay), short convolutions start as the identity, output norms start at 1.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init

from .kernels import linear_core, use_fused_ops


def _init_decay(A_log, dt_bias):
    """As fla / Mamba2: A ~ U(1, 16); dt ~ logU(1e-3, 1e-1) stored through an inverse softplus."""
    init.copy_(A_log, torch.empty(A_log.shape).uniform_(1, 16).log())
    dt = torch.exp(torch.rand(dt_bias.shape) * (math.log(0.1) - math.log(0.001)) + math.log(0.001))
    init.copy_(dt_bias, dt + torch.log(-torch.expm1(-dt)))


class RMSNorm(nn.Module):
    """Llama's RMSNorm; with a `config` whose kernels run on CUDA (`use_fused_ops`), fla's fused kernel."""

    def __init__(self, dim, eps=1e-5, config=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.config = config

    def forward(self, x):
        if self.config is not None and use_fused_ops(self.config, x.device):
            from .kernels_fast import fused_rms_norm

            return fused_rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class ShortConv(nn.Module):
    """Causal depthwise convolution over time, initialised to the identity (weight 1 on the current token)."""

    def __init__(self, channels, size):
        super().__init__()
        self.size = size
        self.weight = nn.Parameter(torch.zeros(channels, size))
        self.reset_new_parameters()

    def reset_new_parameters(self):
        identity = torch.zeros_like(self.weight)
        identity[:, -1] = 1.0
        init.copy_(self.weight, identity)

    def forward(self, x, cache=None, layer_idx=None, seq_idx=None, cu_seqlens=None, fused=False):
        """x: [B, T, C]. With a cache, prepends the cached inputs and stores the newest `size` ones.

        `fused`: fla's causal_conv1d kernel, packed rows split by `cu_seqlens` instead of `seq_idx`.
        """
        T = x.shape[1]
        if cache is not None:
            x = cache.update_conv_state(x.transpose(1, 2), layer_idx, conv_kernel_size=self.size).transpose(1, 2)
        if fused:
            from .kernels_fast import fused_short_conv

            return fused_short_conv(x, self.weight, cu_seqlens)[:, -T:]
        # Tap j looks j steps back; with packed sequences (seq_idx) a tap never crosses a boundary.
        # The weight takes x's dtype, so under bf16 autocast q, k, v stay bf16 for the kernels (as fla's conv).
        weight = self.weight.to(x.dtype)
        out = x * weight[:, -1]
        for j in range(1, self.size):
            shifted = F.pad(x, (0, 0, j, 0))[:, : x.shape[1]]
            if seq_idx is not None:
                shifted = shifted * (F.pad(seq_idx, (j, 0), value=-1)[:, : x.shape[1]] == seq_idx).unsqueeze(-1)
            out = out + shifted * weight[:, -1 - j]
        return F.silu(out[:, -T:])


class LinearMixer(nn.Module):
    """Shared body: projections (teacher's), optional short conv, features, the recurrence, per-head norm."""

    delta = False  # delta rule (erase before write)
    qk_l2norm = False

    def __init__(self, config, layer_idx):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = H = config.num_attention_heads
        self.num_kv_heads = Hkv = config.num_key_value_heads
        self.head_dim = D = config.head_dim
        self.scale = D**-0.5
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, H * D, bias=False)
        self.k_proj = nn.Linear(hidden, Hkv * D, bias=False)
        self.v_proj = nn.Linear(hidden, Hkv * D, bias=False)
        self.o_proj = nn.Linear(H * D, hidden, bias=False)
        self.conv = ShortConv((H + 2 * Hkv) * D, config.conv_size) if config.use_short_conv else None
        self.o_norm = RMSNorm(self.value_dim, eps=config.rms_norm_eps, config=config)

    @property
    def value_dim(self):
        return self.config.head_dim

    def gates(self, x):
        """Returns (g, beta) for hidden states x [B, T, hidden]; g is log-decay [B,T,H] or [B,T,H,K]."""
        return None, None

    def features(self, q, k, v):
        return q, k, v

    def readout(self, o):
        return o

    def forward(self, hidden_states, attention_mask=None, cache=None, seq_idx=None, cu_seqlens=None):
        x = hidden_states
        if attention_mask is not None:
            # Padding writes nothing: with zero inputs k = v = 0 and the (still zero) state stays zero.
            x = x * attention_mask[:, -x.shape[1] :, None].to(x.dtype)
        B, T, _ = x.shape
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.conv is not None:
            fused = use_fused_ops(self.config, x.device)
            q, k, v = self.conv(torch.cat([q, k, v], -1), cache, self.layer_idx, seq_idx, cu_seqlens, fused).split(
                [H * D, Hkv * D, Hkv * D], -1
            )
        q = q.view(B, T, H, D)
        k = k.view(B, T, Hkv, D).repeat_interleave(H // Hkv, dim=2)
        v = v.view(B, T, Hkv, D).repeat_interleave(H // Hkv, dim=2)
        q, k, v = self.features(q, k, v)
        g, beta = self.gates(x)

        state = None
        if cache is not None and cache.layers[self.layer_idx].is_recurrent_states_initialized[0]:
            state = cache.layers[self.layer_idx].recurrent_states[0]
        o, new_state = linear_core(
            self.config, self.kind, q, k, v, g, beta, delta=self.delta, scale=self.scale,
            initial_state=state, output_final_state=cache is not None, cu_seqlens=cu_seqlens,
            qk_l2norm=self.qk_l2norm,
        )
        if cache is not None:
            cache.update_recurrent_state(new_state, self.layer_idx)
        o = self.o_norm(self.readout(o))
        return self.o_proj(o.reshape(B, T, H * self.value_dim))


class LinearAttention(LinearMixer):
    """S_t = S_{t-1} + phi(k_t) v_t^T, o_t = phi(q_t) S_t (the per-head RMSNorm replaces the normaliser)."""

    kind = "linear_attn"

    def features(self, q, k, v):
        phi = {"elu": lambda x: F.elu(x) + 1, "relu": F.relu, "identity": lambda x: x}[self.config.feature_map]
        return phi(q), phi(k), v


class RetNet(LinearMixer):
    """S_t = gamma_h S_{t-1} + k_t v_t^T with fixed per-head decays gamma_h = 1 - 2^(-5 - h) (multi-scale retention)."""

    kind = "retnet"

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


class GLA(LinearMixer):
    """S_t = Diag(alpha_t) S_{t-1} + k_t v_t^T, alpha_t = sigmoid(W2 W1 x_t + b)^(1/16) per key channel."""

    kind = "gla"

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

    def gates(self, x):
        B, T, _ = x.shape
        g = F.logsigmoid(self.gk_proj(x).float()) / self.config.gate_logit_normalizer
        return g.view(B, T, self.num_heads, self.head_dim), None


class DeltaNet(LinearMixer):
    """S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, q and k L2-normalised, beta_t = sigmoid(w.x_t)."""

    kind = "deltanet"
    delta = True
    qk_l2norm = True

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        self.b_proj = nn.Linear(config.hidden_size, self.num_heads, bias=True)

    def reset_new_parameters(self):
        init.zeros_(self.b_proj.weight)
        init.zeros_(self.b_proj.bias)  # beta = 0.5

    def gates(self, x):
        return None, torch.sigmoid(self.b_proj(x).float())


class GatedDeltaNet(DeltaNet):
    """S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T, alpha_t = exp(-exp(A) softplus(a.x_t + dt_bias))."""

    kind = "gated_deltanet"

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        self.a_proj = nn.Linear(config.hidden_size, self.num_heads, bias=False)
        self.A_log = nn.Parameter(torch.zeros(self.num_heads))
        self.dt_bias = nn.Parameter(torch.zeros(self.num_heads))

    def reset_new_parameters(self):
        super().reset_new_parameters()
        init.zeros_(self.a_proj.weight)
        _init_decay(self.A_log, self.dt_bias)

    def gates(self, x):
        g = -self.A_log.float().exp() * F.softplus(self.a_proj(x).float() + self.dt_bias)
        return g, torch.sigmoid(self.b_proj(x).float())


class KDA(DeltaNet):
    """Kimi Delta Attention: S_t = (I - beta_t k_t k_t^T) Diag(alpha_t) S_{t-1} + beta_t k_t v_t^T, per-channel alpha."""

    kind = "kda"

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
        _init_decay(self.A_log, self.dt_bias)

    def gates(self, x):
        B, T, _ = x.shape
        f = (self.f_proj(x).float() + self.dt_bias).view(B, T, self.num_heads, self.head_dim)
        g = -self.A_log.float().exp()[:, None] * F.softplus(f)
        return g, torch.sigmoid(self.b_proj(x).float())


class MLSTM(LinearMixer):
    """xLSTM's mLSTM: C_t = f_t C_{t-1} + i_t k_t v_t^T, n_t = f_t n_{t-1} + i_t k_t,
    h_t = C_t q_t / max(|n_t . q_t|, 1), f_t = sigmoid, i_t = exp(soft-capped pre-activation).

    The normaliser n rides along as an extra value column of ones, so the state is [K, V + 1].
    """

    kind = "xlstm"

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        self.igate = nn.Linear(config.hidden_size, self.num_heads, bias=True)
        self.fgate = nn.Linear(config.hidden_size, self.num_heads, bias=True)

    def reset_new_parameters(self):
        # As xLSTM: input gate bias -10 (writes start small), forget gate biases spread over 3..6 (slow decay).
        init.zeros_(self.igate.weight)
        init.constant_(self.igate.bias, -10.0)
        init.zeros_(self.fgate.weight)
        init.copy_(self.fgate.bias, torch.linspace(3.0, 6.0, self.num_heads))

    def features(self, q, k, v):
        return q, k, torch.cat([v, torch.ones_like(v[..., :1])], -1)

    def gates(self, x):
        cap = self.config.igate_soft_cap
        i = cap * torch.tanh(self.igate(x).float() / cap)
        return F.logsigmoid(self.fgate(x).float()), i.exp()

    def readout(self, o):
        num, den = o[..., :-1], o[..., -1:]
        return num / torch.maximum(den.abs(), torch.ones_like(den))


MIXER_CLASSES = {
    cls.kind: cls for cls in (LinearAttention, RetNet, GLA, DeltaNet, GatedDeltaNet, KDA, MLSTM)
}
