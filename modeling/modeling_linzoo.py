"""linzoo causal LM: the SmolLM2/Llama backbone with a linear token mixer in every layer.

Parameter names follow `LlamaForCausalLM` (`model.layers.i.self_attn.q_proj`, ...), so a teacher's state
dict loads into a student directly and only the mixers' new parameters start fresh. Recurrent and
short-conv states live in the transformers cache (`DynamicCache(config=...)` with `layer_types`).
"""

import re
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import DynamicCache, LinearAttentionCacheLayerMixin
from transformers.loss.loss_utils import LOSS_MAPPING
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from .configuration_linzoo import LinzooConfig
from .graph_decoding import graph_decoding
from .kernels import fused_cross_entropy, fused_swiglu, use_fused_ops
from .memory import NUMBER_OF_STATES, rope, rope_inv_freq
from .mixer_base import RMSNorm
from .mixers import MIXER_CLASSES

# transformers >= 5.20 calls the cache `cache`; 5.17 (and older) `past_key_values`.
_CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class LinzooCache(DynamicCache):
    """`DynamicCache(config=...)` that also counts the tokens it has seen.

    transformers 5.17's `generate` asks the cache for its length, which a DynamicCache holding only
    linear-attention layers cannot answer; the count answers it for every layer type.
    """

    def __init__(self, *args, config=None, **kwargs):
        super().__init__(*args, config=config, **kwargs)
        self.seen_tokens = 0
        if config is not None and (config.window_size or config.sparse_cache_size):
            # a linear layer with a window / sparse cache keeps them beside its state (`memory.py`)
            for layer in self.layers:
                if isinstance(layer, LinearAttentionCacheLayerMixin):
                    LinearAttentionCacheLayerMixin.__init__(layer, number_of_states=NUMBER_OF_STATES)

    def get_seq_length(self, layer_idx=0):
        return self.seen_tokens

    @property
    def is_compileable(self):
        # Keeps generate() from replacing our 2D padding mask by 4D attention masks (5.17 does for compileable
        # caches). Graph capture of decoding is `graph_decoding.GraphedDecoder`'s job.
        return False

    def reset(self):
        super().reset()
        self.seen_tokens = 0


class LinzooMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        if use_fused_ops(self.config, x.device):
            return self.down_proj(fused_swiglu(self.gate_proj(x), self.up_proj(x)))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LinzooAttention(nn.Module):
    """Softmax attention with RoPE, kept at `config.attn_layers` in hybrid students (the teacher's own layer)."""

    def __init__(self, config, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = (
            config.num_attention_heads, config.num_key_value_heads, config.head_dim,
        )
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)
        self.rope_theta = config.rope_theta
        self.register_buffer("inv_freq", torch.empty(self.head_dim // 2), persistent=False)
        self.reset_new_parameters()

    def reset_new_parameters(self):
        # A non-persistent buffer: recomputed here, also after from_pretrained builds the model on `meta`.
        init.copy_(self.inv_freq, rope_inv_freq(self.head_dim, self.rope_theta))

    def project(self, hidden_states, position_ids):
        """q [B,H,T,D], k and v [B,Hkv,T,D], RoPE applied to q and k."""
        B, T, _ = hidden_states.shape
        shape = (B, T, -1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        return rope(q, position_ids, self.inv_freq), rope(k, position_ids, self.inv_freq), v

    @torch.no_grad()
    def token_weights(self, hidden_states, position_ids=None, **_):
        """[B, H, T, T]: the causal softmax attention weights of every head (no cache, no padding)."""
        T = hidden_states.shape[1]
        if position_ids is None:
            position_ids = torch.arange(T, device=hidden_states.device)[None]
        q, k, _ = self.project(hidden_states, position_ids)
        k = k.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)
        scores = (q.float() @ k.float().transpose(-1, -2)) * self.head_dim**-0.5
        causal = torch.ones(T, T, dtype=torch.bool, device=scores.device).tril()
        return scores.masked_fill(~causal, float("-inf")).softmax(-1)

    def forward(self, hidden_states, attention_mask=None, cache=None, position_ids=None, attn_bias=None, **_):
        """`attn_bias`: a boolean [B, 1, T, past + T] mask, or None for plain causal attention (no padding or
        packing: SDPA's causal kernels, no materialised mask)."""
        B, T, _ = hidden_states.shape
        q, k, v = self.project(hidden_states, position_ids)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        causal = attn_bias is None and T > 1 and k.shape[2] == T  # a decoding step sees all of its past
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias, is_causal=causal, enable_gqa=True)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, -1))


class LinzooDecoderLayer(GradientCheckpointingLayer):
    def __init__(self, config, layer_idx):
        super().__init__()
        is_attn = layer_idx in config.attn_layers
        self.self_attn = LinzooAttention(config, layer_idx) if is_attn else MIXER_CLASSES[config.mixer](config, layer_idx)
        self.mlp = LinzooMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, config=config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, config=config)

    def forward(self, hidden_states, attention_mask=None, cache=None, mixer_kwargs=None):
        residual = hidden_states
        hidden_states = self.self_attn(self.input_layernorm(hidden_states), attention_mask=attention_mask, cache=cache,
                                       **(mixer_kwargs or {}))
        hidden_states = residual + hidden_states
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


_LAYER_KEY = re.compile(r"^((?:.*\.)?layers)\.(\d+)\.(.+)$")  # model.layers.30.mlp.up_proj.weight


def _spans(indices):
    """[0, 1, 2, 5] -> "0-2, 5"."""
    runs = []
    for i in sorted(indices):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _by_layer(keys):
    layers = defaultdict(set)
    for key in keys:
        if match := _LAYER_KEY.match(key):
            layers[match[1], int(match[2])].add(key)
    return layers


def _named(keys, universe, examples=3):
    """A few patterns naming `keys`, with their count: a layer whose every key of `universe` is among them reads
    `model.layers.[30-31].*`, keys alike but for their layer `model.layers.[0-29].self_attn.A_log`."""
    whole = {layer for layer, of_layer in _by_layer(universe).items() if of_layer <= keys}
    groups = defaultdict(set)
    for key in keys:
        if not (match := _LAYER_KEY.match(key)):
            groups[2, key, ""].add(None)
            continue
        layer = (match[1], int(match[2]))
        groups[(0, match[1], "*") if layer in whole else (1, match[1], match[3])].add(layer[1])
    names = [f"{prefix}.{_spans(ix) if len(ix) == 1 else f'[{_spans(ix)}]'}.{rest}" if rest else prefix
             for (_, prefix, rest), ix in sorted(groups.items())]
    more = f" and {len(names) - examples} more" if len(names) > examples else ""
    return ", ".join(names[:examples]) + more + (f" ({_count(len(keys), 'key')})" if len(keys) > 1 else "")


def _count(n, noun):
    return f"{n} {noun}{'' if n == 1 else 's'}"


def check_weights_match_config(name, model, loading_info, ignore_mismatched_sizes=False):
    """One ValueError line when `from_pretrained(name)` built a model its weights do not fill: tensors the config
    builds but the weights lack (MISSING), weights it has no place for (UNEXPECTED), other shapes (MISMATCHED) — a
    config.json edited or swapped beside its weights (another mixer, layer count or `attn_layers`) would otherwise
    run, with fresh random tensors, and still write fluent text. `loading_info` is from_pretrained's
    (`output_loading_info=True`), where transformers has already dropped what a model declares optional
    (`_keys_to_ignore_on_load_missing`) and tied weights. Shared with `linzoo.load_model` for teachers."""
    missing, unexpected = set(loading_info["missing_keys"]), set(loading_info["unexpected_keys"])
    mismatched = {} if ignore_mismatched_sizes else {key: (list(in_weights), list(in_model))
                                                     for key, in_weights, in_model in loading_info["mismatched_keys"]}
    if not (missing or unexpected or mismatched):
        return
    built = set(model.state_dict())
    held = (built - missing) | unexpected
    config_layers, weight_layers = _by_layer(built), _by_layer(held)
    facts = []
    if len(config_layers) != len(weight_layers):
        facts.append(f"the config builds {_count(len(config_layers), 'layer')}, the weights hold {len(weight_layers)}")
    differing = {layer for layer in _by_layer(missing | unexpected | set(mismatched)) if layer in config_layers
                 and layer in weight_layers}
    if differing:
        facts.append(f"the config builds layer{'s' if len(differing) > 1 else ''} "
                     f"{_spans({i for _, i in differing})} with other tensors than the weights hold")
    if not facts:
        other = "other tensors" if missing or unexpected else "tensors of other shapes"
        facts.append(f"the config builds {other} than the weights hold")
    keys = [f"missing {_named(missing, built)}"] if missing else []
    keys += [f"unexpected {_named(unexpected, held)}"] if unexpected else []
    if mismatched:
        key, (weights_shape, config_shape) = min(mismatched.items())
        keys.append(f"mismatched {_named(set(mismatched), held)}: {key} is {weights_shape} in the weights, "
                    f"{config_shape} in the config")
    where = f"{name}/config.json" if name else "the config"
    raise ValueError(f"{where} disagrees with its weights: {'; '.join(facts)} ({'; '.join(keys)}): restore the "
                     "config.json saved with these weights")


class LinzooPreTrainedModel(PreTrainedModel):
    config_class = LinzooConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["LinzooDecoderLayer"]
    _is_stateful = True  # recurrent state cannot be rolled back (no assisted decoding)
    _supports_sdpa = True
    # a student made without a window / sparse cache, loaded with one (`window_size=`, `sparse_cache_size=`): its null
    # logit starts at 0 (`Memory.reset_new_parameters`), by design, not a weight the checkpoint lost
    _keys_to_ignore_on_load_missing = [r"\.memory\.null_logit$"]

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, output_loading_info=False,
                        ignore_mismatched_sizes=False, **kwargs):
        """transformers' from_pretrained, refusing weights that disagree with the config (every load path runs this
        class, remote code included): `check_weights_match_config`. Tensors of other shapes are refused here too,
        in that one line, unless `ignore_mismatched_sizes=True` (then, as in transformers, they start fresh)."""
        model, info = super().from_pretrained(pretrained_model_name_or_path, *args, output_loading_info=True,
                                              ignore_mismatched_sizes=True, **kwargs)
        check_weights_match_config(pretrained_model_name_or_path, model, info, ignore_mismatched_sizes)
        return (model, info) if output_loading_info else model

    def _init_weights(self, module):
        super()._init_weights(module)
        if hasattr(module, "reset_new_parameters"):
            module.reset_new_parameters()

    def _initialize_weights(self, module, is_custom_code=False):
        # transformers skips custom-code modules whose *direct* parameters are all loaded; a mixer's new
        # parameters sit in children (gk_proj, b_proj, ...), so always let it reset them (loaded ones are kept:
        # `transformers.initialization` skips tensors flagged as loaded).
        if hasattr(module, "reset_new_parameters") and not getattr(module, "_is_hf_initialized", False):
            self._init_weights(module)
            module._is_hf_initialized = True
            return
        super()._initialize_weights(module, is_custom_code)


def _packed_boundaries(position_ids, T):
    """Sequence boundaries of a padding-free packed row (B == 1, position_ids restarting at 0), else None."""
    if position_ids is None or position_ids.shape[0] != 1 or T < 2:
        return None, None
    starts = (position_ids[0] == 0).nonzero().flatten()
    if len(starts) < 2:
        return None, None
    if starts[0] != 0:
        starts = torch.cat([starts.new_zeros(1), starts])
    cu_seqlens = torch.cat([starts, starts.new_tensor([T])]).to(torch.int64)
    seq_idx = (position_ids == 0).cumsum(-1) - (position_ids[0, 0] == 0).long()
    return cu_seqlens, seq_idx


class LinzooModel(LinzooPreTrainedModel):
    _keys_to_ignore_on_load_unexpected = [r"^lm_head\.weight$"]  # the body alone, from a causal LM's folder

    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList(LinzooDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps, config=config)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def _attn_bias(self, attention_mask, position_ids, seq_idx, past, T, device):
        """Boolean [B, 1, T, past + T] mask for the hybrid softmax layers (causal, padding, packing); None where
        causality alone is the mask (no padding, no packing, and nothing cached or a single new token)."""
        if attention_mask is None and seq_idx is None and (past == 0 or T == 1):
            return None
        S = past + T
        q_pos = torch.arange(past, S, device=device)[:, None]
        allowed = torch.arange(S, device=device)[None, :] <= q_pos
        allowed = allowed[None, None]
        if attention_mask is not None:
            allowed = allowed & attention_mask[:, None, None, -S:].bool()
        if seq_idx is not None:
            allowed = allowed & (seq_idx[:, None, :, None] == seq_idx[:, None, None, :])
        # A padded query row would see nothing; let it see itself so softmax stays finite.
        return allowed | (torch.arange(S, device=device)[None, :] == q_pos)[None, None]

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, past_key_values=None,
                inputs_embeds=None, use_cache=None, output_hidden_states=None, **kwargs):
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids or inputs_embeds.")
        if inputs_embeds is None:
            inputs_embeds = self.embed_tokens(input_ids)
        B, T, _ = inputs_embeds.shape
        cache = cache if cache is not None else past_key_values
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        if use_cache and cache is None and not self.training:
            cache = LinzooCache(config=self.config)
        if not use_cache:
            cache = None
        if attention_mask is not None and attention_mask.dim() != 2:
            raise ValueError("linzoo models take a 2D [batch, length] attention_mask (1 = token, 0 = padding).")
        if attention_mask is not None and bool(attention_mask.all()):
            attention_mask = None  # nothing to mask: skip the multiply

        cu_seqlens, seq_idx = _packed_boundaries(position_ids, T) if cache is None else (None, None)
        if cu_seqlens is not None and attention_mask is not None:
            raise ValueError("Packed sequences (position_ids restarting at 0) must not also carry padding.")
        mixer_kwargs = {"cu_seqlens": cu_seqlens, "seq_idx": seq_idx}
        if self.config.attn_layers:
            first = self.config.attn_layers[0]
            past = cache.layers[first].get_seq_length() if cache is not None and len(cache.layers) > first else 0
            if position_ids is None:
                if attention_mask is not None:
                    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, -T:]
                else:
                    position_ids = torch.arange(past, past + T, device=inputs_embeds.device)[None].expand(B, -1)
            attn_kwargs = {
                "position_ids": position_ids,
                "attn_bias": self._attn_bias(attention_mask, position_ids, seq_idx, past, T, inputs_embeds.device),
            }

        hidden_states = inputs_embeds
        all_hidden = () if output_hidden_states else None
        for i, layer in enumerate(self.layers):
            if output_hidden_states:
                all_hidden += (hidden_states,)
            kw = attn_kwargs if i in self.config.attn_layers else mixer_kwargs
            hidden_states = layer(hidden_states, attention_mask, cache, kw)
        hidden_states = self.norm(hidden_states)
        if output_hidden_states:  # as Llama: embeddings, each layer's input, then the final normed state
            all_hidden += (hidden_states,)
        if isinstance(cache, LinzooCache):
            cache.seen_tokens += T
        return BaseModelOutputWithPast(
            last_hidden_state=hidden_states, hidden_states=all_hidden, **{_CACHE_FIELD: cache}
        )


class LinzooForCausalLM(LinzooPreTrainedModel, GenerationMixin):
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    # Greedy decoding through one CUDA graph per token: model.generate(..., custom_generate=model.graph_decoding).
    graph_decoding = staticmethod(graph_decoding)

    def __init__(self, config):
        super().__init__(config)
        self.model = LinzooModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, *args, **kwargs):
        if generation_config.use_cache is not False and model_kwargs.get(_CACHE_FIELD) is None:
            model_kwargs[_CACHE_FIELD] = LinzooCache(config=self.config)
        return super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)

    def _prefills_in_pieces(self, model_kwargs, labels):
        """Whether this call is a long prefill to run in `config.prefill_piece_size` pieces: inference (no gradient)
        with a cache, longer than one piece, and nothing asked for that pieces would change (labels, every layer's
        hidden states)."""
        piece = self.config.prefill_piece_size
        tokens = model_kwargs["input_ids"] if model_kwargs["input_ids"] is not None else model_kwargs["inputs_embeds"]
        use_cache = model_kwargs["use_cache"] if model_kwargs["use_cache"] is not None else self.config.use_cache
        return bool(piece and tokens is not None and tokens.shape[1] > piece and use_cache and labels is None
                    and not model_kwargs["output_hidden_states"] and not torch.is_grad_enabled() and not self.training)

    def _prefill_in_pieces(self, model_kwargs, logits_to_keep):
        """The model over the prompt piece by piece, each continuing the cache (the continuation a decoding step also
        is): the same states, and the activations of one piece at a time. Keeps the last hidden states that
        `logits_to_keep` asks for (all when 0)."""
        piece, kw = self.config.prefill_piece_size, model_kwargs
        tokens = kw["input_ids"] if kw["input_ids"] is not None else kw["inputs_embeds"]
        T = tokens.shape[1]
        tail = logits_to_keep if isinstance(logits_to_keep, int) and logits_to_keep > 0 else T
        kept, cache, mask = [], kw["cache"], kw["attention_mask"]
        past = mask.shape[1] - T if mask is not None else 0  # the mask covers what is cached, then the prompt
        for start in range(0, T, piece):
            end = min(start + piece, T)
            part = {name: (None if kw[name] is None else kw[name][:, start:end])
                    for name in ("input_ids", "inputs_embeds", "position_ids")}
            outputs = self.model(**part, attention_mask=None if mask is None else mask[:, : past + end], cache=cache,
                                 use_cache=True, output_hidden_states=False)
            cache = getattr(outputs, _CACHE_FIELD)
            if end > T - tail:
                kept.append(outputs.last_hidden_state[:, max(T - tail - start, 0):])
        return BaseModelOutputWithPast(last_hidden_state=torch.cat(kept, 1), **{_CACHE_FIELD: cache})

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, past_key_values=None,
                inputs_embeds=None, labels=None, use_cache=None, output_hidden_states=None, logits_to_keep=0,
                **kwargs):
        cache = cache if cache is not None else past_key_values
        model_kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                            inputs_embeds=inputs_embeds, use_cache=use_cache, output_hidden_states=output_hidden_states)
        if self._prefills_in_pieces(model_kwargs, labels):
            outputs = self._prefill_in_pieces(model_kwargs, logits_to_keep)
        else:
            outputs = self.model(**model_kwargs)
        hidden_states = outputs.last_hidden_state
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            hidden_states = hidden_states[:, -logits_to_keep:]
        elif isinstance(logits_to_keep, torch.Tensor):
            hidden_states = hidden_states[:, logits_to_keep]
        logits = self.lm_head(hidden_states)
        loss = None
        if labels is not None:
            loss_function = self.loss_function
            if loss_function is LOSS_MAPPING["ForCausalLM"] and use_fused_ops(self.config, logits.device):
                loss_function = fused_causal_lm_loss
            loss = loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states,
            **{_CACHE_FIELD: getattr(outputs, _CACHE_FIELD)},
        )


def fused_causal_lm_loss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100, shift_labels=None,
                         **kwargs):
    """transformers' `ForCausalLMLoss` (same shift, same reduction over `num_items_in_batch`) with fla's fused
    cross-entropy, which reads bf16 logits as they are instead of an fp32 copy of all of them."""
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    shift_labels = shift_labels.reshape(-1).to(logits.device)
    reduction = "sum" if num_items_in_batch is not None else "mean"
    loss = fused_cross_entropy(logits.reshape(-1, vocab_size), shift_labels, ignore_index, reduction)
    if reduction == "sum":
        loss = loss / (num_items_in_batch.to(loss.device) if torch.is_tensor(num_items_in_batch) else num_items_in_batch)
    return loss


LinzooConfig.register_for_auto_class()
LinzooForCausalLM.register_for_auto_class("AutoModelForCausalLM")
