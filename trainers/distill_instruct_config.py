"""Configuration of instruction-aware distillation (KD from an instruction-tuned teacher on chat data)."""

from dataclasses import dataclass, field

from trl.experimental.gkd import GKDConfig

from .common import KDArguments, default_bf16


@dataclass
class InstructDistillConfig(GKDConfig, KDArguments):
    r"""
    Off-policy by default (`lmbda=0`): the student learns the teacher's distribution on the dataset's own
    assistant turns, with the chunked CE + KL loss of stage 3. `lmbda > 0` switches to TRL's on-policy GKD
    (student-generated completions, generalized JSD with `beta`).
    """

    teacher: str = field(default="embedded", metadata={"help": "Instruct teacher: Hub id, folder, .gguf or 'embedded'."})
    dataset: str = field(default="embedded", metadata={"help": "Chats: 'embedded', local files, or a Hub dataset id."})
    max_seq_length: int = field(default=1024, metadata={"help": "Tokens per packed row."})
    total_tokens: int = field(default=5_000_000, metadata={"help": "Token budget (sets max_steps)."})
    lmbda: float = field(default=0.0, metadata={"help": "Share of on-policy (student-generated) batches; 0 = off-policy."})
    packing: bool = field(default=True, metadata={"help": "Pack chats into rows (padding-free, off-policy only)."})
    packing_strategy: str = field(default="bfd", metadata={"help": "TRL packing strategy."})
    report_to: list[str] | str | None = field(default="none", metadata={"help": "Trackers (e.g. wandb) or 'none'."})
    logging_steps: float = field(default=10, metadata={"help": "Log every N steps."})
    save_steps: float = field(default=200, metadata={"help": "Checkpoint every N steps."})
    save_total_limit: int | None = field(default=2, metadata={"help": "Checkpoints kept."})

    def __post_init__(self):
        self.check_kd()
        if not 0.0 <= self.lmbda <= 1.0:
            raise ValueError(f"lmbda must lie in [0, 1], got {self.lmbda}.")
        if self.lmbda > 0:
            self.packing = False  # on-policy generation needs whole prompts
        self.max_length = self.max_seq_length
        default_bf16(self)
        super().__post_init__()
