"""What a model's token mixers see and produce, from one forward pass with hooks: the one capture behind attention
transfer (stage 1's teacher targets), the start fitted to a teacher (`linzoo.calibrate`), the init-error report
(experiments/init_error/init_error.py) and the retrieval-heads eval. Teachers (Llama's attention) and students
(softmax or linear mixers) alike: every decoder layer's `self_attn`."""

from __future__ import annotations

from typing import NamedTuple

import torch


class MixerIO(NamedTuple):
    input: torch.Tensor  # [B, T, hidden]: the mixer's input, after input_layernorm
    output: torch.Tensor  # [B, T, hidden]: its output, after o_proj
    kwargs: dict  # the keyword arguments it was called with (positions, masks)
    heads: torch.Tensor | None  # [B, T, heads * head_dim]: the per-head outputs before o_proj (with heads=True)


def mixer_io(model, input_ids, attention_mask=None, layers=None, heads: bool = False) -> dict[int, MixerIO]:
    """{layer: MixerIO} of `layers` (default all) from `model(input_ids, attention_mask)` without a cache, logits kept
    for the last position only. Runs under whatever grad mode the caller set."""
    modules = [layer.self_attn for layer in model.model.layers]
    layers = range(len(modules)) if layers is None else list(layers)
    seen, hooks = {i: {} for i in layers}, []

    def on_mixer(i):
        def hook(module, args, kwargs, out):
            seen[i].update(input=args[0] if args else kwargs["hidden_states"], kwargs=kwargs,
                           output=out[0] if isinstance(out, tuple) else out)
        return hook

    def on_o_proj(i):
        def hook(module, args, out):
            seen[i]["heads"] = args[0]
        return hook

    for i in layers:
        hooks.append(modules[i].register_forward_hook(on_mixer(i), with_kwargs=True))
        if heads:
            hooks.append(modules[i].o_proj.register_forward_hook(on_o_proj(i)))
    try:
        model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=1)
    finally:
        for hook in hooks:
            hook.remove()
    return {i: MixerIO(v["input"], v["output"], v["kwargs"], v.get("heads")) for i, v in seen.items()}
