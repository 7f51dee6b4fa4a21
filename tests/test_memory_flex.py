"""The window through FlexAttention (modeling/memory.py `_flex_window`, what CUDA runs for prefill and training rows)
against the banded torch form (`_banded_window`): outputs and a whole student's logits, on the CPU (flex's unfused
eager path computes the same function), over left padding, GQA, T < W and queries that see nothing. Flex has no
backward on the CPU: its gradients are compared on CUDA by scripts/gpu_parity.py --window_size (the fast path's
rows `mixer+wW`, against the torch path's banded window)."""

import warnings

import pytest
import torch

from linzoo.modeling import memory

from test_modeling import VOCAB, tiny_model

pytestmark = [pytest.mark.usefixtures("one_thread"),  # conftest.py
              pytest.mark.filterwarnings("ignore:.*flex_attention.*:UserWarning")]
TOL = dict(atol=1e-5, rtol=1e-4)

CASES = [  # B, H, Hkv, T, W, pads (per row), null -inf for the first queries (no token outside the window yet)
    pytest.param(2, 4, 2, 37, 5, (0, 7), id="gqa2-T37-W5-pad"),
    pytest.param(1, 3, 1, 9, 16, (0,), id="gqa3-T9-W16"),  # T < W
    pytest.param(2, 2, 2, 20, 1, (4, 0), id="mha-T20-W1-pad"),
]


def _inputs(B, H, Hkv, T, W, pads):
    torch.manual_seed(0)
    D = 8
    qs = torch.randn(B, H, T, D)
    ksE = torch.randn(B, W + T, Hkv, D)
    vsE = torch.randn(B, W + T, Hkv, D)
    validE = torch.ones(B, W + T, dtype=torch.bool)
    validE[:, :W] = False  # nothing cached before this forward
    for b, p in enumerate(pads):
        validE[b, W : W + p] = False
    outside = (torch.arange(T) - W + 1).clamp(min=0).float()  # tokens that left the window by query i
    null = (torch.randn(H)[None, :, None] + outside.log()[None, None]).expand(B, H, T).clone()
    return qs, ksE, vsE, validE, null


@pytest.mark.parametrize("B, H, Hkv, T, W, pads", CASES)
def test_flex_window_equals_banded(B, H, Hkv, T, W, pads):
    inputs = _inputs(B, H, Hkv, T, W, pads)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        flex_parts, parts = memory._flex_window(*inputs, W), memory._banded_window(*inputs, W)
    assert inputs[-1][..., 0].isinf().all()  # the first query has no token outside the window: no null
    for name, a, b in zip(("p_null", "soft"), flex_parts, parts):
        assert a.isfinite().all(), name
        torch.testing.assert_close(a, b, **TOL, msg=name)


def test_a_student_with_the_flex_window(monkeypatch):
    """A windowed student's logits with every window through flex == banded, and the CUDA rule: flex for a prefill of
    at least FLEX_MIN_TOKENS on CUDA unless kernel_backend is torch."""
    model = tiny_model("gated_deltanet", [1], window_size=4)
    ids = torch.randint(1, VOCAB, (2, 19))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    with torch.no_grad():
        want = model(ids * mask, attention_mask=mask, use_cache=False).logits
        monkeypatch.setattr(memory, "_window", lambda mixer, *args: memory._flex_window(*args))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = model(ids * mask, attention_mask=mask, use_cache=False).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], **TOL)
