"""The sparse cache of modeling/memory.py ranked block by block (`_sparse_window`: each block of queries ranks the G
entries kept so far and its own new candidates, no [T, T] scores or ranking) against the frozen full form it replaced
(test_memory_banded's `reference_memory_forward`, whose tests cover its outputs, parts, gradients, kept entries and
cached decoding): ties, with blocks patched small so that tiny inputs span many."""

import pytest
import torch

from linzoo.modeling import memory
from linzoo.modeling.memory import memory_forward

from test_memory_banded import TOL, _layer_and_inputs, reference_memory_forward

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py

BLOCKS = [1, 4, 7, 64]  # queries per block: single queries, several, not dividing T, one block


@pytest.fixture(params=BLOCKS, ids=[f"C{c}" for c in BLOCKS])
def block(request, monkeypatch):
    monkeypatch.setattr(memory, "_sparse_block_size", lambda W: request.param)
    return request.param


def test_blocked_sparse_ties_keep_the_earlier(block):
    """Equal recall errors everywhere (v_proj at zero: every value and readout is 0): the cache keeps the earliest
    candidates, as the full ranking does."""
    attn, x, valid = _layer_and_inputs("gated_deltanet", {"window_size": 2, "sparse_cache_size": 3}, 15, (0, 3))
    with torch.no_grad():
        attn.v_proj.weight.zero_()
        torch.testing.assert_close(memory_forward(attn, x, valid), reference_memory_forward(attn, x, valid), **TOL)
