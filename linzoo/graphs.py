"""Greedy decoding with one CUDA graph per step.

A linear student's cache has a fixed size (recurrent state + short-conv window, static addresses in
transformers' `LinearAttentionLayer`), so one decode step can be captured once and replayed: the
per-token cost drops from hundreds of kernel launches from Python to one graph launch.
"""

import torch


class GraphedDecoder:
    """`GraphedDecoder(model, prompt_ids).generate(n)` -> [B, n] greedy tokens after the prompt."""

    def __init__(self, model, prompt_ids):
        if getattr(model.config, "attn_layers", None):
            raise ValueError("CUDA-graph decoding needs a fixed-size cache; hybrid students keep a growing KV cache.")
        if prompt_ids.device.type != "cuda":
            raise ValueError("GraphedDecoder needs the model and prompt on a CUDA device.")
        self.model = model.eval()
        with torch.no_grad():  # the last position's logits only, as generate() asks for them (same bf16 rounding)
            out = model(prompt_ids, use_cache=True, logits_to_keep=1)
        self.cache = out.cache if hasattr(out, "cache") else out.past_key_values
        self.tokens = out.logits[:, -1:].argmax(-1)
        states = [t for layer in self.cache.layers for t in (*layer.recurrent_states.values(), *layer.conv_states.values())
                  if t is not None]
        saved = [t.clone() for t in states]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.no_grad():
            for _ in range(2):  # warm-up (kernel autotuning, allocator) outside the graph
                self._step()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.no_grad():
            self._step()
        for t, s in zip(states, saved):  # warm-up and capture advanced the state: restore it
            t.copy_(s)
        self._first = self.tokens.clone()

    def _step(self):
        logits = self.model(self.tokens, cache=self.cache, past_key_values=self.cache, use_cache=True).logits
        self.tokens.copy_(logits[:, -1:].argmax(-1))

    @torch.no_grad()
    def generate(self, new_tokens):
        self.tokens.copy_(self._first)
        out = [self._first]
        for _ in range(new_tokens - 1):
            self.graph.replay()
            out.append(self.tokens.clone())
        return torch.cat(out, 1)
