"""Configuration of a linzoo student: a Llama/SmolLM2 backbone whose attention is a linear mixer, and the cache
size a config implies (`state_sizes`, from each mixer's `state_shapes`)."""

import math
from dataclasses import dataclass

from transformers import PretrainedConfig

from .mixer_base import CONV_ACTIVATIONS
from .mixer_linear_attn import FEATURE_MAPS
from .mixers import DEFAULT_MIXER, MIXER_CLASSES, MIXERS

KERNEL_BACKENDS = ("auto", "fast", "torch")


def _check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"Unknown {name} {value!r}; valid values are: {', '.join(map(repr, choices))}.")


class LinzooConfig(PretrainedConfig):
    r"""
    Llama-style backbone fields (as `LlamaConfig`) plus the token mixer.

    Args:
        mixer (`str`): one of `linzoo.MIXERS` (the registry in `mixers.py`).
        attn_layers (`list[int]`): layer indices that keep softmax attention (a hybrid student); empty by default.
        kernel_backend (`str`): `"auto"` uses fla / mlstm-kernels when CUDA and the package are present and the
            pure-torch path otherwise (falling back, with one warning, when a mixer's kernels do not import);
            `"fast"` requires the kernels; `"torch"` forces the pure-torch path.
        use_short_conv (`bool`, *optional*): causal depthwise conv (kernel `conv_size`) on q, k, v, then SiLU.
            Defaults to the mixer's own default (its class's `short_conv`).
        conv_activation (`str`): where that SiLU applies: `"silu"` on q, k and v (fla's; the default, and so the
            behaviour of every checkpoint saved before this field), `"silu_qk"` on q and k only (the value path stays
            the teacher's v_proj: what `linzoo.linearize` builds with calibration tokens), `"identity"` nowhere.
        feature_map (`str`): feature map of the mixer that has one (linear attention; `"elu"` is elu(x)+1).
        gate_low_rank_dim (`int`): rank of the low-rank per-channel gate projections.
        gate_logit_normalizer (`float`): divides GLA's log-sigmoid gate (fla's default 16).
        igate_soft_cap (`float`): soft cap on xLSTM's exponential input gate pre-activation.
        chunk_size (`int`): chunk length of the pure-torch chunked form.
        prefill_piece_size (`int`): a prompt longer than this is prefilled (no gradient, with a cache) in pieces of
            this many tokens, each continuing the cache of the last: the state is the same, and memory stays that of
            one piece instead of growing with the prompt. 0: one forward whatever its length. (Not transformers'
            `generation_config.prefill_chunk_size`, which splits prompts inside `generate()` only, and which a model
            config field of that name would switch on.)
        window_size (`int`): in every linear layer, exact softmax attention (the teacher's q, k, v with RoPE) over the
            last `window_size` tokens beside the linear state, which then holds only the tokens that left the window
            (LoLCATs; `memory.py`). 0 (the default): off.
        sparse_cache_size (`int`): in every linear layer, a cache of the key-value pairs the linear state recalls
            worst, attended with the same softmax (LoLA); an inference assist, settable at load
            (`from_pretrained(..., sparse_cache_size=64)`). 0 (the default): off.
        teacher (`str`): lineage: where the backbone came from (the rest of the lineage — stage, parent, new
            parameters — is in the checkpoint's `linzoo_training.json`).
    """

    model_type = "linzoo"
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(
        self,
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=None,
        hidden_act="silu",
        max_position_embeddings=8192,
        initializer_range=0.02,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        use_cache=True,
        pad_token_id=None,
        bos_token_id=1,
        eos_token_id=2,
        mixer=DEFAULT_MIXER,
        attn_layers=(),
        kernel_backend="auto",
        use_short_conv=None,
        conv_size=4,
        conv_activation="silu",
        feature_map="elu",
        gate_low_rank_dim=16,
        gate_logit_normalizer=16.0,
        igate_soft_cap=15.0,
        chunk_size=64,
        prefill_piece_size=4096,
        window_size=0,
        sparse_cache_size=0,
        teacher=None,
        **kwargs,
    ):
        _check_choice("mixer", mixer, MIXERS)
        _check_choice("kernel_backend", kernel_backend, KERNEL_BACKENDS)
        _check_choice("feature_map", feature_map, FEATURE_MAPS)
        _check_choice("conv_activation", conv_activation, CONV_ACTIVATIONS)
        if hidden_size % num_attention_heads:
            raise ValueError(f"hidden_size {hidden_size} is not divisible by num_attention_heads {num_attention_heads}.")
        if num_attention_heads % num_key_value_heads:
            raise ValueError(
                f"num_attention_heads {num_attention_heads} is not a multiple of num_key_value_heads {num_key_value_heads}."
            )
        attn_layers = sorted(int(i) for i in attn_layers)
        bad = [i for i in attn_layers if not 0 <= i < num_hidden_layers]
        if bad:
            raise ValueError(f"attn_layers {bad} are outside 0..{num_hidden_layers - 1}.")
        if conv_size < 2:
            raise ValueError(f"conv_size must be >= 2, got {conv_size}.")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}.")
        for name, value in (("window_size", window_size), ("sparse_cache_size", sparse_cache_size),
                            ("prefill_piece_size", prefill_piece_size)):
            if int(value) != value or value < 0:
                raise ValueError(f"{name} must be a whole number >= 0 (0: off), got {value!r}.")

        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.use_cache = use_cache
        self.mixer = mixer
        self.attn_layers = attn_layers
        self.kernel_backend = kernel_backend
        self.use_short_conv = MIXER_CLASSES[mixer].short_conv if use_short_conv is None else bool(use_short_conv)
        self.conv_size = conv_size
        self.conv_activation = conv_activation
        self.feature_map = feature_map
        self.gate_low_rank_dim = gate_low_rank_dim
        self.gate_logit_normalizer = gate_logit_normalizer
        self.igate_soft_cap = igate_soft_cap
        self.chunk_size = chunk_size
        self.prefill_piece_size = int(prefill_piece_size)
        self.window_size = int(window_size)
        self.sparse_cache_size = int(sparse_cache_size)
        self.teacher = teacher
        # transformers' DynamicCache(config=...) builds one recurrent-state layer per "linear_attention" entry.
        self.layer_types = [
            "full_attention" if i in attn_layers else "linear_attention" for i in range(num_hidden_layers)
        ]
        kwargs.pop("layer_types", None)
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )


@dataclass(frozen=True)
class StateSize:
    """Bytes one sequence keeps while decoding at a given context length."""

    recurrent: int  # linear layers: heads x K x V fp32 per layer, whatever the context length
    conv: int  # linear layers' short-conv windows: (q + k + v channels) x conv_size in the model dtype
    attention_kv: int  # softmax layers (a hybrid student's, or a teacher's): 2 x kv_heads x head_dim x tokens
    teacher_kv: int  # the teacher's KV cache at this context: 2 x layers x kv_heads x head_dim x tokens x bytes
    memory: int = 0  # linear layers' sliding window and sparse cache (`memory.py`), fp32, whatever the context length

    @property
    def fixed(self) -> int:
        """What a linear layer keeps whatever the context length: state, conv window, sliding window, sparse cache."""
        return self.recurrent + self.conv + self.memory

    @property
    def total(self) -> int:
        return self.fixed + self.attention_kv


def _field(config, name, default=None):
    return config.get(name, default) if isinstance(config, dict) else getattr(config, name, default)


def state_sizes(config, tokens: int, dtype_bytes: int = 4) -> StateSize:
    """Cache sizes for `config` (a config object or config.json dict) at `tokens` tokens of context.
    A model that is not a linzoo student is all softmax attention: its state is its KV cache."""
    layers, heads = _field(config, "num_hidden_layers"), _field(config, "num_attention_heads")
    kv_heads = _field(config, "num_key_value_heads") or heads
    head_dim = _field(config, "head_dim") or _field(config, "hidden_size") // heads
    kv_per_layer = 2 * kv_heads * head_dim * tokens * dtype_bytes
    if _field(config, "model_type") != LinzooConfig.model_type:
        return StateSize(0, 0, layers * kv_per_layer, layers * kv_per_layer)
    if isinstance(config, dict):
        config = LinzooConfig.from_dict(config)
    softmax_layers = len(config.attn_layers)
    linear_layers = layers - softmax_layers
    shapes = MIXER_CLASSES[config.mixer].state_shapes(config)
    recurrent = linear_layers * math.prod(shapes["recurrent"]) * 4  # linear_ops keeps states in fp32
    conv = linear_layers * math.prod(shapes["conv"]) * dtype_bytes if "conv" in shapes else 0
    memory = linear_layers * sum(math.prod(shapes[k]) for k in ("window", "sparse", "counts") if k in shapes) * 4
    return StateSize(recurrent, conv, softmax_layers * kv_per_layer, layers * kv_per_layer, memory)
