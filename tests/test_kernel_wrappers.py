"""The CUDA wrappers' own math, on CPU: `MLSTM.fast_core` turns our gates and state layout into what the kernels
take (xLSTM: forget pre-activation, log input gate, (C, n, m) states, padding to the kernel's lengths) and back.
With mlstm-kernels' pure-torch reference standing in for its Triton kernels, the wrapper must reproduce our
torch path exactly (fp32): outputs, final states, gradients and the decode step. Whatever then differs on
the GPU (scripts/gpu_parity.py) is the Triton kernels' own precision, not our glue.
"""

import pytest
import torch
import torch.nn.functional as F

from linzoo.modeling import LinzooConfig
from linzoo.modeling.linear_ops import torch_chunk, torch_recurrent
from linzoo.modeling.mixer_xlstm import MLSTM

native = pytest.importorskip("mlstm_kernels.torch.chunkwise.native")
native_step = pytest.importorskip("mlstm_kernels.torch.recurrent.native_step")

B, H, K, V = 2, 3, 16, 16


@pytest.fixture(autouse=True)
def _native_kernels(monkeypatch):
    def chunkwise(q, k, v, i, f, **kw):  # the reference wants T % chunk == 0; our wrapper pads to 16 / 2^n / 128
        return native.mlstm_chunkwise__native_autograd(q, k, v, i, f, chunk_size=min(64, q.shape[2]), **kw)

    monkeypatch.setattr(MLSTM.fast_kernels, "_loaded",
                        {"chunk": chunkwise, "recurrent": native_step.mlstm_recurrent_step__native})
    torch.manual_seed(0)


def mlstm_inputs(T, grad=False):
    q, k, v = torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, H, V)
    v = torch.cat([v, torch.ones_like(v[..., :1])], -1)  # MLSTM.features: the normaliser's column of ones
    log_f = F.logsigmoid(torch.randn(B, T, H) + 3.0)  # MLSTM.gates
    i_gate = (15 * torch.tanh((torch.randn(B, T, H) - 1.0) / 15)).exp()
    xs = [q, k, v, log_f, i_gate]
    return [x.requires_grad_(grad) for x in xs]


def readout(o):  # the layer's own readout (numerator / max(|denominator|, 1)); it uses no layer state
    return MLSTM.readout(None, o)


LAYER = MLSTM(LinzooConfig(hidden_size=H * K, num_attention_heads=H, num_key_value_heads=H, mixer="xlstm"), 0)


def run_fast(q, k, v, g, i, state=None):
    return LAYER.fast_core(q, k, v, g, i, initial_state=state, output_final_state=True)


def run_torch(q, k, v, g, i, state=None):
    return torch_chunk(q, k, v, g, i, delta=False, scale=K**-0.5, initial_state=state, output_final_state=True,
                       chunk_size=16)


@pytest.mark.parametrize("T", [16, 40, 128, 200])  # exact, padded to 2^n, one 128 chunk, padded to 256
def test_mlstm_wrapper_matches_torch_path(T):
    xs = mlstm_inputs(T, grad=True)
    o_fast, s_fast = run_fast(*xs)
    o_ref, s_ref = run_torch(*xs)
    h_fast, h_ref = readout(o_fast), readout(o_ref)
    torch.testing.assert_close(h_fast, h_ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(s_fast, s_ref, rtol=1e-4, atol=1e-4 * s_ref.abs().max().item())
    cot = torch.randn_like(h_ref)
    g_fast = torch.autograd.grad((h_fast * cot).sum(), xs)
    g_ref = torch.autograd.grad((h_ref * cot).sum(), xs)
    names = ["q", "k", "v", "log_f", "i_gate"]
    for name, a, b in zip(names, g_fast, g_ref):
        if name == "v":  # the ones column carries no gradient in the kernels' form
            a, b = a[..., :-1], b[..., :-1]
        err = ((a - b).norm() / b.norm()).item()
        assert err < 1e-4, f"d/d{name}: relative error {err:.2e}"


@torch.no_grad()
def test_mlstm_wrapper_decode_step_continues_the_prefill():
    T = 24
    q, k, v, g, i = mlstm_inputs(T + 3)
    o_full, _ = run_torch(q, k, v, g, i)
    _, state = run_fast(q[:, :T], k[:, :T], v[:, :T], g[:, :T], i[:, :T])
    outs = []
    for t in range(T, T + 3):  # one token at a time: the recurrent-step kernel, state carried in our layout
        o, state = run_fast(q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], g[:, t : t + 1], i[:, t : t + 1], state)
        outs.append(o)
    torch.testing.assert_close(readout(torch.cat(outs, 1)), readout(o_full[:, T:]), rtol=1e-4, atol=1e-5)
    o_rec, s_rec = torch_recurrent(q, k, v, g, i, delta=False, scale=K**-0.5)
    torch.testing.assert_close(state, s_rec, rtol=1e-4, atol=1e-4 * s_rec.abs().max().item())


def test_mlstm_wrapper_trains_the_kernels_in_fp32(monkeypatch):
    """bf16 training inputs reach the chunkwise kernel as fp32 (its bf16 backward loses the forget-gate gradient,
    see MLSTM._mlstm); the output comes back in the input dtype; no-grad inference stays bf16."""
    seen = []
    chunkwise = MLSTM.fast_kernels._loaded["chunk"]

    def recording(q, k, v, *a, **kw):  # (the torch reference wants one dtype; the Triton kernels take mixed ones)
        seen.append(q.dtype)
        return chunkwise(q.float(), k.float(), v.float(), *a, **kw)

    monkeypatch.setitem(MLSTM.fast_kernels._loaded, "chunk", recording)
    q, k, v, g, i = mlstm_inputs(32)
    q, k, v = (x.bfloat16().requires_grad_(True) for x in (q, k, v))
    o, _ = run_fast(q, k, v, g, i)
    assert seen == [torch.float32] and o.dtype == torch.bfloat16
    o.float().sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad.float()).all()
    with torch.no_grad():
        run_fast(q, k, v, g, i)
    assert seen[-1] == torch.bfloat16
