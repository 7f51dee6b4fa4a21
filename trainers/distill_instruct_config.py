"""Configuration of instruction-aware distillation (KD from an instruction-tuned teacher on chat data)."""

import warnings
from dataclasses import dataclass, field

from trl.import_utils import TRLExperimentalWarning

with warnings.catch_warnings():
    # GKD lives in trl.experimental (TRL is pinned); its import notice, meant for whoever chose that import, was
    # printed ahead of everything `linzoo distill-instruct` says, errors included.
    warnings.simplefilter("ignore", TRLExperimentalWarning)
    from trl.experimental.gkd import GKDConfig

from .common import ChatRunArguments, KDArguments


@dataclass
class InstructDistillConfig(ChatRunArguments, GKDConfig, KDArguments):
    r"""
    Off-policy by default (`lmbda=0`): the student learns the teacher's distribution on the dataset's own
    assistant turns, with the chunked CE + KL loss of stage 3. `lmbda > 0` switches to TRL's on-policy GKD
    (student-generated completions, generalized JSD with `beta`).
    """

    teacher: str = field(default="embedded", metadata={"help": "Instruct teacher: Hub id, folder, .gguf or 'embedded'."})
    lmbda: float = field(default=0.0, metadata={"help": "Share of on-policy (student-generated) batches; 0 = off-policy."})

    def __post_init__(self):
        self.check_kd()
        if not 0.0 <= self.lmbda <= 1.0:
            raise ValueError(f"lmbda must lie in [0, 1], got {self.lmbda}.")
        if self.lmbda > 0:
            self.packing = False  # on-policy generation needs whole prompts
        self.check_chat_run()
        super().__post_init__()
