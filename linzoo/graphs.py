"""Greedy decoding with one CUDA graph per step.

A linear student's cache has a fixed size (recurrent state + short-conv window, static addresses in
transformers' `LinearAttentionLayer`), so one decode step can be captured once and replayed: the
per-token cost drops from hundreds of kernel launches from Python to one graph launch.
"""

import torch


class GraphedDecoder:
    """`GraphedDecoder(model, prompt_ids).generate(n)` -> [B, n] greedy tokens after the prompt, equal to
    `model.generate(prompt_ids, max_new_tokens=n, do_sample=False)`'s new tokens.

    `graph=False` runs the very same static-buffer step eagerly instead of replaying its capture (any device):
    what the tests compare with `generate()` on CPU."""

    def __init__(self, model, prompt_ids, graph: bool = True):
        if getattr(model.config, "attn_layers", None):
            raise ValueError("CUDA-graph decoding needs a fixed-size cache; hybrid students keep a growing KV cache.")
        if graph and prompt_ids.device.type != "cuda":
            raise ValueError("GraphedDecoder needs the model and prompt on a CUDA device (or graph=False).")
        self.model = model.eval()
        with torch.no_grad():  # the last position's logits only, as generate() asks for them (same bf16 rounding)
            out = model(prompt_ids, use_cache=True, logits_to_keep=1)
        self.cache = out.cache if hasattr(out, "cache") else out.past_key_values
        self.tokens = out.logits[:, -1:].argmax(-1)
        # The first new token comes from the prefill: kept before the warm-up steps below overwrite `tokens`.
        self._first = self.tokens.clone()
        snapshot = self._snapshot()
        self.graph = None
        if graph:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream), torch.no_grad():
                for _ in range(2):  # warm-up (kernel autotuning, allocator) outside the graph
                    self._step()
            torch.cuda.current_stream().wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph), torch.no_grad():
                self._step()
        else:
            with torch.no_grad():
                self._step()  # the same warm-up as the graph path, so both restore the same way
        self._restore(snapshot)  # warm-up (and capture) advanced the state: back to just after the prompt

    def _snapshot(self):
        """The cache's recurrent and conv states (copies) and its token count."""
        states = [t for layer in self.cache.layers for t in (*layer.recurrent_states.values(), *layer.conv_states.values())
                  if t is not None]
        return states, [t.clone() for t in states], self.cache.seen_tokens

    def _restore(self, snapshot):
        states, saved, seen = snapshot
        for t, s in zip(states, saved):  # in place: the graph holds these addresses
            t.copy_(s)
        self.cache.seen_tokens = seen

    def _step(self):
        logits = self.model(self.tokens, cache=self.cache, past_key_values=self.cache, use_cache=True).logits
        self.tokens.copy_(logits[:, -1:].argmax(-1))

    @torch.no_grad()
    def generate(self, new_tokens):
        """Greedy tokens from the state just after the prompt; every call starts there again."""
        snapshot = self._snapshot()
        self.tokens.copy_(self._first)
        out = [self._first]
        for _ in range(new_tokens - 1):
            self.graph.replay() if self.graph is not None else self._step()
            out.append(self.tokens.clone())
        self._restore(snapshot)
        return torch.cat(out, 1)
