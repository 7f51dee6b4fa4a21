"""fla's fused kernels that the CUDA path uses, run on CPU through Triton's interpreter, against our torch forms.

    pip install --no-deps --target /tmp/tri triton==3.6.0 fla-core==0.6.0 flash-linear-attention==0.6.0
    TRITON_INTERPRET=1 PYTHONPATH=/tmp/tri python experiments/kernels_cpu/fused_ops_interpreter_check.py

Checks, in fp32, outputs and input gradients of: RMSNorm (forward only: the interpreter cannot run its backward
kernel), SwiGLU, the short convolution (plain and packed with `cu_seqlens`, against `ShortConv`'s torch form with
`seq_idx`), the cross-entropy kernel, and a whole tiny linzoo model's logits with every fused op switched on
(mixer recurrences on the torch path). fla's delta-rule kernels refuse fp32 and do not run in the interpreter;
they are checked on the GPU (`scripts/gpu_parity.py`, `scripts/bench_speed.py`). Exits 1 when an error > 1e-5.
"""

import sys

import torch
import torch.nn.functional as F
from torch.func import functional_call
import triton.runtime.autotuner as autotuner

# The interpreter has no GPU to benchmark autotuning configs on: keep each kernel's first config.
_init = autotuner.Autotuner.__init__
autotuner.Autotuner.__init__ = lambda self, fn, names, configs, *a, **kw: _init(self, fn, names, configs[:1], *a, **kw)

from fla.modules.fused_cross_entropy.ops import cross_entropy_loss  # noqa: E402  (the module asserts CUDA tensors)

from linzoo.modeling import LinzooConfig, LinzooForCausalLM, kernels, mixer_base, modeling_linzoo  # noqa: E402
from linzoo.modeling.mixer_base import RMSNorm, ShortConv  # noqa: E402

TOL = 1e-5
worst = 0.0


def rel(a, b):
    """Relative L2 error of `a` against the reference `b`, in fp32 (scripts/bench_utils.py's, kept here so that this
    experiment runs from its own folder)."""
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def check(name, fast, ref, *xs, backward=True):
    global worst
    xs_f = [x.clone().requires_grad_(backward) for x in xs]
    xs_r = [x.clone().requires_grad_(backward) for x in xs]
    of, orf = fast(*xs_f), ref(*xs_r)
    errs = [rel(of.detach(), orf.detach())]
    if backward:
        w = torch.randn_like(orf)
        (of * w).sum().backward()
        (orf * w).sum().backward()
        errs += [rel(a.grad, b.grad) for a, b in zip(xs_f, xs_r)]
    worst = max(worst, *errs)
    print(f"{name:34s} output {errs[0]:.1e}" + ("  input grads " + " ".join(f"{e:.1e}" for e in errs[1:]) if backward else ""))


def main():
    torch.manual_seed(0)
    x, w = torch.randn(3, 17, 40), torch.randn(40) + 1
    norm = RMSNorm(40, 1e-5)  # no config: the torch form
    check("rms_norm (forward)", lambda x, w: kernels.fused_rms_norm(x, w, 1e-5),
          lambda x, w: functional_call(norm, {"weight": w}, (x,)), x, w, backward=False)
    check("swiglu", kernels.fused_swiglu, lambda g, u: F.silu(g) * u, torch.randn(3, 17, 40), torch.randn(3, 17, 40))
    conv = ShortConv(40, 4)
    x, cw = torch.randn(1, 30, 40), torch.randn(40, 4)

    def torch_conv(seq_idx=None):
        return lambda x, w: functional_call(conv, {"weight": w}, (x,), {"seq_idx": seq_idx})

    check("short conv", lambda x, w: kernels.fused_short_conv(x, w), torch_conv(), x, cw)
    cu, seq_idx = torch.tensor([0, 7, 9, 30]), torch.tensor([[0] * 7 + [1] * 2 + [2] * 21])
    check("short conv, packed (cu_seqlens)", lambda x, w: kernels.fused_short_conv(x, w, cu), torch_conv(seq_idx), x, cw)
    t = torch.randint(0, 100, (50,))
    t[:5] = -100
    check("cross-entropy kernel (sum)", lambda lg: cross_entropy_loss(lg, t, ignore_index=-100)[0].sum(),
          lambda lg: F.cross_entropy(lg, t, ignore_index=-100, reduction="sum"), torch.randn(50, 100))
    cfg = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, kernel_backend="torch", chunk_size=8)
    ids = torch.randint(0, 100, (2, 21))
    original = mixer_base.use_fused_ops
    for mixer in ("gated_deltanet", "gla"):  # with and without the short conv
        model = LinzooForCausalLM(LinzooConfig(**cfg, mixer=mixer)).eval()
        with torch.no_grad():
            ref = model(ids).logits
            mixer_base.use_fused_ops = modeling_linzoo.use_fused_ops = lambda config, device: True
            try:
                fused = model(ids).logits
            finally:
                mixer_base.use_fused_ops = modeling_linzoo.use_fused_ops = original
        check(f"whole model, {mixer} (logits)", lambda a: fused, lambda a: ref, ids.float(), backward=False)
    print(f"worst relative error {worst:.1e} (limit {TOL:.0e})")
    sys.exit(0 if worst <= TOL else 1)


if __name__ == "__main__":
    main()
