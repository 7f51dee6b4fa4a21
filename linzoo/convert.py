"""Build a linzoo student from a Llama-family teacher."""

from __future__ import annotations

from .modeling import LinzooConfig, LinzooForCausalLM
from .modeling.mixers import DEFAULT_MIXER

SUPPORTED_TEACHERS = ("llama", "mistral")  # q/k/v/o without biases, SwiGLU MLP, RMSNorm, RoPE
TEACHER_ATTENTION = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight")


def fresh_parameters(student) -> list[str]:
    """Names of the parameters a linearized student adds to its teacher: every mixer's own (gates, norms, convs)."""
    return [
        name for name, _ in student.named_parameters()
        if ".self_attn." in name and int(name.split(".")[2]) not in student.config.attn_layers
        and not name.endswith(TEACHER_ATTENTION)
    ]


def student_config(teacher_config, mixer: str, **options) -> LinzooConfig:
    """A LinzooConfig with the teacher's backbone shape, the chosen mixer and its options."""
    tc = teacher_config
    if tc.model_type not in SUPPORTED_TEACHERS:
        raise ValueError(
            f"Teacher model_type {tc.model_type!r} is not supported; linzoo linearizes {', '.join(SUPPORTED_TEACHERS)} "
            "models (Llama-style q/k/v/o, SwiGLU MLP, RMSNorm) such as the SmolLM2 family."
        )
    if getattr(tc, "attention_bias", False) or getattr(tc, "mlp_bias", False):
        raise ValueError("Teachers with attention or MLP biases are not supported.")
    rope = getattr(tc, "rope_parameters", None) or {}
    return LinzooConfig(
        vocab_size=tc.vocab_size,
        hidden_size=tc.hidden_size,
        intermediate_size=tc.intermediate_size,
        num_hidden_layers=tc.num_hidden_layers,
        num_attention_heads=tc.num_attention_heads,
        num_key_value_heads=tc.num_key_value_heads,
        head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads,
        max_position_embeddings=tc.max_position_embeddings,
        rms_norm_eps=tc.rms_norm_eps,
        rope_theta=rope.get("rope_theta", getattr(tc, "rope_theta", 10000.0)),
        tie_word_embeddings=tc.tie_word_embeddings,
        bos_token_id=tc.bos_token_id,
        eos_token_id=tc.eos_token_id,
        pad_token_id=tc.pad_token_id,
        mixer=mixer,
        teacher=tc._name_or_path or None,
        **options,
    )


def linearize(teacher, mixer: str = DEFAULT_MIXER, calibration=None, **options) -> LinzooForCausalLM:
    """Replace every attention of `teacher` (a model, or a spec for `load_teacher`) by `mixer`.

    Embeddings, norms, MLPs and the attention's q/k/v/o projections are copied (GQA: k/v keep the
    teacher's head count and are repeated per query head inside the mixer). Layers in `attn_layers` keep the
    teacher's softmax attention.

    `calibration`: token ids [rows, length] of text like the training data (`linzoo linearize` passes 4,096 tokens of
    its training rows, `--calibration_tokens`; results/init/). With them the student starts fitted to the teacher
    (`linzoo.calibrate`): the short convolution's SiLU acts on q and k only (`conv_activation="silu_qk"` unless
    `options` say otherwise), so the value path is the teacher's v_proj; each head's decay half-life and write
    strength, the output norm that sets the scale and, where held-out rows say it helps, o_proj are fitted on those
    tokens (the fit's report: `student.calibration_report`). Without them, the new parameters (`fresh_parameters`)
    keep each mixer's plain start (`reset_new_parameters`: gates near 1, identity convs, unit norms; SiLU on q, k
    and v), as every student had before the fit, whose output is 10-600x the teacher attention's energy.
    """
    if isinstance(teacher, str):
        from .loading import load_teacher

        teacher, _ = load_teacher(teacher)
    if calibration is not None:
        options.setdefault("conv_activation", "silu_qk")
    config = student_config(teacher.config, mixer, **options)
    weight = next(teacher.parameters())
    student = LinzooForCausalLM(config).to(device=weight.device, dtype=weight.dtype)
    state = {k: v for k, v in teacher.state_dict().items() if not k.endswith("rotary_emb.inv_freq")}
    result = student.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        raise ValueError(f"Teacher weights with no place in the student: {result.unexpected_keys[:5]} ...")
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    missing = set(result.missing_keys) - tied - set(fresh_parameters(student))
    if missing:
        raise ValueError(f"Backbone weights missing from the teacher: {sorted(missing)[:5]}")
    student.tie_weights()
    if getattr(teacher, "generation_config", None) is not None:
        student.generation_config = teacher.generation_config
    if calibration is not None:
        from .calibrate import fit_to_teacher

        student.calibration_report = fit_to_teacher(student, teacher, calibration)
    return student
