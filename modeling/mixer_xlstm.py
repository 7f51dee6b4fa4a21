"""xLSTM's mLSTM (Beck et al., 2024): exponential input gate, sigmoid forget gate and a normaliser state."""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init

from .kernels import FastKernels
from .mixer_base import LinearMixer, decay_rate


def _mlstm_length(T):
    """xl_chunk wants T % 16 == 0, a power of two below 128, else a multiple of its 128 chunk."""
    if T >= 128:
        return -(-T // 128) * 128
    return max(16, 1 << (T - 1).bit_length())


class MLSTM(LinearMixer):
    """xLSTM's mLSTM: C_t = f_t C_{t-1} + i_t k_t v_t^T, n_t = f_t n_{t-1} + i_t k_t,
    h_t = C_t q_t / max(|n_t . q_t|, 1), f_t = sigmoid, i_t = exp(soft-capped pre-activation).

    The normaliser n rides along as an extra value column of ones, so the state is [K, V + 1].
    """

    name = "xlstm"
    title = "xLSTM (mLSTM)"
    gated = True
    recurrence = "C_t = f_t C_{t-1} + i_t k_t v_tᵀ, h = C_t q_t / max(\\|n_t·q_t\\|, 1), exponential input gate"
    new_parameters = "input/forget gates"
    fast_kernels = FastKernels(
        "the xlstm kernels", chunk="mlstm_kernels.torch.chunkwise.triton_xl_chunk.mlstm_chunkwise__xl_chunk",
        recurrent="mlstm_kernels.torch.recurrent.triton_step.mlstm_recurrent_step__triton",
    )
    state_value_columns = 1  # the normaliser
    start_knobs = ("half_life",)

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

    @torch.no_grad()
    def set_start_knobs(self, half_life):
        # Forget gate sigmoid(b) = exp(-rate). Input gate 1 (bias 0): at the default e^-10 the mixer's output is
        # ~1e-5, which the output norm's eps swallows; a uniform input gate is otherwise undone by the normaliser
        # and the output norm, so it is no knob.
        f = torch.exp(-decay_rate(half_life))
        self.fgate.bias.copy_(torch.logit(f))
        self.igate.bias.zero_()

    def features(self, q, k, v):
        return q, k, torch.cat([v, torch.ones_like(v[..., :1])], -1)

    def gates(self, x):
        cap = self.config.igate_soft_cap
        i = cap * torch.tanh(self.igate(x).float() / cap)
        return F.logsigmoid(self.fgate(x).float()), i.exp()

    def readout(self, o):
        num, den = o[..., :-1], o[..., -1:]
        return num / torch.maximum(den.abs(), torch.ones_like(den))

    def fast_core(self, q, k, v, g, beta, *, initial_state=None, output_final_state=False, cu_seqlens=None):
        """mlstm-kernels (their scale is always K^-0.5, as ours)."""
        fns = self.fast_kernels.load()
        i_gate = beta.log()
        if cu_seqlens is None:
            return self._mlstm(fns, q, k, v, g, i_gate, initial_state, output_final_state)
        outs = []
        bounds = cu_seqlens.tolist()
        for s, e in zip(bounds[:-1], bounds[1:]):
            outs.append(self._mlstm(fns, q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], i_gate[:, s:e], None, False)[0])
        return torch.cat(outs, 1), None

    @staticmethod
    def _mlstm(fns, q, k, v, log_f, i_gate, initial_state, output_final_state):
        """q, k: [B,T,H,K]; v: [B,T,H,V+1] (last column the normaliser's ones); state raw [B,H,K,V+1]."""
        B, T, H, K = q.shape
        V = v.shape[-1] - 1
        v = v[..., :V]
        # The kernels take the forget pre-activation and apply logsigmoid themselves.
        f_pre = log_f - torch.log(-torch.expm1(log_f))
        if initial_state is None:
            c0 = n0 = m0 = None
        else:
            c0, n0 = initial_state[..., :V].float().contiguous(), initial_state[..., V].float().contiguous()
            m0 = initial_state.new_zeros(B, H, 1, dtype=torch.float32)
        out_dtype = v.dtype
        if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v, log_f, i_gate)):
            # Training on bf16 weights without autocast (e.g. LoRA on a model loaded in bf16): the chunkwise kernels'
            # bf16 backward loses the forget-gate gradient (H200, 135M shape: 1.2e-1 relative error vs 1.0e-2 for the
            # torch path in bf16; 6.9e-3 on fp32 inputs; results/gpu/gpu_parity_H200.json), so they get fp32.
            # Under autocast the kernels cast to fp32 themselves (custom_fwd); inference keeps bf16.
            q, k, v = q.float(), k.float(), v.float()
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        i_gate, f_pre = i_gate.transpose(1, 2).float(), f_pre.transpose(1, 2).float()
        if T == 1 and not torch.is_grad_enabled() and initial_state is not None:
            h, (c, n, m) = fns["recurrent"](q[:, :, 0], k[:, :, 0], v[:, :, 0], i_gate, f_pre, c0, n0, m0, eps=0.0)
            h = h.unsqueeze(2)
        else:
            pad = _mlstm_length(T) - T
            if pad:  # padding writes nothing (k = v = 0, input gate e^-30) and keeps the state (forget gate ~1)
                q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
                i_gate, f_pre = F.pad(i_gate, (0, pad), value=-30.0), F.pad(f_pre, (0, pad), value=30.0)
            h, (c, n, m) = fns["chunk"](
                q.contiguous(), k.contiguous(), v.contiguous(), i_gate.contiguous(), f_pre.contiguous(),
                c_initial=c0, n_initial=n0, m_initial=m0, return_last_states=True, eps=0.0,
            )
            h = h[:, :, :T]
        state = torch.cat([c, n.unsqueeze(-1)], -1) * m.float().exp().unsqueeze(-1) if output_final_state else None
        # The kernels return the normalised output; ours carries (numerator, denominator) for `readout`.
        h = h.transpose(1, 2).to(out_dtype)
        return torch.cat([h, torch.ones_like(h[..., :1])], -1), state
