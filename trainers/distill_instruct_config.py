"""Configuration of instruction-aware distillation (KD from an instruction-tuned teacher on chat data)."""

import warnings
from dataclasses import dataclass, field, fields

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
        self.check_loss_vocabulary()
        if self.lmbda > 0:
            self.packing = False  # on-policy generation needs whole prompts
        self.check_chat_run()
        super().__post_init__()


    # One loss, one vocabulary: off-policy (lmbda = 0) is stage 3's CE + KL with kd_temperature / kd_alpha; on-policy
    # (lmbda > 0) is TRL's GKD with its temperature / beta. A flag of the other loss would be silently ignored.
    OFF_POLICY, ON_POLICY = ("kd_temperature", "kd_alpha"), ("temperature", "beta")

    def check_loss_vocabulary(self):
        defaults = {f.name: f.default for f in fields(self)}
        ignored = self.OFF_POLICY if self.lmbda > 0 else self.ON_POLICY
        changed = [name for name in ignored if getattr(self, name) != defaults[name]]
        if changed:
            used = self.ON_POLICY if self.lmbda > 0 else self.OFF_POLICY
            loss = "on-policy GKD (--lmbda > 0)" if self.lmbda > 0 else "off-policy distillation (--lmbda 0)"
            raise ValueError(f"{', '.join('--' + n for n in changed)} belong to the other loss: {loss} reads "
                             f"{' and '.join('--' + n for n in used)}; drop {'it' if len(changed) == 1 else 'them'} or "
                             "change --lmbda.")
