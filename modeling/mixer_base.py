"""What every token mixer shares: the teacher's q/k/v/o projections, an optional short convolution, the one
recurrence of `linear_ops` (through `kernels.linear_core`) and a per-head output norm.

A mixer is one small class in its own file (`mixer_<name>.py`) that declares its facts — name, recurrence in
words, fast kernels, defaults, benchmark peer — and picks the decay `g`, the strength `beta` and the delta rule;
`mixers.py` registers it, and the config, kernel dispatch, cards, Space, tests, recipes and benchmark read
those facts from there.

New parameters start as each mixer's `reset_new_parameters` documents (gates near 1, identity short convolutions,
unit output norms): the plain start of a model built from its config. Given calibration tokens, `linzoo.linearize`
fits them to the teacher instead (each mixer's `set_start_knobs` below, then `linzoo.calibrate`'s output-norm fit).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init

from .kernels import fused_rms_norm, fused_short_conv, linear_core, torch_core, use_fused_ops
from .memory import Memory, memory_forward, memory_state_shapes

# Below this many new tokens and without autograd, decode with the fused-recurrent kernels (as fla's layers do).
RECURRENT_MAX_LEN = 64
# Which of q, k, v the short convolution's SiLU applies to (config `conv_activation`): "silu" all three (fla's
# ShortConvolution, and every checkpoint saved before the field existed); "silu_qk" q and k only, so that the value
# path is exactly the teacher's v_proj at init (the start `linzoo.linearize` fits to a teacher); "identity" none.
CONV_ACTIVATIONS = ("silu", "silu_qk", "identity")


def decay_rate(half_life):
    """Per-token log-decay rate (> 0) of a memory that halves in `half_life` tokens: ln(2) / half_life."""
    return math.log(2.0) / torch.as_tensor(half_life, dtype=torch.float32)


def inverse_softplus(y):
    """x with softplus(x) = y, for y > 0."""
    return y + torch.log(-torch.expm1(-y))


def init_decay(A_log, dt_bias):
    """As fla / Mamba2: A ~ U(1, 16); dt ~ logU(1e-3, 1e-1) stored through an inverse softplus."""
    init.copy_(A_log, torch.empty(A_log.shape).uniform_(1, 16).log())
    dt = torch.exp(torch.rand(dt_bias.shape) * (math.log(0.1) - math.log(0.001)) + math.log(0.001))
    init.copy_(dt_bias, dt + torch.log(-torch.expm1(-dt)))


class HeadDecay:
    """A data-dependent decay per head, as Mamba-2 and Gated DeltaNet have it: step dt_t = softplus(a.x_t + dt_bias),
    log-decay g_t = -exp(A_log) dt_t. Parameters `a_proj`, `A_log`, `dt_bias` (fla's names); a mixin for a mixer."""

    def add_head_decay(self, config):
        self.a_proj = nn.Linear(config.hidden_size, self.num_heads, bias=False)
        self.A_log = nn.Parameter(torch.zeros(self.num_heads))
        self.dt_bias = nn.Parameter(torch.zeros(self.num_heads))

    def reset_head_decay(self):
        init.zeros_(self.a_proj.weight)
        init_decay(self.A_log, self.dt_bias)

    @torch.no_grad()
    def start_head_decay(self, half_life):
        """Per head [H] (a_proj at zero): A = 1 and dt = ln(2) / half_life, so the decay halves the state in
        `half_life` tokens."""
        self.A_log.zero_()
        self.dt_bias.copy_(inverse_softplus(decay_rate(half_life)))

    def head_decay(self, x):
        """(log-decay g [B, T, H], step dt [B, T, H]) in fp32."""
        dt = F.softplus(self.a_proj(x).float() + self.dt_bias)
        return -self.A_log.float().exp() * dt, dt


class RMSNorm(nn.Module):
    """Llama's RMSNorm; with a `config` whose kernels run on CUDA (`use_fused_ops`), fla's fused kernel."""

    def __init__(self, dim, eps=1e-5, config=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.config = config

    def forward(self, x):
        if self.config is not None and use_fused_ops(self.config, x.device):
            return fused_rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class ShortConv(nn.Module):
    """Causal depthwise convolution over time, initialised to the identity (weight 1 on the current token), then
    SiLU on the first `silu_channels` channels (all by default)."""

    def __init__(self, channels, size, silu_channels=None):
        super().__init__()
        self.size = size
        self.silu_channels = channels if silu_channels is None else silu_channels
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
        everywhere = self.silu_channels == x.shape[-1]
        if fused:
            out = fused_short_conv(x, self.weight, cu_seqlens, activation="silu" if everywhere else None)[:, -T:]
            return out if everywhere else self.activate(out)
        # Tap j looks j steps back; with packed sequences (seq_idx) a tap never crosses a boundary.
        # The weight takes x's dtype, so under bf16 autocast q, k, v stay bf16 for the kernels (as fla's conv).
        # Each tap adds into the rows it reaches, in place (no shifted copy of x): the first j rows get nothing.
        weight = self.weight.to(x.dtype)
        L = x.shape[1]
        out = x * weight[:, -1]
        for j in range(1, min(self.size, L)):
            shifted = x[:, : L - j]
            if seq_idx is not None:
                shifted = shifted * (seq_idx[:, : L - j] == seq_idx[:, j:]).unsqueeze(-1)
            out[:, j:].addcmul_(shifted, weight[:, -1 - j])
        return self.activate(out[:, -T:])

    def activate(self, out):
        """SiLU on the first `silu_channels` channels of out [B, T, C]."""
        n = self.silu_channels
        if n == out.shape[-1]:
            return F.silu(out)
        return out if n == 0 else torch.cat([F.silu(out[..., :n]), out[..., n:]], -1)


class LinearMixer(nn.Module):
    """Shared body: projections (teacher's), optional short conv, features, the recurrence, per-head norm.

    A subclass declares (class attributes, read by the registry and everything derived from it):
        name, title, recurrence, new_parameters: its config value, display name, recurrence and new
            parameters in words (cards, README);
        start_knobs: the per-head knobs its `set_start_knobs` sets ("half_life", "strength"), which
            `linzoo.calibrate` fits to a teacher;
        fast_kernels: a `kernels.FastKernels` with `chunk` and `recurrent` functions (or its own `fast_core`);
        short_conv: whether the short convolution is on by default; delta, qk_l2norm: the delta rule and
            L2-normalised q, k; state_value_columns: extra value columns its state carries;
    and overrides `gates`, `features`, `readout`, `fast_call` as it needs.
    """

    name = title = recurrence = new_parameters = None
    gated = False  # whether the state decays by a gate computed from the input (RetNet's fixed decay is not one)
    start_knobs = ()  # what `set_start_knobs` sets: "half_life" and/or "strength"
    fast_kernels = None
    short_conv = False
    delta = False
    qk_l2norm = False
    state_value_columns = 0

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
        silu = {"silu": None, "silu_qk": (H + Hkv) * D, "identity": 0}[config.conv_activation]
        self.conv = ShortConv((H + 2 * Hkv) * D, config.conv_size, silu) if config.use_short_conv else None
        self.o_norm = RMSNorm(D, eps=config.rms_norm_eps, config=config)
        # Exact softmax over a sliding window and a sparse cache beside the state (`memory.py`); off by default.
        self.memory = Memory(config, H) if config.window_size or config.sparse_cache_size else None

    @classmethod
    def state_shapes(cls, config):
        """Per-layer cache tensors (without batch): the recurrent state [H, K, V] (fp32), the conv window and, with a
        window or sparse cache, theirs (`memory.memory_state_shapes`, fp32). A whole model's bytes at a context length:
        `configuration_linzoo.state_sizes`."""
        H, Hkv, D = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        shapes = {"recurrent": (H, D, D + cls.state_value_columns)}
        if config.use_short_conv:
            shapes["conv"] = ((H + 2 * Hkv) * D, config.conv_size)
        if config.window_size or config.sparse_cache_size:
            shapes.update(memory_state_shapes(cls, config))
        return shapes

    def set_start_knobs(self, half_life=None, strength=None):
        """Sets the gates for a start fitted to a teacher (`linzoo.calibrate`), with their input-dependent parts
        still at zero: per head [H], a decay that halves the state in `half_life` tokens and a write strength in
        (0, 1). Gets exactly the knobs of `start_knobs`; a mixer without any has nothing to set (its output norm
        is fitted either way)."""

    def gates(self, x):
        """Returns (g, beta) for hidden states x [B, T, hidden]; g is log-decay [B,T,H] or [B,T,H,K]."""
        return None, None

    def features(self, q, k, v):
        return q, k, v

    def readout(self, o):
        return o

    def fast_call(self, fns, recurrent, q, k, v, g, beta, **common):
        """Calls this mixer's fla kernel (`fns["recurrent"]` for short no-grad decoding, else `fns["chunk"]`)."""
        return fns["recurrent" if recurrent else "chunk"](q, k, v, **common)

    def fast_takes(self, q) -> bool:
        """Whether the CUDA kernels take inputs like `q`; where not, `kernels.linear_core` runs the torch path."""
        return True

    @staticmethod
    def fast_recurrent(q) -> bool:
        """Whether `fast_core` takes the recurrent kernel for `q` (short, no gradient: decoding), not the chunked
        one."""
        return q.shape[1] <= RECURRENT_MAX_LEN and not torch.is_grad_enabled()

    def fast_core(self, q, k, v, g, beta, *, initial_state=None, output_final_state=False, cu_seqlens=None):
        """The recurrence on the CUDA kernels: exactly what `linear_ops.torch_chunk` computes, same state layout
        [B, H, K, V] in fp32."""
        recurrent = self.fast_recurrent(q)
        common = dict(scale=self.scale, initial_state=None if initial_state is None else initial_state.float(),
                      output_final_state=output_final_state, cu_seqlens=cu_seqlens)
        if self.qk_l2norm:
            common["use_qk_l2norm_in_kernel"] = True
        if beta is not None:
            beta = beta.to(q.dtype)
        return self.fast_call(self.fast_kernels.load(), recurrent, q, k, v, g, beta, **common)

    def project(self, x, cache=None, seq_idx=None, cu_seqlens=None, projected=None):
        """q [B,T,H,D], k and v [B,T,H,D] (key/value heads repeated) for hidden states x, through the short
        convolution where there is one; `features` not yet applied. `projected`: x's q_proj, k_proj and v_proj outputs
        when the caller has them already (the window's softmax reads them too)."""
        B, T, _ = x.shape
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        q, k, v = projected if projected is not None else (self.q_proj(x), self.k_proj(x), self.v_proj(x))
        if self.conv is not None:
            fused = use_fused_ops(self.config, x.device)
            q, k, v = self.conv(torch.cat([q, k, v], -1), cache, self.layer_idx, seq_idx, cu_seqlens, fused).split(
                [H * D, Hkv * D, Hkv * D], -1
            )
        q = q.view(B, T, H, D)
        k = k.view(B, T, Hkv, D).repeat_interleave(H // Hkv, dim=2)
        v = v.view(B, T, Hkv, D).repeat_interleave(H // Hkv, dim=2)
        return q, k, v

    @torch.no_grad()
    def token_weights(self, hidden_states, **_):
        """[B, H, T, T]: the weight of token j's value in head output t, before the output norm — this mixer's
        counterpart of softmax attention weights. Every mixer's output is linear in the values, so running the
        recurrence (pure torch) with token j's value set to the j-th unit vector reads the weights off exactly.
        With a sliding window (`memory.py`) a head is p_null * o_norm(linear part) + softmax part: the linear part's
        weights count at p_null times the output norm's gain at that token (||o_norm(y)|| / ||y||, y the real linear
        part), beside the window's softmax weights. With a sparse cache (whose choice depends on the values) this
        raises."""
        x = hidden_states
        B, T, _ = x.shape
        units = torch.eye(T, device=x.device, dtype=torch.float32).expand(B, T, T)
        if self.memory is not None:
            if self.memory.sparse:
                raise NotImplementedError(
                    "token_weights is not defined with sparse_cache_size > 0 (which pairs the cache keeps depends on "
                    "the values): score heads on the student without it (load it with sparse_cache_size=0).")
            valid = torch.ones(B, T, dtype=torch.bool, device=x.device)
            _, _, raw = memory_forward(self, x, valid, parts=True)
            norm = raw.float().norm(dim=-1, keepdim=True).clamp_min(1e-12)
            gain = self.o_norm(raw).float().norm(dim=-1, keepdim=True) / norm
            p_null, soft, linear = memory_forward(self, x, valid, parts=True, replace_values=units)
            return (p_null * gain * linear.float() + soft).transpose(1, 2)
        q, k, _ = self.project(x)
        q, k, units = self.features(q.float(), k.float(), units[:, :, None].expand(B, T, self.num_heads, T))
        g, beta = self.gates(x)
        o, _ = torch_core(self.config, q, k, units, g, beta, delta=self.delta, scale=self.scale, initial_state=None,
                          output_final_state=False, qk_l2norm=self.qk_l2norm)
        return self.readout(o).transpose(1, 2)

    def forward(self, hidden_states, attention_mask=None, cache=None, seq_idx=None, cu_seqlens=None):
        x = hidden_states
        if attention_mask is not None:
            # Padding writes nothing: with zero inputs k = v = 0 and the (still zero) state stays zero.
            x = x * attention_mask[:, -x.shape[1] :, None].to(x.dtype)
        B, T, _ = x.shape
        H, D = self.num_heads, self.head_dim
        if self.memory is not None:
            valid = torch.ones(B, T, dtype=torch.bool, device=x.device) if attention_mask is None else (
                attention_mask[:, -T:].bool())
            if cu_seqlens is None:
                o = memory_forward(self, x, valid, cache)
            else:  # packed rows: sequence by sequence, each from an empty memory
                bounds = cu_seqlens.tolist()
                o = torch.cat([memory_forward(self, x[:, s:e], valid[:, s:e]) for s, e in zip(bounds[:-1], bounds[1:])], 1)
            return self.o_proj(o.reshape(B, T, H * D))
        q, k, v = self.features(*self.project(x, cache, seq_idx, cu_seqlens))
        g, beta = self.gates(x)

        state = None
        if cache is not None and cache.layers[self.layer_idx].is_recurrent_states_initialized[0]:
            state = cache.layers[self.layer_idx].recurrent_states[0]
        o, new_state = linear_core(self.config, self, q, k, v, g, beta, initial_state=state,
                                   output_final_state=cache is not None, cu_seqlens=cu_seqlens)
        if cache is not None:
            cache.update_recurrent_state(new_state, self.layer_idx)
        o = self.o_norm(self.readout(o))
        return self.o_proj(o.reshape(B, T, H * D))


class DeltaRuleMixer(LinearMixer):
    """The delta rule's shared part: erase before write with strength beta_t = sigmoid(w.x_t + b), q and k
    L2-normalised, short convolution on by default (as fla's delta-rule layers)."""

    short_conv = True
    delta = True
    qk_l2norm = True

    def __init__(self, config, layer_idx):
        super().__init__(config, layer_idx)
        self.b_proj = nn.Linear(config.hidden_size, self.num_heads, bias=True)

    def reset_new_parameters(self):
        init.zeros_(self.b_proj.weight)
        init.zeros_(self.b_proj.bias)  # beta = 0.5

    @torch.no_grad()
    def start_strength(self, strength):
        """beta = strength per head [H] (b_proj's weight at zero)."""
        self.b_proj.bias.copy_(torch.logit(torch.as_tensor(strength, dtype=torch.float32)))

    def beta(self, x):
        return torch.sigmoid(self.b_proj(x).float())

    def fast_call(self, fns, recurrent, q, k, v, g, beta, **common):
        """fla's delta-rule kernels: strength `beta`, and the decay `g` of the gated ones."""
        gate = {} if g is None else {"g": g}
        return fns["recurrent" if recurrent else "chunk"](q, k, v, **gate, beta=beta, **common)
