"""Greedy decoding with one CUDA graph per step, as a `generate()` decoding loop.

    out = model.generate(**inputs, max_new_tokens=256, custom_generate=model.graph_decoding)

A linear student's cache has a fixed size (recurrent state + short-conv window, static addresses in
transformers' `LinearAttentionLayer`), so one decode step can be captured once and replayed: the
per-token cost drops from hundreds of kernel launches from Python to one graph launch. `graph_decoding` is a
transformers `custom_generate` callable (generate() prepares the inputs, then calls it instead of its own loop):
greedy decoding of pure linear students; with sampling, logits processors, a streamer, padding, dict outputs or
softmax layers it hands over to generate()'s own loop. Off CUDA the same static step runs eagerly.
"""

import torch
from transformers.generation.utils import GenerationMixin
from transformers.utils import logging

logger = logging.get_logger(__name__)


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
    def generate(self, new_tokens, eos=None, check_every=16):
        """Greedy tokens from the state just after the prompt; every call starts there again. With `eos` (a tensor of
        ids) it stops early once every row has produced one of them, checked every `check_every` tokens (one host
        sync each); the tokens after a row's eos are whatever the step computed."""
        snapshot = self._snapshot()
        self.tokens.copy_(self._first)
        out = [self._first]
        done = None if eos is None else torch.isin(self._first[:, 0], eos)
        for i in range(1, new_tokens):
            if done is not None and i % check_every == 0 and bool(done.all()):
                break
            self.graph.replay() if self.graph is not None else self._step()
            out.append(self.tokens.clone())
            if done is not None:
                done = done | torch.isin(self.tokens[:, 0], eos)
        self._restore(snapshot)
        return torch.cat(out, 1)

def _plain_greedy(model, logits_processor, generation_config, streamer, model_kwargs):
    """Why the graph loop cannot stand in for generate()'s own here, or None when it can."""
    mask = model_kwargs.get("attention_mask")
    if generation_config.do_sample or (generation_config.num_beams or 1) != 1:
        return "sampling or beam search"
    if len(logits_processor):
        return f"logits processors ({', '.join(type(p).__name__ for p in logits_processor)})"
    if streamer is not None or generation_config.return_dict_in_generate:
        return "a streamer or dict outputs"
    if getattr(model.config, "attn_layers", None):
        return "softmax attention layers (a hybrid's KV cache grows)"
    if mask is not None and not bool(mask.all()):
        return "padding"
    cache = model_kwargs.get("cache", model_kwargs.get("past_key_values"))
    if cache is not None and cache.get_seq_length() > 0:  # (an empty one, as generate() makes, is not used)
        return "a cache that already holds tokens"
    return None


def graph_decoding(model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False,
                   streamer=None, **model_kwargs):
    """`custom_generate` decoding loop: greedy tokens from a `GraphedDecoder` (a CUDA graph on CUDA, the same
    static step eagerly elsewhere), equal to generate()'s own greedy loop: same prompt forward, stops at
    `max_length`/`max_new_tokens` or once every row has ended with an eos, positions after a row's eos padded.
    Anything else (see `_plain_greedy`) runs generate()'s own loop, with one warning saying why."""
    why = _plain_greedy(model, logits_processor, generation_config, streamer, model_kwargs)
    if why is not None:
        logger.warning_once(f"graph_decoding covers plain greedy decoding; {why}: using generate()'s own loop.")
        return GenerationMixin._sample(model, input_ids, logits_processor, stopping_criteria, generation_config,
                                       synced_gpus=synced_gpus, streamer=streamer, **model_kwargs)
    new_tokens = generation_config.max_length - input_ids.shape[1]
    if new_tokens <= 0:
        return input_ids
    eos = generation_config._eos_token_tensor
    eos = None if eos is None else eos.to(input_ids.device).flatten()
    decoder = GraphedDecoder(model, input_ids, graph=input_ids.device.type == "cuda")
    tokens = decoder.generate(new_tokens, eos)
    if eos is not None:  # as generate(): after a row's first eos, pad; stop where the last row ended
        ended = torch.isin(tokens, eos)
        after = (ended.cumsum(1) - ended.long()) > 0  # strictly after the first eos
        pad = generation_config._pad_token_tensor
        tokens = tokens.masked_fill(after, int(pad) if pad is not None else int(eos[0]))
        if bool(ended.any(1).all()):
            tokens = tokens[:, : int(ended.long().argmax(1).max()) + 1]
    return torch.cat([input_ids, tokens], 1)
