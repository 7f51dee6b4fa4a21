"""The sparse cache of modeling/memory.py ranked block by block (`_sparse_window`: each block of queries ranks the G
entries kept so far and its own new candidates, no [T, T] scores or ranking) against the frozen full form it replaced
(test_memory_banded's `reference_memory_forward`, whose tests also cover its outputs, parts and gradients): ties, the
cache's kept entries and cached decoding, with blocks patched small so that tiny inputs span many."""

import pytest
import torch

from linzoo.modeling import memory, mixer_base
from linzoo.modeling.memory import SPARSE, _state, memory_forward

from test_memory_banded import TOL, _layer_and_inputs, cache_of, reference_memory_forward
from test_modeling import VOCAB, tiny_model

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


@pytest.mark.parametrize("mixer, overrides", [
    pytest.param("gated_deltanet", {"window_size": 3, "sparse_cache_size": 2}, id="gdn-W3-G2"),
    pytest.param("gla", {"window_size": 2, "sparse_cache_size": 4, "num_key_value_heads": 1}, id="gla-W2-G4-gqa4"),
])
def test_blocked_sparse_cache_and_decoding_equal_reference(mixer, overrides, block, monkeypatch):
    """Left-padded prompts: a cached prefill, a block, then single tokens == one uncached forward == the reference's;
    the cache's kept entries after the prefill are the reference's (the valid ones, in order)."""
    model = tiny_model(mixer, **overrides)
    torch.manual_seed(2)
    ids = torch.randint(1, VOCAB, (2, 22))
    mask = torch.ones_like(ids)
    mask[1, :6] = 0
    ids = ids * mask

    def run():
        out = model(ids[:, :9], attention_mask=mask[:, :9], use_cache=True)
        entries = _state(cache_of(out), 0, SPARSE).clone()
        pieces = [out.logits]
        out = model(ids[:, 9:14], attention_mask=mask[:, :14], cache=cache_of(out), use_cache=True)
        pieces.append(out.logits)
        for t in range(14, 22):
            out = model(ids[:, t : t + 1], attention_mask=mask[:, : t + 1], cache=cache_of(out), use_cache=True)
            pieces.append(out.logits)
        return torch.cat(pieces, 1), entries

    with torch.no_grad():
        full = model(ids, attention_mask=mask, use_cache=False).logits
        pieces, entries = run()
        monkeypatch.setattr(mixer_base, "memory_forward", reference_memory_forward)
        want = model(ids, attention_mask=mask, use_cache=False).logits
        _, want_entries = run()
    real = mask.bool()
    torch.testing.assert_close(full[real], want[real], **TOL)
    torch.testing.assert_close(pieces[real], full[real], **TOL)
    kept, want_kept = entries[..., -1].bool(), want_entries[..., -1].bool()  # [B, G, H]
    assert torch.equal(kept, want_kept)
    torch.testing.assert_close(entries[kept], want_entries[kept], **TOL)
