"""Configuration of the three linearization stages (one config; each stage trainer reads its fields)."""

from dataclasses import dataclass, field
from pathlib import Path

import torch
from trl import SFTConfig

from ..arguments import check_fields

from ..modeling.mixers import DEFAULT_MIXER, MIXERS
from .common import KDArguments, RunArguments, default_bf16


@dataclass
class LinearizeConfig(RunArguments, SFTConfig, KDArguments):
    r"""
    Stage 1 (attention transfer), stage 2 (hidden-state alignment) and stage 3 (knowledge distillation) of
    linearizing a teacher, as in "What Matters in Linearizing Language Models?" (arXiv 2504.14366).

    The total token budget is split across the stages by `stage_fractions` (the paper's 3B recipe: 0.1/0.2/0.7);
    each stage then runs `tokens / (batch x seq_len x grad_accum x processes)` optimizer steps.
    """

    teacher: str = field(default="embedded", metadata={"help": "Teacher: Hub id, local folder, .gguf file or 'embedded'."})
    mixer: str = field(default=DEFAULT_MIXER, metadata={"help": f"Token mixer, one of {', '.join(MIXERS)}."})
    output_dir: str | None = field(
        default=None, metadata={"help": "Where the student (and each stage's checkpoints) go; default runs/<teacher>/<mixer>/base."}
    )
    attn_layers: list[str] = field(
        default_factory=list,
        metadata={"help": "Layer indices that keep softmax attention (hybrid student), or auto:K: the K layers whose "
                          "teacher heads retrieve best on passkey prompts (linzoo eval heads), chosen before the fit."},
    )
    dataset: str = field(
        default="embedded", metadata={"help": "Text for distillation: 'embedded', local files, or a Hub dataset id."}
    )
    repeat_every: int = field(
        default=0,
        metadata={"help": "Copy/recall-rich text: after every ~N characters of a document insert a verbatim excerpt "
                          "of its earlier text (linzoo.data.with_repeats); 0: the text as it is."},
    )
    chat_fraction: float = field(
        default=0.0,
        metadata={"help": "Share of the text (characters) that is chats (--chat_dataset) rendered with the teacher's chat "
                          "template (linzoo.data.with_chats); 0: text only."},
    )
    chat_dataset: str = field(default="embedded", metadata={"help": "Chats for --chat_fraction: 'embedded', files, or a Hub id."})
    total_tokens: int = field(default=20_000_000, metadata={"help": "Token budget over the three stages."})
    stage_fractions: list[float] = field(
        default_factory=lambda: [0.1, 0.2, 0.7],
        metadata={"help": "Share of the budget for attention transfer, hidden-state alignment, KD."},
    )
    max_seq_length: int = field(default=2048, metadata={"help": "Tokens per training row."})
    stage_learning_rates: list[float] = field(
        default_factory=lambda: [1e-3, 1e-4, 1e-4], metadata={"help": "Peak learning rate of each stage."}
    )
    stage_trainable: list[str] = field(
        default_factory=lambda: ["mixers", "all", "all"],
        metadata={"help": "What each stage trains: 'mixers' (the token mixers only; the teacher's other weights stay "
                          "frozen) or 'all'; one word for all three stages."},
    )
    kernel_backend: str = field(default="auto", metadata={"help": "'auto', 'fast' (fla kernels) or 'torch'.",
                                                          "choices": ("auto", "fast", "torch")})
    calibration_tokens: int = field(
        default=4096,
        metadata={"help": "Tokens of the training text (rows of at most 512) the fresh student is fitted to the teacher "
                          "on before stage 1 (linzoo.calibrate; results/init/). 0: the plain start."},
    )
    heldout_probe_tokens: int = field(
        default=2048,
        metadata={"help": "Tokens of the text's held-out split on which the student's perplexity is measured where "
                          "training starts (the fitted start, or --init_student) and where it ends, beside the "
                          "teacher's: both go in linzoo_training.json, and a student that ends worse than it started "
                          "is named. 0: off."},
    )
    max_wall_seconds: float = field(
        default=0,
        metadata={"help": "Wall-clock limit of the whole command in seconds (0: none). A stage that reaches its share of "
                          "the time left stops, saves and the run goes on, so a student is always saved "
                          "(linzoo.trainers.deadline)."},
    )
    window_size: int = field(
        default=0,
        metadata={"help": "Exact softmax over the last N tokens beside the linear state in every linear layer (the "
                          "config's window_size; typical 64-256). 0: off."},
    )
    init_student: str | None = field(
        default=None,
        metadata={"help": "Train this student further (a linearize run's folder) instead of linearizing the teacher: "
                          "its mixer, layers and weights; the stages then run on it, each with a fresh optimizer and "
                          "schedule (typically --stage_fractions 0 0 1). A zoo's linearize row with a parent passes "
                          "the parent's folder here."},
    )
    data_offset_tokens: int = field(
        default=0,
        metadata={"help": "Skip this many tokens of the packed training text first: a student trained further sees "
                          "text it has not seen (its parent's tokens)."},
    )
    # Defaults for a linearization run (overridable like any TrainingArguments field).
    report_to: list[str] | str | None = field(default="none", metadata={"help": "Trackers (e.g. wandb) or 'none'."})
    logging_steps: float = field(default=10, metadata={"help": "Log every N steps."})
    save_steps: float = field(default=200, metadata={"help": "Checkpoint every N steps (resume picks the last)."})
    save_total_limit: int | None = field(default=2, metadata={"help": "Checkpoints kept per stage."})
    lr_scheduler_type: str = field(default="cosine", metadata={"help": "Learning-rate schedule of each stage."})
    dataset_kwargs: dict | None = field(
        default_factory=lambda: {"skip_prepare_dataset": True},
        metadata={"help": "Rows arrive tokenized and packed (linzoo.data.pack_dataset)."},
    )

    LIMITS = {"attn_layers": {"unique": True}, "window_size": {"min": 0}, "calibration_tokens": {"min": 0},
              "heldout_probe_tokens": {"min": 0}, "max_wall_seconds": {"min": 0}, "repeat_every": {"min": 0},
              "data_offset_tokens": {"min": 0}, "total_tokens": {"min": 1},
              "max_seq_length": {"min": 1}, "stage_fractions": {"min": 0}, "stage_learning_rates": {"min": 0}}

    def __post_init__(self):
        # a stage's config is this one `dataclasses.replace`d: the schedule comes back as the enum the first
        # __post_init__ made of it, which check_fields' str() would turn into "SchedulerType.CONSTANT"
        self.lr_scheduler_type = getattr(self.lr_scheduler_type, "value", self.lr_scheduler_type)
        check_fields(self)  # types, finite numbers, limits: before any other check, and before anything loads
        if self.mixer not in MIXERS:
            raise ValueError(f"Unknown mixer {self.mixer!r}: pass --mixer one of {', '.join(MIXERS)}.")
        if len(self.stage_fractions) != 3 or any(f < 0 for f in self.stage_fractions) or sum(self.stage_fractions) <= 0:
            raise ValueError(f"stage_fractions must be three non-negative numbers, got {self.stage_fractions}.")
        if len(self.stage_learning_rates) != 3:
            raise ValueError(f"stage_learning_rates must be three numbers, got {self.stage_learning_rates}.")
        if len(self.stage_trainable) == 1:  # one word for all three stages
            self.stage_trainable = self.stage_trainable * 3
        if len(self.stage_trainable) != 3 or set(self.stage_trainable) - {"mixers", "all"}:
            raise ValueError(f"stage_trainable must be one or three of 'mixers'/'all', got {self.stage_trainable}.")
        if not 0 <= self.chat_fraction < 1:
            raise ValueError(f"chat_fraction must lie in [0, 1), got {self.chat_fraction}.")
        if self.window_size < 0:
            raise ValueError(f"window_size must be >= 0 (0: off; typical 64-256), got {self.window_size}.")
        if self.window_size > self.max_seq_length:
            raise ValueError(f"--window_size {self.window_size} is longer than the rows it trains on (--max_seq_length "
                             f"{self.max_seq_length}): such a window is full softmax attention; typical 64-256")
        if self.kernel_backend == "fast" and not torch.cuda.is_available():
            raise ValueError("--kernel_backend fast runs fla's CUDA kernels, and torch sees no CUDA GPU here: use "
                             "--kernel_backend torch (or auto)")
        if self.calibration_tokens < 0:
            raise ValueError(f"calibration_tokens must be >= 0 (0: no fit), got {self.calibration_tokens}.")
        if self.max_wall_seconds < 0:
            raise ValueError(f"max_wall_seconds must be >= 0 (0: no limit), got {self.max_wall_seconds}.")
        if self.total_tokens <= 0 or self.max_seq_length <= 0:
            raise ValueError("total_tokens and max_seq_length must be positive.")
        self.check_kd()
        if self.init_student is not None:
            self.check_init_student()
        layers, self.auto_attn_layers = parse_attn_layers(self.attn_layers)
        self.attn_layers = [f"auto:{self.auto_attn_layers}"] if self.auto_attn_layers else layers  # as the run records it
        if self.output_dir is None:
            teacher = Path(self.teacher).name.removesuffix(".gguf")
            self.output_dir = str(Path("runs") / teacher / self.mixer / "base")
        self.max_length = self.max_seq_length
        default_bf16(self)
        self.check_run()
        super().__post_init__()

    def check_init_student(self):
        """--init_student: a student folder of this --mixer, whose layout the run does not also choose."""
        from linzoo.loading import read_config

        if self.attn_layers or self.window_size:
            raise ValueError(f"--init_student {self.init_student}: the student keeps its own layers and window; drop "
                             "--attn_layers and --window_size")
        if not Path(self.init_student).expanduser().is_dir():
            return  # a zoo's parent row, not trained yet (`linzoo zoo --check`); a wrong path fails as it loads
        config = read_config(self.init_student)
        if config.get("model_type") != "linzoo":
            raise ValueError(f"--init_student {self.init_student}: not a linzoo student (its config.json has "
                             f"model_type {config.get('model_type')!r}): give a linearize run's folder")
        if config.get("mixer") != self.mixer:
            raise ValueError(f"--init_student {self.init_student} is a {config.get('mixer')} student: pass --mixer "
                             f"{config.get('mixer')}")

    def stage_tokens(self):
        total = sum(self.stage_fractions)
        return [int(self.total_tokens * f / total) for f in self.stage_fractions]


def parse_attn_layers(values) -> tuple[list[int], int | None]:
    """--attn_layers: (layer indices, None), or ([], K) for `auto:K`."""
    values = [str(v) for v in values]
    if len(values) == 1 and values[0].startswith("auto:"):
        k = values[0].removeprefix("auto:")
        if not k.isdigit() or int(k) < 1:
            raise ValueError(f"--attn_layers {values[0]}: give auto:K with K >= 1 softmax layers, e.g. auto:3")
        return [], int(k)
    if not all(v.lstrip("-").isdigit() for v in values):
        raise ValueError(f"--attn_layers {' '.join(values)}: give layer indices (e.g. 3 4 23) or auto:K (e.g. auto:3)")
    return [int(v) for v in values], None
